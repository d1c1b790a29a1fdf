//! Offline quantization of whole safetensors checkpoints (feature `checkpoint`).
//!
//! [`quantize_checkpoint`] reads a checkpoint (one `.safetensors` file, or a Hugging Face
//! model folder with one or more shards, `config.json`, tokenizer files), quantizes the
//! selected 2-D linear weights and writes a folder that inference engines load:
//!
//! | [`Scheme`] / [`Layout`] | tensors per quantized `P.weight` | config |
//! |---|---|---|
//! | NVFP4 / ModelOpt | `P.weight` U8 `[N, K/2]`, `P.weight_scale` F8_E4M3 `[N, K/16]`, `P.weight_scale_2` F32 `[]` (= amax / 2688) | `hf_quant_config.json` and `config.json` `quantization_config` (`quant_method: modelopt`, `quant_algo: NVFP4`) |
//! | NVFP4 / compressed-tensors | `P.weight_packed` U8 `[N, K/2]`, `P.weight_scale` F8_E4M3 `[N, K/16]`, `P.weight_global_scale` F32 `[1]` (= 2688 / amax, the reciprocal) | `config.json` `quantization_config` (`format: nvfp4-pack-quantized`) |
//! | MXFP8 / compressed-tensors | `P.weight` F8_E4M3 `[N, K]`, `P.weight_scale` U8 (E8M0 exponents) `[N, K/32]` | `config.json` `quantization_config` (`format: mxfp8-quantized`) |
//!
//! With calibrated input amaxes ([`QuantizeOptions::input_amax`]), each quantized NVFP4
//! layer also gets its static activation scale: ModelOpt `P.input_scale` F32 `[]` (= amax /
//! 2688) or compressed-tensors `P.input_global_scale` F32 `[1]` (= 2688 / amax, and the
//! config's `input_activations` of the `NVFP4` scheme).
//!
//! Every other tensor is copied byte for byte. The arithmetic of each layout is its
//! producer's, bit for bit ([`layouts`]). [`dequantize_checkpoint`] goes back to BF16 or
//! F32, with per-tensor error statistics against a reference checkpoint.
//!
//! Files are memory-mapped and processed one tensor per task on the rayon pool; a task holds
//! the tensor widened to f32 plus its outputs (the error statistics are accumulated block by
//! block), so peak memory is about `threads × 5 bytes × (elements of the largest tensor)`
//! beyond the mapped files, not the model. The output is built in a
//! hidden sibling directory and renamed into place at the end; an output that exists and is
//! not an empty directory is refused. On any error the partial directory is removed.
//!
//! ```
//! use fp_formats::checkpoint::{quantize_checkpoint, NoProgress, QuantizeOptions};
//! # let dir = std::env::temp_dir().join(format!("fpf-doc-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir).unwrap();
//! # let input = dir.join("model.safetensors");
//! # fp_formats::checkpoint::write_f32_checkpoint(&input, &[
//! #     ("model.layers.0.mlp.up_proj.weight", vec![4, 32], (0..128).map(|i| i as f32 / 64.0 - 1.0).collect()),
//! #     ("model.norm.weight", vec![32], vec![1.0; 32]),
//! # ]).unwrap();
//! let report = quantize_checkpoint(&input, &dir.join("out"), &QuantizeOptions::default(), &NoProgress)?;
//! assert_eq!(report.quantized().count(), 1);   // the norm is copied
//! assert!(dir.join("out/model.safetensors").exists());
//! # std::fs::remove_dir_all(&dir).unwrap();
//! # Ok::<(), fp_formats::checkpoint::CheckpointError>(())
//! ```

mod error;
mod io;
pub mod layouts;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use safetensors::Dtype;
use serde_json::{json, Value};

pub use error::CheckpointError;
use io::{InTensor, InputFile, OutTensor, Writer};
use layouts::{MxScale, Nvfp4Convention};

use crate::stats::ErrorStats;

/// The quantized format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Scheme {
    /// E2M1 elements, E4M3 scales per 16, an FP32 tensor scale.
    #[default]
    Nvfp4,
    /// E4M3 elements, E8M0 scales per 32.
    Mxfp8,
}

/// The tensor names and config of the output.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Layout {
    /// NVIDIA TensorRT Model Optimizer's Hugging Face export (NVFP4 only).
    #[default]
    ModelOpt,
    /// compressed-tensors (`nvfp4-pack-quantized`, `mxfp8-quantized`), as written by
    /// llm-compressor and read by vLLM.
    CompressedTensors,
}

/// Which tensors to quantize: 2-D `*.weight` tensors whose name matches an `include`
/// pattern and no `exclude` pattern. Patterns are globs over the whole name: `*` matches
/// any run of characters (dots included), `?` one character.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selection {
    /// Names to consider (default `*`).
    pub include: Vec<String>,
    /// Names to leave unquantized (default: embeddings, the LM head, norms).
    pub exclude: Vec<String>,
}

impl Default for Selection {
    fn default() -> Self {
        Selection {
            include: vec!["*".into()],
            exclude: ["*embed*", "*lm_head*", "*norm*", "*wte*", "*wpe*"]
                .map(String::from)
                .to_vec(),
        }
    }
}

impl Selection {
    /// Whether the tensor `name` with `shape` is selected.
    ///
    /// ```
    /// use fp_formats::checkpoint::Selection;
    /// let s = Selection::default();
    /// assert!(s.selects("model.layers.3.self_attn.q_proj.weight", &[64, 64]));
    /// assert!(!s.selects("model.embed_tokens.weight", &[256, 64]));
    /// assert!(!s.selects("lm_head.weight", &[256, 64]));
    /// assert!(!s.selects("model.layers.3.input_layernorm.weight", &[64]));
    /// assert!(!s.selects("model.layers.3.mlp.up_proj.bias", &[64]));
    /// ```
    pub fn selects(&self, name: &str, shape: &[usize]) -> bool {
        shape.len() == 2
            && name.ends_with(".weight")
            && self.include.iter().any(|p| glob_match(p, name))
            && !self.exclude.iter().any(|p| glob_match(p, name))
    }
}

/// Glob matching over a whole string: `*` any run (possibly empty), `?` one character.
///
/// ```
/// use fp_formats::checkpoint::glob_match;
/// assert!(glob_match("model.layers.*.mlp.*", "model.layers.10.mlp.down_proj.weight"));
/// assert!(glob_match("*q_proj*", "a.q_proj.weight"));
/// assert!(!glob_match("*.bias", "a.weight"));
/// assert!(glob_match("layer?.w", "layer7.w"));
/// ```
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, s): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut pi, mut si) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while si < s.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == s[si]) {
            pi += 1;
            si += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = si;
            pi += 1;
        } else if let Some(st) = star {
            pi = st + 1;
            mark += 1;
            si = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Options of [`quantize_checkpoint`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QuantizeOptions {
    /// The format.
    pub scheme: Scheme,
    /// The tensor names and config.
    pub layout: Layout,
    /// MXFP8 block exponents (ignored for NVFP4).
    pub mx_scale: MxScale,
    /// The tensors to quantize.
    pub selection: Selection,
    /// Skip the per-tensor error statistics (one dequantization pass fewer).
    pub no_stats: bool,
    /// Extra `__metadata__` entries for every output file (e.g. the producer of the model).
    pub metadata: BTreeMap<String, String>,
    /// Calibrated input amax of each quantized linear layer, by module name (`P` of
    /// `P.weight`), for static NVFP4 activation scales: ModelOpt's `P.input_scale` (F32 `[]`,
    /// [`layouts::modelopt_input_scale`]) or compressed-tensors' `P.input_global_scale` (F32
    /// `[1]`, [`layouts::ct_input_global_scale`], and the `NVFP4` scheme's
    /// `input_activations` in the config instead of `NVFP4A16`'s `null`). Empty: weights
    /// only. Otherwise every quantized layer needs a finite, positive amax and every entry
    /// must name a quantized layer; NVFP4 only.
    pub input_amax: BTreeMap<String, f32>,
}

/// The float type a dequantized checkpoint is written in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FloatType {
    /// BF16, rounded to nearest even from the producer's f32 value (what the producers'
    /// own decompressors return).
    #[default]
    Bf16,
    /// The exact f32 value.
    F32,
}

/// Options of [`dequantize_checkpoint`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DequantizeOptions {
    /// Output type of the dequantized weights.
    pub dtype: FloatType,
    /// A checkpoint to compare with (same tensor names): per-tensor error statistics.
    pub reference: Option<PathBuf>,
}

/// What happened to one input tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Quantized.
    Quantized,
    /// Dequantized back to a float type.
    Dequantized,
    /// Copied unchanged.
    Copied,
}

/// One line of a [`Report`].
#[derive(Clone, Debug, PartialEq)]
pub struct TensorReport {
    /// Tensor name in the input (for a dequantized weight: the `P.weight` it becomes).
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its safetensors dtype in the input.
    pub dtype: String,
    /// What was done.
    pub action: Action,
    /// Error of the quantized weight (quantize), or of the dequantized weight against the
    /// reference (dequantize with a reference).
    pub stats: Option<ErrorStats>,
}

/// The outcome of a whole-checkpoint conversion.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    /// Output files, relative to the output directory.
    pub files: Vec<PathBuf>,
    /// Every tensor, in file then name order.
    pub tensors: Vec<TensorReport>,
    /// Bytes of input `.safetensors` files.
    pub bytes_read: u64,
    /// Bytes of output `.safetensors` files.
    pub bytes_written: u64,
}

impl Report {
    /// The quantized tensors.
    pub fn quantized(&self) -> impl Iterator<Item = &TensorReport> {
        self.tensors
            .iter()
            .filter(|t| t.action == Action::Quantized)
    }
}

/// Progress of a conversion, called from worker threads.
pub trait Progress: Sync {
    /// Called once with the number of tensors and input bytes to process.
    fn begin(&self, _tensors: usize, _bytes: u64) {}
    /// Called after each tensor with its input bytes.
    fn advance(&self, _tensor: &str, _bytes: u64) {}
}

/// A [`Progress`] that reports nothing.
pub struct NoProgress;
impl Progress for NoProgress {}

/// The `.safetensors` files and side files of an input path.
struct Input {
    shards: Vec<PathBuf>,
    side_files: Vec<PathBuf>,
}

fn list_input(input: &Path) -> Result<Input, CheckpointError> {
    let md = fs::metadata(input).map_err(CheckpointError::io(input))?;
    if md.is_file() {
        return Ok(Input {
            shards: vec![input.into()],
            side_files: vec![],
        });
    }
    let mut shards = vec![];
    let mut side_files = vec![];
    for e in fs::read_dir(input).map_err(CheckpointError::io(input))? {
        let e = e.map_err(CheckpointError::io(input))?;
        let p = e.path();
        if !e.file_type().map_err(CheckpointError::io(&p))?.is_file() {
            continue;
        }
        if p.extension().is_some_and(|x| x == "safetensors") {
            shards.push(p);
        } else {
            side_files.push(p);
        }
    }
    shards.sort();
    side_files.sort();
    if shards.is_empty() {
        return Err(CheckpointError::NoInput(input.into()));
    }
    Ok(Input { shards, side_files })
}

/// A hidden sibling directory that becomes `out` on [`Staging::commit`] and is removed if
/// dropped before.
struct Staging {
    tmp: PathBuf,
    out: PathBuf,
    done: bool,
}

impl Staging {
    fn new(out: &Path) -> Result<Self, CheckpointError> {
        if let Ok(md) = fs::symlink_metadata(out) {
            let empty_dir = md.is_dir()
                && fs::read_dir(out)
                    .map_err(CheckpointError::io(out))?
                    .next()
                    .is_none();
            if !empty_dir {
                return Err(CheckpointError::OutputExists(out.into()));
            }
        }
        let name = out
            .file_name()
            .ok_or_else(|| CheckpointError::Options(format!("bad output path {}", out.display())))?
            .to_string_lossy()
            .into_owned();
        let parent = match out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        fs::create_dir_all(&parent).map_err(CheckpointError::io(&parent))?;
        let tmp = parent.join(format!(".{name}.partial-{}", std::process::id()));
        if tmp.exists() {
            fs::remove_dir_all(&tmp).map_err(CheckpointError::io(&tmp))?;
        }
        fs::create_dir(&tmp).map_err(CheckpointError::io(&tmp))?;
        Ok(Staging {
            tmp,
            out: out.into(),
            done: false,
        })
    }

    fn commit(mut self) -> Result<(), CheckpointError> {
        if self.out.is_dir() {
            // Empty (checked at the start): rename(2) does not replace it on every platform.
            fs::remove_dir(&self.out).map_err(CheckpointError::io(&self.out))?;
        }
        fs::rename(&self.tmp, &self.out).map_err(CheckpointError::io(&self.out))?;
        self.done = true;
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.done {
            let _ = fs::remove_dir_all(&self.tmp);
        }
    }
}

fn read_json(path: &Path) -> Result<Value, CheckpointError> {
    let text = fs::read_to_string(path).map_err(CheckpointError::io(path))?;
    serde_json::from_str(&text).map_err(|error| CheckpointError::Json {
        path: path.into(),
        error,
    })
}

fn write_json(path: &Path, v: &Value) -> Result<(), CheckpointError> {
    let mut s = serde_json::to_string_pretty(v).expect("JSON value");
    s.push('\n');
    fs::write(path, s).map_err(CheckpointError::io(path))
}

fn module_of(weight_name: &str) -> &str {
    weight_name.strip_suffix(".weight").unwrap_or(weight_name)
}

/// The planned work on one input tensor.
enum Job<'a> {
    Copy(&'a InTensor),
    Quantize(&'a InTensor),
}

const FLOAT_TYPES: [Dtype; 3] = [Dtype::F32, Dtype::BF16, Dtype::F16];

fn quantized_outputs(t: &InTensor, opts: &QuantizeOptions) -> Vec<OutTensor> {
    let (n, k) = (t.shape[0], t.shape[1]);
    let p = module_of(&t.name);
    let mut outs = weight_outputs(p, n, k, opts);
    if opts.input_amax.contains_key(p) {
        outs.push(match opts.layout {
            Layout::ModelOpt => OutTensor::new(format!("{p}.input_scale"), Dtype::F32, vec![]),
            Layout::CompressedTensors => {
                OutTensor::new(format!("{p}.input_global_scale"), Dtype::F32, vec![1])
            }
        });
    }
    outs
}

/// The bytes of module `p`'s input scale in the layout's convention (see
/// [`QuantizeOptions::input_amax`]), if it has one.
fn input_scale_bytes(p: &str, opts: &QuantizeOptions) -> Option<Vec<u8>> {
    let amax = *opts.input_amax.get(p)?;
    let v = match opts.layout {
        Layout::ModelOpt => layouts::modelopt_input_scale(amax),
        Layout::CompressedTensors => layouts::ct_input_global_scale(amax),
    };
    Some(v.to_le_bytes().to_vec())
}

/// Checks [`QuantizeOptions::input_amax`] against the modules that are quantized.
fn check_input_amax(opts: &QuantizeOptions, quantized: &[String]) -> Result<(), CheckpointError> {
    if opts.input_amax.is_empty() {
        return Ok(());
    }
    let bad = |m: String| Err(CheckpointError::Options(m));
    if opts.scheme == Scheme::Mxfp8 {
        return bad(
            "MXFP8 activations are scaled per block at run time: there is no input scale to \
             calibrate (input amax given)"
                .into(),
        );
    }
    for (m, &a) in &opts.input_amax {
        if quantized.binary_search(m).is_err() {
            return bad(format!(
                "an input amax is given for `{m}`, which is not a quantized linear layer"
            ));
        }
        let ok =
            a.is_finite() && a > 0.0 && (opts.layout == Layout::ModelOpt || (1.0 / a).is_finite());
        if !ok {
            return bad(format!(
                "the input amax {a:e} of `{m}` must be finite and positive (a normal f32)"
            ));
        }
    }
    if let Some(m) = quantized.iter().find(|m| !opts.input_amax.contains_key(*m)) {
        return bad(format!(
            "no input amax for the quantized layer `{m}`: calibrate every quantized layer or none"
        ));
    }
    Ok(())
}

fn weight_outputs(p: &str, n: usize, k: usize, opts: &QuantizeOptions) -> Vec<OutTensor> {
    match (opts.scheme, opts.layout) {
        (Scheme::Nvfp4, Layout::ModelOpt) => vec![
            OutTensor::new(format!("{p}.weight"), Dtype::U8, vec![n, k / 2]),
            OutTensor::new(format!("{p}.weight_scale"), Dtype::F8_E4M3, vec![n, k / 16]),
            OutTensor::new(format!("{p}.weight_scale_2"), Dtype::F32, vec![]),
        ],
        (Scheme::Nvfp4, Layout::CompressedTensors) => vec![
            OutTensor::new(format!("{p}.weight_packed"), Dtype::U8, vec![n, k / 2]),
            OutTensor::new(format!("{p}.weight_scale"), Dtype::F8_E4M3, vec![n, k / 16]),
            OutTensor::new(format!("{p}.weight_global_scale"), Dtype::F32, vec![1]),
        ],
        (Scheme::Mxfp8, _) => vec![
            OutTensor::new(format!("{p}.weight"), Dtype::F8_E4M3, vec![n, k]),
            OutTensor::new(format!("{p}.weight_scale"), Dtype::U8, vec![n, k / 32]),
        ],
    }
}

fn nonfinite(path: &Path, t: &InTensor, x: &[f32]) -> CheckpointError {
    let i = x.iter().position(|v| !v.is_finite()).unwrap_or(0);
    let cols = t.shape[1].max(1);
    CheckpointError::NonFinite {
        path: path.into(),
        tensor: t.name.clone(),
        row: i / cols,
        col: i % cols,
        value: x[i],
    }
}

/// Error statistics accumulated block by block, with exactly the arithmetic of
/// [`ErrorStats::new`] (one pass, no dequantized copy of the tensor).
#[derive(Default)]
struct StatsAcc {
    n: usize,
    sig: f64,
    noise: f64,
    err_sum: f64,
    mag_sum: f64,
    max_err: f64,
    flushed: usize,
    clipped: usize,
}

impl StatsAcc {
    fn add(&mut self, x: &[f32], y: &[f32], clip_at: f32) {
        for (&xf, &yf) in x.iter().zip(y) {
            let (xv, yv) = (xf as f64, yf as f64);
            let e = yv - xv;
            self.sig += xv * xv;
            self.noise += e * e;
            self.err_sum += e;
            self.mag_sum += xv.abs();
            self.max_err = self.max_err.max(e.abs());
            self.flushed += (xv != 0.0 && yv == 0.0) as usize;
            self.clipped += (xf.abs() > clip_at) as usize;
        }
        self.n += x.len();
    }

    fn finish(self) -> ErrorStats {
        if self.n == 0 {
            return ErrorStats::default();
        }
        let nf = self.n as f64;
        ErrorStats {
            count: self.n,
            rmse: (self.noise / nf).sqrt(),
            sqnr_db: 10.0 * (self.sig / self.noise).log10(),
            relative_bias: if self.mag_sum > 0.0 {
                self.err_sum / self.mag_sum
            } else {
                0.0
            },
            max_abs_error: self.max_err,
            clipped_fraction: self.clipped as f64 / nf,
            flushed_fraction: self.flushed as f64 / nf,
        }
    }
}

/// Quantizes one f32 weight; returns the output tensors' bytes (in [`quantized_outputs`]
/// order) and the error statistics (an element counts as clipped when its magnitude exceeds
/// the element maximum times its block's scale).
fn quantize_one(
    x: &[f32],
    rows: usize,
    cols: usize,
    opts: &QuantizeOptions,
) -> Result<(Vec<Vec<u8>>, Option<ErrorStats>), crate::FormatError> {
    let mut acc = StatsAcc::default();
    match opts.scheme {
        Scheme::Nvfp4 => {
            let (q, conv) = match opts.layout {
                Layout::ModelOpt => (
                    layouts::modelopt_nvfp4_quantize(x, rows, cols)?,
                    Nvfp4Convention::ModelOpt,
                ),
                Layout::CompressedTensors => (
                    layouts::ct_nvfp4_quantize(x, rows, cols)?,
                    Nvfp4Convention::CompressedTensors,
                ),
            };
            let stats = (!opts.no_stats).then(|| {
                let mut y = [0.0f32; 16];
                for ((b, c), s) in x
                    .chunks_exact(16)
                    .zip(q.packed.chunks_exact(8))
                    .zip(q.scales.chunks_exact(1))
                {
                    layouts::nvfp4_dequantize(c, s, q.tensor_scale, conv, &mut y);
                    let f = crate::ElementFormat::to_f32(crate::E4M3(s[0]));
                    let d = match conv {
                        Nvfp4Convention::ModelOpt => f * q.tensor_scale,
                        Nvfp4Convention::CompressedTensors => f / q.tensor_scale,
                    };
                    acc.add(b, &y, 6.0 * d);
                }
                acc.finish()
            });
            let ts = q.tensor_scale.to_le_bytes().to_vec();
            Ok((vec![q.packed, q.scales, ts], stats))
        }
        Scheme::Mxfp8 => {
            let q = layouts::mxfp8_quantize(x, rows, cols, opts.mx_scale)?;
            let stats = (!opts.no_stats).then(|| {
                let mut y = [0.0f32; 32];
                for ((b, c), s) in x
                    .chunks_exact(32)
                    .zip(q.codes.chunks_exact(32))
                    .zip(q.scales.chunks_exact(1))
                {
                    layouts::mxfp8_dequantize(c, s, &mut y);
                    acc.add(b, &y, 448.0 * crate::E8M0(s[0]).value());
                }
                acc.finish()
            });
            Ok((vec![q.codes, q.scales], stats))
        }
    }
}

fn quant_config(opts: &QuantizeOptions, ignored: &[String]) -> (Value, Option<Value>) {
    let version = env!("CARGO_PKG_VERSION");
    match (opts.scheme, opts.layout) {
        (Scheme::Nvfp4, Layout::ModelOpt) => {
            let hf = json!({
                "producer": {"name": "nibble-fp-formats", "version": version},
                "quantization": {
                    "quant_algo": "NVFP4",
                    "kv_cache_quant_algo": null,
                    "group_size": 16,
                    "exclude_modules": ignored,
                }
            });
            let cfg = json!({
                "config_groups": {"group_0": {
                    "input_activations": {"dynamic": false, "num_bits": 4, "type": "float", "group_size": 16},
                    "weights": {"dynamic": false, "num_bits": 4, "type": "float", "group_size": 16},
                    "targets": ["Linear"],
                }},
                "ignore": ignored,
                "quant_algo": "NVFP4",
                "producer": {"name": "nibble-fp-formats", "version": version},
                "quant_method": "modelopt",
            });
            (cfg, Some(hf))
        }
        (scheme, _) => {
            let (weights, format) = match scheme {
                Scheme::Nvfp4 => (
                    json!({
                        "num_bits": 4, "type": "float", "symmetric": true, "group_size": 16,
                        "strategy": "tensor_group", "block_structure": null, "dynamic": false,
                        "actorder": null, "scale_dtype": "torch.float8_e4m3fn",
                        "zp_dtype": "torch.float8_e4m3fn", "observer": "memoryless_minmax",
                        "observer_kwargs": {},
                    }),
                    "nvfp4-pack-quantized",
                ),
                Scheme::Mxfp8 => (
                    json!({
                        "num_bits": 8, "type": "float", "symmetric": true, "group_size": 32,
                        "strategy": "group", "block_structure": null, "dynamic": false,
                        "actorder": null, "scale_dtype": "torch.uint8",
                        "zp_dtype": "torch.uint8", "observer": "memoryless_minmax",
                        "observer_kwargs": {},
                    }),
                    "mxfp8-quantized",
                ),
            };
            // NVFP4 with calibrated global scales: the `NVFP4` scheme (W4A4, block scales
            // computed at run time, `dynamic: local`); otherwise `NVFP4A16` / `MXFP8A16`.
            let input_activations = if opts.input_amax.is_empty() {
                Value::Null
            } else {
                json!({
                    "num_bits": 4, "type": "float", "symmetric": true, "group_size": 16,
                    "strategy": "tensor_group", "block_structure": null, "dynamic": "local",
                    "actorder": null, "scale_dtype": "torch.float8_e4m3fn",
                    "zp_dtype": "torch.float8_e4m3fn", "observer": "static_minmax",
                    "observer_kwargs": {},
                })
            };
            let cfg = json!({
                "config_groups": {"group_0": {
                    "targets": ["Linear"],
                    "weights": weights,
                    "input_activations": input_activations,
                    "output_activations": null,
                    "format": format,
                }},
                "format": format,
                "global_compression_ratio": null,
                "ignore": ignored,
                "kv_cache_scheme": null,
                "quant_method": "compressed-tensors",
                "quantization_status": "compressed",
            });
            (cfg, None)
        }
    }
}

/// Quantizes a checkpoint (a `.safetensors` file or a model folder) into the new directory
/// `output`. See the [module documentation](self).
///
/// Errors (nothing is written): unreadable, truncated or corrupt safetensors; a selected
/// tensor with a dtype other than F32/BF16/F16, or whose inner dimension is not a multiple
/// of the block (16 for NVFP4, 32 for MXFP8); NaN or infinite weights (tensor and index);
/// an input that is already quantized; MXFP8 with [`Layout::ModelOpt`] (ModelOpt has no
/// MXFP8 checkpoint format); an output that exists and is not empty.
pub fn quantize_checkpoint(
    input: &Path,
    output: &Path,
    opts: &QuantizeOptions,
    progress: &dyn Progress,
) -> Result<Report, CheckpointError> {
    if opts.scheme == Scheme::Mxfp8 && opts.layout == Layout::ModelOpt {
        return Err(CheckpointError::Options(
            "ModelOpt has no MXFP8 checkpoint format; use the compressed-tensors layout".into(),
        ));
    }
    let inp = list_input(input)?;
    let files = inp
        .shards
        .iter()
        .map(|p| InputFile::open(p))
        .collect::<Result<Vec<_>, _>>()?;

    // Plan and validate everything before writing anything.
    let mut plans: Vec<(Vec<Job>, Vec<OutTensor>)> = vec![];
    let mut ignored = vec![];
    let mut quantized_modules = vec![];
    let mut rename = BTreeMap::new(); // input tensor -> output tensors (for the index)
    let (mut n_jobs, mut total) = (0usize, 0u64);
    for f in &files {
        let (mut jobs, mut outs) = (vec![], vec![]);
        if let Some(t) = f.tensors.iter().find(|t| {
            ["_scale", "_scale_2", "_packed", "_global_scale"]
                .iter()
                .any(|s| t.name.ends_with(&format!(".weight{s}")))
        }) {
            return Err(CheckpointError::Layout {
                path: f.path.clone(),
                message: format!(
                    "tensor `{}` looks quantized already (dequantize it first)",
                    t.name
                ),
            });
        }
        for t in &f.tensors {
            if opts.selection.selects(&t.name, &t.shape) {
                if !FLOAT_TYPES.contains(&t.dtype) {
                    return Err(CheckpointError::UnsupportedDtype {
                        path: f.path.clone(),
                        tensor: t.name.clone(),
                        dtype: io::dtype_name(t.dtype),
                    });
                }
                let block = if opts.scheme == Scheme::Nvfp4 { 16 } else { 32 };
                if t.shape[1] % block != 0 {
                    return Err(CheckpointError::BadShape {
                        path: f.path.clone(),
                        tensor: t.name.clone(),
                        shape: t.shape.clone(),
                        reason: format!(
                            "the inner dimension {} is not a multiple of the block size {block} \
                             (exclude the tensor with a pattern)",
                            t.shape[1]
                        ),
                    });
                }
                quantized_modules.push(module_of(&t.name).to_string());
                let o = quantized_outputs(t, opts);
                rename.insert(t.name.clone(), o.iter().map(|o| o.name.clone()).collect());
                outs.extend(o);
                jobs.push(Job::Quantize(t));
            } else {
                if t.shape.len() == 2 && t.name.ends_with(".weight") {
                    ignored.push(module_of(&t.name).to_string());
                }
                rename.insert(t.name.clone(), vec![t.name.clone()]);
                outs.push(OutTensor::new(t.name.clone(), t.dtype, t.shape.clone()));
                jobs.push(Job::Copy(t));
            }
            n_jobs += 1;
            total += (t.range.end - t.range.start) as u64;
        }
        plans.push((jobs, outs));
    }
    ignored.sort();
    quantized_modules.sort();
    check_input_amax(opts, &quantized_modules)?;
    progress.begin(n_jobs, total);

    let staging = Staging::new(output)?;
    let mut report = Report::default();
    let mut meta = output_metadata(&files, "quantized_by");
    meta.extend(opts.metadata.clone());
    for (f, (jobs, outs)) in files.iter().zip(&plans) {
        let name = f.path.file_name().expect("file name");
        let out_path = staging.tmp.join(name);
        let writer = Writer::create(&out_path, outs, &meta)?;
        let results = jobs
            .par_iter()
            .map(|job| -> Result<TensorReport, CheckpointError> {
                let t = match job {
                    Job::Copy(t) | Job::Quantize(t) => *t,
                };
                let bytes = f.bytes(t);
                let r = match job {
                    Job::Copy(_) => {
                        writer.write(&t.name, bytes)?;
                        TensorReport {
                            name: t.name.clone(),
                            shape: t.shape.clone(),
                            dtype: io::dtype_name(t.dtype),
                            action: Action::Copied,
                            stats: None,
                        }
                    }
                    Job::Quantize(_) => {
                        let mut x = vec![];
                        io::to_f32(t.dtype, bytes, &mut x);
                        let (rows, cols) = (t.shape[0], t.shape[1]);
                        let (mut data, stats) =
                            quantize_one(&x, rows, cols, opts).map_err(|e| match e {
                                crate::FormatError::NonFinite { .. } => nonfinite(&f.path, t, &x),
                                other => CheckpointError::BadShape {
                                    path: f.path.clone(),
                                    tensor: t.name.clone(),
                                    shape: t.shape.clone(),
                                    reason: other.to_string(),
                                },
                            })?;
                        data.extend(input_scale_bytes(module_of(&t.name), opts));
                        for (o, d) in quantized_outputs(t, opts).iter().zip(&data) {
                            writer.write(&o.name, d)?;
                        }
                        TensorReport {
                            name: t.name.clone(),
                            shape: t.shape.clone(),
                            dtype: io::dtype_name(t.dtype),
                            action: Action::Quantized,
                            stats,
                        }
                    }
                };
                progress.advance(&t.name, bytes.len() as u64);
                Ok(r)
            })
            .collect::<Result<Vec<_>, _>>()?;
        writer.finish()?;
        report.tensors.extend(results);
        report.bytes_read += f.len();
        report.bytes_written += fs::metadata(&out_path)
            .map_err(CheckpointError::io(&out_path))?
            .len();
        report.files.push(PathBuf::from(name));
    }

    let (cfg, hf) = quant_config(opts, &ignored);
    let mut has_config = false;
    for side in &inp.side_files {
        let name = side.file_name().expect("file name");
        let dst = staging.tmp.join(name);
        let n = name.to_string_lossy();
        if n == "config.json" {
            let mut c = read_json(side)?;
            if let Some(m) = c.as_object_mut() {
                m.insert("quantization_config".into(), cfg.clone());
            }
            write_json(&dst, &c)?;
            has_config = true;
        } else if n.ends_with(".safetensors.index.json") {
            let mut idx = read_json(side)?;
            if let Some(map) = idx.get("weight_map").and_then(Value::as_object).cloned() {
                let mut new = serde_json::Map::new();
                for (k, v) in map {
                    for o in rename.get(&k).cloned().unwrap_or_else(|| vec![k.clone()]) {
                        new.insert(o, v.clone());
                    }
                }
                idx["weight_map"] = Value::Object(new);
            }
            if let Some(m) = idx.as_object_mut() {
                let meta = m.entry("metadata").or_insert_with(|| json!({}));
                if let Some(meta) = meta.as_object_mut() {
                    meta.insert("total_size".into(), json!(report.bytes_written));
                }
            }
            write_json(&dst, &idx)?;
        } else if n == "hf_quant_config.json" {
            continue;
        } else {
            fs::copy(side, &dst).map_err(CheckpointError::io(side))?;
        }
        report.files.push(PathBuf::from(name));
    }
    if !has_config {
        write_json(
            &staging.tmp.join("config.json"),
            &json!({ "quantization_config": cfg }),
        )?;
        report.files.push("config.json".into());
    }
    if let Some(hf) = hf {
        write_json(&staging.tmp.join("hf_quant_config.json"), &hf)?;
        report.files.push("hf_quant_config.json".into());
    }
    staging.commit()?;
    Ok(report)
}

/// The logical `[N, K]` of packed FP4 data `[N, K/2]` (empty when it is not 2-D, which the
/// caller rejects).
fn packed_shape(t: &InTensor) -> Vec<usize> {
    match t.shape[..] {
        [n, half] => vec![n, half.saturating_mul(2)],
        _ => vec![],
    }
}

/// How a quantized weight `P.weight` is stored.
enum Stored<'a> {
    Nvfp4 {
        packed: &'a InTensor,
        scale: &'a InTensor,
        tensor_scale: &'a InTensor,
        conv: Nvfp4Convention,
    },
    Mxfp8 {
        codes: &'a InTensor,
        scale: &'a InTensor,
    },
}

fn scalar_f32(f: &InputFile, t: &InTensor) -> Result<f32, CheckpointError> {
    let b = f.bytes(t);
    if t.dtype != Dtype::F32 || b.len() != 4 {
        return Err(CheckpointError::Layout {
            path: f.path.clone(),
            message: format!("`{}` must be one F32 value", t.name),
        });
    }
    Ok(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// Dequantizes a checkpoint written in one of the [`Layout`]s (by this crate, ModelOpt or
/// llm-compressor) back to BF16 or F32 `P.weight` tensors, with the producer's arithmetic,
/// into the new directory `output`. Other tensors are copied (activation scales of
/// dequantized layers are dropped), `hf_quant_config.json` is dropped and
/// `quantization_config` removed from `config.json`.
///
/// With [`DequantizeOptions::reference`] (the checkpoint before quantization), each
/// dequantized weight gets error statistics against it.
pub fn dequantize_checkpoint(
    input: &Path,
    output: &Path,
    opts: &DequantizeOptions,
    progress: &dyn Progress,
) -> Result<Report, CheckpointError> {
    let inp = list_input(input)?;
    let files = inp
        .shards
        .iter()
        .map(|p| InputFile::open(p))
        .collect::<Result<Vec<_>, _>>()?;
    let refs = match &opts.reference {
        Some(r) => list_input(r)?
            .shards
            .iter()
            .map(|p| InputFile::open(p))
            .collect::<Result<Vec<_>, _>>()?,
        None => vec![],
    };
    let out_dtype = match opts.dtype {
        FloatType::Bf16 => Dtype::BF16,
        FloatType::F32 => Dtype::F32,
    };

    let layout_err = |f: &InputFile, m: String| CheckpointError::Layout {
        path: f.path.clone(),
        message: m,
    };
    // Plan per file: (weight name, stored form) and tensors to copy.
    let mut plans = vec![];
    let (mut n_jobs, mut total) = (0usize, 0u64);
    for f in &files {
        let mut consumed = std::collections::BTreeSet::new();
        let mut weights: Vec<(String, Vec<usize>, Stored)> = vec![];
        for t in &f.tensors {
            let Some(p) = t.name.strip_suffix(".weight_scale") else {
                continue;
            };
            let need = |n: &str| {
                f.get(n)
                    .ok_or_else(|| layout_err(f, format!("`{}` has no matching `{n}`", t.name)))
            };
            let (stored, shape) = if let Some(packed) = f.get(&format!("{p}.weight_packed")) {
                let g = need(&format!("{p}.weight_global_scale"))?;
                let s = packed_shape(packed);
                (
                    Stored::Nvfp4 {
                        packed,
                        scale: t,
                        tensor_scale: g,
                        conv: Nvfp4Convention::CompressedTensors,
                    },
                    s,
                )
            } else {
                let w = need(&format!("{p}.weight"))?;
                if w.dtype == Dtype::U8 {
                    let s2 = need(&format!("{p}.weight_scale_2"))?;
                    let s = packed_shape(w);
                    (
                        Stored::Nvfp4 {
                            packed: w,
                            scale: t,
                            tensor_scale: s2,
                            conv: Nvfp4Convention::ModelOpt,
                        },
                        s,
                    )
                } else if w.dtype == Dtype::F8_E4M3 {
                    (Stored::Mxfp8 { codes: w, scale: t }, w.shape.clone())
                } else {
                    return Err(layout_err(
                        f,
                        format!("`{p}.weight` has dtype {}", io::dtype_name(w.dtype)),
                    ));
                }
            };
            // Shapes: 2-D, scales per 16 (NVFP4) or 32 (MXFP8) along rows.
            let (block, sdt) = match &stored {
                Stored::Nvfp4 { .. } => (16, [Dtype::F8_E4M3, Dtype::F8_E4M3]),
                Stored::Mxfp8 { .. } => (32, [Dtype::U8, Dtype::F8_E8M0]),
            };
            let data_ok = match &stored {
                Stored::Nvfp4 { packed, .. } => packed.dtype == Dtype::U8,
                Stored::Mxfp8 { codes, .. } => codes.dtype == Dtype::F8_E4M3,
            };
            let ok = data_ok
                && shape.len() == 2
                && shape[1] % block == 0
                && t.shape == [shape[0], shape[1] / block]
                && sdt.contains(&t.dtype);
            if !ok {
                return Err(layout_err(
                    f,
                    format!(
                        "`{}` ({} {:?}) does not match the weight shape {shape:?}",
                        t.name,
                        io::dtype_name(t.dtype),
                        t.shape
                    ),
                ));
            }
            for n in [
                "weight",
                "weight_scale",
                "weight_scale_2",
                "weight_packed",
                "weight_global_scale",
                "input_scale",
                "input_global_scale",
            ] {
                consumed.insert(format!("{p}.{n}"));
            }
            weights.push((format!("{p}.weight"), shape, stored));
        }
        let copies: Vec<&InTensor> = f
            .tensors
            .iter()
            .filter(|t| !consumed.contains(&t.name))
            .collect();
        let mut outs: Vec<OutTensor> = copies
            .iter()
            .map(|t| OutTensor::new(t.name.clone(), t.dtype, t.shape.clone()))
            .collect();
        for (name, shape, _) in &weights {
            outs.push(OutTensor::new(name.clone(), out_dtype, shape.clone()));
        }
        n_jobs += copies.len() + weights.len();
        total += f.len();
        plans.push((weights, copies, outs));
    }
    progress.begin(n_jobs, total);

    let staging = Staging::new(output)?;
    let mut report = Report::default();
    let mut meta = output_metadata(&files, "dequantized_by");
    meta.remove("quantized_by");
    for (f, (weights, copies, outs)) in files.iter().zip(&plans) {
        let name = f.path.file_name().expect("file name");
        let out_path = staging.tmp.join(name);
        let writer = Writer::create(&out_path, outs, &meta)?;
        let mut results = copies
            .par_iter()
            .map(|t| -> Result<TensorReport, CheckpointError> {
                writer.write(&t.name, f.bytes(t))?;
                progress.advance(&t.name, (t.range.end - t.range.start) as u64);
                Ok(TensorReport {
                    name: t.name.clone(),
                    shape: t.shape.clone(),
                    dtype: io::dtype_name(t.dtype),
                    action: Action::Copied,
                    stats: None,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let deq = weights
            .par_iter()
            .map(
                |(wname, shape, stored)| -> Result<TensorReport, CheckpointError> {
                    let mut y = vec![0.0f32; shape[0] * shape[1]];
                    let (dtype, nbytes) = match stored {
                        Stored::Nvfp4 {
                            packed,
                            scale,
                            tensor_scale,
                            conv,
                        } => {
                            let ts = scalar_f32(f, tensor_scale)?;
                            layouts::nvfp4_dequantize(
                                f.bytes(packed),
                                f.bytes(scale),
                                ts,
                                *conv,
                                &mut y,
                            );
                            (packed.dtype, f.bytes(packed).len() + f.bytes(scale).len())
                        }
                        Stored::Mxfp8 { codes, scale } => {
                            layouts::mxfp8_dequantize(f.bytes(codes), f.bytes(scale), &mut y);
                            (codes.dtype, f.bytes(codes).len() + f.bytes(scale).len())
                        }
                    };
                    let bytes: Vec<u8> = match out_dtype {
                        Dtype::BF16 => {
                            for v in y.iter_mut() {
                                *v = half::bf16::from_f32(*v).to_f32();
                            }
                            y.iter()
                                .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
                                .collect()
                        }
                        _ => y.iter().flat_map(|v| v.to_le_bytes()).collect(),
                    };
                    writer.write(wname, &bytes)?;
                    let stats = match refs.iter().find_map(|r| r.get(wname).map(|t| (r, t))) {
                        Some((r, t)) => {
                            let mut x = vec![];
                            if !io::to_f32(t.dtype, r.bytes(t), &mut x) || x.len() != y.len() {
                                return Err(layout_err(
                                    r,
                                    format!("reference `{wname}` does not match {shape:?}"),
                                ));
                            }
                            Some(ErrorStats::new(&x, &y, 0))
                        }
                        None => None,
                    };
                    progress.advance(wname, nbytes as u64);
                    Ok(TensorReport {
                        name: wname.clone(),
                        shape: shape.clone(),
                        dtype: io::dtype_name(dtype),
                        action: Action::Dequantized,
                        stats,
                    })
                },
            )
            .collect::<Result<Vec<_>, _>>()?;
        results.extend(deq);
        results.sort_by(|a, b| a.name.cmp(&b.name));
        writer.finish()?;
        report.tensors.extend(results);
        report.bytes_read += f.len();
        report.bytes_written += fs::metadata(&out_path)
            .map_err(CheckpointError::io(&out_path))?
            .len();
        report.files.push(PathBuf::from(name));
    }
    for side in &inp.side_files {
        let name = side.file_name().expect("file name");
        let n = name.to_string_lossy();
        let dst = staging.tmp.join(name);
        if n == "hf_quant_config.json" {
            continue;
        } else if n == "config.json" {
            let mut c = read_json(side)?;
            if let Some(m) = c.as_object_mut() {
                m.remove("quantization_config");
                if m.is_empty() {
                    continue;
                }
            }
            write_json(&dst, &c)?;
        } else if n.ends_with(".safetensors.index.json") {
            let mut idx = read_json(side)?;
            if let Some(map) = idx.get("weight_map").and_then(Value::as_object).cloned() {
                let mut new = serde_json::Map::new();
                for (k, v) in map {
                    let base = [
                        ".weight_scale_2",
                        ".weight_scale",
                        ".weight_packed",
                        ".weight_global_scale",
                        ".input_scale",
                        ".input_global_scale",
                    ]
                    .iter()
                    .find_map(|s| k.strip_suffix(s).map(|p| format!("{p}.weight")))
                    .unwrap_or(k);
                    new.insert(base, v);
                }
                idx["weight_map"] = Value::Object(new);
            }
            if let Some(m) = idx.as_object_mut() {
                let meta = m.entry("metadata").or_insert_with(|| json!({}));
                if let Some(meta) = meta.as_object_mut() {
                    meta.insert("total_size".into(), json!(report.bytes_written));
                }
            }
            write_json(&dst, &idx)?;
        } else {
            fs::copy(side, &dst).map_err(CheckpointError::io(side))?;
        }
        report.files.push(PathBuf::from(name));
    }
    staging.commit()?;
    Ok(report)
}

/// Writes F32 tensors `(name, shape, values)` to a new safetensors file (a small helper for
/// tests, examples and exports).
///
/// # Panics
/// If a tensor's values do not match its shape.
///
/// ```
/// # let p = std::env::temp_dir().join(format!("fpf-w-{}.safetensors", std::process::id()));
/// fp_formats::checkpoint::write_f32_checkpoint(&p, &[("w", vec![2, 2], vec![1.0, 2.0, 3.0, 4.0])])?;
/// assert_eq!(std::fs::metadata(&p)?.len() % 8, 0);
/// # std::fs::remove_file(&p)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn write_f32_checkpoint(
    path: &Path,
    tensors: &[(&str, Vec<usize>, Vec<f32>)],
) -> Result<(), CheckpointError> {
    let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    write_f32_checkpoint_with_metadata(path, tensors, &meta)
}

/// [`write_f32_checkpoint`] with the given `__metadata__` (string to string).
///
/// # Panics
/// If a tensor's values do not match its shape.
///
/// ```
/// # let p = std::env::temp_dir().join(format!("fpf-wm-{}.safetensors", std::process::id()));
/// let meta = [("format".to_string(), "pt".to_string())].into_iter().collect();
/// fp_formats::checkpoint::write_f32_checkpoint_with_metadata(&p, &[("w", vec![1], vec![1.0])], &meta)?;
/// # std::fs::remove_file(&p)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn write_f32_checkpoint_with_metadata(
    path: &Path,
    tensors: &[(&str, Vec<usize>, Vec<f32>)],
    metadata: &BTreeMap<String, String>,
) -> Result<(), CheckpointError> {
    let outs: Vec<OutTensor> = tensors
        .iter()
        .map(|(n, s, v)| {
            assert_eq!(s.iter().product::<usize>(), v.len(), "values of {n}");
            OutTensor::new(*n, Dtype::F32, s.clone())
        })
        .collect();
    let w = Writer::create(path, &outs, metadata)?;
    for (n, _, v) in tensors {
        let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        w.write(n, &b)?;
    }
    w.finish()
}

/// The safetensors metadata of an output file: the first input file's, with the format
/// defaulted to `pt` and `stamp` naming this crate and its version.
fn output_metadata(files: &[InputFile], stamp: &str) -> BTreeMap<String, String> {
    let mut meta = files
        .first()
        .map(|f| f.metadata.clone())
        .unwrap_or_default();
    meta.entry("format".into()).or_insert_with(|| "pt".into());
    meta.insert(
        stamp.into(),
        format!("nibble fp-formats {}", env!("CARGO_PKG_VERSION")),
    );
    meta
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fused_statistics_equal_error_stats() {
        let x: Vec<f32> = (0..64 * 96)
            .map(|i| ((i * 7919 % 1013) as f32 / 500.0 - 1.0) * (1.0 + (i % 97) as f32))
            .collect();
        for (scheme, layout) in [
            (Scheme::Nvfp4, Layout::ModelOpt),
            (Scheme::Nvfp4, Layout::CompressedTensors),
            (Scheme::Mxfp8, Layout::CompressedTensors),
        ] {
            let opts = QuantizeOptions {
                scheme,
                layout,
                ..Default::default()
            };
            let (bytes, stats) = quantize_one(&x, 64, 96, &opts).unwrap();
            let mut y = vec![0.0f32; x.len()];
            match scheme {
                Scheme::Nvfp4 => {
                    let ts = f32::from_le_bytes(bytes[2][..4].try_into().unwrap());
                    let conv = if layout == Layout::ModelOpt {
                        Nvfp4Convention::ModelOpt
                    } else {
                        Nvfp4Convention::CompressedTensors
                    };
                    layouts::nvfp4_dequantize(&bytes[0], &bytes[1], ts, conv, &mut y);
                }
                Scheme::Mxfp8 => layouts::mxfp8_dequantize(&bytes[0], &bytes[1], &mut y),
            }
            let s = stats.unwrap();
            let reference = ErrorStats::new(&x, &y, (s.clipped_fraction * x.len() as f64) as usize);
            assert_eq!(s, reference, "{scheme:?} {layout:?}");
            if scheme == Scheme::Nvfp4 {
                assert!(
                    s.clipped_fraction > 0.0,
                    "NVFP4 scales round down: some clip"
                );
            }
        }
    }
}

//! Hugging Face export and import: a Nibble GPT as a `LlamaForCausalLM` folder, and back.
//!
//! The default GPT is Llama-shaped (RoPE in the rotate-half convention, pre-norm RMSNorm,
//! SwiGLU MLP, no biases, multi-head attention with as many key/value heads as query heads),
//! so it maps onto Hugging Face's Llama one to one:
//!
//! | Nibble | Hugging Face Llama |
//! |---|---|
//! | `embed.weight` | `model.embed_tokens.weight` |
//! | `blocks.{i}.attn_norm.weight` | `model.layers.{i}.input_layernorm.weight` |
//! | `blocks.{i}.attn.qkv.weight` rows `[0, d)`, `[d, 2d)`, `[2d, 3d)` | `model.layers.{i}.self_attn.{q,k,v}_proj.weight` |
//! | `blocks.{i}.attn.out.weight` | `model.layers.{i}.self_attn.o_proj.weight` |
//! | `blocks.{i}.mlp_norm.weight` | `model.layers.{i}.post_attention_layernorm.weight` |
//! | `blocks.{i}.mlp.up.weight` rows `[0, h)` (gate), `[h, 2h)` (up) | `model.layers.{i}.mlp.{gate,up}_proj.weight` |
//! | `blocks.{i}.mlp.down.weight` | `model.layers.{i}.mlp.down_proj.weight` |
//! | `final_norm.weight` | `model.norm.weight` |
//! | `lm_head.weight` (untied) | `lm_head.weight` (`tie_word_embeddings: false`) |
//!
//! Weights are exported as F32, so [`load_hf`] gives back the checkpoint's tensors bit for
//! bit. Models with the GELU MLP have no Llama equivalent and are refused. A byte-level
//! model (vocab 256) gets a `tokenizer.json` whose BPE has the 256 GPT-2 byte symbols as its
//! vocabulary (token id = byte value) and no merges, so `transformers` tokenizes text into
//! exactly Nibble's byte tokens.
//!
//! With a quantization scheme, the export is quantized by [`fp_formats::checkpoint`] (the
//! ModelOpt or compressed-tensors layout) after it is written, so a model trained under the
//! NVFP4 recipe can ship as an NVFP4 checkpoint.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use autograd::NamedTensor;
use fp_formats::checkpoint::{Layout, NoProgress, QuantizeOptions, Scheme};
use serde_json::{json, Value};

use crate::any_checkpoint::AnyCheckpoint;
use crate::data::{Tokenizer, TOKENIZER_FILE};
use crate::model::{MlpKind, ModelConfig};
use crate::rundir::StagedDir;

/// Why an export or import failed. Nothing is left in the output directory.
#[derive(Debug, thiserror::Error)]
pub enum HfError {
    /// The Nibble checkpoint could not be read.
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    /// The model cannot be expressed as a Hugging Face Llama (or the folder is not one
    /// Nibble can load).
    #[error("unsupported configuration: {0}")]
    Unsupported(String),
    /// A file of the folder is malformed or does not match the config.
    #[error("{}: {message}", path.display())]
    Bad {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// An I/O error.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        error: std::io::Error,
    },
    /// Writing, quantizing or reading safetensors failed.
    #[error(transparent)]
    Tensors(#[from] fp_formats::checkpoint::CheckpointError),
    /// The output directory could not be staged or committed (it exists and is not empty,
    /// or a file-system error).
    #[error(transparent)]
    Output(#[from] crate::rundir::StageError),
    /// The folder's tensors do not fit in memory (the message carries the estimate).
    #[error(transparent)]
    TooLarge(#[from] crate::memory::TooLarge),
    /// Activation calibration failed.
    #[error("calibration: {0}")]
    Calibrate(crate::calibrate::CalibrateError),
}

// Not `#[from]`: that would also return the calibration error as `source()`, and reporters
// that print causes (`anyhow`'s `{:#}`) would say it twice.
impl From<crate::calibrate::CalibrateError> for HfError {
    fn from(e: crate::calibrate::CalibrateError) -> Self {
        HfError::Calibrate(e)
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> HfError + '_ {
    move |error| HfError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// The `producer` recorded in exported files.
pub fn producer() -> String {
    format!("nibble trainer {}", env!("CARGO_PKG_VERSION"))
}

/// `config.json` of the Llama equivalent of `cfg` (errors for configurations without one).
///
/// ```
/// let cfg = trainer::model::ModelConfig::preset("tiny").unwrap();
/// let c = trainer::hf::llama_config(&cfg).unwrap();
/// assert_eq!(c["model_type"], "llama");
/// assert_eq!(c["hidden_size"], 32);
/// assert_eq!(c["num_key_value_heads"], c["num_attention_heads"]);
/// ```
pub fn llama_config(cfg: &ModelConfig) -> Result<Value, HfError> {
    cfg.validate()
        .map_err(|e| HfError::Unsupported(e.to_string()))?;
    if cfg.mlp != MlpKind::Swiglu {
        return Err(HfError::Unsupported(
            "the GELU MLP has no Hugging Face Llama equivalent (Llama's MLP is gated SwiGLU); \
             only `mlp = \"swiglu\"` models export"
                .into(),
        ));
    }
    Ok(json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.hidden,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_heads,
        "head_dim": cfg.d_model / cfg.n_heads,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.seq,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_base,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_base},
        "rope_scaling": null,
        "attention_bias": false,
        "attention_dropout": 0.0,
        "mlp_bias": false,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "use_cache": true,
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": null,
        "eos_token_id": null,
        "pad_token_id": null,
        "torch_dtype": "float32",
        "dtype": "float32",
    }))
}

fn get<'a>(
    tensors: &'a BTreeMap<&str, &NamedTensor>,
    name: &str,
) -> Result<&'a NamedTensor, HfError> {
    tensors.get(name).copied().ok_or_else(|| HfError::Bad {
        path: PathBuf::from(crate::checkpoint::TENSORS_FILE),
        message: format!("tensor `{name}` is missing"),
    })
}

/// A Hugging Face tensor: name, shape, F32 values.
pub type HfTensor = (String, Vec<usize>, Vec<f32>);

/// The Hugging Face tensors `(name, shape, values)` of a Nibble model's parameters (fused
/// QKV and gate/up split by rows; the data is copied unchanged).
pub fn to_hf_tensors(cfg: &ModelConfig, params: &[NamedTensor]) -> Result<Vec<HfTensor>, HfError> {
    llama_config(cfg)?;
    let by: BTreeMap<&str, &NamedTensor> = params.iter().map(|t| (t.name.as_str(), t)).collect();
    let (d, h) = (cfg.d_model, cfg.hidden);
    let mut out = vec![];
    let copy = |out: &mut Vec<_>, from: &str, to: String| -> Result<(), HfError> {
        let t = get(&by, from)?;
        out.push((to, t.shape.clone(), t.data.clone()));
        Ok(())
    };
    let rows = |t: &NamedTensor, r0: usize, r1: usize| -> Vec<f32> {
        let cols = t.shape[1];
        t.data[r0 * cols..r1 * cols].to_vec()
    };
    copy(&mut out, "embed.weight", "model.embed_tokens.weight".into())?;
    for i in 0..cfg.n_layers {
        let (p, q) = (format!("blocks.{i}"), format!("model.layers.{i}"));
        copy(
            &mut out,
            &format!("{p}.attn_norm.weight"),
            format!("{q}.input_layernorm.weight"),
        )?;
        let qkv = get(&by, &format!("{p}.attn.qkv.weight"))?;
        for (j, n) in ["q_proj", "k_proj", "v_proj"].iter().enumerate() {
            out.push((
                format!("{q}.self_attn.{n}.weight"),
                vec![d, d],
                rows(qkv, j * d, (j + 1) * d),
            ));
        }
        copy(
            &mut out,
            &format!("{p}.attn.out.weight"),
            format!("{q}.self_attn.o_proj.weight"),
        )?;
        copy(
            &mut out,
            &format!("{p}.mlp_norm.weight"),
            format!("{q}.post_attention_layernorm.weight"),
        )?;
        let up = get(&by, &format!("{p}.mlp.up.weight"))?;
        out.push((
            format!("{q}.mlp.gate_proj.weight"),
            vec![h, d],
            rows(up, 0, h),
        ));
        out.push((
            format!("{q}.mlp.up_proj.weight"),
            vec![h, d],
            rows(up, h, 2 * h),
        ));
        copy(
            &mut out,
            &format!("{p}.mlp.down.weight"),
            format!("{q}.mlp.down_proj.weight"),
        )?;
    }
    copy(&mut out, "final_norm.weight", "model.norm.weight".into())?;
    if !cfg.tie_embeddings {
        copy(&mut out, "lm_head.weight", "lm_head.weight".into())?;
    }
    Ok(out)
}

/// The GPT-2 byte-to-character table (printable bytes map to themselves, the others to
/// `U+0100 + n`), used by byte-level BPE vocabularies.
pub fn byte_to_char() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable =
            (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        table[b as usize] = if printable {
            char::from_u32(b).expect("Latin-1")
        } else {
            n += 1;
            char::from_u32(0xFF + n).expect("Latin Extended-A")
        };
    }
    table
}

/// `tokenizer.json` of the byte-level vocabulary: token id = byte value.
pub fn byte_tokenizer_json() -> Value {
    let vocab: serde_json::Map<String, Value> = byte_to_char()
        .iter()
        .enumerate()
        .map(|(i, c)| (c.to_string(), json!(i)))
        .collect();
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false});
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": byte_level,
        "post_processor": null,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": false,
            "vocab": vocab,
            "merges": [],
        }
    })
}

fn write_json(path: &Path, v: &Value) -> Result<(), HfError> {
    let mut s = serde_json::to_string_pretty(v).expect("JSON");
    s.push('\n');
    fs::write(path, s).map_err(io(path))
}

/// How to export.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExportOptions {
    /// Quantize the linear layers (embedding, LM head and norms stay F32).
    pub quantize: Option<(Scheme, Layout)>,
    /// Extra safetensors metadata (e.g. the training step and recipe).
    pub metadata: BTreeMap<String, String>,
    /// [`export`] only: calibrate the activation scales of an NVFP4 export on this many
    /// batches of the run's validation data ([`crate::calibrate::calibrate_checkpoint`]).
    pub calibrate: Option<usize>,
    /// Calibrated input amax per linear layer, by the model's names (`blocks.{i}.attn.qkv`,
    /// ..., from [`crate::calibrate`]): an NVFP4 export gets ModelOpt `input_scale` or
    /// compressed-tensors `input_global_scale` tensors (see [`hf_input_amax`]).
    pub input_amax: BTreeMap<String, f32>,
    /// The `tokenizer.json` to ship ([`crate::data::Tokenizer::to_json`]); `None`: the
    /// byte-level one for a vocabulary of 256, none otherwise. [`export`] fills it from
    /// [`tokenizer_of`].
    pub tokenizer_json: Option<String>,
}

/// The tokenizer that goes with a model: for a Hugging Face folder its `tokenizer.json`;
/// for a checkpoint or run directory the `tokenizer.json` the run keeps (a run on a
/// `trainer tokenize` folder), else the one its data source implies (byte-level for the
/// corpus and text files, the tokenized folder's). `None` when it is unknown (a bare shard,
/// or a folder without `tokenizer.json`).
pub fn tokenizer_of(path: &Path) -> Result<Option<Tokenizer>, HfError> {
    let tok = |p: &Path| {
        Tokenizer::from_file(p).map_err(|e| HfError::Bad {
            path: p.to_path_buf(),
            message: e.to_string(),
        })
    };
    if is_hf_folder(path) {
        let p = path.join(TOKENIZER_FILE);
        return if p.is_file() {
            tok(&p).map(Some)
        } else {
            Ok(None)
        };
    }
    let rl_dir = crate::rl::checkpoint::resolve(path);
    let dir = match &rl_dir {
        Some(d) => d.clone(),
        None => crate::checkpoint::resolve(path)?,
    };
    // run/checkpoints/step_N -> run
    let run = dir.parent().and_then(Path::parent);
    for d in [Some(path), Some(dir.as_path()), run].into_iter().flatten() {
        let p = d.join(TOKENIZER_FILE);
        if p.is_file() {
            return tok(&p).map(Some);
        }
    }
    if rl_dir.is_some() {
        // an RL run keeps tokenizer.json unless its model is byte-level
        return Ok(Some(Tokenizer::Bytes));
    }
    let spath = dir.join(crate::checkpoint::STATE_FILE);
    let text = fs::read_to_string(&spath).map_err(io(&spath))?;
    let state: crate::checkpoint::TrainState =
        serde_json::from_str(&text).map_err(|e| HfError::Bad {
            path: spath.clone(),
            message: e.to_string(),
        })?;
    state.data.tokenizer().map_err(|e| HfError::Bad {
        path: spath,
        message: e.to_string(),
    })
}

/// The input amaxes of the Hugging Face modules, from those of the model's linear layers:
/// the fused QKV's goes to `q_proj`, `k_proj` and `v_proj` (they read the same input), the
/// fused gate/up's to `gate_proj` and `up_proj`; the LM head's is dropped (it stays F32).
///
/// Errors: a name that is not a linear layer of `cfg`, a missing layer.
///
/// ```
/// use std::collections::BTreeMap;
/// let cfg = trainer::model::ModelConfig::preset("tiny").unwrap();
/// let mut a = BTreeMap::new();
/// for i in 0..2 {
///     for (k, v) in [("attn.qkv", 1.0), ("attn.out", 2.0), ("mlp.up", 3.0), ("mlp.down", 4.0)] {
///         a.insert(format!("blocks.{i}.{k}"), v);
///     }
/// }
/// let hf = trainer::hf::hf_input_amax(&cfg, &a).unwrap();
/// assert_eq!(hf.len(), 2 * 7);
/// assert_eq!(hf["model.layers.1.self_attn.v_proj"], 1.0);
/// assert_eq!(hf["model.layers.0.mlp.gate_proj"], 3.0);
/// ```
pub fn hf_input_amax(
    cfg: &ModelConfig,
    amax: &BTreeMap<String, f32>,
) -> Result<BTreeMap<String, f32>, HfError> {
    let mut out = BTreeMap::new();
    let mut used = 0;
    for i in 0..cfg.n_layers {
        let q = format!("model.layers.{i}");
        let targets: [(&str, &[&str]); 4] = [
            (
                "attn.qkv",
                &["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
            ),
            ("attn.out", &["self_attn.o_proj"]),
            ("mlp.up", &["mlp.gate_proj", "mlp.up_proj"]),
            ("mlp.down", &["mlp.down_proj"]),
        ];
        for (nibble, hf) in targets {
            let name = format!("blocks.{i}.{nibble}");
            let a = *amax.get(&name).ok_or_else(|| {
                HfError::Unsupported(format!("no calibrated input amax for `{name}`"))
            })?;
            used += 1;
            for h in hf {
                out.insert(format!("{q}.{h}"), a);
            }
        }
    }
    used += usize::from(amax.contains_key("lm_head"));
    if used != amax.len() {
        let extra = amax
            .keys()
            .find(|k| {
                *k != "lm_head"
                    && !(0..cfg.n_layers).any(|i| k.starts_with(&format!("blocks.{i}.")))
            })
            .cloned()
            .unwrap_or_default();
        return Err(HfError::Unsupported(format!(
            "input amax for `{extra}`, which is not a linear layer of a {}-layer model",
            cfg.n_layers
        )));
    }
    Ok(out)
}

/// What [`export_model`] wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct ExportReport {
    /// Files in the output folder.
    pub files: Vec<String>,
    /// Tensors written (before quantization).
    pub tensors: usize,
    /// Linear weights quantized.
    pub quantized: usize,
    /// Why no tokenizer files were written, if none were.
    pub tokenizer_note: Option<String>,
}

/// Writes a Hugging Face Llama folder for a model given as its config and parameters: see
/// the [module documentation](self). `out` must not exist or be empty.
pub fn export_model(
    cfg: &ModelConfig,
    params: &[NamedTensor],
    out: &Path,
    opts: &ExportOptions,
) -> Result<ExportReport, HfError> {
    let config = llama_config(cfg)?;
    let tensors = to_hf_tensors(cfg, params)?;
    let input_amax =
        if opts.input_amax.is_empty() {
            BTreeMap::new()
        } else {
            match opts.quantize {
                Some((Scheme::Nvfp4, _)) => hf_input_amax(cfg, &opts.input_amax)?,
                _ => return Err(HfError::Unsupported(
                    "calibrated activation scales belong to an NVFP4 export (--quantize nvfp4); \
                     MXFP8 scales activations per block at run time"
                        .into(),
                )),
            }
        };
    let staging = StagedDir::new(out, "export")?;
    let dir = staging.path();
    let mut meta = BTreeMap::from([
        ("format".to_string(), "pt".to_string()),
        ("producer".to_string(), producer()),
        (
            "nibble_model_config".to_string(),
            serde_json::to_string(cfg).expect("config JSON"),
        ),
        ("hf_config".to_string(), config.to_string()),
    ]);
    meta.extend(opts.metadata.clone());
    let refs: Vec<(&str, Vec<usize>, Vec<f32>)> = tensors
        .iter()
        .map(|(n, s, v)| (n.as_str(), s.clone(), v.clone()))
        .collect();
    fp_formats::checkpoint::write_f32_checkpoint_with_metadata(
        &dir.join("model.safetensors"),
        &refs,
        &meta,
    )?;
    write_json(&dir.join("config.json"), &config)?;
    write_json(
        &dir.join("generation_config.json"),
        &json!({"max_length": cfg.seq, "do_sample": false, "bos_token_id": null, "eos_token_id": null, "pad_token_id": null}),
    )?;
    let tokenizer_json = match &opts.tokenizer_json {
        Some(t) => Some(t.clone()),
        None if cfg.vocab == 256 => Some(Tokenizer::Bytes.to_json()),
        None => None,
    };
    let tokenizer_note = if let Some(t) = tokenizer_json {
        let p = dir.join(TOKENIZER_FILE);
        fs::write(&p, t).map_err(io(&p))?;
        write_json(
            &dir.join("tokenizer_config.json"),
            &json!({
                "tokenizer_class": "PreTrainedTokenizerFast",
                "model_max_length": cfg.seq,
                "clean_up_tokenization_spaces": false,
                "add_bos_token": false,
                "add_eos_token": false,
            }),
        )?;
        None
    } else {
        Some(format!(
            "vocabulary of {} tokens and no tokenizer found with the model: no tokenizer files \
             written (add the tokenizer.json the token shards were made with)",
            cfg.vocab
        ))
    };
    let mut report = ExportReport {
        files: vec![],
        tensors: tensors.len(),
        quantized: 0,
        tokenizer_note,
    };
    match opts.quantize {
        None => {
            staging.commit()?;
        }
        Some((scheme, layout)) => {
            let q = QuantizeOptions {
                scheme,
                layout,
                metadata: BTreeMap::from([("producer".to_string(), producer())]),
                no_stats: true,
                input_amax,
                ..Default::default()
            };
            let r =
                fp_formats::checkpoint::quantize_checkpoint(staging.path(), out, &q, &NoProgress)?;
            report.quantized = r.quantized().count();
            drop(staging);
        }
    }
    let mut files: Vec<String> = fs::read_dir(out)
        .map_err(io(out))?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    files.sort();
    report.files = files;
    Ok(report)
}

/// Exports a Nibble checkpoint, pretraining or RL ([`AnyCheckpoint`]: a checkpoint directory
/// or a run directory, whose latest checkpoint is used) as a Hugging Face Llama folder.
pub fn export(src: &Path, out: &Path, opts: &ExportOptions) -> Result<ExportReport, HfError> {
    let ck = AnyCheckpoint::load(src)?;
    let mut opts = opts.clone();
    if opts.tokenizer_json.is_none() {
        if let Some(t) = tokenizer_of(src)? {
            if t.vocab_size() as usize > ck.model().vocab {
                return Err(HfError::Unsupported(format!(
                    "the tokenizer ({}) has more tokens than the model ({})",
                    t.describe(),
                    ck.model().vocab
                )));
            }
            opts.tokenizer_json = Some(t.to_json());
        }
    }
    opts.metadata
        .entry("nibble_step".into())
        .or_insert_with(|| ck.step().to_string());
    opts.metadata
        .entry("nibble_recipe".into())
        .or_insert_with(|| ck.trained_by());
    if let Some(n) = opts.calibrate {
        if !matches!(opts.quantize, Some((Scheme::Nvfp4, _))) {
            return Err(HfError::Unsupported(
                "calibration (--calibrate) is for an NVFP4 export (--quantize nvfp4); MXFP8 \
                 scales activations per block at run time"
                    .into(),
            ));
        }
        let amax = match &ck {
            AnyCheckpoint::Pretrain(c) => crate::calibrate::calibrate_checkpoint(c, n)?,
            AnyCheckpoint::Rl(rl) => {
                // the policy's activations on the pretraining data of the checkpoint RL
                // started from (its task + corpus mix)
                let start = Path::new(&rl.state.start);
                let mut base = crate::checkpoint::load(start).map_err(|e| {
                    HfError::Unsupported(format!(
                        "calibrating an RL checkpoint reads the data of the checkpoint RL \
                         started from ({}), which cannot be loaded: {e}",
                        start.display()
                    ))
                })?;
                base.state.model = rl.state.model.clone();
                base.tensors = rl.tensors.clone();
                crate::calibrate::calibrate_checkpoint(&base, n)?
            }
        };
        opts.input_amax = amax.into_iter().map(|a| (a.name, a.amax)).collect();
        opts.metadata
            .insert("nibble_calibration_batches".into(), n.to_string());
    }
    export_model(ck.model(), ck.tensors(), out, &opts)
}

fn cfg_usize(c: &Value, key: &str, path: &Path) -> Result<usize, HfError> {
    c.get(key)
        .and_then(Value::as_u64)
        .map(|v| v as usize)
        .ok_or_else(|| HfError::Bad {
            path: path.to_path_buf(),
            message: format!("`{key}` missing or not a non-negative integer"),
        })
}

/// The Nibble [`ModelConfig`] of a Hugging Face Llama `config.json` (errors for anything
/// the GPT cannot run: grouped-query attention, biases, other activations, RoPE scaling,
/// another head size, quantized folders).
pub fn model_config_from_llama(c: &Value, path: &Path) -> Result<ModelConfig, HfError> {
    let unsupported = |m: String| Err(HfError::Unsupported(format!("{}: {m}", path.display())));
    let s = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or("");
    if s("model_type") != "llama" {
        return unsupported(format!(
            "model_type `{}`, only `llama` loads",
            s("model_type")
        ));
    }
    if c.get("quantization_config").is_some_and(|q| !q.is_null()) {
        return unsupported(
            "the folder is quantized; dequantize it first (fp-formats' quantize_checkpoint \
             example, `dequantize --dtype f32`)"
                .into(),
        );
    }
    if s("hidden_act") != "silu" {
        return unsupported(format!(
            "hidden_act `{}`, only `silu` (SwiGLU) loads",
            s("hidden_act")
        ));
    }
    for k in ["attention_bias", "mlp_bias"] {
        if c.get(k).and_then(Value::as_bool).unwrap_or(false) {
            return unsupported(format!("`{k}` is true; the GPT has no biases"));
        }
    }
    if c.get("rope_scaling").is_some_and(|v| !v.is_null())
        || c.get("rope_parameters")
            .and_then(|r| r.get("rope_type"))
            .and_then(Value::as_str)
            .is_some_and(|t| t != "default")
    {
        return unsupported("RoPE scaling is not supported".into());
    }
    let d = cfg_usize(c, "hidden_size", path)?;
    let heads = cfg_usize(c, "num_attention_heads", path)?;
    let kv = c
        .get("num_key_value_heads")
        .and_then(Value::as_u64)
        .map(|v| v as usize)
        .unwrap_or(heads);
    if kv != heads {
        return unsupported(format!(
            "grouped-query attention ({kv} key/value heads for {heads} query heads)"
        ));
    }
    if let Some(hd) = c.get("head_dim").and_then(Value::as_u64) {
        if heads == 0 || hd.checked_mul(heads as u64) != Some(d as u64) {
            return unsupported(format!("head_dim {hd} x {heads} heads != hidden_size {d}"));
        }
    }
    let rope = c
        .get("rope_parameters")
        .and_then(|r| r.get("rope_theta"))
        .or_else(|| c.get("rope_theta"))
        .and_then(Value::as_f64)
        .unwrap_or(10_000.0);
    let cfg = ModelConfig {
        vocab: cfg_usize(c, "vocab_size", path)?,
        d_model: d,
        n_layers: cfg_usize(c, "num_hidden_layers", path)?,
        n_heads: heads,
        hidden: cfg_usize(c, "intermediate_size", path)?,
        mlp: MlpKind::Swiglu,
        seq: cfg_usize(c, "max_position_embeddings", path)?,
        tie_embeddings: c
            .get("tie_word_embeddings")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        rope_base: rope as f32,
        norm_eps: c
            .get("rms_norm_eps")
            .and_then(Value::as_f64)
            .unwrap_or(1e-6) as f32,
    };
    cfg.validate()
        .map_err(|e| HfError::Unsupported(format!("{}: {e}", path.display())))?;
    Ok(cfg)
}

/// Whether `path` is a Hugging Face model folder rather than a Nibble checkpoint or run
/// directory: it has a `config.json` and neither a checkpoint `state.json`, a `latest`
/// pointer nor a `checkpoints/` folder.
pub fn is_hf_folder(path: &Path) -> bool {
    path.join("config.json").is_file()
        && !path.join(crate::checkpoint::STATE_FILE).exists()
        && !path.join(crate::checkpoint::LATEST_FILE).exists()
        && !path.join("checkpoints").exists()
}

/// Loads a Hugging Face Llama folder (as written by [`export_model`], or any unquantized
/// Llama checkpoint of a shape the GPT supports) as a Nibble config and parameters named as
/// in [`crate::model`]. F32 weights load bit for bit; BF16 and F16 are widened exactly.
pub fn load_hf(dir: &Path) -> Result<(ModelConfig, Vec<NamedTensor>), HfError> {
    let cpath = dir.join("config.json");
    let text = fs::read_to_string(&cpath).map_err(io(&cpath))?;
    let c: Value = serde_json::from_str(&text).map_err(|e| HfError::Bad {
        path: cpath.clone(),
        message: e.to_string(),
    })?;
    let cfg = model_config_from_llama(&c, &cpath)?;
    // All shards.
    let mut shards: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(io(dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    shards.sort();
    if shards.is_empty() {
        return Err(HfError::Bad {
            path: dir.to_path_buf(),
            message: "no .safetensors file".into(),
        });
    }
    // the file bytes, their f32 values (twice the bytes for BF16/F16) and the parameters
    let bytes: u128 = shards
        .iter()
        .filter_map(|p| fs::metadata(p).ok())
        .map(|m| u128::from(m.len()))
        .sum();
    crate::memory::check(&format!("loading {}", dir.display()), bytes * 5)?;
    let mut hf: BTreeMap<String, (Vec<usize>, Vec<f32>)> = BTreeMap::new();
    for p in &shards {
        let bytes = fs::read(p).map_err(io(p))?;
        let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| HfError::Bad {
            path: p.clone(),
            message: e.to_string(),
        })?;
        for (name, v) in st.tensors() {
            let b = v.data();
            let data: Vec<f32> = match v.dtype() {
                safetensors::Dtype::F32 => b
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
                safetensors::Dtype::BF16 => b
                    .chunks_exact(2)
                    .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
                    .collect(),
                safetensors::Dtype::F16 => b
                    .chunks_exact(2)
                    .map(|c| fp_formats::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                    .collect(),
                other => {
                    return Err(HfError::Bad {
                        path: p.clone(),
                        message: format!(
                            "tensor `{name}` has dtype {other:?}; F32, BF16 or F16 expected"
                        ),
                    })
                }
            };
            hf.insert(name, (v.shape().to_vec(), data));
        }
    }
    let wpath = shards[0].clone();
    let mut take = |name: &str, shape: &[usize]| -> Result<Vec<f32>, HfError> {
        let (s, v) = hf.remove(name).ok_or_else(|| HfError::Bad {
            path: wpath.clone(),
            message: format!("tensor `{name}` is missing"),
        })?;
        if s != shape {
            return Err(HfError::Bad {
                path: wpath.clone(),
                message: format!("tensor `{name}` has shape {s:?}, the config needs {shape:?}"),
            });
        }
        Ok(v)
    };
    let (d, h, v) = (cfg.d_model, cfg.hidden, cfg.vocab);
    let mut out = vec![];
    let mut push = |name: String, shape: Vec<usize>, data: Vec<f32>| {
        out.push(NamedTensor { name, shape, data });
    };
    push(
        "embed.weight".into(),
        vec![v, d],
        take("model.embed_tokens.weight", &[v, d])?,
    );
    for i in 0..cfg.n_layers {
        let (p, q) = (format!("blocks.{i}"), format!("model.layers.{i}"));
        push(
            format!("{p}.attn_norm.weight"),
            vec![d],
            take(&format!("{q}.input_layernorm.weight"), &[d])?,
        );
        let mut qkv = Vec::with_capacity(3 * d * d);
        for n in ["q_proj", "k_proj", "v_proj"] {
            qkv.extend(take(&format!("{q}.self_attn.{n}.weight"), &[d, d])?);
        }
        push(format!("{p}.attn.qkv.weight"), vec![3 * d, d], qkv);
        push(
            format!("{p}.attn.out.weight"),
            vec![d, d],
            take(&format!("{q}.self_attn.o_proj.weight"), &[d, d])?,
        );
        push(
            format!("{p}.mlp_norm.weight"),
            vec![d],
            take(&format!("{q}.post_attention_layernorm.weight"), &[d])?,
        );
        let mut up = take(&format!("{q}.mlp.gate_proj.weight"), &[h, d])?;
        up.extend(take(&format!("{q}.mlp.up_proj.weight"), &[h, d])?);
        push(format!("{p}.mlp.up.weight"), vec![2 * h, d], up);
        push(
            format!("{p}.mlp.down.weight"),
            vec![d, h],
            take(&format!("{q}.mlp.down_proj.weight"), &[d, h])?,
        );
    }
    push(
        "final_norm.weight".into(),
        vec![d],
        take("model.norm.weight", &[d])?,
    );
    if !cfg.tie_embeddings {
        push(
            "lm_head.weight".into(),
            vec![v, d],
            take("lm_head.weight", &[v, d])?,
        );
    }
    // Rotary caches some exporters store are derived data; anything else is a mismatch.
    hf.retain(|k, _| !k.ends_with("rotary_emb.inv_freq"));
    if let Some(k) = hf.keys().next() {
        return Err(HfError::Bad {
            path: wpath,
            message: format!(
                "tensor `{k}` does not belong to a {}-layer Llama",
                cfg.n_layers
            ),
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((cfg, out))
}

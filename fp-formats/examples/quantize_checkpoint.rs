//! Whole-checkpoint quantization with `fp_formats::checkpoint` (feature `checkpoint`).
//!
//! ```text
//! cargo run --release -p fp-formats --features checkpoint --example quantize_checkpoint -- \
//!     quantize MODEL_DIR_OR_FILE --out DIR [--scheme nvfp4|mxfp8]
//!     [--layout modelopt|compressed-tensors] [--mx-scale rceil|floor|compressed-tensors]
//!     [--include GLOB]... [--exclude GLOB]... [--no-default-excludes] [--no-stats] [--threads N]
//! ... dequantize QUANTIZED --out DIR [--dtype bf16|f32] [--reference ORIGINAL]
//! ... copy MODEL_DIR_OR_FILE --out DIR      # plain read + write of the .safetensors bytes
//! ```
//!
//! Prints a progress bar on stderr, then one line per quantized tensor (SQNR, RMSE, clipped
//! and flushed fractions) and the throughput in GB/s of input.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use fp_formats::checkpoint::{
    dequantize_checkpoint, layouts::MxScale, quantize_checkpoint, Action, DequantizeOptions,
    FloatType, Layout, Progress, QuantizeOptions, Report, Scheme,
};
use indicatif::{ProgressBar, ProgressStyle};

const USAGE: &str = "\
usage: quantize_checkpoint quantize INPUT --out DIR [options]
       quantize_checkpoint dequantize INPUT --out DIR [--dtype bf16|f32] [--reference ORIGINAL]
       quantize_checkpoint copy INPUT --out DIR

INPUT is a .safetensors file or a Hugging Face model folder (shards, config.json, tokenizer).
DIR must not exist (or be empty); it appears only when everything succeeded.

quantize options:
  --scheme nvfp4|mxfp8                     (default nvfp4)
  --layout modelopt|compressed-tensors     (default modelopt; mxfp8 needs compressed-tensors)
  --mx-scale rceil|floor|compressed-tensors  MXFP8 block exponents (default rceil)
  --include GLOB     quantize only 2-D *.weight tensors matching GLOB (repeatable; default *)
  --exclude GLOB     leave matching tensors unquantized (repeatable; added to the defaults
                     *embed* *lm_head* *norm* *wte* *wpe*)
  --no-default-excludes
  --no-stats         skip the per-tensor error statistics
  --threads N        worker threads (default: all cores)";

struct Bar(ProgressBar);

impl Progress for Bar {
    fn begin(&self, _tensors: usize, bytes: u64) {
        self.0.set_length(bytes);
    }
    fn advance(&self, tensor: &str, bytes: u64) {
        self.0.set_message(tensor.to_string());
        self.0.inc(bytes);
    }
}

fn bar() -> Bar {
    let pb = ProgressBar::new(0);
    pb.set_style(
        ProgressStyle::with_template(
            "{bar:30} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta} {wide_msg}",
        )
        .expect("template"),
    );
    Bar(pb)
}

/// Command, input, output and `(option, value)` pairs.
type Parsed = (String, PathBuf, PathBuf, Vec<(String, String)>);

fn parse(args: &[String]) -> Result<Parsed, String> {
    let mut it = args.iter();
    let cmd = it.next().ok_or("missing command")?.clone();
    let (mut input, mut out, mut opts) = (None, None, vec![]);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--out" => out = Some(PathBuf::from(it.next().ok_or("--out needs a value")?)),
            "--no-stats" | "--no-default-excludes" => opts.push((a.clone(), String::new())),
            s if s.starts_with("--") => {
                let v = it.next().ok_or(format!("{s} needs a value"))?;
                opts.push((s.to_string(), v.clone()));
            }
            _ if input.is_none() => input = Some(PathBuf::from(a)),
            _ => return Err(format!("unexpected argument {a}")),
        }
    }
    Ok((
        cmd,
        input.ok_or("missing INPUT")?,
        out.ok_or("missing --out DIR")?,
        opts,
    ))
}

fn print_report(r: &Report, secs: f64) {
    let q: Vec<_> = r
        .tensors
        .iter()
        .filter(|t| t.action != Action::Copied)
        .collect();
    if q.iter().any(|t| t.stats.is_some()) {
        println!(
            "{:<48} {:>14} {:>5} {:>9} {:>11} {:>9} {:>9}",
            "tensor", "shape", "dtype", "SQNR dB", "RMSE", "clipped", "flushed"
        );
        for t in &q {
            if let Some(s) = t.stats {
                println!(
                    "{:<48} {:>14} {:>5} {:>9.2} {:>11.4e} {:>9.2e} {:>9.2e}",
                    t.name,
                    format!("{:?}", t.shape),
                    t.dtype,
                    s.sqnr_db,
                    s.rmse,
                    s.clipped_fraction,
                    s.flushed_fraction
                );
            }
        }
    }
    let copied = r.tensors.len() - q.len();
    println!(
        "{} tensors converted, {copied} copied; {:.1} MB read, {:.1} MB written in {secs:.2} s: {:.3} GB/s of input",
        q.len(),
        r.bytes_read as f64 / 1e6,
        r.bytes_written as f64 / 1e6,
        r.bytes_read as f64 / secs / 1e9
    );
    println!(
        "files: {}",
        r.files
            .iter()
            .map(|f| f.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
}

/// The baseline of the bench figure: read each `.safetensors` file and write it to `out`
/// unchanged, synced like the quantizer's output.
fn copy(input: &Path, out: &Path) -> Result<(u64, f64), String> {
    use std::io::Write;
    let files: Vec<PathBuf> = if input.is_file() {
        vec![input.into()]
    } else {
        let mut v: Vec<PathBuf> = std::fs::read_dir(input)
            .map_err(|e| e.to_string())?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        v.sort();
        v
    };
    if out.exists() {
        return Err(format!("{} exists", out.display()));
    }
    std::fs::create_dir_all(out).map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let mut total = 0;
    for f in files {
        let data = std::fs::read(&f).map_err(|e| e.to_string())?;
        let mut o = std::fs::File::create(out.join(f.file_name().expect("name")))
            .map_err(|e| e.to_string())?;
        o.write_all(&data).map_err(|e| e.to_string())?;
        o.sync_all().map_err(|e| e.to_string())?;
        total += data.len() as u64;
    }
    Ok((total, t0.elapsed().as_secs_f64()))
}

fn run(args: &[String]) -> Result<(), String> {
    if args.is_empty() || args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return Ok(());
    }
    let (cmd, input, out, opts) = parse(args)?;
    let mut q = QuantizeOptions::default();
    let mut d = DequantizeOptions::default();
    for (k, v) in &opts {
        match (cmd.as_str(), k.as_str()) {
            ("quantize", "--scheme") => {
                q.scheme = match v.as_str() {
                    "nvfp4" => Scheme::Nvfp4,
                    "mxfp8" => Scheme::Mxfp8,
                    _ => return Err(format!("unknown scheme {v}")),
                }
            }
            ("quantize", "--layout") => {
                q.layout = match v.as_str() {
                    "modelopt" => Layout::ModelOpt,
                    "compressed-tensors" => Layout::CompressedTensors,
                    _ => return Err(format!("unknown layout {v}")),
                }
            }
            ("quantize", "--mx-scale") => {
                q.mx_scale = match v.as_str() {
                    "rceil" => MxScale::Rceil,
                    "floor" => MxScale::Floor,
                    "compressed-tensors" => MxScale::CompressedTensors,
                    _ => return Err(format!("unknown MX scale rule {v}")),
                }
            }
            ("quantize", "--include") => {
                if q.selection.include == ["*"] {
                    q.selection.include.clear();
                }
                q.selection.include.push(v.clone());
            }
            ("quantize", "--exclude") => q.selection.exclude.push(v.clone()),
            ("quantize", "--no-default-excludes") => q.selection.exclude.clear(),
            ("quantize", "--no-stats") => q.no_stats = true,
            ("dequantize", "--dtype") => {
                d.dtype = match v.as_str() {
                    "bf16" => FloatType::Bf16,
                    "f32" => FloatType::F32,
                    _ => return Err(format!("unknown dtype {v}")),
                }
            }
            ("dequantize", "--reference") => d.reference = Some(PathBuf::from(v)),
            (_, "--threads") => {
                let n: usize = v.parse().map_err(|_| format!("bad --threads {v}"))?;
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n)
                    .build_global()
                    .map_err(|e| e.to_string())?;
            }
            _ => return Err(format!("unknown option {k} for {cmd}\n\n{USAGE}")),
        }
    }
    let t0 = Instant::now();
    match cmd.as_str() {
        "quantize" => {
            let b = bar();
            let r = quantize_checkpoint(&input, &out, &q, &b).map_err(|e| e.to_string())?;
            b.0.finish_and_clear();
            print_report(&r, t0.elapsed().as_secs_f64());
        }
        "dequantize" => {
            let b = bar();
            let r = dequantize_checkpoint(&input, &out, &d, &b).map_err(|e| e.to_string())?;
            b.0.finish_and_clear();
            print_report(&r, t0.elapsed().as_secs_f64());
        }
        "copy" => {
            let (n, s) = copy(&input, &out)?;
            println!(
                "copied {:.1} MB in {s:.2} s: {:.3} GB/s",
                n as f64 / 1e6,
                n as f64 / s / 1e9
            );
        }
        _ => return Err(format!("unknown command {cmd}\n\n{USAGE}")),
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

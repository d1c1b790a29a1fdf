//! Offline weight quantization: reads a raw little-endian f32 or bf16 matrix (or makes a
//! deterministic synthetic one), quantizes it to NVFP4, MXFP8 (E4M3, RCEIL) and MXFP4 (E2M1,
//! RCEIL), writes the codes, scales and a JSON header per format, and prints error
//! statistics.
//!
//! ```text
//! cargo run --release -p fp-formats --example quantize_weights -- \
//!     [--input FILE --dtype f32|bf16 --rows R --cols C] [--out DIR]
//! ```
//!
//! Without `--input` a 1024 x 4096 matrix of Gaussian values (per-row scales, a few large
//! outliers) is used. Output goes to `target/quantized` unless `--out` says otherwise:
//! `<format>.codes.bin`, `<format>.scales.bin` and `<format>.json` for each format.
//! Rows whose length is not a multiple of the block size are zero-padded (the header gives
//! `padded_cols`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use fp_formats::mx::{self, MxElement, MxMatrix, MxOptions, ScaleRule};
use fp_formats::nvfp4::{self, Nvfp4Matrix, Nvfp4Options};
use fp_formats::stats::ErrorStats;
use fp_formats::{FormatError, Padding};

const USAGE: &str = "\
usage: quantize_weights [--input FILE --dtype f32|bf16 --rows R --cols C] [--out DIR]

  --input FILE   raw little-endian weights, row-major [R, C] (default: a synthetic
                 1024 x 4096 Gaussian matrix with outliers)
  --dtype T      element type of FILE: f32 (default) or bf16
  --rows R       rows of the matrix in FILE
  --cols C       columns of the matrix in FILE
  --out DIR      output directory (default: target/quantized)
  --help         this text";

#[derive(Clone, Copy, PartialEq)]
enum Dtype {
    F32,
    Bf16,
}

impl Dtype {
    fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 => 2,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
        }
    }
}

struct Args {
    input: Option<PathBuf>,
    dtype: Dtype,
    rows: Option<usize>,
    cols: Option<usize>,
    out: PathBuf,
}

/// A failure to report: the message, and whether to print the usage text after it.
struct Failure {
    message: String,
    usage: bool,
}

impl From<String> for Failure {
    fn from(message: String) -> Self {
        Failure {
            message,
            usage: false,
        }
    }
}

fn usage_error(message: String) -> Failure {
    Failure {
        message,
        usage: true,
    }
}

fn parse_args(mut it: impl Iterator<Item = String>) -> Result<Option<Args>, Failure> {
    let mut args = Args {
        input: None,
        dtype: Dtype::F32,
        rows: None,
        cols: None,
        out: PathBuf::from("target/quantized"),
    };
    let mut dtype_given = false;
    while let Some(flag) = it.next() {
        if flag == "--help" || flag == "-h" {
            return Ok(None);
        }
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
            _ => (flag.clone(), None),
        };
        if !matches!(
            name.as_str(),
            "--input" | "--dtype" | "--rows" | "--cols" | "--out"
        ) {
            return Err(usage_error(format!("unknown argument `{flag}`")));
        }
        let value = match inline.or_else(|| it.next()) {
            Some(v) => v,
            None => return Err(usage_error(format!("`{name}` needs a value"))),
        };
        let count = |v: &str| -> Result<usize, Failure> {
            match v.parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(usage_error(format!(
                    "`{name}` must be a positive integer, got `{v}`"
                ))),
            }
        };
        match name.as_str() {
            "--input" => args.input = Some(PathBuf::from(value)),
            "--out" => args.out = PathBuf::from(value),
            "--rows" => args.rows = Some(count(&value)?),
            "--cols" => args.cols = Some(count(&value)?),
            _ => {
                dtype_given = true;
                args.dtype = match value.as_str() {
                    "f32" => Dtype::F32,
                    "bf16" => Dtype::Bf16,
                    other => {
                        return Err(usage_error(format!(
                            "`--dtype` must be f32 or bf16, got `{other}`"
                        )))
                    }
                }
            }
        }
    }
    if args.input.is_none() && (args.rows.is_some() || args.cols.is_some() || dtype_given) {
        return Err(usage_error(
            "`--rows`, `--cols` and `--dtype` describe `--input FILE`; give the file too".into(),
        ));
    }
    if args.input.is_some() && (args.rows.is_none() || args.cols.is_none()) {
        return Err(usage_error(
            "`--input` needs the shape: `--rows R --cols C`".into(),
        ));
    }
    Ok(Some(args))
}

/// Reads a raw little-endian matrix and checks its size and values.
fn read_matrix(path: &Path, dtype: Dtype, rows: usize, cols: usize) -> Result<Vec<f32>, String> {
    let shape_err = || format!("the shape {rows} x {cols} is too large");
    let n = rows.checked_mul(cols).ok_or_else(shape_err)?;
    let need = n.checked_mul(dtype.size()).ok_or_else(shape_err)?;
    let len = std::fs::metadata(path)
        .map_err(|e| format!("cannot read `{}`: {e}", path.display()))?
        .len();
    if len != need as u64 {
        return Err(format!(
            "`{}` holds {len} bytes, but --rows {rows} --cols {cols} with --dtype {} needs \
             {need} bytes ({n} elements of {} bytes)",
            path.display(),
            dtype.name(),
            dtype.size()
        ));
    }
    let bytes =
        std::fs::read(path).map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
    if bytes.len() != need {
        return Err(format!(
            "`{}` changed size while being read",
            path.display()
        ));
    }
    let data: Vec<f32> = match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        // bf16 is the top half of an f32: the conversion is exact.
        Dtype::Bf16 => bytes
            .chunks_exact(2)
            .map(|b| f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16))
            .collect(),
    };
    if let Err(FormatError::NonFinite { index, value }) = fp_formats::finite_amax(&data) {
        let count = data.iter().filter(|v| !v.is_finite()).count();
        return Err(format!(
            "`{}` contains {count} non-finite value(s); the first is {value} at row {}, \
             column {} (flat index {index}). Block scaling needs finite weights.",
            path.display(),
            index / cols,
            index % cols
        ));
    }
    Ok(data)
}

/// Deterministic stand-in for a weight matrix: N(0, 0.02^2) values with a per-row scale in
/// [0.5, 2) and 64 outliers of magnitude 0.25 to 1.
fn synthetic_matrix(rows: usize, cols: usize) -> Vec<f32> {
    let mut state = 0x853C_49E6_748F_EA9Bu64;
    let mut next = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    let mut uniform = move || ((next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    let mut data = Vec::with_capacity(rows * cols);
    for _ in 0..rows {
        let row_scale = 0.5 + 1.5 * uniform();
        for _ in 0..cols {
            // Box-Muller.
            let g = (-2.0 * uniform().ln()).sqrt() * (2.0 * std::f64::consts::PI * uniform()).cos();
            data.push((0.02 * row_scale * g) as f32);
        }
    }
    let n = data.len();
    for k in 0..64.min(n) {
        let i = (uniform() * n as f64) as usize % n;
        let sign = if k % 2 == 0 { 1.0 } else { -1.0 };
        data[i] = sign * (0.25 + 0.75 * uniform()) as f32;
    }
    data
}

/// A JSON string literal.
fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

struct Header<'a> {
    format: &'a str,
    element: &'a str,
    scale_format: &'a str,
    scale_rule: &'a str,
    block: usize,
    padded_cols: usize,
    amax: f32,
    codes_len: usize,
    scales_len: usize,
    packing: &'a str,
    dequantize: &'a str,
}

fn header_json(h: &Header<'_>, rows: usize, cols: usize, source: &str) -> String {
    let file = |kind: &str| json_str(&format!("{}.{kind}.bin", h.format));
    format!(
        "{{\n  \"format\": {},\n  \"element\": {},\n  \"scale_format\": {},\n  \
         \"scale_rule\": {},\n  \"block_size\": {},\n  \"block_axis\": \"row\",\n  \
         \"rows\": {rows},\n  \"cols\": {cols},\n  \"padded_cols\": {},\n  \"amax\": {:e},\n  \
         \"amax_f32_bits\": \"0x{:08x}\",\n  \"codes_file\": {},\n  \"codes_bytes\": {},\n  \
         \"codes_layout\": {},\n  \"scales_file\": {},\n  \"scales_bytes\": {},\n  \
         \"scales_shape\": [{rows}, {}],\n  \"dequantize\": {},\n  \"source\": {}\n}}\n",
        json_str(h.format),
        json_str(h.element),
        json_str(h.scale_format),
        json_str(h.scale_rule),
        h.block,
        h.padded_cols,
        h.amax,
        h.amax.to_bits(),
        file("codes"),
        h.codes_len,
        json_str(h.packing),
        file("scales"),
        h.scales_len,
        h.padded_cols / h.block,
        json_str(h.dequantize),
        json_str(source),
    )
}

fn write_file(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), String> {
    let path = dir.join(name);
    std::fs::write(&path, bytes).map_err(|e| format!("cannot write `{}`: {e}", path.display()))
}

struct Row {
    format: &'static str,
    bits_per_element: f64,
    millis: f64,
    stats: ErrorStats,
}

fn run(args: Args) -> Result<(), String> {
    let (data, rows, cols, source) = match &args.input {
        Some(path) => {
            let (rows, cols) = (args.rows.unwrap_or(0), args.cols.unwrap_or(0));
            let data = read_matrix(path, args.dtype, rows, cols)?;
            (
                data,
                rows,
                cols,
                format!("{} ({})", path.display(), args.dtype.name()),
            )
        }
        None => {
            let (rows, cols) = (1024, 4096);
            (
                synthetic_matrix(rows, cols),
                rows,
                cols,
                "synthetic 1024x4096 Gaussian".into(),
            )
        }
    };
    std::fs::create_dir_all(&args.out)
        .map_err(|e| format!("cannot create `{}`: {e}", args.out.display()))?;
    let err = |e: FormatError| format!("quantization failed: {e}");
    let mut table = Vec::new();

    // NVFP4: E2M1 elements, 1x16 blocks with UE4M3 scales, FP32 tensor scale from amax.
    let t = Instant::now();
    let q: Nvfp4Matrix = nvfp4::quantize(
        &data,
        rows,
        cols,
        Nvfp4Options {
            padding: Padding::Zero,
        },
    )
    .map_err(err)?;
    let millis = t.elapsed().as_secs_f64() * 1e3;
    let stats = ErrorStats::new(&data, &q.dequantize(), q.clipped_count(&data));
    write_file(&args.out, "nvfp4.codes.bin", &q.codes)?;
    write_file(&args.out, "nvfp4.scales.bin", q.scale_bytes())?;
    let header = Header {
        format: "nvfp4",
        element: "e2m1",
        scale_format: "ue4m3",
        scale_rule: "te-nvfp4 (s_b = e4m3_rne(amax_b * fl(S_enc / 6)), S_enc = 2688 / amax)",
        block: nvfp4::BLOCK,
        padded_cols: q.padded_cols,
        amax: q.amax,
        codes_len: q.codes.len(),
        scales_len: q.scales.len(),
        packing: "row-major [rows, padded_cols / 2] bytes; element 2i in the low nibble",
        dequantize: "x = e2m1(code) * ue4m3(scale) * (1 / fl(2688 / amax))",
    };
    write_file(
        &args.out,
        "nvfp4.json",
        header_json(&header, rows, cols, &source).as_bytes(),
    )?;
    table.push(Row {
        format: "NVFP4",
        bits_per_element: 4.0 + 8.0 / 16.0,
        millis,
        stats,
    });

    for (format, element, name, bits) in [
        ("mxfp8", MxElement::E4M3, "MXFP8 E4M3", 8.0 + 8.0 / 32.0),
        ("mxfp4", MxElement::E2M1, "MXFP4 E2M1", 4.0 + 8.0 / 32.0),
    ] {
        let opts = MxOptions {
            element,
            rule: ScaleRule::Rceil,
            padding: Padding::Zero,
        };
        let t = Instant::now();
        let q: MxMatrix = mx::quantize(&data, rows, cols, opts).map_err(err)?;
        let millis = t.elapsed().as_secs_f64() * 1e3;
        let stats = ErrorStats::new(&data, &q.dequantize(), q.clipped_count(&data));
        write_file(&args.out, &format!("{format}.codes.bin"), &q.codes)?;
        write_file(&args.out, &format!("{format}.scales.bin"), q.scale_bytes())?;
        let (element_name, packing) = match element {
            MxElement::E4M3 => ("e4m3", "row-major [rows, padded_cols] bytes, one code each"),
            _ => (
                "e2m1",
                "row-major [rows, padded_cols / 2] bytes; element 2i in the low nibble",
            ),
        };
        let header = Header {
            format,
            element: element_name,
            scale_format: "e8m0",
            scale_rule: "rceil (2^ceil(log2(amax_b / max_elem)))",
            block: mx::BLOCK,
            padded_cols: q.padded_cols,
            amax: q.amax,
            codes_len: q.codes.len(),
            scales_len: q.scales.len(),
            packing,
            dequantize: "x = element(code) * 2^(scale - 127)",
        };
        write_file(
            &args.out,
            &format!("{format}.json"),
            header_json(&header, rows, cols, &source).as_bytes(),
        )?;
        table.push(Row {
            format: name,
            bits_per_element: bits,
            millis,
            stats,
        });
    }

    let amax = data.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    println!("input: {source}, {rows} x {cols}, amax {amax:e}");
    println!("output: {}", args.out.display());
    println!();
    println!(
        "{:<11} {:>9} {:>11} {:>9} {:>11} {:>10} {:>10} {:>10}",
        "format", "bits/elem", "RMSE", "SQNR dB", "rel. bias", "clipped", "flushed", "quant ms"
    );
    for r in &table {
        let s = &r.stats;
        println!(
            "{:<11} {:>9.3} {:>11.4e} {:>9.2} {:>11.3e} {:>10.3e} {:>10.3e} {:>10.1}",
            r.format,
            r.bits_per_element,
            s.rmse,
            s.sqnr_db,
            s.relative_bias,
            s.clipped_fraction,
            s.flushed_fraction,
            r.millis
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(Some(args)) => args,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(f) => {
            eprintln!("error: {}", f.message);
            if f.usage {
                eprintln!("\n{USAGE}");
            }
            return ExitCode::from(2);
        }
    };
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

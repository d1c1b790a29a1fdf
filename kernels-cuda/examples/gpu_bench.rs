//! GPU benchmark: quantizer throughput (GB/s and the fraction of HBM bandwidth) and GEMM
//! TFLOP/s (BF16, TF32, FP8, emulated NVFP4 / MXFP8).
//!
//! ```text
//! cargo run -p kernels-cuda --release --example gpu_bench -- [--json PATH] [--size N] [--hbm-gbs 4800]
//! ```
//!
//! Timing: after 3 warm-up calls, 5 batches of back-to-back calls, each batch between two
//! CUDA events on the stream (so host launch overhead overlaps GPU work, as in training);
//! the reported time per call is the median batch's average. A quantizer's bytes are the
//! minimum it must move (input read once, codes and scales written once), so "of HBM" is the
//! fraction of the bandwidth ceiling reached; NVFP4 and FP8 read the input twice (amax pass,
//! then the cast), which caps them near 1/2 of the ceiling plus the write share. A device to
//! device copy of the input is measured first as the achievable ceiling ("of copy").
//! Each measurement that fails prints an error line and the run continues; the exit status is
//! 1 if any failed. Without a GPU it prints a SKIP line and exits successfully.

use std::fmt::Write as _;

use cudarc::driver::sys::CUevent_flags;
use fp_formats::mx::{MxElement, ScaleRule};
use kernels_cuda::{probe, DeviceQuantized, Gpu, GpuContext, QuantJob, Result};
use quant::{
    BlockShape, Fp8Element, OperandQuant, QuantState, Quantizer, QuantizerBackend, Rht, RngKey,
    RoundingMode, Usage,
};

struct Args {
    json: Option<String>,
    size: usize,
    hbm_gbs: f64,
}

fn parse() -> std::result::Result<Args, String> {
    let mut a = Args {
        json: None,
        size: 8192,
        hbm_gbs: 4800.0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--json" => a.json = Some(it.next().ok_or("--json PATH")?),
            "--size" => a.size = it.next().and_then(|s| s.parse().ok()).ok_or("--size N")?,
            "--hbm-gbs" => {
                a.hbm_gbs = it
                    .next()
                    .and_then(|s| s.parse().ok())
                    .ok_or("--hbm-gbs X")?
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

/// Milliseconds per call of `f`: 3 warm-up calls, then 5 batches of `batch` back-to-back
/// calls between two CUDA events; the median batch's average.
fn time_ms(g: &GpuContext, batch: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..3 {
        f()?;
    }
    g.synchronize()?;
    let ctx = g.context();
    let mut ms = Vec::with_capacity(5);
    for _ in 0..5 {
        let start = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let end = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        start.record(g.stream())?;
        for _ in 0..batch {
            f()?;
        }
        end.record(g.stream())?;
        end.synchronize()?;
        ms.push(start.elapsed_ms(&end)? as f64 / batch as f64);
    }
    ms.sort_by(|a, b| a.total_cmp(b));
    Ok(ms[ms.len() / 2])
}

struct Report {
    text: String,
    json: Vec<String>,
    hbm: f64,
    copy_gbs: Option<f64>,
    failed: usize,
}

impl Report {
    fn line(&mut self, s: String) {
        println!("{s}");
        self.text.push_str(&s);
        self.text.push('\n');
    }

    /// Records `name`'s result, or its error (and continues).
    fn item(&mut self, name: &str, r: Result<()>) {
        if let Err(e) = r {
            self.failed += 1;
            self.line(format!("{name:<46} ERROR: {e}"));
            self.json.push(format!(
                "{{\"kind\":\"error\",\"name\":\"{name}\",\"error\":\"{}\"}}",
                json_escape(&e.to_string())
            ));
        }
    }

    fn bandwidth(&mut self, name: &str, ms: f64, bytes: usize, note: &str) {
        let gbs = bytes as f64 / (ms * 1e-3) / 1e9;
        let of_copy = self.copy_gbs.map_or(String::new(), |c| {
            format!(" {:>6.1}% of copy", 100.0 * gbs / c)
        });
        self.line(format!(
            "{name:<46} {ms:>9.4} ms {gbs:>9.1} GB/s {:>6.1}% of HBM{of_copy}{note}",
            100.0 * gbs / self.hbm
        ));
        self.json.push(format!(
            "{{\"kind\":\"bandwidth\",\"name\":\"{name}\",\"ms\":{ms:.5},\"bytes\":{bytes},\"gbs\":{gbs:.2},\"hbm_fraction\":{:.4}}}",
            gbs / self.hbm
        ));
    }

    fn gemm(&mut self, name: &str, m: usize, n: usize, k: usize, ms: f64) {
        let tflops = 2.0 * m as f64 * n as f64 * k as f64 / (ms * 1e-3) / 1e12;
        self.line(format!(
            "{name:<46} {ms:>9.4} ms {tflops:>9.1} TFLOP/s  ({m}x{n}x{k})"
        ));
        self.json.push(format!(
            "{{\"kind\":\"gemm\",\"name\":\"{name}\",\"m\":{m},\"n\":{n},\"k\":{k},\"ms\":{ms:.5},\"tflops\":{tflops:.2}}}"
        ));
    }
}

fn json_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| match c {
            '"' => vec!['\\', '"'],
            '\\' => vec!['\\', '\\'],
            c if (c as u32) < 0x20 => vec![' '],
            c => vec![c],
        })
        .collect()
}

fn out_bytes(t: &DeviceQuantized) -> usize {
    t.codes_len + t.scale_len()
}

fn bench_job(
    g: &GpuContext,
    r: &mut Report,
    in_bytes: usize,
    mut job: QuantJob<'_>,
    state: &mut QuantState,
    name: &str,
) -> Result<()> {
    let ms = time_ms(g, 20, || job.launch())?;
    let (a, b) = job.finish_fp8(state)?;
    let bytes = in_bytes + a.as_ref().map_or(0, out_bytes) + b.as_ref().map_or(0, out_bytes);
    r.bandwidth(name, ms, bytes, "");
    Ok(())
}

/// The driver and cuBLASLt versions and the shared libraries actually loaded.
fn environment(r: &mut Report) {
    let mut v = 0i32;
    // SAFETY: writes one int; the driver is loaded (probe succeeded).
    let dv = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
    r.line(format!("CUDA driver API version: {v} ({dv:?})"));
    // SAFETY: dlopen() probing only, then a version query of the loaded library.
    if unsafe { cudarc::cublaslt::sys::is_culib_present() } {
        let lt = unsafe { cudarc::cublaslt::sys::cublasLtGetVersion() };
        r.line(format!("cuBLASLt version: {lt}"));
    } else {
        r.line("cuBLASLt: not found (libcublasLt.so.13 not on the library path)".into());
    }
    if let Ok(maps) = std::fs::read_to_string("/proc/self/maps") {
        let mut libs: Vec<&str> = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .filter(|p| p.contains("libcuda") || p.contains("libcublas") || p.contains("libnvrtc"))
            .collect();
        libs.sort_unstable();
        libs.dedup();
        for l in libs {
            r.line(format!("loaded: {l}"));
        }
    }
}

fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|i| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let u = ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
            u * if i % 64 < 8 { 8.0 } else { 1.0 }
        })
        .collect()
}

fn run(g: &GpuContext, args: &Args, r: &mut Report) -> Result<()> {
    let n = args.size;
    r.line(format!(
        "device: {} (cc {:?}, PTX {})",
        g.name(),
        g.compute_capability(),
        g.arch().tag()
    ));
    r.line(format!(
        "quantizers on a {n}x{n} f32 tensor ({} MB); HBM ceiling {} GB/s",
        (n * n * 4) >> 20,
        r.hbm
    ));
    let x = g.upload(&data(n * n, 1), n, n)?;
    let in_bytes = n * n * 4;
    let key = RngKey {
        seed: 42,
        stream: 7,
    };
    let st = &mut QuantState::new();

    // The achievable ceiling: a device-to-device copy of the input (read + write).
    let res = (|| {
        // SAFETY: fully overwritten by the copy before anything reads it.
        let mut y = unsafe { g.stream().alloc::<f32>(n * n)? };
        let ms = time_ms(g, 20, || Ok(g.stream().memcpy_dtod(&x.data, &mut y)?))?;
        r.bandwidth("device-to-device copy (read + write)", ms, 2 * in_bytes, "");
        r.copy_gbs = Some(2.0 * in_bytes as f64 / (ms * 1e-3) / 1e9);
        Ok(())
    })();
    r.item("device-to-device copy", res);

    let res = time_ms(g, 20, || g.amax(&x).map(|_| ()))
        .map(|ms| r.bandwidth("amax", ms, in_bytes, " (incl. a 16-byte readback + sync)"));
    r.item("amax", res);

    let nv = OperandQuant::nvfp4();
    let nv_sr = nv.with_rounding(RoundingMode::Stochastic);
    let nv_col = nv_sr.with_rht(Rht::FixedSigns);
    let w16 = nv.with_block(BlockShape::Tile16);
    let mx8 = OperandQuant::mx(MxElement::E4M3, ScaleRule::Rceil);
    let mx4 = OperandQuant::mx(MxElement::E2M1, ScaleRule::Rceil);
    let f8 = OperandQuant::fp8_current(Fp8Element::E4M3);

    // Rowwise and columnwise quantizers of each setting, drawing from `key`.
    let qz = |q: &OperandQuant, u: Usage| -> Result<Quantizer> {
        Ok(Quantizer::new(*q, u)?.with_key(key))
    };
    let row = |q: &OperandQuant| qz(q, Usage::Rowwise);
    let col = |q: &OperandQuant| qz(q, Usage::Columnwise);
    type Prep<'a> = Box<dyn Fn(&mut QuantState) -> Result<QuantJob<'a>> + 'a>;
    let jobs: Vec<(&str, Prep<'_>)> = vec![
        (
            "NVFP4 rowwise 1x16 RNE",
            Box::new(|s| g.prepare(&x, Some(&row(&nv)?), None, s)),
        ),
        (
            "NVFP4 rowwise 1x16 SR",
            Box::new(|s| g.prepare(&x, Some(&row(&nv_sr)?), None, s)),
        ),
        (
            "NVFP4 columnwise 1x16 SR + RHT",
            Box::new(|s| g.prepare(&x, None, Some(&col(&nv_col)?), s)),
        ),
        (
            "NVFP4 cast+transpose (SR | SR + RHT)",
            Box::new(|s| g.prepare(&x, Some(&row(&nv_sr)?), Some(&col(&nv_col)?), s)),
        ),
        (
            "NVFP4 cast+transpose 16x16 weights",
            Box::new(|s| g.prepare(&x, Some(&row(&w16)?), Some(&col(&w16)?), s)),
        ),
        (
            "MXFP8 rowwise RCEIL",
            Box::new(|s| g.prepare(&x, Some(&row(&mx8)?), None, s)),
        ),
        (
            "MXFP8 cast+transpose RCEIL",
            Box::new(|s| g.prepare(&x, Some(&row(&mx8)?), Some(&col(&mx8)?), s)),
        ),
        (
            "MXFP4 rowwise RCEIL",
            Box::new(|s| g.prepare(&x, Some(&row(&mx4)?), None, s)),
        ),
        (
            "FP8 E4M3 rowwise (current scaling)",
            Box::new(|s| g.prepare(&x, Some(&row(&f8)?), None, s)),
        ),
        (
            "FP8 E4M3 cast+transpose",
            Box::new(|s| g.prepare(&x, Some(&row(&f8)?), Some(&col(&f8)?), s)),
        ),
    ];
    for (name, prep) in &jobs {
        let res = prep(st).and_then(|job| bench_job(g, r, in_bytes, job, st, name));
        r.item(name, res);
    }
    drop(jobs);

    let res = (|| {
        let t = g.quantize(&row(&nv)?, &x, st)?;
        let ms = time_ms(g, 20, || g.dequantize(&t).map(|_| ()))?;
        r.bandwidth("NVFP4 dequantize to f32", ms, out_bytes(&t) + in_bytes, "");
        Ok(())
    })();
    r.item("NVFP4 dequantize to f32", res);
    drop(x);

    // GEMMs: M = N = K = size.
    let (m, nn, k) = (n, n, n);
    let a = g.upload(&data(m * k, 2), m, k)?;
    let b = g.upload(&data(nn * k, 3), nn, k)?;
    r.line("GEMMs, out[M,N] = A[M,K] B[N,K]^T, f32 output unless noted".to_string());
    let (ab, bb) = (g.to_bf16(&a.data)?, g.to_bf16(&b.data)?);
    let res = time_ms(g, 10, || {
        g.gemm_bf16_f32(&ab, &bb, m, nn, k, 1.0).map(|_| ())
    })
    .map(|ms| r.gemm("BF16 (cuBLASLt, f32 out)", m, nn, k, ms));
    r.item("BF16 (cuBLASLt, f32 out)", res);
    let res = time_ms(g, 10, || g.gemm_bf16(&ab, &bb, m, nn, k).map(|_| ()))
        .map(|ms| r.gemm("BF16 (cudarc safe API, bf16 out)", m, nn, k, ms));
    r.item("BF16 (cudarc safe API, bf16 out)", res);
    let res = time_ms(g, 5, || g.gemm_f32(&a.data, &b.data, m, nn, k).map(|_| ()))
        .map(|ms| r.gemm("f32 (cudarc safe API, TF32 compute)", m, nn, k, ms));
    r.item("f32 (cudarc safe API, TF32 compute)", res);
    drop((ab, bb));
    let name = "FP8 E4M3 x E4M3 (cuBLASLt, per-tensor scales)";
    let res = (|| {
        let fa = g.quantize(&row(&f8)?, &a, st)?;
        let fb = g.quantize(&row(&f8)?, &b, st)?;
        let ms = time_ms(g, 10, || g.gemm_fp8(&fa, &fb).map(|_| ()))?;
        r.gemm(name, m, nn, k, ms);
        Ok(())
    })();
    r.item(name, res);
    for (fmt, q) in [("NVFP4", nv), ("MXFP8", mx8)] {
        let name = format!("{fmt} emulated (dequant to BF16 + BF16 GEMM)");
        let res = (|| {
            let qa = g.quantize(&row(&q)?, &a, st)?;
            let qb = g.quantize(&row(&q)?, &b, st)?;
            let ms = time_ms(g, 10, || g.gemm_emulated(&qa, &qb).map(|_| ()))?;
            r.gemm(&name, m, nn, k, ms);
            let (oa, _) = g.operand_bf16(&qa)?;
            let (ob, _) = g.operand_bf16(&qb)?;
            let ms = time_ms(g, 10, || {
                g.gemm_bf16_f32(&oa, &ob, m, nn, qa.padded_cols, 1.0)
                    .map(|_| ())
            })?;
            r.gemm(&format!("{fmt} emulated, GEMM part only"), m, nn, k, ms);
            if g.compute_capability().0 == 10 {
                let ms = time_ms(g, 10, || g.gemm_block_scaled(&qa, &qb).map(|_| ()))?;
                r.gemm(&format!("{fmt} block-scaled (sm_100)"), m, nn, k, ms);
            }
            Ok(())
        })();
        r.item(&name, res);
    }
    Ok(())
}

fn main() {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("gpu_bench: {e}");
            std::process::exit(2);
        }
    };
    let mut r = Report {
        text: String::new(),
        json: Vec::new(),
        hbm: args.hbm_gbs,
        copy_gbs: None,
        failed: 0,
    };
    let ctx = match probe() {
        Gpu::Ready(ctx) => ctx,
        Gpu::Unavailable(why) => {
            println!("SKIP gpu_bench: {why}");
            return;
        }
    };
    environment(&mut r);
    // `g` stays alive until `process::exit`: no teardown (cuBLASLt's handle destructor
    // unwraps) can turn a finished run into a crash before the report is written.
    let g = GpuContext::new(ctx);
    let res = match &g {
        Ok(g) => run(g, &args, &mut r),
        Err(e) => Err(kernels_cuda::KernelError::Unsupported(format!(
            "loading the kernels: {e}"
        ))),
    };
    r.item("bench", res);
    if let Some(path) = &args.json {
        let mut s = String::from("[\n");
        let _ = write!(s, "{}", r.json.join(",\n"));
        s.push_str("\n]\n");
        if let Err(e) = std::fs::write(path, s) {
            eprintln!("gpu_bench: writing {path}: {e}");
            r.failed += 1;
        }
    }
    if r.failed > 0 {
        println!("gpu_bench: {} measurement(s) failed", r.failed);
    }
    std::process::exit(i32::from(r.failed > 0));
}

//! GPU benchmark: quantizer throughput (GB/s and the fraction of HBM bandwidth) and GEMM
//! TFLOP/s (BF16, TF32, FP8, emulated NVFP4 / MXFP8).
//!
//! ```text
//! cargo run -p kernels-cuda --release --example gpu_bench -- [--json PATH] [--size N] [--hbm-gbs 4800]
//! ```
//!
//! Times are CUDA-event medians of 20 launches after 3 warm-ups. A quantizer's bytes are the
//! minimum it must move (input read once, codes and scales written once), so "of HBM" is the
//! fraction of the bandwidth ceiling reached; NVFP4 and FP8 read the input twice (amax pass,
//! then the cast), which caps them near 1/2 of the ceiling plus the write share.
//! Without a GPU it prints a SKIP line and exits successfully.

use std::fmt::Write as _;

use cudarc::driver::sys::CUevent_flags;
use fp_formats::mx::{MxElement, ScaleRule};
use kernels_cuda::{probe, DeviceQuantized, Gpu, GpuContext, QuantJob, Result};
use quant::{BlockShape, Fp8Element, OperandQuant, QuantState, Rht, RngKey, RoundingMode};

struct Args {
    json: Option<String>,
    size: usize,
    hbm_gbs: f64,
}

fn parse() -> Args {
    let mut a = Args {
        json: None,
        size: 8192,
        hbm_gbs: 4800.0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--json" => a.json = it.next(),
            "--size" => a.size = it.next().and_then(|s| s.parse().ok()).expect("--size N"),
            "--hbm-gbs" => a.hbm_gbs = it.next().and_then(|s| s.parse().ok()).expect("--hbm-gbs X"),
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

/// Median milliseconds of `iters` timed runs of `f` (after 3 warm-ups), with CUDA events.
fn time_ms(g: &GpuContext, iters: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..3 {
        f()?;
    }
    g.synchronize()?;
    let mut ms = Vec::with_capacity(iters);
    for _ in 0..iters {
        let start = g
            .context()
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let end = g
            .context()
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        start.record(g.stream())?;
        f()?;
        end.record(g.stream())?;
        end.synchronize()?;
        ms.push(start.elapsed_ms(&end)? as f64);
    }
    ms.sort_by(|a, b| a.total_cmp(b));
    Ok(ms[iters / 2])
}

struct Report {
    text: String,
    json: Vec<String>,
}

impl Report {
    fn line(&mut self, s: String) {
        println!("{s}");
        self.text.push_str(&s);
        self.text.push('\n');
    }
}

fn out_bytes(t: &DeviceQuantized) -> usize {
    t.codes_len + t.scale_len()
}

fn bench_job(
    g: &GpuContext,
    r: &mut Report,
    hbm: f64,
    name: &str,
    in_bytes: usize,
    mut job: QuantJob<'_>,
    state: &mut QuantState,
) -> Result<()> {
    let ms = time_ms(g, 20, || job.launch())?;
    let (a, b) = job.finish_fp8(state)?;
    let bytes = in_bytes + a.as_ref().map_or(0, out_bytes) + b.as_ref().map_or(0, out_bytes);
    let gbs = bytes as f64 / (ms * 1e-3) / 1e9;
    r.line(format!(
        "{name:<46} {ms:>9.3} ms {gbs:>9.1} GB/s {:>6.1}% of HBM",
        100.0 * gbs / hbm
    ));
    r.json.push(format!(
        "{{\"kind\":\"quantize\",\"name\":\"{name}\",\"ms\":{ms:.5},\"bytes\":{bytes},\"gbs\":{gbs:.2},\"hbm_fraction\":{:.4}}}",
        gbs / hbm
    ));
    Ok(())
}

fn gemm_line(r: &mut Report, name: &str, m: usize, n: usize, k: usize, ms: f64) {
    let tflops = 2.0 * m as f64 * n as f64 * k as f64 / (ms * 1e-3) / 1e12;
    r.line(format!(
        "{name:<46} {ms:>9.3} ms {tflops:>9.1} TFLOP/s  ({m}x{n}x{k})"
    ));
    r.json.push(format!(
        "{{\"kind\":\"gemm\",\"name\":\"{name}\",\"m\":{m},\"n\":{n},\"k\":{k},\"ms\":{ms:.5},\"tflops\":{tflops:.2}}}"
    ));
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
    let hbm = args.hbm_gbs;
    let n = args.size;
    r.line(format!(
        "device: {} (cc {:?}, PTX {})",
        g.name(),
        g.compute_capability(),
        g.arch().tag()
    ));
    r.line(format!(
        "quantizers on a {n}x{n} f32 tensor ({} MB); HBM ceiling {hbm} GB/s",
        (n * n * 4) >> 20
    ));
    let x = g.upload(&data(n * n, 1), n, n)?;
    let in_bytes = n * n * 4;
    let key = RngKey {
        seed: 42,
        stream: 7,
    };
    let st = &mut QuantState::new();

    let nv = OperandQuant::nvfp4();
    let nv_sr = nv.with_rounding(RoundingMode::Stochastic);
    let nv_col = nv_sr.with_rht(Rht::FixedSigns);
    let w16 = nv.with_block(BlockShape::Tile16);
    let mx8 = OperandQuant::mx(MxElement::E4M3, ScaleRule::Rceil);
    let mx4 = OperandQuant::mx(MxElement::E2M1, ScaleRule::Rceil);
    let f8 = OperandQuant::fp8_current(Fp8Element::E4M3);

    let amax_ms = time_ms(g, 20, || g.amax(&x).map(|_| ()))?;
    let gbs = in_bytes as f64 / (amax_ms * 1e-3) / 1e9;
    r.line(format!(
        "{:<46} {amax_ms:>9.3} ms {gbs:>9.1} GB/s {:>6.1}% of HBM (incl. 4-byte readback)",
        "amax",
        100.0 * gbs / hbm
    ));
    r.json.push(format!(
        "{{\"kind\":\"quantize\",\"name\":\"amax\",\"ms\":{amax_ms:.5},\"gbs\":{gbs:.2}}}"
    ));

    bench_job(
        g,
        r,
        hbm,
        "NVFP4 rowwise 1x16 RNE",
        in_bytes,
        g.prepare_nvfp4(&x, Some((&nv, key)), None)?,
        st,
    )?;
    bench_job(
        g,
        r,
        hbm,
        "NVFP4 rowwise 1x16 SR",
        in_bytes,
        g.prepare_nvfp4(&x, Some((&nv_sr, key)), None)?,
        st,
    )?;
    bench_job(
        g,
        r,
        hbm,
        "NVFP4 columnwise 1x16 SR + RHT",
        in_bytes,
        g.prepare_nvfp4(&x, None, Some((&nv_col, key)))?,
        st,
    )?;
    bench_job(
        g,
        r,
        hbm,
        "NVFP4 cast+transpose (SR | SR + RHT)",
        in_bytes,
        g.prepare_nvfp4(&x, Some((&nv_sr, key)), Some((&nv_col, key)))?,
        st,
    )?;
    bench_job(
        g,
        r,
        hbm,
        "NVFP4 cast+transpose 16x16 weights",
        in_bytes,
        g.prepare_nvfp4(&x, Some((&w16, key)), Some((&w16, key)))?,
        st,
    )?;
    bench_job(
        g,
        r,
        hbm,
        "MXFP8 rowwise RCEIL",
        in_bytes,
        g.prepare_mx(&x, Some((&mx8, key)), None)?,
        st,
    )?;
    bench_job(
        g,
        r,
        hbm,
        "MXFP8 cast+transpose RCEIL",
        in_bytes,
        g.prepare_mx(&x, Some((&mx8, key)), Some((&mx8, key)))?,
        st,
    )?;
    bench_job(
        g,
        r,
        hbm,
        "MXFP4 rowwise RCEIL",
        in_bytes,
        g.prepare_mx(&x, Some((&mx4, key)), None)?,
        st,
    )?;
    bench_job(
        g,
        r,
        hbm,
        "FP8 E4M3 rowwise (current scaling)",
        in_bytes,
        g.prepare_fp8(&x, Some((&f8, key)), None, st)?,
        st,
    )?;
    bench_job(
        g,
        r,
        hbm,
        "FP8 E4M3 cast+transpose",
        in_bytes,
        g.prepare_fp8(&x, Some((&f8, key)), Some((&f8, key)), st)?,
        st,
    )?;

    let t = g.quantize_nvfp4(&x, quant::Usage::Rowwise, &nv, key)?;
    let ms = time_ms(g, 20, || g.dequantize(&t).map(|_| ()))?;
    let bytes = out_bytes(&t) + in_bytes;
    let gbs = bytes as f64 / (ms * 1e-3) / 1e9;
    r.line(format!(
        "{:<46} {ms:>9.3} ms {gbs:>9.1} GB/s {:>6.1}% of HBM",
        "NVFP4 dequantize to f32",
        100.0 * gbs / hbm
    ));
    r.json.push(format!(
        "{{\"kind\":\"quantize\",\"name\":\"nvfp4 dequantize\",\"ms\":{ms:.5},\"gbs\":{gbs:.2}}}"
    ));
    drop(t);

    // GEMMs: M = N = K = size.
    let (m, nn, k) = (n, n, n);
    let a = g.upload(&data(m * k, 2), m, k)?;
    let b = g.upload(&data(nn * k, 3), nn, k)?;
    r.line("GEMMs, out[M,N] = A[M,K] B[N,K]^T, f32 output unless noted".to_string());
    let (ab, bb) = (g.to_bf16(&a.data)?, g.to_bf16(&b.data)?);
    let ms = time_ms(g, 20, || {
        g.gemm_bf16_f32(&ab, &bb, m, nn, k, 1.0).map(|_| ())
    })?;
    gemm_line(r, "BF16 (cuBLASLt, f32 out)", m, nn, k, ms);
    let ms = time_ms(g, 20, || g.gemm_bf16(&ab, &bb, m, nn, k).map(|_| ()))?;
    gemm_line(r, "BF16 (cudarc safe API, bf16 out)", m, nn, k, ms);
    let ms = time_ms(g, 10, || g.gemm_f32(&a.data, &b.data, m, nn, k).map(|_| ()))?;
    gemm_line(r, "f32 (cudarc safe API, TF32 compute)", m, nn, k, ms);
    let fa = g.quantize_fp8(&a, quant::Usage::Rowwise, &f8, key, st)?;
    let fb = g.quantize_fp8(&b, quant::Usage::Rowwise, &f8, key, st)?;
    match time_ms(g, 20, || g.gemm_fp8(&fa, &fb).map(|_| ())) {
        Ok(ms) => gemm_line(
            r,
            "FP8 E4M3 x E4M3 (cuBLASLt, per-tensor scales)",
            m,
            nn,
            k,
            ms,
        ),
        Err(e) => r.line(format!("FP8 GEMM failed: {e}")),
    }
    drop((fa, fb));
    for (name, q) in [("NVFP4", nv), ("MXFP8", mx8)] {
        let qa = g.quantize(&a, quant::Usage::Rowwise, &q, key, st)?;
        let qb = g.quantize(&b, quant::Usage::Rowwise, &q, key, st)?;
        let ms = time_ms(g, 20, || g.gemm_emulated(&qa, &qb).map(|_| ()))?;
        gemm_line(
            r,
            &format!("{name} emulated (dequant to BF16 + BF16 GEMM)"),
            m,
            nn,
            k,
            ms,
        );
        let (oa, _) = g.operand_bf16(&qa)?;
        let (ob, _) = g.operand_bf16(&qb)?;
        let ms = time_ms(g, 20, || {
            g.gemm_bf16_f32(&oa, &ob, m, nn, qa.padded_cols, 1.0)
                .map(|_| ())
        })?;
        gemm_line(r, &format!("{name} emulated, GEMM part only"), m, nn, k, ms);
        if g.compute_capability().0 == 10 {
            match time_ms(g, 20, || g.gemm_block_scaled(&qa, &qb).map(|_| ())) {
                Ok(ms) => gemm_line(r, &format!("{name} block-scaled (sm_100)"), m, nn, k, ms),
                Err(e) => r.line(format!("{name} block-scaled GEMM failed: {e}")),
            }
        }
    }
    Ok(())
}

fn main() {
    let args = parse();
    let ctx = match probe() {
        Gpu::Ready(ctx) => ctx,
        Gpu::Unavailable(why) => {
            println!("SKIP gpu_bench: {why}");
            return;
        }
    };
    let g = GpuContext::new(ctx).expect("loading the kernels");
    let mut r = Report {
        text: String::new(),
        json: Vec::new(),
    };
    let res = run(&g, &args, &mut r);
    if let Err(e) = &res {
        r.line(format!("bench error: {e}"));
    }
    if let Some(path) = &args.json {
        let mut s = String::from("[\n");
        let _ = write!(s, "{}", r.json.join(",\n"));
        s.push_str("\n]\n");
        std::fs::write(path, s).expect("writing the JSON report");
    }
    if res.is_err() {
        std::process::exit(1);
    }
}

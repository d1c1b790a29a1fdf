//! GPU benchmark of the training-step kernels (`kernels_cuda::train`) at the shapes of one
//! step of the trainer's `large` preset (d 768, 12 heads of 64, hidden 2048, vocab 256, seq
//! 1024) with 16 sequences (16,384 tokens): time per call, GB/s of the minimum traffic and its
//! fraction of the H200's 4.8 TB/s HBM, and for attention and the fixed-order f32 GEMM the
//! TFLOP/s and their fraction of the 989 TFLOP/s dense BF16 peak.
//!
//! ```text
//! cargo run -p kernels-cuda --release --example train_bench -- [--json PATH] [--seqs N]
//! ```
//!
//! Timing as `gpu_bench`: 2 warm-up calls, then 5 batches of back-to-back calls between two
//! CUDA events; the median batch's average. Without a GPU it prints a SKIP line and exits 0.

use std::fmt::Write as _;

use cudarc::driver::sys::CUevent_flags;
use kernels_cuda::train::{Activation, AdamWCoeffs, Launcher, TrainOps};
use kernels_cuda::{probe, Gpu, GpuBuf, GpuContext, Result};

const HBM_GBS: f64 = 4800.0;
const PEAK_TFLOPS: f64 = 989.0;

fn time_ms(g: &GpuContext, batch: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..2 {
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
    json: Vec<String>,
    failed: usize,
}

impl Report {
    /// `bytes`: minimum traffic; `flops`: 0 when not compute-bound.
    fn item(&mut self, name: &str, r: Result<f64>, bytes: f64, flops: f64) {
        match r {
            Ok(ms) => {
                let gbs = bytes / ms / 1e6;
                let mut line = format!(
                    "{name:<34} {ms:>9.3} ms {gbs:>8.0} GB/s {:>5.1}% of HBM",
                    100.0 * gbs / HBM_GBS
                );
                let mut tf = 0.0;
                if flops > 0.0 {
                    tf = flops / ms / 1e9;
                    let _ = write!(
                        line,
                        " {tf:>7.2} TFLOP/s {:>5.2}% of BF16 peak",
                        100.0 * tf / PEAK_TFLOPS
                    );
                }
                println!("{line}");
                self.json.push(format!(
                    "{{\"name\":\"{name}\",\"ms\":{ms},\"gbs\":{gbs},\"tflops\":{tf}}}"
                ));
            }
            Err(e) => {
                self.failed += 1;
                println!("{name:<34} ERROR: {e}");
                self.json.push(format!(
                    "{{\"name\":\"{name}\",\"error\":\"{}\"}}",
                    e.to_string().replace(['"', '\\', '\n'], " ")
                ));
            }
        }
    }
}

fn run(g: &GpuContext, seqs: usize, rep: &mut Report) -> Result<()> {
    let (t, d, h, hd, f, v) = (1024usize, 768usize, 12usize, 64usize, 2048usize, 256usize);
    let n = seqs * t;
    let fill = |len: usize, seed: u32| -> Result<GpuBuf<f32>> {
        let x: Vec<f32> = (0..len)
            .map(|i| {
                ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) as f32
                    / (1u32 << 24) as f32
                    - 0.5
            })
            .collect();
        Launcher::upload(g, &x)
    };
    let x = fill(n * d, 1)?;
    let w = fill(d, 2)?;
    let dy = fill(n * d, 3)?;
    let mut y = Launcher::zeros::<f32>(g, n * d)?;
    let mut rstd = Launcher::zeros::<f32>(g, n)?;
    let (mut dx, mut dw) = (
        Launcher::zeros::<f32>(g, n * d)?,
        Launcher::zeros::<f32>(g, d)?,
    );
    let nd = (n * d * 4) as f64;
    rep.item(
        "rmsnorm fwd [16K, 768]",
        time_ms(g, 20, || g.rms_fwd(&x, &w, 1e-5, &mut y, Some(&mut rstd))),
        2.0 * nd,
        0.0,
    );
    let per = (32768 / 4 / d).max(1);
    rep.item(
        "rmsnorm bwd [16K, 768]",
        time_ms(g, 10, || {
            g.norm_bwd(
                false,
                &x,
                &w,
                &rstd,
                &dy,
                per,
                Some((false, &mut dx)),
                Some((false, &mut dw)),
                None,
            )
        }),
        3.0 * nd,
        0.0,
    );
    rep.item(
        "add [16K, 768]",
        time_ms(g, 20, || g.add(&x, &dy, &mut y)),
        3.0 * nd,
        0.0,
    );
    rep.item(
        "round_bf16 [16K, 768]",
        time_ms(g, 20, || g.round_bf16(&x, &mut y)),
        2.0 * nd,
        0.0,
    );
    let tab = fill(t * hd, 4)?;
    rep.item(
        "rope [16K x 12 heads, 64]",
        time_ms(g, 20, || g.rope(&x, &tab, t, hd, false, (false, &mut y))),
        2.0 * nd,
        0.0,
    );
    // the layout copies of attention: split_heads ([16, 1024, 12, 64] -> [16, 12, 1024, 64]) and
    // one third of the fused QKV projection's columns (split)
    rep.item(
        "split_heads (swap_axes) [16K, 768]",
        time_ms(g, 20, || {
            g.swap_axes(&x, [n / t, t, h, hd], 1, 2, (false, &mut y))
        }),
        2.0 * nd,
        0.0,
    );
    let qkv = fill(3 * n * d, 16)?;
    rep.item(
        "split (columns) [16K, 2304] -> 768",
        time_ms(g, 20, || g.columns(&qkv, 3 * d, d, d, false, &mut y)),
        2.0 * nd,
        0.0,
    );
    let mut part = Launcher::zeros::<f32>(g, 1)?;
    rep.item(
        "sum_rows (bias grad) [16K, 768]",
        time_ms(g, 10, || g.sum_rows(&x, d, Some(per), (false, &mut dw))),
        nd,
        0.0,
    );
    rep.item(
        "sum f64 [16K, 768]",
        time_ms(g, 5, || g.sum_all(&x, Some(1 << 14), 1.0, &mut part)),
        nd,
        0.0,
    );

    let gate = fill(n * f, 5)?;
    let up = fill(n * f, 6)?;
    let dyf = fill(n * f, 7)?;
    let (mut yf, mut dg, mut du) = (
        Launcher::zeros::<f32>(g, n * f)?,
        Launcher::zeros::<f32>(g, n * f)?,
        Launcher::zeros::<f32>(g, n * f)?,
    );
    let nf = (n * f * 4) as f64;
    rep.item(
        "swiglu fwd [16K, 2048]",
        time_ms(g, 20, || g.swiglu_fwd(&gate, &up, &mut yf)),
        3.0 * nf,
        0.0,
    );
    rep.item(
        "swiglu bwd [16K, 2048]",
        time_ms(g, 10, || {
            g.swiglu_bwd(
                &gate,
                &up,
                &dyf,
                Some((false, &mut dg)),
                Some((false, &mut du)),
            )
        }),
        5.0 * nf,
        0.0,
    );
    rep.item(
        "gelu fwd [16K, 2048]",
        time_ms(g, 20, || g.act_fwd(Activation::Gelu, &gate, &mut yf)),
        2.0 * nf,
        0.0,
    );

    let logits = fill(n * v, 8)?;
    let targets: Vec<u32> = (0..n as u32).map(|i| i % v as u32).collect();
    let (mut st, mut loss, mut dl) = (
        Launcher::zeros::<f32>(g, 2 * n)?,
        Launcher::zeros::<f32>(g, 1)?,
        Launcher::zeros::<f32>(g, n * v)?,
    );
    let one = Launcher::upload(g, &[1.0f32])?;
    let nv = (n * v * 4) as f64;
    rep.item(
        "cross_entropy fwd [16K, 256]",
        time_ms(g, 10, || {
            g.cross_entropy_fwd(&logits, v, &targets, None, &mut st, &mut loss)
                .map(|_| ())
        }),
        nv,
        0.0,
    );
    rep.item(
        "cross_entropy bwd [16K, 256]",
        time_ms(g, 10, || {
            g.cross_entropy_bwd(&logits, v, &targets, None, &st, &one, (false, &mut dl))
        }),
        2.0 * nv,
        0.0,
    );

    let table = fill(v * d, 9)?;
    let ids: Vec<u32> = (0..n as u32).map(|i| (i * 31) % v as u32).collect();
    let mut gt = Launcher::zeros::<f32>(g, v * d)?;
    rep.item(
        "embedding fwd [16K, 768]",
        time_ms(g, 20, || g.embedding_fwd(&table, d, &ids, &mut y)),
        nd,
        0.0,
    );
    rep.item(
        "embedding bwd [16K, 768]",
        time_ms(g, 5, || g.embedding_bwd(&ids, &dy, d, (false, &mut gt))),
        nd,
        0.0,
    );

    // attention on [seqs * 12, 1024, 64]: causal FLOPs 4 · bh · T² / 2 · d forward
    let bh = seqs * h;
    let (q, k, vv) = (
        fill(bh * t * hd, 10)?,
        fill(bh * t * hd, 11)?,
        fill(bh * t * hd, 12)?,
    );
    let (mut o, mut lse) = (
        Launcher::zeros::<f32>(g, bh * t * hd)?,
        Launcher::zeros::<f32>(g, bh * t)?,
    );
    let fwd_flops = 2.0 * bh as f64 * (t * t) as f64 * hd as f64;
    let an = (bh * t * hd * 4) as f64;
    let (mut gq, mut gk, mut gv) = (
        Launcher::zeros::<f32>(g, bh * t * hd)?,
        Launcher::zeros::<f32>(g, bh * t * hd)?,
        Launcher::zeros::<f32>(g, bh * t * hd)?,
    );
    // FP32 attention runs the fused kernels; BF16 attention the tensor-core GEMMs with
    // materialised scores (which also multiply the masked half: the FLOPs counted are the
    // causal ones, the useful work)
    for (precision, bf16) in [("fp32", false), ("bf16", true)] {
        rep.item(
            &format!("attention fwd {precision} [192, 1024, 64]"),
            time_ms(g, 2, || {
                g.attention_fwd(&q, &k, &vv, bh, t, hd, bf16, &mut o, &mut lse)
            }),
            4.0 * an,
            fwd_flops,
        );
        rep.item(
            &format!("attention bwd {precision} [192, 1024, 64]"),
            time_ms(g, 1, || {
                g.attention_bwd(
                    &q,
                    &k,
                    &vv,
                    &o,
                    &lse,
                    &dy,
                    bh,
                    t,
                    hd,
                    bf16,
                    (false, &mut gq),
                    (false, &mut gk),
                    (false, &mut gv),
                )
            }),
            8.0 * an,
            2.5 * fwd_flops,
        );
    }
    // the fixed-order f32 GEMM: [16K, 768] x [768, 768]ᵀ
    let wm = fill(d * d, 13)?;
    rep.item(
        "sgemm [16K, 768] x [768, 768]^T",
        time_ms(g, 2, || {
            g.sgemm(n, d, d, 1.0, &x, (d, 1), &wm, (1, d), 0.0, &mut y)
        }),
        (2 * n * d + d * d) as f64 * 4.0,
        2.0 * (n * d * d) as f64,
    );
    // optimizer over ~100M parameters
    let np = 100 << 20;
    let (mut p, gr, mut m, mut vm) = (
        fill(np, 14)?,
        fill(np, 15)?,
        Launcher::zeros::<f32>(g, np)?,
        Launcher::zeros::<f32>(g, np)?,
    );
    rep.item(
        "grad_norm [100M]",
        time_ms(g, 5, || g.grad_norm(&[&gr]).map(|_| ())),
        np as f64 * 4.0,
        0.0,
    );
    let c = AdamWCoeffs::new(1e-4, 0.1, 0.9, 0.95, 1e-8, 10, 1.0);
    rep.item(
        "adamw [100M]",
        time_ms(g, 5, || g.adamw(&mut p, &gr, &mut m, &mut vm, &c)),
        np as f64 * 28.0,
        0.0,
    );
    Ok(())
}

fn main() {
    let mut json_path = None;
    let mut seqs = 16usize;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--json" => json_path = it.next(),
            "--seqs" => {
                seqs = it
                    .next()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(16)
                    .clamp(1, 64)
            }
            other => {
                eprintln!("unknown argument {other}; usage: train_bench [--json PATH] [--seqs N]");
                std::process::exit(2);
            }
        }
    }
    let ctx = match probe() {
        Gpu::Ready(c) => c,
        Gpu::Unavailable(why) => {
            println!("SKIP train_bench: {why}");
            return;
        }
    };
    let g = match GpuContext::new(ctx) {
        Ok(g) => g,
        Err(e) => {
            println!("ERROR: {e}");
            std::process::exit(1);
        }
    };
    println!(
        "train_bench on {} ({} sequences of 1024 tokens, `large` preset shapes)",
        g.name(),
        seqs
    );
    let mut rep = Report {
        json: Vec::new(),
        failed: 0,
    };
    if let Err(e) = run(&g, seqs, &mut rep) {
        rep.failed += 1;
        println!("ERROR: {e}");
    }
    if let Some(p) = json_path {
        let body = format!("[{}]\n", rep.json.join(",\n"));
        if let Err(e) = std::fs::write(&p, body) {
            println!("ERROR writing {p}: {e}");
            rep.failed += 1;
        }
    }
    std::process::exit(i32::from(rep.failed > 0));
}

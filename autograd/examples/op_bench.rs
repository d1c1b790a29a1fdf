//! Times single ops forward + backward at the step_bench shapes (dev aid):
//! `cargo run --release -p autograd --example op_bench -- [reps] [name filter]`.
use std::time::Instant;

use autograd::{init, Graph, ParamStore, QkvAttention, Result, Tensor};

fn time(name: &str, reps: usize, f: impl Fn(&mut Graph<'_>) -> Result<Tensor>) -> Result<()> {
    if let Some(only) = std::env::args().nth(2) {
        if !name.contains(&only) {
            return Ok(());
        }
    }
    let mut ps = ParamStore::new();
    let mut best = f64::MAX;
    for _ in 0..reps {
        let mut g = Graph::new(&mut ps);
        let t0 = Instant::now();
        autograd::with_polling_workers(|| -> Result<()> {
            let y = f(&mut g)?;
            let n = g.shape(y)?.numel();
            let r = vec![1.0f32; n];
            g.backward_with(y, &r)
        })?;
        best = best.min(t0.elapsed().as_secs_f64());
    }
    println!("{name:<24} {:>9.3} ms", best * 1e3);
    Ok(())
}

fn main() -> Result<()> {
    // on a thread of the pool (sized by RAYON_NUM_THREADS), so that the other threads poll
    // for work during each op as they do in a training step
    let pool = rayon::ThreadPoolBuilder::new()
        .build()
        .expect("building the rayon pool");
    pool.install(run)
}

fn run() -> Result<()> {
    let reps: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let (n, d, h) = (2048, 256, 768);
    let xd = init::normal(n * d, 1.0, 1);
    let xh = init::normal(n * h, 1.0, 2);
    let xh2 = init::normal(n * h, 1.0, 3);
    let w = vec![1.0f32; d];
    time("swiglu [2048,768]", reps, |g| {
        let a = g.variable(&xh, &[n, h])?;
        let b = g.variable(&xh2, &[n, h])?;
        g.swiglu(a, b)
    })?;
    let xs = init::normal(n * 704, 1.0, 6);
    time("swiglu_halves [2048,704]", reps, |g| {
        let a = g.variable(&xs, &[n, 704])?;
        g.swiglu_halves(a)
    })?;
    time("variable [2048,704]", reps, |g| g.variable(&xs, &[n, 704]))?;
    time("gelu [2048,768]", reps, |g| {
        let a = g.variable(&xh, &[n, h])?;
        g.gelu(a)
    })?;
    time("rmsnorm [2048,256]", reps, |g| {
        let a = g.variable(&xd, &[n, d])?;
        let w = g.variable(&w, &[d])?;
        g.rmsnorm(a, w, 1e-5)
    })?;
    time("rope [8,4,256,64]", reps, |g| {
        let a = g.variable(&xd, &[8, 4, 256, 64])?;
        g.rope(a, 10000.0, 0)
    })?;
    time("split_heads [8,256,256]", reps, |g| {
        let a = g.variable(&xd, &[8, 256, 256])?;
        g.split_heads(a, 4)
    })?;
    time("add [2048,256]", reps, |g| {
        let a = g.variable(&xd, &[n, d])?;
        let b = g.variable(&xd, &[n, d])?;
        g.add(a, b)
    })?;
    time("attention [8,4,256,64]", reps, |g| {
        let q = g.variable(&xd, &[8, 4, 256, 64])?;
        let k = g.variable(&xd, &[8, 4, 256, 64])?;
        let v = g.variable(&xd, &[8, 4, 256, 64])?;
        g.causal_attention(q, k, v)
    })?;
    // a block's attention from its QKV projection: the chain of ops, then the fused op
    for (b, t, c) in [(16, 128, 128), (8, 256, 256)] {
        let x = init::normal(b * t * 3 * c, 1.0, 5);
        let spec = QkvAttention {
            heads: 4,
            rope_base: 10000.0,
            round_bf16: true,
        };
        time(&format!("qkv chain [{b},{t},3x{c}]"), reps, |g| {
            let x = g.variable(&x, &[b, t, 3 * c])?;
            let p = g.split(x, &[c, c, c])?;
            let [q, k, v] = [p[0], p[1], p[2]].map(|y| g.split_heads(y, 4));
            let q = g.rope(q?, spec.rope_base, 0)?;
            let k = g.rope(k?, spec.rope_base, 0)?;
            let [q, k, v] = [q, k, v?].map(|y| g.round_bf16(y));
            let a = g.causal_attention(q?, k?, v?)?;
            g.merge_heads(a)
        })?;
        time(&format!("qkv_attention [{b},{t},3x{c}]"), reps, |g| {
            let x = g.variable(&x, &[b, t, 3 * c])?;
            g.qkv_attention(x, spec)
        })?;
    }
    time("cross_entropy [2048,256]", reps, |g| {
        let a = g.variable(&xd, &[n, d])?;
        let t: Vec<u32> = (0..n as u32).map(|i| i % 256).collect();
        g.cross_entropy(a, &t, None)
    })?;
    let wq = init::normal(h * d, 0.05, 4);
    for (name, pol) in [
        ("linear fp32 2048x256->768", quant::GemmPolicy::FP32),
        ("linear bf16 2048x256->768", quant::GemmPolicy::BF16),
        (
            "linear nvfp4 2048x256->768",
            quant::GemmPolicy::nvfp4_paper(),
        ),
    ] {
        for (m, k, nout) in [(2048, 128, 384), (2048, 128, 704), (2048, 352, 128)] {
            let xs = init::normal(m * k, 1.0, 8);
            let ws = init::normal(nout * k, 0.05, 9);
            time(&format!("{name} {m}x{k}->{nout}"), reps, |g| {
                let x = g.variable(&xs, &[m, k])?;
                let w = g.variable(&ws, &[nout, k])?;
                g.linear(x, w, None, &pol, 0)
            })?;
        }
        time(name, reps, |g| {
            let x = g.variable(&xd, &[n, d])?;
            let w = g.variable(&wq, &[h, d])?;
            g.linear(x, w, None, &pol, 0)
        })?;
    }
    Ok(())
}

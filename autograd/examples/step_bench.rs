//! One training step (forward + backward + AdamW from the `optim` crate) of a GPT-shaped
//! stack, in tokens/s, for the FP32, BF16 and NVFP4 (paper recipe) GEMM policies.
//!
//! ```text
//! cargo run --release -p autograd --example step_bench -- [--threads 2] [--steps 10]
//!     [--warmup 2] [--policy fp32|bf16|nvfp4|all] [--layers 4] [--d-model 256] [--heads 4]
//!     [--seq 256] [--batch 8] [--vocab 256] [--hidden 768] [--profile]
//! ```
//!
//! Model: token embedding, `layers` pre-norm blocks (RMSNorm → QKV linear → RoPE → fused
//! causal attention → output linear → residual; RMSNorm → SwiGLU MLP (gate, up, down
//! linears) → residual), final RMSNorm, LM head, mean cross-entropy. Block linears use the
//! measured policy; the LM head runs in FP32 for the FP32 policy and in BF16 otherwise (the
//! NVFP4 recipe keeps the head in BF16). Times are medians over the measured steps ("best" is
//! the fastest step); tokens/s is from the median. Threads: `--threads` sets both the rayon pool and
//! `MATMUL_NUM_THREADS` (matrixmultiply, capped at 4 by the crate).

#[path = "gpt/mod.rs"]
mod gpt;

use std::time::Instant;

use autograd::{init::Rng, Graph, ParamStore};
use gpt::{Config, Gpt};
use optim::{AdamW, AdamWConfig, ParamSpec};
use quant::GemmPolicy;

struct Args {
    threads: usize,
    steps: usize,
    warmup: usize,
    policy: String,
    cfg: Config,
    seq: usize,
    batch: usize,
    profile: bool,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        threads: 2,
        steps: 10,
        warmup: 2,
        policy: "all".into(),
        cfg: Config {
            vocab: 256,
            d_model: 256,
            n_heads: 4,
            n_layers: 4,
            hidden: 768,
            rope_base: 10000.0,
            eps: 1e-5,
        },
        seq: 256,
        batch: 8,
        profile: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or(format!("{flag} needs a value"));
        let num = |s: String| s.parse::<usize>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--threads" => a.threads = num(val()?)?,
            "--steps" => a.steps = num(val()?)?,
            "--warmup" => a.warmup = num(val()?)?,
            "--policy" => a.policy = val()?,
            "--layers" => a.cfg.n_layers = num(val()?)?,
            "--d-model" => a.cfg.d_model = num(val()?)?,
            "--heads" => a.cfg.n_heads = num(val()?)?,
            "--hidden" => a.cfg.hidden = num(val()?)?,
            "--vocab" => a.cfg.vocab = num(val()?)?,
            "--seq" => a.seq = num(val()?)?,
            "--batch" => a.batch = num(val()?)?,
            "--profile" => a.profile = true,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() -> Result<(), BoxError> {
    let a = parse()?;
    // matrixmultiply reads MATMUL_NUM_THREADS once, at its first GEMM
    if std::env::var_os("MATMUL_NUM_THREADS").is_none() {
        std::env::set_var("MATMUL_NUM_THREADS", a.threads.to_string());
    }
    // Run the whole loop on a worker of the pool: parallel ops then split work with the
    // calling thread instead of waking the pool from outside and leaving it spinning.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(a.threads)
        .build()?;
    pool.install(|| run(&a))
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn run(a: &Args) -> Result<(), BoxError> {
    let cfg = a.cfg;
    let n_tok = a.batch * a.seq;
    let mut rng = Rng::new(1234);
    let stream: Vec<u32> = (0..n_tok + 1)
        .map(|_| (rng.next_u64() % cfg.vocab as u64) as u32)
        .collect();
    let (tokens, targets) = (&stream[..n_tok], &stream[1..]);
    let policies: Vec<(&str, GemmPolicy, GemmPolicy)> = [
        ("fp32", GemmPolicy::FP32, GemmPolicy::FP32),
        ("bf16", GemmPolicy::BF16, GemmPolicy::BF16),
        ("nvfp4", GemmPolicy::nvfp4_paper(), GemmPolicy::BF16),
    ]
    .into_iter()
    .filter(|(n, ..)| a.policy == "all" || a.policy == *n)
    .collect();
    println!(
        "step_bench: {} layers, d_model {}, {} heads, SwiGLU {}, vocab {}, batch {} x seq {} = {} tokens/step, {} threads, AdamW (optim)",
        cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.hidden, cfg.vocab, a.batch, a.seq, n_tok, a.threads
    );
    println!(
        "{:<11} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>8}",
        "policy", "fwd ms", "bwd ms", "optim ms", "step ms", "best ms", "tokens/s", "loss"
    );
    for (name, policy, head) in policies {
        let mut ps = ParamStore::new();
        let model = Gpt::new(&mut ps, cfg, 7)?;
        let specs: Vec<ParamSpec> = ps
            .ids()
            .map(|id| ParamSpec::new(ps.value(id).map(|v| v.len()).unwrap_or(0), 0))
            .collect();
        let mut opt = AdamW::new(AdamWConfig::default(), &specs)?;
        let (mut f, mut b, mut o, mut s) = (vec![], vec![], vec![], vec![]);
        let mut last_loss = 0.0;
        for step in 0..a.warmup + a.steps {
            let t0 = Instant::now();
            let mut g = Graph::new(&mut ps).with_rng(0, step as u64);
            let last = step + 1 == a.warmup + a.steps;
            if a.profile && last {
                g.enable_profiling();
            }
            let loss = model.loss(&mut g, tokens, targets, a.batch, &policy, &head)?;
            last_loss = g.item(loss)?;
            let t1 = Instant::now();
            g.backward(loss)?;
            if let (true, Some(p)) = (last, g.profile()) {
                println!("{name}, last step:\n{p}");
            }
            drop(g);
            let t2 = Instant::now();
            let (mut values, grads) = ps.params_and_grads();
            opt.step(&mut values, &grads, 1e-3)?;
            ps.zero_grad();
            ps.end_quant_step()?;
            let t3 = Instant::now();
            if step >= a.warmup {
                f.push((t1 - t0).as_secs_f64());
                b.push((t2 - t1).as_secs_f64());
                o.push((t3 - t2).as_secs_f64());
                s.push((t3 - t0).as_secs_f64());
            }
        }
        let step_s = median(&mut s);
        println!(
            "{:<11} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>10.0} {:>8.4}",
            name,
            1e3 * median(&mut f),
            1e3 * median(&mut b),
            1e3 * median(&mut o),
            1e3 * step_s,
            1e3 * s[0],
            n_tok as f64 / step_s,
            last_loss
        );
    }
    Ok(())
}

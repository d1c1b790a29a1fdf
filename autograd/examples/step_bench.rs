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
//! NVFP4 recipe keeps the head in BF16). The policies run interleaved (step s of each, then
//! step s + 1, ...), so that a load change on a shared machine hits them alike. Times are
//! medians over the measured steps ("best" is the fastest step); tokens/s is from the median;
//! "ratio" is the median step time over that of the first policy listed (FP32 by default).
//! Threads: `--threads` sets the rayon pool, on which every kernel runs (the f32 GEMM too);
//! each step runs with the pool's other threads polling for work
//! (`autograd::with_polling_workers`), as the trainer's steps do.

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
        "{:<11} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>8} {:>8}",
        "policy", "fwd ms", "bwd ms", "optim ms", "step ms", "best ms", "tokens/s", "loss", "ratio"
    );
    struct Run {
        name: &'static str,
        policy: GemmPolicy,
        head: GemmPolicy,
        ps: ParamStore,
        model: Gpt,
        opt: AdamW,
        /// forward, backward, optimizer, whole step (seconds per measured step)
        times: [Vec<f64>; 4],
        last_loss: f32,
    }
    let mut runs = Vec::new();
    for (name, policy, head) in policies {
        let mut ps = ParamStore::new();
        let model = Gpt::new(&mut ps, cfg, 7)?;
        let specs: Vec<ParamSpec> = ps
            .ids()
            .map(|id| ParamSpec::new(ps.value(id).map(|v| v.len()).unwrap_or(0), 0))
            .collect();
        let opt = AdamW::new(AdamWConfig::default(), &specs)?;
        runs.push(Run {
            name,
            policy,
            head,
            ps,
            model,
            opt,
            times: Default::default(),
            last_loss: 0.0,
        });
    }
    // Interleaved: step s of every policy, then step s + 1, ... so that load changes on a
    // shared machine hit all policies alike (ratios from one run are then comparable).
    for step in 0..a.warmup + a.steps {
        for r in runs.iter_mut() {
            let t0 = Instant::now();
            let mut one = || -> Result<(Instant, Instant), BoxError> {
                let mut g = Graph::new(&mut r.ps).with_rng(0, step as u64);
                let last = step + 1 == a.warmup + a.steps;
                if a.profile && last {
                    g.enable_profiling();
                }
                let loss = r
                    .model
                    .loss(&mut g, tokens, targets, a.batch, &r.policy, &r.head)?;
                r.last_loss = g.item(loss)?;
                let t1 = Instant::now();
                g.backward(loss)?;
                if let (true, Some(p)) = (last, g.profile()) {
                    println!("{}, last step:\n{p}", r.name);
                }
                drop(g);
                let t2 = Instant::now();
                let (mut values, grads) = r.ps.params_and_grads();
                r.opt.step(&mut values, &grads, 1e-3)?;
                r.ps.zero_grad();
                r.ps.end_quant_step()?;
                Ok((t1, t2))
            };
            let (t1, t2) = autograd::with_polling_workers(&mut one)?;
            let t3 = Instant::now();
            if step >= a.warmup {
                let d = [t1 - t0, t2 - t1, t3 - t2, t3 - t0];
                for (v, d) in r.times.iter_mut().zip(d) {
                    v.push(d.as_secs_f64());
                }
            }
        }
    }
    let mut base = None;
    for r in runs.iter_mut() {
        let [f, b, o, s] = &mut r.times;
        let best = s.iter().fold(f64::MAX, |m, &v| m.min(v));
        let step_s = median(s);
        let base_s = *base.get_or_insert(step_s);
        println!(
            "{:<11} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>10.0} {:>8.4} {:>8.2}",
            r.name,
            1e3 * median(f),
            1e3 * median(b),
            1e3 * median(o),
            1e3 * step_s,
            1e3 * best,
            n_tok as f64 / step_s,
            r.last_loss,
            step_s / base_s
        );
    }
    Ok(())
}

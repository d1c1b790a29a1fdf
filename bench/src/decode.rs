//! `bench decode`: the RL sampler's decoding, as ratios measured in one run (reported, not
//! gated): tokens/s of KV-cache decoding over full recomputation (the whole context re-run for
//! every token, what `trainer sample` did before the cache), and the time of an NVFP4-sampler
//! decode step (W4A4 in every block, static activation scales) over a BF16-sampler step, on the
//! default model with random weights. Rounds are interleaved; medians (and the ratios'
//! spreads over rounds) are reported; `cargo xtask bench` adds them to its report, ungated.

use std::time::Instant;

use anyhow::Result;

use crate::harness::median_and_spread;
use crate::metric::{Better, Metric};
use trainer::model::{Gpt, ModelConfig};
use trainer::recipe::Recipe;
use trainer::rl::kv_cache::KvCache;
use trainer::rl::plan::ActivationScales;
use trainer::rl::sampler::{GenConfig, PolicySampler};

/// New tokens per sequence.
const TOKENS: usize = 64;
/// Sequences of a sampler batch.
const ROWS: usize = 64;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn gen(tokens: usize) -> GenConfig {
    GenConfig {
        max_tokens: tokens,
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        stop: vec![],
    }
}

/// Runs the measurements, prints a small table and returns the metrics (all reported).
pub fn suite(rounds: usize) -> Result<Vec<Metric>> {
    let cfg = ModelConfig::preset("small")?;
    // autograd's ParamStore, named through trainer's API
    let mut ps = Default::default();
    let model = Gpt::new(&mut ps, cfg, 1)?;
    let prompt: Vec<u32> = "\nOnce, there was".bytes().map(u32::from).collect();
    let n = TOKENS;
    let bf16 = Recipe::builtin("bf16")?;
    let mut cached = PolicySampler::new(&model, &ps, bf16.clone(), ActivationScales::Dynamic, &[])?;
    let calib: Vec<Vec<u32>> = vec![prompt.clone(); 4];
    let nv = Recipe::builtin("nvfp4-no-bf16-layers")?;
    let mut nvfp4 = PolicySampler::new(&model, &ps, nv, ActivationScales::Static, &calib)?;
    let batch: Vec<Vec<u32>> = vec![prompt.clone(); ROWS];
    let (mut full_s, mut cache_s, mut bf_s, mut nv_s) = (vec![], vec![], vec![], vec![]);
    // the pool's other threads poll for the decoding's tiny parallel regions, as they do in
    // the trainer's sampling
    autograd::with_polling_workers(|| -> Result<()> {
        for round in 0..rounds {
            // one sequence, n tokens: full recomputation (a fresh prefill of the whole context
            // for every token, greedy), through the sampler's own forward
            let t = Instant::now();
            let mut ctx = prompt.clone();
            for _ in 0..n {
                let mut cache = KvCache::new(&cached.model().cfg, 1, ctx.len())?;
                let v = cached.forward(&ctx, 1, &mut cache, None)?;
                let last = &v[v.len() - 256..];
                let next = (0..256)
                    .max_by(|&a, &b| last[a].total_cmp(&last[b]))
                    .unwrap_or(0);
                ctx.push(next as u32);
            }
            full_s.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            cached.generate(std::slice::from_ref(&prompt), &gen(n), round as u64)?;
            cache_s.push(t.elapsed().as_secs_f64());
            // ROWS rows x n tokens: BF16 and NVFP4 samplers
            let t = Instant::now();
            batch_run(&mut cached, &batch, n, round)?;
            bf_s.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            batch_run(&mut nvfp4, &batch, n, round)?;
            nv_s.push(t.elapsed().as_secs_f64());
        }
        Ok(())
    })?;
    let ratios =
        |a: &[f64], b: &[f64]| -> Vec<f64> { a.iter().zip(b).map(|(x, y)| x / y).collect() };
    let (f, c) = (median(full_s.clone()), median(cache_s.clone()));
    let (b, q) = (median(bf_s.clone()), median(nv_s.clone()));
    let speedup = median_and_spread(&ratios(&full_s, &cache_s));
    let nv_over_bf = median_and_spread(&ratios(&nv_s, &bf_s));
    println!("decode, small preset, {rounds} interleaved rounds (medians):");
    println!("| measurement | value |\n|---|---:|");
    println!("| 1 sequence x {n} tokens, full recomputation (s) | {f:.3} |");
    println!("| 1 sequence x {n} tokens, KV cache (s) | {c:.3} |");
    println!(
        "| KV-cache tokens/s over full recomputation | {:.2} |",
        speedup.0
    );
    println!("| {ROWS} sequences x {n} tokens, BF16 sampler (s) | {b:.3} |");
    println!("| {ROWS} sequences x {n} tokens, NVFP4 sampler, static scales (s) | {q:.3} |");
    println!(
        "| NVFP4-sampler decode time / BF16-sampler decode time | {:.2} |",
        nv_over_bf.0
    );
    let rows_tokens = (ROWS * n) as f64;
    Ok(vec![
        Metric::reported_ratio(
            "decode/kv_cache/vs_full_recompute".into(),
            speedup,
            Better::Higher,
            format!(
                "tokens/s of KV-cache decoding over full recomputation (whole context re-run per \
                 token): 1 sequence x {n} new tokens, small preset, BF16, same rounds"
            ),
        ),
        Metric::reported_ratio(
            "decode/nvfp4_sampler/vs_bf16_sampler".into(),
            nv_over_bf,
            Better::Lower,
            format!(
                "time of NVFP4-sampler decoding (W4A4, static scales) over BF16-sampler \
                 decoding: {ROWS} sequences x {n} new tokens with the KV cache, same rounds \
                 (NVFP4 is emulated on the CPU)"
            ),
        ),
        Metric::absolute(
            "decode/kv_cache/tokens_per_s".into(),
            n as f64 / c,
            "tok/s",
            Better::Higher,
            format!("KV-cache decoding, 1 sequence x {n} tokens, BF16"),
        ),
        Metric::absolute(
            "decode/bf16_sampler/tokens_per_s".into(),
            rows_tokens / b,
            "tok/s",
            Better::Higher,
            format!("BF16 sampler, {ROWS} sequences x {n} tokens"),
        ),
        Metric::absolute(
            "decode/nvfp4_sampler/tokens_per_s".into(),
            rows_tokens / q,
            "tok/s",
            Better::Higher,
            format!("NVFP4 sampler (static scales), {ROWS} sequences x {n} tokens"),
        ),
    ])
}

fn batch_run(s: &mut PolicySampler, batch: &[Vec<u32>], n: usize, round: usize) -> Result<()> {
    s.generate(batch, &gen(n), round as u64)?;
    Ok(())
}

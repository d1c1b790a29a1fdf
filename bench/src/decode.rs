//! `bench decode`: the RL sampler's decoding, as ratios measured in one run (reported, not
//! gated): tokens/s of KV-cache decoding over full recomputation (the whole context re-run for
//! every token, what `trainer sample` did before the cache), and the time of an NVFP4-sampler
//! decode step (W4A4 in every block, static activation scales) over a BF16-sampler step, on the
//! default model with random weights. Rounds are interleaved; medians are reported.

use std::time::Instant;

use anyhow::Result;
use trainer::model::{Gpt, ModelConfig};
use trainer::recipe::Recipe;
use trainer::rl::kv_cache::KvCache;
use trainer::rl::plan::ActivationScales;
use trainer::rl::sampler::{GenConfig, PolicySampler};

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

/// Runs the measurements and prints a small table.
pub fn run(rounds: usize) -> Result<()> {
    let cfg = ModelConfig::preset("small")?;
    // autograd's ParamStore, named through trainer's API (bench does not depend on autograd)
    let mut ps = Default::default();
    let model = Gpt::new(&mut ps, cfg, 1)?;
    let prompt: Vec<u32> = "\nOnce, there was".bytes().map(u32::from).collect();
    let n = 64;
    let bf16 = Recipe::builtin("bf16")?;
    let mut cached = PolicySampler::new(&model, &ps, bf16.clone(), ActivationScales::Dynamic, &[])?;
    let calib: Vec<Vec<u32>> = vec![prompt.clone(); 4];
    let nv = Recipe::builtin("nvfp4-no-bf16-layers")?;
    let mut nvfp4 = PolicySampler::new(&model, &ps, nv, ActivationScales::Static, &calib)?;
    let batch: Vec<Vec<u32>> = vec![prompt.clone(); 64];
    let (mut full_s, mut cache_s, mut bf_s, mut nv_s) = (vec![], vec![], vec![], vec![]);
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
        // 64 rows x n tokens: BF16 and NVFP4 samplers
        let t = Instant::now();
        bf16_run(&mut cached, &batch, n, round)?;
        bf_s.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        bf16_run(&mut nvfp4, &batch, n, round)?;
        nv_s.push(t.elapsed().as_secs_f64());
    }
    let (f, c, b, q) = (median(full_s), median(cache_s), median(bf_s), median(nv_s));
    println!("decode, small preset, {rounds} interleaved rounds (medians):");
    println!("| measurement | value |\n|---|---:|");
    println!("| 1 sequence x {n} tokens, full recomputation (s) | {f:.3} |");
    println!("| 1 sequence x {n} tokens, KV cache (s) | {c:.3} |");
    println!(
        "| KV-cache tokens/s over full recomputation | {:.2} |",
        f / c
    );
    println!("| 64 sequences x {n} tokens, BF16 sampler (s) | {b:.3} |");
    println!("| 64 sequences x {n} tokens, NVFP4 sampler, static scales (s) | {q:.3} |");
    println!(
        "| NVFP4-sampler decode time / BF16-sampler decode time | {:.2} |",
        q / b
    );
    Ok(())
}

fn bf16_run(s: &mut PolicySampler, batch: &[Vec<u32>], n: usize, round: usize) -> Result<()> {
    s.generate(batch, &gen(n), round as u64)?;
    Ok(())
}

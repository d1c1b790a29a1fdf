//! End-to-end training steps of the default model (`trainer`'s `small` preset on the embedded
//! corpus) per recipe.
//!
//! Recipes are compared inside one process: a trainer per recipe, then rounds in which every
//! trainer takes one step, in an order that rotates from round to round, so each gated ratio
//! (recipe step time / FP32 step time) comes from steps taken within about a second of each
//! other. For thread scaling, 1-thread and 2-thread FP32 children (a process each, with its own
//! pool and allocator state) alternate.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use trainer::recipe::Recipe;
use trainer::train::{RunConfig, TrainOptions, Trainer};

use crate::harness::{child_output, median_and_spread, pool, Rounds};
use crate::metric::{Basis, Better, Metric};
use crate::peak;

/// Recipes the step suite measures; FP32 is the reference.
pub const RECIPES: &[&str] = &["fp32", "bf16", "fp8-current", "mxfp8", "nvfp4"];

/// Model preset the steps run (the README's main command trains it).
pub const PRESET: &str = "small";

/// What a child prints (one JSON line on stdout).
#[derive(Debug, Serialize, Deserialize)]
pub struct ChildResult {
    /// Threads (the rayon pool every kernel runs on).
    pub threads: usize,
    /// Tokens per optimizer step.
    pub tokens_per_step: u64,
    /// Recipe names, in the order of `secs`.
    pub recipes: Vec<String>,
    /// Seconds of each timed step: `secs[recipe][round]`.
    pub secs: Vec<Vec<f64>>,
}

/// Child: a trainer per recipe, `warmup` untimed steps each, then `rounds` rounds of one
/// timed step per recipe in rotating order.
pub fn child(
    preset: &str,
    recipes: &[String],
    threads: usize,
    warmup: usize,
    rounds: usize,
) -> Result<ChildResult> {
    if threads == 0 || rounds == 0 || recipes.is_empty() {
        bail!("need at least one recipe, thread and round");
    }
    pool(threads)?.install(|| {
        let tokens_per_step = RunConfig::preset(preset)?.tokens_per_step();
        let mut trainers = warm_trainers(preset, recipes, warmup)?;
        let n = trainers.len();
        let mut secs = vec![Vec::with_capacity(rounds); n];
        for round in 0..rounds {
            for k in 0..n {
                let i = (k + round) % n;
                let t = Instant::now();
                trainers[i].train_step()?;
                secs[i].push(t.elapsed().as_secs_f64());
            }
        }
        Ok(ChildResult {
            threads,
            tokens_per_step,
            recipes: recipes.to_vec(),
            secs,
        })
    })
}

/// A trainer per recipe on the preset's model (run directory unused: nothing is written),
/// each after `warmup` untimed steps, on the current rayon pool.
pub fn warm_trainers(preset: &str, recipes: &[String], warmup: usize) -> Result<Vec<Trainer>> {
    let cfg = RunConfig::preset(preset)?;
    let mut trainers = Vec::new();
    for r in recipes {
        let mut tr = Trainer::new(
            cfg.clone(),
            Recipe::builtin(r)?,
            TrainOptions {
                out: std::env::temp_dir().join("nibble-bench-unused"),
                quiet: true,
                stop_after: None,
            },
        )?;
        for _ in 0..warmup {
            tr.train_step()?;
        }
        trainers.push(tr);
    }
    Ok(trainers)
}

fn run_child(
    preset: &str,
    recipes: &[&str],
    threads: usize,
    warmup: usize,
    rounds: usize,
) -> Result<ChildResult> {
    let args = [
        "step",
        "--preset",
        preset,
        "--recipes",
        &recipes.join(","),
        "--threads",
        &threads.to_string(),
        "--warmup",
        &warmup.to_string(),
        "--rounds",
        &rounds.to_string(),
    ]
    .map(String::from);
    let what = format!("step child ({recipes:?}, {threads} threads)");
    let out = child_output(&args, &[], &what)?;
    let line = String::from_utf8_lossy(&out);
    serde_json::from_str(line.trim()).with_context(|| format!("parsing child output {line:?}"))
}

/// Parent: the recipe comparison (`rounds` rounds in one 2-thread child) and the thread
/// scaling (`scaling_rounds` pairs of 1- and 2-thread FP32 children, each pair followed by
/// the register-only probe of the host's second core), then the metrics.
pub fn suite(rounds: usize, scaling_rounds: usize) -> Result<Vec<Metric>> {
    let (mut out, what) = per_recipe(PRESET, rounds, true)?;
    // Thread scaling: alternate 1- and 2-thread children (order flipped every round).
    // After each pair of children, the host's second core: the same register-only work on a
    // 1-thread and a 2-thread pool (two units of about 50 ms each).
    let pools = [pool(1)?, pool(2)?];
    let iters = peak::scaling_iters(0.05)?;
    let mut per = [Vec::new(), Vec::new()];
    let mut probe = [Vec::new(), Vec::new()];
    for round in 0..scaling_rounds {
        for k in 0..2 {
            let i = (k + round) % 2;
            let c = run_child(PRESET, &["fp32"], i + 1, 1, 3)?;
            per[i].push(median_and_spread(&c.secs[0]).0);
        }
        for k in 0..2 {
            let i = (k + round) % 2;
            let t = Instant::now();
            peak::scaling_work(&pools[i], 2, iters);
            probe[i].push(t.elapsed().as_secs_f64());
        }
    }
    let [one, two] = per;
    let s = Rounds::from_times(vec!["1t", "2t"], vec![one, two]);
    let (x, spread) = s.ratio("1t", "2t");
    let [one, two] = probe;
    let p = Rounds::from_times(vec!["1t", "2t"], vec![one, two]).ratio("1t", "2t");
    eprintln!(
        "  fp32 2-thread speed-up {x:.2}x ({scaling_rounds} pairs of children; the FMA probe's {:.2}x)",
        p.0
    );
    // Reported, not gated: a step runs hundreds of short parallel regions, and how fast the
    // host wakes an idle vCPU for each differs between hosts of one kind (a Zen 4 CI host ran
    // it at 1.38x in two runs against 1.74x recorded, while the coarse quantizer speed-ups of
    // the same run held), so the figure is reported with the two probes that explain it.
    out.push(Metric::reported_ratio(
        "step/fp32/speedup_2t".into(),
        (x, spread),
        Better::Higher,
        format!("1-thread step time / 2-thread step time (alternating child processes), {what}"),
    ));
    let wake = peak::wake_latency_us(&pools[1], 64);
    eprintln!("  a sleeping pool thread wakes for a task in {wake:.1} us (median of 64)");
    out.push(Metric::absolute(
        "step/wake_probe/us".into(),
        wake,
        "us",
        Better::Lower,
        "median time for an idle thread of a 2-thread pool to wake and take a queued task after 2 ms asleep (64 tries): the cost each parallel region of a step pays on this host".into(),
    ));
    out.push(Metric::reported_ratio(
        peak::scaling_probe_metric("step"),
        p,
        Better::Higher,
        "the host's second core in these rounds: register-only FMA work on a 1-thread pool / the same work on a 2-thread pool, timed after each pair of children (~2.0 on two whole cores)".into(),
    ));
    Ok(out)
}

/// Another preset's steps per recipe (`base`: the larger model the goals name), in
/// one 2-thread child, reported, not gated: `step_<preset>/<recipe>/{ms,tokens_per_s,vs_fp32}`.
/// A `base` step is about ten times the default model's, so a gated figure would cost CI
/// minutes.
pub fn preset_suite(preset: &str, rounds: usize) -> Result<Vec<Metric>> {
    Ok(per_recipe(preset, rounds, false)?.0)
}

/// Every recipe's step in one 2-thread child: median ms, tokens/s and the ratio to the FP32
/// step, named `step/...` and gated for the default preset (`gated`), `step_<preset>/...` and
/// reported otherwise; also the description of what was measured.
fn per_recipe(preset: &str, rounds: usize, gated: bool) -> Result<(Vec<Metric>, String)> {
    let res = run_child(preset, RECIPES, 2, 1, rounds)?;
    let r = Rounds::from_times(RECIPES.to_vec(), res.secs);
    let tokens = res.tokens_per_step;
    let prefix = if gated {
        "step".to_string()
    } else {
        format!("step_{preset}")
    };
    let what = format!(
        "trainer preset `{preset}` on the embedded corpus, {tokens} tokens/step, fwd+bwd+clip+AdamW"
    );
    let mut out = Vec::new();
    for &recipe in RECIPES {
        let ms = 1e3 * r.median_secs(recipe);
        eprintln!("  {preset} {recipe:<12} {ms:8.1} ms/step (median of {rounds}, 2 threads)");
        out.push(Metric::absolute(
            format!("{prefix}/{recipe}/ms"),
            ms,
            "ms",
            Better::Lower,
            format!("median step time, 2 threads, {what}"),
        ));
        out.push(Metric::absolute(
            format!("{prefix}/{recipe}/tokens_per_s"),
            tokens as f64 / (ms / 1e3),
            "tok/s",
            Better::Higher,
            format!("2 threads, {what}"),
        ));
        if recipe == "fp32" {
            continue;
        }
        let (name, ratio) = (
            format!("{prefix}/{recipe}/vs_fp32"),
            r.ratio(recipe, "fp32"),
        );
        let note = format!(
            "step time / FP32 step time (steps interleaved in one process), 2 threads, {what}"
        );
        out.push(if gated {
            Metric::ratio(name, ratio, Basis::Compute, Better::Lower, note)
        } else {
            Metric::reported_ratio(name, ratio, Better::Lower, note)
        });
    }
    Ok((out, what))
}

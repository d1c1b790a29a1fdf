//! `bench ops`: where one training step's time goes, op by op. For each recipe, a trainer
//! on a 1-thread and one on a 2-thread pool (one process; the two pools take their rounds
//! alternately) take `rounds` steps each with the graph's op timer on
//! ([`trainer::train::Trainer::set_op_profiling`]); the table gives each op's median forward
//! and backward milliseconds per step on both pools and its speed-up from the second thread,
//! then the sum over the ops and the whole step (which adds the optimizer and the step's
//! bookkeeping). Reported, never gated: it explains
//! the gated step ratios (which ops a recipe spends its time in, and which of them gain
//! less than the rest from a second core).

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{bail, Result};
use trainer::recipe::Recipe;
use trainer::train::{RunConfig, TrainOptions, Trainer};

use crate::harness::{median_and_spread, pool};

/// Per-step seconds of one recipe on one pool: each op (name, forward) and the whole step.
#[derive(Default)]
struct Timings {
    ops: BTreeMap<(&'static str, bool), Vec<f64>>,
    calls: BTreeMap<(&'static str, bool), usize>,
    steps: Vec<f64>,
}

impl Timings {
    fn median(v: &[f64]) -> f64 {
        if v.is_empty() {
            0.0
        } else {
            median_and_spread(v).0
        }
    }

    /// The median over rounds of the per-round sum over all ops.
    fn all_ops(&self) -> f64 {
        let rounds = self.steps.len();
        let sums: Vec<f64> = (0..rounds)
            .map(|r| self.ops.values().filter_map(|v| v.get(r)).sum())
            .collect();
        Self::median(&sums)
    }
}

/// A pool and a trainer per recipe on it, with the timings of its profiled steps.
struct Lane {
    pool: rayon::ThreadPool,
    trainers: Vec<Trainer>,
    timings: Vec<Timings>,
}

impl Lane {
    /// A trainer per recipe on a pool of `threads`, `warmup` untimed steps each.
    fn new(preset: &str, recipes: &[String], threads: usize, warmup: usize) -> Result<Lane> {
        let pool = pool(threads)?;
        let trainers = pool.install(|| -> Result<Vec<Trainer>> {
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
                tr.set_op_profiling(true);
                trainers.push(tr);
            }
            Ok(trainers)
        })?;
        let timings = recipes.iter().map(|_| Timings::default()).collect();
        Ok(Lane {
            pool,
            trainers,
            timings,
        })
    }

    /// One profiled step of every recipe, on this lane's pool.
    fn round(&mut self) -> Result<()> {
        let Lane {
            pool,
            trainers,
            timings,
        } = self;
        pool.install(|| {
            for (tr, t) in trainers.iter_mut().zip(timings.iter_mut()) {
                let t0 = Instant::now();
                tr.train_step()?;
                t.steps.push(t0.elapsed().as_secs_f64());
                let Some(p) = tr.last_op_profile() else {
                    bail!("the trainer returned no op profile");
                };
                for e in p.entries() {
                    t.ops.entry((e.op, e.forward)).or_default().push(e.seconds);
                    t.calls.insert((e.op, e.forward), e.calls);
                }
            }
            Ok(())
        })
    }
}

/// Runs the profiles on 1 and 2 threads and prints one Markdown table per recipe.
pub fn run(preset: &str, recipes: &[String], warmup: usize, rounds: usize) -> Result<()> {
    if recipes.is_empty() || rounds == 0 {
        bail!("need at least one recipe and one round");
    }
    // the two pools take their rounds alternately (first one, then the other, the order
    // flipped every round), so that the host's drift reaches both alike
    let mut lanes = [
        Lane::new(preset, recipes, 1, warmup)?,
        Lane::new(preset, recipes, 2, warmup)?,
    ];
    for r in 0..rounds {
        for i in [r % 2, 1 - r % 2] {
            lanes[i].round()?;
        }
    }
    let [one, two] = lanes.map(|l| l.timings);
    println!(
        "`{preset}` preset, medians over {rounds} profiled steps per recipe and pool \
         (ms per step; ops under 1% of the 1-thread step are left out):"
    );
    for ((name, a), b) in recipes.iter().zip(&one).zip(&two) {
        let step1 = Timings::median(&a.steps);
        println!("\n{name}\n\n| op | dir | calls | 1 thread | 2 threads | speed-up |");
        println!("|---|---|---:|---:|---:|---:|");
        let mut rows: Vec<_> = a
            .ops
            .iter()
            .map(|(k, v)| (*k, Timings::median(v)))
            .filter(|(_, ms)| *ms >= 0.01 * step1)
            .collect();
        rows.sort_by(|x, y| y.1.total_cmp(&x.1));
        let line = |label: &str, dir: &str, calls: String, s1: f64, s2: f64| {
            let up = if s2 > 0.0 { s1 / s2 } else { f64::NAN };
            println!(
                "| {label} | {dir} | {calls} | {:.2} | {:.2} | {up:.2}x |",
                1e3 * s1,
                1e3 * s2
            );
        };
        for ((op, fwd), s1) in rows {
            let s2 = b.ops.get(&(op, fwd)).map_or(0.0, |v| Timings::median(v));
            let calls = a.calls.get(&(op, fwd)).copied().unwrap_or(0);
            line(
                op,
                if fwd { "fwd" } else { "bwd" },
                calls.to_string(),
                s1,
                s2,
            );
        }
        line("all ops", "", String::new(), a.all_ops(), b.all_ops());
        line("step", "", String::new(), step1, Timings::median(&b.steps));
    }
    Ok(())
}

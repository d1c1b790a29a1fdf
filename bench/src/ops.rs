//! `bench ops`: where one training step's time goes, op by op. For each recipe, a trainer
//! on a 1-thread and one on a 2-thread pool (one process; the two pools take their rounds
//! alternately) take `rounds` steps each with the graph's op timer on
//! ([`trainer::train::Trainer::set_op_profiling`]); the table gives each op's median forward
//! and backward milliseconds per step on both pools and its speed-up from the second thread,
//! then the sum over the ops and the whole step (which adds the optimizer and the step's
//! bookkeeping). Reported, never gated: it explains the gated step ratios (which ops a
//! recipe spends its time in, and which of them gain less than the rest from a second core).

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{bail, Result};
use trainer::train::Trainer;

use crate::harness::{median_and_spread, pool};
use crate::steps::warm_trainers;

/// Per-step seconds of one recipe on one pool: each op (name, forward) over the steps it
/// ran in, the sum over all ops and the whole step, one value per profiled step.
#[derive(Default)]
struct Timings {
    ops: BTreeMap<(&'static str, bool), Vec<f64>>,
    calls: BTreeMap<(&'static str, bool), usize>,
    all_ops: Vec<f64>,
    steps: Vec<f64>,
}

/// The median of a non-empty series (every series here holds one value per round).
fn median(v: &[f64]) -> f64 {
    median_and_spread(v).0
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
        let mut trainers = pool.install(|| warm_trainers(preset, recipes, warmup))?;
        for tr in trainers.iter_mut() {
            tr.set_op_profiling(true);
        }
        let timings = recipes.iter().map(|_| Timings::default()).collect();
        Ok(Lane {
            pool,
            trainers,
            timings,
        })
    }

    /// Round `round`: one profiled step of every recipe on this lane's pool, in an order
    /// that rotates from round to round (as in `bench step`).
    fn round(&mut self, round: usize) -> Result<()> {
        let Lane {
            pool,
            trainers,
            timings,
        } = self;
        let n = trainers.len();
        pool.install(|| {
            for k in 0..n {
                let i = (k + round) % n;
                let (tr, t) = (&mut trainers[i], &mut timings[i]);
                let t0 = Instant::now();
                tr.train_step()?;
                t.steps.push(t0.elapsed().as_secs_f64());
                let Some(p) = tr.last_op_profile() else {
                    bail!("the trainer returned no op profile");
                };
                t.all_ops.push(p.entries().iter().map(|e| e.seconds).sum());
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
            lanes[i].round(r)?;
        }
    }
    let [one, two] = lanes.map(|l| l.timings);
    println!(
        "`{preset}` preset, medians over {rounds} profiled steps per recipe and pool \
         (ms per step; ops under 1% of the 1-thread step are left out):"
    );
    for ((name, a), b) in recipes.iter().zip(&one).zip(&two) {
        let step1 = median(&a.steps);
        println!("\n{name}\n\n| op | dir | calls | 1 thread | 2 threads | speed-up |");
        println!("|---|---|---:|---:|---:|---:|");
        let mut rows: Vec<_> = a
            .ops
            .iter()
            .map(|(k, v)| (*k, median(v)))
            .filter(|(_, secs)| *secs >= 0.01 * step1)
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
            let s2 = b.ops.get(&(op, fwd)).map_or(0.0, |v| median(v));
            let calls = a.calls.get(&(op, fwd)).copied().unwrap_or(0);
            line(
                op,
                if fwd { "fwd" } else { "bwd" },
                calls.to_string(),
                s1,
                s2,
            );
        }
        line(
            "all ops",
            "",
            String::new(),
            median(&a.all_ops),
            median(&b.all_ops),
        );
        line("step", "", String::new(), step1, median(&b.steps));
    }
    Ok(())
}

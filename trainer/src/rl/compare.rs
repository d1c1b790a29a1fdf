//! The report of `trainer rl compare`: a grid of plans x corrections x seeds, each run in
//! `OUT/<plan>-<correction>/seed<k>/`, summarized in `OUT/report.md` with SVG curves
//! (held-out and rollout pass rates, mismatch) averaged over seeds.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::config::{io_err, RlError};
use super::correction::Correction;
use super::metrics::{self, EvalRecord, RlSummary, StepRecord};

/// The file a run stopped by the divergence guard leaves (see [`super::guard`]); a grid
/// run holding it is final: `rl compare` reports it and does not resume it.
pub const DIAGNOSIS_FILE: &str = "diagnosis.txt";

/// Whether the run in `dir` was stopped by the divergence guard (or a non-finite value).
pub fn stopped(dir: &Path) -> bool {
    dir.join(DIAGNOSIS_FILE).is_file()
}

/// One run of the grid.
#[derive(Clone, Debug)]
pub struct GridRun {
    /// The plan as given (name or file).
    pub plan: String,
    /// The plan's name.
    pub plan_name: String,
    /// The correction.
    pub correction: Correction,
    /// The seed.
    pub seed: u64,
    /// Its directory.
    pub dir: PathBuf,
}

struct Loaded {
    summary: RlSummary,
    steps: Vec<StepRecord>,
    evals: Vec<EvalRecord>,
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    let sd = if v.len() > 1 {
        (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
    } else {
        f64::NAN
    };
    (m, sd)
}

fn mean_curve(curves: &[Vec<(f64, f64)>]) -> Vec<(f64, f64)> {
    let n = curves.iter().map(|c| c.len()).min().unwrap_or(0);
    (0..n)
        .map(|i| {
            let x = curves[0][i].0;
            let y = curves.iter().map(|c| c[i].1).sum::<f64>() / curves.len() as f64;
            (x, y)
        })
        .collect()
}

fn ema(points: Vec<(f64, f64)>, alpha: f64) -> Vec<(f64, f64)> {
    let mut acc = None;
    points
        .into_iter()
        .map(|(x, y)| {
            let v = match acc {
                None => y,
                Some(a) => alpha * y + (1.0 - alpha) * a,
            };
            acc = Some(v);
            (x, v)
        })
        .collect()
}

/// A stopped run's row: its last held-out evaluation, its mean mismatch, and why it stopped
/// (the diagnosis's first line).
fn stopped_row(key: &(String, String), r: &GridRun, diagnosis: &str) -> Result<String, RlError> {
    let steps = metrics::read(&r.dir.join("metrics.jsonl"))?;
    let evals = metrics::read(&r.dir.join("eval.jsonl"))?;
    let last = evals.last().map_or("-".to_string(), |e: &EvalRecord| {
        format!("{}, {:.3}, {:.3}", e.step, e.pass_rate, e.sampled_pass_rate)
    });
    let n = steps.len().max(1) as f64;
    let mean = |f: fn(&StepRecord) -> f64| steps.iter().map(f).sum::<f64>() / n;
    let why = diagnosis.lines().next().unwrap_or("").replace('|', "/");
    Ok(format!(
        "| {} | {} | {} | {last} | {:.2e} | {:.2e} | {why} |",
        key.0,
        key.1,
        r.seed,
        mean(|x| x.mismatch.mean_abs_dlogp),
        mean(|x| x.mismatch.k3),
    ))
}

/// Writes `OUT/report.md` and the SVGs from the runs that finished (and a table of the runs
/// the divergence guard stopped); returns the report path.
pub fn write_report(out: &Path, grid: &[GridRun], from: &Path) -> Result<PathBuf, RlError> {
    let mut groups: BTreeMap<(String, String), Vec<(u64, Loaded)>> = BTreeMap::new();
    let mut missing = Vec::new();
    let mut stopped_rows = Vec::new();
    let mut stopped_count: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut order: Vec<(String, String)> = Vec::new();
    for r in grid {
        let key = (r.plan_name.clone(), r.correction.name().to_string());
        if !order.contains(&key) {
            order.push(key.clone());
        }
        let sp = r.dir.join("summary.json");
        let Ok(text) = std::fs::read_to_string(&sp) else {
            match std::fs::read_to_string(r.dir.join(DIAGNOSIS_FILE)) {
                Ok(diagnosis) => {
                    stopped_rows.push(stopped_row(&key, r, &diagnosis)?);
                    *stopped_count.entry(key).or_default() += 1;
                }
                Err(_) => missing.push(format!("{} {} seed {}", key.0, key.1, r.seed)),
            }
            continue;
        };
        let summary: RlSummary = serde_json::from_str(&text)
            .map_err(|e| RlError::Invalid(format!("{}: {e}", sp.display())))?;
        let steps = metrics::read(&r.dir.join("metrics.jsonl"))?;
        let evals = metrics::read(&r.dir.join("eval.jsonl"))?;
        groups.entry(key).or_default().push((
            r.seed,
            Loaded {
                summary,
                steps,
                evals,
            },
        ));
    }
    let reference = order
        .iter()
        .find(|(p, c)| p == "bf16" && c == "none")
        .cloned();
    let ref_final = |f: fn(&RlSummary) -> f64| -> BTreeMap<u64, f64> {
        reference
            .as_ref()
            .and_then(|k| groups.get(k))
            .map(|runs| runs.iter().map(|(s, l)| (*s, f(&l.summary))).collect())
            .unwrap_or_default()
    };
    let mut s = String::new();
    let _ = writeln!(s, "# RL comparison\n");
    let _ = writeln!(
        s,
        "Start: `{}`. Held-out pass rates on the fixed held-out prompts, by a BF16 copy of the policy (the same evaluator for every plan): greedy decoding, and one completion sampled at temperature 1 per prompt (pass@1 of the policy's own distribution, seed 0). Before, after, gain: mean ± sample standard deviation over seeds; the gap to `bf16`/`none` is paired by seed (mean ± standard error).\n",
        from.display()
    );
    let _ = writeln!(
        s,
        "| plan | correction | seeds | greedy before | greedy after | greedy gain | greedy gap to bf16 | sampled before | sampled after | sampled gain | sampled gap to bf16 | mean abs dlogp | k3 KL | bitwise-different | sampler tok/s | trainer tok/s |"
    );
    let _ = writeln!(
        s,
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for key in &order {
        let Some(runs) = groups.get(key) else {
            continue;
        };
        let seeds = match stopped_count.get(key) {
            Some(n) => format!("{} (+{n} stopped)", runs.len()),
            None => runs.len().to_string(),
        };
        let cell = |before: fn(&RlSummary) -> f64, after: fn(&RlSummary) -> f64| {
            let f: Vec<f64> = runs.iter().map(|(_, l)| after(&l.summary)).collect();
            let i: Vec<f64> = runs.iter().map(|(_, l)| before(&l.summary)).collect();
            let gain: Vec<f64> = f.iter().zip(&i).map(|(a, b)| a - b).collect();
            let (fm, fsd) = mean_sd(&f);
            let (im, _) = mean_sd(&i);
            let (gm, gsd) = mean_sd(&gain);
            let rf = ref_final(after);
            let gaps: Vec<f64> = runs
                .iter()
                .filter_map(|(seed, l)| rf.get(seed).map(|r| after(&l.summary) - r))
                .collect();
            let gap = if gaps.is_empty() || Some(key) == reference.as_ref() {
                "-".to_string()
            } else {
                let (m, sd) = mean_sd(&gaps);
                let se = sd / (gaps.len() as f64).sqrt();
                if se.is_nan() {
                    format!("{m:+.3}")
                } else {
                    format!("{m:+.3} ± {se:.3}")
                }
            };
            let pm = |sd: f64| {
                if sd.is_nan() {
                    String::new()
                } else {
                    format!(" ± {sd:.3}")
                }
            };
            format!("{im:.3} | {fm:.3}{} | {gm:+.3}{} | {gap}", pm(fsd), pm(gsd))
        };
        let greedy = cell(|s| s.initial_pass_rate, |s| s.final_pass_rate);
        let sampled = cell(
            |s| s.initial_sampled_pass_rate,
            |s| s.final_sampled_pass_rate,
        );
        let avg = |g: &dyn Fn(&RlSummary) -> f64| {
            runs.iter().map(|(_, l)| g(&l.summary)).sum::<f64>() / runs.len() as f64
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {greedy} | {sampled} | {:.2e} | {:.2e} | {:.3} | {:.0} | {:.0} |",
            key.0,
            key.1,
            seeds,
            avg(&|x| x.mean_abs_dlogp),
            avg(&|x| x.k3),
            avg(&|x| x.frac_bitwise_different),
            avg(&|x| x.sampler_tokens_per_s),
            avg(&|x| x.trainer_tokens_per_s),
        );
    }
    if !stopped_rows.is_empty() {
        let _ = writeln!(
            s,
            "\nMeans, gains and gaps are over the finished runs only. {} run(s) were stopped by \
             the divergence guard and are not averaged in (a plan and correction whose runs all \
             stopped has no row above); each is listed with its last held-out evaluation and \
             its mean mismatch over the steps it took:\n",
            stopped_rows.len()
        );
        let _ = writeln!(
            s,
            "| plan | correction | seed | last evaluation: step, greedy, sampled | mean abs dlogp | k3 KL | stopped |"
        );
        let _ = writeln!(s, "|---|---|---:|---|---:|---:|---|");
        for row in &stopped_rows {
            let _ = writeln!(s, "{row}");
        }
    }
    if !missing.is_empty() {
        let _ = writeln!(s, "\nNot finished: {}.", missing.join(", "));
    }
    let _ = writeln!(
        s,
        "\nPlots: `pass.svg` and `sampled-pass.svg` (held-out pass rates), `reward.svg` (rollout pass rate, EMA 0.2), `mismatch.svg` (mean |logp_sampler - logp_trainer| per step), `k3.svg` (k3 KL estimator per step); curves are means over seeds."
    );
    let series = |f: &dyn Fn(&Loaded) -> Vec<(f64, f64)>| -> Vec<(String, Vec<(f64, f64)>)> {
        order
            .iter()
            .filter_map(|k| {
                let runs = groups.get(k)?;
                let curves: Vec<Vec<(f64, f64)>> = runs.iter().map(|(_, l)| f(l)).collect();
                Some((format!("{} / {}", k.0, k.1), mean_curve(&curves)))
            })
            .collect()
    };
    let plot = |name: &str, title: &str, y: &str, data: Vec<(String, Vec<(f64, f64)>)>| {
        crate::report::plot_lines(&out.join(name), title, "step", y, &data)
            .map_err(|e| RlError::Invalid(e.to_string()))
    };
    plot(
        "pass.svg",
        "held-out pass rate (greedy)",
        "pass rate",
        series(&|l| {
            l.evals
                .iter()
                .map(|e| (e.step as f64, e.pass_rate))
                .collect()
        }),
    )?;
    plot(
        "sampled-pass.svg",
        "held-out pass rate (one sample at temperature 1)",
        "pass rate",
        series(&|l| {
            l.evals
                .iter()
                .map(|e| (e.step as f64, e.sampled_pass_rate))
                .collect()
        }),
    )?;
    plot(
        "reward.svg",
        "rollout pass rate (EMA)",
        "pass rate",
        series(&|l| {
            ema(
                l.steps
                    .iter()
                    .map(|r| (r.step as f64, r.pass_rate))
                    .collect(),
                0.2,
            )
        }),
    )?;
    plot(
        "mismatch.svg",
        "sampler/trainer mismatch",
        "mean |dlogp|",
        series(&|l| {
            l.steps
                .iter()
                .map(|r| (r.step as f64, r.mismatch.mean_abs_dlogp))
                .collect()
        }),
    )?;
    plot(
        "k3.svg",
        "k3 KL(sampler || trainer)",
        "k3",
        series(&|l| {
            l.steps
                .iter()
                .map(|r| (r.step as f64, r.mismatch.k3))
                .collect()
        }),
    )?;
    let path = out.join("report.md");
    crate::rundir::write_atomic(&path, s.as_bytes()).map_err(io_err(&path))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(out: &Path, plan: &str, correction: Correction, seed: u64) -> GridRun {
        GridRun {
            plan: plan.into(),
            plan_name: plan.into(),
            correction,
            seed,
            dir: out
                .join(format!("{plan}-{}", correction.name()))
                .join(format!("seed{seed}")),
        }
    }

    /// Writes a run's metrics (two steps at mismatch `dlogp`) and its evaluations.
    fn history(r: &GridRun, dlogp: f64, evals: &[(u64, f64)]) {
        std::fs::create_dir_all(&r.dir).unwrap();
        for step in 1..=2 {
            let mut rec = StepRecord {
                step,
                ..StepRecord::default()
            };
            rec.mismatch.mean_abs_dlogp = dlogp;
            metrics::append(&r.dir.join("metrics.jsonl"), &rec).unwrap();
        }
        for &(step, pass) in evals {
            let e = EvalRecord {
                step,
                pass_rate: pass,
                sampled_pass_rate: pass / 2.0,
                prompts: 200,
            };
            metrics::append(&r.dir.join("eval.jsonl"), &e).unwrap();
        }
    }

    #[test]
    fn stopped_runs_are_listed_not_averaged_and_unfinished_ones_named() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path();
        let done = run(out, "bf16", Correction::None, 0);
        history(&done, 0.0, &[(0, 0.15), (2, 0.4)]);
        let summary = RlSummary {
            plan: "bf16".into(),
            correction: "none".into(),
            seed: 0,
            steps: 2,
            initial_pass_rate: 0.15,
            final_pass_rate: 0.4,
            initial_sampled_pass_rate: 0.025,
            final_sampled_pass_rate: 0.335,
            mean_abs_dlogp: 0.0,
            k3: 0.0,
            frac_bitwise_different: 0.0,
            sampler_tokens_per_s: 1.0,
            trainer_tokens_per_s: 1.0,
            seconds: 1.0,
        };
        let text = serde_json::to_string(&summary).unwrap();
        std::fs::write(done.dir.join("summary.json"), text).unwrap();
        let stopped_run = run(out, "bf16-nvfp4", Correction::TokenTis, 0);
        history(&stopped_run, 0.2, &[(0, 0.15), (1, 0.115)]);
        std::fs::write(
            stopped_run.dir.join(DIAGNOSIS_FILE),
            "RL run stopped at step 2: the rollout pass rate collapsed | x\nlast good: none\n",
        )
        .unwrap();
        let unfinished = run(out, "bf16-nvfp4", Correction::None, 0);
        history(&unfinished, 0.2, &[(0, 0.15)]);
        assert!(stopped(&stopped_run.dir) && !stopped(&unfinished.dir) && !stopped(&done.dir));

        let stopped_ref = run(out, "bf16", Correction::None, 1);
        history(&stopped_ref, 0.0, &[(0, 0.15)]);
        std::fs::write(
            stopped_ref.dir.join(DIAGNOSIS_FILE),
            "RL run stopped at step 1\n",
        )
        .unwrap();

        let grid = [done, stopped_ref, stopped_run, unfinished];
        let report = std::fs::read_to_string(write_report(out, &grid, out).unwrap()).unwrap();
        assert!(
            report.contains("| bf16 | none | 1 (+1 stopped) | 0.150 | 0.400 |"),
            "{report}"
        );
        assert!(
            !report.contains("| bf16-nvfp4 | token-tis | 1"),
            "not averaged: {report}"
        );
        assert!(report.contains(
            "| bf16-nvfp4 | token-tis | 0 | 1, 0.115, 0.058 | 2.00e-1 | 0.00e0 | RL run stopped \
             at step 2: the rollout pass rate collapsed / x |"
        ));
        assert!(report.contains("2 run(s) were stopped by the divergence guard"));
        assert!(report.contains("Not finished: bf16-nvfp4 none seed 0."));
    }
}

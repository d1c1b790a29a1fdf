//! Comparison reports: `report.md` (final validation loss, gap to BF16, throughput, wall
//! time, per-layer quantization error) and SVG loss curves (`loss.svg`: validation loss,
//! `train-loss.svg`: training loss smoothed with an EMA), from the runs' summaries and
//! metrics.
//!
//! With several seeds per recipe (`trainer compare --seeds N`) the report adds a table of
//! seed statistics: the mean and sample standard deviation of the final validation loss,
//! and the gap to BF16 as the mean of **paired** per-seed gaps (recipe and BF16 share the
//! seed, hence the initialisation and the data order) with its standard error and the number
//! of seeds in which the recipe ended worse than BF16. The curves are then means over seeds.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use plotters::prelude::*;

use crate::train::{LayerError, RunSummary, StepMetrics, TrainError};

/// One finished run of a comparison.
#[derive(Clone, Debug)]
pub struct RunResult {
    /// The run's seed (initialisation, batching, stochastic rounding).
    pub seed: u64,
    /// Its summary.
    pub summary: RunSummary,
    /// Its metrics.
    pub metrics: Vec<StepMetrics>,
}

/// Mean and sample standard deviation (`None` for fewer than two values).
fn mean_sd(v: &[f64]) -> (f64, Option<f64>) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let sd = (v.len() > 1)
        .then(|| (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt());
    (mean, sd)
}

/// Runs grouped by recipe, in order of first appearance.
fn by_recipe(runs: &[RunResult]) -> Vec<(&str, Vec<&RunResult>)> {
    let mut groups: Vec<(&str, Vec<&RunResult>)> = Vec::new();
    for r in runs {
        match groups.iter_mut().find(|(n, _)| *n == r.summary.recipe) {
            Some((_, g)) => g.push(r),
            None => groups.push((&r.summary.recipe, vec![r])),
        }
    }
    groups
}

/// The seed-statistics table (only written when some recipe ran with several seeds).
fn seed_table(s: &mut String, runs: &[RunResult], reference: &str) {
    let groups = by_recipe(runs);
    let refs: Vec<&RunResult> = groups
        .iter()
        .find(|(n, _)| *n == reference)
        .map(|(_, g)| g.clone())
        .unwrap_or_default();
    let _ = writeln!(
        s,
        "Final validation loss over seeds (mean ± sample standard deviation); gap to \
         {reference} = mean ± standard error of the per-seed gaps (recipe vs {reference} with \
         the same seed); \"worse\" = seeds in which the recipe ended above {reference}.\n"
    );
    let _ = writeln!(
        s,
        "| recipe | seeds | final val loss | gap to {reference} | worse than {reference} | per seed |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    for (name, g) in &groups {
        let losses: Vec<f64> = g.iter().map(|r| r.summary.final_val_loss as f64).collect();
        let (mean, sd) = mean_sd(&losses);
        let gaps: Vec<f64> = g
            .iter()
            .filter_map(|r| {
                let b = refs
                    .iter()
                    .find(|b| b.seed == r.seed)?
                    .summary
                    .final_val_loss as f64;
                (b > 0.0).then(|| 100.0 * (r.summary.final_val_loss as f64 - b) / b)
            })
            .collect();
        let (gap, worse) = if *name == reference || gaps.is_empty() {
            ("-".to_string(), "-".to_string())
        } else {
            let (gm, gsd) = mean_sd(&gaps);
            let se = gsd.map_or(String::new(), |sd| {
                format!(" ± {:.2}", sd / (gaps.len() as f64).sqrt())
            });
            (
                format!("{gm:+.2}%{se}"),
                format!(
                    "{}/{}",
                    gaps.iter().filter(|&&x| x > 0.0).count(),
                    gaps.len()
                ),
            )
        };
        let per_seed = g
            .iter()
            .map(|r| format!("{}: {:.4}", r.seed, r.summary.final_val_loss))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            s,
            "| {name} | {} | {mean:.4}{} | {gap} | {worse} | {per_seed} |",
            g.len(),
            sd.map_or(String::new(), |sd| format!(" ± {sd:.4}")),
        );
    }
    let _ = writeln!(s);
}

/// A curve: `(x, y)` points.
type Curve = Vec<(f64, f64)>;

/// Averages each group's curves point by point (curves of one recipe share their x values;
/// a shorter curve, from a run that stopped early, truncates the mean).
fn mean_curves(groups: Vec<(String, Vec<Curve>)>) -> Vec<(String, Curve)> {
    groups
        .into_iter()
        .map(|(name, curves)| {
            let len = curves.iter().map(Vec::len).min().unwrap_or(0);
            let n = curves.len().max(1) as f64;
            let pts = (0..len)
                .map(|i| {
                    let y = curves.iter().map(|c| c[i].1).sum::<f64>() / n;
                    (curves[0][i].0, y)
                })
                .collect();
            (name, pts)
        })
        .collect()
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |error| TrainError::Io {
        path: path.to_path_buf(),
        error,
    }
}

const COLORS: [RGBColor; 8] = [
    RGBColor(0, 0, 0),
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
];

/// Draws one line per series (`(name, points)`) into an SVG file.
pub fn plot_lines(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> Result<(), TrainError> {
    let pts = series
        .iter()
        .flat_map(|(_, p)| p.iter())
        .filter(|(x, y)| x.is_finite() && y.is_finite());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    if x1 - x0 < 1e-12 {
        x1 = x0 + 1.0;
    }
    let pad = ((y1 - y0) * 0.05).max(1e-3);
    let perr = |e: String| TrainError::Io {
        path: path.to_path_buf(),
        error: std::io::Error::other(e),
    };
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| perr(e.to_string()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1, (y0 - pad)..(y1 + pad))
        .map_err(|e| perr(e.to_string()))?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .draw()
        .map_err(|e| perr(e.to_string()))?;
    for (i, (name, p)) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                p.iter()
                    .copied()
                    .filter(|(x, y)| x.is_finite() && y.is_finite()),
                c.stroke_width(2),
            ))
            .map_err(|e| perr(e.to_string()))?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| perr(e.to_string()))?;
    root.present().map_err(|e| perr(e.to_string()))?;
    Ok(())
}

fn fmt_sqnr(v: Option<f64>) -> String {
    v.map_or("exact".into(), |s| format!("{s:.1}"))
}

/// The recipe the gaps are measured against unless the caller names another.
pub const DEFAULT_REFERENCE: &str = "bf16";

/// The markdown report (without a reading, which a person writes on top); gaps are relative
/// to `reference` (a recipe among `runs`, paired by seed; "-" where it did not run).
pub fn markdown(runs: &[RunResult], header: &str, reference: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{header}");
    let seeded = by_recipe(runs).iter().any(|(_, g)| g.len() > 1);
    if seeded {
        seed_table(&mut s, runs, reference);
        let _ = writeln!(s, "Every run:\n");
    }
    let _ = writeln!(
        s,
        "| recipe | seed | final val loss | gap to {reference} | final train loss | tokens/s | wall time |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    for r in runs {
        let m = &r.summary;
        let base = runs
            .iter()
            .find(|b| b.summary.recipe == reference && b.seed == r.seed)
            .map(|b| b.summary.final_val_loss);
        let gap = match base {
            Some(b) if b > 0.0 => format!("{:+.2}%", 100.0 * (m.final_val_loss - b) / b),
            _ => "-".into(),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {:.4} | {} | {:.4} | {:.0} | {:.0} s |",
            m.recipe, r.seed, m.final_val_loss, gap, m.final_train_loss, m.tokens_per_s, m.wall_s
        );
    }
    if let Some(r) = runs.first() {
        let _ = writeln!(
            s,
            "\nUnigram entropy of the training split: {:.4} nats/token. {} steps, {} tokens, {} parameters.",
            r.summary.unigram_nats, r.summary.steps, r.summary.tokens, r.summary.params
        );
    }
    let _ = writeln!(
        s,
        "\n## Per-layer quantization error (Fprop operands, last evaluation before any switch to BF16)\n\n\
         SQNR in dB (higher is better), bias = mean signed error / mean magnitude, clipped and \
         flushed-to-zero fractions; X is the layer input on the first validation batch, W the weight. \
         Layers the recipe keeps in BF16/FP32 at that point are left out.{}\n",
        if seeded {
            " One run per recipe: its first seed."
        } else {
            ""
        }
    );
    for (_, g) in by_recipe(runs) {
        let r = g[0];
        let layers: Vec<&LayerError> = r
            .summary
            .layers
            .iter()
            .filter(|l| l.is_quantized())
            .collect();
        if layers.is_empty() {
            continue;
        }
        let _ = writeln!(
            s,
            "### {} (step {})\n",
            r.summary.recipe, r.summary.layers_step
        );
        let _ = writeln!(
            s,
            "| layer | X SQNR | X bias | X clipped | X flushed | W SQNR | W bias | W clipped | W flushed |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|");
        for l in layers {
            let _ = writeln!(
                s,
                "| {} | {} | {:+.2e} | {:.2e} | {:.2e} | {} | {:+.2e} | {:.2e} | {:.2e} |",
                l.layer,
                fmt_sqnr(l.x.sqnr_db),
                l.x.bias,
                l.x.clipped,
                l.x.flushed,
                fmt_sqnr(l.w.sqnr_db),
                l.w.bias,
                l.w.clipped,
                l.w.flushed
            );
        }
        let _ = writeln!(s);
    }
    s
}

/// Writes `report.md`, `loss.svg` and `train-loss.svg` into `dir`.
pub fn write_report(
    dir: &Path,
    runs: &[RunResult],
    header: &str,
    reference: &str,
) -> Result<(), TrainError> {
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let groups = by_recipe(runs);
    let seeds = groups.iter().map(|(_, g)| g.len()).max().unwrap_or(1);
    let title = |what: &str| {
        if seeds > 1 {
            format!("{what}, mean of {seeds} seeds")
        } else {
            what.to_string()
        }
    };
    let val = mean_curves(
        groups
            .iter()
            .map(|(name, g)| {
                let curves = g
                    .iter()
                    .map(|r| {
                        r.metrics
                            .iter()
                            .filter_map(|m| m.val_loss.map(|v| (m.tokens as f64 / 1e6, v as f64)))
                            .collect()
                    })
                    .collect();
                (name.to_string(), curves)
            })
            .collect(),
    );
    plot_lines(
        &dir.join("loss.svg"),
        &title("validation loss"),
        "training tokens (millions)",
        "loss (nats/token)",
        &val,
    )?;
    let ema_curve = |r: &RunResult| -> Vec<(f64, f64)> {
        let mut ema = None::<f64>;
        r.metrics
            .iter()
            .map(|m| {
                let e = match ema {
                    None => m.train_loss as f64,
                    Some(e) => 0.9 * e + 0.1 * m.train_loss as f64,
                };
                ema = Some(e);
                (m.tokens as f64 / 1e6, e)
            })
            .skip(r.metrics.len() / 20)
            .collect()
    };
    let train = mean_curves(
        groups
            .iter()
            .map(|(name, g)| (name.to_string(), g.iter().map(|r| ema_curve(r)).collect()))
            .collect(),
    );
    plot_lines(
        &dir.join("train-loss.svg"),
        &title("training loss (EMA 0.9)"),
        "training tokens (millions)",
        "loss (nats/token)",
        &train,
    )?;
    let p = dir.join("report.md");
    // atomic: an interrupted comparison never leaves a truncated report
    crate::rundir::write_atomic(&p, markdown(runs, header, reference).as_bytes())
        .map_err(io_err(&p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn layers_are_quantized_by_their_policy_and_old_records_by_its_description() {
        let layer = |policy: &str, quantized: Option<bool>| {
            let mut v = serde_json::json!({
                "layer": "blocks.0.mlp.up", "kind": "mlp-up", "policy": policy,
                "x": {"sqnr_db": null, "bias": 0.0, "clipped": 0.0, "flushed": 0.0},
                "w": {"sqnr_db": null, "bias": 0.0, "clipped": 0.0, "flushed": 0.0},
            });
            if let Some(q) = quantized {
                v["quantized"] = q.into();
            }
            serde_json::from_value::<LayerError>(v).unwrap()
        };
        // The flag decides, whatever the description says.
        assert!(layer("all bf16", Some(true)).is_quantized());
        assert!(!layer("fprop[X bf16, W f32] ...", Some(false)).is_quantized());
        // Records written before the flag: by the description.
        assert!(!layer("all bf16", None).is_quantized());
        assert!(!layer("all f32", None).is_quantized());
        assert!(layer("all nvfp4/1x16", None).is_quantized());
    }

    fn run(recipe: &str, seed: u64, val: f32) -> RunResult {
        let metrics = (1..=4)
            .map(|step| StepMetrics {
                step,
                tokens: step * 1000,
                train_loss: val + 1.0 / step as f32,
                val_loss: (step % 2 == 0).then_some(val + 0.5 / step as f32),
                lr: 1e-3,
                grad_norm: 1.0,
                tokens_per_s: 1e4,
                progress: step as f64 / 4.0,
                layers: Vec::new(),
            })
            .collect();
        RunResult {
            seed,
            summary: RunSummary {
                recipe: recipe.into(),
                steps: 4,
                tokens: 4000,
                params: 10,
                final_val_loss: val,
                final_train_loss: val,
                unigram_nats: 3.0,
                wall_s: 1.0,
                tokens_per_s: 1e4,
                layers: Vec::new(),
                layers_step: 4,
                out_dir: PathBuf::new(),
                checkpoint: PathBuf::new(),
            },
            metrics,
        }
    }

    #[test]
    fn one_seed_gives_the_plain_table() {
        let md = markdown(&[run("bf16", 0, 1.0), run("nvfp4", 0, 1.02)], "# t", "bf16");
        assert!(!md.contains("over seeds"));
        assert!(md.contains("| nvfp4 | 0 | 1.0200 | +2.00% |"), "{md}");
    }

    #[test]
    fn several_seeds_give_paired_gaps_and_spread() {
        // nvfp4 is 2% and 4% worse than bf16 of the same seed, although its seed-1 loss
        // is below bf16's seed-0 loss: the gap must be paired by seed.
        let runs = [
            run("bf16", 0, 1.0),
            run("nvfp4", 0, 1.02),
            run("bf16", 1, 0.5),
            run("nvfp4", 1, 0.52),
        ];
        let md = markdown(&runs, "# t", DEFAULT_REFERENCE);
        // mean of 1.02 and 0.52 = 0.77; sd = 0.5 / sqrt(2) = 0.3536
        assert!(
            md.contains("| nvfp4 | 2 | 0.7700 ± 0.3536 | +3.00% ± 1.00 | 2/2 |"),
            "{md}"
        );
        assert!(
            md.contains("| bf16 | 2 | 0.7500 ± 0.3536 | - | - |"),
            "{md}"
        );
        assert!(md.contains("| nvfp4 | 1 | 0.5200 | +4.00% |"), "{md}");
        assert!(md.contains("One run per recipe: its first seed."));
    }

    #[test]
    fn gaps_can_be_taken_against_another_recipe() {
        // An ablation against its parent recipe: -2% and -1% of nvfp4 of the same seed.
        let runs = [
            run("nvfp4", 0, 1.0),
            run("nvfp4-no-rht", 0, 0.98),
            run("nvfp4", 1, 2.0),
            run("nvfp4-no-rht", 1, 1.98),
        ];
        let md = markdown(&runs, "# t", "nvfp4");
        assert!(md.contains("| gap to nvfp4 | worse than nvfp4 |"), "{md}");
        assert!(
            md.contains("| nvfp4-no-rht | 2 | 1.4800 ± 0.7071 | -1.50% ± 0.50 | 0/2 |"),
            "{md}"
        );
        assert!(
            md.contains("| nvfp4 | 2 | 1.5000 ± 0.7071 | - | - |"),
            "{md}"
        );
        // Without the reference among the runs there is no gap.
        let md = markdown(&runs, "# t", "bf16");
        assert!(
            md.contains("| nvfp4-no-rht | 2 | 1.4800 ± 0.7071 | - | - |"),
            "{md}"
        );
    }

    #[test]
    fn curves_are_averaged_over_seeds() {
        let m = mean_curves(vec![(
            "a".into(),
            vec![
                vec![(0.0, 1.0), (1.0, 3.0), (2.0, 9.0)],
                vec![(0.0, 3.0), (1.0, 5.0)],
            ],
        )]);
        assert_eq!(m, vec![("a".to_string(), vec![(0.0, 2.0), (1.0, 4.0)])]);
        let dir = tempfile::tempdir().unwrap();
        let runs = [run("bf16", 0, 1.0), run("bf16", 1, 2.0)];
        write_report(dir.path(), &runs, "# t", "bf16").unwrap();
        let svg = std::fs::read_to_string(dir.path().join("loss.svg")).unwrap();
        assert!(svg.contains("mean of 2 seeds"));
    }
}

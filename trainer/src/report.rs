//! Comparison reports: `report.md` (final validation loss, gap to BF16, throughput, wall
//! time, per-layer quantization error) and SVG loss curves (`loss.svg`: validation loss,
//! `train-loss.svg`: training loss smoothed with an EMA), from the runs' summaries and
//! metrics.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use plotters::prelude::*;

use crate::train::{LayerError, RunSummary, StepMetrics, TrainError};

/// One finished run of a comparison.
#[derive(Clone, Debug)]
pub struct RunResult {
    /// Its summary.
    pub summary: RunSummary,
    /// Its metrics.
    pub metrics: Vec<StepMetrics>,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
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
        source: std::io::Error::other(e),
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

fn quantized(l: &LayerError) -> bool {
    !(l.policy.starts_with("all bf16")
        || l.policy.starts_with("all f32")
        || l.policy.starts_with("all fp32"))
}

/// The markdown report (without a reading, which a person writes on top).
pub fn markdown(runs: &[RunResult], header: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{header}");
    let bf16 = runs
        .iter()
        .find(|r| r.summary.recipe == "bf16")
        .map(|r| r.summary.final_val_loss);
    let _ = writeln!(
        s,
        "| recipe | final val loss | gap to bf16 | final train loss | tokens/s | wall time |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    for r in runs {
        let m = &r.summary;
        let gap = match bf16 {
            Some(b) if b > 0.0 => format!("{:+.2}%", 100.0 * (m.final_val_loss - b) / b),
            _ => "-".into(),
        };
        let _ = writeln!(
            s,
            "| {} | {:.4} | {} | {:.4} | {:.0} | {:.0} s |",
            m.recipe, m.final_val_loss, gap, m.final_train_loss, m.tokens_per_s, m.wall_s
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
         Layers the recipe keeps in BF16/FP32 at that point are left out.\n"
    );
    for r in runs {
        let layers: Vec<&LayerError> = r.summary.layers.iter().filter(|l| quantized(l)).collect();
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
pub fn write_report(dir: &Path, runs: &[RunResult], header: &str) -> Result<(), TrainError> {
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let val: Vec<(String, Vec<(f64, f64)>)> = runs
        .iter()
        .map(|r| {
            (
                r.summary.recipe.clone(),
                r.metrics
                    .iter()
                    .filter_map(|m| m.val_loss.map(|v| (m.tokens as f64 / 1e6, v as f64)))
                    .collect(),
            )
        })
        .collect();
    plot_lines(
        &dir.join("loss.svg"),
        "validation loss",
        "training tokens (millions)",
        "loss (nats/token)",
        &val,
    )?;
    let train: Vec<(String, Vec<(f64, f64)>)> = runs
        .iter()
        .map(|r| {
            let mut ema = None::<f64>;
            let pts = r
                .metrics
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
                .collect();
            (r.summary.recipe.clone(), pts)
        })
        .collect();
    plot_lines(
        &dir.join("train-loss.svg"),
        "training loss (EMA 0.9)",
        "training tokens (millions)",
        "loss (nats/token)",
        &train,
    )?;
    let p = dir.join("report.md");
    fs::write(&p, markdown(runs, header)).map_err(io_err(&p))
}

//! The record every measurement becomes: one named number with its unit, the direction that
//! counts as better, and whether it is a gate (a same-run ratio or an instruction count) or
//! only reported (an absolute time or throughput).
//!
//! `cargo xtask bench` reads these records from the JSON this binary writes, merges them
//! into `target/bench/report.json` and compares the gated ones with `bench/baseline.json`.

use serde::Serialize;

/// Which way is an improvement.
#[derive(Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Better {
    /// Larger values are better (speed ratios, throughput).
    Higher,
    /// Smaller values are better (time ratios, instruction counts).
    Lower,
}

/// What a metric is, which decides whether and how tightly it gates.
#[derive(Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A ratio of two timings taken in the same rounds (gated, tolerant of machine noise).
    /// (`cargo xtask bench` adds a third kind, callgrind instruction counts.)
    Ratio,
    /// An absolute figure (reported, never gated: it moves with the machine's load).
    Absolute,
}

/// One measured figure.
#[derive(Clone, Debug, Serialize)]
pub struct Metric {
    /// `group/case/what`, e.g. `quant/nvfp4_row_1x16/vs_memcpy`.
    pub name: String,
    /// The figure.
    pub value: f64,
    /// Unit, e.g. `x`, `ms`, `GB/s`, `Ir/elem`.
    pub unit: String,
    /// Direction of improvement.
    pub better: Better,
    /// Gate or report.
    pub kind: Kind,
    /// Relative spread across rounds (interquartile range over median), when measured in rounds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spread: Option<f64>,
    /// What exactly was measured.
    pub note: String,
}

impl Metric {
    /// A gated same-run ratio.
    pub fn ratio(name: String, value: f64, spread: f64, better: Better, note: String) -> Metric {
        Metric {
            name,
            value,
            unit: "x".into(),
            better,
            kind: Kind::Ratio,
            spread: Some(spread),
            note,
        }
    }

    /// A reported absolute figure.
    pub fn absolute(name: String, value: f64, unit: &str, better: Better, note: String) -> Metric {
        Metric {
            name,
            value,
            unit: unit.into(),
            better,
            kind: Kind::Absolute,
            spread: None,
            note,
        }
    }
}

/// The JSON document a suite writes: its name and its metrics.
#[derive(Debug, Serialize)]
pub struct SuiteReport {
    /// Suite name (`kernels`, `steps`).
    pub suite: String,
    /// Rounds each paired measurement ran.
    pub rounds: usize,
    /// The figures.
    pub metrics: Vec<Metric>,
}

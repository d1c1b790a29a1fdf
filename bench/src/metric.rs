//! The record every measurement becomes: one named number with its unit, the direction that
//! counts as better, and whether it is a gate (a same-run ratio whose two sides are bound by
//! the same resource, or an instruction count) or only reported (an absolute time or
//! throughput, or a ratio to a reference bound by another resource, such as a compute-bound
//! kernel over a memcpy).
//!
//! `cargo xtask bench` reads these records from the JSON this binary writes, merges them
//! into `target/bench/report.json` and compares the gated ones with `bench/baseline.json`.

use serde::{Deserialize, Serialize};

/// Which way is an improvement.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Better {
    /// Larger values are better (speed ratios, throughput).
    Higher,
    /// Smaller values are better (time ratios, instruction counts).
    Lower,
}

/// What a metric is, which decides whether and how tightly it gates.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A ratio of two timings taken in the same rounds whose two sides are bound by the same
    /// resource (its [`Basis`]): gated, tolerant of machine noise.
    /// (`cargo xtask bench` adds a third kind, callgrind instruction counts.)
    Ratio,
    /// Reported, never gated: an absolute figure (it moves with the machine's load), or a
    /// ratio whose two sides are bound by different resources (it moves with the machine's
    /// balance of memory bandwidth to compute).
    Reported,
}

/// The resource both sides of a gated ratio are bound by. A machine that is faster in that
/// resource speeds both sides up alike, so the ratio carries over; `cargo xtask bench` uses
/// the basis to decide whether a baseline recorded on another machine still applies.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Basis {
    /// Both sides are bound by the core (in-cache data, GEMMs, training steps).
    Compute,
    /// Both sides stream from memory (tensors far larger than the caches).
    Memory,
    /// The same work on one thread over two threads (a 2-thread speed-up): it carries over
    /// only to a host that gives the second thread a whole core, which `cargo xtask bench`
    /// checks against the register-only probe timed in the same rounds
    /// ([`crate::peak::scaling_probe_metric`]).
    Cores,
}

/// One measured figure.
#[derive(Clone, Debug, Serialize, Deserialize)]
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
    /// For gated ratios: the resource both sides are bound by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basis: Option<Basis>,
    /// Relative spread across rounds (interquartile range over median), when measured in rounds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread: Option<f64>,
    /// What exactly was measured.
    pub note: String,
}

impl Metric {
    /// A gated same-run ratio whose two sides are bound by `basis`.
    pub fn ratio(
        name: String,
        (value, spread): (f64, f64),
        basis: Basis,
        better: Better,
        note: String,
    ) -> Metric {
        Metric {
            name,
            value,
            unit: "x".into(),
            better,
            kind: Kind::Ratio,
            basis: Some(basis),
            spread: Some(spread),
            note,
        }
    }

    /// A reported same-run ratio whose two sides are bound by different resources.
    pub fn reported_ratio(
        name: String,
        (value, spread): (f64, f64),
        better: Better,
        note: String,
    ) -> Metric {
        Metric {
            kind: Kind::Reported,
            basis: None,
            ..Metric::ratio(name, (value, spread), Basis::Compute, better, note)
        }
    }

    /// A reported absolute figure.
    pub fn absolute(name: String, value: f64, unit: &str, better: Better, note: String) -> Metric {
        Metric {
            name,
            value,
            unit: unit.into(),
            better,
            kind: Kind::Reported,
            basis: None,
            spread: None,
            note,
        }
    }
}

/// The JSON document a suite writes: its name and its metrics.
#[derive(Debug, Serialize, Deserialize)]
pub struct SuiteReport {
    /// Suite name (`kernels`, `steps`).
    pub suite: String,
    /// Rounds each paired measurement ran.
    pub rounds: usize,
    /// The figures.
    pub metrics: Vec<Metric>,
}

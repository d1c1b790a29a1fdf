//! The metric record shared by every source (`bench kernels`, `bench steps`, callgrind,
//! criterion, the GPU bench) and the baseline that gates the gated ones.

use serde::{Deserialize, Serialize};

/// Which way is an improvement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Better {
    /// Larger is better.
    Higher,
    /// Smaller is better.
    Lower,
}

/// What a metric is; decides whether and how tightly it gates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A ratio of timings from the same rounds: gated with the ratio tolerance.
    Ratio,
    /// Instructions per element counted by callgrind: gated with the (tight) instruction tolerance.
    Instructions,
    /// An absolute figure: reported only.
    Absolute,
}

impl Kind {
    /// Whether metrics of this kind are compared with the baseline.
    pub fn gated(self) -> bool {
        !matches!(self, Kind::Absolute)
    }
}

/// One figure, as the `bench` binary writes it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Metric {
    /// `source/case/what`.
    pub name: String,
    /// The figure.
    pub value: f64,
    /// Unit.
    pub unit: String,
    /// Direction of improvement.
    pub better: Better,
    /// Gate or report.
    pub kind: Kind,
    /// Relative spread over rounds (IQR / median), where measured in rounds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread: Option<f64>,
    /// What was measured.
    #[serde(default)]
    pub note: String,
}

/// A suite's JSON document.
#[derive(Debug, Deserialize)]
pub struct SuiteReport {
    /// Suite name.
    #[allow(dead_code)]
    pub suite: String,
    /// Its metrics.
    pub metrics: Vec<Metric>,
}

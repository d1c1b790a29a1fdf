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
    /// A ratio of timings from the same rounds whose two sides are bound by one resource (its
    /// [`Basis`]): gated against the baseline profile of the same machine model.
    Ratio,
    /// Instructions per element counted by callgrind: the same on every machine that runs the
    /// same binary, so gated everywhere with the (tight) instruction tolerance.
    Instructions,
    /// An absolute figure, or a ratio across resources (a kernel over a memcpy): reported only.
    #[serde(alias = "absolute")]
    Reported,
}

impl Kind {
    /// Whether metrics of this kind are compared with the baseline.
    pub fn gated(self) -> bool {
        !matches!(self, Kind::Reported)
    }
}

/// The resource both sides of a gated timing ratio are bound by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Basis {
    /// Both sides bound by the core: the ratio carries over to a machine of the same model
    /// whatever its clock or memory bandwidth.
    Compute,
    /// Both sides stream from memory: the ratio carries over only while the machine's balance
    /// of memory bandwidth to compute is close to the baseline's.
    Memory,
    /// The same work on one thread over two threads (a 2-thread speed-up): the ratio carries
    /// over only while the host gives the second thread a whole core, which the run's
    /// register-only probe of the same rounds shows (see `baseline::FULL_SECOND_CORE`).
    Cores,
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
    /// For timing ratios: the resource both sides are bound by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basis: Option<Basis>,
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

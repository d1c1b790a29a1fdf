//! The committed baseline (`bench/baseline.json`) and the comparison that gates CI.
//!
//! A gated metric regresses when it is worse than its baseline value by more than its
//! tolerance, relative: for "higher is better", `value < base * (1 - tol)`; for "lower is
//! better", `value > base * (1 + tol)`. Improvements never fail (accept them with
//! `--update-baseline` so the gate tightens). A baseline metric the run did not measure fails,
//! unless its source was skipped for a stated reason (no valgrind).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::metric::{Better, Kind, Metric};

/// Default tolerances by kind.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Tolerances {
    /// Same-run timing ratios.
    pub ratio: f64,
    /// Callgrind instruction counts.
    pub instructions: f64,
}

/// One baseline entry.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Entry {
    /// Accepted value.
    pub value: f64,
    /// Direction of improvement.
    pub better: Better,
    /// Kind (selects the default tolerance).
    pub kind: Kind,
    /// A per-metric tolerance overriding the default (kept across `--update-baseline`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<f64>,
}

/// The baseline file.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Baseline {
    /// Why these tolerances, for the reader of the file.
    pub about: String,
    /// When and where it was recorded.
    pub recorded: String,
    /// Default tolerances.
    pub tolerance: Tolerances,
    /// Accepted values of the gated metrics.
    pub metrics: BTreeMap<String, Entry>,
}

impl Baseline {
    /// The tolerance that applies to `name`.
    pub fn tolerance_of(&self, e: &Entry) -> f64 {
        e.tolerance.unwrap_or(match e.kind {
            Kind::Instructions => self.tolerance.instructions,
            _ => self.tolerance.ratio,
        })
    }

    /// A baseline accepting `metrics`' gated values, keeping `old`'s tolerances and notes.
    pub fn accept(metrics: &[Metric], old: Option<&Baseline>, recorded: String) -> Baseline {
        let mut entries = BTreeMap::new();
        for m in metrics.iter().filter(|m| m.kind.gated()) {
            let tolerance = old
                .and_then(|b| b.metrics.get(&m.name))
                .and_then(|e| e.tolerance);
            entries.insert(
                m.name.clone(),
                Entry {
                    value: m.value,
                    better: m.better,
                    kind: m.kind,
                    tolerance,
                },
            );
        }
        // Metrics whose source was skipped this time keep their old entries.
        if let Some(old) = old {
            for (name, e) in &old.metrics {
                entries.entry(name.clone()).or_insert_with(|| e.clone());
            }
        }
        Baseline {
            about: old
                .map(|b| b.about.clone())
                .unwrap_or_else(|| DEFAULT_ABOUT.into()),
            recorded,
            tolerance: old.map(|b| b.tolerance).unwrap_or(DEFAULT_TOLERANCES),
            metrics: entries,
        }
    }
}

/// Tolerances for a fresh baseline (see `bench/README.md` for how they were chosen).
pub const DEFAULT_TOLERANCES: Tolerances = Tolerances {
    ratio: 0.30,
    instructions: 0.03,
};

const DEFAULT_ABOUT: &str = "Accepted values of the gated metrics of `cargo xtask bench`. \
    Regenerate with `cargo xtask bench --update-baseline` after a deliberate change.";

/// The verdict on one gated metric.
#[derive(Clone, Debug, PartialEq)]
pub enum Status {
    /// Within tolerance (`change` = value / base - 1).
    Ok { change: f64 },
    /// Better than the baseline by more than the tolerance.
    Improved { change: f64 },
    /// Worse than the baseline by more than the tolerance.
    Regressed { change: f64 },
    /// In the run but not in the baseline.
    New,
    /// In the baseline, not measured, and not excused.
    Missing,
    /// In the baseline, not measured, because its source was skipped.
    Skipped(String),
}

impl Status {
    /// Whether this verdict fails the gate.
    pub fn fails(&self) -> bool {
        matches!(self, Status::Regressed { .. } | Status::Missing)
    }
}

/// One row of the comparison.
#[derive(Clone, Debug)]
pub struct Verdict {
    /// Metric name.
    pub name: String,
    /// Measured value (None when missing or skipped).
    pub value: Option<f64>,
    /// Baseline value (None when new).
    pub base: Option<f64>,
    /// Tolerance applied.
    pub tolerance: Option<f64>,
    /// Verdict.
    pub status: Status,
}

/// Compares the run's gated metrics with the baseline. `skipped` maps a metric-name prefix to
/// the reason its source did not run.
pub fn compare(metrics: &[Metric], base: &Baseline, skipped: &[(String, String)]) -> Vec<Verdict> {
    let mut out = Vec::new();
    for m in metrics.iter().filter(|m| m.kind.gated()) {
        let Some(e) = base.metrics.get(&m.name) else {
            out.push(Verdict {
                name: m.name.clone(),
                value: Some(m.value),
                base: None,
                tolerance: None,
                status: Status::New,
            });
            continue;
        };
        let tol = base.tolerance_of(e);
        let change = m.value / e.value - 1.0;
        let worse = match e.better {
            Better::Higher => m.value < e.value * (1.0 - tol),
            Better::Lower => m.value > e.value * (1.0 + tol),
        };
        let better = match e.better {
            Better::Higher => m.value > e.value * (1.0 + tol),
            Better::Lower => m.value < e.value * (1.0 - tol),
        };
        let status = if !m.value.is_finite() || worse {
            Status::Regressed { change }
        } else if better {
            Status::Improved { change }
        } else {
            Status::Ok { change }
        };
        out.push(Verdict {
            name: m.name.clone(),
            value: Some(m.value),
            base: Some(e.value),
            tolerance: Some(tol),
            status,
        });
    }
    for (name, e) in &base.metrics {
        if metrics.iter().any(|m| &m.name == name) {
            continue;
        }
        let status = match skipped
            .iter()
            .find(|(prefix, _)| name.starts_with(prefix.as_str()))
        {
            Some((_, why)) => Status::Skipped(why.clone()),
            None => Status::Missing,
        };
        out.push(Verdict {
            name: name.clone(),
            value: None,
            base: Some(e.value),
            tolerance: Some(base.tolerance_of(e)),
            status,
        });
    }
    out
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A metric with a unit and no spread or note (shared with `confirm`'s tests).
    pub(in super::super) fn metric(name: &str, value: f64, better: Better, kind: Kind) -> Metric {
        Metric {
            name: name.into(),
            value,
            unit: "x".into(),
            better,
            kind,
            spread: None,
            note: String::new(),
        }
    }

    fn baseline() -> Baseline {
        let ms = [
            metric("q/speed", 1.0, Better::Higher, Kind::Ratio),
            metric("q/time", 2.0, Better::Lower, Kind::Ratio),
            metric("callgrind/k", 10.0, Better::Lower, Kind::Instructions),
        ];
        Baseline::accept(&ms, None, "test".into())
    }

    fn status(name: &str, value: f64, better: Better, kind: Kind) -> Status {
        let b = baseline();
        let v = compare(&[metric(name, value, better, kind)], &b, &[]);
        v.into_iter().find(|v| v.name == name).unwrap().status
    }

    #[test]
    fn higher_is_better_fails_only_below_tolerance() {
        // tolerance 0.30: 0.71 passes, 0.69 fails, 1.4 is an improvement
        assert!(matches!(
            status("q/speed", 0.71, Better::Higher, Kind::Ratio),
            Status::Ok { .. }
        ));
        assert!(status("q/speed", 0.69, Better::Higher, Kind::Ratio).fails());
        assert!(matches!(
            status("q/speed", 1.4, Better::Higher, Kind::Ratio),
            Status::Improved { .. }
        ));
    }

    #[test]
    fn lower_is_better_fails_only_above_tolerance() {
        assert!(!status("q/time", 2.59, Better::Lower, Kind::Ratio).fails());
        assert!(status("q/time", 2.61, Better::Lower, Kind::Ratio).fails());
        assert!(!status("q/time", 1.0, Better::Lower, Kind::Ratio).fails());
        assert!(status("q/time", f64::NAN, Better::Lower, Kind::Ratio).fails());
    }

    #[test]
    fn instruction_counts_gate_tightly() {
        assert!(!status("callgrind/k", 10.29, Better::Lower, Kind::Instructions).fails());
        assert!(status("callgrind/k", 10.31, Better::Lower, Kind::Instructions).fails());
    }

    #[test]
    fn missing_fails_unless_skipped_and_new_does_not_gate() {
        let b = baseline();
        let run = [metric("q/speed", 1.0, Better::Higher, Kind::Ratio)];
        let v = compare(&run, &b, &[]);
        assert!(v
            .iter()
            .any(|v| v.name == "q/time" && v.status == Status::Missing));
        let v = compare(&run, &b, &[("callgrind/".into(), "no valgrind".into())]);
        let cg = v.iter().find(|v| v.name == "callgrind/k").unwrap();
        assert_eq!(cg.status, Status::Skipped("no valgrind".into()));
        let v = compare(&[metric("x/new", 5.0, Better::Lower, Kind::Ratio)], &b, &[]);
        assert_eq!(v[0].status, Status::New);
        assert!(!v[0].status.fails());
    }

    #[test]
    fn absolute_metrics_never_gate_and_update_keeps_tolerances() {
        let mut b = baseline();
        b.metrics.get_mut("q/time").unwrap().tolerance = Some(0.5);
        let run = [
            metric("q/speed", 2.0, Better::Higher, Kind::Ratio),
            metric("q/ms", 1e9, Better::Lower, Kind::Absolute),
        ];
        let nb = Baseline::accept(&run, Some(&b), "now".into());
        assert_eq!(nb.metrics["q/speed"].value, 2.0);
        assert_eq!(nb.metrics["q/time"].tolerance, Some(0.5));
        assert!(!nb.metrics.contains_key("q/ms"));
        let v = compare(&run, &nb, &[]);
        assert!(v.iter().all(|v| v.name != "q/ms"));
        assert!(matches!(
            v.iter().find(|v| v.name == "q/speed").unwrap().status,
            Status::Ok { .. }
        ));
    }
}

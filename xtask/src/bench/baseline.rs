//! The committed baseline (`bench/baseline.json`) and the comparison that gates CI.
//!
//! Machines of one kind are not one machine: two hosts can differ twofold in memory bandwidth
//! and by a third in core speed, or be different processor models altogether. So the
//! baseline keeps two things apart:
//!
//! - **Portable** metrics, callgrind instruction counts: the same on every machine that runs
//!   the same binary. They gate everywhere, tightly.
//! - **Machine profiles** of timing ratios, one per processor model (`cpu` string and logical
//!   CPU count), each with the machine's calibration (a memcpy's GB/s and the compute probe's
//!   rate). A run is compared with the profile of its own processor model only:
//!   - a ratio of [`Basis::Compute`] (both sides bound by the core) gates whatever the host's
//!     clock or memory bandwidth: a faster host speeds both sides up alike;
//!   - a ratio of [`Basis::Memory`] (both sides streaming from memory) gates only while the
//!     host's balance (memcpy GB/s over probe rate) is within `balance` of the profile's;
//!     otherwise it is reported as not comparable;
//!   - a ratio of [`Basis::Cores`] (a 2-thread speed-up) gates only when the register-only
//!     probe timed in the same rounds (`<group>/fma_probe/speedup_2t`) shows that the host
//!     gave the second thread a whole core ([`FULL_SECOND_CORE`]): on a VM whose two logical
//!     CPUs share a core, every speed-up falls whatever the code does;
//!   - on a processor model with no profile, timing ratios are reported, not gated, and the
//!     report says so; instruction counts still gate.
//!
//! A gated metric regresses when it is slower than its baseline by more than its tolerance:
//! with `slowdown` = base / value for "higher is better" and value / base for "lower is
//! better", it fails when `slowdown > 1 + tolerance`. A tolerance below 0.3 therefore fails a
//! 30% slowdown whichever way the metric is written. Tolerances of timing ratios are derived
//! from measured run-to-run spread (`--update-baseline --runs N`, see [`derive_tolerances`]).
//! Improvements never fail (accept them with `--update-baseline` so the gate tightens). A
//! baseline metric the run did not measure fails, unless its source was skipped for a stated
//! reason (no valgrind).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::metric::{Basis, Better, Kind, Metric};

/// Default tolerances by kind, and the balance window of memory-bound ratios.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Tolerances {
    /// Timing ratios without a derived tolerance (allowed slowdown, 0.25 = 25%).
    pub ratio: f64,
    /// Callgrind instruction counts.
    pub instructions: f64,
    /// How far the host's memcpy/compute balance may be from the profile's (relative, either
    /// way) for [`Basis::Memory`] ratios to be compared.
    pub balance: f64,
}

/// Tolerances for a fresh baseline (see `bench/README.md` for how they were chosen).
pub const DEFAULT_TOLERANCES: Tolerances = Tolerances {
    ratio: 0.25,
    instructions: 0.03,
    balance: 0.25,
};

/// Bounds of a derived timing tolerance: at least 15% (CI shares its host with other tenants:
/// in-cache kernel ratios were seen to move by up to 15% under a load average of 16, with
/// no change in the code), at most 25% (so that a 30% slowdown always fails).
pub const DERIVED_TOLERANCE_RANGE: (f64, f64) = (0.15, 0.25);

/// The least 2-thread over 1-thread speed-up of the register-only probe at which a host counts
/// as giving the second thread a whole core (two whole cores give 1.95-2.06x; a core shared
/// with another tenant or a hyperthread sibling gives far less).
pub const FULL_SECOND_CORE: f64 = 1.8;

/// The run's measurement of the host's second core for a speed-up metric: the probe metric
/// of the speed-up's group (its first name segment), timed in the same rounds.
pub fn second_core_probe(name: &str) -> String {
    let group = name.split('/').next().unwrap_or(name);
    format!("{group}/fma_probe/speedup_2t")
}

/// Whether `name` is a probe of the host's second core (`<group>/fma_probe/speedup_2t`).
pub fn is_second_core_probe(name: &str) -> bool {
    name == second_core_probe(name)
}

/// For a 2-thread speed-up in `metrics`, the probe of its rounds when that shows a host short
/// of a whole second core (a NaN probe counts as short); `None` for other metrics, for a
/// full second core, or without a probe.
fn shared_second_core(m: &Metric, metrics: &[Metric]) -> Option<f64> {
    if m.basis != Some(Basis::Cores) {
        return None;
    }
    let name = second_core_probe(&m.name);
    metrics
        .iter()
        .find(|p| p.name == name)
        .map(|p| p.value)
        .filter(|p| p.is_nan() || *p < FULL_SECOND_CORE)
}

/// Multiple of the largest run-to-run deviation a derived tolerance allows.
pub const DERIVED_TOLERANCE_FACTOR: f64 = 3.0;

/// One baseline entry.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Entry {
    /// Accepted value.
    pub value: f64,
    /// Direction of improvement.
    pub better: Better,
    /// Kind (selects the default tolerance).
    pub kind: Kind,
    /// For timing ratios: the resource both sides are bound by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basis: Option<Basis>,
    /// A per-metric tolerance overriding the default (kept across `--update-baseline`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<f64>,
    /// How `tolerance` was obtained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerance_from: Option<String>,
    /// Why this timing ratio is reported but not gated on this machine: it moved between runs
    /// by more than a tolerance may allow while still failing a 30% slowdown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_gated: Option<String>,
}

/// Which machine a profile belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint {
    /// The processor's model name (`/proc/cpuinfo`).
    pub cpu: String,
    /// Logical CPUs available to the run.
    pub logical_cpus: usize,
    /// The widest instruction-set class of the CPU (`amx`, `avx512_bf16`, `avx512`, `avx2`,
    /// `baseline`, or `portable` when the portable code is forced): hosts that report one
    /// model name can differ in it (2-core "AMD EPYC" VMs of two generations, with and
    /// without AVX-512), and with it in their core, hence their timing ratios; with AMX it
    /// also decides which GEMM runs.
    pub isa: String,
}

impl std::fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}, {} CPUs, {}", self.cpu, self.logical_cpus, self.isa)
    }
}

/// A machine's calibration, measured in every run next to the kernels.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// One-thread memcpy of a tensor far larger than the caches, GB/s.
    pub memcpy_gbs: f64,
    /// The frozen compute probe on an in-cache tensor, Gelem/s (None in profiles recorded
    /// before the probe existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_gelem_s: Option<f64>,
}

impl Calibration {
    /// Memory bandwidth per unit of compute, when both are known.
    pub fn balance(&self) -> Option<f64> {
        self.compute_gelem_s.map(|c| self.memcpy_gbs / c)
    }
}

/// This run's machine: fingerprint and calibration.
#[derive(Clone, Debug, PartialEq)]
pub struct Machine {
    /// Processor model and logical CPUs.
    pub fingerprint: Fingerprint,
    /// Calibration measured in this run (None when the kernel suite did not produce it).
    pub calibration: Option<Calibration>,
}

/// The timing baseline of one processor model.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Profile {
    /// The machine it belongs to.
    pub fingerprint: Fingerprint,
    /// When and from what run it was recorded.
    pub recorded: String,
    /// The machine's calibration when it was recorded (absent when the run that recorded
    /// it measured none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<Calibration>,
    /// Accepted values of the timing ratios.
    pub metrics: BTreeMap<String, Entry>,
}

/// Metrics that are the same on every machine (instruction counts).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Portable {
    /// When and from what run they were recorded.
    pub recorded: String,
    /// Accepted values.
    pub metrics: BTreeMap<String, Entry>,
}

/// The baseline file.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Baseline {
    /// Why these tolerances, for the reader of the file.
    pub about: String,
    /// Default tolerances.
    pub tolerance: Tolerances,
    /// Instruction counts, gated on every machine.
    pub portable: Portable,
    /// Timing ratios, one profile per processor model.
    pub machines: Vec<Profile>,
}

/// What repeated runs say about one timing ratio.
#[derive(Clone, Debug, PartialEq)]
pub struct DerivedTolerance {
    /// The median over the runs (the accepted value).
    pub value: f64,
    /// The tolerance, or None when the ratio is too noisy to gate here.
    pub tolerance: Option<f64>,
    /// How it was obtained (or why it is not gated).
    pub how: String,
}

/// Derived tolerances by metric name.
pub type Derived = BTreeMap<String, DerivedTolerance>;

/// The median of `values` and their largest relative deviation from it (in log terms, so a
/// halving and a doubling weigh alike); None for fewer than two values or any value that is
/// not a positive finite number.
fn spread(values: &[f64]) -> Option<(f64, f64)> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| *x > 0.0).collect();
    if v.len() < 2 || v.len() != values.len() || v.iter().any(|x| !x.is_finite()) {
        return None;
    }
    let median = median_of(&mut v);
    let dev = v
        .iter()
        .map(|x| (x / median).ln().abs())
        .fold(0.0, f64::max)
        .exp_m1();
    Some((median, dev))
}

/// The median of a non-empty `v` (sorted in place).
fn median_of(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The tolerance for a ratio with median `median` and largest deviation `own` over `n` runs,
/// judged by `group` when given: the reference the ratio shares with others and the typical
/// (median) largest deviation among them, if that is larger than its own.
fn tolerance_for(
    median: f64,
    own: f64,
    n: usize,
    group: Option<(&str, usize, f64)>,
) -> DerivedTolerance {
    let (lo, hi) = DERIVED_TOLERANCE_RANGE;
    let (dev, basis) = match group {
        Some((reference, members, typical)) if typical > own => (
            typical,
            format!(
                "the {members} ratios against the same reference ({reference}) deviate from their medians by {:.1}% over {n} runs (the median of their largest deviations; this one's own {:.1}%, too few runs to stand for its noise alone)",
                100.0 * typical,
                100.0 * own
            ),
        ),
        _ => (
            own,
            format!("largest deviation from the median over {n} runs {:.1}%", 100.0 * own),
        ),
    };
    let wanted = DERIVED_TOLERANCE_FACTOR * dev;
    if wanted > hi {
        return DerivedTolerance {
            value: median,
            tolerance: None,
            how: format!(
                "too noisy to gate on this machine: {basis}, and {DERIVED_TOLERANCE_FACTOR} x that exceeds the {:.0}% cap that keeps a 30% slowdown failing",
                100.0 * hi
            ),
        };
    }
    DerivedTolerance {
        value: median,
        tolerance: Some(wanted.max(lo)),
        how: format!(
            "{DERIVED_TOLERANCE_FACTOR} x the deviation ({basis}), within [{:.0}%, {:.0}%]",
            100.0 * lo,
            100.0 * hi
        ),
    }
}

/// The reference a timing ratio is measured against, the last segment of its name
/// (`vs_compute_probe`, `vs_fp32`, `speedup_2t`).
fn reference_of(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

/// The accepted value and tolerance of every ratio of a recording (`samples`: each ratio's
/// values over the runs): the median, and a tolerance of [`DERIVED_TOLERANCE_FACTOR`] times
/// the largest relative deviation from it (in log terms, so a halving and a doubling weigh
/// alike), at least the floor of [`DERIVED_TOLERANCE_RANGE`]. A ratio whose tolerance would
/// exceed the range's cap is too noisy to gate: a tolerance wide enough for its noise would
/// let a 30% slowdown pass, so it is reported instead (its kernel's instruction count still
/// gates). Ratios with fewer than two runs, or any value that is not a positive finite
/// number, get none. One more rule: ratios against the same reference (the compute probe, the
/// FP32 step, ...) are measured under the same conditions in every run, so a ratio is taken
/// to be at least as noisy as the typical one of them (the median of their largest
/// deviations). A handful of runs can be quiet for one ratio by luck: on a shared 2-vCPU
/// host, two in-cache kernels whose five runs deviated by 6-8% (gated at 19-23%) were
/// measured 17-31% below their medians in a CI run a few hours later, while most ratios
/// against the same probe had deviated by 10-17% in the recording.
pub fn derive_tolerances(samples: &BTreeMap<String, Vec<f64>>) -> Derived {
    let spreads: BTreeMap<&str, (f64, f64, usize)> = samples
        .iter()
        .filter_map(|(name, v)| spread(v).map(|(m, d)| (name.as_str(), (m, d, v.len()))))
        .collect();
    let mut by_reference: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for (name, (_, dev, _)) in &spreads {
        by_reference
            .entry(reference_of(name))
            .or_default()
            .push(*dev);
    }
    let typical: BTreeMap<&str, (usize, f64)> = by_reference
        .into_iter()
        .map(|(r, mut devs)| (r, (devs.len(), median_of(&mut devs))))
        .collect();
    spreads
        .iter()
        .map(|(name, &(median, dev, n))| {
            let reference = reference_of(name);
            let group = typical
                .get(reference)
                .filter(|(members, _)| *members > 1)
                .map(|&(members, t)| (reference, members, t));
            (name.to_string(), tolerance_for(median, dev, n, group))
        })
        .collect()
}

fn entry(m: &Metric, old: Option<&Entry>, derived: Option<&DerivedTolerance>) -> Entry {
    let (value, tolerance, tolerance_from, not_gated) = match derived {
        Some(d) => match d.tolerance {
            Some(t) => (d.value, Some(t), Some(d.how.clone()), None),
            None => (d.value, None, None, Some(d.how.clone())),
        },
        None => (
            m.value,
            old.and_then(|e| e.tolerance),
            old.and_then(|e| e.tolerance_from.clone()),
            old.and_then(|e| e.not_gated.clone()),
        ),
    };
    Entry {
        value,
        better: m.better,
        kind: m.kind,
        basis: m.basis,
        tolerance,
        tolerance_from,
        not_gated,
    }
}

impl Baseline {
    /// The tolerance that applies to `e`.
    pub fn tolerance_of(&self, e: &Entry) -> f64 {
        e.tolerance.unwrap_or(match e.kind {
            Kind::Instructions => self.tolerance.instructions,
            _ => self.tolerance.ratio,
        })
    }

    /// The profile of `fingerprint`'s processor model, if recorded.
    pub fn profile(&self, fingerprint: &Fingerprint) -> Option<&Profile> {
        self.machines.iter().find(|p| &p.fingerprint == fingerprint)
    }

    /// A baseline accepting `metrics`' gated values: the instruction counts, and this
    /// machine's profile (other machines' profiles are kept). `derived` replaces a timing
    /// ratio's value and tolerance by those derived from repeated runs; otherwise tolerances
    /// are kept from `old`. Portable metrics whose source was skipped keep their old entries.
    pub fn accept(
        metrics: &[Metric],
        old: Option<&Baseline>,
        machine: &Machine,
        derived: &Derived,
        recorded: String,
    ) -> Baseline {
        let old_profile = old.and_then(|b| b.profile(&machine.fingerprint));
        let mut portable = BTreeMap::new();
        let mut timing = BTreeMap::new();
        for m in metrics.iter().filter(|m| m.kind.gated()) {
            if m.kind == Kind::Instructions {
                let o = old.and_then(|b| b.portable.metrics.get(&m.name));
                portable.insert(m.name.clone(), entry(m, o, None));
            } else {
                let o = old_profile.and_then(|p| p.metrics.get(&m.name));
                let mut e = entry(m, o, derived.get(&m.name));
                if let Some(probe) = shared_second_core(m, metrics) {
                    e.tolerance = None;
                    e.tolerance_from = None;
                    e.not_gated = Some(format!(
                        "recorded on a host that did not give the second thread a whole core (the register-only probe in the same rounds scaled {probe:.2}x): re-record on an idle host"
                    ));
                }
                timing.insert(m.name.clone(), e);
            }
        }
        if let Some(old) = old {
            for (name, e) in &old.portable.metrics {
                portable.entry(name.clone()).or_insert_with(|| e.clone());
            }
        }
        let calibration = machine
            .calibration
            .or(old_profile.and_then(|p| p.calibration));
        let mut machines: Vec<Profile> = old
            .map(|b| {
                b.machines
                    .iter()
                    .filter(|p| p.fingerprint != machine.fingerprint)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        machines.push(Profile {
            fingerprint: machine.fingerprint.clone(),
            recorded: recorded.clone(),
            calibration,
            metrics: timing,
        });
        Baseline {
            about: old
                .map(|b| b.about.clone())
                .unwrap_or_else(|| DEFAULT_ABOUT.into()),
            tolerance: old.map(|b| b.tolerance).unwrap_or(DEFAULT_TOLERANCES),
            portable: Portable {
                recorded,
                metrics: portable,
            },
            machines,
        }
    }
}

const DEFAULT_ABOUT: &str = "Accepted values of the gated metrics of `cargo xtask bench`: \
    instruction counts (portable, gated on every machine) and one profile of timing ratios per \
    processor model. Regenerate with `cargo xtask bench --update-baseline --runs 5` after a \
    deliberate change; see bench/README.md.";

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
    /// A timing ratio that cannot be compared on this machine (no profile for its processor
    /// model, or a memory-bound ratio on a host of another balance): reported, not gated.
    NotCompared(String),
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

/// How this run's machine relates to the baseline: what the report says before the table.
#[derive(Clone, Debug, PartialEq)]
pub struct MachineMatch {
    /// The recorded profile of this processor model, by its `recorded` text.
    pub profile: Option<String>,
    /// This host's memcpy bandwidth over the profile's.
    pub memcpy_vs_profile: Option<f64>,
    /// This host's compute probe rate over the profile's.
    pub compute_vs_profile: Option<f64>,
    /// Whether memory-bound ratios are compared (balance within the window).
    pub memory_ratios_compared: bool,
    /// One sentence for the report.
    pub summary: String,
}

/// Relates `machine` to the baseline's profiles.
pub fn match_machine(base: &Baseline, machine: &Machine) -> MachineMatch {
    let fp = &machine.fingerprint;
    let Some(p) = base.profile(fp) else {
        let known: Vec<String> = base
            .machines
            .iter()
            .map(|p| p.fingerprint.to_string())
            .collect();
        return MachineMatch {
            profile: None,
            memcpy_vs_profile: None,
            compute_vs_profile: None,
            memory_ratios_compared: false,
            summary: format!(
                "No timing profile for this machine ({fp}; profiles: {}): timing ratios are reported, not gated; instruction counts gate as everywhere. `cargo xtask bench --update-baseline --runs 5` adds this machine's profile.",
                if known.is_empty() { "none".into() } else { known.join(", ") }
            ),
        };
    };
    let here = machine.calibration;
    let there = p.calibration;
    let memcpy = here.zip(there).map(|(h, t)| h.memcpy_gbs / t.memcpy_gbs);
    let compute = here
        .and_then(|c| c.compute_gelem_s)
        .zip(there.and_then(|c| c.compute_gelem_s))
        .map(|(a, b)| a / b);
    let balance = here
        .and_then(|c| c.balance())
        .zip(there.and_then(|c| c.balance()))
        .map(|(a, b)| a / b);
    let window = 1.0 + base.tolerance.balance;
    let memory_ratios_compared = balance.is_some_and(|b| b <= window && b >= 1.0 / window);
    let fmt = |x: Option<f64>| x.map_or("unknown".into(), |x| format!("{x:.2}x"));
    let summary = format!(
        "Timing profile of this machine ({}) recorded {}. This host vs that recording: memcpy {}, compute probe {}, balance {}. Core-bound ratios are compared as they are (both sides scale with the core); memory-bound ratios {}.",
        fp,
        p.recorded,
        fmt(memcpy),
        fmt(compute),
        fmt(balance),
        if memory_ratios_compared {
            format!("are compared too (balance within {:.0}%)", 100.0 * base.tolerance.balance)
        } else {
            format!(
                "are reported, not gated (balance outside {:.0}% or unknown)",
                100.0 * base.tolerance.balance
            )
        }
    );
    MachineMatch {
        profile: Some(p.recorded.clone()),
        memcpy_vs_profile: memcpy,
        compute_vs_profile: compute,
        memory_ratios_compared,
        summary,
    }
}

fn judge(value: f64, e: &Entry, tol: f64) -> Status {
    let change = value / e.value - 1.0;
    let slowdown = match e.better {
        Better::Higher => e.value / value,
        Better::Lower => value / e.value,
    };
    if !value.is_finite() || !slowdown.is_finite() || slowdown > 1.0 + tol {
        Status::Regressed { change }
    } else if slowdown < 1.0 / (1.0 + tol) {
        Status::Improved { change }
    } else {
        Status::Ok { change }
    }
}

/// Compares the run's gated metrics with the baseline. `skipped` maps a metric-name prefix to
/// the reason its source did not run.
pub fn compare(
    metrics: &[Metric],
    base: &Baseline,
    machine: &Machine,
    skipped: &[(String, String)],
) -> (MachineMatch, Vec<Verdict>) {
    let matched = match_machine(base, machine);
    let profile = base.profile(&machine.fingerprint);
    let mut out = Vec::new();
    for m in metrics.iter().filter(|m| m.kind.gated()) {
        let entry = if m.kind == Kind::Instructions {
            base.portable.metrics.get(&m.name)
        } else {
            let Some(p) = profile else {
                out.push(Verdict {
                    name: m.name.clone(),
                    value: Some(m.value),
                    base: None,
                    tolerance: None,
                    status: Status::NotCompared("no timing profile for this processor".into()),
                });
                continue;
            };
            p.metrics.get(&m.name)
        };
        let Some(e) = entry else {
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
        let status = if let Some(why) = &e.not_gated {
            Status::NotCompared(why.clone())
        } else if e.basis == Some(Basis::Memory) && !matched.memory_ratios_compared {
            Status::NotCompared(
                "memory-bound ratio on a host whose memory/compute balance differs from the profile's".into(),
            )
        } else if let Some(probe) = shared_second_core(m, metrics) {
            Status::NotCompared(format!(
                "2-thread speed-up on a host that did not give the second thread a whole core: the register-only probe in the same rounds scaled {probe:.2}x (at least {FULL_SECOND_CORE}x counts as two whole cores)"
            ))
        } else {
            judge(m.value, e, tol)
        };
        out.push(Verdict {
            name: m.name.clone(),
            value: Some(m.value),
            base: Some(e.value),
            tolerance: Some(tol),
            status,
        });
    }
    let expected = base
        .portable
        .metrics
        .iter()
        .chain(profile.into_iter().flat_map(|p| p.metrics.iter()));
    for (name, e) in expected {
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
    (matched, out)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A metric with a unit and no spread or note (shared with `confirm`'s tests); timing
    /// ratios are core-bound.
    pub(in super::super) fn metric(name: &str, value: f64, better: Better, kind: Kind) -> Metric {
        Metric {
            name: name.into(),
            value,
            unit: "x".into(),
            better,
            kind,
            basis: (kind == Kind::Ratio).then_some(Basis::Compute),
            spread: None,
            note: String::new(),
        }
    }

    #[test]
    fn a_speed_up_gates_only_where_the_host_gave_the_second_thread_a_whole_core() {
        let speed_up = |v| Metric {
            basis: Some(Basis::Cores),
            ..metric("step/fp32/speedup_2t", v, Better::Higher, Kind::Ratio)
        };
        let probe = |group: &str, v| {
            let name = format!("{group}/fma_probe/speedup_2t");
            metric(&name, v, Better::Higher, Kind::Reported)
        };
        let base = accept(&[speed_up(1.74), probe("step", 2.01)]);
        assert_eq!(
            base.machines[0].metrics.len(),
            1,
            "the probe is reported only"
        );
        // the CI host of 2026-12-03: the step scaled 1.38x; had its probe scaled alike, the
        // host is the cause and the figure says nothing about the code
        let v = verdicts(&[speed_up(1.38), probe("step", 1.40)], &base);
        match &v[0].status {
            Status::NotCompared(why) => assert!(why.contains("scaled 1.40x"), "{why}"),
            s => panic!("expected not compared, got {s:?}"),
        }
        // on two whole cores the same figure is a regression of the code
        let v = verdicts(&[speed_up(1.38), probe("step", 1.98)], &base);
        assert!(v[0].status.fails(), "{:?}", v[0].status);
        // another group's probe does not vouch for this one; without a probe it gates
        let v = verdicts(&[speed_up(1.38), probe("quant", 1.20)], &base);
        assert!(v[0].status.fails(), "{:?}", v[0].status);
        let v = verdicts(&[speed_up(1.72), probe("step", f64::NAN)], &base);
        assert!(matches!(v[0].status, Status::NotCompared(_)));
        let v = verdicts(&[speed_up(1.72), probe("step", 1.99)], &base);
        assert!(matches!(v[0].status, Status::Ok { .. }));
        // a profile recorded on a shared core keeps the figure but does not gate it
        let base = accept(&[speed_up(1.20), probe("step", 1.25)]);
        let e = &base.machines[0].metrics["step/fp32/speedup_2t"];
        assert!(e.not_gated.as_deref().unwrap().contains("1.25x"), "{e:?}");
        let v = verdicts(&[speed_up(1.72), probe("step", 1.99)], &base);
        assert!(matches!(v[0].status, Status::NotCompared(_)));
    }

    /// A machine with the given processor name, memcpy GB/s and probe rate.
    pub(in super::super) fn machine(cpu: &str, memcpy_gbs: f64, compute: f64) -> Machine {
        Machine {
            fingerprint: Fingerprint {
                cpu: cpu.into(),
                logical_cpus: 2,
                isa: "avx2".into(),
            },
            calibration: Some(Calibration {
                memcpy_gbs,
                compute_gelem_s: Some(compute),
            }),
        }
    }

    /// A baseline accepting `ms` on the test machine `cpu`.
    pub(in super::super) fn accept(ms: &[Metric]) -> Baseline {
        Baseline::accept(
            ms,
            None,
            &machine("cpu", 10.0, 5.0),
            &Derived::new(),
            "test".into(),
        )
    }

    /// Verdicts of `run` against `b` on the test machine.
    pub(in super::super) fn verdicts(run: &[Metric], b: &Baseline) -> Vec<Verdict> {
        compare(run, b, &machine("cpu", 10.0, 5.0), &[]).1
    }

    fn baseline() -> Baseline {
        accept(&[
            metric("q/speed", 1.0, Better::Higher, Kind::Ratio),
            metric("q/time", 2.0, Better::Lower, Kind::Ratio),
            metric("callgrind/k", 10.0, Better::Lower, Kind::Instructions),
        ])
    }

    fn status(name: &str, value: f64, better: Better, kind: Kind) -> Status {
        let v = verdicts(&[metric(name, value, better, kind)], &baseline());
        v.into_iter().find(|v| v.name == name).unwrap().status
    }

    #[test]
    fn a_slowdown_beyond_tolerance_fails_either_way_round() {
        // tolerance 0.25: a 24% slowdown passes, 26% fails, in both directions
        assert!(!status("q/speed", 1.0 / 1.24, Better::Higher, Kind::Ratio).fails());
        assert!(status("q/speed", 1.0 / 1.26, Better::Higher, Kind::Ratio).fails());
        assert!(!status("q/time", 2.0 * 1.24, Better::Lower, Kind::Ratio).fails());
        assert!(status("q/time", 2.0 * 1.26, Better::Lower, Kind::Ratio).fails());
        // a 30% slowdown always fails
        assert!(status("q/speed", 1.0 / 1.3, Better::Higher, Kind::Ratio).fails());
        assert!(status("q/time", 2.6, Better::Lower, Kind::Ratio).fails());
        assert!(matches!(
            status("q/speed", 1.3, Better::Higher, Kind::Ratio),
            Status::Improved { .. }
        ));
        assert!(!status("q/time", 1.0, Better::Lower, Kind::Ratio).fails());
        assert!(status("q/time", f64::NAN, Better::Lower, Kind::Ratio).fails());
        assert!(status("q/speed", 0.0, Better::Higher, Kind::Ratio).fails());
    }

    #[test]
    fn instruction_counts_gate_tightly() {
        assert!(!status("callgrind/k", 10.29, Better::Lower, Kind::Instructions).fails());
        assert!(status("callgrind/k", 10.31, Better::Lower, Kind::Instructions).fails());
    }

    #[test]
    fn missing_fails_unless_skipped_and_new_does_not_gate() {
        let b = baseline();
        let here = machine("cpu", 10.0, 5.0);
        let run = [metric("q/speed", 1.0, Better::Higher, Kind::Ratio)];
        let (_, v) = compare(&run, &b, &here, &[]);
        assert!(v
            .iter()
            .any(|v| v.name == "q/time" && v.status == Status::Missing));
        let (_, v) = compare(
            &run,
            &b,
            &here,
            &[("callgrind/".into(), "no valgrind".into())],
        );
        let cg = v.iter().find(|v| v.name == "callgrind/k").unwrap();
        assert_eq!(cg.status, Status::Skipped("no valgrind".into()));
        let v = verdicts(&[metric("x/new", 5.0, Better::Lower, Kind::Ratio)], &b);
        assert_eq!(v[0].status, Status::New);
        assert!(!v[0].status.fails());
    }

    #[test]
    fn reported_metrics_never_gate_and_update_keeps_tolerances() {
        let mut b = baseline();
        b.machines[0].metrics.get_mut("q/time").unwrap().tolerance = Some(0.5);
        let run = [
            metric("q/speed", 2.0, Better::Higher, Kind::Ratio),
            metric("q/time", 2.0, Better::Lower, Kind::Ratio),
            metric("q/ms", 1e9, Better::Lower, Kind::Reported),
        ];
        let here = machine("cpu", 10.0, 5.0);
        let nb = Baseline::accept(&run, Some(&b), &here, &Derived::new(), "now".into());
        let p = nb.profile(&here.fingerprint).unwrap();
        assert_eq!(p.metrics["q/speed"].value, 2.0);
        assert_eq!(p.metrics["q/time"].tolerance, Some(0.5));
        assert!(!p.metrics.contains_key("q/ms"));
        // the instruction count was not measured this time: kept
        assert_eq!(nb.portable.metrics["callgrind/k"].value, 10.0);
        let (_, v) = compare(&run, &nb, &here, &[]);
        assert!(v.iter().all(|v| v.name != "q/ms"));
        assert!(matches!(
            v.iter().find(|v| v.name == "q/speed").unwrap().status,
            Status::Ok { .. }
        ));
    }

    #[test]
    fn another_processor_gets_its_own_profile_and_keeps_the_others() {
        let b = baseline();
        let other = machine("other cpu", 20.0, 3.0);
        let run = [
            metric("q/speed", 0.1, Better::Higher, Kind::Ratio), // 10x slower there
            metric("callgrind/k", 10.0, Better::Lower, Kind::Instructions),
        ];
        // No profile for it: the timing ratio is reported, the instruction count gates.
        let (m, v) = compare(&run, &b, &other, &[]);
        assert!(m.profile.is_none());
        assert!(m.summary.contains("No timing profile"));
        let speed = v.iter().find(|v| v.name == "q/speed").unwrap();
        assert!(matches!(speed.status, Status::NotCompared(_)));
        assert!(v.iter().all(|v| !v.status.fails()), "{v:?}");
        let bad = [metric(
            "callgrind/k",
            11.0,
            Better::Lower,
            Kind::Instructions,
        )];
        assert!(compare(&bad, &b, &other, &[]).1[0].status.fails());
        // Accepting it there adds a profile and leaves the first one alone.
        let nb = Baseline::accept(&run, Some(&b), &other, &Derived::new(), "there".into());
        assert_eq!(nb.machines.len(), 2);
        assert_eq!(
            nb.profile(&machine("cpu", 1.0, 1.0).fingerprint)
                .unwrap()
                .metrics["q/speed"]
                .value,
            1.0
        );
        assert_eq!(
            nb.profile(&other.fingerprint).unwrap().metrics["q/speed"].value,
            0.1
        );
    }

    #[test]
    fn a_profile_without_calibration_round_trips_and_compares() {
        let run = [metric("q/speed", 1.0, Better::Higher, Kind::Ratio)];
        let mut here = machine("cpu", 1.0, 1.0);
        here.calibration = None;
        let b = Baseline::accept(&run, None, &here, &Derived::new(), "x".into());
        assert_eq!(b.machines[0].calibration, None);
        let text = serde_json::to_string(&b).unwrap();
        let back: Baseline = serde_json::from_str(&text).unwrap();
        let (m, v) = compare(&run, &back, &machine("cpu", 2.0, 2.0), &[]);
        assert_eq!(
            (m.memcpy_vs_profile, m.memory_ratios_compared),
            (None, false)
        );
        assert!(matches!(v[0].status, Status::Ok { .. }));
    }

    /// The derivation for one ratio recorded alone.
    fn derive_tolerance(values: &[f64]) -> Option<DerivedTolerance> {
        let samples = BTreeMap::from([("q/alone".to_string(), values.to_vec())]);
        derive_tolerances(&samples).remove("q/alone")
    }

    #[test]
    fn a_ratio_is_as_noisy_as_the_typical_ratio_against_its_reference() {
        let runs = |dev: f64| vec![1.0, 1.0 + dev, 1.0, 1.0 - dev / 2.0, 1.0];
        let samples = BTreeMap::from([
            // Against the probe: two quiet by luck, three noisy (12%, 13%, 15%).
            ("k/a/vs_probe".to_string(), runs(0.06)),
            ("k/b/vs_probe".to_string(), runs(0.02)),
            ("k/c/vs_probe".to_string(), runs(0.12)),
            ("k/d/vs_probe".to_string(), runs(0.13)),
            ("k/e/vs_probe".to_string(), runs(0.15)),
            // Against the FP32 step: both quiet, one quieter than the other.
            ("s/x/vs_fp32".to_string(), runs(0.01)),
            ("s/y/vs_fp32".to_string(), runs(0.07)),
            // Alone against its reference: judged by its own spread.
            ("t/speedup_2t".to_string(), runs(0.04)),
        ]);
        let d = derive_tolerances(&samples);
        assert_eq!(d.len(), 8);
        for quiet_by_luck in ["k/a/vs_probe", "k/b/vs_probe"] {
            let e = &d[quiet_by_luck];
            assert_eq!((e.value, e.tolerance), (1.0, None), "{quiet_by_luck}");
            assert!(
                e.how
                    .contains("the 5 ratios against the same reference (vs_probe)")
                    && e.how.contains("12.0%"),
                "{}",
                e.how
            );
        }
        assert_eq!(d["k/e/vs_probe"].tolerance, None);
        assert!(d["k/e/vs_probe"]
            .how
            .contains("largest deviation from the median over 5 runs 15.0%"));
        // The group's median deviation (4%) lifts the quieter one to 3 x 4%, under the floor.
        assert_eq!(d["s/x/vs_fp32"].tolerance, Some(0.15));
        let t = d["s/y/vs_fp32"].tolerance.unwrap();
        assert!((t - 0.21).abs() < 1e-9, "{t}");
        let t = d["t/speedup_2t"].tolerance.unwrap();
        assert_eq!(t, 0.15);
        assert!(
            d["t/speedup_2t"].how.contains("over 5 runs 4.0%"),
            "{}",
            d["t/speedup_2t"].how
        );
    }

    #[test]
    fn derived_tolerances_follow_the_spread_within_bounds() {
        // 2% spread: floor of 15%
        let d = derive_tolerance(&[1.0, 1.02, 0.99, 1.01, 1.0]).unwrap();
        assert_eq!((d.value, d.tolerance), (1.0, Some(0.15)));
        assert!(d.how.contains("5 runs"));
        // 6% deviation: 3 x 6% = 18%
        let t = derive_tolerance(&[1.0, 1.06, 1.0])
            .unwrap()
            .tolerance
            .unwrap();
        assert!((t - 0.18).abs() < 1e-9, "{t}");
        // 8% deviation: 24%, still under the cap
        let t = derive_tolerance(&[1.0, 1.08, 1.0])
            .unwrap()
            .tolerance
            .unwrap();
        assert!((t - 0.24).abs() < 1e-9, "{t}");
        // 20% deviation: a tolerance for that would let a 30% slowdown pass: not gated
        let d = derive_tolerance(&[1.0, 1.2, 1.0]).unwrap();
        assert_eq!((d.value, d.tolerance), (1.0, None));
        assert!(d.how.contains("too noisy"), "{}", d.how);
        assert!(derive_tolerance(&[1.0]).is_none());
        assert!(derive_tolerance(&[1.0, f64::NAN]).is_none());
        assert!(derive_tolerance(&[1.0, 0.0]).is_none());
    }

    #[test]
    fn derived_values_and_tolerances_are_accepted() {
        let run = [
            metric("q/speed", 0.9, Better::Higher, Kind::Ratio),
            metric("q/noisy", 0.9, Better::Higher, Kind::Ratio),
        ];
        let mut d = Derived::new();
        let derived = |value, tolerance, how: &str| DerivedTolerance {
            value,
            tolerance,
            how: how.into(),
        };
        d.insert("q/speed".into(), derived(1.0, Some(0.2), "how"));
        d.insert("q/noisy".into(), derived(1.0, None, "too noisy"));
        let here = machine("cpu", 1.0, 1.0);
        let b = Baseline::accept(&run, None, &here, &d, "x".into());
        let e = &b.machines[0].metrics["q/speed"];
        assert_eq!((e.value, e.tolerance), (1.0, Some(0.2)));
        assert_eq!(e.tolerance_from.as_deref(), Some("how"));
        // The noisy one is reported whatever its value; the other still gates.
        let slow = [
            metric("q/speed", 0.5, Better::Higher, Kind::Ratio),
            metric("q/noisy", 0.1, Better::Higher, Kind::Ratio),
        ];
        let (_, v) = compare(&slow, &b, &here, &[]);
        assert!(v[0].status.fails());
        assert_eq!(v[1].status, Status::NotCompared("too noisy".into()));
        // An update without --runs keeps the verdict.
        let b2 = Baseline::accept(&run, Some(&b), &here, &Derived::new(), "y".into());
        assert_eq!(
            b2.machines[0].metrics["q/noisy"].not_gated.as_deref(),
            Some("too noisy")
        );
    }
}

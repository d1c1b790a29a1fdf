//! Confirmation of timing regressions.
//!
//! A timing ratio can fail the gate because a burst of load hit the rounds that measured it,
//! not because the code got slower. Before failing, `cargo xtask bench` measures the sources
//! of the failing timing ratios once more and keeps, for each of those metrics, the better of
//! the two values: a real regression is slower in both runs, a transient is not. Instruction
//! counts are deterministic and are never re-measured. The report keeps both values.

use std::collections::BTreeSet;

use super::baseline::{second_core_probe, Verdict};
use super::metric::{Basis, Better, Kind, Metric};

/// A source that can be measured again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    /// `bench kernels`.
    Kernels,
    /// `bench steps`.
    Steps,
}

/// The repeatable source of a metric, by its name (`None` for callgrind, criterion, GPU).
pub fn source_of(name: &str) -> Option<Source> {
    if name.starts_with("step/") {
        Some(Source::Steps)
    } else if ["callgrind/", "criterion/", "gpu/"]
        .iter()
        .any(|p| name.starts_with(p))
    {
        None
    } else {
        Some(Source::Kernels)
    }
}

/// The timing ratios that failed the gate: `(names, sources to re-measure)`.
pub fn to_confirm(metrics: &[Metric], verdicts: &[Verdict]) -> (Vec<String>, BTreeSet<Source>) {
    let mut names = Vec::new();
    let mut sources = BTreeSet::new();
    for v in verdicts.iter().filter(|v| v.status.fails()) {
        let is_ratio = metrics
            .iter()
            .any(|m| m.name == v.name && m.kind == Kind::Ratio);
        if let (true, Some(s)) = (is_ratio, source_of(&v.name)) {
            names.push(v.name.clone());
            sources.insert(s);
        }
    }
    (names, sources)
}

/// For each metric named in `names`, keeps the better of its first value and its value in
/// `rerun`, and says so in its note. A 2-thread speed-up ([`Basis::Cores`]) that keeps its
/// second value brings along the probe of the host's second core from the same rounds, so the
/// gate judges it by the conditions it was measured in. Returns one line per metric for the
/// log.
pub fn merge(metrics: &mut [Metric], rerun: &[Metric], names: &[String]) -> Vec<String> {
    let mut log = Vec::new();
    let mut probes_from_rerun = BTreeSet::new();
    for m in metrics.iter_mut().filter(|m| names.contains(&m.name)) {
        let Some(again) = rerun.iter().find(|r| r.name == m.name) else {
            continue;
        };
        let first = m.value;
        let second_better = match m.better {
            Better::Higher => again.value > first,
            Better::Lower => again.value < first,
        } || !first.is_finite();
        if second_better {
            m.value = again.value;
            m.spread = again.spread;
            if m.basis == Some(Basis::Cores) {
                probes_from_rerun.insert(second_core_probe(&m.name));
            }
        }
        let line = format!(
            "confirmation run: first {first:.4}, second {:.4}; kept the better",
            again.value
        );
        log.push(format!("{}: {line}", m.name));
        m.note = if m.note.is_empty() {
            line
        } else {
            format!("{} ({line})", m.note)
        };
    }
    for m in metrics
        .iter_mut()
        .filter(|m| probes_from_rerun.contains(&m.name))
    {
        if let Some(again) = rerun.iter().find(|r| r.name == m.name) {
            log.push(format!(
                "{}: {:.4} from the rounds of the kept speed-up (first {:.4})",
                m.name, again.value, m.value
            ));
            m.value = again.value;
            m.spread = again.spread;
        }
    }
    log
}

#[cfg(test)]
mod tests {
    use super::super::baseline::tests::{accept, metric, verdicts};
    use super::*;

    #[test]
    fn only_failing_timing_ratios_are_confirmed_from_their_source() {
        let base = accept(&[
            metric("quant/k/vs_memcpy", 1.0, Better::Higher, Kind::Ratio),
            metric("step/nvfp4/vs_fp32", 1.1, Better::Lower, Kind::Ratio),
            metric("step/bf16/vs_fp32", 1.0, Better::Lower, Kind::Ratio),
            metric("callgrind/k/ir", 4.0, Better::Lower, Kind::Instructions),
        ]);
        let run = [
            metric("quant/k/vs_memcpy", 0.5, Better::Higher, Kind::Ratio), // fails
            metric("step/nvfp4/vs_fp32", 2.0, Better::Lower, Kind::Ratio), // fails
            metric("step/bf16/vs_fp32", 1.05, Better::Lower, Kind::Ratio), // ok
            metric("callgrind/k/ir", 5.0, Better::Lower, Kind::Instructions), // fails, exact
        ];
        let v = verdicts(&run, &base);
        let (names, sources) = to_confirm(&run, &v);
        assert_eq!(names.len(), 2);
        assert!(names.contains(&"quant/k/vs_memcpy".to_string()));
        assert!(names.contains(&"step/nvfp4/vs_fp32".to_string()));
        assert_eq!(
            sources.into_iter().collect::<Vec<_>>(),
            vec![Source::Kernels, Source::Steps]
        );
    }

    #[test]
    fn a_transient_is_forgiven_and_a_real_regression_is_not() {
        let base = accept(&[
            metric("quant/a/vs_memcpy", 1.0, Better::Higher, Kind::Ratio),
            metric("step/b/vs_fp32", 1.0, Better::Lower, Kind::Ratio),
        ]);
        let mut run = vec![
            metric("quant/a/vs_memcpy", 0.5, Better::Higher, Kind::Ratio),
            metric("step/b/vs_fp32", 1.6, Better::Lower, Kind::Ratio),
        ];
        let rerun = [
            metric("quant/a/vs_memcpy", 0.95, Better::Higher, Kind::Ratio), // transient
            metric("step/b/vs_fp32", 1.5, Better::Lower, Kind::Ratio),      // real
        ];
        let names: Vec<String> = run.iter().map(|m| m.name.clone()).collect();
        let log = merge(&mut run, &rerun, &names);
        assert_eq!(log.len(), 2);
        assert_eq!(run[0].value, 0.95);
        assert_eq!(run[1].value, 1.5);
        assert!(run[0].note.contains("first 0.5000, second 0.9500"));
        let v = verdicts(&run, &base);
        assert!(!v[0].status.fails());
        assert!(v[1].status.fails());
    }

    #[test]
    fn a_speed_up_kept_from_the_rerun_brings_its_probe_of_the_second_core() {
        let cores = |name: &str, v| Metric {
            basis: Some(Basis::Cores),
            ..metric(name, v, Better::Higher, Kind::Ratio)
        };
        let probe = |v| {
            metric(
                "step/fma_probe/speedup_2t",
                v,
                Better::Higher,
                Kind::Reported,
            )
        };
        let mut run = vec![cores("step/fp32/speedup_2t", 1.30), probe(1.98)];
        let rerun = [cores("step/fp32/speedup_2t", 1.35), probe(1.41)];
        let log = merge(&mut run, &rerun, &["step/fp32/speedup_2t".to_string()]);
        assert_eq!((run[0].value, run[1].value), (1.35, 1.41));
        assert_eq!(log.len(), 2, "{log:?}");
        // a first value that stays keeps the first rounds' probe
        let mut run = vec![cores("step/fp32/speedup_2t", 1.70), probe(1.98)];
        merge(&mut run, &rerun, &["step/fp32/speedup_2t".to_string()]);
        assert_eq!((run[0].value, run[1].value), (1.70, 1.98));
    }

    #[test]
    fn a_better_first_value_is_kept_and_names_not_listed_are_untouched() {
        let mut run = vec![
            metric("quant/a/vs_memcpy", 0.6, Better::Higher, Kind::Ratio),
            metric("quant/b/vs_memcpy", 0.1, Better::Higher, Kind::Ratio),
        ];
        let rerun = [
            metric("quant/a/vs_memcpy", 0.4, Better::Higher, Kind::Ratio),
            metric("quant/b/vs_memcpy", 9.0, Better::Higher, Kind::Ratio),
        ];
        merge(&mut run, &rerun, &["quant/a/vs_memcpy".to_string()]);
        assert_eq!(run[0].value, 0.6);
        assert_eq!(run[1].value, 0.1);
        assert!(run[1].note.is_empty());
    }

    #[test]
    fn sources_by_name() {
        assert_eq!(source_of("step/fp32/speedup_2t"), Some(Source::Steps));
        assert_eq!(
            source_of("optim/adamw_10M/vs_inplace"),
            Some(Source::Kernels)
        );
        assert_eq!(source_of("callgrind/quant/x/ir_per_elem"), None);
        assert_eq!(source_of("gpu/nvfp4/gbps"), None);
    }
}

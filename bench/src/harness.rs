//! Paired timing: every case of a group runs in every round, in an order that rotates from
//! round to round, and gated figures are medians of *per-round* ratios. A burst of load from
//! another job slows the cases of one round together, so it moves that round's times but
//! hardly its ratios, and the median discards the rounds it did distort.

use std::hint::black_box;
use std::time::Instant;

/// A named piece of work timed as one call.
pub struct Case<'a> {
    /// Name used in metric names.
    pub name: &'static str,
    run: Box<dyn FnMut() + 'a>,
}

impl<'a> Case<'a> {
    /// A case running `f` once per timed call.
    pub fn new(name: &'static str, f: impl FnMut() + 'a) -> Case<'a> {
        Case {
            name,
            run: Box::new(f),
        }
    }
}

/// Per-round seconds of each case: `times[case][round]`.
pub struct Rounds {
    names: Vec<&'static str>,
    times: Vec<Vec<f64>>,
}

/// Runs `cases` for `rounds` rounds; in each round every case runs `reps` times back to back
/// and its fastest run is that round's time (one warm-up call per case precedes round 0).
pub fn run_rounds(cases: &mut [Case<'_>], rounds: usize, reps: usize) -> Rounds {
    for c in cases.iter_mut() {
        (c.run)();
    }
    let n = cases.len();
    let mut times = vec![Vec::with_capacity(rounds); n];
    for r in 0..rounds {
        for k in 0..n {
            let i = (k + r) % n;
            let mut best = f64::INFINITY;
            for _ in 0..reps.max(1) {
                let t = Instant::now();
                (cases[i].run)();
                best = best.min(black_box(t.elapsed().as_secs_f64()));
            }
            times[i].push(best);
        }
    }
    Rounds {
        names: cases.iter().map(|c| c.name).collect(),
        times,
    }
}

impl Rounds {
    /// Builds rounds from times measured elsewhere (e.g. by child processes):
    /// `times[case][round]`.
    pub fn from_times(names: Vec<&'static str>, times: Vec<Vec<f64>>) -> Rounds {
        Rounds { names, times }
    }

    fn index(&self, name: &str) -> usize {
        self.names
            .iter()
            .position(|n| *n == name)
            .unwrap_or_else(|| panic!("no case named {name}"))
    }

    /// Median seconds of a case over the rounds.
    pub fn median_secs(&self, name: &str) -> f64 {
        median_and_spread(&self.times[self.index(name)]).0
    }

    /// Median and relative spread (IQR / median) of `time(num) / time(den)` per round.
    pub fn ratio(&self, num: &str, den: &str) -> (f64, f64) {
        let (a, b) = (&self.times[self.index(num)], &self.times[self.index(den)]);
        let r: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
        median_and_spread(&r)
    }
}

/// Median and interquartile range over the median of `v` (spread 0 for fewer than 2 values).
pub fn median_and_spread(v: &[f64]) -> (f64, f64) {
    assert!(!v.is_empty(), "no samples");
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let q = |p: f64| {
        let x = p * (s.len() - 1) as f64;
        let (lo, hi) = (x.floor() as usize, x.ceil() as usize);
        s[lo] + (s[hi] - s[lo]) * (x - lo as f64)
    };
    let med = q(0.5);
    let spread = if med != 0.0 {
        (q(0.75) - q(0.25)) / med
    } else {
        0.0
    };
    (med, spread)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_spread_of_known_values() {
        assert_eq!(median_and_spread(&[3.0]), (3.0, 0.0));
        let (m, s) = median_and_spread(&[1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(m, 3.0);
        assert!((s - 2.0 / 3.0).abs() < 1e-12);
        let (m, _) = median_and_spread(&[4.0, 1.0]);
        assert_eq!(m, 2.5);
    }

    #[test]
    fn per_round_ratios_cancel_a_common_slowdown() {
        // Round 1 is twice as slow for both cases: the ratio is unaffected.
        let r = Rounds::from_times(
            vec!["a", "b"],
            vec![vec![1.0, 2.0, 1.0], vec![2.0, 4.0, 2.0]],
        );
        assert_eq!(r.ratio("b", "a"), (2.0, 0.0));
        assert_eq!(r.median_secs("b"), 2.0);
    }

    #[test]
    fn every_case_runs_rounds_times_reps_plus_warmup() {
        let (mut a, mut b) = (0, 0);
        {
            let mut cases = [Case::new("a", || a += 1), Case::new("b", || b += 1)];
            let r = run_rounds(&mut cases, 4, 3);
            assert_eq!(r.times[0].len(), 4);
        }
        assert_eq!((a, b), (13, 13));
    }
}

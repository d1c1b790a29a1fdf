//! Paired timing: every case of a group runs in every round, in an order that rotates from
//! round to round, and gated figures are medians of *per-round* ratios. A burst of load from
//! another job slows the cases of one round together, so it moves that round's times but
//! hardly its ratios, and the median discards the rounds it did distort.
//!
//! Single-thread cases are timed with the process's CPU clock, which does not count time the
//! process spends descheduled while other jobs run; multi-threaded cases (whose point is
//! wall-clock speed-up) use wall time.

use std::hint::black_box;
use std::time::{Duration, Instant};

/// How a case is timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clock {
    /// Wall-clock time.
    Wall,
    /// CPU time of the whole process (all threads); wall time where the platform has none.
    ProcessCpu,
}

/// CPU time consumed by this process so far (Linux, 64-bit), or `None`.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
fn process_cpu_time() -> Option<Duration> {
    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
    }
    const CLOCK_PROCESS_CPUTIME_ID: i32 = 2;
    let mut t = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid, writable timespec; clock_gettime only writes to it.
    let rc = unsafe { clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    (rc == 0).then(|| Duration::new(t.tv_sec as u64, t.tv_nsec as u32))
}

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
fn process_cpu_time() -> Option<Duration> {
    None
}

impl Clock {
    /// Seconds taken by `f` on this clock.
    pub fn time(self, f: &mut dyn FnMut()) -> f64 {
        if self == Clock::ProcessCpu {
            if let Some(start) = process_cpu_time() {
                f();
                if let Some(end) = process_cpu_time() {
                    return (end - start).as_secs_f64();
                }
            }
        }
        let t = Instant::now();
        f();
        t.elapsed().as_secs_f64()
    }
}

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

    /// Runs the case once, untimed.
    pub fn call(&mut self) {
        (self.run)();
    }

    /// The same case made slower on purpose by `fraction` (0.3: 30% slower): after each call
    /// the CPU stays busy for `fraction` of the CPU time the call took. This is how the gate
    /// is shown to catch a real slowdown (`bench kernels --inject-slowdown`).
    pub fn slowed(self, fraction: f64) -> Case<'a> {
        let mut run = self.run;
        Case {
            name: self.name,
            run: Box::new(move || {
                let spent = Clock::ProcessCpu.time(&mut *run);
                busy_for(spent * fraction);
            }),
        }
    }
}

/// Keeps this thread busy for `secs` of process CPU time (wall time off Linux).
fn busy_for(secs: f64) {
    let start = process_cpu_time();
    let wall = Instant::now();
    loop {
        let spent = match (start, process_cpu_time()) {
            (Some(a), Some(b)) => (b - a).as_secs_f64(),
            _ => wall.elapsed().as_secs_f64(),
        };
        if spent >= secs {
            return;
        }
        black_box(spent);
    }
}

/// Per-round seconds of each case: `times[case][round]`.
pub struct Rounds {
    names: Vec<&'static str>,
    times: Vec<Vec<f64>>,
}

/// Runs `cases` for `rounds` rounds; in each round every case runs `reps` times back to back
/// and its fastest run on `clock` is that round's time (one warm-up call per case precedes
/// round 0).
pub fn run_rounds(cases: &mut [Case<'_>], rounds: usize, reps: usize, clock: Clock) -> Rounds {
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
                best = best.min(black_box(clock.time(&mut cases[i].run)));
            }
            times[i].push(best);
        }
    }
    Rounds {
        names: cases.iter().map(|c| c.name).collect(),
        times,
    }
}

/// Times of cases each measured right after a run of a common reference:
/// `case_secs[case][round]` and the reference's `ref_secs[case][round]` just before it.
pub struct Against {
    names: Vec<&'static str>,
    case_secs: Vec<Vec<f64>>,
    ref_secs: Vec<Vec<f64>>,
}

/// Like [`run_rounds`], but every case is preceded by its own run of `reference` (fastest of
/// `reps` each), so each case's ratio to the reference comes from measurements taken
/// back to back: a reference that is sensitive to load (a memcpy) is sampled exactly when
/// the case is.
pub fn run_against(
    reference: &mut Case<'_>,
    cases: &mut [Case<'_>],
    rounds: usize,
    reps: usize,
    clock: Clock,
) -> Against {
    (reference.run)();
    for c in cases.iter_mut() {
        (c.run)();
    }
    let n = cases.len();
    let mut case_secs = vec![Vec::with_capacity(rounds); n];
    let mut ref_secs = vec![Vec::with_capacity(rounds); n];
    let best = |f: &mut Box<dyn FnMut() + '_>| {
        (0..reps.max(1))
            .map(|_| clock.time(f))
            .fold(f64::INFINITY, f64::min)
    };
    for r in 0..rounds {
        for k in 0..n {
            let i = (k + r) % n;
            ref_secs[i].push(best(&mut reference.run));
            case_secs[i].push(best(&mut cases[i].run));
        }
    }
    Against {
        names: cases.iter().map(|c| c.name).collect(),
        case_secs,
        ref_secs,
    }
}

impl Against {
    fn index(&self, name: &str) -> usize {
        self.names
            .iter()
            .position(|n| *n == name)
            .unwrap_or_else(|| panic!("no case named {name}"))
    }

    /// Names of the cases, in order.
    pub fn names(&self) -> &[&'static str] {
        &self.names
    }

    /// Median seconds of a case.
    pub fn median_secs(&self, name: &str) -> f64 {
        median_and_spread(&self.case_secs[self.index(name)]).0
    }

    /// Median seconds of the reference over all its runs.
    pub fn reference_median_secs(&self) -> f64 {
        median_and_spread(&self.ref_secs.concat()).0
    }

    /// Speed relative to the reference: median over rounds of reference time / case time,
    /// with its relative spread.
    pub fn speed_vs_reference(&self, name: &str) -> (f64, f64) {
        let i = self.index(name);
        let r: Vec<f64> = self.ref_secs[i]
            .iter()
            .zip(&self.case_secs[i])
            .map(|(a, b)| a / b)
            .collect();
        median_and_spread(&r)
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

    /// The fastest round's seconds of a case.
    pub fn best_secs(&self, name: &str) -> f64 {
        self.times[self.index(name)]
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min)
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

/// Runs this bench binary again with `args` (and the environment variables `env` set) and
/// returns what it printed; `what` names the child in errors, with its stderr when it fails.
pub fn child_output(args: &[String], env: &[(&str, &str)], what: &str) -> anyhow::Result<Vec<u8>> {
    use anyhow::Context;
    let exe = std::env::current_exe().context("locating the bench binary")?;
    let out = std::process::Command::new(exe)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .with_context(|| format!("starting the {what}"))?;
    if !out.status.success() {
        anyhow::bail!(
            "the {what} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out.stdout)
}

/// A rayon pool of `threads` threads (each measurement that compares thread counts runs its
/// sides on pools of its own, not on the global one).
pub fn pool(threads: usize) -> anyhow::Result<rayon::ThreadPool> {
    Ok(rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?)
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
            let r = run_rounds(&mut cases, 4, 3, Clock::Wall);
            assert_eq!(r.times[0].len(), 4);
        }
        assert_eq!((a, b), (13, 13));
    }

    #[test]
    fn every_case_gets_its_own_reference_run() {
        let (mut r, mut a, mut b) = (0, 0, 0);
        {
            let mut reference = Case::new("ref", || r += 1);
            let mut cases = [Case::new("a", || a += 1), Case::new("b", || b += 1)];
            let x = run_against(&mut reference, &mut cases, 3, 2, Clock::Wall);
            assert_eq!(x.names(), ["a", "b"]);
            assert!(x.speed_vs_reference("a").0 > 0.0);
        }
        // warm-up once each; then per round and case: 2 reference + 2 case runs
        assert_eq!((r, a, b), (1 + 3 * 2 * 2, 1 + 3 * 2, 1 + 3 * 2));
    }

    #[test]
    fn a_slowed_case_still_runs_its_work_once_per_call() {
        let mut n = 0;
        {
            let mut case = Case::new("a", || n += 1).slowed(0.3);
            (case.run)();
            (case.run)();
        }
        assert_eq!(n, 2);
    }

    #[test]
    fn cpu_clock_counts_work_not_sleep() {
        let busy = Clock::ProcessCpu.time(&mut || {
            let mut x = 0u64;
            for i in 0..20_000_000u64 {
                x = black_box(x.wrapping_add(i));
            }
        });
        let asleep = Clock::ProcessCpu.time(&mut || std::thread::sleep(Duration::from_millis(50)));
        assert!(busy > 0.0);
        // Sleeping costs (almost) no CPU time, unlike on the wall clock.
        assert!(asleep < 0.025, "sleep cost {asleep} s of CPU");
        assert!(Clock::Wall.time(&mut || std::thread::sleep(Duration::from_millis(50))) >= 0.05);
    }
}

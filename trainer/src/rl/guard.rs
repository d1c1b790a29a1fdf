//! The RL divergence guard (beyond the non-finite checks of [`super::run`]): a step or an
//! evaluation that trips it stops the run with `diagnosis.txt`, and nothing of it is saved,
//! so the last checkpoint is the last good one.
//!
//! * **Mismatch spike**: a step whose k3 estimate of KL(sampler ‖ trainer) exceeds
//!   `guard_max_k3` (default 1.0; the largest per-step k3 of the committed grid is 0.30,
//!   the `nvfp4` plan): the sampler no longer samples the policy being trained.
//! * **Rollout collapse**: the mean rollout pass rate over the last `guard_window` steps
//!   (default 5) falls below `guard_collapse` (default 0.5) times the best such mean so far,
//!   once that best has reached `guard_min_pass` (default 0.1, so a policy that never passed
//!   is not judged), **and** the drop exceeds [`NOISE_Z`] standard errors of a difference of
//!   two window means, estimated from the run's own step-to-step changes of the pass rate
//!   (their median, which a collapse barely moves; judged once `2 x guard_window` steps are
//!   recorded). The second condition keeps sampling noise
//!   from tripping it: at a pass rate near 0.08 (16 prompts x 8 completions per step) steps
//!   range from 0.02 to 0.17 with no trend, and the best 5-step mean of a 40-step run reaches
//!   twice a later one by chance alone - the ratio test alone stopped such runs. In the
//!   committed grid the ratio never fell below 0.78.
//! * **Held-out collapse**: an evaluation's greedy held-out pass rate below `guard_collapse`
//!   times the best so far (the initial one included, judged once the best reaches
//!   `guard_min_pass`), **and** below the best by more than [`NOISE_Z`] binomial standard
//!   errors of the difference of two pass rates over the held-out prompts
//!   (`sqrt((b(1-b) + p(1-p)) / n)`); its checkpoint is not written. (At lr 3e-4 the held-out
//!   pass rate fell from 0.945 to 0.46 in 30 steps, 12 standard errors: this trips it; so
//!   does 0.15 to 0.0 at lr 6e-4 on `reverse`, 5.9 standard errors. From a weak start an early
//!   dip that recovers, 0.15 to 0.07 at step 25 and 0.4 by step 200, is 2.6 standard errors:
//!   the ratio test alone stopped that run.)
//!
//! `guard_max_k3 = 0` or `guard_collapse = 0` turns the corresponding check off. The guard's
//! state is rebuilt from `metrics.jsonl` and `eval.jsonl` on resume, so a resumed run trips
//! exactly where the uninterrupted one would.

use std::collections::VecDeque;

/// How many standard errors a rollout pass-rate drop must exceed to count as a collapse
/// (the best window mean is a maximum over many windows, so a plain 2-3 sigma would trip on
/// noise in long runs).
pub const NOISE_Z: f64 = 4.0;

use super::config::RlConfig;
use super::metrics::{EvalRecord, StepRecord};

/// The guard's state.
#[derive(Clone, Debug, PartialEq)]
pub struct RlGuard {
    max_k3: f64,
    collapse: f64,
    window: usize,
    min_pass: f64,
    recent: VecDeque<f64>,
    best_window: f64,
    best_eval: f64,
    /// The last recorded step's pass rate and every |difference| of consecutive steps' (their
    /// median sets the noise bound; a collapse adds one or two large differences, which the
    /// median ignores, where a variance would grow with them).
    last: Option<f64>,
    abs_diffs: Vec<f64>,
}

impl RlGuard {
    /// A guard with the bounds of `cfg` and no history.
    pub fn new(cfg: &RlConfig) -> RlGuard {
        RlGuard {
            max_k3: cfg.guard_max_k3,
            collapse: cfg.guard_collapse,
            window: cfg.guard_window.max(1),
            min_pass: cfg.guard_min_pass,
            recent: VecDeque::new(),
            best_window: 0.0,
            best_eval: 0.0,
            last: None,
            abs_diffs: Vec::new(),
        }
    }

    /// The state after `steps` and `evals` (a resumed run's history).
    pub fn replay(cfg: &RlConfig, steps: &[StepRecord], evals: &[EvalRecord]) -> RlGuard {
        let mut g = RlGuard::new(cfg);
        for s in steps {
            g.record_step(s.pass_rate);
        }
        for e in evals {
            g.record_eval(e.pass_rate);
        }
        g
    }

    fn window_mean(&self, next: f64) -> Option<f64> {
        let n = self.recent.len() + 1;
        if n < self.window {
            return None;
        }
        let skip = n - self.window;
        let sum: f64 = self.recent.iter().skip(skip).sum::<f64>() + next;
        Some(sum / self.window as f64)
    }

    /// The standard error of a difference of two window means: the per-step standard
    /// deviation is estimated robustly as median(|x_i - x_(i-1)|) / 0.954 (for normal noise
    /// |x_i - x_(i-1)| is half-normal with scale sigma x sqrt 2, whose median is 0.954 sigma);
    /// `None` until `2 x window` steps are recorded.
    fn window_noise(&self) -> Option<f64> {
        if self.abs_diffs.len() + 1 < 2 * self.window {
            return None;
        }
        let mut d = self.abs_diffs.clone();
        d.sort_by(f64::total_cmp);
        let sigma = d[d.len() / 2] / 0.954;
        Some(sigma * (2.0 / self.window as f64).sqrt())
    }

    /// Judges a step's rollout pass rate and mismatch k3 (nothing recorded): the reason to
    /// stop, if any.
    ///
    /// ```
    /// use trainer::rl::config::RlConfig;
    /// use trainer::rl::guard::RlGuard;
    /// let g = RlGuard::new(&RlConfig::default());
    /// assert!(g.check_step(0.5, 0.2).is_none());
    /// assert!(g.check_step(0.5, 1.5).unwrap().contains("k3"));
    /// ```
    pub fn check_step(&self, pass_rate: f64, k3: f64) -> Option<String> {
        if self.max_k3 > 0.0 && k3 > self.max_k3 {
            return Some(format!(
                "the sampler/trainer mismatch spiked: k3 KL estimate {k3:.3e} > guard_max_k3 {} \
                 (the sampler no longer samples the policy being trained)",
                self.max_k3
            ));
        }
        let m = self.window_mean(pass_rate)?;
        let noise = self.window_noise()?;
        if self.collapse > 0.0
            && self.best_window >= self.min_pass
            && m < self.collapse * self.best_window
            && self.best_window - m > NOISE_Z * noise
        {
            return Some(format!(
                "the rollout pass rate collapsed: {m:.3} over the last {} steps, below \
                 guard_collapse {} x its best {:.3} and {:.1} standard errors under it",
                self.window,
                self.collapse,
                self.best_window,
                (self.best_window - m) / noise.max(f64::MIN_POSITIVE)
            ));
        }
        None
    }

    /// Records a step that passed.
    pub fn record_step(&mut self, pass_rate: f64) {
        if let Some(m) = self.window_mean(pass_rate) {
            self.best_window = self.best_window.max(m);
        }
        if let Some(last) = self.last {
            self.abs_diffs.push((pass_rate - last).abs());
        }
        self.last = Some(pass_rate);
        self.recent.push_back(pass_rate);
        while self.recent.len() >= self.window {
            self.recent.pop_front();
        }
    }

    /// Judges an evaluation's greedy held-out pass rate over `prompts` prompts (nothing
    /// recorded).
    pub fn check_eval(&self, pass_rate: f64, prompts: usize) -> Option<String> {
        let (b, p) = (self.best_eval, pass_rate);
        let se = ((b * (1.0 - b) + p * (1.0 - p)) / prompts.max(1) as f64).sqrt();
        (self.collapse > 0.0 && b >= self.min_pass && p < self.collapse * b && b - p > NOISE_Z * se)
            .then(|| {
                format!(
                    "the held-out pass rate collapsed: {p:.3}, below guard_collapse {} x \
                     its best {b:.3} and {:.1} standard errors below it over {prompts} prompts \
                     (this evaluation's checkpoint was not written)",
                    self.collapse,
                    (b - p) / se.max(f64::MIN_POSITIVE)
                )
            })
    }

    /// Records an evaluation that passed.
    pub fn record_eval(&mut self, pass_rate: f64) {
        self.best_eval = self.best_eval.max(pass_rate);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> RlConfig {
        RlConfig {
            guard_window: 3,
            ..RlConfig::default()
        }
    }

    #[test]
    fn rollout_collapse_is_judged_on_the_window_mean_and_its_noise() {
        let mut g = RlGuard::new(&cfg());
        // a steady run (per-step spread ~0.014), then a drop: windows of 3 fall to
        // (0.6 + 0.2 + 0.1) / 3 = 0.3 = 0.5 x 0.6 exactly, then below
        let steady = [0.6, 0.62, 0.58, 0.6, 0.61, 0.59, 0.6, 0.6];
        for p in steady.into_iter().chain([0.2]) {
            assert_eq!(g.check_step(p, 0.0), None);
            g.record_step(p);
        }
        assert_eq!(g.check_step(0.1, 0.0), None, "0.3 is not below 0.5 x 0.6");
        let why = g.check_step(0.05, 0.0).unwrap();
        assert!(why.contains("0.283 over the last 3 steps"), "{why}");
        assert!(why.contains("best 0.600"), "{why}");
        // one bad step inside a good window is noise, not a collapse
        let mut g = RlGuard::new(&cfg());
        for p in [0.6, 0.6, 0.6, 0.0, 0.6, 0.6, 0.0] {
            assert_eq!(g.check_step(p, 0.0), None);
            g.record_step(p);
        }
    }

    #[test]
    fn a_noisy_low_pass_rate_is_not_a_collapse() {
        // the per-step rollout pass rates of a real run from a weak start (lr 3e-5, 16
        // prompts x 8 completions): no trend, but a best 5-step mean of 0.117 and a later one
        // of 0.055 - the ratio test alone stopped this run at step 40
        let passes = [
            0.07, 0.062, 0.094, 0.078, 0.109, 0.117, 0.07, 0.102, 0.039, 0.094, 0.102, 0.078,
            0.078, 0.125, 0.062, 0.031, 0.07, 0.039, 0.055, 0.047, 0.109, 0.117, 0.055, 0.117,
            0.102, 0.023, 0.055, 0.141, 0.039, 0.094, 0.141, 0.172, 0.023, 0.117, 0.102, 0.047,
            0.062, 0.094, 0.031, 0.04, 0.03,
        ];
        let mut g = RlGuard::new(&RlConfig::default());
        for p in passes {
            assert_eq!(g.check_step(p, 0.0), None, "{p}");
            g.record_step(p);
        }
        assert!(g.best_window >= 0.1 && g.window_mean(0.03).unwrap() < 0.5 * g.best_window);
        // the same drop from a steady, higher pass rate is a collapse
        let mut g = RlGuard::new(&RlConfig::default());
        for _ in 0..20 {
            g.record_step(0.5);
            g.record_step(0.52);
        }
        for p in [0.1, 0.1, 0.1] {
            assert_eq!(g.check_step(p, 0.0), None, "{p}");
            g.record_step(p);
        }
        // (0.52 + 4 x 0.1) / 5 = 0.184 < 0.5 x 0.512
        assert!(g.check_step(0.1, 0.0).unwrap().contains("collapsed"));
    }

    #[test]
    fn a_policy_that_never_passed_is_not_judged_and_zero_turns_checks_off() {
        let mut g = RlGuard::new(&cfg());
        for p in [0.09, 0.09, 0.09, 0.0, 0.0, 0.0] {
            assert_eq!(g.check_step(p, 0.0), None);
            g.record_step(p);
        }
        g.record_eval(0.05);
        assert_eq!(g.check_eval(0.0, 200), None);
        let off = RlGuard::new(&RlConfig {
            guard_max_k3: 0.0,
            guard_collapse: 0.0,
            ..cfg()
        });
        assert_eq!(off.check_step(0.0, 1e9), None);
        let mut off = off;
        off.record_eval(0.9);
        assert_eq!(off.check_eval(0.0, 200), None);
    }

    #[test]
    fn held_out_collapse_and_mismatch_spike() {
        let mut g = RlGuard::new(&RlConfig::default());
        g.record_eval(0.86);
        g.record_eval(0.945);
        assert_eq!(g.check_eval(0.85, 200), None);
        let why = g.check_eval(0.46, 200).unwrap();
        assert!(
            why.contains(
                "0.460, below guard_collapse 0.5 x its best 0.945 and 12.5 standard errors"
            ),
            "{why}"
        );
        // from a weak start: an early dip within the noise of 200 prompts is not a collapse
        // (that run recovered to 0.4), a fall to zero is
        let mut weak = RlGuard::new(&RlConfig::default());
        weak.record_eval(0.15);
        assert_eq!(weak.check_eval(0.07, 200), None);
        let why = weak.check_eval(0.0, 200).unwrap();
        assert!(
            why.contains("5.9 standard errors below it over 200 prompts"),
            "{why}"
        );
        // the same dip over 2000 prompts is outside the noise
        assert!(weak.check_eval(0.07, 2000).is_some());
        assert_eq!(g.check_step(0.5, 1.0), None, "at the bound");
        assert!(g
            .check_step(0.5, 1.0001)
            .unwrap()
            .contains("k3 KL estimate 1.000e0"));
    }

    #[test]
    fn replay_gives_the_live_state() {
        let c = cfg();
        let mut live = RlGuard::new(&c);
        let passes = [0.5, 0.7, 0.4, 0.8, 0.6];
        let steps: Vec<StepRecord> = passes
            .iter()
            .enumerate()
            .map(|(i, &p)| {
                live.record_step(p);
                StepRecord {
                    step: i as u64 + 1,
                    pass_rate: p,
                    ..StepRecord::default()
                }
            })
            .collect();
        live.record_eval(0.7);
        let evals = [EvalRecord {
            step: 0,
            pass_rate: 0.7,
            sampled_pass_rate: 0.5,
            prompts: 10,
        }];
        assert_eq!(RlGuard::replay(&c, &steps, &evals), live);
    }
}

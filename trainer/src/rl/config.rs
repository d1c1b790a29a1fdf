//! Settings of an RL run (`rl.toml` in its directory) and its errors.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::correction::Correction;
use super::plan::PlanError;
use super::tasks::{Task, UnknownTask};
use crate::checkpoint::CheckpointError;
use crate::model::ModelError;

/// The most prompts, completions per prompt, steps or evaluation prompts one run accepts.
pub const MAX_COUNT: usize = 1 << 20;

/// RL settings (serde / TOML; unknown fields are errors). Defaults in parentheses.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RlConfig {
    /// The task (`add`).
    pub task: Task,
    /// Seed of the prompt stream, the sampler and the trainer's random streams (0).
    pub seed: u64,
    /// Policy-gradient steps (60).
    pub steps: u64,
    /// Prompts per step (16).
    pub prompts: usize,
    /// Completions per prompt, G >= 2 (8).
    pub group: usize,
    /// New tokens per completion at most (0: the task's longest answer plus its stop token).
    pub max_tokens: usize,
    /// Sampling temperature (1).
    pub temperature: f32,
    /// Top-k (0 = off).
    pub top_k: usize,
    /// Top-p (1 = off).
    pub top_p: f32,
    /// PPO clip ε (0.2).
    pub clip_eps: f64,
    /// Optimizer updates per batch, each on one minibatch of the rollouts (1).
    pub minibatches: usize,
    /// Divide advantages by the group's standard deviation (true).
    pub scale_std: bool,
    /// KL penalty to the initial policy, β (0 = off).
    pub kl_coef: f64,
    /// Off-policy correction (`none`).
    pub correction: Correction,
    /// The correction's bound C (2).
    pub correction_c: f64,
    /// AdamW learning rate (3e-5: at 3e-4 the policy degrades within 10 steps, measured).
    pub lr: f32,
    /// Linear warmup steps (5).
    pub warmup_steps: u64,
    /// Gradient-norm clip (1).
    pub grad_clip: f32,
    /// Evaluate the held-out pass rate and checkpoint every N steps and at the end (10).
    pub eval_every: u64,
    /// Held-out prompts (200).
    pub eval_prompts: usize,
    /// Calibration sequences of static activation scales (64).
    pub calibration: usize,
    /// Checkpoints kept (2).
    pub keep_checkpoints: usize,
    /// Divergence guard ([`super::guard`]): stop when a step's k3 KL estimate between
    /// sampler and trainer exceeds this (1.0; 0 = off).
    pub guard_max_k3: f64,
    /// Divergence guard: stop when the rollout pass rate over `guard_window` steps, or the
    /// held-out pass rate, falls below this fraction of its best (0.5; 0 = off).
    pub guard_collapse: f64,
    /// Divergence guard: steps of the rollout pass rate's window (5).
    pub guard_window: usize,
    /// Divergence guard: collapses are judged once the best pass rate reached this (0.1).
    pub guard_min_pass: f64,
}

impl Default for RlConfig {
    fn default() -> Self {
        RlConfig {
            task: Task::Add,
            seed: 0,
            steps: 60,
            prompts: 16,
            group: 8,
            max_tokens: 0,
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            clip_eps: 0.2,
            minibatches: 1,
            scale_std: true,
            kl_coef: 0.0,
            correction: Correction::None,
            correction_c: 2.0,
            lr: 3e-5,
            warmup_steps: 5,
            grad_clip: 1.0,
            eval_every: 10,
            eval_prompts: 200,
            calibration: 64,
            keep_checkpoints: 2,
            guard_max_k3: 1.0,
            guard_collapse: 0.5,
            guard_window: 5,
            guard_min_pass: 0.1,
        }
    }
}

impl RlConfig {
    /// New tokens per completion.
    pub fn gen_tokens(&self) -> usize {
        if self.max_tokens == 0 {
            self.task.max_answer_tokens()
        } else {
            self.max_tokens
        }
    }

    /// Checks every setting.
    pub fn validate(&self) -> Result<(), RlError> {
        let bad = |m: String| Err(RlError::Invalid(m));
        if self.group < 2 {
            return bad(format!(
                "group (G = {}) must be at least 2: advantages compare the completions of one prompt",
                self.group
            ));
        }
        for (what, n) in [
            ("prompts", self.prompts),
            ("group", self.group),
            ("eval_prompts", self.eval_prompts),
            ("calibration", self.calibration),
            ("minibatches", self.minibatches),
            ("max_tokens", self.max_tokens),
        ] {
            if n > MAX_COUNT {
                return bad(format!("{what} ({n}) must be at most {MAX_COUNT}"));
            }
        }
        if self.prompts == 0 || self.eval_prompts == 0 || self.calibration == 0 {
            return bad("prompts, eval_prompts and calibration must be positive".into());
        }
        if self.steps == 0 || self.steps > MAX_COUNT as u64 || self.eval_every == 0 {
            return bad(format!(
                "steps ({}) must be in 1..={MAX_COUNT} and eval_every ({}) positive",
                self.steps, self.eval_every
            ));
        }
        if self.minibatches == 0 || self.minibatches > self.prompts * self.group {
            return bad(format!(
                "minibatches ({}) must be in 1..={} (the rollouts per step)",
                self.minibatches,
                self.prompts * self.group
            ));
        }
        let finite_pos = |x: f64| x.is_finite() && x > 0.0;
        if !(finite_pos(self.clip_eps) && self.clip_eps < 1.0) {
            return bad(format!("clip_eps ({}) must be in (0, 1)", self.clip_eps));
        }
        if !(finite_pos(self.correction_c) && self.correction_c >= 1.0) {
            return bad(format!("correction_c ({}) must be >= 1", self.correction_c));
        }
        if !(self.kl_coef.is_finite() && self.kl_coef >= 0.0) {
            return bad(format!("kl_coef ({}) must be >= 0", self.kl_coef));
        }
        if !(finite_pos(self.lr as f64) && finite_pos(self.grad_clip as f64)) {
            return bad(format!(
                "lr ({}) and grad_clip ({}) must be positive",
                self.lr, self.grad_clip
            ));
        }
        if !(self.temperature.is_finite() && self.temperature > 0.0) {
            return bad(format!(
                "temperature ({}) must be > 0 for policy-gradient sampling",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(format!("top_p ({}) must be in (0, 1]", self.top_p));
        }
        if !(self.guard_max_k3.is_finite() && self.guard_max_k3 >= 0.0) {
            return bad(format!(
                "guard_max_k3 ({}) must be >= 0 (0 = off)",
                self.guard_max_k3
            ));
        }
        if !((0.0..1.0).contains(&self.guard_collapse)
            && (0.0..=1.0).contains(&self.guard_min_pass))
        {
            return bad(format!(
                "guard_collapse ({}) must be in [0, 1) and guard_min_pass ({}) in [0, 1]",
                self.guard_collapse, self.guard_min_pass
            ));
        }
        if !(1..=1000).contains(&self.guard_window) {
            return bad(format!(
                "guard_window ({}) must be in 1..=1000",
                self.guard_window
            ));
        }
        Ok(())
    }
}

/// Why an RL run could not start or continue.
#[derive(Debug, thiserror::Error)]
pub enum RlError {
    /// Bad settings or inputs.
    #[error("{0}")]
    Invalid(String),
    /// The plan.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The task.
    #[error(transparent)]
    Task(#[from] UnknownTask),
    /// The model.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A checkpoint.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The optimizer.
    #[error(transparent)]
    Optim(#[from] optim::OptimError),
    /// The run directory.
    #[error(transparent)]
    RunDir(#[from] crate::rundir::RunDirError),
    /// Memory.
    #[error(transparent)]
    Memory(#[from] crate::memory::TooLarge),
    /// A file.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        error: std::io::Error,
    },
    /// A NaN or infinite reward, log-probability, loss or gradient, or the divergence guard
    /// ([`super::guard`]) tripped: the run stopped.
    #[error("RL run stopped at step {step}: {reason}; the last good checkpoint is {last_checkpoint} (diagnosis in {diagnosis})")]
    Diverged {
        /// The step.
        step: u64,
        /// What was not finite.
        reason: String,
        /// The last checkpoint written.
        last_checkpoint: String,
        /// The diagnosis file.
        diagnosis: String,
    },
}

impl From<autograd::Error> for RlError {
    fn from(e: autograd::Error) -> Self {
        RlError::Model(ModelError::Autograd(e))
    }
}

/// An I/O error with its path.
pub fn io_err(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> RlError + '_ {
    move |error| RlError::Io {
        path: path.to_path_buf(),
        error,
    }
}

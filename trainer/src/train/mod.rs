//! The training loop: gradient accumulation, warmup + cosine or WSD learning rate, global
//! gradient clipping, AdamW (no weight decay for norms and embeddings), periodic evaluation
//! with per-layer quantization error, JSON-lines metrics, atomic checkpoints, exact resume and
//! a divergence guard.
//!
//! # Outputs (in the run directory)
//!
//! * `metrics.jsonl`: one [`StepMetrics`] object per optimizer step; evaluation steps add
//!   `val_loss` and `layers` (per-layer quantization error of the Fprop operands).
//! * `run.toml`: the [`RunConfig`]; `recipe.toml`: the resolved recipe.
//! * `checkpoints/step-NNNNNNNN/` and `checkpoints/latest` (see [`crate::checkpoint`]).
//! * `summary.json`: a [`RunSummary`] at the end; `diagnosis.txt` when the guard trips.
//!
//! # Divergence guard
//!
//! A step stops the run with [`TrainError::Diverged`] when its loss or gradient norm is not
//! finite, or its loss exceeds `explode_factor` times the reference: the loss of the first
//! step during warmup, the running minimum of the training loss after it. Nothing of that
//! step is applied or saved. An evaluation judges the parameters it is about to checkpoint the
//! same way (validation loss against the same reference) and refuses to save them when they
//! fail, so the last checkpoint is always one that passed: the last good one.
//!
//! # Run directory
//!
//! [`Trainer::run`] holds an exclusive lock on the run directory while it runs
//! ([`crate::rundir::RunLock`]); a new run refuses a directory that already holds a run unless
//! [`Trainer::set_overwrite`] was called; leftovers of an interrupted checkpoint are removed;
//! small files are replaced atomically and each metrics line is written with one call. A stop
//! requested with [`crate::interrupt::request_stop`] (SIGINT/SIGTERM in the CLI) ends the run
//! after the current step with a checkpoint and [`TrainError::Stopped`].
//!
//! # Where each part lives
//!
//! * [`crate::config`]: the run's configuration and its validation;
//! * `error`: [`TrainError`];
//! * `metrics`: [`StepMetrics`], [`LayerError`], [`RunSummary`], [`read_metrics`];
//! * this module: setting up a [`Trainer`] (fresh or resumed) and writing checkpoints;
//! * `step`: one optimizer step and the loss guard;
//! * `eval`: validation loss and per-layer quantization error;
//! * `run`: the loop with its outputs, progress bar and stop handling.

use std::path::{Path, PathBuf};

use autograd::{OpProfile, ParamStore};
use optim::{AdamW, AdamWConfig, LrSchedule, ParamGroup, ParamSpec};

use crate::checkpoint::{self, CheckpointError, TrainState, STATE_VERSION};
use crate::data::{split, Batcher, BatcherConfig, DataError, Sampling, Tokens};
use crate::model::Gpt;
use crate::recipe::Recipe;

pub(crate) mod device_step;
mod error;
mod eval;
mod metrics;
mod run;
mod step;

pub use crate::config::{LrShape, RunConfig, TrainConfig, MAX_BATCH};
pub use error::TrainError;
pub use eval::Evaluation;
pub use metrics::{read_metrics, LayerError, OperandError, RunSummary, StepMetrics};
pub use step::StepOutcome;

/// Options that are not part of the run's identity.
#[derive(Clone, Debug, Default)]
pub struct TrainOptions {
    /// Run directory.
    pub out: PathBuf,
    /// Hide the progress bar.
    pub quiet: bool,
    /// Stop after this many steps in this process (the run's schedule is unchanged; for
    /// interrupt/resume tests).
    pub stop_after: Option<u64>,
}

/// A training run in progress. Its state is read through methods ([`Trainer::config`],
/// [`Trainer::step`], [`Trainer::params`], ...) and changed only by training, resuming and
/// [`Trainer::params_mut`] (e.g. initialising from a Hugging Face folder before the first
/// step).
pub struct Trainer {
    cfg: RunConfig,
    recipe: Recipe,
    ps: ParamStore,
    model: Gpt,
    opt: AdamW,
    schedule: LrSchedule,
    batcher: Batcher,
    val: Tokens,
    unigram_nats: f64,
    step: u64,
    tokens_seen: u64,
    running_min: Option<f32>,
    initial_loss: Option<f32>,
    best_val: Option<f32>,
    last_checkpoint: Option<PathBuf>,
    opts: TrainOptions,
    overwrite: bool,
    /// Test hook: the step whose loss and first gradient are made NaN.
    inject_nan_at_step: Option<u64>,
    /// The run directory this trainer continues (resume), if any.
    resumed_from: Option<PathBuf>,
    /// The device the forward and backward passes and the optimizer step run on, with
    /// AdamW's moments there (`None`: the CPU); see [`Trainer::set_device`].
    device: Option<device_step::DeviceUpdate>,
    /// Whether steps time their ops ([`Trainer::set_op_profiling`]).
    op_profiling: bool,
    /// The op timings of the last step when profiling.
    last_op_profile: Option<OpProfile>,
}

fn param_layout(ps: &ParamStore, model: &Gpt) -> Vec<ParamSpec> {
    ps.ids()
        .map(|id| {
            let len = ps.value(id).map(|v| v.len()).unwrap_or(0);
            ParamSpec::new(len, if model.decays(id) { 0 } else { 1 })
        })
        .collect()
}

impl Trainer {
    /// Sets up a fresh run (loads data, builds and initialises the model).
    pub fn new(cfg: RunConfig, recipe: Recipe, opts: TrainOptions) -> Result<Trainer, TrainError> {
        cfg.validate()?;
        cfg.check_memory()?;
        recipe
            .validate()
            .map_err(|e| TrainError::Config(e.to_string()))?;
        let tokens = cfg.data.load()?;
        let (train, val) = split(&tokens, cfg.train.val_fraction)?;
        let batcher = Batcher::new(
            train.clone(),
            BatcherConfig {
                batch: cfg.train.batch,
                seq: cfg.model.seq,
                sampling: Sampling::Random,
                seed: cfg.train.seed,
            },
        )?;
        Self::build(cfg, recipe, opts, batcher, &train, val)
    }

    fn build(
        cfg: RunConfig,
        recipe: Recipe,
        opts: TrainOptions,
        batcher: Batcher,
        train: &Tokens,
        val: Tokens,
    ) -> Result<Trainer, TrainError> {
        if val.len() < cfg.model.seq + 1 {
            return Err(TrainError::Data(DataError::TooShort {
                what: format!("the validation split ({} tokens)", val.len()),
                needed: cfg.model.seq as u64 + 1,
                available: val.len() as u64,
            }));
        }
        let mut ps = ParamStore::new();
        let model = Gpt::new(&mut ps, cfg.model.clone(), cfg.train.seed)?;
        let t = &cfg.train;
        let groups = [ParamGroup::new(t.weight_decay, 1.0), ParamGroup::no_decay()];
        let opt = AdamW::with_groups(
            AdamWConfig {
                beta1: t.beta1,
                beta2: t.beta2,
                eps: 1e-8,
                weight_decay: t.weight_decay,
            },
            &groups,
            &param_layout(&ps, &model),
        )?;
        let schedule = cfg.schedule()?;
        let unigram_nats = crate::data::unigram_entropy_nats(train);
        Ok(Trainer {
            cfg,
            recipe,
            ps,
            model,
            opt,
            schedule,
            batcher,
            val,
            unigram_nats,
            step: 0,
            tokens_seen: 0,
            running_min: None,
            initial_loss: None,
            best_val: None,
            last_checkpoint: None,
            opts,
            overwrite: false,
            inject_nan_at_step: crate::interrupt::nan_step_from_env(),
            resumed_from: None,
            device: None,
            op_profiling: false,
            last_op_profile: None,
        })
    }

    /// Continues a run from a checkpoint (a checkpoint directory or a run directory). The
    /// model, recipe, data and training settings come from the checkpoint. A run directory
    /// that has no checkpoint yet (stopped or killed before its first one) but its
    /// `run.toml` and `recipe.toml` starts again from step 0 with them.
    pub fn resume(path: &Path, opts: TrainOptions) -> Result<Trainer, TrainError> {
        let ck = match checkpoint::load(path) {
            Ok(ck) => ck,
            Err(CheckpointError::NotACheckpoint(_)) if is_unstarted_run(path) => {
                let cfg = RunConfig::from_file(&path.join("run.toml"))?;
                let recipe_path = path.join("recipe.toml");
                let recipe = Recipe::from_file(&recipe_path)
                    .map_err(|e| TrainError::Config(format!("{}: {e}", recipe_path.display())))?;
                let mut tr = Trainer::new(cfg, recipe, opts)?;
                tr.resumed_from = Some(path.to_path_buf());
                return Ok(tr);
            }
            Err(e) => return Err(e.into()),
        };
        let st = &ck.state;
        let cfg = RunConfig {
            model: st.model.clone(),
            train: st.train.clone(),
            data: st.data.clone(),
        };
        cfg.validate()?;
        cfg.check_memory()?;
        let bad = |message: String| {
            TrainError::Checkpoint(CheckpointError::BadState {
                path: ck.dir.join(checkpoint::STATE_FILE),
                message,
            })
        };
        // The recipe comes from outside bytes too: validated as a fresh run's is.
        st.recipe
            .validate()
            .map_err(|e| bad(format!("recipe: {e}")))?;
        let b = &st.batcher.config;
        if b.batch != cfg.train.batch
            || b.seq != cfg.model.seq
            || b.seed != cfg.train.seed
            || b.sampling != Sampling::Random
        {
            return Err(bad(format!(
                "batcher {b:?} does not match train.batch {}, model.seq {}, train.seed {}",
                cfg.train.batch, cfg.model.seq, cfg.train.seed
            )));
        }
        if st.step > cfg.train.steps
            || st.step.checked_mul(cfg.tokens_per_step()) != Some(st.tokens_seen)
        {
            return Err(bad(format!(
                "step {} and tokens_seen {} do not fit a run of {} steps of {} tokens",
                st.step,
                st.tokens_seen,
                cfg.train.steps,
                cfg.tokens_per_step()
            )));
        }
        let tokens = cfg.data.load()?;
        let (train, val) = split(&tokens, cfg.train.val_fraction)?;
        let batcher = Batcher::from_state(train.clone(), &st.batcher)?;
        let mut tr = Self::build(cfg, st.recipe.clone(), opts, batcher, &train, val)?;
        ck.apply(&mut tr.ps)?;
        tr.opt.load_state(&ck.optimizer)?;
        tr.step = st.step;
        tr.tokens_seen = st.tokens_seen;
        tr.running_min = st.running_min_loss;
        tr.initial_loss = st.initial_loss;
        tr.best_val = st.best_val_loss;
        tr.last_checkpoint = Some(ck.dir.clone());
        tr.resumed_from = ck
            .dir
            .parent()
            .and_then(Path::parent)
            .map(Path::to_path_buf);
        Ok(tr)
    }

    /// Lets [`Trainer::run`] delete an existing run in its directory (its run files, see
    /// [`crate::rundir::RUN_FILES`]) instead of refusing it.
    pub fn set_overwrite(&mut self, overwrite: bool) {
        self.overwrite = overwrite;
    }

    /// Times every op of each following step, forward and backward (the graph's
    /// [`OpProfile`], summed over the step's micro-batches; see [`Trainer::last_op_profile`]).
    /// On the CPU the timer only reads the clock between ops; on a device each op first waits
    /// for its kernels (so that the times are the device's), which slows the step: off by
    /// default.
    pub fn set_op_profiling(&mut self, on: bool) {
        self.op_profiling = on;
        if !on {
            self.last_op_profile = None;
        }
    }

    /// The op timings of the last step, when [`Trainer::set_op_profiling`] is on (also of a
    /// step the divergence guard rejected; none after a step that failed). On a device each
    /// op's time includes its kernels (the graph synchronises before reading the clock).
    pub fn last_op_profile(&self) -> Option<&OpProfile> {
        self.last_op_profile.as_ref()
    }

    /// **For tests**: make the loss and one gradient NaN at `step`, to exercise the
    /// divergence guard. (The binary takes it from [`crate::interrupt::NAN_ENV`]; it is never
    /// part of a configuration or a checkpoint.)
    pub fn set_inject_nan_at_step(&mut self, step: Option<u64>) {
        self.inject_nan_at_step = step;
    }
    /// The run directory.
    pub fn out_dir(&self) -> &Path {
        &self.opts.out
    }

    /// The run's configuration.
    pub fn config(&self) -> &RunConfig {
        &self.cfg
    }

    /// The precision recipe.
    pub fn recipe(&self) -> &Recipe {
        &self.recipe
    }

    /// The model's structure (its parameters live in [`Trainer::params`]).
    pub fn model(&self) -> &Gpt {
        &self.model
    }

    /// Runs every training step on `device` (`None`: the CPU): forward, backward, the gradient
    /// norm, clipping and AdamW on the FP32 master weights, with the parameters, gradients and
    /// AdamW moments staying in device memory between steps (only the loss and the gradient
    /// norm come back each step). The norm and AdamW are optim's arithmetic bit for bit, so a
    /// device run differs from a CPU run only through its forward and backward passes.
    /// Checkpoints download the store and the moments first (the same files on either device:
    /// a checkpoint resumes on either). Evaluation runs its batches on the device too, but the
    /// first (its quantization-error probes read host values).
    ///
    /// # Errors
    /// Leaving a device mid-run downloads its store and moments first; a device error then.
    pub fn set_device(
        &mut self,
        device: Option<std::sync::Arc<autograd::backend::DeviceBackend>>,
    ) -> Result<(), TrainError> {
        self.sync_host(true)?;
        self.device = device.map(device_step::DeviceUpdate::new);
        Ok(())
    }

    /// The parameters (values, gradients, quantizer states).
    pub fn params(&self) -> &ParamStore {
        &self.ps
    }

    /// The parameters, to change them before training starts (e.g. `train --init`). Changing
    /// them mid-run makes the run's checkpoints describe a different trajectory.
    pub fn params_mut(&mut self) -> &mut ParamStore {
        &mut self.ps
    }

    /// Optimizer steps taken.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Training tokens consumed.
    pub fn tokens_seen(&self) -> u64 {
        self.tokens_seen
    }

    fn total_tokens(&self) -> u64 {
        self.cfg.train.steps * self.cfg.tokens_per_step()
    }

    fn progress(&self) -> f64 {
        self.tokens_seen as f64 / self.total_tokens().max(1) as f64
    }
    /// Writes a checkpoint of the current state into `out/checkpoints/`.
    pub fn save_checkpoint(&mut self) -> Result<PathBuf, TrainError> {
        self.sync_host(true)?;
        let mut state = TrainState {
            version: STATE_VERSION,
            step: self.step,
            tokens_seen: self.tokens_seen,
            recipe: self.recipe.clone(),
            model: self.cfg.model.clone(),
            train: self.cfg.train.clone(),
            data: self.cfg.data.clone(),
            batcher: self.batcher.state(),
            running_min_loss: self.running_min,
            initial_loss: self.initial_loss,
            best_val_loss: self.best_val,
            quant_states: checkpoint::quant_state_records(&self.ps),
            tensors_crc32: 0,
            optimizer_crc32: 0,
        };
        let dir = checkpoint::save(
            &self.opts.out.join("checkpoints"),
            &mut state,
            &self.ps.export(),
            &self.opt.save_state(),
            self.cfg.train.keep_checkpoints,
        )?;
        self.last_checkpoint = Some(dir.clone());
        Ok(dir)
    }
}

/// Whether `dir` holds a run that has written its configuration but no checkpoint yet.
fn is_unstarted_run(dir: &Path) -> bool {
    dir.join("run.toml").is_file()
        && dir.join("recipe.toml").is_file()
        && !dir
            .join("checkpoints")
            .join(checkpoint::LATEST_FILE)
            .exists()
}

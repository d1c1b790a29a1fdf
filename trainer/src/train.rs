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

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use autograd::{gemm_stream, Graph, OperandRole, ParamStore};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use optim::{AdamW, AdamWConfig, DecayShape, LrSchedule, ParamGroup, ParamSpec};
use quant::{QuantState, RngKey, Usage};
use serde::{Deserialize, Serialize};

use crate::checkpoint::{self, CheckpointError, TrainState, STATE_VERSION};
use crate::data::{split, Batcher, BatcherConfig, DataError, DataSource, Sampling, Tokens};
use crate::interrupt;
use crate::memory::{self, TooLarge};
use crate::model::{Gpt, LinearProbe, ModelConfig, ModelError, Precision};
use crate::recipe::{describe_policy, LayerKind, Recipe};
use crate::rundir::{self, RunDirError, RunLock};

/// Learning-rate schedule shape.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LrShape {
    /// Linear warmup, cosine decay to `min_lr`.
    #[default]
    Cosine,
    /// Warmup, stable, then a linear decay over the last `decay_fraction` of the steps.
    Wsd,
}

/// Training settings (serde / TOML `[train]` table).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    /// Optimizer steps.
    pub steps: u64,
    /// Rows per micro-batch.
    pub batch: usize,
    /// Micro-batches per optimizer step (gradient accumulation).
    pub grad_accum: usize,
    /// Peak learning rate.
    pub lr: f32,
    /// Final learning rate as a fraction of `lr`.
    pub min_lr_ratio: f32,
    /// Warmup steps.
    pub warmup_steps: u64,
    /// Schedule shape.
    pub lr_shape: LrShape,
    /// WSD: fraction of the steps spent decaying.
    pub decay_fraction: f64,
    /// AdamW weight decay (linear-layer matrices only).
    pub weight_decay: f32,
    /// AdamW β1.
    pub beta1: f32,
    /// AdamW β2.
    pub beta2: f32,
    /// Global gradient-norm clip.
    pub clip: f32,
    /// Evaluate (and checkpoint) every this many steps (and at the end).
    pub eval_every: u64,
    /// Validation batches per evaluation.
    pub eval_batches: usize,
    /// Fraction of the tokens held out for validation.
    pub val_fraction: f64,
    /// Seed of initialisation, batching and stochastic rounding.
    pub seed: u64,
    /// Checkpoints kept.
    pub keep_checkpoints: usize,
    /// Divergence guard: a loss above this multiple of the reference (the first step's loss
    /// during warmup, the running minimum after it) stops the run.
    pub explode_factor: f32,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            steps: 400,
            batch: 16,
            grad_accum: 1,
            lr: 3e-3,
            min_lr_ratio: 0.1,
            warmup_steps: 40,
            lr_shape: LrShape::Cosine,
            decay_fraction: 0.2,
            weight_decay: 0.1,
            beta1: 0.9,
            beta2: 0.95,
            clip: 1.0,
            eval_every: 50,
            eval_batches: 8,
            val_fraction: 0.05,
            seed: 0,
            keep_checkpoints: 2,
            explode_factor: 3.0,
        }
    }
}

/// Upper bound of `train.batch`, `train.grad_accum` and `train.eval_batches`.
pub const MAX_BATCH: usize = 1 << 20;

fn default_data() -> DataSource {
    DataSource::Corpus {
        seed: 0,
        bytes: crate::data::DEFAULT_CORPUS_BYTES,
    }
}

/// A whole run: model, training settings and data (a TOML file with `[model]`, `[train]`
/// and `[data]` tables; `[model]` may be replaced by `preset = "small"`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// Model shape.
    pub model: ModelConfig,
    /// Training settings.
    #[serde(default)]
    pub train: TrainConfig,
    /// Data source.
    #[serde(default = "default_data")]
    pub data: DataSource,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RunConfigFile {
    preset: Option<String>,
    model: Option<ModelConfig>,
    #[serde(default)]
    train: TrainConfig,
    #[serde(default = "default_data")]
    data: DataSource,
}

/// Why a run could not be set up or did not finish.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The run configuration is invalid (message says which field).
    #[error("invalid run config: {0}")]
    Config(String),
    /// Model construction or a forward/backward op failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// Data could not be loaded or batched.
    #[error(transparent)]
    Data(#[from] DataError),
    /// Optimizer error (bad hyperparameters, state of another model).
    #[error("optimizer: {0}")]
    Optim(optim::OptimError),
    /// Checkpoint error.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// Output files.
    #[error("{path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Invalid sampling settings (temperature, token count, prompt).
    #[error("invalid sampling settings: {0}")]
    Sampling(String),
    /// The run directory is locked by another process or holds another run.
    #[error(transparent)]
    RunDir(#[from] RunDirError),
    /// The run does not fit in memory (the message carries the estimate).
    #[error(transparent)]
    TooLarge(#[from] TooLarge),
    /// A stop was requested ([`crate::interrupt::request_stop`]): the run ended after a
    /// step and wrote a checkpoint.
    #[error("stopped at step {step} of {steps} on request; checkpoint written to {checkpoint}; continue with `trainer train --resume {dir}`")]
    Stopped {
        /// Steps taken.
        step: u64,
        /// The run's total steps.
        steps: u64,
        /// The checkpoint written.
        checkpoint: PathBuf,
        /// The run directory.
        dir: PathBuf,
    },
    /// The divergence guard tripped (see the module docs).
    #[error("training diverged at step {step}: {reason} (loss {loss}, grad norm {grad_norm}); non-finite gradients in: {bad_layers}; last good checkpoint: {last_checkpoint}")]
    Diverged {
        /// The step.
        step: u64,
        /// Why.
        reason: String,
        /// Its training loss.
        loss: f32,
        /// Its gradient norm.
        grad_norm: f32,
        /// Parameters with non-finite gradients (comma-separated, or `none`).
        bad_layers: String,
        /// The last checkpoint written (or `none`).
        last_checkpoint: String,
    },
}

// Not `#[from]`: the message already carries the optimizer's, and a `source()` as well
// would make chain printers (anyhow's `{:#}`) repeat it.
impl From<optim::OptimError> for TrainError {
    fn from(e: optim::OptimError) -> Self {
        TrainError::Optim(e)
    }
}

impl From<autograd::Error> for TrainError {
    fn from(e: autograd::Error) -> Self {
        TrainError::Model(ModelError::Autograd(e))
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl RunConfig {
    /// A preset model with default training settings on the default corpus.
    pub fn preset(name: &str) -> Result<RunConfig, TrainError> {
        Ok(RunConfig {
            model: ModelConfig::preset(name)?,
            train: TrainConfig::default(),
            data: default_data(),
        })
    }

    /// Parses a run TOML (`preset = "..."` or a `[model]` table, plus optional `[train]`
    /// and `[data]`).
    pub fn from_toml_str(text: &str) -> Result<RunConfig, TrainError> {
        let f: RunConfigFile =
            toml::from_str(text).map_err(|e| TrainError::Config(e.to_string()))?;
        let model = match (f.preset, f.model) {
            (Some(_), Some(_)) => {
                return Err(TrainError::Config(
                    "give either `preset` or a [model] table, not both".into(),
                ))
            }
            (Some(p), None) => ModelConfig::preset(&p)?,
            (None, Some(m)) => m,
            (None, None) => {
                return Err(TrainError::Config(
                    "missing `preset = \"NAME\"` or a [model] table".into(),
                ))
            }
        };
        let cfg = RunConfig {
            model,
            train: f.train,
            data: f.data,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads a run TOML file.
    pub fn from_file(path: &Path) -> Result<RunConfig, TrainError> {
        let text = fs::read_to_string(path).map_err(io_err(path))?;
        Self::from_toml_str(&text).map_err(|e| match e {
            TrainError::Config(m) => TrainError::Config(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    /// As TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_default()
    }

    /// Checks everything that can be checked without data.
    pub fn validate(&self) -> Result<(), TrainError> {
        self.model.validate()?;
        let t = &self.train;
        let bad = |m: String| Err(TrainError::Config(m));
        if t.steps == 0 || t.batch == 0 || t.grad_accum == 0 {
            return bad("train.steps, train.batch and train.grad_accum must be positive".into());
        }
        if t.batch > MAX_BATCH || t.grad_accum > MAX_BATCH || t.eval_batches > MAX_BATCH {
            return bad(format!(
                "train.batch ({}), train.grad_accum ({}) and train.eval_batches ({}) must be at most {MAX_BATCH}",
                t.batch, t.grad_accum, t.eval_batches
            ));
        }
        if self.total_tokens_checked().is_none() {
            return bad(format!(
                "train.steps ({}) x train.batch ({}) x train.grad_accum ({}) x model.seq ({}) tokens overflow a 64-bit count",
                t.steps, t.batch, t.grad_accum, self.model.seq
            ));
        }
        if !(t.lr.is_finite() && t.lr > 0.0 && (0.0..=1.0).contains(&t.min_lr_ratio)) {
            return bad(format!(
                "train.lr ({}) must be > 0 and train.min_lr_ratio ({}) in [0, 1]",
                t.lr, t.min_lr_ratio
            ));
        }
        if t.warmup_steps > t.steps {
            return bad(format!(
                "train.warmup_steps ({}) exceeds train.steps ({})",
                t.warmup_steps, t.steps
            ));
        }
        if !(0.0..1.0).contains(&t.val_fraction) || t.val_fraction <= 0.0 {
            return bad(format!(
                "train.val_fraction ({}) must be in (0, 1)",
                t.val_fraction
            ));
        }
        if !(0.0..=1.0).contains(&t.decay_fraction) {
            return bad(format!(
                "train.decay_fraction ({}) must be in [0, 1]",
                t.decay_fraction
            ));
        }
        if t.clip.is_nan() || t.clip <= 0.0 || t.explode_factor.is_nan() || t.explode_factor <= 1.0
        {
            return bad("train.clip must be > 0 and train.explode_factor > 1".into());
        }
        if t.eval_every == 0 || t.eval_batches == 0 {
            return bad("train.eval_every and train.eval_batches must be positive".into());
        }
        if self.data.vocab_size() as usize > self.model.vocab {
            return bad(format!(
                "the data's vocabulary ({}) is larger than model.vocab ({})",
                self.data.vocab_size(),
                self.model.vocab
            ));
        }
        Ok(())
    }

    /// Tokens per optimizer step.
    pub fn tokens_per_step(&self) -> u64 {
        (self.train.batch as u64)
            .saturating_mul(self.train.grad_accum as u64)
            .saturating_mul(self.model.seq as u64)
    }

    fn total_tokens_checked(&self) -> Option<u64> {
        (self.train.batch as u64)
            .checked_mul(self.train.grad_accum as u64)?
            .checked_mul(self.model.seq as u64)?
            .checked_mul(self.train.steps)
    }

    /// Estimated peak memory of the run in bytes: parameters with their gradients, AdamW
    /// moments and checkpoint copies; one micro-batch's activations (per block: the saved
    /// inputs of the norms, linear layers and MLP, the attention scores and probabilities;
    /// the logits and their gradient); the data (5 bytes per byte of the generated corpus).
    /// An estimate to refuse what cannot fit, not a measurement.
    pub fn memory_estimate(&self) -> u128 {
        let m = &self.model;
        let w = |v: usize| v as u128;
        let params = w(m.num_params()) * 32;
        let rows = w(self.train.batch);
        let tokens = rows * w(m.seq);
        let per_block = tokens * (16 * w(m.d_model) + 8 * w(m.hidden)) * 4
            + rows * w(m.n_heads) * w(m.seq) * w(m.seq) * 4 * 3;
        let head = tokens * (w(m.vocab) * 4 + w(m.d_model) * 4) * 4;
        let data = match &self.data {
            DataSource::Corpus { bytes, .. } => crate::data::corpus_memory(*bytes),
            _ => 0,
        };
        params + w(m.n_layers) * per_block + head + data
    }

    /// Refuses a run whose [`RunConfig::memory_estimate`] exceeds the memory available
    /// ([`TrainError::TooLarge`], with the estimate).
    pub fn check_memory(&self) -> Result<(), TrainError> {
        memory::check(
            &format!(
                "this run ({} parameters, batch {} x seq {})",
                self.model.num_params(),
                self.train.batch,
                self.model.seq
            ),
            self.memory_estimate(),
        )?;
        Ok(())
    }

    fn schedule(&self) -> Result<LrSchedule, TrainError> {
        let t = &self.train;
        let min = t.lr * t.min_lr_ratio;
        Ok(match t.lr_shape {
            LrShape::Cosine => LrSchedule::warmup_cosine(t.lr, min, t.warmup_steps, t.steps)?,
            LrShape::Wsd => {
                let decay = ((t.steps as f64 * t.decay_fraction).round() as u64)
                    .min(t.steps - t.warmup_steps);
                LrSchedule::wsd(
                    t.lr,
                    min,
                    t.warmup_steps,
                    decay,
                    t.steps,
                    DecayShape::Linear,
                )?
            }
        })
    }
}

/// Quantization error of one operand (from `quant::stats::operand_error`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OperandError {
    /// SQNR in dB (`None` when exact).
    pub sqnr_db: Option<f64>,
    /// Mean signed error relative to the mean magnitude.
    pub bias: f64,
    /// Fraction clipped at the format maximum.
    pub clipped: f64,
    /// Fraction of non-zeros flushed to zero.
    pub flushed: f64,
}

/// Per-layer quantization error of the Fprop operands at an evaluation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerError {
    /// Layer name (`blocks.0.attn.qkv`, `lm_head`).
    pub layer: String,
    /// Layer kind.
    pub kind: LayerKind,
    /// Policy in words.
    pub policy: String,
    /// Whether any operand of the policy is quantized below BF16 (absent in records written
    /// before it was recorded; see [`LayerError::is_quantized`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantized: Option<bool>,
    /// Activations X (rowwise, first rows of the first validation batch).
    pub x: OperandError,
    /// Weights W (rowwise).
    pub w: OperandError,
}

impl LayerError {
    /// Whether any operand of the layer's policy is quantized below BF16. Records written
    /// before the flag existed are judged by their policy's description ("all bf16...",
    /// "all f32..." are not quantized).
    pub fn is_quantized(&self) -> bool {
        self.quantized.unwrap_or_else(|| {
            !["all bf16", "all f32", "all fp32"]
                .iter()
                .any(|p| self.policy.starts_with(p))
        })
    }
}

/// What a run reports at its end, kept up to date while it trains: the latest training and
/// validation losses, and the layer statistics of the latest evaluation that saw a quantized
/// layer (with its step).
struct LastSeen {
    train_loss: f32,
    layers: Vec<LayerError>,
    val_loss: f32,
    layers_step: u64,
}

/// One line of `metrics.jsonl`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    /// Optimizer steps taken (1 after the first).
    pub step: u64,
    /// Training tokens consumed.
    pub tokens: u64,
    /// Mean training loss of the step's micro-batches.
    pub train_loss: f32,
    /// Validation loss (evaluation steps only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_loss: Option<f32>,
    /// Learning rate used.
    pub lr: f32,
    /// Gradient norm before clipping.
    pub grad_norm: f32,
    /// Training throughput of this step.
    pub tokens_per_s: f64,
    /// Training progress (fraction of tokens), what the recipe's schedule sees.
    pub progress: f64,
    /// Per-layer quantization error (evaluation steps only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<LayerError>,
}

/// What a finished run reports (`summary.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    /// Recipe name.
    pub recipe: String,
    /// Steps.
    pub steps: u64,
    /// Training tokens.
    pub tokens: u64,
    /// Model parameters.
    pub params: usize,
    /// Final validation loss.
    pub final_val_loss: f32,
    /// Last training loss.
    pub final_train_loss: f32,
    /// Unigram entropy of the training split (nats), the "learned nothing but frequencies"
    /// baseline.
    pub unigram_nats: f64,
    /// Wall time of this process's part of the run (seconds).
    pub wall_s: f64,
    /// Mean training throughput.
    pub tokens_per_s: f64,
    /// Per-layer quantization error at the last evaluation that had a quantized layer.
    pub layers: Vec<LayerError>,
    /// The step of `layers`.
    pub layers_step: u64,
    /// Run directory.
    pub out_dir: PathBuf,
    /// Last checkpoint.
    pub checkpoint: PathBuf,
}

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

/// A training run in progress.
pub struct Trainer {
    /// Run configuration.
    pub cfg: RunConfig,
    /// Recipe.
    pub recipe: Recipe,
    /// Parameters.
    pub ps: ParamStore,
    /// The model.
    pub model: Gpt,
    opt: AdamW,
    schedule: LrSchedule,
    batcher: Batcher,
    val: Tokens,
    unigram_nats: f64,
    /// Optimizer steps taken.
    pub step: u64,
    /// Training tokens consumed.
    pub tokens_seen: u64,
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
}

fn param_layout(ps: &ParamStore, model: &Gpt) -> Vec<ParamSpec> {
    ps.ids()
        .map(|id| {
            let len = ps.value(id).map(|v| v.len()).unwrap_or(0);
            ParamSpec::new(len, if model.decays(id) { 0 } else { 1 })
        })
        .collect()
}

fn error_of(s: &fp_formats::stats::ErrorStats) -> OperandError {
    OperandError {
        sqnr_db: s.sqnr_db.is_finite().then_some(s.sqnr_db),
        bias: if s.relative_bias.is_finite() {
            s.relative_bias
        } else {
            0.0
        },
        clipped: s.clipped_fraction,
        flushed: s.flushed_fraction,
    }
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

    /// **For tests**: make the loss and one gradient NaN at `step`, to exercise the
    /// divergence guard. (The binary takes it from [`crate::interrupt::NAN_ENV`]; it is never
    /// part of a configuration or a checkpoint.)
    pub fn set_inject_nan_at_step(&mut self, step: Option<u64>) {
        self.inject_nan_at_step = step;
    }

    /// The guard's reference loss: the first step's loss during warmup, the running
    /// minimum after it.
    fn guard_reference(&self) -> Option<(f32, &'static str)> {
        if self.step < self.cfg.train.warmup_steps {
            self.initial_loss
                .or(self.running_min)
                .map(|l| (l, "the first step's loss"))
        } else {
            self.running_min.map(|l| (l, "the running minimum"))
        }
    }

    /// The run directory.
    pub fn opts_out(&self) -> &Path {
        &self.opts.out
    }

    fn total_tokens(&self) -> u64 {
        self.cfg.train.steps * self.cfg.tokens_per_step()
    }

    fn progress(&self) -> f64 {
        self.tokens_seen as f64 / self.total_tokens().max(1) as f64
    }

    /// Validation loss over `eval_batches` sequential batches (the same windows every time),
    /// and the per-layer quantization error of the first batch's Fprop operands.
    pub fn evaluate(&mut self) -> Result<(f32, Vec<LayerError>), TrainError> {
        let mut vb = Batcher::new(
            self.val.clone(),
            BatcherConfig {
                batch: self.cfg.train.batch,
                seq: self.cfg.model.seq,
                sampling: Sampling::Sequential,
                seed: 0,
            },
        )?;
        let prec_progress = self.progress();
        let mut total = 0.0f64;
        let mut probes: Vec<LinearProbe> = Vec::new();
        let n = self.cfg.train.eval_batches;
        for i in 0..n {
            let b = vb.next_batch();
            let mut g = Graph::new(&mut self.ps).with_rng(self.cfg.train.seed, self.step);
            g.set_grad_enabled(false);
            let prec = Precision {
                recipe: &self.recipe,
                progress: prec_progress,
            };
            let probe = (i == 0).then_some(&mut probes);
            let loss = self
                .model
                .loss(&mut g, &b.inputs, &b.targets, b.batch, &prec, probe)?;
            total += g.item(loss)? as f64;
        }
        let layers = self.layer_errors(&probes)?;
        Ok(((total / n as f64) as f32, layers))
    }

    fn layer_errors(&self, probes: &[LinearProbe]) -> Result<Vec<LayerError>, TrainError> {
        let seed = self.cfg.train.seed;
        let mut out = Vec::with_capacity(probes.len());
        for p in probes {
            let st = self.ps.linear_state(p.weight)?;
            let state_of = |role: OperandRole| {
                st.map(|s| s.operand(role).clone())
                    .unwrap_or_else(QuantState::new)
            };
            let key = |role| -> Result<RngKey, TrainError> {
                Ok(RngKey {
                    seed,
                    stream: gemm_stream(p.stream, role, self.step)?,
                })
            };
            let qerr = |e: quant::QuantError| TrainError::Model(ModelError::Autograd(e.into()));
            let x = quant::stats::operand_error(
                &p.x,
                p.rows,
                p.cols,
                Usage::Rowwise,
                &p.policy.fprop.a,
                key(OperandRole::FpropX)?,
                &mut state_of(OperandRole::FpropX),
            )
            .map_err(qerr)?;
            let w = self.ps.value(p.weight)?;
            let rows = w.len() / p.cols;
            let w = quant::stats::operand_error(
                w,
                rows,
                p.cols,
                Usage::Rowwise,
                &p.policy.fprop.b,
                key(OperandRole::FpropW)?,
                &mut state_of(OperandRole::FpropW),
            )
            .map_err(qerr)?;
            out.push(LayerError {
                layer: p.name.clone(),
                kind: p.kind,
                policy: describe_policy(&p.policy),
                quantized: Some(p.policy.quantizes()),
                x: error_of(&x),
                w: error_of(&w),
            });
        }
        Ok(out)
    }

    fn bad_layers(&self) -> String {
        let bad: Vec<String> = self
            .ps
            .ids()
            .filter(|&id| {
                self.ps
                    .grad(id)
                    .map(|g| g.iter().any(|v| !v.is_finite()))
                    .unwrap_or(false)
            })
            .filter_map(|id| self.ps.name(id).ok().map(str::to_string))
            .collect();
        if bad.is_empty() {
            "none".into()
        } else {
            bad.join(", ")
        }
    }

    /// One optimizer step (every micro-batch's forward and backward, clipping, AdamW):
    /// returns (mean training loss, pre-clip grad norm, lr), or the divergence error (nothing
    /// applied). [`Trainer::run`] calls it in its loop; benchmarks call it directly. It writes
    /// nothing to disk.
    pub fn train_step(&mut self) -> Result<(f32, f32, f32), TrainError> {
        let accum = self.cfg.train.grad_accum;
        let progress = self.progress();
        let mut loss_sum = 0.0f64;
        for _ in 0..accum {
            let b = self.batcher.next_batch();
            let mut g = Graph::new(&mut self.ps).with_rng(self.cfg.train.seed, self.step);
            let prec = Precision {
                recipe: &self.recipe,
                progress,
            };
            let loss = self
                .model
                .loss(&mut g, &b.inputs, &b.targets, b.batch, &prec, None)?;
            loss_sum += g.item(loss)? as f64;
            let scaled = if accum > 1 {
                g.scale(loss, 1.0 / accum as f32)?
            } else {
                loss
            };
            g.backward(scaled)?;
        }
        let mut loss = (loss_sum / accum as f64) as f32;
        let step_no = self.step + 1;
        if self.inject_nan_at_step == Some(step_no) {
            loss = f32::NAN;
            let id = self.model.blocks[0].qkv;
            if let Some(v) = self.ps.grad_mut(id)?.first_mut() {
                *v = f32::NAN;
            }
        }
        let grad_norm = optim::grad_norm(&self.ps.grads());
        let lr = self.schedule.lr(self.step);
        let diverged = |reason: String, me: &Self| TrainError::Diverged {
            step: step_no,
            reason,
            loss,
            grad_norm,
            bad_layers: me.bad_layers(),
            last_checkpoint: me
                .last_checkpoint
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "none".into()),
        };
        if !loss.is_finite() || !grad_norm.is_finite() {
            return Err(diverged("non-finite loss or gradient norm".into(), self));
        }
        if let Some((m, what)) = self.guard_reference() {
            if loss > self.cfg.train.explode_factor * m {
                return Err(diverged(
                    format!(
                        "loss exploded above {}x {what} {m}",
                        self.cfg.train.explode_factor
                    ),
                    self,
                ));
            }
        }
        let coef = optim::clip_coefficient(grad_norm, self.cfg.train.clip)?;
        let (values, grads) = self.ps.params_and_grads();
        let mut values = values;
        self.opt.step_scaled(&mut values, &grads, lr, coef)?;
        self.ps.end_quant_step()?;
        self.ps.zero_grad();
        self.step = step_no;
        self.tokens_seen += self.cfg.tokens_per_step();
        self.running_min = Some(self.running_min.map_or(loss, |m| m.min(loss)));
        self.initial_loss.get_or_insert(loss);
        Ok((loss, grad_norm, lr))
    }

    /// Writes a checkpoint of the current state into `out/checkpoints/`.
    pub fn save_checkpoint(&mut self) -> Result<PathBuf, TrainError> {
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

    /// Runs to the end (or to `stop_after` steps in this process), evaluating and
    /// checkpointing every `eval_every` steps and at the end.
    ///
    /// Holds the run directory's lock throughout ([`TrainError::RunDir`] when another
    /// process holds it); a new run refuses a directory that holds another run unless
    /// [`Trainer::set_overwrite`]; a stop request ends the run after the current step with a
    /// checkpoint ([`TrainError::Stopped`]). A run that already finished returns its
    /// `summary.json` unchanged.
    pub fn run(&mut self) -> Result<RunSummary, TrainError> {
        let out = self.opts.out.clone();
        let _lock = RunLock::acquire(&out)?;
        let same_dir = |a: &Path, b: &Path| match (fs::canonicalize(a), fs::canonicalize(b)) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        };
        let continues_here = self
            .resumed_from
            .as_deref()
            .is_some_and(|d| same_dir(d, &out));
        if !continues_here {
            rundir::prepare_fresh(&out, self.overwrite)?;
        }
        rundir::remove_leftovers(&out.join("checkpoints"))?;
        rundir::remove_atomic_leftovers(&out)?;
        let write = |name: &str, text: String| -> Result<(), TrainError> {
            let p = out.join(name);
            rundir::write_atomic(&p, text.as_bytes()).map_err(io_err(&p))
        };
        let total = self.cfg.train.steps;
        if self.step >= total {
            let p = out.join("summary.json");
            if let Some(s) = fs::read_to_string(&p)
                .ok()
                .and_then(|t| serde_json::from_str::<RunSummary>(&t).ok())
            {
                return Ok(s);
            }
        }
        write("run.toml", self.cfg.to_toml())?;
        write("recipe.toml", self.recipe.to_toml())?;
        // metrics: keep the lines up to the current step (resume), then append
        let mpath = out.join("metrics.jsonl");
        let mut kept = String::new();
        if self.step > 0 {
            if let Ok(old) = fs::read_to_string(&mpath) {
                for line in old.lines() {
                    if let Ok(m) = serde_json::from_str::<StepMetrics>(line) {
                        if m.step <= self.step {
                            kept.push_str(line);
                            kept.push('\n');
                        }
                    }
                }
            }
        }
        rundir::write_atomic(&mpath, kept.as_bytes()).map_err(io_err(&mpath))?;
        let mut metrics = fs::OpenOptions::new()
            .append(true)
            .open(&mpath)
            .map_err(io_err(&mpath))?;

        let bar = if self.opts.quiet {
            ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden())
        } else {
            ProgressBar::new(total)
        };
        bar.set_style(
            ProgressStyle::with_template(
                "{prefix} [{elapsed_precise}] {bar:30} {pos}/{len} {msg} ETA {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_prefix(self.recipe.name.clone());
        bar.set_position(self.step);
        let start = Instant::now();
        let start_tokens = self.tokens_seen;
        let mut last = LastSeen {
            train_loss: f32::NAN,
            layers: Vec::new(),
            val_loss: f32::NAN,
            layers_step: 0,
        };
        let stop_at = self
            .opts
            .stop_after
            .map_or(total, |s| (self.step + s).min(total));
        let diverged = |e: TrainError, bar: &ProgressBar| {
            bar.abandon();
            let _ = write("diagnosis.txt", format!("{e}\n"));
            e
        };
        while self.step < stop_at {
            let t0 = Instant::now();
            let (loss, grad_norm, lr) = match self.train_step() {
                Ok(v) => v,
                Err(e @ TrainError::Diverged { .. }) => return Err(diverged(e, &bar)),
                Err(e) => return Err(e),
            };
            interrupt::hook("step");
            let dt = t0.elapsed().as_secs_f64();
            let tps = self.cfg.tokens_per_step() as f64 / dt.max(1e-9);
            let eval_now = self.step % self.cfg.train.eval_every == 0 || self.step == total;
            let (val_loss, layers) = if eval_now {
                let (v, l) = self.evaluate()?;
                (Some(v), l)
            } else {
                (None, Vec::new())
            };
            let m = StepMetrics {
                step: self.step,
                tokens: self.tokens_seen,
                train_loss: loss,
                val_loss,
                lr,
                grad_norm,
                tokens_per_s: tps,
                progress: self.progress(),
                layers,
            };
            let mut line = serde_json::to_string(&m).unwrap_or_default();
            line.push('\n');
            // one write call per line: a concurrent reader never sees half a line
            metrics.write_all(line.as_bytes()).map_err(io_err(&mpath))?;
            if let Some(v) = val_loss {
                if let Err(e) = self.judge_validation(v, loss, grad_norm) {
                    return Err(diverged(e, &bar));
                }
                last.val_loss = v;
                // keep the last statistics that saw a quantized layer (a recipe's late
                // switch to BF16 would otherwise leave only BF16 layers to report)
                let any_quantized = m.layers.iter().any(LayerError::is_quantized);
                let kept_quantized = last.layers.iter().any(LayerError::is_quantized);
                if any_quantized || !kept_quantized {
                    last.layers = m.layers.clone();
                    last.layers_step = m.step;
                }
                self.save_checkpoint()?;
            }
            last.train_loss = loss;
            let el = start.elapsed().as_secs_f64();
            let avg = (self.tokens_seen - start_tokens) as f64 / el.max(1e-9);
            bar.set_message(format!(
                "loss {loss:.4} val {} {avg:.0} tok/s",
                if last.val_loss.is_nan() {
                    "-".to_string()
                } else {
                    format!("{:.4}", last.val_loss)
                }
            ));
            bar.set_position(self.step);
            if interrupt::stop_requested() && self.step < total {
                bar.abandon();
                let checkpoint = match &self.last_checkpoint {
                    Some(p) if p.ends_with(checkpoint::step_dir_name(self.step)) => p.clone(),
                    _ => self.save_checkpoint()?,
                };
                return Err(TrainError::Stopped {
                    step: self.step,
                    steps: total,
                    checkpoint,
                    dir: out.clone(),
                });
            }
        }
        bar.finish();
        let saved_here = self
            .last_checkpoint
            .as_ref()
            .is_some_and(|p| p.ends_with(checkpoint::step_dir_name(self.step)));
        if self.step < total && !saved_here {
            // stopped early between evaluations: checkpoint anyway
            self.save_checkpoint()?;
        }
        if last.val_loss.is_nan() {
            // nothing evaluated in this process (e.g. resuming a finished run)
            let (v, l) = self.evaluate()?;
            let prev_train = kept
                .lines()
                .last()
                .and_then(|l| serde_json::from_str::<StepMetrics>(l).ok())
                .map_or(f32::NAN, |m| m.train_loss);
            last = LastSeen {
                train_loss: prev_train,
                layers: l,
                val_loss: v,
                layers_step: self.step,
            };
        }
        let mut wall_s = start.elapsed().as_secs_f64();
        let mut tokens_per_s = (self.tokens_seen - start_tokens) as f64 / wall_s.max(1e-9);
        if self.tokens_seen == start_tokens {
            // nothing trained in this process (killed after its last checkpoint, before the
            // summary): the training time and throughput of the recorded steps
            let per_step = self.cfg.tokens_per_step() as f64;
            let (tokens, secs) = kept
                .lines()
                .filter_map(|l| serde_json::from_str::<StepMetrics>(l).ok())
                .filter(|m| m.tokens_per_s > 0.0 && m.tokens_per_s.is_finite())
                .fold((0.0, 0.0), |(t, s), m| {
                    (t + per_step, s + per_step / m.tokens_per_s)
                });
            if secs > 0.0 {
                wall_s = secs;
                tokens_per_s = tokens / secs;
            }
        }
        let summary = RunSummary {
            recipe: self.recipe.name.clone(),
            steps: self.step,
            tokens: self.tokens_seen,
            params: self.ps.num_elements(),
            final_val_loss: last.val_loss,
            final_train_loss: last.train_loss,
            unigram_nats: self.unigram_nats,
            wall_s,
            tokens_per_s,
            layers: last.layers,
            layers_step: last.layers_step,
            out_dir: out.clone(),
            checkpoint: self.last_checkpoint.clone().unwrap_or_default(),
        };
        if self.step == total {
            write(
                "summary.json",
                serde_json::to_string_pretty(&summary).unwrap_or_default(),
            )?;
        }
        Ok(summary)
    }

    /// The guard applied to the parameters about to be checkpointed: a validation loss that
    /// is not finite or above `explode_factor` times the reference is a divergence, and the
    /// checkpoint is not written.
    ///
    /// The reference is the smaller of the first step's loss and the best validation loss so
    /// far (before the first evaluation: the training guard's reference). Validation is not
    /// compared with the training loss once it has a history of its own, so that a model
    /// that overfits (validation well above training) is not taken for a diverged one.
    fn judge_validation(
        &mut self,
        val_loss: f32,
        loss: f32,
        grad_norm: f32,
    ) -> Result<(), TrainError> {
        let reference = match (self.best_val, self.initial_loss) {
            (Some(b), Some(i)) if i < b => Some((i, "the first step's loss")),
            (Some(b), _) => Some((b, "the best validation loss")),
            (None, _) => self.guard_reference(),
        };
        let reason = if !val_loss.is_finite() {
            Some("non-finite validation loss".to_string())
        } else {
            reference.and_then(|(m, what)| {
                (val_loss > self.cfg.train.explode_factor * m).then(|| {
                    format!(
                        "validation loss {val_loss} above {}x {what} {m}",
                        self.cfg.train.explode_factor
                    )
                })
            })
        };
        if reason.is_none() {
            self.best_val = Some(self.best_val.map_or(val_loss, |b| b.min(val_loss)));
        }
        match reason {
            None => Ok(()),
            Some(reason) => Err(TrainError::Diverged {
                step: self.step,
                reason: format!("{reason}; the parameters after this step were not saved"),
                loss,
                grad_norm,
                bad_layers: "none".into(),
                last_checkpoint: self
                    .last_checkpoint
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| "none".into()),
            }),
        }
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

/// Reads `metrics.jsonl`.
pub fn read_metrics(path: &Path) -> Result<Vec<StepMetrics>, TrainError> {
    let text = fs::read_to_string(path).map_err(io_err(path))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l)
                .map_err(|e| TrainError::Config(format!("{}:{}: {e}", path.display(), i + 1)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Trainer {
        let cfg = RunConfig::from_toml_str(
            "[model]\nvocab = 256\nd_model = 32\nn_layers = 1\nn_heads = 2\nhidden = 64\nseq = 16\n\
             [train]\nsteps = 200\nbatch = 2\nwarmup_steps = 10\n\
             [data]\nkind = \"corpus\"\nseed = 0\nbytes = 5000\n",
        )
        .unwrap();
        Trainer::new(
            cfg,
            Recipe::builtin("bf16").unwrap(),
            TrainOptions::default(),
        )
        .unwrap()
    }

    #[test]
    fn validation_is_judged_against_its_own_history_and_the_first_loss() {
        let mut tr = tiny();
        // in warmup, before any evaluation: against the first step's loss
        tr.step = 5;
        tr.initial_loss = Some(5.5);
        tr.running_min = Some(5.0);
        assert!(tr.judge_validation(17.0, 5.0, 1.0).is_err());
        assert_eq!(tr.best_val, None, "a failed evaluation is not a reference");
        tr.judge_validation(10.0, 5.0, 1.0).unwrap();
        assert_eq!(tr.best_val, Some(10.0));
        // the first step's loss stays an upper reference
        let e = tr.judge_validation(17.0, 5.0, 1.0).unwrap_err().to_string();
        assert!(e.contains("3x the first step's loss 5.5"), "{e}");
        // after warmup an overfitting model (validation 3.5x the training minimum, but
        // close to its best validation loss) is not a divergence
        tr.step = 100;
        tr.best_val = Some(1.0);
        tr.running_min = Some(0.2);
        tr.judge_validation(2.5, 0.2, 1.0).unwrap();
        let e = tr.judge_validation(3.5, 0.2, 1.0).unwrap_err().to_string();
        assert!(e.contains("3x the best validation loss 1"), "{e}");
        assert!(tr.judge_validation(f32::NAN, 0.2, 1.0).is_err());
    }
}

//! The run's configuration as data: the model shape, the training settings and the data
//! source (`run.toml`), their validation, and the memory estimate checked before anything is
//! allocated. Nothing here touches a model or a file other than the TOML it reads.

use std::fs;
use std::path::{Path, PathBuf};

use optim::{DecayShape, LrSchedule};
use serde::{Deserialize, Serialize};

use crate::data::DataSource;
use crate::memory::{self, TooLarge};
use crate::model::{ModelConfig, ModelError};

/// Why a run configuration is invalid or could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A field is out of range or the TOML does not parse (the message says which).
    #[error("invalid run config: {0}")]
    Invalid(String),
    /// The model shape is invalid.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The configuration file could not be read.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        error: std::io::Error,
    },
    /// The run does not fit in memory (the message carries the estimate).
    #[error(transparent)]
    TooLarge(#[from] TooLarge),
    /// The learning-rate schedule rejects the settings.
    #[error("optimizer: {0}")]
    Schedule(optim::OptimError),
}

// Not `#[from]`: the message already carries the optimizer's (see `TrainError::Optim`).
impl From<optim::OptimError> for ConfigError {
    fn from(e: optim::OptimError) -> Self {
        ConfigError::Schedule(e)
    }
}

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

/// The default data source: the embedded corpus generator, seed 0.
pub(crate) fn default_data() -> DataSource {
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

impl RunConfig {
    /// A preset model with default training settings on the default corpus.
    pub fn preset(name: &str) -> Result<RunConfig, ConfigError> {
        Ok(RunConfig {
            model: ModelConfig::preset(name)?,
            train: TrainConfig::default(),
            data: default_data(),
        })
    }

    /// Parses a run TOML (`preset = "..."` or a `[model]` table, plus optional `[train]`
    /// and `[data]`).
    pub fn from_toml_str(text: &str) -> Result<RunConfig, ConfigError> {
        let f: RunConfigFile =
            toml::from_str(text).map_err(|e| ConfigError::Invalid(e.to_string()))?;
        let model = match (f.preset, f.model) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::Invalid(
                    "give either `preset` or a [model] table, not both".into(),
                ))
            }
            (Some(p), None) => ModelConfig::preset(&p)?,
            (None, Some(m)) => m,
            (None, None) => {
                return Err(ConfigError::Invalid(
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
    pub fn from_file(path: &Path) -> Result<RunConfig, ConfigError> {
        let text = fs::read_to_string(path).map_err(|error| ConfigError::Io {
            path: path.to_path_buf(),
            error,
        })?;
        Self::from_toml_str(&text).map_err(|e| match e {
            ConfigError::Invalid(m) => ConfigError::Invalid(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    /// As TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_default()
    }

    /// Checks everything that can be checked without data.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.model.validate()?;
        let t = &self.train;
        let bad = |m: String| Err(ConfigError::Invalid(m));
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
    /// ([`ConfigError::TooLarge`], with the estimate).
    pub fn check_memory(&self) -> Result<(), ConfigError> {
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

    /// The learning-rate schedule these settings describe.
    pub fn schedule(&self) -> Result<LrSchedule, ConfigError> {
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

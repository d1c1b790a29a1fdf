//! [`TrainError`]: why a run could not be set up or did not finish.

use std::path::{Path, PathBuf};

use crate::checkpoint::CheckpointError;
use crate::config::ConfigError;
use crate::data::DataError;
use crate::memory::TooLarge;
use crate::model::ModelError;
use crate::rundir::RunDirError;

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
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        error: std::io::Error,
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

impl From<ConfigError> for TrainError {
    fn from(e: ConfigError) -> Self {
        match e {
            ConfigError::Invalid(m) => TrainError::Config(m),
            ConfigError::Model(e) => TrainError::Model(e),
            ConfigError::Io { path, error } => TrainError::Io { path, error },
            ConfigError::TooLarge(e) => TrainError::TooLarge(e),
            ConfigError::Schedule(e) => TrainError::Optim(e),
        }
    }
}

impl From<autograd::Error> for TrainError {
    fn from(e: autograd::Error) -> Self {
        TrainError::Model(ModelError::Autograd(e))
    }
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |error| TrainError::Io {
        path: path.to_path_buf(),
        error,
    }
}

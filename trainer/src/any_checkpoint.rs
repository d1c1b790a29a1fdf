//! The model of any Nibble checkpoint, pretraining or RL, for the commands that only read
//! a model: `sample`, `export`, `rl --from` (RL continued from an RL-tuned policy).
//!
//! A path is resolved as an RL checkpoint first (a directory holding `rl_state.json`, or an
//! RL run directory whose `checkpoints/latest` names one), then as a pretraining checkpoint
//! ([`crate::checkpoint::resolve`]). Both are loaded with their checksums verified. Resuming
//! still needs the matching kind (`train --resume`, `rl --resume`): only those restore the
//! optimizer, data cursor and random streams.

use std::path::Path;

use autograd::{NamedTensor, ParamStore};

use crate::checkpoint::{self, Checkpoint, CheckpointError};
use crate::model::ModelConfig;
use crate::rl::checkpoint::{self as rlck, RlCheckpoint, RL_STATE_FILE};

/// A loaded checkpoint of either kind.
pub enum AnyCheckpoint {
    /// A pretraining checkpoint (`state.json`).
    Pretrain(Box<Checkpoint>),
    /// An RL checkpoint (`rl_state.json`): the policy after `step` RL steps.
    Rl(Box<RlCheckpoint>),
}

impl AnyCheckpoint {
    /// Loads the checkpoint at `path` (a checkpoint directory or a run directory of either
    /// kind).
    ///
    /// ```no_run
    /// use trainer::any_checkpoint::AnyCheckpoint;
    /// let ck = AnyCheckpoint::load(std::path::Path::new("runs/rl-add"))?;
    /// println!("{} parameters after step {}", ck.tensors().len(), ck.step());
    /// # Ok::<(), trainer::checkpoint::CheckpointError>(())
    /// ```
    pub fn load(path: &Path) -> Result<AnyCheckpoint, CheckpointError> {
        match rlck::resolve(path) {
            Some(dir) => {
                let ck = rlck::load(&dir).map_err(|e| CheckpointError::BadState {
                    path: dir.join(RL_STATE_FILE),
                    message: e.to_string(),
                })?;
                ck.state
                    .model
                    .validate()
                    .map_err(|e| CheckpointError::BadState {
                        path: dir.join(RL_STATE_FILE),
                        message: e.to_string(),
                    })?;
                Ok(AnyCheckpoint::Rl(Box::new(ck)))
            }
            None => Ok(AnyCheckpoint::Pretrain(Box::new(checkpoint::load(path)?))),
        }
    }

    /// The checkpoint directory (`.../checkpoints/step-N`).
    pub fn dir(&self) -> &Path {
        match self {
            AnyCheckpoint::Pretrain(c) => &c.dir,
            AnyCheckpoint::Rl(c) => &c.dir,
        }
    }

    /// The model's shape.
    pub fn model(&self) -> &ModelConfig {
        match self {
            AnyCheckpoint::Pretrain(c) => &c.state.model,
            AnyCheckpoint::Rl(c) => &c.state.model,
        }
    }

    /// The parameters.
    pub fn tensors(&self) -> &[NamedTensor] {
        match self {
            AnyCheckpoint::Pretrain(c) => &c.tensors,
            AnyCheckpoint::Rl(c) => &c.tensors,
        }
    }

    /// Steps taken: pretraining steps, or RL steps after the starting checkpoint.
    pub fn step(&self) -> u64 {
        match self {
            AnyCheckpoint::Pretrain(c) => c.state.step,
            AnyCheckpoint::Rl(c) => c.state.step,
        }
    }

    /// What trained it last: the pretraining recipe's name, or `rl:<plan>`.
    pub fn trained_by(&self) -> String {
        match self {
            AnyCheckpoint::Pretrain(c) => c.state.recipe.name.clone(),
            AnyCheckpoint::Rl(c) => format!("rl:{}", c.state.plan.name),
        }
    }

    /// The pretraining checkpoint, when it is one.
    pub fn as_pretrain(&self) -> Option<&Checkpoint> {
        match self {
            AnyCheckpoint::Pretrain(c) => Some(c),
            AnyCheckpoint::Rl(_) => None,
        }
    }

    /// Imports the parameters (and a pretraining checkpoint's quantizer states) into `ps`
    /// (typed error when they do not fit the model built in `ps`).
    pub fn apply(&self, ps: &mut ParamStore) -> Result<(), CheckpointError> {
        match self {
            AnyCheckpoint::Pretrain(c) => c.apply(ps),
            AnyCheckpoint::Rl(c) => {
                ps.import(&c.tensors)
                    .map_err(|error| CheckpointError::Mismatch {
                        path: c.dir.join(checkpoint::TENSORS_FILE),
                        error,
                    })
            }
        }
    }
}

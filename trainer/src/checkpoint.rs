//! Checkpoints: a directory `step-NNNNNNNN/` holding
//!
//! * `model.safetensors`: every parameter as an F32 tensor under its name;
//! * `optimizer.bin`: `optim`'s versioned, CRC-checked AdamW state bytes;
//! * `state.json`: [`TrainState`]: step, tokens seen, batcher cursor and RNG, recipe, model
//!   and training configuration, data source, quantizer states (FP8 delayed-scaling
//!   histories), the loss guard's running minimum, and CRC-32s of the two binary files.
//!
//! Writing is atomic: the files go into `.tmp-step-NNNNNNNN/` (each written, fsynced), the
//! directory is fsynced and renamed to `step-NNNNNNNN/`, then the run directory's `latest`
//! file is replaced (write a temp file, fsync, rename) with the new directory's name. A crash
//! at any point leaves the previous checkpoint intact and `latest` pointing at a complete one.
//! Older checkpoints beyond the newest `keep` are removed afterwards.

use std::collections::HashMap;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use autograd::{LinearQuantState, NamedTensor, ParamStore};
use quant::QuantState;
use safetensors::tensor::{Dtype, TensorView};
use serde::{Deserialize, Serialize};

use crate::config::TrainConfig;
use crate::data::{BatcherState, DataSource};
use crate::interrupt;
use crate::model::ModelConfig;
use crate::recipe::Recipe;

/// Version of [`TrainState`]'s layout.
pub const STATE_VERSION: u32 = 1;

/// Why a checkpoint could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// File-system error.
    #[error("{path}: {error}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        error: std::io::Error,
    },
    /// Neither a checkpoint directory nor a run directory with a `latest` file.
    #[error("{0}: not a checkpoint (no state.json) and no `latest` file naming one")]
    NotACheckpoint(PathBuf),
    /// The `latest` file names a checkpoint directory that does not exist (or holds no
    /// `state.json`).
    #[error("{latest} names {target}, which is missing or incomplete; resume from another checkpoint directory (`checkpoints/step-N`) instead")]
    DanglingLatest {
        /// The `latest` file.
        latest: PathBuf,
        /// The directory it names.
        target: PathBuf,
    },
    /// `state.json` is not valid.
    #[error("{path}: bad state file: {message}")]
    BadState {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A file does not match the checksum recorded in `state.json`.
    #[error("{path}: checksum mismatch (recorded {expected:08x}, file {actual:08x}): truncated or corrupt")]
    Checksum {
        /// The file.
        path: PathBuf,
        /// CRC-32 in `state.json`.
        expected: u32,
        /// CRC-32 of the file.
        actual: u32,
    },
    /// The safetensors file is malformed or holds something else than F32 tensors.
    #[error("{path}: bad tensors file: {message}")]
    BadTensors {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The tensors do not fit the model (missing, unknown or wrong-shaped parameters).
    #[error("{path}: tensors do not fit the model: {error}")]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// What autograd said.
        error: autograd::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |error| CheckpointError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// One operand's quantizer state as stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperandStateRecord {
    /// Amax history (TE slot order).
    pub amax_history: Vec<f32>,
    /// Delayed-scaling scale.
    pub scale: f32,
    /// Last cast's amax.
    pub last_amax: f32,
    /// Last cast's scale.
    pub last_scale: f32,
}

/// One linear layer's quantizer state as stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinearStateRecord {
    /// Weight parameter name.
    pub param: String,
    /// The six operand states (Fprop X, W, Dgrad dY, W, Wgrad dY, X).
    pub operands: Vec<OperandStateRecord>,
}

/// The JSON state file of a checkpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainState {
    /// [`STATE_VERSION`].
    pub version: u32,
    /// Optimizer steps taken.
    pub step: u64,
    /// Training tokens consumed.
    pub tokens_seen: u64,
    /// The recipe (resolved).
    pub recipe: Recipe,
    /// Model shape.
    pub model: ModelConfig,
    /// Training settings.
    pub train: TrainConfig,
    /// Data source.
    pub data: DataSource,
    /// Training batcher (RNG and cursor).
    pub batcher: BatcherState,
    /// The divergence guard's running minimum of the training loss.
    pub running_min_loss: Option<f32>,
    /// The first step's training loss (the guard's reference during warmup); absent in
    /// checkpoints written before it was recorded.
    #[serde(default)]
    pub initial_loss: Option<f32>,
    /// The best validation loss so far (the guard's reference for the next evaluation);
    /// absent in checkpoints written before it was recorded.
    #[serde(default)]
    pub best_val_loss: Option<f32>,
    /// Quantizer states of the linear layers that have one.
    pub quant_states: Vec<LinearStateRecord>,
    /// CRC-32 of `model.safetensors`.
    pub tensors_crc32: u32,
    /// CRC-32 of `optimizer.bin`.
    pub optimizer_crc32: u32,
}

/// Names of the files in a checkpoint directory.
pub const TENSORS_FILE: &str = "model.safetensors";
/// Optimizer state file.
pub const OPTIMIZER_FILE: &str = "optimizer.bin";
/// JSON state file.
pub const STATE_FILE: &str = "state.json";
/// Pointer file in the run's checkpoint folder.
pub const LATEST_FILE: &str = "latest";

/// A loaded checkpoint.
#[derive(Debug)]
pub struct Checkpoint {
    /// Its directory.
    pub dir: PathBuf,
    /// The state file.
    pub state: TrainState,
    /// Parameters.
    pub tensors: Vec<NamedTensor>,
    /// Optimizer bytes.
    pub optimizer: Vec<u8>,
}

/// Serializes parameters as safetensors (F32, little-endian).
pub fn tensors_to_bytes(tensors: &[NamedTensor]) -> Result<Vec<u8>, CheckpointError> {
    let raw: Vec<Vec<u8>> = tensors
        .iter()
        .map(|t| t.data.iter().flat_map(|v| v.to_le_bytes()).collect())
        .collect();
    let views = tensors
        .iter()
        .zip(&raw)
        .map(|(t, r)| TensorView::new(Dtype::F32, t.shape.clone(), r).map(|v| (t.name.clone(), v)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CheckpointError::BadTensors {
            path: PathBuf::from(TENSORS_FILE),
            message: e.to_string(),
        })?;
    safetensors::serialize(views, None::<HashMap<String, String>>).map_err(|e| {
        CheckpointError::BadTensors {
            path: PathBuf::from(TENSORS_FILE),
            message: e.to_string(),
        }
    })
}

/// Parses safetensors bytes into F32 parameters (typed error on anything else).
pub fn tensors_from_bytes(bytes: &[u8], path: &Path) -> Result<Vec<NamedTensor>, CheckpointError> {
    let bad = |message: String| CheckpointError::BadTensors {
        path: path.to_path_buf(),
        message,
    };
    let st = safetensors::SafeTensors::deserialize(bytes).map_err(|e| bad(e.to_string()))?;
    let mut out = Vec::new();
    for (name, view) in st.tensors() {
        if view.dtype() != Dtype::F32 {
            return Err(bad(format!(
                "{name}: dtype {:?}, expected F32",
                view.dtype()
            )));
        }
        let data = view
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        out.push(NamedTensor {
            name,
            shape: view.shape().to_vec(),
            data,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Quantizer states of every linear weight of `ps` that has one.
pub fn quant_state_records(ps: &ParamStore) -> Vec<LinearStateRecord> {
    let mut v = Vec::new();
    for id in ps.ids() {
        if let (Ok(Some(s)), Ok(name)) = (ps.linear_state(id), ps.name(id)) {
            v.push(LinearStateRecord {
                param: name.to_string(),
                operands: s
                    .operands
                    .iter()
                    .map(|q| OperandStateRecord {
                        amax_history: q.amax_history().to_vec(),
                        scale: q.scale(),
                        last_amax: q.last_amax(),
                        last_scale: q.last_scale(),
                    })
                    .collect(),
            });
        }
    }
    v
}

/// Restores quantizer states into `ps` (`policy` is set again by the next forward pass).
pub fn restore_quant_states(
    ps: &mut ParamStore,
    records: &[LinearStateRecord],
    path: &Path,
) -> Result<(), CheckpointError> {
    let bad = |message: String| CheckpointError::BadState {
        path: path.to_path_buf(),
        message,
    };
    for r in records {
        let id = ps
            .id(&r.param)
            .map_err(|e| bad(format!("quant_states: {e}")))?;
        if r.operands.len() != 6 {
            return Err(bad(format!(
                "quant_states: {} has {} operand states, expected 6",
                r.param,
                r.operands.len()
            )));
        }
        let mut s = LinearQuantState::default();
        for (dst, o) in s.operands.iter_mut().zip(&r.operands) {
            *dst = QuantState::restore(o.amax_history.clone(), o.scale, o.last_amax, o.last_scale);
        }
        ps.set_linear_state(id, Some(s))
            .map_err(|e| bad(e.to_string()))?;
    }
    Ok(())
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let mut f = fs::File::create(path).map_err(io(path))?;
    f.write_all(bytes).map_err(io(path))?;
    f.sync_all().map_err(io(path))
}

fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    // Directories can be opened and fsynced on Unix; elsewhere this is best effort.
    match fs::File::open(dir) {
        Ok(f) => {
            let _ = f.sync_all();
            Ok(())
        }
        Err(e) => Err(CheckpointError::Io {
            path: dir.to_path_buf(),
            error: e,
        }),
    }
}

/// Name of the checkpoint directory of a step.
pub fn step_dir_name(step: u64) -> String {
    format!("step-{step:08}")
}

/// Writes a checkpoint under `root` (the run's `checkpoints/` folder) atomically (see the
/// module docs), points `latest` at it and keeps the newest `keep` checkpoints. Returns its
/// directory.
pub fn save(
    root: &Path,
    state: &mut TrainState,
    tensors: &[NamedTensor],
    optimizer: &[u8],
    keep: usize,
) -> Result<PathBuf, CheckpointError> {
    fs::create_dir_all(root).map_err(io(root))?;
    let name = step_dir_name(state.step);
    let tmp = root.join(format!(".tmp-{name}"));
    let latest_tmp = root.join(".latest.tmp");
    let result = publish(root, &name, &tmp, &latest_tmp, state, tensors, optimizer);
    if result.is_err() {
        // a failed write leaves nothing behind (a killed one is cleaned by the next run)
        let _ = fs::remove_dir_all(&tmp);
        let _ = fs::remove_file(&latest_tmp);
    }
    let dst = result?;
    prune(root, &name, keep)?;
    interrupt::hook("checkpoint-pruned");
    Ok(dst)
}

fn publish(
    root: &Path,
    name: &str,
    tmp: &Path,
    latest_tmp: &Path,
    state: &mut TrainState,
    tensors: &[NamedTensor],
    optimizer: &[u8],
) -> Result<PathBuf, CheckpointError> {
    if tmp.exists() {
        fs::remove_dir_all(tmp).map_err(io(tmp))?;
    }
    fs::create_dir(tmp).map_err(io(tmp))?;
    interrupt::hook("checkpoint-tmp-dir");
    let tbytes = tensors_to_bytes(tensors)?;
    state.tensors_crc32 = optim::crc32(&tbytes);
    state.optimizer_crc32 = optim::crc32(optimizer);
    write_synced(&tmp.join(TENSORS_FILE), &tbytes)?;
    interrupt::hook("checkpoint-tensors");
    write_synced(&tmp.join(OPTIMIZER_FILE), optimizer)?;
    interrupt::hook("checkpoint-optimizer");
    let json = serde_json::to_vec_pretty(state).map_err(|e| CheckpointError::BadState {
        path: tmp.join(STATE_FILE),
        message: e.to_string(),
    })?;
    write_synced(&tmp.join(STATE_FILE), &json)?;
    sync_dir(tmp)?;
    interrupt::hook("checkpoint-state");
    let dst = root.join(name);
    if dst.exists() {
        fs::remove_dir_all(&dst).map_err(io(&dst))?;
    }
    fs::rename(tmp, &dst).map_err(io(&dst))?;
    sync_dir(root)?;
    interrupt::hook("checkpoint-renamed");
    write_synced(latest_tmp, name.as_bytes())?;
    interrupt::hook("checkpoint-latest-tmp");
    let latest = root.join(LATEST_FILE);
    fs::rename(latest_tmp, &latest).map_err(io(&latest))?;
    sync_dir(root)?;
    interrupt::hook("checkpoint-latest");
    Ok(dst)
}

fn prune(root: &Path, name: &str, keep: usize) -> Result<(), CheckpointError> {
    // prune
    let mut dirs: Vec<String> = fs::read_dir(root)
        .map_err(io(root))?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("step-"))
        .collect();
    dirs.sort();
    if dirs.len() > keep.max(1) {
        for old in &dirs[..dirs.len() - keep.max(1)] {
            if *old != name {
                let _ = fs::remove_dir_all(root.join(old));
            }
        }
    }
    Ok(())
}

/// Resolves `path` to a checkpoint directory: itself if it holds `state.json`; else the
/// directory named by its `latest` file, or by `checkpoints/latest` (a run directory); a
/// `latest` file itself names the directory beside it.
pub fn resolve(path: &Path) -> Result<PathBuf, CheckpointError> {
    if path.join(STATE_FILE).is_file() {
        return Ok(path.to_path_buf());
    }
    let roots = match latest_file_parent(path) {
        Some(parent) => vec![parent],
        None => vec![path.to_path_buf(), path.join("checkpoints")],
    };
    for root in roots {
        let latest = root.join(LATEST_FILE);
        if latest.is_file() {
            let name = fs::read_to_string(&latest).map_err(io(&latest))?;
            let name = name.trim();
            let dir = root.join(name);
            let plain = !name.is_empty()
                && Path::new(name)
                    .components()
                    .all(|c| matches!(c, std::path::Component::Normal(_)));
            if plain && dir.join(STATE_FILE).is_file() {
                return Ok(dir);
            }
            return Err(CheckpointError::DanglingLatest {
                latest,
                target: dir,
            });
        }
    }
    Err(CheckpointError::NotACheckpoint(path.to_path_buf()))
}

/// The directory holding `path` when `path` is a `latest` file (`run/checkpoints/latest`).
pub fn latest_file_parent(path: &Path) -> Option<PathBuf> {
    let parent = path.parent()?;
    (path.is_file() && path.file_name()? == LATEST_FILE).then(|| parent.to_path_buf())
}

/// Loads and verifies a checkpoint (see [`resolve`] for `path`): state JSON, checksums,
/// safetensors structure. Whether the tensors fit a model is checked by [`Checkpoint::apply`].
pub fn load(path: &Path) -> Result<Checkpoint, CheckpointError> {
    let dir = resolve(path)?;
    let spath = dir.join(STATE_FILE);
    let text = fs::read(&spath).map_err(io(&spath))?;
    let state: TrainState =
        serde_json::from_slice(&text).map_err(|e| CheckpointError::BadState {
            path: spath.clone(),
            message: e.to_string(),
        })?;
    if state.version != STATE_VERSION {
        return Err(CheckpointError::BadState {
            path: spath,
            message: format!(
                "version {}, this build reads {STATE_VERSION}",
                state.version
            ),
        });
    }
    state
        .model
        .validate()
        .map_err(|e| CheckpointError::BadState {
            path: spath.clone(),
            message: e.to_string(),
        })?;
    let tpath = dir.join(TENSORS_FILE);
    let tbytes = fs::read(&tpath).map_err(io(&tpath))?;
    let crc = optim::crc32(&tbytes);
    if crc != state.tensors_crc32 {
        return Err(CheckpointError::Checksum {
            path: tpath,
            expected: state.tensors_crc32,
            actual: crc,
        });
    }
    let tensors = tensors_from_bytes(&tbytes, &tpath)?;
    let opath = dir.join(OPTIMIZER_FILE);
    let optimizer = fs::read(&opath).map_err(io(&opath))?;
    let crc = optim::crc32(&optimizer);
    if crc != state.optimizer_crc32 {
        return Err(CheckpointError::Checksum {
            path: opath,
            expected: state.optimizer_crc32,
            actual: crc,
        });
    }
    Ok(Checkpoint {
        dir,
        state,
        tensors,
        optimizer,
    })
}

impl Checkpoint {
    /// Imports the parameters and quantizer states into `ps` (typed error when they do not
    /// fit: missing, unknown or wrong-shaped tensors).
    pub fn apply(&self, ps: &mut ParamStore) -> Result<(), CheckpointError> {
        let tpath = self.dir.join(TENSORS_FILE);
        ps.import(&self.tensors)
            .map_err(|error| CheckpointError::Mismatch { path: tpath, error })?;
        restore_quant_states(ps, &self.state.quant_states, &self.dir.join(STATE_FILE))
    }
}

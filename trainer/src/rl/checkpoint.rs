//! RL checkpoints: `checkpoints/step-N/` with the policy (`model.safetensors`), the AdamW
//! state (`optimizer.bin`), the initial policy when a KL penalty needs it
//! (`reference.safetensors`) and `rl_state.json` (step, prompt cursor, the run's random
//! stream, settings, checksums), written into a temporary directory, synced and renamed, then
//! pointed at by `checkpoints/latest` (replaced atomically). Everything a step depends on is in
//! it, so a resumed run continues bit for bit.

use std::fs;
use std::path::{Path, PathBuf};

use autograd::NamedTensor;
use serde::{Deserialize, Serialize};

use super::config::{io_err, RlConfig, RlError};
use super::plan::Plan;
use crate::checkpoint::{step_dir_name, tensors_from_bytes, tensors_to_bytes};
use crate::model::ModelConfig;
use crate::rng::Xoshiro256StarStar;

/// The state file's version.
pub const RL_STATE_VERSION: u32 = 1;
/// The state file.
pub const RL_STATE_FILE: &str = "rl_state.json";

/// The JSON state of an RL checkpoint.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RlState {
    /// [`RL_STATE_VERSION`].
    pub version: u32,
    /// Steps taken.
    pub step: u64,
    /// Training prompts consumed.
    pub cursor: u64,
    /// The run's random stream (sampler seeds).
    pub rng: Xoshiro256StarStar,
    /// Model shape.
    pub model: ModelConfig,
    /// The plan.
    pub plan: Plan,
    /// The settings.
    pub config: RlConfig,
    /// The checkpoint RL started from.
    pub start: String,
    /// Held-out pass rate before the first step.
    pub initial_pass_rate: f64,
    /// CRC-32 of `model.safetensors`.
    pub tensors_crc32: u32,
    /// CRC-32 of `optimizer.bin`.
    pub optimizer_crc32: u32,
    /// CRC-32 of `reference.safetensors`, when there is one.
    pub reference_crc32: Option<u32>,
}

/// A loaded RL checkpoint.
pub struct RlCheckpoint {
    /// Its directory.
    pub dir: PathBuf,
    /// The state.
    pub state: RlState,
    /// Policy parameters.
    pub tensors: Vec<NamedTensor>,
    /// Optimizer bytes.
    pub optimizer: Vec<u8>,
    /// Initial policy (KL reference).
    pub reference: Option<Vec<NamedTensor>>,
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), RlError> {
    use std::io::Write;
    let mut f = fs::File::create(path).map_err(io_err(path))?;
    f.write_all(bytes).map_err(io_err(path))?;
    f.sync_all().map_err(io_err(path))
}

/// Writes a checkpoint under `root` and keeps the newest `keep`; returns its directory.
pub fn save(
    root: &Path,
    state: &mut RlState,
    tensors: &[NamedTensor],
    optimizer: &[u8],
    reference: Option<&[NamedTensor]>,
    keep: usize,
) -> Result<PathBuf, RlError> {
    fs::create_dir_all(root).map_err(io_err(root))?;
    let name = step_dir_name(state.step);
    let tmp = root.join(format!(".tmp-{name}"));
    let dst = root.join(&name);
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp).map_err(io_err(&tmp))?;
    let tbytes = tensors_to_bytes(tensors)?;
    state.tensors_crc32 = optim::crc32(&tbytes);
    state.optimizer_crc32 = optim::crc32(optimizer);
    write_synced(&tmp.join(crate::checkpoint::TENSORS_FILE), &tbytes)?;
    write_synced(&tmp.join(crate::checkpoint::OPTIMIZER_FILE), optimizer)?;
    state.reference_crc32 = match reference {
        Some(r) => {
            let rb = tensors_to_bytes(r)?;
            write_synced(&tmp.join("reference.safetensors"), &rb)?;
            Some(optim::crc32(&rb))
        }
        None => None,
    };
    let json = serde_json::to_vec_pretty(state).expect("state serializes");
    write_synced(&tmp.join(RL_STATE_FILE), &json)?;
    let _ = fs::remove_dir_all(&dst);
    fs::rename(&tmp, &dst).map_err(io_err(&dst))?;
    let latest = root.join(crate::checkpoint::LATEST_FILE);
    crate::rundir::write_atomic(&latest, name.as_bytes()).map_err(io_err(&latest))?;
    let mut steps: Vec<String> = fs::read_dir(root)
        .map_err(io_err(root))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("step-"))
        .collect();
    steps.sort();
    let n = steps.len();
    for old in steps.into_iter().take(n.saturating_sub(keep.max(1))) {
        let _ = fs::remove_dir_all(root.join(old));
    }
    Ok(dst)
}

/// The RL checkpoint directory `path` names, if it names one: the directory itself, an RL
/// run directory (its `checkpoints/latest`), or a `checkpoints/latest` file.
pub fn resolve(path: &Path) -> Option<PathBuf> {
    if path.join(RL_STATE_FILE).is_file() {
        return Some(path.into());
    }
    let root =
        crate::checkpoint::latest_file_parent(path).unwrap_or_else(|| path.join("checkpoints"));
    let name = fs::read_to_string(root.join(crate::checkpoint::LATEST_FILE)).ok()?;
    let dir = root.join(name.trim());
    dir.join(RL_STATE_FILE).is_file().then_some(dir)
}

/// Loads and verifies a checkpoint directory.
pub fn load(dir: &Path) -> Result<RlCheckpoint, RlError> {
    let spath = dir.join(RL_STATE_FILE);
    let text = fs::read(&spath).map_err(io_err(&spath))?;
    let state: RlState = serde_json::from_slice(&text)
        .map_err(|e| RlError::Invalid(format!("{}: {e}", spath.display())))?;
    if state.version != RL_STATE_VERSION {
        return Err(RlError::Invalid(format!(
            "{}: version {}, this build reads {RL_STATE_VERSION}",
            spath.display(),
            state.version
        )));
    }
    let read_checked = |name: &str, crc: u32| -> Result<Vec<u8>, RlError> {
        let p = dir.join(name);
        let b = fs::read(&p).map_err(io_err(&p))?;
        if optim::crc32(&b) != crc {
            return Err(RlError::Invalid(format!(
                "{}: checksum mismatch",
                p.display()
            )));
        }
        Ok(b)
    };
    let tpath = dir.join(crate::checkpoint::TENSORS_FILE);
    let tensors = tensors_from_bytes(
        &read_checked(crate::checkpoint::TENSORS_FILE, state.tensors_crc32)?,
        &tpath,
    )?;
    let optimizer = read_checked(crate::checkpoint::OPTIMIZER_FILE, state.optimizer_crc32)?;
    let reference = match state.reference_crc32 {
        Some(c) => Some(tensors_from_bytes(
            &read_checked("reference.safetensors", c)?,
            &dir.join("reference.safetensors"),
        )?),
        None => None,
    };
    Ok(RlCheckpoint {
        dir: dir.into(),
        state,
        tensors,
        optimizer,
        reference,
    })
}

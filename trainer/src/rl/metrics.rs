//! What an RL run records: one [`StepRecord`] per step (`metrics.jsonl`), one [`EvalRecord`]
//! per held-out evaluation (`eval.jsonl`), and [`RlSummary`] at the end (`summary.json`).

use std::fs;
use std::io::Write;
use std::path::Path;

use serde::{de::DeserializeOwned, Deserialize, Serialize};

use super::config::{io_err, RlError};
use super::correction::Mismatch;

/// One policy-gradient step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// Step (1-based).
    pub step: u64,
    /// Mean reward of the rollouts.
    pub reward: f64,
    /// Fraction of rollouts with reward 1.
    pub pass_rate: f64,
    /// Mean completion length (tokens).
    pub response_len: f64,
    /// Mean sampler entropy per completion token (nats).
    pub entropy: f64,
    /// Loss (token-normalized, summed over minibatches).
    pub loss: f64,
    /// Gradient norm of the last update, before clipping.
    pub grad_norm: f64,
    /// Learning rate.
    pub lr: f64,
    /// Fraction of tokens whose PPO clip was active.
    pub clip_frac: f64,
    /// Sampler/trainer mismatch of this step's tokens.
    pub mismatch: Mismatch,
    /// Fraction of tokens the correction truncated or masked.
    pub corrected_frac: f64,
    /// Sampler throughput: prompt + generated tokens per second of generation.
    pub sampler_tokens_per_s: f64,
    /// Trainer throughput: tokens per second of the log-probability recomputation and update.
    pub trainer_tokens_per_s: f64,
    /// Wall seconds of the step.
    pub seconds: f64,
}

/// One held-out evaluation (a BF16 copy of the policy).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EvalRecord {
    /// Steps taken before it.
    pub step: u64,
    /// Fraction of held-out prompts answered exactly by greedy decoding.
    pub pass_rate: f64,
    /// Fraction answered exactly by one completion sampled at temperature 1 (pass@1 of the
    /// policy's own distribution, fixed seed).
    pub sampled_pass_rate: f64,
    /// Prompts evaluated.
    pub prompts: usize,
}

/// The end of a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RlSummary {
    /// Plan name.
    pub plan: String,
    /// Correction name.
    pub correction: String,
    /// Seed.
    pub seed: u64,
    /// Steps.
    pub steps: u64,
    /// Held-out pass rate before the first step.
    pub initial_pass_rate: f64,
    /// Held-out pass rate after the last step.
    pub final_pass_rate: f64,
    /// Held-out sampled pass rate (temperature 1) before the first step.
    pub initial_sampled_pass_rate: f64,
    /// Held-out sampled pass rate after the last step.
    pub final_sampled_pass_rate: f64,
    /// Mean over steps of the mean |Δlogp|.
    pub mean_abs_dlogp: f64,
    /// Mean over steps of the k3 estimator.
    pub k3: f64,
    /// Mean over steps of the fraction of bitwise-different log-probabilities.
    pub frac_bitwise_different: f64,
    /// Sampler tokens per second over the run.
    pub sampler_tokens_per_s: f64,
    /// Trainer tokens per second over the run.
    pub trainer_tokens_per_s: f64,
    /// Wall seconds.
    pub seconds: f64,
}

/// Appends one JSON line (one `write` call).
pub fn append<T: Serialize>(path: &Path, record: &T) -> Result<(), RlError> {
    let mut line = serde_json::to_string(record).expect("records serialize");
    line.push('\n');
    let mut f = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io_err(path))?;
    f.write_all(line.as_bytes()).map_err(io_err(path))
}

/// Reads a JSONL file (missing file: empty).
pub fn read<T: DeserializeOwned>(path: &Path) -> Result<Vec<T>, RlError> {
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(io_err(path)(e)),
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l)
                .map_err(|e| RlError::Invalid(format!("{}: {e}", path.display())))
        })
        .collect()
}

/// Keeps only the lines of a JSONL file whose `step` is at most `step` (a resume's trim),
/// byte for byte, rewriting the file atomically.
pub fn trim(path: &Path, step: u64) -> Result<(), RlError> {
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err(path)(e)),
    };
    let mut out = String::new();
    for l in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(l)
            .map_err(|e| RlError::Invalid(format!("{}: {e}", path.display())))?;
        if v.get("step")
            .and_then(|s| s.as_u64())
            .is_some_and(|s| s <= step)
        {
            out.push_str(l);
            out.push('\n');
        }
    }
    crate::rundir::write_atomic(path, out.as_bytes()).map_err(io_err(path))
}

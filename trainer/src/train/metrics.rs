//! What a run reports: one [`StepMetrics`] line per step in `metrics.jsonl`, the per-layer
//! quantization error of evaluations ([`LayerError`]) and the final [`RunSummary`].

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::{io_err, TrainError};
use crate::recipe::LayerKind;

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

pub(super) fn error_of(s: &fp_formats::stats::ErrorStats) -> OperandError {
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

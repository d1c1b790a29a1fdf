//! Activation calibration: the largest input magnitude (amax) of every linear layer over a
//! set of batches, from which static activation scales are derived (ModelOpt's NVFP4
//! `input_scale = amax / 2688`, compressed-tensors' `input_global_scale = 2688 / amax`, see
//! [`fp_formats::checkpoint::layouts`]; an RL sampler's static scales).
//!
//! The forward pass is the model's own ([`Gpt::forward_logits`] with gradients off), read
//! through its [`LinearProbe`]s, which see every row of each layer's input; nothing in the
//! forward's arithmetic changes. [`calibrate_checkpoint`] runs it in FP32 (the recipe
//! `fp32`), as ModelOpt's max calibration observes the unquantized model, on the first `N`
//! sequential batches of the run's validation split (the windows `evaluate` uses), so the
//! amaxes are deterministic: the same checkpoint and `N` give the same bits on any thread
//! count (every op of the forward is).
//!
//! ```
//! use autograd::ParamStore;
//! use trainer::calibrate::input_amax;
//! use trainer::data::{Batcher, BatcherConfig, Sampling, Tokens};
//! use trainer::model::{Gpt, ModelConfig};
//! use trainer::recipe::Recipe;
//! let mut ps = ParamStore::new();
//! let model = Gpt::new(&mut ps, ModelConfig::preset("tiny").unwrap(), 1).unwrap();
//! let tokens = Tokens::from_text(&"calibration text. ".repeat(20));
//! let cfg = BatcherConfig { batch: 2, seq: 32, sampling: Sampling::Sequential, seed: 0 };
//! let batches = Batcher::new(tokens, cfg).unwrap().take(2);
//! let fp32 = Recipe::builtin("fp32").unwrap();
//! let amax = input_amax(&model, &mut ps, &fp32, batches).unwrap();
//! assert_eq!(amax.len(), 4 * 2 + 1); // four linears per block, then the LM head
//! assert_eq!(amax[0].name, "blocks.0.attn.qkv");
//! assert!(amax.iter().all(|a| a.amax > 0.0 && a.amax.is_finite()));
//! ```

use autograd::{Graph, ParamStore};

use crate::checkpoint::Checkpoint;
use crate::data::{split, Batch, Batcher, BatcherConfig, DataError, Sampling};
use crate::model::{Gpt, LinearProbe, ModelError, Precision};
use crate::recipe::{LayerKind, Recipe};

/// The most calibration batches one call accepts.
pub const MAX_CALIBRATION_BATCHES: usize = 100_000;

/// Why a calibration failed.
#[derive(Debug, thiserror::Error)]
pub enum CalibrateError {
    /// No batches, or more than [`MAX_CALIBRATION_BATCHES`].
    #[error("calibration needs 1..={MAX_CALIBRATION_BATCHES} batches, got {0}")]
    BadBatchCount(usize),
    /// The calibration data holds fewer distinct batches than asked for.
    #[error(
        "{origin}: {windows} windows of {seq}+1 tokens make {available} calibration batches of \
         {batch} rows, {requested} requested"
    )]
    TooFewBatches {
        /// Where the tokens came from.
        origin: String,
        /// Whole sequential windows in the data.
        windows: usize,
        /// Tokens per row.
        seq: usize,
        /// Rows per batch.
        batch: usize,
        /// Distinct batches the data holds.
        available: usize,
        /// Batches asked for.
        requested: usize,
    },
    /// A layer's input held NaN or an infinity (a diverged model).
    #[error("calibration batch {batch}: the input of `{layer}` is not finite (amax {amax})")]
    NonFinite {
        /// The linear layer (`blocks.{i}.attn.qkv`, ...).
        layer: String,
        /// 0-based batch index.
        batch: usize,
        /// Its amax.
        amax: f32,
    },
    /// A layer's input was zero on every calibration token: no scale can be derived.
    #[error("the input of `{0}` is zero on every calibration token: no activation scale")]
    Zero(String),
    /// The forward pass failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The calibration data could not be loaded or batched.
    #[error(transparent)]
    Data(#[from] DataError),
    /// The checkpoint could not be applied or the recipe resolved.
    #[error("{0}")]
    Setup(String),
}

/// The calibrated input amax of one linear layer.
#[derive(Clone, Debug, PartialEq)]
pub struct LinearAmax {
    /// `blocks.{i}.attn.qkv`, `blocks.{i}.attn.out`, `blocks.{i}.mlp.up`,
    /// `blocks.{i}.mlp.down` or `lm_head` (the model's linear names).
    pub name: String,
    /// Block index (`None` for the LM head).
    pub block: Option<usize>,
    /// Layer kind.
    pub kind: LayerKind,
    /// `max |x|` over every element of the layer's input on every calibration batch.
    pub amax: f32,
}

/// The input amax of every linear layer of `model` (in [`Gpt::linears`] order: the four
/// linears of each block, then the LM head) over `batches`, with the forward pass under
/// `recipe` at progress 0 and gradients off.
///
/// Errors: no batch, or more than [`MAX_CALIBRATION_BATCHES`]
/// ([`CalibrateError::BadBatchCount`]); a non-finite input ([`CalibrateError::NonFinite`],
/// naming the layer and batch); an input that is zero on every batch
/// ([`CalibrateError::Zero`]); a failed forward pass.
pub fn input_amax(
    model: &Gpt,
    ps: &mut ParamStore,
    recipe: &Recipe,
    batches: impl IntoIterator<Item = Batch>,
) -> Result<Vec<LinearAmax>, CalibrateError> {
    let mut out: Vec<LinearAmax> = Vec::new();
    let mut n = 0;
    for b in batches {
        if n == MAX_CALIBRATION_BATCHES {
            return Err(CalibrateError::BadBatchCount(n + 1));
        }
        let mut probes: Vec<LinearProbe> = Vec::new();
        let mut g = Graph::new(ps).with_rng(0, 0);
        g.set_grad_enabled(false);
        let prec = Precision {
            recipe,
            progress: 0.0,
        };
        model.forward_logits(&mut g, &b.inputs, b.batch, &prec, Some(&mut probes))?;
        if out.is_empty() {
            out = probes
                .iter()
                .map(|p| LinearAmax {
                    name: p.name.clone(),
                    block: p.block,
                    kind: p.kind,
                    amax: 0.0,
                })
                .collect();
        }
        for (o, p) in out.iter_mut().zip(&probes) {
            if !p.amax.is_finite() {
                return Err(CalibrateError::NonFinite {
                    layer: p.name.clone(),
                    batch: n,
                    amax: p.amax,
                });
            }
            o.amax = o.amax.max(p.amax);
        }
        n += 1;
    }
    if n == 0 {
        return Err(CalibrateError::BadBatchCount(0));
    }
    if let Some(z) = out.iter().find(|a| a.amax == 0.0) {
        return Err(CalibrateError::Zero(z.name.clone()));
    }
    Ok(out)
}

/// Calibrates a checkpoint on the first `batches` sequential batches (the run's rows per
/// batch and context length) of its validation split, in FP32: see the
/// [module documentation](self).
///
/// Errors: those of [`input_amax`]; the run's data cannot be loaded (a moved text file or
/// shard); the validation split holds fewer than `batches` distinct batches
/// ([`CalibrateError::TooFewBatches`]).
pub fn calibrate_checkpoint(
    ck: &Checkpoint,
    batches: usize,
) -> Result<Vec<LinearAmax>, CalibrateError> {
    if batches == 0 || batches > MAX_CALIBRATION_BATCHES {
        return Err(CalibrateError::BadBatchCount(batches));
    }
    let tokens = ck.state.data.load()?;
    let (_, val) = split(&tokens, ck.state.train.val_fraction)?;
    let cfg = BatcherConfig {
        batch: ck.state.train.batch,
        seq: ck.state.model.seq,
        sampling: Sampling::Sequential,
        seed: 0,
    };
    let batcher = Batcher::new(val, cfg)?;
    let windows = batcher.windows_per_pass();
    let available = windows / cfg.batch;
    if batches > available {
        return Err(CalibrateError::TooFewBatches {
            origin: batcher.tokens().origin().to_string(),
            windows,
            seq: cfg.seq,
            batch: cfg.batch,
            available,
            requested: batches,
        });
    }
    let mut ps = ParamStore::new();
    let model = Gpt::new(&mut ps, ck.state.model.clone(), 0)?;
    ps.import(&ck.tensors)
        .map_err(|e| CalibrateError::Setup(format!("{}: {e}", ck.dir.display())))?;
    let fp32 = Recipe::builtin("fp32").map_err(|e| CalibrateError::Setup(e.to_string()))?;
    input_amax(&model, &mut ps, &fp32, batcher.take(batches))
}

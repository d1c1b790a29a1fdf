//! The GPT: token embedding, `n_layers` pre-norm blocks (RMSNorm → fused QKV linear → RoPE →
//! causal attention → output linear → residual; RMSNorm → SwiGLU or GELU MLP → residual),
//! final RMSNorm and the LM head (tied to the embedding or its own matrix).
//!
//! Every linear layer takes its [`GemmPolicy`] from the recipe
//! ([`Recipe::policy_for`] with the block index, the [`LayerKind`] and the training
//! progress), and its random-stream id from [`layer_stream`]: `8·block + kind` inside blocks
//! and `8·n_layers` for the LM head, so every (block, kind) pair draws its own random bits.
//! With [`AttentionPrecision::Bf16`], Q, K and V are rounded to BF16 (straight-through
//! gradient) before attention, and inside it every other operand of its matrix products too
//! (P, dO, dS: [`AttentionProducts::Bf16`]), which accumulate in FP32 on the BF16 GEMM.
//!
//! Parameter names (what checkpoints store): `embed.weight`, `blocks.{i}.attn_norm.weight`,
//! `blocks.{i}.attn.qkv.weight`, `blocks.{i}.attn.out.weight`, `blocks.{i}.mlp_norm.weight`,
//! `blocks.{i}.mlp.up.weight` (SwiGLU: gate and up rows stacked, `[2·hidden, d]`),
//! `blocks.{i}.mlp.down.weight`, `final_norm.weight`, `lm_head.weight` (untied only).

use autograd::{init, AttentionProducts, Graph, ParamId, ParamStore, QkvAttention, Tensor};
use quant::GemmPolicy;
use serde::{Deserialize, Serialize};

use crate::recipe::{AttentionPrecision, LayerKind, Recipe};

/// MLP flavour.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MlpKind {
    /// `down(silu(gate(x)) ⊙ up(x))`; gate and up are one fused linear.
    #[default]
    Swiglu,
    /// `down(gelu(up(x)))`.
    Gelu,
}

/// Why a model configuration was rejected.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A size that does not work (zero, heads not dividing `d_model`, odd head size, ...).
    #[error("invalid model config: {0}")]
    Invalid(String),
    /// No such preset.
    #[error("unknown model preset '{name}'; valid: {valid}")]
    UnknownPreset {
        /// The name asked for.
        name: String,
        /// The presets.
        valid: String,
    },
    /// The autograd engine rejected an op (shapes, token ids out of range, ...).
    #[error(transparent)]
    Autograd(#[from] autograd::Error),
}

/// Model shape (serde / TOML `[model]` table).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Vocabulary size (256 for byte-level data).
    pub vocab: usize,
    /// Residual width.
    pub d_model: usize,
    /// Transformer blocks.
    pub n_layers: usize,
    /// Attention heads (`d_model / n_heads` must be even, for RoPE).
    pub n_heads: usize,
    /// MLP hidden width.
    pub hidden: usize,
    /// MLP flavour.
    #[serde(default)]
    pub mlp: MlpKind,
    /// Context length (tokens per training row).
    pub seq: usize,
    /// Share the embedding matrix with the LM head.
    #[serde(default)]
    pub tie_embeddings: bool,
    /// RoPE base.
    #[serde(default = "default_rope_base")]
    pub rope_base: f32,
    /// RMSNorm epsilon.
    #[serde(default = "default_eps")]
    pub norm_eps: f32,
}

fn default_rope_base() -> f32 {
    10_000.0
}
fn default_eps() -> f32 {
    1e-5
}

/// The model presets, smallest first.
pub const PRESET_NAMES: [&str; 5] = ["tiny", "small", "base", "medium", "large"];

impl ModelConfig {
    /// A preset: `tiny` (tests, ~30K parameters), `small` (the default: d 128, 4 layers,
    /// ~0.8M), `base` (d 256, 6 layers, ~5M), `medium` (d 512, 8 layers, ~25M), `large`
    /// (d 768, 14 layers, ~100M). All byte-level (vocab 256) with SwiGLU.
    pub fn preset(name: &str) -> Result<ModelConfig, ModelError> {
        let mk = |d: usize, layers: usize, heads: usize, hidden: usize, seq: usize| ModelConfig {
            vocab: 256,
            d_model: d,
            n_layers: layers,
            n_heads: heads,
            hidden,
            mlp: MlpKind::Swiglu,
            seq,
            tie_embeddings: false,
            rope_base: default_rope_base(),
            norm_eps: default_eps(),
        };
        Ok(match name {
            "tiny" => mk(32, 2, 2, 64, 32),
            "small" => mk(128, 4, 4, 352, 128),
            "base" => mk(256, 6, 4, 688, 256),
            "medium" => mk(512, 8, 8, 1376, 512),
            "large" => mk(768, 14, 12, 2048, 1024),
            _ => {
                return Err(ModelError::UnknownPreset {
                    name: name.to_string(),
                    valid: PRESET_NAMES.join(", "),
                })
            }
        })
    }

    /// Checks the sizes.
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |m: String| Err(ModelError::Invalid(m));
        if self.vocab == 0
            || self.d_model == 0
            || self.n_layers == 0
            || self.n_heads == 0
            || self.hidden == 0
            || self.seq == 0
        {
            return bad(format!(
                "vocab ({}), d_model ({}), n_layers ({}), n_heads ({}), hidden ({}) and seq ({}) must be positive",
                self.vocab, self.d_model, self.n_layers, self.n_heads, self.hidden, self.seq
            ));
        }
        if !self.d_model.is_multiple_of(self.n_heads)
            || !(self.d_model / self.n_heads).is_multiple_of(2)
        {
            return bad(format!(
                "d_model ({}) must be a multiple of n_heads ({}) with an even head size",
                self.d_model, self.n_heads
            ));
        }
        if self.n_layers > MAX_LAYERS
            || self.vocab > MAX_VOCAB
            || self.d_model > MAX_WIDTH
            || self.hidden > MAX_WIDTH
            || self.seq > MAX_SEQ
        {
            return bad(format!(
                "model too large: n_layers ({}) must be at most {MAX_LAYERS}, vocab ({}) at most {MAX_VOCAB}, d_model ({}) and hidden ({}) at most {MAX_WIDTH}, seq ({}) at most {MAX_SEQ}",
                self.n_layers, self.vocab, self.d_model, self.hidden, self.seq
            ));
        }
        if !(self.rope_base.is_finite() && self.rope_base > 1.0) {
            return bad(format!("rope_base ({}) must be > 1", self.rope_base));
        }
        if !(self.norm_eps.is_finite() && self.norm_eps > 0.0) {
            return bad(format!("norm_eps ({}) must be > 0", self.norm_eps));
        }
        Ok(())
    }

    /// Number of parameters the model will have.
    pub fn num_params(&self) -> usize {
        let (d, h) = (self.d_model, self.hidden);
        let up = match self.mlp {
            MlpKind::Swiglu => 2 * h * d,
            MlpKind::Gelu => h * d,
        };
        let block = 2 * d + 3 * d * d + d * d + up + h * d;
        let head = if self.tie_embeddings {
            0
        } else {
            self.vocab * d
        };
        self.vocab * d + self.n_layers * block + d + head
    }
}

/// Upper bound of `n_layers` (checked by [`ModelConfig::validate`]).
pub const MAX_LAYERS: usize = 100_000;
/// Upper bound of `vocab`.
pub const MAX_VOCAB: usize = 1 << 24;
/// Upper bound of `d_model` and `hidden`.
pub const MAX_WIDTH: usize = 1 << 20;
/// Upper bound of `seq`.
pub const MAX_SEQ: usize = 1 << 20;

/// The random-stream id of a linear layer (see the module docs).
pub fn layer_stream(block: usize, kind: LayerKind, n_layers: usize) -> u64 {
    match kind {
        LayerKind::AttnQkv => 8 * block as u64,
        LayerKind::AttnOut => 8 * block as u64 + 1,
        LayerKind::MlpUp => 8 * block as u64 + 2,
        LayerKind::MlpDown => 8 * block as u64 + 3,
        LayerKind::LmHead => 8 * n_layers as u64,
    }
}

/// Parameter handles of one block.
#[derive(Clone, Debug)]
pub struct Block {
    /// Pre-attention norm gain.
    pub attn_norm: ParamId,
    /// Fused QKV projection `[3d, d]`.
    pub qkv: ParamId,
    /// Attention output projection `[d, d]`.
    pub out: ParamId,
    /// Pre-MLP norm gain.
    pub mlp_norm: ParamId,
    /// MLP up projection (`[2·hidden, d]` for SwiGLU, `[hidden, d]` for GELU).
    pub up: ParamId,
    /// MLP down projection `[d, hidden]`.
    pub down: ParamId,
}

/// The input of one quantized linear layer captured during a forward pass, for error
/// statistics (see [`Gpt::forward_logits`]).
#[derive(Clone, Debug)]
pub struct LinearProbe {
    /// `blocks.{i}.attn.qkv` etc.
    pub name: String,
    /// Block index (`None` for the LM head).
    pub block: Option<usize>,
    /// Layer kind.
    pub kind: LayerKind,
    /// The weight.
    pub weight: ParamId,
    /// The policy the layer ran with.
    pub policy: GemmPolicy,
    /// Random-stream id.
    pub stream: u64,
    /// The first `rows` rows of the layer's input `X` (`[rows, cols]`).
    pub x: Vec<f32>,
    /// Rows captured.
    pub rows: usize,
    /// Input width.
    pub cols: usize,
    /// The largest magnitude of the whole input (all rows, not only the captured ones; NaN
    /// if the input holds a NaN), for activation calibration ([`crate::calibrate`]).
    pub amax: f32,
}

/// Rows of a linear input a probe keeps (keeps statistics cheap).
pub const PROBE_ROWS: usize = 256;

/// The GPT's parameter handles and configuration.
#[derive(Clone, Debug)]
pub struct Gpt {
    /// Shape.
    pub cfg: ModelConfig,
    /// Token embedding `[vocab, d]`.
    pub embed: ParamId,
    /// Blocks.
    pub blocks: Vec<Block>,
    /// Final norm gain.
    pub final_norm: ParamId,
    /// LM head `[vocab, d]` (`None` when tied to the embedding).
    pub lm_head: Option<ParamId>,
}

/// Precision context of one forward pass.
#[derive(Clone, Copy, Debug)]
pub struct Precision<'a> {
    /// The recipe.
    pub recipe: &'a Recipe,
    /// Training progress in `[0, 1]` (fraction of tokens seen), for the recipe's schedule.
    pub progress: f64,
}

impl Precision<'_> {
    fn policy(&self, block: usize, kind: LayerKind, n_layers: usize) -> GemmPolicy {
        self.recipe.policy_for(block, n_layers, kind, self.progress)
    }
}

impl Gpt {
    /// Adds the parameters to `ps` (which should be empty), initialised from `seed`:
    /// normal(0, 0.02) matrices, output projections scaled by `1/√(2·n_layers)`, norm gains 1.
    pub fn new(ps: &mut ParamStore, cfg: ModelConfig, seed: u64) -> Result<Gpt, ModelError> {
        cfg.validate()?;
        let (d, h, v) = (cfg.d_model, cfg.hidden, cfg.vocab);
        let std = 0.02f32;
        let proj_std = std / (2.0 * cfg.n_layers as f32).sqrt();
        let mut k = 0u64;
        let mut next_seed = || {
            k += 1;
            seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(k)
        };
        let embed = ps.add(
            "embed.weight",
            &[v, d],
            init::normal(v * d, std, next_seed()),
        )?;
        let mut blocks = Vec::with_capacity(cfg.n_layers);
        let up_rows = match cfg.mlp {
            MlpKind::Swiglu => 2 * h,
            MlpKind::Gelu => h,
        };
        for i in 0..cfg.n_layers {
            let p = format!("blocks.{i}");
            let attn_norm = ps.add_filled(&format!("{p}.attn_norm.weight"), &[d], 1.0)?;
            let qkv = ps.add(
                &format!("{p}.attn.qkv.weight"),
                &[3 * d, d],
                init::normal(3 * d * d, std, next_seed()),
            )?;
            let out = ps.add(
                &format!("{p}.attn.out.weight"),
                &[d, d],
                init::normal(d * d, proj_std, next_seed()),
            )?;
            let mlp_norm = ps.add_filled(&format!("{p}.mlp_norm.weight"), &[d], 1.0)?;
            let up = ps.add(
                &format!("{p}.mlp.up.weight"),
                &[up_rows, d],
                init::normal(up_rows * d, std, next_seed()),
            )?;
            let down = ps.add(
                &format!("{p}.mlp.down.weight"),
                &[d, h],
                init::normal(d * h, proj_std, next_seed()),
            )?;
            blocks.push(Block {
                attn_norm,
                qkv,
                out,
                mlp_norm,
                up,
                down,
            });
        }
        let final_norm = ps.add_filled("final_norm.weight", &[d], 1.0)?;
        let lm_head = if cfg.tie_embeddings {
            None
        } else {
            Some(ps.add(
                "lm_head.weight",
                &[v, d],
                init::normal(v * d, std, next_seed()),
            )?)
        };
        Ok(Gpt {
            cfg,
            embed,
            blocks,
            final_norm,
            lm_head,
        })
    }

    /// Whether a parameter gets weight decay (matrices of linear layers only: not norms, not
    /// the embedding, not a tied head).
    pub fn decays(&self, id: ParamId) -> bool {
        self.lm_head == Some(id)
            || self
                .blocks
                .iter()
                .any(|b| [b.qkv, b.out, b.up, b.down].contains(&id))
    }

    /// The quantized linear layers: (name, block, kind, weight), LM head last.
    pub fn linears(&self) -> Vec<(String, Option<usize>, LayerKind, ParamId)> {
        let mut v = Vec::new();
        for (i, b) in self.blocks.iter().enumerate() {
            v.push((
                format!("blocks.{i}.attn.qkv"),
                Some(i),
                LayerKind::AttnQkv,
                b.qkv,
            ));
            v.push((
                format!("blocks.{i}.attn.out"),
                Some(i),
                LayerKind::AttnOut,
                b.out,
            ));
            v.push((
                format!("blocks.{i}.mlp.up"),
                Some(i),
                LayerKind::MlpUp,
                b.up,
            ));
            v.push((
                format!("blocks.{i}.mlp.down"),
                Some(i),
                LayerKind::MlpDown,
                b.down,
            ));
        }
        v.push((
            "lm_head".into(),
            None,
            LayerKind::LmHead,
            self.lm_head.unwrap_or(self.embed),
        ));
        v
    }

    #[allow(clippy::too_many_arguments)]
    fn lin(
        &self,
        g: &mut Graph<'_>,
        x: Tensor,
        w: ParamId,
        block: Option<usize>,
        kind: LayerKind,
        prec: &Precision<'_>,
        probes: &mut Option<&mut Vec<LinearProbe>>,
    ) -> Result<Tensor, ModelError> {
        let n = self.cfg.n_layers;
        let bi = block.unwrap_or(0);
        let policy = prec.policy(bi, kind, n);
        let stream = layer_stream(bi, kind, n);
        if let Some(p) = probes.as_deref_mut() {
            let shape = g.shape(x)?;
            let cols = shape.last();
            let rows = shape.rows().min(PROBE_ROWS);
            let xv = g.value(x)?;
            let amax = xv.iter().fold(0.0f32, |m, &v| {
                if v.abs() > m || v.is_nan() {
                    v.abs()
                } else {
                    m
                }
            });
            let name = match block {
                Some(i) => format!(
                    "blocks.{i}.{}",
                    match kind {
                        LayerKind::AttnQkv => "attn.qkv",
                        LayerKind::AttnOut => "attn.out",
                        LayerKind::MlpUp => "mlp.up",
                        LayerKind::MlpDown => "mlp.down",
                        LayerKind::LmHead => "lm_head",
                    }
                ),
                None => "lm_head".into(),
            };
            p.push(LinearProbe {
                name,
                block,
                kind,
                weight: w,
                policy,
                stream,
                x: xv[..rows * cols].to_vec(),
                rows,
                cols,
                amax,
            });
        }
        let wt = g.param(w)?;
        Ok(g.linear(x, wt, None, &policy, stream)?)
    }

    /// Logits `[batch, T, vocab]` of `tokens: [batch, T]` (row-major, `T ≤ seq` not
    /// enforced: RoPE extrapolates). `probes`, when given, receives the input of every linear
    /// layer (first [`PROBE_ROWS`] rows).
    pub fn forward_logits(
        &self,
        g: &mut Graph<'_>,
        tokens: &[u32],
        batch: usize,
        prec: &Precision<'_>,
        mut probes: Option<&mut Vec<LinearProbe>>,
    ) -> Result<Tensor, ModelError> {
        let cfg = &self.cfg;
        if batch == 0 || tokens.is_empty() || !tokens.len().is_multiple_of(batch) {
            return Err(ModelError::Invalid(format!(
                "{} tokens do not form {batch} rows",
                tokens.len()
            )));
        }
        let t = tokens.len() / batch;
        let e = g.param(self.embed)?;
        let mut x = g.embedding(tokens, &[batch, t], e)?;
        // split into heads, RoPE, optional BF16 rounding, attention, merge: one fused op
        let attn = QkvAttention {
            heads: cfg.n_heads,
            rope_base: cfg.rope_base,
            round_bf16: prec.recipe.attention == AttentionPrecision::Bf16,
        };
        for (i, b) in self.blocks.iter().enumerate() {
            let w = g.param(b.attn_norm)?;
            let h = g.rmsnorm(x, w, cfg.norm_eps)?;
            let qkv = self.lin(g, h, b.qkv, Some(i), LayerKind::AttnQkv, prec, &mut probes)?;
            let a = g.qkv_attention(qkv, attn)?;
            let a = self.lin(g, a, b.out, Some(i), LayerKind::AttnOut, prec, &mut probes)?;
            x = g.add(x, a)?;
            let w = g.param(b.mlp_norm)?;
            let h = g.rmsnorm(x, w, cfg.norm_eps)?;
            let u = self.lin(g, h, b.up, Some(i), LayerKind::MlpUp, prec, &mut probes)?;
            let m = match cfg.mlp {
                MlpKind::Swiglu => g.swiglu_halves(u)?,
                MlpKind::Gelu => g.gelu(u)?,
            };
            let m = self.lin(g, m, b.down, Some(i), LayerKind::MlpDown, prec, &mut probes)?;
            x = g.add(x, m)?;
        }
        let w = g.param(self.final_norm)?;
        let x = g.rmsnorm(x, w, cfg.norm_eps)?;
        let head = self.lm_head.unwrap_or(self.embed);
        self.lin(g, x, head, None, LayerKind::LmHead, prec, &mut probes)
    }

    /// Mean next-token cross-entropy of `tokens: [batch, T]` against `targets`.
    pub fn loss(
        &self,
        g: &mut Graph<'_>,
        tokens: &[u32],
        targets: &[u32],
        batch: usize,
        prec: &Precision<'_>,
        probes: Option<&mut Vec<LinearProbe>>,
    ) -> Result<Tensor, ModelError> {
        let logits = self.forward_logits(g, tokens, batch, prec, probes)?;
        Ok(g.cross_entropy(logits, targets, None)?)
    }
}

/// Computes one linear layer of [`Gpt::forward_cached`]: given the graph, the layer's input
/// and the layer's index in [`Gpt::linears`] order, returns its output.
pub type LinearFn<'f> =
    dyn for<'g> FnMut(&mut Graph<'g>, Tensor, usize) -> Result<Tensor, ModelError> + 'f;

impl Gpt {
    /// Logits `[batch, Tn, vocab]` of `tokens: [batch, Tn]`, the tokens at positions
    /// `cache.len()..cache.len() + Tn` of `batch` sequences whose earlier keys and values are
    /// in `cache`; appends the new keys and values to it (inference: no gradient).
    ///
    /// The same ops as [`Gpt::forward_logits`] in the same order, except that attention over
    /// an earlier prefix runs as [`Graph::cached_attention`] (the first call, on an empty
    /// cache, uses [`Graph::causal_attention`] like training) and every linear layer is
    /// computed by `linear` (index in [`Gpt::linears`] order: `4·block + {0 qkv, 1 out, 2 up,
    /// 3 down}`, the LM head `4·n_layers`), so a sampler can use weights quantized once.
    pub fn forward_cached(
        &self,
        g: &mut Graph<'_>,
        tokens: &[u32],
        batch: usize,
        attention: AttentionPrecision,
        cache: &mut crate::rl::kv_cache::KvCache,
        linear: &mut LinearFn<'_>,
    ) -> Result<Tensor, ModelError> {
        let cfg = &self.cfg;
        if batch == 0
            || tokens.is_empty()
            || !tokens.len().is_multiple_of(batch)
            || batch != cache.batch()
        {
            return Err(ModelError::Invalid(format!(
                "{} tokens do not form {batch} rows of a cache of {} rows",
                tokens.len(),
                cache.batch()
            )));
        }
        let t = tokens.len() / batch;
        let past = cache.len();
        if past + t > cache.capacity() {
            return Err(ModelError::Invalid(format!(
                "{} cached + {t} new positions exceed the cache's {}",
                past,
                cache.capacity()
            )));
        }
        let e = g.param(self.embed)?;
        let mut x = g.embedding(tokens, &[batch, t], e)?;
        let d = cfg.d_model;
        let bf16_attn = attention == AttentionPrecision::Bf16;
        let products = AttentionProducts::bf16_if(bf16_attn);
        for (i, b) in self.blocks.iter().enumerate() {
            let w = g.param(b.attn_norm)?;
            let h = g.rmsnorm(x, w, cfg.norm_eps)?;
            let qkv = linear(g, h, 4 * i)?;
            let parts = g.split(qkv, &[d, d, d])?;
            let mut q = g.split_heads(parts[0], cfg.n_heads)?;
            let mut k = g.split_heads(parts[1], cfg.n_heads)?;
            let mut v = g.split_heads(parts[2], cfg.n_heads)?;
            q = g.rope(q, cfg.rope_base, past)?;
            k = g.rope(k, cfg.rope_base, past)?;
            if bf16_attn {
                q = g.round_bf16(q)?;
                k = g.round_bf16(k)?;
                v = g.round_bf16(v)?;
            }
            if g.device() == autograd::Device::Cpu {
                cache.write(i, g.value(k)?, g.value(v)?, t);
            } else {
                cache.write(i, &g.to_vec(k)?, &g.to_vec(v)?, t);
            }
            let a = if past == 0 {
                g.causal_attention_with(q, k, v, products)?
            } else {
                let (kc, vc) = cache.layer(i);
                g.cached_attention_with(q, kc, vc, cache.capacity(), past, products)?
            };
            let a = g.merge_heads(a)?;
            let a = linear(g, a, 4 * i + 1)?;
            x = g.add(x, a)?;
            let w = g.param(b.mlp_norm)?;
            let h = g.rmsnorm(x, w, cfg.norm_eps)?;
            let u = linear(g, h, 4 * i + 2)?;
            let m = match cfg.mlp {
                MlpKind::Swiglu => {
                    let gu = g.split(u, &[cfg.hidden, cfg.hidden])?;
                    g.swiglu(gu[0], gu[1])?
                }
                MlpKind::Gelu => g.gelu(u)?,
            };
            let m = linear(g, m, 4 * i + 3)?;
            x = g.add(x, m)?;
        }
        cache.advance(t);
        let w = g.param(self.final_norm)?;
        let x = g.rmsnorm(x, w, cfg.norm_eps)?;
        linear(g, x, 4 * cfg.n_layers)
    }
}

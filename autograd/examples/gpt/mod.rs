//! A small GPT built from autograd ops: pre-norm RMSNorm, RoPE, causal attention, SwiGLU MLP,
//! untied LM head. Shared by the `step_bench` example and the transformer gradient check
//! (`tests/transformer.rs`); the `trainer` crate has the full model.

#![allow(dead_code)]

use autograd::{init, Graph, ParamId, ParamStore, QkvAttention, Result, Tensor};
use quant::GemmPolicy;

/// Model shape.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    pub vocab: usize,
    pub d_model: usize,
    pub n_heads: usize,
    pub n_layers: usize,
    /// SwiGLU hidden width.
    pub hidden: usize,
    pub rope_base: f32,
    pub eps: f32,
}

/// Parameter handles of one transformer block.
pub struct Block {
    pub attn_norm: ParamId,
    pub qkv: ParamId,
    pub proj: ParamId,
    pub mlp_norm: ParamId,
    pub gate: ParamId,
    pub up: ParamId,
    pub down: ParamId,
}

pub struct Gpt {
    pub cfg: Config,
    pub emb: ParamId,
    pub blocks: Vec<Block>,
    pub final_norm: ParamId,
    pub head: ParamId,
}

impl Block {
    pub fn new(ps: &mut ParamStore, cfg: &Config, prefix: &str, seed: u64) -> Result<Block> {
        let (d, h) = (cfg.d_model, cfg.hidden);
        let std = 0.02f32.max(1.0 / (d as f32).sqrt() * 0.5);
        let mut lin = |name: &str, o: usize, i: usize, k: u64| {
            ps.add(
                &format!("{prefix}.{name}"),
                &[o, i],
                init::normal(o * i, std, seed * 16 + k),
            )
        };
        let qkv = lin("attn.qkv", 3 * d, d, 1)?;
        let proj = lin("attn.proj", d, d, 2)?;
        let gate = lin("mlp.gate", h, d, 3)?;
        let up = lin("mlp.up", h, d, 4)?;
        let down = lin("mlp.down", d, h, 5)?;
        let attn_norm = ps.add_filled(&format!("{prefix}.attn_norm"), &[d], 1.0)?;
        let mlp_norm = ps.add_filled(&format!("{prefix}.mlp_norm"), &[d], 1.0)?;
        Ok(Block {
            attn_norm,
            qkv,
            proj,
            mlp_norm,
            gate,
            up,
            down,
        })
    }

    /// `x: [B, T, d] → [B, T, d]`. `layer` numbers the block (random streams `8·layer + i`).
    pub fn forward(
        &self,
        g: &mut Graph<'_>,
        cfg: &Config,
        x: Tensor,
        layer: u64,
        policy: &GemmPolicy,
    ) -> Result<Tensor> {
        let s = 8 * layer;
        // attention
        let w = g.param(self.attn_norm)?;
        let h = g.rmsnorm(x, w, cfg.eps)?;
        let w = g.param(self.qkv)?;
        let qkv = g.linear(h, w, None, policy, s)?;
        let spec = QkvAttention {
            heads: cfg.n_heads,
            rope_base: cfg.rope_base,
            // BF16 attention under every low-precision policy, as the trainer's recipes and
            // torch's BF16 autocast run it
            round_bf16: *policy != GemmPolicy::FP32,
        };
        let a = g.qkv_attention(qkv, spec)?;
        let w = g.param(self.proj)?;
        let a = g.linear(a, w, None, policy, s + 1)?;
        let x = g.add(x, a)?;
        // MLP
        let w = g.param(self.mlp_norm)?;
        let h = g.rmsnorm(x, w, cfg.eps)?;
        let w = g.param(self.gate)?;
        let gt = g.linear(h, w, None, policy, s + 2)?;
        let w = g.param(self.up)?;
        let u = g.linear(h, w, None, policy, s + 3)?;
        let m = g.swiglu(gt, u)?;
        let w = g.param(self.down)?;
        let m = g.linear(m, w, None, policy, s + 4)?;
        g.add(x, m)
    }
}

impl Gpt {
    pub fn new(ps: &mut ParamStore, cfg: Config, seed: u64) -> Result<Gpt> {
        let emb = ps.add(
            "emb",
            &[cfg.vocab, cfg.d_model],
            init::normal(cfg.vocab * cfg.d_model, 1.0, seed),
        )?;
        let blocks = (0..cfg.n_layers)
            .map(|l| Block::new(ps, &cfg, &format!("blocks.{l}"), seed + 1 + l as u64))
            .collect::<Result<Vec<_>>>()?;
        let final_norm = ps.add_filled("final_norm", &[cfg.d_model], 1.0)?;
        let std = 1.0 / (cfg.d_model as f32).sqrt();
        let head = ps.add(
            "head",
            &[cfg.vocab, cfg.d_model],
            init::normal(cfg.vocab * cfg.d_model, std, seed + 999),
        )?;
        Ok(Gpt {
            cfg,
            emb,
            blocks,
            final_norm,
            head,
        })
    }

    /// Mean next-token cross-entropy of `tokens: [batch, T]` against `targets`. Block linears
    /// use `policy`, the LM head `head_policy`.
    pub fn loss(
        &self,
        g: &mut Graph<'_>,
        tokens: &[u32],
        targets: &[u32],
        batch: usize,
        policy: &GemmPolicy,
        head_policy: &GemmPolicy,
    ) -> Result<Tensor> {
        let t = tokens.len() / batch;
        let e = g.param(self.emb)?;
        let mut x = g.embedding(tokens, &[batch, t], e)?;
        for (l, b) in self.blocks.iter().enumerate() {
            x = b.forward(g, &self.cfg, x, l as u64, policy)?;
        }
        let w = g.param(self.final_norm)?;
        let x = g.rmsnorm(x, w, self.cfg.eps)?;
        let w = g.param(self.head)?;
        let logits = g.linear(x, w, None, head_policy, 8 * self.cfg.n_layers as u64)?;
        g.cross_entropy(logits, targets, None)
    }
}

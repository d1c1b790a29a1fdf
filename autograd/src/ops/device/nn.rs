//! Device arms of the activations, SwiGLU, RMSNorm / LayerNorm, RoPE, embedding,
//! cross-entropy and causal attention.

use super::{dev_backward, DevGrad};
use crate::backend::{Act, Backend, NormKind};
use crate::{AttentionProducts, Graph, Result, Shape, Tensor};

impl Graph<'_> {
    /// GELU / SiLU.
    pub(crate) fn dev_act(&mut self, op: &'static str, kind: Act, x: Tensor) -> Result<Tensor> {
        let sx = self.shape(x)?;
        let be = self.be()?;
        let mut y = be.zeros(sx.numel())?;
        be.act_fwd(kind, self.values().dev(x)?, &mut y)?;
        let bw = self.needs_grad(&[x]).then(|| {
            dev_backward(move |ctx, dy| {
                if let Some(mut g) = ctx.take(x)? {
                    ctx.be.act_bwd(kind, ctx.val(x)?, dy, g.out())?;
                    ctx.put(x, g)?;
                }
                Ok(())
            })
        });
        Ok(self.push_dev(op, y, sx, bw))
    }

    /// `silu(gate) ⊙ up`.
    pub(crate) fn dev_swiglu(&mut self, gate: Tensor, up: Tensor, s: Shape) -> Result<Tensor> {
        let be = self.be()?;
        let mut y = be.zeros(s.numel())?;
        let v = self.values();
        be.swiglu_fwd(v.dev(gate)?, v.dev(up)?, &mut y)?;
        let bw = self.needs_grad(&[gate, up]).then(|| {
            dev_backward(move |ctx, dy| {
                let (mut gg, mut gu) = (ctx.take(gate)?, ctx.take(up)?);
                ctx.be.swiglu_bwd(
                    ctx.val(gate)?,
                    ctx.val(up)?,
                    dy,
                    gg.as_mut().map(DevGrad::out),
                    gu.as_mut().map(DevGrad::out),
                )?;
                put_all(ctx, [(gate, gg), (up, gu)])
            })
        });
        Ok(self.push_dev("swiglu", y, s, bw))
    }

    /// RMSNorm (`b == None`, `kind == Rms`) or LayerNorm over rows of `w`'s length.
    pub(crate) fn dev_norm(
        &mut self,
        kind: NormKind,
        x: Tensor,
        w: Tensor,
        b: Option<Tensor>,
        eps: f32,
    ) -> Result<Tensor> {
        let sx = self.shape(x)?;
        let be = self.be()?;
        let inputs: Vec<Tensor> = [Some(x), Some(w), b].into_iter().flatten().collect();
        let rg = self.needs_grad(&inputs);
        let per_row = if kind == NormKind::Rms { 1 } else { 2 };
        let mut y = be.zeros(sx.numel())?;
        let mut stats = be.zeros(per_row * sx.rows())?;
        let v = self.values();
        let st = rg.then_some(&mut stats);
        match kind {
            NormKind::Rms => be.rmsnorm_fwd(v.dev(x)?, v.dev(w)?, eps, &mut y, st)?,
            NormKind::Layer => {
                let bv = b.map(|b| v.dev(b)).transpose()?;
                be.layernorm_fwd(v.dev(x)?, v.dev(w)?, bv, eps, &mut y, st)?
            }
        }
        let op = if kind == NormKind::Rms {
            "rmsnorm"
        } else {
            "layernorm"
        };
        let bw = rg.then(|| {
            dev_backward(move |ctx, dy| {
                let (mut gx, mut gw) = (ctx.take(x)?, ctx.take(w)?);
                let mut gb = match b {
                    Some(b) => ctx.take(b)?,
                    None => None,
                };
                ctx.be.norm_bwd(
                    kind,
                    ctx.val(x)?,
                    ctx.val(w)?,
                    &stats,
                    dy,
                    gx.as_mut().map(DevGrad::out),
                    gw.as_mut().map(DevGrad::out),
                    gb.as_mut().map(DevGrad::out),
                )?;
                put_all(ctx, [(x, gx), (w, gw)])?;
                if let (Some(b), Some(g)) = (b, gb) {
                    ctx.put(b, g)?;
                }
                Ok(())
            })
        });
        Ok(self.push_dev(op, y, sx, bw))
    }

    /// RoPE on `[.., t, d]` with the CPU op's f64 table.
    pub(crate) fn dev_rope(
        &mut self,
        x: Tensor,
        base: f32,
        pos_offset: usize,
        t: usize,
        d: usize,
    ) -> Result<Tensor> {
        let sx = self.shape(x)?;
        let be = self.be()?;
        // one upload per table and graph (a step's layers share it: q and k of every block)
        let key = (t, d, base.to_bits(), pos_offset);
        let tab = match self.dev_rope_cache.get(&key) {
            Some(tab) => tab.clone(),
            None => {
                let host = self.rope_tab(t, d, base, pos_offset);
                let tab = std::rc::Rc::new(be.upload(&host)?);
                self.dev_rope_cache.insert(key, tab.clone());
                tab
            }
        };
        let mut y = be.zeros(sx.numel())?;
        be.rope(self.values().dev(x)?, &tab, t, d, false, (false, &mut y))?;
        let bw = self.needs_grad(&[x]).then(|| {
            dev_backward(move |ctx, dy| {
                if let Some(mut g) = ctx.take(x)? {
                    ctx.be.rope(dy, &tab, t, d, true, g.out())?;
                    ctx.put(x, g)?;
                }
                Ok(())
            })
        });
        Ok(self.push_dev("rope", y, sx, bw))
    }

    /// Rows `ids` of a `[V, d]` table (ids already checked against `V`).
    pub(crate) fn dev_embedding(
        &mut self,
        ids: &[u32],
        table: Tensor,
        d: usize,
        out_shape: Shape,
    ) -> Result<Tensor> {
        let be = self.be()?;
        let mut y = be.zeros(out_shape.numel())?;
        be.embedding_fwd(self.values().dev(table)?, d, ids, &mut y)?;
        let bw = self.needs_grad(&[table]).then(|| {
            let ids = ids.to_vec();
            dev_backward(move |ctx, dy| {
                if let Some(mut g) = ctx.take(table)? {
                    ctx.be.embedding_bwd(&ids, dy, d, g.out())?;
                    ctx.put(table, g)?;
                }
                Ok(())
            })
        });
        Ok(self.push_dev("embedding", y, out_shape, bw))
    }

    /// Mean cross-entropy over the counted rows (targets already checked against `v`).
    pub(crate) fn dev_cross_entropy(
        &mut self,
        logits: Tensor,
        targets: &[u32],
        ignore: Option<u32>,
        v: usize,
    ) -> Result<Tensor> {
        let be = self.be()?;
        let mut stats = be.zeros(2 * targets.len())?;
        let mut loss = be.zeros(1)?;
        let lv = self.values().dev(logits)?;
        be.cross_entropy_fwd(lv, v, targets, ignore, &mut stats, &mut loss)?;
        let bw = self.needs_grad(&[logits]).then(|| {
            let targets = targets.to_vec();
            dev_backward(move |ctx, dy| {
                if let Some(mut g) = ctx.take(logits)? {
                    let lv = ctx.val(logits)?;
                    ctx.be
                        .cross_entropy_bwd(lv, v, &targets, ignore, &stats, dy, g.out())?;
                    ctx.put(logits, g)?;
                }
                Ok(())
            })
        });
        Ok(self.push_dev("cross_entropy", loss, Shape::scalar(), bw))
    }

    /// Fused causal attention on `[B, H, T, D]` (`bh = B·H`).
    pub(crate) fn dev_attention(
        &mut self,
        [q, k, v]: [Tensor; 3],
        s: Shape,
        (bh, t, d): (usize, usize, usize),
        products: AttentionProducts,
    ) -> Result<Tensor> {
        let be = self.be()?;
        let mut o = be.zeros(s.numel())?;
        let mut lse = be.zeros(bh * t)?;
        let vals = self.values();
        let (qv, kv, vv) = (vals.dev(q)?, vals.dev(k)?, vals.dev(v)?);
        be.attention_fwd(qv, kv, vv, bh, t, d, products, &mut o, &mut lse)?;
        let me = self.next_tensor();
        let bw = self.needs_grad(&[q, k, v]).then(|| {
            dev_backward(move |ctx, dy| {
                let n = bh * t * d;
                // the kernel writes all three gradients: scratch for those not wanted
                let (xq, mut gq) = take_or_scratch(ctx, q, n)?;
                let (xk, mut gk) = take_or_scratch(ctx, k, n)?;
                let (xv, mut gv) = take_or_scratch(ctx, v, n)?;
                let qkvo = [ctx.val(q)?, ctx.val(k)?, ctx.val(v)?, ctx.val(me)?];
                let (oq, ok, ov) = (gq.out(), gk.out(), gv.out());
                ctx.be
                    .attention_bwd(qkvo, &lse, dy, bh, t, d, products, oq, ok, ov)?;
                put_all(
                    ctx,
                    [
                        (q, xq.then_some(gq)),
                        (k, xk.then_some(gk)),
                        (v, xv.then_some(gv)),
                    ],
                )?;
                Ok(())
            })
        });
        Ok(self.push_dev("causal_attention", o, s, bw))
    }
}

/// The gradient buffer of `x`, or zeroed scratch (`false`) when `x` needs none.
fn take_or_scratch(ctx: &mut super::DevCtx<'_>, x: Tensor, n: usize) -> Result<(bool, DevGrad)> {
    Ok(match ctx.take(x)? {
        Some(g) => (true, g),
        None => (
            false,
            DevGrad {
                buf: ctx.be.zeros(n)?,
                fresh: true,
            },
        ),
    })
}

/// Puts back every taken gradient.
fn put_all<const N: usize>(
    ctx: &mut super::DevCtx<'_>,
    grads: [(Tensor, Option<DevGrad>); N],
) -> Result<()> {
    for (t, g) in grads {
        if let Some(g) = g {
            ctx.put(t, g)?;
        }
    }
    Ok(())
}

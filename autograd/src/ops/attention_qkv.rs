//! Causal self-attention straight from a fused QKV projection: `[B, T, 3·H·D] → [B, T, H·D]`.
//!
//! The same arithmetic, in the same order, as the unfused chain a GPT block used to build
//! (`split` into Q, K, V → `split_heads` → `rope` on Q and K → optional `round_bf16` →
//! [`Graph::causal_attention`] → `merge_heads`), so every output and gradient is bit for bit
//! that chain's; only the layout work is gone. Per batch row and head, the forward reads the
//! head's Q, K and V rows out of the `[T, 3, H, D]` input, rotates Q and K into one
//! contiguous `[T, D]` buffer each (kept for the backward), runs the fused attention kernel,
//! and writes the head's output into its columns of `[T, H·D]`. The backward reads `dO` and
//! `O` in place through strided views, runs the attention backward into per-head scratch, and
//! writes `dQ` and `dK` rotated back (RoPE's backward) and `dV` into the head's columns of
//! `dQKV`. Batch rows run in parallel, the heads of one row in order, so the
//! results do not depend on the number of threads.
//!
//! With BF16 attention the chain rounds Q, K and V to BF16 before the products; here they stay
//! as RoPE leaves them, because they are used only as operands of the BF16 products, which
//! round every operand to BF16 themselves with the same rounding
//! (`Multiplier`: the BF16 unit's packing, or a rounded copy for the f32 GEMM), so the
//! results are the same bits without a rounding pass.

use quant::gemm::MatRef;
use rayon::prelude::*;

use super::attention::cpu::{head_backward, head_forward, head_view};
use super::attention::BQ;
use super::attention_products::{AttentionProducts, Multiplier};
use super::rope::cpu::rotate;
use crate::cpu::{dot, simd, store_over_zero};
use crate::error::{arg_err, shape_err};
use crate::graph::backward_fn;
use crate::{Graph, Result, Shape, Tensor};

/// What [`Graph::qkv_attention`] does around the attention itself.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QkvAttention {
    /// Heads `H`: the input's `3·C` channels hold Q, K and V of `C = H·D` channels each.
    pub heads: usize,
    /// RoPE frequency base for Q and K (positions `0..T`; finite and > 1).
    pub rope_base: f32,
    /// BF16 attention ([`AttentionProducts::Bf16`]): Q, K and V rounded to BF16 after RoPE
    /// (straight-through gradient), and so are P, dO and dS inside; the products accumulate
    /// in FP32 on the BF16 GEMM (on a device: in the attention kernel's order).
    pub round_bf16: bool,
}

impl Graph<'_> {
    /// Causal self-attention of `qkv: [B, T, 3·C]` (Q, K, V side by side, each `[H, D]` per
    /// position, `D = C / H` even): RoPE on Q and K, optional BF16 rounding, then
    /// `softmax(QKᵀ/√D + causal mask) V` per head; returns `[B, T, C]` (heads side by side).
    /// Bit for bit the composition `split`, `split_heads`, `rope`, `round_bf16`,
    /// [`Graph::causal_attention`], `merge_heads`, forward and backward.
    ///
    /// ```
    /// use autograd::{Graph, ParamStore, QkvAttention};
    /// let mut ps = ParamStore::new();
    /// let mut g = Graph::new(&mut ps);
    /// // B = 1, T = 2, one head of D = 2: the first position sees only its own value
    /// let qkv = g.input(&[1.0, 0.0, 1.0, 0.0, 2.0, 4.0, 1.0, 0.0, 1.0, 0.0, 6.0, 8.0], &[1, 2, 6])?;
    /// let spec = QkvAttention { heads: 1, rope_base: 10000.0, round_bf16: false };
    /// let o = g.qkv_attention(qkv, spec)?;
    /// assert_eq!(g.shape(o)?.dims(), &[1, 2, 2]);
    /// assert_eq!(&g.value(o)?[..2], &[2.0, 4.0]);
    /// # Ok::<(), autograd::Error>(())
    /// ```
    pub fn qkv_attention(&mut self, qkv: Tensor, spec: QkvAttention) -> Result<Tensor> {
        let sx = self.shape(qkv)?;
        if sx.rank() != 3 {
            return shape_err("qkv_attention", format!("expected [B, T, 3*H*D], got {sx}"));
        }
        let [b, t, c3] = [sx.dims()[0], sx.dims()[1], sx.dims()[2]];
        let h = spec.heads;
        if h == 0 || c3 % (3 * h) != 0 || !(c3 / (3 * h)).is_multiple_of(2) {
            return arg_err(
                "qkv_attention",
                format!("{c3} channels do not split into Q, K, V of {h} heads of even size"),
            );
        }
        if !(spec.rope_base > 1.0 && spec.rope_base.is_finite()) {
            return arg_err(
                "qkv_attention",
                format!("rope base must be finite and > 1, got {}", spec.rope_base),
            );
        }
        if self.dev.is_some() {
            return self.qkv_attention_composed(qkv, spec);
        }
        let (c, d) = (c3 / 3, c3 / (3 * h));
        let dims = Dims { t, h, d };
        let heads_shape = Shape::new(&[b, h, t, d])?;
        let tab = self.rope_tab(t, d, spec.rope_base, 0);
        let n = b * t * c;
        let (mut qh, mut kh, mut vh) = (self.alloc(n), self.alloc(n), self.alloc(n));
        let mut out = self.alloc(n);
        let mut lse = vec![0.0f32; b * h * t];
        let products = AttentionProducts::bf16_if(spec.round_bf16);
        cpu::forward(
            self.values().get(qkv),
            &tab,
            dims,
            spec.round_bf16,
            [qh.as_mut_slice(), kh.as_mut_slice(), vh.as_mut_slice()],
            out.as_mut_slice(),
            &mut lse,
        );
        let qh = self.push("qkv_attention.q", qh, heads_shape, None);
        let kh = self.push("qkv_attention.k", kh, heads_shape, None);
        let vh = self.push("qkv_attention.v", vh, heads_shape, None);
        let me = self.next_tensor();
        let bw = self.needs_grad(&[qkv]).then(|| {
            backward_fn(move |ctx, dy| {
                if let Some(mut g) = ctx.take(qkv) {
                    let acc = g.acc();
                    let x = ctx.vals;
                    cpu::backward(
                        [x.get(qh), x.get(kh), x.get(vh), x.get(me)],
                        &lse,
                        dy,
                        &tab,
                        dims,
                        products,
                        acc,
                        g.slice(),
                    );
                    g.fresh = false;
                    ctx.put(qkv, g);
                }
                Ok(())
            })
        });
        Ok(self.push("qkv_attention", out, Shape::new(&[b, t, c])?, bw))
    }

    /// [`Graph::qkv_attention`] as the chain of separate ops it fuses (the device path, and
    /// the reference the fused kernels are tested against).
    pub(crate) fn qkv_attention_composed(
        &mut self,
        qkv: Tensor,
        spec: QkvAttention,
    ) -> Result<Tensor> {
        let c = self.shape(qkv)?.last() / 3;
        let parts = self.split(qkv, &[c, c, c])?;
        let mut q = self.split_heads(parts[0], spec.heads)?;
        let mut k = self.split_heads(parts[1], spec.heads)?;
        let v = self.split_heads(parts[2], spec.heads)?;
        q = self.rope(q, spec.rope_base, 0)?;
        k = self.rope(k, spec.rope_base, 0)?;
        // BF16 products round Q, K and V themselves (to the same values a `round_bf16` op
        // would give, whose gradient passes straight through): no separate rounding
        let products = AttentionProducts::bf16_if(spec.round_bf16);
        let a = self.causal_attention_with(q, k, v, products)?;
        self.merge_heads(a)
    }
}

/// Sequence length, heads and head size of one call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    t: usize,
    h: usize,
    d: usize,
}

/// CPU kernels.
pub(crate) mod cpu {
    use super::*;

    /// Row `r` of a `[rows, n]` matrix at column `col`, `len` wide.
    #[inline(always)]
    fn at(x: &[f32], n: usize, r: usize, col: usize, len: usize) -> &[f32] {
        &x[r * n + col..r * n + col + len]
    }

    /// Forward: fills the per-head `heads = [Q, K, V]` buffers (`[B, H, T, D]`, Q and K
    /// rotated; not rounded: `round` selects BF16 products, which round their operands), `out:
    /// [B, T, C]` and `lse: [B, H, T]`.
    pub(crate) fn forward(
        qkv: &[f32],
        tab: &[f32],
        dims: Dims,
        round: bool,
        heads: [&mut [f32]; 3],
        out: &mut [f32],
        lse: &mut [f32],
    ) {
        let Dims { t, h, d } = dims;
        let (c, hd) = (h * d, t * d);
        if hd == 0 || h == 0 {
            return;
        }
        let [qh, kh, vh] = heads;
        out.par_chunks_mut(t * c)
            .zip(qh.par_chunks_mut(h * hd))
            .zip(kh.par_chunks_mut(h * hd))
            .zip(vh.par_chunks_mut(h * hd))
            .zip(lse.par_chunks_mut(h * t))
            .enumerate()
            .for_each_init(
                || {
                    let products = AttentionProducts::bf16_if(round);
                    (vec![0.0f32; BQ.min(t) * t + hd], Multiplier::new(products))
                },
                |(scr, mul), (bi, ((((o, qb), kb), vb), l))| {
                    let x = &qkv[bi * t * 3 * c..(bi + 1) * t * 3 * c];
                    simd(
                        #[inline(always)]
                        || {
                            let (s, oh) = scr.split_at_mut(BQ.min(t) * t);
                            for hi in 0..h {
                                let r = hi * hd..(hi + 1) * hd;
                                let q = &mut qb[r.clone()];
                                let (k, v) = (&mut kb[r.clone()], &mut vb[r]);
                                gather(x, tab, dims, hi, [q, k, v]);
                                let l = &mut l[hi * t..(hi + 1) * t];
                                let views = [&*q, &*k, &*v].map(|y| MatRef::row_major(y, t, d));
                                head_forward(views, t, d, oh, l, s, mul);
                                for (i, row) in oh.chunks_exact(d).enumerate() {
                                    o[i * c + hi * d..i * c + (hi + 1) * d].copy_from_slice(row);
                                }
                            }
                        },
                    );
                },
            );
    }

    /// One head's `[T, D]` Q, K and V out of a batch row's `[T, 3·C]` input: Q and K rotated
    /// by RoPE.
    #[inline(always)]
    fn gather(x: &[f32], tab: &[f32], dims: Dims, hi: usize, o: [&mut [f32]; 3]) {
        let Dims { t, h, d } = dims;
        let c = h * d;
        let [q, k, v] = o;
        let set = |y: &mut f32, v: f32| *y = v;
        for (p, ((qr, kr), vr)) in q
            .chunks_exact_mut(d)
            .zip(k.chunks_exact_mut(d))
            .zip(v.chunks_exact_mut(d))
            .enumerate()
        {
            rotate(at(x, 3 * c, p, hi * d, d), tab, t, p, false, qr, set);
            rotate(at(x, 3 * c, p, c + hi * d, d), tab, t, p, false, kr, set);
            vr.copy_from_slice(at(x, 3 * c, p, 2 * c + hi * d, d));
        }
    }

    /// Backward: `x = [Q, K, V, O]` (the per-head buffers and the `[B, T, C]` output),
    /// `dout: [B, T, C]`; writes (`acc`: adds) `dqkv: [B, T, 3·C]`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn backward(
        x: [&[f32]; 4],
        lse: &[f32],
        dout: &[f32],
        tab: &[f32],
        dims: Dims,
        products: AttentionProducts,
        acc: bool,
        dqkv: &mut [f32],
    ) {
        let Dims { t, h, d } = dims;
        let (c, hd) = (h * d, t * d);
        if hd == 0 || h == 0 {
            return;
        }
        let [qa, ka, va, oa] = x;
        dqkv.par_chunks_mut(t * 3 * c).enumerate().for_each_init(
            || {
                let scr = vec![0.0f32; 2 * BQ.min(t) * t + t + 3 * hd];
                (scr, Multiplier::new(products))
            },
            |(scr, mul), (bi, g)| {
                let tc = bi * t * c..(bi + 1) * t * c;
                let (dy, o) = (&dout[tc.clone()], &oa[tc]);
                simd(
                    #[inline(always)]
                    || {
                        let (grads, scr) = scr.split_at_mut(3 * hd);
                        let (delta, scr) = scr.split_at_mut(t);
                        let (dq, rest) = grads.split_at_mut(hd);
                        let (dk, dv) = rest.split_at_mut(hd);
                        for hi in 0..h {
                            let m = |y| head_view(y, bi * h + hi, t, d);
                            let dom = MatRef {
                                data: &dy[hi * d..],
                                rows: t,
                                cols: d,
                                row_stride: c,
                                col_stride: 1,
                            };
                            for (i, dl) in delta.iter_mut().enumerate() {
                                *dl = dot(at(dy, c, i, hi * d, d), at(o, c, i, hi * d, d));
                            }
                            let l = &lse[(bi * h + hi) * t..(bi * h + hi + 1) * t];
                            let views = [m(qa), m(ka), m(va), dom];
                            let gs = [&mut *dq, &mut *dk, &mut *dv];
                            head_backward(views, l, delta, t, d, gs, [0.0; 3], scr, mul);
                            scatter(g, tab, dims, hi, acc, [dq, dk, dv]);
                        }
                    },
                );
            },
        );
    }

    /// Writes (`acc`: adds) one head's `[T, D]` gradients into a batch row's `[T, 3·C]`
    /// `dQKV`: dQ and dK rotated back (RoPE's backward), dV as is, with the bits of the
    /// unfused chain's zero-filled `split` gradient ([`store_over_zero`]).
    #[inline(always)]
    fn scatter(g: &mut [f32], tab: &[f32], dims: Dims, hi: usize, acc: bool, gs: [&[f32]; 3]) {
        let Dims { t, h, d } = dims;
        let c = h * d;
        let put = move |y: &mut f32, v: f32| store_over_zero(acc, y, v);
        for (p, row) in g.chunks_exact_mut(3 * c).enumerate() {
            let (gq, rest) = row.split_at_mut(c);
            let (gk, gv) = rest.split_at_mut(c);
            let r = hi * d..(hi + 1) * d;
            let (gq, gk, gv) = (&mut gq[r.clone()], &mut gk[r.clone()], &mut gv[r]);
            let src = |i: usize| &gs[i][p * d..(p + 1) * d];
            rotate(src(0), tab, t, p, true, gq, put);
            rotate(src(1), tab, t, p, true, gk, put);
            for (y, &v) in gv.iter_mut().zip(src(2)) {
                put(y, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::QkvAttention;
    use crate::{init, Error, Graph, ParamStore};

    /// Bits of the fused op's output and `qkv` gradient, and of the unfused chain's.
    fn both(b: usize, t: usize, h: usize, d: usize, round: bool) -> [(Vec<u32>, Vec<u32>); 2] {
        let n = b * t * 3 * h * d;
        let xs = init::normal(n, 1.0, 11);
        let w = init::normal(b * t * h * d, 1.0, 12);
        let spec = QkvAttention {
            heads: h,
            rope_base: 10000.0,
            round_bf16: round,
        };
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        [false, true].map(|fused| {
            let mut ps = ParamStore::new();
            let mut g = Graph::new(&mut ps);
            let x = g.variable(&xs, &[b, t, 3 * h * d]).unwrap();
            let wt = g.input(&w, &[b, t, h * d]).unwrap();
            let o = if fused {
                g.qkv_attention(x, spec).unwrap()
            } else {
                g.qkv_attention_composed(x, spec).unwrap()
            };
            let y = g.mul(o, wt).unwrap();
            let l = g.sum(y).unwrap();
            g.backward(l).unwrap();
            (bits(g.value(o).unwrap()), bits(g.grad(x).unwrap().unwrap()))
        })
    }

    #[test]
    fn fused_equals_unfused_chain_bit_for_bit() {
        // one and several query blocks (a partial one), 1 and 4 heads, BF16 on and off
        for (b, t, h, d, round) in [
            (2, 5, 1, 4, false),
            (3, 70, 4, 8, true),
            (2, 130, 2, 16, false),
            (1, 64, 3, 2, true),
        ] {
            let [fused, chain] = both(b, t, h, d, round);
            assert_eq!(fused.0, chain.0, "output, {b}x{t} h{h} d{d} round {round}");
            assert_eq!(
                fused.1, chain.1,
                "gradient, {b}x{t} h{h} d{d} round {round}"
            );
        }
    }

    #[test]
    fn qkv_attention_rejects_bad_shapes() {
        let mut ps = ParamStore::new();
        let mut g = Graph::new(&mut ps);
        let spec = |heads, rope_base| QkvAttention {
            heads,
            rope_base,
            round_bf16: false,
        };
        let x = g.input(&[0.0; 24], &[1, 2, 12]).unwrap();
        let x4 = g.input(&[0.0; 24], &[1, 1, 2, 12]).unwrap();
        assert!(matches!(
            g.qkv_attention(x4, spec(1, 1e4)),
            Err(Error::Shape { .. })
        ));
        for (heads, base) in [(0, 1e4), (3, 1e4), (4, 1e4), (1, 1.0), (1, f32::NAN)] {
            assert!(matches!(
                g.qkv_attention(x, spec(heads, base)),
                Err(Error::InvalidArgument { .. })
            ));
        }
        assert!(g.qkv_attention(x, spec(2, 1e4)).is_ok());
    }
}

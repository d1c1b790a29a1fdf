//! Fused causal scaled-dot-product attention on `[B, H, T, D]` tensors.
//!
//! Per (batch, head) and per block of `BQ` queries, the forward pass computes the score strip
//! `S = QKᵀ/√D` over the keys the block can see (causal: key `j ≤ t`), a numerically stable
//! softmax row by row, and `O = P V`; the products run in the arithmetic the caller picks
//! ([`AttentionProducts`]: the f32 GEMM, or BF16 operands on the BF16 GEMM). Only
//! one `BQ × T` strip per worker exists at a time (never the `T × T` matrix), and only the
//! per-row log-sum-exp is saved for backward, which recomputes `P` strip by strip
//! (FlashAttention's recipe):
//!
//! ```text
//! dV += Pᵀ dO      dP = dO Vᵀ      dS = P ⊙ (dP − rowsum(dO ⊙ O))
//! dQ  = dS K / √D  dK += dSᵀ Q / √D
//! ```
//! Heads run in parallel; the blocks of one head run in a fixed order, so results are
//! deterministic on any number of threads.

use quant::gemm::MatRef;
use rayon::prelude::*;

use super::attention_products::{AttentionProducts, Multiplier};

use crate::cpu::{dot, exp, max, simd, sum16};
use crate::error::shape_err;
use crate::graph::{backward_fn, BackwardCtx, Grad};
use crate::{Graph, Result, Tensor};

/// Queries per block.
pub(crate) const BQ: usize = 64;

/// The gradient buffer of `x`, or a scratch buffer to discard when `x` needs none.
fn take_or_scratch(ctx: &mut BackwardCtx<'_>, x: Tensor, n: usize) -> (Grad, bool) {
    match ctx.take(x) {
        Some(g) => (g, true),
        None => (
            Grad {
                buf: ctx.pool.take(n),
                fresh: true,
            },
            false,
        ),
    }
}

impl Graph<'_> {
    /// Causal self-attention `softmax(QKᵀ/√D + causal mask) V` for `q, k, v: [B, H, T, D]`
    /// (query `t` sees keys `0..=t`); returns `[B, H, T, D]`.
    ///
    /// ```
    /// use autograd::{Graph, ParamStore};
    /// let mut ps = ParamStore::new();
    /// let mut g = Graph::new(&mut ps);
    /// // B = H = 1, T = 2, D = 1: the first query sees only the first value
    /// let q = g.input(&[1.0, 1.0], &[1, 1, 2, 1])?;
    /// let k = g.input(&[0.0, 0.0], &[1, 1, 2, 1])?;
    /// let v = g.input(&[2.0, 4.0], &[1, 1, 2, 1])?;
    /// let o = g.causal_attention(q, k, v)?;
    /// assert_eq!(g.value(o)?, &[2.0, 3.0]); // equal scores: mean of the visible values
    /// # Ok::<(), autograd::Error>(())
    /// ```
    pub fn causal_attention(&mut self, q: Tensor, k: Tensor, v: Tensor) -> Result<Tensor> {
        self.causal_attention_with(q, k, v, AttentionProducts::F32)
    }

    /// [`Graph::causal_attention`] with its matrix products in the arithmetic `products`
    /// ([`AttentionProducts`]: FP32, or every operand rounded to BF16 with FP32 accumulation
    /// on the BF16 GEMM). On a device the attention kernel rounds the same operands and sums
    /// in its own fixed order.
    ///
    /// ```
    /// use autograd::{AttentionProducts, Graph, ParamStore};
    /// let mut ps = ParamStore::new();
    /// let mut g = Graph::new(&mut ps);
    /// // values 1 + 2^-10 are not BF16: they round to 1
    /// let q = g.input(&[1.0, 1.0], &[1, 1, 2, 1])?;
    /// let v = g.input(&[1.0 + 1.0 / 1024.0, 3.0], &[1, 1, 2, 1])?;
    /// let o = g.causal_attention_with(q, q, v, AttentionProducts::Bf16)?;
    /// assert_eq!(g.value(o)?, &[1.0, 2.0]);
    /// # Ok::<(), autograd::Error>(())
    /// ```
    pub fn causal_attention_with(
        &mut self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        products: AttentionProducts,
    ) -> Result<Tensor> {
        let (sq, sk, sv) = (self.shape(q)?, self.shape(k)?, self.shape(v)?);
        if sq.rank() != 4 || sk != sq || sv != sq {
            return shape_err(
                "causal_attention",
                format!("q, k, v must share one [B, H, T, D] shape, got {sq}, {sk}, {sv}"),
            );
        }
        let (t, d) = (sq.dims()[2], sq.dims()[3]);
        let bh = sq.dims()[0] * sq.dims()[1];
        if self.dev.is_some() {
            return self.dev_attention([q, k, v], sq, (bh, t, d), products);
        }
        let mut out = self.alloc(sq.numel());
        let mut lse = vec![0.0f32; bh * t];
        let vals = self.values();
        cpu::forward(
            vals.get(q),
            vals.get(k),
            vals.get(v),
            t,
            d,
            products,
            out.as_mut_slice(),
            &mut lse,
        );
        let me = self.next_tensor();
        let bw = self.needs_grad(&[q, k, v]).then(|| {
            backward_fn(move |ctx, dy| {
                let n = bh * t * d;
                let (mut gq, kq) = take_or_scratch(ctx, q, n);
                let (mut gk, kk) = take_or_scratch(ctx, k, n);
                let (mut gv, kv) = take_or_scratch(ctx, v, n);
                let betas = [gq.beta(), gk.beta(), gv.beta()];
                let x = ctx.vals;
                cpu::backward(
                    [x.get(q), x.get(k), x.get(v), x.get(me)],
                    &lse,
                    dy,
                    t,
                    d,
                    products,
                    [gq.slice(), gk.slice(), gv.slice()],
                    betas,
                );
                for (x, g, keep) in [(q, gq, kq), (k, gk, kk), (v, gv, kv)] {
                    if keep {
                        ctx.put(x, g);
                    } else {
                        ctx.pool.give(g.buf);
                    }
                }
                Ok(())
            })
        });
        Ok(self.push("causal_attention", out, sq, bw))
    }
}

/// CPU kernels.
pub(crate) mod cpu {
    use super::*;

    /// Forward over all heads; writes `out` and the per-row log-sum-exp `lse`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        t: usize,
        d: usize,
        products: AttentionProducts,
        out: &mut [f32],
        lse: &mut [f32],
    ) {
        let hd = t * d;
        if hd == 0 {
            return;
        }
        out.par_chunks_mut(hd)
            .zip(lse.par_chunks_mut(t))
            .enumerate()
            .for_each_init(
                || (vec![0.0f32; BQ.min(t) * t], Multiplier::new(products)),
                |(s, mul), (h, (o, l))| {
                    let m = |x| head_view(x, h, t, d);
                    simd(
                        #[inline(always)]
                        || head_forward([m(q), m(k), m(v)], t, d, o, l, s, mul),
                    );
                },
            );
    }

    /// Turns the visible part of a row of unscaled scores into softmax probabilities of the
    /// scaled scores `scale · row` (`scale > 0`; masked part: 0) and returns their
    /// log-sum-exp. The scaling is the epilogue of the score product, done here inside the
    /// exponentials' pass instead of in a pass of its own: `scale · p` is the one rounding the
    /// GEMM would have made, so the bits are those of a product scaled by the GEMM. The
    /// maximum of the scaled scores is the scaled maximum, bit for bit: rounding is monotonic
    /// and `scale` positive.
    #[inline(always)]
    pub(crate) fn softmax_row(row: &mut [f32], visible: usize, scale: f32) -> f32 {
        debug_assert!(scale > 0.0);
        let m = scale * max(&row[..visible]);
        let (span, l) = exp_visible(row, visible, scale, m);
        let inv = 1.0 / l;
        for_lanes(&mut row[..span], |x| *x *= inv);
        // (+0 again past `visible`, where a NaN `inv` would have left NaN)
        row[visible..span].fill(0.0);
        m + l.ln()
    }

    /// `row[j] = e^(scale · row[j] - shift)` for `j < visible`, `+0` past it; returns the span
    /// the exponentials ran over and `Σ_{j < visible} row[j]` afterwards, as [`crate::cpu::sum`]
    /// takes it (16 lane sums over whole groups, the tail in order), from the same pass. The
    /// span is `visible` rounded up to whole 16-lane groups (lanes past `visible` are computed
    /// and then zeroed), so that a causal row's ragged end costs one vector step instead of
    /// up to fifteen scalar ones. Each lane is the same `exp` as alone, so the bits do not
    /// depend on the grouping; `scale · row[j]` is the score product's epilogue (see
    /// [`softmax_row`]). Where the sum is unused (the backward), inlining drops it.
    #[inline(always)]
    pub(crate) fn exp_visible(
        row: &mut [f32],
        visible: usize,
        scale: f32,
        shift: f32,
    ) -> (usize, f32) {
        let span = visible.next_multiple_of(16).min(row.len());
        let full = visible / 16 * 16;
        let e = |x: &mut f32| *x = exp(scale * *x - shift);
        let mut lanes = [0.0f32; 16];
        for g in row[..full].chunks_exact_mut(16) {
            for (s, x) in lanes.iter_mut().zip(g) {
                e(x);
                *s += *x;
            }
        }
        for_lanes(&mut row[full..span], e);
        let tail: f32 = row[full..visible].iter().sum();
        row[visible..].fill(0.0);
        (span, sum16(&lanes) + tail)
    }

    /// `f` on every element of `x`, 16 at a time (one vector step each), the rest alone.
    #[inline(always)]
    fn for_lanes(x: &mut [f32], f: impl Fn(&mut f32)) {
        let mut groups = x.chunks_exact_mut(16);
        for g in &mut groups {
            g.iter_mut().for_each(&f);
        }
        groups.into_remainder().iter_mut().for_each(f);
    }

    /// Head `h`'s row-major `[T, D]` block of a `[.., T, D]` buffer.
    #[inline(always)]
    pub(crate) fn head_view(x: &[f32], h: usize, t: usize, d: usize) -> MatRef<'_> {
        MatRef::row_major(&x[h * t * d..(h + 1) * t * d], t, d)
    }

    /// Rows `r0..r1` of a row-major view (its column stride is 1, its row stride any).
    #[inline(always)]
    pub(crate) fn rows(m: MatRef<'_>, r0: usize, r1: usize) -> MatRef<'_> {
        MatRef {
            data: &m.data[r0 * m.row_stride..],
            rows: r1 - r0,
            ..m
        }
    }

    /// One head's forward: `x = [q, k, v]`, each a `[T, D]` view with column stride 1 (any
    /// row stride: the GEMM packs its operands, so the layout does not change the bits);
    /// writes the contiguous `[T, D]` output `o` and the row log-sum-exps `lse`; `mul`
    /// multiplies.
    #[inline(always)]
    pub(crate) fn head_forward(
        x: [MatRef<'_>; 3],
        t: usize,
        d: usize,
        o: &mut [f32],
        lse: &mut [f32],
        s: &mut [f32],
        mul: &mut Multiplier,
    ) {
        let [q, k, v] = x;
        let scale = 1.0 / (d as f32).sqrt();
        for qb in (0..t).step_by(BQ) {
            let r1 = (qb + BQ).min(t);
            let (bq, kv) = (r1 - qb, r1);
            let s = &mut s[..bq * kv];
            mul.mul(1.0, rows(q, qb, r1), rows(k, 0, kv).t(), 0.0, s);
            for (i, row) in s.chunks_exact_mut(kv).enumerate() {
                lse[qb + i] = softmax_row(row, qb + i + 1, scale);
            }
            let p = MatRef::row_major(s, bq, kv);
            mul.mul(1.0, p, rows(v, 0, kv), 0.0, &mut o[qb * d..r1 * d]);
        }
    }

    /// Backward over all heads. `x = [q, k, v, o]`; `g = [dq, dk, dv]` written with GEMM
    /// `betas` (0: overwrite a fresh buffer, 1: accumulate).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn backward(
        x: [&[f32]; 4],
        lse: &[f32],
        dout: &[f32],
        t: usize,
        d: usize,
        products: AttentionProducts,
        g: [&mut [f32]; 3],
        betas: [f32; 3],
    ) {
        let hd = t * d;
        if hd == 0 {
            return;
        }
        let [dq, dk, dv] = g;
        dq.par_chunks_mut(hd)
            .zip(dk.par_chunks_mut(hd))
            .zip(dv.par_chunks_mut(hd))
            .enumerate()
            .for_each_init(
                || {
                    (
                        vec![0.0f32; 2 * BQ.min(t) * t + t],
                        Multiplier::new(products),
                    )
                },
                |(scr, mul), (h, ((dq, dk), dv))| {
                    let r = h * hd..(h + 1) * hd;
                    let m = |x| head_view(x, h, t, d);
                    let (lse, dout, o) = (&lse[h * t..(h + 1) * t], &dout[r.clone()], &x[3][r]);
                    simd(
                        #[inline(always)]
                        || {
                            let (delta, scr) = scr.split_at_mut(t);
                            for (i, dl) in delta.iter_mut().enumerate() {
                                *dl = dot(&dout[i * d..(i + 1) * d], &o[i * d..(i + 1) * d]);
                            }
                            let dom = MatRef::row_major(dout, t, d);
                            let views = [m(x[0]), m(x[1]), m(x[2]), dom];
                            head_backward(views, lse, delta, t, d, [dq, dk, dv], betas, scr, mul)
                        },
                    );
                },
            );
    }

    /// One head's backward: `x = [q, k, v, dO]` as `[T, D]` views (column stride 1),
    /// `delta[i] = dO_i · O_i`; writes `g = [dq, dk, dv]` (contiguous `[T, D]`) with GEMM
    /// `betas`; `scr` holds two `min(BQ, T) × T` strips; `mul` multiplies.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(crate) fn head_backward(
        x: [MatRef<'_>; 4],
        lse: &[f32],
        delta: &[f32],
        t: usize,
        d: usize,
        g: [&mut [f32]; 3],
        betas: [f32; 3],
        scr: &mut [f32],
        mul: &mut Multiplier,
    ) {
        let [q, k, v, dout] = x;
        let [dq, dk, dv] = g;
        let scale = 1.0 / (d as f32).sqrt();
        let strip = BQ.min(t) * t;
        let (s, dp) = scr.split_at_mut(strip);
        let nblocks = t.div_ceil(BQ);
        // last block first: it sees every key, so it initialises all of dK and dV
        for bi in (0..nblocks).rev() {
            let qb = bi * BQ;
            let r1 = (qb + BQ).min(t);
            let (bq, kv) = (r1 - qb, r1);
            let (bk, bv) = if bi == nblocks - 1 {
                (betas[1], betas[2])
            } else {
                (1.0, 1.0)
            };
            let s = &mut s[..bq * kv];
            let dp = &mut dp[..bq * kv];
            let qm = rows(q, qb, r1);
            let km = rows(k, 0, kv);
            let vm = rows(v, 0, kv);
            let dom = rows(dout, qb, r1);
            // P = exp(S - lse), masked
            mul.mul(1.0, qm, km.t(), 0.0, s);
            for (i, row) in s.chunks_exact_mut(kv).enumerate() {
                exp_visible(row, qb + i + 1, scale, lse[qb + i]);
            }
            let pm = MatRef::row_major(s, bq, kv);
            mul.mul(1.0, pm.t(), dom, bv, &mut dv[..kv * d]);
            mul.mul(1.0, dom, vm.t(), 0.0, dp);
            for (i, (dpr, pr)) in dp.chunks_exact_mut(kv).zip(s.chunks_exact(kv)).enumerate() {
                let dl = delta[qb + i];
                for (x, &p) in dpr.iter_mut().zip(pr) {
                    *x = p * (*x - dl);
                }
            }
            let dsm = MatRef::row_major(dp, bq, kv);
            mul.mul(scale, dsm, km, betas[0], &mut dq[qb * d..r1 * d]);
            mul.mul(scale, dsm.t(), qm, bk, &mut dk[..kv * d]);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::test_util::assert_gradcheck;
    use crate::{init, Error, Graph, ParamStore, Tensor};

    /// The unfused reference: masked softmax(QKᵀ/√D) V from matmul ops.
    fn reference(g: &mut Graph<'_>, q: Tensor, k: Tensor, v: Tensor) -> crate::Result<Tensor> {
        let s = g.shape(q)?;
        let (t, d) = (s.dims()[2], s.dims()[3]);
        let sc = g.matmul_t(q, k)?;
        let sc = g.scale(sc, 1.0 / (d as f32).sqrt())?;
        let scv = g.to_vec(sc)?;
        let rows = scv.len() / t;
        let mut p = vec![0.0f32; scv.len()];
        for r in 0..rows {
            let i = r % t;
            let row = &scv[r * t..r * t + i + 1];
            let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let z: f64 = row.iter().map(|&x| ((x - m) as f64).exp()).sum();
            for (j, &x) in row.iter().enumerate() {
                p[r * t + j] = (((x - m) as f64).exp() / z) as f32;
            }
        }
        let p = g.input(&p, &[s.dims()[0], s.dims()[1], t, t])?;
        g.matmul(p, v)
    }

    #[test]
    fn gradcheck_causal_attention() {
        let mut ps = ParamStore::new();
        let sh = [2, 2, 5, 4];
        let q = ps.add("q", &sh, init::normal(80, 1.0, 1)).unwrap();
        let k = ps.add("k", &sh, init::normal(80, 1.0, 2)).unwrap();
        let v = ps.add("v", &sh, init::normal(80, 1.0, 3)).unwrap();
        assert_gradcheck(&mut ps, |g| {
            let (q, k, v) = (g.param(q)?, g.param(k)?, g.param(v)?);
            let a = g.causal_attention(q, k, v)?;
            let b = g.causal_attention(q, q, q)?; // one tensor in three roles
            g.add(a, b)
        });
    }

    #[test]
    fn multi_block_attention_matches_unfused_reference() {
        // T spans several query blocks, including a partial one
        let (b, h, t, d) = (1, 2, 150, 16);
        let n = b * h * t * d;
        let mut ps = ParamStore::new();
        let mut g = Graph::new(&mut ps);
        let q = g.variable(&init::normal(n, 1.0, 4), &[b, h, t, d]).unwrap();
        let k = g.variable(&init::normal(n, 1.0, 5), &[b, h, t, d]).unwrap();
        let v = g.input(&init::normal(n, 1.0, 6), &[b, h, t, d]).unwrap();
        let o = g.causal_attention(q, k, v).unwrap();
        let r = reference(&mut g, q, k, v).unwrap();
        let (ov, rv) = (g.to_vec(o).unwrap(), g.to_vec(r).unwrap());
        let err = ov
            .iter()
            .zip(&rv)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(err < 2e-5, "max error {err}");
        let l = g.sum(o).unwrap();
        g.backward(l).unwrap();
        assert!(g.grad(q).unwrap().unwrap().iter().all(|x| x.is_finite()));
        assert!(g.grad(v).unwrap().is_none());
    }

    #[test]
    fn gradcheck_attention_across_blocks() {
        // T = 70 > BQ: the backward's block loop (reverse order, dK/dV accumulation across
        // blocks) is checked numerically
        let mut ps = ParamStore::new();
        let sh = [1, 1, 70, 2];
        let q = ps.add("q", &sh, init::normal(140, 1.0, 7)).unwrap();
        let k = ps.add("k", &sh, init::normal(140, 1.0, 8)).unwrap();
        let v = ps.add("v", &sh, init::normal(140, 1.0, 9)).unwrap();
        assert_gradcheck(&mut ps, |g| {
            let (q, k, v) = (g.param(q)?, g.param(k)?, g.param(v)?);
            g.causal_attention(q, k, v)
        });
    }

    /// BF16 products: forward and gradients within BF16 error of the f64 attention of the
    /// same inputs (each product's operands carry a relative rounding of at most 2⁻⁹), yet not
    /// the FP32 result (P, dO and dS are rounded too, not only Q, K and V); the same bits on
    /// one and two threads.
    #[test]
    fn bf16_products_are_close_to_exact_attention() {
        use crate::AttentionProducts;
        let (b, h, t, d) = (1, 2, 80, 16);
        let n = b * h * t * d;
        let (qv, kv, vv, wv) = (
            init::normal(n, 1.0, 11),
            init::normal(n, 1.0, 12),
            init::normal(n, 1.0, 13),
            init::normal(n, 1.0, 14),
        );
        let run = |products| {
            let mut ps = ParamStore::new();
            let mut g = Graph::new(&mut ps);
            let sh = [b, h, t, d];
            let q = g.variable(&qv, &sh).unwrap();
            let k = g.variable(&kv, &sh).unwrap();
            let v = g.variable(&vv, &sh).unwrap();
            let w = g.input(&wv, &sh).unwrap();
            let o = g.causal_attention_with(q, k, v, products).unwrap();
            let l = g.mul(o, w).unwrap();
            let l = g.sum(l).unwrap();
            g.backward(l).unwrap();
            let mut out = vec![g.to_vec(o).unwrap()];
            out.extend([q, k, v].map(|x| g.grad(x).unwrap().unwrap().to_vec()));
            out
        };
        let exact = exact_attention(&qv, &kv, &vv, &wv, b * h, t, d);
        let (f32s, bf16s) = (run(AttentionProducts::F32), run(AttentionProducts::Bf16));
        for (i, name) in ["O", "dQ", "dK", "dV"].iter().enumerate() {
            let scale = exact[i].iter().fold(0.0f64, |m, x| m.max(x.abs()));
            let err = |y: &[f32]| {
                y.iter()
                    .zip(&exact[i])
                    .fold(0.0f64, |m, (&a, &e)| m.max((a as f64 - e).abs()))
                    / scale
            };
            let (ef, eb) = (err(&f32s[i]), err(&bf16s[i]));
            eprintln!("{name}: relative error FP32 {ef:.2e}, BF16 {eb:.2e}");
            assert!(ef < 1e-5, "{name}: FP32 relative error {ef:.2e}");
            assert!(
                eb < 3e-2 && eb > 10.0 * ef,
                "{name}: BF16 relative error {eb:.2e} (FP32 {ef:.2e})"
            );
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let one = pool.install(|| run(AttentionProducts::Bf16));
        let bits = |v: &Vec<Vec<f32>>| -> Vec<Vec<u32>> {
            v.iter()
                .map(|x| x.iter().map(|y| y.to_bits()).collect())
                .collect()
        };
        assert_eq!(bits(&one), bits(&bf16s));
    }

    /// `O` and the gradients of `Σ O ⊙ W` for `[bh, T, D]` inputs, in f64.
    fn exact_attention(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        w: &[f32],
        bh: usize,
        t: usize,
        d: usize,
    ) -> [Vec<f64>; 4] {
        let f = |x: &[f32]| x.iter().map(|&y| y as f64).collect::<Vec<f64>>();
        let (q, k, v, w) = (f(q), f(k), f(v), f(w));
        let n = bh * t * d;
        let (mut o, mut dq, mut dk, mut dv) =
            (vec![0.0; n], vec![0.0; n], vec![0.0; n], vec![0.0; n]);
        let sc = 1.0 / (d as f64).sqrt();
        for h in 0..bh {
            let at = |x: &[f64], i: usize, c: usize| x[(h * t + i) * d + c];
            for i in 0..t {
                let s: Vec<f64> = (0..=i)
                    .map(|j| (0..d).map(|c| at(&q, i, c) * at(&k, j, c)).sum::<f64>() * sc)
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                let p: Vec<f64> = s.iter().map(|x| (x - m).exp() / z).collect();
                let r = (h * t + i) * d;
                for c in 0..d {
                    o[r + c] = (0..=i).map(|j| p[j] * at(&v, j, c)).sum();
                }
                // dO = W; dP_j = dO · V_j; dS_j = P_j (dP_j - dO · O)
                let delta: f64 = (0..d).map(|c| w[r + c] * o[r + c]).sum();
                for (j, &pj) in p.iter().enumerate() {
                    let dp: f64 = (0..d).map(|c| w[r + c] * at(&v, j, c)).sum();
                    let ds = pj * (dp - delta) * sc;
                    let rj = (h * t + j) * d;
                    for c in 0..d {
                        dv[rj + c] += pj * w[r + c];
                        dq[r + c] += ds * at(&k, j, c);
                        dk[rj + c] += ds * at(&q, i, c);
                    }
                }
            }
        }
        [o, dq, dk, dv]
    }

    /// The softmax of a causal row of unscaled scores over whole 16-lane groups, with the
    /// scaling and the exponentials' sum fused into the `exp` pass, gives, for every
    /// visible length of rows of 64 and 70 values and two scales, the bits of the
    /// element-by-element loops it replaced (scores scaled first, masked lanes +0, the same
    /// log-sum-exp), with NaN, large scores and a signed-zero tie for the maximum included.
    #[test]
    fn softmax_row_has_the_bits_of_the_element_loops() {
        use super::cpu::softmax_row;
        use crate::cpu::{exp, max, sum};
        for len in [64, 70] {
            let scores: Vec<f32> = init::normal(len, 3.0, len as u64)
                .into_iter()
                .enumerate()
                .map(|(j, x)| match j {
                    9 => 80.0,
                    3 | 40 => 1e3, // two equal maxima
                    _ => x,
                })
                .collect();
            for scale in [1.0, 1.0 / 32f32.sqrt()] {
                for visible in 1..=len {
                    for nan in [false, true] {
                        let mut row = scores.clone();
                        if nan {
                            row[visible / 2] = f32::NAN;
                        }
                        let mut want = row.clone();
                        let (vis, masked) = want.split_at_mut(visible);
                        vis.iter_mut().for_each(|x| *x *= scale);
                        let m = max(vis);
                        vis.iter_mut().for_each(|x| *x = exp(*x - m));
                        let l = sum(vis);
                        vis.iter_mut().for_each(|x| *x *= 1.0 / l);
                        masked.fill(0.0);
                        let want_lse = m + l.ln();
                        let lse = softmax_row(&mut row, visible, scale);
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        let case = format!("len {len}, scale {scale}, visible {visible}, {nan}");
                        assert_eq!(bits(&row), bits(&want), "{case}");
                        assert_eq!(lse.to_bits(), want_lse.to_bits(), "lse, {case}");
                    }
                }
            }
        }
    }

    /// A row of zeros of both signs: the maximum's zero and so the log-sum-exp's bits are
    /// those of the element loops (`max` of the unfused code).
    #[test]
    fn softmax_row_of_signed_zeros_matches_max() {
        use super::cpu::softmax_row;
        use crate::cpu::{exp, max, sum};
        for len in [5, 16, 37] {
            let row: Vec<f32> = (0..len)
                .map(|j| if j % 3 == 0 { -0.0 } else { 0.0 })
                .collect();
            let m = max(&row);
            let l = sum(&row.iter().map(|&x| exp(x - m)).collect::<Vec<_>>());
            let lse = softmax_row(&mut row.clone(), len, 1.0);
            assert_eq!(lse.to_bits(), (m + l.ln()).to_bits(), "len {len}");
        }
    }

    #[test]
    fn attention_shape_errors() {
        let mut ps = ParamStore::new();
        let mut g = Graph::new(&mut ps);
        let a = g.input(&[0.0; 8], &[1, 1, 2, 4]).unwrap();
        let b = g.input(&[0.0; 8], &[1, 1, 4, 2]).unwrap();
        assert!(matches!(
            g.causal_attention(a, b, a),
            Err(Error::Shape { .. })
        ));
        let c = g.input(&[0.0; 8], &[2, 4]).unwrap();
        assert!(matches!(
            g.causal_attention(c, c, c),
            Err(Error::Shape { .. })
        ));
    }
}

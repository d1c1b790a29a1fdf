//! Causal attention of new query rows against a key/value cache, for autoregressive decoding
//! (inference only: no gradient).
//!
//! A query at absolute position `p` sees keys `0..=p`. Each query row is computed on its own
//! with the arithmetic of [`Graph::causal_attention`]'s forward: the score row
//! `S = q Kᵀ/√D` over exactly the `p + 1` visible keys, the same softmax row kernel (max, the
//! crate's `exp`, fixed-lane sum), then `O = P V`, both products in the same arithmetic
//! ([`AttentionProducts`]). The full forward computes the same row inside a block of up to
//! 64 queries whose score strip is wider than `p + 1`; the extra entries are masked to
//! exactly 0, so as long as each GEMM output element does not depend on the number of rows
//! or on zero products appended to its reduction, the cached row equals the full
//! recomputation bit for bit (`trainer`'s `rl_sampler` tests check it end to end). Both
//! arithmetics have that property: a running FP32 sum to which `±0` products are added keeps
//! its value, and the BF16 units flush subnormal sums whether or not zeros follow; only an
//! output whose every visible product is `−0` could come out `−0` in one and `+0` in the
//! other.

use quant::gemm::MatRef;
use rayon::prelude::*;

use super::attention::cpu::softmax_row;
use super::attention_products::{AttentionProducts, Multiplier};
use crate::cpu::simd;
use crate::error::shape_err;
use crate::{Graph, Result, Shape, Tensor};

impl Graph<'_> {
    /// Attention of `q: [B, H, Tn, D]`, the queries at positions `past..past + Tn`, against a
    /// cache of keys and values `[B, H, cap, D]` (row-major, the first `past + Tn` positions
    /// filled, the new rows included). Returns `[B, H, Tn, D]` without a gradient.
    ///
    /// ```
    /// use autograd::{Graph, ParamStore};
    /// let mut ps = ParamStore::new();
    /// let mut g = Graph::new(&mut ps);
    /// // B = H = 1, D = 1, capacity 4: the query at position 1 sees the first two values
    /// let q = g.input(&[1.0], &[1, 1, 1, 1])?;
    /// let (k, v) = ([0.0, 0.0, 9.0, 9.0], [2.0, 4.0, 9.0, 9.0]);
    /// let o = g.cached_attention(q, &k, &v, 4, 1)?;
    /// assert_eq!(g.value(o)?, &[3.0]);
    /// # Ok::<(), autograd::Error>(())
    /// ```
    pub fn cached_attention(
        &mut self,
        q: Tensor,
        k_cache: &[f32],
        v_cache: &[f32],
        cap: usize,
        past: usize,
    ) -> Result<Tensor> {
        self.cached_attention_with(q, k_cache, v_cache, cap, past, AttentionProducts::F32)
    }

    /// [`Graph::cached_attention`] with its products in the arithmetic `products`, that of
    /// [`Graph::causal_attention_with`].
    pub fn cached_attention_with(
        &mut self,
        q: Tensor,
        k_cache: &[f32],
        v_cache: &[f32],
        cap: usize,
        past: usize,
        products: AttentionProducts,
    ) -> Result<Tensor> {
        let sq = self.shape(q)?;
        if sq.rank() != 4 {
            return shape_err(
                "cached_attention",
                format!("q must be [B, H, Tn, D], got {sq}"),
            );
        }
        let (bh, tn, d) = (sq.dims()[0] * sq.dims()[1], sq.dims()[2], sq.dims()[3]);
        let need = bh.checked_mul(cap).and_then(|n| n.checked_mul(d));
        if past.checked_add(tn).is_none_or(|end| end > cap)
            || need != Some(k_cache.len())
            || need != Some(v_cache.len())
        {
            return shape_err(
                "cached_attention",
                format!(
                    "q {sq} at positions {past}.. needs caches of [{bh}, {cap}, {d}] with room for {} positions, got {} and {} values",
                    past.saturating_add(tn),
                    k_cache.len(),
                    v_cache.len()
                ),
            );
        }
        if self.dev.is_some() {
            let shape = Shape::new(sq.dims())?;
            let dims = (bh, tn, d);
            return self.dev_cached_attention(
                q,
                (k_cache, v_cache),
                cap,
                past,
                dims,
                shape,
                products,
            );
        }
        let mut out = self.alloc(sq.numel());
        let qv = self.values().get(q);
        if tn * d > 0 {
            out.as_mut_slice()
                .par_chunks_mut(tn * d)
                .enumerate()
                .for_each_init(
                    || (vec![0.0f32; past + tn], Multiplier::new(products)),
                    |(s, mul), (h, o)| {
                        let kv_h = h * cap * d..(h + 1) * cap * d;
                        let (k, v) = (&k_cache[kv_h.clone()], &v_cache[kv_h]);
                        let qh = &qv[h * tn * d..(h + 1) * tn * d];
                        simd(
                            #[inline(always)]
                            || head(qh, k, v, past, tn, d, o, s, mul),
                        );
                    },
                );
        }
        Ok(self.push("cached_attention", out, Shape::new(sq.dims())?, None))
    }
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn head(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    past: usize,
    tn: usize,
    d: usize,
    o: &mut [f32],
    s: &mut [f32],
    mul: &mut Multiplier,
) {
    let scale = 1.0 / (d as f32).sqrt();
    for i in 0..tn {
        let kv = past + i + 1;
        let s = &mut s[..kv];
        mul.mul(
            1.0,
            MatRef::row_major(&q[i * d..(i + 1) * d], 1, d),
            MatRef::row_major(&k[..kv * d], kv, d).t(),
            0.0,
            s,
        );
        softmax_row(s, kv, scale);
        mul.mul(
            1.0,
            MatRef::row_major(s, 1, kv),
            MatRef::row_major(&v[..kv * d], kv, d),
            0.0,
            &mut o[i * d..(i + 1) * d],
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::{AttentionProducts, Graph, ParamStore};

    fn pseudo(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) % 1000) as f32 / 500.0
                    - 1.0
            })
            .collect()
    }

    /// Every query row of the full causal attention equals the cached computation of that row
    /// alone, bit for bit (also across the 64-query block boundary), in both arithmetics.
    #[test]
    fn cached_rows_equal_full_attention() {
        for products in [AttentionProducts::F32, AttentionProducts::Bf16] {
            cached_rows_equal_full_attention_with(products);
        }
    }

    fn cached_rows_equal_full_attention_with(products: AttentionProducts) {
        let (b, h, t, d) = (2, 3, 70, 8);
        let n = b * h * t * d;
        let (q, k, v) = (pseudo(n, 1), pseudo(n, 2), pseudo(n, 3));
        let mut ps = ParamStore::new();
        let mut g = Graph::new(&mut ps);
        let (qt, kt, vt) = (
            g.input(&q, &[b, h, t, d]).unwrap(),
            g.input(&k, &[b, h, t, d]).unwrap(),
            g.input(&v, &[b, h, t, d]).unwrap(),
        );
        let full = g.causal_attention_with(qt, kt, vt, products).unwrap();
        let full = g.to_vec(full).unwrap();
        for p in [0, 1, 5, 63, 64, 69] {
            let qp: Vec<f32> = (0..b * h)
                .flat_map(|bh| q[(bh * t + p) * d..(bh * t + p + 1) * d].to_vec())
                .collect();
            let qp = g.input(&qp, &[b, h, 1, d]).unwrap();
            let o = g.cached_attention_with(qp, &k, &v, t, p, products).unwrap();
            let o = g.value(o).unwrap();
            for bh in 0..b * h {
                let want = &full[(bh * t + p) * d..(bh * t + p + 1) * d];
                let got = &o[bh * d..(bh + 1) * d];
                let (w, gb): (Vec<u32>, Vec<u32>) = (
                    want.iter().map(|x| x.to_bits()).collect(),
                    got.iter().map(|x| x.to_bits()).collect(),
                );
                assert_eq!(w, gb, "{products:?}: row {p} head {bh}");
            }
        }
    }

    #[test]
    fn rejects_short_caches() {
        let mut ps = ParamStore::new();
        let mut g = Graph::new(&mut ps);
        let q = g.input(&[1.0, 2.0], &[1, 1, 1, 2]).unwrap();
        assert!(g.cached_attention(q, &[0.0; 4], &[0.0; 4], 2, 2).is_err());
        assert!(g.cached_attention(q, &[0.0; 3], &[0.0; 4], 2, 1).is_err());
    }
}

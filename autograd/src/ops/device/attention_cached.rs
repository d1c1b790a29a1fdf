//! Device arm of `cached_attention` (the sampler's decode step), from the training kernels:
//! the first `past + Tn` cached keys and values of every head (host slices in the op's API) are
//! uploaded, the new queries are placed at their positions `past..past + Tn` of an otherwise
//! zero query block, and the fused causal attention forward (`nb_attn_fwd`) runs over all
//! `past + Tn` positions; the output rows of the new queries are the result (a query at
//! position `p` sees keys `0..=p` in both). Correctness first: each call recomputes the rows
//! of the earlier positions too (`O((past + Tn)²)` per call instead of `O(Tn (past + Tn))`).
//! The causal attention kernel's bound against the exact result applies (derived in
//! `autograd/tests/kernel_checks`); no gradient, as on the CPU.

use crate::backend::Backend;
use crate::{AttentionProducts, Graph, Result, Shape, Tensor};

impl Graph<'_> {
    /// `q: [B, H, Tn, D]` at positions `past..` against `[B·H, cap, D]` caches (shapes
    /// checked by the front-end): `bh = B·H`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn dev_cached_attention(
        &mut self,
        q: Tensor,
        (k_cache, v_cache): (&[f32], &[f32]),
        cap: usize,
        past: usize,
        (bh, tn, d): (usize, usize, usize),
        shape: Shape,
        products: AttentionProducts,
    ) -> Result<Tensor> {
        let be = self.be()?;
        let mut out = be.zeros(bh * tn * d)?;
        if bh * tn * d > 0 {
            let t = past + tn;
            let visible = |c: &[f32]| -> Vec<f32> {
                (0..bh)
                    .flat_map(|h| c[h * cap * d..h * cap * d + t * d].iter().copied())
                    .collect()
            };
            let (k, v) = (be.upload(&visible(k_cache))?, be.upload(&visible(v_cache))?);
            let mut qt = be.zeros(bh * t * d)?;
            be.columns(
                self.values().dev(q)?,
                t * d,
                past * d,
                tn * d,
                true,
                &mut qt,
            )?;
            let (mut o, mut lse) = (be.zeros(bh * t * d)?, be.zeros(bh * t)?);
            be.attention_fwd(&qt, &k, &v, bh, t, d, products, &mut o, &mut lse)?;
            be.columns(&o, t * d, past * d, tn * d, false, &mut out)?;
        }
        Ok(self.push_dev("cached_attention", out, shape, None))
    }
}

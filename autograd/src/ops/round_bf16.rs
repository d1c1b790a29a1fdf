//! `round_bf16`: round every element to BF16 (nearest-even) in the forward pass and pass the
//! gradient straight through (the identity) in the backward pass. The trainer uses it on the
//! attention inputs Q, K, V when a recipe asks for BF16 attention matmuls, which makes the
//! `QKᵀ` and `PV` products see BF16 operands with FP32 accumulation (the softmax output P
//! stays FP32).

use crate::cpu::for_chunks;
use crate::graph::backward_fn;
use crate::ops::elementwise::cpu::copy_or_add;
use crate::{Graph, Result, Tensor};

impl Graph<'_> {
    /// BF16 rounding (nearest-even) with a straight-through gradient.
    ///
    /// ```
    /// use autograd::{Graph, ParamStore};
    /// let mut ps = ParamStore::new();
    /// let mut g = Graph::new(&mut ps);
    /// let x = g.variable(&[1.0, 1.0 + 1.0 / 256.0, 3.0], &[3])?;
    /// let y = g.round_bf16(x)?;
    /// assert_eq!(g.value(y)?, &[1.0, 1.0, 3.0]); // 1 + 2^-8 is a tie: rounds to even
    /// let l = g.sum(y)?;
    /// g.backward(l)?;
    /// assert_eq!(g.grad(x)?.unwrap(), &[1.0, 1.0, 1.0]);
    /// # Ok::<(), autograd::Error>(())
    /// ```
    pub fn round_bf16(&mut self, x: Tensor) -> Result<Tensor> {
        let sx = self.shape(x)?;
        if self.dev.is_some() {
            return self.dev_round_bf16(x, sx);
        }
        let mut out = self.alloc(sx.numel());
        let xv = self.values().get(x);
        for_chunks(
            out.as_mut_slice(),
            #[inline(always)]
            |o, c| {
                for (y, &v) in c.iter_mut().zip(&xv[o..]) {
                    *y = fp_formats::round_to_bf16(v);
                }
            },
        );
        let bw = self.needs_grad(&[x]).then(|| {
            backward_fn(move |ctx, dy| {
                if let Some(mut g) = ctx.take(x) {
                    copy_or_add(dy, g.acc(), g.slice());
                    ctx.put(x, g);
                }
                Ok(())
            })
        });
        Ok(self.push("round_bf16", out, sx, bw))
    }
}

#[cfg(test)]
mod tests {
    use crate::{init, Graph, ParamStore};

    /// The gradient is the straight-through identity: compare with the finite difference of
    /// the *unrounded* function (rounding is piecewise constant, so a numeric check of the
    /// rounded function would see zero or huge slopes).
    #[test]
    fn straight_through_gradient_and_values() {
        let mut ps = ParamStore::new();
        let xv = init::normal(64, 1.0, 5);
        let w = init::normal(64, 1.0, 6);
        let mut g = Graph::new(&mut ps);
        let x = g.variable(&xv, &[8, 8]).unwrap();
        let wt = g.input(&w, &[8, 8]).unwrap();
        let y = g.round_bf16(x).unwrap();
        for (a, b) in g.value(y).unwrap().iter().zip(&xv) {
            assert_eq!(*a, fp_formats::round_to_bf16(*b));
            assert!((a - b).abs() <= b.abs() / 256.0);
        }
        let p = g.mul(y, wt).unwrap();
        let l = g.sum(p).unwrap();
        g.backward(l).unwrap();
        assert_eq!(g.grad(x).unwrap().unwrap(), &w[..]);
        // large enough for the parallel path
        let n = 1 << 16;
        let big: Vec<f32> = (0..n).map(|i| i as f32 * 1.001).collect();
        let bx = g.input(&big, &[n]).unwrap();
        let by = g.round_bf16(bx).unwrap();
        let v = g.value(by).unwrap();
        assert!(v
            .iter()
            .zip(&big)
            .all(|(a, b)| *a == fp_formats::round_to_bf16(*b)));
    }
}

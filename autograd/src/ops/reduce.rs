//! `sum` and `mean` of all elements (to a scalar), accumulated in f64.

use rayon::prelude::*;

use crate::cpu::{for_chunks, store, PAR_MIN};
use crate::graph::backward_fn;
use crate::{Graph, Result, Shape, Tensor};

impl Graph<'_> {
    /// The sum of all elements, as a scalar.
    ///
    /// ```
    /// use autograd::{Graph, ParamStore};
    /// let mut ps = ParamStore::new();
    /// let mut g = Graph::new(&mut ps);
    /// let x = g.input(&[1.0, 2.0, 3.0, 6.0], &[2, 2])?;
    /// let (s, m) = (g.sum(x)?, g.mean(x)?);
    /// assert_eq!((g.item(s)?, g.item(m)?), (12.0, 3.0));
    /// # Ok::<(), autograd::Error>(())
    /// ```
    pub fn sum(&mut self, x: Tensor) -> Result<Tensor> {
        self.reduce(x, 1.0)
    }

    /// The mean of all elements, as a scalar (0 for an empty tensor).
    pub fn mean(&mut self, x: Tensor) -> Result<Tensor> {
        let n = self.shape(x)?.numel();
        self.reduce(x, if n == 0 { 0.0 } else { 1.0 / n as f64 })
    }

    fn reduce(&mut self, x: Tensor, factor: f64) -> Result<Tensor> {
        self.check(x)?;
        if self.dev.is_some() {
            return self.dev_reduce(x, factor);
        }
        let mut out = self.alloc(1);
        out.as_mut_slice()[0] = (cpu::sum_f64(self.values().get(x)) * factor) as f32;
        let bw = self.needs_grad(&[x]).then(|| {
            backward_fn(move |ctx, dy| {
                if let Some(mut g) = ctx.take(x) {
                    let v = (dy[0] as f64 * factor) as f32;
                    let acc = g.acc();
                    for_chunks(
                        g.slice(),
                        #[inline(always)]
                        |_, c| c.iter_mut().for_each(|d| store(acc, d, v)),
                    );
                    ctx.put(x, g);
                }
                Ok(())
            })
        });
        Ok(self.push(
            if factor == 1.0 { "sum" } else { "mean" },
            out,
            Shape::scalar(),
            bw,
        ))
    }
}

/// CPU kernels.
pub(crate) mod cpu {
    use super::*;

    /// Sum in f64 (chunked, parallel for large inputs).
    pub(crate) fn sum_f64(x: &[f32]) -> f64 {
        let chunk = |c: &[f32]| c.iter().map(|&v| v as f64).sum::<f64>();
        if x.len() < PAR_MIN {
            chunk(x)
        } else {
            x.par_chunks(1 << 14)
                .map(chunk)
                .collect::<Vec<f64>>()
                .iter()
                .sum()
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::test_util::assert_gradcheck;
    use crate::{init, ParamStore};

    #[test]
    fn gradcheck_sum_mean() {
        let mut ps = ParamStore::new();
        let a = ps.add("a", &[3, 5], init::normal(15, 1.0, 1)).unwrap();
        assert_gradcheck(&mut ps, |g| {
            let a = g.param(a)?;
            let s = g.sum(a)?;
            let m = g.mean(a)?;
            let s = g.scale(s, 0.3)?;
            g.add(s, m)
        });
    }
}

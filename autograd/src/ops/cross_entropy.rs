//! Fused softmax cross-entropy on logits: numerically stable (max-shifted log-sum-exp),
//! mean over the counted tokens, optional ignore index. Backward writes
//! `(softmax − onehot) / count` straight into the logits' gradient.

use rayon::prelude::*;

use crate::cpu::{exp, for_rows_with, max, store, sum, PAR_MIN};
use crate::error::shape_err;
use crate::graph::backward_fn;
use crate::{Error, Graph, Result, Shape, Tensor};

impl Graph<'_> {
    /// Mean cross-entropy of `logits: [..., V]` against one class id per row. Rows whose
    /// target equals `ignore_index` do not count; if no row counts, the loss is 0 (with a zero
    /// gradient) rather than PyTorch's NaN.
    ///
    /// ```
    /// use autograd::{Graph, ParamStore};
    /// let mut ps = ParamStore::new();
    /// let mut g = Graph::new(&mut ps);
    /// let logits = g.variable(&[0.0, 0.0, 0.0, 1.0, 2.0, 3.0], &[2, 3])?;
    /// let loss = g.cross_entropy(logits, &[2, 0], None)?;
    /// let ln3 = 3f32.ln();
    /// let row1 = (1f32.exp() + 2f32.exp() + 3f32.exp()).ln() - 1.0;
    /// assert!((g.item(loss)? - 0.5 * (ln3 + row1)).abs() < 1e-6);
    /// let only_first = g.cross_entropy(logits, &[2, 7], Some(7))?;
    /// assert!((g.item(only_first)? - ln3).abs() < 1e-6);
    /// # Ok::<(), autograd::Error>(())
    /// ```
    pub fn cross_entropy(
        &mut self,
        logits: Tensor,
        targets: &[u32],
        ignore_index: Option<u32>,
    ) -> Result<Tensor> {
        let sl = self.shape(logits)?;
        if sl.rank() == 0 {
            return shape_err("cross_entropy", "logits must have a class axis");
        }
        let (rows, v) = (sl.rows(), sl.last());
        if targets.len() != rows {
            return shape_err(
                "cross_entropy",
                format!("{} targets for {rows} rows of {sl}", targets.len()),
            );
        }
        let ignored = move |t: u32| ignore_index == Some(t);
        if let Some(&bad) = targets.iter().find(|&&t| !ignored(t) && t as usize >= v) {
            return Err(Error::IndexOutOfRange {
                op: "cross_entropy",
                index: bad,
                size: v,
            });
        }
        if self.dev.is_some() {
            return self.dev_cross_entropy(logits, targets, ignore_index, v);
        }
        let count = targets.iter().filter(|&&t| !ignored(t)).count();
        // per-row (loss, log-sum-exp)
        let mut stats = vec![0.0f32; 2 * rows];
        let lv = self.values().get(logits);
        let row_stats = |r: usize, st: &mut [f32]| {
            let row = &lv[r * v..(r + 1) * v];
            let lse = cpu::logsumexp(row);
            let t = targets[r];
            st[0] = if ignored(t) {
                0.0
            } else {
                lse - row[t as usize]
            };
            st[1] = lse;
        };
        if rows * v >= PAR_MIN {
            stats
                .par_chunks_mut(2)
                .enumerate()
                .for_each(|(r, st)| row_stats(r, st));
        } else {
            stats
                .chunks_mut(2)
                .enumerate()
                .for_each(|(r, st)| row_stats(r, st));
        }
        let total: f64 = stats.chunks_exact(2).map(|s| s[0] as f64).sum();
        let mut out = self.alloc(1);
        out.as_mut_slice()[0] = if count == 0 {
            0.0
        } else {
            (total / count as f64) as f32
        };
        let bw = self.needs_grad(&[logits]).then(|| {
            let targets = targets.to_vec();
            backward_fn(move |ctx, dy| {
                if let Some(mut g) = ctx.take(logits) {
                    let scale = if count == 0 {
                        0.0
                    } else {
                        dy[0] / count as f32
                    };
                    let lv = ctx.vals.get(logits);
                    let acc = g.acc();
                    for_rows_with(
                        g.slice(),
                        v,
                        &mut [],
                        0,
                        #[inline(always)]
                        |r, gr, _| {
                            let t = targets[r];
                            let row = &lv[r * v..(r + 1) * v];
                            if ignored(t) {
                                gr.iter_mut().for_each(|d| store(acc, d, 0.0));
                                return;
                            }
                            let lse = stats[2 * r + 1];
                            for (d, &x) in gr.iter_mut().zip(row) {
                                store(acc, d, scale * exp(x - lse));
                            }
                            gr[t as usize] -= scale;
                        },
                    );
                    ctx.put(logits, g);
                }
                Ok(())
            })
        });
        Ok(self.push("cross_entropy", out, Shape::scalar(), bw))
    }
}

/// CPU kernels.
pub(crate) mod cpu {
    use super::*;

    /// `log Σ exp(x)`, shifted by the maximum.
    pub(crate) fn logsumexp(x: &[f32]) -> f32 {
        let m = max(x);
        if m == f32::NEG_INFINITY {
            return m;
        }
        let mut acc = [0.0f32; 16];
        let c = x.chunks_exact(16);
        let tail: f32 = c.remainder().iter().map(|&v| exp(v - m)).sum();
        for ch in c {
            for (a, &v) in acc.iter_mut().zip(ch) {
                *a += exp(v - m);
            }
        }
        m + (sum(&acc) + tail).ln()
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::test_util::assert_gradcheck;
    use crate::{init, Error, Graph, ParamStore};

    #[test]
    fn gradcheck_cross_entropy() {
        let mut ps = ParamStore::new();
        let x = ps
            .add("logits", &[2, 3, 7], init::normal(42, 2.0, 1))
            .unwrap();
        assert_gradcheck(&mut ps, |g| {
            let x = g.param(x)?;
            let a = g.cross_entropy(x, &[0, 6, 3, 3, 1, 5], None)?;
            let b = g.cross_entropy(x, &[9, 6, 9, 2, 9, 0], Some(9))?;
            let b = g.scale(b, 0.7)?;
            g.add(a, b)
        });
    }

    #[test]
    fn stable_for_huge_logits_and_checks_targets() {
        let mut ps = ParamStore::new();
        let mut g = Graph::new(&mut ps);
        let x = g
            .variable(&[1000.0, 0.0, -1000.0, 2000.0], &[2, 2])
            .unwrap();
        let l = g.cross_entropy(x, &[0, 0], None).unwrap();
        assert!(
            (g.item(l).unwrap() - 0.5 * (0.0 + 3000.0)).abs() < 1e-3,
            "{}",
            g.item(l).unwrap()
        );
        let none = g.cross_entropy(x, &[5, 5], Some(5)).unwrap();
        assert_eq!(g.item(none).unwrap(), 0.0);
        assert!(matches!(
            g.cross_entropy(x, &[2, 0], None),
            Err(Error::IndexOutOfRange { .. })
        ));
        assert!(matches!(
            g.cross_entropy(x, &[0], None),
            Err(Error::Shape { .. })
        ));
        g.backward(l).unwrap();
        let gx = g.grad(x).unwrap().unwrap();
        assert_eq!(gx, &[0.0, 0.0, -0.5, 0.5]);
    }
}

//! Batched matrix products `a · b` and `a · bᵀ` (attention's `QKᵀ` and `PV` when computed
//! unfused), through `quant::gemm::sgemm` with strided views: no transpose is ever copied.

use quant::gemm::{sgemm, MatRef};
use rayon::prelude::*;

use crate::error::shape_err;
use crate::graph::backward_fn;
use crate::{Graph, Result, Shape, Tensor};

/// Geometry of a (batched) product `C[b] = A[b] · op(B[b])`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bmm {
    batch: usize,
    m: usize,
    k: usize,
    n: usize,
    /// `op(B) = Bᵀ` (B stored `[N, K]`).
    trans_b: bool,
    /// B is one matrix shared by every batch item.
    b_shared: bool,
}

impl Bmm {
    fn b_view<'a>(&self, b: &'a [f32], i: usize) -> MatRef<'a> {
        let (k, n) = (self.k, self.n);
        let bi = if self.b_shared {
            b
        } else {
            &b[i * k * n..(i + 1) * k * n]
        };
        if self.trans_b {
            MatRef::row_major(bi, n, k).t()
        } else {
            MatRef::row_major(bi, k, n)
        }
    }

    /// Runs `f(i, chunk)` over the batch, in parallel when items are small enough that the
    /// GEMM would not thread by itself.
    fn for_items(&self, out: &mut [f32], item: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
        if item == 0 {
            return;
        }
        let small = self.m * self.k + self.k * self.n < (1 << 15);
        if self.batch > 1 && small {
            out.par_chunks_mut(item)
                .enumerate()
                .for_each(|(i, c)| f(i, c));
        } else {
            out.chunks_mut(item).enumerate().for_each(|(i, c)| f(i, c));
        }
    }

    fn forward(&self, a: &[f32], b: &[f32], c: &mut [f32]) {
        let (m, k, n) = (self.m, self.k, self.n);
        self.for_items(c, m * n, |i, ci| {
            let ai = MatRef::row_major(&a[i * m * k..(i + 1) * m * k], m, k);
            sgemm(1.0, ai, self.b_view(b, i), 0.0, ci);
        });
    }

    /// `dA (+)= dC · op(B)ᵀ`.
    fn grad_a(&self, dc: &[f32], b: &[f32], beta: f32, da: &mut [f32]) {
        let (m, k, n) = (self.m, self.k, self.n);
        self.for_items(da, m * k, |i, dai| {
            let dci = MatRef::row_major(&dc[i * m * n..(i + 1) * m * n], m, n);
            sgemm(1.0, dci, self.b_view(b, i).t(), beta, dai);
        });
    }

    /// `dB (+)= A[b]ᵀ · dC[b]` (or its transpose when `op(B) = Bᵀ`); summed over the batch
    /// when B is shared.
    fn grad_b(&self, dc: &[f32], a: &[f32], beta: f32, db: &mut [f32]) {
        let (m, k, n) = (self.m, self.k, self.n);
        let term = |i: usize, beta: f32, dbi: &mut [f32]| {
            let ai = MatRef::row_major(&a[i * m * k..(i + 1) * m * k], m, k);
            let dci = MatRef::row_major(&dc[i * m * n..(i + 1) * m * n], m, n);
            if self.trans_b {
                sgemm(1.0, dci.t(), ai, beta, dbi); // [N, K]
            } else {
                sgemm(1.0, ai.t(), dci, beta, dbi); // [K, N]
            }
        };
        if self.b_shared {
            for i in 0..self.batch {
                term(i, if i == 0 { beta } else { 1.0 }, db);
            }
        } else {
            self.for_items(db, k * n, |i, dbi| term(i, beta, dbi));
        }
    }
}

impl Graph<'_> {
    /// Matrix product over the last two axes: `a: [..., M, K] · b: [..., K, N] → [..., M, N]`.
    /// `b` has the same leading (batch) axes as `a`, or is a single `[K, N]` matrix.
    ///
    /// ```
    /// use autograd::{Graph, ParamStore};
    /// let mut ps = ParamStore::new();
    /// let mut g = Graph::new(&mut ps);
    /// let a = g.input(&[1.0, 2.0, 3.0, 4.0], &[1, 2, 2])?;
    /// let b = g.input(&[1.0, 1.0, 0.0, 1.0], &[1, 2, 2])?;
    /// let c = g.matmul(a, b)?;
    /// assert_eq!(g.value(c)?, &[1.0, 3.0, 3.0, 7.0]);
    /// let d = g.matmul_t(a, b)?; // a · bᵀ
    /// assert_eq!(g.value(d)?, &[3.0, 2.0, 7.0, 4.0]);
    /// # Ok::<(), autograd::Error>(())
    /// ```
    pub fn matmul(&mut self, a: Tensor, b: Tensor) -> Result<Tensor> {
        self.bmm(a, b, false)
    }

    /// `a · bᵀ` over the last two axes: `a: [..., M, K]`, `b: [..., N, K]` → `[..., M, N]`.
    pub fn matmul_t(&mut self, a: Tensor, b: Tensor) -> Result<Tensor> {
        self.bmm(a, b, true)
    }

    fn bmm(&mut self, a: Tensor, b: Tensor, trans_b: bool) -> Result<Tensor> {
        let op = if trans_b { "matmul_t" } else { "matmul" };
        let (sa, sb) = (self.shape(a)?, self.shape(b)?);
        if sa.rank() < 2 || sb.rank() < 2 {
            return shape_err(
                op,
                format!("operands need at least two axes, got {sa} and {sb}"),
            );
        }
        let (ad, bd) = (sa.dims(), sb.dims());
        let (m, k) = (ad[ad.len() - 2], ad[ad.len() - 1]);
        let (bk, n) = if trans_b {
            (bd[bd.len() - 1], bd[bd.len() - 2])
        } else {
            (bd[bd.len() - 2], bd[bd.len() - 1])
        };
        let lead_a = &ad[..ad.len() - 2];
        let b_shared = bd.len() == 2;
        if bk != k || !(b_shared || bd[..bd.len() - 2] == *lead_a) {
            return shape_err(op, format!("cannot multiply {sa} by {sb}"));
        }
        let batch: usize = lead_a.iter().product();
        let geo = if b_shared {
            // one GEMM over all rows of `a`
            Bmm {
                batch: 1,
                m: batch * m,
                k,
                n,
                trans_b,
                b_shared,
            }
        } else {
            Bmm {
                batch,
                m,
                k,
                n,
                trans_b,
                b_shared,
            }
        };
        let mut od = lead_a.to_vec();
        od.extend([m, n]);
        let out_shape = Shape::new(&od)?;
        if self.dev.is_some() {
            let d = crate::ops::device::DevBmm {
                batch: geo.batch,
                m: geo.m,
                k: geo.k,
                n: geo.n,
                trans_b,
                b_shared,
            };
            return self.dev_bmm(op, a, b, d, out_shape);
        }
        let mut out = self.alloc(out_shape.numel());
        let v = self.values();
        geo.forward(v.get(a), v.get(b), out.as_mut_slice());
        let bw = self.needs_grad(&[a, b]).then(|| {
            backward_fn(move |ctx, dy| {
                let (ga, gb) = (ctx.take(a), ctx.take(b));
                let (av, bv) = (ctx.vals.get(a), ctx.vals.get(b));
                if let Some(mut g) = ga {
                    let beta = g.beta();
                    geo.grad_a(dy, bv, beta, g.slice());
                    ctx.put(a, g);
                }
                if let Some(mut g) = gb {
                    let beta = g.beta();
                    geo.grad_b(dy, av, beta, g.slice());
                    ctx.put(b, g);
                }
                Ok(())
            })
        });
        Ok(self.push(op, out, out_shape, bw))
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::test_util::assert_gradcheck;
    use crate::{init, Error, Graph, ParamStore};

    #[test]
    fn gradcheck_matmul() {
        let mut ps = ParamStore::new();
        let a = ps
            .add("a", &[2, 3, 4, 5], init::normal(120, 0.5, 1))
            .unwrap();
        let b = ps
            .add("b", &[2, 3, 5, 2], init::normal(60, 0.5, 2))
            .unwrap();
        let c = ps
            .add("c", &[2, 3, 6, 5], init::normal(180, 0.5, 3))
            .unwrap();
        let w = ps.add("w", &[5, 3], init::normal(15, 1.0, 4)).unwrap();
        assert_gradcheck(&mut ps, |g| {
            let (a, b, c, w) = (g.param(a)?, g.param(b)?, g.param(c)?, g.param(w)?);
            let ab = g.matmul(a, b)?; // [2,3,4,2]
            let ac = g.matmul_t(a, c)?; // [2,3,4,6]
            let aw = g.matmul(a, w)?; // shared b: [2,3,4,3]
            let s1 = g.sum(ab)?;
            let p = g.mul(ac, ac)?;
            let s2 = g.sum(p)?;
            let q = g.mul(aw, aw)?;
            let s3 = g.mean(q)?;
            let s = g.add(s1, s2)?;
            let s = g.add(s, s3)?;
            let t = g.matmul_t(ac, ac)?; // same tensor twice
            let st = g.mean(t)?;
            g.add(s, st)
        });
    }

    #[test]
    fn matmul_shape_errors() {
        let mut ps = ParamStore::new();
        let mut g = Graph::new(&mut ps);
        let a = g.input(&[0.0; 6], &[2, 3]).unwrap();
        let b = g.input(&[0.0; 6], &[2, 3]).unwrap();
        assert!(matches!(g.matmul(a, b), Err(Error::Shape { .. })));
        assert!(g.matmul_t(a, b).is_ok());
        let c = g.input(&[0.0; 12], &[2, 2, 3]).unwrap();
        let d = g.input(&[0.0; 18], &[3, 3, 2]).unwrap();
        assert!(matches!(g.matmul(c, d), Err(Error::Shape { .. })));
        let v = g.input(&[0.0; 3], &[3]).unwrap();
        assert!(matches!(g.matmul(a, v), Err(Error::Shape { .. })));
    }
}

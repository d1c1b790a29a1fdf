//! `add`, `mul` (same shape, or the second operand broadcast over leading dimensions, e.g. a
//! bias `[D]` onto `[N, D]`) and `scale` by a constant.

use crate::cpu::{for_chunks, for_rows, store, sum_rows};
use crate::error::shape_err;
use crate::graph::backward_fn;
use crate::{Graph, Result, Shape, Tensor};

/// Checks that `b` equals `a` or a suffix of it; returns the broadcast period (`b`'s size).
fn broadcast(op: &'static str, a: Shape, b: Shape) -> Result<usize> {
    let (ad, bd) = (a.dims(), b.dims());
    if bd.len() > ad.len() || ad[ad.len() - bd.len()..] != *bd {
        return shape_err(op, format!("{b} is neither {a} nor a suffix of it"));
    }
    Ok(b.numel())
}

impl Graph<'_> {
    /// `a + b`; `b` may be broadcast over `a`'s leading dimensions.
    ///
    /// ```
    /// use autograd::{Graph, ParamStore};
    /// let mut ps = ParamStore::new();
    /// let mut g = Graph::new(&mut ps);
    /// let a = g.input(&[1.0, 2.0, 3.0, 4.0], &[2, 2])?;
    /// let bias = g.input(&[10.0, 20.0], &[2])?;
    /// let y = g.add(a, bias)?;
    /// assert_eq!(g.value(y)?, &[11.0, 22.0, 13.0, 24.0]);
    /// let z = g.mul(a, bias)?;
    /// assert_eq!(g.value(z)?, &[10.0, 40.0, 30.0, 80.0]);
    /// let s = g.scale(a, 0.5)?;
    /// assert_eq!(g.value(s)?, &[0.5, 1.0, 1.5, 2.0]);
    /// # Ok::<(), autograd::Error>(())
    /// ```
    pub fn add(&mut self, a: Tensor, b: Tensor) -> Result<Tensor> {
        let (sa, sb) = (self.shape(a)?, self.shape(b)?);
        let nb = broadcast("add", sa, sb)?;
        if self.dev.is_some() {
            return self.dev_add(a, b, nb, sa);
        }
        let mut out = self.alloc(sa.numel());
        let v = self.values();
        cpu::add(v.get(a), v.get(b), nb, out.as_mut_slice());
        let full = nb == sa.numel();
        let bw = self.needs_grad(&[a, b]).then(|| {
            backward_fn(move |ctx, dy| {
                if let Some(mut g) = ctx.take(a) {
                    cpu::copy_or_add(dy, g.acc(), g.slice());
                    ctx.put(a, g);
                }
                if let Some(mut g) = ctx.take(b) {
                    if full {
                        cpu::copy_or_add(dy, g.acc(), g.slice());
                    } else {
                        let acc = g.acc();
                        sum_rows(dy, nb, g.slice(), acc);
                    }
                    ctx.put(b, g);
                }
                Ok(())
            })
        });
        Ok(self.push("add", out, sa, bw))
    }

    /// `a ⊙ b` (elementwise); `b` may be broadcast over `a`'s leading dimensions.
    pub fn mul(&mut self, a: Tensor, b: Tensor) -> Result<Tensor> {
        let (sa, sb) = (self.shape(a)?, self.shape(b)?);
        let nb = broadcast("mul", sa, sb)?;
        if self.dev.is_some() {
            return self.dev_mul(a, b, nb, sa);
        }
        let mut out = self.alloc(sa.numel());
        let v = self.values();
        cpu::mul(v.get(a), v.get(b), nb, out.as_mut_slice());
        let bw = self.needs_grad(&[a, b]).then(|| {
            backward_fn(move |ctx, dy| {
                let (ga, gb) = (ctx.take(a), ctx.take(b));
                let (av, bv) = (ctx.vals.get(a), ctx.vals.get(b));
                if let Some(mut g) = ga {
                    cpu::mul_into(dy, bv, nb, g.acc(), g.slice());
                    ctx.put(a, g);
                }
                if let Some(mut g) = gb {
                    if nb == dy.len() {
                        cpu::mul_into(dy, av, nb, g.acc(), g.slice());
                    } else {
                        let mut tmp = ctx.pool.take(dy.len());
                        cpu::mul_into(dy, av, dy.len(), false, tmp.as_mut_slice());
                        let acc = g.acc();
                        sum_rows(tmp.as_slice(), nb, g.slice(), acc);
                        ctx.pool.give(tmp);
                    }
                    ctx.put(b, g);
                }
                Ok(())
            })
        });
        Ok(self.push("mul", out, sa, bw))
    }

    /// `s · x` for a constant `s`.
    pub fn scale(&mut self, x: Tensor, s: f32) -> Result<Tensor> {
        let sx = self.shape(x)?;
        if self.dev.is_some() {
            return self.dev_scale(x, s, sx);
        }
        let mut out = self.alloc(sx.numel());
        let xv = self.values().get(x);
        cpu::scale(xv, s, false, out.as_mut_slice());
        let bw = self.needs_grad(&[x]).then(|| {
            backward_fn(move |ctx, dy| {
                if let Some(mut g) = ctx.take(x) {
                    cpu::scale(dy, s, g.acc(), g.slice());
                    ctx.put(x, g);
                }
                Ok(())
            })
        });
        Ok(self.push("scale", out, sx, bw))
    }
}

/// CPU kernels.
pub(crate) mod cpu {
    use super::*;

    pub(crate) fn add(a: &[f32], b: &[f32], nb: usize, out: &mut [f32]) {
        if nb == a.len() {
            for_chunks(
                out,
                #[inline(always)]
                |o, c| {
                    for ((y, &x), &z) in c.iter_mut().zip(&a[o..]).zip(&b[o..]) {
                        *y = x + z;
                    }
                },
            );
        } else {
            for_rows(
                out,
                nb,
                #[inline(always)]
                |r, row| {
                    for ((y, &x), &z) in row.iter_mut().zip(&a[r * nb..]).zip(b) {
                        *y = x + z;
                    }
                },
            );
        }
    }

    pub(crate) fn mul(a: &[f32], b: &[f32], nb: usize, out: &mut [f32]) {
        mul_into(a, b, nb, false, out)
    }

    /// `out (+)= a ⊙ b` with `b` repeating every `nb` elements.
    pub(crate) fn mul_into(a: &[f32], b: &[f32], nb: usize, acc: bool, out: &mut [f32]) {
        if nb == 0 {
            return;
        }
        if nb == a.len() {
            for_chunks(
                out,
                #[inline(always)]
                |o, c| {
                    for ((y, &x), &z) in c.iter_mut().zip(&a[o..]).zip(&b[o..]) {
                        store(acc, y, x * z);
                    }
                },
            );
        } else {
            for_rows(
                out,
                nb,
                #[inline(always)]
                |r, row| {
                    for ((y, &x), &z) in row.iter_mut().zip(&a[r * nb..]).zip(b) {
                        store(acc, y, x * z);
                    }
                },
            );
        }
    }

    pub(crate) fn scale(x: &[f32], s: f32, acc: bool, out: &mut [f32]) {
        for_chunks(
            out,
            #[inline(always)]
            |o, c| {
                for (y, &x) in c.iter_mut().zip(&x[o..]) {
                    store(acc, y, s * x);
                }
            },
        );
    }

    pub(crate) fn copy_or_add(src: &[f32], acc: bool, out: &mut [f32]) {
        for_chunks(
            out,
            #[inline(always)]
            |o, c| {
                for (y, &x) in c.iter_mut().zip(&src[o..]) {
                    store(acc, y, x);
                }
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::test_util::assert_gradcheck;
    use crate::{init, Error, Graph, ParamStore};

    #[test]
    fn gradcheck_add_mul_scale() {
        let mut ps = ParamStore::new();
        let a = ps.add("a", &[2, 3, 4], init::normal(24, 1.0, 1)).unwrap();
        let b = ps.add("b", &[2, 3, 4], init::normal(24, 1.0, 2)).unwrap();
        let c = ps.add("c", &[4], init::normal(4, 1.0, 3)).unwrap();
        assert_gradcheck(&mut ps, |g| {
            let (a, b, c) = (g.param(a)?, g.param(b)?, g.param(c)?);
            let ab = g.mul(a, b)?; // same shape
            let abc = g.mul(ab, c)?; // broadcast
            let s = g.add(abc, a)?;
            let s = g.add(s, c)?; // broadcast
            g.scale(s, -1.5)
        });
    }

    #[test]
    fn broadcast_rules() {
        let mut ps = ParamStore::new();
        let mut g = Graph::new(&mut ps);
        let a = g.input(&[0.0; 6], &[2, 3]).unwrap();
        let b = g.input(&[0.0; 2], &[2]).unwrap();
        assert!(matches!(g.add(a, b), Err(Error::Shape { op: "add", .. })));
        assert!(matches!(g.mul(b, a), Err(Error::Shape { op: "mul", .. })));
        // large enough to take the parallel paths
        let n = 1 << 16;
        let x = g.variable(&vec![1.5; n], &[n / 64, 64]).unwrap();
        let bias = g.variable(&[1.0; 64], &[64]).unwrap();
        let y = g.add(x, bias).unwrap();
        let y = g.mul(y, bias).unwrap();
        let l = g.sum(y).unwrap();
        g.backward(l).unwrap();
        let gb = g.grad(bias).unwrap().unwrap();
        // d/db Σ (x + b) b = Σ_rows (x + 2b) = 1024 * 3.5
        assert!(gb.iter().all(|&v| v == 1024.0 * 3.5), "{}", gb[0]);
    }
}

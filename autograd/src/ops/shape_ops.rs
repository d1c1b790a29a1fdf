//! Shape ops: `reshape` (a free view), `transpose` of two axes and the attention layouts
//! `split_heads` / `merge_heads` (materialised, contiguous), and `split` along the last axis.

use crate::cpu::{for_rows, store};
use crate::error::{arg_err, shape_err};
use crate::graph::backward_fn;
use crate::{Graph, Result, Shape, Tensor, MAX_RANK};

/// `dims` left-padded with ones to rank 4.
fn pad4(dims: &[usize]) -> [usize; 4] {
    let mut d = [1usize; MAX_RANK];
    d[MAX_RANK - dims.len()..].copy_from_slice(dims);
    d
}

impl Graph<'_> {
    /// The same data with a new shape of the same element count (no copy).
    ///
    /// ```
    /// use autograd::{Graph, ParamStore};
    /// let mut ps = ParamStore::new();
    /// let mut g = Graph::new(&mut ps);
    /// let x = g.input(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0], &[2, 3])?;
    /// let y = g.reshape(x, &[3, 2])?;
    /// let t = g.transpose(x, 0, 1)?;
    /// assert_eq!(g.value(t)?, &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    /// let parts = g.split(x, &[1, 2])?;
    /// assert_eq!(g.value(parts[1])?, &[1.0, 2.0, 4.0, 5.0]);
    /// assert_eq!(g.shape(y)?.dims(), &[3, 2]);
    /// # Ok::<(), autograd::Error>(())
    /// ```
    pub fn reshape(&mut self, x: Tensor, shape: &[usize]) -> Result<Tensor> {
        let sx = self.shape(x)?;
        let s = Shape::new(shape)?;
        if s.numel() != sx.numel() {
            return shape_err("reshape", format!("cannot view {sx} as {s}"));
        }
        if self.dev.is_some() {
            return self.dev_reshape(x, s);
        }
        let bw = self.needs_grad(&[x]).then(|| {
            backward_fn(move |ctx, dy| {
                ctx.accumulate(x, dy);
                Ok(())
            })
        });
        Ok(self.push_alias("reshape", x, s, bw))
    }

    /// Swaps axes `a` and `b` (materialised as a contiguous tensor).
    pub fn transpose(&mut self, x: Tensor, a: usize, b: usize) -> Result<Tensor> {
        let sx = self.shape(x)?;
        let r = sx.rank();
        if a >= r || b >= r {
            return arg_err(
                "transpose",
                format!("axes ({a}, {b}) out of range for {sx}"),
            );
        }
        let mut od = sx.dims().to_vec();
        od.swap(a, b);
        let off = MAX_RANK - r;
        self.swap_axes(x, pad4(sx.dims()), a + off, b + off, Shape::new(&od)?)
    }

    /// `[B, T, H·D] → [B, H, T, D]`: the per-head layout attention works in.
    ///
    /// ```
    /// use autograd::{Graph, ParamStore};
    /// let mut ps = ParamStore::new();
    /// let mut g = Graph::new(&mut ps);
    /// // B = 1, T = 2, H = 2, D = 1
    /// let x = g.input(&[1.0, 2.0, 3.0, 4.0], &[1, 2, 2])?;
    /// let h = g.split_heads(x, 2)?;
    /// assert_eq!(g.shape(h)?.dims(), &[1, 2, 2, 1]);
    /// assert_eq!(g.value(h)?, &[1.0, 3.0, 2.0, 4.0]);
    /// let m = g.merge_heads(h)?;
    /// assert_eq!(g.value(m)?, &[1.0, 2.0, 3.0, 4.0]);
    /// # Ok::<(), autograd::Error>(())
    /// ```
    pub fn split_heads(&mut self, x: Tensor, heads: usize) -> Result<Tensor> {
        let sx = self.shape(x)?;
        if sx.rank() != 3 {
            return shape_err("split_heads", format!("expected [B, T, H*D], got {sx}"));
        }
        let [b, t, c] = [sx.dims()[0], sx.dims()[1], sx.dims()[2]];
        if heads == 0 || c % heads != 0 {
            return arg_err(
                "split_heads",
                format!("{c} channels do not split into {heads} heads"),
            );
        }
        let d = c / heads;
        self.swap_axes(x, [b, t, heads, d], 1, 2, Shape::new(&[b, heads, t, d])?)
    }

    /// `[B, H, T, D] → [B, T, H·D]` (inverse of [`Graph::split_heads`]).
    pub fn merge_heads(&mut self, x: Tensor) -> Result<Tensor> {
        let sx = self.shape(x)?;
        if sx.rank() != 4 {
            return shape_err("merge_heads", format!("expected [B, H, T, D], got {sx}"));
        }
        let [b, h, t, d] = [sx.dims()[0], sx.dims()[1], sx.dims()[2], sx.dims()[3]];
        self.swap_axes(x, [b, h, t, d], 1, 2, Shape::new(&[b, t, h * d])?)
    }

    /// Splits the last axis into consecutive parts of the given sizes (copies).
    pub fn split(&mut self, x: Tensor, sizes: &[usize]) -> Result<Vec<Tensor>> {
        let sx = self.shape(x)?;
        let c = sx.last();
        if sx.rank() == 0 || sizes.iter().sum::<usize>() != c {
            return shape_err(
                "split",
                format!("sizes {sizes:?} do not add up to the last axis of {sx}"),
            );
        }
        if self.dev.is_some() {
            return self.dev_split(x, sizes, sx);
        }
        let rows = sx.rows();
        let mut outs = Vec::with_capacity(sizes.len());
        let mut off = 0;
        for &s in sizes {
            let shape = sx.with_last(s)?;
            let mut out = self.alloc(rows * s);
            let xv = self.values().get(x);
            if s > 0 {
                for_rows(
                    out.as_mut_slice(),
                    s,
                    #[inline(always)]
                    |r, row| {
                        row.copy_from_slice(&xv[r * c + off..r * c + off + s]);
                    },
                );
            }
            let o = off;
            let bw = self.needs_grad(&[x]).then(|| {
                backward_fn(move |ctx, dy| {
                    if let Some(mut g) = ctx.take(x) {
                        let gx = g.zeroed();
                        if s > 0 {
                            for_rows(
                                gx,
                                c,
                                #[inline(always)]
                                |r, row| {
                                    for (d, &v) in
                                        row[o..o + s].iter_mut().zip(&dy[r * s..(r + 1) * s])
                                    {
                                        *d += v;
                                    }
                                },
                            );
                        }
                        ctx.put(x, g);
                    }
                    Ok(())
                })
            });
            outs.push(self.push("split", out, shape, bw));
            off += s;
        }
        Ok(outs)
    }

    /// Copies `x` (seen as 4-D `dims`) with axes `a < b` swapped, as `out_shape`.
    fn swap_axes(
        &mut self,
        x: Tensor,
        dims: [usize; 4],
        a: usize,
        b: usize,
        out_shape: Shape,
    ) -> Result<Tensor> {
        let (a, b) = (a.min(b), a.max(b));
        if self.dev.is_some() {
            return self.dev_swap_axes(x, dims, (a, b), out_shape);
        }
        let mut out = self.alloc(out_shape.numel());
        cpu::swap_axes(self.values().get(x), dims, a, b, false, out.as_mut_slice());
        let bw = self.needs_grad(&[x]).then(|| {
            let mut od = dims;
            od.swap(a, b);
            backward_fn(move |ctx, dy| {
                if let Some(mut g) = ctx.take(x) {
                    cpu::swap_axes(dy, od, a, b, g.acc(), g.slice());
                    ctx.put(x, g);
                }
                Ok(())
            })
        });
        Ok(self.push("transpose", out, out_shape, bw))
    }
}

/// CPU kernels.
pub(crate) mod cpu {
    use super::*;

    /// `out (+)= src` with axes `a < b` of the 4-D `dims` swapped.
    pub(crate) fn swap_axes(
        src: &[f32],
        dims: [usize; 4],
        a: usize,
        b: usize,
        acc: bool,
        out: &mut [f32],
    ) {
        let n: usize = dims.iter().product();
        if n == 0 {
            return;
        }
        // input strides, then permuted to output order
        let mut st = [0usize; 4];
        st[3] = 1;
        for i in (0..3).rev() {
            st[i] = st[i + 1] * dims[i + 1];
        }
        let (mut od, mut os) = (dims, st);
        od.swap(a, b);
        os.swap(a, b);
        let inner = od[3];
        for_rows(
            out,
            od[2] * inner,
            #[inline(always)]
            |r, blk| {
                let (i0, i1) = (r / od[1], r % od[1]);
                let base = i0 * os[0] + i1 * os[1];
                for (i2, row) in blk.chunks_exact_mut(inner).enumerate() {
                    let s = base + i2 * os[2];
                    if os[3] == 1 {
                        for (d, &v) in row.iter_mut().zip(&src[s..s + inner]) {
                            store(acc, d, v);
                        }
                    } else {
                        for (i3, d) in row.iter_mut().enumerate() {
                            store(acc, d, src[s + i3 * os[3]]);
                        }
                    }
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
    fn gradcheck_shape_ops() {
        let mut ps = ParamStore::new();
        let x = ps.add("x", &[2, 3, 8], init::normal(48, 1.0, 1)).unwrap();
        assert_gradcheck(&mut ps, |g| {
            let x = g.param(x)?;
            let h = g.split_heads(x, 2)?; // [2, 2, 3, 4]
            let t = g.transpose(h, 0, 3)?; // [4, 2, 3, 2]
            let t = g.transpose(t, 3, 0)?; // back
            let m = g.merge_heads(t)?; // [2, 3, 8]
            let p = g.split(m, &[3, 0, 5])?;
            let a = g.reshape(p[2], &[6, 5])?;
            let b = g.reshape(p[0], &[6, 3])?;
            let b = g.transpose(b, 1, 0)?; // [3, 6]
            let b = g.reshape(b, &[6, 3])?;
            let s = g.split(x, &[5, 3])?;
            let s0 = g.reshape(s[0], &[6, 5])?;
            let s1 = g.reshape(s[1], &[6, 3])?;
            let u = g.add(a, s0)?;
            let v = g.mul(b, s1)?;
            let u = g.reshape(u, &[30])?;
            let v = g.reshape(v, &[18])?;
            let su = g.sum(u)?;
            let vv = g.mul(v, v)?;
            let sv = g.sum(vv)?;
            let y = g.add(su, sv)?;
            let z = g.reshape(u, &[5, 6])?;
            let z = g.transpose(z, 0, 1)?;
            let zs = g.mean(z)?;
            let y = g.add(y, zs)?;
            let yy = g.reshape(y, &[1])?;
            let p = g.split(x, &[8])?;
            let pm = g.mean(p[0])?;
            let pm = g.reshape(pm, &[1])?;
            g.add(yy, pm)
        });
    }

    #[test]
    fn shape_errors() {
        let mut ps = ParamStore::new();
        let mut g = Graph::new(&mut ps);
        let x = g.input(&[0.0; 12], &[2, 2, 3]).unwrap();
        assert!(matches!(g.reshape(x, &[5]), Err(Error::Shape { .. })));
        assert!(matches!(
            g.transpose(x, 0, 3),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(matches!(
            g.split_heads(x, 2),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(matches!(g.merge_heads(x), Err(Error::Shape { .. })));
        assert!(matches!(g.split(x, &[1, 1]), Err(Error::Shape { .. })));
    }
}

//! Device arms of `add`, `mul`, `scale`, `sum` / `mean`, `round_bf16` and `reshape`.

use std::sync::Arc;

use super::{dev_backward, DBuf, DevCtx};
use crate::backend::{Backend, DeviceBackend};
use crate::{Device, Error, Graph, Result, Shape, Tensor};

impl Graph<'_> {
    /// The device backend of a device graph.
    pub(crate) fn be(&self) -> Result<Arc<DeviceBackend>> {
        self.dev.clone().ok_or(Error::WrongDevice {
            what: "device op",
            device: Device::Cpu,
            hint: "move the store with ParamStore::to_device first",
        })
    }

    /// `a + b`, `b` repeating with period `nb` over `a`.
    pub(crate) fn dev_add(&mut self, a: Tensor, b: Tensor, nb: usize, sa: Shape) -> Result<Tensor> {
        let be = self.be()?;
        let mut out = be.zeros(sa.numel())?;
        let v = self.values();
        be.add(v.dev(a)?, v.dev(b)?, &mut out)?;
        let full = nb == sa.numel();
        let bw = self.needs_grad(&[a, b]).then(|| {
            dev_backward(move |ctx, dy| {
                if let Some(mut g) = ctx.take(a)? {
                    ctx.be.copy_or_add(dy, g.out())?;
                    ctx.put(a, g)?;
                }
                if let Some(mut g) = ctx.take(b)? {
                    if full {
                        ctx.be.copy_or_add(dy, g.out())?;
                    } else {
                        ctx.be.sum_rows(dy, nb, g.out())?;
                    }
                    ctx.put(b, g)?;
                }
                Ok(())
            })
        });
        Ok(self.push_dev("add", out, sa, bw))
    }

    /// `a ⊙ b`, `b` repeating with period `nb` over `a`.
    pub(crate) fn dev_mul(&mut self, a: Tensor, b: Tensor, nb: usize, sa: Shape) -> Result<Tensor> {
        let be = self.be()?;
        let mut out = be.zeros(sa.numel())?;
        let v = self.values();
        be.mul(v.dev(a)?, v.dev(b)?, (false, &mut out))?;
        let bw = self.needs_grad(&[a, b]).then(|| {
            dev_backward(move |ctx, dy| {
                let (ga, gb) = (ctx.take(a)?, ctx.take(b)?);
                let n = ctx.be.len(dy);
                if let Some(mut g) = ga {
                    ctx.be.mul(dy, ctx.val(b)?, g.out())?;
                    ctx.put(a, g)?;
                }
                if let Some(mut g) = gb {
                    if nb == n {
                        ctx.be.mul(dy, ctx.val(a)?, g.out())?;
                    } else {
                        let mut tmp = ctx.be.zeros(n)?;
                        ctx.be.mul(dy, ctx.val(a)?, (false, &mut tmp))?;
                        ctx.be.sum_rows(&tmp, nb, g.out())?;
                    }
                    ctx.put(b, g)?;
                }
                Ok(())
            })
        });
        Ok(self.push_dev("mul", out, sa, bw))
    }

    /// `s · x`.
    pub(crate) fn dev_scale(&mut self, x: Tensor, s: f32, sx: Shape) -> Result<Tensor> {
        let be = self.be()?;
        let mut out = be.zeros(sx.numel())?;
        be.scale(self.values().dev(x)?, s, (false, &mut out))?;
        let bw = self.needs_grad(&[x]).then(|| {
            dev_backward(move |ctx, dy| {
                if let Some(mut g) = ctx.take(x)? {
                    ctx.be.scale(dy, s, g.out())?;
                    ctx.put(x, g)?;
                }
                Ok(())
            })
        });
        Ok(self.push_dev("scale", out, sx, bw))
    }

    /// `(f32)(Σ x · factor)`, summed in f64 as the CPU does.
    pub(crate) fn dev_reduce(&mut self, x: Tensor, factor: f64) -> Result<Tensor> {
        let be = self.be()?;
        let mut out = be.zeros(1)?;
        be.sum(self.values().dev(x)?, factor, &mut out)?;
        let bw = self.needs_grad(&[x]).then(|| {
            dev_backward(move |ctx, dy| {
                if let Some(mut g) = ctx.take(x)? {
                    ctx.be.fill_scaled(dy, factor, g.out())?;
                    ctx.put(x, g)?;
                }
                Ok(())
            })
        });
        let op = if factor == 1.0 { "sum" } else { "mean" };
        Ok(self.push_dev(op, out, Shape::scalar(), bw))
    }

    /// BF16 rounding with a straight-through gradient.
    pub(crate) fn dev_round_bf16(&mut self, x: Tensor, sx: Shape) -> Result<Tensor> {
        let be = self.be()?;
        let mut out = be.zeros(sx.numel())?;
        be.round_bf16(self.values().dev(x)?, &mut out)?;
        let bw = self.needs_grad(&[x]).then(|| pass_through(x));
        Ok(self.push_dev("round_bf16", out, sx, bw))
    }

    /// A view of `x` as shape `s` (no copy).
    pub(crate) fn dev_reshape(&mut self, x: Tensor, s: Shape) -> Result<Tensor> {
        let bw = self.needs_grad(&[x]).then(|| pass_through(x));
        Ok(self.push_alias_dev("reshape", x, s, bw))
    }
}

/// The backward of an op whose gradient is its output gradient.
fn pass_through(x: Tensor) -> super::DevBackwardFn {
    dev_backward(move |ctx: &mut DevCtx<'_>, dy: &DBuf| ctx.accumulate(x, dy))
}

impl Graph<'_> {
    /// `x` seen as 4-D `dims` with axes `a < b` swapped (`transpose`, `split_heads`,
    /// `merge_heads`), as `out_shape`.
    pub(crate) fn dev_swap_axes(
        &mut self,
        x: Tensor,
        dims: [usize; 4],
        (a, b): (usize, usize),
        out_shape: Shape,
    ) -> Result<Tensor> {
        let be = self.be()?;
        let mut out = be.zeros(out_shape.numel())?;
        be.swap_axes(self.values().dev(x)?, dims, a, b, (false, &mut out))?;
        let bw = self.needs_grad(&[x]).then(|| {
            let mut od = dims;
            od.swap(a, b);
            dev_backward(move |ctx, dy| {
                if let Some(mut g) = ctx.take(x)? {
                    ctx.be.swap_axes(dy, od, a, b, g.out())?;
                    ctx.put(x, g)?;
                }
                Ok(())
            })
        });
        Ok(self.push_dev("transpose", out, out_shape, bw))
    }

    /// Consecutive parts of the last axis of `x` (sizes already checked to add up).
    pub(crate) fn dev_split(
        &mut self,
        x: Tensor,
        sizes: &[usize],
        sx: Shape,
    ) -> Result<Vec<Tensor>> {
        let be = self.be()?;
        let (rows, c) = (sx.rows(), sx.last());
        let mut outs = Vec::with_capacity(sizes.len());
        let mut off = 0;
        for &s in sizes {
            let shape = sx.with_last(s)?;
            let mut out = be.zeros(rows * s)?;
            if s > 0 {
                be.columns(self.values().dev(x)?, c, off, s, false, &mut out)?;
            }
            let o = off;
            let bw = self.needs_grad(&[x]).then(|| {
                dev_backward(move |ctx, dy| {
                    if let Some(mut g) = ctx.take(x)? {
                        // a fresh gradient is zeroed device memory: adding is writing
                        let (_, buf) = g.out();
                        if s > 0 {
                            ctx.be.columns(dy, c, o, s, true, buf)?;
                        }
                        ctx.put(x, g)?;
                    }
                    Ok(())
                })
            });
            outs.push(self.push_dev("split", out, shape, bw));
            off += s;
        }
        Ok(outs)
    }
}

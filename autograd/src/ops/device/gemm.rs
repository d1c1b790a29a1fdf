//! Device arm of the linear layer: FP32 and BF16 operands on the device's f32 GEMM (a BF16
//! operand is rounded first, so its products are exact and only the f32 accumulation order
//! differs from the CPU's BF16 GEMM). Operands quantized below BF16 (FP8, MXFP8, NVFP4) have
//! no device path yet.

use quant::{GemmPolicy, OperandQuant};

use super::{dev_backward, no_kernel, DBuf};
use crate::backend::{Backend, DeviceBackend};
use crate::{Graph, Result, Shape, Tensor};

/// Whether an operand is rounded to BF16 (`true`) or used as is; an error for formats below
/// BF16.
fn rounds(q: &OperandQuant) -> Result<bool> {
    if q.is_identity() {
        Ok(false)
    } else if *q == OperandQuant::BF16 {
        Ok(true)
    } else {
        no_kernel("linear (operands quantized below BF16)")
    }
}

/// `x` as the operand: a BF16-rounded copy, or `x` itself.
fn operand<'a>(
    be: &DeviceBackend,
    x: &'a DBuf,
    round: bool,
    keep: &'a mut Option<DBuf>,
) -> Result<&'a DBuf> {
    if !round {
        return Ok(x);
    }
    let mut r = be.zeros(be.len(x))?;
    be.round_bf16(x, &mut r)?;
    Ok(keep.insert(r))
}

/// The policy's six operands: rounded to BF16 or not.
#[derive(Clone, Copy)]
struct Rounding {
    fx: bool,
    fw: bool,
    dy: bool,
    dw: bool,
    wdy: bool,
    wx: bool,
}

impl Rounding {
    fn of(p: &GemmPolicy) -> Result<Rounding> {
        Ok(Rounding {
            fx: rounds(&p.fprop.a)?,
            fw: rounds(&p.fprop.b)?,
            dy: rounds(&p.dgrad.a)?,
            dw: rounds(&p.dgrad.b)?,
            wdy: rounds(&p.wgrad.a)?,
            wx: rounds(&p.wgrad.b)?,
        })
    }
}

impl Graph<'_> {
    /// `y = x Wᵀ (+ b)` for `x: [m, n_in]`, `w: [n_out, n_in]` (shapes already checked).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn dev_linear(
        &mut self,
        x: Tensor,
        w: Tensor,
        bias: Option<Tensor>,
        policy: &GemmPolicy,
        (m, n_out, n_in): (usize, usize, usize),
        out_shape: Shape,
    ) -> Result<Tensor> {
        let r = Rounding::of(policy)?;
        let be = self.be()?;
        let inputs: Vec<Tensor> = [Some(x), Some(w), bias].into_iter().flatten().collect();
        let rg = self.needs_grad(&inputs);
        let v = self.values();
        let (mut kx, mut kw) = (None, None);
        let xa = operand(&be, v.dev(x)?, r.fx, &mut kx)?;
        let wb = operand(&be, v.dev(w)?, r.fw, &mut kw)?;
        let mut y = be.zeros(m * n_out)?;
        be.gemm(m, n_out, n_in, 1.0, xa, false, wb, true, 0.0, &mut y)?;
        if let Some(b) = bias {
            let mut yb = be.zeros(m * n_out)?;
            be.add(&y, v.dev(b)?, &mut yb)?;
            y = yb;
        }
        // the layer's state records the policy it ran with, as on the CPU (checkpoints)
        if let (Some(p), true) = (self.param_index(w), self.grad_enabled()) {
            let (_, states, _) = self.parts();
            states[p].get_or_insert_with(Default::default).policy = Some(*policy);
        }
        let bw = rg.then(|| {
            dev_backward(move |ctx, dy| {
                let be = ctx.be;
                if let Some(mut g) = ctx.take(x)? {
                    let (mut k1, mut k2) = (None, None);
                    let dya = operand(be, dy, r.dy, &mut k1)?;
                    let wa = operand(be, ctx.val(w)?, r.dw, &mut k2)?;
                    let beta = g.beta();
                    be.gemm(m, n_in, n_out, 1.0, dya, false, wa, false, beta, &mut g.buf)?;
                    ctx.put(x, g)?;
                }
                if let Some(mut g) = ctx.take(w)? {
                    let (mut k1, mut k2) = (None, None);
                    let dya = operand(be, dy, r.wdy, &mut k1)?;
                    let xa = operand(be, ctx.val(x)?, r.wx, &mut k2)?;
                    let beta = g.beta();
                    be.gemm(n_out, n_in, m, 1.0, dya, true, xa, false, beta, &mut g.buf)?;
                    ctx.put(w, g)?;
                }
                if let Some(b) = bias {
                    if let Some(mut g) = ctx.take(b)? {
                        be.sum_rows(dy, n_out, g.out())?;
                        ctx.put(b, g)?;
                    }
                }
                Ok(())
            })
        });
        Ok(self.push_dev("linear", y, out_shape, bw))
    }
}

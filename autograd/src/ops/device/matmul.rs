//! Device arm of `matmul` / `matmul_t`: the batched fixed-order f32 GEMM
//! (`kernels_cuda::train_bmm`) with every transposition expressed by strides, as the CPU op
//! does with strided views; forward, `dA` and `dB` (a shared `B` is folded into one GEMM by the
//! front-end, as on the CPU). Only the summation order differs from quant's blocked sgemm.

use kernels_cuda::train_bmm::Strided;

use super::dev_backward;
use crate::backend::Backend;
use crate::{Graph, Result, Shape, Tensor};

/// The product's geometry: `C_i[m, n] = A_i[m, k] · op(B_i)`, `op(B) = Bᵀ` with `trans_b`
/// (B stored `[n, k]`), one `B` for all items with `b_shared`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DevBmm {
    pub(crate) batch: usize,
    pub(crate) m: usize,
    pub(crate) k: usize,
    pub(crate) n: usize,
    pub(crate) trans_b: bool,
    pub(crate) b_shared: bool,
}

const fn st(row: usize, col: usize, item: usize) -> Strided {
    Strided { row, col, item }
}

impl DevBmm {
    /// `op(B_i)` as a `[k, n]` operand.
    fn op_b(&self) -> Strided {
        let item = if self.b_shared { 0 } else { self.k * self.n };
        if self.trans_b {
            st(1, self.k, item)
        } else {
            st(self.n, 1, item)
        }
    }
}

impl Graph<'_> {
    /// `a · op(b)` on the device (shapes checked by the front-end).
    pub(crate) fn dev_bmm(
        &mut self,
        op: &'static str,
        a: Tensor,
        b: Tensor,
        geo: DevBmm,
        out_shape: Shape,
    ) -> Result<Tensor> {
        let be = self.be()?;
        let v = self.values();
        let (m, k, n) = (geo.m, geo.k, geo.n);
        let mut c = be.zeros(out_shape.numel())?;
        let sa = st(k, 1, m * k);
        be.gemm_batched(
            geo.batch,
            (m, n, k),
            (v.dev(a)?, sa),
            (v.dev(b)?, geo.op_b()),
            0.0,
            &mut c,
        )?;
        let bw = self.needs_grad(&[a, b]).then(|| {
            dev_backward(move |ctx, dc| {
                let be = ctx.be;
                let sdc = st(n, 1, m * n);
                if let Some(mut g) = ctx.take(a)? {
                    // dA_i (+)= dC_i · op(B_i)ᵀ: op(B)ᵀ as [n, k] is op(B) read transposed
                    let ob = geo.op_b();
                    let obt = st(ob.col, ob.row, ob.item);
                    let beta = g.beta();
                    let bv = ctx.val(b)?;
                    be.gemm_batched(geo.batch, (m, k, n), (dc, sdc), (bv, obt), beta, &mut g.buf)?;
                    ctx.put(a, g)?;
                }
                if let Some(mut g) = ctx.take(b)? {
                    let beta = g.beta();
                    let av = ctx.val(a)?;
                    // dB_i: [n, k] = dC_iᵀ · A_i (trans_b), else [k, n] = A_iᵀ · dC_i
                    let (mnk, x, y) = if geo.trans_b {
                        ((n, k, m), (dc, st(1, n, m * n)), (av, st(k, 1, m * k)))
                    } else {
                        ((k, n, m), (av, st(1, k, m * k)), (dc, st(n, 1, m * n)))
                    };
                    // a shared B comes with batch 1 (the front-end folds the items into m)
                    be.gemm_batched(geo.batch, mnk, x, y, beta, &mut g.buf)?;
                    ctx.put(b, g)?;
                }
                Ok(())
            })
        });
        Ok(self.push_dev(op, c, out_shape, bw))
    }
}

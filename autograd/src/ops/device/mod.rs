//! The `Cuda` arms of the ops: each `Graph` op's front-end checks shapes, then, on a device
//! graph, calls its `dev_*` method here, which runs the op's CUDA kernels through
//! [`DeviceBackend`] (the same [`Backend`] calls `tests/kernel_checks` compares with the CPU
//! ops) and records a device backward closure. Ops without a CUDA kernel report
//! [`Error::NoDeviceKernel`].

mod attention_cached;
mod elementwise;
mod gemm;
mod matmul;
mod nn;

pub use gemm::linear_blocker;
pub(crate) use matmul::DevBmm;

use crate::backend::{Backend, DeviceBackend, DeviceBuf};
use crate::graph::{Node, Value, Values};
use crate::{Error, Result, Tensor};

/// A device buffer of f32.
pub(crate) type DBuf = DeviceBuf<f32>;

/// A device backward closure: receives the context and its node's output gradient.
pub(crate) type DevBackwardFn = Box<dyn FnOnce(&mut DevCtx<'_>, &DBuf) -> Result<()>>;

/// Boxes a device backward closure.
pub(crate) fn dev_backward(
    f: impl FnOnce(&mut DevCtx<'_>, &DBuf) -> Result<()> + 'static,
) -> DevBackwardFn {
    Box::new(f)
}

/// A gradient buffer taken out for a kernel. A fresh one is zero-filled device memory (the
/// device path has no pool), so writing and accumulating into it give the same result.
pub(crate) struct DevGrad {
    pub(crate) buf: DBuf,
    fresh: bool,
}

impl DevGrad {
    /// The kernel output: overwrite a fresh buffer, accumulate into an existing one.
    pub(crate) fn out(&mut self) -> (bool, &mut DBuf) {
        let acc = !std::mem::replace(&mut self.fresh, false);
        (acc, &mut self.buf)
    }

    /// GEMM `beta` (0 overwrites a fresh buffer, 1 accumulates); marks the buffer written.
    pub(crate) fn beta(&mut self) -> f32 {
        if std::mem::replace(&mut self.fresh, false) {
            0.0
        } else {
            1.0
        }
    }
}

/// What a device backward closure may touch.
pub(crate) struct DevCtx<'a> {
    pub(crate) be: &'a DeviceBackend,
    pub(crate) vals: Values<'a>,
    pub(crate) node_grads: &'a mut [Option<DBuf>],
    pub(crate) param_grads: &'a mut [Option<DBuf>],
    /// The linear layers' quantizer states (FP8 delayed scaling), as the CPU closures see them.
    pub(crate) states: &'a mut [Option<Box<crate::quant_state::LinearQuantState>>],
}

impl DevCtx<'_> {
    fn node(&self, t: Tensor) -> &Node {
        &self.vals.nodes[t.idx()]
    }

    /// The device value of `t`.
    pub(crate) fn val(&self, t: Tensor) -> Result<&DBuf> {
        self.vals.dev(t)
    }

    /// Takes the gradient buffer of `t` out; `None` when `t` needs no gradient. Every `take`
    /// is followed by a [`DevCtx::put`] of the same tensor.
    pub(crate) fn take(&mut self, t: Tensor) -> Result<Option<DevGrad>> {
        let node = self.node(t);
        if !node.requires_grad {
            return Ok(None);
        }
        let n = node.shape.numel();
        let slot = match node.value {
            Value::Param(p) => &mut self.param_grads[p],
            _ => &mut self.node_grads[t.idx()],
        };
        Ok(Some(match slot.take() {
            Some(buf) => DevGrad { buf, fresh: false },
            // also the second take of a tensor that appears twice among an op's inputs
            None => DevGrad {
                buf: self.be.zeros(n)?,
                fresh: true,
            },
        }))
    }

    /// Returns a gradient buffer; if the slot was refilled meanwhile, the two are added.
    pub(crate) fn put(&mut self, t: Tensor, g: DevGrad) -> Result<()> {
        let slot = match self.node(t).value {
            Value::Param(p) => &mut self.param_grads[p],
            _ => &mut self.node_grads[t.idx()],
        };
        match slot {
            None => *slot = Some(g.buf),
            Some(b) => self.be.copy_or_add(&g.buf, (true, b))?,
        }
        Ok(())
    }

    /// Adds `src` to the gradient of `t`.
    pub(crate) fn accumulate(&mut self, t: Tensor, src: &DBuf) -> Result<()> {
        if let Some(mut g) = self.take(t)? {
            self.be.copy_or_add(src, g.out())?;
            self.put(t, g)?;
        }
        Ok(())
    }
}

/// The error of an op with no CUDA kernel yet.
pub(crate) fn no_kernel<T>(op: &'static str) -> Result<T> {
    Err(Error::NoDeviceKernel { op })
}

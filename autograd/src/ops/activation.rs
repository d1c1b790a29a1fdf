//! Pointwise non-linearities: GELU (tanh approximation), SiLU, and SwiGLU
//! (`silu(gate) ⊙ up`).

use crate::backend::Act;
use crate::cpu::{exp, for_chunks, sigmoid, store, tanh};
use crate::error::shape_err;
use crate::graph::backward_fn;
use crate::{Graph, Result, Tensor};

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_C: f32 = 0.044_715;

impl Graph<'_> {
    /// GELU, tanh approximation: `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))` (PyTorch's
    /// `gelu(approximate="tanh")`).
    ///
    /// ```
    /// use autograd::{Graph, ParamStore};
    /// let mut ps = ParamStore::new();
    /// let mut g = Graph::new(&mut ps);
    /// let x = g.input(&[-1.0, 0.0, 2.0], &[3])?;
    /// let y = g.gelu(x)?;
    /// let s = g.silu(x)?;
    /// let v = g.value(y)?;
    /// assert!((v[0] + 0.158_808).abs() < 1e-5 && v[1] == 0.0 && (v[2] - 1.954_597_7).abs() < 1e-5);
    /// assert!((g.value(s)?[2] - 1.761_594_2).abs() < 1e-6);
    /// let up = g.input(&[1.0, 1.0, 0.5], &[3])?;
    /// let sw = g.swiglu(x, up)?; // silu(x) * up
    /// assert!((g.value(sw)?[2] - 0.880_797_1).abs() < 1e-6);
    /// # Ok::<(), autograd::Error>(())
    /// ```
    pub fn gelu(&mut self, x: Tensor) -> Result<Tensor> {
        if self.dev.is_some() {
            return self.dev_act("gelu", Act::Gelu, x);
        }
        self.pointwise("gelu", x, cpu::gelu_fwd, cpu::gelu_bwd)
    }

    /// SiLU (swish): `x · σ(x)`.
    pub fn silu(&mut self, x: Tensor) -> Result<Tensor> {
        if self.dev.is_some() {
            return self.dev_act("silu", Act::Silu, x);
        }
        self.pointwise("silu", x, cpu::silu_fwd, cpu::silu_bwd)
    }

    /// SwiGLU's gating: `silu(gate) ⊙ up` for two tensors of the same shape.
    pub fn swiglu(&mut self, gate: Tensor, up: Tensor) -> Result<Tensor> {
        let (sg, su) = (self.shape(gate)?, self.shape(up)?);
        if sg != su {
            return shape_err("swiglu", format!("gate {sg} and up {su} differ"));
        }
        if self.dev.is_some() {
            return self.dev_swiglu(gate, up, sg);
        }
        let mut out = self.alloc(sg.numel());
        let v = self.values();
        let (gv, uv) = (v.get(gate), v.get(up));
        for_chunks(
            out.as_mut_slice(),
            #[inline(always)]
            |o, c| {
                for ((y, &g), &u) in c.iter_mut().zip(&gv[o..]).zip(&uv[o..]) {
                    *y = g * sigmoid(g) * u;
                }
            },
        );
        let bw = self.needs_grad(&[gate, up]).then(|| {
            backward_fn(move |ctx, dy| {
                let (gg, gu) = (ctx.take(gate), ctx.take(up));
                let (gv, uv) = (ctx.vals.get(gate), ctx.vals.get(up));
                if let Some(mut g) = gg {
                    let acc = g.acc();
                    for_chunks(
                        g.slice(),
                        #[inline(always)]
                        |o, c| {
                            let it = c.iter_mut().zip(&dy[o..]).zip(&gv[o..]).zip(&uv[o..]);
                            for (((d, &dy), &x), &u) in it {
                                store(acc, d, dy * u * cpu::silu_grad(x));
                            }
                        },
                    );
                    ctx.put(gate, g);
                }
                if let Some(mut g) = gu {
                    let acc = g.acc();
                    for_chunks(
                        g.slice(),
                        #[inline(always)]
                        |o, c| {
                            for ((d, &dy), &x) in c.iter_mut().zip(&dy[o..]).zip(&gv[o..]) {
                                store(acc, d, dy * x * sigmoid(x));
                            }
                        },
                    );
                    ctx.put(up, g);
                }
                Ok(())
            })
        });
        Ok(self.push("swiglu", out, sg, bw))
    }

    /// A pointwise op from its value `f(x)` and derivative `f'(x)`.
    /// Generic over the function items so the element loops inline them and vectorise.
    fn pointwise<F, D>(&mut self, name: &'static str, x: Tensor, f: F, df: D) -> Result<Tensor>
    where
        F: Fn(f32) -> f32 + Sync + Send,
        D: Fn(f32) -> f32 + Sync + Send + 'static,
    {
        let sx = self.shape(x)?;
        let mut out = self.alloc(sx.numel());
        let xv = self.values().get(x);
        for_chunks(
            out.as_mut_slice(),
            #[inline(always)]
            |o, c| {
                for (y, &x) in c.iter_mut().zip(&xv[o..]) {
                    *y = f(x);
                }
            },
        );
        let bw = self.needs_grad(&[x]).then(|| {
            backward_fn(move |ctx, dy| {
                if let Some(mut g) = ctx.take(x) {
                    let xv = ctx.vals.get(x);
                    let acc = g.acc();
                    for_chunks(
                        g.slice(),
                        #[inline(always)]
                        |o, c| {
                            for ((d, &dy), &x) in c.iter_mut().zip(&dy[o..]).zip(&xv[o..]) {
                                store(acc, d, dy * (df)(x));
                            }
                        },
                    );
                    ctx.put(x, g);
                }
                Ok(())
            })
        });
        Ok(self.push(name, out, sx, bw))
    }
}

/// CPU kernels (scalar functions the element loops inline and vectorise).
pub(crate) mod cpu {
    use super::*;

    #[inline(always)]
    pub(crate) fn gelu_fwd(x: f32) -> f32 {
        let u = SQRT_2_OVER_PI * (x + GELU_C * x * x * x);
        0.5 * x * (1.0 + tanh(u))
    }

    #[inline(always)]
    pub(crate) fn gelu_bwd(x: f32) -> f32 {
        let x2 = x * x;
        let t = tanh(SQRT_2_OVER_PI * (x + GELU_C * x2 * x));
        0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_C * x2)
    }

    #[inline(always)]
    pub(crate) fn silu_fwd(x: f32) -> f32 {
        x / (1.0 + exp(-x))
    }

    #[inline(always)]
    pub(crate) fn silu_bwd(x: f32) -> f32 {
        silu_grad(x)
    }

    /// `d/dx [x σ(x)] = σ(x) (1 + x (1 − σ(x)))`.
    #[inline(always)]
    pub(crate) fn silu_grad(x: f32) -> f32 {
        let s = sigmoid(x);
        s * (1.0 + x * (1.0 - s))
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::test_util::assert_gradcheck;
    use crate::{init, ParamStore};

    #[test]
    fn gradcheck_gelu_silu_swiglu() {
        let mut ps = ParamStore::new();
        let a = ps.add("a", &[4, 6], init::normal(24, 1.5, 1)).unwrap();
        let b = ps.add("b", &[4, 6], init::normal(24, 1.0, 2)).unwrap();
        assert_gradcheck(&mut ps, |g| {
            let (a, b) = (g.param(a)?, g.param(b)?);
            let x = g.gelu(a)?;
            let y = g.silu(b)?;
            let z = g.swiglu(a, b)?;
            let s = g.add(x, y)?;
            g.add(s, z)
        });
    }
}

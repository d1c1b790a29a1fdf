//! Pointwise non-linearities: GELU (tanh approximation), SiLU, and SwiGLU
//! (`silu(gate) ⊙ up`).

use crate::backend::Act;
use crate::cpu::{exp, for_chunks, for_rows, sigmoid, store, store_over_zero, tanh};
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

    /// SwiGLU of one tensor `x: [..., 2·H]` whose last axis holds the gate then the up
    /// projection (a fused gate-and-up linear's output): `silu(x[.., :H]) ⊙ x[.., H:]`,
    /// `[..., H]`. Bit for bit `split(x, [H, H])` then [`Graph::swiglu`], forward and
    /// backward, without the two copies and the zero-filled gradient.
    ///
    /// ```
    /// use autograd::{Graph, ParamStore};
    /// let mut ps = ParamStore::new();
    /// let mut g = Graph::new(&mut ps);
    /// let x = g.input(&[2.0, 0.0, 1.0, 3.0], &[1, 4])?; // gate [2, 0], up [1, 3]
    /// let y = g.swiglu_halves(x)?;
    /// assert_eq!(g.shape(y)?.dims(), &[1, 2]);
    /// assert!((g.value(y)?[0] - 1.761_594_2).abs() < 1e-6 && g.value(y)?[1] == 0.0);
    /// # Ok::<(), autograd::Error>(())
    /// ```
    pub fn swiglu_halves(&mut self, x: Tensor) -> Result<Tensor> {
        let sx = self.shape(x)?;
        if sx.rank() == 0 || sx.last() % 2 != 0 {
            return shape_err(
                "swiglu_halves",
                format!("expected [..., 2*H] (gate, up), got {sx}"),
            );
        }
        let h = sx.last() / 2;
        if self.dev.is_some() {
            let gu = self.split(x, &[h, h])?;
            return self.swiglu(gu[0], gu[1]);
        }
        let shape = sx.with_last(h)?;
        let mut out = self.alloc(shape.numel());
        let xv = self.values().get(x);
        for_rows(
            out.as_mut_slice(),
            h,
            #[inline(always)]
            |r, y| {
                let (gv, uv) = xv[2 * r * h..2 * (r + 1) * h].split_at(h);
                for ((y, &g), &u) in y.iter_mut().zip(gv).zip(uv) {
                    *y = g * sigmoid(g) * u;
                }
            },
        );
        let bw = self.needs_grad(&[x]).then(|| {
            backward_fn(move |ctx, dy| {
                if let Some(mut g) = ctx.take(x) {
                    let (acc, xv) = (g.acc(), ctx.vals.get(x));
                    for_rows(
                        g.slice(),
                        2 * h,
                        #[inline(always)]
                        |r, row| {
                            let (dg, du) = row.split_at_mut(h);
                            let (gv, uv) = xv[2 * r * h..2 * (r + 1) * h].split_at(h);
                            let dy = &dy[r * h..(r + 1) * h];
                            let grads = dg.iter_mut().zip(du.iter_mut());
                            for ((dg, du), ((&dy, &x), &u)) in grads.zip(dy.iter().zip(gv).zip(uv))
                            {
                                let s = sigmoid(x); // once for both gradients
                                store_over_zero(acc, dg, dy * u * cpu::silu_grad_with(x, s));
                                store_over_zero(acc, du, dy * x * s);
                            }
                        },
                    );
                    g.fresh = false;
                    ctx.put(x, g);
                }
                Ok(())
            })
        });
        Ok(self.push("swiglu_halves", out, shape, bw))
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
        silu_grad_with(x, sigmoid(x))
    }

    /// [`silu_grad`] given `s = σ(x)`.
    #[inline(always)]
    pub(crate) fn silu_grad_with(x: f32, s: f32) -> f32 {
        s * (1.0 + x * (1.0 - s))
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::test_util::assert_gradcheck;
    use crate::{init, Error, Graph, ParamStore};

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

    #[test]
    fn swiglu_halves_equals_split_then_swiglu_bit_for_bit() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        // small, and large enough for the parallel row loops; gradients fresh and accumulated
        for (rows, h, second) in [
            (3, 5, false),
            (3, 5, true),
            (300, 352, false),
            (300, 352, true),
        ] {
            let xs = init::normal(rows * 2 * h, 2.0, 7);
            let w = init::normal(rows * h, 1.0, 8);
            let [fused, chain] = [true, false].map(|fused| {
                let mut ps = ParamStore::new();
                let mut g = Graph::new(&mut ps);
                let x = g.variable(&xs, &[rows, 2 * h]).unwrap();
                let wt = g.input(&w, &[rows, h]).unwrap();
                let y = if fused {
                    g.swiglu_halves(x).unwrap()
                } else {
                    let p = g.split(x, &[h, h]).unwrap();
                    g.swiglu(p[0], p[1]).unwrap()
                };
                let yw = g.mul(y, wt).unwrap();
                let mut l = g.sum(yw).unwrap();
                if second {
                    // a second consumer, differentiated first: x's gradient accumulates
                    let z = g.mul(x, x).unwrap();
                    let b = g.sum(z).unwrap();
                    l = g.add(l, b).unwrap();
                }
                g.backward(l).unwrap();
                (bits(g.value(y).unwrap()), bits(g.grad(x).unwrap().unwrap()))
            });
            assert_eq!(fused, chain, "{rows}x{h}, second consumer {second}");
        }
        let mut ps = ParamStore::new();
        let mut g = Graph::new(&mut ps);
        let odd = g.input(&[0.0; 6], &[2, 3]).unwrap();
        assert!(matches!(g.swiglu_halves(odd), Err(Error::Shape { .. })));
    }
}

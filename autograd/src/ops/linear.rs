//! The quantized linear layer `Y = X Wᵀ (+ b)`, its three GEMMs driven by a
//! [`quant::GemmPolicy`] (docs/numerics.md#the-precision-model):
//!
//! | GEMM  | computes        | operand A (policy)              | operand B (policy)            |
//! |-------|-----------------|---------------------------------|-------------------------------|
//! | Fprop | `Y = X Wᵀ`      | X rowwise `[T, in]` (`fprop.a`)  | W rowwise `[out, in]` (`fprop.b`) |
//! | Dgrad | `dX = dY W`     | dY rowwise `[T, out]` (`dgrad.a`)| W columnwise = Wᵀ `[in, out]` (`dgrad.b`) |
//! | Wgrad | `dW = dYᵀ X`    | dY columnwise = dYᵀ `[out, T]` (`wgrad.a`) | X columnwise = Xᵀ `[in, T]` (`wgrad.b`) |
//!
//! Every GEMM is one call of [`quant::qgemm::quantized_matmul_tn`], each operand quantized
//! from the high-precision tensor (rowwise and columnwise copies independently; under FP8
//! current scaling the second cast of X, W and dY takes the amax the first one measured, the
//! same bits), and the gradients pass straight through the quantizers. When both operands of a GEMM are
//! quantized (BF16, FP8, MX, NVFP4) it runs on `quant::gemm::bf16::quantized_gemm_tn`
//! (the BF16 GEMM on AMX-BF16 tiles where the CPU has them, FP32 accumulation in a fixed
//! order; the f32 GEMM elsewhere), two NVFP4/MXFP4 operands on a CPU with AVX2 but no BF16
//! unit on the E2M1 block GEMM (`quant::gemm::e2m1`); with an FP32 operand, on the f32 GEMM. Either way each output element's arithmetic does not depend on the
//! number of rows or threads. Random bits (stochastic rounding, random
//! Hadamard signs) come from a distinct Philox stream per operand role, layer and step: see
//! [`crate::gemm_stream`]. An all-FP32 policy is bit for bit the plain f32 linear layer.

use quant::gemm::MatRef;
use quant::qgemm::{
    e2m1_values, fake_operand, packing_rounds, quantized_matmul_tn,
    quantized_matmul_tn_prequantized, transpose_exact, FakeOperand, Operand,
};
use quant::{
    Fp8Scaling, GemmPolicy, OperandQuant, QuantFormat, QuantState, Quantizer, RngKey, Usage,
};

use crate::cpu::{for_rows, sum_rows};
use crate::error::shape_err;
use crate::graph::backward_fn;
use crate::quant_state::{key, st2, LinearQuantState, OperandRole};
use crate::{Graph, Result, Tensor};

impl Graph<'_> {
    /// The linear layer `y = x Wᵀ (+ bias)` with quantized GEMMs.
    ///
    /// * `x: [..., in]`, `w: [out, in]`, `bias: [out]`; the output is `[..., out]`.
    /// * `policy` sets the six operand quantizers; [`GemmPolicy::FP32`] is exact f32.
    /// * `stream` is the layer's random stream id (unique per linear layer of the model,
    ///   `≤ MAX_LAYER_STREAM`); with the graph's seed and step it keys every random bit
    ///   ([`crate::gemm_stream`]).
    /// * When `w` is a parameter, the layer's [`LinearQuantState`] lives in the store and
    ///   persists across steps; with gradients off, the forward GEMM uses a copy of it, so
    ///   evaluation does not touch delayed-scaling histories.
    /// * The quantizers' own constraints surface as [`Error::Quant`](crate::Error::Quant):
    ///   e.g. the Hadamard transform of NVFP4's Wgrad operands needs the token count (the rows
    ///   of `x`) to be a multiple of 16.
    ///
    /// ```
    /// use autograd::{Graph, ParamStore};
    /// use quant::GemmPolicy;
    /// let mut ps = ParamStore::new();
    /// let w = ps.add("w", &[2, 3], vec![1.0, 0.0, 0.0, 0.0, 1.0, 1.0])?;
    /// let b = ps.add("b", &[2], vec![0.5, -0.5])?;
    /// let mut g = Graph::new(&mut ps).with_rng(42, 0);
    /// let x = g.input(&[1.0, 2.0, 3.0], &[1, 3])?;
    /// let (wt, bt) = (g.param(w)?, g.param(b)?);
    /// let y = g.linear(x, wt, Some(bt), &GemmPolicy::FP32, 0)?;
    /// assert_eq!(g.value(y)?, &[1.5, 4.5]);
    /// let yq = g.linear(x, wt, None, &GemmPolicy::BF16, 1)?;
    /// assert_eq!(g.value(yq)?, &[1.0, 5.0]); // small integers are exact in BF16
    /// let loss = g.sum(y)?;
    /// g.backward(loss)?;
    /// drop(g);
    /// assert_eq!(ps.grad(w)?, &[1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);
    /// assert_eq!(ps.grad(b)?, &[1.0, 1.0]);
    /// # Ok::<(), autograd::Error>(())
    /// ```
    pub fn linear(
        &mut self,
        x: Tensor,
        w: Tensor,
        bias: Option<Tensor>,
        policy: &GemmPolicy,
        stream: u64,
    ) -> Result<Tensor> {
        let (sx, sw) = (self.shape(x)?, self.shape(w)?);
        if sw.rank() != 2 || sx.rank() == 0 || sx.last() != sw.dims()[1] {
            return shape_err(
                "linear",
                format!(
                    "input {sx} and weight {sw} (expected [out, in] with in = last axis of input)"
                ),
            );
        }
        let (n_out, n_in) = (sw.dims()[0], sw.dims()[1]);
        if let Some(b) = bias {
            let sb = self.shape(b)?;
            if sb.dims() != [n_out] {
                return shape_err("linear", format!("bias {sb} for {n_out} outputs"));
            }
        }
        let (seed, step) = (self.seed, self.step);
        key(seed, stream, OperandRole::FpropX, step)?; // range check
        let m = sx.rows();
        let out_shape = sx.with_last(n_out)?;
        if self.dev.is_some() {
            return self.dev_linear(x, w, bias, policy, stream, (m, n_out, n_in), out_shape);
        }
        let inputs: Vec<Tensor> = [Some(x), Some(w), bias].into_iter().flatten().collect();
        let rg = self.needs_grad(&inputs);
        let wp = self.param_index(w);
        let mut y = self.alloc(m * n_out);
        // Quantize W once for Fprop and Dgrad when the policy gives both the same
        // transpose-exact quantizer (NVFP4 16x16 RNE, BF16 RNE): the Dgrad operand (Wᵀ) is then
        // the transpose of the Fprop one, bit for bit (docs/numerics.md#1x16-blocks-and-16x16-tiles).
        // Not where the GEMMs' packing rounds W itself (BF16 RNE on a BF16 unit): each then
        // packs it straight from W, to the same bits, without the rounding pass and its copy.
        let reuse_w = self.needs_grad(&[x])
            && policy.fprop.b == policy.dgrad.b
            && transpose_exact(&policy.fprop.b)
            && !packing_rounds(&policy.fprop.b);
        let mut wq = reuse_w.then(|| self.alloc(n_out * n_in));
        let grad_on = self.grad_enabled();
        let (vals, states, _) = self.parts();
        let mut scratch_state;
        let state: &mut LinearQuantState = match wp {
            Some(p) if grad_on => states[p].get_or_insert_with(Default::default),
            Some(p) => {
                scratch_state = states[p].as_deref().cloned().unwrap_or_default();
                &mut scratch_state
            }
            None => {
                scratch_state = LinearQuantState::default();
                &mut scratch_state
            }
        };
        state.policy = Some(*policy);
        let (sa, sb) = st2(state, OperandRole::FpropX, OperandRole::FpropW);
        let xa = operand(
            vals.get(x),
            (m, n_in),
            Usage::Rowwise,
            policy.fprop.a,
            key(seed, stream, OperandRole::FpropX, step)?,
            sa,
            None,
        )?;
        let wb = operand(
            vals.get(w),
            (n_out, n_in),
            Usage::Rowwise,
            policy.fprop.b,
            key(seed, stream, OperandRole::FpropW, step)?,
            sb,
            None,
        )?;
        // The kept W operand: its buffer and per-tensor factor.
        let mut w_fake: Option<f32> = None;
        match wq.as_mut() {
            Some(buf) => {
                let wf = fake_operand(wb, buf.as_mut_slice())?;
                w_fake = Some(wf.factor);
                quantized_matmul_tn_prequantized(xa, wf, y.as_mut_slice())?;
            }
            None => quantized_matmul_tn(xa, wb, y.as_mut_slice())?,
        }
        // X's and W's amaxes, when both of a tensor's casts measure one (see `known_amax`)
        let x_amax = known_amax(state, (OperandRole::FpropX, policy.fprop.a), policy.wgrad.b);
        let w_amax = known_amax(state, (OperandRole::FpropW, policy.fprop.b), policy.dgrad.b);
        if let Some(b) = bias {
            let bv = vals.get(b);
            for_rows(
                y.as_mut_slice(),
                n_out,
                #[inline(always)]
                |_, row| {
                    for (y, &b) in row.iter_mut().zip(bv) {
                        *y += b;
                    }
                },
            );
        }
        let policy = *policy;
        let bw = rg.then(|| {
            backward_fn(move |ctx, dy| {
                let mut local = LinearQuantState::default();
                let (gx, gw) = (ctx.take(x), ctx.take(w));
                let vals = ctx.vals;
                let state: &mut LinearQuantState = match wp {
                    Some(p) => ctx.states[p].get_or_insert_with(Default::default),
                    None => &mut local,
                };
                let (seed, step) = (ctx.seed, ctx.step);
                // returns dY's amax where Wgrad's cast of dY can take it (see `known_amax`)
                let dgrad = |state: &mut LinearQuantState, out: &mut [f32]| -> Result<KnownAmax> {
                    let (sa, sb) = st2(state, OperandRole::DgradDy, OperandRole::DgradW);
                    let dya = operand(
                        dy,
                        (m, n_out),
                        Usage::Rowwise,
                        policy.dgrad.a,
                        key(seed, stream, OperandRole::DgradDy, step)?,
                        sa,
                        None,
                    )?;
                    match (&wq, w_fake) {
                        // Wᵀ as the transpose of the Fprop operand (see the forward).
                        (Some(buf), Some(factor)) => {
                            let wf = FakeOperand {
                                values: MatRef::row_major(buf.as_slice(), n_out, n_in),
                                factor,
                                // transpose-exact quantizers are NVFP4 or BF16
                                quantized: true,
                                e2m1: e2m1_values(&policy.fprop.b),
                            };
                            quantized_matmul_tn_prequantized(dya, wf.t(), out)?;
                        }
                        _ => quantized_matmul_tn(
                            dya,
                            operand(
                                vals.get(w),
                                (n_out, n_in),
                                Usage::Columnwise,
                                policy.dgrad.b,
                                key(seed, stream, OperandRole::DgradW, step)?,
                                sb,
                                w_amax,
                            )?,
                            out,
                        )?,
                    }
                    Ok(known_amax(
                        state,
                        (OperandRole::DgradDy, policy.dgrad.a),
                        policy.wgrad.a,
                    ))
                };
                let wgrad = |state: &mut LinearQuantState,
                             out: &mut [f32],
                             dy_amax: KnownAmax|
                 -> Result<()> {
                    let (sa, sb) = st2(state, OperandRole::WgradDy, OperandRole::WgradX);
                    quantized_matmul_tn(
                        operand(
                            dy,
                            (m, n_out),
                            Usage::Columnwise,
                            policy.wgrad.a,
                            key(seed, stream, OperandRole::WgradDy, step)?,
                            sa,
                            dy_amax,
                        )?,
                        operand(
                            vals.get(x),
                            (m, n_in),
                            Usage::Columnwise,
                            policy.wgrad.b,
                            key(seed, stream, OperandRole::WgradX, step)?,
                            sb,
                            x_amax,
                        )?,
                        out,
                    )?;
                    Ok(())
                };
                // straight into a fresh gradient buffer, through scratch otherwise
                let mut gx = gx;
                let mut dy_amax = None;
                if let Some(g) = gx.as_mut() {
                    g.write_with(ctx.pool, |o| {
                        dy_amax = dgrad(state, o)?;
                        Ok(())
                    })?;
                }
                let mut gw = gw;
                if let Some(g) = gw.as_mut() {
                    g.write_with(ctx.pool, |o| wgrad(state, o, dy_amax))?;
                }
                if let Some(buf) = wq {
                    ctx.pool.give(buf);
                }
                if let Some(g) = gx {
                    ctx.put(x, g);
                }
                if let Some(g) = gw {
                    ctx.put(w, g);
                }
                if let Some(b) = bias {
                    if let Some(mut g) = ctx.take(b) {
                        let acc = g.acc();
                        sum_rows(dy, n_out, g.slice(), acc);
                        ctx.put(b, g);
                    }
                }
                Ok(())
            })
        });
        Ok(self.push("linear", y, out_shape, bw))
    }
}

/// The amax that `role`'s cast just measured, when that cast and `next`, a later cast of the
/// same tensor in the same step, both use FP8 current scaling: `next` may then take it
/// ([`Quantizer::with_tensor_amax`]) instead of reading the tensor again. The amax of a tensor
/// does not depend on the orientation or the FP8 element, and current scaling keeps no
/// state between casts, so the result and the states are bit for bit those of measuring
/// again. Read right after the cast, before another call of the layer reuses the state.
fn known_amax(
    state: &LinearQuantState,
    (role, this): (OperandRole, OperandQuant),
    next: OperandQuant,
) -> KnownAmax {
    let current = |q: OperandQuant| {
        matches!(
            q.format,
            QuantFormat::Fp8 {
                scaling: Fp8Scaling::Current { .. },
                ..
            }
        )
    };
    (current(this) && current(next)).then(|| state.operands[role as usize].last_amax())
}

/// A tensor's amax, where a cast measured it for a later one to take ([`known_amax`]).
type KnownAmax = Option<f32>;

/// The GEMM operand `[rows, cols]` `data`, quantized for `usage` with `q`, `key`, the
/// operand's delayed-scaling state and, where a first cast measured it, the tensor's amax.
fn operand<'a>(
    data: &'a [f32],
    (rows, cols): (usize, usize),
    usage: Usage,
    q: OperandQuant,
    key: RngKey,
    state: &'a mut QuantState,
    amax: KnownAmax,
) -> Result<Operand<'a>> {
    let mut quantizer = Quantizer::new(q, usage)?.with_key(key);
    if let Some(a) = amax {
        quantizer = quantizer.with_tensor_amax(a);
    }
    Ok(Operand::new(MatRef::new(data, rows, cols)?, quantizer).with_state(state))
}

#[cfg(test)]
mod tests {
    use quant::gemm::bf16::{quantized_gemm_tn, Bf16Workspace};
    use quant::gemm::{matmul_tn, sgemm, MatRef};
    use quant::qgemm::quantized_matmul_tn_fake;
    use quant::{
        AmaxAlgo, Fp8Element, Fp8Scaling, GemmPolicy, OperandQuant, QuantFormat, QuantState,
        Quantizer, RngKey, Usage,
    };

    use super::*;
    use crate::ops::test_util::assert_gradcheck;
    use crate::quant_state::{gemm_stream, MAX_LAYER_STREAM};
    use crate::{init, Error, ParamStore};

    #[test]
    fn gradcheck_linear_fp32() {
        let mut ps = ParamStore::new();
        let x = ps.add("x", &[2, 3, 5], init::normal(30, 1.0, 1)).unwrap();
        let w = ps.add("w", &[4, 5], init::normal(20, 1.0, 2)).unwrap();
        let b = ps.add("b", &[4], init::normal(4, 1.0, 3)).unwrap();
        assert_gradcheck(&mut ps, |g| {
            let (x, w, b) = (g.param(x)?, g.param(w)?, g.param(b)?);
            let y = g.linear(x, w, Some(b), &GemmPolicy::FP32, 0)?;
            // the same weight twice; x's gradient arrives from two layers
            let u = g.linear(x, w, None, &GemmPolicy::FP32, 1)?;
            let v = g.mul(u, y)?;
            g.add(v, y)
        });
    }

    /// Runs one linear layer forward and backward (seeded with `r`) and returns
    /// `(y, dx, dw, db)`.
    fn run(
        policy: &GemmPolicy,
        xs: &[f32],
        ws: &[f32],
        r: &[f32],
        dims: (usize, usize, usize),
        seed: u64,
        step: u64,
    ) -> [Vec<f32>; 4] {
        let (t, n_in, n_out) = dims;
        let mut ps = ParamStore::new();
        let w = ps.add("w", &[n_out, n_in], ws.to_vec()).unwrap();
        let b = ps.add_zeros("b", &[n_out]).unwrap();
        let mut g = Graph::new(&mut ps).with_rng(seed, step);
        let x = g.variable(xs, &[t, n_in]).unwrap();
        let (wt, bt) = (g.param(w).unwrap(), g.param(b).unwrap());
        let y = g.linear(x, wt, Some(bt), policy, 11).unwrap();
        let yv = g.to_vec(y).unwrap();
        g.backward_with(y, r).unwrap();
        let dx = g.grad(x).unwrap().unwrap().to_vec();
        drop(g);
        [
            yv,
            dx,
            ps.grad(w).unwrap().to_vec(),
            ps.grad(b).unwrap().to_vec(),
        ]
    }

    fn data(t: usize, n_in: usize, n_out: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        (
            init::normal(t * n_in, 1.0, 21),
            init::normal(n_out * n_in, 0.3, 22),
            init::normal(t * n_out, 0.01, 23),
        )
    }

    #[test]
    fn fp32_policy_is_the_plain_f32_linear_bit_for_bit() {
        let (t, n_in, n_out) = (37, 24, 20);
        let (xs, ws, r) = data(t, n_in, n_out);
        let [y, dx, dw, db] = run(&GemmPolicy::FP32, &xs, &ws, &r, (t, n_in, n_out), 1, 2);
        let mut y_ref = vec![0.0; t * n_out];
        matmul_tn(&xs, &ws, t, n_out, n_in, &mut y_ref);
        assert_eq!(y, y_ref); // zero bias
        let mut dx_ref = vec![0.0; t * n_in];
        sgemm(
            1.0,
            MatRef::row_major(&r, t, n_out),
            MatRef::row_major(&ws, n_out, n_in),
            0.0,
            &mut dx_ref,
        );
        assert_eq!(dx, dx_ref);
        let mut dw_ref = vec![0.0; n_out * n_in];
        sgemm(
            1.0,
            MatRef::row_major(&r, t, n_out).t(),
            MatRef::row_major(&xs, t, n_in),
            0.0,
            &mut dw_ref,
        );
        assert_eq!(dw, dw_ref);
        let mut db_ref = vec![0.0f32; n_out];
        for row in r.chunks(n_out) {
            db_ref.iter_mut().zip(row).for_each(|(d, v)| *d += v);
        }
        assert_eq!(db, db_ref);
    }

    #[test]
    fn bf16_policy_rounds_the_gemm_inputs() {
        let (t, n_in, n_out) = (8, 16, 4);
        let (xs, ws, r) = data(t, n_in, n_out);
        let [y, dx, ..] = run(&GemmPolicy::BF16, &xs, &ws, &r, (t, n_in, n_out), 0, 0);
        let rb = |v: &[f32]| {
            v.iter()
                .map(|&x| fp_formats::round_to_bf16(x))
                .collect::<Vec<_>>()
        };
        // BF16 operands, the BF16 GEMM (FP32 accumulation in its fixed order)
        let mut bw = Bf16Workspace::new();
        let mut y_ref = vec![0.0; t * n_out];
        quantized_gemm_tn(
            MatRef::row_major(&rb(&xs), t, n_in),
            MatRef::row_major(&rb(&ws), n_out, n_in),
            &mut y_ref,
            &mut bw,
        );
        assert_eq!(y, y_ref);
        let mut dx_ref = vec![0.0; t * n_in];
        quantized_gemm_tn(
            MatRef::row_major(&rb(&r), t, n_out),
            MatRef::row_major(&rb(&ws), n_out, n_in).t(),
            &mut dx_ref,
            &mut bw,
        );
        assert_eq!(dx, dx_ref);
    }

    /// One quantized GEMM assembled by hand from `quant::fake`: fake-quantize both operands
    /// (stored layout, no per-tensor factor), multiply (the BF16 GEMM when both are
    /// quantized, f32 otherwise), apply `α = f_A · f_B`.
    #[allow(clippy::too_many_arguments)]
    fn hand_gemm(
        a: (&[f32], usize, usize, Usage, &OperandQuant, OperandRole),
        b: (&[f32], usize, usize, Usage, &OperandQuant, OperandRole),
        seed: u64,
        step: u64,
        layer: u64,
    ) -> Vec<f32> {
        let quantize = |(data, rows, cols, usage, q, role): (
            &[f32],
            usize,
            usize,
            Usage,
            &OperandQuant,
            OperandRole,
        )| {
            let key = RngKey {
                seed,
                stream: gemm_stream(layer, role, step).unwrap(),
            };
            let mut buf = vec![0.0f32; rows * cols];
            let x = MatRef::new(data, rows, cols).unwrap();
            let q = Quantizer::new(*q, usage).unwrap().with_key(key);
            let f = q
                .fake_quantize_into(x, &mut QuantState::new(), &mut buf)
                .unwrap();
            let (outer, k) = if usage == Usage::Rowwise {
                (rows, cols)
            } else {
                (cols, rows)
            };
            (buf, outer, k, f)
        };
        let both = a.4.format != QuantFormat::F32 && b.4.format != QuantFormat::F32;
        let e2m1 = [e2m1_values(a.4), e2m1_values(b.4)];
        let (qa, m, k, fa) = quantize(a);
        let (qb, n, _, fb) = quantize(b);
        let mut out = vec![0.0f32; m * n];
        if both {
            // the GEMM the layer runs for two quantized operands' values (E2M1 or BF16)
            let fake = |values, e2m1| FakeOperand {
                values,
                factor: 1.0,
                quantized: true,
                e2m1,
            };
            quantized_matmul_tn_fake(
                fake(MatRef::row_major(&qa, m, k), e2m1[0]),
                fake(MatRef::row_major(&qb, n, k), e2m1[1]),
                &mut out,
            )
            .unwrap();
        } else {
            sgemm(
                1.0,
                MatRef::row_major(&qa, m, k),
                MatRef::row_major(&qb, n, k).t(),
                0.0,
                &mut out,
            );
        }
        let alpha = fa * fb;
        if alpha != 1.0 {
            out.iter_mut().for_each(|v| *v *= alpha);
        }
        out
    }

    #[test]
    fn quantized_linear_equals_the_hand_assembled_quant_computation() {
        let dims = (64, 48, 32);
        let (xs, ws, r) = data(dims.0, dims.1, dims.2);
        let (seed, step) = (7, 3);
        for policy in [GemmPolicy::nvfp4_paper(), GemmPolicy::fp8_current_hybrid()] {
            let [y, dx, dw, _] = assert_equals_hand_assembled(&policy, dims, seed, step);
            // quantization is real: not the f32 result
            let [y32, dx32, dw32, _] = run(&GemmPolicy::FP32, &xs, &ws, &r, dims, seed, step);
            assert_ne!(y, y32);
            assert_ne!(dx, dx32);
            assert_ne!(dw, dw32);
        }
        // stochastic rounding: the same step replays bit for bit, another step draws new bits
        let p = GemmPolicy::nvfp4_paper();
        let a = run(&p, &xs, &ws, &r, dims, seed, step);
        let b = run(&p, &xs, &ws, &r, dims, seed, step + 1);
        assert_eq!(a, run(&p, &xs, &ws, &r, dims, seed, step));
        assert_eq!(a[0], b[0]); // Fprop is RNE
        assert_ne!(a[1], b[1]); // Dgrad's dY is stochastically rounded
    }

    /// With a transpose-exact W quantizer the layer quantizes W once and uses the transpose
    /// for Dgrad: bit for bit the requantized columnwise operand, also with padded tiles.
    #[test]
    fn reused_weight_operand_equals_requantized() {
        let dims = (32, 40, 24); // W tiles padded in both dimensions
        for policy in [GemmPolicy::nvfp4_paper(), GemmPolicy::BF16] {
            assert!(quant::qgemm::transpose_exact(&policy.dgrad.b));
            assert_equals_hand_assembled(&policy, dims, 5, 2);
        }
    }

    /// Runs the layer (stream 11) under `policy` on `data(dims)` and asserts that its
    /// Fprop, Dgrad and Wgrad outputs equal the quant GEMMs assembled by hand from the same
    /// operands, quantizers and random streams; returns the layer's outputs.
    fn assert_equals_hand_assembled(
        policy: &GemmPolicy,
        dims: (usize, usize, usize),
        seed: u64,
        step: u64,
    ) -> [Vec<f32>; 4] {
        let (t, n_in, n_out) = dims;
        let (xs, ws, r) = data(t, n_in, n_out);
        let out = run(policy, &xs, &ws, &r, dims, seed, step);
        let (row, col) = (Usage::Rowwise, Usage::Columnwise);
        let y_ref = hand_gemm(
            (&xs, t, n_in, row, &policy.fprop.a, OperandRole::FpropX),
            (&ws, n_out, n_in, row, &policy.fprop.b, OperandRole::FpropW),
            seed,
            step,
            11,
        );
        let dx_ref = hand_gemm(
            (&r, t, n_out, row, &policy.dgrad.a, OperandRole::DgradDy),
            (&ws, n_out, n_in, col, &policy.dgrad.b, OperandRole::DgradW),
            seed,
            step,
            11,
        );
        let dw_ref = hand_gemm(
            (&r, t, n_out, col, &policy.wgrad.a, OperandRole::WgradDy),
            (&xs, t, n_in, col, &policy.wgrad.b, OperandRole::WgradX),
            seed,
            step,
            11,
        );
        assert_eq!(out[0], y_ref, "{policy:?} fprop");
        assert_eq!(out[1], dx_ref, "{policy:?} dgrad");
        assert_eq!(out[2], dw_ref, "{policy:?} wgrad");
        out
    }

    /// Under FP8 current scaling the second cast of X, W and dY takes the amax the first one
    /// measured: every role's state after a step is the one casting its tensor afresh leaves
    /// (and each cast checks the amax it was given against the tensor).
    #[test]
    fn current_scaling_states_equal_fresh_casts() {
        let (t, n_in, n_out) = (48, 40, 24);
        let (xs, ws, r) = data(t, n_in, n_out);
        let policy = GemmPolicy::fp8_current_hybrid();
        let mut ps = ParamStore::new();
        let w = ps.add("w", &[n_out, n_in], ws.clone()).unwrap();
        let mut g = Graph::new(&mut ps);
        let x = g.variable(&xs, &[t, n_in]).unwrap();
        let wt = g.param(w).unwrap();
        let y = g.linear(x, wt, None, &policy, 3).unwrap();
        g.backward_with(y, &r).unwrap();
        drop(g);
        let st = ps.linear_state(w).unwrap().unwrap().clone();
        let roles = [
            (
                OperandRole::FpropX,
                &xs,
                t,
                n_in,
                Usage::Rowwise,
                policy.fprop.a,
            ),
            (
                OperandRole::FpropW,
                &ws,
                n_out,
                n_in,
                Usage::Rowwise,
                policy.fprop.b,
            ),
            (
                OperandRole::DgradDy,
                &r,
                t,
                n_out,
                Usage::Rowwise,
                policy.dgrad.a,
            ),
            (
                OperandRole::DgradW,
                &ws,
                n_out,
                n_in,
                Usage::Columnwise,
                policy.dgrad.b,
            ),
            (
                OperandRole::WgradDy,
                &r,
                t,
                n_out,
                Usage::Columnwise,
                policy.wgrad.a,
            ),
            (
                OperandRole::WgradX,
                &xs,
                t,
                n_in,
                Usage::Columnwise,
                policy.wgrad.b,
            ),
        ];
        for (role, v, rows, cols, usage, q) in roles {
            let mut fresh = QuantState::new();
            let mut out = vec![0.0f32; rows * cols];
            Quantizer::new(q, usage)
                .unwrap()
                .fake_quantize_into(MatRef::new(v, rows, cols).unwrap(), &mut fresh, &mut out)
                .unwrap();
            assert_eq!(st.operand(role), &fresh, "{role:?}");
            let amax = v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            assert_eq!(fresh.last_amax(), amax, "{role:?}");
        }
    }

    #[test]
    fn delayed_scaling_state_persists_in_the_store() {
        let delayed = OperandQuant {
            format: QuantFormat::Fp8 {
                element: Fp8Element::E4M3,
                scaling: Fp8Scaling::Delayed {
                    history_len: 4,
                    margin: 0,
                    algo: AmaxAlgo::Max,
                },
            },
            ..OperandQuant::F32
        };
        let policy = GemmPolicy::uniform(delayed);
        let mut ps = ParamStore::new();
        let w = ps.add("w", &[4, 8], init::normal(32, 1.0, 1)).unwrap();
        let xs = init::normal(16, 1.0, 2);
        let step = |ps: &mut ParamStore, grad: bool| {
            let mut g = Graph::new(ps);
            g.set_grad_enabled(grad);
            let x = g.input(&xs, &[2, 8]).unwrap();
            let wt = g.param(w).unwrap();
            let y = g.linear(x, wt, None, &policy, 0).unwrap();
            let l = g.sum(y).unwrap();
            g.backward(l).unwrap();
        };
        step(&mut ps, true);
        let st = ps.linear_state(w).unwrap().unwrap().clone();
        let x_amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert_eq!(st.operand(OperandRole::FpropX).amax_history()[0], x_amax);
        assert!(st.operand(OperandRole::WgradDy).amax_history()[0] == 1.0); // dY = ones
                                                                            // evaluation does not touch the histories
        step(&mut ps, false);
        assert_eq!(ps.linear_state(w).unwrap().unwrap(), &st);
        ps.end_quant_step().unwrap();
        let s = ps
            .linear_state(w)
            .unwrap()
            .unwrap()
            .operand(OperandRole::FpropX);
        assert_eq!(s.scale(), 448.0 / x_amax);
        assert_eq!(s.amax_history()[0], 0.0);
        // checkpoint round trip of the state
        let saved = ps.linear_state(w).unwrap().cloned();
        ps.set_linear_state(w, None).unwrap();
        assert!(ps.linear_state(w).unwrap().is_none());
        ps.set_linear_state(w, saved.clone()).unwrap();
        assert_eq!(ps.linear_state(w).unwrap().cloned(), saved);
    }

    #[test]
    fn linear_rejects_bad_shapes_and_streams() {
        let mut ps = ParamStore::new();
        let mut g = Graph::new(&mut ps);
        let x = g.input(&[0.0; 6], &[2, 3]).unwrap();
        let w = g.input(&[0.0; 8], &[2, 4]).unwrap();
        let p = GemmPolicy::FP32;
        assert!(matches!(
            g.linear(x, w, None, &p, 0),
            Err(Error::Shape { .. })
        ));
        let w = g.input(&[0.0; 6], &[2, 3]).unwrap();
        let b = g.input(&[0.0; 3], &[3]).unwrap();
        assert!(matches!(
            g.linear(x, w, Some(b), &p, 0),
            Err(Error::Shape { .. })
        ));
        assert!(matches!(
            g.linear(x, w, None, &p, MAX_LAYER_STREAM + 1),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(g.linear(x, w, None, &p, MAX_LAYER_STREAM).is_ok());
    }
}

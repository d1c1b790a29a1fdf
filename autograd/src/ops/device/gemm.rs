//! Device arm of the linear layer. Each of the six GEMM operands is formed as the CPU layer
//! forms it (`ops/linear.rs`): FP32 as is; BF16 rounded by the `round_bf16` kernel; FP8
//! (per-tensor, current or delayed scaling with the layer's `QuantState`), MXFP8 / MXFP4 and
//! NVFP4 (1x16 or 16x16 scales, RNE or stochastic rounding, the Hadamard transform on the
//! Wgrad operands) by `kernels-cuda`'s quantizer kernels under the same Philox keys
//! (`gemm_stream(layer, role, step)`), dequantized exactly without the per-tensor factor: the
//! values and factors of quant's `fake_quantize_into`, bit for bit. When both operands of a
//! GEMM are exactly BF16 (BF16-rounded, or quantized without the per-tensor factor), they are
//! formed as BF16 bits (`nb_f32_to_bf16` for BF16, `nb_nvfp4_to_bf16` / `nb_mx_to_bf16` /
//! FP8 dequantize-then-convert for quantized copies: exact on such values) and multiplied by the
//! tensor-core GEMM (`kernels_cuda::train_tc`: cuBLASLt, f32 accumulation, the two factors as
//! its `alpha`); with an FP32 operand the GEMM is the device's fixed-order f32 `nb_sgemm`.
//! Every product is exact, so only the accumulation order differs from the CPU's BF16 / f32
//! GEMM.
//!
//! Where the CPU quantizes W once and uses its transpose for Dgrad (a transpose-exact
//! quantizer), the device quantizes the columnwise copy: the same bits (quant's
//! `transpose_exact`).

use quant::{GemmPolicy, OperandQuant, QuantFormat, QuantState, Quantizer, Usage};

use kernels_cuda::train_quant::PendingBf16;
use kernels_cuda::train_tc::{Bf16Gemm, Bf16View};

use super::{dev_backward, no_kernel, DBuf};
use crate::backend::{Backend, DeviceBackend, DeviceBuf, DeviceLauncher};
use crate::quant_state::{key, st2, LinearQuantState, OperandRole};
use crate::{Graph, Result, Shape, Tensor};

/// How an operand is formed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Form {
    /// The tensor itself (FP32).
    AsIs,
    /// Rounded to BF16 (nearest even).
    Bf16,
    /// Quantized and dequantized by the quantizer kernels (NVFP4, MX, FP8).
    Quantized,
}

impl Form {
    fn of(q: &OperandQuant) -> Result<Form> {
        match operand_form(q) {
            Ok(f) => Ok(f),
            Err(op) => no_kernel(op),
        }
    }
}

/// How the device forms an operand of setting `q`, or the `NoDeviceKernel` op name.
fn operand_form(q: &OperandQuant) -> std::result::Result<Form, &'static str> {
    use fp_formats::mx::MxElement;
    match q.format {
        QuantFormat::F32 => Ok(Form::AsIs),
        QuantFormat::Bf16 if *q == OperandQuant::BF16 => Ok(Form::Bf16),
        QuantFormat::Bf16 => Err("linear (BF16 operands with stochastic rounding)"),
        QuantFormat::Nvfp4 {
            four_over_six: Some(_),
        } => Err("linear (NVFP4 Four Over Six)"),
        QuantFormat::Mx {
            element: MxElement::E2M3 | MxElement::E3M2,
            ..
        } => Err("linear (MXFP6 operands)"),
        QuantFormat::Nvfp4 { .. } | QuantFormat::Mx { .. } | QuantFormat::Fp8 { .. } => {
            Ok(Form::Quantized)
        }
    }
}

/// Why the device linear cannot run `policy` (the [`Error::NoDeviceKernel`](crate::Error)
/// op name it would report), or `None` when it runs all six operands: FP32, BF16
/// (nearest-even), per-tensor FP8, MXFP8 / MXFP4 and NVFP4 (without Four Over Six).
///
/// ```
/// use quant::GemmPolicy;
/// assert_eq!(autograd::backend::linear_blocker(&GemmPolicy::nvfp4_paper()), None);
/// ```
pub fn linear_blocker(policy: &GemmPolicy) -> Option<&'static str> {
    policy.operands().iter().find_map(|q| operand_form(q).err())
}

/// One operand slot of the layer: its setting, usage and role.
#[derive(Clone, Copy)]
struct Slot {
    q: OperandQuant,
    form: Form,
    usage: Usage,
    role: OperandRole,
}

/// The six slots of a policy.
#[derive(Clone, Copy)]
struct Slots {
    fx: Slot,
    fw: Slot,
    dy: Slot,
    dw: Slot,
    wdy: Slot,
    wx: Slot,
}

impl Slots {
    fn of(p: &GemmPolicy) -> Result<Slots> {
        let s = |q: OperandQuant, usage, role| -> Result<Slot> {
            Ok(Slot {
                q,
                form: Form::of(&q)?,
                usage,
                role,
            })
        };
        let (r, c) = (Usage::Rowwise, Usage::Columnwise);
        Ok(Slots {
            fx: s(p.fprop.a, r, OperandRole::FpropX)?,
            fw: s(p.fprop.b, r, OperandRole::FpropW)?,
            dy: s(p.dgrad.a, r, OperandRole::DgradDy)?,
            dw: s(p.dgrad.b, c, OperandRole::DgradW)?,
            wdy: s(p.wgrad.a, c, OperandRole::WgradDy)?,
            wx: s(p.wgrad.b, c, OperandRole::WgradX)?,
        })
    }
}

/// A formed operand's values: f32 (the tensor itself, or BF16-exact values for the f32
/// GEMM), or BF16 bits for the tensor-core GEMM.
enum Vals<'a> {
    F32(&'a DBuf),
    /// Stored row-major with this many elements per row.
    Bf16(DeviceBuf<u16>, usize),
}

/// A formed operand: its values, whether they are `[outer, K]` (the GEMM's TN layout: a
/// quantized copy, or a rowwise tensor) rather than `[K, outer]`, and its factor.
struct Operand<'a> {
    vals: Vals<'a>,
    tn: bool,
    factor: f32,
}

/// Where one layer's operands get their random keys.
#[derive(Clone, Copy)]
struct Keys {
    seed: u64,
    step: u64,
    stream: u64,
}

/// Whether the GEMM of slots `a` and `b` over `(m, n, k)` runs on the tensor-core BF16 GEMM:
/// both operands are exactly BF16 (BF16-rounded, or quantized without their per-tensor
/// factor) and no dimension is empty.
fn on_tensor_cores(a: Slot, b: Slot, (m, n, k): (usize, usize, usize)) -> bool {
    a.form != Form::AsIs && b.form != Form::AsIs && m * n * k > 0
}

/// An operand being formed: ready, or a quantization launched on the device whose factor
/// (and non-finite check) comes back with [`Forming::finish`]. A layer starts every operand
/// it needs before finishing any, so the device synchronises once per pass (forward,
/// backward) rather than once per quantized operand.
enum Forming<'a> {
    Ready(Operand<'a>),
    Pending(Box<PendingBf16<DeviceLauncher>>),
}

impl<'a> Forming<'a> {
    /// The operand, once its quantization's amax is back (`state` as at the start).
    fn finish(self, be: &DeviceBackend, state: &mut QuantState) -> Result<Operand<'a>> {
        Ok(match self {
            Forming::Ready(o) => o,
            Forming::Pending(p) => {
                let (b, ld, factor) = be.quantize_bf16_finish(*p, state)?;
                Operand {
                    vals: Vals::Bf16(b, ld),
                    tn: true,
                    factor,
                }
            }
        })
    }
}

/// Starts forming the operand of `slot` from `x` (row-major `[rows, cols]`, the tensor before
/// any transposition), as BF16 bits when `tc`: a BF16 operand converts with nearest-even
/// rounding (the same bits as `round_bf16` then converting), a quantized one decodes straight
/// to BF16 (exact: its values without the factor are BF16 values) and is finished later;
/// `keep` holds a new f32 buffer.
#[allow(clippy::too_many_arguments)]
fn start<'a>(
    be: &DeviceBackend,
    x: &'a DBuf,
    dims: (usize, usize),
    slot: Slot,
    keys: Keys,
    state: &mut QuantState,
    keep: &'a mut Option<DBuf>,
    tc: bool,
) -> Result<Forming<'a>> {
    let rowwise = slot.usage == Usage::Rowwise;
    let ready = |vals, tn, factor| Ok(Forming::Ready(Operand { vals, tn, factor }));
    match slot.form {
        Form::AsIs => ready(Vals::F32(x), rowwise, 1.0),
        Form::Bf16 if tc => ready(Vals::Bf16(be.to_bf16(x)?, dims.1), rowwise, 1.0),
        Form::Bf16 => {
            let mut r = be.zeros(be.len(x))?;
            be.round_bf16(x, &mut r)?;
            ready(Vals::F32(keep.insert(r)), rowwise, 1.0)
        }
        Form::Quantized => {
            let k = key(keys.seed, keys.stream, slot.role, keys.step)?;
            let qz = Quantizer::new(slot.q, slot.usage)?.with_key(k);
            if tc {
                let p = be.quantize_bf16_start(&qz, x, dims, state)?;
                Ok(Forming::Pending(Box::new(p)))
            } else {
                let mut r = be.zeros(be.len(x))?;
                let factor = be.fake_quantize(&qz, x, dims, state, &mut r)?;
                ready(Vals::F32(keep.insert(r)), true, factor)
            }
        }
    }
}

/// `c (+)= op(A) · op(B)ᵀ · (f_A · f_B)` for the TN GEMM `c[m, n] = A[m, K] · B[n, K]ᵀ`: the
/// tensor-core BF16 GEMM on BF16 operands, the f32 GEMM otherwise.
fn tn_gemm(
    be: &DeviceBackend,
    (m, n, k): (usize, usize, usize),
    a: &Operand<'_>,
    b: &Operand<'_>,
    beta: f32,
    c: &mut DBuf,
) -> Result<()> {
    let alpha = a.factor * b.factor;
    match (&a.vals, &b.vals) {
        (Vals::Bf16(ab, la), Vals::Bf16(bb, lb)) => {
            // op(A) = A[m, K] (TN) or the transpose of [K, m]; op(B) = B[n, K]ᵀ (TN) or
            // [K, n]; the rows of quantized copies are padded (ld >= K)
            let va = if a.tn {
                Bf16View::rows(*la)
            } else {
                Bf16View::cols(*la)
            };
            let vb = if b.tn {
                Bf16View::cols(*lb)
            } else {
                Bf16View::rows(*lb)
            };
            let g = Bf16Gemm {
                beta,
                ..Bf16Gemm::single((m, n, k), alpha, va, vb)
            };
            Ok(be.gemm_bf16(&g, ab, bb, c)?)
        }
        (Vals::F32(ab), Vals::F32(bb)) => {
            Ok(be.gemm(m, n, k, alpha, ab, !a.tn, bb, b.tn, beta, c)?)
        }
        _ => unreachable_mixed(),
    }
}

/// Both operands of a GEMM are formed with the same `tc` flag, so they never mix.
fn unreachable_mixed() -> Result<()> {
    Err(crate::Error::Device(
        crate::backend::BackendError::InvalidArgument(
            "linear: a BF16 operand paired with an f32 one".into(),
        ),
    ))
}

impl Graph<'_> {
    /// `y = x Wᵀ (+ b)` for `x: [m, n_in]`, `w: [n_out, n_in]` (shapes and stream checked).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn dev_linear(
        &mut self,
        x: Tensor,
        w: Tensor,
        bias: Option<Tensor>,
        policy: &GemmPolicy,
        stream: u64,
        (m, n_out, n_in): (usize, usize, usize),
        out_shape: Shape,
    ) -> Result<Tensor> {
        let s = Slots::of(policy)?;
        let keys = Keys {
            seed: self.seed,
            step: self.step,
            stream,
        };
        let be = self.be()?;
        let inputs: Vec<Tensor> = [Some(x), Some(w), bias].into_iter().flatten().collect();
        let rg = self.needs_grad(&inputs);
        let wp = self.param_index(w);
        let grad_on = self.grad_enabled();
        let (v, states, _) = self.parts();
        // the layer's state as the CPU layer picks it: the store's while training (it records
        // the policy, for checkpoints and `end_quant_step`), a copy in evaluation
        let mut scratch;
        let state: &mut LinearQuantState = match wp {
            Some(p) if grad_on => states[p].get_or_insert_with(Default::default),
            Some(p) => {
                scratch = states[p].as_deref().cloned().unwrap_or_default();
                &mut scratch
            }
            None => {
                scratch = LinearQuantState::default();
                &mut scratch
            }
        };
        state.policy = Some(*policy);
        let (sa, sb) = st2(state, OperandRole::FpropX, OperandRole::FpropW);
        let (mut kx, mut kw) = (None, None);
        let tc = on_tensor_cores(s.fx, s.fw, (m, n_out, n_in));
        let xa = start(&be, v.dev(x)?, (m, n_in), s.fx, keys, sa, &mut kx, tc)?;
        let wb = start(&be, v.dev(w)?, (n_out, n_in), s.fw, keys, sb, &mut kw, tc)?;
        let (xa, wb) = (xa.finish(&be, sa)?, wb.finish(&be, sb)?);
        let mut y = be.zeros(m * n_out)?;
        tn_gemm(&be, (m, n_out, n_in), &xa, &wb, 0.0, &mut y)?;
        if let Some(b) = bias {
            let mut yb = be.zeros(m * n_out)?;
            be.add(&y, v.dev(b)?, &mut yb)?;
            y = yb;
        }
        let bw = rg.then(|| {
            dev_backward(move |ctx, dy| {
                let be = ctx.be;
                let mut local = LinearQuantState::default();
                let state: &mut LinearQuantState = match wp {
                    Some(p) => ctx.states[p].get_or_insert_with(Default::default),
                    None => &mut local,
                };
                let mut st = std::mem::take(state);
                let r = (|| -> Result<()> {
                    // OperandRole order: FpropX, FpropW, DgradDy, DgradW, WgradDy, WgradX
                    let [_, _, s_dy, s_dw, s_wdy, s_wx] = &mut st.operands;
                    let (gx, gw) = (ctx.take(x)?, ctx.take(w)?);
                    let (wv, xv) = (ctx.val(w)?, ctx.val(x)?);
                    let (mut k1, mut k2, mut k3, mut k4) = (None, None, None, None);
                    let (dgrad, wgrad) = ((m, n_in, n_out), (n_out, n_in, m));
                    // every operand launched before any is finished: one synchronisation
                    let d = match gx {
                        Some(_) => {
                            let tc = on_tensor_cores(s.dy, s.dw, dgrad);
                            let a = start(be, dy, (m, n_out), s.dy, keys, s_dy, &mut k1, tc)?;
                            let b = start(be, wv, (n_out, n_in), s.dw, keys, s_dw, &mut k2, tc)?;
                            Some((a, b))
                        }
                        None => None,
                    };
                    let wg = match gw {
                        Some(_) => {
                            let tc = on_tensor_cores(s.wdy, s.wx, wgrad);
                            let a = start(be, dy, (m, n_out), s.wdy, keys, s_wdy, &mut k3, tc)?;
                            let b = start(be, xv, (m, n_in), s.wx, keys, s_wx, &mut k4, tc)?;
                            Some((a, b))
                        }
                        None => None,
                    };
                    let mut done = Vec::with_capacity(2);
                    if let (Some(mut g), Some((a, b))) = (gx, d) {
                        let (a, b) = (a.finish(be, s_dy)?, b.finish(be, s_dw)?);
                        let beta = g.beta();
                        tn_gemm(be, dgrad, &a, &b, beta, &mut g.buf)?;
                        done.push((x, g));
                    }
                    if let (Some(mut g), Some((a, b))) = (gw, wg) {
                        let (a, b) = (a.finish(be, s_wdy)?, b.finish(be, s_wx)?);
                        let beta = g.beta();
                        tn_gemm(be, wgrad, &a, &b, beta, &mut g.buf)?;
                        done.push((w, g));
                    }
                    for (t, g) in done {
                        ctx.put(t, g)?;
                    }
                    Ok(())
                })();
                if let Some(p) = wp {
                    ctx.states[p] = Some(Box::new(st));
                }
                r?;
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

//! The sampler's linear layers between two weight syncs: every weight fake-quantized once
//! (`quant::qgemm::fake_operand`, the function the training forward itself uses to quantize a
//! weight once for Fprop and Dgrad) and kept as a `quant::qgemm::FrozenOperand` (packed once
//! into the BF16 GEMM's tiles where that GEMM runs, so decode steps do not pack it again),
//! every activation quantized per call and multiplied through
//! `quant::qgemm::quantized_matmul_tn_frozen`, which is bit for bit the training forward's
//! `quantized_matmul_tn` with the same settings. Random keys are those of a
//! graph with seed 0 at step 0 (`autograd::gemm_stream`), as the RL trainer's recomputation
//! uses; Fprop rounds to nearest in every built-in recipe, so they draw nothing.
//!
//! Static activation scales: for an input format with a per-tensor scale (NVFP4's global
//! scale, FP8 current scaling), the input is clipped to `±amax` (the calibrated amax of that
//! layer's input) and quantized together with one extra row holding `amax` (its output is
//! dropped): the tensor's amax is then exactly the calibrated one whatever the batch holds, so
//! each row's quantization no longer depends on the other rows. This is how a static-scale
//! engine behaves (values beyond the calibrated range saturate), through `quant`'s own
//! quantizers only.

use autograd::{gemm_stream, Graph, OperandRole, ParamStore, Tensor};
use quant::gemm::MatRef;
use quant::qgemm::{fake_operand, quantized_matmul_tn_frozen, FrozenOperand, Operand};
use quant::{Fp8Scaling, GemmPolicy, QuantFormat, QuantState, Quantizer, RngKey, Usage};

use crate::model::{layer_stream, Gpt, ModelError};
use crate::recipe::Recipe;

/// One linear layer's frozen weight.
#[derive(Clone, Debug)]
struct FrozenLinear {
    /// The fake-quantized weight (`[out, in]`), packed once for the BF16 GEMM where it runs.
    w: FrozenOperand,
    policy: GemmPolicy,
    stream: u64,
    x_state: QuantState,
    /// The weight (on a device graph the layer is autograd's device linear on it).
    param: autograd::ParamId,
}

/// Whether an input quantizer has a per-tensor scale computed from the tensor's amax.
pub fn has_tensor_scale(policy: &GemmPolicy) -> bool {
    matches!(
        policy.fprop.a.format,
        QuantFormat::Nvfp4 { .. }
            | QuantFormat::Fp8 {
                scaling: Fp8Scaling::Current { .. },
                ..
            }
    )
}

fn key(stream: u64, role: OperandRole) -> Result<RngKey, ModelError> {
    Ok(RngKey {
        seed: 0,
        stream: gemm_stream(stream, role, 0)?,
    })
}

/// Every linear layer of a model, frozen at one weight sync.
#[derive(Clone, Debug)]
pub struct FrozenLinears {
    layers: Vec<FrozenLinear>,
    /// Calibrated input amax per layer (static scales), in [`Gpt::linears`] order.
    static_amax: Option<Vec<f32>>,
}

impl FrozenLinears {
    /// Quantizes every weight of `model` in `ps` once under `recipe`'s Fprop policies at
    /// progress 0 (dynamic activation scales until [`FrozenLinears::set_static_amax`]).
    pub fn new(model: &Gpt, ps: &ParamStore, recipe: &Recipe) -> Result<FrozenLinears, ModelError> {
        let n = model.cfg.n_layers;
        let mut layers = Vec::new();
        for (_, block, kind, w) in model.linears() {
            let bi = block.unwrap_or(0);
            let policy = recipe.policy_for(bi, n, kind, 0.0);
            let stream = layer_stream(bi, kind, n);
            let shape = ps.shape(w)?;
            let (rows, cols) = (shape.dims()[0], shape.dims()[1]);
            let mut state = ps.linear_state(w)?.cloned().unwrap_or_default();
            let mut values = vec![0.0f32; rows * cols];
            let [x_state, w_state, ..] = &mut state.operands;
            let qerr = |e: quant::QuantError| ModelError::Autograd(e.into());
            let quantizer = Quantizer::new(policy.fprop.b, Usage::Rowwise).map_err(qerr)?;
            let x = MatRef::new(ps.value(w)?, rows, cols).map_err(qerr)?;
            let op = Operand::new(x, quantizer.with_key(key(stream, OperandRole::FpropW)?))
                .with_state(w_state);
            let wf = fake_operand(op, &mut values).map_err(|e| ModelError::Autograd(e.into()))?;
            layers.push(FrozenLinear {
                w: FrozenOperand::new(wf).map_err(qerr)?,
                policy,
                stream,
                x_state: x_state.clone(),
                param: w,
            });
        }
        Ok(FrozenLinears {
            layers,
            static_amax: None,
        })
    }

    /// Uses static activation scales from these per-layer input amaxes (each > 0 and finite;
    /// [`Gpt::linears`] order).
    pub fn set_static_amax(&mut self, amax: Vec<f32>) -> Result<(), ModelError> {
        if amax.len() != self.layers.len() || amax.iter().any(|a| !(a.is_finite() && *a > 0.0)) {
            return Err(ModelError::Invalid(format!(
                "static activation amax needs {} finite positive values, got {amax:?}",
                self.layers.len()
            )));
        }
        self.static_amax = Some(amax);
        Ok(())
    }

    /// The static amaxes in use, if any.
    pub fn static_amax(&self) -> Option<&[f32]> {
        self.static_amax.as_deref()
    }

    /// Layer `index` on input `x: [..., in]`; also returns the input's amax.
    pub fn apply(
        &self,
        g: &mut Graph<'_>,
        x: Tensor,
        index: usize,
    ) -> Result<(Tensor, f32), ModelError> {
        let l = self.layers.get(index).ok_or_else(|| {
            ModelError::Invalid(format!("no linear layer {index} of {}", self.layers.len()))
        })?;
        let (n_out, n_in) = l.w.dims();
        let shape = g.shape(x)?;
        if shape.last() != n_in {
            return Err(ModelError::Invalid(format!(
                "linear layer {index} takes {} inputs, got {shape}",
                n_in
            )));
        }
        if g.device() == autograd::Device::Cuda {
            return self.apply_device(g, x, index);
        }
        let m = shape.rows();
        let xv = g.value(x)?;
        let amax = xv.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let clipped: Vec<f32>;
        let (data, rows) = match self.clip(index) {
            Some(a) => {
                clipped = clip_rows(xv, a, n_in);
                (&clipped[..], m + 1)
            }
            None => (xv, m),
        };
        let mut state = l.x_state.clone();
        let qerr = |e: quant::QuantError| ModelError::Autograd(e.into());
        let quantizer = Quantizer::new(l.policy.fprop.a, Usage::Rowwise).map_err(qerr)?;
        let x = MatRef::new(data, rows, n_in).map_err(qerr)?;
        let xa = Operand::new(x, quantizer.with_key(key(l.stream, OperandRole::FpropX)?))
            .with_state(&mut state);
        let mut y = vec![0.0f32; rows * n_out];
        quantized_matmul_tn_frozen(xa, &l.w, &mut y).map_err(|e| ModelError::Autograd(e.into()))?;
        y.truncate(m * n_out);
        let mut dims = shape.dims().to_vec();
        *dims.last_mut().expect("rank >= 1") = n_out;
        let out = g.input(&y, &dims)?;
        Ok((out, amax))
    }

    /// The calibrated amax that clips layer `index`'s input (static scales on a format with a
    /// per-tensor scale), if any.
    fn clip(&self, index: usize) -> Option<f32> {
        let l = &self.layers[index];
        self.static_amax
            .as_ref()
            .filter(|_| has_tensor_scale(&l.policy))
            .map(|s| s[index])
    }

    /// [`FrozenLinears::apply`] on a device graph: autograd's device linear on the store's
    /// weight with gradients off (the same quantizers, keys and state as the frozen weight:
    /// seed 0, step 0, a copy of the layer's state; the weight is quantized per call, the
    /// same values), its GEMM on tensor cores. The input comes to the host for its amax;
    /// with static scales the clipped input plus its amax row (as on the CPU) goes back up and
    /// the extra output row is dropped.
    fn apply_device(
        &self,
        g: &mut Graph<'_>,
        x: Tensor,
        index: usize,
    ) -> Result<(Tensor, f32), ModelError> {
        let l = &self.layers[index];
        let (n_out, n_in) = l.w.dims();
        let xv = g.to_vec(x)?;
        let amax = xv.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let w = g.param(l.param)?;
        let Some(a) = self.clip(index) else {
            return Ok((g.linear(x, w, None, &l.policy, l.stream)?, amax));
        };
        let shape = g.shape(x)?;
        let m = shape.rows();
        let xin = g.input(&clip_rows(&xv, a, n_in), &[m + 1, n_in])?;
        let y = g.linear(xin, w, None, &l.policy, l.stream)?;
        let flat = g.reshape(y, &[1, (m + 1) * n_out])?;
        let kept = g.split(flat, &[m * n_out, n_out])?[0];
        let mut dims = shape.dims().to_vec();
        *dims.last_mut().expect("rank >= 1") = n_out;
        Ok((g.reshape(kept, &dims)?, amax))
    }
}

/// `x` (rows of `cols`) clipped to `±a`, plus one row holding `a` (then zeros): its amax is
/// exactly the calibrated one (module docs).
fn clip_rows(x: &[f32], a: f32, cols: usize) -> Vec<f32> {
    let mut buf = Vec::with_capacity(x.len() + cols);
    buf.extend(x.iter().map(|v| v.clamp(-a, a)));
    buf.push(a);
    buf.resize(x.len() + cols, 0.0);
    buf
}

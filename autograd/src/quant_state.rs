//! The quantizer state of linear layers and the random streams of their GEMM operands.
//!
//! It lives below both the graph (which keeps it per parameter, in the
//! [`ParamStore`](crate::ParamStore)) and the linear op (which reads and updates it), so that
//! neither imports the other for it.

use quant::{GemmPolicy, QuantState, RngKey};

use crate::error::arg_err;
use crate::Result;

/// The six GEMM operands of a linear layer (the "role" part of a random stream id).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum OperandRole {
    /// Fprop operand A: X rowwise.
    FpropX = 0,
    /// Fprop operand B: W rowwise.
    FpropW = 1,
    /// Dgrad operand A: dY rowwise.
    DgradDy = 2,
    /// Dgrad operand B: W columnwise.
    DgradW = 3,
    /// Wgrad operand A: dY columnwise.
    WgradDy = 4,
    /// Wgrad operand B: X columnwise.
    WgradX = 5,
}

/// Largest layer stream id [`gemm_stream`] accepts (21 bits).
pub const MAX_LAYER_STREAM: u64 = (1 << 21) - 1;
/// Largest step [`gemm_stream`] accepts (40 bits).
pub const MAX_STEP: u64 = (1 << 40) - 1;

/// The Philox stream id of one GEMM operand: `step << 24 | layer << 3 | role`.
///
/// Bits 0–2 hold the [`OperandRole`], bits 3–23 the layer's stream id (`≤ 2²¹ − 1`), bits
/// 24–63 the training step (`≤ 2⁴⁰ − 1`). The packing is injective, so every (layer, role,
/// step) triple gets its own stream under the run's seed (`RngKey { seed, stream }`), the
/// rowwise and columnwise copies of one tensor never share random bits, and a replayed step
/// reproduces its bits exactly (on the GPU too, which derives the same id).
///
/// ```
/// use autograd::{gemm_stream, OperandRole};
/// assert_eq!(gemm_stream(5, OperandRole::WgradDy, 2)?, (2 << 24) | (5 << 3) | 4);
/// assert!(gemm_stream(1 << 21, OperandRole::FpropX, 0).is_err());
/// # Ok::<(), autograd::Error>(())
/// ```
pub fn gemm_stream(layer: u64, role: OperandRole, step: u64) -> Result<u64> {
    if layer > MAX_LAYER_STREAM || step > MAX_STEP {
        return arg_err(
            "gemm_stream",
            format!("layer stream {layer} (max {MAX_LAYER_STREAM}) or step {step} (max {MAX_STEP}) out of range"),
        );
    }
    Ok((step << 24) | (layer << 3) | role as u64)
}

pub(crate) fn key(seed: u64, layer: u64, role: OperandRole, step: u64) -> Result<RngKey> {
    Ok(RngKey {
        seed,
        stream: gemm_stream(layer, role, step)?,
    })
}

/// Quantizer state of one linear layer, one [`QuantState`] per GEMM operand, kept in the
/// [`ParamStore`](crate::ParamStore) next to the layer's weight so that FP8 delayed-scaling
/// histories persist across steps. Call [`ParamStore::end_quant_step`](crate::ParamStore::end_quant_step)
/// once per optimizer step to roll the histories (a no-op for every other format).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LinearQuantState {
    /// The policy the layer last ran with (its settings drive [`LinearQuantState::end_step`]).
    pub policy: Option<GemmPolicy>,
    /// Per-operand states, indexed by [`OperandRole`].
    pub operands: [QuantState; 6],
}

impl LinearQuantState {
    /// The state of one operand.
    pub fn operand(&self, role: OperandRole) -> &QuantState {
        &self.operands[role as usize]
    }

    /// Ends a training step: [`QuantState::end_step`] for every operand with its setting.
    pub fn end_step(&mut self) -> Result<()> {
        if let Some(p) = self.policy {
            let qs = [
                p.fprop.a, p.fprop.b, p.dgrad.a, p.dgrad.b, p.wgrad.a, p.wgrad.b,
            ];
            for (s, q) in self.operands.iter_mut().zip(&qs) {
                s.end_step(q)?;
            }
        }
        Ok(())
    }
}

/// Two distinct operand states at once.
pub(crate) fn st2(
    s: &mut LinearQuantState,
    a: OperandRole,
    b: OperandRole,
) -> (&mut QuantState, &mut QuantState) {
    let (a, b) = (a as usize, b as usize);
    debug_assert!(a < b);
    let (lo, hi) = s.operands.split_at_mut(b);
    (&mut lo[a], &mut hi[0])
}

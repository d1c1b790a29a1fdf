//! The emulated quantized GEMM: `out[M, N] = α · Â[M, K] · B̂[N, K]ᵀ` (the "TN" GEMM of
//! every linear layer), where `Â`, `B̂` are the operands fake-quantized along K without
//! their per-tensor factors (exact in f32, see [`crate::fake`]) and
//! `α = factor_A · factor_B` (NVFP4 `S_dec,A · S_dec,B`, FP8 `scale_inv_A · scale_inv_B`,
//! numerics-spec 2.3) is applied to the f32 accumulator in a separate epilogue pass, as the
//! hardware does. This models the hardware GEMM up to the f32 accumulation order.
//!
//! * An [`Operand`] is a row-major `[rows, cols]` tensor and a [`Usage`]: rowwise, the GEMM
//!   operand is the tensor itself; columnwise, its transpose (`[cols, rows]`).
//! * FP32 operands are never copied: they enter [`sgemm`] as (possibly transposed) strided
//!   views, and an all-FP32 product is bit for bit the plain [`sgemm`] / [`matmul_tn`].
//! * Quantized operands are fake-quantized into reusable scratch buffers (per thread, or a
//!   caller-provided [`GemmWorkspace`]); quantization is `O(MK + NK)` against the GEMM's
//!   `O(MNK)`.
//!
//! [`matmul_tn`]: crate::gemm::matmul_tn
//!
//! ```
//! use quant::qgemm::{quantized_matmul_tn, Operand};
//! use quant::{OperandQuant, Usage};
//! let x = [1.0f32, 2.0, 3.0, 4.0]; // [2, 2]
//! let w = [1.0f32, 0.0, 0.0, 1.0];
//! let f32q = OperandQuant::F32;
//! let mut y = [0.0f32; 4];
//! quantized_matmul_tn(
//!     Operand::new(&x, 2, 2, Usage::Rowwise, &f32q),
//!     Operand::new(&w, 2, 2, Usage::Rowwise, &OperandQuant::BF16),
//!     &mut y,
//! ).unwrap();
//! assert_eq!(y, [1.0, 2.0, 3.0, 4.0]); // X · Wᵀ
//! ```

use std::cell::Cell;

use crate::config::{Fp8Scaling, OperandQuant, QuantFormat, Usage};
use crate::gemm::{sgemm, MatRef};
use crate::{fake, QuantError, QuantState, RngKey};

/// One GEMM operand: the high-precision tensor and how to quantize it.
#[derive(Debug)]
pub struct Operand<'a> {
    /// Row-major `[rows, cols]` data.
    pub data: &'a [f32],
    /// Rows of `data`.
    pub rows: usize,
    /// Columns of `data`.
    pub cols: usize,
    /// Rowwise: the GEMM operand is `data` (`[rows, cols]`); columnwise: `dataᵀ`
    /// (`[cols, rows]`). Either way the operand's second dimension is the reduction
    /// dimension K.
    pub usage: Usage,
    /// Quantization settings.
    pub quant: &'a OperandQuant,
    /// Random stream for stochastic rounding / random Hadamard signs.
    pub key: RngKey,
    /// State for delayed FP8 scaling (required there, unused otherwise).
    pub state: Option<&'a mut QuantState>,
}

impl<'a> Operand<'a> {
    /// An operand with the default random key and no state.
    pub fn new(
        data: &'a [f32],
        rows: usize,
        cols: usize,
        usage: Usage,
        quant: &'a OperandQuant,
    ) -> Self {
        Operand {
            data,
            rows,
            cols,
            usage,
            quant,
            key: RngKey::default(),
            state: None,
        }
    }

    /// The same operand with a random key.
    pub fn with_key(mut self, key: RngKey) -> Self {
        self.key = key;
        self
    }

    /// The same operand with a quantization state.
    pub fn with_state(mut self, state: &'a mut QuantState) -> Self {
        self.state = Some(state);
        self
    }

    /// `(outer, k)`: the GEMM operand's shape.
    pub fn gemm_shape(&self) -> (usize, usize) {
        match self.usage {
            Usage::Rowwise => (self.rows, self.cols),
            Usage::Columnwise => (self.cols, self.rows),
        }
    }
}

/// Scratch buffers for the fake-quantized operands, reusable across calls.
#[derive(Debug, Default)]
pub struct GemmWorkspace {
    a: Vec<f32>,
    b: Vec<f32>,
}

impl GemmWorkspace {
    /// An empty workspace (buffers grow on first use and are then reused).
    pub fn new() -> Self {
        Self::default()
    }
}

thread_local! {
    static WORKSPACE: Cell<Option<Box<GemmWorkspace>>> = const { Cell::new(None) };
}

/// `out[M, N] = α · Â · B̂ᵀ` (see the module docs), with this thread's workspace.
///
/// Errors: [`QuantError::GemmShape`] when the operands disagree on K or `out` does not hold
/// `M · N` elements; [`QuantError::InvalidConfig`] for an invalid operand configuration or a
/// delayed-scaling FP8 operand without a state; shape and non-finite errors from the
/// quantizers.
pub fn quantized_matmul_tn(
    a: Operand<'_>,
    b: Operand<'_>,
    out: &mut [f32],
) -> Result<(), QuantError> {
    let mut ws = WORKSPACE.with(|c| c.take()).unwrap_or_default();
    let r = quantized_matmul_tn_with(a, b, out, &mut ws);
    WORKSPACE.with(|c| c.set(Some(ws)));
    r
}

/// [`quantized_matmul_tn`] with a caller-provided workspace.
pub fn quantized_matmul_tn_with(
    a: Operand<'_>,
    b: Operand<'_>,
    out: &mut [f32],
    ws: &mut GemmWorkspace,
) -> Result<(), QuantError> {
    for op in [&a, &b] {
        crate::panel::check_len(op.data, op.rows, op.cols)?;
        fake::validate(op.quant, op.usage)?;
    }
    let (m, ka) = a.gemm_shape();
    let (n, kb) = b.gemm_shape();
    if ka != kb {
        return Err(QuantError::GemmShape(format!(
            "operand A is [{m}, {ka}] and operand B is [{n}, {kb}]: the reduction dimensions differ"
        )));
    }
    if out.len() != m * n {
        return Err(QuantError::GemmShape(format!(
            "output holds {} elements, [{m}, {n}] needs {}",
            out.len(),
            m * n
        )));
    }
    let k = ka;
    let GemmWorkspace { a: wa, b: wb } = ws;
    let (av, fa) = prepare(a, wa)?;
    let (bv, fb) = prepare(b, wb)?;
    // B̂ᵀ: [K, N].
    sgemm(1.0, av, bv.t(), 0.0, out);
    let alpha = fa * fb;
    if alpha != 1.0 && k > 0 {
        // One O(MN) pass on the calling thread (cheaper than waking the rayon pool between
        // the GEMM's threads and the next step).
        out.iter_mut().for_each(|v| *v *= alpha);
    }
    Ok(())
}

/// The operand as an `[outer, K]` view and its per-tensor factor.
fn prepare<'a>(op: Operand<'a>, buf: &'a mut Vec<f32>) -> Result<(MatRef<'a>, f32), QuantError> {
    let (outer, k) = op.gemm_shape();
    if op.quant.format == QuantFormat::F32 {
        let v = MatRef::row_major(op.data, op.rows, op.cols);
        let v = match op.usage {
            Usage::Rowwise => v,
            Usage::Columnwise => v.t(),
        };
        return Ok((v, 1.0));
    }
    let delayed = matches!(
        op.quant.format,
        QuantFormat::Fp8 {
            scaling: Fp8Scaling::Delayed { .. },
            ..
        }
    );
    let mut local = QuantState::new();
    let state = match op.state {
        Some(s) => s,
        None if delayed => {
            return Err(QuantError::InvalidConfig(
                "a delayed-scaling FP8 operand needs a QuantState".into(),
            ))
        }
        None => &mut local,
    };
    let n = outer * k;
    if buf.len() < n {
        buf.resize(n, 0.0);
    }
    let dst = &mut buf[..n];
    let f = fake::fake_quantize_into(
        op.data, op.rows, op.cols, op.usage, op.quant, op.key, state, dst,
    )?;
    Ok((MatRef::row_major(dst, outer, k), f))
}

//! The one entry point for every operand format: configuration checks, quantization, fake
//! quantization (quantize-dequantize in f32) and dequantization.
//!
//! All functions work on the **stored layout**: `[rows, cols]` for [`Usage::Rowwise`], the
//! transpose `[cols, rows]` for [`Usage::Columnwise`] (quantized from the high-precision
//! tensor, never from the other copy).
//!
//! | format | unscaled values (`fake_quantize_into`) | per-tensor factor |
//! |---|---|---|
//! | F32 | `x` | 1 |
//! | BF16 | `bf16(x)` | 1 |
//! | FP8 | `fp8(code)` | `1 / scale` |
//! | MX | `element(code) · 2^(b-127)` | 1, or 4/3 with `sr_prescale` |
//! | NVFP4 | `e2m1(code) · ue4m3(s_b)` | `S_dec` |
//!
//! Unscaled values are exact in f32, so an emulated GEMM of two fake-quantized operands
//! followed by the product of the factors in the epilogue models the hardware GEMM
//! (docs/numerics.md#the-quantized-gemm) up to accumulation order.
//!
//! ```
//! use fp_formats::mx::{MxElement, ScaleRule};
//! use quant::{fake, OperandQuant, QuantState, RngKey, Usage};
//! let x: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
//! let q = OperandQuant::mx(MxElement::E2M1, ScaleRule::Rceil);
//! let mut st = QuantState::new();
//! let key = RngKey::default();
//! let t = fake::quantize(&x, 2, 32, Usage::Rowwise, &q, key, &mut st).unwrap();
//! let y = fake::fake_quantize(&x, 2, 32, Usage::Rowwise, &q, key, &mut st).unwrap();
//! assert_eq!(t.dequantize(), y);
//! assert!(x.iter().zip(&y).all(|(a, b)| (a - b).abs() <= 0.25));
//! ```

use crate::config::{BlockShape, Fp8Scaling, OperandQuant, QuantFormat, Rht, RoundingMode, Usage};
use crate::fp8::QuantState;
use crate::{bf16, fp8, mx, QuantError, QuantizedTensor, RngKey};

fn invalid(msg: impl Into<String>) -> QuantError {
    QuantError::InvalidConfig(msg.into())
}

/// Checks that an operand configuration is meaningful for a usage:
/// * `Tile16` only with NVFP4; MX needs `Row32`; NVFP4 needs `Row16` or `Tile16` (the block
///   shape is ignored by the per-tensor formats F32, BF16 and FP8);
/// * the Hadamard transform only for NVFP4 and MX, and only with columnwise usage;
/// * Four Over Six not with the Hadamard transform or stochastic rounding;
/// * `sr_prescale` only with stochastic rounding; F32 never with stochastic rounding;
/// * delayed FP8 scaling needs `history_len >= 1`.
///
/// ```
/// use quant::{fake, BlockShape, OperandQuant, Usage};
/// let w = OperandQuant::nvfp4().with_block(BlockShape::Tile16);
/// assert!(fake::validate(&w, Usage::Columnwise).is_ok());
/// assert!(fake::validate(&OperandQuant::BF16.with_block(BlockShape::Row32), Usage::Rowwise).is_ok());
/// let bad = OperandQuant::nvfp4().with_rht(quant::Rht::FixedSigns);
/// assert!(fake::validate(&bad, Usage::Rowwise).is_err()); // RHT is columnwise only
/// ```
pub fn validate(q: &OperandQuant, usage: Usage) -> Result<(), QuantError> {
    if q.rht != Rht::Off && usage != Usage::Columnwise {
        return Err(invalid(
            "the Hadamard transform applies to columnwise usage only",
        ));
    }
    match q.format {
        QuantFormat::F32 | QuantFormat::Bf16 | QuantFormat::Fp8 { .. } => {
            if q.rht != Rht::Off {
                return Err(invalid(
                    "the Hadamard transform is only supported for NVFP4 and MX",
                ));
            }
            if q.format == QuantFormat::F32 && q.rounding == RoundingMode::Stochastic {
                return Err(invalid("F32 has nothing to round stochastically"));
            }
            if let QuantFormat::Fp8 {
                scaling: Fp8Scaling::Delayed { history_len: 0, .. },
                ..
            } = q.format
            {
                return Err(invalid("delayed scaling needs history_len >= 1"));
            }
            Ok(())
        }
        QuantFormat::Mx { .. } => mx::validate(q, usage),
        QuantFormat::Nvfp4 { four_over_six } => {
            if q.block == BlockShape::Row32 {
                return Err(invalid("NVFP4 uses 1x16 blocks or 16x16 tiles, not Row32"));
            }
            if four_over_six.is_some()
                && (q.rht != Rht::Off || q.rounding == RoundingMode::Stochastic)
            {
                return Err(invalid(
                    "Four Over Six is not combinable with the Hadamard transform or stochastic rounding",
                ));
            }
            Ok(())
        }
    }
}

/// Quantizes one operand to its stored representation. `state` is used (and updated) by
/// delayed FP8 scaling only; pass a fresh [`QuantState`] otherwise.
///
/// Errors: see [`validate`], plus shape mismatches and (block formats) non-finite input.
pub fn quantize(
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    q: &OperandQuant,
    key: RngKey,
    state: &mut QuantState,
) -> Result<QuantizedTensor, QuantError> {
    validate(q, usage)?;
    match q.format {
        QuantFormat::F32 => bf16::quantize_f32(x, rows, cols, usage, q),
        QuantFormat::Bf16 => bf16::quantize(x, rows, cols, usage, q, key),
        QuantFormat::Fp8 { .. } => fp8::quantize(x, rows, cols, usage, q, key, state),
        QuantFormat::Mx { .. } => mx::quantize(x, rows, cols, usage, q, key),
        QuantFormat::Nvfp4 { .. } => crate::nvfp4::quantize(x, rows, cols, usage, q, key),
    }
}

/// Fake quantization: writes the **unscaled** dequantized values (see the module table) in
/// the stored layout into `out` (`rows * cols` elements) and returns the per-tensor factor
/// that the full dequantized value is multiplied by.
#[allow(clippy::too_many_arguments)]
pub fn fake_quantize_into(
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    q: &OperandQuant,
    key: RngKey,
    state: &mut QuantState,
    out: &mut [f32],
) -> Result<f32, QuantError> {
    validate(q, usage)?;
    match q.format {
        QuantFormat::F32 => bf16::fake_quantize_into_f32(x, rows, cols, usage, q, out),
        QuantFormat::Bf16 => bf16::fake_quantize_into(x, rows, cols, usage, q, key, out),
        QuantFormat::Fp8 { .. } => {
            fp8::fake_quantize_into(x, rows, cols, usage, q, key, state, out)
        }
        QuantFormat::Mx { .. } => mx::fake_quantize_into(x, rows, cols, usage, q, key, out),
        QuantFormat::Nvfp4 { .. } => {
            crate::nvfp4::fake_quantize_into(x, rows, cols, usage, q, key, out)
        }
    }
}

/// Fake quantization with the per-tensor factor applied: f32 in, the dequantized f32
/// values out (stored layout). Equal to `quantize(..)?.dequantize()` bit for bit.
pub fn fake_quantize(
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    q: &OperandQuant,
    key: RngKey,
    state: &mut QuantState,
) -> Result<Vec<f32>, QuantError> {
    let mut out = vec![0.0f32; x.len()];
    let f = fake_quantize_into(x, rows, cols, usage, q, key, state, &mut out)?;
    apply_factor(&mut out, f);
    Ok(out)
}

/// Multiplies by the per-tensor factor (skipped when it is 1, which is exact anyway).
pub(crate) fn apply_factor(v: &mut [f32], f: f32) {
    use rayon::prelude::*;
    if f != 1.0 {
        v.par_iter_mut().for_each(|x| *x *= f);
    }
}

impl QuantizedTensor {
    /// Dequantizes to f32 in the stored layout (`[rows, cols]`, padding dropped), with the
    /// per-tensor factor applied, for every format.
    ///
    /// ```
    /// use quant::{fake, Fp8Element, OperandQuant, QuantState, RngKey, Usage};
    /// let x = [0.5f32, -3.0, 112.0, 0.0]; // E5M2 scale 57344 / 112 = 512
    /// let q = OperandQuant::fp8_current(Fp8Element::E5M2);
    /// let t = fake::quantize(&x, 2, 2, Usage::Columnwise, &q, RngKey::default(),
    ///                        &mut QuantState::new()).unwrap();
    /// assert_eq!(t.dequantize(), vec![0.5, 112.0, -3.0, 0.0]); // transposed
    /// ```
    pub fn dequantize(&self) -> Vec<f32> {
        match self.format {
            QuantFormat::F32 => bf16::dequantize_f32(self),
            QuantFormat::Bf16 => bf16::dequantize(self),
            QuantFormat::Fp8 { .. } => fp8::dequantize(self),
            QuantFormat::Mx { .. } => mx::dequantize(self),
            QuantFormat::Nvfp4 { .. } => crate::nvfp4::dequantize(self),
        }
    }
}

/// Fake quantization with the per-tensor factor applied that also returns how many
/// elements the quantizer clipped at the format maximum (for [`crate::stats`]).
pub(crate) fn fake_quantize_counting(
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    q: &OperandQuant,
    key: RngKey,
    state: &mut QuantState,
) -> Result<(Vec<f32>, usize), QuantError> {
    validate(q, usage)?;
    let mut out = vec![0.0f32; x.len()];
    let (f, clipped) = match q.format {
        QuantFormat::F32 => (
            bf16::fake_quantize_into_f32(x, rows, cols, usage, q, &mut out)?,
            0,
        ),
        QuantFormat::Bf16 => bf16::fake_quantize_counting(x, rows, cols, usage, q, key, &mut out)?,
        QuantFormat::Fp8 { .. } => {
            fp8::fake_quantize_counting(x, rows, cols, usage, q, key, state, &mut out)?
        }
        QuantFormat::Mx { .. } => {
            mx::fake_quantize_counting(x, rows, cols, usage, q, key, &mut out)?
        }
        QuantFormat::Nvfp4 { .. } => {
            let t = crate::nvfp4::quantize(x, rows, cols, usage, q, key)?;
            let clipped = nvfp4_clipped(x, rows, cols, usage, q, key, &t)?;
            return Ok((t.dequantize(), clipped));
        }
    };
    apply_factor(&mut out, f);
    Ok((out, clipped))
}

/// Elements of an NVFP4 tensor whose scaled magnitude `|fl(v · enc_b)|` exceeded 6, with
/// `v` the values the quantizer saw and `enc_b = min(fl(1 / fl(s_b · S_dec)), FLT_MAX)`
/// recomputed from the stored block scales and `S_dec` (this covers 16x16 tiles, whose
/// scale is repeated on every row, and Four Over Six, whose winning candidate is the stored
/// scale).
fn nvfp4_clipped(
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    q: &OperandQuant,
    key: RngKey,
    t: &QuantizedTensor,
) -> Result<usize, QuantError> {
    use fp_formats::nvfp4::{GlobalScale, BLOCK};
    let v = reference_stored(x, rows, cols, usage, q, key)?;
    let g = GlobalScale {
        amax: t.amax,
        s_enc: 1.0 / t.tensor_scale_inv,
        s_dec: t.tensor_scale_inv,
        block_factor: 0.0,
    };
    let bpr = t.padded_cols / BLOCK;
    if t.cols == 0 {
        return Ok(0);
    }
    Ok(v.chunks_exact(t.cols)
        .enumerate()
        .map(|(r, row)| {
            row.chunks(BLOCK)
                .enumerate()
                .map(|(b, blk)| {
                    let enc = g.block_encode_factor(fp_formats::UE4M3(t.scales[r * bpr + b]));
                    blk.iter().filter(|&&v| (v * enc).abs() > 6.0).count()
                })
                .sum::<usize>()
        })
        .sum())
}

/// The values a quantizer sees: the stored layout of `x`, Hadamard-transformed when `q`
/// asks for it.
pub(crate) fn reference_stored(
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    q: &OperandQuant,
    key: RngKey,
) -> Result<Vec<f32>, QuantError> {
    crate::panel::check_len(x, rows, cols)?;
    let mut v = crate::panel::stored_copy(x, rows, cols, usage);
    let (_, scols) = crate::panel::stored_shape(rows, cols, usage);
    if q.rht != Rht::Off && scols % crate::hadamard::N == 0 {
        crate::hadamard::apply_rht(&mut v, q.rht, key);
    }
    Ok(v)
}

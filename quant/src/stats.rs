//! Error statistics of any operand quantization ([`fp_formats::stats::ErrorStats`]).
//!
//! The reference is the operand in its stored layout (the transpose for columnwise usage);
//! the approximation is the full dequantized operand (per-tensor factor applied). With a
//! Hadamard transform the comparison is made in the transformed domain, i.e. against the
//! values the quantizer actually saw (the transform is orthogonal, so RMSE and SQNR are
//! the same as in the original domain up to the transform's BF16 rounding).
//!
//! "Clipped" counts the elements whose scaled magnitude exceeded the element format's
//! maximum, as the quantizer computed it (FP8 `|x · scale| > max`, MX `|x · 2^(127-b)|`,
//! NVFP4 `|x · enc_b| > 6`, BF16 finite values that overflowed to Inf).

use fp_formats::stats::ErrorStats;

use crate::config::{OperandQuant, Usage};
use crate::{fake, QuantError, QuantState, RngKey};

/// Quantizes `x` (`[rows, cols]`) as `q` prescribes and measures the error: RMSE, SQNR
/// (dB), relative bias (mean signed error / mean magnitude), max abs error, clipped and
/// flushed-to-zero fractions.
///
/// ```
/// use fp_formats::mx::{MxElement, ScaleRule};
/// use quant::{stats, OperandQuant, QuantState, RngKey, Usage};
/// let x: Vec<f32> = (0..4096).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
/// let e8 = stats::operand_error(&x, 64, 64, Usage::Rowwise,
///     &OperandQuant::mx(MxElement::E4M3, ScaleRule::Rceil), RngKey::default(),
///     &mut QuantState::new()).unwrap();
/// let e4 = stats::operand_error(&x, 64, 64, Usage::Rowwise,
///     &OperandQuant::mx(MxElement::E2M1, ScaleRule::Rceil), RngKey::default(),
///     &mut QuantState::new()).unwrap();
/// assert!(e8.sqnr_db > 25.0 && e8.sqnr_db > e4.sqnr_db + 10.0);
/// assert_eq!(e8.clipped_fraction, 0.0); // RCEIL never clips
/// ```
pub fn operand_error(
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    q: &OperandQuant,
    key: RngKey,
    state: &mut QuantState,
) -> Result<ErrorStats, QuantError> {
    let (deq, clipped) = fake::fake_quantize_counting(x, rows, cols, usage, q, key, state)?;
    let reference = fake::reference_stored(x, rows, cols, usage, q, key)?;
    Ok(ErrorStats::new(&reference, &deq, clipped))
}

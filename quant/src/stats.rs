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

use crate::config::Rht;
use crate::{MatRef, QuantError, QuantState, QuantizedTensor, Quantizer};

/// Quantizes `x` with `q` and measures the error: RMSE, SQNR (dB), relative bias (mean
/// signed error / mean magnitude), max abs error, clipped and flushed-to-zero fractions.
///
/// Errors: as [`Quantizer::quantize`].
///
/// ```
/// use fp_formats::mx::{MxElement, ScaleRule};
/// use quant::{stats, MatRef, OperandQuant, QuantState, Quantizer, Usage};
/// let x: Vec<f32> = (0..4096).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
/// let x = MatRef::new(&x, 64, 64)?;
/// let err = |q| -> Result<_, quant::QuantError> {
///     stats::operand_error(&Quantizer::new(q, Usage::Rowwise)?, x, &mut QuantState::new())
/// };
/// let e8 = err(OperandQuant::mx(MxElement::E4M3, ScaleRule::Rceil))?;
/// let e4 = err(OperandQuant::mx(MxElement::E2M1, ScaleRule::Rceil))?;
/// assert!(e8.sqnr_db > 25.0 && e8.sqnr_db > e4.sqnr_db + 10.0);
/// assert_eq!(e8.clipped_fraction, 0.0); // RCEIL never clips
/// # Ok::<(), quant::QuantError>(())
/// ```
pub fn operand_error(
    q: &Quantizer,
    x: MatRef<'_>,
    state: &mut QuantState,
) -> Result<ErrorStats, QuantError> {
    let (deq, clipped) = q.fake_quantize_counting(x, state)?;
    let reference = reference_stored(q, x)?;
    Ok(ErrorStats::new(&reference, &deq, clipped))
}

/// Elements of an NVFP4 tensor whose scaled magnitude `|fl(v · enc_b)|` exceeded 6, with
/// `v` the values the quantizer saw and `enc_b = min(fl(1 / fl(s_b · S_dec)), FLT_MAX)`
/// recomputed from the stored block scales and `S_dec` (this covers 16x16 tiles, whose
/// scale is repeated on every row, and Four Over Six, whose winning candidate is the stored
/// scale).
pub(crate) fn nvfp4_clipped(
    q: &Quantizer,
    x: MatRef<'_>,
    t: &QuantizedTensor,
) -> Result<usize, QuantError> {
    use fp_formats::nvfp4::{GlobalScale, BLOCK};
    let v = reference_stored(q, x)?;
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
fn reference_stored(q: &Quantizer, x: MatRef<'_>) -> Result<Vec<f32>, QuantError> {
    let d = x.contiguous()?;
    let mut v = crate::panel::stored_copy(d, x.rows, x.cols, q.usage());
    let (_, scols) = q.stored_shape(x.rows, x.cols);
    if q.spec().rht != Rht::Off && scols % crate::hadamard::N == 0 {
        crate::hadamard::apply_rht(&mut v, q.spec().rht, q.key());
    }
    Ok(v)
}

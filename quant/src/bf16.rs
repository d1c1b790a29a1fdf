//! The two unscaled formats: BF16 (round to nearest-even, or stochastic rounding with 8
//! Philox bits per element) and F32 (passthrough).
//!
//! BF16 codes are two bytes per element, little endian; F32 codes four. Both have
//! `tensor_scale_inv = 1`. BF16 overflow follows the IEEE cast: a finite value that rounds
//! above the largest BF16 becomes ±Inf (counted as clipped); NaN stays NaN.
//!
//! ```
//! use quant::{MatRef, OperandQuant, QuantState, Quantizer, Usage};
//! let x = [1.0f32 + f32::EPSILON, 3.0];
//! let q = Quantizer::new(OperandQuant::BF16, Usage::Rowwise)?;
//! let t = q.quantize(MatRef::new(&x, 1, 2)?, &mut QuantState::new())?;
//! assert_eq!(t.codes, vec![0x80, 0x3F, 0x40, 0x40]);
//! assert_eq!(t.dequantize(), vec![1.0, 3.0]);
//! # Ok::<(), quant::QuantError>(())
//! ```

use fp_formats::{bf16_from_f32, round_to_bf16, Overflow, Rounding};
use rayon::prelude::*;

use crate::config::{OperandQuant, QuantFormat, RoundingMode, Usage};
use crate::panel::{self, grow, stored_panel, stored_shape, with_scratch};
use crate::{QuantError, QuantizedTensor, RngKey};

fn check(q: &OperandQuant, want: QuantFormat) -> Result<(), QuantError> {
    if q.format != want {
        return Err(QuantError::InvalidConfig(format!(
            "{want:?} quantizer called with {:?}",
            q.format
        )));
    }
    Ok(())
}

/// BF16 bits of `x` (RNE, or SR with random byte `r`), IEEE overflow.
#[inline(always)]
fn bf16_bits(x: f32, r: Option<u8>) -> u16 {
    match r {
        None if !x.is_nan() => (round_to_bf16(x).to_bits() >> 16) as u16,
        None => bf16_from_f32(x, Rounding::NearestEven, Overflow::Propagate).to_bits(),
        Some(r) => bf16_from_f32(x, Rounding::Stochastic(r), Overflow::Propagate).to_bits(),
    }
}

/// Rounds the stored layout to BF16; `store(out, bits)`; returns the overflow count.
/// Nearest-even rounding of a run, exactly `bf16_bits(v, None)` per element: a branch-free
/// loop the compiler vectorises (the carry trick of `round_to_bf16`), then a fix-up pass for
/// NaNs, which only the scalar encoder canonicalises. Returns how many finite inputs rounded
/// to infinity.
#[inline(always)]
fn round_run_rne<T>(src: &[f32], out: &mut [T], store: &impl Fn(&mut T, u16)) -> usize {
    // u32 lanes throughout (flags as 0/1 counts) so the loop vectorises.
    let mut overflow = 0u32;
    let mut nans = 0u32;
    for (o, &v) in out.iter_mut().zip(src) {
        let b = v.to_bits();
        let a = b & 0x7FFF_FFFF;
        let r = b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16;
        overflow += ((r & 0x7FFF == 0x7F80) & (a < 0x7F80_0000)) as u32;
        nans += (a > 0x7F80_0000) as u32;
        store(o, r as u16);
    }
    let overflow = overflow as usize;
    if nans > 0 {
        for (o, &v) in out.iter_mut().zip(src) {
            if v.is_nan() {
                store(o, bf16_bits(v, None));
            }
        }
    }
    overflow
}

fn round_tensor<T: Send>(
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    sr: Option<RngKey>,
    out: &mut [T],
    store: impl Fn(&mut T, u16) + Sync,
) -> usize {
    let (srows, scols) = stored_shape(rows, cols, usage);
    if srows == 0 || scols == 0 {
        return 0;
    }
    let p = panel::panel_rows_for(scols, usage);
    out.par_chunks_mut(p * scols)
        .enumerate()
        .map(|(pi, chunk)| {
            let r0 = pi * p;
            let n = chunk.len() / scols;
            with_scratch(|s| {
                let rb = sr.map(|key| {
                    let rb = grow(&mut s.rbits, n * scols);
                    crate::philox::fill_random_bytes(key, (r0 * scols) as u64, rb);
                    &*rb
                });
                let src = stored_panel(x, rows, cols, usage, r0, n, &mut s.panel);
                match rb {
                    None => round_run_rne(src, chunk, &store),
                    Some(rb) => {
                        let mut overflow = 0usize;
                        for ((o, &v), &r) in chunk.iter_mut().zip(src).zip(rb) {
                            let b = bf16_bits(v, Some(r));
                            overflow += (b & 0x7FFF == 0x7F80 && v.is_finite()) as usize;
                            store(o, b);
                        }
                        overflow
                    }
                }
            })
        })
        .sum()
}

/// Quantizes to BF16 in the stored layout (two bytes per element, little endian).
///
/// Errors: a format other than BF16, RHT requested, `x.len() != rows * cols`.
pub(crate) fn quantize(
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    q: &OperandQuant,
    key: RngKey,
) -> Result<QuantizedTensor, QuantError> {
    check(q, QuantFormat::Bf16)?;
    panel::check_len(x, rows, cols)?;
    let (srows, scols) = stored_shape(rows, cols, usage);
    let sr = (q.rounding == RoundingMode::Stochastic).then_some(key);
    let mut bits = vec![0u16; srows * scols];
    round_tensor(x, rows, cols, usage, sr, &mut bits, |o, b| *o = b);
    let amax = crate::fp8::tensor_amax(x);
    Ok(QuantizedTensor {
        format: q.format,
        block: q.block,
        usage,
        rows: srows,
        cols: scols,
        padded_rows: srows,
        padded_cols: scols,
        codes: bits.iter().flat_map(|b| b.to_le_bytes()).collect(),
        scales: Vec::new(),
        amax,
        tensor_scale_inv: 1.0,
        hadamard: None,
    })
}

/// Fake quantization to BF16 in the stored layout; returns the per-tensor factor 1.
pub(crate) fn fake_quantize_into(
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    q: &OperandQuant,
    key: RngKey,
    out: &mut [f32],
) -> Result<f32, QuantError> {
    fake_quantize_counting(x, rows, cols, usage, q, key, out).map(|(f, _)| f)
}

pub(crate) fn fake_quantize_counting(
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    q: &OperandQuant,
    key: RngKey,
    out: &mut [f32],
) -> Result<(f32, usize), QuantError> {
    check(q, QuantFormat::Bf16)?;
    panel::check_len(x, rows, cols)?;
    panel::check_out(out, x.len())?;
    let sr = (q.rounding == RoundingMode::Stochastic).then_some(key);
    let n = round_tensor(x, rows, cols, usage, sr, out, |o, b| {
        *o = f32::from_bits((b as u32) << 16)
    });
    Ok((1.0, n))
}

/// Dequantizes a BF16 tensor (exact), stored layout.
///
/// # Panics
/// If the tensor is not BF16.
pub(crate) fn dequantize(t: &QuantizedTensor) -> Vec<f32> {
    assert_eq!(
        t.format,
        QuantFormat::Bf16,
        "bf16::dequantize called on {:?}",
        t.format
    );
    t.codes
        .par_chunks_exact(2)
        .map(|b| f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16))
        .collect()
}

/// "Quantizes" to F32: the stored layout copied as little-endian bytes.
///
/// Errors: a format other than F32, RHT or stochastic rounding requested, or
/// `x.len() != rows * cols`.
///
/// ```
/// use quant::{MatRef, OperandQuant, QuantState, Quantizer, Usage};
/// let x = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
/// let q = Quantizer::new(OperandQuant::F32, Usage::Columnwise)?;
/// let t = q.quantize(MatRef::new(&x, 2, 3)?, &mut QuantState::new())?;
/// assert_eq!((t.rows, t.cols), (3, 2));
/// assert_eq!(t.dequantize(), vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
/// # Ok::<(), quant::QuantError>(())
/// ```
pub(crate) fn quantize_f32(
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    q: &OperandQuant,
) -> Result<QuantizedTensor, QuantError> {
    check(q, QuantFormat::F32)?;
    panel::check_len(x, rows, cols)?;
    let (srows, scols) = stored_shape(rows, cols, usage);
    let stored = panel::stored_copy(x, rows, cols, usage);
    Ok(QuantizedTensor {
        format: q.format,
        block: q.block,
        usage,
        rows: srows,
        cols: scols,
        padded_rows: srows,
        padded_cols: scols,
        codes: bytemuck::cast_slice(&stored).to_vec(),
        scales: Vec::new(),
        amax: crate::fp8::tensor_amax(x),
        tensor_scale_inv: 1.0,
        hadamard: None,
    })
}

/// F32 fake quantization: copies the stored layout into `out`; returns 1.
pub(crate) fn fake_quantize_into_f32(
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    q: &OperandQuant,
    out: &mut [f32],
) -> Result<f32, QuantError> {
    check(q, QuantFormat::F32)?;
    panel::check_len(x, rows, cols)?;
    panel::check_out(out, x.len())?;
    match usage {
        Usage::Rowwise => out.copy_from_slice(x),
        Usage::Columnwise => {
            let (srows, scols) = stored_shape(rows, cols, usage);
            if srows > 0 && scols > 0 {
                let p = panel::panel_rows_for(scols, usage);
                out.par_chunks_mut(p * scols)
                    .enumerate()
                    .for_each(|(pi, chunk)| {
                        with_scratch(|s| {
                            let n = chunk.len() / scols;
                            chunk.copy_from_slice(stored_panel(
                                x,
                                rows,
                                cols,
                                usage,
                                pi * p,
                                n,
                                &mut s.panel,
                            ));
                        })
                    });
            }
        }
    }
    Ok(1.0)
}

/// Decodes an F32 tensor's little-endian bytes.
///
/// # Panics
/// If the tensor is not F32.
pub(crate) fn dequantize_f32(t: &QuantizedTensor) -> Vec<f32> {
    assert_eq!(
        t.format,
        QuantFormat::F32,
        "dequantize_f32 called on {:?}",
        t.format
    );
    t.codes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectorised nearest-even run equals the scalar encoder on every f32 bit pattern
    /// (NaNs included, in runs with and without them), and counts the same overflows.
    #[test]
    fn rne_run_matches_scalar_exhaustively() {
        let mismatches: usize = (0u32..1 << 16)
            .into_par_iter()
            .map(|hi| {
                let src: Vec<f32> = (0u32..1 << 16)
                    .map(|lo| f32::from_bits(hi << 16 | lo))
                    .collect();
                let mut fast = vec![0u16; src.len()];
                let n = round_run_rne(&src, &mut fast, &|o: &mut u16, b| *o = b);
                let mut want_n = 0;
                let mut bad = 0;
                for (&v, &f) in src.iter().zip(&fast) {
                    let b = bf16_bits(v, None);
                    want_n += (b & 0x7FFF == 0x7F80 && v.is_finite()) as usize;
                    bad += (b != f) as usize;
                }
                bad + (n != want_n) as usize
            })
            .sum();
        assert_eq!(mismatches, 0);
    }

    #[test]
    fn rne_run_without_nans_and_with_overflow() {
        let src = [
            1.0f32,
            f32::MAX,
            -f32::MAX,
            3.0e38,
            1.0e-40,
            -0.0,
            f32::INFINITY,
        ];
        let mut out = [0.0f32; 7];
        let n = round_run_rne(&src, &mut out, &|o: &mut f32, b| {
            *o = f32::from_bits((b as u32) << 16)
        });
        assert_eq!(
            n, 2,
            "f32::MAX and -f32::MAX round to infinity; 3e38 does not"
        );
        for (&v, &o) in src.iter().zip(&out) {
            assert_eq!(o.to_bits(), (bf16_bits(v, None) as u32) << 16);
        }
    }
}

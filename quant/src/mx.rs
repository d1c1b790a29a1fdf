//! MX (OCP Microscaling) tensor quantizers: MXFP8 (E4M3, E5M2), MXFP6 (E2M3, E3M2) and
//! MXFP4 (E2M1), 32 elements per E8M0 scale, every [`ScaleRule`], round-to-nearest-even or
//! stochastic rounding, and Tseng et al.'s unbiased 3/4-prescaled stochastic variant.
//!
//! # Layout
//! * [`Usage::Rowwise`]: 1x32 blocks along the rows of `x` (`[rows, cols]`).
//! * [`Usage::Columnwise`]: 32x1 blocks down the columns of `x`, stored transposed
//!   (`[cols, rows]`, blocks along the stored rows), quantized from the high-precision
//!   tensor, never from the rowwise copy.
//! * Stored rows are zero-padded to a multiple of 32 columns (`padded_cols`); the padding
//!   does not change any block amax, quantizes to code 0 and is dropped by dequantization.
//!   Stored rows are not padded (`padded_rows == rows`).
//! * Codes per stored row: `MxElement::packed_len(padded_cols)` bytes (one byte per element
//!   for MXFP8, `fp_formats::pack` FP6 / FP4 packing otherwise); scales: one E8M0 byte per
//!   block, `[rows, padded_cols / 32]`.
//!
//! # Arithmetic
//! Per block: `b = rule.scale::<F>(block_amax)` ([`ScaleRule::scale`]), then each element is
//! `F(fl(x · 2^(127 - b)))` with saturating RNE (or SR), exactly
//! `fp_formats::mx::quantize_block`. Input must be finite.
//!
//! # Implementation
//! `fake_quantize_into` and `quantize` run the fused kernel of `mx/fast.rs`: per block
//! the amax and [`ScaleRule::scale`], then per element the saturating RNE (or SR) rounding
//! done in the f32 domain on the grid of the element format, written as
//! `element · 2^(b - 127)` (fake quantization) or as the code, bit for bit what
//! `F::from_f32(..)` and the decoder give (tested exhaustively for RNE, on every decision
//! point for SR, and on whole tensors against the previous codes path). The emulated GEMM
//! quantizes columnwise operands without RHT in the source layout
//! (`fake_quantize_columnwise_source_layout`, the same values, no transpose).
//!
//! # Hadamard transform
//! [`Rht::FixedSigns`] / [`Rht::RandomSigns`] (columnwise usage only): every 16-element
//! chunk of a stored row is replaced by its BF16-rounded 16-point transform
//! ([`crate::hadamard`], the same arithmetic as [`crate::nvfp4`]) before the block amaxes and
//! the quantization; the stored row length (the original row count) must be a multiple of
//! 16. `amax` is then the post-transform amax. (Tseng et al. use a 64-point transform with
//! fresh signs per call; this crate offers the 16-point one shared with NVFP4.)
//!
//! # Stochastic rounding
//! [`RoundingMode::Stochastic`] uses 8 Philox bits per element
//! ([`crate::philox::fill_random_bytes`] with the element's flat index in the stored,
//! **padded** layout, `r * padded_cols + c`, as [`crate::nvfp4`] does), with the hardware
//! rule of [`fp_formats::Rounding`]:
//! `P(up) = floor(256 f) / 256`. Values beyond the element maximum saturate, which biases
//! SR under FLOOR scales (up to `amax / 2^b ∈ [2^emax, 2^(emax+1))` exceeds the maximum).
//!
//! **`sr_prescale`** (Tseng, Yu, Park, arXiv 2502.20586; docs/numerics.md#prescaled-stochastic-rounding): the scaled block
//! is multiplied by 3/4 before SR, `y = fl(x · (3/4 · 2^(127 - b)))`. For every rule and
//! element this keeps `|y| ≤ 3/4 · 2^(emax+1) ≤ F::MAX` (E2M1: `[4, 8) → [3, 6)`), so
//! nothing clips; the tensor's `tensor_scale_inv` is `fl(4/3)` and dequantization (or the
//! GEMM epilogue, `α = ∏ tensor_scale_inv`) multiplies it back. The remaining bias per
//! element, relative to the exact `x`, is bounded by
//! * the 8-bit probability quantisation: `E[q] - y ∈ (-step(y)/256, 0]` in the scaled
//!   domain (`step(y)` the element grid spacing at `|y|`, at most `2^(emax - mbits)`),
//!   i.e. `|E[x̂] - x| < fl(4/3) · 2^(b-127) · step(y) / 256` — for MXFP4 at most
//!   `(4/3) · 2 / 256 ≈ 1.04 %` of the block scale `2^(b-127)`, and 0 when `256 f` is an
//!   integer;
//! * plus one f32 rounding of the prescale product and the f32 value of 4/3
//!   (relative `2^-24` and `2.98e-8`).
//!
//! `sr_prescale` requires stochastic rounding.
//!
//! ```
//! use fp_formats::mx::{MxElement, ScaleRule};
//! use quant::{MatRef, OperandQuant, QuantState, Quantizer, Usage};
//! let x: Vec<f32> = (0..64).map(|i| ((i % 31) as f32 - 15.0) * 0.5).collect(); // 2 x 32
//! let q = Quantizer::new(OperandQuant::mx(MxElement::E4M3, ScaleRule::Rceil), Usage::Rowwise)?;
//! let t = q.quantize(MatRef::new(&x, 2, 32)?, &mut QuantState::new())?;
//! assert_eq!(t.scales, vec![127 - 5, 127 - 5]); // amax 7.5: 2^ceil(log2(7.5 / 448))
//! assert_eq!(t.dequantize(), x);               // k/2, |k| <= 15, is exact in MXFP8
//! # Ok::<(), quant::QuantError>(())
//! ```

use fp_formats::mx::{MxElement, ScaleRule, BLOCK};
use fp_formats::{ElementFormat, E2M1, E2M3, E3M2, E4M3, E5M2, E8M0};
use rayon::prelude::*;

use crate::config::{OperandQuant, QuantFormat, Rht, RoundingMode, Usage};
use crate::panel::{self, grow, stored_panel, stored_panel_owned, stored_shape, with_scratch};
use crate::{MatRef, QuantError, QuantizedTensor, RngKey};

/// `fl(4/3)`: the per-tensor factor of the 3/4-prescaled stochastic variant.
pub const PRESCALE_INV: f32 = 4.0 / 3.0;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod fast;

/// Resolved settings of one MX quantization.
#[derive(Clone, Copy)]
struct MxCast {
    element: MxElement,
    rule: ScaleRule,
    sr: Option<RngKey>,
    prescale: bool,
    rht: Rht,
    key: RngKey,
}

/// The clipped count and non-finite flag of the scaled elements a hand-written kernel saw
/// (`mx/avx512.rs`, `mx/avx2.rs`), merged into the panel's counts by `fast.rs`.
#[cfg(target_arch = "x86_64")]
#[derive(Default)]
struct Counts {
    clipped: usize,
    bad: bool,
}

impl MxCast {
    /// The E8M0 scale of a block whose largest magnitude is `amax` ([`ScaleRule::scale`])
    /// and the multiplier of its elements: the scale's exact reciprocal `2^(127 - b)`, times
    /// 3/4 with the prescaled stochastic rounding. What every MX kernel computes per block.
    #[inline(always)]
    fn block_scale<F: ElementFormat>(&self, amax: f32) -> (E8M0, f32) {
        let scale = self.rule.scale::<F>(amax);
        let inv = scale.reciprocal();
        (scale, if self.prescale { inv * 0.75 } else { inv })
    }
}

/// The resolved settings of an MX quantizer (its settings were checked by
/// [`crate::Quantizer::new`]; `usage` is unused since).
fn settings(q: &OperandQuant, _usage: Usage, key: RngKey) -> Result<MxCast, QuantError> {
    let QuantFormat::Mx {
        element,
        rule,
        sr_prescale,
    } = q.format
    else {
        return Err(QuantError::InvalidConfig(format!(
            "mx quantizer called with {:?}",
            q.format
        )));
    };
    let sr = q.rounding == RoundingMode::Stochastic;
    Ok(MxCast {
        element,
        rule,
        sr: sr.then_some(key),
        prescale: sr_prescale,
        rht: q.rht,
        key,
    })
}

/// What one panel pass found.
#[derive(Clone, Copy, Default)]
struct PanelStats {
    clipped: usize,
    amax: f32,
    non_finite: bool,
}

impl PanelStats {
    fn merge(self, o: PanelStats) -> PanelStats {
        PanelStats {
            clipped: self.clipped + o.clipped,
            amax: self.amax.max(o.amax),
            non_finite: self.non_finite | o.non_finite,
        }
    }
}

/// Checks that the Hadamard transform's dimension (the stored row length) is a multiple of
/// 16.
fn check_rht(c: &MxCast, rows: usize, scols: usize) -> Result<(), QuantError> {
    if c.rht != Rht::Off && !scols.is_multiple_of(crate::hadamard::N) {
        return Err(QuantError::InvalidConfig(format!(
            "the Hadamard transform needs the transformed dimension (rows = {rows}) to be a \
             multiple of 16"
        )));
    }
    Ok(())
}

/// Turns a pass's non-finite flag into the error that names the offending input element.
fn check_finite(x: &[f32], st: PanelStats) -> Result<PanelStats, QuantError> {
    if st.non_finite {
        let err = match fp_formats::finite_amax(x) {
            Err(e) => e,
            Ok(_) => fp_formats::FormatError::NonFinite {
                index: 0,
                value: f32::INFINITY,
            },
        };
        return Err(err.into());
    }
    Ok(st)
}

/// Runs the codes quantizer over the stored layout in parallel panels of `p` stored rows.
/// `body(out, src, rbits, scales, codes)` quantizes one panel: `out` is the panel's chunk of
/// the output (`out_per_row` items per stored row), `src` its stored rows (`[n, scols]`,
/// transposed and transformed as the usage and RHT ask), `rbits` its random bytes (`[n,
/// pcols]`, stochastic rounding only), `scales` its chunk of the scales (`[n, bpr]`) and
/// `codes` a scratch buffer for unpacked codes.
fn run<T: Send>(
    x: MatRef<'_>,
    usage: Usage,
    c: &MxCast,
    out: &mut [T],
    out_per_row: usize,
    scales: &mut [u8],
    body: impl Fn(&mut [T], &[f32], Option<&[u8]>, &mut [u8], &mut Vec<u8>) -> PanelStats + Sync,
) -> Result<PanelStats, QuantError> {
    let (x, rows, cols) = (x.data, x.rows, x.cols);
    let (srows, scols) = stored_shape(rows, cols, usage);
    if srows == 0 || scols == 0 {
        return Ok(PanelStats::default());
    }
    let pcols = scols.div_ceil(BLOCK) * BLOCK;
    let bpr = pcols / BLOCK;
    let p = panel::panel_rows_for(scols, usage);
    check_rht(c, rows, scols)?;
    let st = out
        .par_chunks_mut(p * out_per_row)
        .zip(scales.par_chunks_mut(p * bpr))
        .enumerate()
        .map(|(pi, (chunk, sc))| {
            let r0 = pi * p;
            let n = sc.len() / bpr;
            with_scratch(|s| {
                let rb = c.sr.map(|key| {
                    let rb = grow(&mut s.rbits, n * pcols);
                    crate::philox::fill_random_bytes(key, (r0 * pcols) as u64, rb);
                    &*rb
                });
                let src: &[f32] = if c.rht == Rht::Off {
                    stored_panel(x, rows, cols, usage, r0, n, &mut s.panel)
                } else {
                    let p = stored_panel_owned(x, rows, cols, usage, r0, n, &mut s.panel);
                    crate::hadamard::apply_rht(p, c.rht, c.key);
                    p
                };
                body(chunk, src, rb, sc, &mut s.codes)
            })
        })
        .reduce(PanelStats::default, PanelStats::merge);
    check_finite(x, st)
}

/// Quantizes to MX in the stored layout (see the module docs for layout and arithmetic).
///
/// Errors ([`QuantError`]): a non-MX format, a block shape other than `Row32`,
/// `sr_prescale` without stochastic rounding, RHT with rowwise usage (or a stored row
/// length not divisible by 16), `x.len() != rows * cols`, non-finite input.
pub(crate) fn quantize(
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    q: &OperandQuant,
    key: RngKey,
) -> Result<QuantizedTensor, QuantError> {
    let c = settings(q, usage, key)?;
    panel::check_len(x, rows, cols)?;
    let (srows, scols) = stored_shape(rows, cols, usage);
    let pcols = scols.div_ceil(BLOCK) * BLOCK;
    let row_bytes = c.element.packed_len(pcols);
    let mut codes = vec![0u8; srows * row_bytes];
    let mut scales = vec![0u8; srows * (pcols / BLOCK)];
    let bits = c.element.bits();
    let st = run(
        MatRef::row_major(x, rows, cols),
        usage,
        &c,
        &mut codes,
        row_bytes,
        &mut scales,
        |out, src, rb, sc, buf| {
            if bits == 8 {
                // One byte per code: straight into the output.
                return fast::codes_panel(&c, src, rb, scols, out, sc, false);
            }
            let u = grow(buf, out.len() / row_bytes * pcols);
            let st = fast::codes_panel(&c, src, rb, scols, u, sc, false);
            for (o, row) in out.chunks_exact_mut(row_bytes).zip(u.chunks_exact(pcols)) {
                match bits {
                    6 => fp_formats::pack::pack_fp6_into(row, o),
                    _ => fp_formats::pack::pack_fp4_into(row, o),
                }
            }
            st
        },
    )?;
    Ok(QuantizedTensor {
        format: q.format,
        block: q.block,
        usage,
        rows: srows,
        cols: scols,
        padded_rows: srows,
        padded_cols: pcols,
        codes,
        scales,
        amax: st.amax,
        tensor_scale_inv: if c.prescale { PRESCALE_INV } else { 1.0 },
        hadamard: crate::hadamard::sign_mask(c.rht, c.key),
    })
}

/// Fake quantization: writes `element(code) · 2^(b - 127)` (without the per-tensor factor)
/// in the stored layout into `out` (`rows * cols` elements, padding dropped) and returns
/// the per-tensor factor (1, or [`PRESCALE_INV`] for `sr_prescale`). Exact in f32; the
/// values are those of [`quantize`] and [`dequantize`] without the factor, bit for bit,
/// computed by the fused path (`mx/fast.rs`) without producing codes.
///
/// Errors: as [`quantize`], plus `out.len() != x.len()`.
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

/// [`fake_quantize_into`] that also returns how many elements clipped at the element
/// maximum (`|x · 2^(127 - b)| > MAX`).
pub(crate) fn fake_quantize_counting(
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    q: &OperandQuant,
    key: RngKey,
    out: &mut [f32],
) -> Result<(f32, usize), QuantError> {
    fake_quantize_impl(MatRef::row_major(x, rows, cols), usage, q, key, out, false)
}

/// The fused fake quantization; `portable` forces the baseline (non-AVX2) build (tests).
fn fake_quantize_impl(
    x: MatRef<'_>,
    usage: Usage,
    q: &OperandQuant,
    key: RngKey,
    out: &mut [f32],
    portable: bool,
) -> Result<(f32, usize), QuantError> {
    let c = settings(q, usage, key)?;
    let (x, rows, cols) = (x.data, x.rows, x.cols);
    panel::check_len(x, rows, cols)?;
    panel::check_out(out, x.len())?;
    let st = fast::fake_quantize(x, rows, cols, usage, &c, out, portable)?;
    Ok((if c.prescale { PRESCALE_INV } else { 1.0 }, st.clipped))
}

/// The columnwise fake quantization written in the **source layout** (`out` shaped like
/// `x`: `out[r * cols + c]` is the value [`fake_quantize_into`] writes at stored position
/// `(c, r)`), for a GEMM that reads the operand through a transposed view: no transposing
/// copy. Returns the per-tensor factor, or `None` for an operand with RHT (whose transform
/// runs along the stored rows; the caller then uses the stored layout).
///
/// Errors: as [`fake_quantize_into`].
pub(crate) fn fake_quantize_columnwise_source_layout(
    x: &[f32],
    rows: usize,
    cols: usize,
    q: &OperandQuant,
    key: RngKey,
    out: &mut [f32],
) -> Result<Option<f32>, QuantError> {
    source_layout_impl(x, rows, cols, q, key, out, false).map(|r| r.map(|(f, _)| f))
}

/// [`fake_quantize_columnwise_source_layout`] with the clipped count; `portable` forces the
/// baseline build (tests).
fn source_layout_impl(
    x: &[f32],
    rows: usize,
    cols: usize,
    q: &OperandQuant,
    key: RngKey,
    out: &mut [f32],
    portable: bool,
) -> Result<Option<(f32, usize)>, QuantError> {
    let c = settings(q, Usage::Columnwise, key)?;
    panel::check_len(x, rows, cols)?;
    panel::check_out(out, x.len())?;
    if c.rht != Rht::Off {
        return Ok(None);
    }
    let st = fast::fake_quantize_columnwise_source_layout(x, rows, cols, &c, out, portable)?;
    Ok(Some((
        if c.prescale { PRESCALE_INV } else { 1.0 },
        st.clipped,
    )))
}

/// [`fake_quantize_into`] of `x` packed straight into the BF16 GEMM's tiles (`a_layout`: as
/// its A operand, else as B): the same values panel by panel, packed while in cache, with no
/// f32 copy of the operand. Rowwise operands are packed block-major
/// ([`crate::gemm::pack::pack_panels`]); columnwise ones without RHT are quantized in the
/// source layout (as [`fake_quantize_columnwise_source_layout`]) and packed chunk-major
/// ([`crate::gemm::pack::pack_panels_chunk_major`]). Returns `(factor, chunk_major)`, or
/// `None` for what this path does not cover (columnwise RHT, an empty tensor), which the
/// caller quantizes the usual way.
///
/// # Errors
/// As [`fake_quantize_into`].
pub(crate) fn fake_quantize_packed(
    x: &[f32],
    (rows, cols, usage): (usize, usize, Usage),
    q: &OperandQuant,
    key: RngKey,
    a_layout: bool,
    buf: &mut crate::gemm::TileWords,
) -> Result<Option<(f32, bool)>, QuantError> {
    let c = settings(q, usage, key)?;
    panel::check_len(x, rows, cols)?;
    if rows == 0 || cols == 0 || c.rht != Rht::Off {
        return Ok(None);
    }
    let columnwise = usage == Usage::Columnwise;
    let st = fast::fake_quantize_packed(x, (rows, cols, columnwise), &c, a_layout, buf);
    check_finite(x, st)?;
    Ok(Some((
        if c.prescale { PRESCALE_INV } else { 1.0 },
        columnwise,
    )))
}

/// `out[i] = element(codes[i]) · scale(i / 32) · f` for one stored row (unpacked codes;
/// `out` may be shorter than `codes`, dropping the padding).
fn decode_row(element: MxElement, codes: &[u8], scales: &[u8], f: f32, out: &mut [f32]) {
    fn go<F: ElementFormat>(codes: &[u8], scales: &[u8], f: f32, out: &mut [f32]) {
        for ((o, c), &s) in out.chunks_mut(BLOCK).zip(codes.chunks(BLOCK)).zip(scales) {
            let s = E8M0(s).value();
            for (o, &c) in o.iter_mut().zip(c) {
                *o = F::from_bits(c).to_f32() * s * f;
            }
        }
    }
    match element {
        MxElement::E4M3 => go::<E4M3>(codes, scales, f, out),
        MxElement::E5M2 => go::<E5M2>(codes, scales, f, out),
        MxElement::E2M3 => go::<E2M3>(codes, scales, f, out),
        MxElement::E3M2 => go::<E3M2>(codes, scales, f, out),
        MxElement::E2M1 => go::<E2M1>(codes, scales, f, out),
    }
}

/// Dequantizes an MX tensor: `element(code) · 2^(b - 127) · tensor_scale_inv`, stored
/// layout `[rows, cols]` (padding dropped).
///
/// # Panics
/// If the tensor is not MX or its buffers do not match its shape.
pub(crate) fn dequantize(t: &QuantizedTensor) -> Vec<f32> {
    let QuantFormat::Mx { .. } = t.format else {
        panic!("mx::dequantize called on {:?}", t.format);
    };
    let (rows, cols) = (t.rows, t.cols);
    let mut out = vec![0.0f32; rows * cols];
    if rows == 0 || cols == 0 {
        return out;
    }
    let f = t.tensor_scale_inv;
    out.par_chunks_mut(cols)
        .enumerate()
        .for_each_init(Vec::new, |buf: &mut Vec<u8>, (r, orow)| {
            row_into(t, r, f, orow, buf)
        });
    out
}

/// Stored row `r` of the MX tensor `t` (its `t.cols` values, padding dropped) into `out`:
/// `element(code) · 2^(b - 127) · f` (`f = 1`: the values without the per-tensor factor,
/// those `fake_quantize_into` writes). `buf` is scratch for unpacking 4- and 6-bit codes.
///
/// # Panics
/// If `t` is not MX or its buffers do not hold row `r`.
pub(crate) fn row_into(t: &QuantizedTensor, r: usize, f: f32, out: &mut [f32], buf: &mut Vec<u8>) {
    let QuantFormat::Mx { element, .. } = t.format else {
        panic!("mx::row_into called on {:?}", t.format);
    };
    let pcols = t.padded_cols;
    let row_bytes = element.packed_len(pcols);
    let bpr = pcols / BLOCK;
    let bytes = &t.codes[r * row_bytes..(r + 1) * row_bytes];
    let codes: &[u8] = match element.bits() {
        8 => bytes,
        bits => {
            let u = grow(buf, pcols);
            if bits == 6 {
                fp_formats::pack::unpack_fp6_into(bytes, u);
            } else {
                fp_formats::pack::unpack_fp4_into(bytes, u);
            }
            u
        }
    };
    decode_row(
        element,
        codes,
        &t.scales[r * bpr..(r + 1) * bpr],
        f,
        &mut out[..t.cols],
    );
}

#[cfg(test)]
mod tests;

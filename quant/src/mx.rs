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
//! **`sr_prescale`** (Tseng, Yu, Park, arXiv 2502.20586; numerics-spec 1.8): the scaled block
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
//! use quant::{mx, OperandQuant, RngKey, Usage};
//! let x: Vec<f32> = (0..64).map(|i| ((i % 31) as f32 - 15.0) * 0.5).collect(); // 2 x 32
//! let q = OperandQuant::mx(MxElement::E4M3, ScaleRule::Rceil);
//! let t = mx::quantize(&x, 2, 32, Usage::Rowwise, &q, RngKey::default()).unwrap();
//! assert_eq!(t.scales, vec![127 - 5, 127 - 5]); // amax 7.5: 2^ceil(log2(7.5 / 448))
//! assert_eq!(mx::dequantize(&t), x);           // k/2, |k| <= 15, is exact in MXFP8
//! ```

use fp_formats::mx::{MxElement, ScaleRule, BLOCK};
use fp_formats::{ElementFormat, Overflow, Rounding, E2M1, E2M3, E3M2, E4M3, E5M2, E8M0};
use rayon::prelude::*;

use crate::config::{BlockShape, OperandQuant, QuantFormat, Rht, RoundingMode, Usage};
use crate::panel::{self, grow, stored_panel, stored_panel_owned, stored_shape, with_scratch};
use crate::{QuantError, QuantizedTensor, RngKey};

/// `fl(4/3)`: the per-tensor factor of the 3/4-prescaled stochastic variant.
pub const PRESCALE_INV: f32 = 4.0 / 3.0;

/// An MX element format with its fastest exact RNE cast of a block of scaled values.
trait Elem: ElementFormat {
    #[inline(always)]
    fn rne_block(y: &[f32; BLOCK], out: &mut [u8]) {
        for (o, &v) in out.iter_mut().zip(y) {
            *o = Self::from_f32_rne_sat(v).to_bits();
        }
    }
}
impl Elem for E4M3 {
    #[inline(always)]
    fn rne_block(y: &[f32; BLOCK], out: &mut [u8]) {
        // fp-formats' slice encoder (AVX2 when available), bit-identical to encode_rne_sat.
        E4M3::encode_slice_rne_sat(y, out);
    }
}
impl Elem for E2M1 {
    #[inline(always)]
    fn rne_block(y: &[f32; BLOCK], out: &mut [u8]) {
        for (o, &v) in out.iter_mut().zip(y) {
            *o = E2M1::encode_rne_sat(v);
        }
    }
}
impl Elem for E5M2 {}
impl Elem for E2M3 {}
impl Elem for E3M2 {}

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

/// Checks an MX operand configuration for a usage (see the module docs).
pub(crate) fn validate(q: &OperandQuant, usage: Usage) -> Result<(), QuantError> {
    settings(q, usage, RngKey::default()).map(|_| ())
}

fn settings(q: &OperandQuant, usage: Usage, key: RngKey) -> Result<MxCast, QuantError> {
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
    if q.block != BlockShape::Row32 {
        return Err(QuantError::InvalidConfig(format!(
            "MX formats use 1x32 blocks (BlockShape::Row32), not {:?}",
            q.block
        )));
    }
    let sr = q.rounding == RoundingMode::Stochastic;
    if sr_prescale && !sr {
        return Err(QuantError::InvalidConfig(
            "sr_prescale (Tseng et al.'s 3/4 prescaling) requires stochastic rounding".into(),
        ));
    }
    if q.rht != Rht::Off && usage != Usage::Columnwise {
        return Err(QuantError::InvalidConfig(
            "the Hadamard transform applies to columnwise usage only".into(),
        ));
    }
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

/// Quantizes `n` stored rows (`src`, `[n, scols]`) to unpacked codes (`[n, pcols]`) and
/// scales (`[n, pcols / 32]`).
fn quantize_rows<F: Elem>(
    c: &MxCast,
    src: &[f32],
    rbits: Option<&[u8]>,
    scols: usize,
    codes: &mut [u8],
    scales: &mut [u8],
) -> PanelStats {
    let pcols = scols.div_ceil(BLOCK) * BLOCK;
    let bpr = pcols / BLOCK;
    let mut st = PanelStats::default();
    let mut pad = [0.0f32; BLOCK];
    for (r, row) in src.chunks_exact(scols).enumerate() {
        for b in 0..bpr {
            let start = b * BLOCK;
            let end = (start + BLOCK).min(scols);
            let rb = rbits.map(|rb| &rb[r * pcols + start..r * pcols + start + BLOCK]);
            let blk: &[f32] = if end - start == BLOCK {
                &row[start..end]
            } else {
                pad.fill(0.0);
                pad[..end - start].copy_from_slice(&row[start..end]);
                &pad[..]
            };
            let amax = fp_formats::nvfp4::block_amax(blk);
            let scale = c.rule.scale::<F>(amax);
            st.amax = st.amax.max(amax);
            scales[r * bpr + b] = scale.0;
            let inv = scale.reciprocal();
            let mul = if c.prescale { inv * 0.75 } else { inv };
            let out = &mut codes[r * pcols + start..r * pcols + start + BLOCK];
            let (mut clipped, mut bad) = (0usize, false);
            match rb {
                None => {
                    let mut ys = [0.0f32; BLOCK];
                    for (o, &v) in ys.iter_mut().zip(blk) {
                        let y = v * mul;
                        clipped += (y.abs() > F::MAX) as usize;
                        bad |= !y.is_finite();
                        *o = y;
                    }
                    F::rne_block(&ys, out);
                }
                Some(rb) => {
                    for ((o, &v), &r) in out.iter_mut().zip(blk).zip(rb) {
                        let y = v * mul;
                        let a = y.abs();
                        clipped += (a > F::MAX) as usize;
                        bad |= !y.is_finite();
                        *o = F::from_f32(y, Rounding::Stochastic(r), Overflow::Saturate).to_bits();
                    }
                }
            }
            st.clipped += clipped;
            st.non_finite |= bad;
        }
    }
    st
}

fn quantize_rows_dyn(
    c: &MxCast,
    src: &[f32],
    rbits: Option<&[u8]>,
    scols: usize,
    codes: &mut [u8],
    scales: &mut [u8],
) -> PanelStats {
    match c.element {
        MxElement::E4M3 => quantize_rows::<E4M3>(c, src, rbits, scols, codes, scales),
        MxElement::E5M2 => quantize_rows::<E5M2>(c, src, rbits, scols, codes, scales),
        MxElement::E2M3 => quantize_rows::<E2M3>(c, src, rbits, scols, codes, scales),
        MxElement::E3M2 => quantize_rows::<E3M2>(c, src, rbits, scols, codes, scales),
        MxElement::E2M1 => quantize_rows::<E2M1>(c, src, rbits, scols, codes, scales),
    }
}

/// Runs the quantizer over the stored layout in parallel panels. `sink(r0, n, codes,
/// scales)` consumes each panel's unpacked codes `[n, pcols]` and scales `[n, bpr]`;
/// `direct` gives the panel an output chunk for the unpacked codes when the caller can
/// take them in place (MXFP8 quantize).
#[allow(clippy::too_many_arguments)]
fn run<T: Send>(
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    c: &MxCast,
    out: &mut [T],
    out_per_row: usize,
    scales: &mut [u8],
    sink: impl Fn(&mut [T], &[u8], &[u8]) + Sync,
) -> Result<PanelStats, QuantError> {
    let (srows, scols) = stored_shape(rows, cols, usage);
    if srows == 0 || scols == 0 {
        return Ok(PanelStats::default());
    }
    let pcols = scols.div_ceil(BLOCK) * BLOCK;
    let bpr = pcols / BLOCK;
    let p = panel::panel_rows_for(scols, usage);
    if c.rht != Rht::Off && scols % crate::hadamard::N != 0 {
        return Err(QuantError::InvalidConfig(format!(
            "the Hadamard transform needs the transformed dimension (rows = {rows}) to be a \
             multiple of 16"
        )));
    }
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
                let codes = grow(&mut s.codes, n * pcols);
                let src: &[f32] = if c.rht == Rht::Off {
                    stored_panel(x, rows, cols, usage, r0, n, &mut s.panel)
                } else {
                    let p = stored_panel_owned(x, rows, cols, usage, r0, n, &mut s.panel);
                    crate::fake::apply_rht(p, c.rht, c.key);
                    p
                };
                let st = quantize_rows_dyn(c, src, rb, scols, codes, sc);
                sink(chunk, codes, sc);
                st
            })
        })
        .reduce(PanelStats::default, PanelStats::merge);
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

/// Quantizes to MX in the stored layout (see the module docs for layout and arithmetic).
///
/// Errors ([`QuantError`]): a non-MX format, a block shape other than `Row32`,
/// `sr_prescale` without stochastic rounding, RHT with rowwise usage (or a stored row
/// length not divisible by 16), `x.len() != rows * cols`, non-finite input.
pub fn quantize(
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
    let element = c.element;
    let st = run(
        x,
        rows,
        cols,
        usage,
        &c,
        &mut codes,
        row_bytes,
        &mut scales,
        |out, u, _| {
            for (o, row) in out.chunks_exact_mut(row_bytes).zip(u.chunks_exact(pcols)) {
                match element.bits() {
                    8 => o.copy_from_slice(row),
                    6 => o.copy_from_slice(&fp_formats::pack::pack_fp6(row)),
                    _ => fp_formats::pack::pack_fp4_into(row, o),
                }
            }
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
    })
}

/// Fake quantization: writes `element(code) · 2^(b - 127)` (without the per-tensor factor)
/// in the stored layout into `out` (`rows * cols` elements, padding dropped) and returns
/// the per-tensor factor (1, or [`PRESCALE_INV`] for `sr_prescale`). Exact in f32.
pub fn fake_quantize_into(
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
    let c = settings(q, usage, key)?;
    panel::check_len(x, rows, cols)?;
    panel::check_out(out, x.len())?;
    let (srows, scols) = stored_shape(rows, cols, usage);
    let pcols = scols.div_ceil(BLOCK) * BLOCK;
    let bpr = pcols / BLOCK;
    let mut scales = vec![0u8; srows * bpr];
    let element = c.element;
    let st = run(
        x,
        rows,
        cols,
        usage,
        &c,
        out,
        scols,
        &mut scales,
        |o, u, sc| {
            for ((orow, crow), srow) in o
                .chunks_exact_mut(scols)
                .zip(u.chunks_exact(pcols))
                .zip(sc.chunks_exact(bpr))
            {
                decode_row(element, crow, srow, orow);
            }
        },
    )?;
    Ok((if c.prescale { PRESCALE_INV } else { 1.0 }, st.clipped))
}

/// `out[i] = element(codes[i]) · scale(i / 32)` for one stored row (unpacked codes).
fn decode_row(element: MxElement, codes: &[u8], scales: &[u8], out: &mut [f32]) {
    fn go<F: ElementFormat>(codes: &[u8], scales: &[u8], out: &mut [f32]) {
        for ((o, c), &s) in out.chunks_mut(BLOCK).zip(codes.chunks(BLOCK)).zip(scales) {
            let s = E8M0(s).value();
            for (o, &c) in o.iter_mut().zip(c) {
                *o = F::from_bits(c).to_f32() * s;
            }
        }
    }
    match element {
        MxElement::E4M3 => go::<E4M3>(codes, scales, out),
        MxElement::E5M2 => go::<E5M2>(codes, scales, out),
        MxElement::E2M3 => go::<E2M3>(codes, scales, out),
        MxElement::E3M2 => go::<E3M2>(codes, scales, out),
        MxElement::E2M1 => go::<E2M1>(codes, scales, out),
    }
}

/// Dequantizes an MX tensor: `element(code) · 2^(b - 127) · tensor_scale_inv`, stored
/// layout `[rows, cols]` (padding dropped).
///
/// # Panics
/// If the tensor is not MX or its buffers do not match its shape.
pub fn dequantize(t: &QuantizedTensor) -> Vec<f32> {
    let QuantFormat::Mx { element, .. } = t.format else {
        panic!("mx::dequantize called on {:?}", t.format);
    };
    let (rows, cols, pcols) = (t.rows, t.cols, t.padded_cols);
    let mut out = vec![0.0f32; rows * cols];
    if rows == 0 || cols == 0 {
        return out;
    }
    let row_bytes = element.packed_len(pcols);
    let bpr = pcols / BLOCK;
    let f = t.tensor_scale_inv;
    out.par_chunks_mut(cols).enumerate().for_each(|(r, orow)| {
        let bytes = &t.codes[r * row_bytes..(r + 1) * row_bytes];
        let codes: Vec<u8> = match element.bits() {
            8 => bytes.to_vec(),
            6 => fp_formats::pack::unpack_fp6(bytes, pcols).expect("row length"),
            _ => fp_formats::pack::unpack_fp4(bytes, pcols).expect("row length"),
        };
        let mut full = vec![0.0f32; pcols];
        decode_row(
            element,
            &codes,
            &t.scales[r * bpr..(r + 1) * bpr],
            &mut full,
        );
        for (o, &v) in orow.iter_mut().zip(&full) {
            *o = v * f;
        }
    });
    out
}

//! MX (OCP Microscaling) block formats: 32 elements along a row share one E8M0 scale.
//!
//! Element formats: MXFP8 ([`E4M3`], [`E5M2`]), MXFP6 ([`E2M3`], [`E3M2`]) and MXFP4
//! ([`E2M1`]). The scale is chosen from the block amax by a [`ScaleRule`]; data are then
//! multiplied by the exact reciprocal `2^(127 - b)` (one f32 multiply, never a division) and
//! cast with saturating round-to-nearest-even.
//!
//! ```
//! use fp_formats::mx::{quantize, MxElement, MxOptions, ScaleRule};
//! let x: Vec<f32> = (0..32).map(|i| (i % 16) as f32 * 0.5).collect();
//! let q = quantize(&x, 1, 32, MxOptions::new(MxElement::E4M3, ScaleRule::Rceil)).unwrap();
//! // amax 7.5: RCEIL picks 2^ceil(log2(7.5 / 448)) = 2^-5.
//! assert_eq!(q.scales[0].exponent(), Some(-5));
//! assert_eq!(q.dequantize(), x); // 16 * k, k < 16, is exact in E4M3
//! ```

use alloc::vec::Vec;

use crate::error::FormatError;
use crate::formats::{ElementFormat, E2M1, E2M3, E3M2, E4M3, E5M2, E8M0};
use crate::{check_shape, kernels, pack, Padding};

/// Elements per MX block.
pub const BLOCK: usize = 32;

/// How the E8M0 block scale is derived from the block amax.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum ScaleRule {
    /// OCP MX v1.0: `e = floor(log2(amax)) - emax_elem`. Block maxima above the element
    /// max times `2^e` are clipped.
    Floor,
    /// NVIDIA / cuBLAS / TE "round up": `e = ceil(log2(fl(amax * fl(1 / max_elem))))`,
    /// computed on the bits (hardware `cvt.rp.satfinite.ue8m0x2.f32`). Never clips, except
    /// within a factor `max_elem` of f32's maximum, where every rule's scale is capped at
    /// [`max_scale`] (see [`ScaleRule::scale`]).
    #[default]
    Rceil,
    /// `e = ceil(log2(amax)) - emax_elem` (torchao CEIL).
    Ceil,
    /// Round amax's mantissa to the element's mantissa width (half up), then FLOOR
    /// (torchao EVEN).
    Even,
}

impl ScaleRule {
    /// The block scale for an element format `F` and a block amax.
    ///
    /// A NaN or infinite amax gives the NaN scale `0xFF`. An all-zero block gets the
    /// smallest scale `2^-127` under every rule. Every rule's scale is capped at
    /// [`max_scale`]`::<F>()`, the largest whose product with the largest element is finite
    /// in f32: a block whose amax is near f32's maximum is then clipped to the largest finite
    /// value of the grid instead of dequantizing to infinity.
    ///
    /// ```
    /// use fp_formats::{mx::ScaleRule, E2M1, E4M3};
    /// assert_eq!(ScaleRule::Floor.scale::<E4M3>(449.0).exponent(), Some(0));
    /// assert_eq!(ScaleRule::Rceil.scale::<E4M3>(449.0).exponent(), Some(1));
    /// assert_eq!(ScaleRule::Rceil.scale::<E2M1>(7.0).exponent(), Some(1));
    /// ```
    #[inline]
    pub fn scale<F: ElementFormat>(self, amax: f32) -> E8M0 {
        if !amax.is_finite() {
            return E8M0::NAN;
        }
        let amax = amax.abs();
        let s = match self {
            ScaleRule::Rceil => {
                let d = amax * (1.0 / F::MAX);
                rceil_e8m0(d)
            }
            ScaleRule::Floor => floor_rule::<F>(amax.to_bits()),
            ScaleRule::Even => {
                let mbits = F::MANTISSA_BITS;
                let bits = amax.to_bits();
                let rounded = (bits + (1 << (23 - mbits - 1))) & 0x7F80_0000;
                floor_rule::<F>(rounded)
            }
            ScaleRule::Ceil => {
                let bits = amax.to_bits();
                let e = (bits >> 23) as i32 - 127 + ((bits & 0x7F_FFFF) != 0) as i32;
                E8M0::from_exponent_clamped(e - F::EMAX)
            }
        };
        E8M0(s.0.min(max_scale::<F>().0))
    }
}

/// The largest E8M0 scale usable with element format `F`: `2^(127 - EMAX)`, so that
/// `F::MAX * scale < 2^128` stays finite in f32 (`F::MAX < 2^(EMAX + 1)`).
///
/// ```
/// use fp_formats::{mx::max_scale, E2M1, E4M3};
/// assert_eq!(max_scale::<E4M3>().exponent(), Some(119));
/// assert!((448.0 * max_scale::<E4M3>().value()).is_finite());
/// assert_eq!(max_scale::<E2M1>().exponent(), Some(125));
/// ```
#[inline]
pub const fn max_scale<F: ElementFormat>() -> E8M0 {
    E8M0((254 - F::EMAX) as u8)
}

#[inline]
fn floor_rule<F: ElementFormat>(amax_bits: u32) -> E8M0 {
    let e = (amax_bits >> 23) as i32 - 127;
    E8M0::from_exponent_clamped(e - F::EMAX)
}

/// `ceil(log2(d))` as a biased E8M0 code, on the bits of `d` (round toward +inf,
/// saturating at `0xFE`): the exponent field plus one if any mantissa bit is set; for an f32
/// subnormal `d`, plus one only when `d > 2^-127`.
#[inline]
pub fn rceil_e8m0(d: f32) -> E8M0 {
    if d.is_nan() {
        return E8M0::NAN;
    }
    let bits = d.to_bits() & 0x7FFF_FFFF;
    let exp = bits >> 23;
    let man = bits & 0x7F_FFFF;
    let b = if exp == 0 {
        (man > 0x40_0000) as u32
    } else {
        exp + (man != 0) as u32
    };
    E8M0(b.min(0xFE) as u8)
}

/// The element format of an MX matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum MxElement {
    /// MXFP8 with E4M3 elements.
    E4M3,
    /// MXFP8 with E5M2 elements.
    E5M2,
    /// MXFP6 with E2M3 elements.
    E2M3,
    /// MXFP6 with E3M2 elements.
    E3M2,
    /// MXFP4 (E2M1 elements).
    E2M1,
}

impl MxElement {
    /// Bits per stored element.
    pub fn bits(self) -> u32 {
        match self {
            MxElement::E4M3 | MxElement::E5M2 => 8,
            MxElement::E2M3 | MxElement::E3M2 => 6,
            MxElement::E2M1 => 4,
        }
    }

    /// Bytes of packed codes for `n` elements.
    pub fn packed_len(self, n: usize) -> usize {
        match self.bits() {
            8 => n,
            6 => pack::fp6_packed_len(n),
            _ => pack::fp4_packed_len(n),
        }
    }
}

/// Options of the MX quantizer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MxOptions {
    /// Element format.
    pub element: MxElement,
    /// Scale rule.
    pub rule: ScaleRule,
    /// What to do when the row length is not a multiple of 32.
    pub padding: Padding,
}

impl MxOptions {
    /// Options with no padding.
    pub fn new(element: MxElement, rule: ScaleRule) -> Self {
        MxOptions {
            element,
            rule,
            padding: Padding::Error,
        }
    }
}

/// An MX-quantized row-major matrix.
#[derive(Clone, Debug, PartialEq)]
pub struct MxMatrix {
    /// Logical rows.
    pub rows: usize,
    /// Logical columns.
    pub cols: usize,
    /// Columns after zero padding to a multiple of 32.
    pub padded_cols: usize,
    /// Element format.
    pub element: MxElement,
    /// Codes, packed per [`crate::pack`] for FP4 and FP6, one byte each for FP8; each row
    /// packs separately (`packed_len(padded_cols)` bytes per row).
    pub codes: Vec<u8>,
    /// One E8M0 scale per block, row-major.
    pub scales: Vec<E8M0>,
    /// Tensor amax (informational; MX needs no tensor scale).
    pub amax: f32,
}

impl MxMatrix {
    /// The scales as raw bytes.
    pub fn scale_bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.scales)
    }

    /// How many elements of `data` (the matrix this was quantized from) were clipped: their
    /// scaled magnitude exceeded the element format's maximum.
    ///
    /// # Panics
    /// If `data.len() != rows * cols`.
    pub fn clipped_count(&self, data: &[f32]) -> usize {
        assert_eq!(data.len(), self.rows * self.cols);
        let max = match self.element {
            MxElement::E4M3 => E4M3::MAX,
            MxElement::E5M2 => E5M2::MAX,
            MxElement::E2M3 => E2M3::MAX,
            MxElement::E3M2 => E3M2::MAX,
            MxElement::E2M1 => E2M1::MAX,
        };
        let bpr = self.padded_cols / BLOCK;
        let mut n = 0;
        for (r, row) in data.chunks_exact(self.cols.max(1)).enumerate() {
            for (b, block) in row.chunks(BLOCK).enumerate() {
                let inv = self.scales[r * bpr + b].reciprocal();
                n += block.iter().filter(|&&v| (v * inv).abs() > max).count();
            }
        }
        n
    }

    /// Exact dequantization to f32, `[rows, cols]`.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = alloc::vec![0.0f32; self.rows * self.cols];
        self.dequantize_into(&mut out);
        out
    }

    /// [`Self::dequantize`] into a caller-provided buffer of `rows * cols` elements.
    ///
    /// # Panics
    /// If `out.len() != rows * cols`.
    pub fn dequantize_into(&self, out: &mut [f32]) {
        assert_eq!(
            out.len(),
            self.rows * self.cols,
            "MX dequantize output length"
        );
        let (cols, padded) = (self.cols, self.padded_cols);
        match self.element {
            MxElement::E4M3 => crate::kernels::mx_e4m3_dequantize_rows(
                &self.codes,
                &self.scales,
                cols,
                padded,
                out,
            ),
            MxElement::E2M1 => crate::kernels::mx_e2m1_dequantize_rows(
                &self.codes,
                &self.scales,
                cols,
                padded,
                out,
            ),
            element => {
                if cols == 0 {
                    return;
                }
                let row_bytes = element.packed_len(padded);
                let bpr = padded / BLOCK;
                let mut codes = alloc::vec![0u8; padded];
                let rows = out
                    .chunks_exact_mut(cols)
                    .zip(self.codes.chunks_exact(row_bytes));
                for ((orow, bytes), srow) in rows.zip(self.scales.chunks_exact(bpr)) {
                    unpack_row_into(element, bytes, &mut codes);
                    for ((o, c), s) in orow
                        .chunks_mut(BLOCK)
                        .zip(codes.chunks_exact(BLOCK))
                        .zip(srow)
                    {
                        let s = s.value();
                        for (o, &c) in o.iter_mut().zip(c) {
                            *o = decode(element, c) * s;
                        }
                    }
                }
            }
        }
    }
}

fn unpack_row_into(element: MxElement, bytes: &[u8], codes: &mut [u8]) {
    match element.bits() {
        8 => codes.copy_from_slice(bytes),
        6 => pack::unpack_fp6_into(bytes, codes),
        _ => pack::unpack_fp4_into(bytes, codes),
    }
}

/// Decodes one element code of the given format.
#[inline]
pub fn decode(element: MxElement, code: u8) -> f32 {
    match element {
        MxElement::E4M3 => E4M3(code).to_f32(),
        MxElement::E5M2 => E5M2(code).to_f32(),
        MxElement::E2M3 => E2M3(code).to_f32(),
        MxElement::E3M2 => E3M2(code).to_f32(),
        MxElement::E2M1 => E2M1(code).to_f32(),
    }
}

/// Quantizes one block (any length up to 32) to unpacked codes; returns the scale.
#[inline]
pub fn quantize_block<F: ElementFormat>(x: &[f32], rule: ScaleRule, codes: &mut [u8]) -> E8M0 {
    let scale = rule.scale::<F>(crate::nvfp4::block_amax(x));
    let inv = scale.reciprocal();
    for (c, &v) in codes.iter_mut().zip(x) {
        *c = F::from_f32_rne_sat(v * inv).to_bits();
    }
    scale
}

/// Quantizes a row-major `[rows, cols]` matrix to an MX format with 1x32 blocks along rows.
///
/// Errors on a shape mismatch, on a row length that is not a multiple of 32 without
/// [`Padding::Zero`], and on NaN or infinite input.
pub fn quantize(
    data: &[f32],
    rows: usize,
    cols: usize,
    options: MxOptions,
) -> Result<MxMatrix, FormatError> {
    let padded_cols = check_shape(data, rows, cols, BLOCK, options.padding)?;
    let amax = crate::finite_amax(data)?;
    let bpr = padded_cols / BLOCK;
    let element = options.element;
    let rule = options.rule;
    let row_bytes = element.packed_len(padded_cols);
    let mut codes = alloc::vec![0u8; rows * row_bytes];
    let mut scales = alloc::vec![E8M0(0); rows * bpr];
    // Full blocks of the formats with a fast encoder: the vectorised kernels (the same
    // values as `quantize_block`: the fast encoders are bit-identical to `from_f32`).
    let first_generic_block = match element {
        MxElement::E4M3 => {
            kernels::mx_quantize_rows::<E4M3>(
                data,
                cols,
                padded_cols,
                rule,
                &mut codes,
                &mut scales,
            );
            cols / BLOCK
        }
        MxElement::E2M1 => {
            kernels::mx_quantize_rows::<E2M1>(
                data,
                cols,
                padded_cols,
                rule,
                &mut codes,
                &mut scales,
            );
            cols / BLOCK
        }
        _ => 0,
    };
    let mut row_codes = alloc::vec![0u8; padded_cols];
    let mut pad = [0.0f32; BLOCK];
    let generic_rows = if first_generic_block < bpr { rows } else { 0 };
    for r in 0..generic_rows {
        let row = &data[r * cols..][..cols];
        for b in first_generic_block..bpr {
            let start = b * BLOCK;
            let src = if start + BLOCK <= cols {
                &row[start..start + BLOCK]
            } else {
                pad.fill(0.0);
                pad[..cols - start].copy_from_slice(&row[start..]);
                &pad[..]
            };
            let dst = &mut row_codes[start..start + BLOCK];
            scales[r * bpr + b] = match element {
                MxElement::E4M3 => quantize_block::<E4M3>(src, rule, dst),
                MxElement::E5M2 => quantize_block::<E5M2>(src, rule, dst),
                MxElement::E2M3 => quantize_block::<E2M3>(src, rule, dst),
                MxElement::E3M2 => quantize_block::<E3M2>(src, rule, dst),
                MxElement::E2M1 => quantize_block::<E2M1>(src, rule, dst),
            };
        }
        // Every format packs whole blocks into whole bytes (32 codes: 32, 24 or 16 bytes).
        let bytes_per_block = element.packed_len(BLOCK);
        let start = first_generic_block * BLOCK;
        let src = &row_codes[start..];
        let dst = &mut codes[r * row_bytes + first_generic_block * bytes_per_block..]
            [..element.packed_len(src.len())];
        match element.bits() {
            8 => dst.copy_from_slice(src),
            6 => pack::pack_fp6_into(src, dst),
            _ => pack::pack_fp4_into(src, dst),
        }
    }
    Ok(MxMatrix {
        rows,
        cols,
        padded_cols,
        element,
        codes,
        scales,
        amax,
    })
}

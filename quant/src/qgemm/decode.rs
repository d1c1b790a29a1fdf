//! The values of a [`QuantizedTensor`]'s stored rows without its per-tensor factor (element
//! code times block scale: what [`Quantizer::fake_quantize_into`](crate::Quantizer) writes
//! for the same operand), for the GEMM that takes quantized tensors
//! ([`super::quantized_matmul_tn_tensors`]), and the check that a tensor's buffers match its
//! shape before any of them is read.
//!
//! With AVX-512, NVFP4 rows decode sixteen values per step (the E2M1 codes of a block looked
//! up in a register, times the block's scale) and MXFP8 and FP8 rows sixteen per gather from
//! a 256-entry table of the element values (times the block's E8M0 scale): the same IEEE
//! products of the same values as the portable loops, so the same bits (tested below against
//! the scalar decoders on every code and scale byte). The other formats (BF16, F32, MXFP6,
//! MXFP4) decode through the scalar code their dequantization uses.

use fp_formats::nvfp4::{dequantize_block, BLOCK as NVFP4_BLOCK};
use fp_formats::UE4M3;

use crate::config::QuantFormat;
use crate::{Fp8Element, QuantError, QuantizedTensor, MAX_DIM};

/// Checks that `t` is a consistent tensor of its format: dimensions within [`MAX_DIM`], the
/// padded shape a whole number of blocks and no smaller than the stored one, the code and
/// scale buffers exactly the padded shape's, and a finite per-tensor factor. A tensor made
/// by a quantizer always passes; one made by hand or read from a file may not.
pub(super) fn check(t: &QuantizedTensor, name: &str) -> Result<(), QuantError> {
    let bad = |why: String| Err(QuantError::InvalidConfig(format!("{name}: {why}")));
    let (pr, pc) = (t.padded_rows, t.padded_cols);
    if [t.rows, t.cols, pr, pc].iter().any(|&d| d > MAX_DIM) {
        return bad(format!(
            "shape {}x{} padded to {pr}x{pc} exceeds the largest dimension {MAX_DIM}",
            t.rows, t.cols
        ));
    }
    if pr < t.rows || pc < t.cols {
        return bad(format!(
            "shape {}x{} padded to the smaller {pr}x{pc}",
            t.rows, t.cols
        ));
    }
    // (block length along the stored rows, bytes of codes per padded row)
    let (block, row_bytes) = match t.format {
        QuantFormat::F32 => (1, pc * 4),
        QuantFormat::Bf16 => (1, pc * 2),
        QuantFormat::Fp8 { .. } => (1, pc),
        QuantFormat::Nvfp4 { .. } => (NVFP4_BLOCK, pc / 2),
        QuantFormat::Mx { element, .. } => (fp_formats::mx::BLOCK, element.packed_len(pc)),
    };
    if !pc.is_multiple_of(block) {
        return bad(format!(
            "{pc} padded columns are not a whole number of {block}-element blocks"
        ));
    }
    // (no overflow: both factors are below 2^33)
    let (codes, scales) = (
        pr * row_bytes,
        if block > 1 { pr * (pc / block) } else { 0 },
    );
    if t.codes.len() != codes || t.scales.len() != scales {
        return bad(format!(
            "{} code bytes and {} scale bytes where a {:?} tensor padded to {pr}x{pc} has {codes} and {scales}",
            t.codes.len(),
            t.scales.len(),
            t.format
        ));
    }
    if !t.tensor_scale_inv.is_finite() {
        return bad(format!(
            "per-tensor factor {} is not finite",
            t.tensor_scale_inv
        ));
    }
    Ok(())
}

/// Writes the unscaled values of stored rows `r0 .. r0 + n` of `t` into `dst` (`n` rows of
/// `t.cols` values, padding dropped; `n = dst.len() / t.cols`). `t` must have passed
/// [`check`] and hold those rows.
pub(super) fn rows_into(t: &QuantizedTensor, r0: usize, dst: &mut [f32]) {
    let cols = t.cols;
    if cols == 0 {
        return;
    }
    let pc = t.padded_cols;
    let rows = dst
        .chunks_exact_mut(cols)
        .enumerate()
        .map(|(i, d)| (r0 + i, d));
    match t.format {
        QuantFormat::F32 => {
            for (r, d) in rows {
                let bytes = &t.codes[r * pc * 4..][..cols * 4];
                for (v, b) in d.iter_mut().zip(bytes.chunks_exact(4)) {
                    *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
        }
        QuantFormat::Bf16 => {
            for (r, d) in rows {
                let bytes = &t.codes[r * pc * 2..][..cols * 2];
                for (v, b) in d.iter_mut().zip(bytes.chunks_exact(2)) {
                    *v = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16);
                }
            }
        }
        QuantFormat::Fp8 { element, .. } => {
            let codes = ByteCodes::new(element == Fp8Element::E5M2);
            for (r, d) in rows {
                codes.row(&t.codes[r * pc..][..cols], None, d);
            }
        }
        QuantFormat::Mx { element, .. } if element.bits() == 8 => {
            let codes = ByteCodes::new(element == fp_formats::mx::MxElement::E5M2);
            let bpr = pc / fp_formats::mx::BLOCK;
            for (r, d) in rows {
                let scales = &t.scales[r * bpr..][..bpr];
                codes.row(&t.codes[r * pc..][..cols], Some(scales), d);
            }
        }
        QuantFormat::Mx { .. } => {
            let mut buf = Vec::new();
            for (r, d) in rows {
                crate::mx::row_into(t, r, 1.0, d, &mut buf);
            }
        }
        QuantFormat::Nvfp4 { .. } => {
            for (r, d) in rows {
                let scales = &t.scales[r * (pc / NVFP4_BLOCK)..][..pc / NVFP4_BLOCK];
                nvfp4_row(&t.codes[r * pc / 2..][..pc / 2], scales, d);
            }
        }
    }
}

/// One-byte element codes (FP8, MXFP8), E5M2 or else E4M3: their values' table and which
/// of the two it is, which the AVX-512 decoding reads from the bits instead.
struct ByteCodes {
    lut: [f32; 256],
    e5m2: bool,
}

impl ByteCodes {
    fn new(e5m2: bool) -> ByteCodes {
        let element = if e5m2 {
            Fp8Element::E5M2
        } else {
            Fp8Element::E4M3
        };
        ByteCodes {
            lut: core::array::from_fn(|c| crate::fp8::decode(element, c as u8)),
            e5m2,
        }
    }

    /// One row: `out[i]` the value of `codes[i]`, times the E8M0 scale of its 32-block
    /// `scales[i / 32]` when there are scales (MXFP8: `element · 2^(b - 127)`, what
    /// `mx::row_into` computes with a factor of 1; FP8: the element alone). With AVX-512 the
    /// values come from the codes' bits (`avx512::fp8_blocks`), else from the table; the
    /// same bits (the same values and one IEEE product).
    fn row(&self, codes: &[u8], scales: Option<&[u8]>, out: &mut [f32]) {
        let scale = |i: usize| scales.map_or(1.0, |s| fp_formats::E8M0(s[i / 32]).value());
        let mut done = 0;
        #[cfg(target_arch = "x86_64")]
        if avx512::available() {
            done = out.len() / 16 * 16;
            // SAFETY: AVX-512F is present; `done` codes and outputs lie in the slices, and
            // `scales` holds a scale per 32 of them.
            unsafe { avx512::fp8_blocks((&self.lut, self.e5m2), codes, scales, &mut out[..done]) };
        }
        for (i, o) in out.iter_mut().enumerate().skip(done) {
            let v = self.lut[codes[i] as usize];
            *o = if scales.is_some() { v * scale(i) } else { v };
        }
    }
}

/// One NVFP4 row: `out[i] = e2m1(code i) · ue4m3(scale i / 16)` for `i < out.len()` (the
/// codes and scales may run on over padding). AVX-512 where present, else the portable
/// loop; the same bits (both products exact).
fn nvfp4_row(codes: &[u8], scales: &[u8], out: &mut [f32]) {
    let whole = out.len() / NVFP4_BLOCK;
    #[cfg(target_arch = "x86_64")]
    if avx512::available() {
        // SAFETY: AVX-512F is present; `whole` blocks of codes (8 bytes each), scales and
        // outputs (16 values each) lie inside the slices, as `out.len() <= 16 · scales.len()`
        // and `codes.len() = 8 · scales.len()` for the rows `rows_into` passes.
        unsafe { avx512::blocks(codes, scales, &mut out[..whole * NVFP4_BLOCK]) };
        tail(codes, scales, out, whole);
        return;
    }
    nvfp4_row_portable(codes, scales, out);
}

/// [`nvfp4_row`] without AVX-512.
fn nvfp4_row_portable(codes: &[u8], scales: &[u8], out: &mut [f32]) {
    let whole = out.len() / NVFP4_BLOCK;
    for (b, dst) in out[..whole * NVFP4_BLOCK]
        .chunks_exact_mut(NVFP4_BLOCK)
        .enumerate()
    {
        dequantize_block(&codes[b * 8..][..8], UE4M3(scales[b]), 1.0, dst);
    }
    tail(codes, scales, out, whole);
}

/// The partial last block of an NVFP4 row (block `b`), if any.
fn tail(codes: &[u8], scales: &[u8], out: &mut [f32], b: usize) {
    let rest = out.len() - b * NVFP4_BLOCK;
    if rest > 0 {
        let mut buf = [0.0f32; NVFP4_BLOCK];
        dequantize_block(&codes[b * 8..][..8], UE4M3(scales[b]), 1.0, &mut buf);
        out[b * NVFP4_BLOCK..].copy_from_slice(&buf[..rest]);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use fp_formats::{ElementFormat, E2M1, UE4M3};

    /// Whether the AVX-512 decoding runs here.
    pub(super) fn available() -> bool {
        std::is_x86_feature_detected!("avx512f")
    }

    /// 16 values per step of [`super::ByteCodes::row`], from the bits of the codes: the 7 bits
    /// below the sign moved to the top of an f32's exponent and mantissa (E4M3: `<< 20`,
    /// E5M2: `<< 21`) and multiplied by `2^(127 - bias)` (2^120, 2^112), which is exact for
    /// the element's normal and subnormal values alike (the f32 intermediate of a subnormal
    /// code is an f32 subnormal, and no FTZ or DAZ is in effect here), then the sign bit
    /// put back; the codes of NaN and infinity (E4M3 `0x7F`, E5M2 from `0x7C`) gathered from
    /// `lut` instead, only in a vector that holds one. Times the E8M0 scale of each 32-block
    /// when there are scales.
    ///
    /// # Safety
    /// The CPU must support AVX-512F; `out.len()` must be a multiple of 16, `codes` at least
    /// as long, and `scales` (if any) hold one byte per 32 values of `out`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn fp8_blocks(
        (lut, e5m2): (&[f32; 256], bool),
        codes: &[u8],
        scales: Option<&[u8]>,
        out: &mut [f32],
    ) {
        let n = out.len() / 16;
        assert!(out.len() == 16 * n && codes.len() >= 16 * n);
        assert!(scales.is_none_or(|s| s.len() >= n.div_ceil(2)));
        let (shift, factor, special) = if e5m2 {
            (_mm_cvtsi32_si128(21), 2f32.powi(112), 0x7C)
        } else {
            (_mm_cvtsi32_si128(20), 2f32.powi(120), 0x7F)
        };
        let (factor, special) = (_mm512_set1_ps(factor), _mm512_set1_epi32(special));
        let (low7, sign) = (_mm512_set1_epi32(0x7F), _mm512_set1_epi32(0x80));
        for i in 0..n {
            // SAFETY: codes 16 i .. 16 i + 16 lie in `codes` (asserted above).
            let c = unsafe { _mm_loadu_si128(codes.as_ptr().add(16 * i).cast()) };
            let c = _mm512_cvtepu8_epi32(c);
            let m = _mm512_and_si512(c, low7);
            let v = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_sll_epi32(m, shift)), factor);
            let s = _mm512_slli_epi32::<24>(_mm512_and_si512(c, sign));
            let mut v = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(v), s));
            let odd = _mm512_cmpge_epi32_mask(m, special);
            if odd != 0 {
                // SAFETY: every index is below 256, inside `lut`.
                v = unsafe { _mm512_mask_i32gather_ps::<4>(v, odd, c, lut.as_ptr().cast()) };
            }
            let v = match scales {
                Some(s) => _mm512_mul_ps(v, _mm512_set1_ps(fp_formats::E8M0(s[i / 2]).value())),
                None => v,
            };
            // SAFETY: values 16 i .. 16 i + 16 lie in `out` (asserted above).
            unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(16 * i), v) };
        }
    }

    /// Whole NVFP4 blocks: `out` (a multiple of 16 values) from 8 code bytes and one scale
    /// per block. Each block: the 16 nibbles widened to 32-bit lanes (low nibble first, as
    /// stored), looked up among the 16 E2M1 values by `vpermps`, times the scale's value.
    ///
    /// # Safety
    /// The CPU must support AVX-512F; `codes` must hold 8 bytes and `scales` one byte per
    /// block of `out`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn blocks(codes: &[u8], scales: &[u8], out: &mut [f32]) {
        let n = out.len() / 16;
        assert!(codes.len() >= 8 * n && scales.len() >= n && out.len() == 16 * n);
        let values: [f32; 16] = core::array::from_fn(|c| E2M1(c as u8).to_f32());
        let table = _mm512_loadu_ps(values.as_ptr());
        let low = _mm_set1_epi8(0x0F);
        for (b, &scale) in scales[..n].iter().enumerate() {
            // SAFETY: bytes 8 b .. 8 b + 8 lie in `codes` (asserted above).
            let x = unsafe { _mm_loadl_epi64(codes.as_ptr().add(8 * b).cast()) };
            let lo = _mm_and_si128(x, low);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(x), low);
            let idx = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi));
            let v = _mm512_permutexvar_ps(idx, table);
            let s = _mm512_set1_ps(UE4M3(scale).to_f32());
            // SAFETY: values 16 b .. 16 b + 16 lie in `out` (asserted above).
            unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(16 * b), _mm512_mul_ps(v, s)) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AVX-512 rows equal the portable ones bit for bit: every code in both nibbles,
    /// every scale byte (zero, subnormal, normal, the largest and NaN), and rows with a
    /// partial last block.
    #[test]
    fn nvfp4_rows_match_the_portable_loop() {
        #[cfg(target_arch = "x86_64")]
        if !avx512::available() {
            eprintln!("skipped: no AVX-512 on this CPU, only the portable loop runs here");
            return;
        }
        let blocks = 256;
        let codes: Vec<u8> = (0..8 * blocks).map(|i| (i * 37 + i / 256) as u8).collect();
        let scales: Vec<u8> = (0..blocks).map(|b| b as u8).collect();
        for len in [16 * blocks, 16 * blocks - 5, 16 * (blocks - 1) + 1] {
            let (mut fast, mut slow) = (vec![0.0f32; len], vec![0.0f32; len]);
            nvfp4_row(&codes, &scales, &mut fast);
            nvfp4_row_portable(&codes, &scales, &mut slow);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&fast), bits(&slow), "row of {len} values");
        }
        // the lookup order: byte 0x21 holds code 1 (0.5) first, then code 2 (1.0)
        let mut two = [0.0f32; 16];
        nvfp4_row(&[0x21, 0, 0, 0, 0, 0, 0, 0], &[0x38], &mut two);
        assert_eq!(&two[..3], &[0.5, 1.0, 0.0]);
    }

    /// The byte-code rows equal `mx::row_into` (MXFP8, every code under every scale byte,
    /// NaN's included) and the FP8 decoder, on rows with a partial last vector.
    #[test]
    fn byte_code_rows_match_the_scalar_decoders() {
        use fp_formats::mx::{MxElement, BLOCK};
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let cols = 256 * 32;
        let codes: Vec<u8> = (0..cols).map(|i| (i % 256) as u8).collect();
        let scales: Vec<u8> = (0..cols / BLOCK).map(|b| b as u8).collect();
        for element in [MxElement::E4M3, MxElement::E5M2] {
            let t = QuantizedTensor {
                format: QuantFormat::Mx {
                    element,
                    rule: fp_formats::mx::ScaleRule::Floor,
                    sr_prescale: false,
                },
                block: crate::config::BlockShape::Row16,
                usage: crate::config::Usage::Rowwise,
                rows: 1,
                cols: cols - 7,
                padded_rows: 1,
                padded_cols: cols,
                codes: codes.clone(),
                scales: scales.clone(),
                amax: 1.0,
                tensor_scale_inv: 1.0,
                hadamard: None,
            };
            check(&t, "t").unwrap();
            let (mut got, mut want) = (vec![0.0f32; cols - 7], vec![0.0f32; cols - 7]);
            rows_into(&t, 0, &mut got);
            crate::mx::row_into(&t, 0, 1.0, &mut want, &mut Vec::new());
            assert_eq!(bits(&got), bits(&want), "{element:?}");
        }
        for element in [Fp8Element::E4M3, Fp8Element::E5M2] {
            let mut got = vec![0.0f32; 250];
            ByteCodes::new(element == Fp8Element::E5M2).row(&codes, None, &mut got);
            let want: Vec<f32> = codes[..250]
                .iter()
                .map(|&c| crate::fp8::decode(element, c))
                .collect();
            assert_eq!(bits(&got), bits(&want), "{element:?}");
        }
    }
}

//! Slice-level hot loops (amax, NVFP4 / MX block quantization and dequantization, slice
//! encoders and decoders).
//!
//! Every kernel has a portable version (`*_portable`, plain branch-free Rust, used on every
//! target) and, on x86-64, an AVX2 version in [`avx2`] selected at run time by the
//! workspace's shared dispatch, [`crate::cpu`] (or at compile time when the build enables
//! AVX2 without `std`). The AVX2 code performs the same IEEE f32 operations in the same
//! order, so both return identical bytes; the unit tests below compare them with each other
//! and with the scalar reference code of the public API.
//!
//! The matrix kernels (`nvfp4_*_rows`, `mx_*_rows`) require finite input (the callers check
//! with [`amax_finite`] first); the slice encoders and decoders accept anything.

use crate::formats::{ElementFormat, E2M1, E4M3, E8M0, UE4M3};
use crate::mx::ScaleRule;
use crate::nvfp4::GlobalScale;

#[cfg(all(target_arch = "x86_64", any(feature = "std", target_feature = "avx2")))]
mod avx2;

/// Whether the AVX2 kernels run: with the `std` feature, as the shared dispatch
/// ([`crate::cpu::has_avx2`]) says; without it, only builds that enable AVX2 compile them in.
#[cfg(all(target_arch = "x86_64", any(feature = "std", target_feature = "avx2")))]
#[inline]
pub(crate) fn has_avx2() -> bool {
    #[cfg(feature = "std")]
    {
        crate::cpu::has_avx2()
    }
    #[cfg(not(feature = "std"))]
    {
        true // the build enables AVX2
    }
}

/// Whether the AVX2 kernels run (never on this target).
#[cfg(not(all(target_arch = "x86_64", any(feature = "std", target_feature = "avx2"))))]
#[allow(dead_code)] // only the tests ask
#[inline]
pub(crate) fn has_avx2() -> bool {
    false
}

/// Runs `$avx2` (an `unsafe` call into [`avx2`]) when the CPU has AVX2, else `$portable`.
macro_rules! dispatch {
    ($avx2:expr, $portable:expr) => {{
        #[cfg(all(target_arch = "x86_64", any(feature = "std", target_feature = "avx2")))]
        {
            if has_avx2() {
                // SAFETY: the running CPU supports AVX2 (checked just above); the kernels
                // only read and write inside the slices they are given.
                #[allow(unused_unsafe)]
                return unsafe { $avx2 };
            }
        }
        $portable
    }};
}

/// `max(a, b)` that keeps `a` when `b` is NaN; identical to `f32::max` whenever `a` is not
/// NaN, and compiles to a single `maxps`.
#[inline(always)]
fn fmax(a: f32, b: f32) -> f32 {
    if b > a {
        b
    } else {
        a
    }
}

/// Absolute maximum of 16 values, ignoring NaN (0 when all are NaN): the same value as
/// [`crate::nvfp4::block_amax`].
#[inline(always)]
pub(crate) fn amax16(x: &[f32; 16]) -> f32 {
    let mut m = [0.0f32; 8];
    for i in 0..16 {
        m[i % 8] = fmax(m[i % 8], x[i].abs());
    }
    for i in 0..4 {
        m[i] = fmax(m[i], m[i + 4]);
    }
    for i in 0..2 {
        m[i] = fmax(m[i], m[i + 2]);
    }
    fmax(m[0], m[1])
}

/// Absolute maximum of 32 values, ignoring NaN.
#[inline(always)]
pub(crate) fn amax32(x: &[f32; 32]) -> f32 {
    let mut m = [0.0f32; 16];
    for i in 0..32 {
        m[i % 16] = fmax(m[i % 16], x[i].abs());
    }
    let m: &[f32; 16] = &m;
    amax16(m)
}

/// Absolute maximum of any slice, ignoring NaN (0 for an empty or all-NaN slice).
#[inline(always)]
pub(crate) fn amax_slice(x: &[f32]) -> f32 {
    let mut m = [0.0f32; 16];
    let chunks = x.chunks_exact(16);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..16 {
            m[i] = fmax(m[i], c[i].abs());
        }
    }
    let mut a = amax16(&m);
    for v in rest {
        a = fmax(a, v.abs());
    }
    a
}

/// `(amax, all_finite)` of a slice in one pass. `amax` (the absolute maximum) is only
/// meaningful when `all_finite`.
pub(crate) fn amax_finite(data: &[f32]) -> (f32, bool) {
    dispatch!(avx2::amax_finite(data), amax_finite_portable(data))
}

#[inline]
pub(crate) fn amax_finite_portable(data: &[f32]) -> (f32, bool) {
    let mut m = [0.0f32; 16];
    let mut bad = [0u32; 16];
    let chunks = data.chunks_exact(16);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..16 {
            let a = c[i].abs();
            m[i] = fmax(m[i], a);
            bad[i] |= (a.to_bits() > 0x7F7F_FFFF) as u32;
        }
    }
    let mut amax = amax16(&m);
    let mut any_bad = bad.iter().fold(0, |acc, &b| acc | b) != 0;
    for v in rest {
        amax = fmax(amax, v.abs());
        any_bad |= !v.is_finite();
    }
    (amax, !any_bad)
}

/// `UE4M3(code).to_f32()` without the table (so that it vectorises); identical for every
/// byte (the sign bit is ignored, `0x7F` / `0xFF` are NaN).
#[inline(always)]
pub(crate) fn ue4m3_value(code: u32) -> f32 {
    let c = code & 0x7F;
    let e = c >> 3;
    let m = c & 7;
    let normal = f32::from_bits(((e + 120) << 23) | (m << 20));
    let sub = m as f32 * (1.0 / 512.0);
    let v = if e == 0 { sub } else { normal };
    if c == 0x7F {
        f32::NAN
    } else {
        v
    }
}

/// `E4M3(code).to_f32()` without the table; identical bits for every byte (NaN codes give
/// the table's `±NaN`).
#[inline(always)]
pub(crate) fn e4m3_value(code: u32) -> f32 {
    let sign = (code & 0x80) << 24;
    let mag = ue4m3_value(code).to_bits();
    f32::from_bits(mag | sign)
}

/// `E2M1(code).to_f32()` without the table, for a 4-bit code; identical for all 16 codes.
#[inline(always)]
pub(crate) fn e2m1_value(code: u32) -> f32 {
    let m3 = code & 7;
    // Codes 2..=7 are normal: exponent field 127 + (m3 >> 1) - 1, mantissa bit m3 & 1,
    // i.e. f32 bits (m3 + 252) << 22. Code 1 is 0.5, code 0 is 0.
    let normal = (m3 + 252) << 22;
    let small = if m3 == 1 { 0x3F00_0000 } else { 0 };
    let mag = if m3 >= 2 { normal } else { small };
    f32::from_bits(mag | ((code & 8) << 28))
}

/// One NVFP4 block: the exact steps of [`crate::nvfp4::quantize_block_rne`].
#[inline(always)]
fn nvfp4_block(x: &[f32; 16], g: &GlobalScale, out: &mut [u8; 8]) -> u8 {
    let s = (amax16(x) * g.block_factor).min(f32::MAX);
    let code = E4M3::encode_rne_sat(s);
    let enc = (1.0 / (ue4m3_value(code as u32) * g.s_dec)).min(f32::MAX);
    let mut q = [0u8; 16];
    for i in 0..16 {
        q[i] = E2M1::encode_rne_sat(x[i] * enc);
    }
    for i in 0..8 {
        out[i] = q[2 * i] | (q[2 * i + 1] << 4);
    }
    code
}

/// Eight NVFP4 blocks at once, so that the scale arithmetic (E4M3 encode, the division)
/// runs on vectors of block scales. Same per-block arithmetic as [`nvfp4_block`].
#[inline(always)]
fn nvfp4_block8(x: &[f32; 128], g: &GlobalScale, out: &mut [u8; 64], scales: &mut [u8; 8]) {
    let mut amax = [0.0f32; 8];
    for (j, a) in amax.iter_mut().enumerate() {
        let b: &[f32; 16] = x[16 * j..16 * j + 16].try_into().unwrap();
        *a = amax16(b);
    }
    let mut enc = [0.0f32; 8];
    for j in 0..8 {
        let s = (amax[j] * g.block_factor).min(f32::MAX);
        let code = E4M3::encode_rne_sat(s);
        scales[j] = code;
        enc[j] = (1.0 / (ue4m3_value(code as u32) * g.s_dec)).min(f32::MAX);
    }
    let mut q = [0u8; 128];
    for i in 0..128 {
        q[i] = E2M1::encode_rne_sat(x[i] * enc[i / 16]);
    }
    for i in 0..64 {
        out[i] = q[2 * i] | (q[2 * i + 1] << 4);
    }
}

/// NVFP4-quantizes the full 16-element blocks of every row of a row-major matrix with
/// finite values (`cols / 16` blocks per row; a partial tail block is left to the caller).
/// `codes` holds `padded_cols / 2` bytes per row and `scales` `padded_cols / 16`.
pub(crate) fn nvfp4_quantize_rows(
    data: &[f32],
    cols: usize,
    padded_cols: usize,
    g: &GlobalScale,
    codes: &mut [u8],
    scales: &mut [UE4M3],
) {
    if cols == 0 {
        return;
    }
    let scales: &mut [u8] = bytemuck::cast_slice_mut(scales);
    dispatch!(
        avx2::nvfp4_quantize_rows(data, cols, padded_cols, g, codes, scales),
        nvfp4_quantize_rows_portable(data, cols, padded_cols, g, codes, scales)
    )
}

#[inline]
pub(crate) fn nvfp4_quantize_rows_portable(
    data: &[f32],
    cols: usize,
    padded_cols: usize,
    g: &GlobalScale,
    codes: &mut [u8],
    scales: &mut [u8],
) {
    let full = cols / 16;
    let bpr = padded_cols / 16;
    let rows = data
        .chunks_exact(cols)
        .zip(codes.chunks_exact_mut(padded_cols / 2));
    for ((row, crow), srow) in rows.zip(scales.chunks_exact_mut(bpr)) {
        let mut x8 = row[..16 * full].chunks_exact(128);
        let mut c8 = crow[..8 * full].chunks_exact_mut(64);
        let mut s8 = srow[..full].chunks_exact_mut(8);
        for ((x, c), s) in (&mut x8).zip(&mut c8).zip(&mut s8) {
            nvfp4_block8(
                x.try_into().unwrap(),
                g,
                c.try_into().unwrap(),
                s.try_into().unwrap(),
            );
        }
        let x1 = x8.remainder().chunks_exact(16);
        let c1 = c8.into_remainder().chunks_exact_mut(8);
        for ((x, c), s) in x1.zip(c1).zip(s8.into_remainder()) {
            *s = nvfp4_block(x.try_into().unwrap(), g, c.try_into().unwrap());
        }
    }
}

/// One NVFP4 block: `x̂ = fl(fl(e2m1 * s) * S_dec)` with `s` the block scale's value.
#[inline(always)]
fn nvfp4_dequantize_block(c: &[u8; 8], s: f32, s_dec: f32, o: &mut [f32; 16]) {
    for i in 0..8 {
        o[2 * i] = e2m1_value(c[i] as u32 & 0xF) * s * s_dec;
        o[2 * i + 1] = e2m1_value(c[i] as u32 >> 4) * s * s_dec;
    }
}

/// The partial last block of a row (`tail.len() == cols % 16` elements).
#[inline(always)]
fn nvfp4_dequantize_tail(tail: &mut [f32], crow: &[u8], srow: &[u8], cols: usize, s_dec: f32) {
    if tail.is_empty() {
        return;
    }
    let b = cols / 16;
    let s = UE4M3(srow[b]).to_f32();
    for (i, o) in tail.iter_mut().enumerate() {
        let byte = crow[8 * b + i / 2];
        let code = if i % 2 == 0 { byte & 0xF } else { byte >> 4 };
        *o = E2M1(code).to_f32() * s * s_dec;
    }
}

/// NVFP4 dequantization of whole rows: `x̂ = fl(fl(e2m1 * f32(s_b)) * S_dec)`.
/// `out` is `[rows, cols]`; padded columns are skipped.
pub(crate) fn nvfp4_dequantize_rows(
    codes: &[u8],
    scales: &[UE4M3],
    cols: usize,
    padded_cols: usize,
    s_dec: f32,
    out: &mut [f32],
) {
    if cols == 0 {
        return;
    }
    let scales: &[u8] = bytemuck::cast_slice(scales);
    dispatch!(
        avx2::nvfp4_dequantize_rows(codes, scales, cols, padded_cols, s_dec, out),
        nvfp4_dequantize_rows_portable(codes, scales, cols, padded_cols, s_dec, out)
    )
}

#[inline]
pub(crate) fn nvfp4_dequantize_rows_portable(
    codes: &[u8],
    scales: &[u8],
    cols: usize,
    padded_cols: usize,
    s_dec: f32,
    out: &mut [f32],
) {
    let bpr = padded_cols / 16;
    let rows = out
        .chunks_exact_mut(cols)
        .zip(codes.chunks_exact(padded_cols / 2));
    for ((orow, crow), srow) in rows.zip(scales.chunks_exact(bpr)) {
        let mut o16 = orow.chunks_exact_mut(16);
        for ((o, c), &s) in (&mut o16).zip(crow.chunks_exact(8)).zip(srow) {
            let s = ue4m3_value(s as u32);
            nvfp4_dequantize_block(c.try_into().unwrap(), s, s_dec, o.try_into().unwrap());
        }
        nvfp4_dequantize_tail(o16.into_remainder(), crow, srow, cols, s_dec);
    }
}

/// Element encoders with a fast RNE + saturating path, for the MX kernels (implemented by
/// [`E4M3`] and [`E2M1`] only: the AVX2 kernel tells them apart by [`ElementFormat::BITS`]).
pub(crate) trait FastEncode: ElementFormat {
    /// `Self::from_f32_rne_sat(x).to_bits()`.
    fn encode(x: f32) -> u8;
}

impl FastEncode for E4M3 {
    #[inline(always)]
    fn encode(x: f32) -> u8 {
        E4M3::encode_rne_sat(x)
    }
}

impl FastEncode for E2M1 {
    #[inline(always)]
    fn encode(x: f32) -> u8 {
        E2M1::encode_rne_sat(x)
    }
}

/// One MX block of 32 values to 32 unpacked codes; returns the scale.
#[inline(always)]
fn mx_block<F: FastEncode>(x: &[f32; 32], rule: ScaleRule, q: &mut [u8; 32]) -> E8M0 {
    let scale = rule.scale::<F>(amax32(x));
    let inv = scale.reciprocal();
    for i in 0..32 {
        q[i] = F::encode(x[i] * inv);
    }
    scale
}

/// MX-quantizes the full 32-element blocks of every row of a matrix with finite values,
/// with a fast-path element format (E4M3: one byte per code; E2M1: packed two per byte).
/// `codes` holds `packed_len(padded_cols)` bytes per row, `scales` `padded_cols / 32`.
pub(crate) fn mx_quantize_rows<F: FastEncode>(
    data: &[f32],
    cols: usize,
    padded_cols: usize,
    rule: ScaleRule,
    codes: &mut [u8],
    scales: &mut [E8M0],
) {
    if cols == 0 {
        return;
    }
    #[cfg(all(target_arch = "x86_64", any(feature = "std", target_feature = "avx2")))]
    if has_avx2() {
        // SAFETY: the running CPU supports AVX2; the kernels only touch the given slices.
        unsafe { avx2::mx_quantize_rows::<F>(data, cols, padded_cols, rule, codes, scales) };
        return;
    }
    mx_quantize_rows_portable::<F>(data, cols, padded_cols, rule, codes, scales)
}

#[inline]
pub(crate) fn mx_quantize_rows_portable<F: FastEncode>(
    data: &[f32],
    cols: usize,
    padded_cols: usize,
    rule: ScaleRule,
    codes: &mut [u8],
    scales: &mut [E8M0],
) {
    let full = cols / 32;
    let bpr = padded_cols / 32;
    let packed = F::BITS == 4;
    let row_bytes = if packed { padded_cols / 2 } else { padded_cols };
    let block_bytes = if packed { 16 } else { 32 };
    let rows = data
        .chunks_exact(cols)
        .zip(codes.chunks_exact_mut(row_bytes));
    for ((row, crow), srow) in rows.zip(scales.chunks_exact_mut(bpr)) {
        let blocks = row[..32 * full].chunks_exact(32);
        let outs = crow.chunks_exact_mut(block_bytes);
        for ((x, c), s) in blocks.zip(outs).zip(srow.iter_mut()) {
            let mut q = [0u8; 32];
            *s = mx_block::<F>(x.try_into().unwrap(), rule, &mut q);
            if packed {
                for i in 0..16 {
                    c[i] = q[2 * i] | (q[2 * i + 1] << 4);
                }
            } else {
                c.copy_from_slice(&q);
            }
        }
    }
}

/// MXFP8-E4M3 dequantization of whole rows (`out` is `[rows, cols]`, padding skipped).
pub(crate) fn mx_e4m3_dequantize_rows(
    codes: &[u8],
    scales: &[E8M0],
    cols: usize,
    padded_cols: usize,
    out: &mut [f32],
) {
    if cols == 0 {
        return;
    }
    dispatch!(
        avx2::mx_e4m3_dequantize_rows(codes, scales, cols, padded_cols, out),
        mx_e4m3_dequantize_rows_portable(codes, scales, cols, padded_cols, out)
    )
}

#[inline]
pub(crate) fn mx_e4m3_dequantize_rows_portable(
    codes: &[u8],
    scales: &[E8M0],
    cols: usize,
    padded_cols: usize,
    out: &mut [f32],
) {
    let bpr = padded_cols / 32;
    let rows = out
        .chunks_exact_mut(cols)
        .zip(codes.chunks_exact(padded_cols));
    for ((orow, crow), srow) in rows.zip(scales.chunks_exact(bpr)) {
        for ((o, c), s) in orow.chunks_mut(32).zip(crow.chunks_exact(32)).zip(srow) {
            let s = s.value();
            for (o, &c) in o.iter_mut().zip(c) {
                *o = e4m3_value(c as u32) * s;
            }
        }
    }
}

/// One MXFP4 block (or the first `o.len()` elements of it): `x̂ = e2m1 * s`.
#[inline(always)]
fn mx_e2m1_dequantize_block(c: &[u8], s: f32, o: &mut [f32]) {
    for (i, o) in o.iter_mut().enumerate() {
        let byte = c[i / 2] as u32;
        let code = if i % 2 == 0 { byte & 0xF } else { byte >> 4 };
        *o = e2m1_value(code) * s;
    }
}

/// MXFP4 (E2M1) dequantization of whole rows (`out` is `[rows, cols]`).
pub(crate) fn mx_e2m1_dequantize_rows(
    codes: &[u8],
    scales: &[E8M0],
    cols: usize,
    padded_cols: usize,
    out: &mut [f32],
) {
    if cols == 0 {
        return;
    }
    dispatch!(
        avx2::mx_e2m1_dequantize_rows(codes, scales, cols, padded_cols, out),
        mx_e2m1_dequantize_rows_portable(codes, scales, cols, padded_cols, out)
    )
}

#[inline]
pub(crate) fn mx_e2m1_dequantize_rows_portable(
    codes: &[u8],
    scales: &[E8M0],
    cols: usize,
    padded_cols: usize,
    out: &mut [f32],
) {
    let bpr = padded_cols / 32;
    let rows = out
        .chunks_exact_mut(cols)
        .zip(codes.chunks_exact(padded_cols / 2));
    for ((orow, crow), srow) in rows.zip(scales.chunks_exact(bpr)) {
        for ((o, c), s) in orow.chunks_mut(32).zip(crow.chunks_exact(16)).zip(srow) {
            mx_e2m1_dequantize_block(c, s.value(), o);
        }
    }
}

/// [`E2M1::encode_slice_packed`] on full pairs (`dst.len() == src.len() / 2`).
pub(crate) fn e2m1_encode_packed(src: &[f32], dst: &mut [u8]) {
    dispatch!(
        avx2::e2m1_encode_packed(src, dst),
        e2m1_encode_packed_portable(src, dst)
    )
}

#[inline]
pub(crate) fn e2m1_encode_packed_portable(src: &[f32], dst: &mut [u8]) {
    for (d, p) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = E2M1::encode_rne_sat(p[0]) | (E2M1::encode_rne_sat(p[1]) << 4);
    }
}

/// [`E2M1::decode_slice_packed`] on full pairs (`src.len() == dst.len() / 2`).
pub(crate) fn e2m1_decode_packed(src: &[u8], dst: &mut [f32]) {
    dispatch!(
        avx2::e2m1_decode_packed(src, dst),
        e2m1_decode_packed_portable(src, dst)
    )
}

#[inline]
pub(crate) fn e2m1_decode_packed_portable(src: &[u8], dst: &mut [f32]) {
    for (p, &b) in dst.chunks_exact_mut(2).zip(src) {
        p[0] = e2m1_value(b as u32 & 0xF);
        p[1] = e2m1_value(b as u32 >> 4);
    }
}

/// [`E4M3::encode_slice_rne_sat`].
pub(crate) fn e4m3_encode(src: &[f32], dst: &mut [u8]) {
    dispatch!(avx2::e4m3_encode(src, dst), e4m3_encode_portable(src, dst))
}

#[inline]
pub(crate) fn e4m3_encode_portable(src: &[f32], dst: &mut [u8]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = E4M3::encode_rne_sat(x);
    }
}

/// [`E4M3::decode_slice`].
pub(crate) fn e4m3_decode(src: &[u8], dst: &mut [f32]) {
    dispatch!(avx2::e4m3_decode(src, dst), e4m3_decode_portable(src, dst))
}

#[inline]
pub(crate) fn e4m3_decode_portable(src: &[u8], dst: &mut [f32]) {
    for (d, &c) in dst.iter_mut().zip(src) {
        *d = e4m3_value(c as u32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvfp4;
    use alloc::vec::Vec;

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[cfg(feature = "std")]
    #[test]
    fn reports_which_path_runs() {
        // Not an assertion: the log shows whether the AVX2 kernels were exercised.
        std::println!("AVX2 kernels available: {}", has_avx2());
    }

    #[test]
    fn table_free_decoders_match_the_tables() {
        for c in 0..=255u8 {
            assert_eq!(
                ue4m3_value(c as u32).to_bits(),
                UE4M3(c).to_f32().to_bits(),
                "{c:#x}"
            );
            assert_eq!(
                e4m3_value(c as u32).to_bits(),
                E4M3(c).to_f32().to_bits(),
                "{c:#x}"
            );
        }
        for c in 0..16u8 {
            assert_eq!(
                e2m1_value(c as u32).to_bits(),
                E2M1(c).to_f32().to_bits(),
                "{c:#x}"
            );
        }
    }

    /// Deterministic mix of ordinary values, exact grid points and midpoints (of E2M1 and
    /// E4M3, both signs), subnormals, ±0, huge values, and (when `specials`) NaN and ±Inf.
    fn values(n: usize, specials: bool) -> Vec<f32> {
        let mut s = 0x1234_5678_9ABC_DEF0u64;
        let grid = [
            0.0f32,
            0.25,
            0.5,
            0.75,
            1.0,
            1.25,
            1.5,
            1.75,
            2.0,
            2.5,
            3.0,
            3.5,
            4.0,
            5.0,
            6.0,
            7.0,
            448.0,
            464.0,
            480.0,
            0.015625,
            0.0009765625,
            0.001953125,
        ];
        (0..n)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let r = s;
                let sign = if r & 1 == 0 { 1.0 } else { -1.0 };
                let uniform = ((r >> 11) as f64 / (1u64 << 53) as f64 * 16.0 - 8.0) as f32;
                match r % 9 {
                    0 => {
                        let b = (r >> 32) as u32 ^ r as u32;
                        let finite = b & 0x7F80_0000 != 0x7F80_0000;
                        f32::from_bits(if specials || finite {
                            b
                        } else {
                            b & 0xBFFF_FFFF
                        })
                    }
                    1 if specials => [f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY][i % 4],
                    1 => uniform * 1e4,
                    2 => grid[(r >> 8) as usize % grid.len()] * sign,
                    3 => f32::from_bits((r >> 40) as u32 & 0x807F_FFFF), // subnormals and ±0
                    4 => uniform * 1e-3,
                    5 => f32::from_bits(0x3C00_0000 + ((r >> 20) as u32 & 0x07FF_FFFF)) * sign,
                    _ => uniform,
                }
            })
            .collect()
    }

    #[test]
    fn amax_finite_matches_scalar() {
        for specials in [false, true] {
            let v = values(10_001, specials);
            for len in [0, 1, 15, 16, 17, 31, 32, 33, 100, 10_001] {
                let x = &v[..len];
                let reference = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                let finite = x.iter().all(|v| v.is_finite());
                for (a, f) in [amax_finite(x), amax_finite_portable(x)] {
                    assert_eq!(f, finite);
                    if finite {
                        assert_eq!(a.to_bits(), reference.to_bits());
                    }
                }
                assert_eq!(amax_slice(x).to_bits(), reference.to_bits());
            }
        }
        // A non-finite value in the vector body and in the tail.
        let mut x = values(100, false);
        for i in [3, 99] {
            let saved = x[i];
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                x[i] = bad;
                assert!(!amax_finite(&x).1 && !amax_finite_portable(&x).1);
            }
            x[i] = saved;
        }
    }

    fn scaled_matrix(rows: usize, cols: usize) -> Vec<f32> {
        let mut x = values(rows * cols, false);
        if x.len() < 264 {
            return x;
        }
        // Tiny blocks (flushed or subnormal scales), an outlier, and blocks of zeros.
        for v in &mut x[16..32] {
            *v *= 1e-9;
        }
        for v in &mut x[48..64] {
            *v *= 1e-6;
        }
        x[100] = 3.0e4;
        x[200..232].fill(0.0);
        x[232..264].fill(-0.0);
        x
    }

    #[test]
    fn nvfp4_kernels_match_the_block_primitive() {
        // 13 blocks per row: one group of 8 plus 5 single blocks.
        for (rows, cols) in [(7, 16 * 13), (3, 16 * 64), (2, 16)] {
            let x = scaled_matrix(rows, cols);
            let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let g = GlobalScale::from_amax(amax);
            let mut ref_codes = alloc::vec![0u8; rows * cols / 2];
            let mut ref_scales = Vec::new();
            for (b, out) in x.chunks_exact(16).zip(ref_codes.chunks_exact_mut(8)) {
                ref_scales.push(nvfp4::quantize_block_rne(b, &g, out).0);
            }
            let mut codes = alloc::vec![0u8; rows * cols / 2];
            let mut scales = alloc::vec![UE4M3(0); rows * cols / 16];
            nvfp4_quantize_rows(&x, cols, cols, &g, &mut codes, &mut scales);
            assert_eq!(codes, ref_codes);
            assert_eq!(bytemuck::cast_slice::<UE4M3, u8>(&scales), &ref_scales[..]);
            let mut codes = alloc::vec![0u8; rows * cols / 2];
            let mut scales = alloc::vec![0u8; rows * cols / 16];
            nvfp4_quantize_rows_portable(&x, cols, cols, &g, &mut codes, &mut scales);
            assert_eq!(codes, ref_codes);
            assert_eq!(scales, ref_scales);

            // Dequantization against the public block primitive, with every scale code
            // (including NaN 0x7F) and a negative S_dec.
            let mut scales = ref_scales.clone();
            for (i, s) in scales.iter_mut().enumerate().take(256) {
                *s = i as u8;
            }
            let ue: Vec<UE4M3> = scales.iter().map(|&s| UE4M3(s)).collect();
            for s_dec in [g.s_dec, -g.s_dec, 1.0] {
                let mut reference = alloc::vec![0.0f32; rows * cols];
                let blocks = reference
                    .chunks_exact_mut(16)
                    .zip(ref_codes.chunks_exact(8));
                for ((o, c), &s) in blocks.zip(&ue) {
                    nvfp4::dequantize_block(c, s, s_dec, o);
                }
                let mut out = alloc::vec![0.0f32; rows * cols];
                nvfp4_dequantize_rows(&ref_codes, &ue, cols, cols, s_dec, &mut out);
                assert_eq!(bits(&out), bits(&reference));
                let mut out = alloc::vec![0.0f32; rows * cols];
                nvfp4_dequantize_rows_portable(&ref_codes, &scales, cols, cols, s_dec, &mut out);
                assert_eq!(bits(&out), bits(&reference));
            }
        }
    }

    #[test]
    fn slice_kernels_match_the_generic_encoders() {
        for n in [0, 1, 2, 31, 64, 65, 130, 4099, 100_003] {
            let x = values(n, true);
            let codes: Vec<u8> = x.iter().map(|&v| E4M3::from_f32_rne_sat(v).0).collect();
            for k in [e4m3_encode, e4m3_encode_portable] {
                let mut out = alloc::vec![0u8; x.len()];
                k(&x, &mut out);
                assert_eq!(out, codes);
            }
            let pairs = x.len() / 2;
            let packed: Vec<u8> = x
                .chunks_exact(2)
                .map(|p| E2M1::from_f32_rne_sat(p[0]).0 | (E2M1::from_f32_rne_sat(p[1]).0 << 4))
                .collect();
            for k in [e2m1_encode_packed, e2m1_encode_packed_portable] {
                let mut out = alloc::vec![0u8; pairs];
                k(&x[..2 * pairs], &mut out);
                assert_eq!(out, packed);
            }
        }
        let all: Vec<u8> = (0..=255).chain(0..=255).chain(0..7).collect();
        for k in [e4m3_decode, e4m3_decode_portable] {
            let mut out = alloc::vec![0.0f32; all.len()];
            k(&all, &mut out);
            let want: Vec<f32> = all.iter().map(|&c| E4M3(c).to_f32()).collect();
            assert_eq!(bits(&out), bits(&want));
        }
        for k in [e2m1_decode_packed, e2m1_decode_packed_portable] {
            let mut out = alloc::vec![0.0f32; 2 * all.len()];
            k(&all, &mut out);
            for (i, v) in out.iter().enumerate() {
                let c = if i % 2 == 0 {
                    all[i / 2] & 0xF
                } else {
                    all[i / 2] >> 4
                };
                assert_eq!(v.to_bits(), E2M1(c).to_f32().to_bits());
            }
        }
    }

    type MxQuantize = fn(&[f32], usize, usize, ScaleRule, &mut [u8], &mut [E8M0]);
    type MxDequantize = fn(&[u8], &[E8M0], usize, usize, &mut [f32]);

    /// Every f32 bit pattern `i * stride` plus dense windows around the E2M1 and E4M3
    /// decision points and the 16-bit boundaries the AVX2 E2M1 encoder relies on.
    fn sweep(stride: u64) -> impl Iterator<Item = Vec<f32>> {
        let strided = (0..(1u64 << 32) / stride).map(move |i| (i * stride) as u32);
        let points = [
            0.25f32,
            0.75,
            1.25,
            1.75,
            2.5,
            3.5,
            5.0,
            6.0,
            0.5,
            1.0,
            2.0,
            4.0,
            448.0,
            464.0,
            2.0f32.powi(-6),
            2.0f32.powi(-9),
            2.0f32.powi(-10),
            2.0f32.powi(-7),
            f32::MAX,
            f32::INFINITY,
            f32::MIN_POSITIVE,
        ];
        let windows = points.into_iter().flat_map(|p| {
            let b = p.to_bits();
            (b.saturating_sub(70_000)..=b.saturating_add(70_000).min(0x7FFF_FFFF))
                .flat_map(|m| [m, m | 0x8000_0000])
        });
        let nans = (0x7F80_0001u32..0x7F81_0000).chain(0x7FFE_FFF0..=0x7FFF_FFFF);
        let all: Vec<u32> = strided.chain(windows).chain(nans).collect();
        (0..all.len().div_ceil(1 << 20)).map(move |k| {
            all[k << 20..((k + 1) << 20).min(all.len())]
                .iter()
                .map(|&b| f32::from_bits(b))
                .collect()
        })
    }

    fn check_slice_encoders(x: &[f32], generic: bool) {
        let mut e4 = alloc::vec![0u8; x.len()];
        e4m3_encode(x, &mut e4);
        let mut e2 = alloc::vec![0u8; x.len() / 2];
        e2m1_encode_packed(&x[..x.len() / 2 * 2], &mut e2);
        for (i, &v) in x.iter().enumerate() {
            let want4 = E4M3::encode_rne_sat(v);
            let want2 = E2M1::encode_rne_sat(v);
            assert_eq!(e4[i], want4, "E4M3 {v:e} ({:#010x})", v.to_bits());
            if i < e2.len() * 2 {
                let got2 = if i % 2 == 0 {
                    e2[i / 2] & 0xF
                } else {
                    e2[i / 2] >> 4
                };
                assert_eq!(got2, want2, "E2M1 {v:e} ({:#010x})", v.to_bits());
            }
            if generic {
                assert_eq!(want4, E4M3::from_f32_rne_sat(v).0);
                assert_eq!(want2, E2M1::from_f32_rne_sat(v).0);
            }
        }
    }

    #[test]
    fn slice_encoders_strided_f32_and_decision_points() {
        for x in sweep(997) {
            check_slice_encoders(&x, true);
        }
    }

    /// Every f32 bit pattern through the vector encoders (about 75 CPU-seconds, split over
    /// two threads).
    #[cfg(feature = "std")]
    #[test]
    fn slice_encoders_all_f32() {
        let halves: [std::thread::JoinHandle<()>; 2] = core::array::from_fn(|half| {
            std::thread::spawn(move || {
                let mut x = alloc::vec![0.0f32; 1 << 24];
                for chunk in (half as u32 * 128)..(half as u32 * 128 + 128) {
                    for (i, v) in x.iter_mut().enumerate() {
                        *v = f32::from_bits((chunk << 24) | i as u32);
                    }
                    check_slice_encoders(&x, false);
                }
            })
        });
        for h in halves {
            h.join().expect("sweep thread panicked");
        }
    }

    #[test]
    fn mx_kernels_match_the_generic_encoder() {
        // 6 blocks per row (no group of 8), and 19 (two groups of 8 plus 3 single blocks).
        for (rows, cols) in [(5, 32 * 6), (3, 32 * 19)] {
            mx_kernels_case(rows, cols);
        }
    }

    fn mx_kernels_case(rows: usize, cols: usize) {
        let mut x = scaled_matrix(rows, cols);
        x[40] = 1e30;
        x[300] = 1e-38;
        x[333] = 7.0e-45;
        for rule in [
            ScaleRule::Rceil,
            ScaleRule::Floor,
            ScaleRule::Ceil,
            ScaleRule::Even,
        ] {
            // E4M3
            let mut ref_codes = Vec::new();
            let mut ref_scales = Vec::new();
            for b in x.chunks_exact(32) {
                let s = rule.scale::<E4M3>(b.iter().fold(0.0f32, |a, v| a.max(v.abs())));
                ref_scales.push(s);
                ref_codes.extend(
                    b.iter()
                        .map(|&v| E4M3::from_f32_rne_sat(v * s.reciprocal()).0),
                );
            }
            let kernels: [MxQuantize; 2] =
                [mx_quantize_rows::<E4M3>, mx_quantize_rows_portable::<E4M3>];
            for k in kernels {
                let mut codes = alloc::vec![0u8; rows * cols];
                let mut scales = alloc::vec![E8M0(0); rows * cols / 32];
                k(&x, cols, cols, rule, &mut codes, &mut scales);
                assert_eq!(codes, ref_codes);
                assert_eq!(scales, ref_scales);
            }
            // Every code, and every scale including NaN (0xFF).
            let mut all_codes = ref_codes.clone();
            for (i, c) in all_codes.iter_mut().enumerate().take(256) {
                *c = i as u8;
            }
            let mut all_scales = ref_scales.clone();
            all_scales[1] = E8M0(0xFF);
            all_scales[2] = E8M0(0);
            all_scales[3] = E8M0(0xFE);
            let reference: Vec<u32> = all_codes
                .iter()
                .enumerate()
                .map(|(i, &c)| (E4M3(c).to_f32() * all_scales[i / 32].value()).to_bits())
                .collect();
            let kernels: [MxDequantize; 2] =
                [mx_e4m3_dequantize_rows, mx_e4m3_dequantize_rows_portable];
            for k in kernels {
                let mut out = alloc::vec![0.0f32; rows * cols];
                k(&all_codes, &all_scales, cols, cols, &mut out);
                assert_eq!(bits(&out), reference);
            }
            // E2M1 (packed)
            let mut unpacked = Vec::new();
            let mut ref_scales = Vec::new();
            for b in x.chunks_exact(32) {
                let s = rule.scale::<E2M1>(b.iter().fold(0.0f32, |a, v| a.max(v.abs())));
                ref_scales.push(s);
                unpacked.extend(
                    b.iter()
                        .map(|&v| E2M1::from_f32_rne_sat(v * s.reciprocal()).0),
                );
            }
            let ref_codes = crate::pack::pack_fp4(&unpacked);
            let kernels: [MxQuantize; 2] =
                [mx_quantize_rows::<E2M1>, mx_quantize_rows_portable::<E2M1>];
            for k in kernels {
                let mut codes = alloc::vec![0u8; rows * cols / 2];
                let mut scales = alloc::vec![E8M0(0); rows * cols / 32];
                k(&x, cols, cols, rule, &mut codes, &mut scales);
                assert_eq!(codes, ref_codes);
                assert_eq!(scales, ref_scales);
            }
            let mut all_scales = ref_scales.clone();
            all_scales[1] = E8M0(0xFF);
            all_scales[2] = E8M0(0);
            let reference: Vec<u32> = unpacked
                .iter()
                .enumerate()
                .map(|(i, &c)| (E2M1(c).to_f32() * all_scales[i / 32].value()).to_bits())
                .collect();
            let kernels: [MxDequantize; 2] =
                [mx_e2m1_dequantize_rows, mx_e2m1_dequantize_rows_portable];
            for k in kernels {
                let mut out = alloc::vec![0.0f32; rows * cols];
                k(&ref_codes, &all_scales, cols, cols, &mut out);
                assert_eq!(bits(&out), reference);
            }
        }
    }
}

//! AVX2 versions of the kernels in [`super`]: the same f32 operations in the same order on
//! eight lanes at a time, so the results are bit-identical to the portable code (checked by
//! the unit tests in [`super`]). Every function here requires AVX2: callers go through the
//! dispatchers in [`super`], which check the CPU first.
//!
//! Element encoders work on `u32` lanes (one code per lane) and narrow with
//! `packus` + a lane fix-up permute; FP4 codes are then paired into bytes as
//! `(w | w >> 4) & 0xFF` on little-endian `u16` words `lo | hi << 8`.

use core::arch::x86_64::*;

use crate::formats::{ElementFormat, E4M3, E8M0};
use crate::mx::ScaleRule;
use crate::nvfp4::GlobalScale;

use super::FastEncode;

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn splat_u(x: u32) -> __m256i {
    _mm256_set1_epi32(x as i32)
}

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn abs_ps(v: __m256) -> __m256 {
    _mm256_and_ps(v, _mm256_castsi256_ps(splat_u(0x7FFF_FFFF)))
}

/// [`E4M3::encode_rne_sat`] on eight lanes; one code (sign included) per `u32` lane. With
/// `NAN == false` the NaN check is left out (the caller guarantees non-NaN inputs).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn e4m3_codes<const NAN: bool>(v: __m256) -> __m256i {
    let bits = _mm256_castps_si256(v);
    let abs = _mm256_and_si256(bits, splat_u(0x7FFF_FFFF));
    let sign = _mm256_and_si256(_mm256_srli_epi32::<24>(bits), splat_u(0x80));
    let odd = _mm256_and_si256(_mm256_srli_epi32::<20>(abs), splat_u(1));
    let rounded = _mm256_add_epi32(abs, _mm256_add_epi32(splat_u(0x7FFFF), odd));
    let normal = _mm256_sub_epi32(_mm256_srli_epi32::<20>(rounded), splat_u(120 << 3));
    let normal = _mm256_min_epu32(normal, splat_u(0x7E));
    let sub = _mm256_add_ps(_mm256_castsi256_ps(abs), _mm256_set1_ps(16384.0));
    let sub = _mm256_sub_epi32(_mm256_castps_si256(sub), splat_u(0x4680_0000));
    let is_sub = _mm256_cmpgt_epi32(splat_u(0x3C80_0000), abs);
    let mag = _mm256_blendv_epi8(normal, sub, is_sub);
    let mag = if NAN {
        let is_nan = _mm256_cmpgt_epi32(abs, splat_u(0x7F80_0000));
        _mm256_blendv_epi8(mag, splat_u(0x7F), is_nan)
    } else {
        mag
    };
    _mm256_or_si256(mag, sign)
}

/// `lane > t` on signed 16-bit lanes, as -1 / 0.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn gt16(v: __m256i, t: i16) -> __m256i {
    _mm256_cmpgt_epi16(v, _mm256_set1_epi16(t))
}

/// [`crate::E2M1::encode_rne_sat`] of 16 values, one code per 16-bit lane, in the lane order of
/// `_mm256_packus_epi32(v0, v1)` (`v0[0..4], v1[0..4], v0[4..8], v1[4..8]`).
///
/// Every E2M1 decision threshold `T` (0.25, 0.75, ..., 5.0) has zero low 16 bits, so on the
/// magnitude bits `a`: `a >= T` iff `floor(a / 2^16) >= T >> 16` and `a > T` iff
/// `ceil(a / 2^16) > T >> 16`. Comparing those 16-bit halves does the comparisons of
/// `encode_rne_sat` sixteen at a time. Inf has `a >> 16 = 0x7F80` and compares like any
/// large value; with `NAN == false` the caller guarantees no NaN input, with `NAN == true`
/// NaN gives `0x7` as in the scalar code.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn e2m1_codes16<const NAN: bool>(v0: __m256, v1: __m256) -> __m256i {
    let (b0, b1) = (_mm256_castps_si256(v0), _mm256_castps_si256(v1));
    let abs = splat_u(0x7FFF_FFFF);
    let round = splat_u(0xFFFF);
    let c0 = _mm256_srli_epi32::<16>(_mm256_add_epi32(_mm256_and_si256(b0, abs), round));
    let c1 = _mm256_srli_epi32::<16>(_mm256_add_epi32(_mm256_and_si256(b1, abs), round));
    // ceil(|v| / 2^16); at most 0x8000 (only for NaN), so packus does not saturate.
    let hc = _mm256_packus_epi32(c0, c1);
    // The high halves with the sign: sign in bit 15, floor(|v| / 2^16) below it.
    let hr = _mm256_packus_epi32(_mm256_srli_epi32::<16>(b0), _mm256_srli_epi32::<16>(b1));
    let h = _mm256_and_si256(hr, _mm256_set1_epi16(0x7FFF));
    // Start from the sign (8) and add one per threshold passed (a true compare is -1).
    let acc = _mm256_and_si256(_mm256_srli_epi16::<12>(hr), _mm256_set1_epi16(8));
    let acc = _mm256_sub_epi16(acc, gt16(hc, 0x3E80)); // > 0.25
    let acc = _mm256_sub_epi16(acc, gt16(h, 0x3F3F)); // >= 0.75
    let acc = _mm256_sub_epi16(acc, gt16(hc, 0x3FA0)); // > 1.25
    let acc = _mm256_sub_epi16(acc, gt16(h, 0x3FDF)); // >= 1.75
    let acc = _mm256_sub_epi16(acc, gt16(hc, 0x4020)); // > 2.5
    let acc = _mm256_sub_epi16(acc, gt16(h, 0x405F)); // >= 3.5
    let acc = _mm256_sub_epi16(acc, gt16(hc, 0x40A0)); // > 5.0
    if NAN {
        // NaN: |v| > 0x7F800000, i.e. ceil(|v| / 2^16) >= 0x7F81 (unsigned).
        let top = _mm256_set1_epi16(0x7F81);
        let is_nan = _mm256_cmpeq_epi16(_mm256_max_epu16(hc, top), hc);
        _mm256_blendv_epi8(acc, _mm256_set1_epi16(7), is_nan)
    } else {
        acc
    }
}

/// [`crate::E2M1::encode_rne_sat`] of 32 ordered values (four vectors), as 32 ordered bytes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn e2m1_bytes32<const NAN: bool>(v: [__m256; 4]) -> __m256i {
    let lo = e2m1_codes16::<NAN>(v[0], v[1]);
    let hi = e2m1_codes16::<NAN>(v[2], v[3]);
    fix_order(_mm256_packus_epi16(lo, hi))
}

/// Undoes the lane interleave of `packus_epi16(packus_epi32(a, b), packus_epi32(c, d))`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn fix_order(bytes: __m256i) -> __m256i {
    _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// Narrows 32 codes (`u32` lanes, each `< 256`, in four vectors in order) to 32 bytes in
/// order.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn narrow32(a: __m256i, b: __m256i, c: __m256i, d: __m256i) -> __m256i {
    let ab = _mm256_packus_epi32(a, b);
    let cd = _mm256_packus_epi32(c, d);
    fix_order(_mm256_packus_epi16(ab, cd))
}

/// Pairs 32 ordered 4-bit codes (one per byte) into 16 bytes, element `2i` in the low
/// nibble; the result sits in the `u16` lanes' low bytes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn nibble_pairs(codes: __m256i) -> __m256i {
    _mm256_and_si256(
        _mm256_or_si256(codes, _mm256_srli_epi16::<4>(codes)),
        _mm256_set1_epi16(0xFF),
    )
}

/// Packs 64 ordered 4-bit codes (one per byte, two vectors) into 32 bytes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn pack64(lo: __m256i, hi: __m256i) -> __m256i {
    let p = _mm256_packus_epi16(nibble_pairs(lo), nibble_pairs(hi));
    _mm256_permute4x64_epi64::<0xD8>(p)
}

/// Packs 32 ordered 4-bit codes (one per byte) into 16 bytes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn pack32(codes: __m256i) -> __m128i {
    let p = _mm256_packus_epi16(nibble_pairs(codes), _mm256_setzero_si256());
    _mm256_castsi256_si128(_mm256_permute4x64_epi64::<0xD8>(p))
}

/// Largest of eight lanes (all finite).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn hmax(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_shuffle_ps::<0b01>(m, m));
    _mm_cvtss_f32(m)
}

/// Lane-wise `[max(a0, a1), max(a2, a3), max(b0, b1), max(b2, b3)]` per 128-bit half.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn pair_max(a: __m256, b: __m256) -> __m256 {
    _mm256_max_ps(
        _mm256_shuffle_ps::<0x88>(a, b),
        _mm256_shuffle_ps::<0xDD>(a, b),
    )
}

/// See [`super::amax_finite`]: the maximum of the absolute values' bits, which orders
/// non-negative floats correctly and puts Inf and NaN above every finite value.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn amax_finite(data: &[f32]) -> (f32, bool) {
    let mask = splat_u(0x7FFF_FFFF);
    let mut m = [_mm256_setzero_si256(); 4];
    let chunks = data.chunks_exact(32);
    let rest = chunks.remainder();
    for c in chunks {
        let p = c.as_ptr() as *const __m256i;
        for (k, m) in m.iter_mut().enumerate() {
            *m = _mm256_max_epu32(*m, _mm256_and_si256(_mm256_loadu_si256(p.add(k)), mask));
        }
    }
    let v = _mm256_max_epu32(_mm256_max_epu32(m[0], m[1]), _mm256_max_epu32(m[2], m[3]));
    let mut lanes = [0u32; 8];
    _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, v);
    let mut top = lanes.iter().fold(0, |a, &b| a.max(b));
    for v in rest {
        top = top.max(v.to_bits() & 0x7FFF_FFFF);
    }
    (f32::from_bits(top), top < 0x7F80_0000)
}

/// Lane `j` = the largest lane of `m[j]` (all finite): a transposing reduction.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn max_lanes8(m: [__m256; 8]) -> __m256 {
    let q0 = pair_max(pair_max(m[0], m[1]), pair_max(m[2], m[3]));
    let q1 = pair_max(pair_max(m[4], m[5]), pair_max(m[6], m[7]));
    _mm256_max_ps(
        _mm256_permute2f128_ps::<0x20>(q0, q1),
        _mm256_permute2f128_ps::<0x31>(q0, q1),
    )
}

/// The scales of eight NVFP4 blocks (see `super::nvfp4_block8`): writes the UE4M3 codes and
/// returns the encode factors `enc_b`. Inputs must be finite.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn nvfp4_scales8(x: &[f32; 128], g: &GlobalScale, scales: &mut [u8; 8]) -> __m256 {
    let p = x.as_ptr();
    let mut m = [_mm256_setzero_ps(); 8];
    for (j, m) in m.iter_mut().enumerate() {
        let a = abs_ps(_mm256_loadu_ps(p.add(16 * j)));
        let b = abs_ps(_mm256_loadu_ps(p.add(16 * j + 8)));
        *m = _mm256_max_ps(a, b);
    }
    let amax = max_lanes8(m);
    // s = min(amax * block_factor, FLT_MAX); vminps returns FLT_MAX for NaN, like f32::min.
    let s = _mm256_min_ps(
        _mm256_mul_ps(amax, _mm256_set1_ps(g.block_factor)),
        _mm256_set1_ps(f32::MAX),
    );
    let code = e4m3_codes::<false>(s);
    // UE4M3 value of the code (see `super::ue4m3_value`).
    let c = _mm256_and_si256(code, splat_u(0x7F));
    let normal = _mm256_castsi256_ps(_mm256_add_epi32(
        _mm256_slli_epi32::<20>(c),
        splat_u(120 << 23),
    ));
    let sub = _mm256_mul_ps(_mm256_cvtepi32_ps(c), _mm256_set1_ps(1.0 / 512.0));
    let value = _mm256_blendv_ps(
        normal,
        sub,
        _mm256_castsi256_ps(_mm256_cmpgt_epi32(splat_u(8), c)),
    );
    let is_nan = _mm256_castsi256_ps(_mm256_cmpeq_epi32(c, splat_u(0x7F)));
    let value = _mm256_blendv_ps(value, _mm256_set1_ps(f32::NAN), is_nan);
    let enc = _mm256_div_ps(
        _mm256_set1_ps(1.0),
        _mm256_mul_ps(value, _mm256_set1_ps(g.s_dec)),
    );
    let mut codes = [0u32; 8];
    _mm256_storeu_si256(codes.as_mut_ptr() as *mut __m256i, code);
    for (s, c) in scales.iter_mut().zip(codes) {
        *s = c as u8;
    }
    _mm256_min_ps(enc, _mm256_set1_ps(f32::MAX))
}

/// The E2M1 codes of eight NVFP4 blocks, lane `j` of `enc` scaling block `j`. Inputs must be
/// finite.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn nvfp4_encode8(x: &[f32; 128], enc: __m256, out: &mut [u8; 64]) {
    let p = x.as_ptr();
    let o = out.as_mut_ptr() as *mut __m256i;
    for quad in 0..2 {
        // Blocks 4q .. 4q + 3: 64 codes, 32 packed bytes.
        let mut bytes = [_mm256_setzero_si256(); 2];
        for (k, b) in bytes.iter_mut().enumerate() {
            let mut v = [_mm256_setzero_ps(); 4];
            for (i, v) in v.iter_mut().enumerate() {
                let j = 4 * quad + 2 * k + i / 2;
                let e = _mm256_permutevar8x32_ps(enc, splat_u(j as u32));
                *v = _mm256_mul_ps(_mm256_loadu_ps(p.add(16 * j + 8 * (i % 2))), e);
            }
            *b = e2m1_bytes32::<false>(v);
        }
        _mm256_storeu_si256(o.add(quad), pack64(bytes[0], bytes[1]));
    }
}

/// Groups of eight blocks whose scales are computed before any of their elements are
/// encoded: the scale arithmetic is a long dependency chain (amax, E4M3 encode, decode,
/// division), and computing a few groups' scales back to back lets them overlap. Four was
/// fastest for both NVFP4 and MX on the 4096 x 4096 benchmark (1: 15-20% slower, 16: the
/// loads stop overlapping with the encoding and MX gets 20% slower).
const GROUPS_PER_PASS: usize = 4;

/// See [`super::nvfp4_quantize_rows`]. Inputs must be finite.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn nvfp4_quantize_rows(
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
    let mut enc = [_mm256_setzero_ps(); GROUPS_PER_PASS];
    for ((row, crow), srow) in rows.zip(scales.chunks_exact_mut(bpr)) {
        let groups = full / 8;
        let mut first = 0;
        while first < groups {
            let n = (groups - first).min(GROUPS_PER_PASS);
            for (k, enc) in enc.iter_mut().enumerate().take(n) {
                let i = first + k;
                let x = row[128 * i..][..128].try_into().unwrap();
                let s = (&mut srow[8 * i..][..8]).try_into().unwrap();
                *enc = nvfp4_scales8(x, g, s);
            }
            for (k, &enc) in enc.iter().enumerate().take(n) {
                let i = first + k;
                let x = row[128 * i..][..128].try_into().unwrap();
                let c = (&mut crow[64 * i..][..64]).try_into().unwrap();
                nvfp4_encode8(x, enc, c);
            }
            first += n;
        }
        // Fewer than eight blocks left in the row.
        let x1 = row[128 * groups..16 * full].chunks_exact(16);
        let c1 = crow[64 * groups..8 * full].chunks_exact_mut(8);
        for ((x, c), s) in x1.zip(c1).zip(&mut srow[8 * groups..full]) {
            *s = super::nvfp4_block(x.try_into().unwrap(), g, c.try_into().unwrap());
        }
    }
}

/// Table of the eight E2M1 magnitudes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn e2m1_magnitudes() -> __m256 {
    _mm256_setr_ps(0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
}

/// Decodes 8 packed bytes (16 codes) through a table of the eight magnitudes `t` (already
/// multiplied by the scales, which are not NaN) and stores 16 floats. The sign is applied
/// with XOR, which reproduces the sign rule of the products `(±m) * s * s_dec` exactly.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn e2m1_decode16(bytes: *const u8, t: __m256, out: *mut f32) {
    let v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(bytes as *const __m128i));
    let sign = splat_u(0x8000_0000);
    let lo_sign = _mm256_and_si256(_mm256_slli_epi32::<28>(v), sign);
    let hi_sign = _mm256_and_si256(_mm256_slli_epi32::<24>(v), sign);
    let lo = _mm256_permutevar8x32_ps(t, v);
    let hi = _mm256_permutevar8x32_ps(t, _mm256_srli_epi32::<4>(v));
    let lo = _mm256_xor_ps(lo, _mm256_castsi256_ps(lo_sign));
    let hi = _mm256_xor_ps(hi, _mm256_castsi256_ps(hi_sign));
    let a = _mm256_unpacklo_ps(lo, hi);
    let b = _mm256_unpackhi_ps(lo, hi);
    _mm256_storeu_ps(out, _mm256_permute2f128_ps::<0x20>(a, b));
    _mm256_storeu_ps(out.add(8), _mm256_permute2f128_ps::<0x31>(a, b));
}

/// See [`super::nvfp4_dequantize_rows`].
#[target_feature(enable = "avx2")]
pub(super) unsafe fn nvfp4_dequantize_rows(
    codes: &[u8],
    scales: &[u8],
    cols: usize,
    padded_cols: usize,
    s_dec: f32,
    out: &mut [f32],
) {
    let bpr = padded_cols / 16;
    let t = e2m1_magnitudes();
    let rows = out
        .chunks_exact_mut(cols)
        .zip(codes.chunks_exact(padded_cols / 2));
    for ((orow, crow), srow) in rows.zip(scales.chunks_exact(bpr)) {
        let mut o16 = orow.chunks_exact_mut(16);
        for ((o, c), &s) in (&mut o16).zip(crow.chunks_exact(8)).zip(srow) {
            let o: &mut [f32; 16] = o.try_into().unwrap();
            let c: &[u8; 8] = c.try_into().unwrap();
            let sf = super::ue4m3_value(s as u32);
            if sf.is_nan() {
                super::nvfp4_dequantize_block(c, sf, s_dec, o);
            } else {
                let ts = _mm256_mul_ps(_mm256_mul_ps(t, _mm256_set1_ps(sf)), _mm256_set1_ps(s_dec));
                e2m1_decode16(c.as_ptr(), ts, o.as_mut_ptr());
            }
        }
        super::nvfp4_dequantize_tail(o16.into_remainder(), crow, srow, cols, s_dec);
    }
}

/// The largest absolute value of each 8-lane quarter of a 32-block: one vector whose
/// lanes reduce to the block amax (finite values).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn amax32_lanes(p: *const f32) -> __m256 {
    let a = _mm256_max_ps(
        abs_ps(_mm256_loadu_ps(p)),
        abs_ps(_mm256_loadu_ps(p.add(8))),
    );
    let b = _mm256_max_ps(
        abs_ps(_mm256_loadu_ps(p.add(16))),
        abs_ps(_mm256_loadu_ps(p.add(24))),
    );
    _mm256_max_ps(a, b)
}

/// [`ScaleRule::scale`] with [`ScaleRule::Rceil`] for eight (finite, non-negative) block
/// amaxes, and the scales' reciprocals ([`E8M0::reciprocal`]).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn rceil8<F: ElementFormat>(amax: __m256) -> (__m256i, __m256) {
    let d = _mm256_mul_ps(amax, _mm256_set1_ps(1.0 / F::MAX));
    let bits = _mm256_and_si256(_mm256_castps_si256(d), splat_u(0x7FFF_FFFF));
    let exp = _mm256_srli_epi32::<23>(bits);
    let man = _mm256_and_si256(bits, splat_u(0x7F_FFFF));
    let zero = _mm256_setzero_si256();
    // exp + (man != 0); for exp == 0, (man > 0x400000).
    let normal = _mm256_add_epi32(
        _mm256_add_epi32(exp, splat_u(1)),
        _mm256_cmpeq_epi32(man, zero),
    );
    let sub = _mm256_sub_epi32(zero, _mm256_cmpgt_epi32(man, splat_u(0x40_0000)));
    let b = _mm256_blendv_epi8(normal, sub, _mm256_cmpeq_epi32(exp, zero));
    // at most mx::max_scale::<F>() (<= 0xFE): F::MAX times the scale stays finite
    let b = _mm256_min_epu32(b, splat_u(crate::mx::max_scale::<F>().0 as u32));
    // reciprocal: 2^(127 - (b - 127)) = code 254 - b; code 0 is the f32 subnormal 2^-127.
    let c = _mm256_sub_epi32(splat_u(254), b);
    let inv = _mm256_blendv_epi8(
        _mm256_slli_epi32::<23>(c),
        splat_u(0x0040_0000),
        _mm256_cmpeq_epi32(c, zero),
    );
    (b, _mm256_castsi256_ps(inv))
}

/// Encodes one 32-block scaled by `inv` into `out` (32 bytes for E4M3, 16 packed bytes for
/// E2M1). Inputs must be finite.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn mx_encode_block<F: FastEncode>(p: *const f32, inv: __m256, out: *mut u8) {
    let mut v = [_mm256_setzero_ps(); 4];
    for (k, v) in v.iter_mut().enumerate() {
        *v = _mm256_mul_ps(_mm256_loadu_ps(p.add(8 * k)), inv);
    }
    if F::BITS == 8 {
        let q = [
            e4m3_codes::<false>(v[0]),
            e4m3_codes::<false>(v[1]),
            e4m3_codes::<false>(v[2]),
            e4m3_codes::<false>(v[3]),
        ];
        _mm256_storeu_si256(out as *mut __m256i, narrow32(q[0], q[1], q[2], q[3]));
    } else {
        _mm_storeu_si128(out as *mut __m128i, pack32(e2m1_bytes32::<false>(v)));
    }
}

/// The scales of eight MX blocks (written to `s`) and their reciprocals (returned).
/// RCEIL runs on the vector of block amaxes; other rules use the scalar
/// [`ScaleRule::scale`]. Inputs must be finite.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn mx_scales8<F: FastEncode>(x: &[f32; 256], rule: ScaleRule, s: &mut [E8M0; 8]) -> __m256 {
    let p = x.as_ptr();
    let mut m = [_mm256_setzero_ps(); 8];
    for (j, m) in m.iter_mut().enumerate() {
        *m = amax32_lanes(p.add(32 * j));
    }
    let amax = max_lanes8(m);
    if rule == ScaleRule::Rceil {
        let (b, inv) = rceil8::<F>(amax);
        let mut lanes = [0u32; 8];
        _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, b);
        for (s, b) in s.iter_mut().zip(lanes) {
            *s = E8M0(b as u8);
        }
        inv
    } else {
        let mut a = [0.0f32; 8];
        _mm256_storeu_ps(a.as_mut_ptr(), amax);
        let mut inv = [0.0f32; 8];
        for j in 0..8 {
            s[j] = rule.scale::<F>(a[j]);
            inv[j] = s[j].reciprocal();
        }
        _mm256_loadu_ps(inv.as_ptr())
    }
}

/// See [`super::mx_quantize_rows`]: E4M3 (one byte per code) or E2M1 (packed). Inputs must
/// be finite. Blocks go eight at a time so that amax reductions and RCEIL scales run on
/// vectors of blocks; other scale rules use the scalar [`ScaleRule::scale`].
#[target_feature(enable = "avx2")]
pub(super) unsafe fn mx_quantize_rows<F: FastEncode>(
    data: &[f32],
    cols: usize,
    padded_cols: usize,
    rule: ScaleRule,
    codes: &mut [u8],
    scales: &mut [E8M0],
) {
    let full = cols / 32;
    let bpr = padded_cols / 32;
    let block_bytes = F::BITS as usize * 4;
    let row_bytes = padded_cols / 32 * block_bytes;
    let rows = data
        .chunks_exact(cols)
        .zip(codes.chunks_exact_mut(row_bytes));
    let mut invs = [_mm256_setzero_ps(); GROUPS_PER_PASS];
    for ((row, crow), srow) in rows.zip(scales.chunks_exact_mut(bpr)) {
        let groups = full / 8;
        let mut first = 0;
        while first < groups {
            let n = (groups - first).min(GROUPS_PER_PASS);
            for (k, inv) in invs.iter_mut().enumerate().take(n) {
                let i = first + k;
                let x: &[f32; 256] = row[256 * i..][..256].try_into().unwrap();
                let s: &mut [E8M0; 8] = (&mut srow[8 * i..][..8]).try_into().unwrap();
                *inv = mx_scales8::<F>(x, rule, s);
            }
            for (k, &inv) in invs.iter().enumerate().take(n) {
                let i = first + k;
                let p = row[256 * i..][..256].as_ptr();
                let c = crow[8 * block_bytes * i..][..8 * block_bytes].as_mut_ptr();
                for j in 0..8 {
                    let e = _mm256_permutevar8x32_ps(inv, splat_u(j as u32));
                    mx_encode_block::<F>(p.add(32 * j), e, c.add(block_bytes * j));
                }
            }
            first += n;
        }
        // Fewer than eight blocks left in the row.
        let x1 = row[256 * groups..32 * full].chunks_exact(32);
        let c1 = crow[8 * block_bytes * groups..block_bytes * full].chunks_exact_mut(block_bytes);
        for ((x, c), s) in x1.zip(c1).zip(&mut srow[8 * groups..full]) {
            let p = x.as_ptr();
            *s = rule.scale::<F>(hmax(amax32_lanes(p)));
            mx_encode_block::<F>(p, _mm256_set1_ps(s.reciprocal()), c.as_mut_ptr());
        }
    }
}

/// E4M3 values of 8 codes (bits identical to the decode table, NaN included).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn e4m3_values8(bytes: *const u8) -> __m256 {
    let v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(bytes as *const __m128i));
    let sign = _mm256_slli_epi32::<24>(_mm256_and_si256(v, splat_u(0x80)));
    let c = _mm256_and_si256(v, splat_u(0x7F));
    let normal = _mm256_castsi256_ps(_mm256_add_epi32(
        _mm256_slli_epi32::<20>(c),
        splat_u(120 << 23),
    ));
    let sub = _mm256_mul_ps(_mm256_cvtepi32_ps(c), _mm256_set1_ps(1.0 / 512.0));
    let mag = _mm256_blendv_ps(
        normal,
        sub,
        _mm256_castsi256_ps(_mm256_cmpgt_epi32(splat_u(8), c)),
    );
    let is_nan = _mm256_castsi256_ps(_mm256_cmpeq_epi32(c, splat_u(0x7F)));
    let mag = _mm256_blendv_ps(mag, _mm256_set1_ps(f32::NAN), is_nan);
    _mm256_or_ps(mag, _mm256_castsi256_ps(sign))
}

/// See [`super::mx_e4m3_dequantize_rows`].
#[target_feature(enable = "avx2")]
pub(super) unsafe fn mx_e4m3_dequantize_rows(
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
            if o.len() == 32 {
                let sv = _mm256_set1_ps(s);
                for k in 0..4 {
                    let v = _mm256_mul_ps(e4m3_values8(c.as_ptr().add(8 * k)), sv);
                    _mm256_storeu_ps(o.as_mut_ptr().add(8 * k), v);
                }
            } else {
                for (o, &c) in o.iter_mut().zip(c) {
                    *o = E4M3(c).to_f32() * s;
                }
            }
        }
    }
}

/// See [`super::mx_e2m1_dequantize_rows`].
#[target_feature(enable = "avx2")]
pub(super) unsafe fn mx_e2m1_dequantize_rows(
    codes: &[u8],
    scales: &[E8M0],
    cols: usize,
    padded_cols: usize,
    out: &mut [f32],
) {
    let bpr = padded_cols / 32;
    let t = e2m1_magnitudes();
    let rows = out
        .chunks_exact_mut(cols)
        .zip(codes.chunks_exact(padded_cols / 2));
    for ((orow, crow), srow) in rows.zip(scales.chunks_exact(bpr)) {
        for ((o, c), s) in orow.chunks_mut(32).zip(crow.chunks_exact(16)).zip(srow) {
            let s = s.value();
            if o.len() == 32 && !s.is_nan() {
                let ts = _mm256_mul_ps(t, _mm256_set1_ps(s));
                e2m1_decode16(c.as_ptr(), ts, o.as_mut_ptr());
                e2m1_decode16(c.as_ptr().add(8), ts, o.as_mut_ptr().add(16));
            } else {
                super::mx_e2m1_dequantize_block(c, s, o);
            }
        }
    }
}

/// See [`super::e2m1_encode_packed`].
#[target_feature(enable = "avx2")]
pub(super) unsafe fn e2m1_encode_packed(src: &[f32], dst: &mut [u8]) {
    let mut s64 = src.chunks_exact(64);
    let mut d32 = dst.chunks_exact_mut(32);
    for (s, d) in (&mut s64).zip(&mut d32) {
        let p = s.as_ptr();
        let mut v = [_mm256_setzero_ps(); 8];
        for (k, v) in v.iter_mut().enumerate() {
            *v = _mm256_loadu_ps(p.add(8 * k));
        }
        let lo = e2m1_bytes32::<true>([v[0], v[1], v[2], v[3]]);
        let hi = e2m1_bytes32::<true>([v[4], v[5], v[6], v[7]]);
        _mm256_storeu_si256(d.as_mut_ptr() as *mut __m256i, pack64(lo, hi));
    }
    super::e2m1_encode_packed_portable(s64.remainder(), d32.into_remainder());
}

/// See [`super::e2m1_decode_packed`].
#[target_feature(enable = "avx2")]
pub(super) unsafe fn e2m1_decode_packed(src: &[u8], dst: &mut [f32]) {
    let t = e2m1_magnitudes();
    let mut s8 = src.chunks_exact(8);
    let mut d16 = dst.chunks_exact_mut(16);
    for (s, d) in (&mut s8).zip(&mut d16) {
        e2m1_decode16(s.as_ptr(), t, d.as_mut_ptr());
    }
    super::e2m1_decode_packed_portable(s8.remainder(), d16.into_remainder());
}

/// See [`super::e4m3_encode`].
#[target_feature(enable = "avx2")]
pub(super) unsafe fn e4m3_encode(src: &[f32], dst: &mut [u8]) {
    let mut s32 = src.chunks_exact(32);
    let mut d32 = dst.chunks_exact_mut(32);
    for (s, d) in (&mut s32).zip(&mut d32) {
        let p = s.as_ptr();
        let mut q = [_mm256_setzero_si256(); 4];
        for (k, q) in q.iter_mut().enumerate() {
            *q = e4m3_codes::<true>(_mm256_loadu_ps(p.add(8 * k)));
        }
        _mm256_storeu_si256(
            d.as_mut_ptr() as *mut __m256i,
            narrow32(q[0], q[1], q[2], q[3]),
        );
    }
    super::e4m3_encode_portable(s32.remainder(), d32.into_remainder());
}

/// See [`super::e4m3_decode`].
#[target_feature(enable = "avx2")]
pub(super) unsafe fn e4m3_decode(src: &[u8], dst: &mut [f32]) {
    let mut s8 = src.chunks_exact(8);
    let mut d8 = dst.chunks_exact_mut(8);
    for (s, d) in (&mut s8).zip(&mut d8) {
        _mm256_storeu_ps(d.as_mut_ptr(), e4m3_values8(s.as_ptr()));
    }
    super::e4m3_decode_portable(s8.remainder(), d8.into_remainder());
}

//! Element rounding in the f32 domain, shared by the fused MX kernels (`mx/fast.rs`) and the
//! per-tensor FP8 cast (`fp8/fast.rs`): saturating round-to-nearest-even and stochastic
//! rounding of a scaled value onto the grid of a small float format, written as the f32 grid
//! value (or its code) with no encoder, decoder, look-up table or buffer.
//!
//! Every one of these element formats is a sign-magnitude grid with `m` mantissa bits,
//! normals from `2^emin` on and subnormals of spacing `2^(emin - m)`, whose largest finite
//! value `MAX` is a grid point and whose codes above `MAX` (if any) are Inf / NaN.
//! Saturating RNE then is: `a = min(|y|, MAX)` ([`split`]; Inf gives `MAX`, as the encoder's
//! saturation does for every value above `MAX`, including those that would round to the
//! next binade or to a NaN code), then round `a` to the grid spacing of its binade,
//! `step = max(2^floor(log2 a), 2^emin) · 2^-m`, by the magic-number addition
//! `fl(fl(a + C) - C)` with `C = step · 2^23` ([`grid_rne`]): `a + C` lies in `[C, 2C)`,
//! whose f32 spacing is `step`, so the f32 addition rounds `a` to the grid with ties to the
//! even multiple of `step`, which is the even code (the code's last bit is the multiple's
//! last bit); a value that rounds up across a binade gives the next power of two exactly; 0
//! stays 0. The caller puts the sign of `y` back on the (non-negative) grid value (or on a
//! product of it with a scale), so `-0.0` and negative values that round to zero give
//! `-0.0`, as the decoder's negative-zero code does.
//!
//! Stochastic rounding ([`grid_sr`]) uses the encoder's rule `up ⇔ r + floor(256 f) ≥ 256`
//! (`f` the fraction of `a / step`): `t = a / step` is exact (a power-of-two multiply), its
//! floor comes from the magic number `2^23`, `frac(t) · 256` is exact, and
//! `up ⇔ 256 f ≥ 256 - r`.
//!
//! The element code of a grid value `v` ([`grid_code`]) is read off its f32 bits: the
//! exponent and the top `m` mantissa bits, rebased, for normals; `v / 2^(emin - m)` (the bits
//! of `v + 2^emin`) for subnormals.
//!
//! NaN is outside the domain of these functions ([`split`] maps it to `MAX`): MX rejects
//! non-finite input and the FP8 cast selects the NaN result separately.
//!
//! Tested bit for bit against fp-formats' encoder and decoder: RNE for every f32 bit pattern
//! in the non-trivial range of each format (`mx/fast.rs`), SR on every decision point for
//! all 256 random bytes (`mx/tests.rs`).

use fp_formats::{ElementFormat, E2M1, E2M3, E3M2, E4M3, E5M2};

/// An element format with the grid constants of the f32-domain rounding (E4M3, E5M2, E2M3,
/// E3M2, E2M1) and, for the MX tests, the exact RNE cast of a block of scaled values that
/// the MX codes path used before the fused kernels (the reference).
pub(crate) trait Elem: ElementFormat {
    /// Unbiased exponent of the smallest normal value (`1 - bias`).
    const EMIN: i32;
    /// The f32 bits of `2^EMIN`.
    const MIN_NORMAL_BITS: u32 = ((127 + Self::EMIN) as u32) << 23;

    /// Saturating RNE codes of a block of scaled values (the reference encoder).
    #[cfg(test)]
    #[inline(always)]
    fn rne_block(y: &[f32; fp_formats::mx::BLOCK], out: &mut [u8]) {
        for (o, &v) in out.iter_mut().zip(y) {
            *o = Self::from_f32_rne_sat(v).to_bits();
        }
    }
}
impl Elem for E4M3 {
    const EMIN: i32 = -6;
    #[cfg(test)]
    #[inline(always)]
    fn rne_block(y: &[f32; fp_formats::mx::BLOCK], out: &mut [u8]) {
        // fp-formats' slice encoder (AVX2 when available), bit-identical to encode_rne_sat.
        E4M3::encode_slice_rne_sat(y, out);
    }
}
impl Elem for E2M1 {
    const EMIN: i32 = 0;
    #[cfg(test)]
    #[inline(always)]
    fn rne_block(y: &[f32; fp_formats::mx::BLOCK], out: &mut [u8]) {
        for (o, &v) in out.iter_mut().zip(y) {
            *o = E2M1::encode_rne_sat(v);
        }
    }
}
impl Elem for E5M2 {
    const EMIN: i32 = -14;
}
impl Elem for E2M3 {
    const EMIN: i32 = 0;
}
impl Elem for E3M2 {
    const EMIN: i32 = -2;
}

/// `a > b ? a : b` (one `maxps`: `b` when either is NaN, so `max(x, acc)` ignores a NaN
/// `x`).
#[inline(always)]
pub(crate) fn max(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// `2^max(floor(log2 a), emin)` of a non-negative `a` (`2^emin` for 0 and f32 subnormals).
#[inline(always)]
fn binade<F: Elem>(a: f32) -> f32 {
    max(
        f32::from_bits(a.to_bits() & 0x7F80_0000),
        f32::from_bits(F::MIN_NORMAL_BITS),
    )
}

/// `a` (in `[0, F::MAX]`) rounded to nearest even on `F`'s grid (see the module docs).
#[inline(always)]
pub(crate) fn grid_rne<F: Elem>(a: f32) -> f32 {
    // C = 2^max(floor(log2 a), emin) · 2^(23 - m): its f32 spacing is the grid step.
    let c = f32::from_bits(binade::<F>(a).to_bits() + ((23 - F::MANTISSA_BITS) << 23));
    (a + c) - c
}

/// `a` (in `[0, F::MAX]`) stochastically rounded onto `F`'s grid with the random byte `r`:
/// up iff `r + floor(256 · frac(a / step)) >= 256` (see the module docs).
#[inline(always)]
pub(crate) fn grid_sr<F: Elem>(a: f32, r: u8) -> f32 {
    let eb = binade::<F>(a).to_bits();
    let m = F::MANTISSA_BITS << 23;
    let step = f32::from_bits(eb - m);
    let inv_step = f32::from_bits((254 << 23) - eb + m);
    // t = a / step <= 2^(m + 1), exact; its floor by the magic number (nearest even, then
    // one down if above t); the fraction and its product by 256 are exact.
    let t = a * inv_step;
    let n = (t + 8_388_608.0) - 8_388_608.0;
    let fl = if n > t { n - 1.0 } else { n };
    let up = if (t - fl) * 256.0 >= 256.0 - r as f32 {
        1.0
    } else {
        0.0
    };
    (fl + up) * step
}

/// `min(|y|, MAX)` (Inf, and NaN, give `MAX`) and the sign bit of `y`.
#[inline(always)]
pub(crate) fn split<F: Elem>(y: f32) -> (f32, u32) {
    let bits = y.to_bits();
    let ay = f32::from_bits(bits & 0x7FFF_FFFF);
    let a = if ay < F::MAX { ay } else { F::MAX };
    (a, bits & 0x8000_0000)
}

/// The magnitude code of a grid value `v` in `[0, MAX]`: the f32 exponent and top `m`
/// mantissa bits rebased for normals, `v / 2^(emin - m)` (read off the bits of
/// `v + 2^emin`) for subnormals.
#[inline(always)]
pub(crate) fn grid_code<F: Elem>(v: f32) -> u32 {
    let m = F::MANTISSA_BITS;
    let min_normal = f32::from_bits(F::MIN_NORMAL_BITS);
    let normal = (v.to_bits() >> (23 - m)).wrapping_sub(((127 + F::EMIN - 1) as u32) << m);
    let sub = ((v + min_normal).to_bits() >> (23 - m)).wrapping_sub(F::MIN_NORMAL_BITS >> (23 - m));
    if v < min_normal {
        sub
    } else {
        normal
    }
}

/// The steps shared by the AVX-512 kernels of NVFP4 (`nvfp4/avx512.rs`) and MX
/// (`mx/avx512.rs`) on 16 lanes, with this module's scalar arithmetic: stochastic rounding of
/// magnitudes on a grid of known step, the signed product with the block scale, and the
/// amaxes of 16 blocks at once.
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use std::arch::x86_64::*;

    /// [`super::grid_sr`]'s rounding of `a` (non-negative) onto the multiples of `step` (a
    /// power of two; `inv_step` its reciprocal), up iff `floor(256 · frac(a / step)) + r >=
    /// 256` for the random byte `r` of each lane, in integers: `floor(t) + up` is
    /// `(floor(256 · t) + r) >> 8` with `t = a / step` (`256 · t` is exact and below `2^31`
    /// for the grids here, `t <= 2^(m + 1)`, so truncating it to an integer is its floor), and
    /// the result `(floor(t) + up) · step` is the same product of the same values.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) fn round_sr(a: __m512, step: __m512, inv_step: __m512, r: __m512i) -> __m512 {
        let t256 = _mm512_mul_ps(_mm512_mul_ps(a, inv_step), _mm512_set1_ps(256.0));
        let sum = _mm512_add_epi32(_mm512_cvttps_epi32(t256), r);
        let n = _mm512_cvtepi32_ps(_mm512_srli_epi32::<8>(sum));
        _mm512_mul_ps(n, step)
    }

    /// The 16 lanes of `v`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) fn lanes(v: __m512) -> [f32; 16] {
        let mut a = [0.0f32; 16];
        // SAFETY: 16 f32.
        unsafe { _mm512_storeu_ps(a.as_mut_ptr(), v) };
        a
    }

    /// Lane `k`: the largest magnitude in `x[k]` (a block's amax, or what is left of it after
    /// a first maximum), for 16 blocks at once by a transposing tree of maxima (45
    /// operations instead of 16 horizontal reductions). A maximum of finite values is exact
    /// in any order, so lane `k` is the amax of `x[k]`; the kernels use it on finite values
    /// only (NVFP4 checks the tensor amax first; MX reports a non-finite block as an error
    /// whatever its scale).
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) fn block_maxima(x: &[__m512; 16]) -> __m512 {
        let a = x.map(|v| _mm512_abs_ps(v));
        // per 128-bit lane: [a0 ∨ a2, b0 ∨ b2, a1 ∨ a3, b1 ∨ b3] of the pair (a, b)
        let t: [__m512; 8] = std::array::from_fn(|i| {
            let (p, q) = (a[2 * i], a[2 * i + 1]);
            _mm512_max_ps(_mm512_unpacklo_ps(p, q), _mm512_unpackhi_ps(p, q))
        });
        // per 128-bit lane: the lane's maximum of each of four blocks 4i .. 4i + 3, in order
        let u: [__m512; 4] = std::array::from_fn(|i| {
            let (c, d) = (_mm512_castps_pd(t[2 * i]), _mm512_castps_pd(t[2 * i + 1]));
            let (lo, hi) = (_mm512_unpacklo_pd(c, d), _mm512_unpackhi_pd(c, d));
            _mm512_max_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi))
        });
        // 128-bit lanes (0 ∨ 1) and (2 ∨ 3) of u[2j] then of u[2j + 1]
        let r: [__m512; 2] = std::array::from_fn(|j| {
            let (e, f) = (u[2 * j], u[2 * j + 1]);
            _mm512_max_ps(
                _mm512_shuffle_f32x4::<0b10_00_10_00>(e, f),
                _mm512_shuffle_f32x4::<0b11_01_11_01>(e, f),
            )
        });
        // 128-bit lane i: u[i]'s four blocks, maxima over all four lanes: blocks 4i .. 4i + 3
        _mm512_max_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(r[0], r[1]),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(r[0], r[1]),
        )
    }

    /// `fl(v · s)` with the sign bit of `y` (the bits of the scaled element) put back.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) fn signed_product(v: __m512, s: __m512, y: __m512i) -> __m512 {
        let sign = _mm512_set1_epi32(0x8000_0000u32 as i32);
        let m = _mm512_castps_si512(_mm512_mul_ps(v, s));
        _mm512_castsi512_ps(_mm512_or_si512(m, _mm512_and_si512(y, sign)))
    }
}

/// The same steps on eight lanes, for the AVX2 kernels of MX (`mx/avx2.rs`).
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use std::arch::x86_64::*;

    /// [`super::grid_sr`]'s rounding of `a` (non-negative) onto the multiples of `step` (a
    /// power of two; `inv_step` its reciprocal) with the random byte `r` of each lane, in
    /// integers as [`super::avx512::round_sr`]: `(floor(256 · a / step) + r) >> 8` times
    /// `step`.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(crate) fn round_sr(a: __m256, step: __m256, inv_step: __m256, r: __m256i) -> __m256 {
        let t256 = _mm256_mul_ps(_mm256_mul_ps(a, inv_step), _mm256_set1_ps(256.0));
        let sum = _mm256_add_epi32(_mm256_cvttps_epi32(t256), r);
        let n = _mm256_cvtepi32_ps(_mm256_srli_epi32::<8>(sum));
        _mm256_mul_ps(n, step)
    }

    /// `fl(v · s)` with the sign bit of `y` (the bits of the scaled element) put back.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(crate) fn signed_product(v: __m256, s: __m256, y: __m256i) -> __m256 {
        let sign = _mm256_set1_epi32(0x8000_0000u32 as i32);
        let m = _mm256_castps_si256(_mm256_mul_ps(v, s));
        _mm256_castsi256_ps(_mm256_or_si256(m, _mm256_and_si256(y, sign)))
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use std::arch::x86_64::*;

    /// The vector stochastic rounding (integer form) against [`grid_sr`] on every grid the
    /// kernels round onto, for magnitudes across every binade (4096 f32s evenly up to `MAX`,
    /// plus each grid point, its neighbours and the midpoints between grid points) and all
    /// 256 random bytes; AVX2 and AVX-512 where this CPU has them.
    #[test]
    fn vector_sr_matches_grid_sr() {
        fn magnitudes<F: Elem>() -> Vec<f32> {
            let top = F::MAX.to_bits();
            let stride = (top / 4096) | 1; // odd: every low mantissa bit pattern comes up
            let mut v: Vec<f32> = (0..=top)
                .step_by(stride as usize)
                .map(f32::from_bits)
                .collect();
            for code in 0..(1u8 << (F::BITS - 1)) {
                let g = F::from_bits(code).to_f32();
                if !(g.is_finite() && g <= F::MAX) {
                    continue;
                }
                for d in [-1i32, 0, 1] {
                    v.push(f32::from_bits((g.to_bits() as i32 + d).max(0) as u32));
                }
                let next = F::from_bits(code + 1).to_f32();
                if next.is_finite() && next <= F::MAX {
                    v.push((g + next) / 2.0);
                }
            }
            v.retain(|a| *a <= F::MAX);
            v
        }
        fn check<F: Elem>(what: &str) {
            let (avx2, avx512) = (fp_formats::cpu::has_avx2(), fp_formats::cpu::has_avx512f());
            if !avx2 && !avx512 {
                eprintln!("SKIP {what}: neither AVX2 nor AVX-512F here");
                return;
            }
            let m = F::MANTISSA_BITS << 23;
            for a in magnitudes::<F>() {
                let eb = binade::<F>(a).to_bits();
                let (step, inv) = (f32::from_bits(eb - m), f32::from_bits((254 << 23) - eb + m));
                for r in 0..=255u8 {
                    let want = grid_sr::<F>(a, r).to_bits();
                    // SAFETY: each vector path runs only where its instructions are present.
                    unsafe {
                        if avx2 {
                            let (va, vs, vi) =
                                (_mm256_set1_ps(a), _mm256_set1_ps(step), _mm256_set1_ps(inv));
                            let got = avx2::round_sr(va, vs, vi, _mm256_set1_epi32(r as i32));
                            let got = _mm256_cvtss_f32(got).to_bits();
                            assert_eq!(got, want, "{what} AVX2: a = {a:e}, r = {r}");
                        }
                        if avx512 {
                            let (va, vs, vi) =
                                (_mm512_set1_ps(a), _mm512_set1_ps(step), _mm512_set1_ps(inv));
                            let got = avx512::round_sr(va, vs, vi, _mm512_set1_epi32(r as i32));
                            let got = _mm512_cvtss_f32(got).to_bits();
                            assert_eq!(got, want, "{what} AVX-512: a = {a:e}, r = {r}");
                        }
                    }
                }
            }
        }
        check::<E2M1>("E2M1");
        check::<E2M3>("E2M3");
        check::<E3M2>("E3M2");
        check::<E4M3>("E4M3");
        check::<E5M2>("E5M2");
    }
}

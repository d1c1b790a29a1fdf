//! AVX2 kernels of the fused fake-quantization path ([`super::fast`]): the 16x16 transpose and
//! the columnwise staging of whole 16x16 tiles (load, optional Hadamard transform, amax,
//! transpose, store). Each performs exactly the IEEE operations of its portable counterpart
//! in `fast.rs` (no FMA, no reassociation), so the results are identical bit for bit
//! (tested against the portable path in `fast.rs`).
//!
//! Every function here is `unsafe` only because it needs AVX2 (`#[target_feature]`) and
//! works through raw pointers; the callers check the CPU and the slice bounds.

use std::arch::x86_64::*;

use fp_formats::nvfp4::BLOCK;

use super::Tile;

/// Transposes an 8x8 block held as 8 row vectors: `out[m]` lane `k` = `r[k]` lane `m`
/// (unpack, shuffle, then 128-bit lane permutes: 24 shuffles).
///
/// # Safety
/// The CPU must support AVX2.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    let a0 = _mm256_unpacklo_ps(r[0], r[1]);
    let a1 = _mm256_unpackhi_ps(r[0], r[1]);
    let a2 = _mm256_unpacklo_ps(r[2], r[3]);
    let a3 = _mm256_unpackhi_ps(r[2], r[3]);
    let a4 = _mm256_unpacklo_ps(r[4], r[5]);
    let a5 = _mm256_unpackhi_ps(r[4], r[5]);
    let a6 = _mm256_unpacklo_ps(r[6], r[7]);
    let a7 = _mm256_unpackhi_ps(r[6], r[7]);
    let b0 = _mm256_shuffle_ps::<0x44>(a0, a2);
    let b1 = _mm256_shuffle_ps::<0xEE>(a0, a2);
    let b2 = _mm256_shuffle_ps::<0x44>(a1, a3);
    let b3 = _mm256_shuffle_ps::<0xEE>(a1, a3);
    let b4 = _mm256_shuffle_ps::<0x44>(a4, a6);
    let b5 = _mm256_shuffle_ps::<0xEE>(a4, a6);
    let b6 = _mm256_shuffle_ps::<0x44>(a5, a7);
    let b7 = _mm256_shuffle_ps::<0xEE>(a5, a7);
    [
        _mm256_permute2f128_ps::<0x20>(b0, b4),
        _mm256_permute2f128_ps::<0x20>(b1, b5),
        _mm256_permute2f128_ps::<0x20>(b2, b6),
        _mm256_permute2f128_ps::<0x20>(b3, b7),
        _mm256_permute2f128_ps::<0x31>(b0, b4),
        _mm256_permute2f128_ps::<0x31>(b1, b5),
        _mm256_permute2f128_ps::<0x31>(b2, b6),
        _mm256_permute2f128_ps::<0x31>(b3, b7),
    ]
}

/// `dst[j * ld + i] = t[i][j]` for `i, j < 16` (the portable `fast::transpose_store`).
///
/// # Safety
/// The CPU must support AVX2 and `dst` must hold at least `15 * ld + 16` elements.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn transpose_store(t: &Tile, dst: &mut [f32], ld: usize) {
    debug_assert!(dst.len() >= 15 * ld + BLOCK);
    let src = t.as_ptr() as *const f32;
    let out = dst.as_mut_ptr();
    for bi in 0..2 {
        for bj in 0..2 {
            // SAFETY: rows 8 bi + k and columns 8 bj .. 8 bj + 8 lie inside the 16x16 tile.
            let r: [__m256; 8] = core::array::from_fn(|k| unsafe {
                _mm256_loadu_ps(src.add((8 * bi + k) * BLOCK + 8 * bj))
            });
            for (m, v) in transpose8(r).iter().enumerate() {
                // SAFETY: output row 8 bj + m <= 15, columns 8 bi .. 8 bi + 8 <= 16: inside
                // the first 15 * ld + 16 elements of `dst` (caller's contract).
                _mm256_storeu_ps(out.add((8 * bj + m) * ld + 8 * bi), *v);
            }
        }
    }
}

/// The 16-point Hadamard transform of 16 rows x 8 lanes held in registers, with the
/// reference arithmetic of `crate::hadamard` (sign flips, butterfly with strides 1, 2, 4, 8,
/// zero sums to +0, times 0.25, BF16 rounding), lane by lane.
struct Rht8 {
    /// Row `i` is negated iff bit `i` of the mask is set: `-0.0` or `+0.0` to XOR with.
    flips: [__m256; BLOCK],
    quarter: __m256,
    round_bias: __m256i,
    one: __m256i,
    hi16: __m256i,
}

impl Rht8 {
    /// # Safety
    /// The CPU must support AVX2.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn new(mask: u16) -> Self {
        Rht8 {
            flips: core::array::from_fn(|i| {
                if (mask >> i) & 1 == 1 {
                    _mm256_set1_ps(-0.0)
                } else {
                    _mm256_setzero_ps()
                }
            }),
            quarter: _mm256_set1_ps(0.25),
            round_bias: _mm256_set1_epi32(0x7FFF),
            one: _mm256_set1_epi32(1),
            hi16: _mm256_set1_epi32(0xFFFF_0000u32 as i32),
        }
    }

    /// Transforms `v` down its 16 rows. The BF16 rounding is the bit trick of
    /// `round_to_bf16` for non-NaN values (add 0x7FFF plus the lowest kept bit, clear the low
    /// 16 bits); a NaN, which it could turn into a finite value, sets its lane in `bad`.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn apply(&self, v: &mut [__m256; BLOCK], bad: &mut __m256) {
        for i in 0..BLOCK {
            v[i] = _mm256_xor_ps(v[i], self.flips[i]);
        }
        // Butterfly stages with strides 1, 2, 4, 8 (each fully unrolled).
        hadamard16_butterflies!(v, _mm256_add_ps, _mm256_sub_ps);
        let zero = _mm256_setzero_ps();
        for e in v.iter_mut() {
            // `+ 0.0` turns a -0 sum into +0 (`crate::hadamard`, "Sign of zero").
            let y = _mm256_mul_ps(_mm256_add_ps(*e, zero), self.quarter);
            *bad = _mm256_or_ps(*bad, _mm256_cmp_ps::<_CMP_UNORD_Q>(y, y));
            let b = _mm256_castps_si256(y);
            let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(b), self.one);
            let r = _mm256_add_epi32(b, _mm256_add_epi32(self.round_bias, lsb));
            *e = _mm256_castsi256_ps(_mm256_and_si256(r, self.hi16));
        }
    }
}

/// A running amax and non-finite flag over 8 lanes.
struct Amax8 {
    amax: __m256,
    bad: __m256,
}

impl Amax8 {
    /// # Safety
    /// The CPU must support AVX2.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn new() -> Self {
        Amax8 {
            amax: _mm256_setzero_ps(),
            bad: _mm256_setzero_ps(),
        }
    }

    /// Takes `|e|` into the amax; flags NaN and infinite lanes.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn add(&mut self, e: __m256) {
        let a = _mm256_and_ps(e, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF)));
        self.amax = _mm256_max_ps(self.amax, a);
        let big = _mm256_cmp_ps::<_CMP_NLE_UQ>(a, _mm256_set1_ps(f32::MAX));
        self.bad = _mm256_or_ps(self.bad, big);
    }

    /// The amax over all lanes and whether any lane was flagged.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn finish(self) -> (f32, bool) {
        let mut a = [0.0f32; 8];
        let mut b = [0.0f32; 8];
        _mm256_storeu_ps(a.as_mut_ptr(), self.amax);
        _mm256_storeu_ps(b.as_mut_ptr(), self.bad);
        let m = a.iter().fold(0.0f32, |m, &v| if v > m { v } else { m });
        (m, b.iter().any(|v| v.to_bits() != 0))
    }
}

/// Stages the whole tiles of one strip of a columnwise operand: input rows `r0 .. r0 + 16`,
/// input columns `col0 .. col0 + n` (`n` a multiple of 16). For the tile at input column
/// `col0 + c`, `t[i][j] = x[(r0 + i) * ld + col0 + c + j]` is Hadamard-transformed along `i`
/// when `mask` is set (the reference arithmetic of `crate::hadamard`: sign flips, butterfly
/// with strides 1, 2, 4, 8, zero sums to +0, times 0.25, BF16 rounding; the rounding skips
/// the NaN case, which
/// the returned flag reports), and its transpose is stored at
/// `dst[(c + j) * ld_dst + r0 + i]`. Returns the amax of the stored values and whether any
/// of them (or of the transformed values before rounding) is non-finite.
///
/// # Panics
/// If a tile would read outside `x` or write outside `dst`.
#[allow(clippy::too_many_arguments)]
pub(super) fn stage_strip(
    x: &[f32],
    ld: usize,
    r0: usize,
    col0: usize,
    n: usize,
    dst: &mut [f32],
    ld_dst: usize,
    mask: Option<u16>,
) -> (f32, bool) {
    assert!(n.is_multiple_of(BLOCK));
    if n == 0 {
        return (0.0, false);
    }
    assert!(
        (r0 + BLOCK - 1) * ld + col0 + n <= x.len(),
        "stage_strip: input"
    );
    assert!(
        (n - 1) * ld_dst + r0 + BLOCK <= dst.len(),
        "stage_strip: output"
    );
    assert!(std::is_x86_feature_detected!("avx2"));
    // SAFETY: AVX2 is present (asserted) and the bounds were checked just above.
    unsafe { stage_strip_impl(x, ld, r0, col0, n, dst, ld_dst, mask) }
}

/// [`stage_strip`] after its checks.
///
/// # Safety
/// The CPU must support AVX2; `(r0 + 15) * ld + col0 + n <= x.len()` and
/// `(n - 1) * ld_dst + r0 + 16 <= dst.len()`, `n` a positive multiple of 16.
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn stage_strip_impl(
    x: &[f32],
    ld: usize,
    r0: usize,
    col0: usize,
    n: usize,
    dst: &mut [f32],
    ld_dst: usize,
    mask: Option<u16>,
) -> (f32, bool) {
    let xp = x.as_ptr();
    let out = dst.as_mut_ptr();
    let rht = mask.map(|m| Rht8::new(m));
    let mut acc = Amax8::new();
    for c in (0..n).step_by(BLOCK) {
        for h in 0..2 {
            // SAFETY: (r0 + i) * ld + col0 + c + 8 h + 8 <= (r0 + 15) * ld + col0 + n.
            let mut v: [__m256; BLOCK] = core::array::from_fn(|i| unsafe {
                _mm256_loadu_ps(xp.add((r0 + i) * ld + col0 + c + 8 * h))
            });
            if let Some(rht) = &rht {
                rht.apply(&mut v, &mut acc.bad);
            }
            for e in &v {
                acc.add(*e);
            }
            // Tile columns 8 h .. 8 h + 8 become stored rows c + 8 h + m; tile rows 0..8 and
            // 8..16 their first and second 8 elements.
            let lo = transpose8([v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]]);
            let hi = transpose8([v[8], v[9], v[10], v[11], v[12], v[13], v[14], v[15]]);
            for m in 0..8 {
                let row = out.add((c + 8 * h + m) * ld_dst + r0);
                // SAFETY: row index c + 8 h + m <= n - 1, columns r0 .. r0 + 16.
                _mm256_storeu_ps(row, lo[m]);
                _mm256_storeu_ps(row.add(8), hi[m]);
            }
        }
    }
    acc.finish()
}

/// The Hadamard staging of a columnwise operand in the source layout: for the 16 input rows
/// `r0 .. r0 + 16` and columns `c0 .. c0 + n` (`n` a multiple of 8), `dst[i * ld + c]` receives
/// `x[(r0 + i) * ld + c]` transformed along `i` (the arithmetic of [`stage_strip`], including
/// its NaN flag), without a transpose. Returns the amax of the stored values and whether any
/// of them (or of the values before rounding) is non-finite.
///
/// # Panics
/// If the strip would read outside `x` or write outside `dst`.
pub(super) fn rht_strip(
    x: &[f32],
    ld: usize,
    r0: usize,
    n: usize,
    dst: &mut [f32],
    mask: u16,
    c0: usize,
) -> (f32, bool) {
    assert!(n.is_multiple_of(8) && c0 + n <= ld);
    if n == 0 {
        return (0.0, false);
    }
    assert!(
        (r0 + BLOCK - 1) * ld + c0 + n <= x.len(),
        "rht_strip: input"
    );
    assert!((BLOCK - 1) * ld + c0 + n <= dst.len(), "rht_strip: output");
    assert!(std::is_x86_feature_detected!("avx2"));
    // SAFETY: AVX2 is present (asserted) and the bounds were checked just above.
    unsafe { rht_strip_impl(x, ld, r0, c0..c0 + n, dst, mask) }
}

/// [`rht_strip`] after its checks, on the columns `cols`.
///
/// # Safety
/// The CPU must support AVX2; `(r0 + 15) * ld + cols.end <= x.len()`, `15 * ld + cols.end
/// <= dst.len()`, the range's length a multiple of 8.
#[target_feature(enable = "avx2")]
unsafe fn rht_strip_impl(
    x: &[f32],
    ld: usize,
    r0: usize,
    cols: std::ops::Range<usize>,
    dst: &mut [f32],
    mask: u16,
) -> (f32, bool) {
    let xp = x.as_ptr();
    let out = dst.as_mut_ptr();
    let rht = Rht8::new(mask);
    let mut acc = Amax8::new();
    for c in cols.step_by(8) {
        // SAFETY: (r0 + i) * ld + c + 8 <= (r0 + 15) * ld + cols.end.
        let mut v: [__m256; BLOCK] =
            core::array::from_fn(|i| unsafe { _mm256_loadu_ps(xp.add((r0 + i) * ld + c)) });
        rht.apply(&mut v, &mut acc.bad);
        for (i, e) in v.iter().enumerate() {
            acc.add(*e);
            // SAFETY: i * ld + c + 8 <= 15 * ld + cols.end.
            _mm256_storeu_ps(out.add(i * ld + c), *e);
        }
    }
    acc.finish()
}

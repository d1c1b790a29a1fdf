//! AVX-512 kernels of the fused fake-quantization path ([`super::fast`]), each on whole
//! 16-lane rows held in `zmm` registers with the exact IEEE operations of the portable code
//! (no FMA, no reassociation), so the same bits as the portable and AVX2 builds:
//!
//! * [`vertical_stretch`]: one whole 16x16 stretch of a columnwise operand in the source
//!   layout (one row of 16 stored blocks per register): `fast::fake_vertical`'s lane-wise
//!   block amaxes, `fast::group_scales` on 16 lanes, then per element the RNE or stochastic
//!   rounding onto the E2M1 grid times the block scale (tested below against the portable
//!   code); with a tile-wide scale and RNE it also quantizes a whole 16x16 tile of a
//!   rowwise operand (the weights' 2D scaling), whose elements all get the same treatment;
//! * [`row_group`]: up to 16 whole blocks of a stored row (`fast::fake_panel`'s rowwise
//!   loop);
//! * [`rht_strip`]: the Hadamard staging of 16 input rows, 16 columns per step (the AVX2
//!   strip's arithmetic);
//! * [`rht_vertical_strip`]: the two fused for the packing pass of a columnwise operand with
//!   RHT, each 16x16 stretch transformed and quantized in registers with no staged copy
//!   (tested below against the two kernels one after the other).
//!
//! `row_group` and `rht_strip` are covered by the whole-tensor tests in `nvfp4.rs`, which
//! compare the dispatched path with the reference on every configuration. The portable code
//! keeps a 16x16 stretch in a stack array, which the AVX2 build cannot hold in its sixteen
//! `ymm` registers (two per row): it spills, and its per-element work ran at about 4.5
//! cycles on the Zen 4 host, where these kernels took the quantizers from 20-21% to 14-15%
//! of a one-thread NVFP4 or MXFP8 training step.

use std::arch::x86_64::*;

use fp_formats::nvfp4::{GlobalScale, BLOCK};

use crate::grid::avx512::{block_maxima, lanes, round_sr, signed_product};
use crate::philox::avx512::words_x16;
use crate::RngKey;

pub(super) use crate::philox::avx512::available;

/// How one stretch is quantized: its blocks' sharing of a scale, its rounding and where its
/// random bytes come from (lane `l` uses those of block `first + l · stride`).
#[derive(Clone, Copy)]
pub(super) struct Stretch<'a> {
    pub tile2d: bool,
    pub sr: bool,
    pub g: &'a GlobalScale,
    pub key: RngKey,
    pub first: u64,
    pub stride: u64,
}

/// Fake-quantizes the 16x16 stretch whose row `i` (16 lanes = 16 stored blocks) is read at
/// `src + i · ld` and written at `dst + i · ld` (`src` may equal `dst`): the portable
/// `fast::fake_vertical` on whole stretches, bit for bit.
///
/// # Safety
/// The CPU must support AVX-512F ([`available`]); `src` must be valid for reads and `dst`
/// for writes of 16 rows of 16 `f32` at row stride `ld` (they may be the same memory, but
/// must not otherwise overlap).
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn vertical_stretch(src: *const f32, dst: *mut f32, ld: usize, q: Stretch<'_>) {
    let mut v: [__m512; BLOCK] = core::array::from_fn(|i| _mm512_loadu_ps(src.add(i * ld)));
    quantize_stretch(&mut v, q);
    for (i, row) in v.iter().enumerate() {
        _mm512_storeu_ps(dst.add(i * ld), *row);
    }
}

/// [`vertical_stretch`]'s arithmetic on a stretch held in registers (row `i` in `v[i]`).
#[inline]
#[target_feature(enable = "avx512f")]
fn quantize_stretch(v: &mut [__m512; BLOCK], q: Stretch<'_>) {
    let mut amax = _mm512_setzero_ps();
    for row in v.iter() {
        amax = _mm512_max_ps(amax, _mm512_abs_ps(*row));
    }
    if q.tile2d {
        amax = _mm512_set1_ps(_mm512_reduce_max_ps(amax));
    }
    let (sf, enc) = group_scales_x16(amax, q.g);
    let k = Consts::new();
    if q.sr {
        let words = words_x16(q.key, q.first, q.stride);
        let byte = _mm512_set1_epi32(0xFF);
        for (i, row) in v.iter_mut().enumerate() {
            // byte i of lane l's block: bits 8 (i % 4) .. of its word i / 4
            let w = _mm512_srlv_epi32(words[i / 4], _mm512_set1_epi32(8 * (i % 4) as i32));
            *row = k.fake_sr(*row, enc, sf, _mm512_and_si512(w, byte));
        }
    } else {
        for row in v.iter_mut() {
            *row = k.fake_rne(*row, enc, sf);
        }
    }
}

/// Fake-quantizes `nb <= 16` whole consecutive 16-element blocks of one stored row (one
/// scale each), read at `src` and written at `dst` (`src` may equal `dst`): the portable
/// `fast::fake_panel` on a group of whole blocks, bit for bit. With stochastic rounding,
/// block `k` uses the random bytes of Philox block `first + k`.
///
/// # Safety
/// The CPU must support AVX-512F ([`available`]); `src` must be valid for reads and `dst`
/// for writes of `16 · nb` `f32` (the same memory or disjoint); `nb <= 16`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn row_group(
    src: *const f32,
    dst: *mut f32,
    nb: usize,
    g: &GlobalScale,
    sr: Option<(RngKey, u64)>,
) {
    debug_assert!(nb <= BLOCK);
    let mut x = [_mm512_setzero_ps(); BLOCK];
    for k in 0..nb {
        x[k] = _mm512_loadu_ps(src.add(k * BLOCK));
    }
    // lane k: block k's scale value and encode factor (blocks past `nb` are zero, unused)
    let (sf, enc) = group_scales_x16(block_maxima(&x), g);
    let (sf, enc) = (lanes(sf), lanes(enc));
    let c = Consts::new();
    match sr {
        None => {
            for k in 0..nb {
                let y = c.fake_rne(x[k], _mm512_set1_ps(enc[k]), _mm512_set1_ps(sf[k]));
                _mm512_storeu_ps(dst.add(k * BLOCK), y);
            }
        }
        Some((key, first)) => {
            let words = words_x16(key, first, 1);
            let mut w = [[0u32; BLOCK]; 4];
            for (d, v) in w.iter_mut().zip(words) {
                _mm512_storeu_si512(d.as_mut_ptr().cast(), v);
            }
            for k in 0..nb {
                // block k's 16 bytes: its four words, little-endian
                let bytes = _mm_set_epi32(
                    w[3][k] as i32,
                    w[2][k] as i32,
                    w[1][k] as i32,
                    w[0][k] as i32,
                );
                let r = _mm512_cvtepu8_epi32(bytes);
                let y = c.fake_sr(x[k], _mm512_set1_ps(enc[k]), _mm512_set1_ps(sf[k]), r);
                _mm512_storeu_ps(dst.add(k * BLOCK), y);
            }
        }
    }
}

/// `fast::group_scales` on 16 lanes (lane `k`: block `k`'s scale value `s_b` and encode
/// factor from its amax), bit for bit: the same IEEE multiply, `min(., FLT_MAX)` (MINPS is
/// `a < b ? a : b`, the comparison the portable code writes), the E4M3 rounding of
/// `E4M3::encode_rne_sat` in integer lanes, the decoded scale and the exact division.
/// `amax` must be finite and non-negative.
#[inline]
#[target_feature(enable = "avx512f")]
fn group_scales_x16(amax: __m512, g: &GlobalScale) -> (__m512, __m512) {
    let max = _mm512_set1_ps(f32::MAX);
    let s = _mm512_min_ps(_mm512_mul_ps(amax, _mm512_set1_ps(g.block_factor)), max);
    // E4M3 code of s >= 0: normal range, the f32 mantissa rounded to 3 bits in place...
    let bits = _mm512_castps_si512(s);
    let lsb = _mm512_and_si512(_mm512_srli_epi32::<20>(bits), _mm512_set1_epi32(1));
    let rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFFF)));
    let normal = _mm512_sub_epi32(
        _mm512_srli_epi32::<20>(rounded),
        _mm512_set1_epi32(120 << 3),
    );
    let normal = _mm512_min_epu32(normal, _mm512_set1_epi32(0x7E));
    // ...the subnormal range by adding 2^14 (ulp 2^-9)
    let sub = _mm512_castps_si512(_mm512_add_ps(s, _mm512_set1_ps(16384.0)));
    let sub = _mm512_sub_epi32(sub, _mm512_set1_epi32(0x4680_0000));
    let tiny = _mm512_cmplt_epu32_mask(bits, _mm512_set1_epi32(0x3C80_0000));
    let code = _mm512_mask_blend_epi32(tiny, normal, sub);
    // its value: `(c << 20) + (120 << 23)` as f32 for normal codes, `(c & 7) · 2^-9` else
    let normal = _mm512_add_epi32(_mm512_slli_epi32::<20>(code), _mm512_set1_epi32(120 << 23));
    let sub = _mm512_cvtepi32_ps(_mm512_and_si512(code, _mm512_set1_epi32(7)));
    let sub = _mm512_mul_ps(sub, _mm512_set1_ps(1.0 / 512.0));
    let is_normal = _mm512_cmpge_epu32_mask(code, _mm512_set1_epi32(8));
    let sf = _mm512_mask_blend_ps(is_normal, sub, _mm512_castsi512_ps(normal));
    let e = _mm512_div_ps(
        _mm512_set1_ps(1.0),
        _mm512_mul_ps(sf, _mm512_set1_ps(g.s_dec)),
    );
    (sf, _mm512_min_ps(e, max))
}

/// The broadcast constants of the element arithmetic.
struct Consts {
    abs: __m512i,
    six: __m512,
    exp: __m512i,
    one: __m512,
    magic_shift: __m512i,
    mant: __m512i,
    e255: __m512i,
}

impl Consts {
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn new() -> Consts {
        Consts {
            abs: _mm512_set1_epi32(0x7FFF_FFFF),
            six: _mm512_set1_ps(6.0),
            exp: _mm512_set1_epi32(0x7F80_0000),
            one: _mm512_set1_ps(1.0),
            magic_shift: _mm512_set1_epi32(22 << 23),
            mant: _mm512_set1_epi32(1 << 23),
            e255: _mm512_set1_epi32(255 << 23),
        }
    }

    /// `(bits of y = fl(x · enc), a = min(|y|, 6), b)` with `b` the binade of `a` on the
    /// E2M1 grid as bits: `max(2^floor(log2 a), 1)`, so 1 below 2, 2 below 4, else 4 (the
    /// grid step is `b / 2`): `fast::abs_min6` and its comparisons.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn scaled(&self, x: __m512, enc: __m512) -> (__m512i, __m512, __m512i) {
        let bits = _mm512_castps_si512(_mm512_mul_ps(x, enc));
        let a = _mm512_castsi512_ps(_mm512_and_si512(bits, self.abs));
        // `a < 6 ? a : 6`: MINPS returns its second operand unless the first is smaller.
        let a = _mm512_min_ps(a, self.six);
        // `x > y ? x : y` (MAXPS); a zero's exponent field is 0, below 1.0's
        let top = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(a), self.exp));
        let b = _mm512_castps_si512(_mm512_max_ps(top, self.one));
        (bits, a, b)
    }

    /// `fast::fake_rne` on 16 lanes: the magic number is `2^22 · b`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn fake_rne(&self, x: __m512, enc: __m512, sf: __m512) -> __m512 {
        let (bits, a, b) = self.scaled(x, enc);
        let c = _mm512_castsi512_ps(_mm512_add_epi32(b, self.magic_shift));
        let v = _mm512_sub_ps(_mm512_add_ps(a, c), c);
        signed_product(v, sf, bits)
    }

    /// `fast::fake_sr` on 16 lanes; `r` holds one random byte per lane. The step is `b / 2`
    /// and its reciprocal `2 / b` (exponent arithmetic on the bits of the power of two `b`).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn fake_sr(&self, x: __m512, enc: __m512, sf: __m512, r: __m512i) -> __m512 {
        let (bits, a, b) = self.scaled(x, enc);
        let step = _mm512_castsi512_ps(_mm512_sub_epi32(b, self.mant));
        let inv_step = _mm512_castsi512_ps(_mm512_sub_epi32(self.e255, b));
        signed_product(round_sr(a, step, inv_step, r), sf, bits)
    }
}

/// The Hadamard staging of 16 input rows in the source layout, 16 columns per step: the
/// AVX2 `rht_strip` (the reference arithmetic of `crate::hadamard`: sign flips, butterflies
/// with strides 1, 2, 4, 8, `+ 0`, times 0.25, BF16 rounding by the bit trick, a NaN
/// flagged) on `zmm` registers. For columns `0 .. n` (`n` a multiple of 16), `dst[i · ld +
/// c]` receives `x[(r0 + i) · ld + c]` transformed along `i`. Returns the amax of the stored
/// values and whether any of them (or of the values before rounding) is non-finite.
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
) -> (f32, bool) {
    assert!(n.is_multiple_of(BLOCK) && n <= ld);
    if n == 0 {
        return (0.0, false);
    }
    assert!((r0 + BLOCK - 1) * ld + n <= x.len(), "rht_strip: input");
    assert!((BLOCK - 1) * ld + n <= dst.len(), "rht_strip: output");
    assert!(available());
    // SAFETY: AVX-512F is present (asserted) and the bounds were checked just above.
    unsafe { rht_strip_impl(x.as_ptr(), ld, r0, n, dst.as_mut_ptr(), mask) }
}

/// [`rht_strip`] after its checks.
///
/// # Safety
/// The CPU must support AVX-512F; `x` must be valid for reads of `(r0 + 15) · ld + n`
/// elements, `dst` for writes of `15 · ld + n`; `n` a multiple of 16.
#[target_feature(enable = "avx512f")]
unsafe fn rht_strip_impl(
    x: *const f32,
    ld: usize,
    r0: usize,
    n: usize,
    dst: *mut f32,
    mask: u16,
) -> (f32, bool) {
    let flips = sign_flips(mask);
    let hi16 = _mm512_set1_epi32(0xFFFF_0000u32 as i32);
    let abs = _mm512_set1_epi32(0x7FFF_FFFF);
    let big = _mm512_set1_ps(f32::MAX);
    let mut amax = _mm512_setzero_ps();
    let mut bad: __mmask16 = 0;
    for c in (0..n).step_by(BLOCK) {
        // SAFETY: (r0 + i) * ld + c + 16 <= (r0 + 15) * ld + n.
        let v = rht_block(x.add(r0 * ld + c), ld, &flips);
        for (i, y) in v.iter().enumerate() {
            bad |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(*y, *y);
            let r = round_bf16(*y);
            let out = _mm512_castsi512_ps(_mm512_and_si512(r, hi16));
            let a = _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_and_si512(hi16, abs)));
            amax = _mm512_max_ps(amax, a);
            bad |= _mm512_cmp_ps_mask::<_CMP_NLE_UQ>(a, big);
            // SAFETY: i * ld + c + 16 <= 15 * ld + n.
            _mm512_storeu_ps(dst.add(i * ld + c), out);
        }
    }
    (_mm512_reduce_max_ps(amax), bad != 0)
}

/// The amax and finiteness that [`rht_strip`] returns for the same strip, without storing
/// it (the packed path's amax pass): the largest magnitude is taken before the `+ 0`, the
/// factor 0.25 and the BF16 rounding, which are applied once to it at the end. The `+ 0`
/// changes only the sign of a zero, and the multiplication and the rounding are monotonic
/// in the magnitude and symmetric in the sign, so the largest rounded magnitude is the
/// rounding of the largest magnitude, and it overflows exactly when some rounded value
/// does. A NaN is flagged as in [`rht_strip`].
///
/// # Panics
/// If the strip would read outside `x`.
pub(super) fn rht_strip_amax(x: &[f32], ld: usize, r0: usize, n: usize, mask: u16) -> (f32, bool) {
    assert!(n.is_multiple_of(BLOCK) && n <= ld);
    if n == 0 {
        return (0.0, false);
    }
    assert!(
        (r0 + BLOCK - 1) * ld + n <= x.len(),
        "rht_strip_amax: input"
    );
    assert!(available());
    // SAFETY: AVX-512F is present (asserted) and the bounds were checked just above.
    let (largest, nan) = unsafe { rht_strip_amax_impl(x.as_ptr(), ld, r0, n, mask) };
    // the reference's BF16 rounding of the scaled largest magnitude
    let amax = fp_formats::round_to_bf16(largest * 0.25);
    (amax, nan || amax > f32::MAX)
}

/// [`rht_strip_amax`] after its checks: the largest magnitude of the unscaled butterfly
/// outputs, and whether any of them is a NaN.
///
/// # Safety
/// The CPU must support AVX-512F; `x` must be valid for reads of `(r0 + 15) · ld + n`
/// elements; `n` a multiple of 16.
#[target_feature(enable = "avx512f")]
unsafe fn rht_strip_amax_impl(
    x: *const f32,
    ld: usize,
    r0: usize,
    n: usize,
    mask: u16,
) -> (f32, bool) {
    let flips = sign_flips(mask);
    let mut largest = _mm512_setzero_ps();
    let mut nan: __mmask16 = 0;
    for c in (0..n).step_by(BLOCK) {
        // SAFETY: (r0 + i) * ld + c + 16 <= (r0 + 15) * ld + n.
        for y in rht_sums(x.add(r0 * ld + c), ld, &flips) {
            nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(y, y);
            // MAXPS keeps its second operand when the first is a NaN (flagged above)
            largest = _mm512_max_ps(_mm512_abs_ps(y), largest);
        }
    }
    (_mm512_reduce_max_ps(largest), nan != 0)
}

/// The sign-flip masks of the Hadamard transform's random signs, one per input row.
#[inline]
#[target_feature(enable = "avx512f")]
fn sign_flips(mask: u16) -> [__m512i; BLOCK] {
    core::array::from_fn(|i| _mm512_set1_epi32(if (mask >> i) & 1 == 1 { i32::MIN } else { 0 }))
}

/// The butterfly sums of one 16x16 block of the Hadamard staging: the 16 rows at `x + i ·
/// ld` (16 lanes each), sign-flipped and transformed down the rows, before the `+ 0`, the
/// factor 0.25 and the BF16 rounding.
///
/// # Safety
/// `x` must be valid for reads of 16 rows of 16 `f32` at row stride `ld`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn rht_sums(x: *const f32, ld: usize, flips: &[__m512i; BLOCK]) -> [__m512; BLOCK] {
    let mut v: [__m512; BLOCK] = core::array::from_fn(|i| {
        // SAFETY: row i lies inside the 16 rows the caller vouches for.
        let e = unsafe { _mm512_loadu_si512(x.add(i * ld).cast()) };
        _mm512_castsi512_ps(_mm512_xor_si512(e, flips[i]))
    });
    hadamard16_butterflies!(v, _mm512_add_ps, _mm512_sub_ps);
    v
}

/// One 16x16 block of the Hadamard staging before its BF16 rounding: [`rht_sums`], `+ 0` (a
/// -0 sum becomes +0, `crate::hadamard`, "Sign of zero"), times 0.25.
///
/// # Safety
/// `x` must be valid for reads of 16 rows of 16 `f32` at row stride `ld`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn rht_block(x: *const f32, ld: usize, flips: &[__m512i; BLOCK]) -> [__m512; BLOCK] {
    let mut v = rht_sums(x, ld, flips);
    let (zero, quarter) = (_mm512_setzero_ps(), _mm512_set1_ps(0.25));
    for e in v.iter_mut() {
        *e = _mm512_mul_ps(_mm512_add_ps(*e, zero), quarter);
    }
    v
}

/// The bits of `y` plus the BF16 rounding bias (nearest even); the rounded value is the
/// high half.
#[inline]
#[target_feature(enable = "avx512f")]
fn round_bf16(y: __m512) -> __m512i {
    let b = _mm512_castps_si512(y);
    let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(1));
    _mm512_add_epi32(b, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb))
}

/// [`rht_strip`] followed by [`vertical_stretch`] on each of its 16x16 stretches, in
/// registers: for columns `0 .. n` (`n` a multiple of 16), `dst[i · ld + c]` receives the
/// fake-quantized transform of `x[(r0 + i) · ld + c]` down `i`, with the random bytes of
/// stretch `c / 16` from blocks `q.first + c · q.stride + l · q.stride` (`q.first` is the
/// strip's block index). The same bits as the two kernels one after the other; the strip
/// must be finite (the amax pass checked it).
///
/// # Panics
/// If the strip would read outside `x` or write outside `dst`.
pub(super) fn rht_vertical_strip(
    x: &[f32],
    (ld, r0, n): (usize, usize, usize),
    dst: &mut [f32],
    mask: u16,
    q: Stretch<'_>,
) {
    assert!(n.is_multiple_of(BLOCK) && n <= ld);
    if n == 0 {
        return;
    }
    assert!(
        (r0 + BLOCK - 1) * ld + n <= x.len(),
        "rht_vertical_strip: input"
    );
    assert!(
        (BLOCK - 1) * ld + n <= dst.len(),
        "rht_vertical_strip: output"
    );
    assert!(available());
    // SAFETY: AVX-512F is present (asserted) and the bounds were checked just above.
    unsafe { rht_vertical_strip_impl(x.as_ptr().add(r0 * ld), ld, n, dst.as_mut_ptr(), mask, q) }
}

/// [`rht_vertical_strip`] after its checks, `x` pointing at the strip's first row.
///
/// # Safety
/// The CPU must support AVX-512F; `x` must be valid for reads and `dst` for writes of 16
/// rows of `n` elements at row stride `ld`; `n` a multiple of 16.
#[target_feature(enable = "avx512f")]
unsafe fn rht_vertical_strip_impl(
    x: *const f32,
    ld: usize,
    n: usize,
    dst: *mut f32,
    mask: u16,
    q: Stretch<'_>,
) {
    let flips = sign_flips(mask);
    for c in (0..n).step_by(BLOCK) {
        let first = q.first + c as u64 * q.stride;
        // SAFETY: the 16 rows of columns c .. c + 16 lie inside the strip.
        let v = rht_quantized_stretch(x.add(c), ld, &flips, Stretch { first, ..q });
        for (i, row) in v.iter().enumerate() {
            // SAFETY: as above.
            _mm512_storeu_ps(dst.add(i * ld + c), *row);
        }
    }
}

/// The 16x16 stretch at `x` (row stride `ld`) Hadamard-transformed along its rows (the
/// signs `flips`), each transformed value rounded to BF16, then fake-quantized with `q`:
/// [`rht_vertical_strip`]'s arithmetic on one stretch, row `i` in the result's `i`.
///
/// # Safety
/// The CPU must support AVX-512F; `x` must be valid for reads of 16 rows of 16 `f32` at
/// row stride `ld`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn rht_quantized_stretch(
    x: *const f32,
    ld: usize,
    flips: &[__m512i; BLOCK],
    q: Stretch<'_>,
) -> [__m512; BLOCK] {
    let hi16 = _mm512_set1_epi32(0xFFFF_0000u32 as i32);
    // SAFETY: (caller) the stretch lies in `x`.
    let mut v = unsafe { rht_block(x, ld, flips) };
    for y in v.iter_mut() {
        *y = _mm512_castsi512_ps(_mm512_and_si512(round_bf16(*y), hi16));
    }
    quantize_stretch(&mut v, q);
    v
}

/// [`rht_vertical_strip`]'s arithmetic on one packed tile: the two 16x16 stretches of K
/// rows `0 .. 32` and columns `0 .. 16` from `x` (row stride `ld`), transformed and
/// quantized as there (`q` the first stretch's settings, the second's Philox block the next
/// one), then packed two rows at a time into `tile` as a GEMM's A tile (`a_layout`) or B
/// tile, the tile's 16 rows the 16 columns: the words packing their f32 values gives, with
/// no f32 copy.
///
/// # Safety
/// The CPU must support AVX-512F, BW, DQ and BF16; `x` must be valid for reads of 32 rows
/// of 16 `f32` at row stride `ld`; `tile` must hold 256 words.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512bf16")]
pub(super) unsafe fn rht_tile_packed(
    x: *const f32,
    ld: usize,
    mask: u16,
    q: Stretch<'_>,
    (tile, a_layout): (&mut [u32], bool),
) {
    use crate::gemm::pack_avx512::{k_pair_words, store_k_pairs};
    let flips = sign_flips(mask);
    let mut w = [_mm512_setzero_si512(); BLOCK];
    for h in 0..2 {
        let first = q.first + h as u64;
        // SAFETY: (caller) rows 16 h .. 16 h + 16 of the tile's 16 columns lie in `x`.
        let v = unsafe {
            rht_quantized_stretch(x.add(h * BLOCK * ld), ld, &flips, Stretch { first, ..q })
        };
        for p in 0..BLOCK / 2 {
            w[h * BLOCK / 2 + p] = k_pair_words(v[2 * p], v[2 * p + 1]);
        }
    }
    // SAFETY: (caller) the CPU has AVX-512F; `tile` holds a tile's words.
    unsafe { store_k_pairs(&mut w, tile, a_layout) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvfp4::fast::{block_amax, fake_vertical, group_scales};
    use fp_formats::nvfp4::GlobalScale;

    /// Whether the AVX-512 kernels run here; says so when they do not (the test then skips).
    fn runs_here() -> bool {
        if !available() {
            eprintln!(
                "SKIP: the AVX-512 kernels do not run here (no AVX-512F, or NIBBLE_FORCE_PORTABLE)"
            );
        }
        available()
    }

    /// A xorshift64 stream from `seed` (non-zero).
    fn xorshift(mut s: u64) -> impl FnMut() -> u64 {
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        }
    }

    /// The vector scales against `fast::group_scales` on amaxes across every E4M3 decision
    /// point (subnormal codes, the 2^-6 boundary, ties, 448 and beyond, FLT_MAX), zero and
    /// random values, under tensor scales from tiny to huge.
    #[test]
    fn vector_scales_match_the_portable_scales() {
        if !runs_here() {
            return;
        }
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15u64);
        let mut amaxes: Vec<f32> = vec![0.0, f32::MIN_POSITIVE, 1e-45, 1.0, 6.0, 448.0 * 6.0];
        // every f32 in steps of 2^12 ulps over [2^-20, 2^16] (past and around every E4M3
        // rounding boundary once scaled), and random finite magnitudes
        let mut b = 2f32.powi(-20).to_bits();
        while b < 2f32.powi(16).to_bits() {
            amaxes.push(f32::from_bits(b));
            b += 1 << 12;
        }
        amaxes.extend((0..20_000).map(|_| f32::from_bits((next() as u32) & 0x7F7F_FFFF)));
        for tensor_amax in [1e-30f32, 1e-3, 1.0, 6.0 * 448.0, 1e4, 1e30, f32::MAX] {
            let g = GlobalScale::from_amax(tensor_amax);
            for group in amaxes.chunks(BLOCK) {
                let mut am = [0.0f32; BLOCK];
                am[..group.len()].copy_from_slice(group);
                let want = group_scales(&am, &g);
                // SAFETY: AVX-512F is present (checked above); 16 f32.
                let got = unsafe {
                    let (sf, enc) = group_scales_x16(_mm512_loadu_ps(am.as_ptr()), &g);
                    (lanes(sf), lanes(enc))
                };
                let bits = |v: [f32; BLOCK]| v.map(f32::to_bits);
                assert_eq!(
                    bits(got.0),
                    bits(want.0),
                    "scales of {am:?}, tensor {tensor_amax}"
                );
                assert_eq!(
                    bits(got.1),
                    bits(want.1),
                    "factors of {am:?}, tensor {tensor_amax}"
                );
            }
        }
    }

    /// Lane `k` of the transposing tree is block `k`'s amax, whichever lane holds it.
    #[test]
    fn block_maxima_are_each_blocks_amax() {
        if !runs_here() {
            return;
        }
        let mut next = xorshift(0x0123_4567_89ab_cdefu64);
        for case in 0..2000 {
            let mut x = [[0.0f32; BLOCK]; BLOCK];
            for (k, row) in x.iter_mut().enumerate() {
                for e in row.iter_mut() {
                    *e = (next() % 2001) as f32 - 1000.0;
                }
                // the largest magnitude in a lane that moves with the case, either sign
                let sign = if (case + k) % 2 == 0 { 1.0 } else { -1.0 };
                row[(case + 3 * k) % BLOCK] = sign * (1e4 + k as f32);
            }
            if case % 7 == 0 {
                x[case % BLOCK] = [0.0; BLOCK];
                x[(case + 1) % BLOCK] = [-0.0; BLOCK];
            }
            // SAFETY: AVX-512F is present (checked above); 16 f32 per row.
            let got = unsafe {
                let v = x.map(|row| _mm512_loadu_ps(row.as_ptr()));
                lanes(block_maxima(&v))
            };
            let want = x.map(|row| block_amax(&row));
            assert_eq!(got.map(f32::to_bits), want.map(f32::to_bits), "case {case}");
        }
    }

    /// Every combination of block sharing and rounding, on data spanning the grid's decision
    /// points, zeros, tiny and huge values, against the portable code bit for bit.
    #[test]
    fn stretch_matches_the_portable_code() {
        if !runs_here() {
            return;
        }
        let key = RngKey { seed: 7, stream: 3 };
        let mut next = xorshift(0x1234_5678_9abc_def0u64);
        for case in 0..400 {
            let mut t = [[0.0f32; BLOCK]; BLOCK];
            let scale = [1e-30f32, 1e-3, 1.0, 3.0, 1e4, 1e30][case % 6];
            for row in t.iter_mut() {
                for e in row.iter_mut() {
                    let r = next();
                    *e = match r % 8 {
                        0 => 0.0,
                        1 => -0.0,
                        2 => [0.25f32, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0][(r >> 8) as usize % 8],
                        _ => ((r >> 11) as f32 / (1u64 << 53) as f32 - 0.5) * 12.0,
                    } * scale;
                }
            }
            if case % 13 == 0 {
                t[3] = [0.0; BLOCK]; // a zero row
                for row in t.iter_mut() {
                    row[5] = 0.0; // an all-zero block
                }
            }
            let amax = t.iter().flatten().fold(0.0f32, |m, v| m.max(v.abs()));
            let g = GlobalScale::from_amax(amax);
            for tile2d in [false, true] {
                for sr in [false, true] {
                    let first = next() % 1_000_000;
                    let stride = 1 + next() % 64;
                    let mut want = t;
                    fake_vertical(&mut want, tile2d, sr, &g, key, first, stride);
                    let mut got = t;
                    let q = Stretch {
                        tile2d,
                        sr,
                        g: &g,
                        key,
                        first,
                        stride,
                    };
                    let p = got.as_mut_ptr().cast::<f32>();
                    // SAFETY: AVX-512F is present (checked above); 16 rows of 16 at stride 16.
                    unsafe { vertical_stretch(p, p, BLOCK, q) };
                    for i in 0..BLOCK {
                        for l in 0..BLOCK {
                            assert_eq!(
                                got[i][l].to_bits(),
                                want[i][l].to_bits(),
                                "case {case} tile2d {tile2d} sr {sr} ({i}, {l}): x = {:e}",
                                t[i][l]
                            );
                        }
                    }
                }
            }
        }
    }

    /// The amax pass without stores returns what the staging returns: on random data at
    /// several magnitudes, on columns whose transform reaches the top of the f32 range or
    /// overflows in the butterflies, on subnormals and signed zeros, and with a NaN or an
    /// infinity anywhere.
    #[test]
    fn strip_amax_matches_the_staging() {
        if !runs_here() {
            return;
        }
        let (ld, rows) = (48, 32);
        let check = |x: &[f32], mask: u16, what: &str| {
            let mut staged = vec![0.0f32; BLOCK * ld];
            for r0 in [0, 16] {
                for n in [16, 32, 48] {
                    let want = rht_strip(x, ld, r0, n, &mut staged, mask);
                    let got = rht_strip_amax(x, ld, r0, n, mask);
                    assert_eq!(got.1, want.1, "{what}: r0 {r0} n {n} mask {mask:#x}");
                    if !want.1 {
                        assert_eq!(got.0.to_bits(), want.0.to_bits(), "{what}: r0 {r0} n {n}");
                    }
                }
            }
        };
        let mut random = xorshift(7);
        for scale in [1.0f32, 1e-3, 1e30, 1e-41, 0.0] {
            let x: Vec<f32> = (0..ld * rows)
                .map(|_| ((random() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale)
                .collect();
            check(&x, random() as u16, &format!("random x {scale:e}"));
        }
        // a column whose signs undo the sign flips sums to 16 times its value in the first
        // output: the largest finite sums, one that rounds up in BF16, and overflowing ones
        let mask = 0b0110_1001_1100_0101u16;
        for top in [
            f32::MAX / 16.0,
            f32::from_bits(0x7F7F_8000) / 16.0,
            f32::from_bits(0x7F7F_7FFF) / 16.0,
            f32::MAX / 8.0,
            f32::MAX,
        ] {
            for sign in [1.0f32, -1.0] {
                let mut x = vec![0.5f32; ld * rows];
                for r in 0..rows {
                    let flip = if (mask >> (r % BLOCK)) & 1 == 1 {
                        -1.0
                    } else {
                        1.0
                    };
                    x[r * ld + 21] = sign * flip * top;
                }
                check(&x, mask, &format!("column of {top:e}"));
            }
        }
        let mut zeros = vec![0.0f32; ld * rows];
        zeros.iter_mut().step_by(3).for_each(|v| *v = -0.0);
        check(&zeros, mask, "signed zeros");
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for at in [0, 5 * ld + 17, 19 * ld + 47, ld * rows - 1] {
                let mut x = vec![1.0f32; ld * rows];
                x[at] = bad;
                check(&x, mask, &format!("{bad} at {at}"));
            }
        }
    }

    /// The fused strip equals `rht_strip` then `vertical_stretch` on each stretch, bit for
    /// bit, for every sharing and rounding, on a strip of several stretches at an offset.
    #[test]
    fn fused_strip_matches_the_two_kernels() {
        if !runs_here() {
            return;
        }
        let (ld, rows, r0) = (48, 40, 16);
        let x: Vec<f32> = (0..ld * rows)
            .map(|i| {
                let h = (i as u32).wrapping_mul(2_654_435_761) >> 8;
                (h as f32 / (1u32 << 24) as f32 - 0.5) * [1.0, 1e-4, 40.0][i % 3]
            })
            .collect();
        let key = RngKey { seed: 5, stream: 9 };
        let mask = 0b1011_0010_1100_0101;
        let mut staged = vec![0.0f32; BLOCK * ld];
        let (amax, bad) = rht_strip(&x, ld, r0, ld, &mut staged, mask);
        assert!(!bad);
        let g = GlobalScale::from_amax(amax);
        for tile2d in [false, true] {
            for sr in [false, true] {
                let q = Stretch {
                    tile2d,
                    sr,
                    g: &g,
                    key,
                    first: 1,
                    stride: 3,
                };
                let mut want = staged.clone();
                for c in (0..ld).step_by(BLOCK) {
                    let q = Stretch {
                        first: 1 + c as u64 * 3,
                        ..q
                    };
                    let p = want.as_mut_ptr();
                    // SAFETY: AVX-512F is present; 16 rows of 16 at stride ld from column c.
                    unsafe { vertical_stretch(p.add(c), p.add(c), ld, q) };
                }
                let mut got = vec![f32::NAN; BLOCK * ld];
                rht_vertical_strip(&x, (ld, r0, ld), &mut got, mask, q);
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g.to_bits(), w.to_bits(), "tile2d {tile2d} sr {sr} at {i}");
                }
            }
        }
    }
}

//! AVX-512 kernels of the fused MX fake quantization ([`super::fast`]): whole 32-element
//! blocks of a stored row (rowwise) and whole 32x16 tiles of a columnwise operand in the
//! source layout, one 16-lane `zmm` row at a time, with the exact IEEE operations of the
//! portable code (`crate::grid`'s saturating RNE and stochastic rounding, the scale rule of
//! [`super::MxCast`], no FMA, no reassociation) and its clipped and non-finite counts. Same
//! bits as the portable and AVX2 builds: `mx/tests.rs` runs every element format, scale rule
//! and rounding (RNE, SR, prescaled SR), with and without RHT, on edge data (huge values,
//! partial blocks and tiles, several panels) through the dispatched and the portable builds
//! and compares values, clipped counts and errors with the codes-path reference.
//!
//! The portable code keeps a tile in a stack array that the AVX2 build cannot hold in its
//! registers; here each row goes from load to store in registers, and the random bytes
//! come from the 16-lane Philox of [`crate::philox::avx512`].

use std::arch::x86_64::*;
use std::marker::PhantomData;

use fp_formats::mx::{ScaleRule, BLOCK};

use super::{Counts, MxCast};
use crate::grid::avx512::{block_maxima, lanes, round_sr, signed_product};
use crate::grid::{max, Elem};
use crate::philox::avx512::words_x16;
use crate::RngKey;

pub(super) use crate::philox::avx512::available;

/// Lanes of one register row.
const LANES: usize = 16;

/// [`Counts`] kept in vector lanes while a kernel runs (added into the caller's counts at
/// its end): clipped elements per lane, and the lanes that saw a non-finite scaled value.
struct LaneCounts {
    clipped: __m512i,
    bad: __mmask16,
}

impl LaneCounts {
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn new() -> Self {
        LaneCounts {
            clipped: _mm512_setzero_si512(),
            bad: 0,
        }
    }

    /// Adds these counts into `n`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn add_to(&self, n: &mut Counts) {
        n.clipped += _mm512_reduce_add_epi32(self.clipped) as u32 as usize;
        n.bad |= self.bad != 0;
    }
}

/// [`MxCast::block_scale`] on 16 lanes, bit for bit: lane `k`'s element multiplier and
/// scale value for the block whose largest magnitude is lane `k` of `amax` (non-negative, or
/// non-finite: then both are NaN, as the scalar rule gives). Every [`ScaleRule`] is plain
/// integer arithmetic on the bits of the amax (Rceil on those of `amax · (1 / MAX)`, the
/// same IEEE multiply), clamped to the format's largest scale; the value `2^(b - 127)` and
/// the exact reciprocal `2^(127 - b)` are built from their codes, `b = 0` giving the f32
/// subnormal 2^-127. Replaces sixteen scalar calls per group of blocks, which took about a
/// fifth of the columnwise MXFP8 quantization's time.
#[inline]
#[target_feature(enable = "avx512f")]
fn block_scales_x16<F: Elem>(c: &MxCast, amax: __m512) -> (__m512, __m512) {
    let set = _mm512_set1_epi32;
    let bits = _mm512_and_si512(_mm512_castps_si512(amax), set(0x7FFF_FFFF));
    let finite = _mm512_cmplt_epu32_mask(bits, set(0x7F80_0000));
    let exp_field = |b: __m512i| _mm512_srli_epi32::<23>(b);
    let nonzero_mantissa = |b: __m512i| _mm512_test_epi32_mask(b, set(0x007F_FFFF));
    // `E8M0::from_exponent_clamped(e - EMAX)` for the exponent field `f` (`e = f - 127`);
    // its upper clamp at 254 is subsumed by the format's (`254 - EMAX`) below
    let clamped =
        |f: __m512i| _mm512_max_epi32(_mm512_sub_epi32(f, set(F::EMAX)), _mm512_setzero_si512());
    let one = set(1);
    let code = match c.rule {
        ScaleRule::Rceil => {
            let d = _mm512_mul_ps(_mm512_castsi512_ps(bits), _mm512_set1_ps(1.0 / F::MAX));
            let d = _mm512_castps_si512(d);
            let f = exp_field(d);
            // an f32 subnormal `d` rounds up to 2^-127 unless it is at most 2^-127
            let sub = _mm512_maskz_mov_epi32(_mm512_cmpgt_epu32_mask(d, set(0x0040_0000)), one);
            let normal = _mm512_mask_add_epi32(f, nonzero_mantissa(d), f, one);
            // (`rceil_e8m0` saturates at 0xFE: subsumed by the format's clamp below)
            _mm512_mask_blend_epi32(
                _mm512_cmpeq_epi32_mask(f, _mm512_setzero_si512()),
                normal,
                sub,
            )
        }
        ScaleRule::Floor => clamped(exp_field(bits)),
        ScaleRule::Even => {
            let half = set(1 << (23 - F::MANTISSA_BITS - 1));
            clamped(exp_field(_mm512_add_epi32(bits, half)))
        }
        ScaleRule::Ceil => {
            let f = exp_field(bits);
            clamped(_mm512_mask_add_epi32(f, nonzero_mantissa(bits), f, one))
        }
    };
    let code = _mm512_min_epu32(code, set(254 - F::EMAX));
    let nan = set(f32::NAN.to_bits() as i32);
    // `E8M0::value` of codes 0 ..= 254, NaN where the amax is not finite
    let value = |b: __m512i| {
        let v = _mm512_slli_epi32::<23>(b);
        let v = _mm512_mask_mov_epi32(
            v,
            _mm512_cmpeq_epi32_mask(b, _mm512_setzero_si512()),
            set(0x0040_0000),
        );
        _mm512_castsi512_ps(_mm512_mask_mov_epi32(nan, finite, v))
    };
    let inv = value(_mm512_sub_epi32(set(254), code));
    let mul = if c.prescale {
        _mm512_mul_ps(inv, _mm512_set1_ps(0.75))
    } else {
        inv
    };
    (mul, value(code))
}

/// The broadcast constants of `F`'s grid arithmetic.
struct Grid<F> {
    abs: __m512i,
    max: __m512,
    exp: __m512i,
    min_normal: __m512,
    magic_shift: __m512i,
    mant: __m512i,
    e254: __m512i,
    byte: __m512i,
    one: __m512i,
    _f: PhantomData<F>,
}

impl<F: Elem> Grid<F> {
    #[inline]
    #[target_feature(enable = "avx512f,popcnt")]
    fn new() -> Self {
        Grid {
            abs: _mm512_set1_epi32(0x7FFF_FFFF),
            max: _mm512_set1_ps(F::MAX),
            // the exponent field's mask, which is also the bits of +Inf
            exp: _mm512_set1_epi32(0x7F80_0000),
            min_normal: _mm512_set1_ps(f32::from_bits(F::MIN_NORMAL_BITS)),
            magic_shift: _mm512_set1_epi32(((23 - F::MANTISSA_BITS) << 23) as i32),
            mant: _mm512_set1_epi32((F::MANTISSA_BITS << 23) as i32),
            e254: _mm512_set1_epi32(254 << 23),
            byte: _mm512_set1_epi32(0xFF),
            one: _mm512_set1_epi32(1),
            _f: PhantomData,
        }
    }

    /// `y = fl(x · mul)` counted into `n` (`|y| > MAX` clipped, `|y|` Inf or NaN bad), and
    /// `split`'s `(min(|y|, MAX), binade bits of it, y's bits)`.
    #[inline]
    #[target_feature(enable = "avx512f,popcnt")]
    fn scaled(&self, x: __m512, mul: __m512, n: &mut LaneCounts) -> (__m512, __m512i, __m512i) {
        let y = _mm512_castps_si512(_mm512_mul_ps(x, mul));
        let ay = _mm512_and_si512(y, self.abs);
        let ayf = _mm512_castsi512_ps(ay);
        let clipped = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(ayf, self.max);
        n.clipped = _mm512_mask_add_epi32(n.clipped, clipped, n.clipped, self.one);
        n.bad |= _mm512_cmpge_epu32_mask(ay, self.exp);
        // `ay < MAX ? ay : MAX` (NaN gives MAX): MINPS returns its second operand unless
        // the first is smaller.
        let a = _mm512_min_ps(ayf, self.max);
        // binade: `max(2^floor(log2 a), 2^emin)` as `x > y ? x : y` (MAXPS).
        let top = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(a), self.exp));
        let eb = _mm512_castps_si512(_mm512_max_ps(top, self.min_normal));
        (a, eb, y)
    }

    /// The fake-quantized `x` with RNE (`grid_rne`).
    #[inline]
    #[target_feature(enable = "avx512f,popcnt")]
    fn rne(&self, x: __m512, mul: __m512, s: __m512, n: &mut LaneCounts) -> __m512 {
        let (a, eb, y) = self.scaled(x, mul, n);
        let c = _mm512_castsi512_ps(_mm512_add_epi32(eb, self.magic_shift));
        signed_product(_mm512_sub_ps(_mm512_add_ps(a, c), c), s, y)
    }

    /// The fake-quantized `x` with stochastic rounding (`grid_sr`), one random byte per
    /// lane in `r`.
    #[inline]
    #[target_feature(enable = "avx512f,popcnt")]
    fn sr(&self, x: __m512, mul: __m512, s: __m512, r: __m512i, n: &mut LaneCounts) -> __m512 {
        let (a, eb, y) = self.scaled(x, mul, n);
        let step = _mm512_castsi512_ps(_mm512_sub_epi32(eb, self.mant));
        let inv_step =
            _mm512_castsi512_ps(_mm512_add_epi32(_mm512_sub_epi32(self.e254, eb), self.mant));
        signed_product(round_sr(a, step, inv_step, r), s, y)
    }
}

/// Fake-quantizes the `blocks` whole 32-element blocks of one stored row, read at `src` and
/// written at `dst` (`src` may equal `dst`), the random bytes of block `b` (with stochastic
/// rounding) at `rbits + 32 b`. Returns the largest block amax. Sixteen blocks at a time:
/// their amaxes by one transposing tree of maxima (`grid::avx512::block_maxima`) and their
/// scales before any element, so no element waits on its block's horizontal reduction and
/// scale (the MXFP8 Fprop GEMM 2048 x 352 x 128 with its quantization 5% faster on one
/// thread, together with the clipped counts kept in vector lanes).
///
/// # Safety
/// The CPU must support AVX-512F ([`available`]); `src` must be valid for reads and `dst`
/// for writes of `32 · blocks` `f32` (the same memory or disjoint), `rbits` for reads of
/// `32 · blocks` bytes.
#[target_feature(enable = "avx512f,popcnt")]
pub(super) unsafe fn row_blocks<F: Elem>(
    c: &MxCast,
    src: *const f32,
    dst: *mut f32,
    blocks: usize,
    rbits: Option<*const u8>,
    counts: &mut Counts,
) -> f32 {
    let g = Grid::<F>::new();
    let n = &mut LaneCounts::new();
    let mut amax = 0.0f32;
    // 16 blocks at a time: their amaxes by one tree of maxima and their scales, then the
    // elements (the blocks are read again, from L1)
    for b0 in (0..blocks).step_by(LANES) {
        let nb = (blocks - b0).min(LANES);
        let mut m = [_mm512_setzero_ps(); LANES];
        for (k, m) in m.iter_mut().enumerate().take(nb) {
            let p = src.add((b0 + k) * BLOCK);
            let (x0, x1) = (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(LANES)));
            *m = _mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1));
        }
        let maxima = block_maxima(&m);
        let m = lanes(maxima);
        for &mk in &m[..nb] {
            amax = max(amax, mk);
        }
        let (muls, scales) = block_scales_x16::<F>(c, maxima);
        let (muls, scales) = (lanes(muls), lanes(scales));
        for k in 0..nb {
            let b = b0 + k;
            let (x0, x1) = (
                _mm512_loadu_ps(src.add(b * BLOCK)),
                _mm512_loadu_ps(src.add(b * BLOCK + LANES)),
            );
            let (mul, s) = (_mm512_set1_ps(muls[k]), _mm512_set1_ps(scales[k]));
            let (y0, y1) = match rbits {
                None => (g.rne(x0, mul, s, n), g.rne(x1, mul, s, n)),
                Some(r) => {
                    let r0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(r.add(b * BLOCK).cast()));
                    let r1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(r.add(b * BLOCK + LANES).cast()));
                    (g.sr(x0, mul, s, r0, n), g.sr(x1, mul, s, r1, n))
                }
            };
            _mm512_storeu_ps(dst.add(b * BLOCK), y0);
            _mm512_storeu_ps(dst.add(b * BLOCK + LANES), y1);
        }
    }
    n.add_to(counts);
    amax
}

/// Fake-quantizes one whole 32x16 tile of a columnwise operand in the source layout: row
/// `i` (16 lanes, one stored block each) read at `src + i · ld` and written at `dst + i ·
/// ld` (disjoint). With stochastic rounding, `rand = (key, first, stride)`: rows `16 h ..
/// 16 h + 16` of lane `l` use the bytes of Philox block `first + h + l · stride`. Returns
/// the largest lane amax.
///
/// # Safety
/// The CPU must support AVX-512F ([`available`]); `src` must be valid for reads and `dst`
/// for writes of 32 rows of 16 `f32` at stride `ld`, not overlapping.
#[target_feature(enable = "avx512f,popcnt")]
pub(super) unsafe fn vertical_tile<F: Elem>(
    c: &MxCast,
    src: *const f32,
    dst: *mut f32,
    ld: usize,
    rand: Option<(RngKey, u64, u64)>,
    counts: &mut Counts,
) -> f32 {
    // SAFETY: (caller) row i lies at `dst + i · ld`.
    let store = |i: usize, y: __m512| unsafe { _mm512_storeu_ps(dst.add(i * ld), y) };
    vertical_rows::<F>(c, src, ld, rand, counts, store)
}

/// [`vertical_tile`] packed straight into one BF16 GEMM tile (A tiles when `a_layout`,
/// else B tiles): the tile's 16 rows are the 16 lanes, its K the 32 rows, the same words as
/// packing [`vertical_tile`]'s output, two rows at a time as they come out
/// ([`crate::gemm::pack_avx512::k_pair_words`]), with no f32 copy. Returns the largest lane
/// amax.
///
/// # Safety
/// As [`vertical_tile`] for `src`; the CPU must also have AVX-512BW, DQ and BF16; `tile`
/// must hold 256 words.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512bf16,popcnt")]
pub(super) unsafe fn vertical_tile_packed<F: Elem>(
    c: &MxCast,
    src: *const f32,
    ld: usize,
    rand: Option<(RngKey, u64, u64)>,
    counts: &mut Counts,
    (tile, a_layout): (&mut [u32], bool),
) -> f32 {
    use crate::gemm::pack_avx512::{k_pair_words, store_k_pairs};
    let tile = &mut tile[..LANES * LANES];
    // rows 2p and 2p + 1 make K pair p of the tile, packed as soon as both are out: a B
    // tile's row p at once, an A tile's after the 16 rows are transposed
    let (mut lo, mut w) = (_mm512_setzero_ps(), [_mm512_setzero_si512(); LANES]);
    let amax = vertical_rows::<F>(c, src, ld, rand, counts, |i, y| {
        if i % 2 == 0 {
            lo = y;
        } else if a_layout {
            w[i / 2] = k_pair_words(lo, y);
        } else {
            let row = &mut tile[i / 2 * LANES..][..LANES];
            // SAFETY: 16 words in bounds.
            unsafe { _mm512_storeu_si512(row.as_mut_ptr().cast(), k_pair_words(lo, y)) };
        }
    });
    if a_layout {
        // SAFETY: (caller) the CPU has AVX-512F; `tile` holds a tile's words.
        unsafe { store_k_pairs(&mut w, tile, true) };
    }
    amax
}

/// [`vertical_tile`]'s arithmetic, handing row `i`'s values to `emit(i, y)`.
///
/// # Safety
/// As [`vertical_tile`] for `src`.
#[inline]
#[target_feature(enable = "avx512f,popcnt")]
unsafe fn vertical_rows<F: Elem>(
    c: &MxCast,
    src: *const f32,
    ld: usize,
    rand: Option<(RngKey, u64, u64)>,
    counts: &mut Counts,
    mut emit: impl FnMut(usize, __m512),
) -> f32 {
    let g = Grid::<F>::new();
    let n = &mut LaneCounts::new();
    let mut amax = _mm512_setzero_ps();
    for i in 0..BLOCK {
        amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(src.add(i * ld))));
    }
    let am = lanes(amax);
    let (mul, s) = block_scales_x16::<F>(c, amax);
    match rand {
        None => {
            for i in 0..BLOCK {
                emit(i, g.rne(_mm512_loadu_ps(src.add(i * ld)), mul, s, n));
            }
        }
        Some((key, first, stride)) => {
            for h in 0..2 {
                let words = words_x16(key, first + h as u64, stride);
                for i in 0..LANES {
                    let row = LANES * h + i;
                    // byte i of lane l's block: bits 8 (i % 4) .. of its word i / 4
                    let sh = _mm512_set1_epi32(8 * (i % 4) as i32);
                    let r = _mm512_and_si512(_mm512_srlv_epi32(words[i / 4], sh), g.byte);
                    emit(row, g.sr(_mm512_loadu_ps(src.add(row * ld)), mul, s, r, n));
                }
            }
        }
    }
    n.add_to(counts);
    am.iter().fold(0.0f32, |m, &a| max(m, a))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Rht;
    use fp_formats::mx::MxElement;
    use fp_formats::{E2M1, E2M3, E3M2, E4M3, E5M2};

    /// Block amaxes that reach every branch of every scale rule: each exponent field with
    /// mantissas at and around the rounding points (Even's half, Rceil's subnormal 2^-127),
    /// the neighbours of `MAX · 2^k` where Rceil's quotient crosses a power of two, zero,
    /// the largest finite value, infinity and NaN.
    fn amaxes<F: Elem>() -> Vec<f32> {
        let mut v = Vec::new();
        for f in 0u32..=255 {
            for m in [
                0u32, 1, 2, 0x1F_FFFF, 0x20_0000, 0x3F_FFFF, 0x40_0000, 0x40_0001, 0x7F_FFFF,
            ] {
                v.push(f32::from_bits(f << 23 | m));
            }
            for m in (0..0x80_0000).step_by(0x7_3FF1) {
                v.push(f32::from_bits(f << 23 | m));
            }
        }
        for k in -150..130 {
            let b = (F::MAX * 2f32.powi(k)).to_bits();
            for d in -3i32..=3 {
                v.push(f32::from_bits(b.wrapping_add_signed(d)));
            }
        }
        v.extend([0.0, f32::MIN_POSITIVE, f32::MAX, f32::INFINITY, f32::NAN]);
        v.retain(|x| !x.is_sign_negative());
        v
    }

    fn check<F: Elem>(element: MxElement) {
        let xs = amaxes::<F>();
        for rule in [
            ScaleRule::Rceil,
            ScaleRule::Floor,
            ScaleRule::Even,
            ScaleRule::Ceil,
        ] {
            for prescale in [false, true] {
                let c = MxCast {
                    element,
                    rule,
                    sr: None,
                    prescale,
                    rht: Rht::Off,
                    key: RngKey { seed: 0, stream: 0 },
                };
                for group in xs.chunks(LANES) {
                    let mut a = [0.0f32; LANES];
                    a[..group.len()].copy_from_slice(group);
                    // SAFETY: AVX-512F is present (checked by the caller); 16 f32.
                    let (mul, s) =
                        unsafe { block_scales_x16::<F>(&c, _mm512_loadu_ps(a.as_ptr())) };
                    let (mul, s) = unsafe { (lanes(mul), lanes(s)) };
                    for (k, &x) in a.iter().enumerate() {
                        let (scale, m) = c.block_scale::<F>(x);
                        let what = format!(
                            "{element:?} {rule:?} prescale {prescale}, amax {x:e} ({:#x})",
                            x.to_bits()
                        );
                        assert_eq!(mul[k].to_bits(), m.to_bits(), "multiplier, {what}");
                        assert_eq!(s[k].to_bits(), scale.value().to_bits(), "scale, {what}");
                    }
                }
            }
        }
    }

    #[test]
    fn block_scales_x16_equal_the_scalar_rule() {
        if !available() {
            eprintln!(
                "SKIP: the AVX-512 kernels do not run here (no AVX-512F, or NIBBLE_FORCE_PORTABLE)"
            );
            return;
        }
        check::<E4M3>(MxElement::E4M3);
        check::<E5M2>(MxElement::E5M2);
        check::<E2M3>(MxElement::E2M3);
        check::<E3M2>(MxElement::E3M2);
        check::<E2M1>(MxElement::E2M1);
    }
}

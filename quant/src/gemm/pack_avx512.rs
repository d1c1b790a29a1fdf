//! AVX-512 packing of one 16 x 32 tile (see [`super::pack`]) for the two view layouts that
//! training uses: K contiguous (row-major operands) and rows contiguous (transposed views,
//! the Wgrad operands and W in Dgrad). Sixteen 32-bit words at a time: f32 values rounded
//! to BF16 (nearest even, NaN quieted) exactly as [`super::bf16::bf16_bits`] by
//! `vcvtne2ps2bf16` (32 values per instruction; a line holding an f32 subnormal, which the
//! instruction reads as zero, takes the bit arithmetic instead), pairs formed along K, and
//! the 16 x 16 block of pair words transposed in registers when the tile wants the other
//! orientation. The same words as the scalar packing (the tests compare them).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::bf16::{CHUNK, TILE, TILE_WORDS};
use super::MatRef;

/// The BF16 rounding of sixteen f32 values, in the high half of each 32-bit lane (the low
/// half is garbage): `b + 0x7fff + lsb`, or `b | 0x0040_0000` for a NaN (quieted).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn round_high(x: __m512) -> __m512i {
    let b = _mm512_castps_si512(x);
    let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(1));
    let rounded = _mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
    _mm512_mask_blend_epi32(
        nan,
        rounded,
        _mm512_or_si512(b, _mm512_set1_epi32(0x0040_0000)),
    )
}

/// Pair words from two vectors of rounded values: `lo`'s BF16 in the low half, `hi`'s in
/// the high half of each lane (element `2p` before `2p + 1` in memory, little-endian).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn pair_words(lo: __m512i, hi: __m512i) -> __m512i {
    let hi_mask = _mm512_set1_epi32(0xffff_0000u32 as i32);
    _mm512_or_si512(_mm512_srli_epi32::<16>(lo), _mm512_and_si512(hi, hi_mask))
}

/// `r[y][x] = r[x][y]`: a 16 x 16 block of 32-bit words transposed in registers.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn transpose16(r: &mut [__m512i; 16]) {
    let mut t = [_mm512_setzero_si512(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    // u[4i + j], 128-bit lane L: column 4L + j of rows 4i .. 4i + 3
    let mut u = [_mm512_setzero_si512(); 16];
    for i in 0..4 {
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    // row 4L + j = lane L of u[j], u[4 + j], u[8 + j], u[12 + j]
    for j in 0..4 {
        let s0 = _mm512_shuffle_i32x4::<0b01_00_01_00>(u[j], u[4 + j]);
        let s1 = _mm512_shuffle_i32x4::<0b11_10_11_10>(u[j], u[4 + j]);
        let s2 = _mm512_shuffle_i32x4::<0b01_00_01_00>(u[8 + j], u[12 + j]);
        let s3 = _mm512_shuffle_i32x4::<0b11_10_11_10>(u[8 + j], u[12 + j]);
        r[j] = _mm512_shuffle_i32x4::<0b10_00_10_00>(s0, s2);
        r[4 + j] = _mm512_shuffle_i32x4::<0b11_01_11_01>(s0, s2);
        r[8 + j] = _mm512_shuffle_i32x4::<0b10_00_10_00>(s1, s3);
        r[12 + j] = _mm512_shuffle_i32x4::<0b11_01_11_01>(s1, s3);
    }
}

/// Whether any of the 16 values is an f32 subnormal, which the conversion instruction
/// would read as zero where [`super::bf16::bf16_bits`] rounds it (to a BF16 subnormal, or
/// up to the smallest normal).
#[inline]
#[target_feature(enable = "avx512f,avx512dq")]
fn subnormal(x: __m512) -> __mmask16 {
    _mm512_fpclass_ps_mask::<0x20>(x)
}

/// The 32 BF16 values of `lo` then `hi` (round to nearest even, NaN quieted), in order:
/// `vcvtne2ps2bf16`, which equals [`round_high`] on every input but an f32 subnormal (the
/// callers check for those).
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
fn convert(lo: __m512, hi: __m512) -> __m512i {
    // SAFETY: a plain reinterpretation of 512 bits.
    unsafe { std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo)) }
}

/// The first `n` of 16 lanes.
#[inline(always)]
fn lanes(n: usize) -> __mmask16 {
    if n >= 16 {
        0xffff
    } else {
        ((1u32 << n) - 1) as __mmask16
    }
}

/// Packs tile `(i, t)` of `x` (rows `16i ..`, K `32t ..`, zero-padded) into `tile` as
/// [`super::pack::pack_tile`] does, when the view is K-contiguous (`col_stride == 1`) or
/// rows-contiguous (`row_stride == 1`); returns `false` without writing for other strides.
/// `i` must name a tile with at least one row of `x`.
///
/// Each line of 32 (or pair of lines of 16) values is converted by one `vcvtne2ps2bf16`
/// unless it holds an f32 subnormal, which goes through the bit arithmetic of
/// [`round_high`] instead (the instruction reads such inputs as zero).
///
/// # Safety
/// The CPU must have AVX-512F, BW, DQ and BF16; `x` must fit its storage ([`MatRef::fits`]).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512bf16")]
pub(super) unsafe fn pack_tile(
    x: MatRef<'_>,
    i: usize,
    t: usize,
    tile: &mut [u32],
    a_layout: bool,
) -> bool {
    let rows_here = x.rows.saturating_sub(i * TILE).min(TILE);
    let (k0, kn) = (t * CHUNK, (x.cols - t * CHUNK).min(CHUNK));
    debug_assert!(rows_here > 0 && kn > 0 && x.fits());
    let tile = &mut tile[..TILE_WORDS];
    let mut w = [_mm512_setzero_si512(); TILE];
    // `w[r]`: the 16 pair words of row r (A orientation), or of pair r (B orientation)
    let by_rows = if x.col_stride == 1 {
        let (m0, m1) = (lanes(kn), lanes(kn.saturating_sub(16)));
        for (r, wr) in w.iter_mut().enumerate().take(rows_here) {
            // in bounds: the row's first element lies in the view (it fits its storage)
            let p = x.data.as_ptr().add((i * TILE + r) * x.row_stride + k0);
            let x0 = _mm512_maskz_loadu_ps(m0, p);
            // (no lanes read when the row has at most 16 values left)
            let x1 = _mm512_maskz_loadu_ps(m1, p.wrapping_add(16));
            *wr = if subnormal(x0) | subnormal(x1) == 0 {
                convert(x0, x1)
            } else {
                // the odd 16-bit halves (the BF16 values) of v0 then v1, in K order
                let odd = _mm512_set_epi16(
                    63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27, 25,
                    23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1,
                );
                _mm512_permutex2var_epi16(round_high(x0), odd, round_high(x1))
            };
        }
        true
    } else if x.row_stride == 1 {
        let m = lanes(rows_here);
        for (p, wp) in w.iter_mut().enumerate().take(kn.div_ceil(2)) {
            let (lo, hi) = (2 * p, 2 * p + 1);
            // in bounds: line k0 + kk < K starts inside the view; lanes past its rows masked
            let at = |kk: usize| x.data.as_ptr().add((k0 + kk) * x.col_stride + i * TILE);
            let lo = _mm512_maskz_loadu_ps(m, at(lo));
            let hi = if hi < kn {
                _mm512_maskz_loadu_ps(m, at(hi))
            } else {
                _mm512_setzero_ps()
            };
            *wp = k_pair_words(lo, hi);
        }
        false
    } else {
        return false;
    };
    if by_rows != a_layout {
        transpose16(&mut w);
    }
    for (dst, v) in tile.chunks_exact_mut(TILE).zip(w) {
        _mm512_storeu_si512(dst.as_mut_ptr().cast(), v);
    }
    true
}

/// The 16 pair words of K pair `(lo, hi)` (one value per lane, the lanes the tile's 16
/// rows): each lane's two values rounded to BF16 as [`pack_tile`] rounds them, `lo`'s in the
/// low half. Row `p` of a B tile whose K values `2p`, `2p + 1` these are (a tile of a
/// rows-contiguous view, as a columnwise quantizer produces it in the source layout); an A
/// tile holds the transposed words ([`store_k_pairs`]).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512bf16")]
pub(crate) fn k_pair_words(lo: __m512, hi: __m512) -> __m512i {
    if subnormal(lo) | subnormal(hi) == 0 {
        // lo's 16 values then hi's, interleaved into pair words
        let interleave = _mm512_set_epi16(
            31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20,
            4, 19, 3, 18, 2, 17, 1, 16, 0,
        );
        _mm512_permutexvar_epi16(interleave, convert(lo, hi))
    } else {
        // SAFETY: the CPU has AVX-512F (this function's features).
        unsafe { pair_words(round_high(lo), round_high(hi)) }
    }
}

/// Stores the 16 K-pair rows `w` of [`k_pair_words`] as one tile: an A tile when
/// `a_layout` (transposed first), else a B tile; the words [`pack_tile`] packs from a view
/// holding those values.
///
/// # Safety
/// The CPU must have AVX-512F; `tile` must hold 256 words.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn store_k_pairs(w: &mut [__m512i; TILE], tile: &mut [u32], a_layout: bool) {
    if a_layout {
        transpose16(w);
    }
    for (dst, v) in tile[..TILE_WORDS].chunks_exact_mut(TILE).zip(w.iter()) {
        _mm512_storeu_si512(dst.as_mut_ptr().cast(), *v);
    }
}

#[cfg(test)]
mod tests {
    use super::super::pack::{check_packer_for_tests, edge_values_for_tests as edge, wide_packing};
    use super::*;

    #[test]
    fn packs_the_scalar_words_for_both_layouts_and_orientations() {
        if !wide_packing() {
            eprintln!(
                "SKIP: the AVX-512 packing does not run here (it needs AVX512_BF16, BW, VL and DQ, and no NIBBLE_FORCE_PORTABLE); the scalar packing is what runs"
            );
            return;
        }
        // rows x K with partial tiles and chunks; stored row-major and transposed; with
        // the f32 subnormals (nearly every line has one: the bit-arithmetic fallback) and
        // without them (the conversion instruction on NaN, infinities, ties, overflow)
        let shapes = [(16, 32), (37, 75), (5, 33), (40, 1), (16, 17)];
        for ((rows, k), normal) in shapes.into_iter().flat_map(|s| [(s, false), (s, true)]) {
            let mut v = edge(rows * k);
            if normal {
                for x in v.iter_mut().filter(|x| x.is_subnormal()) {
                    *x = f32::from_bits(x.to_bits() | 0x0080_0000);
                }
            }
            // SAFETY: checked just above; the views fit their storage
            let packer =
                |x: MatRef<'_>, i, t, tile: &mut [u32], a| unsafe { pack_tile(x, i, t, tile, a) };
            check_packer_for_tests(&v, (rows, k), packer, &format!("normal {normal}"));
        }
    }
}

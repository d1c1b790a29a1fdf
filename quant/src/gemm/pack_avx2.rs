//! AVX2 packing of one 16 x 32 tile (see [`super::pack`]) for the two view layouts that
//! training uses: K contiguous (row-major operands) and rows contiguous (transposed views,
//! the Wgrad operands and W in Dgrad), on CPUs without AVX-512 (where the pair arithmetic
//! runs on FMAs, [`super::fma_pairs`]). Eight 32-bit words at a time: f32 values rounded to
//! BF16 (nearest even, NaN quieted) by the bit arithmetic of [`super::bf16::bf16_bits`]
//! (AVX2 has no conversion instruction; the arithmetic is exact for every input, f32
//! subnormals included), pairs formed along K, and the 16 x 16 block of pair words
//! transposed in registers (four 8 x 8 transposes) when the tile wants the other
//! orientation. The same words as the scalar packing (the tests compare them). The packing
//! loops call it for the tiles that transpose, where it is about 1.5x faster than the
//! compiled scalar code; for the others the compiler's vectorisation of the scalar code is
//! as fast.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::bf16::{CHUNK, TILE, TILE_WORDS};
use super::MatRef;
use crate::nvfp4::avx2::transpose8;

/// The BF16 rounding of eight f32 values, in the high half of each 32-bit lane (the low
/// half is garbage): `b + 0x7fff + lsb`, or `b | 0x0040_0000` for a NaN (quieted), as
/// [`super::bf16::bf16_bits`].
#[inline]
#[target_feature(enable = "avx2")]
fn round_high(x: __m256) -> __m256i {
    let b = _mm256_castps_si256(x);
    let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(b), _mm256_set1_epi32(1));
    let rounded = _mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    let quiet = _mm256_or_si256(b, _mm256_set1_epi32(0x0040_0000));
    let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(x, x));
    _mm256_blendv_epi8(rounded, quiet, nan)
}

/// Pair words from two vectors of rounded values: `lo`'s BF16 in the low half, `hi`'s in
/// the high half of each lane (element `2p` before `2p + 1` in memory, little-endian).
#[inline]
#[target_feature(enable = "avx2")]
fn pair_words(lo: __m256i, hi: __m256i) -> __m256i {
    let hi_mask = _mm256_set1_epi32(0xffff_0000u32 as i32);
    _mm256_or_si256(_mm256_srli_epi32::<16>(lo), _mm256_and_si256(hi, hi_mask))
}

/// The sixteen BF16 values of `a` (elements 0 .. 8) then `b` (8 .. 16), rounded
/// ([`round_high`]), in order: eight pair words along K.
#[inline]
#[target_feature(enable = "avx2")]
fn k_pairs(a: __m256, b: __m256) -> __m256i {
    // after the shift each lane holds its BF16 (< 2^16), so the saturating pack keeps it;
    // the pack interleaves the 128-bit lanes of a and b, the permute restores the order
    let a = _mm256_srli_epi32::<16>(round_high(a));
    let b = _mm256_srli_epi32::<16>(round_high(b));
    _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(a, b))
}

/// Lane mask of the first `n` of eight lanes (all when `n >= 8`).
#[inline]
#[target_feature(enable = "avx2")]
fn lanes(n: usize) -> __m256i {
    let n = n.min(8) as i32;
    _mm256_cmpgt_epi32(
        _mm256_set1_epi32(n),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    )
}

/// Eight f32 values from `p`, the lanes outside `mask` read as +0 (and not touched).
///
/// # Safety
/// The CPU must have AVX2; the lanes of `mask` must be readable.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load(p: *const f32, mask: __m256i) -> __m256 {
    // SAFETY: (caller) only the lanes of `mask` are read.
    unsafe { _mm256_maskload_ps(p, mask) }
}

/// `w` (16 rows of 16 words as two halves each) transposed in words: `w[y][x] = w[x][y]`.
#[inline]
#[target_feature(enable = "avx2")]
fn transpose16(w: &mut [[__m256i; 2]; TILE]) {
    let block = |w: &[[__m256i; 2]; TILE], rb: usize, half: usize| -> [__m256; 8] {
        std::array::from_fn(|r| _mm256_castsi256_ps(w[8 * rb + r][half]))
    };
    // SAFETY: the CPU has AVX2 (this function's own target feature).
    let t = unsafe {
        [
            transpose8(block(w, 0, 0)),
            transpose8(block(w, 0, 1)),
            transpose8(block(w, 1, 0)),
            transpose8(block(w, 1, 1)),
        ]
    };
    // output row block Y, half X = the transpose of input row block X, half Y
    for r in 0..8 {
        w[r] = [_mm256_castps_si256(t[0][r]), _mm256_castps_si256(t[2][r])];
        w[8 + r] = [_mm256_castps_si256(t[1][r]), _mm256_castps_si256(t[3][r])];
    }
}

/// Packs tile `(i, t)` of `x` (rows `16i ..`, K `32t ..`, zero-padded) into `tile` as
/// [`super::pack::pack_tile`] does, when the view is K-contiguous (`col_stride == 1`) or
/// rows-contiguous (`row_stride == 1`); returns `false` without writing for other strides.
/// `i` must name a tile with at least one row of `x`.
///
/// # Safety
/// The CPU must have AVX2; `x` must fit its storage ([`MatRef::fits`]).
#[target_feature(enable = "avx2")]
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
    let zero = _mm256_setzero_si256();
    let mut w = [[zero; 2]; TILE];
    // `w[r]`: the 16 pair words of row r (A orientation), or of pair r (B orientation)
    let by_rows = if x.col_stride == 1 {
        let masks: [__m256i; 4] = std::array::from_fn(|q| lanes(kn.saturating_sub(8 * q)));
        for (r, wr) in w.iter_mut().enumerate().take(rows_here) {
            // in bounds: the row's first element lies in the view (it fits its storage),
            // and only its first `kn` values are read
            let p = x.data.as_ptr().add((i * TILE + r) * x.row_stride + k0);
            let v: [__m256; 4] = std::array::from_fn(|q| load(p.wrapping_add(8 * q), masks[q]));
            *wr = [k_pairs(v[0], v[1]), k_pairs(v[2], v[3])];
        }
        true
    } else if x.row_stride == 1 {
        let (m0, m1) = (lanes(rows_here), lanes(rows_here.saturating_sub(8)));
        for (p, wp) in w.iter_mut().enumerate().take(kn.div_ceil(2)) {
            let (lo, hi) = (2 * p, 2 * p + 1);
            // in bounds: line k0 + kk < K starts inside the view; lanes past its rows masked
            let at = |kk: usize| x.data.as_ptr().add((k0 + kk) * x.col_stride + i * TILE);
            let line = |kk: usize| {
                let p = at(kk);
                [load(p, m0), load(p.wrapping_add(8), m1)]
            };
            let l = line(lo);
            let h = if hi < kn {
                line(hi)
            } else {
                [_mm256_setzero_ps(); 2]
            };
            *wp = [
                pair_words(round_high(l[0]), round_high(h[0])),
                pair_words(round_high(l[1]), round_high(h[1])),
            ];
        }
        false
    } else {
        return false;
    };
    if by_rows != a_layout {
        transpose16(&mut w);
    }
    for (dst, v) in tile.chunks_exact_mut(TILE).zip(w) {
        _mm256_storeu_si256(dst.as_mut_ptr().cast(), v[0]);
        _mm256_storeu_si256(dst.as_mut_ptr().add(8).cast(), v[1]);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::super::pack::{check_packer_for_tests, edge_values_for_tests as edge};
    use super::*;

    #[test]
    fn packs_the_scalar_words_for_both_layouts_and_orientations() {
        if !fp_formats::cpu::has_avx2() {
            eprintln!("SKIP: no AVX2 on this CPU (or NIBBLE_FORCE_PORTABLE): the scalar packing is what runs");
            return;
        }
        // rows x K with partial tiles and chunks (every remainder of 8 in both), stored
        // row-major and transposed
        let shapes = [
            (16, 32),
            (37, 75),
            (5, 33),
            (40, 1),
            (16, 17),
            (9, 7),
            (23, 58),
        ];
        for (rows, k) in shapes {
            let v = edge(rows * k);
            // SAFETY: checked just above; the views fit their storage
            let packer =
                |x: MatRef<'_>, i, t, tile: &mut [u32], a| unsafe { pack_tile(x, i, t, tile, a) };
            check_packer_for_tests(&v, (rows, k), packer, "avx2");
        }
    }

    #[test]
    fn declines_views_with_neither_axis_contiguous() {
        if !fp_formats::cpu::has_avx2() {
            eprintln!("SKIP: no AVX2 on this CPU (or NIBBLE_FORCE_PORTABLE)");
            return;
        }
        let v = edge(64);
        // every other column of an [4, 16] matrix: strides (16, 2)
        let x = MatRef {
            data: &v,
            rows: 4,
            cols: 8,
            row_stride: 16,
            col_stride: 2,
        };
        let mut tile = vec![5u32; TILE_WORDS];
        // SAFETY: AVX2 checked; the view fits its storage
        assert!(!unsafe { pack_tile(x, 0, 0, &mut tile, true) });
        assert!(tile.iter().all(|&w| w == 5), "declined without writing");
    }
}

//! The block-scale layout of the Blackwell block-scaled GEMM (cuBLASLt `VEC16_UE4M3` /
//! `VEC32_UE8M0` scale modes; docs/numerics.md#scale-swizzle), as a CPU function.
//!
//! A scale matrix `[rows, scale_cols]` (one byte per block, row-major, the layout of
//! `quant::QuantizedTensor::scales`) is zero-padded to `[round_up(rows, 128),
//! round_up(scale_cols, 4)]` and cut into 128x4 tiles; each tile is 512 contiguous bytes, tiles
//! are ordered by row block then column block, and inside a tile element `(r, c)` with
//! `r = 32 * d4 + d3`, `c = d5` sits at byte `16 * d3 + 4 * d4 + d5`. In one formula
//! (Transformer Engine's `scale_factor_swizzled_offset`):
//!
//! ```text
//! rb = r / 128, rem = r % 128, d4 = rem / 32, d3 = rem % 32, cbg = c / 4, d5 = c % 4
//! offset = ((rb * cbg_cnt + cbg) * 32 + d3) * 16 + d4 * 4 + d5,  cbg_cnt = ceil(scale_cols / 4)
//! ```
//!
//! The GPU kernel `nb_swizzle_scales` (cuda/nvfp4.cu) uses the same formula; the GPU tests
//! compare it with [`swizzle_scales`].

/// The padded shape `(round_up(rows, 128), round_up(scale_cols, 4))` of the swizzled buffer.
///
/// ```
/// assert_eq!(kernels_cuda::swizzle::swizzled_shape(130, 5), (256, 8));
/// ```
pub const fn swizzled_shape(rows: usize, scale_cols: usize) -> (usize, usize) {
    (rows.div_ceil(128) * 128, scale_cols.div_ceil(4) * 4)
}

/// Byte offset of scale `(r, c)` in the swizzled buffer of a matrix with `scale_cols`
/// scale columns.
///
/// ```
/// use kernels_cuda::swizzle::swizzled_offset;
/// assert_eq!(swizzled_offset(0, 0, 8), 0);
/// assert_eq!(swizzled_offset(1, 0, 8), 16);
/// assert_eq!(swizzled_offset(32, 0, 8), 4);
/// assert_eq!(swizzled_offset(0, 4, 8), 512);
/// assert_eq!(swizzled_offset(128, 0, 8), 1024);
/// ```
#[inline]
pub const fn swizzled_offset(r: usize, c: usize, scale_cols: usize) -> usize {
    let cbg_cnt = scale_cols.div_ceil(4);
    let (rb, rem) = (r / 128, r % 128);
    let (d4, d3) = (rem / 32, rem % 32);
    let (cbg, d5) = (c / 4, c % 4);
    ((rb * cbg_cnt + cbg) * 32 + d3) * 16 + d4 * 4 + d5
}

/// Swizzles a row-major `[rows, scale_cols]` scale matrix into the zero-padded 128x4-tile
/// layout (length `round_up(rows, 128) * round_up(scale_cols, 4)`).
///
/// # Panics
/// If `scales.len() != rows * scale_cols`.
pub fn swizzle_scales(scales: &[u8], rows: usize, scale_cols: usize) -> Vec<u8> {
    assert_eq!(scales.len(), rows * scale_cols, "scale matrix length");
    let (pr, pc) = swizzled_shape(rows, scale_cols);
    let mut out = vec![0u8; pr * pc];
    for r in 0..rows {
        for c in 0..scale_cols {
            out[swizzled_offset(r, c, scale_cols)] = scales[r * scale_cols + c];
        }
    }
    out
}

/// The inverse of [`swizzle_scales`] (padding dropped).
///
/// # Panics
/// If `swizzled` does not have the padded length.
pub fn unswizzle_scales(swizzled: &[u8], rows: usize, scale_cols: usize) -> Vec<u8> {
    let (pr, pc) = swizzled_shape(rows, scale_cols);
    assert_eq!(swizzled.len(), pr * pc, "swizzled scale length");
    let mut out = vec![0u8; rows * scale_cols];
    for r in 0..rows {
        for c in 0..scale_cols {
            out[r * scale_cols + c] = swizzled[swizzled_offset(r, c, scale_cols)];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The documented formula, written out literally (docs/numerics.md#scale-swizzle).
    fn spec_offset(r: usize, c: usize, cols_of_scale: usize) -> usize {
        let rb = r / 128;
        let rem = r % 128;
        let d4 = rem / 32;
        let d3 = rem % 32;
        let cbg = c / 4;
        let d5 = c % 4;
        let cbg_cnt = cols_of_scale.div_ceil(4);
        ((rb * cbg_cnt + cbg) * 32 + d3) * 16 + d4 * 4 + d5
    }

    /// The layout built tile by tile from its description: tiles of 128 rows x 4 columns,
    /// ordered row block then column block, each 512 bytes as `[d3: 32][d4: 4][d5: 4]`.
    fn tile_by_tile(scales: &[u8], rows: usize, cols: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for rb in 0..rows.div_ceil(128) {
            for cb in 0..cols.div_ceil(4) {
                for d3 in 0..32 {
                    for d4 in 0..4 {
                        for d5 in 0..4 {
                            let (r, c) = (rb * 128 + d4 * 32 + d3, cb * 4 + d5);
                            out.push(if r < rows && c < cols {
                                scales[r * cols + c]
                            } else {
                                0
                            });
                        }
                    }
                }
            }
        }
        out
    }

    fn pattern(n: usize) -> Vec<u8> {
        (0..n)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) as u8 | 1)
            .collect()
    }

    #[test]
    fn offset_matches_spec_formula() {
        for &(rows, cols) in &[(1, 1), (128, 4), (129, 5), (300, 17), (512, 64)] {
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(
                        swizzled_offset(r, c, cols),
                        spec_offset(r, c, cols),
                        "({r}, {c})"
                    );
                }
            }
        }
    }

    #[test]
    fn swizzle_matches_tile_description_and_roundtrips() {
        for &(rows, cols) in &[(1, 1), (128, 4), (129, 5), (300, 17), (256, 8), (1000, 3)] {
            let s = pattern(rows * cols);
            let z = swizzle_scales(&s, rows, cols);
            assert_eq!(z, tile_by_tile(&s, rows, cols), "{rows}x{cols}");
            assert_eq!(unswizzle_scales(&z, rows, cols), s);
        }
    }

    #[test]
    fn offsets_are_a_bijection_onto_the_padded_buffer() {
        let (rows, cols) = (384, 12);
        let mut seen = vec![false; rows * cols];
        for r in 0..rows {
            for c in 0..cols {
                let o = swizzled_offset(r, c, cols);
                assert!(!seen[o], "offset {o} used twice");
                seen[o] = true;
            }
        }
        assert!(seen.iter().all(|&s| s));
    }
}

//! Packing of GEMM operands into the tile layouts of [`super::bf16`]: f32 values rounded to
//! BF16 (nearest even) and gathered along whichever axis of the view is contiguous, and
//! [`pack_panels`], which packs the stored rows of a quantizer's output panel by panel as
//! the quantizer produces them (no f32 copy of the whole operand).
//!
//! Packing only rounds and moves values: the bits of the packed tiles do not depend on the
//! grouping, the thread count or the instruction set.

use std::cell::Cell;

use rayon::prelude::*;

use super::bf16::{bf16_bits, CHUNK, TILE, TILE_WORDS};
use super::MatRef;

/// Two BF16 values as the 32-bit word that holds `lo` first in memory (element `2p` of a
/// pair before `2p + 1`, whatever the byte order).
#[inline(always)]
fn pair(lo: u16, hi: u16) -> u32 {
    if cfg!(target_endian = "little") {
        lo as u32 | (hi as u32) << 16
    } else {
        hi as u32 | (lo as u32) << 16
    }
}

/// Which tile packer [`pack_one`] runs (a const parameter of the packing loops, each
/// compiled once per instruction set): the scalar code, [`super::pack_avx2`] or
/// [`super::pack_avx512`]. They write the same words.
const SCALAR: u8 = 0;
/// See [`SCALAR`].
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const AVX2: u8 = 1;
/// See [`SCALAR`].
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const AVX512: u8 = 2;

/// Packs `x: [rows, K]` into the [`packed_row_tiles`]`(rows) · ⌈K / 32⌉` tiles of one GEMM
/// operand (rows and K padded with zeros), tile `(i, t)` at word `(i · kc + t) · 256`:
///
/// - as A tiles (`a_layout`): 16 rows x 32 BF16, row-major, element `(r, k)` of a tile in
///   word `r · 16 + k / 2`;
/// - as B tiles: 16 K-pairs x 16 columns x 2 BF16 (the pair-interleaved layout of the tile
///   unit's second operand), element `(n, k)` (`n = 16j + nn`, `k = 32t + 2p + q`) of tile
///   `(j, t)` in word `p · 16 + nn`, half `q`.
///
/// The threads split the operand by groups of 16-row blocks, or a transposed view by runs of
/// K ([`by_k_runs`]).
pub(super) fn pack_view(x: MatRef<'_>, a_layout: bool, buf: &mut crate::gemm::TileWords) {
    let (kc, row_tiles, len) = tile_buffer(x.rows, x.cols, buf);
    if len == 0 {
        return;
    }
    let tiles = &mut buf[..len];
    if by_k_runs(x) {
        return pack_k_runs(x, kc, a_layout, tiles);
    }
    let group = group_size(row_tiles);
    tiles
        .par_chunks_mut(group * kc * TILE_WORDS)
        .enumerate()
        .for_each(|(g, tiles)| pack_dispatch(x, kc, g * group, tiles, (a_layout, false)));
}

/// Whether [`pack_view`] splits a view by runs of K ([`pack_k_runs`]) rather than
/// by groups of rows: a transposed view (rows contiguous), whose K lines are then each read
/// whole by one task instead of in short pieces by every task (on two threads, 1.7x less
/// time to pack a training step's Wgrad operands).
fn by_k_runs(x: MatRef<'_>) -> bool {
    x.row_stride == 1 && x.col_stride != 1
}

/// A block-major tile buffer (`row_tiles · kc` tiles, tile `(i, t)` at tile index `i · kc +
/// t`) shared by the tasks of [`pack_k_runs`], each writing the tiles of its own chunks.
#[derive(Clone, Copy)]
struct SharedTiles {
    ptr: *mut u32,
    kc: usize,
    row_tiles: usize,
}
// SAFETY: the tasks write disjoint tiles through it while the caller holds the buffer.
unsafe impl Send for SharedTiles {}
unsafe impl Sync for SharedTiles {}

impl SharedTiles {
    /// Tile `(i, t)`.
    ///
    /// # Safety
    /// `i < row_tiles`, `t < kc`, the buffer still held by the caller of [`pack_k_runs`],
    /// and no other task touching this tile meanwhile.
    #[allow(clippy::mut_from_ref)]
    #[inline(always)]
    unsafe fn tile(&self, i: usize, t: usize) -> &mut [u32] {
        // SAFETY: (caller) the tile lies in the buffer and only this task writes it.
        unsafe {
            std::slice::from_raw_parts_mut(self.ptr.add((i * self.kc + t) * TILE_WORDS), TILE_WORDS)
        }
    }
}

/// Packs the `row_tiles · kc` tiles of `x` into `tiles` in the block-major layout of
/// [`pack_view`], each task a run of K chunks for all row tiles.
fn pack_k_runs(x: MatRef<'_>, kc: usize, a_layout: bool, tiles: &mut [u32]) {
    let row_tiles = tiles.len() / (kc * TILE_WORDS);
    let per_task = kc.div_ceil(2 * rayon::current_num_threads()).max(1);
    let wide = wide_packing();
    let out = SharedTiles {
        ptr: tiles.as_mut_ptr(),
        kc,
        row_tiles,
    };
    (0..kc.div_ceil(per_task)).into_par_iter().for_each(|g| {
        let chunks = g * per_task..((g + 1) * per_task).min(kc);
        #[cfg(target_arch = "x86_64")]
        if wide {
            // SAFETY: `wide` says the CPU has AVX-512F/BW/VL/DQ and AVX512_BF16; this task
            // writes only the tiles of its own chunks, and `tiles` outlives the loop.
            unsafe { pack_chunks_avx512(x, out, chunks, a_layout) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if fp_formats::cpu::has_avx2() {
            // SAFETY: the CPU has AVX2; otherwise as above.
            unsafe { pack_chunks_avx2(x, out, chunks, a_layout) };
            return;
        }
        // SAFETY: as above.
        unsafe { pack_chunks::<SCALAR>(x, out, chunks, a_layout) };
    });
}

/// Packs tiles `(i, t)` of `x` for every row tile `i` and the chunks `t` in `chunks` into
/// `out`.
///
/// # Safety
/// `chunks` must lie below `out.kc`, and no other task may touch those chunks' tiles
/// meanwhile (see [`SharedTiles::tile`]).
#[inline(always)]
unsafe fn pack_chunks<const ISA: u8>(
    x: MatRef<'_>,
    out: SharedTiles,
    chunks: std::ops::Range<usize>,
    a_layout: bool,
) {
    let mut w = [[0u32; TILE]; TILE];
    for t in chunks {
        for i in 0..out.row_tiles {
            // SAFETY: (caller)
            let tile = unsafe { out.tile(i, t) };
            pack_one::<ISA>(x, i, t, tile, a_layout, &mut w);
        }
    }
}

/// [`pack_chunks`] compiled for AVX-512 (see [`pack_tiles_avx512`]).
///
/// # Safety
/// As [`pack_chunks`]; the CPU must have AVX-512F/BW/VL/DQ and AVX512_BF16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn pack_chunks_avx512(
    x: MatRef<'_>,
    out: SharedTiles,
    chunks: std::ops::Range<usize>,
    a_layout: bool,
) {
    // SAFETY: (caller)
    unsafe { pack_chunks::<AVX512>(x, out, chunks, a_layout) }
}

/// [`pack_chunks`] compiled for AVX2, with the AVX2 tile packer ([`super::pack_avx2`]) for
/// the tiles that transpose.
///
/// # Safety
/// As [`pack_chunks`]; the CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn pack_chunks_avx2(
    x: MatRef<'_>,
    out: SharedTiles,
    chunks: std::ops::Range<usize>,
    a_layout: bool,
) {
    // SAFETY: (caller)
    unsafe { pack_chunks::<AVX2>(x, out, chunks, a_layout) }
}

/// 16-row blocks per packing task: about two tasks per thread. Packing only moves values,
/// so the bits do not depend on it.
fn group_size(blocks: usize) -> usize {
    blocks.div_ceil(2 * rayon::current_num_threads()).max(1)
}

/// Packs the tiles of the 16-row blocks `i0 ..` of `x: [rows, K]` that `tiles` holds (`kc`
/// tiles per block): as A tiles (`words[r][p]`, see [`pack_view`]) when `a_layout`, as B tiles
/// (`words[p][r]`, see [`pack_view`]) otherwise; tile `(b, t)` at tile index `b · kc + t`, or
/// `t · blocks + b` when `chunk_major`.
#[inline(always)]
fn pack_tiles<const ISA: u8>(
    x: MatRef<'_>,
    kc: usize,
    i0: usize,
    tiles: &mut [u32],
    (a_layout, chunk_major): (bool, bool),
) {
    let blocks = tiles.len() / (kc * TILE_WORDS);
    let at = |b: usize, t: usize| {
        if chunk_major {
            (t * blocks + b) * TILE_WORDS
        } else {
            (b * kc + t) * TILE_WORDS
        }
    };
    let mut w = [[0u32; TILE]; TILE];
    // K outermost for a transposed view (each K step's line is then read across the group's
    // blocks in one run); block by block otherwise.
    if x.col_stride != 1 && x.row_stride == 1 {
        for t in 0..kc {
            for b in 0..blocks {
                let tile = &mut tiles[at(b, t)..][..TILE_WORDS];
                pack_one::<ISA>(x, i0 + b, t, tile, a_layout, &mut w);
            }
        }
    } else {
        for b in 0..blocks {
            for t in 0..kc {
                let tile = &mut tiles[at(b, t)..][..TILE_WORDS];
                pack_one::<ISA>(x, i0 + b, t, tile, a_layout, &mut w);
            }
        }
    }
}

/// [`pack_tile`], on the AVX-512 packer inside [`pack_tiles_avx512`] and
/// [`pack_chunks_avx512`] (`ISA == AVX512`), on the AVX2 one inside their AVX2 twins
/// (`ISA == AVX2`), where the view's layout has one.
#[inline(always)]
fn pack_one<const ISA: u8>(
    x: MatRef<'_>,
    i: usize,
    t: usize,
    tile: &mut [u32],
    a_layout: bool,
    w: &mut [[u32; TILE]; TILE],
) {
    #[cfg(target_arch = "x86_64")]
    if ISA == AVX512 && x.rows > i * TILE {
        // SAFETY: `AVX512` is passed only by `pack_tiles_avx512` and `pack_chunks_avx512`,
        // whose callers checked AVX-512F/BW/DQ and AVX512_BF16 (`wide_packing`); the view
        // fits its storage (the GEMM asserted it) and tile `i` holds rows of it.
        if unsafe { super::pack_avx512::pack_tile(x, i, t, tile, a_layout) } {
            return;
        }
    }
    #[cfg(target_arch = "x86_64")]
    if ISA == AVX2 && x.rows > i * TILE && transposes(x, a_layout) {
        // Only the tiles that transpose: there the AVX2 packer takes 0.24 ns per value
        // against the compiled scalar code's 0.36 (in cache, one thread, Zen 3); where the
        // words keep the view's orientation both take 0.22.
        // SAFETY: `AVX2` is passed only by `pack_tiles_avx2` and `pack_chunks_avx2`, whose
        // callers checked AVX2; the view fits its storage and tile `i` holds rows of it.
        if unsafe { super::pack_avx2::pack_tile(x, i, t, tile, a_layout) } {
            return;
        }
    }
    pack_tile(x, i, t, tile, a_layout, w);
}

/// Whether [`pack_tile`] gathers `x`'s pair words row by row (K contiguous in memory, or
/// neither axis), rather than pair by pair (rows contiguous).
#[inline(always)]
fn gathered_by_rows(x: MatRef<'_>) -> bool {
    x.col_stride == 1 || x.row_stride != 1
}

/// Whether packing `x` transposes its 16 x 16 blocks of pair words: gathered by rows but
/// wanted in B's orientation, or the reverse.
#[inline(always)]
fn transposes(x: MatRef<'_>, a_layout: bool) -> bool {
    gathered_by_rows(x) != a_layout
}

/// Packs tile `(i, t)` of `x` (rows `16i ..`, K `32t ..`; zero-padded). The two layouts are
/// transposes of each other in words, so both are made from one 16 x 16 block of pairs
/// `w[r][p]`, gathered along whichever axis of the view is contiguous.
#[inline(always)]
fn pack_tile(
    x: MatRef<'_>,
    i: usize,
    t: usize,
    tile: &mut [u32],
    a_layout: bool,
    w: &mut [[u32; TILE]; TILE],
) {
    let rows_here = x.rows.saturating_sub(i * TILE).min(TILE);
    if rows_here == 0 {
        tile.fill(0); // a padding tile
        return;
    }
    let (k0, kn) = (t * CHUNK, (x.cols - t * CHUNK).min(CHUNK));
    // `by_rows`: w[r][p] for each row r (K contiguous in memory);
    // otherwise w[p][r] for each pair p (rows contiguous): the transposed block.
    let by_rows = gathered_by_rows(x);
    if by_rows {
        for (r, wr) in w.iter_mut().enumerate() {
            wr.fill(0);
            if r >= rows_here {
                continue;
            }
            let base = (i * TILE + r) * x.row_stride + k0 * x.col_stride;
            if x.col_stride == 1 {
                let src = &x.data[base..][..kn];
                let (pairs, rest) = src.split_at(kn & !1);
                for (d, v) in wr.iter_mut().zip(pairs.chunks_exact(2)) {
                    *d = pair(bf16_bits(v[0]), bf16_bits(v[1]));
                }
                if let Some(&v) = rest.first() {
                    wr[kn / 2] = pair(bf16_bits(v), 0);
                }
            } else {
                for kk in 0..kn {
                    let h = bf16_bits(x.data[base + kk * x.col_stride]);
                    let d = &mut wr[kk / 2];
                    *d = if kk % 2 == 0 {
                        pair(h, 0)
                    } else {
                        *d | pair(0, h)
                    };
                }
            }
        }
    } else {
        for (p, wp) in w.iter_mut().enumerate() {
            wp.fill(0);
            let line = |kk: usize| &x.data[(k0 + kk) * x.col_stride + i * TILE..][..rows_here];
            if 2 * p + 1 < kn {
                for ((d, &lo), &hi) in wp.iter_mut().zip(line(2 * p)).zip(line(2 * p + 1)) {
                    *d = pair(bf16_bits(lo), bf16_bits(hi));
                }
            } else if 2 * p < kn {
                for (d, &lo) in wp.iter_mut().zip(line(2 * p)) {
                    *d = pair(bf16_bits(lo), 0);
                }
            }
        }
    }
    if by_rows == a_layout {
        tile.copy_from_slice(bytemuck::cast_slice(&w[..]));
    } else {
        store_transposed(w, tile);
    }
}

#[cfg(test)]
/// Values that exercise the BF16 rounding of the packers (for their tests): ties both ways, NaNs (quieted, sign kept),
/// infinities, f32 subnormals (which round to BF16 subnormals or the smallest normal),
/// values that round up to infinity, signed zeros.
pub(super) fn edge_values_for_tests(n: usize) -> Vec<f32> {
    let specials = [
        f32::from_bits(0x3f80_8000), // tie, even below: stays
        f32::from_bits(0x3f81_8000), // tie, odd below: rounds up
        f32::from_bits(0x3f80_8001),
        f32::from_bits(0x7f80_0001), // signalling NaN
        f32::from_bits(0xffc0_1234),
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::from_bits(0x007f_ffff), // subnormal rounding to the smallest normal
        f32::from_bits(0x0000_8000),
        f32::from_bits(0x7f7f_ffff), // rounds to infinity
        -0.0,
        0.0,
    ];
    (0..n)
        .map(|j| {
            let h = (j as u32).wrapping_mul(2_654_435_761);
            if h.is_multiple_of(5) {
                specials[(h / 5) as usize % specials.len()]
            } else {
                f32::from_bits(h)
            }
        })
        .collect()
}

/// Checks a vector tile packer against [`pack_tile`] on the `[rows, k]` values `v`, stored
/// row-major and as a transposed view, for both orientations and every tile (for the vector
/// packers' tests; `what` names the case in a failure).
#[cfg(test)]
pub(super) fn check_packer_for_tests(
    v: &[f32],
    (rows, k): (usize, usize),
    packer: impl Fn(MatRef<'_>, usize, usize, &mut [u32], bool) -> bool,
    what: &str,
) {
    let vt: Vec<f32> = (0..rows * k)
        .map(|j| v[(j % rows) * k + j / rows])
        .collect();
    let views = [
        MatRef::row_major(v, rows, k),
        MatRef::row_major(&vt, k, rows).t(),
    ];
    for x in views {
        for a_layout in [true, false] {
            for i in 0..rows.div_ceil(TILE) {
                for t in 0..k.div_ceil(CHUNK) {
                    let mut want = vec![7u32; TILE_WORDS];
                    let mut got = vec![9u32; TILE_WORDS];
                    pack_tile(x, i, t, &mut want, a_layout, &mut [[0; TILE]; TILE]);
                    assert!(packer(x, i, t, &mut got, a_layout), "{what}: declined");
                    let at = format!("{what}: [{rows}, {k}] ({i}, {t}) a {a_layout}");
                    assert_eq!(got, want, "{at}");
                }
            }
        }
    }
}

/// `tile[y · 16 + x] = w[x][y]`: the 16 x 16 words transposed.
#[inline(always)]
fn store_transposed(w: &[[u32; TILE]; TILE], tile: &mut [u32]) {
    let tile = &mut tile[..TILE_WORDS];
    for (y, row) in tile.chunks_exact_mut(TILE).enumerate() {
        for (x, d) in row.iter_mut().enumerate() {
            *d = w[x][y];
        }
    }
}

/// [`pack_tiles`] compiled for AVX-512 (every CPU with AMX or AVX512_BF16 has it), with the
/// tiles of K- or rows-contiguous views packed sixteen words at a time
/// ([`super::pack_avx512`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn pack_tiles_avx512(
    x: MatRef<'_>,
    kc: usize,
    i0: usize,
    tiles: &mut [u32],
    layout: (bool, bool),
) {
    pack_tiles::<AVX512>(x, kc, i0, tiles, layout)
}

/// [`pack_tiles`] compiled for AVX2, for CPUs without AVX-512 (the pair arithmetic on
/// FMAs, [`super::fma_pairs`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn pack_tiles_avx2(
    x: MatRef<'_>,
    kc: usize,
    i0: usize,
    tiles: &mut [u32],
    layout: (bool, bool),
) {
    pack_tiles::<AVX2>(x, kc, i0, tiles, layout)
}

/// Whether the packing loops may use AVX-512 (the same instructions' results: the packing
/// only converts and moves values, so the bits do not depend on it).
pub(crate) fn wide_packing() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        fp_formats::cpu::has_avx512_bf16()
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("avx512dq")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Packs the A tiles of the 32-row block `ib` of `x: [M, K]` for chunks `k0 .. k0 + kn`
/// into `tiles` (`2 · kn` tiles; tile `(i, t)` of the block at tile index `i · kn + t`):
/// the same words as those tiles of [`pack_view`] (`a_layout`), for a GEMM that packs A
/// block by block as it goes. `ib` must hold rows of `x` and `k0` chunks of it.
pub(super) fn pack_a_block(x: MatRef<'_>, ib: usize, (k0, kn): (usize, usize), tiles: &mut [u32]) {
    let (r0, c0) = (ib * 2 * TILE, k0 * CHUNK);
    let (rows, cols) = ((x.rows - r0).min(2 * TILE), (x.cols - c0).min(kn * CHUNK));
    let tiles = &mut tiles[..2 * kn * TILE_WORDS];
    pack_dispatch(x.block(r0, rows, c0, cols), kn, 0, tiles, (true, false));
}

/// 16-row tiles of a packed operand of `rows` rows: whole 32-row blocks (the GEMM computes
/// 2 x 2 tiles per call), the padding tile zero.
pub(crate) fn packed_row_tiles(rows: usize) -> usize {
    rows.div_ceil(2 * TILE) * 2
}

/// Elements of one quantized panel per packing task of [`pack_panels`] (256 KiB of f32
/// scratch: it stays in the core's cache between the quantizer writing it and the packing
/// reading it).
const PANEL_ELEMS: usize = 1 << 16;

thread_local! {
    static PANEL: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// Packs an `[rows, k]` operand that `panel` produces in panels of stored rows: `panel(r0,
/// dst)` must write all of `dst` (`n` whole rows of `k` values starting at stored row `r0`,
/// `r0` a multiple of 16) and returns its statistics, which are merged with `merge`. Each
/// panel goes into a per-thread scratch buffer and is packed from there at once into its
/// tiles (the A layout of [`pack_view`] when `a_layout`, else its B layout), so
/// the operand's f32 values never exist as a whole: one pass over the source, in cache.
/// `buf` receives [`packed_row_tiles`]`(rows) · ⌈k / 32⌉` tiles, the same words as packing
/// the whole `[rows, k]` result with [`pack_view`].
pub(crate) fn pack_panels<S, P>(
    rows: usize,
    k: usize,
    a_layout: bool,
    buf: &mut crate::gemm::TileWords,
    merge: fn(S, S) -> S,
    panel: P,
) -> S
where
    S: Send + Default,
    P: Fn(usize, &mut [f32]) -> S + Sync,
{
    let (kc, row_tiles, len) = tile_buffer(rows, k, buf);
    if len == 0 {
        return S::default();
    }
    let per_task = even_tasks(
        (PANEL_ELEMS / (TILE * k)).clamp(1, group_size(row_tiles)),
        row_tiles,
    );
    buf[..len]
        .par_chunks_mut(per_task * kc * TILE_WORDS)
        .enumerate()
        .map(|(g, tiles)| {
            let r0 = g * per_task * TILE;
            let n = rows.saturating_sub(r0).min(per_task * TILE);
            if n == 0 {
                tiles.fill(0); // padding tiles only
                return S::default();
            }
            panel_task(n * k, &panel, r0, |v| {
                let x = MatRef::row_major(v, n, k);
                pack_dispatch(x, kc, 0, tiles, (a_layout, false))
            })
        })
        .reduce(S::default, merge)
}

/// [`pack_panels`] for an `[rows, k]` operand whose values come in the **source layout** of
/// a columnwise quantizer: `panel(k0, dst)` writes `dst` as `n` rows of `rows` values, row
/// `j` holding column `k0 + j` of the operand (`k0` a multiple of 32; `n` = 32 · chunks, or
/// what is left of K). The tiles are stored chunk-major (tile `(i, t)` at tile index `t ·
/// row_tiles + i`, see [`super::bf16::Side::Packed`]), so that each panel's chunks are
/// one contiguous run of `buf`.
pub(crate) fn pack_panels_chunk_major<S, P>(
    rows: usize,
    k: usize,
    a_layout: bool,
    buf: &mut crate::gemm::TileWords,
    merge: fn(S, S) -> S,
    panel: P,
) -> S
where
    S: Send + Default,
    P: Fn(usize, &mut [f32]) -> S + Sync,
{
    let (kc, row_tiles, len) = tile_buffer(rows, k, buf);
    if len == 0 {
        return S::default();
    }
    let per_task = chunks_per_task(rows, kc);
    buf[..len]
        .par_chunks_mut(per_task * row_tiles * TILE_WORDS)
        .enumerate()
        .map(|(g, tiles)| {
            let k0 = g * per_task * CHUNK;
            let n = (k - k0).min(per_task * CHUNK);
            panel_task(n * rows, &panel, k0, |v| {
                let x = MatRef::row_major(v, n, rows).t();
                pack_dispatch(x, n.div_ceil(CHUNK), 0, tiles, (a_layout, true))
            })
        })
        .reduce(S::default, merge)
}

/// Fills the chunk-major tiles of an `[rows, k]` operand (the layout of
/// [`pack_panels_chunk_major`]) tile by tile: `tile(i, t, words)` must write all 256 words
/// of tile `(i, t)` (rows `16i ..`, K `32t ..`) for every `i < ⌈rows / 16⌉`, and returns its
/// statistics, merged with `merge`; the padding tiles past the rows are zeroed here. For a
/// quantizer whose kernel produces whole tiles in registers and packs them itself, with no
/// f32 panel between. Tasks take runs of chunks.
pub(crate) fn fill_tiles_chunk_major<S, P>(
    rows: usize,
    k: usize,
    buf: &mut crate::gemm::TileWords,
    merge: fn(S, S) -> S,
    tile: P,
) -> S
where
    S: Send + Default,
    P: Fn(usize, usize, &mut [u32]) -> S + Sync,
{
    let (kc, row_tiles, len) = tile_buffer(rows, k, buf);
    if len == 0 {
        return S::default();
    }
    let real = rows.div_ceil(TILE);
    let per_task = chunks_per_task(rows, kc);
    buf[..len]
        .par_chunks_mut(per_task * row_tiles * TILE_WORDS)
        .enumerate()
        .map(|(g, tiles)| {
            let mut stats = S::default();
            for (j, words) in tiles.chunks_exact_mut(TILE_WORDS).enumerate() {
                let (t, i) = (g * per_task + j / row_tiles, j % row_tiles);
                if i < real {
                    stats = merge(stats, tile(i, t, words));
                } else {
                    words.fill(0);
                }
            }
            stats
        })
        .reduce(S::default, merge)
}

/// Chunks of K per task of the chunk-major packings of an operand of `rows` rows and `kc`
/// chunks: one panel of [`PANEL_ELEMS`] values, at most half a thread's share, and fewer
/// where that makes the tasks split evenly between the threads (the `small` Wgrad's dY, 64
/// chunks of 352 rows: 16 tasks of 4 rather than 13 of 5, which left one of two threads a
/// task more than the other).
fn chunks_per_task(rows: usize, kc: usize) -> usize {
    let threads = rayon::current_num_threads();
    let most = (PANEL_ELEMS / (CHUNK * rows)).clamp(1, kc.div_ceil(2 * threads));
    even_tasks(most, kc)
}

/// Units of work per task, at most `most` of the `total`: the largest size down to half of
/// `most` that splits `total` into equal tasks whose count divides by the threads of the
/// current pool, else `most` (the row panels of [`pack_panels`]: the `small` Wgrad's 22
/// row tiles of 16 at K = 2048 make 22 tasks of 1 rather than 11 of 2, of which one of two
/// threads took 6).
fn even_tasks(most: usize, total: usize) -> usize {
    let threads = rayon::current_num_threads();
    (most.div_ceil(2)..=most)
        .rev()
        .find(|&c| total.is_multiple_of(c) && (total / c).is_multiple_of(threads))
        .unwrap_or(most)
}

/// The tiles of an `[rows, k]` operand: `(⌈k / 32⌉, packed_row_tiles(rows), words)`, with
/// `buf` grown to at least `words`.
fn tile_buffer(rows: usize, k: usize, buf: &mut crate::gemm::TileWords) -> (usize, usize, usize) {
    let kc = k.div_ceil(CHUNK);
    let row_tiles = packed_row_tiles(rows);
    let len = row_tiles * kc * TILE_WORDS;
    buf.grow_to(len);
    (kc, row_tiles, len)
}

/// Runs `panel(start, dst)` on this thread's scratch (`len` elements) and then `pack` on
/// the values it wrote.
#[inline]
fn panel_task<S, P: Fn(usize, &mut [f32]) -> S>(
    len: usize,
    panel: &P,
    start: usize,
    pack: impl FnOnce(&[f32]),
) -> S {
    // (A nested call on this thread would find the cell empty and allocate.)
    let mut v = PANEL.with(Cell::take);
    if v.len() < len {
        v.resize(len, 0.0);
    }
    let s = panel(start, &mut v[..len]);
    pack(&v[..len]);
    PANEL.with(|c| c.set(v));
    s
}

/// [`pack_tiles`] from block `i0`, with AVX-512 where [`wide_packing`] allows.
#[inline]
fn pack_dispatch(x: MatRef<'_>, kc: usize, i0: usize, tiles: &mut [u32], layout: (bool, bool)) {
    #[cfg(target_arch = "x86_64")]
    if wide_packing() {
        // SAFETY: `wide_packing` says the CPU has AVX-512F/BW/VL/DQ and AVX512_BF16.
        unsafe { pack_tiles_avx512(x, kc, i0, tiles, layout) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if fp_formats::cpu::has_avx2() {
        // SAFETY: the CPU has AVX2.
        unsafe { pack_tiles_avx2(x, kc, i0, tiles, layout) };
        return;
    }
    pack_tiles::<SCALAR>(x, kc, i0, tiles, layout);
}

#[cfg(test)]
mod tests {
    use super::even_tasks;

    /// On two threads: the largest size down to half the limit that makes an even number of
    /// equal tasks, else the limit.
    #[test]
    fn even_tasks_split_evenly_between_the_threads() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        pool.install(|| {
            assert_eq!(even_tasks(2, 22), 1); // 22 tasks, not 11
            assert_eq!(even_tasks(5, 64), 4); // 16 tasks, not 13
            assert_eq!(even_tasks(2, 8), 2); // already even
            assert_eq!(even_tasks(3, 7), 3); // nothing divides: the limit
            assert_eq!(even_tasks(1, 5), 1);
        });
    }
}

//! The fused NVFP4 fake quantization behind [`super::fake_quantize_into`] (every emulated
//! GEMM operand goes through it): it writes `e2m1 · s_b` straight from the scaled value, with
//! no codes, scale bytes or look-up tables in between, and bit for bit the values of
//! [`super::quantize`] followed by [`super::dequantize_unscaled_into`] (tested against the
//! tile-core reference in `nvfp4.rs`'s unit tests, in both builds, and against the packed
//! path in `tests/nvfp4_fast.rs`).
//!
//! # Passes
//!
//! * **Rowwise**: the parallel global amax of `x`, then one pass that reads `x` and writes
//!   `out`, parallel over panels of stored rows.
//! * **Columnwise**: a staging pass writes the stored tensor (the transpose of `x`, each
//!   16-chunk Hadamard-transformed and BF16-rounded when the operand has RHT) into `out`
//!   through 16x16 tiles and reduces its amax on the way; then the rowwise pass runs in place
//!   on `out`. The transform and the transpose thus run once (the packed path transforms
//!   every tile twice: once for the amax, once to quantize it).
//!
//! * **Columnwise in the source layout** (what the emulated GEMM uses,
//!   [`fake_quantize_columnwise_source_layout`]): the same values, kept at the positions of
//!   `x` (`out[r, c]` = stored `(c, r)`) and read by the GEMM through a transposed view,
//!   which it packs faster than the K-contiguous stored layout. Each 16-row strip of `x`
//!   holds one stored block per column, so everything runs lane-wise with no transpose: with
//!   RHT a staging pass writes the transformed strips into `out` (AVX2 in `avx2.rs`) and
//!   reduces the amax, then the quantization runs in place; without RHT it reads `x`.
//!
//! A non-finite input (or an overflowing transform) in a columnwise staging pass sends the
//! caller back to the reference path, which reports the exact offending element.
//!
//! # Arithmetic
//!
//! Per block (or 16x16 tile) the scale is `GlobalScale::block_scale` and the encode factor
//! `min(fl(1 / fl(s_b · S_dec)), FLT_MAX)` exactly as in the reference; the E4M3 scale value
//! is decoded arithmetically ([`e4m3_value`]). Per element, `y = fl(x · enc)`, `a = min(|y|,
//! 6)`; round to nearest even onto the E2M1 grid with the magic-number trick
//! `fl(fl(a + C) - C)` where `C = 2^22 / 2^23 / 2^24` on `[0, 2) / [2, 4) / [4, 6]` (the
//! ulp of `C` is the grid step there, so the f32 addition rounds `a` to the grid with ties
//! to the even grid point, which is the even E2M1 code), or, for stochastic rounding, the
//! integer arithmetic of `encode_sr` returning the grid value instead of the code; the
//! result is `fl(v · s_b)` with the sign of `y`. Both equal `fl(e2m1(code) · s_b)` of the
//! reference (the grid value is exact and the product is the same f32 multiplication).
//!
//! Hot loops are `#[inline(always)]` functions on fixed-size arrays, compiled twice (baseline
//! and AVX2, picked at run time by `avx2_dispatch!`), with plain IEEE operations and no FMA,
//! so both builds give identical bytes (tested).

use fp_formats::nvfp4::{GlobalScale, BLOCK};
use fp_formats::E4M3;
use rayon::prelude::*;

use super::{global_amax, Plan, Scaling, Tile};
use crate::config::Usage;
use crate::hadamard::rht16_columns;
use crate::philox::{blocks_bytes_x16, blocks_words_x16};
use crate::{QuantError, RngKey};

/// Elements per parallel task (rounded to whole 16-row groups); results do not depend on it.
const TASK_ELEMS: usize = 16 * 1024;
/// Minimum stored rows (input columns) per task of the columnwise staging pass.
const STAGE_MIN_ROWS: usize = 64;

/// `a > b ? a : b` (one `maxps`; both operands are never NaN here).
#[inline(always)]
fn max(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// `min(|y|, 6)` for a non-NaN `y` (one `andps` and one `minps`).
#[inline(always)]
fn abs_min6(bits: u32) -> f32 {
    let a = f32::from_bits(bits & 0x7FFF_FFFF);
    if a < 6.0 {
        a
    } else {
        6.0
    }
}

/// The value of an E4M3 scale code `c <= 0x7E` (what `UE4M3(c).to_f32()` returns), without
/// the look-up table: `(c & 7) · 2^-9` for subnormal codes, else the f32 with exponent
/// `(c >> 3) - 7` and the 3 mantissa bits of `c`.
#[inline(always)]
fn e4m3_value(c: u8) -> f32 {
    let c = c as u32;
    let normal = f32::from_bits((c << 20) + (120 << 23));
    let sub = (c & 7) as f32 * (1.0 / 512.0);
    if c >= 8 {
        normal
    } else {
        sub
    }
}

/// `fl(e2m1(E2M1::encode_rne_sat(fl(x · enc))) · sf)` (see the module docs).
#[inline(always)]
fn fake_rne(x: f32, enc: f32, sf: f32) -> f32 {
    let bits = (x * enc).to_bits();
    let a = abs_min6(bits);
    let e = (a >= 2.0) as u32 + (a >= 4.0) as u32;
    let c = f32::from_bits(0x4A80_0000 + (e << 23)); // 2^(22 + e)
    let v = (a + c) - c;
    f32::from_bits((v * sf).to_bits() | (bits & 0x8000_0000))
}

/// `fl(e2m1(encode_sr(clamp(fl(x · enc), -6, 6), r)) · sf)`: the stochastic-rounding
/// decision of `super::encode_sr`, returning the grid value `(lower index + up) · step`.
#[inline(always)]
fn fake_sr(x: f32, enc: f32, sf: f32, r: u8) -> f32 {
    let bits = (x * enc).to_bits();
    let a = abs_min6(bits);
    let e = (a >= 2.0) as i32 + (a >= 4.0) as i32;
    // Grid step 0.5 / 1 / 2 on [0, 2) / [2, 4) / [4, 6]: a / step is exact.
    let inv_step = f32::from_bits((0x4000_0000 - (e << 23)) as u32);
    let step = f32::from_bits((0x3F00_0000 + (e << 23)) as u32);
    // t = a / step in [0, 4) (or 3 for a = 6), exact. `encode_sr` rounds up iff
    // floor(256 · frac(t)) + r >= 256, i.e. iff 256 · frac(t) >= 256 - r (an integer).
    // floor(t) by the magic number (nearest even, then one down if above t); the
    // fractional part and its product by 256 are exact.
    let t = a * inv_step;
    let n = (t + 8_388_608.0) - 8_388_608.0;
    let fl = if n > t { n - 1.0 } else { n };
    let up = if (t - fl) * 256.0 >= 256.0 - r as f32 {
        1.0
    } else {
        0.0
    };
    let v = (fl + up) * step;
    f32::from_bits((v * sf).to_bits() | (bits & 0x8000_0000))
}

/// `max |x_i|` of a block (no NaN possible here).
#[inline(always)]
pub(super) fn block_amax(x: &[f32; BLOCK]) -> f32 {
    let mut m = [0.0f32; 8];
    for i in 0..8 {
        m[i] = max(x[i].abs(), x[i + 8].abs());
    }
    for h in [4, 2, 1] {
        for i in 0..h {
            m[i] = max(m[i], m[i + h]);
        }
    }
    m[0]
}

/// The scale values `s_b` and encode factors of 16 blocks from their amaxes:
/// `GlobalScale::block_scale` and `GlobalScale::block_encode_factor`, with `min(., FLT_MAX)`
/// as a comparison (no NaN can occur) so that the loop vectorises across the blocks.
#[inline(always)]
pub(super) fn group_scales(amax: &[f32; BLOCK], g: &GlobalScale) -> ([f32; BLOCK], [f32; BLOCK]) {
    let mut sf = [0.0f32; BLOCK];
    let mut enc = [0.0f32; BLOCK];
    for k in 0..BLOCK {
        let s = amax[k] * g.block_factor;
        let s = if s < f32::MAX { s } else { f32::MAX };
        sf[k] = e4m3_value(E4M3::encode_rne_sat(s));
        let e = 1.0 / (sf[k] * g.s_dec);
        enc[k] = if e < f32::MAX { e } else { f32::MAX };
    }
    (sf, enc)
}

/// The random bytes of blocks `first + k · stride`, `k < 16`.
#[inline(always)]
fn group_bits(key: RngKey, first: u64, stride: u64) -> [[u8; BLOCK]; BLOCK] {
    let mut blocks = [0u64; BLOCK];
    for (l, b) in blocks.iter_mut().enumerate() {
        *b = first + l as u64 * stride;
    }
    blocks_bytes_x16(key, blocks)
}

/// One block's fake-quantized values (RNE, or SR with the block's random bytes).
#[inline(always)]
fn fake_block(x: &[f32; BLOCK], enc: f32, sf: f32, r: Option<&[u8; BLOCK]>) -> [f32; BLOCK] {
    let mut y = [0.0f32; BLOCK];
    match r {
        Some(r) => {
            for j in 0..BLOCK {
                y[j] = fake_sr(x[j], enc, sf, r[j]);
            }
        }
        None => {
            for j in 0..BLOCK {
                y[j] = fake_rne(x[j], enc, sf);
            }
        }
    }
    y
}

/// Fake-quantizes 16 blocks in place: `v[k]` is one block (`tile2d == false`) or one row of
/// a 16x16 tile that shares one scale (`tile2d`). With stochastic rounding, `v[k]` uses the
/// random bytes of block `first + k · stride`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn fake_group(
    v: &mut Tile,
    tile2d: bool,
    sr: bool,
    g: &GlobalScale,
    key: RngKey,
    first: u64,
    stride: u64,
) {
    let mut amax = [0.0f32; BLOCK];
    if tile2d {
        let mut m = [0.0f32; BLOCK];
        for row in v.iter() {
            for j in 0..BLOCK {
                m[j] = max(m[j], row[j].abs());
            }
        }
        amax = [block_amax(&m); BLOCK];
    } else {
        for k in 0..BLOCK {
            amax[k] = block_amax(&v[k]);
        }
    }
    let (sf, enc) = group_scales(&amax, g);
    if sr {
        let bits = group_bits(key, first, stride);
        for k in 0..BLOCK {
            v[k] = fake_block(&v[k], enc[k], sf[k], Some(&bits[k]));
        }
    } else {
        for k in 0..BLOCK {
            v[k] = fake_block(&v[k], enc[k], sf[k], None);
        }
    }
}

/// Where [`fake_panel`] reads its input: a separate slice, or the output itself (in place).
/// Monomorphised, so the hot loops carry no branch on it.
trait Source {
    /// The 16 elements at `s` (of the source, or of `dst` in place).
    fn block(&self, dst: &[f32], s: usize) -> [f32; BLOCK];
    /// The `e - s <= 16` elements at `s .. e`, zero-padded to a block.
    fn partial(&self, dst: &[f32], s: usize, e: usize) -> [f32; BLOCK];
    /// Where element 0 is read from, given `dst`'s pointer: the source slice, or `dst`.
    fn base(&self, dst: *mut f32) -> *const f32;
}

/// Reads from the slice (the panel's rows, indexed like `dst`).
impl Source for &[f32] {
    #[inline(always)]
    fn block(&self, _: &[f32], s: usize) -> [f32; BLOCK] {
        self[s..s + BLOCK].try_into().expect("16 elements")
    }
    #[inline(always)]
    fn partial(&self, _: &[f32], s: usize, e: usize) -> [f32; BLOCK] {
        let mut b = [0.0; BLOCK];
        load(&mut b, &self[s..e]);
        b
    }
    #[inline(always)]
    fn base(&self, _: *mut f32) -> *const f32 {
        self.as_ptr()
    }
}

/// Reads from `dst` (in-place quantization of the staged columnwise operand).
struct InPlace;

impl Source for InPlace {
    #[inline(always)]
    fn block(&self, dst: &[f32], s: usize) -> [f32; BLOCK] {
        dst[s..s + BLOCK].try_into().expect("16 elements")
    }
    #[inline(always)]
    fn partial(&self, dst: &[f32], s: usize, e: usize) -> [f32; BLOCK] {
        let mut b = [0.0; BLOCK];
        load(&mut b, &dst[s..e]);
        b
    }
    #[inline(always)]
    fn base(&self, dst: *mut f32) -> *const f32 {
        dst
    }
}

/// Copies `n <= 16` elements into a block, zero-filling the rest.
#[inline(always)]
fn load(dst: &mut [f32; BLOCK], src: &[f32]) {
    if src.len() == BLOCK {
        *dst = src.try_into().expect("16 elements");
    } else {
        *dst = [0.0; BLOCK];
        dst[..src.len()].copy_from_slice(src);
    }
}

/// Copies the first `dst.len() <= 16` elements of a block into `dst`.
#[inline(always)]
fn store(dst: &mut [f32], src: &[f32; BLOCK]) {
    if dst.len() == BLOCK {
        let d: &mut [f32; BLOCK] = dst.try_into().expect("16 elements");
        *d = *src;
    } else {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = *s;
        }
    }
}

/// Fake-quantizes the stored rows `p0 .. p0 + n` into `dst` (`n` whole rows of `plan.cols`),
/// reading them from `src` (a slice shaped like `dst`, or `dst` itself).
/// `p0` is a multiple of 16 for 16x16 tiles.
#[inline(always)]
fn fake_panel(dst: &mut [f32], plan: &Plan, src: impl Source, g: &GlobalScale, p0: usize) {
    let cols = plan.cols;
    let n = dst.len() / cols;
    let bpr = plan.blocks_per_row();
    let mut v: Tile = [[0.0; BLOCK]; BLOCK];
    // (No closures: they would be compiled outside the AVX2 build of this function.)
    #[cfg(target_arch = "x86_64")]
    let wide = !plan.portable && super::avx512::available();
    if plan.tile2d {
        for r0 in (0..n).step_by(BLOCK) {
            let nr = (n - r0).min(BLOCK);
            for b in 0..bpr {
                let c0 = b * BLOCK;
                let nc = (cols - c0).min(BLOCK);
                // A whole tile rounded to nearest: one scale and the same rounding for every
                // element, so the lane-wise stretch kernel with its tile-wide amax computes
                // it (with stochastic rounding its random bytes would be transposed).
                #[cfg(target_arch = "x86_64")]
                if wide && !plan.sr && nr == BLOCK && nc == BLOCK {
                    let q = super::avx512::Stretch {
                        tile2d: true,
                        sr: false,
                        g,
                        key: plan.key,
                        first: 0,
                        stride: 0,
                    };
                    let s = r0 * cols + c0;
                    assert!(s + (BLOCK - 1) * cols + BLOCK <= dst.len());
                    let d = dst.as_mut_ptr();
                    // SAFETY: AVX-512F is present (`available`); rows r0 .. r0 + 16, columns
                    // c0 .. c0 + 16 lie inside `dst` (asserted) and inside the source, which
                    // is shaped like `dst` (or is `dst`).
                    unsafe {
                        super::avx512::vertical_stretch(src.base(d).add(s), d.add(s), cols, q)
                    };
                    continue;
                }
                for i in 0..BLOCK {
                    let s = (r0 + i) * cols + c0;
                    v[i] = if i < nr {
                        src.partial(dst, s, s + nc)
                    } else {
                        [0.0; BLOCK]
                    };
                }
                let first = ((p0 + r0) * bpr + b) as u64;
                fake_group(&mut v, true, plan.sr, g, plan.key, first, bpr as u64);
                for i in 0..nr {
                    let s = (r0 + i) * cols + c0;
                    store(&mut dst[s..s + nc], &v[i]);
                }
            }
        }
        return;
    }
    for r in 0..n {
        for b0 in (0..bpr).step_by(BLOCK) {
            let nb = (bpr - b0).min(BLOCK);
            let base = r * cols + b0 * BLOCK;
            let first = ((p0 + r) * bpr + b0) as u64;
            if (b0 + nb) * BLOCK <= cols {
                #[cfg(target_arch = "x86_64")]
                if wide {
                    assert!(base + nb * BLOCK <= dst.len());
                    let d = dst.as_mut_ptr();
                    let sr = plan.sr.then_some((plan.key, first));
                    // SAFETY: AVX-512F is present (`available`); the group's blocks lie
                    // inside `dst` (asserted) and the source shaped like it (or `dst`).
                    unsafe {
                        super::avx512::row_group(src.base(d).add(base), d.add(base), nb, g, sr)
                    };
                    continue;
                }
                // Whole blocks: amaxes and scales first, then block by block from the source
                // into `dst`, without an intermediate copy.
                let mut amax = [0.0f32; BLOCK];
                for k in 0..nb {
                    amax[k] = block_amax(&src.block(dst, base + k * BLOCK));
                }
                let (sf, enc) = group_scales(&amax, g);
                if plan.sr {
                    let bits = group_bits(plan.key, first, 1);
                    for k in 0..nb {
                        let s = base + k * BLOCK;
                        let y = fake_block(&src.block(dst, s), enc[k], sf[k], Some(&bits[k]));
                        store(&mut dst[s..s + BLOCK], &y);
                    }
                } else {
                    for k in 0..nb {
                        let s = base + k * BLOCK;
                        let y = fake_block(&src.block(dst, s), enc[k], sf[k], None);
                        store(&mut dst[s..s + BLOCK], &y);
                    }
                }
                continue;
            }
            // The row's last group ends in a partial block.
            for k in 0..BLOCK {
                let c0 = (b0 + k) * BLOCK;
                v[k] = if k < nb {
                    src.partial(dst, base + k * BLOCK, r * cols + (c0 + BLOCK).min(cols))
                } else {
                    [0.0; BLOCK]
                };
            }
            fake_group(&mut v, false, plan.sr, g, plan.key, first, 1);
            for k in 0..nb {
                let c0 = (b0 + k) * BLOCK;
                let e = r * cols + (c0 + BLOCK).min(cols);
                store(&mut dst[base + k * BLOCK..e], &v[k]);
            }
        }
    }
}

avx2_dispatch!(fake_panel_dispatch => fake_panel(
    dst: &mut [f32], plan: &Plan, src: impl Source, g: &GlobalScale, p0: usize
));

/// Whether the AVX2 transpose may run: the CPU has AVX2 and the plan does not ask for the
/// baseline path.
#[inline(always)]
fn use_avx2(plan: &Plan) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        !plan.portable && fp_formats::cpu::has_avx2()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = plan;
        false
    }
}

/// `dst[j * ld + i] = t[i][j]` for `i, j < 16`: stores the transpose of a 16x16 tile as 16
/// rows of 16 contiguous elements, `ld` apart. `avx2` selects the shuffle implementation
/// (which must only be requested on a CPU with AVX2); both write identical values.
#[inline(always)]
fn transpose_store(t: &Tile, dst: &mut [f32], ld: usize, avx2: bool) {
    assert!(
        dst.len() >= 15 * ld + BLOCK,
        "transpose_store: destination too short"
    );
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: the caller only sets `avx2` when the CPU supports AVX2, and the assert
        // above keeps every store inside `dst`.
        unsafe { super::avx2::transpose_store(t, dst, ld) };
        return;
    }
    let _ = avx2;
    for j in 0..BLOCK {
        let d: &mut [f32; BLOCK] = (&mut dst[j * ld..][..BLOCK])
            .try_into()
            .expect("16 elements");
        for i in 0..BLOCK {
            d[i] = t[i][j];
        }
    }
}

/// Writes the stored rows `p0 .. p0 + n` of a columnwise operand into `dst` (`n` whole rows
/// of `plan.cols` = the input's row count): the transpose of `x`'s columns `p0 .. p0 + n`,
/// each 16-chunk Hadamard-transformed (BF16 output) when the plan has a sign mask. Returns
/// the amax of what it wrote and whether all of it is finite.
#[inline(always)]
fn stage_panel(dst: &mut [f32], plan: &Plan, x: &[f32], p0: usize) -> (f32, bool) {
    let avx2 = use_avx2(plan);
    let (ld, scols) = (plan.src_cols, plan.cols);
    let n = dst.len() / scols;
    let mut t: Tile = [[0.0; BLOCK]; BLOCK];
    let mut amax = [0.0f32; BLOCK];
    let mut bad = [false; BLOCK];
    // Down the input in steps of 16 rows, across the panel's columns: each step reads
    // `n` contiguous elements of 16 input rows.
    for r0 in (0..scols).step_by(BLOCK) {
        let nr = (scols - r0).min(BLOCK);
        let mut c_start = 0;
        #[cfg(target_arch = "x86_64")]
        if avx2 && nr == BLOCK {
            // The whole tiles of this strip with AVX2 (same operations, see `avx2.rs`).
            c_start = n / BLOCK * BLOCK;
            let (a, b) = super::avx2::stage_strip(x, ld, r0, p0, c_start, dst, scols, plan.mask);
            amax[0] = max(amax[0], a);
            bad[0] |= b;
        }
        for c in (c_start..n).step_by(BLOCK) {
            let nc = (n - c).min(BLOCK);
            // t[i][j] = x[r0 + i, p0 + c + j]: 16 input rows, 16 input columns.
            for i in 0..BLOCK {
                if i < nr {
                    let s = (r0 + i) * ld + p0 + c;
                    load(&mut t[i], &x[s..s + nc]);
                } else {
                    t[i] = [0.0; BLOCK];
                }
            }
            if let Some(mask) = plan.mask {
                // Along i, i.e. along the stored rows (RHT needs nr == 16).
                rht16_columns(&mut t, mask);
            }
            for row in &t {
                for j in 0..BLOCK {
                    let a = row[j].abs();
                    amax[j] = max(amax[j], a);
                    bad[j] |= !a.is_finite();
                }
            }
            if nr == BLOCK && nc == BLOCK {
                transpose_store(&t, &mut dst[c * scols + r0..], scols, avx2);
            } else {
                for j in 0..nc {
                    for i in 0..nr {
                        dst[(c + j) * scols + r0 + i] = t[i][j];
                    }
                }
            }
        }
    }
    let mut m = 0.0f32;
    for a in amax {
        m = max(m, a);
    }
    (m, !bad.iter().any(|&b| b))
}

avx2_dispatch!(stage_panel_dispatch => stage_panel(
    dst: &mut [f32], plan: &Plan, x: &[f32], p0: usize
) -> (f32, bool));

/// Stored rows per parallel task: about [`TASK_ELEMS`] elements, a multiple of 16.
fn task_rows(cols: usize) -> usize {
    (TASK_ELEMS / cols.max(1) / BLOCK).max(1) * BLOCK
}

/// Stored rows per task of the columnwise staging pass: at least [`STAGE_MIN_ROWS`], so that
/// every step reads 256 contiguous bytes of each of 16 input rows.
fn stage_rows(cols: usize) -> usize {
    task_rows(cols).max(STAGE_MIN_ROWS)
}

/// The fused fake quantization of a validated, non-empty plan without Four Over Six, into
/// `out` (`plan.rows x plan.cols`). Returns the per-tensor factor `S_dec`, or `None` when the
/// columnwise staging pass met a non-finite value (the caller then runs the reference path,
/// which names the offending element).
///
/// # Errors
/// Non-finite rowwise input, reported with its index by the amax pass.
pub(super) fn fake_quantize(
    x: &[f32],
    plan: &Plan,
    out: &mut [f32],
) -> Result<Option<f32>, QuantError> {
    debug_assert!(plan.fos.is_none() && !plan.is_empty());
    debug_assert_eq!(out.len(), plan.rows * plan.cols);
    let cols = plan.cols;
    let p = task_rows(cols);
    let g = match plan.usage {
        Usage::Rowwise => {
            let g = Scaling::new(global_amax(x, plan)?, None).g;
            out.par_chunks_mut(p * cols)
                .zip(x.par_chunks(p * cols))
                .enumerate()
                .for_each(|(i, (dst, src))| fake_panel_dispatch(dst, plan, src, &g, i * p));
            g
        }
        Usage::Columnwise => {
            let ps = stage_rows(cols);
            let (amax, finite) = out
                .par_chunks_mut(ps * cols)
                .enumerate()
                .map(|(i, dst)| stage_panel_dispatch(dst, plan, x, i * ps))
                .reduce(|| (0.0, true), |a, b| (max(a.0, b.0), a.1 && b.1));
            if !finite {
                return Ok(None);
            }
            let g = Scaling::new(amax, None).g;
            out.par_chunks_mut(p * cols)
                .enumerate()
                .for_each(|(i, dst)| fake_panel_dispatch(dst, plan, InPlace, &g, i * p));
            g
        }
    };
    Ok(Some(g.s_dec))
}

/// The rowwise fused fake quantization of a validated, non-empty plan without Four Over Six
/// or RHT, packed into GEMM tiles panel by panel ([`crate::gemm::pack::pack_panels`]; the
/// panels start at multiples of 16 rows, as 16x16 tiles need). Returns `S_dec`.
///
/// # Errors
/// Non-finite input, reported with its index by the amax pass.
pub(super) fn fake_quantize_packed(
    x: &[f32],
    plan: &Plan,
    a_layout: bool,
    buf: &mut crate::gemm::TileWords,
) -> Result<f32, QuantError> {
    debug_assert!(plan.usage == Usage::Rowwise && plan.fos.is_none() && plan.mask.is_none());
    let g = Scaling::new(global_amax(x, plan)?, None).g;
    let cols = plan.cols;
    crate::gemm::pack::pack_panels(
        plan.rows,
        cols,
        a_layout,
        buf,
        |_, _| (),
        |r0, dst| fake_panel_dispatch(dst, plan, &x[r0 * cols..][..dst.len()], &g, r0),
    );
    Ok(g.s_dec)
}

// ---------------------------------------------------------------------------------------
// Columnwise operands in the source layout
// ---------------------------------------------------------------------------------------

/// Fake-quantizes a 16x16 stretch `v` of a columnwise operand held in the **source layout**:
/// `v[i][l]` is (the transformed) `x[r + i, c0 + l]`, so each lane `l` is one stored block
/// (Row16) and the 16 lanes one stored tile (Tile16). Lane `l` uses the random bytes of
/// block `first + l · stride`. Everything is lane-wise: block amaxes, scales, elements.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn fake_vertical(
    v: &mut Tile,
    tile2d: bool,
    sr: bool,
    g: &GlobalScale,
    key: RngKey,
    first: u64,
    stride: u64,
) {
    let mut amax = [0.0f32; BLOCK];
    for row in v.iter() {
        for l in 0..BLOCK {
            amax[l] = max(amax[l], row[l].abs());
        }
    }
    if tile2d {
        amax = [block_amax(&amax); BLOCK];
    }
    let (sf, enc) = group_scales(&amax, g);
    if sr {
        let mut blocks = [0u64; BLOCK];
        for (l, b) in blocks.iter_mut().enumerate() {
            *b = first + l as u64 * stride;
        }
        // Byte i of lane l's block: bits 8 (i % 4) .. of its word i / 4.
        let words = blocks_words_x16(key, blocks);
        for i in 0..BLOCK {
            let (w, sh) = (&words[i / 4], 8 * (i % 4));
            for l in 0..BLOCK {
                v[i][l] = fake_sr(v[i][l], enc[l], sf[l], (w[l] >> sh) as u8);
            }
        }
    } else {
        for row in v.iter_mut() {
            for l in 0..BLOCK {
                row[l] = fake_rne(row[l], enc[l], sf[l]);
            }
        }
    }
}

/// Hadamard-transforms the source rows `r0 .. r0 + n` (`n` a multiple of 16) of `x` down
/// their 16-row strips into `dst` (those rows, same layout). Returns the amax of what it
/// wrote and whether all of it (and every value before its BF16 rounding) is finite.
#[inline(always)]
fn rht_stage_panel(dst: &mut [f32], plan: &Plan, x: &[f32], r0: usize) -> (f32, bool) {
    let cols = plan.rows;
    let n = dst.len() / cols;
    let mask = plan.mask.expect("staging needs a Hadamard transform");
    let avx2 = use_avx2(plan);
    let _ = avx2;
    #[cfg(target_arch = "x86_64")]
    let wide = !plan.portable && super::avx512::available();
    let mut v: Tile = [[0.0; BLOCK]; BLOCK];
    let mut amax = [0.0f32; BLOCK];
    let mut bad = [false; BLOCK];
    for r in (0..n).step_by(BLOCK) {
        let strip = &mut dst[r * cols..(r + BLOCK) * cols];
        let mut c_start = 0;
        #[cfg(target_arch = "x86_64")]
        if wide {
            c_start = cols / BLOCK * BLOCK;
            let (a, b) = super::avx512::rht_strip(x, cols, r0 + r, c_start, strip, mask);
            amax[1] = max(amax[1], a);
            bad[1] |= b;
        }
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            let c8 = cols / 8 * 8;
            if c8 > c_start {
                let (a, b) =
                    super::avx2::rht_strip(x, cols, r0 + r, c8 - c_start, strip, mask, c_start);
                amax[0] = max(amax[0], a);
                bad[0] |= b;
            }
            c_start = c8;
        }
        for c0 in (c_start..cols).step_by(BLOCK) {
            let nc = (cols - c0).min(BLOCK);
            for i in 0..BLOCK {
                let s = (r0 + r + i) * cols + c0;
                load(&mut v[i], &x[s..s + nc]);
            }
            // The reference transform: a NaN stays NaN and is caught below.
            rht16_columns(&mut v, mask);
            for (i, row) in v.iter().enumerate() {
                for l in 0..BLOCK {
                    let a = row[l].abs();
                    amax[l] = max(amax[l], a);
                    bad[l] |= !a.is_finite();
                }
                store(&mut strip[i * cols + c0..i * cols + c0 + nc], row);
            }
        }
    }
    (block_amax(&amax), !bad.iter().any(|&b| b))
}

avx2_dispatch!(rht_stage_panel_dispatch => rht_stage_panel(
    dst: &mut [f32], plan: &Plan, x: &[f32], r0: usize
) -> (f32, bool));

/// [`rht_stage_panel_dispatch`] then [`vertical_panel_dispatch`] in place on the source rows
/// `r0 .. r0 + n` of a columnwise operand with RHT (finite: its amax pass checked), the same
/// bits. With AVX-512 and whole 16-column stretches each stretch is transformed and quantized
/// in registers (`avx512::rht_vertical_strip`), without the staged copy.
fn rht_vertical_panel(dst: &mut [f32], plan: &Plan, x: &[f32], g: &GlobalScale, r0: usize) {
    let cols = plan.rows;
    #[cfg(target_arch = "x86_64")]
    if !plan.portable && super::avx512::available() && cols.is_multiple_of(BLOCK) {
        let mask = plan.mask.expect("a Hadamard transform");
        let n = dst.len() / cols;
        let bpr = plan.blocks_per_row() as u64;
        for r in (0..n).step_by(BLOCK) {
            let q = super::avx512::Stretch {
                tile2d: plan.tile2d,
                sr: plan.sr,
                g,
                key: plan.key,
                first: ((r0 + r) / BLOCK) as u64,
                stride: bpr,
            };
            let strip = &mut dst[r * cols..(r + BLOCK) * cols];
            super::avx512::rht_vertical_strip(x, (cols, r0 + r, cols), strip, mask, q);
        }
        return;
    }
    rht_stage_panel_dispatch(&mut *dst, plan, x, r0);
    vertical_panel_dispatch(dst, plan, InPlace, g, r0);
}

/// Fake-quantizes the source rows `r0 .. r0 + n` of a columnwise operand into `dst` (those
/// rows, source layout), reading them from `src` (shaped like `dst`, or `dst` itself).
#[inline(always)]
fn vertical_panel(dst: &mut [f32], plan: &Plan, src: impl Source, g: &GlobalScale, r0: usize) {
    let cols = plan.rows;
    let n = dst.len() / cols;
    let bpr = plan.blocks_per_row() as u64;
    let mut v: Tile = [[0.0; BLOCK]; BLOCK];
    #[cfg(target_arch = "x86_64")]
    let wide = !plan.portable && super::avx512::available();
    for r in (0..n).step_by(BLOCK) {
        let nr = (n - r).min(BLOCK);
        for c0 in (0..cols).step_by(BLOCK) {
            let nc = (cols - c0).min(BLOCK);
            #[cfg(target_arch = "x86_64")]
            if wide && nr == BLOCK && nc == BLOCK {
                let q = super::avx512::Stretch {
                    tile2d: plan.tile2d,
                    sr: plan.sr,
                    g,
                    key: plan.key,
                    first: c0 as u64 * bpr + ((r0 + r) / BLOCK) as u64,
                    stride: bpr,
                };
                let s = r * cols + c0;
                assert!(s + (BLOCK - 1) * cols + BLOCK <= dst.len());
                let d = dst.as_mut_ptr();
                // SAFETY: AVX-512F is present (`available`); rows r .. r + 16, columns
                // c0 .. c0 + 16 lie inside `dst` (asserted) and inside the source, which is
                // shaped like `dst` (or is `dst`).
                unsafe { super::avx512::vertical_stretch(src.base(d).add(s), d.add(s), cols, q) };
                continue;
            }
            for i in 0..BLOCK {
                let s = (r + i) * cols + c0;
                v[i] = if i < nr {
                    src.partial(dst, s, s + nc)
                } else {
                    [0.0; BLOCK]
                };
            }
            // Lane l is stored row c0 + l; this stretch is its stored block (r0 + r) / 16.
            let first = c0 as u64 * bpr + ((r0 + r) / BLOCK) as u64;
            fake_vertical(&mut v, plan.tile2d, plan.sr, g, plan.key, first, bpr);
            for i in 0..nr {
                let s = (r + i) * cols + c0;
                store(&mut dst[s..s + nc], &v[i]);
            }
        }
    }
}

avx2_dispatch!(vertical_panel_dispatch => vertical_panel(
    dst: &mut [f32], plan: &Plan, src: impl Source, g: &GlobalScale, r0: usize
));

/// The columnwise fake quantization of a validated, non-empty columnwise plan without Four
/// Over Six, written in the **source layout**: `out[r * cols + c]` (`out` shaped like `x`)
/// is the value [`fake_quantize`] writes at stored position `(c, r)`. With RHT, a staging
/// pass writes the transformed rows into `out` (no transpose) and reduces their amax, then
/// the quantization runs in place; without, it reads `x`. Returns `None` when a transformed
/// value is non-finite (the caller then takes the reference path for the error).
///
/// # Errors
/// Non-finite input without RHT, reported with its index by the amax pass.
pub(super) fn fake_quantize_columnwise_source_layout(
    x: &[f32],
    plan: &Plan,
    out: &mut [f32],
) -> Result<Option<f32>, QuantError> {
    debug_assert!(plan.usage == Usage::Columnwise && plan.fos.is_none() && !plan.is_empty());
    debug_assert_eq!(out.len(), plan.rows * plan.cols);
    let cols = plan.rows;
    let p = task_rows(cols);
    let g = if plan.mask.is_some() {
        let (amax, finite) = out
            .par_chunks_mut(p * cols)
            .enumerate()
            .map(|(i, dst)| rht_stage_panel_dispatch(dst, plan, x, i * p))
            .reduce(|| (0.0, true), |a, b| (max(a.0, b.0), a.1 && b.1));
        if !finite {
            return Ok(None);
        }
        let g = Scaling::new(amax, None).g;
        out.par_chunks_mut(p * cols)
            .enumerate()
            .for_each(|(i, dst)| vertical_panel_dispatch(dst, plan, InPlace, &g, i * p));
        g
    } else {
        let g = Scaling::new(global_amax(x, plan)?, None).g;
        out.par_chunks_mut(p * cols)
            .zip(x.par_chunks(p * cols))
            .enumerate()
            .for_each(|(i, (dst, src))| vertical_panel_dispatch(dst, plan, src, &g, i * p));
        g
    };
    Ok(Some(g.s_dec))
}

/// [`fake_quantize_columnwise_source_layout`] packed into GEMM tiles chunk-major, panel by
/// panel ([`crate::gemm::pack::pack_panels_chunk_major`]): with RHT, a first pass
/// transforms each panel only for the amax (the same amax as the staging pass; with AVX-512
/// and whole 16-column stretches nothing is stored, `avx512::rht_strip_amax`, else the
/// transform is staged in scratch), and the packing pass transforms each panel again before
/// quantizing it in place. Returns `S_dec`, or `None` for a non-finite transformed value.
///
/// # Errors
/// Non-finite input without RHT, reported with its index by the amax pass.
pub(super) fn fake_quantize_packed_source(
    x: &[f32],
    plan: &Plan,
    a_layout: bool,
    buf: &mut crate::gemm::TileWords,
) -> Result<Option<f32>, QuantError> {
    debug_assert!(plan.usage == Usage::Columnwise && plan.fos.is_none() && !plan.is_empty());
    let (cols, k) = (plan.rows, plan.cols);
    let g = if plan.mask.is_some() {
        let p = task_rows(cols);
        let (amax, finite) = (0..k.div_ceil(p))
            .into_par_iter()
            .map(|i| {
                let n = (k - i * p).min(p);
                #[cfg(target_arch = "x86_64")]
                if !plan.portable && super::avx512::available() && cols.is_multiple_of(BLOCK) {
                    let mask = plan.mask.expect("a Hadamard transform");
                    return (0..n).step_by(BLOCK).fold((0.0, true), |(a, ok), r| {
                        let (s, bad) =
                            super::avx512::rht_strip_amax(x, cols, i * p + r, cols, mask);
                        (max(a, s), ok && !bad)
                    });
                }
                crate::panel::with_scratch(|s| {
                    let dst = crate::panel::grow(&mut s.panel, n * cols);
                    rht_stage_panel_dispatch(dst, plan, x, i * p)
                })
            })
            .reduce(|| (0.0, true), |a, b| (max(a.0, b.0), a.1 && b.1));
        if !finite {
            return Ok(None);
        }
        Scaling::new(amax, None).g
    } else {
        Scaling::new(global_amax(x, plan)?, None).g
    };
    #[cfg(target_arch = "x86_64")]
    if let Some(mask) = plan.mask {
        // whole 32 x 16 tiles: transformed, quantized and packed in registers
        let whole = cols.is_multiple_of(BLOCK) && k.is_multiple_of(2 * BLOCK);
        let wide = super::avx512::available() && crate::gemm::pack::wide_packing();
        if whole && !plan.portable && wide {
            let bpr = plan.blocks_per_row() as u64;
            let fill = crate::gemm::pack::fill_tiles_chunk_major::<(), _>;
            fill(
                cols,
                k,
                buf,
                |(), ()| (),
                |i, t, words: &mut [u32]| {
                    let (r0, c0) = (t * 2 * BLOCK, i * BLOCK);
                    assert!((r0 + 2 * BLOCK - 1) * cols + c0 + BLOCK <= x.len());
                    let q = super::avx512::Stretch {
                        tile2d: plan.tile2d,
                        sr: plan.sr,
                        g: &g,
                        key: plan.key,
                        first: (r0 / BLOCK) as u64 + c0 as u64 * bpr,
                        stride: bpr,
                    };
                    // SAFETY: the CPU has AVX-512F/BW/DQ and AVX512_BF16 (`wide_packing`); the
                    // tile's 32 rows of 16 lie inside `x` (asserted); `words` is one tile.
                    unsafe {
                        let src = x.as_ptr().add(r0 * cols + c0);
                        super::avx512::rht_tile_packed(src, cols, mask, q, (words, a_layout))
                    }
                },
            );
            return Ok(Some(g.s_dec));
        }
    }
    let pack = crate::gemm::pack::pack_panels_chunk_major::<(), _>;
    pack(
        cols,
        k,
        a_layout,
        buf,
        |_, _| (),
        |k0, dst: &mut [f32]| {
            if plan.mask.is_some() {
                rht_vertical_panel(dst, plan, x, &g, k0);
            } else {
                vertical_panel_dispatch(dst, plan, &x[k0 * cols..][..dst.len()], &g, k0);
            }
        },
    );
    Ok(Some(g.s_dec))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fp_formats::{ElementFormat, E2M1, UE4M3};

    #[test]
    fn e4m3_value_matches_lut() {
        for c in 0..=0x7Eu8 {
            assert_eq!(
                e4m3_value(c).to_bits(),
                UE4M3(c).to_f32().to_bits(),
                "{c:#x}"
            );
        }
    }

    /// The grid rounding against the reference encoder, for every f32 in [0, 8] and its
    /// negation, plus infinities (the scaled value of a zero-scale block can overflow).
    #[test]
    fn fake_rne_matches_encoder_everywhere() {
        let top = 8.0f32.to_bits();
        let check = |y: f32| {
            let want = E2M1(E2M1::encode_rne_sat(y)).to_f32();
            let got = fake_rne(y, 1.0, 1.0);
            assert_eq!(got.to_bits(), want.to_bits(), "y = {y:e}");
        };
        for bits in (0..=top).step_by(7) {
            check(f32::from_bits(bits));
            check(-f32::from_bits(bits));
        }
        for y in [
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            -f32::MAX,
            1e30,
            -0.0,
        ] {
            check(y);
        }
        // Every decision point exactly and its neighbours.
        for t in [0.25f32, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 2.0, 4.0, 6.0] {
            for d in -3i32..=3 {
                let y = f32::from_bits((t.to_bits() as i32 + d) as u32);
                check(y);
                check(-y);
            }
        }
    }

    #[test]
    fn fake_sr_matches_encoder() {
        let mut xs = super::super::tests::sr_decision_inputs();
        // beyond the grid: clamped to 6 before encoding
        xs.extend([7.0f32.to_bits(), f32::INFINITY.to_bits()]);
        for bits in xs {
            for sign in [0u32, 0x8000_0000] {
                let y = f32::from_bits(bits | sign);
                for r in 0..=255u8 {
                    let code = super::super::encode_sr(y.clamp(-6.0, 6.0), r);
                    let want = E2M1(code).to_f32();
                    let got = fake_sr(y, 1.0, 1.0, r);
                    assert_eq!(got.to_bits(), want.to_bits(), "y = {y:e}, r = {r}");
                }
            }
        }
    }
}

//! NVFP4 tensor quantization with Transformer Engine's exact semantics (docs/numerics.md#nvfp4):
//! rowwise and columnwise (transposed) copies, 1x16 blocks or 16x16 tiles, the 16-point
//! random Hadamard transform, stochastic rounding from the Philox stream and Four Over Six.
//!
//! # Semantics
//!
//! * **Stored layout.** [`Usage::Rowwise`] quantizes `x` (`[rows, cols]`) as is;
//!   [`Usage::Columnwise`] quantizes `xᵀ` (`[cols, rows]`), stored transposed as Transformer
//!   Engine does. Blocks always run along the rows of the stored tensor (the GEMM reduction
//!   dimension). See [`QuantizedTensor`] for the byte layout.
//! * **Padding** (Transformer Engine's `_pad_tensor`): the stored tensor is zero-padded at the
//!   end of each dimension to a multiple of the tile: for [`BlockShape::Row16`] (tile 1x16)
//!   only the stored columns are padded (`padded_rows = rows`); for [`BlockShape::Tile16`]
//!   both stored rows and columns are padded to multiples of 16. Padding takes part in the
//!   block amax (as zeros), quantizes to code 0 and is dropped by dequantization.
//! * **Per-tensor scale.** `amax` is the maximum of `|v|` over the stored tensor (after the
//!   Hadamard transform when one is applied: the post-RHT amax); `S_enc = fl(2688 / amax)`
//!   with TE's zero/infinity rules ([`GlobalScale::from_amax`]), `S_dec = fl(1 / S_enc)`.
//! * **Blocks.** Row16: one UE4M3 scale per 16 consecutive stored elements,
//!   `s_b = UE4M3(fl(amax_b · fl(S_enc · fl(1/6))))`, `enc_b = min(fl(1 / fl(s_b · S_dec)),
//!   FLT_MAX)`, codes `E2M1(fl(v · enc_b))` with saturation to ±6
//!   ([`GlobalScale::block_scale`], [`GlobalScale::block_encode_factor`],
//!   [`fp_formats::E2M1::encode_rne_sat`]). Tile16: one scale per 16x16 tile of the stored
//!   tensor from the tile amax, repeated on the tile's 16 rows in the scale layout. Since the
//!   global amax is the same for both copies, the rowwise and columnwise copies of a Tile16
//!   tensor without RHT and with round-to-nearest are exact transposes (codes and scales).
//! * **Random Hadamard transform** ([`crate::hadamard`]): columnwise only
//!   ([`QuantError::InvalidConfig`] for rowwise). Each 16-chunk of a stored row is replaced
//!   by its BF16-rounded transform before the amax and the quantization; the stored column
//!   count (the original row count) must be a multiple of 16 (as in Transformer Engine's
//!   reference), otherwise [`QuantError::InvalidConfig`]. Padding rows (Tile16) are added
//!   after the transform. With [`crate::config::Rht::RandomSigns`] the sign mask is a
//!   function of the [`RngKey`], so both Wgrad operands must be quantized with the same key.
//! * **Stochastic rounding** ([`RoundingMode::Stochastic`]): scales are unchanged; each
//!   element's scaled value `y = clamp(fl(v · enc_b), -6, 6)` is rounded up in magnitude with
//!   probability `floor(256 f) / 256` using its 8 random bits `r` from the Philox stream of
//!   the operand's [`RngKey`] ([`crate::philox`]; element index = flat index in the stored,
//!   padded layout), i.e. exactly
//!   `E2M1::from_f32(y, Rounding::Stochastic(r), Overflow::Saturate)`.
//! * **Four Over Six** (TE's `nvfp4_4over6`, docs/numerics.md#four-over-six): the global bound is 256
//!   (`S_enc = fl(1536 / amax)`) when `e4m3_bound_256`, else 448. Per block (or tile) with
//!   amax `a`: `base = fl(fl(a / 6) · S_enc)`, candidate scales `UE4M3(min(fl(1.5 · base),
//!   448))` (map to 4) and `UE4M3(min(base, 448))` (map to 6), each with its own `enc` and
//!   codes; the error of a candidate is `Σ_i err(fl(fl(fl(fl(e2m1_i · s) · amax) / (6 ·
//!   bound)) - v_i))` summed in element order (`err` = `|d|` for MAE, `fl(d · d)` for MSE);
//!   for Tile16 the 16 row errors are summed as a tree (`e_i += e_{i+8}`, then `+4`, `+2`,
//!   `+1`). Map-to-4 wins only if its error is strictly lower. Not combinable with RHT or
//!   stochastic rounding ([`QuantError::InvalidConfig`]).
//! * **Errors.** Non-finite input gives [`fp_formats::FormatError::NonFinite`] with the flat
//!   row-major index into `x` of the first offending element (an RHT that overflows f32,
//!   possible only for `|x| > 2^123`, is reported at the element of `x` whose transform
//!   overflowed, with the transformed value).
//!
//! # Implementation
//!
//! Two passes over the input: the global amax (a parallel `finite_amax`, or, with RHT, a
//! parallel pass that loads, transforms and reduces 16x16 tiles without writing anything),
//! then the quantization proper, parallel over panels of stored rows (64 rowwise, 256
//! columnwise; each columnwise step reads 1 KiB contiguous of 16 input rows). Every block
//! goes through the same per-tile core (`quantize_tile`: 16 block amaxes, scales and encode
//! factors, then codes, with the SR bytes of the tile's 16 blocks from two 8-lane Philox
//! evaluations) whether the result is packed (`quantize`) or decoded (`fake_quantize_into`).
//! Columnwise tiles are transformed down their columns (whole-row vector operations, same
//! per-element arithmetic as [`crate::hadamard::rht16`]) and then transposed in L1. The panel
//! loops are compiled twice, for the baseline target and for AVX2 (picked at run time); both
//! use the same IEEE operations without FMA, so the bytes are identical (unit-tested).
//! Results are independent of the number of rayon threads.
//!
//! `fake_quantize_into` (the emulated GEMM's path) does not go through codes: without Four
//! Over Six it runs a fused kernel (`nvfp4/fast.rs`) that writes `e2m1 · s_b` straight from
//! the scaled value (E2M1 rounding as f32 arithmetic on the grid, no look-up tables), rowwise
//! in one pass after the amax, columnwise after a staging pass that transforms and transposes
//! every tile once (AVX2 shuffles in `nvfp4/avx2.rs`) and reduces the post-RHT amax on the
//! way. The emulated GEMM takes columnwise operands in the source layout instead (same
//! values at the positions of `x`, read through a transposed view; lane-wise kernels, no
//! transpose). Both are tested bit for bit against this tile core (and the packed path) on
//! edge-case data, in both builds; Four Over Six and the error report of a non-finite input
//! take the tile core.
//!
//! ```
//! use quant::{MatRef, OperandQuant, QuantState, Quantizer, Usage};
//! let mut x = vec![0.0f32; 32];
//! x[..16].copy_from_slice(&[0.0, 0.1, -0.2, 0.3, 0.45, -0.6, 0.75, 0.9,
//!                           1.05, -1.2, 1.35, 1.5, -1.65, 1.8, 1.95, 2.1]);
//! x[16] = 10.0;
//! x[17] = -10.0;
//! x[18..].fill(0.5);
//! let q = Quantizer::new(OperandQuant::nvfp4(), Usage::Rowwise)?;
//! let (x, st) = (MatRef::new(&x, 1, 32)?, &mut QuantState::new());
//! let t = q.quantize(x, st)?;
//! assert_eq!(t.scales, [0x6C, 0x7E]);
//! assert_eq!(t.codes[..8], [0x10, 0x29, 0xB3, 0x54, 0xD5, 0x66, 0x7E, 0x77]);
//! let mut fake = vec![0.0f32; 32];
//! let s_dec = q.fake_quantize_into(x, st, &mut fake)?;
//! assert_eq!(s_dec, t.tensor_scale_inv);
//! assert_eq!(fake[16], 6.0 * 448.0); // e2m1 · s_b, without S_dec
//! assert!((t.dequantize()[16] - 10.0).abs() < 1e-5);
//! # Ok::<(), quant::QuantError>(())
//! ```

// Index loops over fixed-size arrays are the idiom the vectoriser handles best here.
#![allow(clippy::needless_range_loop)]

use fp_formats::nvfp4::{dequantize_block, GlobalScale, BLOCK, RANGE};
use fp_formats::{finite_amax, ElementFormat, FormatError, E2M1, E4M3, UE4M3};
use rayon::prelude::*;

use crate::config::{BlockError, BlockShape, FourOverSix, OperandQuant, QuantFormat};
use crate::config::{RoundingMode, Usage};
use crate::hadamard::{rht16_columns, sign_mask};
use crate::philox::blocks_bytes_x8;
use crate::{QuantError, QuantizedTensor, RngKey};

/// Stored rows per parallel work item (multiples of 16). Columnwise panels are wide so that
/// each step down the input reads 1 KiB contiguous per input row (one TLB miss per KiB).
const PANEL_ROWWISE: usize = 64;
const PANEL_COLUMNWISE: usize = 256;
/// Elements per parallel chunk of the plain amax pass.
const AMAX_CHUNK: usize = 1 << 16;

type Tile = [[f32; BLOCK]; BLOCK];

/// The validated geometry and settings of one quantization.
#[derive(Clone, Copy, Debug)]
struct Plan {
    usage: Usage,
    tile2d: bool,
    sr: bool,
    mask: Option<u16>,
    fos: Option<FourOverSix>,
    key: RngKey,
    /// Columns of the input `x` (its row stride).
    src_cols: usize,
    /// Stored (logical) shape.
    rows: usize,
    cols: usize,
    /// Stored shape after padding.
    padded_rows: usize,
    padded_cols: usize,
    /// Force the baseline (non-AVX2) code path (tests compare both).
    portable: bool,
}

impl Plan {
    fn new(
        x: &[f32],
        rows: usize,
        cols: usize,
        usage: Usage,
        q: &OperandQuant,
        key: RngKey,
    ) -> Result<Plan, QuantError> {
        let QuantFormat::Nvfp4 { four_over_six } = q.format else {
            return Err(QuantError::InvalidConfig(format!(
                "nvfp4 quantizer called with format {:?}",
                q.format
            )));
        };
        // The settings were checked by `Quantizer::new` (Row16 or Tile16, RHT columnwise
        // only, Four Over Six without RHT and SR).
        let tile2d = q.block == BlockShape::Tile16;
        let sr = q.rounding == RoundingMode::Stochastic;
        let expected = rows.checked_mul(cols).ok_or(FormatError::ShapeMismatch {
            rows,
            cols,
            expected: usize::MAX,
            got: x.len(),
        })?;
        if x.len() != expected {
            return Err(FormatError::ShapeMismatch {
                rows,
                cols,
                expected,
                got: x.len(),
            }
            .into());
        }
        let (srows, scols) = match usage {
            Usage::Rowwise => (rows, cols),
            Usage::Columnwise => (cols, rows),
        };
        let mask = sign_mask(q.rht, key);
        if mask.is_some() && scols % BLOCK != 0 {
            return Err(QuantError::InvalidConfig(format!(
                "the Hadamard transform needs the transformed dimension (rows = {rows}) to be a \
                 multiple of 16"
            )));
        }
        let padded_cols = scols.div_ceil(BLOCK) * BLOCK;
        let padded_rows = if tile2d {
            srows.div_ceil(BLOCK) * BLOCK
        } else {
            srows
        };
        Ok(Plan {
            usage,
            tile2d,
            sr,
            mask,
            fos: four_over_six,
            key,
            src_cols: cols,
            rows: srows,
            cols: scols,
            padded_rows,
            padded_cols,
            portable: false,
        })
    }

    /// Stored rows per parallel panel. Results do not depend on it.
    #[inline(always)]
    fn panel(&self) -> usize {
        match self.usage {
            Usage::Rowwise => PANEL_ROWWISE,
            Usage::Columnwise => PANEL_COLUMNWISE,
        }
    }

    #[inline(always)]
    fn blocks_per_row(&self) -> usize {
        self.padded_cols / BLOCK
    }

    fn is_empty(&self) -> bool {
        self.rows == 0 || self.cols == 0
    }
}

/// The per-tensor part of the scaling, fixed after the amax pass.
#[derive(Clone, Copy, Debug)]
struct Scaling {
    g: GlobalScale,
    /// Four Over Six: (MSE instead of MAE, `6 · bound`).
    fos: Option<(bool, f32)>,
}

impl Scaling {
    fn new(amax: f32, fos: Option<FourOverSix>) -> Scaling {
        match fos {
            None => Scaling {
                g: GlobalScale::from_amax(amax),
                fos: None,
            },
            Some(f) => {
                let range = if f.e4m3_bound_256 { 6.0 * 256.0 } else { RANGE };
                Scaling {
                    g: global_scale(amax, range),
                    fos: Some((f.error == BlockError::Mse, range)),
                }
            }
        }
    }
}

/// [`GlobalScale::from_amax`] with a different numerator (`6 · E4M3 bound`), as TE's
/// `compute_global_encode_scaling_factor_FP4<E4M3_MAX>` does for Four Over Six.
fn global_scale(amax: f32, range: f32) -> GlobalScale {
    if range == RANGE {
        return GlobalScale::from_amax(amax);
    }
    let mut s_enc = (range / amax).min(f32::MAX);
    if amax == 0.0 || s_enc == 0.0 {
        s_enc = 1.0;
    }
    GlobalScale {
        amax,
        s_enc,
        s_dec: 1.0 / s_enc,
        block_factor: s_enc * (1.0f32 / 6.0),
    }
}

// ---------------------------------------------------------------------------------------
// Element encoders
// ---------------------------------------------------------------------------------------

/// Stochastic E2M1 encode of an already clamped value `y` (`|y| <= 6`) with random byte
/// `r`: bit-identical to `E2M1::from_f32(y, Rounding::Stochastic(r), Overflow::Saturate)`
/// (checked in the unit tests), written without branches so that block loops vectorise.
#[inline(always)]
fn encode_sr(y: f32, r: u8) -> u8 {
    let bits = y.to_bits();
    let sign = ((bits >> 28) & 0x8) as i32;
    // NaN cannot reach here (finite inputs, finite non-zero enc); `min` maps it to 6.
    let a = f32::from_bits(bits & 0x7FFF_FFFF).min(6.0);
    let ge2 = (a >= 2.0) as i32;
    let ge4 = (a >= 4.0) as i32;
    // Grid step 0.5 / 1 / 2 on [0, 2) / [2, 4) / [4, 6]: t = a / step is exact.
    let inv_step = f32::from_bits(0x4000_0000 - ((ge2 + ge4) << 23) as u32);
    // SAFETY: 0 <= a <= 6, so 0 <= a * inv_step * 256 <= 1536 fits an i32.
    let t256: i32 = unsafe { (a * inv_step * 256.0).to_int_unchecked() };
    // t256 = 256 * (grid index of the lower neighbour) + floor(256 * fractional position).
    let up = (r as i32 + (t256 & 0xFF)) >> 8;
    let mag = (t256 >> 8) + up + 2 * (ge2 + ge4);
    (mag | sign) as u8
}

// The hot loops below avoid closures (`array::from_fn`, local closures): a closure is a
// separate function that may not be inlined into the AVX2 build of its caller.

#[inline(always)]
fn encode16_rne(x: &[f32; BLOCK], enc: f32) -> [u8; BLOCK] {
    let mut q = [0u8; BLOCK];
    for i in 0..BLOCK {
        q[i] = E2M1::encode_rne_sat(x[i] * enc);
    }
    q
}

#[inline(always)]
fn encode16_sr(x: &[f32; BLOCK], enc: f32, r: &[u8; BLOCK]) -> [u8; BLOCK] {
    let mut q = [0u8; BLOCK];
    for i in 0..BLOCK {
        q[i] = encode_sr((x[i] * enc).clamp(-6.0, 6.0), r[i]);
    }
    q
}

// ---------------------------------------------------------------------------------------
// Four Over Six
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy)]
struct Candidate {
    scale: UE4M3,
    enc: f32,
}

/// The map-to-4 and map-to-6 candidate scales of a block (or tile) with amax `amax_b`.
#[inline(always)]
fn fos_candidates(amax_b: f32, g: &GlobalScale) -> [Candidate; 2] {
    let base = (amax_b / 6.0) * g.s_enc;
    let s4 = UE4M3(E4M3::encode_rne_sat((base * 1.5).min(448.0)));
    let s6 = UE4M3(E4M3::encode_rne_sat(base.min(448.0)));
    [
        Candidate {
            scale: s4,
            enc: g.block_encode_factor(s4),
        },
        Candidate {
            scale: s6,
            enc: g.block_encode_factor(s6),
        },
    ]
}

/// The candidate's error in the input domain, summed in element order.
#[inline(always)]
fn fos_error(x: &[f32; BLOCK], codes: &[u8; BLOCK], scale: UE4M3, sc: &Scaling) -> f32 {
    let (mse, denom) = sc.fos.expect("Four Over Six scaling");
    let sf = scale.to_f32();
    let amax = sc.g.amax;
    let mut err = 0.0f32;
    for i in 0..BLOCK {
        let val = E2M1(codes[i]).to_f32() * sf * amax / denom;
        let d = val - x[i];
        err += if mse { d * d } else { d.abs() };
    }
    err
}

/// Sum of 16 row errors in the order of a 16-lane shuffle-down tree reduction.
#[inline(always)]
fn tree_sum16(mut e: [f32; BLOCK]) -> f32 {
    for h in [8, 4, 2, 1] {
        for i in 0..h {
            e[i] += e[i + h];
        }
    }
    e[0]
}

// ---------------------------------------------------------------------------------------
// The per-tile core
// ---------------------------------------------------------------------------------------

/// Where a panel's tiles go: packed codes and scale bytes ([`quantize`]) or decoded values
/// ([`fake_quantize_into`]). Implemented by structs with `#[inline(always)]` methods (not
/// closures) so that the writes compile inside the AVX2 build of the panel loop.
trait TileSink {
    /// Receives the tile whose top-left element is at stored position `(r0, 16 * b)`.
    fn put(&mut self, plan: &Plan, r0: usize, b: usize, t: &TileOut);
}

/// Packed codes and scale bytes of the stored rows `p0 ..` (padded layout).
struct PackedSink<'a> {
    p0: usize,
    codes: &'a mut [u8],
    scales: &'a mut [u8],
}

impl TileSink for PackedSink<'_> {
    #[inline(always)]
    fn put(&mut self, plan: &Plan, r0: usize, b: usize, t: &TileOut) {
        let (half_row, bpr) = (plan.padded_cols / 2, plan.blocks_per_row());
        for i in 0..(plan.padded_rows - r0).min(BLOCK) {
            let r = r0 + i - self.p0;
            let dst: &mut [u8; BLOCK / 2] = (&mut self.codes[r * half_row + b * (BLOCK / 2)..]
                [..BLOCK / 2])
                .try_into()
                .expect("8 bytes");
            let q = &t.codes[i];
            for k in 0..BLOCK / 2 {
                dst[k] = q[2 * k] | (q[2 * k + 1] << 4);
            }
            self.scales[r * bpr + b] = t.scales[i].0;
        }
    }
}

/// `e2m1 · s_b` of the stored rows `p0 ..` (logical shape, padding dropped).
struct FakeSink<'a> {
    p0: usize,
    out: &'a mut [f32],
}

impl TileSink for FakeSink<'_> {
    #[inline(always)]
    fn put(&mut self, plan: &Plan, r0: usize, b: usize, t: &TileOut) {
        let c0 = b * BLOCK;
        let n = (plan.cols - c0).min(BLOCK);
        for i in 0..plan.rows.saturating_sub(r0).min(BLOCK) {
            let sf = t.scales[i].to_f32();
            let dst = &mut self.out[(r0 + i - self.p0) * plan.cols + c0..][..n];
            for (d, &code) in dst.iter_mut().zip(&t.codes[i]) {
                *d = E2M1(code).to_f32() * sf;
            }
        }
    }
}

/// The result of one 16x16 tile: unpacked codes and one scale per row.
struct TileOut {
    codes: [[u8; BLOCK]; BLOCK],
    scales: [UE4M3; BLOCK],
}

/// The random bytes of the tile's 16 rows (block index `(r0 + i) * bpr + b` for row `i`).
#[inline(always)]
fn tile_bits(plan: &Plan, r0: usize, b: usize) -> [[u8; BLOCK]; BLOCK] {
    let bpr = plan.blocks_per_row() as u64;
    let first = r0 as u64 * bpr + b as u64;
    let mut blocks = [[0u64; 8]; 2];
    for (h, half) in blocks.iter_mut().enumerate() {
        for (i, blk) in half.iter_mut().enumerate() {
            *blk = first + (8 * h + i) as u64 * bpr;
        }
    }
    let lo = blocks_bytes_x8(plan.key, blocks[0]);
    let hi = blocks_bytes_x8(plan.key, blocks[1]);
    let mut bits = [[0u8; BLOCK]; BLOCK];
    bits[..8].copy_from_slice(&lo);
    bits[8..].copy_from_slice(&hi);
    bits
}

/// Quantizes one 16x16 tile of the stored tensor whose top-left element is at stored
/// position `(r0, 16 * b)`: the scales (per row or per tile, with Four Over Six when
/// configured) and the codes (RNE or SR) of all 16 rows. This is the only place where
/// NVFP4 codes and scales are computed.
#[inline(always)]
fn quantize_tile(tile: &Tile, plan: &Plan, sc: &Scaling, r0: usize, b: usize, out: &mut TileOut) {
    let g = &sc.g;
    if sc.fos.is_some() {
        return quantize_tile_4over6(tile, plan, sc, out);
    }
    // Block amaxes (`row_amax` is `fp_formats::nvfp4::block_amax`, inlined), then the 16
    // scales and encode factors in loops that vectorise across the tile's rows.
    let mut amax = [0.0f32; BLOCK];
    if plan.tile2d {
        let mut m = [0.0f32; BLOCK];
        for row in tile {
            for j in 0..BLOCK {
                m[j] = m[j].max(row[j].abs());
            }
        }
        amax = [row_amax(&m); BLOCK];
    } else {
        for i in 0..BLOCK {
            amax[i] = row_amax(&tile[i]);
        }
    }
    let mut enc = [0.0f32; BLOCK];
    for i in 0..BLOCK {
        out.scales[i] = g.block_scale(amax[i]);
        enc[i] = g.block_encode_factor(out.scales[i]);
    }
    if plan.sr {
        let bits = tile_bits(plan, r0, b);
        for i in 0..BLOCK {
            out.codes[i] = encode16_sr(&tile[i], enc[i], &bits[i]);
        }
    } else {
        for i in 0..BLOCK {
            out.codes[i] = encode16_rne(&tile[i], enc[i]);
        }
    }
}

/// `max |x_i|`, NaN-ignoring: the value of `fp_formats::nvfp4::block_amax` (checked in the
/// unit tests), in
/// a form that inlines into the vectorised tile loop.
#[inline(always)]
fn row_amax(x: &[f32; BLOCK]) -> f32 {
    let mut m = [0.0f32; 8];
    for i in 0..8 {
        m[i] = x[i].abs().max(x[i + 8].abs());
    }
    for h in [4, 2, 1] {
        for i in 0..h {
            m[i] = m[i].max(m[i + h]);
        }
    }
    m[0]
}

/// [`quantize_tile`] with Four Over Six candidate selection (RNE only).
#[inline(always)]
fn quantize_tile_4over6(tile: &Tile, plan: &Plan, sc: &Scaling, out: &mut TileOut) {
    let g = &sc.g;
    #[inline(always)]
    fn pick(x: &[f32; BLOCK], c: &Candidate, sc: &Scaling) -> ([u8; BLOCK], f32) {
        let q = encode16_rne(x, c.enc);
        let e = fos_error(x, &q, c.scale, sc);
        (q, e)
    }
    if plan.tile2d {
        let mut amax = 0.0f32;
        for row in tile {
            amax = amax.max(row_amax(row));
        }
        let [c4, c6] = fos_candidates(amax, g);
        let mut e4 = [0.0f32; BLOCK];
        let mut e6 = [0.0f32; BLOCK];
        let mut q4 = [[0u8; BLOCK]; BLOCK];
        for i in 0..BLOCK {
            (q4[i], e4[i]) = pick(&tile[i], &c4, sc);
            (out.codes[i], e6[i]) = pick(&tile[i], &c6, sc);
        }
        if tree_sum16(e4) < tree_sum16(e6) {
            out.codes = q4;
            out.scales = [c4.scale; BLOCK];
        } else {
            out.scales = [c6.scale; BLOCK];
        }
    } else {
        for i in 0..BLOCK {
            let [c4, c6] = fos_candidates(row_amax(&tile[i]), g);
            let (q4, e4) = pick(&tile[i], &c4, sc);
            let (q6, e6) = pick(&tile[i], &c6, sc);
            (out.codes[i], out.scales[i]) = if e4 < e6 {
                (q4, c4.scale)
            } else {
                (q6, c6.scale)
            };
        }
    }
}

/// Loads the 16x16 stored-layout tile at stored position `(r0, c0)` from `x` (zeros outside
/// the stored shape) and applies the Hadamard transform to its valid rows.
#[inline(always)]
fn load_tile(x: &[f32], plan: &Plan, r0: usize, c0: usize, tile: &mut Tile) {
    let nr = plan.rows.saturating_sub(r0).min(BLOCK);
    let nc = plan.cols.saturating_sub(c0).min(BLOCK);
    let ld = plan.src_cols;
    let full = nr == BLOCK && nc == BLOCK;
    match plan.usage {
        Usage::Rowwise if full => {
            for (i, dst) in tile.iter_mut().enumerate() {
                *dst = *<&[f32; BLOCK]>::try_from(&x[(r0 + i) * ld + c0..][..BLOCK]).expect("16");
            }
        }
        Usage::Rowwise => {
            for (i, dst) in tile.iter_mut().enumerate() {
                *dst = [0.0; BLOCK];
                if i < nr {
                    dst[..nc].copy_from_slice(&x[(r0 + i) * ld + c0..][..nc]);
                }
            }
        }
        Usage::Columnwise => {
            let mut t = [[0.0f32; BLOCK]; BLOCK];
            load_columnwise_transformed(x, plan, r0, c0, &mut t);
            for i in 0..BLOCK {
                for j in 0..BLOCK {
                    tile[i][j] = t[j][i];
                }
            }
        }
    }
}

/// The columnwise tile at stored position `(r0, c0)` **before** its transpose:
/// `t[j][i]` = stored element `(r0 + i, c0 + j)` = `x[c0 + j, r0 + i]` (zeros outside the
/// stored shape), with the Hadamard transform applied along `j` (the stored rows) as
/// whole-row vector operations, padding rows (lanes `i >= rows - r0`) re-zeroed after it.
#[inline(always)]
fn load_columnwise_transformed(x: &[f32], plan: &Plan, r0: usize, c0: usize, t: &mut Tile) {
    let nr = plan.rows.saturating_sub(r0).min(BLOCK);
    let nc = plan.cols.saturating_sub(c0).min(BLOCK);
    let ld = plan.src_cols;
    if nr == BLOCK && nc == BLOCK {
        for (j, row) in t.iter_mut().enumerate() {
            *row = *<&[f32; BLOCK]>::try_from(&x[(c0 + j) * ld + r0..][..BLOCK]).expect("16");
        }
    } else {
        for (j, row) in t.iter_mut().enumerate() {
            *row = [0.0; BLOCK];
            if j < nc {
                row[..nr].copy_from_slice(&x[(c0 + j) * ld + r0..][..nr]);
            }
        }
    }
    if let Some(mask) = plan.mask {
        rht16_columns(t, mask);
        if nr < BLOCK {
            // Padding rows of the stored tensor are added after the transform (+0).
            for row in t.iter_mut() {
                row[nr..].fill(0.0);
            }
        }
    }
}

/// Runs the core over the panel of stored rows `p0 .. p0 + plan.panel()` (clipped to the padded
/// shape) and hands every tile to `sink(r0, b, &out)`. Columnwise panels walk down the
/// input rows (each step reads 16 rows x 256 contiguous bytes); rowwise panels walk along
/// 16 input rows at a time.
#[inline(always)]
fn process_panel(x: &[f32], plan: &Plan, sc: &Scaling, p0: usize, sink: &mut impl TileSink) {
    let p1 = (p0 + plan.panel()).min(plan.padded_rows);
    let bpr = plan.blocks_per_row();
    let mut tile: Tile = [[0.0; BLOCK]; BLOCK];
    let mut out = TileOut {
        codes: [[0; BLOCK]; BLOCK],
        scales: [UE4M3(0); BLOCK],
    };
    // (No closure here: a closure would be compiled outside the AVX2 function.)
    match plan.usage {
        Usage::Columnwise => {
            for b in 0..bpr {
                for r0 in (p0..p1).step_by(BLOCK) {
                    load_tile(x, plan, r0, b * BLOCK, &mut tile);
                    quantize_tile(&tile, plan, sc, r0, b, &mut out);
                    sink.put(plan, r0, b, &out);
                }
            }
        }
        Usage::Rowwise => {
            for r0 in (p0..p1).step_by(BLOCK) {
                for b in 0..bpr {
                    load_tile(x, plan, r0, b * BLOCK, &mut tile);
                    quantize_tile(&tile, plan, sc, r0, b, &mut out);
                    sink.put(plan, r0, b, &out);
                }
            }
        }
    }
}

/// Defines `$name`, which runs the `#[inline(always)]` function `$body` compiled with AVX2
/// when the CPU has it (same IEEE operations and no FMA, so bit-identical results) and
/// `plan.portable` is not set, else compiled for the build's baseline target.
macro_rules! avx2_dispatch {
    ($name:ident => $body:ident(
        $x:ident: $xt:ty, $plan:ident: $pt:ty $(, $arg:ident: $ty:ty)*
    ) $(-> $ret:ty)?) => {
        fn $name($x: $xt, $plan: $pt $(, $arg: $ty)*) $(-> $ret)? {
            #[cfg(all(target_arch = "x86_64", not(target_feature = "avx2")))]
            {
                #[target_feature(enable = "avx2")]
                unsafe fn avx2($x: $xt, $plan: $pt $(, $arg: $ty)*) $(-> $ret)? {
                    $body($x, $plan $(, $arg)*)
                }
                if !$plan.portable && fp_formats::cpu::has_avx2() {
                    // SAFETY: the running CPU supports AVX2 (the shared dispatch checked).
                    return unsafe { avx2($x, $plan $(, $arg)*) };
                }
            }
            $body($x, $plan $(, $arg)*)
        }
    };
}

/// The four butterfly stages (strides 1, 2, 4, 8, each fully unrolled) of the 16-point
/// Hadamard transform on 16 rows of vectors `$v`, with the vector type's `$add` and `$sub`:
/// the shape `crate::hadamard` computes lane by lane, shared by the AVX2 and AVX-512 kernels.
#[cfg(target_arch = "x86_64")]
macro_rules! hadamard16_butterflies {
    ($v:ident, $add:ident, $sub:ident) => {
        hadamard16_butterflies!(@stage $v, $add, $sub, 1);
        hadamard16_butterflies!(@stage $v, $add, $sub, 2);
        hadamard16_butterflies!(@stage $v, $add, $sub, 4);
        hadamard16_butterflies!(@stage $v, $add, $sub, 8);
    };
    (@stage $v:ident, $add:ident, $sub:ident, $s:literal) => {
        for j in 0..BLOCK {
            if j & $s == 0 {
                let (a, b) = ($v[j], $v[j + $s]);
                $v[j] = $add(a, b);
                $v[j + $s] = $sub(a, b);
            }
        }
    };
}

// The fused fake-quantization path (after the macros, which it uses) and its AVX2 and
// AVX-512 kernels.
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod fast;

avx2_dispatch!(process_panel_avx2_dispatch => process_panel(
    x: &[f32], plan: &Plan, sc: &Scaling, p0: usize, sink: &mut impl TileSink
));

/// [`process_panel`] on the widest build that pays: AVX-512 for rowwise 1 x 16 blocks
/// without a transform (one thread, 1024 x 1024: 20-24% less time than the AVX2 build), the
/// AVX2 one for the rest (the columnwise, Hadamard and 16 x 16 tile panels took 5-7% longer
/// on AVX-512). Every build computes the same codes and scales.
fn process_panel_dispatch(
    x: &[f32],
    plan: &Plan,
    sc: &Scaling,
    p0: usize,
    sink: &mut impl TileSink,
) {
    #[cfg(target_arch = "x86_64")]
    if !plan.portable
        && plan.usage == Usage::Rowwise
        && !plan.tile2d
        && plan.mask.is_none()
        && fp_formats::cpu::has_avx512f()
    {
        #[target_feature(enable = "avx2,fma,avx512f")]
        fn wide(x: &[f32], plan: &Plan, sc: &Scaling, p0: usize, sink: &mut impl TileSink) {
            process_panel(x, plan, sc, p0, sink)
        }
        // SAFETY: the running CPU supports AVX-512F (checked just above), hence AVX2 and FMA.
        return unsafe { wide(x, plan, sc, p0, sink) };
    }
    process_panel_avx2_dispatch(x, plan, sc, p0, sink)
}

// ---------------------------------------------------------------------------------------
// Pass 1: the global amax
// ---------------------------------------------------------------------------------------

/// The amax of the transformed stored rows `p0 .. p0 + plan.panel()`, and whether all of them
/// are finite.
#[inline(always)]
fn panel_rht_amax(x: &[f32], plan: &Plan, p0: usize) -> (f32, bool) {
    let p1 = (p0 + plan.panel()).min(plan.rows);
    let mut tile: Tile = [[0.0; BLOCK]; BLOCK];
    let mut amax = [0.0f32; BLOCK];
    let mut bad = [false; BLOCK];
    for b in 0..plan.blocks_per_row() {
        for r0 in (p0..p1).step_by(BLOCK) {
            // The amax does not need the transpose.
            load_columnwise_transformed(x, plan, r0, b * BLOCK, &mut tile);
            for row in &tile {
                for j in 0..BLOCK {
                    let a = row[j].abs();
                    amax[j] = amax[j].max(a);
                    bad[j] |= !a.is_finite();
                }
            }
        }
    }
    (
        amax.iter().fold(0.0f32, |m, &v| m.max(v)),
        !bad.iter().any(|&b| b),
    )
}

avx2_dispatch!(panel_rht_amax_dispatch => panel_rht_amax(
    x: &[f32], plan: &Plan, p0: usize
) -> (f32, bool));

fn global_amax(x: &[f32], plan: &Plan) -> Result<f32, QuantError> {
    if plan.mask.is_none() {
        let parts: Vec<Result<f32, FormatError>> =
            x.par_chunks(AMAX_CHUNK).map(finite_amax).collect();
        let mut amax = 0.0f32;
        for (k, part) in parts.into_iter().enumerate() {
            match part {
                Ok(a) => amax = amax.max(a),
                Err(FormatError::NonFinite { index, value }) => {
                    return Err(FormatError::NonFinite {
                        index: index + k * AMAX_CHUNK,
                        value,
                    }
                    .into())
                }
                Err(e) => return Err(e.into()),
            }
        }
        return Ok(amax);
    }
    // RHT: transform the transposed tiles and reduce; nothing is written. A non-finite
    // input makes some transformed value non-finite, so checking the outputs suffices.
    let n_panels = plan.padded_rows.div_ceil(plan.panel());
    let parts: Vec<(f32, bool)> = (0..n_panels)
        .into_par_iter()
        .map(|p| panel_rht_amax_dispatch(x, plan, p * plan.panel()))
        .collect();
    if parts.iter().all(|p| p.1) {
        return Ok(parts.iter().fold(0.0f32, |m, p| m.max(p.0)));
    }
    // Slow path: name the first non-finite input, or else the first overflowed transform.
    finite_amax(x)?;
    let mut tile: Tile = [[0.0; BLOCK]; BLOCK];
    for r0 in (0..plan.rows).step_by(BLOCK) {
        for b in 0..plan.blocks_per_row() {
            load_tile(x, plan, r0, b * BLOCK, &mut tile);
            for (i, row) in tile.iter().enumerate() {
                for (j, v) in row.iter().enumerate() {
                    if !v.is_finite() && r0 + i < plan.rows {
                        let index = (b * BLOCK + j) * plan.src_cols + r0 + i;
                        return Err(FormatError::NonFinite { index, value: *v }.into());
                    }
                }
            }
        }
    }
    unreachable!("a non-finite transform was detected but not found")
}

// ---------------------------------------------------------------------------------------
// Public API
// ---------------------------------------------------------------------------------------

/// Quantizes a row-major `[rows, cols]` high-precision tensor to NVFP4 for the given usage
/// (see the module docs for the exact semantics and [`QuantizedTensor`] for the layout).
///
/// `key` selects the Philox stream for stochastic rounding and random Hadamard signs; it is
/// ignored otherwise.
///
/// # Errors
/// [`QuantError::InvalidConfig`] for a non-NVFP4 format, 1x32 blocks, RHT with rowwise
/// usage or with a row count that is not a multiple of 16, Four Over Six with RHT or SR;
/// [`QuantError::Format`] for a shape mismatch or non-finite input.
pub(crate) fn quantize(
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    q: &OperandQuant,
    key: RngKey,
) -> Result<QuantizedTensor, QuantError> {
    quantize_impl(x, rows, cols, usage, q, key, false)
}

fn quantize_impl(
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    q: &OperandQuant,
    key: RngKey,
    portable: bool,
) -> Result<QuantizedTensor, QuantError> {
    let plan = Plan {
        portable,
        ..Plan::new(x, rows, cols, usage, q, key)?
    };
    let amax = if plan.is_empty() {
        0.0
    } else {
        global_amax(x, &plan)?
    };
    let sc = Scaling::new(amax, plan.fos);
    let bpr = plan.blocks_per_row();
    let mut codes = vec![0u8; plan.padded_rows * plan.padded_cols / 2];
    let mut scales = vec![0u8; plan.padded_rows * bpr];
    if !plan.is_empty() {
        let half_row = plan.padded_cols / 2;
        codes
            .par_chunks_mut(plan.panel() * half_row)
            .zip(scales.par_chunks_mut(plan.panel() * bpr))
            .enumerate()
            .for_each(|(p, (codes, scales))| {
                let p0 = p * plan.panel();
                let mut sink = PackedSink { p0, codes, scales };
                process_panel_dispatch(x, &plan, &sc, p0, &mut sink);
            });
    }
    Ok(QuantizedTensor {
        format: q.format,
        block: q.block,
        usage,
        rows: plan.rows,
        cols: plan.cols,
        padded_rows: plan.padded_rows,
        padded_cols: plan.padded_cols,
        codes,
        scales,
        amax: sc.g.amax,
        tensor_scale_inv: sc.g.s_dec,
        hadamard: plan.mask,
    })
}

/// Quantizes like [`quantize`] and writes the dequantized values **without** the per-tensor
/// factor, `e2m1(code) · s_b` (exact in f32), into `out` in the stored layout with the
/// logical stored shape (`rows x cols` for rowwise, `cols x rows` for columnwise; padding
/// dropped). Returns the per-tensor factor `S_dec` that the emulated GEMM applies in its
/// epilogue (`α = S_dec,A · S_dec,B`, docs/numerics.md#the-quantized-gemm). `out[i] · S_dec` (one f32
/// multiply) equals [`dequantize`]'s value bit for bit.
///
/// # Errors
/// As [`quantize`], plus a [`fp_formats::FormatError::ShapeMismatch`] when `out.len() !=
/// rows * cols`.
pub(crate) fn fake_quantize_into(
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    q: &OperandQuant,
    key: RngKey,
    out: &mut [f32],
) -> Result<f32, QuantError> {
    let plan = Plan::new(x, rows, cols, usage, q, key)?;
    if out.len() != x.len() {
        return Err(FormatError::ShapeMismatch {
            rows: plan.rows,
            cols: plan.cols,
            expected: x.len(),
            got: out.len(),
        }
        .into());
    }
    if plan.is_empty() {
        return Ok(Scaling::new(0.0, plan.fos).g.s_dec);
    }
    if plan.fos.is_none() {
        if let Some(s_dec) = fast::fake_quantize(x, &plan, out)? {
            return Ok(s_dec);
        }
    }
    fake_quantize_reference(x, &plan, out)
}

/// [`fake_quantize_into`] of `x` packed straight into the BF16 GEMM's tiles (`a_layout`: as
/// its A operand, else as B): the same values panel by panel, packed while in cache, with no
/// f32 copy of the operand. Rowwise operands are packed block-major
/// ([`crate::gemm::pack::pack_panels`]); columnwise ones are quantized in the source layout
/// (as [`fake_quantize_columnwise_source_layout`]) and packed chunk-major
/// ([`crate::gemm::pack::pack_panels_chunk_major`]; with RHT the transform runs twice, once
/// for the global amax and once per panel, instead of being stored). Returns `(S_dec,
/// chunk_major)`, or `None` for what this path does not cover (Four Over Six, an empty
/// tensor, a non-finite transformed value), which the caller quantizes the usual way.
///
/// # Errors
/// As [`fake_quantize_into`].
pub(crate) fn fake_quantize_packed(
    x: &[f32],
    (rows, cols, usage): (usize, usize, Usage),
    q: &OperandQuant,
    key: RngKey,
    a_layout: bool,
    buf: &mut crate::gemm::TileWords,
) -> Result<Option<(f32, bool)>, QuantError> {
    let plan = Plan::new(x, rows, cols, usage, q, key)?;
    if plan.fos.is_some() || plan.is_empty() {
        return Ok(None);
    }
    Ok(match usage {
        Usage::Rowwise => Some((fast::fake_quantize_packed(x, &plan, a_layout, buf)?, false)),
        Usage::Columnwise => {
            fast::fake_quantize_packed_source(x, &plan, a_layout, buf)?.map(|f| (f, true))
        }
    })
}

/// The columnwise [`fake_quantize_into`] of `x` (`[rows, cols]`) written in the layout of
/// `x` instead of the stored (transposed) layout: `out[r * cols + c]` is the stored value at
/// `(c, r)`. Returns `S_dec`. The emulated GEMM reads it through a transposed view, which
/// packs like an f32 operand's view (no transpose is materialised).
///
/// # Errors
/// As [`fake_quantize_into`] with [`Usage::Columnwise`].
pub(crate) fn fake_quantize_columnwise_source_layout(
    x: &[f32],
    rows: usize,
    cols: usize,
    q: &OperandQuant,
    key: RngKey,
    out: &mut [f32],
) -> Result<f32, QuantError> {
    let plan = Plan::new(x, rows, cols, Usage::Columnwise, q, key)?;
    if out.len() != x.len() {
        return Err(FormatError::ShapeMismatch {
            rows,
            cols,
            expected: x.len(),
            got: out.len(),
        }
        .into());
    }
    if plan.is_empty() {
        return Ok(Scaling::new(0.0, plan.fos).g.s_dec);
    }
    if plan.fos.is_none() {
        if let Some(s_dec) = fast::fake_quantize_columnwise_source_layout(x, &plan, out)? {
            return Ok(s_dec);
        }
    }
    // Four Over Six, or the error report: the stored layout, then transposed into `out`.
    let mut stored = vec![0.0f32; x.len()];
    let s_dec = fake_quantize_reference(x, &plan, &mut stored)?;
    for (c, srow) in stored.chunks_exact(rows).enumerate() {
        for (r, v) in srow.iter().enumerate() {
            out[r * cols + c] = *v;
        }
    }
    Ok(s_dec)
}

/// The tile-core implementation of [`fake_quantize_into`] (Four Over Six, the error report
/// of a non-finite columnwise input, and the reference the fused path is tested against).
fn fake_quantize_reference(x: &[f32], plan: &Plan, out: &mut [f32]) -> Result<f32, QuantError> {
    let plan = *plan;
    let amax = global_amax(x, &plan)?;
    let sc = Scaling::new(amax, plan.fos);
    let cols_s = plan.cols;
    out.par_chunks_mut(plan.panel() * cols_s)
        .enumerate()
        .for_each(|(p, out)| {
            let p0 = p * plan.panel();
            process_panel_dispatch(x, &plan, &sc, p0, &mut FakeSink { p0, out });
        });
    Ok(sc.g.s_dec)
}

fn check_tensor(t: &QuantizedTensor) -> Result<(), QuantError> {
    if !matches!(t.format, QuantFormat::Nvfp4 { .. }) {
        return Err(QuantError::InvalidConfig(format!(
            "nvfp4 dequantizer called on a {:?} tensor",
            t.format
        )));
    }
    let bad =
        !t.padded_cols.is_multiple_of(BLOCK) || t.padded_cols < t.cols || t.padded_rows < t.rows;
    if bad {
        return Err(QuantError::InvalidConfig(format!(
            "inconsistent NVFP4 tensor shape {}x{} padded to {}x{}",
            t.rows, t.cols, t.padded_rows, t.padded_cols
        )));
    }
    let n_codes = t.padded_rows * t.padded_cols / 2;
    if t.codes.len() != n_codes {
        return Err(FormatError::BadBufferLength {
            expected: n_codes,
            got: t.codes.len(),
        }
        .into());
    }
    let n_scales = t.padded_rows * t.padded_cols / BLOCK;
    if t.scales.len() != n_scales {
        return Err(FormatError::BadBufferLength {
            expected: n_scales,
            got: t.scales.len(),
        }
        .into());
    }
    Ok(())
}

/// `out[r, c] = fl(fl(e2m1 · s_b) · s_dec)` over the logical stored shape.
fn dequantize_with(t: &QuantizedTensor, s_dec: f32, out: &mut [f32]) {
    let (cols, bpr) = (t.cols, t.padded_cols / BLOCK);
    if cols == 0 {
        return;
    }
    out.par_chunks_mut(cols).enumerate().for_each(|(r, row)| {
        let mut buf = [0.0f32; BLOCK];
        for (b, dst) in row.chunks_mut(BLOCK).enumerate() {
            let codes = &t.codes[(r * t.padded_cols + b * BLOCK) / 2..][..BLOCK / 2];
            dequantize_block(codes, UE4M3(t.scales[r * bpr + b]), s_dec, &mut buf);
            dst.copy_from_slice(&buf[..dst.len()]);
        }
    });
}

/// Dequantizes an NVFP4 tensor to f32 including the per-tensor factor:
/// `fl(fl(e2m1 · s_b) · S_dec)`, in the stored layout with the logical stored shape
/// (`t.rows x t.cols`; padding dropped).
///
/// # Panics
/// If `t` is not a consistent NVFP4 tensor.
pub(crate) fn dequantize(t: &QuantizedTensor) -> Vec<f32> {
    if let Err(e) = check_tensor(t) {
        panic!("nvfp4::dequantize: {e}");
    }
    let mut out = vec![0.0f32; t.rows * t.cols];
    dequantize_with(t, t.tensor_scale_inv, &mut out);
    out
}

/// Writes `e2m1 · s_b` (exact; without the per-tensor factor) of every element of `t` into
/// `out` (`t.rows x t.cols`, padding dropped) and returns the per-tensor factor
/// `t.tensor_scale_inv` (`S_dec`), like `fake_quantize_into`.
///
/// # Errors
/// [`QuantError::InvalidConfig`] if `t` is not an NVFP4 tensor or its shape is
/// inconsistent, [`QuantError::Format`] if a buffer has the wrong length.
///
/// ```
/// use quant::{nvfp4, MatRef, OperandQuant, QuantState, Quantizer, Usage};
/// let x = vec![6.0f32, 1.0];
/// let q = Quantizer::new(OperandQuant::nvfp4(), Usage::Rowwise)?;
/// let t = q.quantize(MatRef::new(&x, 1, 2)?, &mut QuantState::new())?;
/// let mut out = [0.0f32; 2];
/// let s_dec = nvfp4::dequantize_unscaled_into(&t, &mut out)?;
/// assert_eq!(out, [6.0 * 448.0, 448.0]);
/// assert_eq!(s_dec, t.tensor_scale_inv);
/// # Ok::<(), quant::QuantError>(())
/// ```
pub fn dequantize_unscaled_into(t: &QuantizedTensor, out: &mut [f32]) -> Result<f32, QuantError> {
    check_tensor(t)?;
    if out.len() != t.rows * t.cols {
        return Err(FormatError::ShapeMismatch {
            rows: t.rows,
            cols: t.cols,
            expected: t.rows * t.cols,
            got: out.len(),
        }
        .into());
    }
    dequantize_with(t, 1.0, out);
    Ok(t.tensor_scale_inv)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Rht;
    use fp_formats::{Overflow, Rounding};

    /// Magnitude bit patterns in [0, 6] where an SR decision can change: every 40009th f32,
    /// every f32 within 4 ulps of each point `lo + j * step / 256` of the E2M1 grid, the
    /// smallest subnormals, the smallest normal and 6 itself.
    pub(super) fn sr_decision_inputs() -> Vec<u32> {
        let six = 6.0f32.to_bits();
        let mut xs: Vec<u32> = (0..=six).step_by(40009).collect();
        let grid = [0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        for w in grid.windows(2) {
            for j in 0..256 {
                let b = (w[0] + (w[1] - w[0]) * j as f32 / 256.0).to_bits();
                xs.extend(b.saturating_sub(4)..=(b + 4).min(six));
            }
        }
        xs.extend([1, 2, 0x0080_0000, six]);
        xs
    }

    /// The branch-free SR encoder against the generic bit-level encoder of fp-formats, for
    /// all 256 random bytes and both signs, on a sweep of [0, 6] (every 40009th f32) plus
    /// every f32 within 4 ulps of each point `lo + j * step / 256` where the decision
    /// changes (grid points included).
    #[test]
    fn encode_sr_matches_fp_formats() {
        for bits in sr_decision_inputs() {
            for sign in [0u32, 0x8000_0000] {
                let y = f32::from_bits(bits | sign);
                for r in 0..=255u8 {
                    let want = E2M1::from_f32(y, Rounding::Stochastic(r), Overflow::Saturate).0;
                    assert_eq!(encode_sr(y, r), want, "y = {y:e}, r = {r}");
                }
            }
        }
    }

    /// The AVX2 build of the hot loops and the baseline build give identical bytes.
    #[test]
    fn portable_and_avx2_paths_agree() {
        use crate::config::{BlockError, FourOverSix};
        let (rows, cols) = (80, 48);
        let x: Vec<f32> = (0..rows * cols)
            .map(|i| {
                ((i * 2654435761usize % 1000) as f32 - 500.0) * if i % 37 == 0 { 0.3 } else { 0.01 }
            })
            .collect();
        let key = RngKey { seed: 3, stream: 4 };
        let nv = OperandQuant::nvfp4();
        let fos = OperandQuant {
            format: QuantFormat::Nvfp4 {
                four_over_six: Some(FourOverSix {
                    error: BlockError::Mse,
                    e4m3_bound_256: true,
                }),
            },
            ..nv
        };
        for usage in [Usage::Rowwise, Usage::Columnwise] {
            let mut qs = vec![
                nv,
                nv.with_rounding(RoundingMode::Stochastic),
                nv.with_block(BlockShape::Tile16),
                fos,
                fos.with_block(BlockShape::Tile16),
            ];
            if usage == Usage::Columnwise {
                qs.push(
                    nv.with_rht(Rht::FixedSigns)
                        .with_rounding(RoundingMode::Stochastic),
                );
            }
            for q in qs {
                let a = quantize_impl(&x, rows, cols, usage, &q, key, true).unwrap();
                let b = quantize_impl(&x, rows, cols, usage, &q, key, false).unwrap();
                assert_eq!(a, b, "{usage:?} {q:?}");
            }
        }
    }

    /// Inputs for the fused-path tests: random magnitudes over many binades with zeros,
    /// subnormals, exact grid points, ties and values near f32::MAX (finite), optionally a
    /// whole all-zero / all-subnormal region so that some blocks get scale 0.
    fn edge_data(n: usize, seed: u64, huge: bool) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let u = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                match (s >> 8) % 23 {
                    0 => 0.0,
                    1 => -0.0,
                    2 => f32::from_bits((s >> 12) as u32 & 0x807F_FFFF), // subnormal
                    3 => [0.25f32, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0][i % 8],
                    4 if huge => f32::MAX * u,
                    5 => u * 1e-30,
                    6 => u * 1e6,
                    _ if i % 97 < 20 => u * 1e-38, // whole low-magnitude stretches
                    _ => u * 4.0,
                }
            })
            .collect()
    }

    /// The fused fake quantization (AVX2 and baseline builds) equals the tile-core
    /// reference bit for bit, for every non-Four-Over-Six configuration, both usages and
    /// shapes with partial blocks, partial tiles and partial 16-block groups.
    #[test]
    fn fused_fake_quantize_matches_reference() {
        let key = RngKey {
            seed: 11,
            stream: 5,
        };
        let nv = OperandQuant::nvfp4();
        let sr = RoundingMode::Stochastic;
        let mut configs = vec![
            (nv, false),
            (nv.with_rounding(sr), false),
            (nv.with_block(BlockShape::Tile16), false),
            (nv.with_block(BlockShape::Tile16).with_rounding(sr), false),
        ];
        for rht in [Rht::FixedSigns, Rht::RandomSigns] {
            configs.push((nv.with_rht(rht), true));
            configs.push((nv.with_rht(rht).with_rounding(sr), true));
            configs.push((nv.with_rht(rht).with_block(BlockShape::Tile16), true));
        }
        let shapes = [
            (16, 16),
            (32, 256),
            (48, 272),
            (64, 768),
            (16, 1),
            (17, 33),
            (5, 300),
            (80, 48),
            (272, 40),
            (96, 17),
        ];
        for (si, &(rows, cols)) in shapes.iter().enumerate() {
            for huge in [false, true] {
                let x = edge_data(rows * cols, si as u64 * 2 + huge as u64, huge);
                for &(q, rht) in &configs {
                    for usage in [Usage::Rowwise, Usage::Columnwise] {
                        if rht && (usage == Usage::Rowwise || rows % 16 != 0) {
                            continue;
                        }
                        let plan = Plan::new(&x, rows, cols, usage, &q, key).unwrap();
                        let mut want = vec![f32::NAN; x.len()];
                        let Ok(s_ref) = fake_quantize_reference(&x, &plan, &mut want) else {
                            // An overflowing transform: the fused paths must defer.
                            assert!(rht && huge);
                            let s = fast::fake_quantize(&x, &plan, &mut want).unwrap();
                            assert!(s.is_none());
                            let s =
                                fast::fake_quantize_columnwise_source_layout(&x, &plan, &mut want);
                            assert!(s.unwrap().is_none());
                            continue;
                        };
                        for portable in [false, true] {
                            let plan = Plan { portable, ..plan };
                            let mut got = vec![f32::NAN; x.len()];
                            let s = fast::fake_quantize(&x, &plan, &mut got).unwrap();
                            let ctx = format!(
                                "{rows}x{cols} {usage:?} {q:?} huge={huge} portable={portable}"
                            );
                            assert_eq!(s.map(f32::to_bits), Some(s_ref.to_bits()), "{ctx}");
                            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                                assert_eq!(
                                    a.to_bits(),
                                    b.to_bits(),
                                    "{ctx} at {i}: {a:e} vs {b:e}"
                                );
                            }
                            if usage == Usage::Columnwise {
                                // The source-layout variant: the transpose of the same values.
                                let mut src = vec![f32::NAN; x.len()];
                                let s = fast::fake_quantize_columnwise_source_layout(
                                    &x, &plan, &mut src,
                                )
                                .unwrap();
                                assert_eq!(s.map(f32::to_bits), Some(s_ref.to_bits()), "{ctx}");
                                for r in 0..rows {
                                    for c in 0..cols {
                                        let (a, b) = (src[r * cols + c], want[c * rows + r]);
                                        assert_eq!(
                                            a.to_bits(),
                                            b.to_bits(),
                                            "{ctx} src ({r}, {c})"
                                        );
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// The crate entry of the source-layout path, including its fallbacks (Four Over Six,
    /// non-finite input), against the transposed stored-layout result.
    #[test]
    fn columnwise_source_layout_entry() {
        use crate::config::{BlockError, FourOverSix};
        let (rows, cols) = (48, 40);
        let x = edge_data(rows * cols, 99, false);
        let key = RngKey { seed: 2, stream: 8 };
        let nv = OperandQuant::nvfp4();
        let fos = OperandQuant {
            format: QuantFormat::Nvfp4 {
                four_over_six: Some(FourOverSix {
                    error: BlockError::Mae,
                    e4m3_bound_256: false,
                }),
            },
            ..nv
        };
        let qs = [
            nv.with_rht(Rht::FixedSigns)
                .with_rounding(RoundingMode::Stochastic),
            nv.with_block(BlockShape::Tile16),
            fos,
        ];
        for q in qs {
            let mut stored = vec![0.0f32; x.len()];
            let s1 = fake_quantize_into(&x, rows, cols, Usage::Columnwise, &q, key, &mut stored);
            let mut src = vec![0.0f32; x.len()];
            let s2 = fake_quantize_columnwise_source_layout(&x, rows, cols, &q, key, &mut src);
            assert_eq!(s1.unwrap(), s2.unwrap());
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(src[r * cols + c].to_bits(), stored[c * rows + r].to_bits());
                }
            }
            for bad in [f32::INFINITY, f32::from_bits(0x7FFF_FFFF)] {
                let mut xb = x.clone();
                xb[7 * cols + 3] = bad;
                let e1 =
                    fake_quantize_into(&xb, rows, cols, Usage::Columnwise, &q, key, &mut stored);
                let e2 = fake_quantize_columnwise_source_layout(&xb, rows, cols, &q, key, &mut src);
                assert_eq!(
                    format!("{:?}", e1.unwrap_err()),
                    format!("{:?}", e2.unwrap_err())
                );
            }
        }
    }

    /// RHT chunks whose exact sums are zero quantize to code 0x0, as in Transformer Engine
    /// (whose transform is a GEMM with an accumulator that starts at +0), on every path:
    /// packed (AVX2 and baseline builds), fused fake quantization (both builds) and its
    /// source-layout variant. Expected bytes derived by hand, column by column of `x`
    /// (= stored row), 32 rows = two chunks:
    /// * col 0, all -0.0, and col 1, mixed ±0: every output is an exact zero: codes 0x00,
    ///   block scales 0 (a plain butterfly gives -0 in some places of both, checked below);
    /// * col 2: after the signs, each chunk is `[-0 x 8, k, -k, +0 x 6]`, so output `j` is
    ///   `k · (H16[8][j] - H16[9][j]) / 4`: zero for every even `j` (code 0 in the low
    ///   nibble of every byte); at `j = 8` a plain butterfly computes `-0 - (+0) = -0`;
    /// * col 3: `-2^-133` alone at the head of each chunk (sign +1): every output is
    ///   `-2^-135`, which BF16 rounds to -0: a tiny negative sum, -0 in TE as well: codes
    ///   0x88;
    /// * cols 4-7: small integers, so that the tensor amax is ordinary.
    #[test]
    fn rht_zero_sums_quantize_to_code_zero() {
        use crate::hadamard::{signs, TE_SIGN_MASK};
        let (rows, cols) = (32, 8);
        let s = signs(TE_SIGN_MASK);
        let mut x = vec![0.0f32; rows * cols];
        for r in 0..rows {
            let i = r % 16;
            let k = if r < 16 { 2.0 } else { 1.0 };
            x[r * cols] = -0.0;
            x[r * cols + 1] = if r % 3 == 0 { -0.0 } else { 0.0 };
            x[r * cols + 2] = match i {
                0..=7 => -0.0 * s[i],
                8 => k * s[i],
                9 => -k * s[i],
                _ => 0.0 * s[i],
            };
            x[r * cols + 3] = if i == 0 {
                -f32::from_bits(0x0001_0000)
            } else {
                0.0
            };
            for c in 4..cols {
                x[r * cols + c] = ((r * 7 + c * 3) % 9) as f32 - 4.0;
            }
        }
        // Without the `+ 0` of crate::hadamard the transform has -0 zeros in cols 0-2.
        let plain = |c: usize, g: usize| -> [f32; 16] {
            let mut v: [f32; 16] = core::array::from_fn(|i| x[(16 * g + i) * cols + c] * s[i]);
            for h in [1, 2, 4, 8] {
                for j in (0..16).filter(|j| j & h == 0) {
                    let (a, b) = (v[j], v[j + h]);
                    (v[j], v[j + h]) = (a + b, a - b);
                }
            }
            v
        };
        for c in 0..3 {
            let neg = (0..2)
                .flat_map(|g| plain(c, g))
                .filter(|v| v.to_bits() == 0x8000_0000);
            assert!(neg.count() > 0, "col {c} has no -0 sum to fix");
        }

        let key = RngKey { seed: 5, stream: 6 };
        let nv = OperandQuant::nvfp4().with_rht(Rht::FixedSigns);
        for q in [
            nv,
            nv.with_rounding(RoundingMode::Stochastic),
            nv.with_block(BlockShape::Tile16),
        ] {
            let want_value = |c: usize, e: usize| -> Option<u32> {
                match c {
                    0 | 1 => Some(0),
                    2 if e.is_multiple_of(2) => Some(0),
                    3 => Some(0x8000_0000),
                    _ => None,
                }
            };
            for portable in [false, true] {
                let ctx = format!("{q:?} portable={portable}");
                let t =
                    quantize_impl(&x, rows, cols, Usage::Columnwise, &q, key, portable).unwrap();
                assert_eq!((t.rows, t.cols, t.padded_cols), (cols, rows, rows), "{ctx}");
                for c in 0..4 {
                    let codes = &t.codes[c * rows / 2..][..rows / 2];
                    let want: &[u8] = match c {
                        0 | 1 => &[0x00; 16],
                        3 => &[0x88; 16],
                        _ => &[],
                    };
                    if c == 2 {
                        assert!(
                            codes.iter().all(|b| b & 0xF == 0),
                            "{ctx}: col 2 {codes:02x?}"
                        );
                    } else {
                        assert_eq!(codes, want, "{ctx}: col {c}");
                    }
                    if q.block == BlockShape::Row16 && c != 2 {
                        assert_eq!(t.scales[c * 2..c * 2 + 2], [0, 0], "{ctx}: col {c} scales");
                    }
                }
                let plan = Plan {
                    portable,
                    ..Plan::new(&x, rows, cols, Usage::Columnwise, &q, key).unwrap()
                };
                let mut stored = vec![f32::NAN; x.len()];
                fast::fake_quantize(&x, &plan, &mut stored)
                    .unwrap()
                    .unwrap();
                let mut src = vec![f32::NAN; x.len()];
                fast::fake_quantize_columnwise_source_layout(&x, &plan, &mut src)
                    .unwrap()
                    .unwrap();
                for c in 0..4 {
                    for e in 0..rows {
                        if let Some(w) = want_value(c, e) {
                            let (a, b) = (stored[c * rows + e], src[e * cols + c]);
                            assert_eq!(a.to_bits(), w, "{ctx}: fused ({c}, {e}) = {a:e}");
                            assert_eq!(b.to_bits(), w, "{ctx}: source layout ({c}, {e}) = {b:e}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn row_amax_is_block_amax() {
        let mut s = 0x1234_5678_9abc_def1u64;
        for k in 0..20_000 {
            let mut x = [0.0f32; BLOCK];
            for v in &mut x {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                *v = f32::from_bits((s >> 32) as u32 & 0xBFFF_FFFF); // finite, any sign
            }
            if k % 3 == 0 {
                x[(s % 16) as usize] = f32::NAN;
            }
            let want = fp_formats::nvfp4::block_amax(&x);
            assert_eq!(row_amax(&x).to_bits(), want.to_bits(), "{x:?}");
        }
    }

    #[test]
    fn tree_sum_order() {
        let e: [f32; 16] = core::array::from_fn(|i| i as f32);
        assert_eq!(tree_sum16(e), 120.0);
        // Catastrophic-cancellation probe: the tree pairs i with i + 8 first.
        let mut e = [0.0f32; 16];
        e[0] = 1e8;
        e[8] = -1e8;
        e[1] = 1.0;
        assert_eq!(tree_sum16(e), 1.0);
    }
}

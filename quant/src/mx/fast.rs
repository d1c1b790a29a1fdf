//! The fused MX kernels behind [`super::fake_quantize_into`] (every emulated GEMM operand of
//! the MX recipes goes through it) and [`super::quantize`]: per 32-block the amax, the E8M0
//! scale ([`ScaleRule::scale`](fp_formats::mx::ScaleRule::scale)) and then, per element,
//! `element_value(round(fl(x · 2^(127 - b)))) · 2^(b - 127)` written straight as f32 (or the
//! element code, [`Out`]), with no intermediate codes, look-up tables or buffers; bit for
//! bit what the encoder (`F::from_f32` / `encode_slice_rne_sat`) and the decoder give.
//! Tested: the RNE element rounding and code against the encoder and decoder for every f32
//! bit pattern in the non-trivial range of each format (every 509th pattern outside it, where
//! the result is 0 or the saturated maximum; all 2^32 patterns were checked once), the SR
//! rounding on every decision point for all 256 random bytes, and whole tensors against the previous codes path (`mx/tests.rs`).
//!
//! # Element rounding in the f32 domain
//!
//! The saturating RNE and SR rounding onto the element grid and the code of a grid value
//! are the shared helpers of [`crate::grid`] (module docs there). The sign of `y` is put back
//! on the (non-negative) product of the grid value with the scale, so `-0.0` and negative
//! values that round to zero give `-0.0` as the decoder's negative-zero code does.
//! `fl(v · s)` is then the very multiplication of the decoder (`F(code).to_f32() · s`), and
//! `fl(-v · s) = -fl(v · s)`.
//!
//! The clipped count (`|y| > MAX`) and the non-finite check (`|y|` Inf or NaN, which makes
//! the caller report the offending input) are the reference's. NaN inputs are outside the
//! domain (the caller reports an error; the values written for them are unspecified).
//!
//! The code path writes the grid value's code with the format's sign bit from `y`.
//!
//! # Passes
//!
//! * **Rowwise**: one pass over panels of stored rows that reads `x` and writes `out`.
//! * **Columnwise**: per panel, the transposed stored rows (each 16-chunk Hadamard-transformed
//!   with RHT) are written into `out`, then quantized in place.
//! * **Columnwise in the source layout** (the emulated GEMM, no RHT): each 32-row strip of
//!   `x` holds one stored block per column, so 32x16 tiles are quantized lane-wise, without
//!   a transpose, into `out` shaped like `x`.
//! * **Codes** ([`super::quantize`]): the rowwise kernel over the stored panels, writing codes
//!   and scale bytes.
//!
//! The per-panel functions are `#[inline(always)]` on fixed-size arrays and are compiled
//! twice (baseline and AVX2, picked at run time); both use plain IEEE operations without
//! FMA, so they give identical bits (tested). Where the CPU has them, hand-written kernels
//! take the whole blocks and tiles of the fake quantization with the same operations
//! ([`Kernel`]: `mx/avx512.rs`, and `mx/avx2.rs` for CPUs without AVX-512).

use fp_formats::mx::{MxElement, BLOCK};
use fp_formats::{E2M1, E2M3, E3M2, E4M3, E5M2};
use rayon::prelude::*;

use super::{MxCast, PanelStats};
use crate::config::{Rht, Usage};
use crate::grid::{grid_code, grid_rne, grid_sr, max, split, Elem};
use crate::panel::{self, stored_shape};
use crate::philox::blocks_bytes_x16;
use crate::QuantError;

/// What the fused kernel writes per element, from the grid value `v` (non-negative), the
/// scale value `s` and the sign bit of the scaled element (`0` or `0x8000_0000`).
pub(super) trait Out: Copy + Send + Sync {
    /// Whether the output is codes (`[n, pcols]`, padding included, plus the scale bytes)
    /// rather than fake-quantized values (`[n, scols]`).
    const CODES: bool;
    /// The output for one element.
    fn emit<F: Elem>(v: f32, s: f32, sign: u32) -> Self;
    /// `dst`'s pointer when the output is `f32` values (what the AVX-512 kernels write).
    fn values_ptr(dst: &mut [Self]) -> Option<*mut f32>;
}

/// Fake-quantized values: `fl(v · s)` with the sign of the scaled element.
impl Out for f32 {
    const CODES: bool = false;
    #[inline(always)]
    fn emit<F: Elem>(v: f32, s: f32, sign: u32) -> f32 {
        f32::from_bits((v * s).to_bits() | sign)
    }
    #[inline(always)]
    fn values_ptr(dst: &mut [f32]) -> Option<*mut f32> {
        Some(dst.as_mut_ptr())
    }
}

/// Element codes (unpacked, one per byte): the magnitude code and the format's sign bit.
impl Out for u8 {
    const CODES: bool = true;
    #[inline(always)]
    fn emit<F: Elem>(v: f32, _: f32, sign: u32) -> u8 {
        (grid_code::<F>(v) | (sign >> (32 - F::BITS))) as u8
    }
    #[inline(always)]
    fn values_ptr(_: &mut [u8]) -> Option<*mut f32> {
        None
    }
}

/// The fake-quantized value of a scaled element `y` with RNE: `F(rne_sat(y)).to_f32() · s`
/// (what [`block`] computes per element; for the tests).
#[cfg(test)]
#[inline(always)]
pub(super) fn fake_rne<F: Elem>(y: f32, s: f32) -> f32 {
    let (a, sign) = split::<F>(y);
    f32::emit::<F>(grid_rne::<F>(a), s, sign)
}

/// The fake-quantized value of a scaled element `y` with stochastic rounding (random byte
/// `r`): `F(sr_sat(y, r)).to_f32() · s` (for the tests).
#[cfg(test)]
#[inline(always)]
pub(super) fn fake_sr<F: Elem>(y: f32, s: f32, r: u8) -> f32 {
    let (a, sign) = split::<F>(y);
    f32::emit::<F>(grid_sr::<F>(a, r), s, sign)
}

/// `max |x_i|` of a block (equal to `fp_formats::nvfp4::block_amax` for finite input).
#[inline(always)]
fn block_amax(x: &[f32; BLOCK]) -> f32 {
    let mut m = [0.0f32; 8];
    for i in 0..8 {
        m[i] = max(
            max(x[i].abs(), x[i + 8].abs()),
            max(x[i + 16].abs(), x[i + 24].abs()),
        );
    }
    for h in [4, 2, 1] {
        for i in 0..h {
            m[i] = max(m[i], m[i + h]);
        }
    }
    m[0]
}

/// Lanes of the per-panel counters (one AVX2 vector).
const CL: usize = 8;

/// Per-lane counters of one panel: elements clipped (`|y| > MAX`) and non-finite `y`
/// (element `j` of a block counts in lane `j % 8`, so that they stay in two registers).
struct Lanes {
    clipped: [u32; CL],
    bad: [u32; CL],
}

impl Lanes {
    fn new() -> Lanes {
        Lanes {
            clipped: [0; CL],
            bad: [0; CL],
        }
    }

    /// Counts the scaled elements `y` (`N` a multiple of 8): clipped if `|y| > MAX`, bad if
    /// not finite. (Flags first, then a vertical fold: this shape vectorises.)
    #[inline(always)]
    fn count<F: Elem, const N: usize>(&mut self, y: &[f32; N]) {
        let mut c = [0u32; N];
        let mut b = [0u32; N];
        for j in 0..N {
            let ay = y[j].abs();
            c[j] = (ay > F::MAX) as u32;
            b[j] = (ay.to_bits() >= 0x7F80_0000) as u32;
        }
        for q in (0..N).step_by(CL) {
            for k in 0..CL {
                self.clipped[k] += c[q + k];
                self.bad[k] |= b[q + k];
            }
        }
    }

    /// Adds the counts of a hand-written kernel (`mx/avx512.rs`, `mx/avx2.rs`).
    #[cfg(target_arch = "x86_64")]
    fn merge(&mut self, n: &super::Counts) {
        self.clipped[0] += n.clipped as u32;
        self.bad[0] |= n.bad as u32;
    }

    /// The clipped count and whether any `y` was not finite.
    fn totals(&self) -> (usize, bool) {
        (
            self.clipped.iter().map(|&k| k as usize).sum(),
            self.bad.iter().any(|&b| b != 0),
        )
    }
}

/// One block: the scaled values `fl(x · mul)` rounded (RNE, or SR with the random bytes
/// `r`) and emitted with scale value `s` into `out`.
#[inline(always)]
fn block<F: Elem, T: Out>(
    x: &[f32; BLOCK],
    mul: f32,
    s: f32,
    r: Option<&[u8; BLOCK]>,
    l: &mut Lanes,
    out: &mut [T; BLOCK],
) {
    let mut y = [0.0f32; BLOCK];
    for j in 0..BLOCK {
        y[j] = x[j] * mul;
    }
    l.count::<F, BLOCK>(&y);
    // (Loops, not closures: a closure would be compiled outside the AVX2 build.)
    match r {
        None => {
            for j in 0..BLOCK {
                let (a, sign) = split::<F>(y[j]);
                out[j] = T::emit::<F>(grid_rne::<F>(a), s, sign);
            }
        }
        Some(r) => {
            for j in 0..BLOCK {
                let (a, sign) = split::<F>(y[j]);
                out[j] = T::emit::<F>(grid_sr::<F>(a, r[j]), s, sign);
            }
        }
    }
}

/// Where [`panel`] reads its input: a separate slice shaped like the (fake-quantized)
/// output, or the output itself (in place). Monomorphised: no branch in the hot loop.
trait Source<T> {
    /// The 32 elements at `s`.
    fn block(&self, dst: &[T], s: usize) -> [f32; BLOCK];
    /// The `e - s < 32` elements at `s .. e`, zero-padded to a block.
    fn partial(&self, dst: &[T], s: usize, e: usize) -> [f32; BLOCK];
    /// Where element 0 is read from, given the output's values pointer.
    fn base(&self, dst: *mut f32) -> *const f32;
}

/// Copies `src` (fewer than 32 elements) into a zero-padded block.
#[inline(always)]
fn pad(src: &[f32]) -> [f32; BLOCK] {
    let mut b = [0.0f32; BLOCK];
    b[..src.len()].copy_from_slice(src);
    b
}

impl<T> Source<T> for &[f32] {
    #[inline(always)]
    fn block(&self, _: &[T], s: usize) -> [f32; BLOCK] {
        self[s..s + BLOCK].try_into().expect("32 elements")
    }
    #[inline(always)]
    fn partial(&self, _: &[T], s: usize, e: usize) -> [f32; BLOCK] {
        pad(&self[s..e])
    }
    #[inline(always)]
    fn base(&self, _: *mut f32) -> *const f32 {
        self.as_ptr()
    }
}

/// Reads from the output (in-place quantization of the staged columnwise panel).
struct InPlace;

impl Source<f32> for InPlace {
    #[inline(always)]
    fn block(&self, dst: &[f32], s: usize) -> [f32; BLOCK] {
        dst[s..s + BLOCK].try_into().expect("32 elements")
    }
    #[inline(always)]
    fn partial(&self, dst: &[f32], s: usize, e: usize) -> [f32; BLOCK] {
        pad(&dst[s..e])
    }
    #[inline(always)]
    fn base(&self, dst: *mut f32) -> *const f32 {
        dst
    }
}

/// Which code takes the whole blocks (rowwise) or whole 32x16 tiles (columnwise in the
/// source layout) of a panel: the hand-written AVX-512 or AVX2 kernels, or the compiled
/// loops of this module. All give the same bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernel {
    Compiled,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx512,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx2,
}

impl Kernel {
    /// The fastest kernel this CPU runs, or the compiled loops when `portable`.
    fn of(portable: bool) -> Kernel {
        #[cfg(target_arch = "x86_64")]
        if !portable {
            if super::avx512::available() {
                return Kernel::Avx512;
            }
            if fp_formats::cpu::has_avx2() {
                return Kernel::Avx2;
            }
        }
        let _ = portable;
        Kernel::Compiled
    }
}

/// Quantizes the `n` stored rows of one panel (`[n, scols]`, read from `src`) into `dst`:
/// fake-quantized values `[n, scols]`, or codes `[n, pcols]` (padding included) with the
/// scale bytes in `scales` (`[n, pcols / 32]`). `rbits` holds the random bytes of the
/// panel's padded rows (`[n, pcols]`) for stochastic rounding.
#[inline(always)]
fn panel<F: Elem, S: Source<T>, T: Out>(
    c: &MxCast,
    src: S,
    rbits: Option<&[u8]>,
    scols: usize,
    dst: &mut [T],
    scales: &mut [u8],
    portable: bool,
) -> PanelStats {
    let pcols = scols.div_ceil(BLOCK) * BLOCK;
    let bpr = pcols / BLOCK;
    let n = if T::CODES {
        dst.len() / pcols
    } else {
        dst.len() / scols
    };
    let mut l = Lanes::new();
    let mut amax = 0.0f32;
    // Whole blocks of each row on a hand-written kernel where one runs (values output only).
    let kernel = if T::CODES {
        Kernel::Compiled
    } else {
        Kernel::of(portable)
    };
    let first_block = if kernel == Kernel::Compiled {
        0
    } else {
        scols / BLOCK
    };
    #[cfg(target_arch = "x86_64")]
    let mut counts = super::Counts::default();
    for r in 0..n {
        let row = r * scols;
        #[cfg(target_arch = "x86_64")]
        if let Some(d) = T::values_ptr(dst).filter(|_| kernel != Kernel::Compiled) {
            assert!(row + first_block * BLOCK <= dst.len());
            assert!(rbits.is_none_or(|rb| r * pcols + first_block * BLOCK <= rb.len()));
            let (src, dst) = (src.base(d).wrapping_add(row), d.wrapping_add(row));
            let rb = rbits.map(|rb| rb[r * pcols..].as_ptr());
            // SAFETY: the kernel's instructions are present (`Kernel::of`); the row's whole
            // blocks lie inside `dst` and the source shaped like it (or `dst` itself), and
            // their random bytes inside `rbits` (asserted).
            let m = unsafe {
                if kernel == Kernel::Avx512 {
                    super::avx512::row_blocks::<F>(c, src, dst, first_block, rb, &mut counts)
                } else {
                    super::avx2::row_blocks::<F>(c, src, dst, first_block, rb, &mut counts)
                }
            };
            amax = max(amax, m);
        }
        for b in first_block..bpr {
            let c0 = b * BLOCK;
            let s = row + c0;
            let whole = c0 + BLOCK <= scols;
            let x = if whole {
                src.block(dst, s)
            } else {
                src.partial(dst, s, row + scols)
            };
            let m = block_amax(&x);
            amax = max(amax, m);
            let (scale, mul) = c.block_scale::<F>(m);
            let rb: Option<&[u8; BLOCK]> =
                rbits.map(|rb| rb[r * pcols + c0..][..BLOCK].try_into().expect("32 bytes"));
            let (d, len) = if T::CODES {
                scales[r * bpr + b] = scale.0;
                (r * pcols + c0, BLOCK)
            } else {
                (s, (scols - c0).min(BLOCK))
            };
            let sv = scale.value();
            if len == BLOCK {
                let d: &mut [T; BLOCK] = (&mut dst[d..d + BLOCK]).try_into().expect("32");
                block::<F, T>(&x, mul, sv, rb, &mut l, d);
            } else {
                let mut y = [T::emit::<F>(0.0, sv, 0); BLOCK];
                block::<F, T>(&x, mul, sv, rb, &mut l, &mut y);
                dst[d..d + len].copy_from_slice(&y[..len]);
            }
        }
    }
    #[cfg(target_arch = "x86_64")]
    l.merge(&counts);
    let (clipped, non_finite) = l.totals();
    PanelStats {
        clipped,
        amax,
        non_finite,
    }
}

/// Runs [`panel`] compiled with AVX2 when the CPU has it and `portable` is not set
/// (identical results: same IEEE operations, no FMA), else the baseline build.
fn panel_dispatch<F: Elem, S: Source<T>, T: Out>(
    c: &MxCast,
    src: S,
    rbits: Option<&[u8]>,
    scols: usize,
    dst: &mut [T],
    scales: &mut [u8],
    portable: bool,
) -> PanelStats {
    #[cfg(all(target_arch = "x86_64", not(target_feature = "avx2")))]
    {
        #[target_feature(enable = "avx2")]
        unsafe fn avx2<F: Elem, S: Source<T>, T: Out>(
            c: &MxCast,
            src: S,
            rbits: Option<&[u8]>,
            scols: usize,
            dst: &mut [T],
            scales: &mut [u8],
        ) -> PanelStats {
            panel::<F, S, T>(c, src, rbits, scols, dst, scales, false)
        }
        if !portable && fp_formats::cpu::has_avx2() {
            // SAFETY: the running CPU supports AVX2 (the shared dispatch checked).
            return unsafe { avx2::<F, S, T>(c, src, rbits, scols, dst, scales) };
        }
    }
    panel::<F, S, T>(c, src, rbits, scols, dst, scales, portable)
}

/// One panel of any element format (see [`panel`]).
fn panel_dyn<S: Source<T>, T: Out>(
    c: &MxCast,
    src: S,
    rbits: Option<&[u8]>,
    scols: usize,
    dst: &mut [T],
    scales: &mut [u8],
    portable: bool,
) -> PanelStats {
    let (r, p) = (rbits, portable);
    match c.element {
        MxElement::E4M3 => panel_dispatch::<E4M3, S, T>(c, src, r, scols, dst, scales, p),
        MxElement::E5M2 => panel_dispatch::<E5M2, S, T>(c, src, r, scols, dst, scales, p),
        MxElement::E2M3 => panel_dispatch::<E2M3, S, T>(c, src, r, scols, dst, scales, p),
        MxElement::E3M2 => panel_dispatch::<E3M2, S, T>(c, src, r, scols, dst, scales, p),
        MxElement::E2M1 => panel_dispatch::<E2M1, S, T>(c, src, r, scols, dst, scales, p),
    }
}

/// Quantizes the stored rows `src` (`[n, scols]`) of one panel to unpacked codes
/// (`codes`, `[n, pcols]`, padding included) and scale bytes (`[n, pcols / 32]`): the
/// codes path of [`super::quantize`], with the rounding of the fused kernel.
pub(super) fn codes_panel(
    c: &MxCast,
    src: &[f32],
    rbits: Option<&[u8]>,
    scols: usize,
    codes: &mut [u8],
    scales: &mut [u8],
    portable: bool,
) -> PanelStats {
    panel_dyn(c, src, rbits, scols, codes, scales, portable)
}

/// The fused fake quantization of a validated configuration into `out` (stored layout,
/// `x.len()` elements). `portable` forces the baseline build (tests).
///
/// # Errors
/// A stored row length not divisible by 16 with RHT; non-finite input (reported with the
/// offending element, as the codes path does).
pub(super) fn fake_quantize(
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    c: &MxCast,
    out: &mut [f32],
    portable: bool,
) -> Result<PanelStats, QuantError> {
    let (srows, scols) = stored_shape(rows, cols, usage);
    if srows == 0 || scols == 0 {
        return Ok(PanelStats::default());
    }
    super::check_rht(c, rows, scols)?;
    let pcols = scols.div_ceil(BLOCK) * BLOCK;
    let p = panel::panel_rows_for(scols, usage);
    let st = out
        .par_chunks_mut(p * scols)
        .enumerate()
        .map(|(pi, dst)| {
            let r0 = pi * p;
            let n = dst.len() / scols;
            panel::with_scratch(|s| {
                let rb = c.sr.map(|key| {
                    let rb = panel::grow(&mut s.rbits, n * pcols);
                    crate::philox::fill_random_bytes(key, (r0 * pcols) as u64, rb);
                    &*rb
                });
                match usage {
                    Usage::Rowwise => {
                        let src = &x[r0 * scols..(r0 + n) * scols];
                        panel_dyn(c, src, rb, scols, dst, &mut [], portable)
                    }
                    Usage::Columnwise => {
                        panel::stored_panel_into(x, rows, cols, usage, r0, n, dst);
                        if c.rht != Rht::Off {
                            crate::hadamard::apply_rht(dst, c.rht, c.key);
                        }
                        panel_dyn(c, InPlace, rb, scols, dst, &mut [], portable)
                    }
                }
            })
        })
        .reduce(PanelStats::default, PanelStats::merge);
    super::check_finite(x, st)
}

/// [`fake_quantize`] of an operand (validated, non-empty, no RHT) packed into GEMM tiles
/// panel by panel: rowwise block-major ([`crate::gemm::pack::pack_panels`]), each panel's
/// values those [`fake_quantize`] writes for the same rows (the random bytes at the same
/// flat indices); columnwise (`columnwise`) chunk-major
/// ([`crate::gemm::pack::pack_panels_chunk_major`]) from the source-layout kernel of
/// [`fake_quantize_columnwise_source_layout`], on 32-row strips.
pub(super) fn fake_quantize_packed(
    x: &[f32],
    (rows, cols, columnwise): (usize, usize, bool),
    c: &MxCast,
    a_layout: bool,
    buf: &mut crate::gemm::TileWords,
) -> PanelStats {
    let merge = PanelStats::merge;
    if columnwise {
        #[cfg(target_arch = "x86_64")]
        if let Some(stats) = columnwise_whole_tiles_packed(x, (rows, cols), c, a_layout, buf) {
            return stats;
        }
        let pcols = rows.div_ceil(BLOCK) * BLOCK;
        let pack = crate::gemm::pack::pack_panels_chunk_major;
        return pack(cols, rows, a_layout, buf, merge, |r0, dst: &mut [f32]| {
            let src = &x[r0 * cols..][..dst.len()];
            match c.element {
                MxElement::E4M3 => vertical_dispatch::<E4M3>(c, src, cols, r0, pcols, dst, false),
                MxElement::E5M2 => vertical_dispatch::<E5M2>(c, src, cols, r0, pcols, dst, false),
                MxElement::E2M3 => vertical_dispatch::<E2M3>(c, src, cols, r0, pcols, dst, false),
                MxElement::E3M2 => vertical_dispatch::<E3M2>(c, src, cols, r0, pcols, dst, false),
                MxElement::E2M1 => vertical_dispatch::<E2M1>(c, src, cols, r0, pcols, dst, false),
            }
        });
    }
    let pcols = cols.div_ceil(BLOCK) * BLOCK;
    crate::gemm::pack::pack_panels(rows, cols, a_layout, buf, merge, |r0, dst| {
        let n = dst.len() / cols;
        panel::with_scratch(|s| {
            let rb = c.sr.map(|key| {
                let rb = panel::grow(&mut s.rbits, n * pcols);
                crate::philox::fill_random_bytes(key, (r0 * pcols) as u64, rb);
                &*rb
            });
            panel_dyn(
                c,
                &x[r0 * cols..(r0 + n) * cols],
                rb,
                cols,
                dst,
                &mut [],
                false,
            )
        })
    })
}

/// The columnwise operand `x: [rows, cols]` quantized and packed tile by tile into the
/// chunk-major tiles of [`fake_quantize_packed`], each 32x16 tile of the source layout (one
/// stored block per lane) going from the quantizing kernel to its packed words in registers
/// ([`super::avx512::vertical_tile_packed`]): no f32 panel between, the same words. Where
/// the AVX-512 kernel and packer run and the tiles are whole (`rows` a multiple of 32,
/// `cols` of 16: the training shapes); `None` otherwise.
#[cfg(target_arch = "x86_64")]
fn columnwise_whole_tiles_packed(
    x: &[f32],
    (rows, cols): (usize, usize),
    c: &MxCast,
    a_layout: bool,
    buf: &mut crate::gemm::TileWords,
) -> Option<PanelStats> {
    let whole = rows > 0 && cols > 0 && rows.is_multiple_of(BLOCK) && cols.is_multiple_of(LANES);
    if !whole || Kernel::of(false) != Kernel::Avx512 || !crate::gemm::pack::wide_packing() {
        return None;
    }
    assert_eq!(x.len(), rows * cols);
    // stored rows (source columns) of `rows` values: the random-byte indexing of
    // `vertical_panel`, whose padded stored row length is `rows` here
    let pcols = rows;
    let pack = crate::gemm::pack::fill_tiles_chunk_major;
    Some(pack(
        cols,
        rows,
        buf,
        PanelStats::merge,
        |i, t, words: &mut [u32]| {
            let (r0, c0) = (t * BLOCK, i * LANES);
            assert!((r0 + BLOCK - 1) * cols + c0 + LANES <= x.len());
            let rand = c.sr.map(|key| {
                let first = ((c0 * pcols) as u64 + 32 * t as u64) / 16;
                (key, first, (pcols / 16) as u64)
            });
            let mut counts = super::Counts::default();
            let src = x[r0 * cols + c0..].as_ptr();
            let out = (words, a_layout);
            // SAFETY: the AVX-512 kernel and packer run here (checked above); the tile's 32 rows
            // of 16 lie inside `x` (asserted) at stride `cols`; `words` is one tile.
            let amax = unsafe {
                use super::avx512::vertical_tile_packed as tile;
                match c.element {
                    MxElement::E4M3 => tile::<E4M3>(c, src, cols, rand, &mut counts, out),
                    MxElement::E5M2 => tile::<E5M2>(c, src, cols, rand, &mut counts, out),
                    MxElement::E2M3 => tile::<E2M3>(c, src, cols, rand, &mut counts, out),
                    MxElement::E3M2 => tile::<E3M2>(c, src, cols, rand, &mut counts, out),
                    MxElement::E2M1 => tile::<E2M1>(c, src, cols, rand, &mut counts, out),
                }
            };
            PanelStats {
                clipped: counts.clipped,
                amax,
                non_finite: counts.bad,
            }
        },
    ))
}

// ---------------------------------------------------------------------------------------
// Columnwise operands in the source layout
// ---------------------------------------------------------------------------------------

/// Source columns (stored rows) per tile of the source-layout kernel.
const LANES: usize = 16;

/// Fake-quantizes the source rows `r0 .. r0 + n` of a columnwise operand (`src`, `[n,
/// cols]`, `r0` a multiple of 32) into `dst` (the same rows of the output, source layout).
/// Each 32-row strip holds one stored block per column, so everything runs lane-wise on
/// 32x16 tiles, with no transpose: per lane the block amax and scale, then per element the
/// rowwise arithmetic. `pcols` is the padded stored row length (random-byte indexing).
#[inline(always)]
fn vertical_panel<F: Elem>(
    c: &MxCast,
    src: &[f32],
    cols: usize,
    r0: usize,
    pcols: usize,
    dst: &mut [f32],
    portable: bool,
) -> PanelStats {
    let n = dst.len() / cols;
    let mut l = Lanes::new();
    let mut amax_all = 0.0f32;
    let mut t = [[0.0f32; LANES]; BLOCK];
    // Whole 32x16 tiles on a hand-written kernel where one runs (the AVX2 one rounds to
    // nearest only).
    let kernel = match Kernel::of(portable) {
        Kernel::Avx2 if c.sr.is_some() => Kernel::Compiled,
        k => k,
    };
    #[cfg(target_arch = "x86_64")]
    let mut counts = super::Counts::default();
    for rs in (0..n).step_by(BLOCK) {
        let nr = (n - rs).min(BLOCK);
        // The stored block index of this strip.
        let k = ((r0 + rs) / BLOCK) as u64;
        for c0 in (0..cols).step_by(LANES) {
            let nc = (cols - c0).min(LANES);
            #[cfg(target_arch = "x86_64")]
            if kernel != Kernel::Compiled && nr == BLOCK && nc == LANES {
                let s = rs * cols + c0;
                let end = s + (BLOCK - 1) * cols + LANES;
                assert!(end <= src.len() && end <= dst.len());
                // Lane j's Philox blocks (see the portable loop below) are
                // ((c0 + j) · pcols + 32 k) / 16 + h, pcols a multiple of 32.
                let rand = c.sr.map(|key| {
                    (
                        key,
                        ((c0 * pcols) as u64 + 32 * k) / 16,
                        (pcols / 16) as u64,
                    )
                });
                let (src, dst) = (src[s..].as_ptr(), dst[s..].as_mut_ptr());
                // SAFETY: the kernel's instructions are present (`Kernel::of`); the tile's 32
                // rows of 16 lie inside `src` and `dst` (asserted), which are distinct slices.
                let m = unsafe {
                    if kernel == Kernel::Avx512 {
                        super::avx512::vertical_tile::<F>(c, src, dst, cols, rand, &mut counts)
                    } else {
                        super::avx2::vertical_tile_rne::<F>(c, src, dst, cols, &mut counts)
                    }
                };
                amax_all = max(amax_all, m);
                continue;
            }
            for (i, row) in t.iter_mut().enumerate() {
                if i < nr && nc == LANES {
                    let s = (rs + i) * cols + c0;
                    *row = src[s..s + LANES].try_into().expect("16 elements");
                } else {
                    *row = [0.0; LANES];
                    if i < nr {
                        let s = (rs + i) * cols + c0;
                        row[..nc].copy_from_slice(&src[s..s + nc]);
                    }
                }
            }
            let mut amax = [0.0f32; LANES];
            for row in &t {
                for j in 0..LANES {
                    amax[j] = max(amax[j], row[j].abs());
                }
            }
            let mut mul = [0.0f32; LANES];
            let mut sv = [0.0f32; LANES];
            for j in 0..LANES {
                amax_all = max(amax_all, amax[j]);
                let (scale, m) = c.block_scale::<F>(amax[j]);
                (mul[j], sv[j]) = (m, scale.value());
            }
            match c.sr {
                None => {
                    for row in t.iter_mut() {
                        let y = scale_row::<F>(row, &mul, &mut l);
                        for j in 0..LANES {
                            let (a, sign) = split::<F>(y[j]);
                            row[j] = f32::emit::<F>(grid_rne::<F>(a), sv[j], sign);
                        }
                    }
                }
                Some(key) => {
                    // Lane j is stored row c0 + j; its block k starts at flat index
                    // (c0 + j) · pcols + 32 k, i.e. at 16-byte Philox block
                    // ((c0 + j) · pcols + 32 k) / 16, and spans two of them.
                    for h in 0..2u64 {
                        let mut blocks = [0u64; LANES];
                        for (j, b) in blocks.iter_mut().enumerate() {
                            *b = (((c0 + j) * pcols) as u64 + 32 * k) / 16 + h;
                        }
                        let bytes = blocks_bytes_x16(key, blocks);
                        for i in 0..16 {
                            let row = &mut t[16 * h as usize + i];
                            let y = scale_row::<F>(row, &mul, &mut l);
                            for j in 0..LANES {
                                let (a, sign) = split::<F>(y[j]);
                                let v = grid_sr::<F>(a, bytes[j][i]);
                                row[j] = f32::emit::<F>(v, sv[j], sign);
                            }
                        }
                    }
                }
            }
            for (i, row) in t.iter().enumerate().take(nr) {
                let s = (rs + i) * cols + c0;
                dst[s..s + nc].copy_from_slice(&row[..nc]);
            }
        }
    }
    #[cfg(target_arch = "x86_64")]
    l.merge(&counts);
    let (clipped, non_finite) = l.totals();
    PanelStats {
        clipped,
        amax: amax_all,
        non_finite,
    }
}

/// `row[j] · mul[j]` for the 16 lanes of a tile row, counted in `l`.
#[inline(always)]
fn scale_row<F: Elem>(row: &[f32; LANES], mul: &[f32; LANES], l: &mut Lanes) -> [f32; LANES] {
    let mut y = [0.0f32; LANES];
    for j in 0..LANES {
        y[j] = row[j] * mul[j];
    }
    l.count::<F, LANES>(&y);
    y
}

/// Runs [`vertical_panel`] compiled with AVX2 when the CPU has it and `portable` is not set.
fn vertical_dispatch<F: Elem>(
    c: &MxCast,
    src: &[f32],
    cols: usize,
    r0: usize,
    pcols: usize,
    dst: &mut [f32],
    portable: bool,
) -> PanelStats {
    #[cfg(all(target_arch = "x86_64", not(target_feature = "avx2")))]
    {
        #[target_feature(enable = "avx2")]
        unsafe fn avx2<F: Elem>(
            c: &MxCast,
            src: &[f32],
            cols: usize,
            r0: usize,
            pcols: usize,
            dst: &mut [f32],
        ) -> PanelStats {
            vertical_panel::<F>(c, src, cols, r0, pcols, dst, false)
        }
        if !portable && fp_formats::cpu::has_avx2() {
            // SAFETY: the running CPU supports AVX2 (the shared dispatch checked).
            return unsafe { avx2::<F>(c, src, cols, r0, pcols, dst) };
        }
    }
    vertical_panel::<F>(c, src, cols, r0, pcols, dst, portable)
}

/// The columnwise fake quantization of a validated configuration without RHT, written in
/// the **source layout**: `out[r * cols + c]` (`out` shaped like `x`) is the value
/// [`fake_quantize`] writes at stored position `(c, r)`, so a GEMM can read the operand
/// through a transposed view without a transposing copy. `portable` forces the baseline
/// build (tests).
///
/// # Errors
/// Non-finite input (reported with the offending element).
pub(super) fn fake_quantize_columnwise_source_layout(
    x: &[f32],
    rows: usize,
    cols: usize,
    c: &MxCast,
    out: &mut [f32],
    portable: bool,
) -> Result<PanelStats, QuantError> {
    debug_assert!(c.rht == Rht::Off);
    if rows == 0 || cols == 0 {
        return Ok(PanelStats::default());
    }
    let pcols = rows.div_ceil(BLOCK) * BLOCK;
    // About 64 Ki elements per task, whole 32-row strips (the stored blocks).
    let p = (65_536 / cols / BLOCK).max(1) * BLOCK;
    let st = out
        .par_chunks_mut(p * cols)
        .zip(x.par_chunks(p * cols))
        .enumerate()
        .map(|(i, (dst, src))| {
            let (r0, ps) = (i * p, portable);
            match c.element {
                MxElement::E4M3 => vertical_dispatch::<E4M3>(c, src, cols, r0, pcols, dst, ps),
                MxElement::E5M2 => vertical_dispatch::<E5M2>(c, src, cols, r0, pcols, dst, ps),
                MxElement::E2M3 => vertical_dispatch::<E2M3>(c, src, cols, r0, pcols, dst, ps),
                MxElement::E3M2 => vertical_dispatch::<E3M2>(c, src, cols, r0, pcols, dst, ps),
                MxElement::E2M1 => vertical_dispatch::<E2M1>(c, src, cols, r0, pcols, dst, ps),
            }
        })
        .reduce(PanelStats::default, PanelStats::merge);
    super::check_finite(x, st)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// `EMIN` against the format: the smallest subnormal is `2^(emin - m)`.
    #[test]
    fn emin_matches_formats() {
        fn check<F: Elem>() {
            let tiny = F::from_bits(1).to_f32();
            let want = 2f32.powi(F::EMIN - F::MANTISSA_BITS as i32);
            assert_eq!(tiny, want, "{}", F::NAME);
            assert_eq!(f32::from_bits(F::MIN_NORMAL_BITS), 2f32.powi(F::EMIN));
        }
        check::<E4M3>();
        check::<E5M2>();
        check::<E2M3>();
        check::<E3M2>();
        check::<E2M1>();
    }

    /// The code the fused codes path writes for a scaled element `y` with RNE.
    pub(in crate::mx) fn code_rne<F: Elem>(y: f32) -> u8 {
        let (a, sign) = split::<F>(y);
        u8::emit::<F>(grid_rne::<F>(a), 1.0, sign)
    }

    /// The code the fused codes path writes for a scaled element `y` with SR.
    pub(in crate::mx) fn code_sr<F: Elem>(y: f32, r: u8) -> u8 {
        let (a, sign) = split::<F>(y);
        u8::emit::<F>(grid_sr::<F>(a, r), 1.0, sign)
    }

    /// The reference: the encoder the codes path uses, then the decoder.
    fn reference_rne<F: Elem>(y: f32) -> f32 {
        let mut code = [0u8; BLOCK];
        let mut ys = [0.0f32; BLOCK];
        ys[0] = y;
        F::rne_block(&ys, &mut code);
        F::from_bits(code[0]).to_f32()
    }

    /// Compares [`fake_rne`] (scale 1) with the encoder + decoder for the bit patterns
    /// `lo, lo + stride, ... <= hi`, in parallel chunks; the reference encodes whole
    /// 32-element blocks as the codes path does.
    fn sweep_rne<F: Elem>(lo: u32, hi: u32, stride: u32) {
        const CHUNK: u64 = 1 << 16;
        let count = (hi - lo) as u64 / stride as u64 + 1;
        (0..count.div_ceil(CHUNK)).into_par_iter().for_each(|k| {
            let (first, last) = (k * CHUNK, ((k + 1) * CHUNK).min(count));
            let mut ys = [0.0f32; BLOCK];
            let mut codes = [0u8; BLOCK];
            for b in (first..last).step_by(BLOCK) {
                for (j, y) in ys.iter_mut().enumerate() {
                    // Past the end: repeat the last pattern.
                    let i = (b + j as u64).min(last - 1);
                    *y = f32::from_bits(lo + (i * stride as u64) as u32);
                }
                F::rne_block(&ys, &mut codes);
                let differs = |j: usize| {
                    let want = F::from_bits(codes[j]).to_f32();
                    fake_rne::<F>(ys[j], 1.0).to_bits() != want.to_bits()
                        || code_rne::<F>(ys[j]) != codes[j]
                };
                let mut bad = false;
                for j in 0..BLOCK {
                    bad |= differs(j);
                }
                if bad {
                    let j = (0..BLOCK).find(|&j| differs(j)).expect("a mismatch");
                    panic!(
                        "{}: y = {:e} ({:#010x}): fast {:e} (code {:#x}), reference {:e} \
                         (code {:#x})",
                        F::NAME,
                        ys[j],
                        ys[j].to_bits(),
                        fake_rne::<F>(ys[j], 1.0),
                        code_rne::<F>(ys[j]),
                        F::from_bits(codes[j]).to_f32(),
                        codes[j]
                    );
                }
            }
        });
    }

    /// Every bit pattern of both signs whose rounding is not trivial, i.e. every f32 in
    /// `[2^(emin - m - 3), 2^(emax + 3)]` (from far below half the smallest subnormal, which
    /// rounds to zero, to far above the maximum, which saturates); outside it, every 509th
    /// pattern, plus zeros, the f32 subnormal and normal limits and the infinities.
    fn sweep_dense<F: Elem>() {
        let lo = ((127 + F::EMIN - F::MANTISSA_BITS as i32 - 3) as u32) << 23;
        let hi = ((127 + F::EMAX + 3) as u32) << 23;
        for sign in [0, 0x8000_0000u32] {
            sweep_rne::<F>(sign | lo, sign | hi, 1);
            sweep_rne::<F>(sign, sign | lo, 509);
            sweep_rne::<F>(sign | hi, sign | 0x7F80_0000, 509);
            for b in [0, 1, 0x7F_FFFF, 0x80_0000, 0x7F7F_FFFF, 0x7F80_0000] {
                sweep_rne::<F>(sign | b, sign | b, 1);
            }
        }
    }

    /// Every non-trivial pattern of every format (about 7 CPU-s in all). A sweep of all
    /// 2^32 non-NaN patterns per format through the same `sweep_rne` (113 s on two cores,
    /// too slow for every `cargo test`) passed once when this kernel was written.
    #[test]
    fn rne_dense_mxfp8() {
        sweep_dense::<E4M3>();
        sweep_dense::<E5M2>();
    }

    #[test]
    fn rne_dense_fp6_fp4() {
        sweep_dense::<E2M3>();
        sweep_dense::<E3M2>();
        sweep_dense::<E2M1>();
    }

    #[test]
    fn reference_helper_agrees() {
        assert_eq!(reference_rne::<E4M3>(500.0), 448.0);
        assert_eq!(reference_rne::<E2M1>(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(code_rne::<E4M3>(-0.0), 0x80);
        assert_eq!(code_rne::<E2M1>(-7.0), 0xF);
        assert_eq!(code_rne::<E3M2>(-1e-30), 0x20);
    }
}

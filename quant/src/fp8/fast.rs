//! The fused per-tensor FP8 cast behind [`super::fake_quantize_into`] (every emulated GEMM
//! operand of the FP8 recipes) and [`super::quantize`]: per element `y = fl(x · scale)`,
//! then the saturating RNE (or SR) rounding onto the E4M3 / E5M2 grid done in the f32 domain
//! with the shared helpers of [`crate::grid`], written straight as the FP8 value (or its
//! code), with no intermediate codes, look-up table or buffer; bit for bit what the encoder
//! (`encode_slice_rne_sat`, `from_f32(.., Saturate)`) and the decoder give.
//!
//! Non-finite values follow the encoder: `±Inf` (and every `|y| > MAX`) saturates to `±MAX`
//! (and counts as clipped); a NaN `y` gives the format's NaN code with the sign of `y`
//! (`0x7F` E4M3, `0x7E` E5M2), whose decoded value is the f32 NaN `0x7FC0_0000` with that
//! sign. The clipped count is `|y| > MAX`, as before.
//!
//! With delayed scaling the scale is known before the cast, so the same pass also takes the
//! tensor amax (NaN-ignoring, like the separate amax pass it replaces: the maximum of the
//! same magnitudes, so the same value whatever the order).
//!
//! Work is cut into panels of stored rows as before (the random bytes of SR are the
//! Philox bytes at each element's flat index in the stored layout), and within a panel into
//! chunks of 64 elements on fixed-size arrays. The panel function is `#[inline(always)]` and
//! compiled three times (baseline, AVX2 and AVX-512, the widest the CPU runs picked at run
//! time: AVX-512 made the FP8 GEMMs with their quantization 13-18% faster than AVX2 on the
//! AMX host); all use plain IEEE operations without FMA, so they give identical bits
//! (tested, `fp8/tests.rs`).

use fp_formats::{E4M3, E5M2};

use crate::config::Fp8Element;
use crate::grid::{grid_code, grid_rne, grid_sr, max, split, Elem};

/// An FP8 element format: the grid of [`Elem`] and the NaN code.
pub(super) trait Fp8: Elem {
    /// The magnitude code a NaN encodes to (the sign bit is kept).
    const NAN_CODE: u32;
}
impl Fp8 for E4M3 {
    const NAN_CODE: u32 = 0x7F;
}
impl Fp8 for E5M2 {
    const NAN_CODE: u32 = 0x7E;
}

/// What the cast writes per element, from the scaled value `y`, its rounded magnitude `v`
/// (a grid value in `[0, MAX]`) and the sign bit of `y`.
pub(super) trait Emit: Copy + Default + Send + Sync {
    /// The output for one element.
    fn emit<F: Fp8>(y: f32, v: f32, sign: u32) -> Self;
}

/// The FP8 value as f32: `±v`, or the decoder's NaN (`0x7FC0_0000` with the sign of `y`).
impl Emit for f32 {
    #[inline(always)]
    fn emit<F: Fp8>(y: f32, v: f32, sign: u32) -> f32 {
        let bits = if y.is_nan() { 0x7FC0_0000 } else { v.to_bits() };
        f32::from_bits(bits | sign)
    }
}

/// The FP8 code: the magnitude code of `v` (or the NaN code) and the sign bit.
impl Emit for u8 {
    #[inline(always)]
    fn emit<F: Fp8>(y: f32, v: f32, sign: u32) -> u8 {
        let mag = if y.is_nan() {
            F::NAN_CODE
        } else {
            grid_code::<F>(v)
        };
        (mag | (sign >> 24)) as u8
    }
}

/// The value (or code) of one scaled element with RNE (for the tests).
#[cfg(test)]
#[inline(always)]
pub(super) fn element_rne<F: Fp8, T: Emit>(y: f32) -> T {
    let (a, sign) = split::<F>(y);
    T::emit::<F>(y, grid_rne::<F>(a), sign)
}

/// The value (or code) of one scaled element with SR and the random byte `r` (for the
/// tests).
#[cfg(test)]
#[inline(always)]
pub(super) fn element_sr<F: Fp8, T: Emit>(y: f32, r: u8) -> T {
    let (a, sign) = split::<F>(y);
    T::emit::<F>(y, grid_sr::<F>(a, r), sign)
}

/// Elements per chunk (fixed-size arrays in the hot loop).
const N: usize = 64;
/// Lanes of the per-panel accumulators (one AVX2 vector).
const L: usize = 8;

/// Per-lane accumulators of one panel: clipped elements (`|y| > MAX`) and `max |x|`
/// (NaN-ignoring); element `j` of a chunk goes to lane `j % 8`.
struct Acc {
    clipped: [u32; L],
    amax: [f32; L],
}

/// What one panel found: the clipped count and (when asked for) `max |x|`.
#[derive(Clone, Copy, Default)]
pub(super) struct CastStats {
    /// Elements with `|x · scale| > MAX`.
    pub clipped: usize,
    /// `max |x|`, NaN-ignoring (0 unless the pass was asked for it).
    pub amax: f32,
}

impl CastStats {
    /// Sum of the counts, maximum of the amaxes.
    pub fn merge(self, o: CastStats) -> CastStats {
        CastStats {
            clipped: self.clipped + o.clipped,
            amax: max(o.amax, self.amax),
        }
    }
}

/// One chunk: `y = fl(x · scale)`, counted (and `|x|` folded into the amax when `AMAX`),
/// rounded (RNE, or SR with the random bytes `r`) and emitted into `out`.
#[inline(always)]
fn chunk<F: Fp8, T: Emit, const AMAX: bool>(
    x: &[f32; N],
    scale: f32,
    r: Option<&[u8; N]>,
    acc: &mut Acc,
    out: &mut [T; N],
) {
    let mut y = [0.0f32; N];
    let mut c = [0u32; N];
    for j in 0..N {
        y[j] = x[j] * scale;
        c[j] = (y[j].abs() > F::MAX) as u32;
    }
    for q in (0..N).step_by(L) {
        for k in 0..L {
            acc.clipped[k] += c[q + k];
            if AMAX {
                // max(x, acc): a NaN x leaves the accumulator unchanged.
                acc.amax[k] = max(x[q + k].abs(), acc.amax[k]);
            }
        }
    }
    // (Loops, not closures: a closure would be compiled outside the AVX2 build.)
    match r {
        None => {
            for j in 0..N {
                let (a, sign) = split::<F>(y[j]);
                out[j] = T::emit::<F>(y[j], grid_rne::<F>(a), sign);
            }
        }
        Some(r) => {
            for j in 0..N {
                let (a, sign) = split::<F>(y[j]);
                out[j] = T::emit::<F>(y[j], grid_sr::<F>(a, r[j]), sign);
            }
        }
    }
}

/// Where [`panel`] reads its input: a slice as long as the output, or the output itself
/// (in place; the staged columnwise panel). Monomorphised: no branch in the hot loop.
pub(super) trait Source<T> {
    /// The `e - s <= 64` elements at `s .. e`, zero-padded to a chunk.
    fn load(&self, dst: &[T], s: usize, e: usize) -> [f32; N];
}

#[inline(always)]
fn load(src: &[f32], s: usize, e: usize) -> [f32; N] {
    if e - s == N {
        src[s..e].try_into().expect("64 elements")
    } else {
        let mut b = [0.0f32; N];
        b[..e - s].copy_from_slice(&src[s..e]);
        b
    }
}

impl<T> Source<T> for &[f32] {
    #[inline(always)]
    fn load(&self, _: &[T], s: usize, e: usize) -> [f32; N] {
        load(self, s, e)
    }
}

/// Reads from the output (in-place cast of the staged columnwise panel).
pub(super) struct InPlace;

impl Source<f32> for InPlace {
    #[inline(always)]
    fn load(&self, dst: &[f32], s: usize, e: usize) -> [f32; N] {
        load(dst, s, e)
    }
}

/// Casts the elements of one panel (read from `src`, as many as `dst` holds) into `dst`;
/// `rbits` holds their random bytes for stochastic rounding.
#[inline(always)]
fn panel<F: Fp8, T: Emit, S: Source<T>, const AMAX: bool>(
    src: S,
    scale: f32,
    rbits: Option<&[u8]>,
    dst: &mut [T],
) -> CastStats {
    let n = dst.len();
    let mut acc = Acc {
        clipped: [0; L],
        amax: [0.0; L],
    };
    for s in (0..n).step_by(N) {
        let e = (s + N).min(n);
        let x = src.load(dst, s, e);
        let mut rpad = [0u8; N];
        let r: Option<&[u8; N]> = rbits.map(|rb| {
            if e - s == N {
                rb[s..e].try_into().expect("64 bytes")
            } else {
                rpad[..e - s].copy_from_slice(&rb[s..e]);
                &rpad
            }
        });
        if e - s == N {
            let d: &mut [T; N] = (&mut dst[s..e]).try_into().expect("64 elements");
            chunk::<F, T, AMAX>(&x, scale, r, &mut acc, d);
        } else {
            let mut d = [T::default(); N];
            chunk::<F, T, AMAX>(&x, scale, r, &mut acc, &mut d);
            dst[s..e].copy_from_slice(&d[..e - s]);
        }
    }
    CastStats {
        clipped: acc.clipped.iter().map(|&c| c as usize).sum(),
        amax: acc.amax.iter().fold(0.0f32, |m, &a| max(a, m)),
    }
}

/// Declares `$name`, [`panel`] compiled with the target feature `$feature`.
#[cfg(target_arch = "x86_64")]
macro_rules! panel_built_with {
    ($name:ident, $feature:literal) => {
        #[target_feature(enable = $feature)]
        unsafe fn $name<F: Fp8, T: Emit, S: Source<T>, const AMAX: bool>(
            src: S,
            scale: f32,
            rbits: Option<&[u8]>,
            dst: &mut [T],
        ) -> CastStats {
            panel::<F, T, S, AMAX>(src, scale, rbits, dst)
        }
    };
}

/// Runs [`panel`] compiled with AVX-512F or else AVX2 when the CPU has it and `portable` is
/// not set (identical results: same IEEE operations, no FMA), else the baseline build.
fn panel_dispatch<F: Fp8, T: Emit, S: Source<T>, const AMAX: bool>(
    src: S,
    scale: f32,
    rbits: Option<&[u8]>,
    dst: &mut [T],
    portable: bool,
) -> CastStats {
    #[cfg(target_arch = "x86_64")]
    if !portable {
        panel_built_with!(avx512, "avx512f");
        if fp_formats::cpu::has_avx512f() {
            // SAFETY: the running CPU supports AVX-512F (the shared dispatch checked).
            return unsafe { avx512::<F, T, S, AMAX>(src, scale, rbits, dst) };
        }
        #[cfg(not(target_feature = "avx2"))]
        {
            panel_built_with!(avx2, "avx2");
            if fp_formats::cpu::has_avx2() {
                // SAFETY: the running CPU supports AVX2 (the shared dispatch checked).
                return unsafe { avx2::<F, T, S, AMAX>(src, scale, rbits, dst) };
            }
        }
    }
    let _ = portable;
    panel::<F, T, S, AMAX>(src, scale, rbits, dst)
}

/// Casts one panel of `element` values (see [`panel`]): `dst[i]` is the FP8 value (`f32`)
/// or code (`u8`) of `fl(src[i] · scale)`; with `amax` the result also holds `max |src[i]|`.
/// `portable` forces the baseline build (tests).
pub(super) fn cast_panel<T: Emit, S: Source<T>>(
    element: Fp8Element,
    src: S,
    scale: f32,
    rbits: Option<&[u8]>,
    dst: &mut [T],
    amax: bool,
    portable: bool,
) -> CastStats {
    let (r, p) = (rbits, portable);
    match (element, amax) {
        (Fp8Element::E4M3, false) => panel_dispatch::<E4M3, T, S, false>(src, scale, r, dst, p),
        (Fp8Element::E4M3, true) => panel_dispatch::<E4M3, T, S, true>(src, scale, r, dst, p),
        (Fp8Element::E5M2, false) => panel_dispatch::<E5M2, T, S, false>(src, scale, r, dst, p),
        (Fp8Element::E5M2, true) => panel_dispatch::<E5M2, T, S, true>(src, scale, r, dst, p),
    }
}

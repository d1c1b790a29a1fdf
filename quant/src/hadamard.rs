//! The 16-point random Hadamard transform (RHT) applied to the Wgrad operands before NVFP4
//! quantization (docs/numerics.md#random-hadamard-transform).
//!
//! `H = (1/4) · diag(s) · H16`, with `H16` the Sylvester Hadamard matrix
//! (`H1 = [1]`, `H2n = [[Hn, Hn], [Hn, -Hn]]`, so `H16[i][j] = (-1)^popcount(i & j)`), is
//! applied as `x' = x · H` to every contiguous 16-element chunk of a row of the
//! (transposed) operand. `H · Hᵀ = I`, so transforming both Wgrad operands along the
//! reduction dimension leaves `dYᵀ X` unchanged in exact arithmetic.
//!
//! # Sign masks
//!
//! A mask is a `u16`: bit `i` set means `s_i = -1`.
//! * [`Rht::FixedSigns`]: Transformer Engine's vector, [`TE_SIGN_MASK`] `= 0xD7E8`.
//! * [`Rht::RandomSigns`]: [`random_sign_mask`]`(key)`, the low 16 bits of output word 0 of
//!   `philox4x32_10(block_counter(RESERVED_BLOCK, key.stream), key_words(key))` (see
//!   [`crate::philox`]). The mask depends on the key only, so **both Wgrad operands must be
//!   quantized with the same [`RngKey`]** (and hence the same mask), otherwise the product
//!   is not preserved. The reserved counter never overlaps the stochastic-rounding bits of
//!   the same key.
//!
//! # Reference arithmetic (normative; a CUDA kernel must reproduce it bit for bit)
//!
//! For a chunk `x[0..16]` (f32):
//! 1. signs: `v_i = -x_i` where bit `i` of the mask is set, else `x_i` (exact);
//! 2. butterfly, 4 stages with strides `h = 1, 2, 4, 8` in that order; in each stage, for
//!    every `j` with `j & h == 0`: `(v_j, v_{j+h}) <- (fl(v_j + v_{j+h}), fl(v_j - v_{j+h}))`
//!    (f32, round to nearest even, no fused operations);
//! 3. `v_i <- fl(v_i + 0) * 0.25`: a zero sum becomes `+0` (see below), nothing else
//!    changes; the product is exact unless it is subnormal;
//! 4. round to BF16 (nearest even; [`fp_formats::round_to_bf16`]), held as f32.
//!
//! The result is `x · diag(s) · H16 / 4` up to the rounding of the butterfly sums and the
//! final BF16 rounding (Transformer Engine computes the same product as a BF16 matmul with
//! FP32 accumulation and a BF16 output; the two agree exactly whenever the sums are exact,
//! e.g. for small-integer inputs, and otherwise may differ in the last BF16 bit).
//!
//! **Sign of zero.** A GEMM accumulator starts at `+0`, and `+0 + (-0) = +0`, so every exact
//! zero of Transformer Engine's transform is `+0`. The butterfly alone can give `-0`: when
//! all sixteen inputs of a chunk are `±0` (a column of `-0.0`, or tiny values that became
//! zero when the tensor was rounded to BF16), or when a `-0` partial sum meets a `+0` one
//! (`-0 - (+0) = -0`). Step 3 adds `+0`, which maps `-0` to `+0` and leaves every other
//! value as it is, so those outputs quantize to E2M1 code 0x0 (not 0x8) as in Transformer
//! Engine. A `-0` can still come out of step 4: a tiny negative sum that rounds to zero in
//! BF16 keeps its sign there too.
//!
//! ```
//! use quant::hadamard::{rht16, TE_SIGN_MASK};
//! let mut x = [0.0f32; 16];
//! x[0] = 8.0;
//! assert_eq!(rht16(&x, TE_SIGN_MASK), [2.0; 16]);
//! ```

// Index loops over fixed-size arrays are the idiom the vectoriser handles best here.
#![allow(clippy::needless_range_loop)]

use fp_formats::round_to_bf16;

use crate::config::Rht;
use crate::philox::{block_counter, key_words, philox4x32_10, RESERVED_BLOCK};
use crate::RngKey;

/// Points of the transform (the NVFP4 block length).
pub const N: usize = 16;

/// Transformer Engine's fixed Wgrad sign vector
/// `[1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1]` as a mask (bit `i` set iff
/// `s_i = -1`).
pub const TE_SIGN_MASK: u16 = 0xD7E8;

/// The per-stream random sign mask of [`Rht::RandomSigns`] (see the module docs).
///
/// ```
/// use quant::hadamard::random_sign_mask;
/// use quant::RngKey;
/// let k = RngKey { seed: 1, stream: 5 };
/// assert_eq!(random_sign_mask(k), random_sign_mask(k));
/// ```
#[inline]
pub fn random_sign_mask(key: RngKey) -> u16 {
    philox4x32_10(block_counter(RESERVED_BLOCK, key.stream), key_words(key))[0] as u16
}

/// The sign mask an [`Rht`] setting uses for an operand with key `key`, or `None` when the
/// transform is off.
///
/// ```
/// use quant::hadamard::{sign_mask, TE_SIGN_MASK};
/// use quant::{Rht, RngKey};
/// assert_eq!(sign_mask(Rht::FixedSigns, RngKey::default()), Some(TE_SIGN_MASK));
/// assert_eq!(sign_mask(Rht::Off, RngKey::default()), None);
/// ```
#[inline]
pub fn sign_mask(rht: Rht, key: RngKey) -> Option<u16> {
    match rht {
        Rht::Off => None,
        Rht::FixedSigns => Some(TE_SIGN_MASK),
        Rht::RandomSigns => Some(random_sign_mask(key)),
    }
}

/// The sign vector of a mask (`±1.0`).
///
/// ```
/// use quant::hadamard::{signs, TE_SIGN_MASK};
/// assert_eq!(&signs(TE_SIGN_MASK)[..4], &[1.0, 1.0, 1.0, -1.0]);
/// ```
pub fn signs(mask: u16) -> [f32; N] {
    core::array::from_fn(|i| if mask >> i & 1 == 1 { -1.0 } else { 1.0 })
}

/// The transform matrix `H = (1/4) · diag(s) · H16` (entries `±0.25`, exact in f32 and
/// BF16); `x · H` is the unrounded transform of a row vector `x`.
///
/// ```
/// use quant::hadamard::{matrix, TE_SIGN_MASK};
/// let h = matrix(TE_SIGN_MASK);
/// assert_eq!(h[0], [0.25; 16]);
/// assert_eq!(h[3][..4], [-0.25, 0.25, 0.25, -0.25]);
/// ```
pub fn matrix(mask: u16) -> [[f32; N]; N] {
    let s = signs(mask);
    core::array::from_fn(|i| {
        core::array::from_fn(|j| {
            let h = if (i & j).count_ones() % 2 == 0 {
                0.25
            } else {
                -0.25
            };
            s[i] * h
        })
    })
}

/// Steps 1-3 of the reference arithmetic (signs, butterfly with strides 1, 2, 4, 8, zero sums
/// to `+0`, times 0.25), without the BF16 rounding.
///
/// ```
/// use quant::hadamard::{rht16_f32, TE_SIGN_MASK};
/// let x: [f32; 16] = core::array::from_fn(|i| i as f32);
/// assert_eq!(rht16_f32(&x, TE_SIGN_MASK)[0], -14.5);
/// ```
#[inline(always)]
pub fn rht16_f32(x: &[f32; N], mask: u16) -> [f32; N] {
    let mut v: [[f32; 1]; N] = [[0.0]; N];
    for i in 0..N {
        v[i][0] = x[i];
    }
    transform_lanes(&mut v, mask, false);
    let mut y = [0.0f32; N];
    for i in 0..N {
        y[i] = v[i][0];
    }
    y
}

/// The reference arithmetic applied independently to `L` lanes: coordinate `j` of lane `l`
/// is `v[j][l]`. Every lane goes through exactly the operations of [`rht16_f32`] (and of
/// [`rht16`] with `round`), so results are identical for any `L`; with `L = 16` all
/// operations are plain vertical vector operations.
#[inline(always)]
fn transform_lanes<const L: usize>(v: &mut [[f32; L]; N], mask: u16, round: bool) {
    for (j, row) in v.iter_mut().enumerate() {
        let flip = ((mask as u32 >> j) & 1) << 31;
        for e in row.iter_mut() {
            *e = f32::from_bits(e.to_bits() ^ flip);
        }
    }
    butterfly_stage::<1, L>(v);
    butterfly_stage::<2, L>(v);
    butterfly_stage::<4, L>(v);
    butterfly_stage::<8, L>(v);
    for row in v.iter_mut() {
        for e in row.iter_mut() {
            // `+ 0.0` turns a -0 sum into +0 (module docs, "Sign of zero").
            *e = (*e + 0.0) * 0.25;
            if round {
                *e = round_to_bf16(*e);
            }
        }
    }
}

#[inline(always)]
fn butterfly_stage<const H: usize, const L: usize>(v: &mut [[f32; L]; N]) {
    for j in 0..N {
        if j & H == 0 {
            for l in 0..L {
                let (a, b) = (v[j][l], v[j + H][l]);
                v[j][l] = a + b;
                v[j + H][l] = a - b;
            }
        }
    }
}

/// Applies [`rht16`] to every **column** of a 16x16 tile in place: afterwards column `c`
/// equals `rht16(old column c)` bit for bit. (The columnwise NVFP4 quantizer transforms the
/// input before transposing it, where this is a sequence of whole-row vector operations.)
///
/// ```
/// use quant::hadamard::{rht16, rht16_columns, TE_SIGN_MASK};
/// let mut t: [[f32; 16]; 16] = core::array::from_fn(|i| core::array::from_fn(|j| (i * j) as f32));
/// let col3: [f32; 16] = core::array::from_fn(|i| t[i][3]);
/// rht16_columns(&mut t, TE_SIGN_MASK);
/// let want = rht16(&col3, TE_SIGN_MASK);
/// assert!((0..16).all(|i| t[i][3] == want[i]));
/// ```
#[inline(always)]
pub fn rht16_columns(tile: &mut [[f32; N]; N], mask: u16) {
    transform_lanes(tile, mask, true);
}

/// The full reference transform of one chunk (steps 1-4: signs, butterfly, zero sums to
/// `+0`, times 0.25, BF16 rounding).
///
/// ```
/// use quant::hadamard::{rht16, TE_SIGN_MASK};
/// let x: [f32; 16] = core::array::from_fn(|i| i as f32);
/// let y = rht16(&x, TE_SIGN_MASK);
/// assert_eq!(y[..4], [-14.5, -7.5, 6.5, -0.5]);
/// // A chunk of -0.0 transforms to +0.0, as Transformer Engine's matmul gives.
/// assert!(rht16(&[-0.0; 16], TE_SIGN_MASK).iter().all(|v| v.to_bits() == 0));
/// ```
#[inline(always)]
pub fn rht16(x: &[f32; N], mask: u16) -> [f32; N] {
    let mut v: [[f32; 1]; N] = [[0.0]; N];
    for i in 0..N {
        v[i][0] = x[i];
    }
    transform_lanes(&mut v, mask, true);
    let mut y = [0.0f32; N];
    for i in 0..N {
        y[i] = v[i][0];
    }
    y
}

/// Applies [`rht16`] in place to every contiguous 16-element chunk of `data`.
///
/// # Panics
/// If `data.len()` is not a multiple of 16.
///
/// ```
/// use quant::hadamard::{rht_rows, TE_SIGN_MASK};
/// let mut x = vec![0.0f32; 32];
/// x[16] = 8.0;
/// rht_rows(&mut x, TE_SIGN_MASK);
/// assert!(x[..16].iter().all(|&v| v == 0.0) && x[16..].iter().all(|&v| v == 2.0));
/// ```
pub fn rht_rows(data: &mut [f32], mask: u16) {
    assert!(
        data.len().is_multiple_of(N),
        "RHT needs a multiple of 16 elements, got {}",
        data.len()
    );
    for chunk in data.chunks_exact_mut(N) {
        let c: &mut [f32; N] = chunk.try_into().expect("16 elements");
        *c = rht16(c, mask);
    }
}

/// Applies the configured transform ([`sign_mask`] of `rht` and `key`; nothing for
/// [`Rht::Off`]) in place to stored rows whose length is a multiple of 16, as [`rht_rows`]
/// does (BF16 output). The quantizers of every format call it before quantizing a
/// transformed operand.
pub(crate) fn apply_rht(data: &mut [f32], rht: Rht, key: RngKey) {
    if let Some(mask) = sign_mask(rht, key) {
        rht_rows(data, mask);
    }
}

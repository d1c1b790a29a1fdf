//! NVFP4: E2M1 elements in blocks of 16 along a row, one UE4M3 scale per block and one FP32
//! per-tensor scale derived from the tensor's amax, with Transformer Engine's exact f32
//! operation order (docs/numerics.md#nvfp4).
//!
//! ```text
//! S_enc = fl(2688 / amax)            (min FLT_MAX; 1 when amax is 0 or +Inf)
//! S_dec = fl(1 / S_enc)
//! m     = fl(S_enc * fl(1/6))
//! s_b   = UE4M3_rne_sat(fl(amax_b * m))          per block
//! enc_b = min(fl(1 / fl(f32(s_b) * S_dec)), FLT_MAX)
//! q_i   = E2M1_rne_sat(fl(x_i * enc_b))          (clamped to ±6)
//! x̂_i   = fl(fl(e2m1(q_i) * f32(s_b)) * S_dec)
//! ```
//!
//! A block whose scale rounds to zero (`amax_b / amax < 2^-10 / 448`) is flushed: its codes
//! saturate but decode to exactly 0, as on the hardware.
//!
//! ```
//! use fp_formats::nvfp4::{quantize, Nvfp4Options};
//! let mut x = vec![0.0f32; 32];
//! x[..16].copy_from_slice(&[0.0, 0.1, -0.2, 0.3, 0.45, -0.6, 0.75, 0.9,
//!                           1.05, -1.2, 1.35, 1.5, -1.65, 1.8, 1.95, 2.1]);
//! x[16] = 10.0;
//! x[17] = -10.0;
//! for v in &mut x[18..] { *v = 0.5; }
//! let q = quantize(&x, 1, 32, Nvfp4Options::default()).unwrap();
//! assert_eq!(q.scale_bytes(), &[0x6C, 0x7E]);                  // 96 and 448
//! assert_eq!(&q.codes[..8], &[0x10, 0x29, 0xB3, 0x54, 0xD5, 0x66, 0x7E, 0x77]);
//! assert!((q.dequantize()[16] - 10.0).abs() < 1e-5);
//! ```

use alloc::vec::Vec;

use crate::error::FormatError;
use crate::formats::{ElementFormat, E2M1, UE4M3};
use crate::rounding::{Overflow, Rounding};
use crate::{check_shape, Padding};

/// Elements per NVFP4 block.
pub const BLOCK: usize = 16;
/// `448 * 6`: the largest magnitude an NVFP4 tensor can represent relative to its scale.
pub const RANGE: f32 = 2688.0;

/// The per-tensor FP32 scales derived from the tensor amax (steps 2 and 4 of the recipe).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GlobalScale {
    /// The tensor amax the scales came from.
    pub amax: f32,
    /// Encode scale `S_enc`.
    pub s_enc: f32,
    /// Decode scale `S_dec = fl(1 / S_enc)`.
    pub s_dec: f32,
    /// `fl(S_enc * fl(1/6))`, the factor that turns a block amax into its f32 scale.
    pub block_factor: f32,
}

impl GlobalScale {
    /// Computes the scales from a tensor amax (TE's `compute_global_encode_scaling_factor_FP4`).
    /// A NaN amax gives `S_enc = FLT_MAX`, as TE's CUDA path does.
    ///
    /// ```
    /// use fp_formats::nvfp4::GlobalScale;
    /// let g = GlobalScale::from_amax(10.0);
    /// assert_eq!(g.s_enc, 268.8);
    /// assert_eq!(GlobalScale::from_amax(0.0).s_enc, 1.0);
    /// ```
    #[inline]
    pub fn from_amax(amax: f32) -> Self {
        // `f32::min` returns the non-NaN operand, like CUDA's `fminf`: NaN amax gives FLT_MAX.
        let mut s_enc = (RANGE / amax).min(f32::MAX);
        if amax == 0.0 || s_enc == 0.0 {
            s_enc = 1.0;
        }
        let s_dec = 1.0 / s_enc;
        GlobalScale {
            amax,
            s_enc,
            s_dec,
            block_factor: s_enc * (1.0f32 / 6.0),
        }
    }

    /// The E4M3 block scale for a block with absolute maximum `block_amax` (RNE, saturating
    /// at 448, no lower clamp).
    #[inline]
    pub fn block_scale(&self, block_amax: f32) -> UE4M3 {
        let s = (block_amax * self.block_factor).min(f32::MAX);
        UE4M3(crate::formats::E4M3::encode_rne_sat(s))
    }

    /// The factor that maps a block's values onto the E2M1 grid:
    /// `min(fl(1 / fl(f32(s_b) * S_dec)), FLT_MAX)`.
    #[inline]
    pub fn block_encode_factor(&self, scale: UE4M3) -> f32 {
        (1.0 / (scale.to_f32() * self.s_dec)).min(f32::MAX)
    }
}

/// Options of the offline NVFP4 quantizer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Nvfp4Options {
    /// What to do when the row length is not a multiple of 16.
    pub padding: Padding,
}

/// An NVFP4-quantized row-major matrix.
#[derive(Clone, Debug, PartialEq)]
pub struct Nvfp4Matrix {
    /// Logical rows.
    pub rows: usize,
    /// Logical columns.
    pub cols: usize,
    /// Columns after zero padding to a multiple of 16 (equal to `cols` when no padding).
    pub padded_cols: usize,
    /// Packed E2M1 codes, `rows * padded_cols / 2` bytes, element `2i` in the low nibble.
    pub codes: Vec<u8>,
    /// One UE4M3 scale per block, `rows * padded_cols / 16`, row-major.
    pub scales: Vec<UE4M3>,
    /// Tensor amax (TE stores the amax; the FP32 scales are recomputed from it).
    pub amax: f32,
}

impl Nvfp4Matrix {
    /// The per-tensor scales recomputed from [`Self::amax`].
    pub fn global_scale(&self) -> GlobalScale {
        GlobalScale::from_amax(self.amax)
    }

    /// The scales as raw bytes (one per block).
    pub fn scale_bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.scales)
    }

    /// How many elements of `data` (the matrix this was quantized from) were clipped: their
    /// scaled magnitude `|x * enc_b|` exceeded 6 (this happens when the block scale rounds
    /// down, see docs/numerics.md#nvfp4-block-scale).
    ///
    /// # Panics
    /// If `data.len() != rows * cols`.
    pub fn clipped_count(&self, data: &[f32]) -> usize {
        assert_eq!(data.len(), self.rows * self.cols);
        let g = self.global_scale();
        let bpr = self.padded_cols / BLOCK;
        let mut n = 0;
        for (r, row) in data.chunks_exact(self.cols.max(1)).enumerate() {
            for (b, block) in row.chunks(BLOCK).enumerate() {
                let enc = g.block_encode_factor(self.scales[r * bpr + b]);
                n += block
                    .iter()
                    .filter(|&&v| (v * enc).abs() > E2M1::MAX)
                    .count();
            }
        }
        n
    }

    /// Exact dequantization to f32, `[rows, cols]` (padding dropped).
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = alloc::vec![0.0f32; self.rows * self.cols];
        self.dequantize_into(&mut out);
        out
    }

    /// [`Self::dequantize`] into a caller-provided buffer of `rows * cols` elements.
    ///
    /// # Panics
    /// If `out.len() != rows * cols`.
    pub fn dequantize_into(&self, out: &mut [f32]) {
        assert_eq!(
            out.len(),
            self.rows * self.cols,
            "NVFP4 dequantize output length"
        );
        let s_dec = self.global_scale().s_dec;
        crate::kernels::nvfp4_dequantize_rows(
            &self.codes,
            &self.scales,
            self.cols,
            self.padded_cols,
            s_dec,
            out,
        );
    }
}

/// Quantizes a row-major `[rows, cols]` matrix to NVFP4 with 1x16 blocks along rows and
/// round-to-nearest-even.
///
/// Errors on a shape mismatch, on a row length that is not a multiple of 16 without
/// [`Padding::Zero`], and on NaN or infinite input.
pub fn quantize(
    data: &[f32],
    rows: usize,
    cols: usize,
    options: Nvfp4Options,
) -> Result<Nvfp4Matrix, FormatError> {
    let padded_cols = check_shape(data, rows, cols, BLOCK, options.padding)?;
    let amax = crate::finite_amax(data)?;
    let g = GlobalScale::from_amax(amax);
    let bpr = padded_cols / BLOCK;
    let mut codes = alloc::vec![0u8; rows * padded_cols / 2];
    let mut scales = alloc::vec![UE4M3(0); rows * bpr];
    // Full blocks: the vectorised kernel (same arithmetic as `quantize_block_rne`).
    crate::kernels::nvfp4_quantize_rows(data, cols, padded_cols, &g, &mut codes, &mut scales);
    if padded_cols != cols {
        // The zero-padded last block of each row.
        let start = cols / BLOCK * BLOCK;
        let mut pad = [0.0f32; BLOCK];
        for r in 0..rows {
            pad.fill(0.0);
            pad[..cols - start].copy_from_slice(&data[r * cols + start..][..cols - start]);
            let out = &mut codes[(r * padded_cols + start) / 2..][..BLOCK / 2];
            scales[r * bpr + bpr - 1] = quantize_block_rne(&pad, &g, out);
        }
    }
    Ok(Nvfp4Matrix {
        rows,
        cols,
        padded_cols,
        codes,
        scales,
        amax,
    })
}

/// Absolute maximum of a block (NaN-ignoring, like CUDA's `fmaxf`).
#[inline(always)]
pub fn block_amax(x: &[f32]) -> f32 {
    crate::kernels::amax_slice(x)
}

/// Quantizes one block of 16 values with RNE; writes 8 packed bytes and returns the scale.
///
/// # Panics
/// If `x.len() != 16` or `out.len() != 8`.
#[inline]
pub fn quantize_block_rne(x: &[f32], g: &GlobalScale, out: &mut [u8]) -> UE4M3 {
    let x: &[f32; BLOCK] = x.try_into().expect("NVFP4 block of 16");
    let out: &mut [u8; BLOCK / 2] = out.try_into().expect("8 output bytes");
    let scale = g.block_scale(block_amax(x));
    let enc = g.block_encode_factor(scale);
    let mut q = [0u8; BLOCK];
    for i in 0..BLOCK {
        q[i] = E2M1::encode_rne_sat(x[i] * enc);
    }
    for i in 0..BLOCK / 2 {
        out[i] = q[2 * i] | (q[2 * i + 1] << 4);
    }
    scale
}

/// Quantizes one block of 16 values with stochastic rounding, one random byte per element
/// (`rbits[i]` for `x[i]`); writes 8 packed bytes and returns the scale. The scale is the
/// same deterministic scale as [`quantize_block_rne`]; scaled values are clamped to ±6
/// before rounding.
///
/// # Panics
/// If `x.len() != 16`, `rbits.len() != 16` or `out.len() != 8`.
#[inline]
pub fn quantize_block_sr(x: &[f32], rbits: &[u8], g: &GlobalScale, out: &mut [u8]) -> UE4M3 {
    assert!(x.len() == BLOCK && rbits.len() == BLOCK && out.len() == BLOCK / 2);
    let scale = g.block_scale(block_amax(x));
    let enc = g.block_encode_factor(scale);
    let mut q = [0u8; BLOCK];
    for i in 0..BLOCK {
        let y = (x[i] * enc).clamp(-6.0, 6.0);
        q[i] = E2M1::from_f32(y, Rounding::Stochastic(rbits[i]), Overflow::Saturate).0;
    }
    for i in 0..BLOCK / 2 {
        out[i] = q[2 * i] | (q[2 * i + 1] << 4);
    }
    scale
}

/// Dequantizes one block: `x̂_i = fl(fl(e2m1(q_i) * f32(s_b)) * S_dec)`.
///
/// # Panics
/// If `codes.len() * 2 != out.len()`.
#[inline]
pub fn dequantize_block(codes: &[u8], scale: UE4M3, s_dec: f32, out: &mut [f32]) {
    assert_eq!(codes.len() * 2, out.len());
    let s = scale.to_f32();
    for (pair, &byte) in out.chunks_exact_mut(2).zip(codes) {
        pair[0] = E2M1(byte & 0xF).to_f32() * s * s_dec;
        pair[1] = E2M1(byte >> 4).to_f32() * s * s_dec;
    }
}

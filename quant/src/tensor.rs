//! The quantized-tensor type shared by every quantizer.

use crate::config::{BlockShape, QuantFormat, Usage};

/// A quantized 2D operand.
///
/// Layout (docs/architecture.md#standard-storage):
/// * `rows x cols` is the **stored** logical shape: the tensor's own shape for
///   [`Usage::Rowwise`], the transposed shape for [`Usage::Columnwise`].
/// * Block formats pad the stored shape with zeros to `padded_rows x padded_cols`, as
///   Transformer Engine pads to its tile shape: NVFP4 columns to a multiple of 16, and rows
///   too for 16x16 tiles (1x16 blocks leave `padded_rows = rows`); MX columns to a multiple
///   of 32. Padding quantizes to zero and is dropped by dequantization.
/// * `codes`: row-major over the padded shape. NVFP4 / MXFP4: two E2M1 codes per byte,
///   element `2i` in the low nibble. MXFP6: each row packed four codes per three bytes
///   (`fp_formats::pack`). FP8: one byte per element. BF16: two bytes per element, little
///   endian. F32: four bytes per element, little endian.
/// * `scales`: one byte per block, row-major over `[padded_rows, padded_cols / block_len]`
///   (UE4M3 for NVFP4, E8M0 for MX; empty for per-tensor formats). For 16x16 tiles the tile's
///   scale is repeated on each of its 16 rows (Transformer Engine's 1x16 scale layout).
/// * `amax`: the per-tensor amax the per-tensor scale was derived from (after the Hadamard
///   transform when one was applied).
/// * `tensor_scale_inv`: the per-tensor decode factor applied in a GEMM epilogue
///   (NVFP4 `S_dec`, FP8 `1/scale`, MX `1` or `4/3` for the prescaled stochastic variant,
///   1 otherwise).
/// * `hadamard`: the sign mask of the 16-point Hadamard transform applied along the stored
///   rows before quantizing (`crate::hadamard::sign_mask`; columnwise NVFP4 and MX with RHT),
///   `None` without one. The values are then those of the transformed tensor; a GEMM
///   multiplies two such tensors only when both carry the same mask.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantizedTensor {
    /// The format the data are stored in.
    pub format: QuantFormat,
    /// Block geometry.
    pub block: BlockShape,
    /// Which copy this is.
    pub usage: Usage,
    /// Stored rows.
    pub rows: usize,
    /// Stored columns.
    pub cols: usize,
    /// Rows after padding.
    pub padded_rows: usize,
    /// Columns after padding.
    pub padded_cols: usize,
    /// Packed element codes (see the type docs).
    pub codes: Vec<u8>,
    /// One scale byte per block.
    pub scales: Vec<u8>,
    /// Per-tensor amax.
    pub amax: f32,
    /// Per-tensor decode factor.
    pub tensor_scale_inv: f32,
    /// The Hadamard transform's sign mask, if one was applied along the stored rows.
    pub hadamard: Option<u16>,
}

//! The crate's error type.

use fp_formats::FormatError;

/// Why a quantization or quantized GEMM was rejected.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum QuantError {
    /// Bad shape, non-finite input or bad buffer, reported by the format layer.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// The operand settings are inconsistent (e.g. a 16x16 block shape with an MX format,
    /// Four Over Six combined with RHT or stochastic rounding).
    #[error("invalid quantization settings: {0}")]
    InvalidConfig(String),
    /// A matrix dimension exceeds the bound the quantizers accept
    /// ([`crate::matrix::MAX_DIM`]).
    #[error("a [{rows}, {cols}] matrix exceeds the largest dimension {max}")]
    DimensionTooLarge {
        /// Rows asked for.
        rows: usize,
        /// Columns asked for.
        cols: usize,
        /// The bound.
        max: usize,
    },
    /// The two GEMM operands do not agree on the reduction dimension, or the output buffer
    /// has the wrong size.
    #[error("GEMM shape mismatch: {0}")]
    GemmShape(String),
}

//! The crate's error type.

/// Why a block quantization or packing request was rejected.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum FormatError {
    /// The data slice does not hold `rows * cols` elements.
    #[error("data has {got} elements but the shape [{rows}, {cols}] needs {expected}")]
    ShapeMismatch {
        /// Rows of the requested shape.
        rows: usize,
        /// Columns of the requested shape.
        cols: usize,
        /// `rows * cols`.
        expected: usize,
        /// Length of the slice that was passed.
        got: usize,
    },
    /// The row length is not a multiple of the block size and padding was not requested.
    #[error(
        "{cols} columns do not divide into blocks of {block}; pad the rows or use Padding::Zero"
    )]
    NotDivisible {
        /// Columns of the matrix.
        cols: usize,
        /// Block length along a row.
        block: usize,
    },
    /// The input holds a NaN or an infinity, which block scaling cannot represent faithfully.
    #[error("non-finite input {value} at flat index {index}")]
    NonFinite {
        /// Flat (row-major) index of the first offending element.
        index: usize,
        /// The offending value.
        value: f32,
    },
    /// A packed buffer has the wrong length for the number of elements.
    #[error("packed buffer holds {got} bytes but {expected} are needed")]
    BadBufferLength {
        /// Bytes needed.
        expected: usize,
        /// Bytes provided.
        got: usize,
    },
}

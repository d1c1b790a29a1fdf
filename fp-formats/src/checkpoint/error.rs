//! Errors of the checkpoint tools.

use std::path::PathBuf;

/// Why a checkpoint could not be quantized or dequantized. Nothing is left in the output
/// directory when one of these is returned.
///
/// Each message is whole: an underlying error (I/O, the safetensors parser, JSON) is part of
/// the message and kept in a field, not also returned by `source()`, so reporters that print
/// an error with its chain of causes (`anyhow`'s `{:#}`) say it once.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// An I/O operation failed.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file or directory concerned.
        path: PathBuf,
        /// The underlying error (in the message, so not also a `source()`).
        error: std::io::Error,
    },
    /// The file is shorter than the 8-byte safetensors header length.
    #[error("{}: truncated safetensors file ({len} bytes; at least 8 are needed)", path.display())]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Its length in bytes.
        len: u64,
    },
    /// The safetensors header or layout is invalid (bad JSON, a header length beyond the
    /// file or above 100 MB, offsets that do not cover the data, a truncated data section).
    #[error("{}: corrupt safetensors file: {error}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What the safetensors parser reported (in the message).
        error: safetensors::SafeTensorError,
    },
    /// A selected tensor has a dtype other than F32, BF16 or F16.
    #[error("{}: tensor `{tensor}` has dtype {dtype}; only F32, BF16 and F16 weights can be quantized", path.display())]
    UnsupportedDtype {
        /// The file.
        path: PathBuf,
        /// The tensor name.
        tensor: String,
        /// Its safetensors dtype.
        dtype: String,
    },
    /// A selected tensor is not a 2-D `*.weight` matrix, or its inner dimension is not a
    /// multiple of the block size.
    #[error("{}: tensor `{tensor}` with shape {shape:?} cannot be quantized: {reason}", path.display())]
    BadShape {
        /// The file.
        path: PathBuf,
        /// The tensor name.
        tensor: String,
        /// Its shape.
        shape: Vec<usize>,
        /// Why.
        reason: String,
    },
    /// A weight holds NaN or an infinity.
    #[error("{}: tensor `{tensor}` holds the non-finite value {value} at index [{row}, {col}]", path.display())]
    NonFinite {
        /// The file.
        path: PathBuf,
        /// The tensor name.
        tensor: String,
        /// Row of the first offending element.
        row: usize,
        /// Column of the first offending element.
        col: usize,
        /// The value.
        value: f32,
    },
    /// The input is already quantized, or quantized tensors are incomplete.
    #[error("{}: {message}", path.display())]
    Layout {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The output path exists and is not an empty directory.
    #[error("{}: the output exists and is not empty; refusing to overwrite a checkpoint (choose a new directory)", .0.display())]
    OutputExists(PathBuf),
    /// The input has no `.safetensors` file.
    #[error("{}: no .safetensors file found", .0.display())]
    NoInput(PathBuf),
    /// A JSON side file (`config.json`, the shard index) is not valid JSON.
    #[error("{}: {error}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// The parser's error (in the message).
        error: serde_json::Error,
    },
    /// The options do not make sense together.
    #[error("{0}")]
    Options(String),
}

impl CheckpointError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |error| CheckpointError::Io { path, error }
    }
}

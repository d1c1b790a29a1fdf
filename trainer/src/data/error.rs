//! The error type of the data module.

use std::path::PathBuf;

/// Why data could not be loaded, split or batched.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The file could not be opened, read or mapped.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        error: std::io::Error,
    },
    /// A text file is not valid UTF-8.
    #[error(
        "{path}: not valid UTF-8 at byte {offset} (line {line}, column {column}); \
         byte-level training needs UTF-8 text (convert with e.g. `iconv -t UTF-8`)"
    )]
    InvalidUtf8 {
        /// The file.
        path: PathBuf,
        /// Byte offset of the first invalid byte.
        offset: usize,
        /// 1-based line of the first invalid byte.
        line: usize,
        /// 1-based column (in bytes) of the first invalid byte.
        column: usize,
    },
    /// A file read as an llm.c shard does not start with the llm.c magic number.
    #[error("{path}: bad magic {found} (an llm.c token shard starts with {expected})")]
    BadMagic {
        /// The file.
        path: PathBuf,
        /// The first header word.
        found: i32,
        /// The llm.c magic number, 20240520.
        expected: i32,
    },
    /// An llm.c shard with a header version other than 1 (uint16 tokens).
    #[error("{path}: unsupported llm.c shard version {version} (supported: 1 = uint16 tokens)")]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// The version in the header.
        version: i32,
    },
    /// The file is shorter than its header says (or than a header).
    #[error("{path}: truncated: expected {expected} bytes, found {actual}")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Bytes the header (or the header size) requires.
        expected: u64,
        /// Bytes in the file.
        actual: u64,
    },
    /// The file is longer than its header says.
    #[error("{path}: {actual} bytes, but the header describes {expected}: trailing bytes")]
    TrailingBytes {
        /// The file.
        path: PathBuf,
        /// Bytes the header describes.
        expected: u64,
        /// Bytes in the file.
        actual: u64,
    },
    /// A header token count that is negative.
    #[error("{path}: invalid token count {count} in the llm.c header")]
    BadTokenCount {
        /// The file.
        path: PathBuf,
        /// The count in the header.
        count: i32,
    },
    /// A headerless (nanoGPT) uint16 file with an odd number of bytes.
    #[error("{path}: {len} bytes is not a whole number of uint16 tokens")]
    OddLength {
        /// The file.
        path: PathBuf,
        /// Its length in bytes.
        len: u64,
    },
    /// A token id outside the vocabulary.
    #[error(
        "{origin}: token {token} at index {index} is outside the vocabulary (size {vocab_size})"
    )]
    TokenOutOfRange {
        /// Where the tokens came from (a path or a description).
        origin: String,
        /// Index of the first offending token.
        index: u64,
        /// Its value.
        token: u32,
        /// The vocabulary size.
        vocab_size: u32,
    },
    /// No tokens at all.
    #[error("{origin}: no tokens")]
    Empty {
        /// Where the tokens came from.
        origin: String,
    },
    /// Too few tokens for the requested windows or split.
    #[error("{what}: need at least {needed} tokens, have {available}")]
    TooShort {
        /// What needed them.
        what: String,
        /// Tokens needed.
        needed: u64,
        /// Tokens available.
        available: u64,
    },
    /// An invalid setting (batch size 0, split fraction outside [0, 1), ...).
    #[error("invalid data setting: {0}")]
    InvalidConfig(String),
    /// The request does not fit in memory (the message carries the estimate).
    #[error(transparent)]
    TooLarge(#[from] crate::memory::TooLarge),
    /// A saved batcher state that does not belong to this data or configuration.
    #[error("batcher state does not match: {0}")]
    StateMismatch(String),
}

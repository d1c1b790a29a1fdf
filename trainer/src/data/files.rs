//! Token sources on disk: UTF-8 text files (byte-level tokens) and pretokenized `uint16`
//! shards in the llm.c and nanoGPT layouts (memory-mapped).
//!
//! # Shard layouts
//!
//! * **llm.c** (`dev/data/data_common.py`, `write_datafile`): a header of 256 little-endian
//!   `int32` (1024 bytes) with `header[0] = 20240520` (magic), `header[1] = 1` (version:
//!   `uint16` tokens) and `header[2]` = number of tokens, followed by exactly that many
//!   little-endian `uint16` tokens.
//! * **nanoGPT** (`data/*/prepare.py`): raw little-endian `uint16` tokens, no header.
//!
//! [`ShardFormat::Auto`] detects the layout by the magic number: a file whose first four bytes
//! are 20240520 is read as llm.c, anything else as raw `uint16`. As raw tokens the magic
//! would be the pair (55432, 308); 55432 is outside the GPT-2 vocabulary (50257), so a GPT-2
//! nanoGPT file is never mistaken for an llm.c one. Version 2 llm.c files (`uint32` tokens)
//! are rejected with [`DataError::UnsupportedVersion`].
//!
//! Every token is checked against the vocabulary size when the file is opened (one
//! sequential pass over the mapping).

use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

use super::{DataError, Tokens};

/// The llm.c shard magic number (`header[0]`).
pub const LLMC_MAGIC: i32 = 20_240_520;
/// The llm.c shard version for `uint16` tokens (`header[1]`).
pub const LLMC_VERSION_U16: i32 = 1;
/// Size of the llm.c header in bytes (256 `int32`).
pub const LLMC_HEADER_BYTES: usize = 256 * 4;
/// The GPT-2 vocabulary size, the usual vocabulary of llm.c and nanoGPT shards.
pub const GPT2_VOCAB: u32 = 50_257;

/// Which layout to read a shard as.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ShardFormat {
    /// llm.c if the file starts with the llm.c magic, raw `uint16` otherwise.
    #[default]
    Auto,
    /// llm.c: 1024-byte header, then `uint16` tokens.
    LlmC,
    /// nanoGPT: raw `uint16` tokens.
    Raw,
}

/// The layout a shard was read as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardLayout {
    /// llm.c with the given header version.
    LlmC {
        /// `header[1]`.
        version: i32,
    },
    /// Headerless `uint16`.
    Raw,
}

/// An opened, validated token shard.
#[derive(Clone, Debug)]
pub struct Shard {
    /// The tokens (memory-mapped).
    pub tokens: Tokens,
    /// How the file was read.
    pub layout: ShardLayout,
}

fn io_err(path: &Path, error: std::io::Error) -> DataError {
    DataError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// Reads a UTF-8 text file as byte-level tokens (vocabulary 256).
///
/// Errors: [`DataError::Io`], [`DataError::InvalidUtf8`] (with the position of the first bad
/// byte), [`DataError::Empty`], [`DataError::TooLarge`] (a file larger than the memory
/// available, checked before reading it).
pub fn load_text_file(path: &Path) -> Result<Tokens, DataError> {
    if let Ok(m) = std::fs::metadata(path) {
        crate::memory::check(
            &format!("the text file {} ({} bytes)", path.display(), m.len()),
            u128::from(m.len()),
        )?;
    }
    let bytes = std::fs::read(path).map_err(|e| io_err(path, e))?;
    if let Err(e) = std::str::from_utf8(&bytes) {
        let offset = e.valid_up_to();
        let before = &bytes[..offset];
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        let line_start = before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |p| p + 1);
        return Err(DataError::InvalidUtf8 {
            path: path.to_path_buf(),
            offset,
            line,
            column: offset - line_start + 1,
        });
    }
    if bytes.is_empty() {
        return Err(DataError::Empty {
            origin: path.display().to_string(),
        });
    }
    Ok(Tokens::from_bytes(bytes).with_origin(&path.display().to_string()))
}

/// The largest vocabulary a `uint16` shard can use.
pub const MAX_SHARD_VOCAB: u32 = 1 << 16;

/// Memory-maps and validates a `uint16` token shard (see the module docs for the layouts).
///
/// Errors: [`DataError::Io`]; for llm.c: [`DataError::BadMagic`] (only with
/// [`ShardFormat::LlmC`]), [`DataError::UnsupportedVersion`], [`DataError::BadTokenCount`],
/// [`DataError::Truncated`], [`DataError::TrailingBytes`]; for raw files:
/// [`DataError::OddLength`]; for both: [`DataError::Empty`] and
/// [`DataError::TokenOutOfRange`] (a token `>= vocab_size`); [`DataError::InvalidConfig`] for
/// a `vocab_size` outside `1..=`[`MAX_SHARD_VOCAB`].
pub fn open_shard(path: &Path, format: ShardFormat, vocab_size: u32) -> Result<Shard, DataError> {
    if vocab_size == 0 || vocab_size > MAX_SHARD_VOCAB {
        return Err(DataError::InvalidConfig(format!(
            "shard vocabulary size {vocab_size} must be in 1..={MAX_SHARD_VOCAB} (uint16 tokens)"
        )));
    }
    let file = File::open(path).map_err(|e| io_err(path, e))?;
    let len = file.metadata().map_err(|e| io_err(path, e))?.len();
    let origin = path.display().to_string();
    if len == 0 {
        return Err(DataError::Empty { origin });
    }
    // SAFETY: the mapping is read-only. As with any memory map, the file must not be
    // truncated or modified by another process while it is mapped; token shards are
    // written once and then only read.
    let map = unsafe { Mmap::map(&file) }.map_err(|e| io_err(path, e))?;
    let has_magic = map.len() >= 4 && read_i32(&map, 0) == LLMC_MAGIC;
    let llmc = match format {
        ShardFormat::Auto => has_magic,
        ShardFormat::LlmC => true,
        ShardFormat::Raw => false,
    };
    if llmc {
        if map.len() < LLMC_HEADER_BYTES {
            if !has_magic && map.len() >= 4 {
                return Err(DataError::BadMagic {
                    path: path.to_path_buf(),
                    found: read_i32(&map, 0),
                    expected: LLMC_MAGIC,
                });
            }
            return Err(DataError::Truncated {
                path: path.to_path_buf(),
                expected: LLMC_HEADER_BYTES as u64,
                actual: len,
            });
        }
        let magic = read_i32(&map, 0);
        if magic != LLMC_MAGIC {
            return Err(DataError::BadMagic {
                path: path.to_path_buf(),
                found: magic,
                expected: LLMC_MAGIC,
            });
        }
        let version = read_i32(&map, 4);
        if version != LLMC_VERSION_U16 {
            return Err(DataError::UnsupportedVersion {
                path: path.to_path_buf(),
                version,
            });
        }
        let count = read_i32(&map, 8);
        if count < 0 {
            return Err(DataError::BadTokenCount {
                path: path.to_path_buf(),
                count,
            });
        }
        let expected = LLMC_HEADER_BYTES as u64 + 2 * count as u64;
        if len < expected {
            return Err(DataError::Truncated {
                path: path.to_path_buf(),
                expected,
                actual: len,
            });
        }
        if len > expected {
            return Err(DataError::TrailingBytes {
                path: path.to_path_buf(),
                expected,
                actual: len,
            });
        }
        if count == 0 {
            return Err(DataError::Empty { origin });
        }
        let tokens =
            Tokens::from_mmap(map, LLMC_HEADER_BYTES, count as usize, vocab_size, &origin)?;
        Ok(Shard {
            tokens,
            layout: ShardLayout::LlmC { version },
        })
    } else {
        if len % 2 != 0 {
            return Err(DataError::OddLength {
                path: path.to_path_buf(),
                len,
            });
        }
        let n = (len / 2) as usize;
        let tokens = Tokens::from_mmap(map, 0, n, vocab_size, &origin)?;
        Ok(Shard {
            tokens,
            layout: ShardLayout::Raw,
        })
    }
}

fn read_i32(b: &[u8], at: usize) -> i32 {
    i32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The bytes of an llm.c version-1 shard holding `tokens` (header + little-endian `uint16`).
///
/// Errors: more than `i32::MAX` tokens.
pub fn llmc_shard_bytes(tokens: &[u16]) -> Result<Vec<u8>, DataError> {
    let count = i32::try_from(tokens.len()).map_err(|_| {
        DataError::InvalidConfig(format!(
            "{} tokens do not fit an llm.c header",
            tokens.len()
        ))
    })?;
    let mut out = Vec::with_capacity(LLMC_HEADER_BYTES + 2 * tokens.len());
    let mut header = [0i32; 256];
    header[0] = LLMC_MAGIC;
    header[1] = LLMC_VERSION_U16;
    header[2] = count;
    for h in header {
        out.extend_from_slice(&h.to_le_bytes());
    }
    for t in tokens {
        out.extend_from_slice(&t.to_le_bytes());
    }
    Ok(out)
}

/// Writes `tokens` as an llm.c version-1 shard.
pub fn write_llmc_shard(path: &Path, tokens: &[u16]) -> Result<(), DataError> {
    let bytes = llmc_shard_bytes(tokens)?;
    std::fs::write(path, bytes).map_err(|e| io_err(path, e))
}

/// Writes `tokens` as a headerless nanoGPT `uint16` file.
pub fn write_raw_shard(path: &Path, tokens: &[u16]) -> Result<(), DataError> {
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    std::fs::write(path, bytes).map_err(|e| io_err(path, e))
}

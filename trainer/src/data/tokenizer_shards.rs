//! Tokenized folders: a `tokenizer.json` and the llm.c shards (`shard_000000.bin`, ...) of
//! text encoded with it, as `trainer tokenize` writes them and [`super::DataSource::Tokenized`]
//! reads them.
//!
//! [`tokenize_files`] reads each UTF-8 file whole (checked against the memory available),
//! cuts it into chunks of about [`CHUNK_BYTES`] that end after a newline (or at the end of
//! the file), encodes the chunks in parallel and appends their ids in file and chunk order,
//! so the shards do not depend on the thread count. Tokens never span two chunks or two
//! files; no separator token is inserted. Shards hold at most `shard_tokens` tokens each.
//! The folder is built under a hidden sibling name and renamed into place when everything
//! succeeded; an output that exists and is not empty is refused.

use std::fs;
use std::path::{Path, PathBuf};

use super::files::{llmc_shard_bytes, open_shard, ShardFormat};
use super::tokenizer::{Tokenizer, TokenizerError};
use super::{DataError, Tokens};
use crate::rundir::StagedDir;

/// The tokenizer file of a tokenized folder (and of a run directory trained on one).
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// Target size of the text chunks encoded in parallel.
pub const CHUNK_BYTES: usize = 1 << 20;
/// The default and largest number of tokens per shard (llm.c's header counts in `int32`).
pub const DEFAULT_SHARD_TOKENS: usize = 100_000_000;

/// The file name of shard `i`.
pub fn shard_name(i: usize) -> String {
    format!("shard_{i:06}.bin")
}

/// What [`tokenize_files`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenizeReport {
    /// Bytes of text read.
    pub bytes: u64,
    /// Tokens written.
    pub tokens: u64,
    /// Shard files, in order.
    pub shards: Vec<PathBuf>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TokenizerError + '_ {
    move |error| TokenizerError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// The chunk boundaries of `text`: ends after the first newline at or past each
/// [`CHUNK_BYTES`] step, or at the end.
fn chunks(text: &str) -> Vec<&str> {
    let b = text.as_bytes();
    let mut out = vec![];
    let mut start = 0;
    while start < b.len() {
        let mut end = (start + CHUNK_BYTES).min(b.len());
        while end < b.len() && b[end - 1] != b'\n' {
            end += 1;
        }
        out.push(&text[start..end]);
        start = end;
    }
    out
}

/// A whole UTF-8 text file (size checked against the memory available first).
fn read_utf8(f: &Path) -> Result<String, TokenizerError> {
    let len = fs::metadata(f).map_err(io(f))?.len();
    crate::memory::check(
        &format!("the text file {} ({len} bytes)", f.display()),
        u128::from(len) * 2,
    )?;
    let bytes = fs::read(f).map_err(io(f))?;
    let bad = |message: String| TokenizerError::Bad {
        origin: f.display().to_string(),
        message,
    };
    if bytes.is_empty() {
        return Err(bad("empty file".into()));
    }
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let line = e.as_bytes()[..at].iter().filter(|&&b| b == b'\n').count() + 1;
        bad(format!(
            "not valid UTF-8 at byte {at} (line {line}); convert it with e.g. `iconv -t UTF-8`"
        ))
    })
}

/// Checks a shard size before any work: `1..=`[`DEFAULT_SHARD_TOKENS`] tokens per shard.
///
/// ```
/// use trainer::data::tokenizer_shards::check_shard_tokens;
/// assert!(check_shard_tokens(1 << 20).is_ok());
/// assert!(check_shard_tokens(0).is_err());
/// ```
pub fn check_shard_tokens(shard_tokens: usize) -> Result<(), TokenizerError> {
    if shard_tokens == 0 || shard_tokens > DEFAULT_SHARD_TOKENS {
        return Err(TokenizerError::Vocab(format!(
            "shards hold 1..={DEFAULT_SHARD_TOKENS} tokens, got {shard_tokens}"
        )));
    }
    Ok(())
}

/// Encodes UTF-8 text `files` with `tokenizer` into the new folder `out`: its
/// `tokenizer.json` and llm.c shards of at most `shard_tokens` tokens (see the module docs).
/// `progress` is called with the bytes of text encoded so far.
///
/// Errors: `shard_tokens` outside `1..=`[`DEFAULT_SHARD_TOKENS`]; a vocabulary above 65,536
/// (ids must fit `uint16`); an unreadable, empty or non-UTF-8 file (with the position of
/// the first bad byte); a file larger than the memory available; an output that exists and
/// is not empty. Nothing is left in `out` on error.
pub fn tokenize_files(
    files: &[PathBuf],
    tokenizer: &Tokenizer,
    out: &Path,
    shard_tokens: usize,
    progress: &dyn Fn(u64),
) -> Result<TokenizeReport, TokenizerError> {
    check_shard_tokens(shard_tokens)?;
    if tokenizer.vocab_size() > super::files::MAX_SHARD_VOCAB {
        return Err(TokenizerError::Vocab(format!(
            "a vocabulary of {} tokens does not fit uint16 shards",
            tokenizer.vocab_size()
        )));
    }
    if files.is_empty() {
        return Err(TokenizerError::Codec("no input files".into()));
    }
    crate::memory::check(
        &format!("a shard buffer of {shard_tokens} tokens"),
        shard_tokens as u128 * 2,
    )?;
    let staging = StagedDir::new(out, "tokenize")?;
    let mut report = TokenizeReport {
        bytes: 0,
        tokens: 0,
        shards: vec![],
    };
    let mut buf: Vec<u16> = Vec::new();
    let flush = |buf: &mut Vec<u16>, report: &mut TokenizeReport| -> Result<(), TokenizerError> {
        let name = shard_name(report.shards.len());
        let p = staging.path().join(&name);
        let bytes = llmc_shard_bytes(buf).map_err(|e| TokenizerError::Codec(e.to_string()))?;
        fs::write(&p, bytes).map_err(io(&p))?;
        report.shards.push(out.join(name));
        buf.clear();
        Ok(())
    };
    for f in files {
        let text = read_utf8(f)?;
        let pieces = chunks(&text);
        // Encode a few chunks per thread at a time: bounded memory, every thread busy.
        let group = 4 * rayon::current_num_threads().max(1);
        for g in pieces.chunks(group) {
            let ids = tokenizer.encode_batch(g)?;
            for (piece, ids) in g.iter().zip(ids) {
                for id in ids {
                    buf.push(id as u16);
                    if buf.len() == shard_tokens {
                        report.tokens += buf.len() as u64;
                        flush(&mut buf, &mut report)?;
                    }
                }
                report.bytes += piece.len() as u64;
                progress(report.bytes);
            }
        }
    }
    if !buf.is_empty() {
        report.tokens += buf.len() as u64;
        flush(&mut buf, &mut report)?;
    }
    let tpath = staging.path().join(TOKENIZER_FILE);
    fs::write(&tpath, tokenizer.to_json()).map_err(io(&tpath))?;
    staging.commit()?;
    Ok(report)
}

/// The shards of a tokenized folder, in order (`shard_*.bin`).
pub fn shard_paths(dir: &Path) -> Result<Vec<PathBuf>, DataError> {
    let entries = fs::read_dir(dir).map_err(|error| DataError::Io {
        path: dir.to_path_buf(),
        error,
    })?;
    let mut v: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("shard_") && n.ends_with(".bin"))
        })
        .collect();
    v.sort();
    if v.is_empty() {
        return Err(DataError::Empty {
            origin: format!("{} (no shard_*.bin)", dir.display()),
        });
    }
    Ok(v)
}

/// The tokens of a tokenized folder: its shards in order (one shard stays memory-mapped;
/// several are concatenated in memory, checked against the memory available), every id
/// below `vocab_size`.
pub fn load_tokenized(dir: &Path, vocab_size: u32) -> Result<Tokens, DataError> {
    let paths = shard_paths(dir)?;
    if paths.len() == 1 {
        return Ok(open_shard(&paths[0], ShardFormat::LlmC, vocab_size)?.tokens);
    }
    let shards = paths
        .iter()
        .map(|p| open_shard(p, ShardFormat::LlmC, vocab_size).map(|s| s.tokens))
        .collect::<Result<Vec<_>, _>>()?;
    let total: usize = shards.iter().map(Tokens::len).sum();
    crate::memory::check(
        &format!("{total} tokens from {}", dir.display()),
        total as u128 * 2,
    )?;
    let mut all: Vec<u16> = Vec::with_capacity(total);
    let mut buf = vec![];
    for s in &shards {
        buf.resize(s.len(), 0);
        s.copy_to(0, &mut buf);
        all.extend(buf.iter().map(|&t| t as u16));
    }
    Ok(Tokens::from_u16(all, vocab_size)?.with_origin(&dir.display().to_string()))
}

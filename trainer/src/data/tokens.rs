//! A token stream: owned bytes, owned `u16`s or a memory-mapped shard, viewed as `u32` ids.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use memmap2::Mmap;

use super::DataError;

/// The vocabulary size of byte-level tokens.
pub const BYTE_VOCAB: u32 = 256;

/// Where the tokens of a [`Tokens`] live.
enum Backing {
    /// Byte-level tokens (ids 0..256).
    Bytes(Vec<u8>),
    /// Owned 16-bit tokens.
    U16(Vec<u16>),
    /// Little-endian 16-bit tokens inside a memory-mapped file, from byte `offset`.
    Mapped { map: Mmap, offset: usize },
}

/// An immutable, cheaply clonable stream of token ids (or a contiguous view of one).
///
/// Clones and [`Tokens::slice`]s share the underlying storage. Token ids are returned as
/// `u32`; each is below [`Tokens::vocab_size`].
#[derive(Clone)]
pub struct Tokens {
    backing: Arc<Backing>,
    start: usize,
    len: usize,
    vocab_size: u32,
    origin: Arc<str>,
}

impl fmt::Debug for Tokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokens")
            .field("origin", &self.origin)
            .field("start", &self.start)
            .field("len", &self.len)
            .field("vocab_size", &self.vocab_size)
            .finish()
    }
}

impl Tokens {
    /// Byte-level tokens of `bytes` (vocabulary 256).
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        Self::from_backing(Backing::Bytes(bytes), BYTE_VOCAB, "bytes")
    }

    /// Byte-level tokens of a string's UTF-8 bytes (vocabulary 256).
    pub fn from_text(text: &str) -> Self {
        Self::from_bytes(text.as_bytes().to_vec())
    }

    /// 16-bit tokens with a vocabulary size, checked: every id must be below `vocab_size`.
    pub fn from_u16(tokens: Vec<u16>, vocab_size: u32) -> Result<Self, DataError> {
        let t = Self::from_backing(Backing::U16(tokens), vocab_size, "tokens");
        t.check_vocab()?;
        Ok(t)
    }

    /// A memory-mapped little-endian `u16` stream at `offset` with `len` tokens (the caller
    /// has checked the file size). Ids are checked against `vocab_size`.
    pub(crate) fn from_mmap(
        map: Mmap,
        offset: usize,
        len: usize,
        vocab_size: u32,
        origin: &str,
    ) -> Result<Self, DataError> {
        debug_assert!(offset + 2 * len <= map.len());
        let t = Tokens {
            backing: Arc::new(Backing::Mapped { map, offset }),
            start: 0,
            len,
            vocab_size,
            origin: origin.into(),
        };
        t.check_vocab()?;
        Ok(t)
    }

    fn from_backing(backing: Backing, vocab_size: u32, origin: &str) -> Self {
        let len = match &backing {
            Backing::Bytes(b) => b.len(),
            Backing::U16(v) => v.len(),
            Backing::Mapped { .. } => unreachable!("mapped tokens are built by from_mmap"),
        };
        Tokens {
            backing: Arc::new(backing),
            start: 0,
            len,
            vocab_size,
            origin: origin.into(),
        }
    }

    /// The same tokens with a description of where they came from (used in errors).
    pub fn with_origin(mut self, origin: &str) -> Self {
        self.origin = origin.into();
        self
    }

    /// Where the tokens came from (a path, `bytes`, `tokens`, ...).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    fn check_vocab(&self) -> Result<(), DataError> {
        let max_id = match *self.backing {
            Backing::Bytes(_) => 1 << 8,
            Backing::U16(_) | Backing::Mapped { .. } => 1 << 16,
        };
        if self.vocab_size >= max_id {
            return Ok(());
        }
        // Chunked scan: fast on mapped files, and the first offender is reported.
        let mut buf = vec![0u32; 1 << 16];
        let mut pos = 0;
        while pos < self.len {
            let n = buf.len().min(self.len - pos);
            self.copy_to(pos, &mut buf[..n]);
            if let Some(i) = buf[..n].iter().position(|&t| t >= self.vocab_size) {
                return Err(DataError::TokenOutOfRange {
                    origin: self.origin.to_string(),
                    index: (pos + i) as u64,
                    token: buf[i],
                    vocab_size: self.vocab_size,
                });
            }
            pos += n;
        }
        Ok(())
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when there are no tokens.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size of the vocabulary the ids belong to (256 for byte-level tokens).
    pub fn vocab_size(&self) -> u32 {
        self.vocab_size
    }

    /// The token at `index` (panics when out of range).
    pub fn get(&self, index: usize) -> u32 {
        assert!(
            index < self.len,
            "token index {index} out of range (len {})",
            self.len
        );
        let i = self.start + index;
        match &*self.backing {
            Backing::Bytes(b) => b[i] as u32,
            Backing::U16(v) => v[i] as u32,
            Backing::Mapped { map, offset } => {
                let o = offset + 2 * i;
                u16::from_le_bytes([map[o], map[o + 1]]) as u32
            }
        }
    }

    /// Copies `out.len()` tokens starting at `start` into `out` (panics when out of range).
    pub fn copy_to(&self, start: usize, out: &mut [u32]) {
        let end = start.checked_add(out.len()).expect("range overflow");
        assert!(
            end <= self.len,
            "tokens {start}..{end} out of range (len {})",
            self.len
        );
        let s = self.start + start;
        let n = out.len();
        match &*self.backing {
            Backing::Bytes(b) => {
                for (o, &x) in out.iter_mut().zip(&b[s..s + n]) {
                    *o = x as u32;
                }
            }
            Backing::U16(v) => {
                for (o, &x) in out.iter_mut().zip(&v[s..s + n]) {
                    *o = x as u32;
                }
            }
            Backing::Mapped { map, offset } => {
                let bytes = &map[offset + 2 * s..offset + 2 * (s + n)];
                for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = u16::from_le_bytes([c[0], c[1]]) as u32;
                }
            }
        }
    }

    /// The tokens in `range` as a vector.
    pub fn to_vec(&self, range: Range<usize>) -> Vec<u32> {
        let mut out = vec![0; range.len()];
        self.copy_to(range.start, &mut out);
        out
    }

    /// A view of the tokens in `range`, sharing storage (panics when out of range).
    pub fn slice(&self, range: Range<usize>) -> Tokens {
        assert!(
            range.start <= range.end && range.end <= self.len,
            "slice {range:?} out of range (len {})",
            self.len
        );
        Tokens {
            start: self.start + range.start,
            len: range.len(),
            ..self.clone()
        }
    }

    /// Iterates over all token ids.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.len).map(move |i| self.get(i))
    }

    /// Calls `f` on consecutive chunks of the stream (fast path for statistics).
    pub fn for_each_chunk(&self, mut f: impl FnMut(&[u32])) {
        let mut buf = vec![0u32; (1 << 16).min(self.len.max(1))];
        let mut pos = 0;
        while pos < self.len {
            let n = buf.len().min(self.len - pos);
            self.copy_to(pos, &mut buf[..n]);
            f(&buf[..n]);
            pos += n;
        }
    }

    /// True when the tokens are memory-mapped from a file.
    pub fn is_mapped(&self) -> bool {
        matches!(*self.backing, Backing::Mapped { .. })
    }
}

/// Train / validation split: the last `val_fraction` of the stream (rounded up to whole
/// tokens, at least one token when `val_fraction > 0`) is validation, the rest training.
///
/// Both parts are views of the same storage. `val_fraction` must be in `[0, 1)`. The split
/// is deterministic and needs no seed; with the default corpus the validation text comes from
/// the last paragraphs of the same generator stream (same distribution, disjoint text).
///
/// ```
/// use trainer::data::{split, Tokens};
/// let t = Tokens::from_text("abcdefghij");
/// let (train, val) = split(&t, 0.2).unwrap();
/// assert_eq!((train.len(), val.len()), (8, 2));
/// assert_eq!(val.get(0), b'i' as u32);
/// ```
pub fn split(tokens: &Tokens, val_fraction: f64) -> Result<(Tokens, Tokens), DataError> {
    if !(0.0..1.0).contains(&val_fraction) {
        return Err(DataError::InvalidConfig(format!(
            "validation fraction {val_fraction} must be in [0, 1)"
        )));
    }
    let n = tokens.len();
    // f64 multiplication is correctly rounded everywhere, so the split point is portable.
    let n_val = ((n as f64) * val_fraction).ceil() as usize;
    let n_val = n_val.min(n);
    if n_val == n && n > 0 {
        return Err(DataError::TooShort {
            what: format!(
                "split of {} with validation fraction {val_fraction}",
                tokens.origin()
            ),
            needed: n as u64 + 1,
            available: n as u64,
        });
    }
    Ok((tokens.slice(0..n - n_val), tokens.slice(n - n_val..n)))
}

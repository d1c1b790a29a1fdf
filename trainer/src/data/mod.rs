//! Training data that never needs a download.
//!
//! * [`generate`]: the embedded default corpus, a seeded generator of structured English-like
//!   text (see [`corpus`] for what it contains and why). Byte-level tokens, vocabulary 256.
//! * [`load_text_file`]: any UTF-8 text file as byte-level tokens.
//! * [`open_shard`]: pretokenized `uint16` shards in the llm.c layout (1024-byte header with
//!   magic 20240520) or the nanoGPT layout (raw), memory-mapped and validated (see [`files`]).
//! * [`Tokenizer`]: byte-level (the default) or a byte-level BPE `tokenizer.json`, trained
//!   with the `tokenizers` crate (see [`tokenizer`]); [`tokenize_files`] writes a tokenized
//!   folder (`tokenizer.json` + llm.c shards) that [`DataSource::Tokenized`] trains on (see
//!   [`tokenizer_shards`]).
//! * [`DataSource`]: one of the above as serializable data, for run configurations.
//! * [`split`]: deterministic train/validation split (the last fraction of the stream).
//! * [`Batcher`]: `[batch, seq]` input/target windows, random (epoch-free) or sequential,
//!   deterministic from a seed and resumable from a [`BatcherState`] (see [`batch`]).
//! * [`unigram_entropy_bits`], [`conditional_entropy_bits`], [`TokenStats`]: the baselines a
//!   model's loss is compared with (see [`stats`]).
//!
//! ```
//! use trainer::data::{split, Batcher, BatcherConfig, DataSource, Sampling};
//! let tokens = DataSource::Corpus { seed: 1, bytes: 20_000 }.load().unwrap();
//! let (train, val) = split(&tokens, 0.1).unwrap();
//! let cfg = BatcherConfig { batch: 4, seq: 64, sampling: Sampling::Random, seed: 7 };
//! let mut batches = Batcher::new(train, cfg).unwrap();
//! let b = batches.next_batch();
//! assert_eq!(b.inputs.len(), 4 * 64);
//! assert_eq!(b.input_row(0)[1..], b.target_row(0)[..63]);
//! assert_eq!(val.len(), 2_000);
//! ```

pub mod batch;
pub mod corpus;
mod error;
pub mod files;
pub mod stats;
pub mod tokenizer;
pub mod tokenizer_shards;
mod tokens;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use batch::{Batch, Batcher, BatcherConfig, BatcherState, Sampling};
pub use corpus::generate;
pub use error::DataError;
pub use files::{
    load_text_file, open_shard, write_llmc_shard, write_raw_shard, Shard, ShardFormat, ShardLayout,
    GPT2_VOCAB, LLMC_MAGIC,
};
pub use stats::{conditional_entropy_bits, unigram_entropy_bits, unigram_entropy_nats, TokenStats};
pub use tokenizer::{BpeTrainOptions, Tokenizer, TokenizerError};
pub use tokenizer_shards::{load_tokenized, tokenize_files, TokenizeReport, TOKENIZER_FILE};
pub use tokens::{split, Tokens, BYTE_VOCAB};

/// Estimated peak memory of [`generate`]`(_, bytes)` and the tokens made from it: the
/// growing text (up to twice its length while it grows), its agreement annotations and the
/// token copy.
pub fn corpus_memory(bytes: usize) -> u128 {
    bytes as u128 * 5
}

/// Bytes of the embedded default corpus that `train` and `data stats` use unless told
/// otherwise (one number, so the statistics describe the corpus that is trained on).
pub const DEFAULT_CORPUS_BYTES: usize = 2_000_000;

/// Where training tokens come from, as data (e.g. part of a run configuration).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum DataSource {
    /// The embedded default corpus: `generate(seed, bytes)`.
    Corpus {
        /// Generator seed.
        seed: u64,
        /// Bytes (= tokens) to generate.
        bytes: usize,
    },
    /// A UTF-8 text file, byte-level.
    Text {
        /// The file.
        path: PathBuf,
    },
    /// A `uint16` token shard (llm.c or nanoGPT layout).
    Shard {
        /// The file.
        path: PathBuf,
        /// Layout ([`ShardFormat::Auto`] detects it by the magic number).
        #[serde(default)]
        format: ShardFormat,
        /// Vocabulary size every token must be below.
        vocab_size: u32,
    },
    /// A tokenized folder (`trainer tokenize`): its `tokenizer.json` and llm.c shards.
    Tokenized {
        /// The folder.
        dir: PathBuf,
        /// The tokenizer's vocabulary size (checked against the folder's tokenizer).
        vocab_size: u32,
    },
}

impl DataSource {
    /// Loads (or generates, or maps) the tokens.
    pub fn load(&self) -> Result<Tokens, DataError> {
        match self {
            DataSource::Corpus { seed, bytes } => {
                if *bytes == 0 {
                    return Err(DataError::Empty {
                        origin: "corpus of 0 bytes".into(),
                    });
                }
                crate::memory::check(&format!("a corpus of {bytes} bytes"), corpus_memory(*bytes))?;
                Ok(Tokens::from_bytes(generate(*seed, *bytes).into_bytes())
                    .with_origin(&format!("corpus(seed {seed}, {bytes} bytes)")))
            }
            DataSource::Text { path } => load_text_file(path),
            DataSource::Shard {
                path,
                format,
                vocab_size,
            } => open_shard(path, *format, *vocab_size).map(|s| s.tokens),
            DataSource::Tokenized { dir, vocab_size } => {
                let t = Tokenizer::from_file(&dir.join(TOKENIZER_FILE))
                    .map_err(|e| DataError::InvalidConfig(e.to_string()))?;
                if t.vocab_size() != *vocab_size {
                    return Err(DataError::InvalidConfig(format!(
                        "{}: the tokenizer has {} tokens, the run configuration records {}",
                        dir.display(),
                        t.vocab_size(),
                        vocab_size
                    )));
                }
                load_tokenized(dir, *vocab_size)
            }
        }
    }

    /// A tokenized folder as a source (its vocabulary read from its `tokenizer.json`).
    pub fn tokenized(dir: &std::path::Path) -> Result<DataSource, DataError> {
        let t = Tokenizer::from_file(&dir.join(TOKENIZER_FILE))
            .map_err(|e| DataError::InvalidConfig(e.to_string()))?;
        Ok(DataSource::Tokenized {
            dir: dir.to_path_buf(),
            vocab_size: t.vocab_size(),
        })
    }

    /// The tokenizer of the tokens: byte-level for the corpus and text files, the folder's
    /// `tokenizer.json` for a tokenized folder, `None` for a bare shard (its tokenizer is
    /// unknown).
    pub fn tokenizer(&self) -> Result<Option<Tokenizer>, DataError> {
        match self {
            DataSource::Corpus { .. } | DataSource::Text { .. } => Ok(Some(Tokenizer::Bytes)),
            DataSource::Shard { .. } => Ok(None),
            DataSource::Tokenized { dir, .. } => Tokenizer::from_file(&dir.join(TOKENIZER_FILE))
                .map(Some)
                .map_err(|e| DataError::InvalidConfig(e.to_string())),
        }
    }

    /// The vocabulary size of the tokens this source yields.
    pub fn vocab_size(&self) -> u32 {
        match self {
            DataSource::Corpus { .. } | DataSource::Text { .. } => BYTE_VOCAB,
            DataSource::Shard { vocab_size, .. } | DataSource::Tokenized { vocab_size, .. } => {
                *vocab_size
            }
        }
    }
}

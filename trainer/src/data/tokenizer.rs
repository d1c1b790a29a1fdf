//! Tokenizers: byte-level (the default: one token per byte, vocabulary 256) or a byte-level
//! BPE in the Hugging Face `tokenizer.json` format, trained by [`Tokenizer::train_bpe`] with
//! the `tokenizers` crate (pure Rust: its `fancy-regex` backend, no Oniguruma) or loaded by
//! [`Tokenizer::from_file`].
//!
//! The BPE is GPT-2's byte-level scheme: text is split with GPT-2's pre-tokenization regex
//! (no prefix space), each piece is mapped to the 256 byte symbols ([`crate::hf::byte_to_char`])
//! and merged; every byte is in the vocabulary, so any UTF-8 text encodes, and decoding
//! gives the text back exactly. Training is deterministic (pair counts are exact, ties are
//! broken by the pair), so the same files and settings give the same `tokenizer.json`.
//!
//! ```
//! use trainer::data::Tokenizer;
//! let bytes = Tokenizer::Bytes;
//! assert_eq!(bytes.encode("hi").unwrap(), vec![104, 105]);
//! assert_eq!(bytes.decode(&[104, 105]).unwrap(), "hi");
//! assert_eq!(bytes.vocab_size(), 256);
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

/// The largest `tokenizer.json` read (GPT-2's is 1.4 MB).
pub const MAX_TOKENIZER_JSON_BYTES: u64 = 64 << 20;
/// The largest BPE vocabulary (token ids are stored as `uint16` in shards).
pub const MAX_BPE_VOCAB: u32 = 1 << 16;
/// The smallest BPE vocabulary to train: the 256 byte symbols plus at least one merge.
pub const MIN_BPE_VOCAB: u32 = 257;

/// Why a tokenizer could not be trained, loaded or used.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A file could not be read or written.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        error: std::io::Error,
    },
    /// A `tokenizer.json` that does not parse, is too large, or is not a byte-level BPE.
    #[error("{origin}: {message}")]
    Bad {
        /// The file (or a description).
        origin: String,
        /// What is wrong.
        message: String,
    },
    /// A vocabulary size outside the supported range, or one that does not match the model.
    #[error("{0}")]
    Vocab(String),
    /// Training failed (the message is the `tokenizers` crate's).
    #[error("training the BPE tokenizer: {0}")]
    Training(String),
    /// Encoding or decoding failed.
    #[error("{0}")]
    Codec(String),
    /// The request does not fit in memory (the message carries the estimate).
    #[error(transparent)]
    TooLarge(#[from] crate::memory::TooLarge),
    /// The output directory could not be staged or committed (it exists and is not empty,
    /// or a file-system error).
    #[error(transparent)]
    Output(#[from] crate::rundir::StageError),
}

/// A trained byte-level BPE.
pub struct Bpe {
    hf: tokenizers::Tokenizer,
    vocab: u32,
    json: String,
    origin: String,
}

impl std::fmt::Debug for Bpe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bpe")
            .field("vocab", &self.vocab)
            .field("origin", &self.origin)
            .finish()
    }
}

/// A tokenizer: byte-level or BPE (cheap to clone).
#[derive(Clone, Debug, Default)]
pub enum Tokenizer {
    /// One token per byte (vocabulary 256): the embedded corpus and text files.
    #[default]
    Bytes,
    /// A byte-level BPE from a `tokenizer.json`.
    Bpe(Arc<Bpe>),
}

/// Settings of [`Tokenizer::train_bpe`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BpeTrainOptions {
    /// Vocabulary size, `MIN_BPE_VOCAB..=MAX_BPE_VOCAB` (the 256 byte symbols included; the
    /// trainer stops earlier when no pair occurs `min_frequency` times).
    pub vocab_size: u32,
    /// Pairs seen fewer times are not merged.
    pub min_frequency: u64,
}

impl BpeTrainOptions {
    /// Checks the settings before any work: the vocabulary size must lie in
    /// `MIN_BPE_VOCAB..=MAX_BPE_VOCAB` ([`TokenizerError::Vocab`] otherwise).
    ///
    /// ```
    /// use trainer::data::BpeTrainOptions;
    /// assert!(BpeTrainOptions::default().validate().is_ok());
    /// let tiny = BpeTrainOptions { vocab_size: 3, ..Default::default() };
    /// assert!(tiny.validate().unwrap_err().to_string().contains("257..=65536"));
    /// ```
    pub fn validate(&self) -> Result<(), TokenizerError> {
        if !(MIN_BPE_VOCAB..=MAX_BPE_VOCAB).contains(&self.vocab_size) {
            return Err(TokenizerError::Vocab(format!(
                "a BPE vocabulary needs {MIN_BPE_VOCAB}..={MAX_BPE_VOCAB} tokens (the 256 bytes \
                 and the merges; uint16 shards), got {}",
                self.vocab_size
            )));
        }
        Ok(())
    }
}

impl Default for BpeTrainOptions {
    fn default() -> Self {
        BpeTrainOptions {
            vocab_size: 4096,
            min_frequency: 2,
        }
    }
}

fn codec(e: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::Codec(e.to_string())
}

impl Tokenizer {
    /// Trains a byte-level BPE on UTF-8 text files (see the module docs).
    ///
    /// Errors: a vocabulary size outside `MIN_BPE_VOCAB..=MAX_BPE_VOCAB`, no files, an
    /// unreadable or non-UTF-8 file, inputs whose training state would not fit in memory
    /// (about 8 bytes per input byte are budgeted), a failure inside the trainer.
    pub fn train_bpe(
        files: &[PathBuf],
        opts: &BpeTrainOptions,
    ) -> Result<Tokenizer, TokenizerError> {
        use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
        use tokenizers::models::TrainerWrapper;
        use tokenizers::pre_tokenizers::byte_level::ByteLevel;

        opts.validate()?;
        if files.is_empty() {
            return Err(TokenizerError::Training("no input files".into()));
        }
        let mut total = 0u128;
        for f in files {
            let md = std::fs::metadata(f).map_err(|error| TokenizerError::Io {
                path: f.clone(),
                error,
            })?;
            total += u128::from(md.len());
        }
        crate::memory::check(
            &format!("training a BPE tokenizer on {total} bytes of text"),
            total * 8,
        )?;
        let byte_level = ByteLevel::default()
            .add_prefix_space(false)
            .trim_offsets(false);
        let mut hf = tokenizers::Tokenizer::new(BPE::default());
        hf.with_pre_tokenizer(Some(byte_level))
            .with_post_processor(Some(byte_level))
            .with_decoder(Some(byte_level));
        let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
            .show_progress(false)
            .vocab_size(opts.vocab_size as usize)
            .min_frequency(opts.min_frequency)
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .build()
            .into();
        let names: Vec<String> = files.iter().map(|p| p.display().to_string()).collect();
        hf.train_from_files(&mut trainer, names)
            .map_err(|e| TokenizerError::Training(e.to_string()))?;
        let json = hf
            .to_string(false)
            .map_err(|e| TokenizerError::Training(e.to_string()))?;
        Self::from_json(&json, "the trained tokenizer")
    }

    /// Loads a `tokenizer.json` (at most [`MAX_TOKENIZER_JSON_BYTES`]); it must be a
    /// byte-level BPE (a `BPE` model with the `ByteLevel` pre-tokenizer) with at most
    /// [`MAX_BPE_VOCAB`] tokens.
    pub fn from_file(path: &Path) -> Result<Tokenizer, TokenizerError> {
        let io = |error| TokenizerError::Io {
            path: path.to_path_buf(),
            error,
        };
        let len = std::fs::metadata(path).map_err(io)?.len();
        if len > MAX_TOKENIZER_JSON_BYTES {
            return Err(TokenizerError::Bad {
                origin: path.display().to_string(),
                message: format!(
                    "{len} bytes; a tokenizer.json of at most {MAX_TOKENIZER_JSON_BYTES} is read"
                ),
            });
        }
        let text = std::fs::read_to_string(path).map_err(io)?;
        Self::from_json(&text, &path.display().to_string())
    }

    /// Parses the text of a `tokenizer.json` (see [`Tokenizer::from_file`]).
    pub fn from_json(text: &str, origin: &str) -> Result<Tokenizer, TokenizerError> {
        let bad = |message: String| TokenizerError::Bad {
            origin: origin.to_string(),
            message,
        };
        let v: Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        let model = v["model"]["type"].as_str().unwrap_or("");
        let pre = v["pre_tokenizer"]["type"].as_str().unwrap_or("");
        if model != "BPE" || pre != "ByteLevel" {
            return Err(bad(format!(
                "a byte-level BPE is needed (model BPE, pre-tokenizer ByteLevel), found model \
                 `{model}` and pre-tokenizer `{pre}`"
            )));
        }
        let hf: tokenizers::Tokenizer = text.parse().map_err(|e| bad(format!("{e}")))?;
        let n = hf.get_vocab_size(true);
        let vocab = u32::try_from(n)
            .ok()
            .filter(|&n| (1..=MAX_BPE_VOCAB).contains(&n))
            .ok_or_else(|| bad(format!("{n} tokens; 1..={MAX_BPE_VOCAB} are supported")))?;
        // Every id below the size must exist (ids index the embedding).
        if let Some(id) = (0..vocab).find(|&i| hf.id_to_token(i).is_none()) {
            return Err(bad(format!(
                "the vocabulary of {vocab} tokens has no token with id {id}"
            )));
        }
        Ok(Tokenizer::Bpe(Arc::new(Bpe {
            hf,
            vocab,
            json: text.to_string(),
            origin: origin.to_string(),
        })))
    }

    /// The vocabulary size (256 for [`Tokenizer::Bytes`]).
    pub fn vocab_size(&self) -> u32 {
        match self {
            Tokenizer::Bytes => super::BYTE_VOCAB,
            Tokenizer::Bpe(b) => b.vocab,
        }
    }

    /// True for [`Tokenizer::Bytes`].
    pub fn is_bytes(&self) -> bool {
        matches!(self, Tokenizer::Bytes)
    }

    /// A short description: `byte-level` or `BPE (N tokens, ORIGIN)`.
    pub fn describe(&self) -> String {
        match self {
            Tokenizer::Bytes => "byte-level".into(),
            Tokenizer::Bpe(b) => format!("BPE ({} tokens, {})", b.vocab, b.origin),
        }
    }

    /// Token ids of `text`.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        match self {
            Tokenizer::Bytes => Ok(text.bytes().map(u32::from).collect()),
            Tokenizer::Bpe(b) => Ok(b.hf.encode(text, false).map_err(codec)?.get_ids().to_vec()),
        }
    }

    /// Token ids of several texts, in parallel (the same ids as [`Tokenizer::encode`] on
    /// each; the order of `texts` is kept).
    pub fn encode_batch(&self, texts: &[&str]) -> Result<Vec<Vec<u32>>, TokenizerError> {
        match self {
            Tokenizer::Bytes => texts.iter().map(|t| self.encode(t)).collect(),
            Tokenizer::Bpe(b) => Ok(b
                .hf
                .encode_batch(texts.to_vec(), false)
                .map_err(codec)?
                .iter()
                .map(|e| e.get_ids().to_vec())
                .collect()),
        }
    }

    /// The text of `ids` (invalid UTF-8, e.g. a multi-byte character cut by the end of a
    /// sample, is replaced by U+FFFD). Errors for an id outside the vocabulary.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        if let Some(&bad) = ids.iter().find(|&&t| t >= self.vocab_size()) {
            return Err(TokenizerError::Codec(format!(
                "token {bad} is outside the vocabulary ({} tokens, {})",
                self.vocab_size(),
                self.describe()
            )));
        }
        match self {
            Tokenizer::Bytes => {
                let b: Vec<u8> = ids.iter().map(|&t| t as u8).collect();
                Ok(String::from_utf8_lossy(&b).into_owned())
            }
            Tokenizer::Bpe(b) => b.hf.decode(ids, false).map_err(codec),
        }
    }

    /// The `tokenizer.json` text (for byte-level: the GPT-2 byte symbols as a BPE without
    /// merges, [`crate::hf::byte_tokenizer_json`]).
    pub fn to_json(&self) -> String {
        match self {
            Tokenizer::Bytes => {
                let mut s =
                    serde_json::to_string_pretty(&crate::hf::byte_tokenizer_json()).expect("JSON");
                s.push('\n');
                s
            }
            Tokenizer::Bpe(b) => b.json.clone(),
        }
    }
}

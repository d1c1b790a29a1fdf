//! The pretraining data of `trainer rl --pretrain-steps`: the task's mix ([`Task::mix`]) as
//! a text file, byte-level, or encoded through a BPE (given, or trained on the mix) into a
//! tokenized folder ([`crate::data::tokenize_files`]), after checking that the BPE expresses
//! the task ([`TaskCodec::check`]).

use std::path::{Path, PathBuf};

use super::codec::TaskCodec;
use super::config::{io_err, RlError};
use super::run::EVAL_SEED;
use super::tasks::{Split, Task};
use crate::data::{BpeTrainOptions, DataSource, Tokenizer, TOKENIZER_FILE};

/// The mix file's name in the RL run directory.
pub const MIX_FILE: &str = "pretrain-mix.txt";
/// The tokenized mix's folder in the RL run directory.
pub const MIX_DATA_DIR: &str = "pretrain-data";

/// How the mix is tokenized.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum MixTokenizer {
    /// One token per byte (the default).
    #[default]
    Bytes,
    /// A byte-level BPE `tokenizer.json` (or a folder holding one).
    File(PathBuf),
    /// A byte-level BPE of this many tokens trained on the mix itself.
    Train(u32),
}

fn invalid(e: impl std::fmt::Display) -> RlError {
    RlError::Invalid(e.to_string())
}

/// Writes the mix of `task` (`examples` examples, `corpus_bytes` of corpus, seed `seed`) to
/// `out/pretrain-mix.txt` and returns the data source to pretrain on and its tokenizer. With a
/// BPE, the mix is encoded into `out/pretrain-data` (reused when it holds the same
/// tokenizer; another tokenizer there is an error).
pub fn pretrain_data(
    task: Task,
    seed: u64,
    examples: usize,
    corpus_bytes: usize,
    out: &Path,
    how: &MixTokenizer,
) -> Result<(DataSource, Tokenizer), RlError> {
    let bpe = |vocab_size| BpeTrainOptions {
        vocab_size,
        min_frequency: 2,
    };
    // the tokenizer (or its settings) first: a refused run writes nothing
    let given = match how {
        MixTokenizer::Bytes => None,
        MixTokenizer::File(p) => {
            let f = if p.is_dir() {
                p.join(TOKENIZER_FILE)
            } else {
                p.clone()
            };
            Some(Tokenizer::from_file(&f).map_err(invalid)?)
        }
        MixTokenizer::Train(vocab) => {
            bpe(*vocab).validate().map_err(invalid)?;
            None
        }
    };
    std::fs::create_dir_all(out).map_err(io_err(out))?;
    let mix_path = out.join(MIX_FILE);
    let mix = task.mix(seed, examples, corpus_bytes);
    crate::rundir::write_atomic(&mix_path, mix.as_bytes()).map_err(io_err(&mix_path))?;
    let mix_path = std::fs::canonicalize(&mix_path).map_err(io_err(&mix_path))?;
    let tok = match (how, given) {
        (_, Some(tok)) => tok,
        (MixTokenizer::Train(vocab), None) => {
            Tokenizer::train_bpe(std::slice::from_ref(&mix_path), &bpe(*vocab)).map_err(invalid)?
        }
        _ => return Ok((DataSource::Text { path: mix_path }, Tokenizer::Bytes)),
    };
    let codec = TaskCodec::new(tok.clone(), tok.vocab_size() as usize)?;
    let check: Vec<_> = task
        .examples(seed.wrapping_add(1), Split::Train, 256)
        .into_iter()
        .chain(task.examples(EVAL_SEED, Split::HeldOut, 256))
        .collect();
    codec.check(task, &check)?;
    let dir = out.join(MIX_DATA_DIR);
    let tpath = dir.join(TOKENIZER_FILE);
    if tpath.is_file() {
        let there = std::fs::read_to_string(&tpath).map_err(io_err(&tpath))?;
        if there != tok.to_json() {
            return Err(RlError::Invalid(format!(
                "{} holds a mix encoded with another tokenizer; remove it or choose another --out",
                dir.display()
            )));
        }
    } else {
        crate::data::tokenize_files(
            &[mix_path],
            &tok,
            &dir,
            crate::data::tokenizer_shards::DEFAULT_SHARD_TOKENS,
            &|_| {},
        )
        .map_err(invalid)?;
    }
    let dir = std::fs::canonicalize(&dir).map_err(io_err(&dir))?;
    let src = DataSource::tokenized(&dir).map_err(invalid)?;
    Ok((src, tok))
}

//! `trainer tokenize`: train a byte-level BPE on text files (or take a `tokenizer.json`)
//! and write a tokenized folder (see [`trainer::data::tokenizer_shards`]).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use trainer::data::tokenizer_shards::{check_shard_tokens, DEFAULT_SHARD_TOKENS};
use trainer::data::{tokenize_files, BpeTrainOptions, Tokenizer};

/// Arguments of `trainer tokenize`.
#[derive(Args, Debug)]
pub struct TokenizeArgs {
    /// UTF-8 text files (the BPE is trained on all of them, then each is encoded).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Output folder (must not exist, or be empty): tokenizer.json and shard_NNNNNN.bin.
    #[arg(long)]
    pub out: PathBuf,
    /// Vocabulary size of the trained BPE (the 256 byte symbols included).
    #[arg(long, default_value_t = 4096, conflicts_with = "tokenizer")]
    pub vocab: u32,
    /// Pairs seen fewer times are not merged.
    #[arg(long, default_value_t = 2, conflicts_with = "tokenizer")]
    pub min_frequency: u64,
    /// Encode with this byte-level BPE tokenizer.json instead of training one.
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// Tokens per shard.
    #[arg(long, default_value_t = DEFAULT_SHARD_TOKENS)]
    pub shard_tokens: usize,
    /// Hide the progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// Runs `trainer tokenize`.
pub fn run_tokenize(args: TokenizeArgs) -> Result<()> {
    if let Some(f) = args.files.iter().find(|f| !f.is_file()) {
        bail!("{}: not a file", f.display());
    }
    // what would refuse the output, before training a tokenizer for it
    check_shard_tokens(args.shard_tokens)?;
    trainer::rundir::StagedDir::check_output(&args.out)?;
    let t0 = Instant::now();
    let tok = match &args.tokenizer {
        Some(p) => Tokenizer::from_file(p)?,
        None => {
            let opts = BpeTrainOptions {
                vocab_size: args.vocab,
                min_frequency: args.min_frequency,
            };
            let spinner = (!args.quiet).then(|| {
                let s = ProgressBar::new_spinner();
                s.set_message("training the BPE tokenizer");
                s.enable_steady_tick(std::time::Duration::from_millis(200));
                s
            });
            let t = Tokenizer::train_bpe(&args.files, &opts)?;
            if let Some(s) = spinner {
                s.finish_and_clear();
            }
            println!(
                "trained a byte-level BPE of {} tokens in {:.1} s",
                t.vocab_size(),
                t0.elapsed().as_secs_f64()
            );
            t
        }
    };
    let total: u64 = args
        .files
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum();
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(total)
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:30} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
        )
        .expect("template"),
    );
    let t1 = Instant::now();
    let r = tokenize_files(&args.files, &tok, &args.out, args.shard_tokens, &|b| {
        bar.set_position(b)
    })?;
    bar.finish_and_clear();
    let secs = t1.elapsed().as_secs_f64();
    println!(
        "encoded {} bytes into {} tokens ({:.2} bytes/token) in {:.1} s ({:.1} MB/s): {} shard(s) and tokenizer.json in {}",
        r.bytes,
        r.tokens,
        r.bytes as f64 / r.tokens.max(1) as f64,
        secs,
        r.bytes as f64 / secs.max(1e-9) / 1e6,
        r.shards.len(),
        args.out.display()
    );
    println!(
        "train on it with: trainer train --data {} (model vocabulary {})",
        args.out.display(),
        tok.vocab_size()
    );
    Ok(())
}

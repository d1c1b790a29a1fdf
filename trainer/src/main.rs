//! The `trainer` command line.
//!
//! ```text
//! trainer recipes                      list the built-in precision recipes
//! trainer recipes show NAME|FILE       print a recipe as TOML [--plan N_BLOCKS --progress P]
//! trainer data sample                  print a sample of the default corpus [--seed S --bytes N]
//! trainer data stats                   token count and entropies [--file F | --shard F]
//! trainer train                        train a GPT (default: small model, nvfp4, embedded corpus)
//! trainer compare                      train several recipes on identical data and write a report
//! trainer sample CHECKPOINT            generate text at a chosen precision
//! trainer export CHECKPOINT --out DIR  a Hugging Face Llama folder [--quantize nvfp4|mxfp8]
//! trainer tokenize FILES --out DIR     train a byte-level BPE, write tokenizer.json + shards
//! trainer plans [show NAME|FILE]       the stage plans (pretrain / RL sampler / RL trainer)
//! trainer rl --from CKPT --task T --plan P --out DIR   GRPO on a verifiable task
//! trainer rl compare --from CKPT --out DIR             plans x corrections x seeds, a report
//! ```
//!
//! Each subcommand is a variant of [`Command`] with its own argument struct and a `run_*`
//! function.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use trainer::data::{
    self, conditional_entropy_bits, DataSource, ShardFormat, ShardLayout, TokenStats, Tokens,
    GPT2_VOCAB,
};
use trainer::model::MAX_LAYERS;
use trainer::recipe::{Recipe, BUILTIN_NAMES};
use trainer::train::TrainError;

mod device_cmd;
mod export_cmd;
mod rl_cmd;
mod run_cmds;
mod tokenize_cmd;
use run_cmds::{run_compare, run_sample, run_train, CompareArgs, SampleArgs, TrainArgs};

/// Low-precision GPT training on Nibble.
#[derive(Parser, Debug)]
#[command(name = "trainer", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List the built-in precision recipes, or show one as TOML.
    Recipes(RecipesArgs),
    /// Inspect training data: corpus samples, token statistics.
    #[command(subcommand)]
    Data(DataCommand),
    /// Train a GPT with a precision recipe.
    Train(TrainArgs),
    /// Train several recipes on identical data, seed and model; write a report.
    Compare(CompareArgs),
    /// Generate text from a checkpoint at a chosen precision.
    Sample(SampleArgs),
    /// Export a checkpoint as a Hugging Face Llama folder (optionally NVFP4 / MXFP8).
    Export(export_cmd::ExportArgs),
    /// Train a byte-level BPE tokenizer on text files and write tokenizer.json and llm.c
    /// token shards (a folder `train --data DIR` reads).
    Tokenize(tokenize_cmd::TokenizeArgs),
    /// List the built-in stage plans (pretrain / RL sampler / RL trainer precisions), or show one.
    Plans(rl_cmd::PlansArgs),
    /// Reinforcement learning on a verifiable task (GRPO), sampler and trainer each at the
    /// plan's precision; `rl compare` runs a grid of plans x corrections x seeds.
    Rl(Box<rl_cmd::RlArgs>),
}

#[derive(Args, Debug)]
struct RecipesArgs {
    #[command(subcommand)]
    command: Option<RecipesCommand>,
}

#[derive(Subcommand, Debug)]
enum RecipesCommand {
    /// List the built-in recipes with one-line descriptions (the default).
    List,
    /// Print a recipe (built-in name or TOML file) as TOML.
    Show {
        /// A built-in recipe name or the path of a TOML recipe file.
        name: String,
        /// Also print the policy of every linear layer of a model with this many blocks
        /// (as TOML comments).
        #[arg(long, value_name = "N_BLOCKS")]
        plan: Option<usize>,
        /// Training progress (fraction of tokens seen) at which to print the plan.
        #[arg(long, default_value_t = 0.0, requires = "plan")]
        progress: f64,
    },
}

#[derive(Subcommand, Debug)]
enum DataCommand {
    /// Print a sample of the embedded default corpus.
    Sample {
        /// Generator seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Bytes to print.
        #[arg(long, default_value_t = 2_000)]
        bytes: usize,
    },
    /// Token count, unigram entropy and short-context conditional entropies of a source
    /// (the default corpus unless --file or --shard is given).
    Stats(DataSourceArgs),
}

/// Shard layouts on the command line.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum ShardFormatArg {
    /// llm.c if the file starts with the llm.c magic, raw uint16 otherwise.
    Auto,
    /// llm.c: 1024-byte header, then uint16 tokens.
    LlmC,
    /// nanoGPT: raw uint16 tokens.
    Raw,
}

impl From<ShardFormatArg> for ShardFormat {
    fn from(f: ShardFormatArg) -> Self {
        match f {
            ShardFormatArg::Auto => ShardFormat::Auto,
            ShardFormatArg::LlmC => ShardFormat::LlmC,
            ShardFormatArg::Raw => ShardFormat::Raw,
        }
    }
}

/// Where tokens come from (shared by every subcommand that reads data).
#[derive(Args, Debug)]
pub(crate) struct DataSourceArgs {
    /// A UTF-8 text file (byte-level tokens).
    #[arg(long, value_name = "FILE", conflicts_with = "shard")]
    file: Option<PathBuf>,
    /// A uint16 token shard (llm.c or nanoGPT layout).
    #[arg(long, value_name = "FILE")]
    shard: Option<PathBuf>,
    /// Layout of --shard.
    #[arg(long, value_enum, default_value_t = ShardFormatArg::Auto, requires = "shard")]
    shard_format: ShardFormatArg,
    /// Vocabulary size of --shard (every token must be below it).
    #[arg(long, default_value_t = GPT2_VOCAB, requires = "shard")]
    vocab: u32,
    /// Seed of the default corpus.
    #[arg(long, default_value_t = 0, conflicts_with_all = ["file", "shard"])]
    seed: u64,
    /// Bytes of the default corpus (the size `train` uses).
    #[arg(long, default_value_t = trainer::data::DEFAULT_CORPUS_BYTES, conflicts_with_all = ["file", "shard"])]
    bytes: usize,
}

impl DataSourceArgs {
    pub(crate) fn source(&self) -> DataSource {
        if let Some(path) = &self.file {
            DataSource::Text { path: path.clone() }
        } else if let Some(path) = &self.shard {
            DataSource::Shard {
                path: path.clone(),
                format: self.shard_format.into(),
                vocab_size: self.vocab,
            }
        } else {
            DataSource::Corpus {
                seed: self.seed,
                bytes: self.bytes,
            }
        }
    }
}

/// The command line, with negative numbers accepted as option values in every subcommand
/// (`--lr -1` then reaches the setting's own check, "must be positive", instead of clap's
/// "unexpected argument '-1'"; no option name starts with a digit).
fn parse_cli() -> Cli {
    fn negatives(c: clap::Command) -> clap::Command {
        c.allow_negative_numbers(true).mut_subcommands(negatives)
    }
    let matches = negatives(<Cli as clap::CommandFactory>::command()).get_matches();
    <Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

fn main() -> std::process::ExitCode {
    let cli = parse_cli();
    let result = match cli.command {
        Command::Recipes(args) => run_recipes(args),
        Command::Data(cmd) => run_data(cmd),
        Command::Train(args) => run_train(args),
        Command::Compare(args) => run_compare(args),
        Command::Sample(args) => run_sample(args),
        Command::Export(args) => export_cmd::run_export(args),
        Command::Tokenize(args) => tokenize_cmd::run_tokenize(args),
        Command::Plans(args) => rl_cmd::run_plans(args),
        Command::Rl(args) => rl_cmd::run_rl(*args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e)
            if e.downcast_ref::<TrainError>()
                .is_some_and(|t| matches!(t, TrainError::Stopped { .. })) =>
        {
            if let Some(TrainError::Stopped {
                step,
                steps,
                checkpoint,
                dir,
            }) = e.downcast_ref::<TrainError>()
            {
                eprintln!(
                    "stopped at step {step} of {steps}; checkpoint: {}",
                    checkpoint.display()
                );
                eprintln!("resume with: trainer train --resume {}", dir.display());
            }
            std::process::ExitCode::from(130)
        }
        Err(e) => {
            // `{:#}` prints the error with its causes on one line, without a backtrace.
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run_recipes(args: RecipesArgs) -> Result<()> {
    match args.command.unwrap_or(RecipesCommand::List) {
        RecipesCommand::List => {
            let width = BUILTIN_NAMES.iter().map(|n| n.len()).max().unwrap_or(0);
            for r in Recipe::builtins() {
                println!("{:<width$}  {}", r.name, r.description);
            }
            println!("\n`trainer recipes show NAME` prints one as TOML; a TOML file works wherever a name does.");
        }
        RecipesCommand::Show {
            name,
            plan,
            progress,
        } => {
            let recipe = Recipe::resolve(&name)?;
            // the flags before any output: a refused command prints no half answer
            if let Some(n_blocks) = plan {
                if n_blocks == 0 || n_blocks > MAX_LAYERS {
                    bail!("--plan needs 1..={MAX_LAYERS} blocks, got {n_blocks}");
                }
                if !(0.0..=1.0).contains(&progress) {
                    bail!("--progress {progress} must be in [0, 1]");
                }
            }
            print!("{}", recipe.to_toml());
            if let Some(n_blocks) = plan {
                println!("\n# Plan for {n_blocks} blocks at progress {progress}:");
                for line in recipe.plan(n_blocks, progress).lines() {
                    println!("# {line}");
                }
            }
        }
    }
    Ok(())
}

fn run_data(cmd: DataCommand) -> Result<()> {
    match cmd {
        DataCommand::Sample { seed, bytes } => {
            trainer::memory::check(
                &format!("a corpus sample of {bytes} bytes"),
                data::corpus_memory(bytes),
            )?;
            let text = data::generate(seed, bytes);
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())?;
            out.write_all(b"\n")?;
        }
        DataCommand::Stats(args) => {
            let source = args.source();
            let (tokens, layout) = match &source {
                DataSource::Shard {
                    path,
                    format,
                    vocab_size,
                } => {
                    let shard = data::open_shard(path, *format, *vocab_size)?;
                    (shard.tokens, Some(shard.layout))
                }
                other => (other.load()?, None),
            };
            print_stats(&tokens, layout).context("computing statistics")?;
        }
    }
    Ok(())
}

/// Tokens used for the conditional entropies (hash tables grow with the data).
const CONDITIONAL_LIMIT: usize = 4_000_000;

fn print_stats(tokens: &Tokens, layout: Option<ShardLayout>) -> Result<()> {
    let s = TokenStats::of(tokens);
    println!("source:          {}", tokens.origin());
    match layout {
        Some(ShardLayout::LlmC { version }) => {
            println!("layout:          llm.c, version {version}")
        }
        Some(ShardLayout::Raw) => println!("layout:          raw uint16 (nanoGPT)"),
        None => println!("layout:          byte-level"),
    }
    println!("tokens:          {}", s.n_tokens);
    println!("vocab size:      {}", s.vocab_size);
    println!("distinct tokens: {}", s.distinct);
    println!(
        "unigram entropy: {:.4} bits/token = {:.4} nats/token",
        s.unigram_bits,
        s.unigram_nats()
    );
    let n = tokens.len().min(CONDITIONAL_LIMIT);
    let head = tokens.slice(0..n);
    let note = if n < tokens.len() {
        format!(" (first {n} tokens)")
    } else {
        String::new()
    };
    for k in 1..=3 {
        let h = conditional_entropy_bits(&head, k);
        println!("H(next | previous {k}){note}: {h:.4} bits/token (plug-in estimate)");
    }
    Ok(())
}

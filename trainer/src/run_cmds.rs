//! `train`, `compare` and `sample`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use trainer::compare::{CompareError, CompareEvent, Comparison};
use trainer::data::{DataSource, ShardFormat};
use trainer::recipe::Recipe;
use trainer::sample::{SampleConfig, Sampler};
use trainer::train::{RunConfig, TrainError, TrainOptions, Trainer};

use crate::device_cmd::{self, DeviceArg};

/// Model, data and run settings shared by `train` and `compare`.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Run configuration TOML (`preset = "small"` or a [model] table, optional [train] and
    /// [data] tables).
    #[arg(long, value_name = "FILE", conflicts_with = "preset")]
    config: Option<PathBuf>,
    /// Model preset: tiny, small (default), base, medium, large.
    #[arg(long)]
    preset: Option<String>,
    /// Optimizer steps (overrides the config).
    #[arg(long)]
    steps: Option<u64>,
    /// Seed of initialisation, batching and stochastic rounding (overrides the config).
    #[arg(long)]
    seed: Option<u64>,
    /// Training data: `corpus` (embedded generator), `corpus:SEED:BYTES`, a UTF-8 text file,
    /// or a `.bin` uint16 token shard (llm.c or nanoGPT; vocabulary from the model config).
    #[arg(long, value_name = "SPEC")]
    data: Option<String>,
    /// Evaluate and checkpoint every N steps (overrides the config).
    #[arg(long, value_name = "N")]
    eval_every: Option<u64>,
    /// Worker threads (rayon and the f32 GEMM); default: all cores.
    #[arg(long)]
    threads: Option<usize>,
    /// Hide the progress bar.
    #[arg(long)]
    quiet: bool,
    /// Where to compute: cpu, cuda, or auto (cuda when a driver, a device and the CUDA path
    /// for this command are present, else cpu; printed at start).
    #[arg(long, value_enum, default_value_t = DeviceArg::Auto)]
    device: DeviceArg,
}

/// `trainer train`.
#[derive(Args, Debug)]
pub struct TrainArgs {
    /// Precision recipe: a built-in name (`trainer recipes`) or a TOML file.
    #[arg(long, default_value = "nvfp4")]
    recipe: String,
    #[command(flatten)]
    run: RunArgs,
    /// Output directory (default: runs/<recipe>-seed<seed>-<unix time>).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue from a checkpoint (a checkpoint directory or a run directory); model,
    /// recipe, data, seed and schedule come from the checkpoint.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["config", "preset", "data", "recipe", "overwrite"])]
    resume: Option<PathBuf>,
    /// Delete the run already in --out (its run.toml, recipe.toml, metrics, summary and
    /// checkpoints) and start over; without it an existing run is refused.
    #[arg(long)]
    overwrite: bool,
    /// Start from a Hugging Face Llama folder (e.g. one written by `trainer export`): the
    /// model shape and weights come from it, the rest from the other flags.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["resume", "config", "preset"])]
    init: Option<PathBuf>,
    /// Time every op of every step and print the last step's table (milliseconds per op kind,
    /// forward and backward) at the end. On a device each op then waits for its kernels, so
    /// steps run slower than without it: for finding where a step's time goes, not for its
    /// speed.
    #[arg(long)]
    op_profile: bool,
}

/// `trainer compare`.
#[derive(Args, Debug)]
pub struct CompareArgs {
    /// Recipes, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "bf16,fp8-current,mxfp8,nvfp4,nvfp4-no-rht,nvfp4-no-sr"
    )]
    recipes: Vec<String>,
    #[command(flatten)]
    run: RunArgs,
    /// Seeds per recipe: runs seeds `seed, seed+1, ..., seed+N-1` of every recipe (each
    /// seed shared by all recipes: same initialisation and data order) and reports means,
    /// standard deviations and paired gaps to bf16.
    #[arg(long, default_value_t = 1, value_name = "N")]
    seeds: u64,
    /// The recipe the report's gaps are measured against (paired by seed), one of the
    /// recipes compared [default: bf16, and no gaps when bf16 is not compared].
    #[arg(long, value_name = "RECIPE")]
    reference: Option<String>,
    /// Report directory (default: runs/compare-seed<seed>-<unix time>); each run goes into
    /// a subdirectory named after its recipe (`<recipe>/seed<k>` with several seeds). A run
    /// that already finished there with the same configuration and recipe is reused, so an
    /// interrupted comparison, or one extended with more seeds or recipes, trains only
    /// what is missing (an interrupted run continues from its last checkpoint).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Delete runs in --out that were made with another configuration or recipe and train
    /// them again; without it such a run is refused.
    #[arg(long)]
    overwrite: bool,
}

/// `trainer sample`.
#[derive(Args, Debug)]
pub struct SampleArgs {
    /// Checkpoint directory or run directory.
    checkpoint: PathBuf,
    /// Where to compute: cpu, cuda or auto (see `train --help`).
    #[arg(long, value_enum, default_value_t = DeviceArg::Auto)]
    device: DeviceArg,
    /// Precision of weights and activations in the forward pass (a recipe; its Fprop
    /// policies apply, without its late switch).
    #[arg(long, default_value = "bf16")]
    recipe: String,
    /// Prompt text (bytes).
    #[arg(long, default_value = "Once, there was")]
    prompt: String,
    /// Tokens to generate at most.
    #[arg(long, visible_alias = "max-new-tokens", default_value_t = 300)]
    tokens: usize,
    /// Softmax temperature (0 = greedy).
    #[arg(long, default_value_t = 0.8)]
    temperature: f32,
    /// Top-k (0 = no limit).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Top-p (nucleus): keep the most likely tokens up to this probability, in (0, 1].
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Stop after this text (one token of the model's tokenizer, e.g. "\n" for a newline);
    /// repeatable.
    #[arg(long, value_name = "TEXT")]
    stop: Vec<String>,
    /// Sampling seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Worker threads.
    #[arg(long)]
    threads: Option<usize>,
    /// Print token ids (space-separated) instead of text; needed for models whose
    /// vocabulary is not byte-level.
    #[arg(long)]
    ids: bool,
}

/// The most worker threads `--threads` accepts.
const MAX_THREADS: usize = 1024;

pub(crate) fn set_threads(threads: Option<usize>) -> Result<()> {
    if let Some(n) = threads {
        if n == 0 || n > MAX_THREADS {
            bail!("--threads must be in 1..={MAX_THREADS}, got {n}");
        }
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .context("setting up the thread pool")?;
    }
    Ok(())
}

/// Runs `f` on a thread of the global rayon pool while the caller waits. Training code run from
/// a thread outside the pool hands each of a step's hundreds of parallel regions to the pool
/// and sleeps until it is done, so every region waits for sleeping threads to wake (65 us to
/// 1.9 ms each on the 2-vCPU VMs this project runs on, `bench steps`' `step/wake_probe/us`);
/// on one of the pool's threads it does its share of each region itself, as `bench step`
/// measures it.
pub(crate) fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    rayon::scope(|_| f())
}

fn parse_data(spec: &str, vocab: usize) -> Result<DataSource> {
    if spec == "corpus" {
        return Ok(DataSource::Corpus {
            seed: 0,
            bytes: trainer::data::DEFAULT_CORPUS_BYTES,
        });
    }
    if let Some(rest) = spec.strip_prefix("corpus:") {
        let parts: Vec<&str> = rest.split(':').collect();
        if parts.len() != 2 {
            bail!("--data corpus:SEED:BYTES, got {spec:?}");
        }
        return Ok(DataSource::Corpus {
            seed: parts[0]
                .parse()
                .with_context(|| format!("--data {spec:?}: corpus seed"))?,
            bytes: parts[1]
                .parse()
                .with_context(|| format!("--data {spec:?}: corpus bytes"))?,
        });
    }
    let path = PathBuf::from(spec);
    const TAKES: &str = "--data takes `corpus`, `corpus:SEED:BYTES`, a UTF-8 text file, a .bin \
                         token shard or a `trainer tokenize` folder";
    if path.is_dir() {
        if path.join(trainer::data::TOKENIZER_FILE).is_file() {
            return Ok(DataSource::tokenized(&path)?);
        }
        bail!(
            "--data {spec}: a folder without {} (not a `trainer tokenize` folder); {TAKES}",
            trainer::data::TOKENIZER_FILE
        );
    }
    if !path.exists() {
        bail!("--data {spec}: no such file or folder; {TAKES}");
    }
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("bin"))
    {
        Ok(DataSource::Shard {
            path,
            format: ShardFormat::Auto,
            vocab_size: u32::try_from(vocab).context("vocab")?,
        })
    } else {
        Ok(DataSource::Text { path })
    }
}

/// The run configuration of the flags, validated, and the notes on what the flags adjusted
/// (for the caller to print once nothing else can refuse the run: a note about a run that
/// is then refused only confuses).
fn run_config(a: &RunArgs) -> Result<(RunConfig, Vec<String>)> {
    let mut cfg = match (&a.config, &a.preset) {
        (Some(p), _) => RunConfig::from_file(p)?,
        (None, Some(name)) => RunConfig::preset(name)?,
        (None, None) => RunConfig::preset("small")?,
    };
    let mut notes = Vec::new();
    if let Some(s) = a.steps {
        cfg.train.steps = s;
        if cfg.train.warmup_steps > s {
            notes.push(format!(
                "note: --steps {s} is below train.warmup_steps ({}): the warmup takes the whole run (the divergence guard still watches it, against the first step's loss)",
                cfg.train.warmup_steps
            ));
            cfg.train.warmup_steps = s;
        }
    }
    if let Some(s) = a.seed {
        cfg.train.seed = s;
    }
    if let Some(e) = a.eval_every {
        cfg.train.eval_every = e;
    }
    if let Some(d) = &a.data {
        cfg.data = parse_data(d, cfg.model.vocab)?;
        // A tokenized folder sets the model's vocabulary (the presets are byte-level).
        if let DataSource::Tokenized { vocab_size, .. } = &cfg.data {
            let v = *vocab_size as usize;
            if cfg.model.vocab != v {
                notes.push(format!(
                    "note: model vocabulary {} -> {v}, the tokenizer's ({d})",
                    cfg.model.vocab
                ));
                cfg.model.vocab = v;
            }
        }
    }
    cfg.validate()?;
    Ok((cfg, notes))
}

/// `runs/NAME`, or `runs/NAME-2`, `runs/NAME-3`, ... when it exists (two runs started in
/// the same second).
fn unused_dir(name: &str) -> PathBuf {
    let base = PathBuf::from("runs");
    (1..)
        .map(|k| match k {
            1 => base.join(name),
            k => base.join(format!("{name}-{k}")),
        })
        .find(|p| !p.exists())
        .unwrap_or_else(|| base.join(name))
}

fn stamp() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn print_divergence(e: &anyhow::Error, out: &Path) {
    if let Some(TrainError::Diverged { .. }) = e.downcast_ref::<TrainError>() {
        eprintln!(
            "diagnosis written to {}",
            out.join("diagnosis.txt").display()
        );
    }
}

pub fn run_train(args: TrainArgs) -> Result<()> {
    set_threads(args.run.threads)?;
    install_stop_handlers()?;
    let t0 = Instant::now();
    let mut tr = if let Some(dir) = &args.resume {
        for (flag, given) in [
            ("--seed", args.run.seed.is_some()),
            ("--eval-every", args.run.eval_every.is_some()),
        ] {
            if given {
                bail!("{flag} cannot be changed on --resume: a resume continues the same run with the checkpoint's settings");
            }
        }
        let (from, default_out) = match trainer::checkpoint::resolve(dir) {
            // default output: the run directory holding checkpoints/step-N
            Ok(ck) => {
                let run_dir = ck
                    .parent()
                    .and_then(Path::parent)
                    .map(Path::to_path_buf)
                    .unwrap_or_else(|| PathBuf::from("."));
                (ck, run_dir)
            }
            // a run directory without a checkpoint yet starts again from its run.toml
            Err(trainer::checkpoint::CheckpointError::NotACheckpoint(_))
                if dir.join("run.toml").is_file() =>
            {
                (dir.clone(), dir.clone())
            }
            Err(e) => return Err(e.into()),
        };
        let out = args.out.clone().unwrap_or(default_out);
        let tr = Trainer::resume(
            &from,
            TrainOptions {
                out,
                quiet: args.run.quiet,
                stop_after: None,
            },
        )?;
        if args.run.steps.is_some_and(|s| s != tr.config().train.steps) {
            bail!(
                "--steps differs from the checkpoint's schedule ({} steps); a resume continues the same run",
                tr.config().train.steps
            );
        }
        if tr.step() >= tr.config().train.steps {
            println!("{} already finished ({} steps)", from.display(), tr.step());
        } else {
            println!("resuming {} at step {}", from.display(), tr.step());
        }
        tr
    } else {
        let (mut cfg, notes) = run_config(&args.run)?;
        let init = match &args.init {
            Some(dir) => {
                let (model, tensors) = trainer::hf::load_hf(dir)?;
                cfg.model = model;
                cfg.validate()?;
                Some(tensors)
            }
            None => None,
        };
        let recipe = Recipe::resolve(&args.recipe)?;
        for n in notes {
            println!("{n}");
        }
        let out = args.out.clone().unwrap_or_else(|| {
            unused_dir(&format!(
                "{}-seed{}-{}",
                recipe.name,
                cfg.train.seed,
                stamp()
            ))
        });
        println!(
            "training {} parameters ({} blocks, d_model {}, seq {}) with recipe {} for {} steps ({} tokens) -> {}",
            cfg.model.num_params(),
            cfg.model.n_layers,
            cfg.model.d_model,
            cfg.model.seq,
            recipe.name,
            cfg.train.steps,
            cfg.train.steps * cfg.tokens_per_step(),
            out.display()
        );
        let mut tr = Trainer::new(
            cfg,
            recipe,
            TrainOptions {
                out,
                quiet: args.run.quiet,
                stop_after: None,
            },
        )?;
        tr.set_overwrite(args.overwrite);
        if let Some(t) = init {
            tr.params_mut().import(&t)?;
        }
        tr
    };
    // nothing is written before this point
    let (dev, line) = device_cmd::resolve(args.run.device, &[tr.recipe()])?;
    println!("{line}");
    tr.set_device(dev)?;
    tr.set_op_profiling(args.op_profile);
    let out = tr.out_dir().to_path_buf();
    let s = match on_pool(|| tr.run()) {
        Ok(s) => s,
        Err(e) => {
            let e = anyhow::Error::from(e);
            print_divergence(&e, &out);
            return Err(e);
        }
    };
    println!(
        "done in {:.0} s: final validation loss {:.4} (unigram entropy {:.4}), {:.0} tokens/s",
        t0.elapsed().as_secs_f64(),
        s.final_val_loss,
        s.unigram_nats,
        s.tokens_per_s
    );
    println!("metrics:    {}", out.join("metrics.jsonl").display());
    println!("summary:    {}", out.join("summary.json").display());
    println!("checkpoint: {}", s.checkpoint.display());
    if let Some(p) = tr.last_op_profile() {
        println!("op profile of the last step (ms):\n{p}");
    }
    Ok(())
}

pub fn run_compare(args: CompareArgs) -> Result<()> {
    let (cfg, notes) = run_config(&args.run)?;
    let recipes = args
        .recipes
        .iter()
        .map(|r| Recipe::resolve(r.trim()))
        .collect::<Result<Vec<_>, _>>()?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| unused_dir(&format!("compare-seed{}-{}", cfg.train.seed, stamp())));
    let mut cmp = Comparison {
        run: cfg,
        recipes,
        seeds: args.seeds,
        reference: args.reference.clone(),
        out,
        quiet: args.run.quiet,
        overwrite: args.overwrite,
        command: std::env::args().skip(2).map(|a| format!(" {a}")).collect(),
        device: None,
    };
    let explain = |e: CompareError| -> anyhow::Error {
        match e {
            CompareError::DuplicateRecipe { first, second, name } => anyhow::anyhow!(
                "--recipes: {} and {} are both named '{name}' and would share one output folder; give each recipe a distinct `name`",
                args.recipes[first].trim(),
                args.recipes[second].trim()
            ),
            e => e.into(),
        }
    };
    // the settings before anything is said (notes, the device) or written
    cmp.validate().map_err(explain)?;
    for n in notes {
        println!("{n}");
    }
    // every run on the device, one after another
    let (device, line) =
        device_cmd::resolve(args.run.device, &cmp.recipes.iter().collect::<Vec<_>>())?;
    println!("{line}");
    cmp.device = device;
    set_threads(args.run.threads)?;
    install_stop_handlers()?;
    let outcome = match on_pool(|| {
        cmp.run(|event| match event {
            CompareEvent::Failed { .. } => eprintln!("{event}"),
            _ => println!("{event}"),
        })
    }) {
        Ok(o) => o,
        Err(e @ CompareError::Train(TrainError::Stopped { .. })) => {
            eprintln!(
                "comparison stopped; run the same `trainer compare` command again to continue it (finished runs are reused, this one resumes)"
            );
            return Err(e.into());
        }
        Err(e) => return Err(explain(e)),
    };
    println!("report: {}", outcome.report.display());
    let plots: Vec<String> = outcome
        .plots
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    println!("plots:  {}", plots.join(" "));
    Ok(())
}

/// SIGINT and SIGTERM stop training after the current step, with a checkpoint.
fn install_stop_handlers() -> Result<()> {
    trainer::interrupt::install_handlers().context("installing the SIGINT/SIGTERM handlers")
}

/// The token of each `--stop` text (`\n` and `\t` escapes read as newline and tab).
fn stop_tokens(tok: &trainer::data::Tokenizer, stops: &[String]) -> Result<Vec<u32>> {
    stops
        .iter()
        .map(|s| {
            let text = s.replace("\\n", "\n").replace("\\t", "\t");
            match tok.encode(&text)?[..] {
                [t] => Ok(t),
                ref ids => bail!(
                    "--stop {s:?} is {} tokens of the tokenizer ({}); a stop must be one token",
                    ids.len(),
                    tok.describe()
                ),
            }
        })
        .collect()
}

pub fn run_sample(args: SampleArgs) -> Result<()> {
    let recipe = Recipe::resolve(&args.recipe)?;
    // stdout is the text: the choice is not printed
    let (dev, _) = device_cmd::resolve(args.device, &[&recipe])?;
    set_threads(args.threads)?;
    let mut s = Sampler::load(&args.checkpoint, recipe)?;
    s.set_device(dev);
    let tok = trainer::hf::tokenizer_of(&args.checkpoint)?;
    let tok = match tok {
        Some(t) if t.vocab_size() as usize > s.vocab() => bail!(
            "the tokenizer ({}) has more tokens than the model ({})",
            t.describe(),
            s.vocab()
        ),
        Some(t) if (t.vocab_size() as usize) < s.vocab() && !args.ids => bail!(
            "the model's vocabulary has {} tokens, more than its tokenizer's ({}): a sampled id \
             beyond the tokenizer has no text; pass --ids to print token ids",
            s.vocab(),
            t.describe()
        ),
        Some(t) => t,
        None if s.vocab() <= 256 => trainer::data::Tokenizer::Bytes,
        None if args.ids => trainer::data::Tokenizer::Bytes,
        None => bail!(
            "the model's vocabulary has {} tokens and no tokenizer was found with it (a run \
             trained on a `trainer tokenize` folder keeps tokenizer.json); pass --ids to print \
             token ids (the prompt is then read as bytes)",
            s.vocab()
        ),
    };
    let prompt = tok.encode(&args.prompt)?;
    let stop = stop_tokens(&tok, &args.stop)?;
    let cfg = SampleConfig {
        tokens: args.tokens,
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        stop,
        seed: args.seed,
    };
    // decoding is hundreds of tiny parallel regions per token: on a pool thread, with the
    // pool's other threads polling for them
    let out = on_pool(|| autograd::with_polling_workers(|| s.generate(&prompt, &cfg)))?;
    if args.ids {
        let ids: Vec<String> = prompt.iter().chain(&out).map(u32::to_string).collect();
        println!("{}", ids.join(" "));
        return Ok(());
    }
    let ids: Vec<u32> = prompt.iter().chain(&out).copied().collect();
    println!("{}", tok.decode(&ids)?);
    Ok(())
}

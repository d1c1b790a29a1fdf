//! `bench`: the measurements behind `cargo xtask bench`.
//!
//! ```text
//! bench kernels [--rounds N] [--json PATH]       quantizers, GEMM, AdamW: same-run ratios
//! bench steps [--rounds N] [--json PATH]        training step per recipe, thread scaling
//! bench step --recipes A,B --threads T           one child: prints a JSON line
//! bench ops [--preset P] [--recipes A,B] [--rounds N]  each op's time per step, 1 and 2 threads
//! bench callgrind --kernel K [--setup-only]      one kernel call, for valgrind
//! bench callgrind --list                         the callgrind kernels and input size
//! bench gemms --threads T [--rounds N] [--json PATH]  instruction peaks, f32 and BF16 GEMMs
//! bench checkpoint [--rounds N] [--layers L] [--dir D] [--json PATH]  checkpoint quantization vs a copy
//! bench decode [--rounds N] [--json PATH]       RL sampler: KV cache vs recomputation, NVFP4 vs BF16
//! ```
//!
//! `kernels` and `callgrind` take `--inject-slowdown KERNEL=FRACTION` (repeatable): that
//! kernel is made slower on purpose, to check that the gate catches a real slowdown.
//!
//! Gated figures are ratios measured in the same rounds (see `harness`) whose two sides are
//! bound by the same resource (see `metric::Basis`), so neither a busy machine nor a machine
//! with another balance of memory bandwidth to compute moves them much; absolute numbers and
//! ratios across resources are reported but never gated.

mod calibrate;
mod checkpoint;
mod decode;
mod gemms;
mod harness;
mod kernels;
mod metric;
mod ops;
mod peak;
mod steps;

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use metric::SuiteReport;

/// Nibble's benchmark binary (normally run by `cargo xtask bench`).
#[derive(Parser, Debug)]
#[command(name = "bench", about)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Quantizers vs memcpy, emulated NVFP4 GEMM vs f32, AdamW vs an in-place pass, thread
    /// scaling: same-run ratios.
    Kernels {
        /// Paired rounds (the gated figures are medians over rounds).
        #[arg(long, default_value_t = 7, value_parser = rounds())]
        rounds: usize,
        /// Write the metrics here (JSON) instead of stdout.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Slow KERNEL down on purpose by FRACTION (e.g. `quant/nvfp4_row_1x16=0.3`).
        #[arg(long, value_name = "KERNEL=FRACTION", value_parser = parse_injection)]
        inject_slowdown: Vec<(String, f64)>,
    },
    /// Training step time per recipe on the default model, and FP32 thread scaling.
    Steps {
        /// Model preset: the default model (`small`) gives the gated ratios and the thread
        /// scaling; another preset (`base`) gives reported `step_<preset>/...` figures only.
        #[arg(long, default_value = steps::PRESET)]
        preset: String,
        /// Rounds of one step per recipe (interleaved in one 2-thread process).
        #[arg(long, default_value_t = 10, value_parser = rounds())]
        rounds: usize,
        /// Pairs of 1-thread and 2-thread FP32 child processes.
        #[arg(long, default_value_t = 3, value_parser = rounds())]
        scaling_rounds: usize,
        /// Write the metrics here (JSON) instead of stdout.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Where a training step's time goes: each op's forward and backward time on a 1-thread
    /// and a 2-thread pool, per recipe (reported, not gated).
    Ops {
        /// Trainer model preset.
        #[arg(long, default_value = steps::PRESET)]
        preset: String,
        /// Built-in recipe names, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "fp32,bf16,nvfp4")]
        recipes: Vec<String>,
        /// Untimed steps per recipe and pool.
        #[arg(long, default_value_t = 2, value_parser = warmup_steps())]
        warmup: usize,
        /// Profiled steps per recipe and pool.
        #[arg(long, default_value_t = 8, value_parser = rounds())]
        rounds: usize,
    },
    /// One step-timing child (used by `steps`): prints a JSON line.
    Step {
        /// Trainer model preset (`small` is the default model; `base` is the larger one).
        #[arg(long, default_value = steps::PRESET)]
        preset: String,
        /// Built-in recipe names, comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        recipes: Vec<String>,
        /// Threads.
        #[arg(long, default_value_t = 2, value_parser = threads())]
        threads: usize,
        /// Untimed steps per recipe.
        #[arg(long, default_value_t = 1, value_parser = warmup_steps())]
        warmup: usize,
        /// Rounds of one timed step per recipe.
        #[arg(long, default_value_t = 4, value_parser = rounds())]
        rounds: usize,
    },
    /// FP32 FMA, BF16 dot-product and AMX-BF16 peaks, and the f32 and BF16 GEMMs on the
    /// training shapes as fractions of them (reported, not gated).
    Gemms {
        /// Threads (the rayon pool every kernel runs on).
        #[arg(long, default_value_t = 1, value_parser = threads())]
        threads: usize,
        /// Paired rounds.
        #[arg(long, default_value_t = 5, value_parser = rounds())]
        rounds: usize,
        /// Write the metrics here (JSON) instead of stdout.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Whole-checkpoint quantization (NVFP4, MXFP8) in GB/s of input and as a multiple of a
    /// plain read + write of the same file in the same rounds (reported, not gated).
    Checkpoint {
        /// Rounds (copy, then each job, per round).
        #[arg(long, default_value_t = 3, value_parser = rounds())]
        rounds: usize,
        /// Layers of the synthetic Llama-shaped F32 checkpoint (d 1024, MLP 2816, vocab 8000:
        /// 4 layers make 271 MB).
        #[arg(long, default_value_t = 4)]
        layers: usize,
        /// Where the checkpoint and the outputs are written (a disk or a tmpfs).
        #[arg(long, default_value_os_t = std::env::temp_dir())]
        dir: PathBuf,
        /// Also write the results here (JSON).
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// The RL sampler's decoding: KV-cache tokens/s over full recomputation, NVFP4-sampler
    /// decode time over BF16-sampler decode time (ratios in one run, reported, not gated).
    Decode {
        /// Interleaved rounds.
        #[arg(long, default_value_t = 5, value_parser = rounds())]
        rounds: usize,
        /// Write the metrics here (JSON) as well.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// One call of one kernel, to be counted by `valgrind --tool=callgrind`.
    Callgrind {
        /// Kernel name (see --list).
        #[arg(long, required_unless_present = "list")]
        kernel: Option<String>,
        /// Prepare the input but skip the call (the baseline to subtract).
        #[arg(long)]
        setup_only: bool,
        /// Print the kernels and the number of elements each processes.
        #[arg(long)]
        list: bool,
        /// Add FRACTION of the kernel's work again (e.g. `quant/nvfp4_row_1x16=0.3`); applies
        /// when KERNEL is the kernel counted.
        #[arg(long, value_name = "KERNEL=FRACTION", value_parser = parse_injection)]
        inject_slowdown: Vec<(String, f64)>,
    },
}

/// Parses `KERNEL=FRACTION` with a fraction in (0, 10].
fn parse_injection(s: &str) -> Result<(String, f64), String> {
    let (name, f) = s
        .rsplit_once('=')
        .ok_or_else(|| format!("expected KERNEL=FRACTION, got {s:?}"))?;
    let f: f64 = f
        .parse()
        .map_err(|e| format!("fraction {f:?} of {s:?}: {e}"))?;
    if !(f > 0.0 && f <= 10.0) {
        return Err(format!("fraction {f} of {s:?} is outside (0, 10]"));
    }
    Ok((name.to_string(), f))
}

/// The most rounds (or warm-up steps, or scaling pairs) one command takes: far beyond any
/// useful run, and small enough that the per-round buffers are never a problem.
const MAX_ROUNDS: u64 = 100_000;

/// `1..=MAX_ROUNDS` rounds (a run of no rounds measures nothing).
fn rounds() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(1..=MAX_ROUNDS)
}

/// `1..=256` threads (a pool is built with that many).
fn threads() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(1..=256)
}

/// `0..=MAX_ROUNDS` untimed warm-up steps.
fn warmup_steps() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(0..=MAX_ROUNDS)
}

fn write(report: &SuiteReport, json: Option<PathBuf>) -> Result<()> {
    let text = serde_json::to_string_pretty(report)?;
    match json {
        Some(path) => {
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
        }
        None => {
            println!("{text}");
            Ok(())
        }
    }
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Cmd::Checkpoint {
            rounds,
            layers,
            dir,
            json,
        } => {
            let shape = checkpoint::Shape {
                layers,
                d: 1024,
                hidden: 2816,
                vocab: 8000,
            };
            let (bytes, results) = checkpoint::suite(&dir, shape, rounds)?;
            println!(
                "{:.1} MB F32 checkpoint in {}, {rounds} round(s), medians:",
                bytes as f64 / 1e6,
                dir.display()
            );
            println!("| job | s | GB/s of input | x copy |\n|---|---:|---:|---:|");
            for r in &results {
                println!(
                    "| {} | {:.3} | {:.2} | {:.2} |",
                    r.job, r.seconds, r.gb_per_s, r.vs_copy
                );
            }
            if let Some(p) = json {
                std::fs::write(&p, serde_json::to_string_pretty(&results)?)
                    .with_context(|| format!("writing {}", p.display()))?;
            }
            Ok(())
        }
        Cmd::Decode { rounds, json } => {
            // on a thread of the pool, as the trainer decodes (`trainer sample`, `rl`)
            let metrics = rayon::scope(|_| decode::suite(rounds))?;
            if json.is_none() {
                return Ok(());
            }
            write(
                &SuiteReport {
                    suite: "decode".into(),
                    rounds,
                    metrics,
                },
                json,
            )
        }
        Cmd::Kernels {
            rounds,
            json,
            inject_slowdown,
        } => {
            let metrics = kernels::suite(rounds, &inject_slowdown)?;
            write(
                &SuiteReport {
                    suite: "kernels".into(),
                    rounds,
                    metrics,
                },
                json,
            )
        }
        Cmd::Steps {
            preset,
            rounds,
            scaling_rounds,
            json,
        } => {
            let metrics = if preset == steps::PRESET {
                steps::suite(rounds, scaling_rounds)?
            } else {
                steps::preset_suite(&preset, rounds)?
            };
            write(
                &SuiteReport {
                    suite: format!("steps-{preset}"),
                    rounds,
                    metrics,
                },
                json,
            )
        }
        Cmd::Gemms {
            threads,
            rounds,
            json,
        } => {
            let mut metrics = gemms::suite(threads, rounds)?;
            metrics.extend(gemms::pairs_suite(threads, rounds)?);
            write(
                &SuiteReport {
                    suite: format!("gemms-{threads}t"),
                    rounds,
                    metrics,
                },
                json,
            )
        }
        Cmd::Ops {
            preset,
            recipes,
            warmup,
            rounds,
        } => ops::run(&preset, &recipes, warmup, rounds),
        Cmd::Step {
            preset,
            recipes,
            threads,
            warmup,
            rounds,
        } => {
            let r = steps::child(&preset, &recipes, threads, warmup, rounds)?;
            println!("{}", serde_json::to_string(&r)?);
            Ok(())
        }
        Cmd::Callgrind {
            kernel,
            setup_only,
            list,
            inject_slowdown,
        } => {
            if list {
                let n = kernels::CALLGRIND_SIDE * kernels::CALLGRIND_SIDE;
                for k in kernels::KERNELS {
                    println!("{k} {n}");
                }
                return Ok(());
            }
            let kernel = kernel.context("--kernel is required")?;
            let inject = inject_slowdown
                .iter()
                .find(|(k, _)| *k == kernel)
                .map(|&(_, f)| f);
            kernels::callgrind_kernel(&kernel, setup_only, inject)
        }
    }
}

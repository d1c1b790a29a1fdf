//! Workspace automation, run as `cargo xtask <task> [args]` (alias in `.cargo/config.toml`).
//!
//! Each task lives in its own module exposing `run(args: &[String]) -> anyhow::Result<()>`
//! and is registered in [`TASKS`]; adding a task means adding a module and one line there.

mod bench;
mod golden;
mod outputs;
mod ptx;
mod venv;

use anyhow::{bail, Result};
use std::path::{Path, PathBuf};

/// A task: name, one-line summary, entry point.
type Task = (&'static str, &'static str, fn(&[String]) -> Result<()>);

const TASKS: &[Task] = &[
    (
        "bench",
        "measure kernels, training steps, callgrind counts; gate on bench/baseline.json (--quick for CI)",
        bench::run,
    ),
    (
        "golden",
        "regenerate fp-formats golden tables from ml_dtypes (--check: verify they are current)",
        golden::run,
    ),
    (
        "ptx",
        "build + ptxas-validate kernels-cuda PTX with pinned CUDA wheels (--check: verify committed)",
        ptx::run,
    ),
];

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((task, rest)) = args.split_first() else {
        print_help();
        return Ok(());
    };
    if matches!(task.as_str(), "help" | "-h" | "--help") {
        print_help();
        return Ok(());
    }
    match TASKS.iter().find(|t| t.0 == task) {
        Some((_, _, run)) => run(rest),
        None => {
            print_help();
            bail!("unknown task `{task}`")
        }
    }
}

fn print_help() {
    eprintln!("usage: cargo xtask <task> [args]   (`cargo xtask <task> --help` for details)\n");
    eprintln!("tasks:");
    for (name, summary, _) in TASKS {
        eprintln!("  {name:<10} {summary}");
    }
}

/// The workspace root (the parent of this crate's directory).
pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

//! `cargo xtask golden [--check] [--venv DIR] [--python PYTHON]`
//!
//! Regenerates the golden tables of `fp-formats` (`fp-formats/tests/data/`) with
//! `xtask/golden/make_golden.py`, in a Python virtual environment holding exactly the
//! versions pinned in `xtask/golden/requirements.txt` (ml_dtypes, numpy). The venv
//! (default `.venv-golden/` at the workspace root, git-ignored) is created and the pins
//! installed with pip when missing or different.
//!
//! With `--check`, the tables are generated into a temporary directory and compared byte
//! for byte with the committed ones; any difference (changed, missing or extra file) is an
//! error. The generator is deterministic (fixed seeds, no numpy RNG).

use crate::outputs;
use crate::venv::{self, run_cmd};
use anyhow::{bail, Context, Result};
use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::process::Command;

const USAGE: &str = "usage: cargo xtask golden [--check] [--venv DIR] [--python PYTHON]

  --check          regenerate into a temporary directory and fail if the committed
                   tables in fp-formats/tests/data differ
  --venv DIR       virtual environment to create/use (default: .venv-golden)
  --python PYTHON  interpreter used to create the venv (default: python3)";

pub fn run(args: &[String]) -> Result<()> {
    let root = crate::workspace_root();
    let Some(opts) = venv::parse(args, &root, ".venv-golden", USAGE)? else {
        return Ok(());
    };
    let golden_dir = root.join("xtask/golden");
    let data_dir = root.join("fp-formats/tests/data");
    let python = venv::ensure_venv(
        &opts,
        &golden_dir.join("requirements.txt"),
        "pinned packages",
    )?;

    outputs::in_temp_dir("golden", |tmp| {
        generate(&python, &golden_dir.join("make_golden.py"), tmp)?;
        if opts.check {
            check(tmp, &data_dir)
        } else {
            outputs::install(file_names, tmp, &data_dir)
        }
    })
}

fn generate(python: &Path, script: &Path, out: &Path) -> Result<()> {
    let out = out.to_str().context("non-UTF-8 temporary path")?;
    run_cmd(Command::new(python).arg(script).args(["--out", out]))
}

fn file_names(dir: &Path) -> Result<BTreeSet<String>> {
    let mut names = BTreeSet::new();
    if dir.exists() {
        for e in fs::read_dir(dir)? {
            let e = e?;
            if e.file_type()?.is_file() {
                names.insert(
                    e.file_name()
                        .into_string()
                        .map_err(|n| anyhow::anyhow!("{n:?}"))?,
                );
            }
        }
    }
    Ok(names)
}

/// Compares the fresh tables with the committed ones.
fn check(fresh: &Path, committed: &Path) -> Result<()> {
    let (problems, count) = outputs::differences(file_names, fresh, committed, "generator")?;
    if !problems.is_empty() {
        bail!(
            "golden tables in {} are stale:\n  {}\nrun `cargo xtask golden` and commit the result",
            committed.display(),
            problems.join("\n  ")
        );
    }
    println!("golden tables are up to date ({count} files)");
    Ok(())
}

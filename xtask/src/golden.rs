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

use anyhow::{bail, ensure, Context, Result};
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const USAGE: &str = "usage: cargo xtask golden [--check] [--venv DIR] [--python PYTHON]

  --check          regenerate into a temporary directory and fail if the committed
                   tables in fp-formats/tests/data differ
  --venv DIR       virtual environment to create/use (default: .venv-golden)
  --python PYTHON  interpreter used to create the venv (default: python3)";

struct Options {
    check: bool,
    venv: PathBuf,
    python: String,
}

fn parse(args: &[String], root: &Path) -> Result<Option<Options>> {
    let mut opts = Options {
        check: false,
        venv: root.join(".venv-golden"),
        python: "python3".into(),
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--check" => opts.check = true,
            "--venv" => opts.venv = it.next().context("--venv needs a directory")?.into(),
            "--python" => opts.python = it.next().context("--python needs a program")?.clone(),
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(None);
            }
            other => bail!("unknown argument `{other}`\n{USAGE}"),
        }
    }
    if opts.venv.is_relative() {
        opts.venv = root.join(&opts.venv);
    }
    Ok(Some(opts))
}

pub fn run(args: &[String]) -> Result<()> {
    let root = crate::workspace_root();
    let Some(opts) = parse(args, &root)? else {
        return Ok(());
    };
    let golden_dir = root.join("xtask/golden");
    let data_dir = root.join("fp-formats/tests/data");
    let python = ensure_venv(&opts, &golden_dir.join("requirements.txt"))?;

    let tmp = std::env::temp_dir().join(format!("nibble-golden-{}", std::process::id()));
    if tmp.exists() {
        fs::remove_dir_all(&tmp)?;
    }
    fs::create_dir_all(&tmp)?;
    let result = generate(&python, &golden_dir.join("make_golden.py"), &tmp).and_then(|()| {
        if opts.check {
            check(&tmp, &data_dir)
        } else {
            install(&tmp, &data_dir)
        }
    });
    fs::remove_dir_all(&tmp).ok();
    result
}

/// Creates the venv if needed and makes sure it holds the pinned packages; returns its
/// interpreter.
fn ensure_venv(opts: &Options, requirements: &Path) -> Result<PathBuf> {
    let python = if cfg!(windows) {
        opts.venv.join("Scripts").join("python.exe")
    } else {
        opts.venv.join("bin").join("python")
    };
    if !python.exists() {
        eprintln!("creating virtual environment {}", opts.venv.display());
        let venv = opts.venv.to_str().context("non-UTF-8 venv path")?;
        run_cmd(Command::new(&opts.python).args(["-m", "venv", venv]))?;
    }
    let pins = read_pins(requirements)?;
    if installed_versions(&python, &pins)? != pins {
        eprintln!("installing pinned packages into {}", opts.venv.display());
        let req = requirements.to_str().context("non-UTF-8 path")?;
        run_cmd(Command::new(&python).args(["-m", "pip", "install", "--quiet", "-r", req]))?;
        let now = installed_versions(&python, &pins)?;
        ensure!(
            now == pins,
            "after pip install: found {now:?}, need {pins:?}"
        );
    }
    Ok(python)
}

/// `name==version` lines of a requirements file.
fn read_pins(path: &Path) -> Result<Vec<(String, String)>> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (name, version) = l
                .split_once("==")
                .with_context(|| format!("`{l}`: pin with `==`"))?;
            Ok((name.trim().to_string(), version.trim().to_string()))
        })
        .collect()
}

/// Versions of the pinned packages installed in the venv (empty string when missing).
fn installed_versions(python: &Path, pins: &[(String, String)]) -> Result<Vec<(String, String)>> {
    let script = "import sys\nfrom importlib import metadata\nfor n in sys.argv[1:]:\n    \
                  try: print(metadata.version(n))\n    except Exception: print('')";
    let out = Command::new(python)
        .args(["-c", script])
        .args(pins.iter().map(|p| &p.0))
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    ensure!(
        out.status.success(),
        "{} failed: {}",
        python.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    Ok(pins
        .iter()
        .map(|p| p.0.clone())
        .zip(text.lines().map(str::to_string))
        .collect())
}

fn generate(python: &Path, script: &Path, out: &Path) -> Result<()> {
    let out = out.to_str().context("non-UTF-8 temporary path")?;
    run_cmd(Command::new(python).arg(script).args(["--out", out]))
}

fn run_cmd(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("spawning {cmd:?}"))?;
    ensure!(status.success(), "{cmd:?} failed: {status}");
    Ok(())
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
    let (new, old) = (file_names(fresh)?, file_names(committed)?);
    let mut problems = Vec::new();
    for name in new.union(&old) {
        match (new.contains(name), old.contains(name)) {
            (true, false) => problems.push(format!("missing: {name}")),
            (false, true) => problems.push(format!("not produced by the generator: {name}")),
            _ => {
                if fs::read(fresh.join(name))? != fs::read(committed.join(name))? {
                    problems.push(format!("differs: {name}"));
                }
            }
        }
    }
    if !problems.is_empty() {
        bail!(
            "golden tables in {} are stale:\n  {}\nrun `cargo xtask golden` and commit the result",
            committed.display(),
            problems.join("\n  ")
        );
    }
    println!("golden tables are up to date ({} files)", new.len());
    Ok(())
}

/// Replaces the committed tables with the fresh ones.
fn install(fresh: &Path, committed: &Path) -> Result<()> {
    fs::create_dir_all(committed)?;
    let (new, old) = (file_names(fresh)?, file_names(committed)?);
    for name in old.difference(&new) {
        println!("removing stale {name}");
        fs::remove_file(committed.join(name))?;
    }
    for name in &new {
        fs::copy(fresh.join(name), committed.join(name))?;
    }
    println!("wrote {} files to {}", new.len(), committed.display());
    Ok(())
}

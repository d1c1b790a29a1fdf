//! The Python virtual environment shared by the tasks that run pinned PyPI packages
//! (`golden`, `ptx`): their common `--check / --venv / --python` options, creating the venv,
//! and installing the `name==version` pins of a requirements file with pip when the
//! installed versions differ.

use anyhow::{bail, ensure, Context, Result};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Options of a venv-backed task.
pub struct Options {
    pub check: bool,
    pub venv: PathBuf,
    pub python: String,
}

/// Parses `[--check] [--venv DIR] [--python PYTHON]`; `default_venv` is relative to `root`,
/// as is a relative `--venv`. `None` when help was printed.
pub fn parse(
    args: &[String],
    root: &Path,
    default_venv: &str,
    usage: &str,
) -> Result<Option<Options>> {
    let mut opts = Options {
        check: false,
        venv: root.join(default_venv),
        python: "python3".into(),
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--check" => opts.check = true,
            "--venv" => opts.venv = it.next().context("--venv needs a directory")?.into(),
            "--python" => opts.python = it.next().context("--python needs a program")?.clone(),
            "-h" | "--help" => {
                println!("{usage}");
                return Ok(None);
            }
            other => bail!("unknown argument `{other}`\n{usage}"),
        }
    }
    if opts.venv.is_relative() {
        opts.venv = root.join(&opts.venv);
    }
    Ok(Some(opts))
}

/// Creates the venv if needed and makes sure it holds the packages pinned in `requirements`
/// (`what` names them in the progress message); returns its interpreter.
pub fn ensure_venv(opts: &Options, requirements: &Path, what: &str) -> Result<PathBuf> {
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
        eprintln!("installing {what} into {}", opts.venv.display());
        let req = requirements.to_str().context("non-UTF-8 path")?;
        run_cmd(Command::new(&python).args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-r",
            req,
        ]))?;
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

/// Runs a command, failing on a non-zero exit.
pub fn run_cmd(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("spawning {cmd:?}"))?;
    ensure!(status.success(), "{cmd:?} failed: {status}");
    Ok(())
}

//! `cargo xtask ptx [--check] [--venv DIR] [--python PYTHON]`
//!
//! Builds the committed PTX of `kernels-cuda` (`kernels-cuda/ptx/`) from
//! `kernels-cuda/cuda/*.cu` with the CUDA 13.0 toolchain pinned in
//! `kernels-cuda/requirements-cuda.txt` (PyPI wheels installed into a virtual environment,
//! default `target/cuda-venv`; no CUDA install and no GPU needed):
//!
//! * every module is compiled by `nvcc -ptx` with the fixed [`NVCC_FLAGS`] for each of
//!   [`TARGETS`]: plain `compute_90` (JIT-compiled by the driver on any GPU of compute
//!   capability 9.0 or later) and the arch-specific `sm_90a` (Hopper) and `sm_100a`
//!   (Blackwell);
//! * each PTX file is assembled with `ptxas -O3 -v` for its architecture to validate it; the
//!   per-kernel register / spill / shared-memory report goes to `ptxas-report.txt`;
//! * `manifest.toml` records the toolkit version, the flags, the SHA-256 of each module's
//!   sources (the `.cu` file and every `cuda/*.cuh` header) and of each PTX file. The
//!   kernels-cuda test suite recomputes the source and PTX hashes, so a `.cu` edit without
//!   `cargo xtask ptx` fails `cargo test`.
//!
//! With `--check`, everything is generated into a temporary directory and compared byte for
//! byte with the committed files; any difference, and any ptxas error, fails. The output is
//! deterministic: nvcc writes no paths or dates into PTX without `-lineinfo`.

use crate::outputs;
use crate::venv;
use anyhow::{bail, ensure, Context, Result};
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const USAGE: &str = "usage: cargo xtask ptx [--check] [--venv DIR] [--python PYTHON]

  --check          regenerate into a temporary directory and fail if the committed PTX,
                   manifest or ptxas report in kernels-cuda/ptx differ (or ptxas rejects any)
  --venv DIR       virtual environment holding the pinned CUDA wheels
                   (default: target/cuda-venv)
  --python PYTHON  interpreter used to create the venv (default: python3)";

/// nvcc flags shared by every module and target. No fast math; `--fmad=false` because the
/// kernels reproduce the CPU reference's step-by-step f32 rounding; `-ftz=false
/// -prec-div=true -prec-sqrt=true` spell out the IEEE defaults.
pub const NVCC_FLAGS: &[&str] = &[
    "-O3",
    "-std=c++17",
    "--fmad=false",
    "-ftz=false",
    "-prec-div=true",
    "-prec-sqrt=true",
];

/// `(file tag, nvcc -arch, ptxas -arch)` of every generated PTX.
pub const TARGETS: &[(&str, &str, &str)] = &[
    ("compute_90", "compute_90", "sm_90"),
    ("sm_90a", "compute_90a", "sm_90a"),
    ("sm_100a", "compute_100a", "sm_100a"),
];

const PTXAS_FLAGS: &[&str] = &["-O3", "-v"];

pub fn run(args: &[String]) -> Result<()> {
    let root = crate::workspace_root();
    let Some(opts) = venv::parse(args, &root, "target/cuda-venv", USAGE)? else {
        return Ok(());
    };
    let crate_dir = root.join("kernels-cuda");
    let requirements = crate_dir.join("requirements-cuda.txt");
    let started = std::time::Instant::now();
    let bin = ensure_toolchain(&opts, &requirements)?;
    eprintln!(
        "toolchain ready in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let result = outputs::in_temp_dir("ptx", |tmp| {
        generate(&bin, &crate_dir, &requirements, tmp)?;
        let committed = crate_dir.join("ptx");
        if opts.check {
            check(tmp, &committed)
        } else {
            outputs::install(generated_names, tmp, &committed)
        }
    });
    eprintln!(
        "cargo xtask ptx took {:.1} s",
        started.elapsed().as_secs_f64()
    );
    result
}

/// Creates the venv and installs the pinned wheels when needed; returns the directory holding
/// `nvcc` and `ptxas`.
fn ensure_toolchain(opts: &venv::Options, requirements: &Path) -> Result<PathBuf> {
    let python = venv::ensure_venv(opts, requirements, "the pinned CUDA wheels")?;
    let out = Command::new(&python)
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ])
        .output()
        .context("asking the venv for its site-packages")?;
    ensure!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bin = PathBuf::from(String::from_utf8(out.stdout)?.trim()).join("nvidia/cu13/bin");
    ensure!(bin.join("nvcc").exists(), "no nvcc in {}", bin.display());
    Ok(bin)
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .fold(String::new(), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// The source digest of a module: SHA-256 over `name \0 len \0 contents` of the `.cu` file
/// followed by every header, sorted by name. `kernels-cuda/tests/ptx_manifest.rs` computes
/// the same digest from the sources it embeds.
fn source_digest(files: &[(String, Vec<u8>)]) -> String {
    let mut h = Sha256::new();
    for (name, data) in files {
        h.update(name.as_bytes());
        h.update([0u8]);
        h.update(data.len().to_string().as_bytes());
        h.update([0u8]);
        h.update(data);
    }
    h.finalize().iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn sorted_files(dir: &Path, ext: &str) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for e in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let name = e?
            .file_name()
            .into_string()
            .map_err(|n| anyhow::anyhow!("{n:?}"))?;
        if name.ends_with(ext) {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// One compile + validation job.
struct Job {
    module: String,
    tag: &'static str,
    arch: &'static str,
    sm: &'static str,
}

/// What a job produced: the PTX bytes and its ptxas resource report.
struct Built {
    ptx: Vec<u8>,
    report: Vec<String>,
}

fn build_one(bin: &Path, cuda_dir: &Path, out: &Path, job: &Job) -> Result<Built> {
    let ptx_path = out.join(format!("{}.{}.ptx", job.module, job.tag));
    let output = Command::new(bin.join("nvcc"))
        .current_dir(cuda_dir)
        .env("PATH", prepend_path(bin))
        .arg("-ptx")
        .arg(format!("-arch={}", job.arch))
        .args(NVCC_FLAGS)
        .arg("-o")
        .arg(&ptx_path)
        .arg(format!("{}.cu", job.module))
        .output()
        .context("spawning nvcc")?;
    ensure!(
        output.status.success(),
        "nvcc failed for {}.cu ({}):\n{}",
        job.module,
        job.arch,
        String::from_utf8_lossy(&output.stderr)
    );
    let cubin = out.join(format!("{}.{}.cubin", job.module, job.tag));
    let output = Command::new(bin.join("ptxas"))
        .arg(format!("-arch={}", job.sm))
        .args(PTXAS_FLAGS)
        .arg(&ptx_path)
        .arg("-o")
        .arg(&cubin)
        .output()
        .context("spawning ptxas")?;
    let log = String::from_utf8_lossy(&output.stderr).into_owned();
    ensure!(
        output.status.success(),
        "ptxas rejected {}.{}.ptx:\n{log}",
        job.module,
        job.tag
    );
    fs::remove_file(&cubin).ok();
    let ptx = fs::read(&ptx_path)?;
    let text = String::from_utf8_lossy(&ptx);
    ensure!(
        text.contains(".version 9.0"),
        "{}.{}.ptx is not PTX ISA 9.0",
        job.module,
        job.tag
    );
    Ok(Built {
        ptx,
        report: parse_ptxas(&log, &format!("{}.{}", job.module, job.tag)),
    })
}

fn prepend_path(bin: &Path) -> std::ffi::OsString {
    let mut p = std::ffi::OsString::from(bin.as_os_str());
    if let Some(old) = std::env::var_os("PATH") {
        p.push(":");
        p.push(old);
    }
    p
}

/// Turns `ptxas -v` output into one line per kernel:
/// `file kernel: N registers, S B stack, X B spill stores, Y B spill loads, M B smem`.
fn parse_ptxas(log: &str, file: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut kernel = String::new();
    let mut frame = String::new();
    for l in log.lines() {
        if let Some(rest) = l.split("Compiling entry function '").nth(1) {
            kernel = rest.split('\'').next().unwrap_or("").to_string();
        } else if l.contains("bytes stack frame") {
            frame = l.trim().to_string();
        } else if let Some(rest) = l.split("Used ").nth(1) {
            let regs = rest.split(' ').next().unwrap_or("?");
            let smem = rest
                .split(", ")
                .find(|p| p.ends_with("bytes smem"))
                .map(|p| p.trim_end_matches(" bytes smem").to_string())
                .unwrap_or_else(|| "0".into());
            let nums: Vec<&str> = frame
                .split(|c: char| !c.is_ascii_digit())
                .filter(|s| !s.is_empty())
                .collect();
            let get = |i: usize| nums.get(i).copied().unwrap_or("?");
            lines.push(format!(
                "{file} {kernel}: {regs} registers, {} B stack, {} B spill stores, {} B spill loads, {smem} B smem",
                get(0),
                get(1),
                get(2)
            ));
        }
    }
    lines.sort();
    lines
}

/// Compiles and validates everything into `out`: the PTX files, `manifest.toml` and
/// `ptxas-report.txt`.
fn generate(bin: &Path, crate_dir: &Path, requirements: &Path, out: &Path) -> Result<()> {
    let cuda_dir = crate_dir.join("cuda");
    let modules: Vec<String> = sorted_files(&cuda_dir, ".cu")?
        .into_iter()
        .map(|n| n.trim_end_matches(".cu").to_string())
        .collect();
    ensure!(
        !modules.is_empty(),
        "no .cu files in {}",
        cuda_dir.display()
    );
    let headers = sorted_files(&cuda_dir, ".cuh")?;

    let version = Command::new(bin.join("nvcc")).arg("--version").output()?;
    let version = String::from_utf8_lossy(&version.stdout);
    let release = version
        .lines()
        .find(|l| l.contains("release"))
        .unwrap_or("?")
        .trim();
    let build = version
        .lines()
        .find(|l| l.starts_with("Build"))
        .unwrap_or("?")
        .trim();

    let jobs: Vec<Job> = modules
        .iter()
        .flat_map(|m| {
            TARGETS.iter().map(move |&(tag, arch, sm)| Job {
                module: m.clone(),
                tag,
                arch,
                sm,
            })
        })
        .collect();
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(8);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<std::sync::Mutex<Option<Result<Built>>>> =
        jobs.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if i >= jobs.len() {
                    break;
                }
                let r = build_one(bin, &cuda_dir, out, &jobs[i]);
                *results[i].lock().expect("job slot") = Some(r);
            });
        }
    });

    let mut manifest = String::new();
    manifest.push_str(
        "# Generated by `cargo xtask ptx`; do not edit. `cargo xtask ptx --check` verifies it.\n",
    );
    let _ = writeln!(manifest, "toolkit = \"{release}; {build}\"");
    let _ = writeln!(
        manifest,
        "requirements_sha256 = \"{}\"",
        sha256_hex(&fs::read(requirements)?)
    );
    let _ = writeln!(manifest, "nvcc_flags = \"-ptx {}\"", NVCC_FLAGS.join(" "));
    let _ = writeln!(manifest, "ptxas_flags = \"{}\"", PTXAS_FLAGS.join(" "));
    let tags: Vec<&str> = TARGETS.iter().map(|t| t.0).collect();
    let _ = writeln!(manifest, "targets = \"{}\"", tags.join(" "));
    let header_list: Vec<(String, Vec<u8>)> = headers
        .iter()
        .map(|h| Ok((h.clone(), fs::read(cuda_dir.join(h))?)))
        .collect::<Result<_>>()?;
    let mut report = vec![
        "# ptxas -O3 -v resources per kernel, from `cargo xtask ptx`; do not edit.".to_string(),
    ];
    let mut failures = Vec::new();
    for (mi, module) in modules.iter().enumerate() {
        let mut files = vec![(
            format!("{module}.cu"),
            fs::read(cuda_dir.join(format!("{module}.cu")))?,
        )];
        files.extend(header_list.iter().cloned());
        let _ = writeln!(manifest, "\n[{module}]");
        let _ = writeln!(manifest, "source_sha256 = \"{}\"", source_digest(&files));
        for (ti, &(tag, _, _)) in TARGETS.iter().enumerate() {
            let slot = results[mi * TARGETS.len() + ti]
                .lock()
                .expect("job slot")
                .take();
            match slot.context("job did not run")? {
                Ok(built) => {
                    let _ = writeln!(manifest, "{tag} = \"{}\"", sha256_hex(&built.ptx));
                    report.extend(built.report);
                }
                Err(e) => failures.push(format!("{e:#}")),
            }
        }
    }
    if !failures.is_empty() {
        bail!(
            "{} PTX build(s) failed:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
    fs::write(out.join("manifest.toml"), manifest)?;
    report.push(String::new());
    fs::write(out.join("ptxas-report.txt"), report.join("\n"))?;
    let spills: Vec<&String> = report
        .iter()
        .filter(|l| l.contains("spill") && !l.contains(" 0 B spill stores, 0 B spill loads"))
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .collect();
    if !spills.is_empty() {
        eprintln!("warning: kernels with register spills:");
        for l in spills {
            eprintln!("  {l}");
        }
    }
    println!(
        "built and validated {} PTX files ({} modules x {} targets) with {release}",
        jobs.len(),
        modules.len(),
        TARGETS.len()
    );
    Ok(())
}

fn generated_names(dir: &Path) -> Result<BTreeSet<String>> {
    let mut names = BTreeSet::new();
    if dir.exists() {
        for e in fs::read_dir(dir)? {
            let e = e?;
            let name = e
                .file_name()
                .into_string()
                .map_err(|n| anyhow::anyhow!("{n:?}"))?;
            if e.file_type()?.is_file()
                && (name.ends_with(".ptx") || name == "manifest.toml" || name == "ptxas-report.txt")
            {
                names.insert(name);
            }
        }
    }
    Ok(names)
}

fn check(fresh: &Path, committed: &Path) -> Result<()> {
    let (problems, count) = outputs::differences(generated_names, fresh, committed, "build")?;
    if !problems.is_empty() {
        bail!(
            "PTX in {} is stale:\n  {}\nrun `cargo xtask ptx` and commit the result",
            committed.display(),
            problems.join("\n  ")
        );
    }
    println!("PTX is up to date and ptxas accepts all of it ({count} files)");
    Ok(())
}

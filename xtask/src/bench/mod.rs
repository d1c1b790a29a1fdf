//! `cargo xtask bench`: measures Nibble the same way every time and gates CI on it.
//!
//! ```text
//! cargo xtask bench [--quick] [--update-baseline] [--update-readme] [--baseline PATH]
//! ```
//!
//! Sources, in order:
//! 1. `bench kernels` (the `bench` crate): quantizers vs memcpy, emulated NVFP4 GEMM vs f32,
//!    AdamW vs an in-place pass, 2-thread vs 1-thread quantizers: same-run ratios, **gated**.
//! 2. `bench steps`: a training step of the default model per recipe (fp32, bf16,
//!    fp8-current, mxfp8, nvfp4), step time over the FP32 step and FP32 thread scaling:
//!    **gated** ratios, plus absolute ms and tokens/s.
//! 3. callgrind instruction counts per element of the quantizer hot loops, where valgrind is
//!    installed: **gated** tightly (deterministic for a given binary).
//! 4. full run only: the criterion benches of every crate (`cargo bench -p fp-formats -p quant
//!    -p optim`), absolute figures, reported.
//! 5. with an NVIDIA driver: `kernels-cuda`'s `gpu_bench`, reported.
//!
//! Writes `target/bench/report.json` and `target/bench/report.md`, compares the gated metrics
//! with `bench/baseline.json` and fails on a regression beyond tolerance. A timing ratio
//! that fails is measured once more first (its whole source, see `confirm`) and the better
//! value is kept, so a burst of load fails the gate only if it strikes twice.
//! `--update-baseline` accepts this run's values instead; `--update-readme` writes the
//! performance section of the top-level README from this run.

mod baseline;
mod collect;
mod confirm;
mod markdown;
mod metric;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::json;

use crate::venv::run_cmd;
use crate::workspace_root;
use baseline::{compare, Baseline, Verdict};
use confirm::Source;
use metric::{Metric, SuiteReport};

struct Options {
    quick: bool,
    update_baseline: bool,
    update_readme: bool,
    baseline: PathBuf,
}

const USAGE: &str =
    "usage: cargo xtask bench [--quick] [--update-baseline] [--update-readme] [--baseline PATH]

  --quick            fewer rounds, no criterion benches (what CI runs; a few minutes on 2 cores)
  --update-baseline  accept this run's gated values into the baseline instead of gating on it
  --update-readme    write the README's performance section from this run
  --baseline PATH    baseline file (default: bench/baseline.json)";

fn parse(args: &[String], root: &Path) -> Result<Option<Options>> {
    let mut o = Options {
        quick: false,
        update_baseline: false,
        update_readme: false,
        baseline: root.join("bench").join("baseline.json"),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => o.quick = true,
            "--update-baseline" => o.update_baseline = true,
            "--update-readme" => o.update_readme = true,
            "--baseline" => {
                o.baseline = PathBuf::from(it.next().context("--baseline needs a path")?)
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(None);
            }
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    Ok(Some(o))
}

fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|p| if p.is_absolute() { p } else { root.join(p) })
        .unwrap_or_else(|| root.join("target"))
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    // xtask itself runs under `cargo run`; let the child cargo pick its own settings.
    c.env_remove("CARGO_PRIMARY_PACKAGE");
    c
}

/// Runs one source of the `bench` binary and reads its metrics.
fn measure(
    bench: &Path,
    out: &Path,
    source: Source,
    rounds: usize,
    scaling_rounds: usize,
) -> Result<Vec<Metric>> {
    let rounds = rounds.to_string();
    let mut cmd = Command::new(bench);
    let json = match source {
        Source::Kernels => {
            cmd.args(["kernels", "--rounds", &rounds]);
            out.join("kernels.json")
        }
        Source::Steps => {
            cmd.args(["steps", "--rounds", &rounds])
                .args(["--scaling-rounds", &scaling_rounds.to_string()]);
            out.join("steps.json")
        }
    };
    run_cmd(cmd.arg("--json").arg(&json))?;
    read_suite(&json)
}

fn read_suite(path: &Path) -> Result<Vec<Metric>> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let r: SuiteReport =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    Ok(r.metrics)
}

/// Entry point of `cargo xtask bench`.
pub fn run(args: &[String]) -> Result<()> {
    let root = workspace_root();
    let Some(opts) = parse(args, &root)? else {
        return Ok(());
    };
    let target = target_dir(&root);
    let out = target.join("bench");
    fs::create_dir_all(&out)?;
    let started = Instant::now();
    let load_start = collect::load_average();
    let mode = if opts.quick { "quick" } else { "full" };
    let (kernel_rounds, step_rounds, scaling_rounds) =
        if opts.quick { (5, 8, 3) } else { (15, 20, 5) };

    println!("== cargo xtask bench ({mode}): building the bench binary");
    run_cmd(
        cargo()
            .current_dir(&root)
            .args(["build", "--release", "-p", "bench"]),
    )?;
    let bench = target.join("release").join("bench");

    let mut metrics = Vec::new();
    let mut skipped: Vec<(String, String)> = Vec::new();

    println!("== kernels: quantizers, GEMM, AdamW ({kernel_rounds} paired rounds)");
    metrics.extend(measure(
        &bench,
        &out,
        Source::Kernels,
        kernel_rounds,
        scaling_rounds,
    )?);

    println!("== training steps per recipe ({step_rounds} interleaved rounds), thread scaling");
    metrics.extend(measure(
        &bench,
        &out,
        Source::Steps,
        step_rounds,
        scaling_rounds,
    )?);

    match collect::valgrind_version() {
        Some(v) => {
            println!("== callgrind instruction counts ({v})");
            metrics.extend(collect::callgrind(&bench, &out)?);
        }
        None => {
            let why = "valgrind is not installed; instruction counts not measured".to_string();
            println!("== callgrind: SKIPPED ({why})");
            skipped.push(("callgrind/".into(), why));
        }
    }

    if opts.quick {
        skipped.push((
            "criterion/".into(),
            "--quick runs no criterion benches".into(),
        ));
    } else {
        println!("== criterion benches of fp-formats, quant, optim");
        let home = out.join("criterion");
        if home.exists() {
            fs::remove_dir_all(&home)?;
        }
        run_cmd(
            cargo()
                .current_dir(&root)
                .env("CRITERION_HOME", &home)
                .args([
                    "bench",
                    "-p",
                    "fp-formats",
                    "-p",
                    "quant",
                    "-p",
                    "optim",
                    "--benches",
                ]),
        )?;
        metrics.extend(collect::criterion(&home)?);
    }

    match collect::gpu_absent() {
        Some(why) => {
            println!("== GPU benches: SKIPPED ({why})");
            skipped.push(("gpu/".into(), why));
        }
        None => {
            println!("== GPU benches (kernels-cuda gpu_bench)");
            let gjson = out.join("gpu.json");
            let _ = fs::remove_file(&gjson);
            run_cmd(
                cargo()
                    .current_dir(&root)
                    .args([
                        "run",
                        "--release",
                        "-p",
                        "kernels-cuda",
                        "--example",
                        "gpu_bench",
                        "--",
                        "--json",
                    ])
                    .arg(&gjson),
            )?;
            if gjson.exists() {
                metrics.extend(collect::gpu(&gjson)?);
            } else {
                skipped.push((
                    "gpu/".into(),
                    "gpu_bench found no usable device (see its SKIP line)".into(),
                ));
            }
        }
    }

    let old = if opts.baseline.exists() {
        let text = fs::read_to_string(&opts.baseline)?;
        Some(
            serde_json::from_str::<Baseline>(&text)
                .with_context(|| format!("parsing {}", opts.baseline.display()))?,
        )
    } else {
        None
    };
    let mut verdicts: Vec<Verdict> = match &old {
        Some(b) => compare(&metrics, b, &skipped),
        None => Vec::new(),
    };
    let (suspects, sources) = confirm::to_confirm(&metrics, &verdicts);
    if let (Some(b), false, false) = (&old, suspects.is_empty(), opts.update_baseline) {
        println!(
            "== confirmation: {} timing ratio(s) failed; measuring their source(s) again: {}",
            suspects.len(),
            suspects.join(", ")
        );
        let mut rerun = Vec::new();
        for s in sources {
            let rounds = match s {
                Source::Kernels => kernel_rounds,
                Source::Steps => step_rounds,
            };
            rerun.extend(measure(&bench, &out, s, rounds, scaling_rounds)?);
        }
        for line in confirm::merge(&mut metrics, &rerun, &suspects) {
            println!("  {line}");
        }
        verdicts = compare(&metrics, b, &skipped);
    }
    let run = markdown::RunInfo {
        mode: mode.into(),
        date: utc_now(),
        git: collect::git_revision(&root),
        machine: collect::machine(),
        load: (load_start, collect::load_average()),
        seconds: started.elapsed().as_secs_f64(),
        baseline: opts
            .baseline
            .strip_prefix(&root)
            .unwrap_or(&opts.baseline)
            .display()
            .to_string(),
        has_baseline: old.is_some(),
    };
    let report = json!({
        "mode": run.mode,
        "date": run.date,
        "git": run.git,
        "machine": run.machine,
        "load_average": {"start": run.load.0, "end": run.load.1},
        "seconds": run.seconds,
        "skipped": skipped.iter().map(|(s, why)| json!({"source": s, "reason": why})).collect::<Vec<_>>(),
        "metrics": metrics,
        "verdicts": verdicts.iter().map(markdown::verdict_json).collect::<Vec<_>>(),
    });
    fs::write(
        out.join("report.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    let md = markdown::report(&run, &metrics, &verdicts, &skipped);
    fs::write(out.join("report.md"), &md)?;
    println!("\n{}", markdown::summary(&verdicts));
    println!(
        "wrote {} and report.md ({:.0} s)",
        out.join("report.json").display(),
        run.seconds
    );

    if opts.update_readme {
        let readme = root.join("README.md");
        let text = fs::read_to_string(&readme)?;
        let section = markdown::readme_section(&run, &metrics, &skipped);
        fs::write(&readme, markdown::splice(&text, &section)?)?;
        println!("updated the performance section of {}", readme.display());
    }
    if opts.update_baseline {
        let b = Baseline::accept(
            &metrics,
            old.as_ref(),
            format!(
                "{} on {} (git {}, {mode} run)",
                run.date, run.machine, run.git
            ),
        );
        fs::write(&opts.baseline, serde_json::to_string_pretty(&b)? + "\n")?;
        println!(
            "accepted {} gated metrics into {}",
            b.metrics.len(),
            opts.baseline.display()
        );
        return Ok(());
    }
    if old.is_none() {
        bail!(
            "no baseline at {}: run `cargo xtask bench --update-baseline` to create one",
            opts.baseline.display()
        );
    }
    let failed: Vec<&Verdict> = verdicts.iter().filter(|v| v.status.fails()).collect();
    if !failed.is_empty() {
        bail!(
            "{} gated metric(s) regressed or went missing: {}\n(see {}; accept a deliberate change with --update-baseline)",
            failed.len(),
            failed.iter().map(|v| v.name.as_str()).collect::<Vec<_>>().join(", "),
            out.join("report.md").display()
        );
    }
    Ok(())
}

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

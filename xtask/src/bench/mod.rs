//! `cargo xtask bench`: measures Nibble the same way every time and gates CI on it.
//!
//! ```text
//! cargo xtask bench [--quick] [--update-baseline [--runs N]] [--update-readme] [--baseline PATH]
//!                   [--inject-slowdown KERNEL=FRACTION]
//! ```
//!
//! Sources, in order:
//! 1. `bench kernels` (the `bench` crate): quantizers on an in-cache tensor vs the compute
//!    probe, emulated NVFP4 GEMM vs f32, AdamW vs an in-place pass, 2-thread vs 1-thread
//!    quantizers: same-run ratios, **gated** against this processor model's profile; the
//!    machine's calibration (memcpy GB/s, probe rate) and quantizers vs memcpy on a large
//!    tensor, reported.
//! 2. `bench steps`: a training step of the default model per recipe (fp32, bf16,
//!    fp8-current, mxfp8, nvfp4), step time over the FP32 step and FP32 thread scaling:
//!    **gated** ratios, plus absolute ms and tokens/s.
//! 3. `bench decode`: the RL sampler's decoding, KV cache over full recomputation and
//!    NVFP4-sampler over BF16-sampler decode time: same-run ratios and tokens/s, reported;
//!    full run only: `bench gemms` (the f32, BF16 and block-scaled GEMMs as fractions of
//!    their instructions' measured peaks and over the f32 GEMM, 1 and 2 threads) and `bench
//!    steps --preset base` (the larger preset's steps over its FP32 step), reported.
//! 4. callgrind instruction counts per element of the quantizer hot loops, where valgrind is
//!    installed: **gated** tightly (deterministic for a given binary).
//! 5. full run only: the criterion benches of every crate (`cargo bench -p fp-formats -p quant
//!    -p optim`), absolute figures, reported.
//! 6. with an NVIDIA driver: `kernels-cuda`'s `gpu_bench`, reported.
//!
//! Writes `target/bench/report.json` and `target/bench/report.md`, compares the gated metrics
//! with `bench/baseline.json` (instruction counts everywhere, timing ratios against the
//! profile of this processor model; see `baseline`) and fails on a regression beyond
//! tolerance. A timing ratio
//! that fails is measured once more first (its whole source, see `confirm`) and the better
//! value is kept, so a burst of load fails the gate only if it strikes twice.
//! `--update-baseline` accepts this run's values instead (with `--runs N`, the timing ratios'
//! medians over N runs and tolerances derived from their spread); `--update-readme` writes the
//! performance section of the top-level README from this run. `--inject-slowdown` makes one
//! kernel slower on purpose, to check that the gate catches it.

mod baseline;
mod collect;
mod confirm;
mod markdown;
mod metric;
#[cfg(test)]
mod simulate;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::json;

use crate::venv::run_cmd;
use crate::workspace_root;
use baseline::{
    compare, derive_tolerances, is_second_core_probe, Baseline, Calibration, Derived, Machine,
    Verdict,
};
use confirm::Source;
use metric::{Metric, SuiteReport};

struct Options {
    quick: bool,
    update_baseline: bool,
    runs: usize,
    update_readme: bool,
    baseline: PathBuf,
    inject: Vec<String>,
}

const USAGE: &str =
    "usage: cargo xtask bench [--quick] [--update-baseline [--runs N]] [--update-readme] [--baseline PATH]
                         [--inject-slowdown KERNEL=FRACTION]

  --quick            fewer rounds, no criterion benches (what CI runs; a few minutes on 2 cores)
  --update-baseline  accept this run's gated values into the baseline instead of gating on it:
                     the instruction counts and this processor model's timing profile
  --runs N           with --update-baseline: measure the timing sources N times (N >= 2) and
                     accept each ratio's median with a tolerance derived from its spread
  --update-readme    write the README's performance section from this run
  --baseline PATH    baseline file (default: bench/baseline.json)
  --inject-slowdown KERNEL=FRACTION
                     make one kernel of `bench kernels` slower on purpose (timing and
                     instruction count), to see the gate fail";

fn parse(args: &[String], root: &Path) -> Result<Option<Options>> {
    let mut o = Options {
        quick: false,
        update_baseline: false,
        runs: 1,
        update_readme: false,
        baseline: root.join("bench").join("baseline.json"),
        inject: Vec::new(),
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
            "--runs" => {
                let n = it.next().context("--runs needs a number")?;
                o.runs = n
                    .parse()
                    .ok()
                    .filter(|n| (2..=20).contains(n))
                    .with_context(|| format!("--runs {n:?}: expected a number from 2 to 20"))?;
            }
            "--inject-slowdown" => o.inject.push(
                it.next()
                    .context("--inject-slowdown needs KERNEL=FRACTION")?
                    .clone(),
            ),
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(None);
            }
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    if o.runs > 1 && !o.update_baseline {
        bail!("--runs derives a baseline's tolerances: it needs --update-baseline");
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
    (rounds, scaling_rounds): (usize, usize),
    inject: &[String],
) -> Result<Vec<Metric>> {
    let rounds = rounds.to_string();
    let mut cmd = Command::new(bench);
    let json = match source {
        Source::Kernels => {
            cmd.args(["kernels", "--rounds", &rounds]);
            for i in inject {
                cmd.args(["--inject-slowdown", i]);
            }
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

/// Rounds of `bench decode` in a quick run.
const DECODE_ROUNDS_QUICK: usize = 3;

/// `bench decode`'s metrics (all reported, never gated).
fn decode(bench: &Path, out: &Path, rounds: usize) -> Result<Vec<Metric>> {
    reported(
        bench,
        &["decode", "--rounds", &rounds.to_string()],
        &out.join("decode.json"),
    )
}

/// Runs a `bench` source whose figures are reported only (`args`, then `--json json`) and
/// reads its metrics; a gated metric there would be a bug in the source, so it is refused.
fn reported(bench: &Path, args: &[&str], json: &Path) -> Result<Vec<Metric>> {
    let mut cmd = Command::new(bench);
    cmd.args(args).arg("--json").arg(json);
    run_cmd(&mut cmd)?;
    let metrics = read_suite(json)?;
    if let Some(m) = metrics.iter().find(|m| m.kind.gated()) {
        bail!(
            "bench {} reported a gated metric ({}); its figures are reported only",
            args.first().copied().unwrap_or_default(),
            m.name
        );
    }
    Ok(metrics)
}

/// Full run only: the GEMMs against their instructions' peaks on 1 and 2 threads (one
/// process each) and the `base` preset's training steps per recipe, all reported.
fn gemms_and_base_steps(bench: &Path, out: &Path) -> Result<Vec<Metric>> {
    let mut metrics = Vec::new();
    for threads in ["1", "2"] {
        println!("== GEMMs vs instruction peaks, {threads} thread(s) (reported)");
        metrics.extend(reported(
            bench,
            &["gemms", "--threads", threads, "--rounds", "5"],
            &out.join(format!("gemms-{threads}t.json")),
        )?);
    }
    println!("== training steps of the `base` preset per recipe (reported)");
    metrics.extend(reported(
        bench,
        &["steps", "--preset", "base", "--rounds", "4"],
        &out.join("steps-base.json"),
    )?);
    Ok(metrics)
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
    let decode_rounds = if opts.quick { DECODE_ROUNDS_QUICK } else { 5 };

    println!("== cargo xtask bench ({mode}): building the bench binary");
    // The same source must give the same machine code wherever it is checked out: the
    // workspace path is remapped (it ends up in line tables and panic messages, and a
    // different path shifts code alignment, which moved in-cache kernel ratios by up to ~20%
    // between a baseline recorded in one clone and CI in another). Its own target folder
    // keeps the flag from invalidating the ordinary release build.
    let bench_target = target.join("bench-build");
    let mut rustflags = std::env::var("RUSTFLAGS").unwrap_or_default();
    rustflags.push_str(&format!(" --remap-path-prefix={}=/nibble", root.display()));
    run_cmd(
        cargo()
            .current_dir(&root)
            .env("RUSTFLAGS", rustflags.trim())
            .args(["build", "--release", "-p", "bench", "--target-dir"])
            .arg(&bench_target),
    )?;
    let bench = bench_target.join("release").join("bench");

    let mut metrics = Vec::new();
    let mut skipped: Vec<(String, String)> = Vec::new();

    let rounds_of = |s: Source| match s {
        Source::Kernels => (kernel_rounds, scaling_rounds),
        Source::Steps => (step_rounds, scaling_rounds),
    };
    if !opts.inject.is_empty() {
        println!(
            "== INJECTED SLOWDOWN (on purpose, to check the gate): {}",
            opts.inject.join(", ")
        );
    }
    println!("== kernels: quantizers, GEMM, AdamW ({kernel_rounds} paired rounds)");
    metrics.extend(measure(
        &bench,
        &out,
        Source::Kernels,
        rounds_of(Source::Kernels),
        &opts.inject,
    )?);

    println!("== training steps per recipe ({step_rounds} interleaved rounds), thread scaling");
    metrics.extend(measure(
        &bench,
        &out,
        Source::Steps,
        rounds_of(Source::Steps),
        &[],
    )?);

    println!(
        "== RL sampler decode: KV cache vs full recomputation, NVFP4 vs BF16 sampler ({decode_rounds} rounds, reported)"
    );
    metrics.extend(decode(&bench, &out, decode_rounds)?);
    if opts.quick {
        skipped.push((
            "quant/gemm_".into(),
            "--quick does not measure the GEMMs against their instructions' peaks".into(),
        ));
        skipped.push((
            "step_base/".into(),
            "--quick does not measure the `base` preset's steps".into(),
        ));
    } else {
        metrics.extend(gemms_and_base_steps(&bench, &out)?);
    }

    // --update-baseline --runs N: the timing sources N - 1 times more, for medians and spreads.
    let mut derived = Derived::new();
    if opts.runs > 1 {
        let mut samples: std::collections::BTreeMap<String, Vec<f64>> = metrics
            .iter()
            .filter(|m| m.kind == metric::Kind::Ratio)
            .map(|m| (m.name.clone(), vec![m.value]))
            .collect();
        // the probes of the host's second core: the worst run decides whether the
        // speed-ups' medians were measured on whole cores
        let mut probes: std::collections::BTreeMap<String, f64> = metrics
            .iter()
            .filter(|m| is_second_core_probe(&m.name))
            .map(|m| (m.name.clone(), m.value))
            .collect();
        for run in 2..=opts.runs {
            println!(
                "== tolerance derivation: timing sources, run {run} of {}",
                opts.runs
            );
            for s in [Source::Kernels, Source::Steps] {
                for m in measure(&bench, &out, s, rounds_of(s), &opts.inject)? {
                    if let Some(v) = samples.get_mut(&m.name) {
                        v.push(m.value);
                    }
                    if let Some(p) = probes.get_mut(&m.name) {
                        *p = p.min(m.value);
                    }
                }
            }
        }
        derived = derive_tolerances(&samples);
        for m in metrics.iter_mut() {
            if let Some(&p) = probes.get(&m.name) {
                m.value = p;
                m.note = format!("{} (the lowest of the {} runs)", m.note, opts.runs);
            }
        }
        for (name, d) in &derived {
            let tol = d.tolerance.map_or("not gated (too noisy)".into(), |t| {
                format!("tolerance {:.0}%", 100.0 * t)
            });
            println!(
                "  {name:<48} median {:.4}, {tol}; values {}",
                d.value,
                samples[name]
                    .iter()
                    .map(|v| format!("{v:.4}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            );
        }
    }

    match collect::valgrind_version() {
        Some(v) => {
            println!("== callgrind instruction counts ({v})");
            metrics.extend(collect::callgrind(&bench, &out, &opts.inject)?);
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
    let machine = this_machine(&metrics);
    let (mut matched, mut verdicts) = match &old {
        Some(b) => {
            let (m, v) = compare(&metrics, b, &machine, &skipped);
            (Some(m), v)
        }
        None => (None, Vec::new()),
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
            rerun.extend(measure(&bench, &out, s, rounds_of(s), &opts.inject)?);
        }
        for line in confirm::merge(&mut metrics, &rerun, &suspects) {
            println!("  {line}");
        }
        let (m, v) = compare(&metrics, b, &machine, &skipped);
        (matched, verdicts) = (Some(m), v);
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
        machine_match: matched.as_ref().map(|m| m.summary.clone()),
        injected: opts.inject.clone(),
    };
    let report = json!({
        "mode": run.mode,
        "date": run.date,
        "git": run.git,
        "machine": run.machine,
        "load_average": {"start": run.load.0, "end": run.load.1},
        "fingerprint": machine.fingerprint,
        "calibration": machine.calibration,
        "machine_match": run.machine_match,
        "injected_slowdown": opts.inject,
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
    if let Some(m) = &run.machine_match {
        println!("\n{m}");
    }
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
        if !opts.inject.is_empty() {
            bail!("refusing to accept a baseline measured with an injected slowdown");
        }
        let runs = if opts.runs > 1 {
            format!(", timing ratios: medians of {} runs", opts.runs)
        } else {
            String::new()
        };
        let b = Baseline::accept(
            &metrics,
            old.as_ref(),
            &machine,
            &derived,
            format!(
                "{} on {} (git {}, {mode} run{runs})",
                run.date, run.machine, run.git
            ),
        );
        fs::write(&opts.baseline, serde_json::to_string_pretty(&b)? + "\n")?;
        let timing = b
            .profile(&machine.fingerprint)
            .map_or(0, |p| p.metrics.len());
        println!(
            "accepted {} instruction counts and {timing} timing ratios ({}) into {}",
            b.portable.metrics.len(),
            machine.fingerprint,
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

/// This run's machine: processor model and logical CPUs, and the calibration the kernel suite
/// measured.
fn this_machine(metrics: &[Metric]) -> Machine {
    let find = |name: &str| metrics.iter().find(|m| m.name == name).map(|m| m.value);
    Machine {
        fingerprint: collect::fingerprint(),
        calibration: find(MEMCPY_GBS).map(|memcpy_gbs| Calibration {
            memcpy_gbs,
            compute_gelem_s: find(COMPUTE_GELEM_S),
        }),
    }
}

/// Name of the memory calibration in the kernel suite's metrics.
const MEMCPY_GBS: &str = "machine/memcpy_gbs";

/// Name of the compute calibration in the kernel suite's metrics.
const COMPUTE_GELEM_S: &str = "machine/compute_probe_gelem_s";

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

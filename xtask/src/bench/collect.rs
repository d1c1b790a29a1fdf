//! Figures from sources other than the `bench` binary's own suites: callgrind instruction
//! counts, criterion's estimates, the GPU bench, and a description of the machine.

use std::fs;
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::baseline::Fingerprint;
use super::metric::{Better, Kind, Metric};

/// `valgrind --version`, or None when valgrind is not installed.
pub fn valgrind_version() -> Option<String> {
    let out = Command::new("valgrind").arg("--version").output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Total instructions (`Ir`) of one run of `bench callgrind ARGS` under callgrind.
fn callgrind_ir(bench: &Path, args: &[&str], scratch: &Path) -> Result<u64> {
    let out_file = scratch.join("callgrind.out");
    let out = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out_file.display()))
        .arg(bench)
        .arg("callgrind")
        .args(args)
        .output()
        .context("running valgrind")?;
    if !out.status.success() {
        bail!(
            "valgrind {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = fs::read_to_string(&out_file)?;
    let total = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("totals:")
                .or_else(|| l.strip_prefix("summary:"))
        })
        .context("no totals line in the callgrind output")?;
    total
        .split_whitespace()
        .next()
        .context("empty totals line")?
        .parse()
        .context("parsing the callgrind total")
}

/// Instructions per element of every callgrind kernel of the `bench` binary: the count of a
/// run that calls the kernel once minus that of a run that only prepares its input.
/// `inject` (`KERNEL=FRACTION`) is passed on: that kernel does that fraction more work.
pub fn callgrind(bench: &Path, scratch: &Path, inject: &[String]) -> Result<Vec<Metric>> {
    let list = Command::new(bench).args(["callgrind", "--list"]).output()?;
    let list = String::from_utf8(list.stdout)?;
    let mut out = Vec::new();
    for line in list.lines() {
        let mut it = line.split_whitespace();
        let (Some(kernel), Some(n)) = (it.next(), it.next()) else {
            continue;
        };
        let n: f64 = n.parse().context("element count")?;
        let mut args = vec!["--kernel", kernel];
        for i in inject {
            args.extend(["--inject-slowdown", i.as_str()]);
        }
        let with = callgrind_ir(bench, &args, scratch)?;
        args.push("--setup-only");
        let without = callgrind_ir(bench, &args, scratch)?;
        let per = with.saturating_sub(without) as f64 / n;
        eprintln!("  callgrind {kernel:<32} {per:8.3} instructions/element");
        out.push(Metric {
            name: format!("callgrind/{kernel}/ir_per_elem"),
            value: per,
            unit: "Ir/elem".into(),
            better: Better::Lower,
            kind: Kind::Instructions,
            basis: None,
            spread: None,
            note: format!(
                "instructions per input element of one call on {n} f32 (callgrind, one thread)"
            ),
        });
    }
    Ok(out)
}

/// Criterion's estimates under `dir` (one `new/benchmark.json` + `new/estimates.json` per
/// benchmark) as reported metrics: median time, and throughput where the bench declares one.
pub fn criterion(dir: &Path) -> Result<Vec<Metric>> {
    let mut found = Vec::new();
    walk(dir, &mut found)?;
    found.sort();
    let mut out = Vec::new();
    for new_dir in found {
        let bench: Value =
            serde_json::from_str(&fs::read_to_string(new_dir.join("benchmark.json"))?)?;
        let est: Value =
            serde_json::from_str(&fs::read_to_string(new_dir.join("estimates.json"))?)?;
        let id = bench["full_id"].as_str().unwrap_or("?").to_string();
        let Some(ns) = est["median"]["point_estimate"].as_f64() else {
            continue;
        };
        out.push(Metric {
            name: format!("criterion/{id}/time"),
            value: ns / 1e6,
            unit: "ms".into(),
            better: Better::Lower,
            kind: Kind::Reported,
            basis: None,
            spread: None,
            note: "criterion median".into(),
        });
        let secs = ns / 1e9;
        if let Some(b) = bench["throughput"]["Bytes"].as_f64() {
            out.push(Metric {
                name: format!("criterion/{id}/gbs"),
                value: b / secs / 1e9,
                unit: "GB/s".into(),
                better: Better::Higher,
                kind: Kind::Reported,
                basis: None,
                spread: None,
                note: "criterion median throughput".into(),
            });
        } else if let Some(e) = bench["throughput"]["Elements"].as_f64() {
            out.push(Metric {
                name: format!("criterion/{id}/gelem_s"),
                value: e / secs / 1e9,
                unit: "G/s".into(),
                better: Better::Higher,
                kind: Kind::Reported,
                basis: None,
                spread: None,
                note: "criterion median throughput (elements, or FLOPs for GEMMs)".into(),
            });
        }
    }
    Ok(out)
}

fn walk(dir: &Path, found: &mut Vec<std::path::PathBuf>) -> Result<()> {
    if !dir.is_dir() {
        return Ok(());
    }
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "new") && path.join("benchmark.json").is_file()
            {
                found.push(path);
            } else if path.file_name().is_none_or(|n| n != "report") {
                walk(&path, found)?;
            }
        }
    }
    Ok(())
}

/// Why the GPU benches cannot run here, or None when an NVIDIA driver is loaded.
pub fn gpu_absent() -> Option<String> {
    if Path::new("/proc/driver/nvidia/version").exists() {
        None
    } else {
        Some("no NVIDIA driver on this machine (/proc/driver/nvidia/version absent)".into())
    }
}

/// The GPU bench's JSON records (a list of objects with a `name` and numeric fields) as
/// reported metrics named `gpu/<name>/<field>`.
pub fn gpu(json: &Path) -> Result<Vec<Metric>> {
    let v: Value = serde_json::from_str(&fs::read_to_string(json)?)?;
    let mut out = Vec::new();
    for rec in v.as_array().context("the GPU bench JSON is not a list")? {
        let name = rec["name"].as_str().unwrap_or("?");
        for (field, val) in rec.as_object().into_iter().flatten() {
            let (unit, better) = match field.as_str() {
                "ms" => ("ms", Better::Lower),
                "gbs" => ("GB/s", Better::Higher),
                "hbm_fraction" => ("of HBM", Better::Higher),
                "tflops" => ("TFLOP/s", Better::Higher),
                _ => continue, // shapes and byte counts describe the case
            };
            let Some(x) = val.as_f64() else { continue };
            out.push(Metric {
                name: format!("gpu/{name}/{field}"),
                value: x,
                unit: unit.into(),
                better,
                kind: Kind::Reported,
                basis: None,
                spread: None,
                note: "kernels-cuda gpu_bench (CUDA-event median)".into(),
            });
        }
    }
    Ok(out)
}

/// The processor's model name (`/proc/cpuinfo`), or the architecture elsewhere.
fn cpu_model() -> String {
    fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|r| r.trim_start_matches([' ', '\t', ':']).trim().to_string())
            })
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// This host's instruction-set class ([`Fingerprint::isa`]), from the CPU flags in
/// `/proc/cpuinfo` (less AMX's under `NIBBLE_NO_AMX`, which leaves the tile unit unused), or
/// `portable` when a variable of `fp_formats::cpu` forces the portable code.
fn isa_class() -> String {
    if fp_formats::cpu::FORCE_PORTABLE_ENV
        .iter()
        .any(|v| std::env::var_os(v).is_some())
    {
        return "portable".into();
    }
    let flags: Vec<String> = fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("flags").map(|r| {
                    r.trim_start_matches([' ', '\t', ':'])
                        .split_whitespace()
                        .map(String::from)
                        .collect()
                })
            })
        })
        .unwrap_or_default();
    let no_amx = std::env::var_os(fp_formats::cpu::NO_AMX_ENV).is_some();
    let flags: Vec<String> = flags
        .into_iter()
        .filter(|f| !(no_amx && f.starts_with("amx_")))
        .collect();
    isa_from_flags(&flags, std::env::consts::ARCH)
}

/// The class for a set of CPU flags: the first of `amx` (AMX-TILE and AMX-BF16),
/// `avx512_bf16`, `avx512` (AVX-512F), `avx2` (AVX2 and FMA) the flags have; `baseline` on
/// x86-64 without them; the architecture's name elsewhere.
fn isa_from_flags(flags: &[String], arch: &str) -> String {
    let has = |f: &str| flags.iter().any(|x| x == f);
    let class = if has("amx_tile") && has("amx_bf16") {
        "amx"
    } else if has("avx512_bf16") {
        "avx512_bf16"
    } else if has("avx512f") {
        "avx512"
    } else if has("avx2") && has("fma") {
        "avx2"
    } else if arch == "x86_64" {
        "baseline"
    } else {
        arch
    };
    class.into()
}

/// Which timing profile of the baseline this machine uses: processor model, logical CPUs and
/// instruction-set class.
pub fn fingerprint() -> Fingerprint {
    Fingerprint {
        cpu: cpu_model(),
        logical_cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        isa: isa_class(),
    }
}

/// A one-line description of the machine: CPU model, logical CPUs, memory, kernel, rustc.
pub fn machine() -> String {
    let Fingerprint {
        cpu,
        logical_cpus: cpus,
        isa,
    } = fingerprint();
    let mem_gib = fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|r| r.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(String::from("? GiB"), |kb| {
            format!("{:.0} GiB", kb / 1048576.0)
        });
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").map_or_else(
        |_| std::env::consts::OS.to_string(),
        |s| format!("Linux {}", s.trim()),
    );
    let rustc = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
        .arg("-V")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    format!("{cpu}, {cpus} logical CPUs ({isa}), {mem_gib} RAM, {kernel}, {rustc}")
}

/// The 1-minute load average, or None off Linux.
pub fn load_average() -> Option<f64> {
    fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `git describe`-like revision of the workspace: short hash plus `-dirty` when the tree has
/// uncommitted changes.
pub fn git_revision(root: &Path) -> String {
    let run = |args: &[&str]| {
        Command::new("git")
            .current_dir(root)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let hash = run(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty =
        run(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    if dirty {
        format!("{hash}-dirty")
    } else {
        hash
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    /// The two "AMD EPYC" hosts seen (Zen 3 without AVX-512, Zen 4 with it) and the Intel
    /// Xeon with AMX get different classes, hence different timing profiles.
    #[test]
    fn isa_class_separates_hosts_that_share_a_model_name() {
        let zen3 = flags("fpu sse2 avx fma avx2 vaes vpclmulqdq");
        let zen4 = flags("fpu sse2 avx fma avx2 avx512f avx512bw avx512_bf16");
        let spr = flags("fpu avx2 fma avx512f avx512_bf16 amx_bf16 amx_tile amx_int8");
        assert_eq!(isa_from_flags(&zen3, "x86_64"), "avx2");
        assert_eq!(isa_from_flags(&zen4, "x86_64"), "avx512_bf16");
        assert_eq!(isa_from_flags(&spr, "x86_64"), "amx");
        assert_eq!(
            isa_from_flags(&flags("fpu avx512f fma avx2"), "x86_64"),
            "avx512"
        );
        assert_eq!(isa_from_flags(&flags("fpu sse2"), "x86_64"), "baseline");
        assert_eq!(isa_from_flags(&[], "aarch64"), "aarch64");
    }

    fn scratch(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("xtask-collect-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn reads_criterion_estimates_and_skips_reports() {
        let root = scratch("criterion");
        let new = root.join("adamw_10M").join("step").join("new");
        fs::create_dir_all(&new).unwrap();
        fs::write(
            new.join("benchmark.json"),
            r#"{"group_id":"adamw_10M","function_id":"step","value_str":null,
                "throughput":{"Bytes":280000000},"full_id":"adamw_10M/step"}"#,
        )
        .unwrap();
        fs::write(
            new.join("estimates.json"),
            r#"{"mean":{"point_estimate":3.0e7},"median":{"point_estimate":2.8e7}}"#,
        )
        .unwrap();
        fs::create_dir_all(root.join("report")).unwrap();
        let m = criterion(&root).unwrap();
        fs::remove_dir_all(&root).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].name, "criterion/adamw_10M/step/time");
        assert!((m[0].value - 28.0).abs() < 1e-9, "median in ms");
        assert_eq!(m[1].name, "criterion/adamw_10M/step/gbs");
        assert!((m[1].value - 10.0).abs() < 1e-9, "280 MB in 28 ms");
    }

    #[test]
    fn reads_gpu_bench_records() {
        let root = scratch("gpu");
        let f = root.join("gpu.json");
        fs::write(
            &f,
            r#"[{"kind":"quantize","name":"nvfp4 rowwise","ms":0.5,"bytes":1000,"gbs":2000.0,"hbm_fraction":0.42},
                {"kind":"gemm","name":"bf16","m":8192,"n":8192,"k":8192,"ms":2.0,"tflops":550.0}]"#,
        )
        .unwrap();
        let m = gpu(&f).unwrap();
        fs::remove_dir_all(&root).unwrap();
        let mut names: Vec<&str> = m.iter().map(|m| m.name.as_str()).collect();
        names.sort();
        assert_eq!(
            names,
            [
                "gpu/bf16/ms",
                "gpu/bf16/tflops",
                "gpu/nvfp4 rowwise/gbs",
                "gpu/nvfp4 rowwise/hbm_fraction",
                "gpu/nvfp4 rowwise/ms",
            ]
        );
        assert!(m.iter().all(|m| m.kind == Kind::Reported));
    }
}

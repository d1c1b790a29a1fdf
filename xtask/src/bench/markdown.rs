//! The human-readable side of a bench run: `target/bench/report.md`, the console summary and
//! the README's performance section.

use std::fmt::Write as _;

use anyhow::{bail, Result};
use serde_json::{json, Value};

use super::baseline::{Status, Verdict};
use super::metric::{Kind, Metric};

/// Facts about the run printed with every table.
pub struct RunInfo {
    /// `quick` or `full`.
    pub mode: String,
    /// UTC start time.
    pub date: String,
    /// Git revision.
    pub git: String,
    /// Machine description.
    pub machine: String,
    /// 1-minute load average at the start and the end.
    pub load: (Option<f64>, Option<f64>),
    /// Wall seconds.
    pub seconds: f64,
    /// Baseline path, relative to the workspace.
    pub baseline: String,
    /// Whether a baseline existed.
    pub has_baseline: bool,
    /// How this machine relates to the baseline's profiles (None without a baseline).
    pub machine_match: Option<String>,
    /// Kernels slowed down on purpose (`KERNEL=FRACTION`).
    pub injected: Vec<String>,
}

fn fmt_load(l: Option<f64>) -> String {
    l.map_or("?".into(), |v| format!("{v:.1}"))
}

fn fmt_value(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 1000.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

fn status_text(s: &Status) -> String {
    match s {
        Status::Ok { change } => format!("ok ({:+.1}%)", 100.0 * change),
        Status::Improved { change } => format!("improved ({:+.1}%)", 100.0 * change),
        Status::Regressed { change } => format!("**REGRESSED** ({:+.1}%)", 100.0 * change),
        Status::New => "new (not in baseline)".into(),
        Status::Missing => "**MISSING**".into(),
        Status::Skipped(why) => format!("skipped: {why}"),
        Status::NotCompared(why) => format!("not compared: {why}"),
    }
}

/// A verdict as JSON for `report.json`.
pub fn verdict_json(v: &Verdict) -> Value {
    let (status, change) = match &v.status {
        Status::Ok { change } => ("ok", Some(*change)),
        Status::Improved { change } => ("improved", Some(*change)),
        Status::Regressed { change } => ("regressed", Some(*change)),
        Status::New => ("new", None),
        Status::Missing => ("missing", None),
        Status::Skipped(_) => ("skipped", None),
        Status::NotCompared(_) => ("not compared", None),
    };
    json!({"name": v.name, "value": v.value, "baseline": v.base, "tolerance": v.tolerance,
           "status": status, "change": change})
}

fn header(run: &RunInfo) -> String {
    format!(
        "{}, git {}, {} (UTC); load average {} at the start, {} at the end; {:.0} s.",
        run.machine,
        run.git,
        run.date,
        fmt_load(run.load.0),
        fmt_load(run.load.1),
        run.seconds
    )
}

/// The full markdown report.
pub fn report(
    run: &RunInfo,
    metrics: &[Metric],
    verdicts: &[Verdict],
    skipped: &[(String, String)],
) -> String {
    let mut s = String::new();
    let flag = if run.mode == "quick" { " --quick" } else { "" };
    let _ = writeln!(s, "# `cargo xtask bench{flag}`\n\n{}\n", header(run));
    if !run.injected.is_empty() {
        let _ = writeln!(
            s,
            "**Slowdown injected on purpose** (to check the gate): {}.\n",
            run.injected.join(", ")
        );
    }
    if !run.has_baseline {
        let _ = writeln!(s, "No baseline at `{}`: nothing was gated.\n", run.baseline);
    }
    if let Some(m) = &run.machine_match {
        let _ = writeln!(s, "{m}\n");
    }
    let _ = writeln!(
        s,
        "## Gated metrics (against `{}`)\n\n| metric | value | spread | baseline | tolerance | verdict |\n|---|---:|---:|---:|---:|---|",
        run.baseline
    );
    for m in metrics.iter().filter(|m| m.kind.gated()) {
        let v = verdicts.iter().find(|v| v.name == m.name);
        let _ = writeln!(
            s,
            "| `{}` | {} {} | {} | {} | {} | {} |",
            m.name,
            fmt_value(m.value),
            m.unit,
            m.spread
                .map_or("-".into(), |x| format!("{:.0}%", 100.0 * x)),
            v.and_then(|v| v.base).map_or("-".into(), fmt_value),
            v.and_then(|v| v.tolerance)
                .map_or("-".into(), |t| format!("{:.0}%", 100.0 * t)),
            v.map_or("-".into(), |v| status_text(&v.status)),
        );
    }
    for v in verdicts.iter().filter(|v| v.value.is_none()) {
        let _ = writeln!(
            s,
            "| `{}` | - | - | {} | - | {} |",
            v.name,
            v.base.map_or("-".into(), fmt_value),
            status_text(&v.status)
        );
    }
    let _ = writeln!(s, "\n## Reported figures (not gated: absolute figures move with the machine's load, ratios across resources with its balance of memory bandwidth to compute)\n\n| metric | value | what |\n|---|---:|---|");
    for m in metrics.iter().filter(|m| m.kind == Kind::Reported) {
        let _ = writeln!(
            s,
            "| `{}` | {} {} | {} |",
            m.name,
            fmt_value(m.value),
            m.unit,
            m.note
        );
    }
    let _ = writeln!(s, "\n## What the gated metrics measure\n");
    for m in metrics.iter().filter(|m| m.kind.gated()) {
        let _ = writeln!(s, "- `{}`: {}", m.name, m.note);
    }
    if !skipped.is_empty() {
        let _ = writeln!(s, "\n## Skipped\n");
        for (src, why) in skipped {
            let _ = writeln!(s, "- `{src}`: {why}");
        }
    }
    s
}

/// A few console lines: counts by verdict and every failing metric.
pub fn summary(verdicts: &[Verdict]) -> String {
    let count = |f: fn(&Status) -> bool| verdicts.iter().filter(|v| f(&v.status)).count();
    let mut s = format!(
        "gate: {} ok, {} improved, {} new, {} skipped, {} not compared, {} regressed, {} missing",
        count(|s| matches!(s, Status::Ok { .. })),
        count(|s| matches!(s, Status::Improved { .. })),
        count(|s| matches!(s, Status::New)),
        count(|s| matches!(s, Status::Skipped(_))),
        count(|s| matches!(s, Status::NotCompared(_))),
        count(|s| matches!(s, Status::Regressed { .. })),
        count(|s| matches!(s, Status::Missing)),
    );
    for v in verdicts
        .iter()
        .filter(|v| v.status.fails() || matches!(v.status, Status::Improved { .. }))
    {
        let _ = write!(
            s,
            "\n  {:<48} {:>10} vs baseline {:>10}  {}",
            v.name,
            v.value.map_or("-".into(), fmt_value),
            v.base.map_or("-".into(), fmt_value),
            status_text(&v.status)
        );
    }
    s
}

const MEMCPY: &str = "machine/memcpy_gbs";
const PROBE: &str = "machine/compute_probe_gelem_s";

const BEGIN: &str = "<!-- bench:begin (generated by `cargo xtask bench --update-readme`) -->";
const END: &str = "<!-- bench:end -->";

fn find(metrics: &[Metric], name: &str) -> Option<f64> {
    metrics.iter().find(|m| m.name == name).map(|m| m.value)
}

/// The README's performance section (between the markers).
pub fn readme_section(run: &RunInfo, metrics: &[Metric], skipped: &[(String, String)]) -> String {
    let mut s = String::new();
    let flag = if run.mode == "quick" { " --quick" } else { "" };
    let _ = writeln!(
        s,
        "Generated by `cargo xtask bench{flag} --update-readme` on {}",
        header(run)
    );
    let _ = writeln!(
        s,
        "\nTraining step of the default model (trainer preset `small`, 2,048 tokens/step, fwd + bwd + AdamW), 2 threads:\n\n| recipe | ms/step | tokens/s | step time / FP32 |\n|---|---:|---:|---:|"
    );
    for r in ["fp32", "bf16", "fp8-current", "mxfp8", "nvfp4"] {
        let (Some(ms), Some(tps)) = (
            find(metrics, &format!("step/{r}/ms")),
            find(metrics, &format!("step/{r}/tokens_per_s")),
        ) else {
            continue;
        };
        let ratio =
            find(metrics, &format!("step/{r}/vs_fp32")).map_or("1".into(), |x| format!("{x:.2}"));
        let _ = writeln!(s, "| {r} | {ms:.1} | {tps:.0} | {ratio} |");
    }
    if let Some(x) = find(metrics, "step/fp32/speedup_2t") {
        let probe =
            |name: &str, f: &dyn Fn(f64) -> String| find(metrics, name).map_or(String::new(), f);
        let _ = writeln!(
            s,
            "\nFP32 step, 2 threads over 1: {x:.2}x (reported: it depends on how soon the host wakes an idle vCPU{}{}).",
            probe("step/fma_probe/speedup_2t", &|v| format!(
                "; register-only FMA work scaled {v:.2}x in the same rounds"
            )),
            probe("step/wake_probe/us", &|v| format!(
                "; a sleeping pool thread took {v:.0} us to wake for a task"
            )),
        );
    }
    base_steps(&mut s, metrics);
    gemms(&mut s, metrics);
    let _ = writeln!(
        s,
        "\nKernels, one thread: speed on an in-cache 256x256 f32 tensor as a multiple of the compute probe's (gated where the machine's profile found it steady between runs), instructions per element from callgrind (gated everywhere), and on a 4096x4096 tensor in GB/s of f32 and as a multiple of a memcpy of it (reported; memcpy {} GB/s, probe {} Gelem/s here):\n\n| kernel | x probe (in cache) | instructions/element | GB/s of f32 | x memcpy |\n|---|---:|---:|---:|---:|",
        find(metrics, MEMCPY).map_or("?".into(), |v| format!("{v:.1}")),
        find(metrics, PROBE).map_or("?".into(), |v| format!("{v:.2}"))
    );
    let dash = |v: Option<f64>, digits: usize| v.map_or("-".into(), |v| format!("{v:.digits$}"));
    for m in metrics
        .iter()
        .filter(|m| m.name.ends_with("/vs_compute_probe"))
    {
        let case = m.name.trim_end_matches("/vs_compute_probe");
        let _ = writeln!(
            s,
            "| `{case}` | {:.3} | {} | {} | {} |",
            m.value,
            dash(find(metrics, &format!("callgrind/{case}/ir_per_elem")), 2),
            dash(find(metrics, &format!("{case}/gbs")), 2),
            dash(find(metrics, &format!("{case}/vs_memcpy")), 3),
        );
    }
    let _ = writeln!(s, "\nOther gated ratios:\n");
    for m in metrics.iter().filter(|m| {
        m.kind == Kind::Ratio
            && !m.name.ends_with("/vs_compute_probe")
            && !m.name.starts_with("step/")
    }) {
        let _ = writeln!(s, "- `{}` = {:.3}: {}", m.name, m.value, m.note);
    }
    for (src, why) in skipped {
        let _ = writeln!(s, "\nNot measured (`{src}`): {why}.");
    }
    s
}

/// The `base` preset's steps (full run only).
fn base_steps(s: &mut String, metrics: &[Metric]) {
    let Some(fp32) = find(metrics, "step_base/fp32/ms") else {
        return;
    };
    let _ = write!(
        s,
        "\nTraining step of the `base` preset (reported), 2 threads, step time / FP32 ({fp32:.0} ms):"
    );
    for r in ["bf16", "fp8-current", "mxfp8", "nvfp4"] {
        if let Some(x) = find(metrics, &format!("step_base/{r}/vs_fp32")) {
            let _ = write!(s, " {r} {x:.2},");
        }
    }
    s.pop();
    s.push_str(".\n");
}

/// The GEMMs on the training shapes against their instructions' peaks (full run only).
fn gemms(s: &mut String, metrics: &[Metric]) {
    let shapes: Vec<&str> = metrics
        .iter()
        .filter_map(|m| m.name.strip_prefix("quant/gemm_f32_"))
        .filter_map(|rest| rest.strip_suffix("/gflops_1t"))
        .collect();
    if shapes.is_empty() {
        return;
    }
    let peak = |unit: &str, t: u32| find(metrics, &format!("machine/peak_{unit}/gflops_{t}t"));
    let has = |case: &str| {
        let prefix = format!("quant/gemm_{case}_");
        metrics.iter().any(|m| m.name.starts_with(&prefix))
    };
    let (pairs, alone) = (has("bf16_pairs"), has("bf16_prepacked"));
    let _ = writeln!(
        s,
        "\nGEMMs on the training shapes (reported), GFLOP/s (fraction of the instruction's peak, the higher of the one measured first and its probe's fastest round beside the GEMMs; fraction of the roofline, the longer of that peak's arithmetic and one pass reading both f32 operands and writing the output), 1 / 2 threads. Peaks: f32 on FP32 FMA; the others on the BF16 unit their GEMM runs on, AMX-BF16 or else `vdpbf16ps` where present, else FP32 FMA. The NVFP4 and MXFP8 GEMMs include quantizing their f32 operands.{} Peaks here: FP32 FMA {} / {}, `vdpbf16ps` {} / {}, AMX-BF16 {} / {} GFLOP/s.\n\n| shape (M x N x K) | f32 | bf16 | nvfp4 | mxfp8 | bf16 over f32 |{}\n|---|---:|---:|---:|---:|---:|{}",
        if alone {
            " `bf16 kernel alone` times the BF16 GEMM's kernel on the same operands packed once (no f32 operand read, rounded or packed; the f32 output still written), its roofline from one pass reading the packed tiles and writing the output."
        } else {
            ""
        },
        dash0(peak("fp32_fma", 1)),
        dash0(peak("fp32_fma", 2)),
        dash0(peak("bf16_dot", 1)),
        dash0(peak("bf16_dot", 2)),
        dash0(peak("amx_bf16", 1)),
        dash0(peak("amx_bf16", 2)),
        if alone { " bf16 kernel alone |" } else { "" },
        if alone { "---:|" } else { "" },
    );
    let cell = |case: &str, shape: &str| gemm_cell(metrics, case, shape);
    for shape in &shapes {
        let x = |t: u32| {
            find(metrics, &format!("quant/gemm_bf16_{shape}/vs_f32_{t}t"))
                .map_or("-".into(), |x| format!("{x:.2}x"))
        };
        let alone_cell = if alone {
            format!(" {} |", cell("bf16_prepacked", shape))
        } else {
            String::new()
        };
        let _ = writeln!(
            s,
            "| `{shape}` | {} | {} | {} | {} | {} / {} |{alone_cell}",
            cell("f32", shape),
            cell("bf16", shape),
            cell("nvfp4", shape),
            cell("mxfp8", shape),
            x(1),
            x(2)
        );
    }
    roofline_shares(s, metrics, &shapes);
    from_codes(s, metrics, &shapes, pairs);
    if !pairs {
        return;
    }
    let _ = writeln!(
        s,
        "\nThe same GEMMs on `vdpbf16ps`, the BF16 unit that CPUs without AMX (a Zen 4) train on, against its peak (same format; the NVFP4 and MXFP8 GEMMs from a child process with `NIBBLE_NO_AMX=1`, which leaves the tile unit unused):\n\n| shape (M x N x K) | bf16 | nvfp4 | mxfp8 |\n|---|---:|---:|---:|"
    );
    for shape in &shapes {
        let _ = writeln!(
            s,
            "| `{shape}` | {} | {} | {} |",
            cell("bf16_pairs", shape),
            cell("nvfp4_pairs", shape),
            cell("mxfp8_pairs", shape),
        );
    }
}

/// One GEMM's cell, 1 / 2 threads: `GFLOP/s (of peak; of roofline)`, as much of it as was
/// measured.
fn gemm_cell(metrics: &[Metric], case: &str, shape: &str) -> String {
    let t = |t: u32| {
        let g = find(metrics, &format!("quant/gemm_{case}_{shape}/gflops_{t}t"));
        let f = find(metrics, &format!("quant/gemm_{case}_{shape}/of_peak_{t}t"));
        let r = find(
            metrics,
            &format!("quant/gemm_{case}_{shape}/of_roofline_{t}t"),
        );
        match (g, f, r) {
            (Some(g), Some(f), Some(r)) => format!("{g:.0} ({f:.2}; {r:.2})"),
            (Some(g), Some(f), None) => format!("{g:.0} ({f:.2})"),
            (Some(g), ..) => format!("{g:.0}"),
            _ => "-".into(),
        }
    };
    format!("{} / {}", t(1), t(2))
}

/// The block-scaled GEMMs on operands quantized beforehand (codes and scales), on the unit
/// training uses and, where timed, on `vdpbf16ps`.
fn from_codes(s: &mut String, metrics: &[Metric], shapes: &[&str], pairs: bool) {
    if !metrics
        .iter()
        .any(|m| m.name.starts_with("quant/gemm_nvfp4_codes_"))
    {
        return;
    }
    let _ = writeln!(
        s,
        "\nThe NVFP4 and MXFP8 GEMMs on the same operands quantized beforehand, as a block-scaled tensor core takes them (codes and scales: `quant::qgemm::quantized_matmul_tn_tensors`, which decodes them into the BF16 unit's tiles and quantizes nothing; the same bits as quantizing in the call), GFLOP/s (fraction of the peak of the unit it runs on), 1 / 2 threads{}:\n\n| shape (M x N x K) | nvfp4 | mxfp8 |{}\n|---|---:|---:|{}",
        if pairs {
            "; on `vdpbf16ps` from the child process without AMX"
        } else {
            ""
        },
        if pairs { " nvfp4 on `vdpbf16ps` | mxfp8 on `vdpbf16ps` |" } else { "" },
        if pairs { "---:|---:|" } else { "" },
    );
    for shape in shapes {
        let mut row = format!(
            "| `{shape}` | {} | {} |",
            gemm_cell(metrics, "nvfp4_codes", shape),
            gemm_cell(metrics, "mxfp8_codes", shape)
        );
        if pairs {
            for case in ["nvfp4_codes_pairs", "mxfp8_codes_pairs"] {
                row.push_str(&format!(" {} |", gemm_cell(metrics, case, shape)));
            }
        }
        let _ = writeln!(s, "{row}");
    }
}

/// The roofline's share of each unit's peak per shape: the most of the peak any GEMM of the
/// shape's f32 operands can reach.
fn roofline_shares(s: &mut String, metrics: &[Metric], shapes: &[&str]) {
    let units: Vec<(&str, &str)> = [
        ("amx_bf16", "AMX-BF16"),
        ("bf16_dot", "`vdpbf16ps`"),
        ("fp32_fma", "FP32 FMA"),
    ]
    .into_iter()
    .filter(|(u, _)| {
        let prefix = format!("quant/roofline_{u}_");
        metrics.iter().any(|m| m.name.starts_with(&prefix))
    })
    .collect();
    if units.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "\nThe most of each unit's peak that any GEMM of these f32 operands can reach, 1 / 2 threads: the time of its arithmetic at the peak over the longer of that and one pass reading both operands and writing the output (the roofline, the pass timed in the same rounds; 1.00 where the arithmetic is the longer):\n\n| shape (M x N x K) |{}\n|---|{}",
        units.iter().map(|(_, n)| format!(" {n} |")).collect::<String>(),
        "---:|".repeat(units.len()),
    );
    for shape in shapes {
        let cell = |u: &str| {
            let t = |t: u32| {
                find(metrics, &format!("quant/roofline_{u}_{shape}/of_peak_{t}t"))
                    .map_or("-".into(), |x| format!("{x:.2}"))
            };
            format!(" {} / {} |", t(1), t(2))
        };
        let _ = writeln!(
            s,
            "| `{shape}` |{}",
            units.iter().map(|(u, _)| cell(u)).collect::<String>()
        );
    }
}

fn dash0(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.0}"))
}

/// Replaces the text between the README markers with `section`.
pub fn splice(readme: &str, section: &str) -> Result<String> {
    let (Some(b), Some(e)) = (readme.find(BEGIN), readme.find(END)) else {
        bail!("the README has no `{BEGIN}` ... `{END}` markers for the performance section");
    };
    if e < b {
        bail!("the README's bench markers are out of order");
    }
    Ok(format!(
        "{}{BEGIN}\n{section}{}",
        &readme[..b],
        &readme[e..]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splice_replaces_only_between_markers() {
        let text = format!("intro\n{BEGIN}\nold\n{END}\noutro\n");
        let out = splice(&text, "new\n").unwrap();
        assert_eq!(out, format!("intro\n{BEGIN}\nnew\n{END}\noutro\n"));
        assert!(splice("no markers", "x").is_err());
    }

    fn reported(name: &str, value: f64) -> Metric {
        Metric {
            name: name.into(),
            value,
            unit: String::new(),
            better: super::super::metric::Better::Higher,
            kind: Kind::Reported,
            basis: None,
            spread: None,
            note: String::new(),
        }
    }

    #[test]
    fn full_run_sections_show_base_steps_and_gemms_against_peaks() {
        let metrics = [
            ("step_base/fp32/ms", 806.0),
            ("step_base/bf16/vs_fp32", 0.58),
            ("step_base/nvfp4/vs_fp32", 0.71),
            ("machine/peak_fp32_fma/gflops_1t", 213.0),
            ("machine/peak_amx_bf16/gflops_2t", 6200.0),
            ("quant/gemm_f32_small_fprop_up/gflops_1t", 130.0),
            ("quant/gemm_f32_small_fprop_up/of_peak_1t", 0.61),
            ("quant/gemm_bf16_small_fprop_up/gflops_2t", 700.0),
            ("quant/gemm_bf16_small_fprop_up/vs_f32_1t", 2.5),
        ]
        .map(|(n, v)| reported(n, v));
        let mut s = String::new();
        base_steps(&mut s, &metrics);
        gemms(&mut s, &metrics);
        assert!(s.contains("FP32 (806 ms): bf16 0.58, nvfp4 0.71."), "{s}");
        assert!(s.contains("FP32 FMA 213 / -"), "{s}");
        assert!(
            s.contains(
                "| `small_fprop_up` | 130 (0.61) / - | - / 700 | - / - | - / - | 2.50x / - |"
            ),
            "{s}"
        );
        assert!(!s.contains("vdpbf16ps`, the BF16 unit"), "{s}");
        // with the kernel alone timed: one more column
        let mut with_alone = metrics.to_vec();
        with_alone.push(reported(
            "quant/gemm_bf16_prepacked_small_fprop_up/gflops_1t",
            450.0,
        ));
        with_alone.push(reported(
            "quant/gemm_bf16_prepacked_small_fprop_up/of_peak_1t",
            0.14,
        ));
        let mut s = String::new();
        gemms(&mut s, &with_alone);
        assert!(
            s.contains(
                "| bf16 over f32 | bf16 kernel alone |\n|---|---:|---:|---:|---:|---:|---:|"
            ),
            "{s}"
        );
        assert!(s.contains("| 2.50x / - | 450 (0.14) / - |"), "{s}");
        // with the `vdpbf16ps` GEMMs timed beside the tiles: a second table
        for (name, v) in [
            ("quant/gemm_bf16_pairs_small_fprop_up/gflops_1t", 101.0),
            ("quant/gemm_bf16_pairs_small_fprop_up/of_peak_1t", 0.83),
            ("quant/gemm_nvfp4_pairs_small_fprop_up/gflops_2t", 150.0),
            ("quant/gemm_mxfp8_pairs_small_fprop_up/gflops_1t", 80.0),
            ("quant/gemm_mxfp8_pairs_small_fprop_up/of_peak_1t", 0.79),
        ] {
            with_alone.push(reported(name, v));
        }
        let mut s = String::new();
        gemms(&mut s, &with_alone);
        assert!(
            s.contains("| shape (M x N x K) | bf16 | nvfp4 | mxfp8 |\n|---|---:|---:|---:|\n| `small_fprop_up` | 101 (0.83) / - | - / 150 | 80 (0.79) / - |"),
            "{s}"
        );
        assert!(!s.contains("quantized beforehand"), "{s}");
        // the GEMMs from codes: a table of their own
        for (name, v) in [
            ("quant/gemm_nvfp4_codes_small_fprop_up/gflops_1t", 900.0),
            ("quant/gemm_nvfp4_codes_small_fprop_up/of_peak_1t", 0.29),
            (
                "quant/gemm_mxfp8_codes_pairs_small_fprop_up/gflops_2t",
                170.0,
            ),
            (
                "quant/gemm_mxfp8_codes_pairs_small_fprop_up/of_peak_2t",
                0.83,
            ),
        ] {
            with_alone.push(reported(name, v));
        }
        let mut s = String::new();
        gemms(&mut s, &with_alone);
        assert!(
            s.contains("| shape (M x N x K) | nvfp4 | mxfp8 | nvfp4 on `vdpbf16ps` | mxfp8 on `vdpbf16ps` |\n|---|---:|---:|---:|---:|\n| `small_fprop_up` | 900 (0.29) / - | - / - | - / - | - / 170 (0.83) |"),
            "{s}"
        );
        // the roofline's shares of the units' peaks: a table of the units measured
        assert!(!s.contains("The most of each unit's peak"), "{s}");
        for (name, v) in [
            ("quant/roofline_amx_bf16_small_fprop_up/of_peak_1t", 0.339),
            ("quant/roofline_amx_bf16_small_fprop_up/of_peak_2t", 0.21),
            ("quant/roofline_bf16_dot_small_fprop_up/of_peak_1t", 1.0),
        ] {
            with_alone.push(reported(name, v));
        }
        let mut s = String::new();
        gemms(&mut s, &with_alone);
        assert!(
            s.contains("| shape (M x N x K) | AMX-BF16 | `vdpbf16ps` |\n|---|---:|---:|\n| `small_fprop_up` | 0.34 / 0.21 | 1.00 / - |"),
            "{s}"
        );
        // a quick run has neither: nothing is written
        let mut empty = String::new();
        base_steps(&mut empty, &[]);
        gemms(&mut empty, &[]);
        assert!(empty.is_empty());
    }
}

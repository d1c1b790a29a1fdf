//! The gate's logic on simulated machines: a baseline recorded on one host must pass on a
//! host of the same processor model with twice the memory bandwidth and a third more compute
//! (the host that failed CI with memcpy-relative gates), and a real 30% slowdown of one kernel
//! must still fail there.
//!
//! Each simulated kernel has a core time per element (at compute 1) and a memory traffic per
//! element; on a tensor far larger than the caches it takes the longer of the two (a
//! roofline), in cache only the core time. The metrics are built with the names, kinds and
//! bases the `bench` binary gives them.

use super::baseline::{compare, Baseline, Calibration, Derived, Fingerprint, Machine, Status};
use super::metric::{Basis, Better, Kind, Metric};

/// A host: memory bandwidth (GB/s) and core speed (relative).
#[derive(Clone, Copy)]
struct Host {
    bandwidth_gbs: f64,
    compute: f64,
}

/// A kernel: core nanoseconds per element at compute 1, bytes moved per element, and
/// instructions per element.
#[derive(Clone, Copy)]
struct Kernel {
    name: &'static str,
    core_ns: f64,
    bytes: f64,
    instructions: f64,
}

/// Kernels shaped like Nibble's: fast encoders near the memory roofline, quantizers well
/// below it (numbers of the order measured on the 2-core machines).
const KERNELS: [Kernel; 5] = [
    Kernel {
        name: "fp-formats/e2m1_encode_packed",
        core_ns: 0.25,
        bytes: 4.5,
        instructions: 2.6,
    },
    Kernel {
        name: "fp-formats/nvfp4_quantize",
        core_ns: 0.53,
        bytes: 4.6,
        instructions: 4.4,
    },
    Kernel {
        name: "quant/nvfp4_row_16x16",
        core_ns: 1.8,
        bytes: 4.6,
        instructions: 16.2,
    },
    Kernel {
        name: "quant/nvfp4_col_rht_sr",
        core_ns: 3.6,
        bytes: 4.6,
        instructions: 30.8,
    },
    Kernel {
        name: "quant/bf16_fake_rne",
        core_ns: 0.32,
        bytes: 8.0,
        instructions: 5.1,
    },
];

/// Core nanoseconds per element of the compute probe at compute 1.
const PROBE_NS: f64 = 0.2;

/// Bytes a memcpy moves per f32 element (read + write).
const MEMCPY_BYTES: f64 = 8.0;

fn ratio(name: String, value: f64, better: Better, kind: Kind, basis: Option<Basis>) -> Metric {
    Metric {
        name,
        value,
        unit: "x".into(),
        better,
        kind,
        basis,
        spread: Some(0.01),
        note: String::new(),
    }
}

/// What `cargo xtask bench` would measure on `host`, with kernel `slow` (if any) slower by
/// `delay` of its time (an injected delay: instructions unchanged) or by `work` (more
/// instructions and time alike), and a deterministic +-3% run-to-run jitter.
fn measure(host: Host, slow: Option<(&str, f64, bool)>, jitter: bool) -> (Vec<Metric>, Machine) {
    let mut out = Vec::new();
    let noise = |i: usize| {
        if jitter {
            1.0 + 0.03 * (i as f64 * 1.7).sin()
        } else {
            1.0
        }
    };
    let memcpy_ns = MEMCPY_BYTES / host.bandwidth_gbs;
    let probe_ns = PROBE_NS / host.compute;
    for (i, k) in KERNELS.iter().enumerate() {
        let (time_factor, ir_factor) = match slow {
            Some((name, f, more_work)) if name == k.name => {
                (1.0 + f, if more_work { 1.0 + f } else { 1.0 })
            }
            _ => (1.0, 1.0),
        };
        let core = time_factor * k.core_ns / host.compute;
        let large = core.max(k.bytes / host.bandwidth_gbs);
        out.push(ratio(
            format!("{}/vs_memcpy", k.name),
            memcpy_ns / large * noise(i),
            Better::Higher,
            Kind::Reported,
            None,
        ));
        out.push(ratio(
            format!("{}/vs_compute_probe", k.name),
            probe_ns / core * noise(i + 7),
            Better::Higher,
            Kind::Ratio,
            Some(Basis::Compute),
        ));
        out.push(ratio(
            format!("callgrind/{}/ir_per_elem", k.name),
            k.instructions * ir_factor,
            Better::Lower,
            Kind::Instructions,
            None,
        ));
    }
    // A training step: GEMMs and quantizers, all core-bound.
    out.push(ratio(
        "step/nvfp4/vs_fp32".into(),
        (100.0 + 14.0) / 100.0 * noise(20),
        Better::Lower,
        Kind::Ratio,
        Some(Basis::Compute),
    ));
    // AdamW against an in-place pass moving the same 28 bytes per parameter: memory-bound on
    // a host with little bandwidth, core-bound on one with much.
    let adamw = (28.0 / host.bandwidth_gbs).max(2.0 / host.compute);
    let inplace = 28.0 / host.bandwidth_gbs;
    out.push(ratio(
        "optim/adamw_10M/vs_inplace".into(),
        inplace / adamw * noise(21),
        Better::Higher,
        Kind::Ratio,
        Some(Basis::Memory),
    ));
    let machine = Machine {
        fingerprint: Fingerprint {
            cpu: "Simulated EPYC".into(),
            logical_cpus: 2,
            isa: "avx2".into(),
        },
        calibration: Some(Calibration {
            memcpy_gbs: host.bandwidth_gbs,
            compute_gelem_s: Some(1.0 / probe_ns),
        }),
    };
    (out, machine)
}

const BASELINE_HOST: Host = Host {
    bandwidth_gbs: 9.4,
    compute: 1.0,
};

/// Twice the memory bandwidth, a third more compute.
const OTHER_HOST: Host = Host {
    bandwidth_gbs: 19.2,
    compute: 1.35,
};

fn baseline() -> Baseline {
    let (m, here) = measure(BASELINE_HOST, None, false);
    Baseline::accept(&m, None, &here, &Derived::new(), "simulated".into())
}

fn failures(metrics: &[Metric], machine: &Machine) -> Vec<String> {
    compare(metrics, &baseline(), machine, &[])
        .1
        .into_iter()
        .filter(|v| v.status.fails())
        .map(|v| v.name)
        .collect()
}

#[test]
fn memcpy_relative_figures_move_by_a_third_on_the_other_host() {
    // The premise: gating on them is what failed CI.
    let (a, _) = measure(BASELINE_HOST, None, false);
    let (b, _) = measure(OTHER_HOST, None, false);
    let get = |ms: &[Metric], n: &str| ms.iter().find(|m| m.name == n).unwrap().value;
    let n = "fp-formats/nvfp4_quantize/vs_memcpy";
    let change = get(&b, n) / get(&a, n) - 1.0;
    assert!(change < -0.3, "{change}");
    // Had they been gated as timing ratios, the other host would have failed.
    let as_gates = |ms: &[Metric]| -> Vec<Metric> {
        let mut ms = ms.to_vec();
        for m in ms.iter_mut().filter(|m| m.name.ends_with("/vs_memcpy")) {
            m.kind = Kind::Ratio;
            m.basis = Some(Basis::Compute);
        }
        ms
    };
    let (_, here) = measure(OTHER_HOST, None, false);
    let old_style = Baseline::accept(&as_gates(&a), None, &here, &Derived::new(), "x".into());
    let (_, v) = compare(&as_gates(&b), &old_style, &here, &[]);
    assert!(v.iter().filter(|v| v.status.fails()).count() >= 3);
}

#[test]
fn a_baseline_from_one_host_passes_on_a_host_with_2x_bandwidth_and_1_35x_compute() {
    let (b, here) = measure(OTHER_HOST, None, true);
    assert_eq!(failures(&b, &here), Vec::<String>::new());
    let (m, v) = compare(&b, &baseline(), &here, &[]);
    assert!(m.profile.is_some());
    assert!((m.memcpy_vs_profile.unwrap() - 19.2 / 9.4).abs() < 1e-9);
    assert!((m.compute_vs_profile.unwrap() - 1.35).abs() < 1e-9);
    // Every core-bound ratio and instruction count was compared, and the memory-bound one
    // was set aside with its reason, because the host's balance moved by half.
    let compared = v
        .iter()
        .filter(|v| matches!(v.status, Status::Ok { .. }))
        .count();
    assert_eq!(compared, 2 * KERNELS.len() + 1);
    let adamw = v
        .iter()
        .find(|v| v.name == "optim/adamw_10M/vs_inplace")
        .unwrap();
    assert!(matches!(adamw.status, Status::NotCompared(_)));
}

#[test]
fn a_30_percent_slowdown_of_one_kernel_still_fails_on_the_other_host() {
    // An injected delay: the same instructions, 30% more time.
    let (b, here) = measure(
        OTHER_HOST,
        Some(("quant/nvfp4_row_16x16", 0.3, false)),
        true,
    );
    assert_eq!(
        failures(&b, &here),
        ["quant/nvfp4_row_16x16/vs_compute_probe"]
    );
    // 30% more work: the timing ratio and the instruction count both fail.
    let (b, here) = measure(
        OTHER_HOST,
        Some(("fp-formats/e2m1_encode_packed", 0.3, true)),
        true,
    );
    let mut f = failures(&b, &here);
    f.sort();
    assert_eq!(
        f,
        [
            "callgrind/fp-formats/e2m1_encode_packed/ir_per_elem",
            "fp-formats/e2m1_encode_packed/vs_compute_probe"
        ]
    );
}

#[test]
fn the_same_host_compares_memory_bound_ratios_too() {
    let (b, here) = measure(BASELINE_HOST, None, true);
    let (m, v) = compare(&b, &baseline(), &here, &[]);
    assert!(m.memory_ratios_compared);
    let adamw = v
        .iter()
        .find(|v| v.name == "optim/adamw_10M/vs_inplace")
        .unwrap();
    assert!(matches!(adamw.status, Status::Ok { .. }));
}

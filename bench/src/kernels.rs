//! In-process kernel suite: the quantizers of `fp-formats` and `quant` against a memcpy of the
//! same f32 tensor, the emulated NVFP4 GEMM against the f32 GEMM, AdamW against an in-place
//! pass over the same bytes, and 2-thread over 1-thread speed-ups; plus the single kernels
//! that `cargo xtask bench` runs under callgrind.
//!
//! Everything but the thread-scaling cases runs on one thread (a one-thread rayon pool, which
//! the f32 GEMM uses too) and is timed on the process CPU clock, so the gated ratios depend
//! little on how busy the machine is; the thread-scaling cases are timed on the wall clock.

use std::hint::black_box;

use anyhow::{bail, Result};
use fp_formats::mx::{self as fmx, MxElement, MxOptions, ScaleRule};
use fp_formats::nvfp4::{self as fnv, Nvfp4Options};
use fp_formats::{E2M1, E4M3};
use optim::{AdamW, AdamWConfig, ParamGroup, ParamSpec};
use quant::gemm::matmul_tn;
use quant::qgemm::{quantized_matmul_tn, Operand};
use quant::{
    BlockShape, Fp8Element, MatRef, OperandQuant, QuantState, Quantizer, Rht, RngKey, RoundingMode,
    Usage,
};

use crate::calibrate;
use crate::harness::{pool, run_against, run_rounds, Case, Clock};
use crate::metric::{Basis, Better, Metric};
use crate::peak;

/// Deterministic normal-ish data (Irwin-Hall of four uniforms, unit variance) from SplitMix64.
pub fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            let s: u32 = (0..4).map(|k| ((z >> (16 * k)) & 0xFFFF) as u32).sum();
            ((s as f32 / 65536.0) - 2.0) * 3.0f32.sqrt()
        })
        .collect()
}

/// The NVFP4 operand configurations of the paper recipe.
struct Nvfp4Configs {
    act: OperandQuant,
    grad: OperandQuant,
    weight: OperandQuant,
}

fn nvfp4_configs() -> Nvfp4Configs {
    let act = OperandQuant::nvfp4();
    Nvfp4Configs {
        act,
        grad: act
            .with_rht(Rht::FixedSigns)
            .with_rounding(RoundingMode::Stochastic),
        weight: act.with_block(BlockShape::Tile16),
    }
}

const KEY: RngKey = RngKey { seed: 1, stream: 2 };

/// The quantizer for `q` and `usage` drawing from [`KEY`] (the suite's settings are valid).
fn qz(q: &OperandQuant, usage: Usage) -> Quantizer {
    Quantizer::new(*q, usage)
        .expect("valid settings")
        .with_key(KEY)
}

/// The `[rows, cols]` view of `x` (the suite's shapes match).
fn mat(x: &[f32], rows: usize, cols: usize) -> MatRef<'_> {
    MatRef::new(x, rows, cols).expect("shape")
}

/// Every quantizer the suite measures, by metric name (`crate/kernel`). One table serves the
/// large-tensor cases, the in-cache cases and the callgrind runs.
pub const KERNELS: &[&str] = &[
    "fp-formats/e2m1_encode_packed",
    "fp-formats/e4m3_encode_rne_sat",
    "fp-formats/nvfp4_quantize",
    "fp-formats/nvfp4_dequantize",
    "fp-formats/mxfp8_e4m3_quantize",
    "fp-formats/mxfp4_quantize",
    "quant/nvfp4_row_1x16",
    "quant/nvfp4_col_rht_sr",
    "quant/nvfp4_row_16x16",
    "quant/nvfp4_fake_col_rht_sr",
    "quant/mxfp8_rowwise",
    "quant/fp8_current",
    "quant/fp8_e5m2_current",
    "quant/bf16_fake_rne",
];

/// An input tensor and every buffer, configuration and one-thread pool the kernels of
/// [`KERNELS`] need, prepared before any of them is timed or counted.
struct Workspace {
    x: Vec<f32>,
    rows: usize,
    cols: usize,
    packed: Vec<u8>,
    bytes: Vec<u8>,
    deq: Vec<f32>,
    fake: Vec<f32>,
    rounded: Vec<f32>,
    nv_fmt: fnv::Nvfp4Matrix,
    nvfp4: Nvfp4Configs,
    pool: rayon::ThreadPool,
}

impl Workspace {
    fn new(rows: usize, cols: usize, seed: u64) -> Result<Workspace> {
        let x = data(rows * cols, seed);
        let nv_fmt = fnv::quantize(&x, rows, cols, Nvfp4Options::default())?;
        Ok(Workspace {
            packed: vec![0; x.len() / 2],
            bytes: vec![0; x.len()],
            deq: vec![0.0; x.len()],
            fake: vec![0.0; x.len()],
            rounded: vec![0.0; x.len()],
            nv_fmt,
            nvfp4: nvfp4_configs(),
            pool: pool(1)?,
            x,
            rows,
            cols,
        })
    }

    /// A case per kernel of [`KERNELS`], in that order, each running its kernel `reps` times
    /// per call and made slower on purpose where `inject` names it ([`Case::slowed`]).
    fn cases(&mut self, reps: usize, inject: &[(String, f64)]) -> Vec<Case<'_>> {
        let Workspace {
            x,
            rows,
            cols,
            packed,
            bytes,
            deq,
            fake,
            rounded,
            nv_fmt,
            nvfp4: c,
            pool: p1,
        } = self;
        let (x, rows, cols, p1, c) = (&x[..], *rows, *cols, &*p1, &*c);
        let nv_fmt = &*nv_fmt;
        let mx8 = MxOptions::new(MxElement::E4M3, ScaleRule::Rceil);
        let mx4 = MxOptions::new(MxElement::E2M1, ScaleRule::Rceil);
        let mxq = OperandQuant::mx(MxElement::E4M3, ScaleRule::Rceil);
        let fp8q = OperandQuant::fp8_current(Fp8Element::E4M3);
        let e5m2q = OperandQuant::fp8_current(Fp8Element::E5M2);
        let bf16q = quant::GemmPolicy::BF16.fprop.a;
        // Quantizers of `quant` run on a one-thread pool (they parallelise with rayon).
        let kernels: Vec<Box<dyn FnMut() + Send + '_>> = vec![
            Box::new(move || E2M1::encode_slice_packed(black_box(x), packed)),
            Box::new(move || E4M3::encode_slice_rne_sat(black_box(x), bytes)),
            Box::new(move || {
                black_box(
                    fnv::quantize(black_box(x), rows, cols, Nvfp4Options::default()).unwrap(),
                );
            }),
            Box::new(move || nv_fmt.dequantize_into(deq)),
            Box::new(move || {
                black_box(fmx::quantize(black_box(x), rows, cols, mx8).unwrap());
            }),
            Box::new(move || {
                black_box(fmx::quantize(black_box(x), rows, cols, mx4).unwrap());
            }),
            Box::new(move || {
                p1.install(|| {
                    black_box(
                        qz(&c.act, Usage::Rowwise)
                            .quantize(mat(x, rows, cols), &mut QuantState::new())
                            .unwrap(),
                    );
                })
            }),
            Box::new(move || {
                p1.install(|| {
                    black_box(
                        qz(&c.grad, Usage::Columnwise)
                            .quantize(mat(x, rows, cols), &mut QuantState::new())
                            .unwrap(),
                    );
                })
            }),
            Box::new(move || {
                p1.install(|| {
                    black_box(
                        qz(&c.weight, Usage::Rowwise)
                            .quantize(mat(x, rows, cols), &mut QuantState::new())
                            .unwrap(),
                    );
                })
            }),
            Box::new(move || {
                p1.install(|| {
                    qz(&c.grad, Usage::Columnwise)
                        .fake_quantize_into(mat(x, rows, cols), &mut QuantState::new(), fake)
                        .unwrap();
                })
            }),
            Box::new(move || {
                p1.install(|| {
                    black_box(
                        qz(&mxq, Usage::Rowwise)
                            .quantize(mat(x, rows, cols), &mut QuantState::new())
                            .unwrap(),
                    );
                })
            }),
            Box::new(move || {
                p1.install(|| {
                    let mut st = QuantState::new();
                    black_box(
                        qz(&fp8q, Usage::Rowwise)
                            .quantize(mat(x, rows, cols), &mut st)
                            .unwrap(),
                    );
                })
            }),
            Box::new(move || {
                p1.install(|| {
                    let mut st = QuantState::new();
                    black_box(
                        qz(&e5m2q, Usage::Rowwise)
                            .quantize(mat(x, rows, cols), &mut st)
                            .unwrap(),
                    );
                })
            }),
            Box::new(move || {
                p1.install(|| {
                    qz(&bf16q, Usage::Rowwise)
                        .fake_quantize_into(mat(x, rows, cols), &mut QuantState::new(), rounded)
                        .unwrap();
                })
            }),
        ];
        assert_eq!(kernels.len(), KERNELS.len(), "one closure per kernel name");
        KERNELS
            .iter()
            .zip(kernels)
            .map(|(&name, mut one)| {
                // Repetitions run inside the pool (nested installs then run inline), so the
                // hand-over to its worker thread is paid once per timed call, not per
                // kernel; a single call runs as a user would call it.
                let case = if reps == 1 {
                    Case::new(name, one)
                } else {
                    Case::new(name, move || {
                        p1.install(|| {
                            for _ in 0..reps {
                                one();
                            }
                        })
                    })
                };
                match inject.iter().find(|(n, _)| n == name) {
                    Some(&(_, fraction)) => case.slowed(fraction),
                    None => case,
                }
            })
            .collect()
    }
}

/// The quantizers on a `rows x cols` f32 tensor far larger than the caches, each as a multiple
/// of a memcpy of the same tensor run just before it, one thread. **Reported, not gated**: the
/// kernels are bound by the core and the memcpy by memory bandwidth, so the ratio moves with
/// the machine's balance of the two (a host with twice the bandwidth and a third more compute
/// makes every kernel look ~1.5x slower).
fn quantizers_vs_memcpy(
    rounds: usize,
    rows: usize,
    cols: usize,
    inject: &[(String, f64)],
    out: &mut Vec<Metric>,
) -> Result<()> {
    let mut ws = Workspace::new(rows, cols, 0x5EED)?;
    let bytes = (rows * cols * 4) as f64;
    let x = ws.x.clone();
    let mut copy = vec![0.0f32; x.len()];
    let mut memcpy = Case::new("memcpy", || copy.copy_from_slice(black_box(&x)));
    let mut cases = ws.cases(1, inject);
    let r = run_against(&mut memcpy, &mut cases, rounds, 2, Clock::ProcessCpu);
    drop((cases, memcpy));
    let memcpy_gbs = bytes / r.reference_median_secs() / 1e9;
    out.push(Metric::absolute(
        MEMCPY_GBS.into(),
        memcpy_gbs,
        "GB/s",
        Better::Higher,
        format!("machine calibration (memory): copy_from_slice of a {rows}x{cols} f32 tensor, one thread"),
    ));
    for &name in r.names() {
        out.push(Metric::reported_ratio(
            format!("{name}/vs_memcpy"),
            r.speed_vs_reference(name),
            Better::Higher,
            format!(
                "speed relative to a memcpy of the same {rows}x{cols} f32 tensor (time of a memcpy run just before / time of kernel), one thread, CPU clock; not gated: kernel and memcpy are bound by different resources"
            ),
        ));
        out.push(Metric::absolute(
            format!("{name}/gbs"),
            bytes / r.median_secs(name) / 1e9,
            "GB/s",
            Better::Higher,
            "f32 bytes per second (median round)".into(),
        ));
    }
    Ok(())
}

/// Side of the square tensor of the in-cache cases: 256 KiB of f32, which with any kernel's
/// output stays in a 1 MiB L2.
pub const IN_CACHE_SIDE: usize = 256;

/// Kernel calls per timed call of an in-cache case (each call is 10-700 us).
const IN_CACHE_REPS: usize = 16;

/// The quantizers on an in-cache tensor, each against the frozen compute probe run just
/// before it (both bound by the core): **gated**. Also records the probe's rate, the
/// machine's compute calibration.
fn quantizers_vs_compute(
    rounds: usize,
    inject: &[(String, f64)],
    out: &mut Vec<Metric>,
) -> Result<()> {
    let side = IN_CACHE_SIDE;
    let mut ws = Workspace::new(side, side, 0xCAC4E)?;
    let x = ws.x.clone();
    let mut probe_out = vec![0u8; x.len()];
    let mut probe = Case::new("probe", || {
        for _ in 0..IN_CACHE_REPS {
            calibrate::compute_probe(black_box(&x), &mut probe_out);
        }
    });
    let mut cases = ws.cases(IN_CACHE_REPS, inject);
    let r = run_against(&mut probe, &mut cases, rounds, 2, Clock::ProcessCpu);
    drop((cases, probe));
    let elems = (side * side * IN_CACHE_REPS) as f64;
    out.push(Metric::absolute(
        COMPUTE_GELEM_S.into(),
        elems / r.reference_median_secs() / 1e9,
        "Gelem/s",
        Better::Higher,
        format!("machine calibration (compute): the frozen compute probe on an in-cache {side}x{side} f32 tensor, one thread"),
    ));
    for &name in r.names() {
        out.push(Metric::ratio(
            format!("{name}/vs_compute_probe"),
            r.speed_vs_reference(name),
            Basis::Compute,
            Better::Higher,
            format!(
                "speed relative to the compute probe on the same in-cache {side}x{side} f32 tensor (time of a probe run just before / time of kernel), one thread, CPU clock"
            ),
        ));
    }
    Ok(())
}

/// 2-thread over 1-thread speed-up of the two NVFP4 quantizers the step runs most.
fn thread_scaling(rounds: usize, rows: usize, cols: usize, out: &mut Vec<Metric>) -> Result<()> {
    let (p1, p2) = (pool(1)?, pool(2)?);
    let x = data(rows * cols, 0x7EAD);
    let c = nvfp4_configs();
    let row = |p: &rayon::ThreadPool| {
        p.install(|| {
            black_box(
                qz(&c.act, Usage::Rowwise)
                    .quantize(mat(&x, rows, cols), &mut QuantState::new())
                    .unwrap(),
            );
        })
    };
    let col = |p: &rayon::ThreadPool| {
        p.install(|| {
            black_box(
                qz(&c.grad, Usage::Columnwise)
                    .quantize(mat(&x, rows, cols), &mut QuantState::new())
                    .unwrap(),
            );
        })
    };
    // the host's second core, timed in the same rounds (two units of about 5 ms each)
    let iters = peak::scaling_iters(0.005)?;
    let mut cases = [
        Case::new("row_1t", || row(&p1)),
        Case::new("row_2t", || row(&p2)),
        Case::new("col_1t", || col(&p1)),
        Case::new("col_2t", || col(&p2)),
        Case::new("probe_1t", || peak::scaling_work(&p1, 2, iters)),
        Case::new("probe_2t", || peak::scaling_work(&p2, 2, iters)),
    ];
    let r = run_rounds(&mut cases, rounds, 2, Clock::Wall);
    for (name, one, two) in [
        ("nvfp4_row_1x16", "row_1t", "row_2t"),
        ("nvfp4_col_rht_sr", "col_1t", "col_2t"),
    ] {
        out.push(Metric::ratio(
            format!("quant/{name}/speedup_2t"),
            r.ratio(one, two),
            Basis::Cores,
            Better::Higher,
            format!("time on a 1-thread pool / time on a 2-thread pool, {rows}x{cols}"),
        ));
    }
    out.push(Metric::reported_ratio(
        peak::scaling_probe_metric("quant"),
        r.ratio("probe_1t", "probe_2t"),
        Better::Higher,
        "the host's second core in these rounds: register-only FMA work on a 1-thread pool / the same work on a 2-thread pool (~2.0 on two whole cores)".into(),
    ));
    Ok(())
}

/// The NVFP4 GEMM (X 1x16, W 16x16, `quantized_matmul_tn`) over the f32 GEMM, one thread.
/// Each round keeps the faster of three calls of each side: where the NVFP4 side is mostly
/// its quantizers reading 12 MB of f32 (the AMX host), one call per round left the ratio
/// spread over 0.30-0.39 between quick runs on an idle host (a gate at 15% failed about
/// one run in six); the best of three read 0.27-0.28.
fn gemm(rounds: usize, out: &mut Vec<Metric>) -> Result<()> {
    let (m, n, k) = (2048usize, 1024usize, 1024usize);
    let p1 = pool(1)?;
    let x = data(m * k, 11);
    let w = data(n * k, 12);
    let c = nvfp4_configs();
    let (mut o1, mut o2) = (vec![0.0f32; m * n], vec![0.0f32; m * n]);
    let mut cases = [
        Case::new("f32", || {
            p1.install(|| matmul_tn(&x, &w, m, n, k, black_box(&mut o1)))
        }),
        Case::new("nvfp4", || {
            p1.install(|| {
                quantized_matmul_tn(
                    Operand::new(mat(&x, m, k), qz(&c.act, Usage::Rowwise)),
                    Operand::new(mat(&w, n, k), qz(&c.weight, Usage::Rowwise)),
                    black_box(&mut o2),
                )
                .unwrap()
            })
        }),
    ];
    let r = run_rounds(&mut cases, rounds, 3, Clock::ProcessCpu);
    out.push(Metric::ratio(
        "quant/nvfp4_emulated_gemm/vs_f32".into(),
        r.ratio("nvfp4", "f32"),
        Basis::Compute,
        Better::Lower,
        format!("time of the NVFP4 GEMM (quantize X 1x16 + W 16x16, then the GEMM this CPU runs for them: E2M1 block, BF16 unit or f32) / f32 GEMM, {m}x{n}x{k}, one thread"),
    ));
    let flops = 2.0 * (m * n * k) as f64;
    out.push(Metric::absolute(
        "quant/f32_gemm/gflops".into(),
        flops / r.median_secs("f32") / 1e9,
        "GFLOP/s",
        Better::Higher,
        format!("matrixmultiply sgemm {m}x{n}x{k}, one thread"),
    ));
    Ok(())
}

/// AdamW on 10M parameters over an in-place pass touching the same bytes, one thread.
fn adamw(rounds: usize, out: &mut Vec<Metric>) -> Result<()> {
    const N: usize = 10_000_000;
    let lens = [6_000_000, 2_500_000, 1_496_000, 4_000];
    let specs: Vec<ParamSpec> = lens
        .iter()
        .enumerate()
        .map(|(i, &n)| ParamSpec::new(n, usize::from(i == 3)))
        .collect();
    let groups = [ParamGroup::new(0.1, 1.0), ParamGroup::no_decay()];
    let mut opt = AdamW::with_groups(AdamWConfig::default(), &groups, &specs)?;
    opt.set_parallel_threshold(usize::MAX);
    let mut params: Vec<Vec<f32>> = lens.iter().map(|&n| data(n, n as u64)).collect();
    let grads: Vec<Vec<f32>> = lens.iter().map(|&n| data(n, !(n as u64))).collect();
    let grad_refs: Vec<&[f32]> = grads.iter().map(|g| &g[..]).collect();
    // AdamW moves 28 bytes per parameter (parameter read + write, gradient read, both
    // moments read + write); an in-place multiply over 3.5 f32 per parameter moves the same.
    let mut rmw = vec![1.0f32; N * 7 / 2];
    let mut cases = [
        Case::new("adamw", || {
            let mut refs: Vec<&mut [f32]> = params.iter_mut().map(|p| &mut p[..]).collect();
            opt.step(&mut refs, &grad_refs, 1e-6).unwrap();
        }),
        Case::new("rmw", || {
            let a = black_box(1.000_001f32);
            rmw.iter_mut().for_each(|v| *v *= a);
        }),
    ];
    let r = run_rounds(&mut cases, rounds, 1, Clock::ProcessCpu);
    out.push(Metric::ratio(
        "optim/adamw_10M/vs_inplace".into(),
        r.ratio("rmw", "adamw"),
        Basis::Memory,
        Better::Higher,
        "speed relative to an in-place multiply moving the same 28 bytes per parameter (time of pass / time of step), one thread".into(),
    ));
    out.push(Metric::absolute(
        "optim/adamw_10M/ms".into(),
        1e3 * r.median_secs("adamw"),
        "ms",
        Better::Lower,
        "one AdamW step over 10M parameters, one thread".into(),
    ));
    Ok(())
}

/// Name of the memory calibration (GB/s of a one-thread memcpy far larger than the caches).
pub const MEMCPY_GBS: &str = "machine/memcpy_gbs";

/// Name of the compute calibration (elements per second of the frozen compute probe).
pub const COMPUTE_GELEM_S: &str = "machine/compute_probe_gelem_s";

/// The whole in-process suite. `inject` names kernels of [`KERNELS`] to slow down on purpose
/// by a fraction (to show that the gate catches it).
pub fn suite(rounds: usize, inject: &[(String, f64)]) -> Result<Vec<Metric>> {
    if let Some((name, _)) = inject.iter().find(|(n, _)| !KERNELS.contains(&n.as_str())) {
        bail!(
            "cannot slow down {name:?}: not a kernel; known: {}",
            KERNELS.join(", ")
        );
    }
    let mut out = Vec::new();
    quantizers_vs_compute(rounds.max(5), inject, &mut out)?;
    quantizers_vs_memcpy(rounds, 4096, 4096, inject, &mut out)?;
    thread_scaling(rounds, 4096, 4096, &mut out)?;
    gemm(rounds, &mut out)?;
    adamw(rounds, &mut out)?;
    Ok(out)
}

/// Side of the square input the callgrind kernels run on.
pub const CALLGRIND_SIDE: usize = 512;

/// Prepares the input, then runs `kernel` once unless `setup_only`: the difference of the two
/// runs' instruction counts is the kernel's. `inject` (a fraction) adds that fraction of the
/// kernel's work again, on the first rows, as an instruction-count slowdown.
pub fn callgrind_kernel(kernel: &str, setup_only: bool, inject: Option<f64>) -> Result<()> {
    let Some(index) = KERNELS.iter().position(|k| *k == kernel) else {
        bail!("unknown kernel {kernel:?}; known: {}", KERNELS.join(", "));
    };
    let side = CALLGRIND_SIDE;
    let mut ws = Workspace::new(side, side, 0xCA11)?;
    // The pool's worker thread exists in both runs, so its start-up cost cancels.
    ws.pool.install(|| black_box(()));
    let mut extra = match inject {
        // Whole 16-row bands, so every kernel's block shape divides it.
        Some(f) if f > 0.0 => {
            let rows = ((side as f64 * f) as usize).div_ceil(16) * 16;
            Some(Workspace::new(rows, side, 0xCA11)?)
        }
        _ => None,
    };
    // The cases are built in both runs, so building them cancels too.
    let mut cases = ws.cases(1, &[]);
    let mut more = extra.as_mut().map(|e| e.cases(1, &[]));
    if setup_only {
        return Ok(());
    }
    cases[index].call();
    if let Some(more) = more.as_mut() {
        more[index].call();
    }
    Ok(())
}

//! In-process kernel suite: the quantizers of `fp-formats` and `quant` against a memcpy of the
//! same f32 tensor, the emulated NVFP4 GEMM against the f32 GEMM, AdamW against an in-place
//! pass over the same bytes, and 2-thread over 1-thread speed-ups; plus the single kernels
//! that `cargo xtask bench` runs under callgrind.
//!
//! Everything but the thread-scaling cases runs on one thread (a one-thread rayon pool and
//! `MATMUL_NUM_THREADS=1`) and is timed on the process CPU clock, so the gated ratios depend
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
    bf16, fp8, mx, nvfp4, BlockShape, Fp8Element, OperandQuant, QuantState, Rht, RngKey,
    RoundingMode, Usage,
};

use crate::harness::{run_against, run_rounds, Case, Clock};
use crate::metric::{Better, Metric};

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

fn pool(threads: usize) -> Result<rayon::ThreadPool> {
    Ok(rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?)
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

/// Quantizers vs memcpy on a `rows x cols` f32 tensor, one thread.
fn quantizers(rounds: usize, rows: usize, cols: usize, out: &mut Vec<Metric>) -> Result<()> {
    let p1 = pool(1)?;
    let x = data(rows * cols, 0x5EED);
    let bytes = (rows * cols * 4) as f64;
    let mut copy = vec![0.0f32; x.len()];
    let mut packed = vec![0u8; x.len() / 2];
    let mut e4m3 = vec![0u8; x.len()];
    let mut deq = vec![0.0f32; x.len()];
    let nv_fmt = fnv::quantize(&x, rows, cols, Nvfp4Options::default())?;
    let mx_opts = MxOptions::new(MxElement::E4M3, ScaleRule::Rceil);
    let mx4_opts = MxOptions::new(MxElement::E2M1, ScaleRule::Rceil);
    let c = nvfp4_configs();
    let mxq = OperandQuant::mx(MxElement::E4M3, ScaleRule::Rceil);
    let fp8q = OperandQuant::fp8_current(Fp8Element::E4M3);
    let e5m2q = OperandQuant::fp8_current(Fp8Element::E5M2);
    let bf16q = quant::GemmPolicy::BF16.fprop.a;
    let mut fake = vec![0.0f32; x.len()];
    let mut rounded = vec![0.0f32; x.len()];

    // Case names are `crate/kernel`; they become the metric names.
    let mut memcpy = Case::new("memcpy", || copy.copy_from_slice(black_box(&x)));
    let mut cases = vec![
        Case::new("fp-formats/e2m1_encode_packed", || {
            E2M1::encode_slice_packed(black_box(&x), &mut packed)
        }),
        Case::new("fp-formats/e4m3_encode_rne_sat", || {
            E4M3::encode_slice_rne_sat(black_box(&x), &mut e4m3)
        }),
        Case::new("fp-formats/nvfp4_quantize", || {
            black_box(fnv::quantize(black_box(&x), rows, cols, Nvfp4Options::default()).unwrap());
        }),
        Case::new("fp-formats/nvfp4_dequantize", || {
            nv_fmt.dequantize_into(&mut deq)
        }),
        Case::new("fp-formats/mxfp8_e4m3_quantize", || {
            black_box(fmx::quantize(black_box(&x), rows, cols, mx_opts).unwrap());
        }),
        Case::new("fp-formats/mxfp4_quantize", || {
            black_box(fmx::quantize(black_box(&x), rows, cols, mx4_opts).unwrap());
        }),
        Case::new("quant/nvfp4_row_1x16", || {
            p1.install(|| {
                black_box(nvfp4::quantize(&x, rows, cols, Usage::Rowwise, &c.act, KEY).unwrap());
            })
        }),
        Case::new("quant/nvfp4_col_rht_sr", || {
            p1.install(|| {
                black_box(
                    nvfp4::quantize(&x, rows, cols, Usage::Columnwise, &c.grad, KEY).unwrap(),
                );
            })
        }),
        Case::new("quant/nvfp4_row_16x16", || {
            p1.install(|| {
                black_box(nvfp4::quantize(&x, rows, cols, Usage::Rowwise, &c.weight, KEY).unwrap());
            })
        }),
        Case::new("quant/nvfp4_fake_col_rht_sr", || {
            p1.install(|| {
                nvfp4::fake_quantize_into(
                    &x,
                    rows,
                    cols,
                    Usage::Columnwise,
                    &c.grad,
                    KEY,
                    &mut fake,
                )
                .unwrap();
            })
        }),
        Case::new("quant/mxfp8_rowwise", || {
            p1.install(|| {
                black_box(mx::quantize(&x, rows, cols, Usage::Rowwise, &mxq, KEY).unwrap());
            })
        }),
        Case::new("quant/fp8_current", || {
            p1.install(|| {
                let mut st = QuantState::new();
                black_box(
                    fp8::quantize(&x, rows, cols, Usage::Rowwise, &fp8q, KEY, &mut st).unwrap(),
                );
            })
        }),
        Case::new("quant/fp8_e5m2_current", || {
            p1.install(|| {
                let mut st = QuantState::new();
                black_box(
                    fp8::quantize(&x, rows, cols, Usage::Rowwise, &e5m2q, KEY, &mut st).unwrap(),
                );
            })
        }),
        Case::new("quant/bf16_fake_rne", || {
            p1.install(|| {
                bf16::fake_quantize_into(&x, rows, cols, Usage::Rowwise, &bf16q, KEY, &mut rounded)
                    .unwrap();
            })
        }),
    ];
    let r = run_against(&mut memcpy, &mut cases, rounds, 2, Clock::ProcessCpu);
    drop((cases, memcpy));
    let memcpy_gbs = bytes / r.reference_median_secs() / 1e9;
    out.push(Metric::absolute(
        "memcpy/f32_tensor/gbs".into(),
        memcpy_gbs,
        "GB/s",
        Better::Higher,
        format!("copy_from_slice of a {rows}x{cols} f32 tensor, one thread"),
    ));
    for &name in r.names() {
        let (t, spread) = r.speed_vs_reference(name);
        out.push(Metric::ratio(
            format!("{name}/vs_memcpy"),
            t,
            spread,
            Better::Higher,
            format!(
                "speed relative to a memcpy of the same {rows}x{cols} f32 tensor (time of a memcpy run just before / time of kernel), one thread, CPU clock"
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

/// 2-thread over 1-thread speed-up of the two NVFP4 quantizers the step runs most.
fn thread_scaling(rounds: usize, rows: usize, cols: usize, out: &mut Vec<Metric>) -> Result<()> {
    let (p1, p2) = (pool(1)?, pool(2)?);
    let x = data(rows * cols, 0x7EAD);
    let c = nvfp4_configs();
    let row = |p: &rayon::ThreadPool| {
        p.install(|| {
            black_box(nvfp4::quantize(&x, rows, cols, Usage::Rowwise, &c.act, KEY).unwrap());
        })
    };
    let col = |p: &rayon::ThreadPool| {
        p.install(|| {
            black_box(nvfp4::quantize(&x, rows, cols, Usage::Columnwise, &c.grad, KEY).unwrap());
        })
    };
    let mut cases = [
        Case::new("row_1t", || row(&p1)),
        Case::new("row_2t", || row(&p2)),
        Case::new("col_1t", || col(&p1)),
        Case::new("col_2t", || col(&p2)),
    ];
    let r = run_rounds(&mut cases, rounds, 2, Clock::Wall);
    for (name, one, two) in [
        ("nvfp4_row_1x16", "row_1t", "row_2t"),
        ("nvfp4_col_rht_sr", "col_1t", "col_2t"),
    ] {
        let (s, spread) = r.ratio(one, two);
        out.push(Metric::ratio(
            format!("quant/{name}/speedup_2t"),
            s,
            spread,
            Better::Higher,
            format!("time on a 1-thread pool / time on a 2-thread pool, {rows}x{cols}"),
        ));
    }
    Ok(())
}

/// Emulated NVFP4 GEMM (X 1x16, W 16x16) over the f32 GEMM, one thread.
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
                    Operand::new(&x, m, k, Usage::Rowwise, &c.act),
                    Operand::new(&w, n, k, Usage::Rowwise, &c.weight),
                    black_box(&mut o2),
                )
                .unwrap()
            })
        }),
    ];
    let r = run_rounds(&mut cases, rounds, 1, Clock::ProcessCpu);
    let (t, spread) = r.ratio("nvfp4", "f32");
    out.push(Metric::ratio(
        "quant/nvfp4_emulated_gemm/vs_f32".into(),
        t,
        spread,
        Better::Lower,
        format!("time of the emulated NVFP4 GEMM (quantize X 1x16 + W 16x16, dequantize, f32 GEMM) / f32 GEMM, {m}x{n}x{k}, one thread"),
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
    let (t, spread) = r.ratio("rmw", "adamw");
    out.push(Metric::ratio(
        "optim/adamw_10M/vs_inplace".into(),
        t,
        spread,
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

/// The whole in-process suite.
pub fn suite(rounds: usize) -> Result<Vec<Metric>> {
    let mut out = Vec::new();
    quantizers(rounds, 4096, 4096, &mut out)?;
    thread_scaling(rounds, 4096, 4096, &mut out)?;
    gemm(rounds, &mut out)?;
    adamw(rounds, &mut out)?;
    Ok(out)
}

/// Kernels that `cargo xtask bench` runs under callgrind, one call each on a fixed input.
pub const CALLGRIND_KERNELS: &[&str] = &[
    "fp-formats/e2m1_encode_packed",
    "fp-formats/e4m3_encode_rne_sat",
    "fp-formats/nvfp4_quantize",
    "fp-formats/mxfp8_e4m3_quantize",
    "quant/nvfp4_row_1x16",
    "quant/nvfp4_col_rht_sr",
    "quant/nvfp4_row_16x16",
    "quant/mxfp8_rowwise",
    "quant/fp8_e5m2_current",
    "quant/bf16_fake_rne",
];

/// Side of the square input the callgrind kernels run on.
pub const CALLGRIND_SIDE: usize = 512;

/// Prepares the input, then runs `kernel` once unless `setup_only`: the difference of the two
/// runs' instruction counts is the kernel's. Quantizers of `quant` run on a one-thread pool.
pub fn callgrind_kernel(kernel: &str, setup_only: bool) -> Result<()> {
    let (rows, cols) = (CALLGRIND_SIDE, CALLGRIND_SIDE);
    let x = data(rows * cols, 0xCA11);
    let p1 = pool(1)?;
    let c = nvfp4_configs();
    let mut packed = vec![0u8; x.len() / 2];
    let mut bytes = vec![0u8; x.len()];
    if !CALLGRIND_KERNELS.contains(&kernel) {
        bail!(
            "unknown kernel {kernel:?}; known: {}",
            CALLGRIND_KERNELS.join(", ")
        );
    }
    // The pool's worker thread exists in both runs, so its start-up cost cancels.
    p1.install(|| black_box(()));
    if setup_only {
        return Ok(());
    }
    match kernel {
        "fp-formats/e2m1_encode_packed" => E2M1::encode_slice_packed(black_box(&x), &mut packed),
        "fp-formats/e4m3_encode_rne_sat" => E4M3::encode_slice_rne_sat(black_box(&x), &mut bytes),
        "fp-formats/nvfp4_quantize" => {
            black_box(fnv::quantize(&x, rows, cols, Nvfp4Options::default())?);
        }
        "fp-formats/mxfp8_e4m3_quantize" => {
            let opts = MxOptions::new(MxElement::E4M3, ScaleRule::Rceil);
            black_box(fmx::quantize(&x, rows, cols, opts)?);
        }
        "quant/nvfp4_row_1x16" => {
            p1.install(|| nvfp4::quantize(&x, rows, cols, Usage::Rowwise, &c.act, KEY))?;
        }
        "quant/nvfp4_col_rht_sr" => {
            p1.install(|| nvfp4::quantize(&x, rows, cols, Usage::Columnwise, &c.grad, KEY))?;
        }
        "quant/nvfp4_row_16x16" => {
            p1.install(|| nvfp4::quantize(&x, rows, cols, Usage::Rowwise, &c.weight, KEY))?;
        }
        "quant/mxfp8_rowwise" => {
            let q = OperandQuant::mx(MxElement::E4M3, ScaleRule::Rceil);
            p1.install(|| mx::quantize(&x, rows, cols, Usage::Rowwise, &q, KEY))?;
        }
        "quant/fp8_e5m2_current" => {
            let q = OperandQuant::fp8_current(Fp8Element::E5M2);
            let mut st = QuantState::new();
            p1.install(|| fp8::quantize(&x, rows, cols, Usage::Rowwise, &q, KEY, &mut st))?;
        }
        "quant/bf16_fake_rne" => {
            let q = quant::GemmPolicy::BF16.fprop.a;
            let mut out = vec![0.0f32; x.len()];
            p1.install(|| {
                bf16::fake_quantize_into(&x, rows, cols, Usage::Rowwise, &q, KEY, &mut out)
            })?;
            black_box(&out);
        }
        _ => unreachable!("checked above"),
    }
    black_box((&packed, &bytes));
    Ok(())
}

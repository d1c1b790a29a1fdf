//! GEMMs against the peaks of their instructions (`peak`): the f32 GEMM (matrixmultiply's kernel on
//! bands of the output, FP32 FMA), the GEMM of two BF16 operands as training runs it
//! (`quant::gemm::bf16::quantized_gemm_tn`: the AMX-BF16 tile unit or AVX512-BF16 `vdpbf16ps` where
//! present, the f32 GEMM elsewhere, not the portable models of their arithmetics that serve the
//! tests) and the block-scaled NVFP4 and MXFP8 GEMMs from f32 tensors (`quant::qgemm`, the
//! operands' quantization included, as in training) on the training shapes of the `small` and
//! `base` presets, and each over the f32 GEMM on the same shapes. Beside the peak, each GEMM is
//! timed against the least memory traffic of any GEMM of its f32 tensors (one pass reading both
//! operands and writing the output, `of_traffic`): at the shapes of training, whose K is small,
//! that traffic rather than the arithmetic bounds the BF16 units, and `of_roofline` takes the
//! larger of the two fractions. Where the CPU has both BF16 units, the `vdpbf16ps` kernel that
//! training leaves to the tiles is timed too (`bf16_pairs`, against its own peak): it is the kernel
//! CPUs without AMX train on; the block-scaled GEMMs are timed on it too, in a child process that
//! leaves the tile unit unused ([`pairs_suite`]). Wherever a BF16 kernel runs, it is also timed
//! alone on the same operands packed once (`bf16_prepacked`, `PackedPair`): the product without
//! rounding and packing its f32 operands, its f32 output still written, to tell the kernel's share
//! of the gap to the peak from the operands'; its `of_traffic` is against one pass over its own
//! least traffic (the packed tiles read, the output written). Where the E2M1 block GEMM runs
//! (`quant::gemm::e2m1`, AVX2 CPUs without BF16 units), the NVFP4 GEMM is measured against the byte
//! dot product's peak (`vpmaddubsw`) and the kernel alone on NVFP4 values (`e2m1`, operand packing
//! included) too. One process per thread count (with its child without AMX); every figure here
//! is reported, not gated.

use std::hint::black_box;

use anyhow::{Context, Result};
use quant::gemm::bf16::{
    bf16_gemm_tn, quantized_gemm_tn, Bf16Arithmetic, Bf16Workspace, PackedPair,
};
use quant::gemm::{sgemm, MatRef};
use quant::qgemm::{quantized_matmul_tn, quantized_matmul_tn_tensors, Operand};
use quant::{GemmPolicy, OperandQuant, Quantizer, RngKey, Usage};

use crate::harness::{child_output, pool, run_rounds, Case, Clock};
use crate::kernels::data;
use crate::metric::{Better, Metric, SuiteReport};
use crate::peak::{peak_gflops, PairedProbe, Unit};

/// `(name, M, N, K)`: the linear layers' GEMMs of a training step (2,048 tokens): Fprop of
/// the FFN's up and down projections (row-major operands), and the Wgrad of the up
/// projection (K = tokens; both operands are transposed views of `[K, M]` and `[K, N]`
/// tensors, dYᵀ and Xᵀ, as in training).
pub const SHAPES: &[(&str, usize, usize, usize)] = &[
    ("small_fprop_up", 2048, 352, 128),
    ("small_fprop_down", 2048, 128, 352),
    ("small_wgrad_up", 352, 128, 2048),
    ("base_fprop_up", 2048, 688, 256),
    ("base_fprop_down", 2048, 256, 688),
    ("base_wgrad_up", 688, 256, 2048),
];

/// The block-scaled GEMMs (NVFP4, MXFP8) timed where training runs them on `vdpbf16ps`,
/// on a CPU that has the AMX tile unit too (which training prefers): the suite of a child
/// process that leaves the tile unit unused (`NIBBLE_NO_AMX`), its `nvfp4`, `mxfp8`,
/// `nvfp4_codes` and `mxfp8_codes` figures renamed with `_pairs` (`nvfp4_pairs`...), beside
/// the in-process `bf16_pairs`.
/// Empty on CPUs without both units. What a CPU without AMX (a Zen 4) trains on, measured
/// against the `vdpbf16ps` peak of this one.
pub fn pairs_suite(threads: usize, rounds: usize) -> Result<Vec<Metric>> {
    if !(fp_formats::cpu::has_amx_bf16() && Bf16Arithmetic::Pairs.native()) {
        return Ok(Vec::new());
    }
    let args = [
        "gemms",
        "--threads",
        &threads.to_string(),
        "--rounds",
        &rounds.to_string(),
    ]
    .map(String::from);
    let env = [(fp_formats::cpu::NO_AMX_ENV, "1")];
    let out = child_output(&args, &env, "gemms child without AMX")?;
    let report: SuiteReport =
        serde_json::from_slice(&out).context("parsing the gemms child's report")?;
    Ok(report
        .metrics
        .into_iter()
        .filter_map(|mut m| {
            // (the longer names first: `nvfp4_` also prefixes `nvfp4_codes_`)
            for case in ["nvfp4_codes", "mxfp8_codes", "nvfp4", "mxfp8"] {
                let prefix = format!("quant/gemm_{case}_");
                if let Some(rest) = m.name.strip_prefix(&prefix) {
                    m.name = format!("quant/gemm_{case}_pairs_{rest}");
                    m.note = format!("{} (on `vdpbf16ps`, the tile unit left unused)", m.note);
                    return Some(m);
                }
            }
            None
        })
        .collect())
}

/// The suite on a pool of `threads` threads.
pub fn suite(threads: usize, rounds: usize) -> Result<Vec<Metric>> {
    let mut out = Vec::new();
    let mut peaks = Vec::new();
    let e2m1 = quant::gemm::e2m1::e2m1_native();
    let mut units = vec![Unit::Fma, Unit::Dpbf16, Unit::Amx];
    if e2m1 {
        units.push(Unit::ByteDot);
    }
    for unit in units {
        let p = peak_gflops(unit, threads, 0.3)?;
        if let Some(g) = p {
            out.push(Metric::absolute(
                format!("machine/peak_{}/gflops_{threads}t", unit.name()),
                g,
                "GFLOP/s",
                Better::Higher,
                format!(
                    "{} peak on {threads} thread(s), registers only",
                    unit.name()
                ),
            ));
        }
        peaks.push((unit, p));
    }
    // each unit's probe again, timed in every shape's rounds beside its GEMMs: the fractions
    // of the peak are ratios of times taken together
    let probes: Vec<(Unit, PairedProbe)> = peaks
        .iter()
        .filter(|(_, p)| p.is_some())
        .filter_map(|&(u, _)| PairedProbe::new(u, threads, 5e-4).map(|p| (u, p)))
        .collect();
    let probe = |u: Unit| probes.iter().find(|(x, _)| *x == u).map(|(_, p)| *p);
    let peak = |u: Unit| peaks.iter().find(|(x, _)| *x == u).and_then(|(_, p)| *p);
    let bf16_unit = match quant::gemm::bf16::quantized_gemm_arithmetic() {
        Some(Bf16Arithmetic::Tiles) => Unit::Amx,
        Some(Bf16Arithmetic::Pairs) if fp_formats::cpu::has_avx512_bf16() => Unit::Dpbf16,
        // the pair arithmetic on FMAs (AVX2), or the f32 GEMM: both at the FMA's peak
        Some(Bf16Arithmetic::Pairs) | None => Unit::Fma,
    };
    // the `vdpbf16ps` kernel, where the CPU has it but training runs on the tiles
    let pairs_too = bf16_unit == Unit::Amx && Bf16Arithmetic::Pairs.native();
    // two NVFP4 operands multiply on the E2M1 block GEMM where it runs
    let nvfp4_unit = if e2m1 { Unit::ByteDot } else { bf16_unit };
    let pool = pool(threads)?;
    for &(name, m, n, k) in SHAPES {
        // every call on a thread of the pool, as a training step's kernels run: a call
        // from outside would hand each product to a sleeping pool thread and wait for it
        // (tens of microseconds each way), which the fast BF16 products would pay the most
        pool.install(|| -> Result<()> {
        let a = data(m * k, 21);
        let b = data(n * k, 22);
        // BF16 operands, as the quantizers leave them (exactly BF16 in f32)
        let round = |v: &[f32]| -> Vec<f32> {
            v.iter()
                .map(|&x| f32::from_bits((quant::gemm::bf16::bf16_bits(x) as u32) << 16))
                .collect()
        };
        let (ab, bb) = (round(&a), round(&b));
        let (mut o1, mut o2) = (vec![0.0f32; m * n], vec![0.0f32; m * n]);
        let mut ws = Bf16Workspace::new();
        // `[outer, K]` views: row-major, or (Wgrad) transposed views of `[K, outer]` data
        let wgrad = name.contains("wgrad");
        fn view(x: &[f32], outer: usize, k: usize, wgrad: bool) -> MatRef<'_> {
            if wgrad {
                MatRef::row_major(x, k, outer).t()
            } else {
                MatRef::row_major(x, outer, k)
            }
        }
        let (va, vb) = (view(&a, m, k, wgrad), view(&b, n, k, wgrad));
        let (vab, vbb) = (view(&ab, m, k, wgrad), view(&bb, n, k, wgrad));
        // the block-scaled GEMMs take the f32 tensors: `[outer, K]`, or `[K, outer]` (Wgrad)
        let tensor = |x, outer| {
            let (r, c) = if wgrad { (k, outer) } else { (outer, k) };
            MatRef::new(x, r, c)
        };
        let (ta, tb) = (tensor(&a, m)?, tensor(&b, n)?);
        let (nv, mx) = (GemmPolicy::nvfp4_paper(), GemmPolicy::mxfp8());
        let pick = |p: GemmPolicy| {
            if wgrad {
                (p.wgrad.a, p.wgrad.b)
            } else {
                (p.fprop.a, p.fprop.b)
            }
        };
        let usage = if wgrad {
            Usage::Columnwise
        } else {
            Usage::Rowwise
        };
        let key = RngKey { seed: 1, stream: 2 };
        let q = |x: OperandQuant| Quantizer::new(x, usage).map(|q| q.with_key(key));
        let (nva, nvb) = (q(pick(nv).0)?, q(pick(nv).1)?);
        let (mxa, mxb) = (q(pick(mx).0)?, q(pick(mx).1)?);
        let (mut o3, mut o4, mut o5, mut o6) = (
            vec![0.0f32; m * n],
            vec![0.0f32; m * n],
            vec![0.0f32; m * n],
            vec![0.0f32; m * n],
        );
        // the same operands quantized beforehand: codes and scales, decoded in the call
        let coded = |x: MatRef<'_>, q: &Quantizer| q.quantize(x, &mut quant::QuantState::new());
        let (cna, cnb) = (coded(ta, &nva)?, coded(tb, &nvb)?);
        let (cma, cmb) = (coded(ta, &mxa)?, coded(tb, &mxb)?);
        let (mut o10, mut o11) = (vec![0.0f32; m * n], vec![0.0f32; m * n]);
        let mut pairs_ws = Bf16Workspace::new();
        // the NVFP4 operands' values (unscaled, `[outer, K]`), for the E2M1 GEMM alone
        let values = |x: MatRef<'_>, q: &Quantizer, outer: usize| -> Result<Vec<f32>> {
            let mut v = vec![0.0f32; outer * k];
            q.fake_quantize_into(x, &mut quant::QuantState::new(), &mut v)?;
            Ok(v)
        };
        let (fa, fb) = (values(ta, &nva, m)?, values(tb, &nvb, n)?);
        let (vfa, vfb) = (MatRef::row_major(&fa, m, k), MatRef::row_major(&fb, n, k));
        let mut o7 = vec![0.0f32; m * n];
        let mut e2m1_ws = quant::gemm::e2m1::E2m1Workspace::new();
        // the BF16 operands packed once: the kernel alone, where a BF16 kernel runs
        let mut prepacked = PackedPair::new(vab, vbb);
        let kernel_alone = prepacked.is_some();
        let mut o8 = vec![0.0f32; m * n];
        // as many bytes as the packed tiles, for the least traffic of the kernel alone
        let tiles_sized = vec![0.0f32; prepacked.as_ref().map_or(0, |p| p.packed_bytes() / 4)];
        let mut o9 = vec![0.0f32; m * n];
        let mut cases = vec![
            Case::new("f32", || {
                sgemm(1.0, va, vb.t(), 0.0, black_box(&mut o1))
            }),
            Case::new("bf16", || {
                quantized_gemm_tn(vab, vbb, black_box(&mut o2), &mut ws)
            }),
            Case::new("nvfp4", || {
                let (a, b) = (Operand::new(ta, nva), Operand::new(tb, nvb));
                quantized_matmul_tn(a, b, black_box(&mut o3))
                    .expect("valid operands");
            }),
            Case::new("mxfp8", || {
                let (a, b) = (Operand::new(ta, mxa), Operand::new(tb, mxb));
                quantized_matmul_tn(a, b, black_box(&mut o4))
                    .expect("valid operands");
            }),
            Case::new("nvfp4_codes", || {
                quantized_matmul_tn_tensors(&cna, &cnb, black_box(&mut o10))
                    .expect("valid tensors");
            }),
            Case::new("mxfp8_codes", || {
                quantized_matmul_tn_tensors(&cma, &cmb, black_box(&mut o11))
                    .expect("valid tensors");
            }),
            // the least memory traffic of any GEMM of these f32 tensors: each operand read
            // once, the output written once
            Case::new("traffic", || {
                touch_once(&a, &b, black_box(&mut o5))
            }),
        ];
        if pairs_too {
            cases.push(Case::new("bf16_pairs", || {
                let (a, b, o) = (vab, vbb, black_box(&mut o6));
                bf16_gemm_tn(Bf16Arithmetic::Pairs, a, b, o, &mut pairs_ws)
            }));
        }
        if let Some(pair) = prepacked.as_mut() {
            cases.push(Case::new("bf16_prepacked", || {
                let o = black_box(&mut o8);
                pair.gemm(o)
            }));
            // the least traffic of the kernel alone: the packed tiles read once, the output
            // written once
            cases.push(Case::new("traffic_prepacked", || {
                touch_once(&tiles_sized, &[], black_box(&mut o9))
            }));
        }
        if e2m1 {
            cases.push(Case::new("e2m1", || {
                let (a, b, o) = (vfa, vfb, black_box(&mut o7));
                let ran = quant::gemm::e2m1::e2m1_gemm_tn(a, b, o, &mut e2m1_ws);
                assert!(ran, "NVFP4 values split into E2M1 groups");
            }));
        }
        let mut units_here = vec![Unit::Fma, bf16_unit, nvfp4_unit];
        if pairs_too {
            units_here.push(Unit::Dpbf16);
        }
        let mut timed: Vec<Unit> = Vec::new();
        for u in units_here {
            if let (false, Some(p)) = (timed.contains(&u), probe(u)) {
                cases.push(Case::new(u.name(), move || p.run()));
                timed.push(u);
            }
        }
        let r = run_rounds(&mut cases, rounds, 3, Clock::Wall);
        // each unit's peak in this shape's rounds: its probe's fastest round, or the peak
        // measured at the start if that was higher (a probe call on a pool can wait for a
        // sleeping thread; no GEMM reads more than the larger of the two)
        let peak_here = |u: Unit| -> Option<f64> {
            let p = probe(u).filter(|_| timed.contains(&u))?;
            let paired = p.flops() / r.best_secs(u.name()) / 1e9;
            Some(peak(u).map_or(paired, |first| first.max(paired)))
        };
        let flops = 2.0 * (m * n * k) as f64;
        let shape = format!("{m}x{n}x{k}, {threads} thread(s)");
        // each case, the unit whose peak it is measured against, and the pass timing its
        // least memory traffic
        let f32_traffic = (
            "traffic",
            "reads both f32 operands and writes the output (the least traffic of any GEMM of them)",
        );
        let mut cases = vec![
            ("f32", Unit::Fma, Some(f32_traffic)),
            ("bf16", bf16_unit, Some(f32_traffic)),
            ("nvfp4", nvfp4_unit, Some(f32_traffic)),
            ("mxfp8", bf16_unit, Some(f32_traffic)),
            // no f32 operand read: no roofline of f32 traffic
            ("nvfp4_codes", nvfp4_unit, None),
            ("mxfp8_codes", bf16_unit, None),
        ];
        if pairs_too {
            cases.push(("bf16_pairs", Unit::Dpbf16, Some(f32_traffic)));
        }
        if kernel_alone {
            // it reads no f32 operand: its least traffic is its tiles'
            let tiles = (
                "traffic_prepacked",
                "reads the packed BF16 tiles of both operands and writes the output (the least traffic of the kernel alone)",
            );
            cases.push(("bf16_prepacked", bf16_unit, Some(tiles)));
        }
        if e2m1 {
            cases.push(("e2m1", Unit::ByteDot, Some(f32_traffic)));
        }
        for (case, unit, traffic) in cases {
            let g = flops / r.median_secs(case) / 1e9;
            out.push(Metric::absolute(
                format!("quant/gemm_{case}_{name}/gflops_{threads}t"),
                g,
                "GFLOP/s",
                Better::Higher,
                format!("{case} GEMM, {shape}"),
            ));
            let of_peak = peak_here(unit).map(|p| g / p);
            if let Some(f) = of_peak {
                out.push(Metric::absolute(
                    format!("quant/gemm_{case}_{name}/of_peak_{threads}t"),
                    f,
                    "x",
                    Better::Higher,
                    format!("{case} GEMM GFLOP/s / {} peak, {shape}", unit.name()),
                ));
            }
            let Some((traffic, what)) = traffic else {
                continue;
            };
            let of_traffic = r.ratio(traffic, case);
            out.push(Metric::reported_ratio(
                format!("quant/gemm_{case}_{name}/of_traffic_{threads}t"),
                of_traffic,
                Better::Higher,
                format!("time of one pass that {what} / time of the {case} GEMM, {shape}"),
            ));
            if let Some(f) = of_peak {
                out.push(Metric::absolute(
                    format!("quant/gemm_{case}_{name}/of_roofline_{threads}t"),
                    f.max(of_traffic.0),
                    "x",
                    Better::Higher,
                    format!("the larger of of_peak and of_traffic: the {case} GEMM's time over the longer of its arithmetic at the unit's peak and its least memory traffic, inverted, {shape}"),
                ));
            }
        }
        // the roofline's share of each unit's peak: the most of it any GEMM of these f32
        // operands can reach, its arithmetic at the peak against one pass of its least traffic
        for &u in &timed {
            let p = peak_here(u).expect("timed units have probes");
            let at_peak = flops / (p * 1e9) / r.median_secs("traffic");
            out.push(Metric::absolute(
                format!("quant/roofline_{}_{name}/of_peak_{threads}t", u.name()),
                at_peak.min(1.0),
                "x",
                Better::Higher,
                format!("the most of the {} peak a GEMM of these f32 operands can reach: the time of its arithmetic at the peak over the longer of that and one pass reading both operands and writing the output, {shape}", u.name()),
            ));
        }
        let mut vs_f32 = vec![
            ("bf16", "operand packing included"),
            ("nvfp4", "quantizing the f32 operands included"),
            ("mxfp8", "quantizing the f32 operands included"),
            ("nvfp4_codes", "operands quantized beforehand, decoded in the call"),
            ("mxfp8_codes", "operands quantized beforehand, decoded in the call"),
        ];
        if pairs_too {
            vs_f32.push(("bf16_pairs", "operand packing included"));
        }
        if e2m1 {
            vs_f32.push(("e2m1", "NVFP4 values, operand packing included"));
        }
        for (case, what) in vs_f32 {
            out.push(Metric::reported_ratio(
                format!("quant/gemm_{case}_{name}/vs_f32_{threads}t"),
                r.ratio("f32", case),
                Better::Higher,
                format!("time of the f32 GEMM / time of the {case} GEMM ({what}), {shape}"),
            ));
        }
            Ok(())
        })?;
    }
    Ok(out)
}

/// Reads every value of `a` and `b` once and writes every value of `out` once, in parallel on
/// the current pool: the memory traffic no GEMM of f32 operands and output can go below.
fn touch_once(a: &[f32], b: &[f32], out: &mut [f32]) {
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 14;
    let read = |x: &[f32]| -> f32 {
        x.par_chunks(CHUNK)
            .map(|c| {
                // 16 independent lanes, so the sum vectorises and is not latency-bound
                let mut acc = [0.0f32; 16];
                let mut it = c.chunks_exact(16);
                for v in &mut it {
                    for (s, x) in acc.iter_mut().zip(v) {
                        *s += x;
                    }
                }
                acc.iter().sum::<f32>() + it.remainder().iter().sum::<f32>()
            })
            .sum()
    };
    let s = read(a) + read(b);
    out.par_chunks_mut(CHUNK).for_each(|c| c.fill(s));
}

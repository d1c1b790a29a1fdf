//! GPU tests: every kernel against `quant` byte for byte on training-sized and odd-shaped
//! inputs (stochastic rounding with the same seeds included), and the GEMMs against the CPU
//! emulated GEMM within accumulation-order tolerance.
//!
//! Every test starts with the probe. Without a usable GPU it prints
//! `SKIP <test>: <reason>` straight to stderr (visible without `--nocapture`) and returns, so
//! `cargo test` stays green on CI. With a GPU, a failure to load the kernels fails the test.

mod common;

use std::io::Write as _;
use std::sync::OnceLock;
use std::time::Instant;

use common::{
    assert_same, cpu_quantize, data, for_each_case, fp8_current_cases, fp8_delayed, mx_cases,
    mx_prescaled, nvfp4_cases, nvfp4_cast_transpose_cases, nvfp4_rht_cases, quantizer,
    rht_zero_sum_cases, rht_zero_sum_data, sweep, CT_COL_KEY, CT_ROW_KEY, KEY, USAGES,
};
use cudarc::driver::CudaSlice;
use fp_formats::mx::{MxElement, ScaleRule};
use kernels_cuda::{DeviceMatrix, DeviceQuantized, Gpu, GpuContext, KernelError};
use quant::qgemm::{quantized_matmul_tn, Operand};
use quant::{
    AmaxAlgo, Fp8Element, OperandQuant, QuantState, Quantizer, QuantizerBackend, Rht, RngKey,
    RoundingMode, Usage,
};

enum State {
    Ready(Box<GpuContext>),
    Skip(String),
    Broken(String),
}

/// Soft checks: a failing check (a panic inside [`soft`]) is recorded and the test goes on
/// with its other cases, so that one GPU run reports every mismatch, not only the first; the
/// [`Checks`] guard that [`gpu`] returns fails the test at its end if any check failed.
struct Checks(&'static str);

thread_local! {
    static FAILED: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs one check; its failure is recorded (the panic hook has printed its message).
fn soft(what: &str, f: impl FnOnce()) {
    if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        let first = msg.lines().next().unwrap_or("").to_string();
        FAILED.with(|f| f.borrow_mut().push(format!("{what}: {first}")));
    }
}

impl Drop for Checks {
    fn drop(&mut self) {
        let failed = FAILED.with(|f| std::mem::take(&mut *f.borrow_mut()));
        if !failed.is_empty() && !std::thread::panicking() {
            panic!(
                "{}: {} check(s) failed:\n  {}",
                self.0,
                failed.len(),
                failed.join("\n  ")
            );
        }
    }
}

fn gpu(test: &'static str) -> Option<(&'static GpuContext, Checks)> {
    static T0: OnceLock<Instant> = OnceLock::new();
    static GPU: OnceLock<State> = OnceLock::new();
    let t0 = *T0.get_or_init(Instant::now);
    let state = GPU.get_or_init(|| match kernels_cuda::probe() {
        Gpu::Unavailable(why) => State::Skip(why),
        Gpu::Ready(ctx) => match GpuContext::new(ctx) {
            Ok(g) => {
                let _ = writeln!(
                    std::io::stderr(),
                    "GPU: {} (cc {:?}, PTX {})",
                    g.name(),
                    g.compute_capability(),
                    g.arch().tag()
                );
                State::Ready(Box::new(g))
            }
            Err(KernelError::Unsupported(why)) => State::Skip(why),
            Err(e) => State::Broken(format!("{e}")),
        },
    });
    match state {
        State::Ready(g) => {
            // Per-test wall time is the gap between consecutive start lines (the first one
            // includes the PTX JIT).
            let _ = writeln!(
                std::io::stderr(),
                "[{:7.2} s] start {test}",
                t0.elapsed().as_secs_f64()
            );
            Some((g, Checks(test)))
        }
        State::Skip(why) => {
            // One write, straight to stderr: libtest does not capture it.
            let _ = std::io::stderr().write_all(format!("SKIP {test}: {why}\n").as_bytes());
            None
        }
        State::Broken(e) => panic!("{test}: a GPU is present but the kernels failed to load: {e}"),
    }
}

// ------------------------------------------------------------------------------------------
// Inputs
// ------------------------------------------------------------------------------------------

/// Training-sized shapes plus odd ones (padding in both dimensions, row strides that are not
/// multiples of 4, single rows).
const SHAPES: &[(usize, usize)] = &[
    (2048, 4096),
    (4096, 1024),
    (64, 48),
    (37, 100),
    (1, 16),
    (130, 202),
    (33, 7),
];
/// Shapes whose row count is a multiple of 16 (columnwise RHT transforms along the rows).
const RHT_SHAPES: &[(usize, usize)] = &[(4096, 2048), (1024, 1000), (48, 37), (16, 16), (272, 130)];

fn upload(g: &GpuContext, x: &[f32], rows: usize, cols: usize) -> DeviceMatrix {
    g.upload(x, rows, cols).expect("upload")
}

#[allow(clippy::too_many_arguments)]
fn check_one(
    g: &GpuContext,
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    q: &OperandQuant,
    key: RngKey,
    what: &str,
) {
    soft(what, || {
        check_one_strict(g, x, rows, cols, usage, q, key, what)
    });
}

#[allow(clippy::too_many_arguments)]
fn check_one_strict(
    g: &GpuContext,
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    q: &OperandQuant,
    key: RngKey,
    what: &str,
) {
    let dx = upload(g, x, rows, cols);
    let mut st_gpu = QuantState::new();
    let mut st_cpu = QuantState::new();
    let qz = quantizer(q, usage, key);
    let t = g
        .quantize(&qz, &dx, &mut st_gpu)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let host = t.to_host().expect("download");
    let cpu = cpu_quantize(x, (rows, cols), &qz, &mut st_cpu);
    assert_same(&host, &cpu, what);
    // Dequantization: bit for bit too.
    let deq = g
        .download(&g.dequantize(&t).expect("dequantize"))
        .expect("download");
    let want = cpu.dequantize();
    assert_eq!(deq.len(), want.len(), "{what}: dequantized length");
    if let Some(i) = deq
        .iter()
        .zip(&want)
        .position(|(a, b)| a.to_bits() != b.to_bits())
    {
        panic!(
            "{what}: dequantized element {i}: gpu {} cpu {}",
            deq[i], want[i]
        );
    }
}

// ------------------------------------------------------------------------------------------
// NVFP4
// ------------------------------------------------------------------------------------------

#[test]
fn nvfp4_rowwise_and_columnwise_match_quant() {
    let Some((g, _checks)) = gpu("nvfp4_rowwise_and_columnwise_match_quant") else {
        return;
    };
    sweep(
        SHAPES,
        100,
        &nvfp4_cases(),
        &USAGES,
        |x, rows, cols, usage, q, what| check_one(g, x, rows, cols, usage, q, KEY, what),
    );
}

#[test]
fn nvfp4_columnwise_rht_matches_quant() {
    let Some((g, _checks)) = gpu("nvfp4_columnwise_rht_matches_quant") else {
        return;
    };
    for (si, &(rows, cols)) in RHT_SHAPES.iter().enumerate() {
        let x = data(rows, cols, 200 + si as u64);
        for_each_case(
            &nvfp4_rht_cases(),
            &[Usage::Columnwise],
            rows,
            cols,
            |usage, q, what| check_one(g, &x, rows, cols, usage, q, KEY, what),
        );
        let key2 = RngKey {
            seed: 7,
            stream: u64::MAX - 3,
        };
        let q = OperandQuant::nvfp4()
            .with_rht(Rht::RandomSigns)
            .with_rounding(RoundingMode::Stochastic);
        check_one(
            g,
            &x,
            rows,
            cols,
            Usage::Columnwise,
            &q,
            key2,
            &format!("nvfp4 RHT other key {rows}x{cols}"),
        );
    }
}

/// RHT chunks with exact zero sums (`common::rht_zero_sum_data`): byte for byte with quant,
/// and a column of -0.0 (stored row 0) quantizes to code 0x0 everywhere, for NVFP4 and MX.
#[test]
fn rht_zero_sums_match_quant() {
    let Some((g, _checks)) = gpu("rht_zero_sums_match_quant") else {
        return;
    };
    let cases = rht_zero_sum_cases();
    for &(rows, cols) in &[(1024usize, 1000usize), (48, 30)] {
        let x = rht_zero_sum_data(rows, cols, 78);
        for_each_case(
            &cases,
            &[Usage::Columnwise],
            rows,
            cols,
            |usage, q, what| {
                check_one(g, &x, rows, cols, usage, q, KEY, what);
                soft(what, || {
                    let t = g
                        .quantize(
                            &quantizer(q, usage, KEY),
                            &upload(g, &x, rows, cols),
                            &mut QuantState::new(),
                        )
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    let host = t.to_host().expect("download");
                    let row0 = &host.codes[..host.codes.len() / host.padded_rows];
                    assert!(
                        row0.iter().all(|&b| b == 0),
                        "{what}: -0 column gave {row0:02x?}"
                    );
                });
            },
        );
    }
}

#[test]
fn nvfp4_cast_transpose_equals_two_quantizations() {
    let Some((g, _checks)) = gpu("nvfp4_cast_transpose_equals_two_quantizations") else {
        return;
    };
    let cases = nvfp4_cast_transpose_cases();
    let (row_key, col_key) = (CT_ROW_KEY, CT_COL_KEY);
    for &(rows, cols) in &[(4096usize, 4096usize), (96, 80), (272, 130)] {
        let x = data(rows, cols, rows as u64 ^ cols as u64);
        let dx = upload(g, &x, rows, cols);
        for (ci, (qr, qc)) in cases.iter().enumerate() {
            soft(&format!("cast_transpose case {ci} {rows}x{cols}"), || {
                let (r, c) = g
                    .cast_transpose(
                        &dx,
                        &quantizer(qr, Usage::Rowwise, row_key),
                        &quantizer(qc, Usage::Columnwise, col_key),
                        &mut QuantState::new(),
                    )
                    .expect("cast_transpose");
                let cr = cpu_quantize(
                    &x,
                    (rows, cols),
                    &quantizer(qr, Usage::Rowwise, row_key),
                    &mut QuantState::new(),
                );
                let cc = cpu_quantize(
                    &x,
                    (rows, cols),
                    &quantizer(qc, Usage::Columnwise, col_key),
                    &mut QuantState::new(),
                );
                assert_same(
                    &r.to_host().expect("dl"),
                    &cr,
                    &format!("cast_transpose case {ci} rowwise {rows}x{cols}"),
                );
                assert_same(
                    &c.to_host().expect("dl"),
                    &cc,
                    &format!("cast_transpose case {ci} columnwise {rows}x{cols}"),
                );
            });
        }
    }
}

#[test]
fn nvfp4_rejects_non_finite_input_and_bad_configs() {
    let Some((g, _checks)) = gpu("nvfp4_rejects_non_finite_input_and_bad_configs") else {
        return;
    };
    let (rows, cols) = (64, 64);
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut x = data(rows, cols, 5);
        x[777] = bad;
        let dx = upload(g, &x, rows, cols);
        let q = OperandQuant::nvfp4();
        let q = quantizer(&q, Usage::Rowwise, KEY);
        let xm = quant::MatRef::new(&x, rows, cols).expect("shape");
        assert!(q.quantize(xm, &mut QuantState::new()).is_err());
        match g.quantize(&q, &dx, &mut QuantState::new()) {
            Err(KernelError::NonFinite(_)) => {}
            other => panic!("{bad}: expected NonFinite, got {other:?}"),
        }
    }
    let dx = upload(g, &data(40, 32, 1), 40, 32);
    let rht = OperandQuant::nvfp4().with_rht(Rht::FixedSigns);
    assert!(
        Quantizer::new(rht, Usage::Rowwise).is_err(),
        "RHT is columnwise only"
    );
    assert!(
        g.quantize(
            &quantizer(&rht, Usage::Columnwise, KEY),
            &dx,
            &mut QuantState::new()
        )
        .is_err(),
        "RHT needs rows % 16 == 0"
    );
}

#[test]
fn amax_and_repeat_launches_are_deterministic() {
    let Some((g, _checks)) = gpu("amax_and_repeat_launches_are_deterministic") else {
        return;
    };
    for &(rows, cols) in &[(4096usize, 4099usize), (3, 5), (1, 1)] {
        let x = data(rows, cols, 9);
        let dx = upload(g, &x, rows, cols);
        let want = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert_eq!(
            g.amax(&dx).expect("amax").to_bits(),
            want.to_bits(),
            "{rows}x{cols}"
        );
    }
    let (rows, cols) = (2048, 2048);
    let x = data(rows, cols, 10);
    let dx = upload(g, &x, rows, cols);
    let q = OperandQuant::nvfp4()
        .with_rht(Rht::FixedSigns)
        .with_rounding(RoundingMode::Stochastic);
    let mut job = g
        .prepare(
            &dx,
            Some(&quantizer(&OperandQuant::nvfp4(), Usage::Rowwise, KEY)),
            Some(&quantizer(&q, Usage::Columnwise, KEY)),
            &mut QuantState::new(),
        )
        .expect("prepare");
    for _ in 0..5 {
        job.launch().expect("launch");
    }
    let (r, c) = job.finish().expect("finish");
    assert_same(
        &r.unwrap().to_host().unwrap(),
        &cpu_quantize(
            &x,
            (rows, cols),
            &quantizer(&OperandQuant::nvfp4(), Usage::Rowwise, KEY),
            &mut QuantState::new(),
        ),
        "repeat rowwise",
    );
    assert_same(
        &c.unwrap().to_host().unwrap(),
        &cpu_quantize(
            &x,
            (rows, cols),
            &quantizer(&q, Usage::Columnwise, KEY),
            &mut QuantState::new(),
        ),
        "repeat columnwise",
    );
}

// ------------------------------------------------------------------------------------------
// MX
// ------------------------------------------------------------------------------------------

#[test]
fn mx_matches_quant() {
    let Some((g, _checks)) = gpu("mx_matches_quant") else {
        return;
    };
    let elements = [MxElement::E4M3, MxElement::E5M2, MxElement::E2M1];
    let rules = [
        ScaleRule::Rceil,
        ScaleRule::Floor,
        ScaleRule::Ceil,
        ScaleRule::Even,
    ];
    for (si, &(rows, cols)) in SHAPES.iter().enumerate() {
        let x = data(rows, cols, 300 + si as u64);
        let mut cases = mx_cases(&elements, &rules);
        cases.push(("mx prescale".into(), mx_prescaled()));
        for_each_case(&cases, &USAGES, rows, cols, |usage, q, what| {
            check_one(g, &x, rows, cols, usage, q, KEY, what)
        });
    }
    for (si, &(rows, cols)) in RHT_SHAPES.iter().enumerate() {
        let x = data(rows, cols, 400 + si as u64);
        for element in elements {
            let q = OperandQuant::mx(element, ScaleRule::Rceil).with_rht(Rht::FixedSigns);
            check_one(
                g,
                &x,
                rows,
                cols,
                Usage::Columnwise,
                &q,
                KEY,
                &format!("mx RHT {element:?} {rows}x{cols}"),
            );
        }
    }
}

#[test]
fn mx_cast_transpose_equals_two_quantizations() {
    let Some((g, _checks)) = gpu("mx_cast_transpose_equals_two_quantizations") else {
        return;
    };
    for &(rows, cols) in &[(4096usize, 2048usize), (100, 70)] {
        let x = data(rows, cols, 17);
        let dx = upload(g, &x, rows, cols);
        let qr = OperandQuant::mx(MxElement::E4M3, ScaleRule::Rceil);
        let qc = qr.with_rounding(RoundingMode::Stochastic);
        soft(&format!("mx cast_transpose {rows}x{cols}"), || {
            let (r, c) = g
                .cast_transpose(
                    &dx,
                    &quantizer(&qr, Usage::Rowwise, KEY),
                    &quantizer(&qc, Usage::Columnwise, KEY),
                    &mut QuantState::new(),
                )
                .expect("cast_transpose");
            assert_same(
                &r.to_host().unwrap(),
                &cpu_quantize(
                    &x,
                    (rows, cols),
                    &quantizer(&qr, Usage::Rowwise, KEY),
                    &mut QuantState::new(),
                ),
                &format!("mx ct rowwise {rows}x{cols}"),
            );
            assert_same(
                &c.to_host().unwrap(),
                &cpu_quantize(
                    &x,
                    (rows, cols),
                    &quantizer(&qc, Usage::Columnwise, KEY),
                    &mut QuantState::new(),
                ),
                &format!("mx ct columnwise {rows}x{cols}"),
            );
        });
    }
}

// ------------------------------------------------------------------------------------------
// FP8
// ------------------------------------------------------------------------------------------

#[test]
fn fp8_current_scaling_matches_quant() {
    let Some((g, _checks)) = gpu("fp8_current_scaling_matches_quant") else {
        return;
    };
    sweep(
        SHAPES,
        500,
        &fp8_current_cases(),
        &USAGES,
        |x, rows, cols, usage, q, what| check_one(g, x, rows, cols, usage, q, KEY, what),
    );
}

#[test]
fn fp8_delayed_scaling_tracks_quant_state() {
    let Some((g, _checks)) = gpu("fp8_delayed_scaling_tracks_quant_state") else {
        return;
    };
    let q = fp8_delayed(Fp8Element::E4M3, 4, 0, AmaxAlgo::Max);
    let (rows, cols) = (1024, 768);
    let mut sg = QuantState::new();
    let mut sc = QuantState::new();
    for step in 0..5u64 {
        let x: Vec<f32> = data(rows, cols, 600 + step)
            .iter()
            .map(|v| v * (1 << step) as f32)
            .collect();
        let dx = upload(g, &x, rows, cols);
        let t = g
            .quantize(&quantizer(&q, Usage::Rowwise, KEY), &dx, &mut sg)
            .expect("gpu");
        let c = cpu_quantize(
            &x,
            (rows, cols),
            &quantizer(&q, Usage::Rowwise, KEY),
            &mut sc,
        );
        assert_same(&t.to_host().unwrap(), &c, &format!("delayed step {step}"));
        sg.end_step(&q).unwrap();
        sc.end_step(&q).unwrap();
        assert_eq!(sg.amax_history(), sc.amax_history());
        assert_eq!(sg.scale().to_bits(), sc.scale().to_bits());
    }
}

#[test]
fn fp8_cast_transpose_equals_two_quantizations() {
    let Some((g, _checks)) = gpu("fp8_cast_transpose_equals_two_quantizations") else {
        return;
    };
    let (rows, cols) = (2048, 1536);
    let x = data(rows, cols, 31);
    let dx = upload(g, &x, rows, cols);
    let q = OperandQuant::fp8_current(Fp8Element::E5M2);
    let (r, c) = g
        .cast_transpose(
            &dx,
            &quantizer(&q, Usage::Rowwise, KEY),
            &quantizer(&q, Usage::Columnwise, KEY),
            &mut QuantState::new(),
        )
        .expect("ct");
    let st = &mut QuantState::new();
    assert_same(
        &r.to_host().unwrap(),
        &cpu_quantize(&x, (rows, cols), &quantizer(&q, Usage::Rowwise, KEY), st),
        "fp8 ct rowwise",
    );
    assert_same(
        &c.to_host().unwrap(),
        &cpu_quantize(&x, (rows, cols), &quantizer(&q, Usage::Columnwise, KEY), st),
        "fp8 ct columnwise",
    );
}

// ------------------------------------------------------------------------------------------
// Scale swizzle
// ------------------------------------------------------------------------------------------

#[test]
fn swizzle_kernel_matches_cpu_swizzle() {
    let Some((g, _checks)) = gpu("swizzle_kernel_matches_cpu_swizzle") else {
        return;
    };
    for &(rows, scols) in &[(1usize, 1usize), (128, 4), (300, 17), (4096, 256)] {
        let s: Vec<u8> = (0..rows * scols).map(|i| (i * 7 + 3) as u8).collect();
        let ds = g.stream().clone_htod(&s).expect("htod");
        let z = g
            .download(&g.swizzle_scales(&ds, rows, scols).expect("swizzle"))
            .expect("dtoh");
        assert_eq!(
            z,
            kernels_cuda::swizzle::swizzle_scales(&s, rows, scols),
            "{rows}x{scols}"
        );
    }
}

// ------------------------------------------------------------------------------------------
// GEMMs
// ------------------------------------------------------------------------------------------

/// `|A|·|B|ᵀ` of the unscaled fake-quantized operands, times `|alpha|`: the scale of the
/// worst-case accumulation error of each output.
fn abs_bound(a: &[f32], b: &[f32], m: usize, n: usize, k: usize, alpha: f32) -> Vec<f32> {
    let aa: Vec<f32> = a.iter().map(|v| v.abs()).collect();
    let bb: Vec<f32> = b.iter().map(|v| v.abs()).collect();
    let mut out = vec![0.0f32; m * n];
    quant::gemm::matmul_tn(&aa, &bb, m, n, k, &mut out);
    out.iter().map(|v| v * alpha.abs()).collect()
}

/// Checks `|gpu - cpu| <= rel * bound + tiny` element-wise. Always prints the worst ratio
/// and the relative Frobenius error first (so that a failing run still reports how far off
/// it is), then fails with the worst element and the number of elements out of bounds.
fn assert_close(gpu: &[f32], cpu: &[f32], bound: &[f32], rel: f32, what: &str) {
    assert_eq!(gpu.len(), cpu.len(), "{what}: output length");
    let mut worst = (0.0f64, 0usize);
    let (mut num, mut den) = (0.0f64, 0.0f64);
    let (mut bad, mut non_finite) = (0usize, 0usize);
    for i in 0..cpu.len() {
        if !gpu[i].is_finite() {
            non_finite += 1;
            continue;
        }
        let d = (gpu[i] as f64 - cpu[i] as f64).abs();
        let allowed = rel as f64 * bound[i] as f64 + 1e-30;
        if d / allowed > worst.0 {
            worst = (d / allowed, i);
        }
        if d > allowed {
            bad += 1;
        }
        num += d * d;
        den += (cpu[i] as f64).powi(2);
    }
    let i = worst.1;
    let _ = writeln!(
        std::io::stderr(),
        "{what}: worst |diff| / allowed = {:.3} (rel {rel:e}), relative Frobenius error {:.3e}",
        worst.0,
        (num / den.max(1e-300)).sqrt()
    );
    assert!(
        bad == 0 && non_finite == 0,
        "{what}: {bad} of {} outputs out of bounds, {non_finite} non-finite; worst at {i}: \
         gpu {} cpu {} bound {} (|diff| / allowed = {:.3})",
        cpu.len(),
        gpu[i],
        cpu[i],
        bound[i],
        worst.0
    );
}

fn fake(x: &[f32], rows: usize, cols: usize, q: &OperandQuant, key: RngKey) -> (Vec<f32>, f32) {
    let mut out = vec![0.0f32; x.len()];
    let x = quant::MatRef::new(x, rows, cols).expect("shape");
    let f = quantizer(q, Usage::Rowwise, key)
        .fake_quantize_into(x, &mut QuantState::new(), &mut out)
        .expect("fake");
    (out, f)
}

type GemmFn =
    fn(&GpuContext, &DeviceQuantized, &DeviceQuantized) -> kernels_cuda::Result<CudaSlice<f32>>;

#[allow(clippy::too_many_arguments)]
fn emulated_case(
    g: &GpuContext,
    gemm: GemmFn,
    qa: &OperandQuant,
    qb: &OperandQuant,
    m: usize,
    n: usize,
    k: usize,
    rel: f32,
    what: &str,
) {
    soft(what, || {
        emulated_case_strict(g, gemm, qa, qb, m, n, k, rel, what)
    });
}

#[allow(clippy::too_many_arguments)]
fn emulated_case_strict(
    g: &GpuContext,
    gemm: GemmFn,
    qa: &OperandQuant,
    qb: &OperandQuant,
    m: usize,
    n: usize,
    k: usize,
    rel: f32,
    what: &str,
) {
    let a = data(m, k, 700);
    let b: Vec<f32> = data(n, k, 701).iter().map(|v| v * 0.05).collect();
    let (da, db) = (upload(g, &a, m, k), upload(g, &b, n, k));
    let ka = RngKey {
        seed: 1,
        stream: 10,
    };
    let kb = RngKey {
        seed: 1,
        stream: 11,
    };
    let mut st = QuantState::new();
    let ta = g
        .quantize(&quantizer(qa, Usage::Rowwise, ka), &da, &mut st)
        .expect("quantize A");
    let tb = g
        .quantize(&quantizer(qb, Usage::Rowwise, kb), &db, &mut st)
        .expect("quantize B");
    let out = g
        .download(&gemm(g, &ta, &tb).unwrap_or_else(|e| panic!("{what}: {e}")))
        .expect("dtoh");
    let mut cpu = vec![0.0f32; m * n];
    quantized_matmul_tn(
        Operand::new(
            quant::MatRef::new(&a, m, k).unwrap(),
            quantizer(qa, Usage::Rowwise, ka),
        ),
        Operand::new(
            quant::MatRef::new(&b, n, k).unwrap(),
            quantizer(qb, Usage::Rowwise, kb),
        ),
        &mut cpu,
    )
    .expect("cpu gemm");
    let (fa, sa) = fake(&a, m, k, qa, ka);
    let (fb, sb) = fake(&b, n, k, qb, kb);
    assert_close(
        &out,
        &cpu,
        &abs_bound(&fa, &fb, m, n, k, sa * sb),
        rel,
        what,
    );
}

#[test]
fn emulated_nvfp4_and_mx_gemms_match_cpu_emulation() {
    let Some((g, _checks)) = gpu("emulated_nvfp4_and_mx_gemms_match_cpu_emulation") else {
        return;
    };
    if g.compute_capability().0 == 10 {
        let _ = writeln!(
            std::io::stderr(),
            "note: compute capability 10.x runs the block-scaled path here"
        );
    }
    // f32 accumulation of exact products in any order: |diff| <= 2 K u sum|a b|, with
    // u = 2^-23 to allow truncating tensor-core adders.
    let k = 2048;
    let rel = 2.0 * k as f32 * 2f32.powi(-23);
    let paper = quant::GemmPolicy::nvfp4_paper();
    emulated_case(
        g,
        GpuContext::gemm_quantized,
        &paper.fprop.a,
        &paper.fprop.b,
        1024,
        1536,
        k,
        rel,
        "NVFP4 fprop (1x16 x 16x16)",
    );
    emulated_case(
        g,
        GpuContext::gemm_quantized,
        &paper.dgrad.a,
        &OperandQuant::nvfp4(),
        512,
        768,
        k,
        rel,
        "NVFP4 SR x RNE",
    );
    let mx8 = OperandQuant::mx(MxElement::E4M3, ScaleRule::Rceil);
    emulated_case(
        g,
        GpuContext::gemm_quantized,
        &mx8,
        &mx8,
        1024,
        1024,
        k,
        rel,
        "MXFP8 E4M3",
    );
    let mx4 = OperandQuant::mx(MxElement::E2M1, ScaleRule::Floor);
    emulated_case(
        g,
        GpuContext::gemm_quantized,
        &mx4,
        &mx4,
        1024,
        1024,
        k,
        rel,
        "MXFP4",
    );
    // Odd shapes: K padded to 16 inside the GEMM.
    emulated_case(
        g,
        GpuContext::gemm_quantized,
        &OperandQuant::nvfp4(),
        &OperandQuant::nvfp4(),
        33,
        70,
        200,
        2.0 * 200.0 * 2f32.powi(-23),
        "NVFP4 odd",
    );
}

#[test]
fn fp8_gemm_matches_cpu_emulation() {
    let Some((g, _checks)) = gpu("fp8_gemm_matches_cpu_emulation") else {
        return;
    };
    // Products of FP8 values are exact, but Hopper's FP8 tensor cores add them with a
    // narrower, truncating accumulator (about 14 bits, promoted to f32 by cuBLASLt every few
    // k-blocks): worst case about 32 * 2^-13 of the group's largest term, so allow 2^-7 of
    // sum |a b|. A layout or scale bug is off by O(1); the printed worst ratio is the
    // measured accuracy.
    let rel = 2f32.powi(-7);
    let q = OperandQuant::fp8_current(Fp8Element::E4M3);
    let native: GemmFn = GpuContext::gemm_fp8;
    emulated_case(g, native, &q, &q, 1024, 2048, 4096, rel, "FP8 E4M3 x E4M3");
    let e5 = OperandQuant::fp8_current(Fp8Element::E5M2);
    emulated_case(g, native, &e5, &q, 512, 512, 1024, rel, "FP8 E5M2 x E4M3");
    // E5M2 x E5M2 is not in cuBLASLt's FP8 table: gemm_fp8 refuses it, gemm_quantized
    // emulates it (exact BF16 operands, f32 accumulation).
    soft("E5M2 x E5M2 through gemm_fp8", || {
        let dx = upload(g, &data(64, 64, 1), 64, 64);
        let t = g
            .quantize(
                &quantizer(&e5, Usage::Rowwise, KEY),
                &dx,
                &mut QuantState::new(),
            )
            .expect("quantize");
        let r = g.gemm_fp8(&t, &t);
        assert!(matches!(r, Err(KernelError::Unsupported(_))), "{r:?}");
    });
    emulated_case(
        g,
        GpuContext::gemm_quantized,
        &e5,
        &e5,
        256,
        384,
        512,
        2.0 * 512.0 * 2f32.powi(-23),
        "FP8 E5M2 x E5M2 (emulated)",
    );
    // Last: our A is cuBLASLt's B, so this asks for cuBLASLt's A = E5M2, B = E4M3.
    emulated_case(g, native, &q, &e5, 512, 256, 1024, rel, "FP8 E4M3 x E5M2");
}

#[test]
fn bf16_and_f32_gemms_match_cpu() {
    let Some((g, _checks)) = gpu("bf16_and_f32_gemms_match_cpu") else {
        return;
    };
    let (m, n, k) = (512, 768, 1024);
    let a = data(m, k, 800);
    let b = data(n, k, 801);
    let ab: Vec<f32> = a.iter().map(|&v| fp_formats::round_to_bf16(v)).collect();
    let bb: Vec<f32> = b.iter().map(|&v| fp_formats::round_to_bf16(v)).collect();
    let mut want = vec![0.0f32; m * n];
    quant::gemm::matmul_tn(&ab, &bb, m, n, k, &mut want);
    let bound = abs_bound(&ab, &bb, m, n, k, 1.0);
    let (da, db) = (upload(g, &a, m, k), upload(g, &b, n, k));
    let (ha, hb) = (g.to_bf16(&da.data).unwrap(), g.to_bf16(&db.data).unwrap());
    // BF16 in, f32 out.
    soft("BF16 -> f32", || {
        let out = g
            .download(&g.gemm_bf16_f32(&ha, &hb, m, n, k, 1.0).unwrap())
            .unwrap();
        assert_close(
            &out,
            &want,
            &bound,
            2.0 * k as f32 * 2f32.powi(-23),
            "BF16 -> f32",
        );
    });
    // BF16 in, BF16 out (safe API): one extra BF16 rounding of the result.
    soft("BF16 -> BF16 (safe API)", || {
        let out16: Vec<f32> = g
            .download(&g.gemm_bf16(&ha, &hb, m, n, k).unwrap())
            .unwrap()
            .iter()
            .map(|v| v.to_f32())
            .collect();
        // The f32 result is within rel * bound of `want`; rounding it to BF16 adds at most
        // 2^-8 of its magnitude (2^-9 when rounded to nearest).
        let rel = 2.0 * k as f32 * 2f32.powi(-23);
        let bound16: Vec<f32> = bound
            .iter()
            .zip(&want)
            .map(|(b, w)| b * (1.0 + 2f32.powi(-7)) + w.abs() * 2f32.powi(-8) / rel)
            .collect();
        assert_close(&out16, &want, &bound16, rel, "BF16 -> BF16 (safe API)");
    });
    // f32 (TF32 in cudarc's safe API): inputs rounded to 10 mantissa bits (each off by less
    // than 2^-10 even if truncated, so each product by less than 2^-9), plus the f32
    // accumulation bound of the BF16 cases.
    let mut want32 = vec![0.0f32; m * n];
    quant::gemm::matmul_tn(&a, &b, m, n, k, &mut want32);
    soft("f32 (TF32)", || {
        let out32 = g
            .download(&g.gemm_f32(&da.data, &db.data, m, n, k).unwrap())
            .unwrap();
        assert_close(
            &out32,
            &want32,
            &abs_bound(&a, &b, m, n, k, 1.0),
            2f32.powi(-9) + 2.0 * k as f32 * 2f32.powi(-23),
            "f32 (TF32)",
        );
    });
}

#[test]
fn block_scaled_gemm_is_blackwell_only() {
    let Some((g, _checks)) = gpu("block_scaled_gemm_is_blackwell_only") else {
        return;
    };
    let x = data(128, 256, 3);
    let dx = upload(g, &x, 128, 256);
    let t = g
        .quantize(
            &quantizer(&OperandQuant::nvfp4(), Usage::Rowwise, KEY),
            &dx,
            &mut QuantState::new(),
        )
        .unwrap();
    let r = g.gemm_block_scaled(&t, &t);
    if g.compute_capability().0 == 10 {
        let out = g
            .download(&r.expect("block-scaled GEMM on sm_100"))
            .unwrap();
        let mut cpu = vec![0.0f32; 128 * 128];
        let q = OperandQuant::nvfp4();
        let xm = quant::MatRef::new(&x, 128, 256).unwrap();
        quantized_matmul_tn(
            Operand::new(xm, quantizer(&q, Usage::Rowwise, KEY)),
            Operand::new(xm, quantizer(&q, Usage::Rowwise, KEY)),
            &mut cpu,
        )
        .unwrap();
        let (f, s) = fake(&x, 128, 256, &q, KEY);
        assert_close(
            &out,
            &cpu,
            &abs_bound(&f, &f, 128, 128, 256, s * s),
            2.0 * 256.0 * 2f32.powi(-23),
            "block-scaled NVFP4",
        );
    } else {
        assert!(matches!(r, Err(KernelError::Unsupported(_))), "{r:?}");
    }
}

/// The training step's tensor-core GEMM (`train_tc`: cuBLASLt, BF16 in, f32 accumulation,
/// α and β) on every transposition, padded leading dimensions, batches with a shared operand
/// and β = 1 against the host reference (`train_tc::reference`, K-order f32 sums) on the same
/// BF16 operands: within `2 (K + 1) u |α| Σ|a·b| + u |β c|` per element (two f32 summation
/// orders of exact products, plus the epilogue), `u = 2⁻²⁴`; a second run gives the same bits.
#[test]
fn training_bf16_gemm_matches_host_reference() {
    use kernels_cuda::train::Launcher;
    use kernels_cuda::train_tc::{reference, Bf16Gemm, Bf16View, TensorCoreOps};
    let Some((g, _checks)) = gpu("training_bf16_gemm_matches_host_reference") else {
        return;
    };
    let u = f64::powi(2.0, -24);
    let mut worst = 0.0f64;
    let shapes = [
        (1usize, 256usize, 192usize, 768usize),
        (3, 37, 50, 129),
        (2, 64, 16, 1000),
    ];
    for (si, &(batch, m, n, k)) in shapes.iter().enumerate() {
        for (ta, tb) in [(false, true), (false, false), (true, false), (true, true)] {
            for (shared_b, beta) in [(false, 0.0f32), (true, 1.0)] {
                let what =
                    format!("{batch} x {m}x{n}x{k} ta {ta} tb {tb} shared {shared_b} beta {beta}");
                soft(&what, || {
                    let view = |t: bool, (r, c): (usize, usize), shared: bool, pad: usize| {
                        let (rows, cols) = if t { (c, r) } else { (r, c) };
                        let ld = cols + pad;
                        let item = if shared { 0 } else { rows * ld };
                        (
                            Bf16View { trans: t, ld, item },
                            (batch - 1) * item + rows * ld,
                        )
                    };
                    let (va, la) = view(ta, (m, k), false, 0);
                    let (vb, lb) = view(tb, (k, n), shared_b, 3);
                    let spec = Bf16Gemm {
                        batch,
                        m,
                        n,
                        k,
                        alpha: 0.375,
                        beta,
                        a: va,
                        b: vb,
                    };
                    let normal = |n: usize, seed: u64| {
                        let mut r = common::Rng(seed);
                        (0..n).map(|_| r.normal()).collect::<Vec<f32>>()
                    };
                    let (xa, xb) = (normal(la, 40 + si as u64), normal(lb, 50 + si as u64));
                    let ha: Vec<u16> = xa
                        .iter()
                        .map(|&x| kernels_cuda::train_tc::bf16_bits_of(x))
                        .collect();
                    let hb: Vec<u16> = xb
                        .iter()
                        .map(|&x| kernels_cuda::train_tc::bf16_bits_of(x))
                        .collect();
                    let c0: Vec<f32> = normal(batch * m * n, 60);
                    let (da, db) = (
                        Launcher::upload(g, &xa).unwrap(),
                        Launcher::upload(g, &xb).unwrap(),
                    );
                    let (mut a16, mut b16) = (
                        Launcher::zeros::<u16>(g, la).unwrap(),
                        Launcher::zeros::<u16>(g, lb).unwrap(),
                    );
                    g.to_bf16_bits(&da, &mut a16).unwrap();
                    g.to_bf16_bits(&db, &mut b16).unwrap();
                    assert_eq!(
                        Launcher::download(g, &a16).unwrap(),
                        ha,
                        "nb_f32_to_bf16 = quant's RNE"
                    );
                    assert_eq!(
                        Launcher::download(g, &b16).unwrap(),
                        hb,
                        "nb_f32_to_bf16 = quant's RNE"
                    );
                    let mut dc = Launcher::upload(g, &c0).unwrap();
                    g.gemm_tc(&spec, &a16, &b16, &mut dc).unwrap();
                    let got = Launcher::download(g, &dc).unwrap();
                    // run to run: the same bits (one stream, our own workspace)
                    let mut again = Launcher::upload(g, &c0).unwrap();
                    g.gemm_tc(&spec, &a16, &b16, &mut again).unwrap();
                    let again = Launcher::download(g, &again).unwrap();
                    let same = got
                        .iter()
                        .zip(&again)
                        .all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "{what}: a second run gave other bits");
                    let mut want = c0.clone();
                    reference(&spec, &ha, &hb, &mut want).unwrap();
                    // Σ|a·b| per element through the reference with |operands|
                    let abs = |h: &[u16]| h.iter().map(|&b| b & 0x7fff).collect::<Vec<u16>>();
                    let mut s = vec![0.0f32; want.len()];
                    let mut sg = spec;
                    sg.alpha = 1.0;
                    sg.beta = 0.0;
                    reference(&sg, &abs(&ha), &abs(&hb), &mut s).unwrap();
                    for i in 0..want.len() {
                        let bound = 2.0 * (k as f64 + 1.0) * u * (0.375 * s[i] as f64) * 1.01
                            + u * (beta as f64 * c0[i] as f64).abs()
                            + u * (want[i] as f64).abs();
                        let d = (got[i] as f64 - want[i] as f64).abs();
                        assert!(
                            d <= bound,
                            "{what}[{i}]: cuBLASLt {} vs reference {}: {d:e} > {bound:e}",
                            got[i],
                            want[i]
                        );
                        if bound > 0.0 {
                            worst = worst.max(d / bound);
                        }
                    }
                });
            }
        }
    }
    eprintln!("training BF16 GEMM: worst |cuBLASLt - reference| / bound {worst:.3}");
}

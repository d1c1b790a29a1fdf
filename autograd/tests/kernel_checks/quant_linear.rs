//! The quantized linear layer on the device (`ops/device/gemm.rs`) against the CPU layer on
//! identical inputs, for BF16 and every built-in policy that quantizes below BF16 (all of them
//! on the tensor-core GEMM: `kernels_cuda::train_tc`, whose emulated form sums in K order).
//!
//! With identical `x`, `W` and `dY`, every quantized operand is bit-for-bit the CPU's (the
//! quantizer kernels reproduce quant: `kernels-cuda/tests/emu_fake_quantize.rs`), so the two
//! layers differ only in how the GEMMs accumulate exact products (BF16-exact values, products
//! exact in f32): each result is within `(K + 1) u |α| S` of the exact `α Σ a b`, where
//! `S = Σ |a| |b|` over the dequantized operands (computed here with quant's
//! `fake_quantize_into` under the layer's keys and states) and `u = 2⁻²⁴`; the two layers then
//! differ by at most twice that, checked per element (plus `u (|α| S + |b|)` for the bias add
//! of the forward). The bias gradient (the same column sums) is bit-exact, and the layer's
//! quantizer state (FP8 delayed-scaling histories and scales, over two steps with
//! `end_quant_step` between) equals the CPU's.

use std::sync::Arc;

use autograd::backend::DeviceBackend;
use autograd::{gemm_stream, init, Graph, LinearQuantState, OperandRole, ParamStore};
use quant::{GemmPolicy, MatRef, OperandQuant, QuantState, Quantizer, RngKey, Usage};

use super::same_bits;

const T: usize = 48; // tokens: a multiple of 16 (the Wgrad RHT)
const N_IN: usize = 40; // pads NVFP4 16x16 tiles and MX 1x32 blocks
const N_OUT: usize = 24;
const LAYER: u64 = 9;
const SEED: u64 = 5;

/// The layer's outputs of one step: y, dx, dW, db and the state after the step.
struct Run {
    y: Vec<f32>,
    dx: Vec<f32>,
    dw: Vec<f32>,
    db: Vec<f32>,
    state: Option<LinearQuantState>,
}

/// Runs `steps` steps of the layer (forward, backward seeded with `r`, `end_quant_step`) on
/// the CPU or on `dev`; returns each step's outputs and the state it started from.
fn run(
    policy: &GemmPolicy,
    dev: Option<&Arc<DeviceBackend>>,
    steps: u64,
) -> Vec<(Option<LinearQuantState>, Run)> {
    let mut ps = ParamStore::new();
    let w = ps
        .add("w", &[N_OUT, N_IN], init::normal(N_OUT * N_IN, 0.3, 61))
        .unwrap();
    let b = ps.add("b", &[N_OUT], init::normal(N_OUT, 0.1, 62)).unwrap();
    if let Some(d) = dev {
        ps.to_device(d).unwrap();
    }
    let mut out = Vec::new();
    for step in 0..steps {
        let before = ps.linear_state(w).unwrap().cloned();
        let xs = data(T * N_IN, 1.0, 63 + step);
        let r = data(T * N_OUT, 0.01, 73 + step);
        ps.zero_grad();
        let mut g = Graph::new(&mut ps).with_rng(SEED, step);
        let x = g.variable(&xs, &[T, N_IN]).unwrap();
        let (wt, bt) = (g.param(w).unwrap(), g.param(b).unwrap());
        let y = g.linear(x, wt, Some(bt), policy, LAYER).unwrap();
        let yv = g.to_vec(y).unwrap();
        g.backward_with(y, &r).unwrap();
        let dx = g.grad_vec(x).unwrap().unwrap();
        drop(g);
        let run = Run {
            y: yv,
            dx,
            dw: ps.download_grad(w).unwrap(),
            db: ps.download_grad(b).unwrap(),
            state: ps.linear_state(w).unwrap().cloned(),
        };
        ps.end_quant_step().unwrap();
        out.push((before, run));
    }
    out
}

/// Step-dependent test data with a few large elements (so block and tensor scales vary).
fn data(n: usize, std: f32, seed: u64) -> Vec<f32> {
    let mut v = init::normal(n, std, seed);
    for i in (0..n).step_by(37) {
        v[i] *= 6.0;
    }
    v
}

/// The dequantized operand (stored layout `[outer, K]`, factor applied) as quant forms it.
fn fake(
    x: &[f32],
    (rows, cols): (usize, usize),
    q: &OperandQuant,
    usage: Usage,
    role: OperandRole,
    step: u64,
    state: &QuantState,
) -> Vec<f32> {
    let key = RngKey {
        seed: SEED,
        stream: gemm_stream(LAYER, role, step).unwrap(),
    };
    let qz = Quantizer::new(*q, usage).unwrap().with_key(key);
    let mut out = vec![0.0f32; rows * cols];
    let mut st = state.clone();
    let f = qz
        .fake_quantize_into(MatRef::new(x, rows, cols).unwrap(), &mut st, &mut out)
        .unwrap();
    out.iter_mut().for_each(|v| *v *= f);
    out
}

/// `S[i, j] = Σ_k |a[i, k]| |b[j, k]|` in f64 for `a: [m, k]`, `b: [n, k]`.
fn abs_products(a: &[f32], b: &[f32], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut s = vec![0.0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            s[i * n + j] = (0..k)
                .map(|q| (a[i * k + q] as f64 * b[j * k + q] as f64).abs())
                .sum();
        }
    }
    s
}

/// Asserts `|got - want| <= (2 (K + 1) u) S + extra` per element; returns the worst ratio.
fn within(what: &str, got: &[f32], want: &[f32], s: &[f64], k: usize, extra: &[f64]) -> f64 {
    let u = f64::powi(2.0, -24);
    assert_eq!(
        (got.len(), want.len()),
        (s.len(), s.len()),
        "{what}: lengths"
    );
    let mut worst = 0.0f64;
    for (i, ((&a, &b), &si)) in got.iter().zip(want).zip(s).enumerate() {
        let bound = 2.0 * (k as f64 + 1.0) * u * si + extra.get(i).copied().unwrap_or(0.0);
        let d = (a as f64 - b as f64).abs();
        assert!(
            d <= bound,
            "{what}[{i}]: device {a} vs CPU {b}: |diff| {d:e} > bound {bound:e}"
        );
        if bound > 0.0 {
            worst = worst.max(d / bound);
        }
    }
    worst
}

/// Every quantized built-in policy, two steps each: the device layer equals the CPU layer on
/// identical inputs within the accumulation-order bound derived in the module docs.
pub fn quantized_linear_matches_cpu_layer(dev: &Arc<DeviceBackend>) {
    for name in [
        "bf16",
        "nvfp4",
        "mxfp8",
        "mxfp4",
        "fp8-current",
        "fp8-delayed",
    ] {
        let p = GemmPolicy::preset(name).unwrap();
        let cpu = run(&p, None, 2);
        let gpu = run(&p, Some(dev), 2);
        let mut worst = 0.0f64;
        for (step, ((before, c), (_, d))) in cpu.iter().zip(&gpu).enumerate() {
            let step = step as u64;
            let what = |t: &str| format!("{name} step {step} {t}");
            assert_eq!(d.state, c.state, "{}", what("quantizer state"));
            same_bits(&what("bias gradient"), &d.db, &c.db);
            let st = |role: OperandRole| {
                before
                    .as_ref()
                    .map_or_else(QuantState::new, |s| s.operand(role).clone())
            };
            let (xs, r) = (
                data(T * N_IN, 1.0, 63 + step),
                data(T * N_OUT, 0.01, 73 + step),
            );
            let ws = init::normal(N_OUT * N_IN, 0.3, 61);
            let (row, col) = (Usage::Rowwise, Usage::Columnwise);
            let f = |x: &[f32], dims, q: &OperandQuant, u, role| {
                fake(x, dims, q, u, role, step, &st(role))
            };
            // Fprop: X [T, N_IN] · W [N_OUT, N_IN]ᵀ, then the bias
            let a = f(&xs, (T, N_IN), &p.fprop.a, row, OperandRole::FpropX);
            let bq = f(&ws, (N_OUT, N_IN), &p.fprop.b, row, OperandRole::FpropW);
            let s = abs_products(&a, &bq, T, N_OUT, N_IN);
            let bias = init::normal(N_OUT, 0.1, 62);
            let u = f64::powi(2.0, -24);
            let extra: Vec<f64> = (0..T * N_OUT)
                .map(|i| u * (s[i] + (bias[i % N_OUT] as f64).abs()))
                .collect();
            worst = worst.max(within(&what("y"), &d.y, &c.y, &s, N_IN, &extra));
            // Dgrad: dY [T, N_OUT] · (Wᵀ [N_IN, N_OUT])ᵀ
            let a = f(&r, (T, N_OUT), &p.dgrad.a, row, OperandRole::DgradDy);
            let bq = f(&ws, (N_OUT, N_IN), &p.dgrad.b, col, OperandRole::DgradW);
            let s = abs_products(&a, &bq, T, N_IN, N_OUT);
            worst = worst.max(within(&what("dx"), &d.dx, &c.dx, &s, N_OUT, &[]));
            // Wgrad: dYᵀ [N_OUT, T] · (Xᵀ [N_IN, T])ᵀ
            let a = f(&r, (T, N_OUT), &p.wgrad.a, col, OperandRole::WgradDy);
            let bq = f(&xs, (T, N_IN), &p.wgrad.b, col, OperandRole::WgradX);
            let s = abs_products(&a, &bq, N_OUT, N_IN, T);
            worst = worst.max(within(&what("dW"), &d.dw, &c.dw, &s, T, &[]));
        }
        // quantization is real: not the FP32 layer
        let f32_run = run(&GemmPolicy::FP32, None, 1);
        assert_ne!(cpu[0].1.dw, f32_run[0].1.dw, "{name}");
        eprintln!("{name}: device layer vs CPU layer, worst |diff| / bound {worst:.3}");
    }
}

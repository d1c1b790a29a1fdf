//! The quantized GEMMs on the BF16 GEMM against an f64 reference of the same quantized
//! values, within the bound derived in docs/numerics.md#the-bf16-gemm, on training shapes and
//! on edge data (zero blocks, tiny and huge block scales, subnormal products).

mod common;
use common::*;

use fp_formats::mx::{MxElement, ScaleRule};
use quant::qgemm::quantized_matmul_tn;
use quant::{Fp8Element, GemmPolicy, OperandQuant, RngKey, Usage};

fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Scales 16-row x 32-column bands of `x` (`[rows, cols]`) by factors from `scales`, and
/// zeroes one band: blocks with tiny, huge and zero amax along K in both layouts.
fn banded(x: &mut [f32], rows: usize, cols: usize, scales: &[f32]) {
    for r in 0..rows {
        for c in 0..cols {
            let band = (r / 16 + c / 32) % scales.len();
            x[r * cols + c] *= scales[band];
        }
    }
}

/// `scales` bands A; B gets the same list without factors above 1e3 (so no product of two
/// quantized values overflows f32, which no real operand pair comes near).
fn check(qa: &OperandQuant, qb: &OperandQuant, dims: (usize, usize, usize), scales: &[f32]) {
    let (m, n, k) = dims;
    let mut a = data(m * k, 1);
    let mut b = data(n * k, 2);
    banded(&mut a, m, k, scales);
    let b_scales: Vec<f32> = scales.iter().copied().filter(|s| *s <= 1e3).collect();
    banded(&mut b, n, k, &b_scales);
    let key = RngKey { seed: 3, stream: 4 };
    let quant = |x: &[f32], rows: usize, q: &OperandQuant| {
        let mut buf = vec![0.0f32; rows * k];
        let f = fake_quantize_into(x, rows, k, Usage::Rowwise, q, key, &mut buf).unwrap();
        (buf, f)
    };
    let ((fa, sa), (fb, sb)) = (quant(&a, m, qa), quant(&b, n, qb));
    let mut got = vec![f32::NAN; m * n];
    quantized_matmul_tn(
        op_key(&a, m, k, Usage::Rowwise, qa, key),
        op_key(&b, n, k, Usage::Rowwise, qb, key),
        &mut got,
    )
    .unwrap();
    // α = f_A · f_B is formed in f32, as the GEMM's epilogue does (it may underflow for two
    // tiny per-tensor factors; that is the epilogue's arithmetic, not the BF16 GEMM's)
    let alpha = (sa * sb) as f64;
    let nr = (17 + k.div_ceil(32)) as f64;
    let u = 2f64.powi(-24);
    let gamma = nr * u / (1.0 - nr * u);
    let tiny = f32::MIN_POSITIVE as f64;
    for i in 0..m {
        for j in 0..n {
            let (mut exact, mut abs, mut flushed) = (0.0f64, 0.0f64, 0.0f64);
            for kk in 0..k {
                let (x, y) = (fa[i * k + kk] as f64, fb[j * k + kk] as f64);
                exact += x * y;
                abs += (x * y).abs();
                if x.abs() < tiny || y.abs() < tiny {
                    flushed += (x * y).abs(); // an input read as zero
                }
            }
            // roundings, flushed partial sums (at most one per addition), then α's rounding
            let sums = (k.div_ceil(32) * 34) as f64;
            let bound = alpha.abs() * (gamma * abs + flushed + sums * tiny)
                + (exact * alpha).abs() * u
                + 2f64.powi(-149);
            let err = (got[i * n + j] as f64 - exact * alpha).abs();
            assert!(
                err <= bound,
                "{qa:?} x {qb:?} ({i},{j}): {:e} vs {:e}, error {err:e} > {bound:e}",
                got[i * n + j],
                exact * alpha
            );
        }
    }
}

#[test]
fn quantized_gemms_within_the_bound_on_training_shapes() {
    let p = GemmPolicy::nvfp4_paper();
    let mx = OperandQuant::mx(MxElement::E4M3, ScaleRule::Rceil);
    let fp8 = OperandQuant::fp8_current(Fp8Element::E4M3);
    for (qa, qb) in [
        (p.fprop.a, p.fprop.b),
        (mx, mx),
        (fp8, fp8),
        (OperandQuant::BF16, OperandQuant::BF16),
    ] {
        check(&qa, &qb, (64, 96, 352), &[1.0]);
    }
}

#[test]
fn quantized_gemms_within_the_bound_on_edge_data() {
    let p = GemmPolicy::nvfp4_paper();
    let mx4 = OperandQuant::mx(MxElement::E2M1, ScaleRule::Floor);
    let mx8 = OperandQuant::mx(MxElement::E4M3, ScaleRule::Rceil);
    let fp8 = OperandQuant::fp8_current(Fp8Element::E5M2);
    // zero blocks, blocks near the bottom of the normal range (subnormal products and
    // values read as zero), huge blocks (MX scales near 2^127)
    let scales = [1.0, 0.0, 1e-36, 3e-39, 1e30, 1e-20, 2.0];
    for (qa, qb) in [(p.fprop.a, p.fprop.b), (mx4, mx4), (mx8, mx8), (fp8, fp8)] {
        check(&qa, &qb, (48, 40, 128), &scales);
    }
    // per-tensor FP8: one tiny and one huge tensor
    check(&fp8, &fp8, (32, 32, 64), &[1e-30, 1e-30]);
    check(&fp8, &fp8, (32, 32, 64), &[1e25, 1e-25, 1.0]);
}

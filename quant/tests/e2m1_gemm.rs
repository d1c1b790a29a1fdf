//! The E2M1 block GEMM (docs/numerics.md#the-e2m1-block-gemm): its kernel against the
//! scalar model bit for bit on NVFP4 and MXFP4 operands of training and odd shapes, both
//! view layouts, packed-once B and 1 to 3 threads; the model against an f64 reference within
//! one rounding per group of 16; edge data (zero groups, the extreme E4M3 scales, exact
//! cancellation); operands whose values are not E2M1 refused; and the quantized GEMM of two
//! E2M1 operands running on it where it runs.

mod common;
use common::*;

use fp_formats::mx::{MxElement, ScaleRule};
use quant::gemm::e2m1::{
    e2m1_dot_reference, e2m1_gemm_tn, e2m1_gemm_tn_packed, e2m1_gemm_tn_portable, e2m1_native,
    E2m1Workspace, PackedE2m1B,
};
use quant::gemm::MatRef;
use quant::qgemm::{quantized_matmul_tn, Operand};
use quant::{BlockShape, OperandQuant, QuantState, Quantizer, RngKey, RoundingMode, Usage};

fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|i| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
            // blocks of different magnitudes, so that groups get different scales
            u * [1.0, 3e-3, 40.0, 0.25][(i / 23) % 4]
        })
        .collect()
}

/// `[rows, cols]` data fake-quantized rowwise with `q` (unscaled values, as the GEMM takes
/// them).
fn fake(q: &OperandQuant, rows: usize, cols: usize, seed: u64) -> Vec<f32> {
    let x = data(rows * cols, seed);
    let quantizer = Quantizer::new(*q, Usage::Rowwise)
        .unwrap()
        .with_key(RngKey { seed, stream: 3 });
    let mut out = vec![0.0; rows * cols];
    let view = MatRef::new(&x, rows, cols).unwrap();
    quantizer
        .fake_quantize_into(view, &mut QuantState::new(), &mut out)
        .unwrap();
    out
}

fn e2m1_formats() -> Vec<OperandQuant> {
    vec![
        OperandQuant::nvfp4(),
        OperandQuant::nvfp4().with_rounding(RoundingMode::Stochastic),
        OperandQuant::nvfp4().with_block(BlockShape::Tile16),
        OperandQuant::mx(MxElement::E2M1, ScaleRule::Floor),
    ]
}

fn same_bits(x: &[f32], y: &[f32]) -> bool {
    x.len() == y.len() && x.iter().zip(y).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// `x: [rows, cols]` copied into its transpose and viewed back as `[rows, cols]`.
fn transposed_copy(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    (0..rows * cols)
        .map(|i| x[(i % rows) * cols + i / rows])
        .collect()
}

#[test]
fn kernel_equals_the_model_on_every_shape_layout_and_thread_count() {
    let fs = e2m1_formats();
    // partial groups, rows and panels; K = 1040 spans two slabs of 64 groups
    let shapes = [
        (1, 1, 1),
        (1, 17, 16),
        (3, 5, 24),
        (2, 16, 1040),
        (33, 47, 100),
        (64, 48, 256),
    ];
    for (i, &(m, n, k)) in shapes.iter().enumerate() {
        let (qa, qb) = (&fs[i % fs.len()], &fs[(i + 1) % fs.len()]);
        let (a, b) = (fake(qa, m, k, 1 + i as u64), fake(qb, n, k, 50 + i as u64));
        let (av, bv) = (MatRef::row_major(&a, m, k), MatRef::row_major(&b, n, k));
        let mut want = vec![f32::NAN; m * n];
        assert!(e2m1_gemm_tn_portable(av, bv, &mut want));
        // the model element by element
        for r in 0..m.min(3) {
            for c in 0..n.min(3) {
                let dot = e2m1_dot_reference(&a[r * k..][..k], &b[c * k..][..k]).unwrap();
                assert_eq!(dot.to_bits(), want[r * n + c].to_bits());
            }
        }
        let (at, bt) = (transposed_copy(&a, m, k), transposed_copy(&b, n, k));
        let atv = MatRef::row_major(&at, k, m).t();
        let btv = MatRef::row_major(&bt, k, n).t();
        for threads in [1, 2, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                let mut ws = E2m1Workspace::new();
                for (x, y) in [(av, bv), (atv, btv), (av, btv)] {
                    let mut got = vec![f32::NAN; m * n];
                    assert!(e2m1_gemm_tn(x, y, &mut got, &mut ws));
                    assert!(same_bits(&got, &want), "[{m}, {n}, {k}] {threads} threads");
                }
                if let Some(p) = PackedE2m1B::new(bv) {
                    assert_eq!(p.dims(), (n, k));
                    let mut got = vec![f32::NAN; m * n];
                    assert!(e2m1_gemm_tn_packed(atv, &p, &mut got, &mut ws));
                    assert!(same_bits(&got, &want));
                } else {
                    assert!(!e2m1_native());
                }
            });
        }
    }
}

#[test]
fn empty_products_are_products() {
    let x = vec![1.5f32; 64];
    for (m, n, k) in [(0, 3, 16), (3, 0, 16), (3, 4, 0), (0, 0, 0)] {
        let (a, b) = (
            MatRef::row_major(&x[..m * k], m, k),
            MatRef::row_major(&x[..n * k], n, k),
        );
        let mut out = vec![f32::NAN; m * n];
        assert!(e2m1_gemm_tn(a, b, &mut out, &mut E2m1Workspace::new()));
        assert!(out.iter().all(|&v| v == 0.0), "[{m}, {n}, {k}]");
        let mut model = vec![f32::NAN; m * n];
        assert!(e2m1_gemm_tn_portable(a, b, &mut model));
        assert!(model.iter().all(|&v| v == 0.0));
        if let Some(p) = PackedE2m1B::new(b) {
            let mut out = vec![f32::NAN; m * n];
            assert!(e2m1_gemm_tn_packed(
                a,
                &p,
                &mut out,
                &mut E2m1Workspace::new()
            ));
            assert!(out.iter().all(|&v| v == 0.0));
        }
    }
}

#[test]
fn one_rounding_per_group_bounds_the_error() {
    let (m, n, k) = (24, 20, 2048);
    let mut worst = 0.0f64;
    for q in e2m1_formats() {
        let (a, b) = (fake(&q, m, k, 7), fake(&q, n, k, 8));
        let mut got = vec![0.0; m * n];
        assert!(e2m1_gemm_tn(
            MatRef::row_major(&a, m, k),
            MatRef::row_major(&b, n, k),
            &mut got,
            &mut E2m1Workspace::new()
        ));
        let groups = k.div_ceil(16) as f64;
        for r in 0..m {
            for c in 0..n {
                let (x, y) = (&a[r * k..][..k], &b[c * k..][..k]);
                let exact: f64 = x.iter().zip(y).map(|(&p, &q)| p as f64 * q as f64).sum();
                let abs: f64 = x
                    .iter()
                    .zip(y)
                    .map(|(&p, &q)| (p as f64 * q as f64).abs())
                    .sum();
                let err = (got[r * n + c] as f64 - exact).abs();
                // each of the `groups` roundings is at most 2^-24 of a partial sum
                let bound = groups * 2f64.powi(-24) * abs;
                assert!(err <= bound, "{q:?}: error {err:e} > bound {bound:e}");
                if bound > 0.0 {
                    worst = worst.max(err / bound);
                }
            }
        }
    }
    // the bound is not vacuous: some sums did round
    assert!(worst > 0.0, "no rounding at all is implausible at K = {k}");
}

#[test]
fn edge_groups_follow_the_model() {
    // zero groups, the smallest (subnormal) and largest E4M3 scales, exact cancellation,
    // signed zeros, a lone value in a group
    let k = 16 * 6;
    let tiny = 2f32.powi(-9) * 0.5; // E4M3's smallest scale times the smallest E2M1 value
    let mut a = vec![0.0f32; 4 * k];
    let mut b = vec![0.0f32; 3 * k];
    for j in 0..16 {
        a[16 + j] = [6.0, -6.0][j % 2] * 448.0; // group 1: the largest scale
        a[32 + j] = [0.5, 1.5, -3.0, 4.0][j % 4] * tiny * 2.0;
        a[48 + j] = if j % 2 == 0 { 2.0 } else { -2.0 };
        a[k + j] = -0.0;
        a[2 * k + 80 + j] = if j == 5 { 0.5 } else { 0.0 };
        b[j] = 1.0;
        b[16 + j] = 448.0 * 4.0;
        b[32 + j] = 3.0 * tiny;
        b[48 + j] = 1.0; // 2 - 2 + 2 - 2 ...: exact zero
        b[k + 64 + j] = -6.0;
        b[2 * k + 80 + j] = 2f32.powi(-10) * 12.0;
    }
    a.copy_within(..k, 3 * k);
    let (m, n) = (4, 3);
    let (av, bv) = (MatRef::row_major(&a, m, k), MatRef::row_major(&b, n, k));
    let mut want = vec![0.0; m * n];
    assert!(e2m1_gemm_tn_portable(av, bv, &mut want));
    let mut got = vec![0.0; m * n];
    assert!(e2m1_gemm_tn(av, bv, &mut got, &mut E2m1Workspace::new()));
    assert!(same_bits(&got, &want));
    for r in 0..m {
        for c in 0..n {
            let exact: f64 = (0..k)
                .map(|i| a[r * k + i] as f64 * b[c * k + i] as f64)
                .sum();
            // these sums are exact in FP32
            assert_eq!(want[r * n + c] as f64, exact, "({r}, {c})");
        }
    }
    // no negative zero comes out
    assert!(want.iter().all(|v| v.to_bits() != (-0.0f32).to_bits()));
}

#[test]
fn values_that_are_not_e2m1_are_refused() {
    let (m, n, k) = (5, 4, 48);
    let b = fake(&OperandQuant::nvfp4(), n, k, 2);
    let bv = MatRef::row_major(&b, n, k);
    // BF16 values, an E2M1 group beyond 12 steps, NaN, infinity
    let bf16 = fake(&OperandQuant::BF16, m, k, 1);
    let mut steps = vec![0.0f32; m * k];
    steps[20] = 6.0;
    steps[21] = 0.25;
    let mut nan = vec![0.0f32; m * k];
    nan[m * k - 1] = f32::NAN;
    let mut inf = vec![0.0f32; m * k];
    inf[7] = f32::INFINITY;
    for a in [bf16, steps, nan, inf] {
        let av = MatRef::row_major(&a, m, k);
        let mut out = vec![0.0; m * n];
        assert!(!e2m1_gemm_tn(av, bv, &mut out, &mut E2m1Workspace::new()));
        assert!(!e2m1_gemm_tn(
            bv,
            av,
            &mut vec![0.0; m * n],
            &mut E2m1Workspace::new()
        ));
        assert!(!e2m1_gemm_tn_portable(av, bv, &mut out));
        assert!(PackedE2m1B::new(av).is_none());
    }
}

/// Two E2M1 operands multiply on the E2M1 GEMM where it runs (the BF16 GEMM elsewhere), and a
/// pair whose values do not split falls back to the BF16 GEMM, both times α applied after.
#[test]
fn the_quantized_gemm_of_two_e2m1_operands_runs_on_it() {
    let (m, n, k) = (40, 24, 160);
    let q = OperandQuant::nvfp4();
    let (x, w) = (data(m * k, 1), data(n * k, 2));
    let key = RngKey { seed: 3, stream: 4 };
    let mut got = vec![0.0; m * n];
    quantized_matmul_tn(
        op_key(&x, m, k, Usage::Rowwise, &q, key),
        op_key(&w, n, k, Usage::Rowwise, &q, key),
        &mut got,
    )
    .unwrap();
    let (mut fx, mut fw) = (vec![0.0; m * k], vec![0.0; n * k]);
    let sx = fake_quantize_into(&x, m, k, Usage::Rowwise, &q, key, &mut fx).unwrap();
    let sw = fake_quantize_into(&w, n, k, Usage::Rowwise, &q, key, &mut fw).unwrap();
    let (fxv, fwv) = (MatRef::row_major(&fx, m, k), MatRef::row_major(&fw, n, k));
    let mut want = vec![0.0; m * n];
    if e2m1_native() {
        assert!(e2m1_gemm_tn_portable(fxv, fwv, &mut want));
    } else {
        quant::gemm::bf16::quantized_gemm_tn(
            fxv,
            fwv,
            &mut want,
            &mut quant::gemm::bf16::Bf16Workspace::new(),
        );
    }
    want.iter_mut().for_each(|v| *v *= sx * sw);
    assert!(same_bits(&got, &want));
    // an NVFP4 operand times a BF16 one is no E2M1 product
    let mut mixed = vec![0.0; m * n];
    let bf16 = OperandQuant::BF16;
    quantized_matmul_tn(
        Operand::new(
            MatRef::new(&x, m, k).unwrap(),
            quantizer(&q, Usage::Rowwise, key).unwrap(),
        ),
        op_key(&w, n, k, Usage::Rowwise, &bf16, key),
        &mut mixed,
    )
    .unwrap();
    assert!(mixed.iter().all(|v| v.is_finite()));
}

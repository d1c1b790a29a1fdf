//! The emulated quantized GEMM: FP32 is bit for bit the plain sgemm (no copies, transposed
//! views), two quantized operands equal "fake-quantize (exactly BF16), BF16 GEMM, α
//! epilogue" bit for bit (with an FP32 operand: the same with sgemm), and shapes /
//! configurations are checked with typed errors.

mod common;
use common::*;

use fp_formats::mx::{MxElement, ScaleRule};
use quant::gemm::bf16::{bf16_bits, quantized_gemm_tn, Bf16Workspace};
use quant::gemm::{matmul_tn, sgemm, MatRef};
use quant::qgemm::{
    fake_operand, quantized_matmul_tn, quantized_matmul_tn_prequantized, quantized_matmul_tn_with,
    GemmWorkspace,
};
use quant::{
    AmaxAlgo, BlockShape, Fp8Element, Fp8Scaling, GemmPolicy, OperandQuant, QuantError,
    QuantFormat, QuantState, Quantizer, Rht, RngKey, RoundingMode, Usage,
};

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u32 ^ seed.wrapping_mul(0x9E37_79B9)).wrapping_mul(2_654_435_761);
            ((h >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 2.0
        })
        .collect()
}

fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0; x.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = x[r * cols + c];
        }
    }
    t
}

#[test]
fn fp32_is_plain_sgemm_bit_for_bit() {
    let (m, n, k) = (37, 29, 70);
    let a = data(m * k, 1);
    let b = data(n * k, 2);
    let f = OperandQuant::F32;
    let mut want = vec![0.0f32; m * n];
    matmul_tn(&a, &b, m, n, k, &mut want);
    let mut got = vec![f32::NAN; m * n];
    quantized_matmul_tn(
        op(&a, m, k, Usage::Rowwise, &f),
        op(&b, n, k, Usage::Rowwise, &f),
        &mut got,
    )
    .unwrap();
    assert!(got
        .iter()
        .zip(&want)
        .all(|(x, y)| x.to_bits() == y.to_bits()));
    // Columnwise operands are transposed views of the same data: A = atᵀ, B = btᵀ.
    let at = transpose(&a, m, k); // [k, m]
    let bt = transpose(&b, n, k); // [k, n]
    let mut want2 = vec![0.0f32; m * n];
    sgemm(
        1.0,
        MatRef::row_major(&at, k, m).t(),
        MatRef::row_major(&bt, k, n),
        0.0,
        &mut want2,
    );
    quantized_matmul_tn(
        op(&at, k, m, Usage::Columnwise, &f),
        op(&bt, k, n, Usage::Columnwise, &f),
        &mut got,
    )
    .unwrap();
    assert!(got
        .iter()
        .zip(&want2)
        .all(|(x, y)| x.to_bits() == y.to_bits()));
}

/// Every quantized policy: out == α · GEMM(fake_A, fake_B) bit for bit, with α the product of
/// the per-tensor factors applied after the accumulation and the BF16 GEMM when both operands
/// are quantized (their fake values are exactly BF16), sgemm otherwise.
#[test]
fn quantized_equals_fake_quantize_then_gemm() {
    let (m, n, k) = (40, 24, 64);
    let key_a = RngKey {
        seed: 1,
        stream: 10,
    };
    let key_b = RngKey {
        seed: 1,
        stream: 10,
    }; // same key: same random Hadamard signs
    let mut mixed =
        OperandQuant::mx(MxElement::E2M1, ScaleRule::Floor).with_rounding(RoundingMode::Stochastic);
    mixed.format = QuantFormat::Mx {
        element: MxElement::E2M1,
        rule: ScaleRule::Floor,
        sr_prescale: true,
    };
    let p = GemmPolicy::nvfp4_paper();
    let cases: Vec<(OperandQuant, OperandQuant, Usage)> = vec![
        (p.fprop.a, p.fprop.b, Usage::Rowwise),
        (p.wgrad.a, p.wgrad.b, Usage::Columnwise),
        (
            OperandQuant::fp8_current(Fp8Element::E4M3),
            OperandQuant::fp8_current(Fp8Element::E5M2),
            Usage::Rowwise,
        ),
        (
            OperandQuant::mx(MxElement::E4M3, ScaleRule::Rceil),
            OperandQuant::mx(MxElement::E3M2, ScaleRule::Even),
            Usage::Columnwise,
        ),
        (mixed, mixed, Usage::Rowwise),
        (OperandQuant::BF16, OperandQuant::F32, Usage::Columnwise),
        // BF16 round-to-nearest on both sides: handed to the GEMM unrounded where it rounds
        // its inputs itself (AMX), the same bits
        (OperandQuant::BF16, OperandQuant::BF16, Usage::Rowwise),
        (OperandQuant::BF16, OperandQuant::BF16, Usage::Columnwise),
        (
            OperandQuant::BF16,
            OperandQuant::mx(MxElement::E4M3, ScaleRule::Rceil),
            Usage::Rowwise,
        ),
        // elementwise formats, columnwise: rounded in the source layout, read transposed
        (
            OperandQuant::fp8_current(Fp8Element::E4M3),
            OperandQuant::fp8_current(Fp8Element::E5M2),
            Usage::Columnwise,
        ),
        // ... but not with stochastic rounding (its bits follow the stored layout)
        (
            OperandQuant::BF16.with_rounding(RoundingMode::Stochastic),
            OperandQuant::fp8_current(Fp8Element::E5M2).with_rounding(RoundingMode::Stochastic),
            Usage::Columnwise,
        ),
        (
            OperandQuant::mx(MxElement::E2M1, ScaleRule::Rceil).with_rht(Rht::RandomSigns),
            OperandQuant::mx(MxElement::E2M1, ScaleRule::Rceil).with_rht(Rht::RandomSigns),
            Usage::Columnwise,
        ),
    ];
    let mut ws = GemmWorkspace::new();
    for (qa, qb, usage) in cases {
        let (ar, ac) = if usage == Usage::Rowwise {
            (m, k)
        } else {
            (k, m)
        };
        let (br, bc) = if usage == Usage::Rowwise {
            (n, k)
        } else {
            (k, n)
        };
        let a = data(ar * ac, 3);
        let b = data(br * bc, 4);
        // Random Hadamard signs: one mask for both operands (the GEMM refuses two).
        let key_b = if qa.rht == Rht::RandomSigns {
            key_a
        } else {
            key_b
        };
        let mut fa = vec![0.0f32; m * k];
        let mut fb = vec![0.0f32; n * k];
        let sa = fake_quantize_into(&a, ar, ac, usage, &qa, key_a, &mut fa).unwrap();
        let sb = fake_quantize_into(&b, br, bc, usage, &qb, key_b, &mut fb).unwrap();
        let mut want = vec![0.0f32; m * n];
        let quantized = [&qa, &qb].map(|q| q.format != QuantFormat::F32);
        for (q, f) in quantized.iter().zip([&fa, &fb]) {
            if *q {
                let exact = |x: &f32| f32::from_bits((bf16_bits(*x) as u32) << 16) == *x;
                assert!(f.iter().all(exact), "{qa:?} / {qb:?}: not exactly BF16");
            }
        }
        if quantized == [true, true] {
            quantized_values_product(
                (MatRef::row_major(&fa, m, k), MatRef::row_major(&fb, n, k)),
                (&qa, &qb),
                &mut want,
            );
        } else {
            matmul_tn(&fa, &fb, m, n, k, &mut want);
        }
        let alpha = sa * sb;
        for v in &mut want {
            *v *= alpha;
        }
        let mut got = vec![0.0f32; m * n];
        quantized_matmul_tn_with(
            op_key(&a, ar, ac, usage, &qa, key_a),
            op_key(&b, br, bc, usage, &qb, key_b),
            &mut got,
            &mut ws,
        )
        .unwrap();
        assert!(
            got.iter()
                .zip(&want)
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "{qa:?} x {qb:?}"
        );
        // And it approximates the exact product.
        let mut exact = vec![0.0f32; m * n];
        let (a_op, b_op) = if usage == Usage::Rowwise {
            (a.clone(), b.clone())
        } else {
            (transpose(&a, ar, ac), transpose(&b, br, bc))
        };
        matmul_tn(&a_op, &b_op, m, n, k, &mut exact);
        let num: f64 = got
            .iter()
            .zip(&exact)
            .map(|(x, y)| ((x - y) as f64).powi(2))
            .sum();
        let den: f64 = exact.iter().map(|y| (*y as f64).powi(2)).sum();
        assert!(
            (num / den).sqrt() < 0.4,
            "{qa:?}: relative error {}",
            (num / den).sqrt()
        );
    }
}

#[test]
fn delayed_fp8_needs_state_and_updates_it() {
    let q = OperandQuant {
        format: QuantFormat::Fp8 {
            element: Fp8Element::E4M3,
            scaling: Fp8Scaling::Delayed {
                history_len: 4,
                margin: 0,
                algo: AmaxAlgo::Max,
            },
        },
        ..OperandQuant::F32
    };
    let a = data(8 * 32, 5);
    let b = data(4 * 32, 6);
    let f = OperandQuant::F32;
    let mut out = vec![0.0f32; 32];
    let r = quantized_matmul_tn(
        op(&a, 8, 32, Usage::Rowwise, &q),
        op(&b, 4, 32, Usage::Rowwise, &f),
        &mut out,
    );
    assert!(matches!(r, Err(QuantError::InvalidConfig(_))));
    let mut st = QuantState::new();
    quantized_matmul_tn(
        op(&a, 8, 32, Usage::Rowwise, &q).with_state(&mut st),
        op(&b, 4, 32, Usage::Rowwise, &f),
        &mut out,
    )
    .unwrap();
    let amax = a.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    assert_eq!(st.amax_history()[0], amax);
    st.end_step(&q).unwrap();
    assert_eq!(st.scale(), 448.0 / amax);
}

#[test]
fn shape_errors() {
    let f = OperandQuant::F32;
    let nv = OperandQuant::nvfp4();
    let a = data(6 * 16, 1);
    let b = data(5 * 32, 2);
    let mut out = vec![0.0f32; 30];
    let r = quantized_matmul_tn(
        op(&a, 6, 16, Usage::Rowwise, &nv),
        op(&b, 5, 32, Usage::Rowwise, &f),
        &mut out,
    );
    assert!(matches!(r, Err(QuantError::GemmShape(_))));
    let r = quantized_matmul_tn(
        op(&a, 6, 16, Usage::Rowwise, &nv),
        op(&b, 10, 16, Usage::Rowwise, &f),
        &mut out,
    );
    assert!(matches!(r, Err(QuantError::GemmShape(_))), "{r:?}");
    let r = quantized_matmul_tn(
        op(&a, 6, 17, Usage::Rowwise, &nv),
        op(&b, 10, 16, Usage::Rowwise, &f),
        &mut out,
    );
    assert!(matches!(r, Err(QuantError::Format(_))));
    // invalid settings never make an operand: Quantizer::new refuses them
    let bad = nv.with_block(BlockShape::Row32);
    let r = Quantizer::new(bad, Usage::Rowwise);
    assert!(matches!(r, Err(QuantError::InvalidConfig(_))));
    // Columnwise: A = aᵀ is [16, 6], so K = 6 must match B's K.
    let b6 = data(3 * 6, 3);
    let mut out2 = vec![0.0f32; 48];
    quantized_matmul_tn(
        op(&a, 6, 16, Usage::Columnwise, &f),
        op(&b6, 3, 6, Usage::Rowwise, &f),
        &mut out2,
    )
    .unwrap();
}

#[test]
fn workspace_is_reused_and_threads_do_not_matter() {
    let (m, n, k) = (64, 48, 128);
    let a = data(m * k, 7);
    let b = data(n * k, 8);
    let qa = OperandQuant::nvfp4().with_rounding(RoundingMode::Stochastic);
    let qb = OperandQuant::nvfp4().with_block(BlockShape::Tile16);
    let key = RngKey { seed: 3, stream: 3 };
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let mut out = vec![0.0f32; m * n];
            for _ in 0..3 {
                quantized_matmul_tn(
                    op_key(&a, m, k, Usage::Rowwise, &qa, key),
                    op(&b, n, k, Usage::Rowwise, &qb),
                    &mut out,
                )
                .unwrap();
            }
            out
        })
    };
    assert_eq!(run(1), run(2));
}

#[test]
fn operands_transformed_differently_are_refused() {
    let (m, n, k) = (8, 8, 32);
    let a = data(k * m, 5);
    let b = data(k * n, 6);
    let mut out = vec![0.0f32; m * n];
    let rht = OperandQuant::nvfp4().with_rht(Rht::FixedSigns);
    let plain = OperandQuant::nvfp4();
    let random = OperandQuant::nvfp4().with_rht(Rht::RandomSigns);
    let key = |stream| RngKey { seed: 1, stream };
    let run = |qa: &OperandQuant, qb: &OperandQuant, ka, kb, out: &mut [f32]| {
        quantized_matmul_tn(
            op_key(&a, k, m, Usage::Columnwise, qa, key(ka)),
            op_key(&b, k, n, Usage::Columnwise, qb, key(kb)),
            out,
        )
    };
    // RHT on one side only, or random signs from two streams: the product would change.
    for (qa, qb, ka, kb) in [
        (&rht, &plain, 0, 0),
        (&plain, &rht, 0, 0),
        (&random, &random, 1, 2),
    ] {
        let e = run(qa, qb, ka, kb, &mut out).unwrap_err();
        assert!(
            matches!(&e, QuantError::InvalidConfig(m) if m.contains("differently")),
            "{e}"
        );
    }
    // The same signs on both sides are fine, random ones from one stream too.
    run(&rht, &rht, 0, 0, &mut out).unwrap();
    run(&random, &random, 3, 3, &mut out).unwrap();
}

/// BF16 round-to-nearest operands at the edges of the rounding (ties to even both ways, values
/// that round up to the next binade or overflow to infinity, subnormals): the quantized GEMM,
/// directly and with a prequantized B, equals rounding first and then the BF16 GEMM.
#[test]
fn bf16_operands_equal_rounding_first_on_edge_values() {
    let (m, n, k) = (33, 18, 70);
    let edge = [
        1.0 + f32::EPSILON * 64.0,  // tie: rounds down to even
        1.0 + f32::EPSILON * 192.0, // tie: rounds up to even
        1.999_999_9,                // rounds up to 2
        -3.390_e38,                 // rounds to -Inf
        3.0e-39,                    // subnormal
        -0.0,
        0.337,
    ];
    let a: Vec<f32> = (0..m * k)
        .map(|i| edge[i % edge.len()] * if i % 3 == 0 { 1.0 } else { 1e-3 })
        .collect();
    let b: Vec<f32> = data(n * k, 9);
    let round = |x: &[f32]| -> Vec<f32> {
        x.iter()
            .map(|&v| f32::from_bits((bf16_bits(v) as u32) << 16))
            .collect()
    };
    let (ra, rb) = (round(&a), round(&b));
    let mut want = vec![0.0f32; m * n];
    quantized_gemm_tn(
        MatRef::row_major(&ra, m, k),
        MatRef::row_major(&rb, n, k),
        &mut want,
        &mut Bf16Workspace::new(),
    );
    let q = OperandQuant::BF16;
    let same = |got: &[f32]| {
        got.iter()
            .zip(&want)
            .all(|(x, y)| x.to_bits() == y.to_bits())
    };
    let mut got = vec![0.0f32; m * n];
    quantized_matmul_tn_with(
        op(&a, m, k, Usage::Rowwise, &q),
        op(&b, n, k, Usage::Rowwise, &q),
        &mut got,
        &mut GemmWorkspace::new(),
    )
    .unwrap();
    assert!(same(&got), "direct");
    let mut bq = vec![0.0f32; n * k];
    let bf = fake_operand(op(&b, n, k, Usage::Rowwise, &q), &mut bq).unwrap();
    let mut got = vec![0.0f32; m * n];
    quantized_matmul_tn_prequantized(op(&a, m, k, Usage::Rowwise, &q), bf, &mut got).unwrap();
    assert!(same(&got), "prequantized B");
}

/// A known tensor amax (`Quantizer::with_tensor_amax`) changes nothing but the work: under FP8
/// current scaling, rowwise and columnwise, as either operand, through the GEMM and through
/// `fake_operand`, the product, the factor and the state are those of measuring the amax;
/// delayed scaling and other formats ignore it, and the states stay ordinary ones.
#[test]
fn a_known_tensor_amax_gives_the_same_bits() {
    let (m, n, k) = (48, 40, 96);
    let (xa, xb) = (data(m * k, 31), data(n * k, 32));
    let current = OperandQuant::fp8_current(Fp8Element::E5M2);
    let delayed = OperandQuant {
        format: QuantFormat::Fp8 {
            element: Fp8Element::E4M3,
            scaling: Fp8Scaling::Delayed {
                history_len: 2,
                margin: 0,
                algo: AmaxAlgo::Max,
            },
        },
        ..OperandQuant::F32
    };
    let amax = |v: &[f32]| v.iter().fold(0.0f32, |a, x| a.max(x.abs()));
    for q in [current, delayed, OperandQuant::nvfp4()] {
        for usage in [Usage::Rowwise, Usage::Columnwise] {
            // `[outer, K]` operands, stored transposed for columnwise
            let (a, b) = match usage {
                Usage::Rowwise => (xa.clone(), xb.clone()),
                Usage::Columnwise => (transpose(&xa, m, k), transpose(&xb, n, k)),
            };
            fn view(v: &[f32], outer: usize, k: usize, usage: Usage) -> MatRef<'_> {
                match usage {
                    Usage::Rowwise => MatRef::new(v, outer, k).unwrap(),
                    Usage::Columnwise => MatRef::new(v, k, outer).unwrap(),
                }
            }
            let qz = Quantizer::new(q, usage).unwrap();
            let run = |known: bool| {
                let (mut sa, mut sb) = (QuantState::new(), QuantState::new());
                let mut out = vec![0.0f32; m * n];
                let (qa, qb) = match known {
                    true => (qz.with_tensor_amax(amax(&a)), qz.with_tensor_amax(amax(&b))),
                    false => (qz, qz),
                };
                let oa = quant::qgemm::Operand::new(view(&a, m, k, usage), qa);
                let ob = quant::qgemm::Operand::new(view(&b, n, k, usage), qb);
                quantized_matmul_tn(oa.with_state(&mut sa), ob.with_state(&mut sb), &mut out)
                    .unwrap();
                let mut buf = vec![0.0f32; m * k];
                let mut sf = QuantState::new();
                let of = quant::qgemm::Operand::new(view(&a, m, k, usage), qa);
                let fa = fake_operand(of.with_state(&mut sf), &mut buf)
                    .unwrap()
                    .factor;
                (bits(&out), sa, sb, bits(&buf), fa.to_bits(), sf)
            };
            let (with, without) = (run(true), run(false));
            assert!(with == without, "{q:?} {usage:?}");
            assert_eq!(
                with.1,
                QuantState::restore(
                    with.1.amax_history().to_vec(),
                    with.1.scale(),
                    with.1.last_amax(),
                    with.1.last_scale()
                )
            );
        }
    }
}

/// A tensor amax that is not the tensor's is refused with a typed error (too small, too
/// large, NaN), rowwise and columnwise, and the state keeps its last cast.
#[test]
fn a_wrong_tensor_amax_is_refused() {
    let (m, n, k) = (32, 16, 64);
    let (a, b) = (data(m * k, 41), data(n * k, 42));
    let true_amax = a.iter().fold(0.0f32, |x, v| x.max(v.abs()));
    let q = OperandQuant::fp8_current(Fp8Element::E4M3);
    for usage in [Usage::Rowwise, Usage::Columnwise] {
        let qz = Quantizer::new(q, usage).unwrap();
        let (ra, ca) = match usage {
            Usage::Rowwise => (m, k),
            Usage::Columnwise => (k, m),
        };
        let (rb, cb) = match usage {
            Usage::Rowwise => (n, k),
            Usage::Columnwise => (k, n),
        };
        for wrong in [true_amax * 0.5, true_amax * 2.0, f32::NAN, 0.0] {
            let mut st = QuantState::new();
            let mut out = vec![0.0f32; m * n];
            let qw = qz.with_tensor_amax(wrong);
            let oa = quant::qgemm::Operand::new(MatRef::new(&a, ra, ca).unwrap(), qw)
                .with_state(&mut st);
            let ob = quant::qgemm::Operand::new(MatRef::new(&b, rb, cb).unwrap(), qz);
            let r = quantized_matmul_tn(oa, ob, &mut out);
            assert!(
                matches!(r, Err(QuantError::InvalidConfig(ref e)) if e.contains("with_tensor_amax")),
                "{usage:?} {wrong}: {r:?}"
            );
            assert_eq!(st, QuantState::new(), "{usage:?} {wrong}");
        }
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

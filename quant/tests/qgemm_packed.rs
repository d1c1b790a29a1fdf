//! Quantized operands go into the BF16 GEMM quantized straight into its packed tiles (no f32
//! copy, where the tile unit runs; rowwise block-major, columnwise from the source-layout
//! kernels chunk-major): the product equals "fake-quantize the whole operand, then the BF16
//! GEMM, then α" bit for bit, for every format with that path, rowwise and columnwise, on
//! either side of the GEMM, on shapes that span several quantize-and-pack panels with
//! partial blocks, chunks and tiles, for 1 to 3 threads; the FP8 delayed-scaling state is
//! updated as by the f32 path, and non-finite input is still a typed error.

mod common;
use common::*;

use fp_formats::mx::{MxElement, ScaleRule};
use quant::gemm::MatRef;
use quant::qgemm::{fake_operand, quantized_matmul_tn_prequantized, quantized_matmul_tn_with};
use quant::qgemm::{
    quantized_matmul_tn_frozen, FakeOperand, FrozenOperand, GemmWorkspace, Operand,
};
use quant::{
    AmaxAlgo, BlockShape, Fp8Element, Fp8Scaling, OperandQuant, QuantError, QuantFormat,
    QuantState, Rht, RngKey, RoundingMode, Usage,
};

/// Whether two results are the same bits element for element.
fn same_bits(x: &[f32], y: &[f32]) -> bool {
    x.len() == y.len() && x.iter().zip(y).all(|(x, y)| x.to_bits() == y.to_bits())
}

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u32 ^ seed.wrapping_mul(0x9E37_79B9)).wrapping_mul(2_654_435_761);
            // a spread of magnitudes, so that blocks get different scales
            let m = ((h >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 2.0;
            m * [1.0, 1e-3, 30.0, 0.2][(i / 37) % 4]
        })
        .collect()
}

fn delayed(element: Fp8Element) -> OperandQuant {
    OperandQuant {
        format: QuantFormat::Fp8 {
            element,
            scaling: Fp8Scaling::Delayed {
                history_len: 4,
                margin: 0,
                algo: AmaxAlgo::Max,
            },
        },
        ..OperandQuant::F32
    }
}

/// Pairs of columnwise formats with a packed path (RHT on both sides or neither).
fn columnwise_pairs() -> Vec<(OperandQuant, OperandQuant)> {
    let f = formats();
    let rht = OperandQuant::nvfp4().with_rht(Rht::FixedSigns);
    let rht_sr = rht.with_rounding(RoundingMode::Stochastic);
    vec![
        (rht_sr, rht),
        (f[0], f[2]),
        (f[1], f[3]),
        (f[3], f[4]),
        (f[4], f[5]),
        (f[5], delayed(Fp8Element::E4M3)),
        (delayed(Fp8Element::E5M2), f[0]),
    ]
}

/// The formats whose rowwise operands take the packed path.
fn formats() -> Vec<OperandQuant> {
    let sr = RoundingMode::Stochastic;
    let mut mxfp4 = OperandQuant::mx(MxElement::E2M1, ScaleRule::Floor).with_rounding(sr);
    mxfp4.format = QuantFormat::Mx {
        element: MxElement::E2M1,
        rule: ScaleRule::Floor,
        sr_prescale: true,
    };
    vec![
        OperandQuant::nvfp4(),
        OperandQuant::nvfp4().with_rounding(sr),
        OperandQuant::nvfp4().with_block(BlockShape::Tile16),
        OperandQuant::mx(MxElement::E4M3, ScaleRule::Rceil),
        mxfp4,
        OperandQuant::fp8_current(Fp8Element::E4M3),
        OperandQuant::fp8_current(Fp8Element::E5M2).with_rounding(sr),
        delayed(Fp8Element::E5M2),
    ]
}

/// The product through the packed path (A and B rowwise, quantized in the call) against the
/// whole-operand reference, for `threads` threads. Returns the output and the two states.
fn run(
    (qa, qb, usage): (&OperandQuant, &OperandQuant, Usage),
    (m, n, k): (usize, usize, usize),
    threads: usize,
) -> (Vec<f32>, [QuantState; 2]) {
    let (a, b) = (data(m * k, 1), data(n * k, 2));
    // the tensors: [outer, K] rowwise, [K, outer] columnwise
    let shape = |outer: usize| match usage {
        Usage::Rowwise => (outer, k),
        Usage::Columnwise => (k, outer),
    };
    let ((ar, ac), (br, bc)) = (shape(m), shape(n));
    let key = RngKey { seed: 5, stream: 9 };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    pool.install(|| {
        // the reference: whole f32 fake-quantized operands, fresh states
        let states = [QuantState::new(), QuantState::new()];
        let [mut sa, mut sb] = states.clone();
        let (mut fa, mut fb) = (vec![0.0f32; m * k], vec![0.0f32; n * k]);
        let xa = quantizer(qa, usage, key).unwrap();
        let xb = quantizer(qb, usage, key).unwrap();
        let ma = MatRef::new(&a, ar, ac).unwrap();
        let mb = MatRef::new(&b, br, bc).unwrap();
        let alpha = xa.fake_quantize_into(ma, &mut sa, &mut fa).unwrap()
            * xb.fake_quantize_into(mb, &mut sb, &mut fb).unwrap();
        let mut want = vec![0.0f32; m * n];
        let (va, vb) = (MatRef::row_major(&fa, m, k), MatRef::row_major(&fb, n, k));
        quantized_values_product((va, vb), (qa, qb), &mut want);
        if alpha != 1.0 {
            want.iter_mut().for_each(|v| *v *= alpha);
        }
        let [mut ga, mut gb] = states;
        let mut got = vec![f32::NAN; m * n];
        quantized_matmul_tn_with(
            Operand::new(ma, xa).with_state(&mut ga),
            Operand::new(mb, xb).with_state(&mut gb),
            &mut got,
            &mut GemmWorkspace::new(),
        )
        .unwrap();
        assert!(
            same_bits(&got, &want),
            "{qa:?} x {qb:?} {usage:?}, [{m}, {n}, {k}], {threads} threads"
        );
        assert_eq!(
            (ga.amax_history(), ga.scale()),
            (sa.amax_history(), sa.scale())
        );
        assert_eq!(
            (gb.amax_history(), gb.scale()),
            (sb.amax_history(), sb.scale())
        );
        // B prequantized (the linear layer's kept W), A packed in the call
        let mut wbuf = vec![0.0f32; n * k];
        let mut sb2 = sb.clone();
        let wf = fake_operand(Operand::new(mb, xb).with_state(&mut sb2), &mut wbuf).unwrap();
        let mut sa2 = sa.clone();
        let mut got2 = vec![f32::NAN; m * n];
        quantized_matmul_tn_prequantized(Operand::new(ma, xa).with_state(&mut sa2), wf, &mut got2)
            .unwrap();
        assert!(
            same_bits(&got2, &want),
            "{qa:?} x prequantized {qb:?}, [{m}, {n}, {k}], {threads} threads"
        );
        // ... and kept with its tiles packed once (the RL sampler's frozen W), twice over
        let frozen = FrozenOperand::new(wf).unwrap();
        for _ in 0..2 {
            let mut sa3 = sa.clone();
            let mut got3 = vec![f32::NAN; m * n];
            let xa3 = Operand::new(ma, xa).with_state(&mut sa3);
            quantized_matmul_tn_frozen(xa3, &frozen, &mut got3).unwrap();
            assert!(
                same_bits(&got3, &want),
                "{qa:?} x frozen {qb:?}, [{m}, {n}, {k}], {threads} threads"
            );
        }
        (got, [ga, gb])
    })
}

#[test]
fn packed_operands_equal_the_whole_operand_path() {
    // K = 1008: 63 NVFP4 blocks, 31.5 chunks; M = 300, N = 70: partial tiles and blocks;
    // about 64 rows (rowwise) or 2-7 chunks (columnwise) per quantize-and-pack panel here,
    // so several panels per operand.
    let fs = formats();
    let rowwise = (0..fs.len()).map(|i| (fs[i], fs[(i + 3) % fs.len()], Usage::Rowwise));
    let columnwise = columnwise_pairs()
        .into_iter()
        .map(|(a, b)| (a, b, Usage::Columnwise));
    let cases: Vec<_> = rowwise.chain(columnwise).collect();
    // ... and M = 96, N = 80: whole 16-column stretches (the AVX-512 columnwise kernels);
    // with K = 1024 also whole 32-row strips, which MX quantizes and packs tile by tile in
    // registers (N = 80: five 16-row tiles, the sixth a padding tile)
    for dims in [(300, 70, 1008), (96, 80, 1008), (96, 80, 1024)] {
        for (qa, qb, usage) in &cases {
            let (first, states) = run((qa, qb, *usage), dims, 1);
            for threads in [2, 3] {
                let (other, st) = run((qa, qb, *usage), dims, threads);
                assert!(same_bits(&first, &other));
                assert_eq!(states[0].scale(), st[0].scale());
            }
        }
    }
    // small and odd shapes: one panel, fewer rows than a tile, K below a block or a chunk
    for dims in [
        (1, 1, 16),
        (5, 33, 48),
        (17, 16, 32),
        (64, 48, 128),
        (3, 2, 1),
        (9, 40, 17),
    ] {
        for (qa, qb, usage) in &cases {
            if dims.2 % 16 == 0 || qa.rht == Rht::Off {
                run((qa, qb, *usage), dims, 2);
            }
        }
    }
}

#[test]
fn packed_path_reports_non_finite_input() {
    let (m, n, k) = (48, 16, 64);
    let mut a = data(m * k, 3);
    a[17 * k + 5] = f32::NAN;
    let b = data(n * k, 4);
    let key = RngKey { seed: 1, stream: 2 };
    for q in [
        OperandQuant::nvfp4(),
        OperandQuant::mx(MxElement::E4M3, ScaleRule::Rceil),
    ] {
        let xa = quantizer(&q, Usage::Rowwise, key).unwrap();
        let xb = quantizer(&q, Usage::Rowwise, key).unwrap();
        let mut out = vec![0.0f32; m * n];
        let r = quantized_matmul_tn_with(
            Operand::new(MatRef::new(&a, m, k).unwrap(), xa),
            Operand::new(MatRef::new(&b, n, k).unwrap(), xb),
            &mut out,
            &mut GemmWorkspace::new(),
        );
        let mut f = vec![0.0f32; m * k];
        let want = xa.fake_quantize_into(
            MatRef::new(&a, m, k).unwrap(),
            &mut QuantState::new(),
            &mut f,
        );
        match (r, want) {
            (Err(QuantError::Format(e)), Err(QuantError::Format(w))) => {
                assert_eq!(e.to_string(), w.to_string())
            }
            (r, w) => panic!("{q:?}: {r:?} vs {w:?}"),
        }
    }
    // columnwise MX on whole 32x16 tiles (`[K, outer]` tensors), quantized and packed in
    // registers: a NaN and an infinity
    let mx = OperandQuant::mx(MxElement::E4M3, ScaleRule::Rceil);
    for bad in [f32::NAN, f32::INFINITY] {
        let mut a = data(k * m, 3);
        a[33 * m + 21] = bad;
        columnwise_error_is_the_quantizers(&mx, &a, (m, n, k), &format!("MX, {bad}"));
    }
    // columnwise with RHT (`[K, outer]` tensors, 16 whole columns): a NaN, and a column
    // whose Hadamard sums overflow
    let rht = OperandQuant::nvfp4().with_rht(Rht::FixedSigns);
    for (at, bad) in [(17 * m + 5, f32::NAN), (usize::MAX, f32::MAX)] {
        let mut a = data(k * m, 3);
        if at == usize::MAX {
            (0..k).for_each(|r| a[r * m + 7] = bad);
        } else {
            a[at] = bad;
        }
        columnwise_error_is_the_quantizers(&rht, &a, (m, n, k), &format!("RHT, {bad}"));
    }
}

/// The GEMM of the columnwise operands `a: [K, M]` (bad input) and a finite `[K, N]`, both
/// quantized with `q`, fails with the error `a`'s own quantization reports.
fn columnwise_error_is_the_quantizers(
    q: &OperandQuant,
    a: &[f32],
    (m, n, k): (usize, usize, usize),
    what: &str,
) {
    let key = RngKey { seed: 1, stream: 2 };
    let b = data(k * n, 4);
    let xa = quantizer(q, Usage::Columnwise, key).unwrap();
    let xb = quantizer(q, Usage::Columnwise, key).unwrap();
    let r = quantized_matmul_tn_with(
        Operand::new(MatRef::new(a, k, m).unwrap(), xa),
        Operand::new(MatRef::new(&b, k, n).unwrap(), xb),
        &mut vec![0.0f32; m * n],
        &mut GemmWorkspace::new(),
    );
    let want = xa.fake_quantize_into(
        MatRef::new(a, k, m).unwrap(),
        &mut QuantState::new(),
        &mut vec![0.0f32; m * k],
    );
    match (r, want) {
        (Err(e), Err(w)) => assert_eq!(e.to_string(), w.to_string()),
        (r, w) => panic!("columnwise {what}: {r:?} vs {w:?}"),
    }
}

/// A frozen operand also serves FP32 inputs (the f32 GEMM on its kept values), transposed
/// views (kept as copied) and unquantized values, with the prequantized path's bits, and its
/// shape is checked against the output.
#[test]
fn frozen_operands_fall_back_and_check_shapes() {
    let (m, n, k) = (37, 45, 70);
    let (a, w) = (data(m * k, 3), data(n * k, 4));
    let ma = MatRef::new(&a, m, k).unwrap();
    let key = RngKey { seed: 1, stream: 2 };
    let fs = formats();
    for (qa, qb) in [
        (fs[0], fs[0]),
        (OperandQuant::F32, fs[0]),
        (fs[0], OperandQuant::F32),
    ] {
        let xa = quantizer(&qa, Usage::Rowwise, key).unwrap();
        let xb = quantizer(&qb, Usage::Columnwise, key).unwrap();
        // W as `[K, N]`, quantized columnwise: its operand is a transposed view
        let mut wbuf = vec![0.0f32; n * k];
        let wf = fake_operand(Operand::new(MatRef::new(&w, k, n).unwrap(), xb), &mut wbuf).unwrap();
        let frozen = FrozenOperand::new(wf).unwrap();
        let (mut want, mut got) = (vec![0.0f32; m * n], vec![f32::NAN; m * n]);
        quantized_matmul_tn_prequantized(Operand::new(ma, xa), wf, &mut want).unwrap();
        quantized_matmul_tn_frozen(Operand::new(ma, xa), &frozen, &mut got).unwrap();
        assert!(same_bits(&got, &want), "{qa:?} x frozen {qb:?}");
        let mut short = vec![0.0f32; m * n - 1];
        let err = quantized_matmul_tn_frozen(Operand::new(ma, xa), &frozen, &mut short);
        assert!(matches!(err, Err(QuantError::GemmShape(_))), "{err:?}");
    }
    // a hand-made view that reads past its values is refused, not read
    let bad = FakeOperand {
        values: MatRef {
            data: &w[..10],
            rows: 4,
            cols: 4,
            row_stride: 4,
            col_stride: 1,
        },
        factor: 1.0,
        quantized: true,
        e2m1: false,
    };
    let err = FrozenOperand::new(bad);
    assert!(matches!(err, Err(QuantError::InvalidConfig(_))), "{err:?}");
}

//! The GEMM on quantized tensors (`quantized_matmul_tn_tensors`: codes and scales, nothing
//! quantized in the call) equals the GEMM that quantizes the same f32 tensors with the same
//! quantizers (`quantized_matmul_tn`) bit for bit: every format, rowwise and columnwise
//! (NVFP4 with the Hadamard transform and stochastic rounding, as the Wgrad operands),
//! mixed formats, an F32 tensor on one side, shapes with partial blocks, tiles and panels,
//! on 1 to 3 threads. Inconsistent tensors and shapes are typed errors, never a panic.

use fp_formats::mx::{MxElement, ScaleRule};
use quant::gemm::MatRef;
use quant::qgemm::{quantized_matmul_tn, quantized_matmul_tn_tensors, Operand};
use quant::{
    BlockShape, Fp8Element, OperandQuant, QuantError, QuantState, QuantizedTensor, Quantizer, Rht,
    RngKey, RoundingMode, Usage,
};

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u32 ^ seed.wrapping_mul(0x9E37_79B9)).wrapping_mul(2_654_435_761);
            let m = ((h >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 2.0;
            // a spread of magnitudes, so that blocks get different scales, and zero blocks
            m * [1.0, 1e-3, 30.0, 0.0, 0.2][(i / 37) % 5]
        })
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The product both ways for operands quantized with `qa`, `qb` in `usage` (the f32 tensors
/// `[outer, K]` rowwise, `[K, outer]` columnwise); panics with the case if they differ.
fn check(qa: OperandQuant, qb: OperandQuant, usage: Usage, shape: (usize, usize, usize)) {
    check_scaled(qa, qb, usage, shape, (1.0, 1.0));
}

/// [`check`] on the two tensors' data times `scales`; returns the product.
fn check_scaled(
    qa: OperandQuant,
    qb: OperandQuant,
    usage: Usage,
    (m, n, k): (usize, usize, usize),
    (sa, sb): (f32, f32),
) -> Vec<f32> {
    let scaled = |v: Vec<f32>, s: f32| v.into_iter().map(|x| x * s).collect::<Vec<_>>();
    let (a, b) = (scaled(data(m * k, 1), sa), scaled(data(n * k, 2), sb));
    let view = |x, outer| match usage {
        Usage::Rowwise => MatRef::new(x, outer, k).unwrap(),
        Usage::Columnwise => MatRef::new(x, k, outer).unwrap(),
    };
    let key = RngKey { seed: 7, stream: 3 };
    let quantizer = |q| Quantizer::new(q, usage).unwrap().with_key(key);
    let (za, zb) = (quantizer(qa), quantizer(qb));
    let ta = za.quantize(view(&a, m), &mut QuantState::new()).unwrap();
    let tb = zb.quantize(view(&b, n), &mut QuantState::new()).unwrap();
    let (mut got, mut want) = (vec![f32::NAN; m * n], vec![f32::NAN; m * n]);
    quantized_matmul_tn_tensors(&ta, &tb, &mut got).unwrap();
    quantized_matmul_tn(
        Operand::new(view(&a, m), za),
        Operand::new(view(&b, n), zb),
        &mut want,
    )
    .unwrap();
    assert_eq!(
        bits(&got),
        bits(&want),
        "{qa:?} x {qb:?}, {usage:?}, {m}x{n}x{k}, scales {sa:e} and {sb:e}"
    );
    got
}

fn formats() -> Vec<OperandQuant> {
    let sr = RoundingMode::Stochastic;
    vec![
        OperandQuant::nvfp4(),
        OperandQuant::nvfp4().with_rounding(sr),
        OperandQuant::nvfp4().with_block(BlockShape::Tile16),
        OperandQuant::mx(MxElement::E4M3, ScaleRule::Rceil),
        OperandQuant::mx(MxElement::E5M2, ScaleRule::Floor),
        OperandQuant::mx(MxElement::E2M3, ScaleRule::Rceil),
        OperandQuant::mx(MxElement::E2M1, ScaleRule::Floor).with_rounding(sr),
        OperandQuant::fp8_current(Fp8Element::E4M3),
        OperandQuant::fp8_current(Fp8Element::E5M2).with_rounding(sr),
        OperandQuant::BF16,
        OperandQuant::F32,
    ]
}

#[test]
fn every_format_equals_quantizing_in_the_call() {
    for q in formats() {
        for usage in [Usage::Rowwise, Usage::Columnwise] {
            for shape in [(37, 19, 70), (64, 48, 256), (1, 1, 1), (33, 17, 16)] {
                check(q, q, usage, shape);
            }
        }
    }
}

/// Tiny times huge operands, whose products are of order one: MX scales near both ends of
/// E8M0 (values below 2^-126, which the BF16 unit reads as zero), FP8 and NVFP4 per-tensor
/// factors far from 1.
#[test]
fn extreme_magnitudes() {
    let f = formats();
    let pairs = [
        (2f32.powi(-118), 2f32.powi(110)),
        (2f32.powi(-100), 2f32.powi(95)),
        (1e-30, 1e30),
        (2f32.powi(100), 2f32.powi(-104)),
    ];
    for scales in pairs {
        for q in [f[0], f[3], f[4], f[6], f[7]] {
            let out = check_scaled(q, q, Usage::Rowwise, (33, 20, 96), scales);
            assert!(out.iter().any(|v| v.abs() > 1e-6), "{q:?}, {scales:?}");
        }
    }
}

#[test]
fn mixed_formats_and_an_f32_side() {
    let f = formats();
    for (qa, qb) in [
        (f[0], f[3]),
        (f[7], f[2]),
        (f[9], f[0]),
        (f[10], f[0]),
        (f[3], f[10]),
    ] {
        check(qa, qb, Usage::Rowwise, (45, 30, 100));
    }
}

/// The Wgrad operands of the NVFP4 recipe: both columnwise with the same Hadamard signs,
/// dY stochastically rounded, on a shape spanning several packing panels.
#[test]
fn hadamard_wgrad_operands_on_several_threads() {
    let rht = OperandQuant::nvfp4().with_rht(Rht::FixedSigns);
    let rht_sr = rht.with_rounding(RoundingMode::Stochastic);
    for threads in 1..=3 {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            check(rht_sr, rht, Usage::Columnwise, (90, 40, 1040));
            check(rht, rht, Usage::Columnwise, (32, 32, 64));
        });
    }
}

/// Several panels of rows (more than 64 Ki values per operand) with partial blocks.
#[test]
fn large_operands_span_panels() {
    let f = formats();
    for q in [f[0], f[3], f[7]] {
        check(q, q, Usage::Rowwise, (300, 129, 530));
    }
}

fn nvfp4_tensor(rows: usize, cols: usize) -> QuantizedTensor {
    let x = data(rows * cols, 5);
    let q = Quantizer::new(OperandQuant::nvfp4(), Usage::Rowwise).unwrap();
    q.quantize(MatRef::new(&x, rows, cols).unwrap(), &mut QuantState::new())
        .unwrap()
}

#[test]
fn bad_tensors_and_shapes_are_typed_errors() {
    let (a, b) = (nvfp4_tensor(4, 32), nvfp4_tensor(3, 32));
    let mut out = vec![0.0f32; 12];
    quantized_matmul_tn_tensors(&a, &b, &mut out).unwrap();
    let invalid = |a: &QuantizedTensor, b: &QuantizedTensor, out: &mut [f32]| {
        matches!(
            quantized_matmul_tn_tensors(a, b, out),
            Err(QuantError::InvalidConfig(_))
        )
    };
    let shape = |a: &QuantizedTensor, b: &QuantizedTensor, out: &mut [f32]| {
        matches!(
            quantized_matmul_tn_tensors(a, b, out),
            Err(QuantError::GemmShape(_))
        )
    };
    // an output of the wrong size, and a K that differs
    assert!(shape(&a, &b, &mut out[..11]));
    assert!(shape(&a, &nvfp4_tensor(3, 48), &mut out));
    // codes or scales cut short, a padded shape smaller than the stored one, padding that is
    // not whole blocks, a dimension past the limit, a non-finite factor
    let mut t = a.clone();
    t.codes.pop();
    assert!(invalid(&t, &b, &mut out));
    let mut t = b.clone();
    t.scales.push(0);
    assert!(invalid(&a, &t, &mut out));
    let mut t = a.clone();
    t.padded_rows = 3;
    assert!(invalid(&t, &b, &mut out));
    let mut t = a.clone();
    (t.cols, t.padded_cols) = (30, 30);
    assert!(invalid(&t, &b, &mut out));
    let mut t = a.clone();
    t.rows = usize::MAX;
    assert!(invalid(&t, &b, &mut out));
    let mut t = a.clone();
    t.tensor_scale_inv = f32::INFINITY;
    assert!(invalid(&t, &b, &mut out));
}

/// Tensors transformed along K differently (one with the Hadamard transform, one without,
/// or with other signs) are refused: their product is not that of the original tensors.
#[test]
fn different_hadamard_transforms_are_refused() {
    let x = data(64 * 32, 9);
    let x = MatRef::new(&x, 64, 32).unwrap();
    let quantize = |spec: OperandQuant| {
        let q = Quantizer::new(spec, Usage::Columnwise).unwrap();
        q.quantize(x, &mut QuantState::new()).unwrap()
    };
    let rht = quantize(OperandQuant::nvfp4().with_rht(Rht::FixedSigns));
    let plain = quantize(OperandQuant::nvfp4());
    assert_eq!(rht.hadamard, Some(quant::hadamard::TE_SIGN_MASK));
    assert_eq!(plain.hadamard, None);
    let mut out = vec![0.0f32; 32 * 32];
    quantized_matmul_tn_tensors(&rht, &rht, &mut out).unwrap();
    let mut other = rht.clone();
    other.hadamard = Some(0x1234);
    for (a, b) in [(&rht, &plain), (&plain, &rht), (&rht, &other)] {
        let r = quantized_matmul_tn_tensors(a, b, &mut out);
        assert!(
            matches!(&r, Err(QuantError::InvalidConfig(m)) if m.contains("Hadamard")),
            "{r:?}"
        );
    }
    // MX records its transform too
    let mx = OperandQuant::mx(MxElement::E4M3, ScaleRule::Rceil).with_rht(Rht::FixedSigns);
    assert_eq!(quantize(mx).hadamard, Some(quant::hadamard::TE_SIGN_MASK));
}

/// Empty products: no rows, or K = 0 (a zero output).
#[test]
fn empty_shapes() {
    let mut none: Vec<f32> = vec![];
    quantized_matmul_tn_tensors(&nvfp4_tensor(0, 32), &nvfp4_tensor(3, 32), &mut none).unwrap();
    let mut out = vec![1.0f32; 12];
    quantized_matmul_tn_tensors(&nvfp4_tensor(4, 0), &nvfp4_tensor(3, 0), &mut out).unwrap();
    assert_eq!(out, vec![0.0; 12]);
}

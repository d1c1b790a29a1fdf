//! The tensor-core GEMM's launcher path on the emulator (`train_tc`): `nb_f32_to_bf16` equals
//! quant's round-to-nearest-even bits on edge values (ties, the largest finite values,
//! subnormals, signed zeros, values already BF16, which it leaves exact), `gemm_tc` runs the
//! host reference through the launcher's pointers, and bad views are typed errors before any
//! launch.

mod common;

use common::shared_emu as emu;
use kernels_cuda::train::Launcher;
use kernels_cuda::train_tc::{bf16_bits_of, reference, Bf16Gemm, Bf16View, TensorCoreOps};
use kernels_cuda::KernelError;

#[test]
fn f32_to_bf16_kernel_is_quants_rounding() {
    let Some(emu) = emu("f32_to_bf16_kernel_is_quants_rounding") else {
        return;
    };
    let mut x = vec![
        0.0f32,
        -0.0,
        1.0,
        f32::from_bits(0x3f80_8000), // a tie: stays even
        f32::from_bits(0x3f81_8000), // a tie: rounds up to even
        f32::from_bits(0x3f80_8001),
        f32::MAX,
        -f32::MAX,
        f32::MIN_POSITIVE,
        f32::from_bits(1),
        f32::from_bits(0x0000_8000),
        f32::INFINITY,
        f32::NEG_INFINITY,
    ];
    let mut r = common::Rng(3);
    x.extend((0..1000).map(|_| r.normal() * 100.0));
    let d = emu.upload(&x).unwrap();
    let mut h = emu.zeros::<u16>(x.len()).unwrap();
    emu.to_bf16_bits(&d, &mut h).unwrap();
    let want: Vec<u16> = x.iter().map(|&v| bf16_bits_of(v)).collect();
    assert_eq!(h.to_vec(), want);
    // values already BF16 come back unchanged
    let exact: Vec<f32> = want
        .iter()
        .map(|&b| f32::from_bits(u32::from(b) << 16))
        .collect();
    let d = emu.upload(&exact).unwrap();
    emu.to_bf16_bits(&d, &mut h).unwrap();
    assert_eq!(h.to_vec(), want);
    let mut short = emu.zeros::<u16>(3).unwrap();
    assert!(matches!(
        emu.to_bf16_bits(&d, &mut short),
        Err(KernelError::InvalidArgument(_))
    ));
}

#[test]
fn gemm_tc_runs_the_reference_and_rejects_bad_views() {
    let Some(emu) = emu("gemm_tc_runs_the_reference_and_rejects_bad_views") else {
        return;
    };
    let (m, n, k) = (3, 4, 5);
    let mut r = common::Rng(9);
    let a: Vec<u16> = (0..2 * m * k).map(|_| bf16_bits_of(r.normal())).collect();
    let b: Vec<u16> = (0..n * k).map(|_| bf16_bits_of(r.normal())).collect();
    // two items of A^T (stored [k, m]), one shared B stored [n, k], accumulating
    let g = Bf16Gemm {
        batch: 2,
        m,
        n,
        k,
        alpha: 1.5,
        beta: 1.0,
        a: Bf16View {
            trans: true,
            ld: m,
            item: m * k,
        },
        b: Bf16View::cols(k),
    };
    let c0: Vec<f32> = (0..2 * m * n).map(|i| i as f32).collect();
    let (da, db) = (emu.upload(&a).unwrap(), emu.upload(&b).unwrap());
    let mut dc = emu.upload(&c0).unwrap();
    emu.gemm_tc(&g, &da, &db, &mut dc).unwrap();
    let mut want = c0.clone();
    reference(&g, &a, &b, &mut want).unwrap();
    assert_eq!(dc.to_vec(), want);
    // one element, by hand: item 1, row 2, column 3
    let at = |i: usize, p: usize| f32::from_bits(u32::from(a[m * k + p * m + i]) << 16);
    let bt = |p: usize, j: usize| f32::from_bits(u32::from(b[j * k + p]) << 16);
    let s = (0..k).fold(0.0f32, |s, p| s + at(2, p) * bt(p, 3));
    assert_eq!(want[m * n + 2 * n + 3], 1.5 * s + c0[m * n + 2 * n + 3]);
    let bad = |g: Bf16Gemm, c: usize| {
        let mut dc = emu.zeros::<f32>(c).unwrap();
        matches!(
            emu.gemm_tc(&g, &da, &db, &mut dc),
            Err(KernelError::InvalidArgument(_))
        )
    };
    assert!(bad(g, 2 * m * n + 1), "c of the wrong length");
    assert!(bad(Bf16Gemm { batch: 3, ..g }, 3 * m * n), "A too short");
    let narrow = Bf16View { ld: m - 1, ..g.a };
    assert!(bad(Bf16Gemm { a: narrow, ..g }, 2 * m * n), "ld < columns");
    assert!(bad(Bf16Gemm { k: 0, ..g }, 2 * m * n), "empty reduction");
}

/// `QuantOps::quantize_bf16` (the tensor-core GEMM's quantized operands: NVFP4 and MX decoded
/// straight to BF16, FP8 dequantized then converted) equals `fake_quantize`'s values rounded
/// to BF16, element for element in the stored layout (the padding beyond K is zero), with the
/// same factor, for NVFP4 (1x16, 16x16, RNE, SR), MX (E4M3, E2M1) and FP8 (current scaling),
/// both usages.
#[test]
fn quantize_bf16_is_fake_quantize_in_bf16() {
    use common::{data, fp8_current_cases, mx_cases, nvfp4_cases, quantizer, KEY, USAGES};
    use fp_formats::mx::{MxElement, ScaleRule};
    use kernels_cuda::train_quant::QuantOps;
    use quant::QuantState;
    let Some(emu) = emu("quantize_bf16_is_fake_quantize_in_bf16") else {
        return;
    };
    let (rows, cols) = (48, 40);
    let x = data(rows, cols, 11);
    let dx = emu.upload(&x).unwrap();
    let mut cases = nvfp4_cases();
    cases.extend(mx_cases(
        &[MxElement::E4M3, MxElement::E2M1],
        &[ScaleRule::Floor],
    ));
    cases.extend(fp8_current_cases());
    let mut checked = 0;
    for (name, q) in &cases {
        for usage in USAGES {
            let qz = quantizer(q, usage, KEY);
            let mut v = emu.zeros::<f32>(rows * cols).unwrap();
            let f = emu
                .fake_quantize(&qz, &dx, (rows, cols), &mut QuantState::new(), &mut v)
                .unwrap();
            let (b, ld, fb) = emu
                .quantize_bf16(&qz, &dx, (rows, cols), &mut QuantState::new())
                .unwrap();
            assert_eq!(f.to_bits(), fb.to_bits(), "{name} {usage:?}: factor");
            let (outer, k) = match usage {
                quant::Usage::Rowwise => (rows, cols),
                quant::Usage::Columnwise => (cols, rows),
            };
            let (v, b) = (v.to_vec(), b.to_vec());
            assert!(ld >= k && b.len() == outer * ld, "{name} {usage:?}: layout");
            for r in 0..outer {
                for c in 0..ld {
                    let want = if c < k { bf16_bits_of(v[r * k + c]) } else { 0 };
                    assert_eq!(b[r * ld + c], want, "{name} {usage:?} [{r}, {c}]");
                }
            }
            checked += 1;
        }
    }
    assert!(checked >= 20, "{checked}");
}

//! The worked examples of docs/numerics.md for the block formats (#worked-examples, #scale-rules).

use fp_formats::mx::{self, MxElement, MxOptions, ScaleRule};
use fp_formats::nvfp4::{self, GlobalScale, Nvfp4Options};
use fp_formats::{ElementFormat, FormatError, Padding, E2M1, E4M3, UE4M3};

fn spec_tensor() -> Vec<f32> {
    let mut x = vec![
        0.0, 0.1, -0.2, 0.3, 0.45, -0.6, 0.75, 0.9, 1.05, -1.2, 1.35, 1.5, -1.65, 1.8, 1.95, 2.1,
    ];
    x.extend([10.0, -10.0]);
    x.extend([0.5; 14]);
    x
}

#[test]
fn nvfp4_worked_example() {
    let x = spec_tensor();
    let g = GlobalScale::from_amax(10.0);
    assert_eq!(g.s_enc.to_bits(), 268.8f32.to_bits());
    assert_eq!(g.block_factor, 44.8);
    assert_eq!(g.s_dec, 0.003_720_238_3);
    assert_eq!(2.1f32 * g.block_factor, 94.079_994);
    let q = nvfp4::quantize(&x, 1, 32, Nvfp4Options::default()).unwrap();
    assert_eq!(q.amax, 10.0);
    assert_eq!(q.scale_bytes(), &[0x6C, 0x7E]);
    assert_eq!(g.block_encode_factor(UE4M3(0x6C)), 2.8);
    assert_eq!(g.block_encode_factor(UE4M3(0x7E)), 0.599_999_96);
    assert_eq!(
        q.codes,
        vec![
            0x10, 0x29, 0xB3, 0x54, 0xD5, 0x66, 0x7E, 0x77, 0xF7, 0x11, 0x11, 0x11, 0x11, 0x11,
            0x11, 0x11
        ]
    );
    let d = q.dequantize();
    let expect0 = [
        0.0, 0.17857, -0.17857, 0.35714, 0.53571, -0.53571, 0.71429, 1.07143, 1.07143, -1.07143,
        1.42857, 1.42857, -1.42857, 2.14286, 2.14286, 2.14286,
    ];
    for (a, b) in d[..16].iter().zip(expect0) {
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    }
    // 6 * 448 exactly, then one f32 rounding by S_dec: 10 to within an ulp.
    assert_eq!(d[16], 2688.0 * g.s_dec);
    assert!((d[16] - 10.0).abs() <= 1e-6);
    assert_eq!(d[17], -d[16]);
    for v in &d[18..] {
        assert!((v - 0.83333).abs() < 1e-5);
    }
    // Exact dequantization: e2m1 * s_b exactly, then one rounding by S_dec.
    assert_eq!(d[1], (0.5f32 * 96.0) * g.s_dec);
}

#[test]
fn nvfp4_clipping_example() {
    let mut x = vec![0.0f32; 16];
    x[0] = 546.0;
    // Force amax_g = 2688 (S_enc = 1) with a second block.
    x.extend(std::iter::once(2688.0).chain(std::iter::repeat_n(0.0, 15)));
    let g = GlobalScale::from_amax(2688.0);
    assert_eq!(g.s_enc, 1.0);
    let s = g.block_scale(546.0);
    assert_eq!(s.0, 0x6B);
    assert_eq!(s.to_f32(), 88.0);
    assert_eq!(g.block_encode_factor(s), 0.011_363_637);
    let q = nvfp4::quantize(&x, 1, 32, Nvfp4Options::default()).unwrap();
    assert_eq!(q.codes[0] & 0xF, 0x7);
    assert_eq!(q.dequantize()[0], 528.0);
    // 546 * enc = 6.2 > 6 is clipped; so is 2688 * enc = 6.0000005 (enc rounded in f32).
    assert_eq!(q.clipped_count(&x), 2);
}

#[test]
fn nvfp4_zero_inf_and_flush() {
    let z = nvfp4::quantize(&[0.0; 32], 2, 16, Nvfp4Options::default()).unwrap();
    assert!(z.scales.iter().all(|s| s.0 == 0));
    assert!(z.codes.iter().all(|&c| c == 0));
    assert_eq!(z.global_scale().s_enc, 1.0);
    assert_eq!(GlobalScale::from_amax(f32::INFINITY).s_enc, 1.0);
    assert_eq!(GlobalScale::from_amax(f32::NAN).s_enc, f32::MAX);
    // A block far below the tensor amax gets scale 0 and decodes to exactly zero.
    let mut x = vec![1e-7f32; 16];
    x.extend([1.0f32; 16]);
    let q = nvfp4::quantize(&x, 1, 32, Nvfp4Options::default()).unwrap();
    assert_eq!(q.scales[0].0, 0);
    assert!(q.dequantize()[..16].iter().all(|&v| v == 0.0));
}

#[test]
fn nvfp4_errors_and_padding() {
    let x = vec![1.0f32; 20];
    assert_eq!(
        nvfp4::quantize(&x, 1, 20, Nvfp4Options::default()),
        Err(FormatError::NotDivisible {
            cols: 20,
            block: 16
        })
    );
    assert!(matches!(
        nvfp4::quantize(&x, 2, 16, Nvfp4Options::default()),
        Err(FormatError::ShapeMismatch { .. })
    ));
    let mut bad = vec![1.0f32; 16];
    bad[5] = f32::NAN;
    assert!(matches!(
        nvfp4::quantize(&bad, 1, 16, Nvfp4Options::default()),
        Err(FormatError::NonFinite { index: 5, .. })
    ));
    let q = nvfp4::quantize(
        &x,
        1,
        20,
        Nvfp4Options {
            padding: Padding::Zero,
        },
    )
    .unwrap();
    assert_eq!(q.padded_cols, 32);
    assert_eq!(q.dequantize(), x);
}

#[test]
fn mx_scale_rules_spec_examples() {
    let e = |rule: ScaleRule, amax: f32| rule.scale::<E4M3>(amax).exponent().unwrap();
    assert_eq!(
        (e(ScaleRule::Floor, 1.0), e(ScaleRule::Rceil, 1.0)),
        (-8, -8)
    );
    assert_eq!(
        (e(ScaleRule::Floor, 448.0), e(ScaleRule::Rceil, 448.0)),
        (0, 0)
    );
    assert_eq!(
        (e(ScaleRule::Floor, 449.0), e(ScaleRule::Rceil, 449.0)),
        (0, 1)
    );
    assert_eq!(
        (e(ScaleRule::Floor, 500.0), e(ScaleRule::Rceil, 500.0)),
        (0, 1)
    );
    let f = |rule: ScaleRule, amax: f32| rule.scale::<E2M1>(amax).exponent().unwrap();
    assert_eq!((f(ScaleRule::Floor, 6.0), f(ScaleRule::Rceil, 6.0)), (0, 0));
    assert_eq!((f(ScaleRule::Floor, 7.0), f(ScaleRule::Rceil, 7.0)), (0, 1));
    assert_eq!((f(ScaleRule::Floor, 8.0), f(ScaleRule::Rceil, 8.0)), (1, 1));
    assert_eq!(
        (f(ScaleRule::Floor, 1.0), f(ScaleRule::Rceil, 1.0)),
        (-2, -2)
    );
    // CEIL and EVEN (torchao definitions).
    assert_eq!(f(ScaleRule::Ceil, 6.0), 1); // ceil(log2 6) = 3, minus 2
    assert_eq!(f(ScaleRule::Ceil, 4.0), 0);
    assert_eq!(f(ScaleRule::Even, 6.0), 0); // 1.5 * 2^2 keeps its one mantissa bit
    assert_eq!(f(ScaleRule::Even, 7.5), 1); // 1.875 * 2^2 rounds up to 2^3
    assert_eq!(f(ScaleRule::Even, 5.9), 0);
    assert_eq!(f(ScaleRule::Even, 7.0), 1);
    // Zero block and non-finite amax.
    assert_eq!(ScaleRule::Floor.scale::<E4M3>(0.0).0, 0);
    assert_eq!(ScaleRule::Rceil.scale::<E4M3>(0.0).0, 0);
    assert_eq!(ScaleRule::Rceil.scale::<E4M3>(f32::INFINITY).0, 0xFF);
}

#[test]
fn mx_element_values_spec_examples() {
    // amax 500, FLOOR: scale 1, 500 -> 448; RCEIL: scale 2, 250 -> 256 -> 512.
    let mut x = vec![0.0f32; 32];
    x[0] = 500.0;
    let fl = mx::quantize(&x, 1, 32, MxOptions::new(MxElement::E4M3, ScaleRule::Floor)).unwrap();
    assert_eq!(fl.codes[0], 0x7E);
    assert_eq!(fl.dequantize()[0], 448.0);
    assert_eq!(fl.clipped_count(&x), 1);
    let rc = mx::quantize(&x, 1, 32, MxOptions::new(MxElement::E4M3, ScaleRule::Rceil)).unwrap();
    assert_eq!(rc.codes[0], 0x78);
    assert_eq!(rc.dequantize()[0], 512.0);
    assert_eq!(rc.clipped_count(&x), 0);
    // MXFP4 amax 7: FLOOR clips to 6, RCEIL gives 3.5 -> 4 -> 8.
    x[0] = 7.0;
    let fl = mx::quantize(&x, 1, 32, MxOptions::new(MxElement::E2M1, ScaleRule::Floor)).unwrap();
    assert_eq!(fl.dequantize()[0], 6.0);
    let rc = mx::quantize(&x, 1, 32, MxOptions::new(MxElement::E2M1, ScaleRule::Rceil)).unwrap();
    assert_eq!(rc.dequantize()[0], 8.0);
    assert_eq!(rc.codes.len(), 16);
}

#[test]
fn mx_all_elements_round_trip_representable_values() {
    for element in [
        MxElement::E4M3,
        MxElement::E5M2,
        MxElement::E2M3,
        MxElement::E3M2,
        MxElement::E2M1,
    ] {
        for rule in [
            ScaleRule::Floor,
            ScaleRule::Rceil,
            ScaleRule::Ceil,
            ScaleRule::Even,
        ] {
            // Powers of two times small integers are exact in every element format at a
            // suitable scale; check the packing round trip and shapes.
            let x: Vec<f32> = (0..64 * 3).map(|i| ((i % 7) as f32 - 3.0) * 0.5).collect();
            let q = mx::quantize(&x, 3, 64, MxOptions::new(element, rule)).unwrap();
            assert_eq!(q.scales.len(), 6);
            assert_eq!(q.codes.len(), 3 * element.packed_len(64));
            let d = q.dequantize();
            for (a, b) in x.iter().zip(&d) {
                assert!(
                    (a - b).abs() <= 0.25 * a.abs() + 1e-6,
                    "{element:?} {rule:?}: {a} vs {b}"
                );
            }
        }
    }
}

#[test]
fn e4m3_block_scale_uses_the_fast_path_consistently() {
    for bits in (0u32..0x7F80_0000).step_by(997) {
        let x = f32::from_bits(bits);
        assert_eq!(E4M3::encode_rne_sat(x), E4M3::from_f32_rne_sat(x).0);
    }
}

/// Issue #13: a finite block amax near f32's maximum gave (RCEIL) a scale whose product
/// with the largest element code overflowed to +inf. Every rule and element format now
/// dequantizes such blocks to finite values (the scale is capped at `mx::max_scale`, the
/// elements saturate), on the scalar path (one block) and the vector path (8 blocks).
#[test]
fn mx_blocks_near_f32_max_dequantize_to_finite_values() {
    use fp_formats::mx::{max_scale, quantize, MxElement, MxOptions};
    use fp_formats::{E2M3, E3M2, E5M2};
    let big = [
        f32::MAX,
        -f32::MAX,
        3.0e38,
        1.0e38,
        2.5e38,
        -3.3e38,
        1.0,
        0.0,
    ];
    for cols in [32usize, 256] {
        let x: Vec<f32> = (0..cols).map(|i| big[i % big.len()]).collect();
        for element in [
            MxElement::E4M3,
            MxElement::E5M2,
            MxElement::E2M3,
            MxElement::E3M2,
            MxElement::E2M1,
        ] {
            for rule in [
                ScaleRule::Rceil,
                ScaleRule::Floor,
                ScaleRule::Ceil,
                ScaleRule::Even,
            ] {
                let q = quantize(&x, 1, cols, MxOptions::new(element, rule)).unwrap();
                let d = q.dequantize();
                for (i, (&v, &w)) in x.iter().zip(&d).enumerate() {
                    assert!(
                        w.is_finite(),
                        "{element:?} {rule:?} cols {cols}: {v} -> {w} at {i}"
                    );
                    assert!(
                        w == 0.0 || w.signum() == v.signum(),
                        "{element:?} {rule:?}: {v} -> {w}"
                    );
                }
                // the largest magnitude keeps at least half its value (saturated, not lost)
                assert!(d[0] >= f32::MAX / 2.0, "{element:?} {rule:?}: {}", d[0]);
            }
        }
    }
    for (s, e) in [
        (max_scale::<E4M3>(), 119),
        (max_scale::<E5M2>(), 112),
        (max_scale::<E2M3>(), 125),
        (max_scale::<E3M2>(), 123),
        (max_scale::<E2M1>(), 125),
    ] {
        assert_eq!(s.exponent(), Some(e));
    }
    assert!((57344.0 * max_scale::<E5M2>().value()).is_finite());
    assert!((28.0 * max_scale::<E3M2>().value()).is_finite());
    assert!((7.5 * max_scale::<E2M3>().value()).is_finite());
    assert_eq!(
        ScaleRule::Rceil.scale::<E4M3>(f32::MAX),
        max_scale::<E4M3>()
    );
}

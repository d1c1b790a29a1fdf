//! Worked values of the element formats and scale rules (docs/numerics.md), written out by hand, plus
//! the crate-defined NaN policy of the formats without NaN (which the golden tables cannot
//! cover: ml_dtypes leaves it undefined).

use fp_formats::{ElementFormat, Overflow, Rounding, E2M1, E2M3, E3M2, E4M3, E5M2, E8M0};

const RNE: Rounding = Rounding::NearestEven;
const SAT: Overflow = Overflow::Saturate;
const PROP: Overflow = Overflow::Propagate;

#[test]
fn e2m1_rne() {
    let cases: [(f32, u8); 20] = [
        (0.0, 0x0),
        (-0.0, 0x8),
        (0.25, 0x0),
        (0.26, 0x1),
        (0.75, 0x2),
        (1.25, 0x2),
        (1.3, 0x3),
        (1.75, 0x4),
        (2.5, 0x4),
        (2.75, 0x5),
        (3.5, 0x6),
        (5.0, 0x6),
        (5.01, 0x7),
        (7.0, 0x7),
        (100.0, 0x7),
        (-0.25, 0x8),
        (-0.3, 0x9),
        (-1.75, 0xC),
        (-5.0, 0xE),
        (-6.5, 0xF),
    ];
    for (x, code) in cases {
        assert_eq!(E2M1::from_f32(x, RNE, SAT).0, code, "E2M1 RNE {x}");
        assert_eq!(E2M1::encode_rne_sat(x), code, "E2M1 fast path {x}");
        // E2M1 has neither Inf nor NaN: Propagate saturates too.
        assert_eq!(
            E2M1::from_f32(x, RNE, PROP).0,
            code,
            "E2M1 RNE/Propagate {x}"
        );
    }
    // Packing [1.0, -6.0]: element 0 in the low nibble, element 1 in the high nibble.
    let lo = E2M1::from_f32_rne_sat(1.0).0;
    let hi = E2M1::from_f32_rne_sat(-6.0).0;
    assert_eq!(lo | (hi << 4), 0xF2);
}

#[test]
fn e2m1_stochastic() {
    let cases: [(f32, u8, f32); 10] = [
        (1.2, 153, 1.0),
        (1.2, 154, 1.5),
        (1.9, 51, 1.5),
        (1.9, 52, 2.0),
        (5.5, 63, 4.0),
        (5.5, 64, 6.0),
        (0.1, 204, 0.0),
        (0.1, 205, 0.5),
        (6.0, 255, 6.0),
        (3.0, 0, 3.0),
    ];
    for (x, r, want) in cases {
        let got = E2M1::from_f32(x, Rounding::Stochastic(r), SAT).to_f32();
        assert_eq!(got, want, "E2M1 SR({x}, {r})");
    }
    // Means over all 256 random bytes (spec: 1.199219, 5.5, 0.099609), exact in f64.
    let mean = |x: f32| {
        (0..=255u8)
            .map(|r| E2M1::from_f32(x, Rounding::Stochastic(r), SAT).to_f32() as f64)
            .sum::<f64>()
            / 256.0
    };
    assert_eq!(mean(1.2), 1.19921875);
    assert_eq!(mean(5.5), 5.5);
    assert_eq!(mean(0.1), 0.099609375);
}

#[test]
fn e4m3_satfinite_rne() {
    let p2 = |e: i32| 2f32.powi(e);
    let cases: [(f32, u8); 21] = [
        (1.0, 0x38),
        (1.0625, 0x38),
        (1.125, 0x39),
        (1.1875, 0x3A),
        (0.1, 0x1D),
        (232.0, 0x76),
        (240.0, 0x77),
        (448.0, 0x7E),
        (449.0, 0x7E),
        (464.0, 0x7E),
        (480.0, 0x7E),
        (p2(-6), 0x08),
        (p2(-9), 0x01),
        (p2(-10), 0x00),
        (1.5 * p2(-10), 0x01),
        (3.0 * p2(-10), 0x02),
        (-2.0, 0xC0),
        (96.0, 0x6C),
        (88.0, 0x6B),
        (44.8, 0x63),
        (-0.0, 0x80),
    ];
    for (x, code) in cases {
        assert_eq!(E4M3::from_f32(x, RNE, SAT).0, code, "E4M3 satfinite {x}");
        assert_eq!(E4M3::encode_rne_sat(x), code, "E4M3 fast path {x}");
    }
    assert_eq!(E4M3(0x1D).to_f32(), 0.1015625);
    assert_eq!(E4M3(0x3A).to_f32(), 1.25);
    assert_eq!(E4M3(0x76).to_f32(), 224.0);
    assert_eq!(E4M3(0x63).to_f32(), 44.0);
    // Non-saturating (ml_dtypes) semantics: 464 ties to 448, beyond it NaN.
    assert_eq!(E4M3::from_f32(464.0, RNE, PROP).0, 0x7E);
    assert_eq!(E4M3::from_f32(480.0, RNE, PROP).0, 0x7F);
    assert_eq!(E4M3::from_f32(-480.0, RNE, PROP).0, 0xFF);
    assert!(E4M3(0x7F).to_f32().is_nan());
}

#[test]
fn e5m2() {
    let p2 = |e: i32| 2f32.powi(e);
    assert_eq!(E5M2::from_f32(1.0, RNE, SAT).0, 0x3C);
    assert_eq!(E5M2::from_f32(57344.0, RNE, SAT).0, 0x7B);
    assert_eq!(E5M2::from_f32(61439.0, RNE, SAT).0, 0x7B);
    assert_eq!(E5M2::from_f32(61439.0, RNE, PROP).0, 0x7B);
    assert_eq!(E5M2::from_f32(61440.0, RNE, PROP).0, 0x7C);
    assert_eq!(E5M2::from_f32(61440.0, RNE, SAT).0, 0x7B);
    assert_eq!(E5M2::from_f32(p2(-16), RNE, SAT).0, 0x01);
    assert_eq!(E5M2::from_f32(p2(-17), RNE, SAT).0, 0x00);
    assert_eq!(E5M2::from_f32(p2(-14), RNE, SAT).0, 0x04);
    assert_eq!(E5M2::from_f32(f32::INFINITY, RNE, PROP).0, 0x7C);
    assert_eq!(E5M2::from_f32(f32::INFINITY, RNE, SAT).0, 0x7B);
    assert_eq!(E5M2(0x7B).to_f32(), 57344.0);
    assert_eq!(E5M2(0x7C).to_f32(), f32::INFINITY);
}

#[test]
fn e8m0_decode() {
    assert_eq!(E8M0(0x7F).to_f32(), 1.0);
    assert_eq!(E8M0(0x80).to_f32(), 2.0);
    assert_eq!(E8M0(0x7E).to_f32(), 0.5);
    assert_eq!(E8M0(0x00).to_f32(), 2f32.powi(-127));
    assert_eq!(E8M0(0x00).to_f32().to_bits(), 0x0040_0000);
    assert_eq!(E8M0(0xFE).to_f32(), 2f32.powi(127));
    assert!(E8M0(0xFF).to_f32().is_nan());
}

/// Crate policy (formats.rs): formats without NaN map NaN (either sign) to +max, as the
/// PTX satfinite casts do, under both overflow policies and every rounding mode.
#[test]
fn nan_to_positive_max_without_nan_encoding() {
    for nan in [f32::NAN, -f32::NAN, f32::from_bits(0x7F80_0001)] {
        for r in [
            RNE,
            Rounding::TowardZero,
            Rounding::TowardNegative,
            Rounding::Stochastic(255),
        ] {
            for o in [SAT, PROP] {
                assert_eq!(E2M1::from_f32(nan, r, o).0, 0x7);
                assert_eq!(E2M3::from_f32(nan, r, o).0, 0x1F);
                assert_eq!(E3M2::from_f32(nan, r, o).0, 0x1F);
            }
        }
        assert_eq!(E2M1::encode_rne_sat(nan), 0x7);
    }
}

/// FP6 cast examples from ONNX's float6.md (docs/numerics.md#e2m3-and-e3m2-fp6).
#[test]
fn fp6_examples() {
    assert_eq!(E2M3::from_f32(25.0, RNE, SAT).to_f32(), 7.5);
    assert_eq!(E3M2::from_f32(25.0, RNE, SAT).to_f32(), 24.0);
    assert_eq!(E2M3::from_f32(f32::INFINITY, RNE, SAT).to_f32(), 7.5);
    assert_eq!(E3M2::from_f32(f32::INFINITY, RNE, SAT).to_f32(), 28.0);
}

//! Property tests (proptest) of the encoders' defining properties, for every format:
//!
//! * RNE: no representable value is strictly closer to x than the result, and exact ties go
//!   to the even code (E8M0, which has no mantissa bits, rounds ties up);
//! * RZ: the largest magnitude <= |x|; RU: the smallest value >= x; RD: the largest <= x;
//! * SR: over all 256 random bytes the result is always one of the two neighbours and the
//!   mean m satisfies 0 <= |x| - |m| < step/256 (biased toward zero by less than 1/256 of
//!   the step, never away from zero);
//! * monotonicity of encode in x for every mode (SR with a fixed byte);
//! * sign symmetry: encode(-x) = encode(x) with the sign bit flipped for RNE/RZ/SR, and
//!   RU(-x) = -RD(x).
//!
//! "Inside the range" means |x| <= max (E8M0: 2^-127 <= x <= 2^127; UE4M3: x >= 0).

mod common;

use common::{Format, Grid, FORMATS, POLICIES};
use fp_formats::{Overflow, Rounding};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::sync::Arc;

/// Inputs that hit the interesting places: arbitrary bit patterns (log-uniform, any
/// exponent), uniform values across the range, and values within a few ulps of a
/// representable value or of a midpoint between two neighbours; plus a random SR byte.
fn input(g: Arc<Grid>) -> impl Strategy<Value = (f32, u8)> {
    let n = g.vals.len();
    let span = (g.ovf * 1.25).min(f32::MAX as f64);
    let g2 = g.clone();
    let near =
        (0..n, any::<bool>(), -64i32..=64, any::<bool>()).prop_map(move |(i, mid, ulps, neg)| {
            let c = if mid {
                (g2.vals[i] + g2.value(i + 1)) / 2.0
            } else {
                g2.vals[i]
            };
            let c = c.min(f32::MAX as f64) as f32;
            let b = (c.to_bits() as i64 + ulps as i64).clamp(0, 0x7F80_0000) as u32;
            let x = f32::from_bits(b);
            if neg {
                -x
            } else {
                x
            }
        });
    let x = prop_oneof![
        any::<u32>()
            .prop_map(f32::from_bits)
            .prop_filter("NaN", |x| !x.is_nan()),
        (-span..span).prop_map(|v| v as f32),
        near,
    ];
    (x, any::<u8>())
}

/// Runs `prop` on `cases` generated inputs for every format.
fn check_all(cases: u32, prop: impl Fn(&Format, &Grid, f32, u8) -> Result<(), TestCaseError>) {
    for f in &FORMATS {
        let g = Arc::new(Grid::new(f));
        let config = Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        };
        let mut runner = TestRunner::new(config);
        if let Err(e) = runner.run(&input(g.clone()), |(x, r)| prop(f, &g, x, r)) {
            panic!("{}: {e}", f.name);
        }
    }
}

fn check_pairs(
    cases: u32,
    prop: impl Fn(&Format, &Grid, f32, f32, u8) -> Result<(), TestCaseError>,
) {
    for f in &FORMATS {
        let g = Arc::new(Grid::new(f));
        let config = Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        };
        let mut runner = TestRunner::new(config);
        let strat = (input(g.clone()), input(g.clone()));
        if let Err(e) = runner.run(&strat, |((x, r), (y, _))| prop(f, &g, x, y, r)) {
            panic!("{}: {e}", f.name);
        }
    }
}

/// Whether x is inside the format's range (see the module docs).
fn in_range(f: &Format, g: &Grid, x: f32) -> bool {
    let a = x.abs() as f64;
    if x.is_nan() || a > g.max() {
        return false;
    }
    match f.name {
        "e8m0" => x > 0.0 && a >= g.vals[0],
        "ue4m3" => x >= 0.0,
        _ => true,
    }
}

/// Every representable finite value with its sign, as f64 (negative zero as -0.0).
fn signed_values(f: &Format, g: &Grid) -> Vec<f64> {
    let mut v = g.vals.clone();
    if f.signed() {
        v.extend(g.vals.iter().map(|&x| -x));
    }
    v
}

fn decode(f: &Format, x: f32, mode: Rounding, ovf: Overflow) -> (u16, f64) {
    let code = (f.encode)(x, mode, ovf);
    (code, (f.decode)(code) as f64)
}

#[test]
fn rne_is_nearest_and_ties_to_even() {
    check_all(1024, |f, g, x, _| {
        if !in_range(f, g, x) {
            return Ok(());
        }
        let xd = x as f64;
        let all = signed_values(f, g);
        for ovf in POLICIES {
            let (code, q) = decode(f, x, Rounding::NearestEven, ovf);
            let d = (q - xd).abs();
            prop_assert!(q.is_finite(), "{x:e} -> {q}");
            prop_assert!(
                all.iter().all(|&v| (v - xd).abs() >= d),
                "{x:e} -> {q}: a representable value is closer"
            );
            // Tie: another value at the same distance -> the code must be even (E8M0: up).
            if let Some(&other) = all.iter().find(|&&v| v != q && (v - xd).abs() == d) {
                if f.name == "e8m0" {
                    prop_assert!(q > other, "e8m0 tie {x:e} -> {q}, not {other}");
                } else {
                    prop_assert!(code & 1 == 0, "tie {x:e} -> {q} (odd code 0x{code:x})");
                }
            }
            // Results of zero keep the sign of x.
            if f.signed() {
                prop_assert_eq!(code & f.sign_bit != 0, x.is_sign_negative());
            }
        }
        Ok(())
    });
}

#[test]
fn directed_modes_pick_the_right_neighbour() {
    check_all(1024, |f, g, x, _| {
        if !in_range(f, g, x) {
            return Ok(());
        }
        let xd = x as f64;
        let all = signed_values(f, g);
        let a = xd.abs();
        let rz = g
            .vals
            .iter()
            .copied()
            .filter(|&v| v <= a)
            .fold(f64::MIN, f64::max);
        let ru = all
            .iter()
            .copied()
            .filter(|&v| v >= xd)
            .fold(f64::MAX, f64::min);
        let rd = all
            .iter()
            .copied()
            .filter(|&v| v <= xd)
            .fold(f64::MIN, f64::max);
        for ovf in POLICIES {
            let (_, q) = decode(f, x, Rounding::TowardZero, ovf);
            prop_assert_eq!(q.abs(), rz, "RZ({:e})", x);
            prop_assert!(q == 0.0 || q.is_sign_negative() == x.is_sign_negative());
            let (_, q) = decode(f, x, Rounding::TowardPositive, ovf);
            prop_assert_eq!(q, ru, "RU({:e})", x);
            let (_, q) = decode(f, x, Rounding::TowardNegative, ovf);
            prop_assert_eq!(q, rd, "RD({:e})", x);
        }
        Ok(())
    });
}

#[test]
fn stochastic_rounding_is_unbiased_within_bound() {
    check_all(1024, |f, g, x, _| {
        if !in_range(f, g, x) {
            return Ok(());
        }
        let a = (x as f64).abs();
        let (lo, hi) = g.neighbours(a).unwrap();
        let (vl, vh) = (g.value(lo), g.value(hi));
        for ovf in POLICIES {
            let mut sum = 0.0f64; // exact: at most 256 values on a grid of < 53 bits
            for r in 0..=255u8 {
                let (_, q) = decode(f, x, Rounding::Stochastic(r), ovf);
                prop_assert!(q.abs() == vl || q.abs() == vh, "SR({x:e}, {r}) = {q}");
                prop_assert!(q == 0.0 || q.is_sign_negative() == x.is_sign_negative());
                sum += q.abs();
            }
            let mean = sum / 256.0;
            let step = vh - vl;
            let bias = a - mean;
            prop_assert!(
                bias >= 0.0 && (bias < step / 256.0 || (lo == hi && bias == 0.0)),
                "SR mean of {x:e}: {mean} (neighbours {vl}, {vh})"
            );
        }
        Ok(())
    });
}

#[test]
fn encode_is_monotone() {
    check_pairs(2048, |f, _g, x, y, r| {
        let (x, y) = if x <= y { (x, y) } else { (y, x) };
        if f.name == "e8m0" && x <= 0.0 {
            return Ok(()); // zero and negatives are NaN in E8M0
        }
        let modes = [
            Rounding::NearestEven,
            Rounding::TowardZero,
            Rounding::TowardPositive,
            Rounding::TowardNegative,
            Rounding::Stochastic(r),
        ];
        for mode in modes {
            for ovf in POLICIES {
                let (_, qx) = decode(f, x, mode, ovf);
                let (_, qy) = decode(f, y, mode, ovf);
                if qx.is_nan() || qy.is_nan() {
                    // Only Propagate produces NaN from non-NaN inputs.
                    prop_assert_eq!(ovf, Overflow::Propagate);
                    continue;
                }
                prop_assert!(
                    qx <= qy,
                    "{mode:?}/{ovf:?}: {x:e} -> {qx} but {y:e} -> {qy}"
                );
            }
        }
        Ok(())
    });
}

#[test]
fn sign_symmetry() {
    check_all(4096, |f, _g, x, r| {
        if !f.signed() {
            return Ok(());
        }
        let s = f.sign_bit;
        for ovf in POLICIES {
            let enc = |x: f32, m: Rounding| (f.encode)(x, m, ovf);
            for m in [
                Rounding::NearestEven,
                Rounding::TowardZero,
                Rounding::Stochastic(r),
            ] {
                prop_assert_eq!(enc(-x, m), enc(x, m) ^ s, "{:?}/{:?} at {:e}", m, ovf, x);
            }
            let (ru, rd) = (Rounding::TowardPositive, Rounding::TowardNegative);
            prop_assert_eq!(enc(-x, ru), enc(x, rd) ^ s, "RU(-x) = -RD(x) at {:e}", x);
            prop_assert_eq!(enc(-x, rd), enc(x, ru) ^ s, "RD(-x) = -RU(x) at {:e}", x);
        }
        Ok(())
    });
}

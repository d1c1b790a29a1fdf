//! Exhaustive checks where the domain is small enough:
//!
//! * every code of every format decodes and re-encodes to itself under every mode/policy
//!   (stochastic rounding with all 256 random bytes);
//! * every f32 bit pattern (all 2^32) through the fast paths `E2M1::encode_rne_sat`,
//!   `E4M3::encode_rne_sat`, `E5M2::encode_rne_sat` and
//!   `round_to_bf16`, against the RNE oracle (a step function of
//!   |x| whose change points come from `common::oracle`); the fast paths are also compared
//!   with the generic encoder directly on every input of the two sweeps below;
//! * the generic encoder of every format, every mode and policy, against the search-based
//!   oracle on a strided sweep of all f32, on every f32 within a window of ulps around every
//!   representable value, every midpoint and the overflow step, and (the 4/6/8-bit formats)
//!   on every f32 whose magnitude lies in the format's active range;
//! * `bf16_from_f32` / `f16_from_f32` (RNE, Propagate) against the `half` crate's
//!   independent conversions on a strided sweep.
//!
//! The large sweeps are split across threads (`common::par_chunks`, at most 8). Measured
//! cost of the whole file: about 60 CPU-seconds with the workspace's test profile
//! (opt-level 3 with overflow checks) on a loaded 2-core machine, i.e. roughly 30 s on two
//! idle cores; each test prints its input count and time with `--nocapture`.

mod common;

use common::{oracle, par_chunks, Format, Grid, Step, FORMATS, MODES, POLICIES};
use fp_formats::{
    bf16, bf16_from_f32, f16, f16_from_f32, round_to_bf16, ElementFormat, Overflow, Rounding, E2M1,
    E2M3, E3M2, E4M3, E5M2, UE4M3,
};
use std::time::Instant;

const INF_BITS: u32 = 0x7F80_0000;
const SIGN: u32 = 0x8000_0000;

fn report(what: &str, t: Instant, n: u64) {
    println!("{what}: {n} inputs in {:.2} s", t.elapsed().as_secs_f64());
}

/// Collects at most a few failure messages per chunk and asserts there are none.
fn assert_no_failures(what: &str, chunks: Vec<(u64, Vec<String>)>) {
    let n: u64 = chunks.iter().map(|c| c.0).sum();
    let msgs: Vec<String> = chunks.into_iter().flat_map(|c| c.1).collect();
    assert_eq!(n, 0, "{what}: {n} mismatches, e.g.\n{}", msgs.join("\n"));
}

/// Compares `check(x, expected_code)` on every f32 with magnitude bits in `abs_lo..abs_hi`
/// (both signs), `expected_code` being the oracle's encoding under `(mode, ovf)`: a walk
/// over the pieces of the oracle's step function (`common::Step`), with a branch-free inner
/// loop per piece so that the fast paths vectorise. Zero, Inf and NaN go to the oracle
/// directly. Returns the number of inputs checked.
fn sweep_against_step(
    what: &str,
    f: &Format,
    mode: Rounding,
    ovf: Overflow,
    abs_lo: u32,
    abs_hi: u32,
    check: impl Fn(f32, u16) -> bool + Sync,
) -> u64 {
    let g = Grid::new(f);
    let steps = [
        Step::new(f, &g, mode, ovf, false),
        Step::new(f, &g, mode, ovf, true),
    ];
    let n = (abs_hi - abs_lo) as u64;
    let res = par_chunks(n, |lo, hi| {
        let (lo, hi) = (abs_lo + lo as u32, abs_lo + hi as u32);
        let mut bad = (0u64, Vec::new());
        for (step, sign) in steps.iter().zip([0, SIGN]) {
            // Pieces [a, b) of constant expected code, clipped to [lo, hi) and to the
            // finite non-zero range; the rest through the oracle.
            let mut pieces: Vec<(u32, u32, u16)> = Vec::new();
            for i in step.index(lo.clamp(1, INF_BITS - 1))..step.starts.len() {
                let a = step.starts[i].max(lo).max(1);
                let b = step.starts.get(i + 1).copied().unwrap_or(INF_BITS).min(hi);
                if a >= hi {
                    break;
                }
                if a < b {
                    pieces.push((a, b, step.codes[i]));
                }
            }
            let special = (lo..hi.min(1)).chain(lo.max(INF_BITS)..hi);
            for abs in special {
                let x = f32::from_bits(abs | sign);
                pieces.push((abs, abs + 1, oracle(f, &g, x, mode, ovf)));
            }
            for (a, b, want) in pieces {
                let n_bad: u64 = (a..b)
                    .map(|abs| !check(f32::from_bits(abs | sign), want) as u64)
                    .sum();
                if n_bad > 0 {
                    bad.0 += n_bad;
                    let first = (a..b).find(|&abs| !check(f32::from_bits(abs | sign), want));
                    let x = f32::from_bits(first.unwrap() | sign);
                    if bad.1.len() < 5 {
                        bad.1.push(format!(
                            "x = {x:e} (0x{:08x}): oracle 0x{want:x}",
                            x.to_bits()
                        ));
                    }
                }
            }
        }
        bad
    });
    assert_no_failures(&format!("{what} ({}, {mode:?}/{ovf:?})", f.name), res);
    2 * n
}

#[test]
fn e2m1_fast_path_all_f32() {
    let t = Instant::now();
    let f = common::format("e2m1");
    let n = sweep_against_step(
        "E2M1::encode_rne_sat",
        &f,
        Rounding::NearestEven,
        Overflow::Saturate,
        0,
        SIGN,
        |x, want| E2M1::encode_rne_sat(x) as u16 == want,
    );
    report("E2M1::encode_rne_sat, all f32", t, n);
}

#[test]
fn e4m3_fast_path_all_f32() {
    let t = Instant::now();
    let f = common::format("e4m3");
    let n = sweep_against_step(
        "E4M3::encode_rne_sat",
        &f,
        Rounding::NearestEven,
        Overflow::Saturate,
        0,
        SIGN,
        |x, want| E4M3::encode_rne_sat(x) as u16 == want,
    );
    report("E4M3::encode_rne_sat, all f32", t, n);
}

#[test]
fn e5m2_fast_path_all_f32() {
    let t = Instant::now();
    let f = common::format("e5m2");
    let n = sweep_against_step(
        "E5M2::encode_rne_sat",
        &f,
        Rounding::NearestEven,
        Overflow::Saturate,
        0,
        SIGN,
        |x, want| E5M2::encode_rne_sat(x) as u16 == want,
    );
    report("E5M2::encode_rne_sat, all f32", t, n);
}

/// `round_to_bf16` against RNE + Propagate to BF16 (NaN only needs to stay NaN).
#[test]
fn round_to_bf16_all_f32() {
    let t = Instant::now();
    let f = common::format("bf16");
    let n = sweep_against_step(
        "round_to_bf16",
        &f,
        Rounding::NearestEven,
        Overflow::Propagate,
        0,
        SIGN,
        |x, want| {
            let r = round_to_bf16(x);
            if x.is_nan() {
                r.is_nan()
            } else {
                r.to_bits() == (want as u32) << 16
            }
        },
    );
    report("round_to_bf16, all f32", t, n);
}

/// The fast paths against the generic encoders at one input.
fn check_fast_paths(x: f32) -> Result<(), String> {
    let e2m1 = E2M1::from_f32(x, Rounding::NearestEven, Overflow::Saturate).0;
    let e4m3 = E4M3::from_f32(x, Rounding::NearestEven, Overflow::Saturate).0;
    let e5m2 = E5M2::from_f32(x, Rounding::NearestEven, Overflow::Saturate).0;
    let bf = bf16_from_f32(x, Rounding::NearestEven, Overflow::Propagate).to_f32();
    let r = round_to_bf16(x);
    let bf_ok = if x.is_nan() {
        r.is_nan()
    } else {
        r.to_bits() == bf.to_bits()
    };
    if E2M1::encode_rne_sat(x) != e2m1
        || E4M3::encode_rne_sat(x) != e4m3
        || E5M2::encode_rne_sat(x) != e5m2
        || !bf_ok
    {
        return Err(format!(
            "fast path != generic at x = {x:e} (0x{:08x})",
            x.to_bits()
        ));
    }
    Ok(())
}

/// Every code: decode, then encode under every mode and policy (SR with all 256 bytes).
#[test]
fn every_code_round_trips() {
    let t = Instant::now();
    let mut n = 0u64;
    for f in &FORMATS {
        let g = Grid::new(f);
        for code in (0..f.n_codes()).map(|c| c as u16) {
            let v = (f.decode)(code);
            let neg_bit = if v.is_sign_negative() { f.sign_bit } else { 0 };
            let modes = MODES[..4]
                .iter()
                .copied()
                .chain((0..=255).map(Rounding::Stochastic));
            for mode in modes {
                for ovf in POLICIES {
                    let got = (f.encode)(v, mode, ovf);
                    n += 1;
                    let want = if v.is_nan() {
                        g.nan_code.unwrap() | neg_bit
                    } else if v.is_infinite() && ovf == Overflow::Saturate {
                        g.max_code() | neg_bit
                    } else if f.name == "ue4m3" {
                        code & 0x7F // sign bit ignored on decode, never set on encode
                    } else {
                        code
                    };
                    assert_eq!(
                        got, want,
                        "{}: code 0x{code:x} = {v:?}, {mode:?}/{ovf:?}: re-encoded to 0x{got:x}",
                        f.name
                    );
                }
            }
        }
    }
    report("code round trips", t, n);
}

/// The encode of `x` under every mode/policy must equal the oracle's.
fn check_against_oracle(f: &Format, g: &Grid, x: f32) -> Result<(), String> {
    for mode in MODES {
        for ovf in POLICIES {
            let got = (f.encode)(x, mode, ovf);
            let want = oracle(f, g, x, mode, ovf);
            if got != want {
                return Err(format!(
                    "{}: x = {x:e} (0x{:08x}) {mode:?}/{ovf:?}: got 0x{got:x}, oracle 0x{want:x}",
                    f.name,
                    x.to_bits()
                ));
            }
        }
    }
    Ok(())
}

/// Strided sweep of all f32 (NaN payloads included) against the oracle, every format,
/// every mode and policy; the fast paths against the generic encoders at the same inputs.
#[test]
fn generic_encoders_strided_all_f32() {
    // Odd, so every residue of the low mantissa bits is visited.
    const STRIDE: u64 = 4099;
    let t = Instant::now();
    let n = (1u64 << 32) / STRIDE;
    let res = par_chunks(n, |lo, hi| {
        let grids: Vec<_> = FORMATS.iter().map(|f| (f, Grid::new(f))).collect();
        let mut bad = (0u64, Vec::new());
        for i in lo..hi {
            let x = f32::from_bits((i * STRIDE) as u32);
            let checks = grids.iter().map(|(f, g)| check_against_oracle(f, g, x));
            for r in checks.chain([check_fast_paths(x)]) {
                if let Err(e) = r {
                    bad.0 += 1;
                    if bad.1.len() < 5 {
                        bad.1.push(e);
                    }
                }
            }
        }
        bad
    });
    assert_no_failures("strided sweep", res);
    report("strided sweep (x 9 formats x 20 modes/policies)", t, n);
}

/// Every f32 within `w` ulps of every representable value, of every midpoint between
/// neighbours (the RNE decision points) and of the overflow step, both signs, against the
/// oracle under every mode and policy; the fast paths against the generic encoders there.
#[test]
fn generic_encoders_dense_around_grid() {
    let t = Instant::now();
    let mut total = 0u64;
    for f in &FORMATS {
        let g = Grid::new(f);
        let w: u32 = if f.code_bits <= 8 { 512 } else { 8 };
        let n = g.vals.len();
        let mut centres = Vec::with_capacity(2 * n + 1);
        for i in 0..n {
            centres.push(g.vals[i]);
            centres.push((g.vals[i] + g.value(i + 1)) / 2.0);
        }
        centres.push(g.ovf);
        let res = par_chunks(centres.len() as u64, |lo, hi| {
            let mut bad = (0u64, Vec::new());
            for &c in &centres[lo as usize..hi as usize] {
                // BF16's overflow step 2^128 is beyond f32: its window ends at Inf.
                let cb = if c > f32::MAX as f64 {
                    INF_BITS
                } else {
                    (c as f32).to_bits()
                };
                assert!(
                    cb == INF_BITS || (c as f32) as f64 == c,
                    "centre {c} not an f32"
                );
                for b in cb.saturating_sub(w)..=cb.saturating_add(w).min(INF_BITS) {
                    for s in [0, SIGN] {
                        let x = f32::from_bits(b | s);
                        let r = check_against_oracle(f, &g, x).and_then(|_| check_fast_paths(x));
                        if let Err(e) = r {
                            bad.0 += 1;
                            if bad.1.len() < 5 {
                                bad.1.push(e);
                            }
                        }
                    }
                }
            }
            bad
        });
        assert_no_failures(&format!("dense sweep {}", f.name), res);
        total += centres.len() as u64 * (2 * w as u64 + 1) * 2;
    }
    report(
        "dense sweep around grid points (x 20 modes/policies)",
        t,
        total,
    );
}

/// The 4/6/8-bit formats except E8M0: every f32 whose magnitude lies between half the
/// smallest positive value and twice the overflow step (both signs), against the oracle's
/// step function, for RNE/Propagate and SR/Saturate (these two exercise every remainder
/// pattern; the other modes share the same exponent and shift logic and are swept densely
/// around every decision point above). About 1.2e9 inputs per mode.
#[test]
fn generic_encoders_active_range() {
    let t = Instant::now();
    let total = active_range::<E2M1>()
        + active_range::<E2M3>()
        + active_range::<E3M2>()
        + active_range::<E4M3>()
        + active_range::<UE4M3>()
        + active_range::<E5M2>();
    report(
        "active-range sweeps of the 4/6/8-bit formats (RNE/Propagate, SR/Saturate)",
        t,
        total,
    );
}

/// One format of [`generic_encoders_active_range`], called through the concrete type so
/// the encoder inlines into the sweep loop.
fn active_range<F: ElementFormat>() -> u64 {
    let f = common::format(F::NAME);
    let g = Grid::new(&f);
    let lo = ((g.min_positive() / 2.0) as f32).to_bits();
    let hi = ((g.ovf * 2.0) as f32).to_bits();
    let mut total = 0;
    for (mode, ovf) in [
        (Rounding::NearestEven, Overflow::Propagate),
        (Rounding::Stochastic(77), Overflow::Saturate),
    ] {
        total += sweep_against_step("active range", &f, mode, ovf, lo, hi, |x, want| {
            F::from_f32(x, mode, ovf).to_bits() as u16 == want
        });
    }
    total
}

/// `bf16_from_f32` / `f16_from_f32` with RNE + Propagate are IEEE conversions: compare with
/// the independent implementations in the `half` crate (NaN: both NaN with the same sign).
#[test]
fn bf16_f16_match_half_crate() {
    const STRIDE: u64 = 61;
    let t = Instant::now();
    let n = (1u64 << 32) / STRIDE;
    let res = par_chunks(n, |lo, hi| {
        let mut bad = (0u64, Vec::new());
        for i in lo..hi {
            let x = f32::from_bits((i * STRIDE) as u32);
            let ours_b = bf16_from_f32(x, Rounding::NearestEven, Overflow::Propagate);
            let ours_h = f16_from_f32(x, Rounding::NearestEven, Overflow::Propagate);
            let (ref_b, ref_h) = (bf16::from_f32(x), f16::from_f32(x));
            let ok = if x.is_nan() {
                ours_b.is_nan()
                    && ours_h.is_nan()
                    && ours_b.is_sign_negative() == x.is_sign_negative()
                    && ours_h.is_sign_negative() == x.is_sign_negative()
            } else {
                ours_b.to_bits() == ref_b.to_bits() && ours_h.to_bits() == ref_h.to_bits()
            };
            if !ok {
                bad.0 += 1;
                if bad.1.len() < 5 {
                    bad.1.push(format!("x = 0x{:08x}", x.to_bits()));
                }
            }
        }
        bad
    });
    assert_no_failures("bf16/f16 vs half", res);
    report("bf16/f16 vs half (strided)", t, n);
}

/// Spot values of the fast paths' documented NaN/Inf behaviour.
#[test]
fn fast_path_spot_values() {
    assert_eq!(E2M1::encode_rne_sat(f32::NAN), 0x7);
    assert_eq!(E2M1::encode_rne_sat(-f32::NAN), 0x7);
    assert_eq!(E2M1::encode_rne_sat(-0.0), 0x8);
    assert_eq!(E4M3::encode_rne_sat(f32::NEG_INFINITY), 0xFE);
    assert_eq!(E4M3::encode_rne_sat(-f32::NAN), 0xFF);
    assert_eq!(E4M3::from_f32_rne_sat(464.0).0, 0x7E);
    assert!(round_to_bf16(f32::NAN).is_nan());
}

//! `nvfp4::fake_quantize_into` (the fused path every emulated GEMM operand takes) against the
//! packed quantizer followed by `dequantize_unscaled_into`, bit for bit, on edge-case data
//! (zeros, signed zeros, subnormals, E2M1 ties, magnitudes near `f32::MAX`, whole blocks
//! that flush to scale 0), on 1 and 2 rayon threads; and its error reports for non-finite
//! inputs, including NaN payloads that a careless BF16 rounding of the Hadamard transform
//! would turn into finite values.

mod common;
use common::*;

use quant::{BlockShape, OperandQuant, QuantError, Rht, RngKey, RoundingMode, Usage};

const KEY: RngKey = RngKey {
    seed: 0xfa57,
    stream: 3,
};

fn edge_data(n: usize, seed: u64, huge: bool) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            match (s >> 8) % 19 {
                0 => 0.0,
                1 => -0.0,
                2 => f32::from_bits((s >> 12) as u32 & 0x807F_FFFF), // subnormal
                3 => [0.25f32, -0.75, 1.25, -1.75, 2.5, -3.5, 5.0, 6.0][i % 8],
                4 if huge => f32::MAX * u,
                5 => u * 1e-30,
                _ if i % 89 < 17 => u * 1e-39, // stretches that flush to scale 0
                _ => u * 8.0,
            }
        })
        .collect()
}

fn configs() -> Vec<(OperandQuant, bool)> {
    let nv = OperandQuant::nvfp4();
    let sr = RoundingMode::Stochastic;
    let mut v = vec![
        (nv, false),
        (nv.with_rounding(sr), false),
        (nv.with_block(BlockShape::Tile16), false),
        (nv.with_block(BlockShape::Tile16).with_rounding(sr), false),
    ];
    for rht in [Rht::FixedSigns, Rht::RandomSigns] {
        v.push((nv.with_rht(rht), true));
        v.push((nv.with_rht(rht).with_rounding(sr), true));
    }
    v
}

#[test]
fn fake_quantize_equals_quantize_then_dequantize() {
    let pools: Vec<rayon::ThreadPool> = [1, 2]
        .iter()
        .map(|&n| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .unwrap()
        })
        .collect();
    let shapes = [
        (32, 256),
        (48, 768),
        (64, 48),
        (33, 17),
        (16, 300),
        (256, 64),
    ];
    for (si, &(rows, cols)) in shapes.iter().enumerate() {
        for huge in [false, true] {
            let x = edge_data(rows * cols, si as u64 + 10 * huge as u64, huge);
            for (q, rht) in configs() {
                for usage in [Usage::Rowwise, Usage::Columnwise] {
                    if rht && (usage == Usage::Rowwise || rows % 16 != 0) {
                        continue;
                    }
                    let ctx = format!("{rows}x{cols} {usage:?} {q:?} huge={huge}");
                    let t = quantize(&x, rows, cols, usage, &q, KEY);
                    let Ok(t) = t else {
                        // only an overflowing Hadamard transform of huge values fails
                        assert!(rht && huge, "{ctx}: {t:?}");
                        let mut out = vec![0.0f32; x.len()];
                        let e = fake_quantize_into(&x, rows, cols, usage, &q, KEY, &mut out);
                        assert_eq!(format!("{e:?}"), format!("{:?}", t.map(|_| 0.0f32)));
                        continue;
                    };
                    let mut want = vec![0.0f32; x.len()];
                    let s_want = quant::nvfp4::dequantize_unscaled_into(&t, &mut want).unwrap();
                    for pool in &pools {
                        let mut got = vec![f32::NAN; x.len()];
                        let s = pool
                            .install(|| {
                                fake_quantize_into(&x, rows, cols, usage, &q, KEY, &mut got)
                            })
                            .unwrap();
                        assert_eq!(s.to_bits(), s_want.to_bits(), "{ctx}");
                        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                            assert_eq!(a.to_bits(), b.to_bits(), "{ctx} at {i}: {a:e} vs {b:e}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn non_finite_inputs_are_reported_like_the_packed_path() {
    let (rows, cols) = (64, 48);
    let base = edge_data(rows * cols, 77, false);
    let bad_values = [
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7FFF_FFFF), // NaN payloads that BF16 rounding would carry into
        f32::from_bits(0xFFFF_FFFF), // the sign bit
        f32::from_bits(0x7FFF_8000),
        f32::INFINITY,
        f32::NEG_INFINITY,
    ];
    for (k, &bad) in bad_values.iter().enumerate() {
        let mut x = base.clone();
        let at = (k * 331 + 17) % x.len();
        x[at] = bad;
        for (q, rht) in configs() {
            for usage in [Usage::Rowwise, Usage::Columnwise] {
                if rht && usage == Usage::Rowwise {
                    continue;
                }
                let want = quantize(&x, rows, cols, usage, &q, KEY).unwrap_err();
                let mut out = vec![0.0f32; x.len()];
                let got = fake_quantize_into(&x, rows, cols, usage, &q, KEY, &mut out).unwrap_err();
                assert!(matches!(got, QuantError::Format(_)), "{got:?}");
                assert_eq!(
                    format!("{got:?}"),
                    format!("{want:?}"),
                    "{bad:e} {usage:?} {q:?}"
                );
            }
        }
    }
}

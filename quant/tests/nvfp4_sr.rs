//! Stochastic rounding in `quant::nvfp4`: every element uses exactly its documented Philox
//! byte, the rounding is unbiased within the documented bound (docs/numerics.md#stochastic-rounding), the mean
//! of many SR quantizations beats one RNE quantization (Transformer Engine's own test), and
//! the bits depend only on (seed, stream, element index).

mod common;
use common::*;

use fp_formats::nvfp4::GlobalScale;
use fp_formats::{ElementFormat, Overflow, Rounding, E2M1, UE4M3};
use quant::hadamard::{rht_rows, TE_SIGN_MASK};
use quant::philox::random_byte;
use quant::{BlockShape, OperandQuant, QuantizedTensor, Rht, RngKey, RoundingMode, Usage};

fn sr() -> OperandQuant {
    OperandQuant::nvfp4().with_rounding(RoundingMode::Stochastic)
}

fn data(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..rows * cols)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u: f32 = (0..4)
                .map(|k| ((s >> (16 * k)) & 0xFFFF) as f32 / 65536.0)
                .sum();
            (u - 2.0) * if i % 61 == 0 { 20.0 } else { 1.0 }
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

fn code(t: &QuantizedTensor, r: usize, c: usize) -> u8 {
    let i = r * t.padded_cols + c;
    (t.codes[i / 2] >> (4 * (i % 2))) & 0xF
}

/// Every SR code is `E2M1::from_f32(clamp(v · enc_b, ±6), Stochastic(byte), Saturate)` with
/// `byte = random_byte(key, r · padded_cols + c)` in the stored, padded layout, and the
/// scales equal the RNE scales.
#[test]
fn codes_use_the_documented_bytes() {
    let key = RngKey {
        seed: 0xDEAD_BEEF_0000_0001,
        stream: 0x0000_0001_0000_0002,
    };
    for (rows, cols, usage, q) in [
        (20, 40, Usage::Rowwise, sr()),
        (32, 24, Usage::Columnwise, sr()),
        (32, 24, Usage::Columnwise, sr().with_rht(Rht::FixedSigns)),
        (
            20,
            40,
            Usage::Columnwise,
            sr().with_block(BlockShape::Tile16),
        ),
    ] {
        let x = data(rows, cols, 7);
        let t = quantize(&x, rows, cols, usage, &q, key).unwrap();
        let rne = quantize(
            &x,
            rows,
            cols,
            usage,
            &q.with_rounding(RoundingMode::NearestEven),
            key,
        )
        .unwrap();
        assert_eq!(t.scales, rne.scales);
        assert_eq!(t.amax, rne.amax);
        // The stored-layout input (transposed, transformed) the codes were computed from.
        let mut s = if usage == Usage::Rowwise {
            x.clone()
        } else {
            transpose(&x, rows, cols)
        };
        if q.rht == Rht::FixedSigns {
            rht_rows(&mut s, TE_SIGN_MASK);
        }
        let g = GlobalScale::from_amax(t.amax);
        let mut rounded_up = 0;
        for r in 0..t.rows {
            for c in 0..t.cols {
                let sb = UE4M3(t.scales[r * (t.padded_cols / 16) + c / 16]);
                let y = (s[r * t.cols + c] * g.block_encode_factor(sb)).clamp(-6.0, 6.0);
                let byte = random_byte(key, (r * t.padded_cols + c) as u64);
                let want = E2M1::from_f32(y, Rounding::Stochastic(byte), Overflow::Saturate).0;
                assert_eq!(code(&t, r, c), want, "{usage:?} {q:?} ({r}, {c})");
                rounded_up += (code(&t, r, c) & 7 > code(&rne, r, c) & 7) as usize;
            }
            for c in t.cols..t.padded_cols {
                assert_eq!(code(&t, r, c), 0, "padding");
            }
        }
        assert!(
            rounded_up > t.rows * t.cols / 10,
            "SR differs from RNE often"
        );
    }
}

/// docs/numerics.md#stochastic-rounding: over all 256 random bytes the mean of SR(y) is `y - δ` with
/// `0 <= δ < step / 256` (for `|y| <= 6`, magnitude-wise), e.g. SR(1.2) = 1.199219.
#[test]
fn per_element_unbiased_within_bound() {
    let sr_mean = |y: f32| -> f64 {
        (0..=255u8)
            .map(|r| E2M1::from_f32(y, Rounding::Stochastic(r), Overflow::Saturate).to_f32() as f64)
            .sum::<f64>()
            / 256.0
    };
    assert!((sr_mean(1.2) - 1.199_219).abs() < 1e-6);
    assert_eq!(sr_mean(5.5), 5.5);
    assert!((sr_mean(0.1) - 0.099_609).abs() < 1e-6);
    for k in 0..=6000 {
        let y = k as f32 * 1e-3 + if k % 7 == 0 { 1e-7 } else { 0.0 };
        let y = y.min(6.0);
        let step = if y < 2.0 {
            0.5
        } else if y < 4.0 {
            1.0
        } else {
            2.0
        };
        for y in [y, -y] {
            let m = sr_mean(y);
            let delta = y.abs() as f64 - m.abs();
            assert!((0.0..step / 256.0).contains(&delta), "y = {y}: mean {m}");
        }
    }
}

/// End to end through the quantizer: the mean over 4096 streams of the (unscaled)
/// dequantized SR values of a small block tracks the input within the bound plus sampling
/// noise, including when the block scale rounded down (no clipping bias beyond ±6).
#[test]
fn quantizer_mean_is_unbiased() {
    let x: Vec<f32> = (0..32).map(|i| (i as f32 * 0.37 - 5.0) * 0.9).collect();
    let n = 4096;
    let mut sum = [0.0f64; 32];
    let mut fake = [0.0f32; 32];
    let mut s_dec = 0.0;
    for stream in 0..n {
        let key = RngKey { seed: 1, stream };
        s_dec = fake_quantize_into(&x, 1, 32, Usage::Rowwise, &sr(), key, &mut fake).unwrap();
        for (s, v) in sum.iter_mut().zip(&fake) {
            *s += *v as f64;
        }
    }
    let t = quantize(&x, 1, 32, Usage::Rowwise, &sr(), RngKey::default()).unwrap();
    for i in 0..32 {
        let sb = UE4M3(t.scales[i / 16]).to_f32() as f64;
        let step = 2.0 * sb; // the widest grid step in input units (before S_dec)
        let mean = sum[i] / n as f64 * s_dec as f64;
        let y = x[i] as f64;
        let tol = (step / 256.0 + 5.0 * step / 2.0 / (n as f64).sqrt()) * s_dec as f64;
        // Elements whose scaled value exceeds 6 are clipped (the scale rounded down).
        let enc = GlobalScale::from_amax(t.amax).block_encode_factor(UE4M3(t.scales[i / 16]));
        if (x[i] * enc).abs() > 6.0 {
            continue;
        }
        assert!(
            (mean - y).abs() <= tol,
            "element {i}: mean {mean} vs {y} (tol {tol})"
        );
    }
}

fn rmse(a: &[f32], b: &[f32]) -> f64 {
    (a.iter()
        .zip(b)
        .map(|(x, y)| ((x - y) as f64).powi(2))
        .sum::<f64>()
        / a.len() as f64)
        .sqrt()
}

/// Transformer Engine's test_nvfp4_sr_quantize: the mean of 50 SR dequantizations (streams
/// 0..50) is closer (RMSE) to the input than one RNE quantization, rowwise and columnwise
/// with RHT (where the reference is the transformed transpose, which the quantizer sees).
#[test]
fn mean_of_50_beats_rne() {
    let (rows, cols) = (128, 96);
    let x = data(rows, cols, 3);
    for (usage, q) in [
        (Usage::Rowwise, sr()),
        (Usage::Columnwise, sr().with_rht(Rht::FixedSigns)),
    ] {
        let target = if usage == Usage::Rowwise {
            x.clone()
        } else {
            let mut t = transpose(&x, rows, cols);
            rht_rows(&mut t, TE_SIGN_MASK);
            t
        };
        let deq = |q: &OperandQuant, key: RngKey| -> Vec<f32> {
            quantize(&x, rows, cols, usage, q, key)
                .unwrap()
                .dequantize()
        };
        let rne = deq(
            &q.with_rounding(RoundingMode::NearestEven),
            RngKey::default(),
        );
        let mut mean = vec![0.0f32; x.len()];
        for stream in 0..50 {
            for (m, v) in mean.iter_mut().zip(deq(&q, RngKey { seed: 77, stream })) {
                *m += v / 50.0;
            }
        }
        let (e_mean, e_rne) = (rmse(&mean, &target), rmse(&rne, &target));
        assert!(
            e_mean < e_rne,
            "{usage:?}: mean-of-50 RMSE {e_mean} >= RNE {e_rne}"
        );
        assert!(e_mean < 0.5 * e_rne, "{usage:?}: {e_mean} vs {e_rne}");
    }
}

/// The bits depend only on (seed, stream, element index): the leading rows of a tensor
/// quantize identically on their own (same amax), on 1 or 2 threads; another stream or seed
/// changes them.
#[test]
fn bits_depend_only_on_key_and_index() {
    let (rows, cols) = (96, 48);
    let mut x = data(rows, cols, 5);
    x[3] = 500.0; // the global amax lies in the leading rows
    let key = RngKey {
        seed: 42,
        stream: 9,
    };
    let pool = |n| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .unwrap()
    };
    let full = pool(2).install(|| quantize(&x, rows, cols, Usage::Rowwise, &sr(), key).unwrap());
    let head = pool(1)
        .install(|| quantize(&x[..32 * cols], 32, cols, Usage::Rowwise, &sr(), key).unwrap());
    assert_eq!(full.amax, head.amax);
    assert_eq!(&full.codes[..head.codes.len()], &head.codes[..]);
    let other_stream = quantize(
        &x,
        rows,
        cols,
        Usage::Rowwise,
        &sr(),
        RngKey { stream: 10, ..key },
    )
    .unwrap();
    let other_seed = quantize(
        &x,
        rows,
        cols,
        Usage::Rowwise,
        &sr(),
        RngKey { seed: 43, ..key },
    )
    .unwrap();
    assert_ne!(full.codes, other_stream.codes);
    assert_ne!(full.codes, other_seed.codes);
    assert_eq!(full.scales, other_stream.scales);
}

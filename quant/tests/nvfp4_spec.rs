//! `quant::nvfp4`: the worked examples of docs/numerics.md#worked-examples as direct assertions, the
//! layout and padding rules, the 16x16 transpose property, errors, the agreement of the
//! packed / fake-quantized / dequantized paths, and independence from the thread count.

mod common;
use common::*;

use fp_formats::FormatError;
use quant::hadamard::{rht_rows, TE_SIGN_MASK};
use quant::{
    nvfp4, BlockError, BlockShape, FourOverSix, OperandQuant, QuantError, QuantFormat,
    QuantizedTensor, Rht, RngKey, RoundingMode, Usage,
};

const KEY: RngKey = RngKey {
    seed: 0x5eed,
    stream: 17,
};

fn nv() -> OperandQuant {
    OperandQuant::nvfp4()
}

fn fos(error: BlockError, e4m3_bound_256: bool) -> OperandQuant {
    OperandQuant {
        format: QuantFormat::Nvfp4 {
            four_over_six: Some(FourOverSix {
                error,
                e4m3_bound_256,
            }),
        },
        ..nv()
    }
}

/// Deterministic test data: roughly normal with a few outliers and a tiny row.
fn data(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut x: Vec<f32> = (0..rows * cols)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u: f32 = (0..4)
                .map(|k| ((s >> (16 * k)) & 0xFFFF) as f32 / 65536.0)
                .sum();
            (u - 2.0) * 1.7
        })
        .collect();
    for i in (0..x.len()).step_by(97) {
        x[i] *= 30.0;
    }
    if rows > 2 {
        for v in &mut x[2 * cols..3 * cols] {
            *v *= 1e-7;
        }
    }
    x
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

fn scale(t: &QuantizedTensor, r: usize, c: usize) -> u8 {
    t.scales[r * (t.padded_cols / 16) + c / 16]
}

// ----------------------------------------------------------------------------------------
// docs/numerics.md#worked-examples
// ----------------------------------------------------------------------------------------

#[test]
fn worked_example_1x32() {
    let block0 = [
        0.0f32, 0.1, -0.2, 0.3, 0.45, -0.6, 0.75, 0.9, 1.05, -1.2, 1.35, 1.5, -1.65, 1.8, 1.95, 2.1,
    ];
    let mut x = block0.to_vec();
    x.extend([10.0, -10.0]);
    x.extend([0.5; 14]);
    let t = quantize(&x, 1, 32, Usage::Rowwise, &nv(), KEY).unwrap();
    assert_eq!(t.amax, 10.0);
    assert_eq!(1.0 / t.tensor_scale_inv, 268.8f32); // S_enc = fl(2688 / 10)
    assert_eq!(t.tensor_scale_inv, 1.0 / 268.8f32);
    assert!((t.tensor_scale_inv - 0.003_720_238_3).abs() < 1e-9);
    assert_eq!(t.scales, [0x6C, 0x7E]); // 96 (rounded up from 94.08) and 448
    assert_eq!(
        t.codes,
        [
            0x10, 0x29, 0xB3, 0x54, 0xD5, 0x66, 0x7E, 0x77, 0xF7, 0x11, 0x11, 0x11, 0x11, 0x11,
            0x11, 0x11
        ]
    );
    let codes: Vec<u8> = (0..16).map(|c| code(&t, 0, c)).collect();
    assert_eq!(
        codes,
        [0, 1, 9, 2, 3, 0xB, 4, 5, 5, 0xD, 6, 6, 0xE, 7, 7, 7]
    );
    let deq = t.dequantize();
    let want0 = [
        0.0, 0.17857, -0.17857, 0.35714, 0.53571, -0.53571, 0.71429, 1.07143, 1.07143, -1.07143,
        1.42857, 1.42857, -1.42857, 2.14286, 2.14286, 2.14286,
    ];
    for (a, b) in deq[..16].iter().zip(want0) {
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    }
    assert!((deq[16] - 10.0).abs() < 1e-5 && (deq[17] + 10.0).abs() < 1e-5);
    assert!(deq[18..].iter().all(|v| (v - 0.83333).abs() < 1e-5));
    // GEMM scale of two such tensors: α = a·b / 7,225,344.
    let alpha = t.tensor_scale_inv * t.tensor_scale_inv;
    assert!((alpha - 100.0 / 7_225_344.0).abs() / alpha < 1e-6);
}

#[test]
fn clipping_example() {
    // amax_g = 2688 -> S_enc = 1; block [546, 0 x 15]: s_f32 = 91 -> E4M3 88 (rounded
    // down) -> 546 * enc = 6.2045 clips to 6 -> decodes to 528.
    let mut x = vec![0.0f32; 32];
    x[0] = 546.0;
    x[16] = 2688.0;
    let t = quantize(&x, 1, 32, Usage::Rowwise, &nv(), KEY).unwrap();
    assert_eq!(t.tensor_scale_inv, 1.0);
    assert_eq!(t.scales[0], 0x6B);
    assert_eq!(code(&t, 0, 0), 0x7);
    assert_eq!(t.dequantize()[0], 528.0);
}

#[test]
fn zero_and_edge_cases() {
    // All-zero tensor: S_enc = 1, all scales and codes 0.
    for usage in [Usage::Rowwise, Usage::Columnwise] {
        for q in [
            nv(),
            nv().with_block(BlockShape::Tile16),
            fos(BlockError::Mae, true),
        ] {
            let t = quantize(&[0.0; 48], 3, 16, usage, &q, KEY).unwrap();
            assert_eq!((t.amax, t.tensor_scale_inv), (0.0, 1.0));
            assert!(t.scales.iter().all(|&s| s == 0) && t.codes.iter().all(|&c| c == 0));
        }
    }
    // A block with amax_b / amax_g below 2^-10 / 448 (2.18e-6) flushes to scale 0 and
    // decodes to exactly 0; just above, it gets the smallest scale 2^-9.
    let mut x = vec![0.0f32; 48];
    x[0] = 1.0;
    x[16] = 2.0e-6;
    x[17] = -1.0e-6;
    x[32] = 2.3e-6;
    let t = quantize(&x, 1, 48, Usage::Rowwise, &nv(), KEY).unwrap();
    assert_eq!(&t.scales, &[0x7E, 0x00, 0x01]);
    let d = t.dequantize();
    assert!(d[16..32].iter().all(|&v| v == 0.0));
    assert!(d[32] > 0.0);
    // Empty tensors.
    let t = quantize(&[], 0, 5, Usage::Rowwise, &nv(), KEY).unwrap();
    assert!(t.codes.is_empty() && t.scales.is_empty() && t.amax == 0.0);
    let t = quantize(&[], 4, 0, Usage::Columnwise, &nv(), KEY).unwrap();
    assert_eq!((t.rows, t.cols), (0, 4));
}

// ----------------------------------------------------------------------------------------
// Layout, padding, transposes
// ----------------------------------------------------------------------------------------

#[test]
fn padding_rules() {
    let (rows, cols) = (21, 35);
    let x = data(rows, cols, 1);
    // Row16: only the blocked (stored column) dimension is padded.
    let t = quantize(&x, rows, cols, Usage::Rowwise, &nv(), KEY).unwrap();
    assert_eq!(
        (t.rows, t.cols, t.padded_rows, t.padded_cols),
        (21, 35, 21, 48)
    );
    let t = quantize(&x, rows, cols, Usage::Columnwise, &nv(), KEY).unwrap();
    assert_eq!(
        (t.rows, t.cols, t.padded_rows, t.padded_cols),
        (35, 21, 35, 32)
    );
    for r in 0..35 {
        assert!((21..32).all(|c| code(&t, r, c) == 0), "padding codes are 0");
    }
    // Tile16: both stored dimensions.
    let w = nv().with_block(BlockShape::Tile16);
    let t = quantize(&x, rows, cols, Usage::Rowwise, &w, KEY).unwrap();
    assert_eq!((t.padded_rows, t.padded_cols), (32, 48));
    assert_eq!(t.codes.len(), 32 * 48 / 2);
    assert_eq!(t.scales.len(), 32 * 3);
    // Padding equals quantizing the explicitly zero-padded tensor.
    let mut xp = vec![0.0f32; 32 * 48];
    for r in 0..rows {
        xp[r * 48..r * 48 + cols].copy_from_slice(&x[r * cols..(r + 1) * cols]);
    }
    let tp = quantize(&xp, 32, 48, Usage::Rowwise, &w, KEY).unwrap();
    assert_eq!(
        (&t.codes, &t.scales, t.amax),
        (&tp.codes, &tp.scales, tp.amax)
    );
    assert_eq!(t.dequantize().len(), rows * cols);
}

/// 16x16 tiles: one scale per tile, repeated on the tile's 16 rows; the columnwise copy is
/// the exact transpose of the rowwise copy (codes and scales).
#[test]
fn tile16_copies_are_transposes() {
    let w = nv().with_block(BlockShape::Tile16);
    for (rows, cols) in [(64, 48), (40, 56), (17, 33), (16, 16)] {
        let x = data(rows, cols, rows as u64);
        let a = quantize(&x, rows, cols, Usage::Rowwise, &w, KEY).unwrap();
        let b = quantize(&x, rows, cols, Usage::Columnwise, &w, KEY).unwrap();
        assert_eq!(a.amax, b.amax);
        assert_eq!(
            (a.padded_rows, a.padded_cols),
            (b.padded_cols, b.padded_rows)
        );
        for r in 0..a.padded_rows {
            for c in 0..a.padded_cols {
                assert_eq!(
                    code(&a, r, c),
                    code(&b, c, r),
                    "code ({r}, {c}) of {rows}x{cols}"
                );
                assert_eq!(scale(&a, r, c), scale(&b, c, r), "scale ({r}, {c})");
                assert_eq!(
                    scale(&a, r, c),
                    scale(&a, r / 16 * 16, c),
                    "scale repeated on rows"
                );
            }
        }
        let (da, db) = (a.dequantize(), b.dequantize());
        assert_eq!(transpose(&da, rows, cols), db);
    }
    // Also with Four Over Six (same candidate choice per tile in both copies).
    let q = OperandQuant {
        block: BlockShape::Tile16,
        ..fos(BlockError::Mse, true)
    };
    let x = data(48, 32, 9);
    let a = quantize(&x, 48, 32, Usage::Rowwise, &q, KEY).unwrap();
    let b = quantize(&x, 48, 32, Usage::Columnwise, &q, KEY).unwrap();
    assert_eq!(transpose(&a.dequantize(), 48, 32), b.dequantize());
}

/// Columnwise = rowwise quantization of the transpose; with RHT, of the transformed
/// transpose (the post-RHT amax).
#[test]
fn columnwise_is_rowwise_of_transpose() {
    let (rows, cols) = (48, 40);
    let x = data(rows, cols, 3);
    let xt = transpose(&x, rows, cols);
    for q in [
        nv(),
        nv().with_block(BlockShape::Tile16),
        fos(BlockError::Mae, false),
    ] {
        let c = quantize(&x, rows, cols, Usage::Columnwise, &q, KEY).unwrap();
        let r = quantize(&xt, cols, rows, Usage::Rowwise, &q, KEY).unwrap();
        assert_eq!((c.codes, c.scales, c.amax), (r.codes, r.scales, r.amax));
    }
    let mut xh = xt.clone();
    rht_rows(&mut xh, TE_SIGN_MASK);
    let c = quantize(
        &x,
        rows,
        cols,
        Usage::Columnwise,
        &nv().with_rht(Rht::FixedSigns),
        KEY,
    )
    .unwrap();
    let r = quantize(&xh, cols, rows, Usage::Rowwise, &nv(), KEY).unwrap();
    assert_eq!(c.amax, xh.iter().fold(0.0f32, |m, v| m.max(v.abs())));
    assert_ne!(c.amax, xt.iter().fold(0.0f32, |m, v| m.max(v.abs())));
    assert_eq!((c.codes, c.scales, c.amax), (r.codes, r.scales, r.amax));
}

#[test]
fn four_over_six_picks_map_to_4() {
    // One block [6, 5 x 15], bound 256: S_enc = 256; map-to-6 scale 256 (0x78) represents
    // 5 as 4 or 6 (error 1 each); map-to-4 scale 384 (0x7C) gives 5 -> 3 * 1.5 = 4.5 (error
    // 0.5) and 6 -> 4 * 1.5 = 6: map-to-4 wins.
    let mut x = vec![5.0f32; 16];
    x[0] = 6.0;
    let t = quantize(&x, 1, 16, Usage::Rowwise, &fos(BlockError::Mae, true), KEY).unwrap();
    assert_eq!(t.scales, [0x7C]);
    assert_eq!(1.0 / t.tensor_scale_inv, 256.0);
    let d = t.dequantize();
    assert_eq!(d[0], 6.0);
    assert!(d[1..].iter().all(|&v| v == 4.5));
    // [6 x 16]: map-to-6 is exact, map-to-4 too (6 -> 4 * 1.5): a tie picks map-to-6.
    let t = quantize(
        &[6.0; 16],
        1,
        16,
        Usage::Rowwise,
        &fos(BlockError::Mse, true),
        KEY,
    )
    .unwrap();
    assert_eq!(t.scales, [0x78]);
    // With bound 448 the global scale is the plain NVFP4 one.
    let t = quantize(&x, 1, 16, Usage::Rowwise, &fos(BlockError::Mae, false), KEY).unwrap();
    assert_eq!(t.tensor_scale_inv, 6.0 / 2688.0);
}

// ----------------------------------------------------------------------------------------
// Errors
// ----------------------------------------------------------------------------------------

#[test]
fn errors() {
    let x = data(32, 16, 5);
    let invalid = |r: Result<QuantizedTensor, QuantError>| {
        assert!(matches!(r, Err(QuantError::InvalidConfig(_))), "{r:?}")
    };
    let rht = nv().with_rht(Rht::FixedSigns);
    invalid(quantize(&x, 32, 16, Usage::Rowwise, &rht, KEY));
    invalid(quantize(
        &x,
        32,
        16,
        Usage::Rowwise,
        &nv().with_rht(Rht::RandomSigns),
        KEY,
    ));
    invalid(quantize(
        &x,
        32,
        16,
        Usage::Columnwise,
        &fos(BlockError::Mae, true).with_rht(Rht::FixedSigns),
        KEY,
    ));
    invalid(quantize(
        &x,
        32,
        16,
        Usage::Rowwise,
        &fos(BlockError::Mse, true).with_rounding(RoundingMode::Stochastic),
        KEY,
    ));
    invalid(quantize(
        &x,
        32,
        16,
        Usage::Rowwise,
        &nv().with_block(BlockShape::Row32),
        KEY,
    ));
    // RHT needs the transformed dimension (rows) to be a multiple of 16.
    invalid(quantize(
        &x[..24 * 16],
        24,
        16,
        Usage::Columnwise,
        &rht,
        KEY,
    ));
    // Shapes.
    assert!(matches!(
        quantize(&x, 31, 16, Usage::Rowwise, &nv(), KEY),
        Err(QuantError::Format(FormatError::ShapeMismatch { .. }))
    ));
    let mut out = vec![0.0f32; 10];
    assert!(matches!(
        fake_quantize_into(&x, 32, 16, Usage::Rowwise, &nv(), KEY, &mut out),
        Err(QuantError::Format(FormatError::ShapeMismatch { .. }))
    ));
    // Non-finite input: the flat index into x of the first offender, on every path.
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut y = x.clone();
        y[200] = bad;
        y[300] = f32::NAN;
        for (usage, q) in [
            (Usage::Rowwise, nv()),
            (Usage::Columnwise, nv()),
            (Usage::Columnwise, rht),
            (Usage::Columnwise, nv().with_block(BlockShape::Tile16)),
        ] {
            match quantize(&y, 32, 16, usage, &q, KEY) {
                Err(QuantError::Format(FormatError::NonFinite { index, value })) => {
                    assert_eq!(index, 200);
                    assert_eq!(value.to_bits(), bad.to_bits());
                }
                r => panic!("expected NonFinite, got {r:?}"),
            }
            let mut out = vec![0.0f32; y.len()];
            assert!(fake_quantize_into(&y, 32, 16, usage, &q, KEY, &mut out).is_err());
        }
    }
    // A dequantizer handed an inconsistent tensor.
    let mut t = quantize(&x, 32, 16, Usage::Rowwise, &nv(), KEY).unwrap();
    t.codes.pop();
    let mut out = vec![0.0f32; 32 * 16];
    assert!(matches!(
        nvfp4::dequantize_unscaled_into(&t, &mut out),
        Err(QuantError::Format(FormatError::BadBufferLength { .. }))
    ));
}

// ----------------------------------------------------------------------------------------
// Path agreement and thread-count independence
// ----------------------------------------------------------------------------------------

fn all_configs() -> Vec<(Usage, OperandQuant)> {
    let sr = RoundingMode::Stochastic;
    let mut v = Vec::new();
    for usage in [Usage::Rowwise, Usage::Columnwise] {
        v.push((usage, nv()));
        v.push((usage, nv().with_rounding(sr)));
        v.push((usage, nv().with_block(BlockShape::Tile16)));
        v.push((usage, nv().with_block(BlockShape::Tile16).with_rounding(sr)));
        v.push((usage, fos(BlockError::Mae, true)));
        v.push((
            usage,
            OperandQuant {
                block: BlockShape::Tile16,
                ..fos(BlockError::Mse, false)
            },
        ));
    }
    for rht in [Rht::FixedSigns, Rht::RandomSigns] {
        v.push((Usage::Columnwise, nv().with_rht(rht)));
        v.push((Usage::Columnwise, nv().with_rht(rht).with_rounding(sr)));
        v.push((
            Usage::Columnwise,
            nv().with_rht(rht).with_block(BlockShape::Tile16),
        ));
    }
    v
}

/// `fake_quantize_into` = `quantize` + `dequantize_unscaled_into`, and `dequantize` =
/// fake · S_dec, bit for bit, for every configuration, including shapes that span several
/// parallel panels and need padding.
#[test]
fn fake_quantize_agrees_with_packed() {
    for (rows, cols) in [(144, 80), (32, 50)] {
        let x = data(rows, cols, 11);
        for (usage, q) in all_configs() {
            let t = quantize(&x, rows, cols, usage, &q, KEY).unwrap();
            let mut fake = vec![0.0f32; rows * cols];
            let s_dec = fake_quantize_into(&x, rows, cols, usage, &q, KEY, &mut fake).unwrap();
            assert_eq!(s_dec, t.tensor_scale_inv);
            let mut unscaled = vec![f32::NAN; rows * cols];
            nvfp4::dequantize_unscaled_into(&t, &mut unscaled).unwrap();
            let full = t.dequantize();
            for i in 0..rows * cols {
                assert_eq!(
                    fake[i].to_bits(),
                    unscaled[i].to_bits(),
                    "{usage:?} {q:?} element {i}"
                );
                assert_eq!((fake[i] * s_dec).to_bits(), full[i].to_bits());
            }
        }
    }
}

#[test]
fn independent_of_thread_count() {
    let (rows, cols) = (208, 144); // several panels in both layouts
    let x = data(rows, cols, 21);
    let pool = |n| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .unwrap()
    };
    let (p1, p2) = (pool(1), pool(2));
    for (usage, q) in all_configs() {
        let a = p1.install(|| quantize(&x, rows, cols, usage, &q, KEY).unwrap());
        let b = p2.install(|| quantize(&x, rows, cols, usage, &q, KEY).unwrap());
        assert_eq!(a, b, "{usage:?} {q:?}");
        let mut fa = vec![0.0f32; rows * cols];
        let mut fb = vec![0.0f32; rows * cols];
        p1.install(|| fake_quantize_into(&x, rows, cols, usage, &q, KEY, &mut fa).unwrap());
        p2.install(|| fake_quantize_into(&x, rows, cols, usage, &q, KEY, &mut fb).unwrap());
        assert_eq!(fa, fb);
    }
}

/// The quantization error is what NVFP4 should give: each dequantized value within half
/// a grid step (relative to its block scale) of the input, except clipped maxima.
#[test]
fn error_is_bounded() {
    let (rows, cols) = (64, 64);
    let x = data(rows, cols, 4);
    let t = quantize(&x, rows, cols, Usage::Rowwise, &nv(), KEY).unwrap();
    let d = t.dequantize();
    for r in 0..rows {
        for c in 0..cols {
            let s = fp_formats::ElementFormat::to_f32(fp_formats::UE4M3(scale(&t, r, c)))
                * t.tensor_scale_inv;
            let (xv, dv) = (x[r * cols + c], d[r * cols + c]);
            if s == 0.0 {
                // Flushed block: decodes to 0, and only tiny blocks flush.
                assert!(dv == 0.0 && xv.abs() <= 2.2e-6 * t.amax, "({r},{c}) {xv}");
                continue;
            }
            // Largest half-step of the E2M1 grid is 1 (between 4 and 6), plus clipping of
            // at most 6 * 2^-4 when the E4M3 scale rounded down.
            assert!(
                (xv - dv).abs() <= 1.0 * s + 0.375 * s + 1e-6 * xv.abs(),
                "({r},{c}) {xv} {dv}"
            );
        }
    }
}

//! The vectorised fast paths (slice encoders and decoders, the NVFP4 and MX matrix
//! quantizers and dequantizers) against references built here from the generic bit-exact
//! encoder `ElementFormat::from_f32` and the formulas of docs/numerics.md#nvfp4-block-scale and
//! docs/numerics.md#scale-rules.
//!
//! The library picks AVX2 kernels at run time when the CPU has them; run this file a second
//! time with `FP_FORMATS_FORCE_PORTABLE=1` to check the portable fallback end to end.

use fp_formats::mx::{self, MxElement, MxOptions, ScaleRule};
use fp_formats::nvfp4::{self, GlobalScale, Nvfp4Options};
use fp_formats::pack;
use fp_formats::{
    ElementFormat, FormatError, Overflow, Padding, Rounding, E2M1, E2M3, E3M2, E4M3, E5M2, E8M0,
    UE4M3,
};

/// Deterministic xorshift64* stream.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Roughly normal (sum of four uniforms, centred, unit variance).
    fn normal(&mut self) -> f32 {
        ((0..4).map(|_| self.uniform()).sum::<f32>() - 2.0) * 3.0f32.sqrt()
    }
}

/// Values of every kind an encoder must handle: grid points and midpoints of E2M1 / E4M3
/// (both signs), ordinary values over many binades, subnormals, ±0, huge values, and (when
/// `specials`) NaN and ±Inf.
fn mixed_values(n: usize, seed: u64, specials: bool) -> Vec<f32> {
    let grid = [
        0.25f32,
        0.5,
        0.75,
        1.0,
        1.25,
        1.5,
        1.75,
        2.0,
        2.5,
        3.0,
        3.5,
        4.0,
        5.0,
        6.0,
        7.0,
        448.0,
        464.0,
        480.0,
        0.015625,
        0.0009765625,
        0.001953125,
    ];
    let mut r = Rng(seed);
    (0..n)
        .map(|i| {
            let k = r.next();
            let sign = if k & 1 == 0 { 1.0 } else { -1.0 };
            let v = match k % 10 {
                0 => {
                    let b = (r.next() >> 32) as u32;
                    let finite = b & 0x7F80_0000 != 0x7F80_0000;
                    f32::from_bits(if specials || finite {
                        b
                    } else {
                        b & 0xBFFF_FFFF
                    })
                }
                1 if specials => [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -f32::NAN][i % 4],
                1 => 0.0,
                2 | 3 => grid[(k >> 8) as usize % grid.len()],
                4 => f32::from_bits((r.next() >> 41) as u32), // subnormals
                5 => r.normal() * 2f32.powi((k >> 8) as i32 % 60 - 30),
                _ => r.normal() * 3.0,
            };
            v * sign
        })
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn rne<F: ElementFormat>(x: f32) -> u8 {
    F::from_f32(x, Rounding::NearestEven, Overflow::Saturate).to_bits()
}

fn abs_max(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |a, v| a.max(v.abs()))
}

#[test]
fn slice_encoders_match_from_f32() {
    for (n, seed) in [
        (0, 1),
        (1, 2),
        (2, 3),
        (63, 4),
        (64, 5),
        (65, 6),
        (1000, 7),
        (300_001, 8),
    ] {
        let x = mixed_values(n, seed, true);
        let mut e4 = vec![0u8; n];
        E4M3::encode_slice_rne_sat(&x, &mut e4);
        let mut e2 = vec![0u8; n.div_ceil(2)];
        E2M1::encode_slice_packed(&x, &mut e2);
        for (i, &v) in x.iter().enumerate() {
            assert_eq!(e4[i], rne::<E4M3>(v), "E4M3 {v:e} at {i}");
            let nib = if i % 2 == 0 {
                e2[i / 2] & 0xF
            } else {
                e2[i / 2] >> 4
            };
            assert_eq!(nib, rne::<E2M1>(v), "E2M1 {v:e} at {i}");
        }
        if n % 2 == 1 {
            assert_eq!(
                e2[n / 2] >> 4,
                0,
                "odd length leaves the last high nibble zero"
            );
        }
        // The packed layout is exactly pack_fp4 of the unpacked codes.
        let unpacked: Vec<u8> = x.iter().map(|&v| rne::<E2M1>(v)).collect();
        assert_eq!(e2, pack::pack_fp4(&unpacked));
    }
}

#[test]
fn slice_decoders_match_to_f32() {
    let codes: Vec<u8> = (0..=255u8).cycle().take(256 * 3 + 5).collect();
    let mut out = vec![0.0f32; codes.len()];
    E4M3::decode_slice(&codes, &mut out);
    let want: Vec<f32> = codes.iter().map(|&c| E4M3(c).to_f32()).collect();
    assert_eq!(bits(&out), bits(&want));
    for n in [0, 1, 2, 31, 32, 33, 2 * codes.len()] {
        let packed = &codes[..n.div_ceil(2)];
        let mut out = vec![0.0f32; n];
        E2M1::decode_slice_packed(packed, &mut out);
        let want: Vec<f32> = pack::unpack_fp4(packed, n)
            .unwrap()
            .iter()
            .map(|&c| E2M1(c).to_f32())
            .collect();
        assert_eq!(bits(&out), bits(&want), "n = {n}");
    }
}

#[test]
#[should_panic(expected = "E2M1 packed output length")]
fn slice_encoder_checks_the_output_length() {
    E2M1::encode_slice_packed(&[1.0, 2.0, 3.0], &mut [0u8; 1]);
}

/// NVFP4 from its definition (docs/numerics.md#nvfp4), with the generic encoders only.
fn nvfp4_reference(x: &[f32], rows: usize, cols: usize) -> (Vec<u8>, Vec<u8>) {
    let amax = abs_max(x);
    let mut s_enc = (2688.0f32 / amax).min(f32::MAX);
    if amax == 0.0 || s_enc == 0.0 {
        s_enc = 1.0;
    }
    let s_dec = 1.0 / s_enc;
    let m = s_enc * (1.0f32 / 6.0);
    let padded = cols.div_ceil(16) * 16;
    let mut unpacked = vec![0u8; rows * padded];
    let mut scales = Vec::new();
    for r in 0..rows {
        for b in 0..padded / 16 {
            let block: Vec<f32> = (b * 16..b * 16 + 16)
                .map(|c| if c < cols { x[r * cols + c] } else { 0.0 })
                .collect();
            let s = rne::<E4M3>((abs_max(&block) * m).min(f32::MAX));
            scales.push(s);
            let enc = (1.0 / (E4M3(s).to_f32() * s_dec)).min(f32::MAX);
            for (i, &v) in block.iter().enumerate() {
                unpacked[r * padded + b * 16 + i] = rne::<E2M1>(v * enc);
            }
        }
    }
    let codes = unpacked.chunks(2).map(|p| p[0] | (p[1] << 4)).collect();
    (codes, scales)
}

fn nvfp4_matrix(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut r = Rng(seed);
    let mut x: Vec<f32> = (0..rows * cols).map(|_| r.normal()).collect();
    let n = x.len();
    // Outliers, a tiny block (subnormal or flushed scale), exact zeros and a tie pattern.
    for k in 0..n / 97 {
        x[(k * 7919) % n] *= 300.0;
    }
    for v in x.iter_mut().skip(n / 3).take(16) {
        *v *= 1e-7;
    }
    for v in x.iter_mut().skip(n / 2).take(40) {
        *v = 0.0;
    }
    for (i, v) in x.iter_mut().skip(2 * n / 3).take(16).enumerate() {
        *v = [0.25f32, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -6.0][i % 8];
    }
    x
}

#[test]
fn nvfp4_quantize_matches_the_spec_reference() {
    // Groups of 8 blocks, full and partial passes of groups, single blocks, padding.
    let shapes = [
        (1, 16),
        (3, 48),
        (5, 128),
        (7, 16 * 13),
        (3, 16 * 45),
        (33, 1024),
        (2, 20),
        (4, 200),
        (3, 5),
    ];
    for (k, &(rows, cols)) in shapes.iter().enumerate() {
        let x = nvfp4_matrix(rows, cols, 100 + k as u64);
        let opts = Nvfp4Options {
            padding: Padding::Zero,
        };
        let q = nvfp4::quantize(&x, rows, cols, opts).unwrap();
        let (codes, scales) = nvfp4_reference(&x, rows, cols);
        assert_eq!(q.codes, codes, "{rows}x{cols}");
        assert_eq!(q.scale_bytes(), &scales[..], "{rows}x{cols}");
        assert_eq!(q.amax.to_bits(), abs_max(&x).to_bits());

        // Dequantization: x̂ = fl(fl(e2m1 * s_b) * S_dec), padding dropped.
        let s_dec = GlobalScale::from_amax(q.amax).s_dec;
        let padded = q.padded_cols;
        let mut want = Vec::new();
        for r in 0..rows {
            for c in 0..cols {
                let i = r * padded + c;
                let code = (codes[i / 2] >> (4 * (i % 2))) & 0xF;
                let s = UE4M3(scales[i / 16]).to_f32();
                want.push(E2M1(code).to_f32() * s * s_dec);
            }
        }
        assert_eq!(bits(&q.dequantize()), bits(&want), "{rows}x{cols}");
        let mut out = vec![f32::NAN; rows * cols];
        q.dequantize_into(&mut out);
        assert_eq!(bits(&out), bits(&want));
    }
}

#[test]
fn nvfp4_big_random_matrix_matches_the_spec_reference() {
    let (rows, cols) = (64, 4096);
    let x = nvfp4_matrix(rows, cols, 7);
    let q = nvfp4::quantize(&x, rows, cols, Nvfp4Options::default()).unwrap();
    let (codes, scales) = nvfp4_reference(&x, rows, cols);
    assert!(q.codes == codes && q.scale_bytes() == &scales[..]);
}

#[test]
fn nvfp4_rejects_non_finite_input_at_the_right_index() {
    let mut x = nvfp4_matrix(4, 64, 3);
    for (i, bad) in [(0, f32::NAN), (77, f32::INFINITY), (255, f32::NEG_INFINITY)] {
        let saved = x[i];
        x[i] = bad;
        match nvfp4::quantize(&x, 4, 64, Nvfp4Options::default()) {
            Err(FormatError::NonFinite { index, .. }) => assert_eq!(index, i),
            other => panic!("expected NonFinite at {i}, got {other:?}"),
        }
        x[i] = saved;
    }
    assert_eq!(
        fp_formats::finite_amax(&x).unwrap().to_bits(),
        abs_max(&x).to_bits()
    );
}

fn mx_codes_reference<F: ElementFormat>(
    x: &[f32],
    rows: usize,
    cols: usize,
    rule: ScaleRule,
) -> (Vec<u8>, Vec<E8M0>) {
    let padded = cols.div_ceil(32) * 32;
    let mut codes = Vec::new();
    let mut scales = Vec::new();
    for r in 0..rows {
        let mut row = Vec::new();
        for b in 0..padded / 32 {
            let block: Vec<f32> = (b * 32..b * 32 + 32)
                .map(|c| if c < cols { x[r * cols + c] } else { 0.0 })
                .collect();
            let s = rule.scale::<F>(abs_max(&block));
            scales.push(s);
            row.extend(block.iter().map(|&v| rne::<F>(v * s.reciprocal())));
        }
        // The documented packings (crate::pack), written out independently.
        match F::BITS {
            8 => codes.extend(row),
            4 => codes.extend(row.chunks(2).map(|p| p[0] | (p[1] << 4))),
            _ => {
                for g in row.chunks(4) {
                    let w = g
                        .iter()
                        .enumerate()
                        .fold(0u32, |w, (i, &c)| w | (c as u32) << (6 * i));
                    codes.extend_from_slice(&w.to_le_bytes()[..3]);
                }
            }
        }
    }
    (codes, scales)
}

fn mx_case<F: ElementFormat>(element: MxElement, rows: usize, cols: usize, seed: u64) {
    let x = nvfp4_matrix(rows, cols, seed);
    for rule in [
        ScaleRule::Rceil,
        ScaleRule::Floor,
        ScaleRule::Ceil,
        ScaleRule::Even,
    ] {
        let opts = MxOptions {
            element,
            rule,
            padding: Padding::Zero,
        };
        let q = mx::quantize(&x, rows, cols, opts).unwrap();
        let (codes, scales) = mx_codes_reference::<F>(&x, rows, cols, rule);
        let what = format!("{element:?} {rule:?} {rows}x{cols}");
        assert_eq!(q.scales, scales, "{what}");
        assert_eq!(q.codes, codes, "{what}");
        // Dequantization: code value times the scale.
        let padded = q.padded_cols;
        let row_bytes = element.packed_len(padded);
        let mut want = Vec::new();
        for r in 0..rows {
            let row = &codes[r * row_bytes..][..row_bytes];
            let unpacked = match F::BITS {
                8 => row.to_vec(),
                4 => pack::unpack_fp4(row, padded).unwrap(),
                _ => pack::unpack_fp6(row, padded).unwrap(),
            };
            for c in 0..cols {
                want.push(
                    F::from_bits(unpacked[c]).to_f32() * scales[r * padded / 32 + c / 32].value(),
                );
            }
        }
        assert_eq!(bits(&q.dequantize()), bits(&want), "{what}");
        let mut out = vec![f32::NAN; rows * cols];
        q.dequantize_into(&mut out);
        assert_eq!(bits(&out), bits(&want), "{what}");
    }
}

#[test]
fn mx_quantize_matches_the_reference_for_every_element_and_rule() {
    let shapes = [
        (1, 32),
        (3, 96),
        (4, 256),
        (3, 32 * 19),
        (2, 32 * 45),
        (9, 1024),
        (2, 40),
        (3, 7),
        (2, 300),
    ];
    for (k, &(rows, cols)) in shapes.iter().enumerate() {
        let seed = 200 + k as u64;
        mx_case::<E4M3>(MxElement::E4M3, rows, cols, seed);
        mx_case::<E2M1>(MxElement::E2M1, rows, cols, seed);
        mx_case::<E5M2>(MxElement::E5M2, rows, cols, seed);
        mx_case::<E2M3>(MxElement::E2M3, rows, cols, seed);
        mx_case::<E3M2>(MxElement::E3M2, rows, cols, seed);
    }
}

#[test]
fn pack_into_variants_match_the_allocating_ones() {
    let mut r = Rng(9);
    for n in [0usize, 1, 2, 3, 4, 5, 7, 8, 33, 100] {
        let c4: Vec<u8> = (0..n).map(|_| (r.next() & 0xF) as u8).collect();
        let c6: Vec<u8> = (0..n).map(|_| (r.next() & 0x3F) as u8).collect();
        let p4 = pack::pack_fp4(&c4);
        let p6 = pack::pack_fp6(&c6);
        assert_eq!(p6.len(), pack::fp6_packed_len(n));
        let mut o6 = vec![0xAAu8; p6.len()];
        pack::pack_fp6_into(&c6, &mut o6);
        assert_eq!(o6, p6);
        let mut u4 = vec![0xAAu8; n];
        pack::unpack_fp4_into(&p4, &mut u4);
        assert_eq!(u4, c4);
        let mut u6 = vec![0xAAu8; n];
        pack::unpack_fp6_into(&p6, &mut u6);
        assert_eq!(u6, c6);
        assert_eq!(pack::unpack_fp6(&p6, n).unwrap(), c6);
        assert_eq!(pack::unpack_fp4(&p4, n).unwrap(), c4);
    }
}

//! The 16-point random Hadamard transform: the matrix, the worked vectors of
//! docs/numerics.md#random-hadamard-transform, and the Wgrad invariance `RHT(dYᵀ) · RHT(Xᵀ)ᵀ ≈ dYᵀ X`.

use quant::gemm::matmul_tn;
use quant::hadamard::{
    matrix, random_sign_mask, rht16, rht16_f32, rht_rows, sign_mask, signs, TE_SIGN_MASK,
};
use quant::{Rht, RngKey};

#[test]
fn te_sign_mask_is_the_te_vector() {
    let te = [
        1., 1., 1., -1., 1., -1., -1., -1., -1., -1., -1., 1., -1., 1., -1., -1.,
    ];
    assert_eq!(signs(TE_SIGN_MASK), te);
    assert_eq!(TE_SIGN_MASK, 55272);
}

/// `H · Hᵀ = I` exactly in f32 (entries ±1/4, 16 terms: every partial sum is exact).
#[test]
fn orthogonal() {
    for mask in [
        0u16,
        TE_SIGN_MASK,
        0xFFFF,
        0x1234,
        random_sign_mask(RngKey { seed: 9, stream: 1 }),
    ] {
        let h = matrix(mask);
        for i in 0..16 {
            for j in 0..16 {
                let dot: f32 = (0..16).map(|k| h[i][k] * h[j][k]).sum();
                assert_eq!(
                    dot,
                    if i == j { 1.0 } else { 0.0 },
                    "mask {mask:#x} ({i}, {j})"
                );
                let dot_t: f32 = (0..16).map(|k| h[k][i] * h[k][j]).sum();
                assert_eq!(dot_t, if i == j { 1.0 } else { 0.0 }, "HᵀH, mask {mask:#x}");
            }
        }
    }
}

#[test]
fn golden_rows() {
    let h = matrix(TE_SIGN_MASK);
    let row = |i: usize| -> Vec<f32> { h[i].iter().map(|v| v * 4.0).collect() };
    assert_eq!(row(0), vec![1.0; 16]);
    let r3 = [
        -1., 1., 1., -1., -1., 1., 1., -1., -1., 1., 1., -1., -1., 1., 1., -1.,
    ];
    assert_eq!(row(3), r3);
}

#[test]
fn golden_vectors() {
    let mut e0 = [0.0f32; 16];
    e0[0] = 8.0;
    assert_eq!(rht16(&e0, TE_SIGN_MASK), [2.0; 16]);
    let ramp: [f32; 16] = core::array::from_fn(|i| i as f32);
    let want = [
        -14.5, -7.5, 6.5, -0.5, 6.5, -0.5, -14.5, 8.5, 7.5, 14.5, 0.5, 1.5, 0.5, -2.5, 9.5, -15.5,
    ];
    assert_eq!(rht16(&ramp, TE_SIGN_MASK), want);
    assert_eq!(rht16_f32(&ramp, TE_SIGN_MASK), want);
}

/// The butterfly computes `x · H` (checked in f64 against the matrix) and the f32 result is
/// within a few ulps of it.
#[test]
fn butterfly_is_x_times_h() {
    let mut s = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    };
    for mask in [TE_SIGN_MASK, 0, 0xA5A5] {
        let h = matrix(mask);
        for _ in 0..200 {
            let x: [f32; 16] = core::array::from_fn(|_| rnd() * 10.0);
            let y = rht16_f32(&x, mask);
            for j in 0..16 {
                let exact: f64 = (0..16).map(|k| x[k] as f64 * h[k][j] as f64).sum();
                let tol =
                    16.0 * f32::EPSILON as f64 * x.iter().map(|v| v.abs() as f64).sum::<f64>();
                assert!((y[j] as f64 - exact).abs() <= tol, "{} vs {exact}", y[j]);
            }
            // The rounded variant is the BF16 rounding of the unrounded one.
            let r = rht16(&x, mask);
            assert!(r
                .iter()
                .zip(&y)
                .all(|(a, b)| *a == fp_formats::round_to_bf16(*b)));
        }
    }
}

#[test]
fn sign_masks() {
    let k = RngKey {
        seed: 11,
        stream: 22,
    };
    assert_eq!(sign_mask(Rht::Off, k), None);
    assert_eq!(sign_mask(Rht::FixedSigns, k), Some(TE_SIGN_MASK));
    assert_eq!(sign_mask(Rht::RandomSigns, k), Some(random_sign_mask(k)));
    // Defined as word 0 of the reserved Philox block of the key.
    let w = quant::philox::philox4x32_10(
        quant::philox::block_counter(u64::MAX, 22),
        quant::philox::key_words(k),
    );
    assert_eq!(random_sign_mask(k), w[0] as u16);
    // Different streams give (generally) different masks.
    let masks: std::collections::HashSet<u16> = (0..64)
        .map(|s| {
            random_sign_mask(RngKey {
                seed: 11,
                stream: s,
            })
        })
        .collect();
    assert!(masks.len() > 60);
}

fn lcg_data(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            // Approximately normal: sum of 4 uniforms, centred.
            let u: f32 = (0..4)
                .map(|k| ((s >> (16 * k)) & 0xFFFF) as f32 / 65536.0)
                .sum::<f32>()
                - 2.0;
            u * 1.7
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

/// Wgrad: `dW = dYᵀ X` over M tokens. Transforming the rows of `dYᵀ` ([N, M]) and `Xᵀ`
/// ([K, M]) along M leaves the product unchanged: without the BF16 rounding to about 1e-5
/// relative (f32 rounding of the butterfly); with it, within the BF16 error.
#[test]
fn wgrad_product_preserved() {
    let (m, n, k) = (256, 24, 40);
    let dy = lcg_data(m * n, 1);
    let x = lcg_data(m * k, 2);
    let dyt = transpose(&dy, m, n); // [N, M]
    let xt = transpose(&x, m, k); // [K, M]
    let mut reference = vec![0.0f32; n * k];
    matmul_tn(&dyt, &xt, n, k, m, &mut reference);
    let norm = reference.iter().map(|v| v * v).sum::<f32>().sqrt();

    for mask in [
        TE_SIGN_MASK,
        random_sign_mask(RngKey { seed: 3, stream: 4 }),
    ] {
        // Unrounded transform.
        let t = |a: &[f32]| -> Vec<f32> {
            a.chunks_exact(16)
                .flat_map(|c| rht16_f32(c.try_into().unwrap(), mask))
                .collect()
        };
        let mut out = vec![0.0f32; n * k];
        matmul_tn(&t(&dyt), &t(&xt), n, k, m, &mut out);
        let err = max_rel(&out, &reference, norm);
        assert!(err < 1e-5, "unrounded RHT changed dYᵀX by {err}");

        // With the BF16 rounding (as quantized): the error is that of rounding the GEMM
        // inputs to BF16 (relative 2^-9 per input), compared with plain BF16 inputs.
        let (mut a, mut b) = (dyt.clone(), xt.clone());
        rht_rows(&mut a, mask);
        rht_rows(&mut b, mask);
        matmul_tn(&a, &b, n, k, m, &mut out);
        let err = max_rel(&out, &reference, norm);
        let bf =
            |v: &[f32]| -> Vec<f32> { v.iter().map(|&e| fp_formats::round_to_bf16(e)).collect() };
        matmul_tn(&bf(&dyt), &bf(&xt), n, k, m, &mut out);
        let bf16_err = max_rel(&out, &reference, norm);
        assert!(
            err < 2.0 * bf16_err.max(2f32.powi(-9)) && err < 2e-2,
            "BF16-rounded RHT changed dYᵀX by {err} (plain BF16 inputs: {bf16_err})"
        );
        // A mismatched pair of sign masks does not preserve the product.
        if mask == TE_SIGN_MASK {
            let mut c = xt.clone();
            rht_rows(&mut c, !mask);
            matmul_tn(&a, &c, n, k, m, &mut out);
            assert!(max_rel(&out, &reference, norm) > 0.1);
        }
    }
}

/// Largest element-wise difference relative to the Frobenius norm of the reference
/// divided by sqrt(#elements) (the RMS magnitude of its entries).
fn max_rel(out: &[f32], reference: &[f32], norm: f32) -> f32 {
    let rms = norm / (reference.len() as f32).sqrt();
    out.iter()
        .zip(reference)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
        / rms
}

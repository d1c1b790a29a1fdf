//! Per-tensor FP8 (current and delayed scaling), BF16 and F32: golden data from a numpy +
//! ml_dtypes transcription of Transformer Engine (tests/data/fp8_golden.bin), the delayed
//! scaling examples of docs/numerics.md#delayed-scaling, and layout / rounding / thread-count properties.

mod common;
use common::*;

use fp_formats::{bf16_from_f32, ElementFormat, Overflow, Rounding, E4M3, E5M2};
use quant::fp8::{self, compute_scale_from_amax};
use quant::philox::random_byte;
use quant::{
    AmaxAlgo, Fp8Element, Fp8Scaling, OperandQuant, QuantError, QuantFormat, QuantState, RngKey,
    RoundingMode, Usage,
};

fn current(element: Fp8Element, power_of_two: bool) -> OperandQuant {
    OperandQuant {
        format: QuantFormat::Fp8 {
            element,
            scaling: Fp8Scaling::Current { power_of_two },
        },
        ..OperandQuant::F32
    }
}

fn delayed(element: Fp8Element, history_len: usize, margin: i32, algo: AmaxAlgo) -> OperandQuant {
    OperandQuant {
        format: QuantFormat::Fp8 {
            element,
            scaling: Fp8Scaling::Delayed {
                history_len,
                margin,
                algo,
            },
        },
        ..OperandQuant::F32
    }
}

#[test]
fn current_scaling_matches_numpy_transcription() {
    let b = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/fp8_golden.bin"
    ))
    .unwrap();
    assert_eq!(&b[..8], b"NBF8GLD1");
    let rd = |p: usize| u32::from_le_bytes(b[p..p + 4].try_into().unwrap());
    let (nt, n) = (rd(8) as usize, rd(12) as usize);
    let mut p = 16;
    let tensors: Vec<Vec<f32>> = (0..nt)
        .map(|_| {
            let t = b[p..p + 4 * n]
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            p += 4 * n;
            t
        })
        .collect();
    let n_cases = rd(p);
    p += 4;
    assert_eq!(n_cases, 28);
    for _ in 0..n_cases {
        let (ti, el, pow2) = (b[p] as usize, b[p + 1], b[p + 2] == 1);
        let (amax, scale) = (f32::from_bits(rd(p + 4)), f32::from_bits(rd(p + 8)));
        let codes = &b[p + 12..p + 12 + n];
        p += 12 + n;
        let element = if el == 0 {
            Fp8Element::E4M3
        } else {
            Fp8Element::E5M2
        };
        let q = current(element, pow2);
        assert_eq!(
            compute_scale_from_amax(amax, fp8::fp8_max(element), pow2).to_bits(),
            scale.to_bits()
        );
        let mut st = QuantState::new();
        let t = quantize_with(
            &tensors[ti],
            32,
            n / 32,
            Usage::Rowwise,
            &q,
            RngKey::default(),
            &mut st,
        )
        .unwrap();
        assert_eq!(t.amax.to_bits(), amax.to_bits(), "tensor {ti}");
        assert_eq!(
            st.last_scale().to_bits(),
            scale.to_bits(),
            "tensor {ti} {element:?} pow2 {pow2}"
        );
        assert_eq!(t.tensor_scale_inv.to_bits(), (1.0 / scale).to_bits());
        assert_eq!(t.codes, codes, "tensor {ti} {element:?} pow2 {pow2}");
    }
    assert_eq!(p, b.len());
}

#[test]
fn compute_scale_edge_cases() {
    assert_eq!(compute_scale_from_amax(0.0, 448.0, false), 1.0);
    assert_eq!(compute_scale_from_amax(f32::INFINITY, 448.0, true), 1.0);
    assert_eq!(compute_scale_from_amax(f32::NAN, 57344.0, false), 1.0);
    assert_eq!(compute_scale_from_amax(1e-40, 448.0, false), f32::MAX);
    assert_eq!(
        compute_scale_from_amax(1e-40, 448.0, true),
        2.0f32.powi(127)
    );
    assert_eq!(compute_scale_from_amax(448.0, 448.0, false), 1.0);
    assert_eq!(compute_scale_from_amax(7.0, 57344.0, false), 8192.0);
    // 448 / 3 = 149.333 -> 128 with pow2 (mantissa cleared, never rounded up).
    assert_eq!(compute_scale_from_amax(3.0, 448.0, true), 128.0);
    assert_eq!(
        compute_scale_from_amax(3.0, 448.0, false).to_bits(),
        (448.0f32 / 3.0).to_bits()
    );
}

/// docs/numerics.md#delayed-scaling: history [.., 3.5, 7.0, 1.0], E4M3, margin 0, max -> 64; margin 1 -> 32;
/// most recent -> 448; E5M2 -> 57344 / 7.
#[test]
fn delayed_scaling_spec_checks() {
    for (element, margin, algo, want) in [
        (Fp8Element::E4M3, 0, AmaxAlgo::Max, 64.0),
        (Fp8Element::E4M3, 1, AmaxAlgo::Max, 32.0),
        (Fp8Element::E4M3, 0, AmaxAlgo::MostRecent, 448.0),
        (Fp8Element::E5M2, 0, AmaxAlgo::Max, 57344.0 / 7.0),
    ] {
        let q = delayed(element, 1024, margin, algo);
        let mut st = QuantState::new();
        for amax in [3.5f32, 7.0, 1.0] {
            let x = [amax, -0.5 * amax];
            quantize_with(&x, 1, 2, Usage::Rowwise, &q, RngKey::default(), &mut st).unwrap();
            st.end_step(&q).unwrap();
        }
        assert_eq!(st.scale(), want, "{element:?} margin {margin} {algo:?}");
        assert_eq!(st.scale_inv(), 1.0 / want);
        assert_eq!(st.amax_history().len(), 1024);
        assert_eq!(&st.amax_history()[1021..], &[3.5, 7.0, 1.0]);
        assert_eq!(st.amax_history()[0], 0.0);
    }
}

#[test]
fn delayed_scaling_keeps_scale_on_zero_nan_inf_amax() {
    let q = delayed(Fp8Element::E4M3, 1, 0, AmaxAlgo::MostRecent);
    let mut st = QuantState::new();
    quantize_with(
        &[2.0, 1.0],
        1,
        2,
        Usage::Rowwise,
        &q,
        RngKey::default(),
        &mut st,
    )
    .unwrap();
    st.end_step(&q).unwrap();
    assert_eq!(st.scale(), 224.0);
    // Zero amax.
    quantize_with(
        &[0.0, 0.0],
        1,
        2,
        Usage::Rowwise,
        &q,
        RngKey::default(),
        &mut st,
    )
    .unwrap();
    st.end_step(&q).unwrap();
    assert_eq!(st.scale(), 224.0);
    // NaN amax (recorded directly; the tensor amax itself ignores NaN elements like fmaxf).
    st.record_amax(f32::NAN);
    st.end_step(&q).unwrap();
    assert_eq!(st.scale(), 224.0);
    // Inf amax from an infinite element.
    quantize_with(
        &[f32::INFINITY, 1.0],
        1,
        2,
        Usage::Rowwise,
        &q,
        RngKey::default(),
        &mut st,
    )
    .unwrap();
    st.end_step(&q).unwrap();
    assert_eq!(st.scale(), 224.0);
    // Tiny amax: the scale overflows to FLT_MAX.
    st.record_amax(1e-44);
    st.end_step(&q).unwrap();
    assert_eq!(st.scale(), f32::MAX);
    // Initial scale 1 on a fresh state whatever the amax.
    let mut fresh = QuantState::new();
    let t = quantize_with(
        &[1000.0, 1.0],
        1,
        2,
        Usage::Rowwise,
        &q,
        RngKey::default(),
        &mut fresh,
    )
    .unwrap();
    assert_eq!(t.tensor_scale_inv, 1.0);
    assert_eq!(t.codes, vec![0x7E, 0x38]); // 1000 saturates to 448 under scale 1
}

/// TE order: the cast uses the scale from the previous step's update; an amax stays in the
/// window for exactly `history_len` updates.
#[test]
fn delayed_scaling_order_and_window() {
    let q = delayed(Fp8Element::E4M3, 2, 0, AmaxAlgo::Max);
    let mut st = QuantState::new();
    let key = RngKey::default();
    let mut scales_used = vec![];
    let mut scales_after = vec![];
    for amax in [8.0f32, 1.0, 1.0, 16.0] {
        let t = quantize_with(&[amax, 0.25], 1, 2, Usage::Rowwise, &q, key, &mut st).unwrap();
        scales_used.push(t.tensor_scale_inv);
        st.end_step(&q).unwrap();
        scales_after.push(st.scale());
    }
    assert_eq!(scales_used, vec![1.0, 1.0 / 56.0, 1.0 / 56.0, 1.0 / 448.0]);
    assert_eq!(scales_after, vec![56.0, 56.0, 448.0, 28.0]);
    // Step 4 cast 16 with scale 448: clipped (counted by the stats).
    let mut st2 = QuantState::with_history_len(2);
    st2.set_scale(448.0);
    let e = operand_error(&[16.0, 0.25], 1, 2, Usage::Rowwise, &q, key, &mut st2).unwrap();
    assert_eq!(e.clipped_fraction, 0.5);
    // A history length change is a configuration error.
    let q3 = delayed(Fp8Element::E4M3, 3, 0, AmaxAlgo::Max);
    assert!(matches!(
        quantize_with(&[1.0], 1, 1, Usage::Rowwise, &q3, key, &mut st),
        Err(QuantError::InvalidConfig(_))
    ));
}

#[test]
fn columnwise_is_transpose_and_layout() {
    let x: Vec<f32> = (0..15 * 7)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.173)
        .collect();
    for el in [Fp8Element::E4M3, Fp8Element::E5M2] {
        let q = current(el, false);
        let key = RngKey::default();
        let r = quantize_with(&x, 15, 7, Usage::Rowwise, &q, key, &mut QuantState::new()).unwrap();
        let c = quantize_with(
            &x,
            15,
            7,
            Usage::Columnwise,
            &q,
            key,
            &mut QuantState::new(),
        )
        .unwrap();
        assert_eq!((c.rows, c.cols), (7, 15));
        for i in 0..15 {
            for j in 0..7 {
                assert_eq!(r.codes[i * 7 + j], c.codes[j * 15 + i]);
            }
        }
        let scale = 1.0 / r.tensor_scale_inv;
        let want: Vec<u8> = x
            .iter()
            .map(|&v| match el {
                Fp8Element::E4M3 => E4M3::from_f32_rne_sat(v * scale).0,
                Fp8Element::E5M2 => E5M2::from_f32_rne_sat(v * scale).0,
            })
            .collect();
        assert_eq!(r.codes, want);
    }
}

#[test]
fn stochastic_rounding_uses_philox_bits_at_the_stored_index() {
    let x: Vec<f32> = (0..40 * 24)
        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 0.01)
        .collect();
    let key = RngKey {
        seed: 3,
        stream: 11,
    };
    for usage in [Usage::Rowwise, Usage::Columnwise] {
        for el in [Fp8Element::E4M3, Fp8Element::E5M2] {
            let q = current(el, false).with_rounding(RoundingMode::Stochastic);
            let t = quantize_with(&x, 40, 24, usage, &q, key, &mut QuantState::new()).unwrap();
            let scale = 1.0 / t.tensor_scale_inv;
            for r in 0..t.rows {
                for c in 0..t.cols {
                    let v = if usage == Usage::Rowwise {
                        x[r * 24 + c]
                    } else {
                        x[c * 24 + r]
                    };
                    let rb = random_byte(key, (r * t.cols + c) as u64);
                    let round = Rounding::Stochastic(rb);
                    let want = match el {
                        Fp8Element::E4M3 => E4M3::from_f32(v * scale, round, Overflow::Saturate).0,
                        Fp8Element::E5M2 => E5M2::from_f32(v * scale, round, Overflow::Saturate).0,
                    };
                    assert_eq!(t.codes[r * t.cols + c], want);
                }
            }
        }
    }
}

#[test]
fn identical_for_any_thread_count() {
    let (rows, cols) = (700, 300);
    let x: Vec<f32> = (0..rows * cols)
        .map(|i| ((i as f32) * 0.618).sin() * 3.0)
        .collect();
    let key = RngKey { seed: 9, stream: 1 };
    let qs = [
        current(Fp8Element::E4M3, false),
        current(Fp8Element::E5M2, true).with_rounding(RoundingMode::Stochastic),
        OperandQuant::BF16.with_rounding(RoundingMode::Stochastic),
        OperandQuant::F32,
    ];
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let mut v = vec![];
            for q in &qs {
                for usage in [Usage::Rowwise, Usage::Columnwise] {
                    v.push(
                        quantize_with(&x, rows, cols, usage, q, key, &mut QuantState::new())
                            .unwrap(),
                    );
                }
            }
            v
        })
    };
    assert_eq!(run(1), run(3));
}

#[test]
fn non_finite_inputs() {
    let q = current(Fp8Element::E4M3, false);
    let x = [1.0f32, f32::NAN, -2.0, 0.5];
    let t = quantize_with(
        &x,
        2,
        2,
        Usage::Rowwise,
        &q,
        RngKey::default(),
        &mut QuantState::new(),
    )
    .unwrap();
    assert_eq!(t.amax, 2.0); // NaN ignored (fmaxf)
    assert_eq!(t.codes[1] & 0x7F, 0x7F); // NaN code
    let x = [1.0f32, f32::NEG_INFINITY];
    let t = quantize_with(
        &x,
        1,
        2,
        Usage::Rowwise,
        &q,
        RngKey::default(),
        &mut QuantState::new(),
    )
    .unwrap();
    assert_eq!(t.tensor_scale_inv, 1.0); // Inf amax -> scale 1
    assert_eq!(t.codes, vec![0x38, 0xFE]); // -Inf saturates to -448
}

#[test]
fn bf16_rounding() {
    let x: Vec<f32> = (0..64 * 8)
        .map(|i| 1.0 + (i as f32) * 1.37e-3 - 0.3)
        .collect();
    let key = RngKey { seed: 1, stream: 2 };
    let t = quantize(&x, 64, 8, Usage::Rowwise, &OperandQuant::BF16, key).unwrap();
    let d = t.dequantize();
    for (v, y) in x.iter().zip(&d) {
        assert_eq!(
            *y,
            bf16_from_f32(*v, Rounding::NearestEven, Overflow::Propagate).to_f32()
        );
    }
    let q = OperandQuant::BF16.with_rounding(RoundingMode::Stochastic);
    let t = quantize(&x, 64, 8, Usage::Columnwise, &q, key).unwrap();
    let d = t.dequantize();
    for r in 0..8 {
        for c in 0..64 {
            let v = x[c * 8 + r];
            let rb = random_byte(key, (r * 64 + c) as u64);
            let want = bf16_from_f32(v, Rounding::Stochastic(rb), Overflow::Propagate).to_f32();
            assert_eq!(d[r * 64 + c], want);
        }
    }
    // Overflow to Inf counts as clipped.
    let e = operand_error(
        &[3.4e38, 1.0],
        1,
        2,
        Usage::Rowwise,
        &OperandQuant::BF16,
        key,
        &mut QuantState::new(),
    )
    .unwrap();
    assert_eq!(e.clipped_fraction, 0.5);
    // F32 is exact and rejects SR.
    let y = fake_quantize_with(
        &x,
        64,
        8,
        Usage::Rowwise,
        &OperandQuant::F32,
        key,
        &mut QuantState::new(),
    )
    .unwrap();
    assert_eq!(y, x);
    assert!(validate(
        &OperandQuant::F32.with_rounding(RoundingMode::Stochastic),
        Usage::Rowwise
    )
    .is_err());
}

//! `train_quant::QuantOps::fake_quantize` (the device linear layer's operand former) on the
//! emulator: for NVFP4 (1x16 / 16x16, RNE / SR, RHT), MXFP8 / MXFP4 and per-tensor FP8
//! (current and delayed scaling), the values and the factor equal quant's
//! `Quantizer::fake_quantize_into` bit for bit, and FP8's `QuantState` ends equal to quant's.
//! Without a C++20 compiler the tests print `SKIP` and return.
#![cfg(feature = "emu")]

mod common;

use common::{
    fp8_current_cases, fp8_delayed, mx_cases, nvfp4_cases, nvfp4_rht_cases, shared_emu as emu,
    sweep, KEY,
};
use fp_formats::mx::{MxElement, ScaleRule};
use kernels_cuda::emu::Emu;
use kernels_cuda::train::Launcher;
use kernels_cuda::train_quant::QuantOps;
use kernels_cuda::KernelError;
use quant::{AmaxAlgo, Fp8Element, MatRef, OperandQuant, QuantState, Quantizer, Usage};

/// Fake-quantizes `x` on the emulator and with quant (each from `state`), asserts the same
/// bits, factor and final state, and returns the final state.
#[allow(clippy::too_many_arguments)]
fn check(
    e: &Emu,
    x: &[f32],
    (rows, cols): (usize, usize),
    usage: Usage,
    q: &OperandQuant,
    state: &QuantState,
    what: &str,
) -> QuantState {
    let qz = Quantizer::new(*q, usage).expect("valid").with_key(KEY);
    let xb = e.upload(x).unwrap();
    let mut out = e.zeros::<f32>(x.len()).unwrap();
    let mut st = state.clone();
    let f = e
        .fake_quantize(&qz, &xb, (rows, cols), &mut st, &mut out)
        .unwrap_or_else(|err| panic!("{what}: {err}"));
    let mut want = vec![0.0f32; x.len()];
    let mut cst = state.clone();
    let fw = qz
        .fake_quantize_into(MatRef::new(x, rows, cols).unwrap(), &mut cst, &mut want)
        .expect("cpu");
    assert_eq!(f.to_bits(), fw.to_bits(), "{what}: factor");
    let got = out.to_vec();
    if let Some(i) = got
        .iter()
        .zip(&want)
        .position(|(a, b)| a.to_bits() != b.to_bits())
    {
        panic!("{what}: element {i}: {} vs quant's {}", got[i], want[i]);
    }
    assert_eq!(st, cst, "{what}: QuantState");
    st
}

#[test]
fn fake_quantize_matches_quant_for_every_format() {
    let Some(e) = emu("fake_quantize_matches_quant_for_every_format") else {
        return;
    };
    let mut cases = nvfp4_cases();
    cases.extend(mx_cases(
        &[MxElement::E4M3, MxElement::E5M2, MxElement::E2M1],
        &[ScaleRule::Rceil],
    ));
    cases.extend(fp8_current_cases());
    let usages = [Usage::Rowwise, Usage::Columnwise];
    // padding in both dimensions, and a multi-tile shape
    sweep(
        &[(48, 40), (70, 96)],
        900,
        &cases,
        &usages,
        |x, r, c, u, q, w| {
            check(e, x, (r, c), u, q, &QuantState::new(), w);
        },
    );
    // the Hadamard transform is columnwise only (rows % 16 == 0)
    sweep(
        &[(32, 24)],
        910,
        &nvfp4_rht_cases(),
        &[Usage::Columnwise],
        |x, r, c, u, q, w| {
            check(e, x, (r, c), u, q, &QuantState::new(), w);
        },
    );
}

#[test]
fn fake_quantize_fp8_delayed_scaling_keeps_quants_state() {
    let Some(e) = emu("fake_quantize_fp8_delayed_scaling_keeps_quants_state") else {
        return;
    };
    let q = fp8_delayed(Fp8Element::E4M3, 3, 0, AmaxAlgo::Max);
    let mut st = QuantState::new();
    for step in 0..3u64 {
        let x = common::data(20, 36, 70 + step);
        let x: Vec<f32> = x.iter().map(|v| v * (1 + step) as f32).collect();
        st = check(
            e,
            &x,
            (20, 36),
            Usage::Rowwise,
            &q,
            &st,
            &format!("delayed step {step}"),
        );
        st.end_step(&q).unwrap();
    }
    assert_ne!(st.scale(), 1.0, "the history moved the scale");
}

#[test]
fn fake_quantize_bad_input_is_a_typed_error() {
    let Some(e) = emu("fake_quantize_bad_input_is_a_typed_error") else {
        return;
    };
    let q = Quantizer::new(OperandQuant::nvfp4(), Usage::Rowwise).unwrap();
    let x = e.upload(&[1.0f32; 32]).unwrap();
    let mut out = e.zeros::<f32>(32).unwrap();
    let mut st = QuantState::new();
    let r = e.fake_quantize(&q, &x, (2, 15), &mut st, &mut out);
    assert!(matches!(r, Err(KernelError::InvalidArgument(_))), "{r:?}");
    let mut nan = vec![1.0f32; 32];
    nan[5] = f32::NAN;
    let x = e.upload(&nan).unwrap();
    let r = e.fake_quantize(&q, &x, (2, 16), &mut st, &mut out);
    assert!(matches!(r, Err(KernelError::NonFinite(_))), "{r:?}");
    let bf16 = Quantizer::new(OperandQuant::BF16, Usage::Rowwise).unwrap();
    let r = e.fake_quantize(&bf16, &x, (2, 16), &mut st, &mut out);
    assert!(matches!(r, Err(KernelError::Unsupported(_))), "{r:?}");
}

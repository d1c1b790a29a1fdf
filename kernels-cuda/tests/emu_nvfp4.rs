//! `quant::QuantizerBackend` for `kernels_cuda::emu::Emu` (feature `emu`): the NVFP4
//! quantizer kernels behind the training emulator's launcher, as autograd's emulated NVFP4
//! training step uses them, equal to `quant` byte for byte (codes, scales, amax, factor) and
//! their dequantization to `QuantizedTensor::dequantize` bit for bit; bad input is a typed
//! error. Without a C++20 compiler the tests print `SKIP` and return.
#![cfg(feature = "emu")]

mod common;

use common::{assert_same, nvfp4_cases, nvfp4_rht_cases, shared_emu as emu, sweep, KEY, USAGES};
use fp_formats::mx::{MxElement, ScaleRule};
use kernels_cuda::emu::Emu;
use kernels_cuda::KernelError;
use quant::{
    Cpu, MatRef, OperandQuant, QuantError, QuantState, Quantizer, QuantizerBackend, Usage,
};

fn check(e: &Emu, x: &[f32], rows: usize, cols: usize, usage: Usage, q: &OperandQuant, what: &str) {
    let qz = Quantizer::new(*q, usage).expect("valid").with_key(KEY);
    let x = MatRef::new(x, rows, cols).expect("shape");
    let got = e
        .quantize(&qz, x, &mut QuantState::new())
        .unwrap_or_else(|err| panic!("{what}: {err}"));
    let cpu = Cpu.quantize(&qz, x, &mut QuantState::new()).expect("cpu");
    assert_same(&got, &cpu, what);
    let deq = e.dequantize(&got).expect("dequantize");
    let want = cpu.dequantize();
    assert_eq!(deq.len(), want.len(), "{what}");
    if let Some(i) = deq
        .iter()
        .zip(&want)
        .position(|(a, b)| a.to_bits() != b.to_bits())
    {
        panic!("{what}: dequantized element {i}: {} vs {}", deq[i], want[i]);
    }
}

#[test]
fn emu_quantize_nvfp4_matches_quant() {
    let Some(e) = emu("emu_quantize_nvfp4_matches_quant") else {
        return;
    };
    // multi-tile, padding in both dimensions, a single row
    sweep(
        &[(80, 48), (37, 20), (1, 16)],
        500,
        &nvfp4_cases(),
        &USAGES,
        |x, r, c, u, q, w| check(e, x, r, c, u, q, w),
    );
    // the Hadamard transform (columnwise, rows a multiple of 16)
    sweep(
        &[(48, 37), (16, 16)],
        600,
        &nvfp4_rht_cases(),
        &[Usage::Columnwise],
        |x, r, c, u, q, w| check(e, x, r, c, u, q, w),
    );
}

#[test]
fn emu_quantize_nvfp4_rejects_bad_input() {
    let Some(e) = emu("emu_quantize_nvfp4_rejects_bad_input") else {
        return;
    };
    let q = Quantizer::new(OperandQuant::nvfp4(), Usage::Rowwise)
        .expect("valid")
        .with_key(KEY);
    let x = vec![0.5f32; 32];
    let st = &mut QuantState::new();
    // a view whose length does not match its shape: quant's check
    assert!(matches!(
        e.quantize(&q, MatRef::row_major(&x, 3, 16), st),
        Err(KernelError::Quant(QuantError::Format(_)))
    ));
    // non-finite input, as quant rejects it
    let mut bad = x.clone();
    bad[7] = f32::NAN;
    assert!(matches!(
        e.quantize(&q, MatRef::new(&bad, 2, 16).expect("shape"), st),
        Err(KernelError::NonFinite(_))
    ));
    // the emulated quantizer runs NVFP4 only, and dequantizes NVFP4 tensors only
    let mx = Quantizer::new(
        OperandQuant::mx(MxElement::E4M3, ScaleRule::Rceil),
        Usage::Rowwise,
    )
    .expect("valid");
    let x32 = MatRef::new(&x, 1, 32).expect("shape");
    assert!(matches!(
        e.quantize(&mx, x32, st),
        Err(KernelError::Unsupported(_))
    ));
    let t = Cpu.quantize(&mx, x32, st).expect("cpu");
    assert!(matches!(e.dequantize(&t), Err(KernelError::Unsupported(_))));
    // nor a truncated one
    let mut t = e
        .quantize(&q, MatRef::new(&x, 2, 16).expect("shape"), st)
        .expect("quantize");
    t.codes.pop();
    assert!(matches!(e.dequantize(&t), Err(KernelError::Unsupported(_))));
}

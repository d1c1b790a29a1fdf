//! `kernels_cuda::emu::Emu::quantize_nvfp4` / `dequantize_nvfp4` (feature `emu`): the NVFP4
//! quantizer kernels behind the training emulator's launcher, as autograd's emulated NVFP4
//! training step uses them, equal to `quant` byte for byte (codes, scales, amax, factor) and
//! their dequantization to `QuantizedTensor::dequantize` bit for bit; bad input is a typed
//! error. Without a C++20 compiler the tests print `SKIP` and return.
#![cfg(feature = "emu")]

mod common;

use common::{assert_same, nvfp4_cases, nvfp4_rht_cases, sweep, KEY, USAGES};
use fp_formats::mx::{MxElement, ScaleRule};
use kernels_cuda::emu::{Emu, EmuError};
use kernels_cuda::KernelError;
use quant::{OperandQuant, QuantState, Usage};

fn emu(test: &str) -> Option<&'static Emu> {
    match Emu::shared() {
        Ok(e) => Some(e),
        Err(e @ (EmuError::NoCompiler(_) | EmuError::NoCxx20(..))) => {
            eprintln!("SKIP {test}: {e}");
            None
        }
        Err(e) => panic!("{test}: {e}"),
    }
}

fn check(e: &Emu, x: &[f32], rows: usize, cols: usize, usage: Usage, q: &OperandQuant, what: &str) {
    let got = e
        .quantize_nvfp4(x, rows, cols, usage, q, KEY)
        .unwrap_or_else(|err| panic!("{what}: {err}"));
    let cpu =
        quant::fake::quantize(x, rows, cols, usage, q, KEY, &mut QuantState::new()).expect("cpu");
    assert_same(&got, &cpu, what);
    let deq = e.dequantize_nvfp4(&got).expect("dequantize");
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
    let q = OperandQuant::nvfp4();
    let x = vec![0.5f32; 32];
    // a length that does not match the shape
    assert!(matches!(
        e.quantize_nvfp4(&x, 3, 16, Usage::Rowwise, &q, KEY),
        Err(KernelError::Unsupported(_))
    ));
    // non-finite input, as quant rejects it
    let mut bad = x.clone();
    bad[7] = f32::NAN;
    assert!(matches!(
        e.quantize_nvfp4(&bad, 2, 16, Usage::Rowwise, &q, KEY),
        Err(KernelError::NonFinite(_))
    ));
    // dequantize_nvfp4 takes NVFP4 tensors only
    let mx = OperandQuant::mx(MxElement::E4M3, ScaleRule::Rceil);
    let t = quant::fake::quantize(&x, 1, 32, Usage::Rowwise, &mx, KEY, &mut QuantState::new())
        .expect("cpu");
    assert!(matches!(
        e.dequantize_nvfp4(&t),
        Err(KernelError::Unsupported(_))
    ));
    // nor a truncated one
    let mut t = e
        .quantize_nvfp4(&x, 2, 16, Usage::Rowwise, &q, KEY)
        .expect("quantize");
    t.codes.pop();
    assert!(matches!(
        e.dequantize_nvfp4(&t),
        Err(KernelError::Unsupported(_))
    ));
}

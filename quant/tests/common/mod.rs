//! Short forms of the quantizer interface for the tests: one call from a slice, its shape,
//! a usage, settings and a key, through `Quantizer` and `MatRef` (each test crate uses a
//! subset).
#![allow(dead_code)]

use quant::qgemm::Operand;
use quant::{
    MatRef, OperandQuant, QuantError, QuantState, QuantizedTensor, Quantizer, RngKey, Usage,
};

/// The quantizer for `q` and `usage` drawing from `key`.
pub fn quantizer(q: &OperandQuant, usage: Usage, key: RngKey) -> Result<Quantizer, QuantError> {
    Ok(Quantizer::new(*q, usage)?.with_key(key))
}

/// Whether `q` is valid for `usage`.
pub fn validate(q: &OperandQuant, usage: Usage) -> Result<(), QuantError> {
    Quantizer::new(*q, usage).map(|_| ())
}

/// `Quantizer::quantize` of the `[rows, cols]` `x` with a fresh state.
pub fn quantize(
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    q: &OperandQuant,
    key: RngKey,
) -> Result<QuantizedTensor, QuantError> {
    quantize_with(x, rows, cols, usage, q, key, &mut QuantState::new())
}

/// `Quantizer::quantize` of the `[rows, cols]` `x` with `state`.
pub fn quantize_with(
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    q: &OperandQuant,
    key: RngKey,
    state: &mut QuantState,
) -> Result<QuantizedTensor, QuantError> {
    quantizer(q, usage, key)?.quantize(MatRef::new(x, rows, cols)?, state)
}

/// `Quantizer::fake_quantize_into` of the `[rows, cols]` `x` with a fresh state.
pub fn fake_quantize_into(
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    q: &OperandQuant,
    key: RngKey,
    out: &mut [f32],
) -> Result<f32, QuantError> {
    quantizer(q, usage, key)?.fake_quantize_into(
        MatRef::new(x, rows, cols)?,
        &mut QuantState::new(),
        out,
    )
}

/// `Quantizer::fake_quantize` of the `[rows, cols]` `x` with `state`.
pub fn fake_quantize_with(
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    q: &OperandQuant,
    key: RngKey,
    state: &mut QuantState,
) -> Result<Vec<f32>, QuantError> {
    quantizer(q, usage, key)?.fake_quantize(MatRef::new(x, rows, cols)?, state)
}

/// A GEMM operand over the `[rows, cols]` `x` (the view unchecked, so that the GEMM's own
/// shape errors are exercised); panics on invalid settings.
pub fn op<'a>(
    x: &'a [f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    q: &OperandQuant,
) -> Operand<'a> {
    Operand::new(
        MatRef::row_major(x, rows, cols),
        Quantizer::new(*q, usage).expect("valid settings"),
    )
}

/// [`op`] drawing from `key`.
pub fn op_key<'a>(
    x: &'a [f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    q: &OperandQuant,
    key: RngKey,
) -> Operand<'a> {
    let mut o = op(x, rows, cols, usage, q);
    o.quantizer = o.quantizer.with_key(key);
    o
}

/// `stats::operand_error` of the `[rows, cols]` `x`.
pub fn operand_error(
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    q: &OperandQuant,
    key: RngKey,
    state: &mut QuantState,
) -> Result<fp_formats::stats::ErrorStats, QuantError> {
    quant::stats::operand_error(
        &quantizer(q, usage, key)?,
        MatRef::new(x, rows, cols)?,
        state,
    )
}

/// The product of two fake-quantized operands' values (`[M, K]`, `[N, K]`, no α) on the
/// GEMM `quant::qgemm` runs for them on this machine: the E2M1 block GEMM when both hold E2M1
/// values and it runs here, else the BF16 GEMM.
pub fn quantized_values_product(
    (fa, fb): (MatRef<'_>, MatRef<'_>),
    (qa, qb): (&OperandQuant, &OperandQuant),
    out: &mut [f32],
) {
    use quant::qgemm::{e2m1_values, quantized_matmul_tn_fake, FakeOperand};
    let fake = |values, q| FakeOperand {
        values,
        factor: 1.0,
        quantized: true,
        e2m1: e2m1_values(q),
    };
    quantized_matmul_tn_fake(fake(fa, qa), fake(fb, qb), out).unwrap();
}

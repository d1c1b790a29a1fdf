//! # quant
//!
//! The CPU reference of every training quantizer in Nibble, bit-exact with Transformer
//! Engine's arithmetic, and fast enough to run on every GEMM operand of every CPU training
//! step: NVFP4 (1x16 and 16x16 blocks, random Hadamard transform, stochastic rounding, Four
//! Over Six), MX (MXFP8 / MXFP6 / MXFP4 with every scale rule, Tseng et al.'s unbiased
//! stochastic MXFP4), per-tensor FP8 (current and delayed scaling), fake quantization, an
//! emulated quantized GEMM and error statistics.
//!
//! Every quantizer is reached through one interface: a checked [`MatRef`] input and a
//! validated [`Quantizer`] (see its module docs); [`QuantizerBackend`] is the same interface
//! over other storage (the GPU's in `kernels-cuda`).
#![warn(missing_docs)]

pub mod config;
mod describe;
mod dispatch;
mod error;
pub mod gemm;
pub mod matrix;
pub mod tensor;

pub mod bf16;
pub mod fp8;
mod grid;
pub mod mx;
mod panel;
pub mod qgemm;
mod quantizer;
pub mod stats;

pub mod hadamard;
pub mod nvfp4;
pub mod philox;
pub mod presets;

pub use config::{
    AmaxAlgo, BlockError, BlockShape, FourOverSix, Fp8Element, Fp8Scaling, GemmOperands,
    GemmPolicy, OperandQuant, QuantFormat, Rht, RoundingMode, Usage,
};
pub use error::QuantError;
pub use fp8::QuantState;
pub use matrix::{MatRef, MAX_DIM};
pub use quantizer::{Cpu, Quantizer, QuantizerBackend};
pub use tensor::QuantizedTensor;

/// Identifies the random stream of a stochastically rounded (or randomly signed) operand:
/// the same key and element index always give the same random bits, on any number of
/// threads and on the GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RngKey {
    /// Run-level seed.
    pub seed: u64,
    /// Stream id: distinct per tensor, layer, GEMM role and step.
    pub stream: u64,
}

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

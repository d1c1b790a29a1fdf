//! # fp-formats
//!
//! Bit-exact low-precision floating-point formats for machine learning: FP4 (E2M1),
//! FP6 (E2M3, E3M2), FP8 (E4M3, E5M2), the NVFP4 block scale UE4M3 and the MX scale E8M0,
//! with explicit rounding modes (nearest-even, toward zero / +inf / -inf, stochastic from
//! caller-supplied bits) and overflow policies (saturate or propagate), nibble and FP6
//! packing, and the NVFP4 and MX block formats used for offline quantization.
//!
//! The crate is `no_std` + `alloc`; the default `std` feature only adds
//! `std::error::Error` for the error type.
//!
//! ```
//! use fp_formats::{E2M1, ElementFormat, Overflow, Rounding};
//! assert_eq!(E2M1::from_f32(2.5, Rounding::NearestEven, Overflow::Saturate).to_f32(), 2.0);
//! assert_eq!(E2M1::from_f32(2.5, Rounding::TowardPositive, Overflow::Saturate).to_f32(), 3.0);
//! assert_eq!(E2M1::from_f32(100.0, Rounding::NearestEven, Overflow::Saturate).to_f32(), 6.0);
//! ```
#![cfg_attr(not(feature = "std"), no_std)]
#![warn(missing_docs)]

extern crate alloc;

mod formats;
mod kernels;
mod minifloat;
mod rounding;

pub use formats::{
    bf16_from_f32, f16_from_f32, round_to_bf16, ElementFormat, E2M1, E2M3, E3M2, E4M3, E5M2, E8M0,
    UE4M3,
};
pub use half::{bf16, f16};
pub use rounding::{Overflow, Rounding};

#[cfg(feature = "checkpoint")]
pub mod checkpoint;
#[cfg(feature = "std")]
pub mod cpu;
mod error;
pub mod mx;
pub mod nvfp4;
pub mod pack;
#[cfg(feature = "std")]
pub mod stats;

pub use error::FormatError;

/// What a block quantizer does with a row length that is not a multiple of the block size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Padding {
    /// Reject the shape with [`FormatError::NotDivisible`].
    #[default]
    Error,
    /// Zero-pad each row to the next multiple of the block size (the padded columns are
    /// stored and dequantize to zero; they are dropped by `dequantize`).
    Zero,
}

/// Checks `data.len() == rows * cols` and the row length against the block size; returns
/// the padded row length.
pub(crate) fn check_shape(
    data: &[f32],
    rows: usize,
    cols: usize,
    block: usize,
    padding: Padding,
) -> Result<usize, FormatError> {
    let expected = rows.checked_mul(cols).ok_or(FormatError::ShapeMismatch {
        rows,
        cols,
        expected: usize::MAX,
        got: data.len(),
    })?;
    if data.len() != expected {
        return Err(FormatError::ShapeMismatch {
            rows,
            cols,
            expected,
            got: data.len(),
        });
    }
    if cols % block != 0 && padding == Padding::Error {
        return Err(FormatError::NotDivisible { cols, block });
    }
    Ok(cols.div_ceil(block) * block)
}

/// The absolute maximum of `data`, or an error naming the first non-finite element.
///
/// One vectorised pass: lanes keep a running max and a flag for non-finite values.
pub fn finite_amax(data: &[f32]) -> Result<f32, FormatError> {
    let (amax, finite) = kernels::amax_finite(data);
    if finite {
        return Ok(amax);
    }
    let index = data.iter().position(|v| !v.is_finite()).unwrap_or(0);
    Err(FormatError::NonFinite {
        index,
        value: data[index],
    })
}

//! Packing of sub-byte codes.
//!
//! * FP4: two codes per byte, element `2i` in the **low** nibble and `2i + 1` in the high
//!   nibble (the layout of Transformer Engine, torchao and ONNX; `__nv_fp4x2_e2m1`).
//!   An odd count leaves the last high nibble zero.
//! * FP6: four codes per three bytes, little-endian: the 24-bit word
//!   `c0 | c1 << 6 | c2 << 12 | c3 << 18` is stored low byte first (ONNX's layout).
//!   A trailing partial group is zero-filled.

use alloc::vec::Vec;

use crate::error::FormatError;

/// Bytes needed to pack `n` FP4 codes.
#[inline]
pub const fn fp4_packed_len(n: usize) -> usize {
    n.div_ceil(2)
}

/// Bytes needed to pack `n` FP6 codes.
#[inline]
pub const fn fp6_packed_len(n: usize) -> usize {
    (n * 6).div_ceil(8)
}

/// Packs 4-bit codes (low nibble of each input byte) two per byte.
///
/// ```
/// use fp_formats::pack::{pack_fp4, unpack_fp4};
/// let packed = pack_fp4(&[0x2, 0xF, 0x1]);
/// assert_eq!(packed, vec![0xF2, 0x01]);
/// assert_eq!(unpack_fp4(&packed, 3).unwrap(), vec![0x2, 0xF, 0x1]);
/// ```
pub fn pack_fp4(codes: &[u8]) -> Vec<u8> {
    let mut out = alloc::vec![0u8; fp4_packed_len(codes.len())];
    pack_fp4_into(codes, &mut out);
    out
}

/// Packs into a caller-provided buffer of exactly [`fp4_packed_len`] bytes.
///
/// # Panics
/// If `out.len() != fp4_packed_len(codes.len())`.
#[inline]
pub fn pack_fp4_into(codes: &[u8], out: &mut [u8]) {
    assert_eq!(out.len(), fp4_packed_len(codes.len()), "fp4 output length");
    let pairs = codes.chunks_exact(2);
    let rest = pairs.remainder();
    for (o, p) in out.iter_mut().zip(pairs) {
        *o = (p[0] & 0xF) | (p[1] << 4);
    }
    if let [last] = rest {
        out[codes.len() / 2] = last & 0xF;
    }
}

/// Unpacks `n` 4-bit codes.
pub fn unpack_fp4(packed: &[u8], n: usize) -> Result<Vec<u8>, FormatError> {
    if packed.len() != fp4_packed_len(n) {
        return Err(FormatError::BadBufferLength { expected: fp4_packed_len(n), got: packed.len() });
    }
    let mut out = Vec::with_capacity(n);
    for &b in packed {
        out.push(b & 0xF);
        out.push(b >> 4);
    }
    out.truncate(n);
    Ok(out)
}

/// Packs 6-bit codes (low 6 bits of each input byte) four per three bytes.
///
/// ```
/// use fp_formats::pack::{pack_fp6, unpack_fp6};
/// let codes = [0x3F, 0x01, 0x20, 0x15, 0x07];
/// let packed = pack_fp6(&codes);
/// assert_eq!(packed.len(), 4);
/// assert_eq!(unpack_fp6(&packed, 5).unwrap(), codes.to_vec());
/// ```
pub fn pack_fp6(codes: &[u8]) -> Vec<u8> {
    let mut out = alloc::vec![0u8; fp6_packed_len(codes.len())];
    for (g, chunk) in codes.chunks(4).enumerate() {
        let mut word = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            word |= ((c & 0x3F) as u32) << (6 * i);
        }
        let nbytes = (chunk.len() * 6).div_ceil(8);
        for b in 0..nbytes {
            out[3 * g + b] = (word >> (8 * b)) as u8;
        }
    }
    out
}

/// Unpacks `n` 6-bit codes.
pub fn unpack_fp6(packed: &[u8], n: usize) -> Result<Vec<u8>, FormatError> {
    if packed.len() != fp6_packed_len(n) {
        return Err(FormatError::BadBufferLength { expected: fp6_packed_len(n), got: packed.len() });
    }
    let mut out = Vec::with_capacity(n);
    for g in 0..n.div_ceil(4) {
        let mut word = 0u32;
        for b in 0..3 {
            if let Some(&byte) = packed.get(3 * g + b) {
                word |= (byte as u32) << (8 * b);
            }
        }
        for i in 0..4 {
            if out.len() < n {
                out.push(((word >> (6 * i)) & 0x3F) as u8);
            }
        }
    }
    Ok(out)
}

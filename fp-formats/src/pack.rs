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
        return Err(FormatError::BadBufferLength {
            expected: fp4_packed_len(n),
            got: packed.len(),
        });
    }
    let mut out = alloc::vec![0u8; n];
    unpack_fp4_into(packed, &mut out);
    Ok(out)
}

/// Unpacks `out.len()` 4-bit codes into a caller-provided buffer.
///
/// # Panics
/// If `packed.len() != fp4_packed_len(out.len())`.
pub fn unpack_fp4_into(packed: &[u8], out: &mut [u8]) {
    assert_eq!(packed.len(), fp4_packed_len(out.len()), "fp4 packed length");
    let mut pairs = out.chunks_exact_mut(2);
    for (p, &b) in (&mut pairs).zip(packed) {
        p[0] = b & 0xF;
        p[1] = b >> 4;
    }
    if let [last] = pairs.into_remainder() {
        *last = packed[packed.len() - 1] & 0xF;
    }
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
    pack_fp6_into(codes, &mut out);
    out
}

/// Packs 6-bit codes into a caller-provided buffer of exactly [`fp6_packed_len`] bytes.
///
/// # Panics
/// If `out.len() != fp6_packed_len(codes.len())`.
pub fn pack_fp6_into(codes: &[u8], out: &mut [u8]) {
    assert_eq!(out.len(), fp6_packed_len(codes.len()), "fp6 output length");
    let groups = codes.chunks_exact(4);
    let rest = groups.remainder();
    for (g, o) in groups.zip(out.chunks_exact_mut(3)) {
        let word = (g[0] & 0x3F) as u32
            | ((g[1] & 0x3F) as u32) << 6
            | ((g[2] & 0x3F) as u32) << 12
            | ((g[3] & 0x3F) as u32) << 18;
        o.copy_from_slice(&word.to_le_bytes()[..3]);
    }
    if !rest.is_empty() {
        let mut word = 0u32;
        for (i, &c) in rest.iter().enumerate() {
            word |= ((c & 0x3F) as u32) << (6 * i);
        }
        let start = codes.len() / 4 * 3;
        let tail = &mut out[start..];
        let n = tail.len();
        tail.copy_from_slice(&word.to_le_bytes()[..n]);
    }
}

/// Unpacks `n` 6-bit codes.
pub fn unpack_fp6(packed: &[u8], n: usize) -> Result<Vec<u8>, FormatError> {
    if packed.len() != fp6_packed_len(n) {
        return Err(FormatError::BadBufferLength {
            expected: fp6_packed_len(n),
            got: packed.len(),
        });
    }
    let mut out = alloc::vec![0u8; n];
    unpack_fp6_into(packed, &mut out);
    Ok(out)
}

/// Unpacks `out.len()` 6-bit codes into a caller-provided buffer.
///
/// # Panics
/// If `packed.len() != fp6_packed_len(out.len())`.
pub fn unpack_fp6_into(packed: &[u8], out: &mut [u8]) {
    assert_eq!(packed.len(), fp6_packed_len(out.len()), "fp6 packed length");
    for (g, o) in out.chunks_mut(4).enumerate() {
        let mut word = 0u32;
        for b in 0..3 {
            if let Some(&byte) = packed.get(3 * g + b) {
                word |= (byte as u32) << (8 * b);
            }
        }
        for (i, c) in o.iter_mut().enumerate() {
            *c = ((word >> (6 * i)) & 0x3F) as u8;
        }
    }
}

//! Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3",
//! SC 2011), the counter-based generator behind every random bit in `quant`: stochastic
//! rounding bits and per-stream random Hadamard signs.
//!
//! The generator is a pure function `philox4x32_10(counter: [u32; 4], key: [u32; 2]) ->
//! [u32; 4]`, identical to Random123's `philox4x32_R(10, ...)` and to cuRAND's
//! `curand_Philox4x32_10` (checked against Random123's known-answer vectors in
//! `tests/philox.rs`).
//!
//! # The stochastic-rounding stream (normative; a CUDA kernel must reproduce it)
//!
//! For an operand quantized with [`RngKey`] `{ seed, stream }`:
//!
//! * **key** = `[seed as u32, (seed >> 32) as u32]`;
//! * the **element index** `i` of an element is its flat row-major index in the *stored*
//!   (quantized) layout over the *padded* shape: `i = r * padded_cols + c` where `(r, c)`
//!   is the element's position in the stored tensor (the transposed tensor for
//!   columnwise usage);
//! * the **block index** is `b = i / 16`, and the **counter** is
//!   `[b as u32, (b >> 32) as u32, stream as u32, (stream >> 32) as u32]`;
//! * the 4 output words, each written little-endian, form 16 bytes
//!   (`bytes[4k + j] = (out[k] >> 8j) as u8`); element `i` uses **byte `i % 16`** of its
//!   block's output.
//!
//! So every NVFP4 block (16 consecutive elements of a stored row, since stored rows are
//! padded to a multiple of 16) costs exactly one Philox call, and its element `j` uses bits
//! `8(j % 4) .. 8(j % 4) + 8` of output word `j / 4` — the same word-to-element assignment
//! as the PTX `cvt.rs.satfinite.e2m1x4.f32` instruction (element `k` of a 4-pack uses bits
//! `8k..8k+7` of its 32-bit random word), so a kernel can pass word `j / 4` of the Philox
//! output straight to that instruction for elements `4(j/4) .. 4(j/4) + 4`.
//!
//! The counter with block index `2^64 - 1` ([`RESERVED_BLOCK`]) is never used for element
//! bits (it would need an element index of `2^68`); the random Hadamard sign mask is drawn
//! from it (see [`crate::hadamard::random_sign_mask`]).
//!
//! ```
//! use quant::philox::{block_bytes, fill_random_bytes};
//! use quant::RngKey;
//! let key = RngKey { seed: 7, stream: 3 };
//! let mut bytes = [0u8; 40];
//! fill_random_bytes(key, 10, &mut bytes); // elements 10..50
//! assert_eq!(bytes[0], block_bytes(key, 0)[10]);
//! assert_eq!(bytes[6], block_bytes(key, 1)[0]); // element 16
//! ```

// Index loops over fixed-size arrays are the idiom the vectoriser handles best here.
#![allow(clippy::needless_range_loop)]

use crate::RngKey;

/// First Philox multiplier.
pub const M0: u32 = 0xD251_1F53;
/// Second Philox multiplier.
pub const M1: u32 = 0xCD9E_8D57;
/// First Weyl key increment (golden ratio).
pub const W0: u32 = 0x9E37_79B9;
/// Second Weyl key increment (sqrt(3) - 1).
pub const W1: u32 = 0xBB67_AE85;
/// Elements that share one Philox call (one output of 16 bytes).
pub const BYTES_PER_BLOCK: usize = 16;
/// The block index reserved for non-element draws (the random Hadamard sign mask).
pub const RESERVED_BLOCK: u64 = u64::MAX;

#[inline(always)]
fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let p = a as u64 * b as u64;
    ((p >> 32) as u32, p as u32)
}

#[inline(always)]
fn round(c: [u32; 4], k: [u32; 2]) -> [u32; 4] {
    let (hi0, lo0) = mulhilo(M0, c[0]);
    let (hi1, lo1) = mulhilo(M1, c[2]);
    [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0]
}

/// Philox4x32 with 10 rounds: the key is bumped by `(W0, W1)` between rounds.
///
/// ```
/// use quant::philox::philox4x32_10;
/// // Random123 known-answer vector (all-zero counter and key).
/// assert_eq!(philox4x32_10([0; 4], [0; 2]), [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
/// ```
#[inline]
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut c = counter;
    let mut k = key;
    c = round(c, k);
    for _ in 1..10 {
        k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        c = round(c, k);
    }
    c
}

/// Eight independent Philox4x32-10 evaluations in structure-of-arrays form
/// (`counters[w][lane]`), written so that the compiler can vectorise the lanes.
#[inline(always)]
fn philox4x32_10_x8(counters: [[u32; 8]; 4], key: [u32; 2]) -> [[u32; 8]; 4] {
    philox4x32_10_lanes(counters, key)
}

/// `L` independent Philox4x32-10 evaluations in structure-of-arrays form (`L = 16` gives
/// two interleaved 8-lane chains on AVX2: more instruction-level parallelism).
#[inline(always)]
fn philox4x32_10_lanes<const L: usize>(counters: [[u32; L]; 4], key: [u32; 2]) -> [[u32; L]; 4] {
    let mut c = counters;
    let mut k = key;
    for r in 0..10 {
        if r > 0 {
            k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        }
        let mut n = [[0u32; L]; 4];
        for l in 0..L {
            let p0 = M0 as u64 * c[0][l] as u64;
            let p1 = M1 as u64 * c[2][l] as u64;
            n[0][l] = (p1 >> 32) as u32 ^ c[1][l] ^ k[0];
            n[1][l] = p1 as u32;
            n[2][l] = (p0 >> 32) as u32 ^ c[3][l] ^ k[1];
            n[3][l] = p0 as u32;
        }
        c = n;
    }
    c
}

/// The Philox key of an [`RngKey`]: `[seed as u32, (seed >> 32) as u32]`.
#[inline]
pub fn key_words(key: RngKey) -> [u32; 2] {
    [key.seed as u32, (key.seed >> 32) as u32]
}

/// The Philox counter of block `block` of stream `stream`:
/// `[block as u32, (block >> 32) as u32, stream as u32, (stream >> 32) as u32]`.
#[inline]
pub fn block_counter(block: u64, stream: u64) -> [u32; 4] {
    [
        block as u32,
        (block >> 32) as u32,
        stream as u32,
        (stream >> 32) as u32,
    ]
}

/// The raw Philox output words of block `block` (elements `16 * block .. 16 * block + 16`).
#[inline]
pub fn block_words(key: RngKey, block: u64) -> [u32; 4] {
    philox4x32_10(block_counter(block, key.stream), key_words(key))
}

/// The 16 random bytes of block `block`: byte `j` belongs to element `16 * block + j`.
#[inline]
pub fn block_bytes(key: RngKey, block: u64) -> [u8; 16] {
    words_to_bytes(block_words(key, block))
}

#[inline(always)]
fn words_to_bytes(w: [u32; 4]) -> [u8; 16] {
    let mut b = [0u8; 16];
    for k in 0..4 {
        b[4 * k..4 * k + 4].copy_from_slice(&w[k].to_le_bytes());
    }
    b
}

/// The 16 random bytes of each of eight (arbitrary) blocks, computed in one vectorisable
/// pass: `out[l] == block_bytes(key, blocks[l])`.
#[inline(always)]
pub(crate) fn blocks_bytes_x8(key: RngKey, blocks: [u64; 8]) -> [[u8; 16]; 8] {
    let mut ctr = [[0u32; 8]; 4];
    for l in 0..8 {
        let c = block_counter(blocks[l], key.stream);
        for w in 0..4 {
            ctr[w][l] = c[w];
        }
    }
    let o = philox4x32_10_x8(ctr, key_words(key));
    let mut out = [[0u8; 16]; 8];
    for (l, bytes) in out.iter_mut().enumerate() {
        *bytes = words_to_bytes([o[0][l], o[1][l], o[2][l], o[3][l]]);
    }
    out
}

/// The Philox output words of sixteen blocks in structure-of-arrays form:
/// `out[w][l] == block_words(key, blocks[l])[w]`, so byte `i` of block `l` is
/// `(out[i / 4][l] >> (8 * (i % 4))) as u8`.
#[inline(always)]
pub(crate) fn blocks_words_x16(key: RngKey, blocks: [u64; 16]) -> [[u32; 16]; 4] {
    let mut ctr = [[0u32; 16]; 4];
    for l in 0..16 {
        let c = block_counter(blocks[l], key.stream);
        for w in 0..4 {
            ctr[w][l] = c[w];
        }
    }
    philox4x32_10_lanes(ctr, key_words(key))
}

/// [`blocks_bytes_x8`] for sixteen blocks: `out[l] == block_bytes(key, blocks[l])`.
#[inline(always)]
pub(crate) fn blocks_bytes_x16(key: RngKey, blocks: [u64; 16]) -> [[u8; 16]; 16] {
    let mut ctr = [[0u32; 16]; 4];
    for l in 0..16 {
        let c = block_counter(blocks[l], key.stream);
        for w in 0..4 {
            ctr[w][l] = c[w];
        }
    }
    let o = philox4x32_10_lanes(ctr, key_words(key));
    let mut out = [[0u8; 16]; 16];
    for (l, bytes) in out.iter_mut().enumerate() {
        *bytes = words_to_bytes([o[0][l], o[1][l], o[2][l], o[3][l]]);
    }
    out
}

/// The random byte of element `index` (slow path, for tests and documentation).
///
/// ```
/// use quant::philox::{random_byte, block_bytes};
/// use quant::RngKey;
/// let key = RngKey { seed: 1, stream: 2 };
/// assert_eq!(random_byte(key, 37), block_bytes(key, 2)[5]);
/// ```
#[inline]
pub fn random_byte(key: RngKey, index: u64) -> u8 {
    block_bytes(key, index / 16)[(index % 16) as usize]
}

/// Writes the random bytes of elements `start_index .. start_index + out.len()` into
/// `out` (`out[k]` is the byte of element `start_index + k`). Whole blocks are generated
/// eight at a time in a vectorisable loop.
///
/// ```
/// use quant::philox::{fill_random_bytes, random_byte};
/// use quant::RngKey;
/// let key = RngKey { seed: 42, stream: 9 };
/// let mut out = vec![0u8; 300];
/// fill_random_bytes(key, 5, &mut out);
/// assert!(out.iter().enumerate().all(|(k, &b)| b == random_byte(key, 5 + k as u64)));
/// ```
pub fn fill_random_bytes(key: RngKey, start_index: u64, out: &mut [u8]) {
    if out.is_empty() {
        return;
    }
    let kw = key_words(key);
    let mut block = start_index / 16;
    let mut pos = 0usize;
    // Unaligned head.
    let head = (start_index % 16) as usize;
    if head != 0 {
        let bytes = block_bytes(key, block);
        let n = (16 - head).min(out.len());
        out[..n].copy_from_slice(&bytes[head..head + n]);
        pos = n;
        block = block.wrapping_add(1);
    }
    // Eight whole blocks at a time.
    let whole = (out.len() - pos) / 128 * 128;
    whole_blocks(key.stream, kw, block, &mut out[pos..pos + whole]);
    pos += whole;
    block = block.wrapping_add(whole as u64 / 16);
    // Remaining blocks (the last may be partial).
    while pos < out.len() {
        let bytes = block_bytes(key, block);
        let n = (out.len() - pos).min(16);
        out[pos..pos + n].copy_from_slice(&bytes[..n]);
        pos += n;
        block = block.wrapping_add(1);
    }
}

/// The random bytes of blocks `block ..` into `out` (a multiple of 128 bytes), eight blocks
/// per Philox evaluation in lanes, compiled for AVX2 where the CPU has it (the lanes' 32-bit
/// products then run eight per `vpmuludq` pair instead of two per SSE2 `pmuludq`): integer
/// operations only, the same bytes either way.
fn whole_blocks(stream: u64, kw: [u32; 2], block: u64, out: &mut [u8]) {
    #[inline(always)]
    fn run(stream: u64, kw: [u32; 2], mut block: u64, out: &mut [u8]) {
        for dst in out.chunks_exact_mut(128) {
            let mut ctr = [[0u32; 8]; 4];
            for l in 0..8 {
                let c = block_counter(block.wrapping_add(l as u64), stream);
                for w in 0..4 {
                    ctr[w][l] = c[w];
                }
            }
            let o = philox4x32_10_x8(ctr, kw);
            for l in 0..8 {
                for w in 0..4 {
                    dst[16 * l + 4 * w..16 * l + 4 * w + 4].copy_from_slice(&o[w][l].to_le_bytes());
                }
            }
            block = block.wrapping_add(8);
        }
    }
    crate::dispatch::with_avx2(
        #[inline(always)]
        || run(stream, kw, block, out),
    )
}

/// The Philox stream on AVX-512 registers, for the AVX-512 quantizer kernels.
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use std::arch::x86_64::*;

    use super::{M0, M1, W0, W1};
    use crate::RngKey;

    const BLOCK: usize = 16;

    /// Whether [`words_x16`] and the AVX-512 quantizer kernels may run: the CPU has AVX-512F
    /// (and POPCNT) and the portable code is not forced (`fp_formats::cpu`).
    pub(crate) fn available() -> bool {
        fp_formats::cpu::has_avx512f()
    }

    /// The Philox4x32-10 output words of the sixteen blocks `first + l · stride` (`l < 16`, one
    /// per lane) of `key`'s stream: `crate::philox::blocks_words_x16` on `zmm` registers, with
    /// each 32 x 32 -> 64-bit product split into its halves by `vpmuludq` on the even and the
    /// odd lanes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) fn words_x16(key: RngKey, first: u64, stride: u64) -> [__m512i; 4] {
        let (mut lo, mut hi) = ([0u32; BLOCK], [0u32; BLOCK]);
        for l in 0..BLOCK {
            let b = first.wrapping_add((l as u64).wrapping_mul(stride));
            (lo[l], hi[l]) = (b as u32, (b >> 32) as u32);
        }
        // SAFETY: 16 u32 each.
        let mut c = unsafe {
            [
                _mm512_loadu_si512(lo.as_ptr().cast()),
                _mm512_loadu_si512(hi.as_ptr().cast()),
                _mm512_set1_epi32(key.stream as u32 as i32),
                _mm512_set1_epi32((key.stream >> 32) as u32 as i32),
            ]
        };
        let (m0, m1) = (_mm512_set1_epi32(M0 as i32), _mm512_set1_epi32(M1 as i32));
        // (high, low) halves of m · x per lane
        let mul = |m: __m512i, x: __m512i| {
            let even = _mm512_mul_epu32(x, m);
            let odd = _mm512_mul_epu32(_mm512_srli_epi64::<32>(x), m);
            let high = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64::<32>(even), odd);
            let low = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64::<32>(odd));
            (high, low)
        };
        let (mut k0, mut k1) = (key.seed as u32, (key.seed >> 32) as u32);
        for r in 0..10 {
            if r > 0 {
                (k0, k1) = (k0.wrapping_add(W0), k1.wrapping_add(W1));
            }
            let (h0, l0) = mul(m0, c[0]);
            let (h1, l1) = mul(m1, c[2]);
            let (kk0, kk1) = (_mm512_set1_epi32(k0 as i32), _mm512_set1_epi32(k1 as i32));
            c = [
                _mm512_ternarylogic_epi32::<0x96>(h1, c[1], kk0),
                l1,
                _mm512_ternarylogic_epi32::<0x96>(h0, c[3], kk1),
                l0,
            ];
        }
        c
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn philox_matches_the_scalar_lanes() {
            if !available() {
                eprintln!("SKIP: the AVX-512 kernels do not run here (no AVX-512F, or NIBBLE_FORCE_PORTABLE)");
                return;
            }
            for (seed, stream, first, stride) in [
                (0u64, 0u64, 0u64, 1u64),
                (
                    0x0123_4567_89ab_cdef,
                    0xfedc_ba98_7654_3210,
                    u64::MAX - 7,
                    1,
                ),
                (7, 3, (1 << 32) - 5, 1 << 31),
                (u64::MAX, u64::MAX, 12345, 977),
            ] {
                let key = RngKey { seed, stream };
                let blocks = core::array::from_fn(|l| first.wrapping_add(l as u64 * stride));
                let want = super::super::blocks_words_x16(key, blocks);
                // SAFETY: AVX-512F is present (checked above).
                let got = unsafe { words_x16(key, first, stride) };
                for w in 0..4 {
                    let mut g = [0u32; BLOCK];
                    // SAFETY: 16 u32.
                    unsafe { _mm512_storeu_si512(g.as_mut_ptr().cast(), got[w]) };
                    assert_eq!(g, want[w], "word {w}, key {key:?}, first {first}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_x8_matches_block_bytes() {
        let key = RngKey {
            seed: 0xABCD_0123_4567_89EF,
            stream: 77,
        };
        let blocks = [0, 1, 5, 1 << 33, 99, u64::MAX - 1, 12345, 7];
        let got = blocks_bytes_x8(key, blocks);
        for l in 0..8 {
            assert_eq!(got[l], block_bytes(key, blocks[l]));
        }
    }

    #[test]
    fn blocks_x16_matches_block_bytes() {
        let key = RngKey {
            seed: 0x0123_4567_89AB_CDEF,
            stream: 1 << 40 | 3,
        };
        let blocks: [u64; 16] =
            core::array::from_fn(|l| (l as u64 * 0x9E37_79B9) ^ (l as u64) << 40);
        let got = blocks_bytes_x16(key, blocks);
        let words = blocks_words_x16(key, blocks);
        for l in 0..16 {
            assert_eq!(got[l], block_bytes(key, blocks[l]));
            for w in 0..4 {
                assert_eq!(words[w][l], block_words(key, blocks[l])[w]);
            }
        }
    }

    #[test]
    fn x8_matches_scalar() {
        let key = [0x1234_5678, 0x9abc_def0];
        let mut ctr = [[0u32; 8]; 4];
        for l in 0..8 {
            for w in 0..4 {
                ctr[w][l] = (l as u32)
                    .wrapping_mul(0x0101_0101)
                    .wrapping_add(w as u32 * 77);
            }
        }
        let o = philox4x32_10_x8(ctr, key);
        for l in 0..8 {
            let c = [ctr[0][l], ctr[1][l], ctr[2][l], ctr[3][l]];
            let s = philox4x32_10(c, key);
            assert_eq!(s, [o[0][l], o[1][l], o[2][l], o[3][l]]);
        }
    }
}

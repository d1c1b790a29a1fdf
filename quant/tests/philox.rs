//! Philox4x32-10 against the Random123 known-answer vectors, and the stochastic-rounding
//! stream layout documented in `quant::philox`.

use quant::philox::{
    block_bytes, block_counter, block_words, fill_random_bytes, key_words, philox4x32_10,
    random_byte,
};
use quant::RngKey;

/// Random123 `tests/kat_vectors` (DEShawResearch/random123), the three `philox4x32 10`
/// lines: counter (4 words), key (2 words), expected output (4 words).
const KAT: [([u32; 4], [u32; 2], [u32; 4]); 3] = [
    (
        [0x0000_0000; 4],
        [0x0000_0000; 2],
        [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8],
    ),
    (
        [0xffff_ffff; 4],
        [0xffff_ffff; 2],
        [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd],
    ),
    (
        [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
        [0xa409_3822, 0x299f_31d0],
        [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1],
    ),
];

#[test]
fn random123_known_answers() {
    for (ctr, key, want) in KAT {
        assert_eq!(philox4x32_10(ctr, key), want, "ctr {ctr:x?} key {key:x?}");
    }
}

#[test]
fn stream_layout() {
    let key = RngKey {
        seed: 0x0123_4567_89ab_cdef,
        stream: 0xfedc_ba98_7654_3210,
    };
    assert_eq!(key_words(key), [0x89ab_cdef, 0x0123_4567]);
    let block = 0x0000_0005_0000_0007u64;
    assert_eq!(
        block_counter(block, key.stream),
        [7, 5, 0x7654_3210, 0xfedc_ba98]
    );
    let w = philox4x32_10([7, 5, 0x7654_3210, 0xfedc_ba98], [0x89ab_cdef, 0x0123_4567]);
    assert_eq!(block_words(key, block), w);
    // Little-endian words: byte j is bits 8(j % 4).. of word j / 4.
    let b = block_bytes(key, block);
    for j in 0..16 {
        assert_eq!(b[j], (w[j / 4] >> (8 * (j % 4))) as u8);
        assert_eq!(random_byte(key, block * 16 + j as u64), b[j]);
    }
}

/// The fast filler agrees with the per-element definition for every alignment and length
/// (including the 8-block vectorised body).
#[test]
fn fill_matches_definition() {
    let key = RngKey {
        seed: 99,
        stream: 12345,
    };
    for start in [0u64, 1, 7, 15, 16, 17, 1000, u32::MAX as u64 * 16 - 40] {
        for len in [0usize, 1, 5, 16, 31, 127, 128, 129, 300, 1024 + 9] {
            let mut out = vec![0u8; len];
            fill_random_bytes(key, start, &mut out);
            for (k, &v) in out.iter().enumerate() {
                assert_eq!(
                    v,
                    random_byte(key, start + k as u64),
                    "start {start} len {len} k {k}"
                );
            }
        }
    }
}

/// Bytes look uniform (a loose sanity check: each value's count within 6 sigma).
#[test]
fn bytes_are_roughly_uniform() {
    let mut out = vec![0u8; 1 << 18];
    fill_random_bytes(RngKey { seed: 5, stream: 6 }, 0, &mut out);
    let mut hist = [0usize; 256];
    for &b in &out {
        hist[b as usize] += 1;
    }
    let mean = out.len() as f64 / 256.0;
    for (v, &c) in hist.iter().enumerate() {
        assert!(
            (c as f64 - mean).abs() < 6.0 * mean.sqrt(),
            "byte {v}: {c} vs {mean}"
        );
    }
}

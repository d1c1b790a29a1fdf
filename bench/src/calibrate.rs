//! The machine's compute calibration: a frozen probe kernel whose speed stands for "how fast
//! is one core of this machine at quantizer-like work".
//!
//! The gated kernel ratios divide a quantizer's time on an in-cache tensor by this probe's
//! time on the same tensor, measured just before it. Both are bound by the core (loads, SIMD
//! arithmetic, compares, conversions, narrowing stores out of L1/L2), so a machine with a
//! faster core speeds both up alike and the ratio carries over from the baseline's machine;
//! memory bandwidth does not enter either side.
//!
//! **Frozen**: changing this function changes every `vs_compute_probe` ratio. If it must
//! change, record the baseline again (`cargo xtask bench --update-baseline`).

/// A toy block quantizer: per block of 16, the absolute maximum, a scale to 7 over it, and
/// each value scaled, offset and truncated to a byte in `0..=15`. `out` must be as long as
/// `x`, and `x.len()` a multiple of 16 (a shorter tail is ignored).
pub fn compute_probe(x: &[f32], out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if fp_formats::cpu::has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (the workspace's shared dispatch checked).
        return unsafe { probe_avx2(x, out) };
    }
    probe_body(x, out);
}

/// The probe in AVX2 + FMA, the instruction set of the quantizers' fast paths, so that it
/// runs on the same execution units as they do. Per block: two 8-lane loads, the absolute
/// maximum by a lane-wise then horizontal maximum, one division, two FMAs, two truncating
/// conversions and two packs to 16 bytes. Four blocks are in flight per iteration, so the
/// probe is bound by instruction throughput, like the quantizers, not by the latency of one
/// block's reduction chain (a latency-bound probe slowed down by a third whenever the other
/// hardware thread of the core was busy, while the kernels did not).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn probe_avx2(x: &[f32], out: &mut [u8]) {
    use std::arch::x86_64::*;
    #[inline(always)]
    unsafe fn block(src: *const f32, dst: *mut u8) {
        let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
        let (lo, hi) = (_mm256_loadu_ps(src), _mm256_loadu_ps(src.add(8)));
        let m = _mm256_max_ps(_mm256_and_ps(lo, abs_mask), _mm256_and_ps(hi, abs_mask));
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
        let scale = _mm256_set1_ps(if amax > 0.0 { 7.0 / amax } else { 0.0 });
        let half = _mm256_set1_ps(8.5);
        let qlo = _mm256_cvttps_epi32(_mm256_fmadd_ps(lo, scale, half));
        let qhi = _mm256_cvttps_epi32(_mm256_fmadd_ps(hi, scale, half));
        // i32 -> i16 -> u8 with the lanes back in order.
        let words = _mm256_permute4x64_epi64(_mm256_packs_epi32(qlo, qhi), 0b11_01_10_00);
        let bytes = _mm_packus_epi16(
            _mm256_castsi256_si128(words),
            _mm256_extracti128_si256(words, 1),
        );
        _mm_storeu_si128(dst.cast(), bytes);
    }
    let n = x.len().min(out.len()) / 16 * 16;
    let (src, dst) = (x.as_ptr(), out.as_mut_ptr());
    let mut i = 0;
    // SAFETY: every block read lies within x[..n] and every block written within out[..n].
    while i + 64 <= n {
        block(src.add(i), dst.add(i));
        block(src.add(i + 16), dst.add(i + 16));
        block(src.add(i + 32), dst.add(i + 32));
        block(src.add(i + 48), dst.add(i + 48));
        i += 64;
    }
    while i < n {
        block(src.add(i), dst.add(i));
        i += 16;
    }
}

/// The portable probe (the same codes, one value at a time).
fn probe_body(x: &[f32], out: &mut [u8]) {
    for (block, codes) in x.chunks_exact(16).zip(out.chunks_exact_mut(16)) {
        let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let scale = if amax > 0.0 { 7.0 / amax } else { 0.0 };
        for (v, c) in block.iter().zip(codes.iter_mut()) {
            *c = v.mul_add(scale, 8.5) as u8;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_maps_each_block_onto_0_to_15() {
        let x: Vec<f32> = (0..32).map(|i| i as f32 - 16.0).collect();
        let mut out = vec![0u8; 32];
        compute_probe(&x, &mut out);
        // Block 0 spans -16..-1 (amax 16): -16 -> 8.5 - 7 = 1.5 -> 1; -1 -> 8.0625 -> 8.
        assert_eq!(out[0], 1);
        assert_eq!(out[15], 8);
        // Block 1 spans 0..15 (amax 15): 15 -> 15.5 -> 15.
        assert_eq!(out[16], 8);
        assert_eq!(out[31], 15);
        let mut portable = vec![0u8; 32];
        probe_body(&x, &mut portable);
        assert_eq!(out, portable);
    }
}

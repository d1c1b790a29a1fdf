//! Small building blocks shared by the CPU kernels: parallel loops over chunks and rows,
//! vectorisable `exp` / `tanh`, multi-accumulator reductions.
//!
//! The standard library's `f32::exp` is a libm call that LLVM cannot vectorise; the versions
//! here are branch-free polynomials (Cephes `expf`, ≤ 2 ulp on the clamped range) that compile
//! to SIMD inside element loops.

use rayon::prelude::*;

/// Runs `f` compiled for AVX-512F, or else AVX2 + FMA, when the CPU has them (asked of the
/// workspace's one run-time dispatch, `fp_formats::cpu`; the crate is built for baseline
/// x86-64, i.e. SSE2). `f` is inlined into the feature-enabled wrapper, so its element loops
/// vectorise 16 or 8 wide. Results are bit-identical on every path: the kernels use no fused
/// multiply-adds of their own (Rust never contracts `a * b + c`) and their reductions have a
/// fixed lane structure (16 accumulators, whatever the vector width). On the 2-vCPU Zen 4
/// host the AVX-512 build made 2-thread training steps 2-3% faster (fewer instructions for
/// the two hardware threads to share) and left one-thread steps unchanged.
#[inline(always)]
pub(crate) fn simd<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        if fp_formats::cpu::has_avx512f() && fp_formats::cpu::has_avx2_fma() {
            // SAFETY: as below, with AVX-512F too.
            return unsafe { avx512(f) };
        }
        if fp_formats::cpu::has_avx2_fma() {
            // SAFETY: the CPU supports the features `avx2_fma` is compiled for (the shared
            // dispatch checked; it also honours NIBBLE_FORCE_PORTABLE).
            return unsafe { avx2_fma(f) };
        }
    }
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,avx2,fma")]
unsafe fn avx2_fma<R>(f: impl FnOnce() -> R) -> R {
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,avx2,fma,avx512f")]
unsafe fn avx512<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// Work below this many elements runs on the calling thread.
pub(crate) const PAR_MIN: usize = 1 << 15;

/// `f(offset, chunk)` over disjoint chunks of `out`, in parallel when `out` is large.
#[inline]
pub(crate) fn for_chunks<F>(out: &mut [f32], f: F)
where
    F: Fn(usize, &mut [f32]) + Sync + Send,
{
    const CHUNK: usize = 1 << 14;
    if out.len() < PAR_MIN {
        simd(
            #[inline(always)]
            || f(0, out),
        );
    } else {
        out.par_chunks_mut(CHUNK).enumerate().for_each(|(i, c)| {
            simd(
                #[inline(always)]
                || f(i * CHUNK, c),
            )
        });
    }
}

/// Number of rows per parallel task for rows of `row_len` elements. Independent of the
/// thread count, so chunked reductions give the same bits on any number of threads.
#[inline]
pub(crate) fn rows_per_task(row_len: usize) -> usize {
    (PAR_MIN / 4 / row_len.max(1)).max(1)
}

/// `f(row_index, row)` over the rows of `out` (`row_len` elements each), in parallel when
/// there is enough work.
#[inline]
pub(crate) fn for_rows<F>(out: &mut [f32], row_len: usize, f: F)
where
    F: Fn(usize, &mut [f32]) + Sync + Send,
{
    if row_len == 0 {
        return;
    }
    let per = if out.len() < PAR_MIN {
        out.len() / row_len
    } else {
        rows_per_task(row_len)
    };
    let task = |ci: usize, chunk: &mut [f32]| {
        simd(
            #[inline(always)]
            || {
                for (r, row) in chunk.chunks_exact_mut(row_len).enumerate() {
                    f(ci * per + r, row);
                }
            },
        )
    };
    if out.len() < PAR_MIN {
        task(0, out);
    } else {
        out.par_chunks_mut(per * row_len)
            .enumerate()
            .for_each(|(ci, chunk)| task(ci, chunk));
    }
}

/// Like [`for_rows`], also handing each row its `side_len` elements of `side` (per-row
/// statistics); `side` may be empty, then every row gets an empty slice.
#[inline]
pub(crate) fn for_rows_with<F>(
    out: &mut [f32],
    row_len: usize,
    side: &mut [f32],
    side_len: usize,
    f: F,
) where
    F: Fn(usize, &mut [f32], &mut [f32]) + Sync + Send,
{
    if row_len == 0 {
        return;
    }
    let rows = out.len() / row_len;
    let side_len = if side.is_empty() { 0 } else { side_len };
    debug_assert!(side.len() == rows * side_len);
    let per = if out.len() < PAR_MIN {
        rows.max(1)
    } else {
        rows_per_task(row_len)
    };
    let task = |ci: usize, oc: &mut [f32], sc: &mut [f32]| {
        simd(
            #[inline(always)]
            || {
                for (r, row) in oc.chunks_exact_mut(row_len).enumerate() {
                    let s = &mut sc[r * side_len..(r + 1) * side_len];
                    f(ci * per + r, row, s);
                }
            },
        )
    };
    if out.len() < PAR_MIN {
        task(0, out, side);
    } else if side_len == 0 {
        out.par_chunks_mut(per * row_len)
            .enumerate()
            .for_each(|(ci, oc)| task(ci, oc, &mut []));
    } else {
        out.par_chunks_mut(per * row_len)
            .zip(side.par_chunks_mut(per * side_len))
            .enumerate()
            .for_each(|(ci, (oc, sc))| task(ci, oc, sc));
    }
}

/// `dst += src`.
#[inline]
pub(crate) fn add_assign(dst: &mut [f32], src: &[f32]) {
    for_chunks(
        dst,
        #[inline(always)]
        |o, d| {
            let n = d.len();
            for (d, s) in d.iter_mut().zip(&src[o..o + n]) {
                *d += s;
            }
        },
    );
}

/// Column sums of a row-major `[rows, n]` matrix: `dst[j] (+)= Σ_r src[r·n + j]`, written
/// (`acc == false`) or added (`acc == true`); parallel partial sums for large inputs.
pub(crate) fn sum_rows(src: &[f32], n: usize, dst: &mut [f32], acc: bool) {
    debug_assert_eq!(dst.len(), n);
    if n == 0 {
        return;
    }
    if !acc {
        dst.fill(0.0);
    }
    if src.len() < PAR_MIN {
        for row in src.chunks_exact(n) {
            for (d, s) in dst.iter_mut().zip(row) {
                *d += s;
            }
        }
        return;
    }
    // fixed chunking and an in-order final reduction: deterministic on any thread count
    let per = rows_per_task(n);
    let partials: Vec<Vec<f32>> = src
        .par_chunks(per * n)
        .map(|c| {
            let mut p = vec![0.0f32; n];
            for row in c.chunks_exact(n) {
                for (d, s) in p.iter_mut().zip(row) {
                    *d += s;
                }
            }
            p
        })
        .collect();
    for p in &partials {
        for (d, s) in dst.iter_mut().zip(p) {
            *d += s;
        }
    }
}

/// Writes (`acc == false`) or adds (`acc == true`) `v` to `d`.
#[inline(always)]
pub(crate) fn store(acc: bool, d: &mut f32, v: f32) {
    // One unconditional store of a selected value: written as two stores under a branch,
    // LLVM if-converts element loops into masked loads and stores (`vmaskmovps`), which
    // AMD cores execute many times slower than plain ones.
    let old = *d;
    *d = if acc { old + v } else { v };
}

/// `*d += v` (`acc`), else `*d = 0 + v`: what a zero-filled gradient that is then added to
/// holds (`split`'s backward), so fused ops that skip the fill keep its bits (−0 → +0).
#[inline(always)]
pub(crate) fn store_over_zero(acc: bool, d: &mut f32, v: f32) {
    // branch-free for the reason given at `store`: the old value is always read and
    // masked to +0 when not accumulating (a select on it would become a masked load)
    let keep = if acc { u32::MAX } else { 0 };
    *d = f32::from_bits(d.to_bits() & keep) + v;
}

/// `e^x` (vectorisable; NaN propagates; 0 below −87, saturates at `e^88` above 88).
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    let x0 = x;
    const HI: f32 = 88.0;
    const LO: f32 = -87.0;
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    const C1: f32 = 0.693_359_4;
    const C2: f32 = -2.121_944_4e-4;
    let x = if x > HI { HI } else { x };
    let x = if x < LO { LO } else { x };
    let t = x * LOG2E + MAGIC;
    let fx = t - MAGIC;
    let n = (t.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
    let r = x - fx * C1 - fx * C2;
    let z = r * r;
    let p = 1.987_569_1e-4_f32;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let y = p * z + r + 1.0;
    let r = y * f32::from_bits((n.wrapping_add(127) as u32) << 23);
    if x0 < LO {
        0.0
    } else {
        r
    }
}

/// `tanh(x)` via `1 - 2 / (e^{2x} + 1)` (absolute error ~1e-7; vectorisable).
#[inline(always)]
pub(crate) fn tanh(x: f32) -> f32 {
    1.0 - 2.0 / (exp(2.0 * x) + 1.0)
}

/// The logistic function `1 / (1 + e^{-x})`.
#[inline(always)]
pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// `Σ a_i b_i` with 16 independent accumulators (vectorises).
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; 16];
    let (ac, bc) = (a.chunks_exact(16), b.chunks_exact(16));
    let (at, bt) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for ((s, &x), &y) in acc.iter_mut().zip(x).zip(y) {
            *s += x * y;
        }
    }
    let mut s = 0.0;
    for (x, y) in at.iter().zip(bt) {
        s += x * y;
    }
    sum16(&acc) + s
}

/// `Σ a_i` with 16 independent accumulators.
#[inline(always)]
pub(crate) fn sum(a: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let c = a.chunks_exact(16);
    let t = c.remainder();
    for x in c {
        for (s, &x) in acc.iter_mut().zip(x) {
            *s += x;
        }
    }
    sum16(&acc) + t.iter().sum::<f32>()
}

/// `Σ a_i²`.
#[inline(always)]
pub(crate) fn sum_sq(a: &[f32]) -> f32 {
    dot(a, a)
}

/// `max_i a_i` (NaN-propagating; `-inf` for an empty slice).
#[inline(always)]
pub(crate) fn max(a: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 16];
    let c = a.chunks_exact(16);
    let t = c.remainder();
    let mut nan = false;
    for x in c {
        for (m, &x) in acc.iter_mut().zip(x) {
            *m = if x > *m { x } else { *m };
            nan |= x.is_nan();
        }
    }
    // the tail lane by lane, then the lanes pairwise: no serial chain of compares (a max
    // does not depend on the order it is taken in, but for which zero wins a tie of +0 and
    // -0, and every caller only subtracts it or adds a non-negative logarithm to it)
    for (m, &x) in acc.iter_mut().zip(t) {
        *m = if x > *m { x } else { *m };
        nan |= x.is_nan();
    }
    let mut w = 8;
    while w > 0 {
        let (lo, hi) = acc.split_at_mut(w);
        for (m, &x) in lo.iter_mut().zip(&hi[..w]) {
            *m = if x > *m { x } else { *m };
        }
        w /= 2;
    }
    if nan {
        f32::NAN
    } else {
        acc[0]
    }
}

#[inline(always)]
pub(crate) fn sum16(a: &[f32; 16]) -> f32 {
    let s: [f32; 8] = std::array::from_fn(|l| a[l] + a[l + 8]);
    (s[0] + s[4]) + (s[1] + s[5]) + ((s[2] + s[6]) + (s[3] + s[7]))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The element kernels compiled for AVX-512F, for AVX2 + FMA and for baseline x86-64 give
    /// the same bits (no contraction, fixed reduction lanes), on values spanning `exp`'s
    /// clamps, NaN and a length that leaves a tail after the 16-wide chunks.
    #[test]
    fn every_instruction_set_gives_the_same_bits() {
        let mut x: Vec<f32> = (0..1003).map(|i| (i as f32 * 0.731).sin() * 95.0).collect();
        x[500] = f32::NAN;
        let finite: Vec<f32> = x
            .iter()
            .map(|v| if v.is_nan() { 0.5 } else { *v })
            .collect();
        #[inline(always)]
        fn kernels(x: &[f32], finite: &[f32]) -> Vec<u32> {
            let mut bits: Vec<u32> = x
                .iter()
                .flat_map(|&v| [exp(v), tanh(v / 8.0), sigmoid(v / 8.0)])
                .map(f32::to_bits)
                .collect();
            bits.extend(
                [
                    dot(finite, &finite[1..]),
                    sum(finite),
                    sum_sq(finite),
                    max(finite),
                    max(x),
                ]
                .map(f32::to_bits),
            );
            bits
        }
        let baseline = kernels(&x, &finite);
        #[cfg(target_arch = "x86_64")]
        {
            use fp_formats::cpu::{has_avx2_fma, has_avx512f};
            // `bits` runs only when `available` (the build's features are present)
            let check = |build: &str, available: bool, bits: &dyn Fn() -> Vec<u32>| {
                if available {
                    assert!(bits() == baseline, "{build}");
                } else {
                    eprintln!("SKIP the {build} build: this CPU lacks it (or the portable code is forced)");
                }
            };
            // SAFETY (both): called by `check` only when the CPU has the features.
            check("AVX2 + FMA", has_avx2_fma(), &|| unsafe {
                avx2_fma(
                    #[inline(always)]
                    || kernels(&x, &finite),
                )
            });
            check("AVX-512F", has_avx512f() && has_avx2_fma(), &|| unsafe {
                avx512(
                    #[inline(always)]
                    || kernels(&x, &finite),
                )
            });
        }
    }

    #[test]
    fn exp_tanh_sigmoid_are_accurate() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let (a, b) = (exp(x) as f64, (x as f64).exp());
            worst = worst.max(((a - b) / b).abs());
            x += 0.013;
        }
        assert!(worst < 3e-7, "exp relative error {worst}");
        for &x in &[-20.0f32, -3.0, -0.5, -1e-3, 0.0, 1e-3, 0.7, 5.0, 30.0] {
            assert!((tanh(x) as f64 - (x as f64).tanh()).abs() < 2e-7);
            assert!((sigmoid(x) as f64 - 1.0 / (1.0 + (-(x as f64)).exp())).abs() < 2e-7);
        }
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-1000.0), 0.0);
        assert!(exp(f32::INFINITY).is_finite());
    }

    #[test]
    fn reductions() {
        let a: Vec<f32> = (0..37).map(|i| i as f32 - 10.0).collect();
        assert_eq!(sum(&a), a.iter().sum::<f32>());
        assert_eq!(max(&a), 26.0);
        assert_eq!(dot(&a, &a), a.iter().map(|x| x * x).sum::<f32>());
        let mut b = a.clone();
        b[20] = f32::NAN;
        assert!(max(&b).is_nan());
        assert_eq!(max(&[]), f32::NEG_INFINITY);
    }

    /// `max` over every length from 0 to 49 (whole 16-lane groups and every tail) and every
    /// position of the largest value: the scalar fold's value, NaN wherever one lies.
    #[test]
    fn max_matches_the_scalar_fold_for_every_tail() {
        for n in 0..50 {
            let base: Vec<f32> = (0..n).map(|i| ((i * 7919) % 23) as f32 - 30.0).collect();
            for top in 0..n {
                let mut a = base.clone();
                a[top] = 5.0;
                let fold = a.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
                assert_eq!(max(&a), fold, "n {n}, largest at {top}");
                a[top] = f32::NAN;
                assert!(max(&a).is_nan(), "n {n}, NaN at {top}");
            }
        }
    }
}

//! The one f32 GEMM every CPU matmul in Nibble goes through (`matrixmultiply`'s kernels,
//! arbitrary strides so transposes are free), behind a small safe wrapper.
//!
//! Threads: the current rayon pool's. A large product is split into bands of the output,
//! one per thread, each multiplied by `matrixmultiply` on its own thread (its own threading
//! is not built in), so every parallel kernel of a training step runs on one pool.
//!
//! [`bf16`] is the BF16 GEMM (BF16 operands, FP32 accumulation) of the quantized recipes, on
//! the AMX-BF16 tile unit or the AVX512-BF16 dot-product instruction where the CPU has one.

#[cfg(target_arch = "x86_64")]
mod amx;
pub mod bf16;
#[cfg(target_arch = "x86_64")]
mod dpbf16;
pub mod e2m1;
#[cfg(target_arch = "x86_64")]
mod fma_pairs;
pub(crate) mod pack;
mod tile_words;
pub(crate) use tile_words::TileWords;
#[cfg(target_arch = "x86_64")]
mod pack_avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod pack_avx512;

use rayon::prelude::*;

pub use crate::matrix::MatRef;

/// `C = alpha · A · B + beta · C` with `A: [m, k]`, `B: [k, n]` and `C` row-major `[m, n]`.
/// With `beta == 0`, `C` is overwritten (NaNs in it do not propagate).
///
/// # Panics
/// If the inner dimensions disagree or a view does not fit its storage. Callers that take
/// shapes from users check them first and return typed errors.
///
/// ```
/// use quant::gemm::{sgemm, MatRef};
/// let a = [1.0, 2.0, 3.0, 4.0]; // [[1, 2], [3, 4]]
/// let b = [1.0, 0.0, 0.0, 1.0];
/// let mut c = [0.0; 4];
/// sgemm(1.0, MatRef::row_major(&a, 2, 2).t(), MatRef::row_major(&b, 2, 2), 0.0, &mut c);
/// assert_eq!(c, [1.0, 3.0, 2.0, 4.0]);
/// ```
pub fn sgemm(alpha: f32, a: MatRef<'_>, b: MatRef<'_>, beta: f32, c: &mut [f32]) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(
        b.rows, k,
        "sgemm: inner dimensions differ ({k} vs {})",
        b.rows
    );
    assert_eq!(
        c.len(),
        m * n,
        "sgemm: output has {} elements, expected {}",
        c.len(),
        m * n
    );
    assert!(
        a.fits() && b.fits(),
        "sgemm: a strided view exceeds its storage"
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        for v in c.iter_mut() {
            *v = if beta == 0.0 { 0.0 } else { *v * beta };
        }
        return;
    }
    let bands = bands(m, n, k);
    if bands <= 1 {
        // SAFETY: the views were checked to lie inside their slices, `c` holds exactly m*n
        // elements with row stride n, and `c` does not alias `a` or `b` (it is borrowed
        // mutably).
        unsafe { band(alpha, (a, b), beta, (0, m), (0, n), c.as_mut_ptr(), n) };
        return;
    }
    // Bands along the longer of M and N, one task each on the rayon pool, each starting at
    // a multiple of BAND_ALIGN. `matrixmultiply` computes an element the same way wherever
    // it lies except in a partial register tile (its masked path rounds `alpha · AB` and
    // `beta · C` separately); register tiles (at most 16 x 16) are laid from the start of
    // each call, so aligned bands have partial tiles only where the whole product has them,
    // and the bits do not depend on the banding (the tests compare them).
    let along_m = m >= n;
    let len = if along_m { m } else { n };
    let per = len.div_ceil(bands).next_multiple_of(BAND_ALIGN);
    let bands = len.div_ceil(per);
    let out = OutPtr(c.as_mut_ptr());
    (0..bands).into_par_iter().for_each(|i| {
        let (lo, hi) = (i * per, ((i + 1) * per).min(len));
        if lo >= hi {
            return;
        }
        let (rows, cols) = if along_m {
            ((lo, hi), (0, n))
        } else {
            ((0, m), (lo, hi))
        };
        // SAFETY: as above; the tasks' bands of `c` are disjoint (rows or columns `lo..hi`),
        // and `c` outlives the parallel loop.
        unsafe { band(alpha, (a, b), beta, rows, cols, out.get(), n) };
    });
}

/// Smallest product (multiply-adds) worth splitting across the pool's threads.
const PARALLEL_MIN_MACS: usize = 1 << 22;

/// Band boundaries are multiples of this (a multiple of every `matrixmultiply` register
/// tile's rows and columns).
const BAND_ALIGN: usize = 64;

/// Bands of the output to compute in parallel: one per thread of the current rayon pool
/// when the product is big enough (at most one per `BAND_ALIGN` rows or columns).
fn bands(m: usize, n: usize, k: usize) -> usize {
    let threads = rayon::current_num_threads();
    if threads <= 1 || m.saturating_mul(n).saturating_mul(k) < PARALLEL_MIN_MACS {
        return 1;
    }
    threads.min(m.max(n) / BAND_ALIGN).max(1)
}

/// The output pointer, shared by tasks that each write their own elements (the f32 GEMM's
/// bands, the BF16 GEMM's blocks in `bf16::block_tasks`).
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: the tasks write disjoint elements through it while the caller holds `c`.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Rows `r0..r1` and columns `j0..j1` of `C = alpha · A · B + beta · C`, `C` row-major at
/// `c` with row stride `ldc`, on this thread.
///
/// # Safety
/// The views must fit their storage, `c` must hold the `[m, ldc]` output, and no other
/// thread may touch the band's elements meanwhile.
#[inline]
unsafe fn band(
    alpha: f32,
    (a, b): (MatRef<'_>, MatRef<'_>),
    beta: f32,
    (r0, r1): (usize, usize),
    (j0, j1): (usize, usize),
    c: *mut f32,
    ldc: usize,
) {
    let (ar, ac) = (a.row_stride as isize, a.col_stride as isize);
    let (br, bc) = (b.row_stride as isize, b.col_stride as isize);
    // SAFETY: (caller) row r0 of A and column j0 of B lie in their views, element (r0, j0)
    // in C.
    unsafe {
        matrixmultiply::sgemm(
            r1 - r0,
            a.cols,
            j1 - j0,
            alpha,
            a.data.as_ptr().add(r0 * a.row_stride),
            ar,
            ac,
            b.data.as_ptr().add(j0 * b.col_stride),
            br,
            bc,
            beta,
            c.add(r0 * ldc + j0),
            ldc as isize,
            1,
        );
    }
}

/// `out[M, N] = A[M, K] · B[N, K]ᵀ` for row-major `A` and `B` (the "TN" GEMM of every
/// linear layer).
pub fn matmul_tn(a: &[f32], b: &[f32], m: usize, n: usize, k: usize, out: &mut [f32]) {
    sgemm(
        1.0,
        MatRef::row_major(a, m, k),
        MatRef::row_major(b, n, k).t(),
        0.0,
        out,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pseudo(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(747_796_405).wrapping_add(1);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (s >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0
            })
            .collect()
    }

    /// The product split into bands on pools of 2-4 threads has the bits of the one call
    /// on one thread: shapes banded along M and along N, with partial register tiles at the
    /// ends (the last band of `(129, 130, 300)` is two columns wide), K over several of the
    /// kernel's K blocks, alpha != 1, both betas, transposed views. Every shape is big enough
    /// to be split on those pools.
    #[test]
    fn banded_products_have_the_bits_of_one_call() {
        let shapes = [
            (1000, 77, 600),
            (77, 1000, 600),
            (300, 200, 1100),
            (129, 130, 300),
        ];
        let pools: Vec<rayon::ThreadPool> = (1..=4)
            .map(|t| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(t)
                    .build()
                    .unwrap()
            })
            .collect();
        for (m, n, k) in shapes {
            for pool in &pools[1..] {
                let split = pool.install(|| bands(m, n, k));
                assert!(split >= 2, "[{m}, {k}] x [{k}, {n}] is not split ({split})");
            }
            let a = pseudo(m * k, 1);
            let bt = pseudo(n * k, 2); // B stored transposed: [n, k]
            let c0 = pseudo(m * n, 3);
            let av = MatRef::row_major(&a, m, k);
            let bv = MatRef::row_major(&bt, n, k).t();
            for (alpha, beta) in [(1.0, 0.0), (0.37, 1.0)] {
                let run = |pool: &rayon::ThreadPool| {
                    let mut c = c0.clone();
                    pool.install(|| sgemm(alpha, av, bv, beta, &mut c));
                    c.iter().map(|x| x.to_bits()).collect::<Vec<u32>>()
                };
                let one = run(&pools[0]);
                for (threads, pool) in (2..).zip(&pools[1..]) {
                    assert!(
                        run(pool) == one,
                        "[{m}, {k}] x [{k}, {n}], alpha {alpha}, beta {beta}, {threads} threads"
                    );
                }
            }
        }
        // one band per thread, at most one per BAND_ALIGN rows of the longer side
        assert_eq!(bands(1000, 77, 600), rayon::current_num_threads().min(15));
    }
}

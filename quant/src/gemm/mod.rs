//! The one f32 GEMM every CPU matmul in Nibble goes through (`matrixmultiply`, multithreaded,
//! arbitrary strides so transposes are free), behind a small safe wrapper.
//!
//! Threads: `matrixmultiply` reads `MATMUL_NUM_THREADS` (default: all cores).
//!
//! [`bf16`] is the BF16 GEMM (BF16 operands, FP32 accumulation) of the quantized recipes, on
//! the AMX-BF16 tile unit or the AVX512-BF16 dot-product instruction where the CPU has one.

#[cfg(target_arch = "x86_64")]
mod amx;
pub mod bf16;
#[cfg(target_arch = "x86_64")]
mod dpbf16;
pub(crate) mod pack;
#[cfg(target_arch = "x86_64")]
mod pack_avx512;

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
    // SAFETY: the views were checked to lie inside their slices, `c` holds exactly m*n
    // elements with row stride n, and `c` does not alias `a` or `b` (it is borrowed mutably).
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            alpha,
            a.data.as_ptr(),
            a.row_stride as isize,
            a.col_stride as isize,
            b.data.as_ptr(),
            b.row_stride as isize,
            b.col_stride as isize,
            beta,
            c.as_mut_ptr(),
            n as isize,
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

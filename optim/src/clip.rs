//! Global gradient-norm clipping.

use rayon::prelude::*;

use crate::error::OptimError;
use crate::group::{CHUNK, DEFAULT_PARALLEL_THRESHOLD};

/// The global L2 norm of all gradients, as if they were one vector.
///
/// Squares are accumulated in f64 over fixed 16K-element chunks whose partial sums are added in
/// order, so the result is exact to f32 rounding for any realistic size and identical whether or not
/// the rayon pool is used. f64 cannot overflow here, so the norm is finite exactly when every
/// gradient element is finite.
///
/// ```
/// let (a, b) = (vec![3.0f32], vec![0.0f32, 4.0]);
/// assert_eq!(optim::grad_norm(&[&a[..], &b[..]]), 5.0);
/// ```
pub fn grad_norm<G: AsRef<[f32]> + Sync>(grads: &[G]) -> f32 {
    let total: usize = grads.iter().map(|g| g.as_ref().len()).sum();
    let chunks = grads.iter().flat_map(|g| g.as_ref().chunks(CHUNK));
    let sum: f64 = if total >= DEFAULT_PARALLEL_THRESHOLD {
        let chunks: Vec<&[f32]> = chunks.collect();
        let partial: Vec<f64> = chunks.par_iter().map(|c| sum_squares(c)).collect();
        partial.iter().sum()
    } else {
        chunks.map(sum_squares).sum()
    };
    sum.sqrt() as f32
}

/// Sum of squares with eight independent f64 accumulators (vectorises, fixed order).
fn sum_squares(x: &[f32]) -> f64 {
    let mut acc = [0.0f64; 8];
    let mut it = x.chunks_exact(8);
    for c in &mut it {
        for (a, &v) in acc.iter_mut().zip(c) {
            let v = v as f64;
            *a += v * v;
        }
    }
    for (a, &v) in acc.iter_mut().zip(it.remainder()) {
        let v = v as f64;
        *a += v * v;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// The factor that clips a gradient of norm `norm` to `max_norm`, computed as
/// `torch.nn.utils.clip_grad_norm_` does, in f32: `min(1, max_norm / (norm + 1e-6))`, where the
/// division is PyTorch's `scalar / tensor`, i.e. `(1 / (norm + 1e-6)) * max_norm`.
///
/// A NaN or infinite `norm` gives [`OptimError::NonFiniteGradNorm`]; a `max_norm` that is not finite
/// and positive gives [`OptimError::InvalidHyperparameter`].
///
/// ```
/// use optim::{clip_coefficient, OptimError};
///
/// assert_eq!(clip_coefficient(0.5, 1.0), Ok(1.0));
/// assert_eq!(clip_coefficient(4.0, 1.0), Ok(1.0 / (4.0 + 1e-6)));
/// assert!(matches!(clip_coefficient(f32::NAN, 1.0), Err(OptimError::NonFiniteGradNorm { .. })));
/// ```
pub fn clip_coefficient(norm: f32, max_norm: f32) -> Result<f32, OptimError> {
    if !(max_norm.is_finite() && max_norm > 0.0) {
        return Err(OptimError::InvalidHyperparameter {
            name: "max_norm",
            value: max_norm as f64,
            reason: "must be finite and > 0",
        });
    }
    if !norm.is_finite() {
        return Err(OptimError::NonFiniteGradNorm { norm });
    }
    Ok(((1.0 / (norm + 1e-6)) * max_norm).min(1.0))
}

/// Scales all gradients in place so that their global L2 norm is at most `max_norm`, and returns the
/// norm before clipping (as `torch.nn.utils.clip_grad_norm_`).
///
/// If the norm is NaN or infinite, the gradients are left untouched and
/// [`OptimError::NonFiniteGradNorm`] is returned: skip the optimizer step. To clip without writing
/// to the gradients, use [`grad_norm`] + [`clip_coefficient`] and pass the coefficient to
/// [`AdamW::step_scaled`](crate::AdamW::step_scaled); the result is bit-identical.
///
/// ```
/// use optim::{clip_grad_norm, OptimError};
///
/// let (mut a, mut b) = (vec![3.0f32], vec![0.0f32, 4.0]);
/// let norm = clip_grad_norm(&mut [&mut a[..], &mut b[..]], 1.0)?;
/// assert_eq!(norm, 5.0);
/// assert!((a[0] - 0.6).abs() < 1e-6 && (b[1] - 0.8).abs() < 1e-6);
///
/// let mut bad = vec![f32::INFINITY, 1.0];
/// let err = clip_grad_norm(&mut [&mut bad[..]], 1.0).unwrap_err();
/// assert_eq!(err, OptimError::NonFiniteGradNorm { norm: f32::INFINITY });
/// assert_eq!(bad[1], 1.0); // untouched
/// # Ok::<(), OptimError>(())
/// ```
pub fn clip_grad_norm(grads: &mut [&mut [f32]], max_norm: f32) -> Result<f32, OptimError> {
    let norm = grad_norm(grads);
    let coef = clip_coefficient(norm, max_norm)?;
    if coef < 1.0 {
        let total: usize = grads.iter().map(|g| g.len()).sum();
        let scale = |c: &mut [f32]| c.iter_mut().for_each(|x| *x *= coef);
        if total >= DEFAULT_PARALLEL_THRESHOLD {
            let mut chunks: Vec<&mut [f32]> =
                grads.iter_mut().flat_map(|g| g.chunks_mut(CHUNK)).collect();
            chunks.par_iter_mut().for_each(|c| scale(c));
        } else {
            grads.iter_mut().for_each(|g| scale(g));
        }
    }
    Ok(norm)
}

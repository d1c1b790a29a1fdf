//! Optimizers for Nibble, over plain f32 parameter slices.
//!
//! * [`AdamW`]: decoupled weight decay and bias correction on FP32 master weights, reproducing
//!   PyTorch's `torch.optim.AdamW` arithmetic; per-group weight decay and learning-rate scale.
//! * [`Sgd`]: momentum, dampening, Nesterov, L2 weight decay (as `torch.optim.SGD`).
//! * [`clip_grad_norm`], [`grad_norm`], [`clip_coefficient`]: global L2 clipping that reports a
//!   NaN/Inf norm as [`OptimError::NonFiniteGradNorm`] instead of applying it.
//! * [`LrSchedule`]: constant, linear warmup + cosine, warmup-stable-decay.
//! * `save_state` / `load_state` / `from_state`: versioned, checksummed bytes for exact resume.
//!
//! The crate knows nothing of tensors: a model is a list of [`ParamSpec`]s (length and group id),
//! and every step receives the parameters and gradients as slices in that order.
//!
//! ```
//! use optim::{clip_coefficient, grad_norm, AdamW, AdamWConfig, LrSchedule, ParamGroup, ParamSpec};
//!
//! let groups = [ParamGroup::new(0.1, 1.0), ParamGroup::no_decay()];
//! let specs = [ParamSpec::new(4, 0), ParamSpec::new(2, 1)];
//! let cfg = AdamWConfig { beta2: 0.95, ..AdamWConfig::default() };
//! let mut opt = AdamW::with_groups(cfg, &groups, &specs)?;
//! let schedule = LrSchedule::warmup_cosine(3e-4, 3e-5, 10, 100)?;
//!
//! let (mut w, mut n) = (vec![0.5f32; 4], vec![1.0f32; 2]);
//! for step in 0..3 {
//!     let (gw, gn) = (vec![0.3f32; 4], vec![-0.1f32; 2]);
//!     let grads = [&gw[..], &gn[..]];
//!     // clip to norm 1 without writing to the gradients; a NaN/Inf norm is an error: skip the step
//!     let Ok(coef) = clip_coefficient(grad_norm(&grads), 1.0) else { continue };
//!     opt.step_scaled(&mut [&mut w[..], &mut n[..]], &grads, schedule.lr(step), coef)?;
//! }
//! assert_eq!(opt.step_count(), 3);
//! let resumed = AdamW::from_state(&opt.save_state())?;
//! assert_eq!(resumed.exp_avg_sq(1), opt.exp_avg_sq(1));
//! # Ok::<(), optim::OptimError>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod adamw;
mod clip;
mod error;
mod group;
mod schedule;
mod sgd;
pub mod state;

pub use adamw::{AdamW, AdamWConfig};
pub use clip::{clip_coefficient, clip_grad_norm, grad_norm};
pub use error::{OptimError, StateError};
pub use group::{ParamGroup, ParamSpec};
pub use schedule::{DecayShape, LrSchedule};
pub use sgd::{Sgd, SgdConfig};
pub use state::crc32;

/// The README's examples are compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

//! # autograd
//!
//! A small, fast reverse-mode autograd for training transformers on the CPU: micrograd's
//! shape (a closure per op, run in reverse creation order) scaled up to tensors, with
//! llm.c-style explicit forward / backward kernel pairs, and a quantized linear op driven by a
//! [`quant::GemmPolicy`].
//!
//! * [`ParamStore`]: named parameters (value + accumulated gradient + per-linear quantizer
//!   state), export / import for checkpoints, the buffer pool.
//! * [`Graph`]: one step's tape. Ops are methods (`g.linear`, `g.rmsnorm`,
//!   `g.causal_attention`, …) returning [`Tensor`] handles; `g.backward(loss)` accumulates
//!   parameter gradients into the store. [`Graph::no_grad`] / [`Graph::set_grad_enabled`]
//!   for evaluation and sampling.
//! * [`gradcheck`]: the finite-difference check every op passes.
//! * [`Device`], [`Storage`], [`backend`]: where data lives. A store moved with
//!   [`ParamStore::to_device`] makes its graphs compute on a CUDA device
//!   ([`backend::DeviceBackend`]); ops without a CUDA kernel yet report
//!   [`Error::NoDeviceKernel`].
//!
//! ```
//! use autograd::{init, Graph, ParamStore};
//! use quant::GemmPolicy;
//!
//! // a one-layer softmax regression on 4 tokens
//! let mut ps = ParamStore::new();
//! let emb = ps.add("emb", &[8, 16], init::normal(8 * 16, 0.5, 1))?;
//! let w = ps.add("head", &[8, 16], init::normal(8 * 16, 0.1, 2))?;
//! let tokens = [1u32, 5, 2, 7];
//! let targets = [5u32, 2, 7, 1];
//! let mut losses = vec![];
//! for step in 0..20 {
//!     let mut g = Graph::new(&mut ps).with_rng(0, step);
//!     let table = g.param(emb)?;
//!     let x = g.embedding(&tokens, &[4], table)?;
//!     let w = g.param(w)?;
//!     let logits = g.linear(x, w, None, &GemmPolicy::FP32, 0)?;
//!     let loss = g.cross_entropy(logits, &targets, None)?;
//!     losses.push(g.item(loss)?);
//!     g.backward(loss)?;
//!     drop(g);
//!     // plain SGD
//!     let (values, grads) = ps.params_and_grads();
//!     for (v, g) in values.into_iter().zip(grads) {
//!         v.iter_mut().zip(g).for_each(|(v, g)| *v -= 0.5 * g);
//!     }
//!     ps.zero_grad();
//! }
//! assert!(losses[19] < 0.5 * losses[0]);
//! # Ok::<(), autograd::Error>(())
//! ```
#![warn(missing_docs)]

pub mod backend;
mod cpu;
mod error;
pub mod gradcheck;
mod graph;
pub mod init;
pub mod ops;
mod param;
mod pool;
mod quant_state;
mod shape;
mod storage;

/// The README's code blocks, compiled and run as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

pub use error::{Error, Result};
pub use graph::{Graph, OpProfile, OpTiming, Tensor};
pub use ops::attention_products::AttentionProducts;
pub use ops::attention_qkv::QkvAttention;
pub use param::{NamedTensor, ParamId, ParamStore};
pub use pool::with_polling_workers;
pub use quant_state::{gemm_stream, LinearQuantState, OperandRole, MAX_LAYER_STREAM, MAX_STEP};
pub use shape::{Shape, MAX_RANK};
pub use storage::{CpuBuf, Device, Storage};

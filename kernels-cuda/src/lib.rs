//! # kernels-cuda
//!
//! The GPU half of Nibble's quantization stack: CUDA kernels that reproduce `quant`'s CPU
//! quantizers **bit for bit**, and cuBLASLt GEMMs.
//!
//! * **Kernels** (`cuda/*.cu`, compiled by `cargo xtask ptx` into committed PTX that is
//!   embedded with `include_str!`; no build script, no CUDA toolkit needed to build):
//!   NVFP4 (1x16 blocks and 16x16 tiles, rowwise and columnwise, the 16-point random Hadamard
//!   transform with post-RHT amax, nearest-even and stochastic rounding from the same
//!   Philox4x32-10 stream as `quant`), MX (MXFP8 E4M3/E5M2 and MXFP4, scale rules FLOOR,
//!   RCEIL, CEIL, EVEN, stochastic rounding, 3/4 prescale, RHT), per-tensor FP8 (E4M3/E5M2,
//!   current or delayed scaling), amax reductions, dequantization, and a fused cast+transpose
//!   that writes the rowwise and columnwise copies from one read of the input
//!   ([`GpuContext::cast_transpose`]).
//! * **GEMMs** ([`GpuContext::gemm_bf16`], [`GpuContext::gemm_f32`] through cudarc's safe
//!   cuBLASLt API; [`GpuContext::gemm_fp8`] natively on Hopper; NVFP4 / MX emulated on Hopper
//!   by exact dequantization to BF16 and a BF16 GEMM with the per-tensor factor in the
//!   epilogue ([`GpuContext::gemm_emulated`]); the Blackwell block-scaled path
//!   ([`GpuContext::gemm_block_scaled`], `VEC16_UE4M3` / `VEC32_UE8M0` with the 128x4
//!   swizzled scales of [`swizzle`]) selected only on compute capability 10.x).
//! * **Probe** ([`probe()`]): [`Gpu::Unavailable`] with a reason on machines without a driver
//!   or device (CI), never a panic.
//!
//! The quantizers implement `quant`'s one interface, [`quant::QuantizerBackend`], for
//! [`GpuContext`]: the same validated [`quant::Quantizer`] (settings, usage, random key; no
//! validation of their own beyond the GPU's limits) over a [`DeviceMatrix`], producing a
//! [`DeviceQuantized`] whose [`DeviceQuantized::to_host`] is a [`quant::QuantizedTensor`]
//! with the same layout; the GPU tests compare them byte for byte. The emulator
//! (`emu::Emu`, feature `emu`) implements it for NVFP4 on host buffers.
//!
//! ```no_run
//! use kernels_cuda::{probe, Gpu, GpuContext, KernelError};
//! use quant::{GemmPolicy, MatRef, QuantState, Quantizer, QuantizerBackend, RngKey, Usage};
//!
//! fn main() -> Result<(), KernelError> {
//!     let Gpu::Ready(ctx) = probe() else { return Ok(()) }; // never panics
//!     let gpu = GpuContext::new(ctx)?; // loads sm_90a / sm_100a / compute_90 PTX
//!     let (rows, cols) = (256, 512);
//!     let host: Vec<f32> = (0..rows * cols).map(|i| (i as f32 * 0.01).sin()).collect();
//!     let x = gpu.upload(&host, rows, cols)?;
//!     let p = GemmPolicy::nvfp4_paper();
//!     let key = |stream| RngKey { seed: 1, stream };
//!     let mut st = QuantState::new();
//!     // One quantizer, two backends, the same bytes.
//!     let xq = Quantizer::new(p.fprop.a, Usage::Rowwise)?.with_key(key(0));
//!     let t = gpu.quantize(&xq, &x, &mut st)?;
//!     assert_eq!(t.to_host()?, xq.quantize(MatRef::new(&host, rows, cols)?, &mut st)?);
//!     // dY: rowwise 1x16 SR (Dgrad) and columnwise 1x16 SR + RHT (Wgrad) from one read.
//!     let dgrad = Quantizer::new(p.dgrad.a, Usage::Rowwise)?.with_key(key(1));
//!     let wgrad = Quantizer::new(p.wgrad.a, Usage::Columnwise)?.with_key(key(2));
//!     let (_dy_row, _dy_col) = gpu.cast_transpose(&x, &dgrad, &wgrad, &mut st)?;
//!     // FP8 native; NVFP4 / MX emulated (sm_90) or block-scaled (sm_100).
//!     let _y = gpu.gemm_quantized(&t, &t)?;
//!     Ok(())
//! }
//! ```
#![warn(missing_docs)]

#[doc(hidden)]
pub mod abi;
#[cfg(feature = "emu")]
pub mod emu;
mod gemm;
mod gpu;
mod gpu_train;
pub mod probe;
pub mod ptx;
mod quantize;
pub mod swizzle;
pub mod train;
mod train_attn;
pub mod train_bmm;
pub mod train_quant;
pub mod train_tc;

pub use gpu::{DeviceMatrix, GpuContext};
pub use gpu_train::{train_kernel_names, GpuBuf};
pub use probe::{probe, Gpu};
pub use quantize::{DeviceQuantized, QuantJob};

/// Why a GPU operation failed.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// A CUDA driver call failed.
    #[error("CUDA driver: {0}")]
    Driver(cudarc::driver::DriverError),
    /// The driver could not load (JIT-compile) a PTX module; `log` holds the JIT compiler's
    /// error and info logs (empty when the driver gave none).
    #[error("loading the {module} PTX ({arch}) failed: {error}; JIT log: {log}")]
    Load {
        /// The module (`cuda/<module>.cu`).
        module: &'static str,
        /// The PTX target tag (`sm_90a`, `sm_100a`, `compute_90`).
        arch: &'static str,
        /// The driver's error.
        error: cudarc::driver::DriverError,
        /// The JIT compiler's logs.
        log: String,
    },
    /// A cuBLASLt call failed (e.g. `CUBLAS_STATUS_NOT_SUPPORTED` from the heuristic query).
    #[error("cuBLASLt: {0}")]
    Blas(cudarc::cublaslt::result::CublasError),
    /// The same configuration or shape error `quant` reports.
    #[error(transparent)]
    Quant(#[from] quant::QuantError),
    /// The input holds NaN or ±Inf (`quant` rejects it as well, with the element's index).
    #[error("non-finite input (amax bits {0:#010x})")]
    NonFinite(u32),
    /// A size, length or index that does not fit the op (named in the message).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The device ran out of memory allocating `bytes`: use a smaller batch or model, or free
    /// device memory held by other processes.
    #[error("out of GPU memory allocating {bytes} bytes: reduce the batch size or model, or free device memory")]
    OutOfMemory {
        /// The failed request.
        bytes: usize,
    },
    /// A configuration the GPU path does not implement (named in the message).
    #[error("not supported on the GPU path: {0}")]
    Unsupported(String),
}

// Not `#[from]`: that would also return the driver's (cuBLASLt's) error as `source()`, and
// reporters that print causes (`anyhow`'s `{:#}`) would say it twice.
impl From<cudarc::driver::DriverError> for KernelError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        KernelError::Driver(e)
    }
}

impl From<cudarc::cublaslt::result::CublasError> for KernelError {
    fn from(e: cudarc::cublaslt::result::CublasError) -> Self {
        KernelError::Blas(e)
    }
}

/// `Result` with [`KernelError`].
pub type Result<T, E = KernelError> = std::result::Result<T, E>;

//! Errors at the device boundary.

use kernels_cuda::KernelError;

/// Why a backend call failed. Each variant says what to do.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// No usable CUDA device: no driver (libcuda), no GPU, or one older than compute
    /// capability 9.0.
    #[error("no CUDA device: {reason}; run on a machine with an NVIDIA driver and a GPU of compute capability 9.0 or later, or use the CPU backend (--device cpu)")]
    NoDevice {
        /// What the probe found.
        reason: String,
    },
    /// The device ran out of memory.
    #[error("out of GPU memory allocating {bytes} bytes: reduce the batch size or model size, or free device memory")]
    OutOfMemory {
        /// The failed request.
        bytes: usize,
    },
    /// The driver could not JIT-compile a kernel module (typically a driver older than the PTX
    /// ISA of CUDA 13.0: update the NVIDIA driver to R580 or later).
    #[error("loading the {module} kernels ({arch}) failed: {error}; update the NVIDIA driver (R580+ JITs CUDA 13.0 PTX); JIT log: {log}")]
    PtxLoad {
        /// The kernel module.
        module: &'static str,
        /// The PTX target.
        arch: &'static str,
        /// The driver's error.
        error: String,
        /// The JIT compiler's log.
        log: String,
    },
    /// A length or shape that does not fit the op.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Any other device error.
    #[error(transparent)]
    Kernel(KernelError),
}

impl From<KernelError> for BackendError {
    fn from(e: KernelError) -> Self {
        match e {
            KernelError::OutOfMemory { bytes } => BackendError::OutOfMemory { bytes },
            KernelError::InvalidArgument(m) => BackendError::InvalidArgument(m),
            KernelError::Load {
                module,
                arch,
                error,
                log,
            } => BackendError::PtxLoad {
                module,
                arch,
                error: error.to_string(),
                log,
            },
            e => BackendError::Kernel(e),
        }
    }
}

//! [`Launcher`] for [`GpuContext`]: the training kernels' modules are JIT-loaded on first use,
//! buffers are `CudaSlice`s on the context's stream, and an allocation the device cannot satisfy
//! is [`KernelError::OutOfMemory`].

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::sys::CUresult;
use cudarc::driver::{
    CudaFunction, CudaSlice, DevicePtr, DriverError, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use crate::abi::Args;
use crate::gpu::{jit_log, GpuContext, THREADS};
use crate::ptx::Module;
use crate::train::{Arg, Elem, Launcher};
use crate::train_tc::{Bf16Gemm, Bf16GemmPtrs};
use crate::{KernelError, Result};

/// A device buffer of `len` elements (at least one is allocated).
#[derive(Debug)]
pub struct GpuBuf<T> {
    /// The allocation (`max(len, 1)` elements).
    pub data: CudaSlice<T>,
    len: usize,
}

impl<T> Drop for GpuBuf<T> {
    /// Makes the buffer's context current on the dropping thread before the allocation is
    /// freed: cudarc frees without binding it, so a buffer dropped on a thread that never
    /// launched anything (a pool released from another thread, a test thread) failed with
    /// `CUDA_ERROR_INVALID_CONTEXT`, which the next launch on the context then reported.
    fn drop(&mut self) {
        // An error here leaves the free to report it through the context, as before.
        let _ = self.data.context().bind_to_thread();
    }
}

/// The training kernels by name.
pub(crate) struct TrainKernels {
    functions: HashMap<&'static str, CudaFunction>,
}

const TRAIN_MODULES: [(Module, &[&str]); 12] = [
    // the quantizers of the device linear layer (`train_quant::QuantOps`)
    (
        crate::ptx::NVFP4,
        &[
            "nb_amax",
            "nb_amax_rht_col",
            "nb_nvfp4_quantize",
            "nb_nvfp4_dequantize",
            "nb_nvfp4_to_bf16",
            "nb_f32_to_bf16",
        ],
    ),
    (
        crate::ptx::MX,
        &["nb_mx_quantize", "nb_mx_dequantize", "nb_mx_to_bf16"],
    ),
    (crate::ptx::FP8, &["nb_fp8_quantize", "nb_fp8_dequantize"]),
    (
        crate::ptx::ACTIVATION,
        &["nb_act_fwd", "nb_act_bwd", "nb_swiglu_fwd", "nb_swiglu_bwd"],
    ),
    (
        crate::ptx::ATTENTION,
        &[
            "nb_attn_fwd",
            "nb_attn_delta",
            "nb_attn_bwd_dq",
            "nb_attn_bwd_dkdv",
            "nb_attn_softmax_bf16",
            "nb_attn_grad_bf16",
        ],
    ),
    (
        crate::ptx::CROSS_ENTROPY,
        &["nb_ce_fwd", "nb_ce_loss", "nb_ce_bwd"],
    ),
    (
        crate::ptx::ELEMENTWISE,
        &[
            "nb_add",
            "nb_mul",
            "nb_scale",
            "nb_copy_or_add",
            "nb_fill_scaled",
            "nb_round_bf16",
            "nb_sum_rows_part",
            "nb_sum_rows_finish",
            "nb_sum_f64_part",
            "nb_sum_f64_finish",
            "nb_permute4",
            "nb_cols_get",
            "nb_cols_add",
        ],
    ),
    (
        crate::ptx::EMBEDDING,
        &["nb_embedding_fwd", "nb_embedding_bwd"],
    ),
    (crate::ptx::GEMM, &["nb_sgemm"]),
    (
        crate::ptx::NORM,
        &[
            "nb_rms_fwd",
            "nb_ln_fwd",
            "nb_norm_bwd_dx",
            "nb_norm_bwd_params",
        ],
    ),
    (
        crate::ptx::OPTIM,
        &["nb_sumsq_chunks", "nb_norm_finish", "nb_adamw"],
    ),
    (crate::ptx::ROPE, &["nb_rope"]),
];

/// Every training kernel as `(module, kernel)` (tests check the PTX exports each).
pub fn train_kernel_names() -> impl Iterator<Item = (&'static str, &'static str)> {
    TRAIN_MODULES
        .iter()
        .flat_map(|(m, names)| names.iter().map(move |n| (m.name, *n)))
}

fn oom_or(e: DriverError, bytes: usize) -> KernelError {
    if e.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        KernelError::OutOfMemory { bytes }
    } else {
        KernelError::Driver(e)
    }
}

impl GpuContext {
    fn train_kernels(&self) -> Result<Arc<TrainKernels>> {
        let mut slot = self.train.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = slot.as_ref() {
            return Ok(k.clone());
        }
        let mut functions = HashMap::new();
        for (m, names) in TRAIN_MODULES {
            let ptx = m.ptx(self.arch);
            let module =
                self.ctx
                    .load_module(Ptx::from_src(ptx))
                    .map_err(|error| KernelError::Load {
                        module: m.name,
                        arch: self.arch.tag(),
                        error,
                        log: jit_log(&self.ctx, ptx),
                    })?;
            for &n in names {
                functions.insert(n, module.load_function(n)?);
            }
        }
        let k = Arc::new(TrainKernels { functions });
        *slot = Some(k.clone());
        Ok(k)
    }
}

impl GpuContext {
    /// A buffer of `n` elements (at least one allocated) from `alloc`; when the device is out
    /// of memory, the pool keeps freed memory (`keep_freed_memory`): give it back, try once more.
    fn buffer<T: Elem>(
        &self,
        n: usize,
        alloc: impl Fn(usize) -> std::result::Result<CudaSlice<T>, cudarc::driver::DriverError>,
    ) -> Result<GpuBuf<T>> {
        let len = n.max(1);
        let data = match alloc(len) {
            Err(e) if e.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                self.trim_pool();
                alloc(len)
            }
            r => r,
        }
        .map_err(|e| oom_or(e, len * std::mem::size_of::<T>()))?;
        Ok(GpuBuf { data, len: n })
    }
}

impl Launcher for GpuContext {
    type Buf<T: Elem> = GpuBuf<T>;

    fn zeros<T: Elem>(&self, n: usize) -> Result<GpuBuf<T>> {
        self.buffer(n, |len| self.stream.alloc_zeros::<T>(len))
    }

    fn scratch<T: Elem>(&self, n: usize) -> Result<GpuBuf<T>> {
        // SAFETY: the memory is handed out uninitialised: `scratch`'s contract is that every
        // element is written (by a kernel or a GEMM) before anything reads it.
        self.buffer(n, |len| unsafe { self.stream.alloc::<T>(len) })
    }

    fn upload<T: Elem>(&self, data: &[T]) -> Result<GpuBuf<T>> {
        let mut b = <Self as Launcher>::zeros::<T>(self, data.len())?;
        if !data.is_empty() {
            self.stream.memcpy_htod(data, &mut b.data)?;
        }
        Ok(b)
    }

    fn download<T: Elem>(&self, b: &GpuBuf<T>) -> Result<Vec<T>> {
        let mut v = self.stream.clone_dtoh(&b.data)?;
        v.truncate(b.len);
        Ok(v)
    }

    fn len<T: Elem>(&self, b: &GpuBuf<T>) -> usize {
        b.len
    }

    fn ptr<T: Elem>(&self, b: &GpuBuf<T>) -> u64 {
        // Every launch goes to this same stream, so stream order covers the dependency the
        // dropped sync guard would record.
        let (p, _sync) = b.data.device_ptr(&self.stream);
        p
    }

    fn grid_stride_blocks(&self, n: usize) -> u32 {
        n.div_ceil(THREADS as usize).clamp(1, 132 * 32) as u32
    }

    unsafe fn launch(&self, kernel: &'static str, grid: (u32, u32), args: &[Arg]) -> Result<()> {
        if grid.0 == 0 || grid.1 == 0 {
            return Ok(());
        }
        let k = self.train_kernels()?;
        let f = k
            .functions
            .get(kernel)
            .ok_or_else(|| KernelError::Unsupported(format!("no kernel {kernel}")))?;
        let mut b = self.stream.launch_builder(f);
        for a in args {
            match a {
                Arg::Ptr(p) | Arg::U64(p) => b.arg(p),
                Arg::I32(v) => b.arg(v),
                Arg::I64(v) => b.arg(v),
                Arg::F32(v) => b.arg(v),
                Arg::F64(v) => b.arg(v),
                Arg::AdamW(c) => b.arg(c),
                Arg::Quant(Args::Nvfp4(a)) => b.arg(a),
                Arg::Quant(Args::Mx(a)) => b.arg(a),
                Arg::Quant(Args::Fp8(a)) => b.arg(a),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: (grid.0, grid.1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the caller guarantees the argument list matches and the pointers are valid.
        unsafe { b.launch(cfg)? };
        Ok(())
    }

    unsafe fn launch_gemm_bf16(&self, g: &Bf16Gemm, p: Bf16GemmPtrs) -> Result<()> {
        self.lt_matmul(crate::gemm::LtCall::training(g, p))
    }
}

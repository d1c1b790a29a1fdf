//! The GPU context: loaded PTX modules, the stream, and device buffers.

use std::sync::{Arc, Mutex};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use crate::ptx::{Arch, Module};
use crate::{KernelError, Result};

/// Threads per block of every kernel (the tile kernels are written for exactly 256).
pub(crate) const THREADS: u32 = 256;

/// A row-major `[rows, cols]` f32 matrix in device memory.
#[derive(Debug)]
pub struct DeviceMatrix {
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// `rows * cols` elements.
    pub data: CudaSlice<f32>,
}

/// Every kernel entry point.
pub(crate) struct Kernels {
    pub amax: CudaFunction,
    pub amax_rht_col: CudaFunction,
    pub nvfp4_quantize: CudaFunction,
    pub nvfp4_dequantize: CudaFunction,
    pub nvfp4_to_bf16: CudaFunction,
    pub f32_to_bf16: CudaFunction,
    pub swizzle_scales: CudaFunction,
    pub mx_quantize: CudaFunction,
    pub mx_dequantize: CudaFunction,
    pub mx_to_bf16: CudaFunction,
    pub fp8_quantize: CudaFunction,
    pub fp8_dequantize: CudaFunction,
}

/// cuBLASLt state, created on first use (so that quantization works where cuBLASLt is not
/// installed).
pub(crate) struct Blas {
    pub safe: cudarc::cublaslt::CudaBlasLT,
    pub handle: cudarc::cublaslt::sys::cublasLtHandle_t,
    pub workspace: CudaSlice<u8>,
}

// SAFETY: the raw handle is only used while the `Mutex` in `GpuContext` is held (or from the
// thread that owns the `CudaBlasLT`, which is itself Send + Sync).
unsafe impl Send for Blas {}

impl Drop for Blas {
    /// The workspace's context made current before cudarc frees it (cudarc does not bind it:
    /// see `GpuBuf`'s `Drop`).
    fn drop(&mut self) {
        let _ = self.workspace.context().bind_to_thread();
    }
}

impl Drop for DeviceMatrix {
    /// The context made current before cudarc frees the data (see `GpuBuf`'s `Drop`).
    fn drop(&mut self) {
        let _ = self.data.context().bind_to_thread();
    }
}

/// A CUDA context on one device with Nibble's kernels loaded.
pub struct GpuContext {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) arch: Arch,
    pub(crate) cc: (i32, i32),
    pub(crate) k: Kernels,
    pub(crate) blas: Mutex<Option<Blas>>,
    /// The training-step kernels, loaded on first use (`gpu_train.rs`).
    pub(crate) train: Mutex<Option<Arc<crate::gpu_train::TrainKernels>>>,
    name: String,
}

impl std::fmt::Debug for GpuContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuContext")
            .field("name", &self.name)
            .field("compute_capability", &self.cc)
            .field("ptx", &self.arch.tag())
            .finish()
    }
}

impl GpuContext {
    /// Loads the PTX for the device's architecture ([`Arch::for_device`]) into `ctx`.
    ///
    /// # Errors
    /// [`KernelError::Unsupported`] below compute capability 9.0; driver errors (e.g. a PTX
    /// version the driver cannot JIT).
    pub fn new(ctx: Arc<CudaContext>) -> Result<GpuContext> {
        let cc = ctx.compute_capability()?;
        let arch = Arch::for_device(cc.0, cc.1).ok_or_else(|| {
            KernelError::Unsupported(format!(
                "compute capability {}.{}: the PTX targets 9.0 and later",
                cc.0, cc.1
            ))
        })?;
        let name = ctx.name().unwrap_or_else(|_| "?".into());
        let load = |m: &Module| {
            ctx.load_module(Ptx::from_src(m.ptx(arch)))
                .map_err(|error| KernelError::Load {
                    module: m.name,
                    arch: arch.tag(),
                    error,
                    log: jit_log(&ctx, m.ptx(arch)),
                })
        };
        let nvfp4 = load(&crate::ptx::NVFP4)?;
        let mx = load(&crate::ptx::MX)?;
        let fp8 = load(&crate::ptx::FP8)?;
        let k = Kernels {
            amax: nvfp4.load_function("nb_amax")?,
            amax_rht_col: nvfp4.load_function("nb_amax_rht_col")?,
            nvfp4_quantize: nvfp4.load_function("nb_nvfp4_quantize")?,
            nvfp4_dequantize: nvfp4.load_function("nb_nvfp4_dequantize")?,
            nvfp4_to_bf16: nvfp4.load_function("nb_nvfp4_to_bf16")?,
            f32_to_bf16: nvfp4.load_function("nb_f32_to_bf16")?,
            swizzle_scales: nvfp4.load_function("nb_swizzle_scales")?,
            mx_quantize: mx.load_function("nb_mx_quantize")?,
            mx_dequantize: mx.load_function("nb_mx_dequantize")?,
            mx_to_bf16: mx.load_function("nb_mx_to_bf16")?,
            fp8_quantize: fp8.load_function("nb_fp8_quantize")?,
            fp8_dequantize: fp8.load_function("nb_fp8_dequantize")?,
        };
        let stream = ctx.default_stream();
        keep_freed_memory(&ctx);
        Ok(GpuContext {
            ctx,
            stream,
            arch,
            cc,
            k,
            blas: Mutex::new(None),
            train: Mutex::new(None),
            name,
        })
    }

    /// Returns the freed memory the device's stream-ordered pool keeps (see
    /// [`keep_freed_memory`]) to the driver: what an allocation that failed for lack of memory
    /// tries before it fails for good. Errors are ignored (nothing to give back).
    pub(crate) fn trim_pool(&self) {
        if !self.ctx.has_async_alloc() || self.ctx.bind_to_thread().is_err() {
            return;
        }
        // SAFETY: the device of a live context; the default pool is never destroyed.
        unsafe {
            if let Ok(pool) =
                cudarc::driver::result::device::get_default_mem_pool(self.ctx.cu_device())
            {
                cudarc::driver::result::mem_pool::trim_to(pool, 0).ok();
            }
        }
    }

    /// The device name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Compute capability `(major, minor)`.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.cc
    }

    /// The PTX target that was loaded.
    pub fn arch(&self) -> Arch {
        self.arch
    }

    /// The CUDA context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream every operation of this context runs on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Waits for all queued work.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize()?;
        Ok(())
    }

    /// Copies a row-major `[rows, cols]` matrix to the device.
    ///
    /// # Errors
    /// A shape mismatch (as `quant` reports it) or a driver error.
    pub fn upload(&self, x: &[f32], rows: usize, cols: usize) -> Result<DeviceMatrix> {
        if rows.checked_mul(cols) != Some(x.len()) {
            return Err(
                quant::QuantError::Format(fp_formats::FormatError::ShapeMismatch {
                    rows,
                    cols,
                    expected: rows.saturating_mul(cols),
                    got: x.len(),
                })
                .into(),
            );
        }
        Ok(DeviceMatrix {
            rows,
            cols,
            data: self.stream.clone_htod(x)?,
        })
    }

    /// Copies a device buffer to the host (synchronizes).
    pub fn download<T: cudarc::driver::DeviceRepr + Default + Clone>(
        &self,
        s: &CudaSlice<T>,
    ) -> Result<Vec<T>> {
        Ok(self.stream.clone_dtoh(s)?)
    }

    /// An uninitialised device buffer of `n` elements (`n` may be 0: one element is
    /// allocated), for outputs that a kernel or cuBLASLt (with `beta = 0`) writes in full.
    ///
    /// # Safety
    /// Every element must be written before it is read.
    pub(crate) unsafe fn uninit<T: cudarc::driver::DeviceRepr>(
        &self,
        n: usize,
    ) -> Result<CudaSlice<T>> {
        Ok(self.stream.alloc::<T>(n.max(1))?)
    }

    /// A zeroed device buffer of `n` elements (`n` may be 0: one element is allocated).
    pub(crate) fn zeros<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
        &self,
        n: usize,
    ) -> Result<CudaSlice<T>> {
        Ok(self.stream.alloc_zeros::<T>(n.max(1))?)
    }

    /// The tensor's absolute maximum, NaN-ignoring (CUDA `fmaxf`, like `quant`'s amax).
    pub fn amax(&self, x: &DeviceMatrix) -> Result<f32> {
        let mut out = self.zeros::<u32>(4)?;
        self.launch_amax(&x.data, x.rows * x.cols, &mut out)?;
        let bits = self.download(&out)?;
        Ok(f32::from_bits(bits[0]))
    }

    pub(crate) fn launch_amax(
        &self,
        x: &CudaSlice<f32>,
        n: usize,
        out: &mut CudaSlice<u32>,
    ) -> Result<()> {
        let n64 = n as u64;
        let mut b = self.stream.launch_builder(&self.k.amax);
        b.arg(x).arg(&n64).arg(out);
        // SAFETY: nb_amax(const float*, u64, u32*) reads n floats and writes out[0..2].
        unsafe { b.launch(grid_stride_cfg(n.div_ceil(4)))? };
        Ok(())
    }

    /// Converts f32 to BF16 with round-to-nearest-even (`fp_formats::round_to_bf16`).
    pub fn to_bf16(&self, x: &CudaSlice<f32>) -> Result<CudaSlice<half::bf16>> {
        let n = x.len();
        // SAFETY: nb_f32_to_bf16 writes all n elements.
        let mut out = unsafe { self.uninit::<half::bf16>(n)? };
        let n64 = n as u64;
        let mut b = self.stream.launch_builder(&self.k.f32_to_bf16);
        b.arg(x).arg(&n64).arg(&mut out);
        // SAFETY: nb_f32_to_bf16(const float*, u64, u16*) writes n elements.
        unsafe { b.launch(grid_stride_cfg(n))? };
        Ok(out)
    }

    /// Swizzles a `[rows, scale_cols]` block-scale matrix on the device into the 128x4-tile
    /// layout of [`crate::swizzle`] (zero padded).
    pub fn swizzle_scales(
        &self,
        scales: &CudaSlice<u8>,
        rows: usize,
        scale_cols: usize,
    ) -> Result<CudaSlice<u8>> {
        if scales.len() < rows * scale_cols {
            return Err(KernelError::Unsupported(
                "scale buffer shorter than rows * scale_cols".into(),
            ));
        }
        let (pr, pc) = crate::swizzle::swizzled_shape(rows, scale_cols);
        let mut out = self.zeros::<u8>(pr * pc)?;
        let (r, c) = (to_i32(rows)?, to_i32(scale_cols)?);
        let mut b = self.stream.launch_builder(&self.k.swizzle_scales);
        b.arg(scales).arg(&r).arg(&c).arg(&mut out);
        // SAFETY: nb_swizzle_scales(const u8*, int, int, u8*) writes inside the padded buffer.
        unsafe { b.launch(grid_stride_cfg(rows * scale_cols))? };
        Ok(out)
    }
}

/// The driver's JIT logs for a PTX module that failed to load: loads it once more through
/// `cuModuleLoadDataEx` with log buffers (cudarc's `load_module` passes none), so that a
/// rejected PTX says why. Never fails; returns what the driver wrote.
pub(crate) fn jit_log(ctx: &CudaContext, ptx: &str) -> String {
    use cudarc::driver::sys;
    use std::ffi::c_void;
    let Ok(src) = std::ffi::CString::new(ptx) else {
        return "PTX holds a NUL byte".into();
    };
    if ctx.bind_to_thread().is_err() {
        return String::new();
    }
    const LOG: usize = 1 << 16;
    let (mut err, mut info) = (vec![0u8; LOG], vec![0u8; LOG]);
    let mut opts = [
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        sys::CUjit_option::CU_JIT_INFO_LOG_BUFFER,
        sys::CUjit_option::CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
        sys::CUjit_option::CU_JIT_LOG_VERBOSE,
    ];
    // Option values are pointer-sized words: buffers by address, sizes and flags by value.
    let word = std::ptr::without_provenance_mut::<c_void>;
    let mut vals: [*mut c_void; 5] = [
        err.as_mut_ptr().cast(),
        word(LOG),
        info.as_mut_ptr().cast(),
        word(LOG),
        word(1),
    ];
    let mut module: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: the option arrays have 5 entries with values of the documented kinds; the log
    // buffers outlive the call; a module that loads after all is unloaded at once.
    let r = unsafe {
        sys::cuModuleLoadDataEx(
            &mut module,
            src.as_ptr().cast(),
            opts.len() as u32,
            opts.as_mut_ptr(),
            vals.as_mut_ptr(),
        )
    };
    if r == sys::CUresult::CUDA_SUCCESS && !module.is_null() {
        // SAFETY: loaded just above, used by nothing.
        unsafe { sys::cuModuleUnload(module) };
    }
    let text = |b: &[u8]| {
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        String::from_utf8_lossy(&b[..end]).trim().to_string()
    };
    let (e, i) = (text(&err), text(&info));
    format!("cuModuleLoadDataEx: {r:?}; error log: {e:?}; info log: {i:?}")
}

/// A 1D grid-stride launch over `n` work items.
pub(crate) fn grid_stride_cfg(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(THREADS as usize).clamp(1, 132 * 32) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A dimension as the kernels' `int`.
pub(crate) fn to_i32(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| KernelError::Unsupported(format!("dimension {v} exceeds i32")))
}

/// Keeps freed stream-ordered allocations in the device's default memory pool (release
/// threshold: unlimited) instead of the default threshold 0, which hands them back to the
/// driver at every synchronisation: a training step frees and allocates the same sizes every
/// step (BF16 GEMM operands, quantized codes and scales) and synchronises once per quantized
/// operand. An allocation that fails for lack of memory trims the pool and tries again
/// (`GpuContext::trim_pool`). Best effort: a driver without memory pools, or a failing call,
/// leaves the default.
fn keep_freed_memory(ctx: &CudaContext) {
    use cudarc::driver::{result, sys};
    if !ctx.has_async_alloc() || ctx.bind_to_thread().is_err() {
        return;
    }
    let mut threshold = u64::MAX;
    // SAFETY: the device of a live context; the attribute takes a u64.
    unsafe {
        if let Ok(pool) = result::device::get_default_mem_pool(ctx.cu_device()) {
            result::mem_pool::set_attribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                &mut threshold as *mut u64 as *mut std::ffi::c_void,
            )
            .ok();
        }
    }
}

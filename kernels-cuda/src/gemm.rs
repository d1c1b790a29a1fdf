//! GEMMs through cuBLASLt, all in Nibble's "TN" form: `out[M, N] = α · A[M, K] · B[N, K]ᵀ`
//! with row-major `A`, `B` (K contiguous) and a row-major `out`.
//!
//! cuBLASLt is column-major, so every call computes `outᵀ[N, M] = B · Aᵀ`: cuBLAS's "A" is our
//! `B` (a `K x N` column-major matrix, transposed), its "B" is our `A` (`K x M`, not
//! transposed), and its `N x M` column-major output is our row-major `[M, N]`. That is the
//! TN layout that FP8 and the block-scaled FP4/FP8 kernels require.
//!
//! * [`GpuContext::gemm_bf16`] / [`GpuContext::gemm_f32`]: cudarc's safe `Matmul` API
//!   (same type in and out; cudarc runs f32 with `CUBLAS_COMPUTE_32F_FAST_TF32`).
//! * [`GpuContext::gemm_bf16_f32`]: BF16 inputs, f32 output and accumulation, α applied in
//!   the epilogue (the emulated quantized GEMM's back end).
//! * [`GpuContext::gemm_fp8`]: per-tensor FP8 natively (Hopper and later), α = product of the
//!   two `scale_inv`; E4M3 x E4M3, E4M3 x E5M2, E5M2 x E4M3 (cuBLASLt has no E5M2 x E5M2).
//! * [`GpuContext::gemm_emulated`]: NVFP4 / MX / FP8 operands dequantized exactly to BF16
//!   (unscaled), a BF16 GEMM, α = product of the per-tensor factors; the same computation as
//!   `quant::qgemm` up to accumulation order.
//! * [`GpuContext::gemm_block_scaled`]: Blackwell (compute capability 10.x) block-scaled
//!   NVFP4 (`VEC16_UE4M3`) and MXFP8 / MXFP4 (`VEC32_UE8M0`) with swizzled scales.
//! * [`GpuContext::gemm_quantized`] picks native FP8, block-scaled (sm_100) or emulated.

use cudarc::cublaslt::sys;
use cudarc::cublaslt::{result as lt, CudaBlasLT, Matmul, MatmulConfig};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use fp_formats::mx::MxElement;
use quant::{Fp8Element, QuantFormat};

use crate::gpu::{Blas, GpuContext};
use crate::quantize::DeviceQuantized;
use crate::{KernelError, Result};

const WORKSPACE_BYTES: usize = 32 << 20;

/// How cuBLASLt should read one operand's block scales.
#[derive(Clone, Copy, Debug)]
struct BlockScales {
    mode: sys::cublasLtMatmulMatrixScale_t,
    ptr: u64,
}

/// One cuBLASLt matmul in the TN form of the module docs.
#[derive(Clone, Copy, Debug)]
struct LtCall {
    m: usize,
    n: usize,
    k: usize,
    a: u64,
    a_type: sys::cudaDataType,
    b: u64,
    b_type: sys::cudaDataType,
    d: u64,
    d_type: sys::cudaDataType,
    alpha: f32,
    a_scales: Option<BlockScales>,
    b_scales: Option<BlockScales>,
}

/// Destroys cuBLASLt descriptors on every exit path.
struct Guard {
    desc: Vec<sys::cublasLtMatmulDesc_t>,
    layouts: Vec<sys::cublasLtMatrixLayout_t>,
    pref: Vec<sys::cublasLtMatmulPreference_t>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        // SAFETY: each handle was created by cuBLASLt and is destroyed exactly once.
        unsafe {
            for &d in &self.desc {
                lt::destroy_matmul_desc(d).ok();
            }
            for &l in &self.layouts {
                lt::destroy_matrix_layout(l).ok();
            }
            for &p in &self.pref {
                lt::destroy_matmul_pref(p).ok();
            }
        }
    }
}

fn set_desc<T>(
    desc: sys::cublasLtMatmulDesc_t,
    attr: sys::cublasLtMatmulDescAttributes_t,
    v: &T,
) -> Result<()> {
    // SAFETY: `v` is a live value of the attribute's documented type and size.
    unsafe {
        lt::set_matmul_desc_attribute(
            desc,
            attr,
            v as *const T as *const _,
            std::mem::size_of::<T>(),
        )?
    };
    Ok(())
}

impl GpuContext {
    fn with_blas<R>(&self, f: impl FnOnce(&mut Blas) -> Result<R>) -> Result<R> {
        let mut guard = self
            .blas
            .lock()
            .map_err(|_| KernelError::Unsupported("poisoned cuBLASLt lock".into()))?;
        // cuBLASLt launches on the context current on this thread (tests run on other threads
        // than the one that created the context).
        self.ctx.bind_to_thread()?;
        if guard.is_none() {
            // SAFETY: dlopen()s the candidate library names only.
            if !unsafe { sys::is_culib_present() } {
                return Err(KernelError::Unsupported(
                    "cuBLASLt (libcublasLt.so.13) not found".into(),
                ));
            }
            let safe = CudaBlasLT::new(self.stream.clone())?;
            let handle = *cudarc::cublaslt::MatmulShared::handle(&safe);
            let workspace = self.zeros::<u8>(WORKSPACE_BYTES)?;
            *guard = Some(Blas {
                safe,
                handle,
                workspace,
            });
        }
        f(guard.as_mut().expect("cuBLASLt initialised"))
    }

    /// Runs one TN matmul with `D = alpha · op(A) · op(B)` (beta = 0).
    fn lt_matmul(&self, c: LtCall) -> Result<()> {
        let (m, n, k) = (c.m as u64, c.n as u64, c.k as u64);
        self.with_blas(|blas| {
            let desc = lt::create_matmul_desc(sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, sys::cudaDataType_t::CUDA_R_32F)?;
            let mut g = Guard { desc: vec![desc], layouts: Vec::new(), pref: Vec::new() };
            use sys::cublasLtMatmulDescAttributes_t as A;
            set_desc(desc, A::CUBLASLT_MATMUL_DESC_TRANSA, &1i32)?;
            set_desc(desc, A::CUBLASLT_MATMUL_DESC_TRANSB, &0i32)?;
            // cuBLAS "A" is our B, cuBLAS "B" is our A.
            if let Some(s) = c.b_scales {
                set_desc(desc, A::CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &(s.mode as u32))?;
                set_desc(desc, A::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &s.ptr)?;
            }
            if let Some(s) = c.a_scales {
                set_desc(desc, A::CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &(s.mode as u32))?;
                set_desc(desc, A::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &s.ptr)?;
            }
            let la = lt::create_matrix_layout(c.b_type, k, n, k as i64)?;
            g.layouts.push(la);
            let lb = lt::create_matrix_layout(c.a_type, k, m, k as i64)?;
            g.layouts.push(lb);
            let ld = lt::create_matrix_layout(c.d_type, n, m, n as i64)?;
            g.layouts.push(ld);
            let pref = lt::create_matmul_pref()?;
            g.pref.push(pref);
            let ws = WORKSPACE_BYTES;
            // SAFETY: a usize attribute of its documented size.
            unsafe {
                lt::set_matmul_pref_attribute(
                    pref,
                    sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                    &ws as *const usize as *const _,
                    std::mem::size_of::<usize>(),
                )?;
            }
            // SAFETY: all descriptors are valid; the heuristic only reads them.
            let heur = unsafe { lt::get_matmul_algo_heuristic(blas.handle, desc, la, lb, ld, ld, pref)? };
            let beta = 0.0f32;
            let (w, _sync) = blas.workspace.device_ptr(&self.stream);
            // SAFETY: the caller guarantees that the device pointers hold matrices of the
            // described shapes and types, alive until the stream reaches this GEMM.
            unsafe {
                lt::matmul(
                    blas.handle,
                    desc,
                    &c.alpha as *const f32 as *const _,
                    &beta as *const f32 as *const _,
                    c.b as *const _,
                    la,
                    c.a as *const _,
                    lb,
                    c.d as *const _,
                    ld,
                    c.d as *mut _,
                    ld,
                    &heur.algo,
                    w as *mut _,
                    ws,
                    self.stream.cu_stream() as *mut _,
                )?;
            }
            Ok(())
        })
    }

    /// `out[M, N] = A[M, K] · B[N, K]ᵀ` in BF16 (BF16 out, f32 accumulation) through cudarc's
    /// safe cuBLASLt API.
    pub fn gemm_bf16(
        &self,
        a: &CudaSlice<half::bf16>,
        b: &CudaSlice<half::bf16>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<CudaSlice<half::bf16>> {
        check_len(a.len(), m * k, "A")?;
        check_len(b.len(), n * k, "B")?;
        // SAFETY: beta = 0: cuBLASLt writes every element of D and reads no C.
        let mut out = unsafe { self.uninit::<half::bf16>(m * n)? };
        self.with_blas(|blas| {
            // SAFETY: shapes checked above; TN as in the module docs.
            unsafe {
                blas.safe
                    .matmul(safe_cfg(m, n, k), b, a, &mut out, None, None)?
            };
            Ok(())
        })?;
        Ok(out)
    }

    /// `out[M, N] = A[M, K] · B[N, K]ᵀ` in f32 through cudarc's safe cuBLASLt API (which
    /// computes with TF32 tensor cores, `CUBLAS_COMPUTE_32F_FAST_TF32`).
    pub fn gemm_f32(
        &self,
        a: &CudaSlice<f32>,
        b: &CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<CudaSlice<f32>> {
        check_len(a.len(), m * k, "A")?;
        check_len(b.len(), n * k, "B")?;
        // SAFETY: beta = 0: cuBLASLt writes every element of D and reads no C.
        let mut out = unsafe { self.uninit::<f32>(m * n)? };
        self.with_blas(|blas| {
            // SAFETY: shapes checked above; TN as in the module docs.
            unsafe {
                blas.safe
                    .matmul(safe_cfg(m, n, k), b, a, &mut out, None, None)?
            };
            Ok(())
        })?;
        Ok(out)
    }

    /// `out[M, N] = alpha · A[M, K] · B[N, K]ᵀ` with BF16 inputs, f32 accumulation and f32
    /// output; `alpha` multiplies the f32 accumulator in the epilogue.
    pub fn gemm_bf16_f32(
        &self,
        a: &CudaSlice<half::bf16>,
        b: &CudaSlice<half::bf16>,
        m: usize,
        n: usize,
        k: usize,
        alpha: f32,
    ) -> Result<CudaSlice<f32>> {
        check_len(a.len(), m * k, "A")?;
        check_len(b.len(), n * k, "B")?;
        // SAFETY: beta = 0: cuBLASLt writes every element of D and reads no C.
        let mut out = unsafe { self.uninit::<f32>(m * n)? };
        let (pa, _sa) = a.device_ptr(&self.stream);
        let (pb, _sb) = b.device_ptr(&self.stream);
        let (pd, _sd) = out.device_ptr_mut(&self.stream);
        let bf = sys::cudaDataType_t::CUDA_R_16BF;
        self.lt_matmul(LtCall {
            m,
            n,
            k,
            a: pa,
            a_type: bf,
            b: pb,
            b_type: bf,
            d: pd,
            d_type: sys::cudaDataType_t::CUDA_R_32F,
            alpha,
            a_scales: None,
            b_scales: None,
        })?;
        drop((_sa, _sb, _sd));
        Ok(out)
    }

    /// Per-tensor FP8 GEMM (native on Hopper and later): both operands rowwise-stored with
    /// the reduction dimension K as their columns (K a multiple of 16), f32 output,
    /// `α = scale_inv_A · scale_inv_B` in the epilogue.
    pub fn gemm_fp8(&self, a: &DeviceQuantized, b: &DeviceQuantized) -> Result<CudaSlice<f32>> {
        let (ta, tb) = match (a.format, b.format) {
            (QuantFormat::Fp8 { element: ea, .. }, QuantFormat::Fp8 { element: eb, .. }) => {
                (fp8_type(ea), fp8_type(eb))
            }
            _ => {
                return Err(KernelError::Unsupported(
                    "gemm_fp8 needs two per-tensor FP8 operands".into(),
                ))
            }
        };
        if !native_fp8_pair(a, b) {
            return Err(KernelError::Unsupported(
                "cuBLASLt has no E5M2 x E5M2 FP8 GEMM (use gemm_emulated)".into(),
            ));
        }
        let k = same_k(a, b)?;
        if k % 16 != 0 {
            return Err(KernelError::Unsupported(format!(
                "FP8 GEMM needs K % 16 == 0, got {k}"
            )));
        }
        // SAFETY: beta = 0: cuBLASLt writes every element of D and reads no C.
        let mut out = unsafe { self.uninit::<f32>(a.rows * b.rows)? };
        let (pa, _sa) = a.codes.device_ptr(&self.stream);
        let (pb, _sb) = b.codes.device_ptr(&self.stream);
        let (pd, _sd) = out.device_ptr_mut(&self.stream);
        self.lt_matmul(LtCall {
            m: a.rows,
            n: b.rows,
            k,
            a: pa,
            a_type: ta,
            b: pb,
            b_type: tb,
            d: pd,
            d_type: sys::cudaDataType_t::CUDA_R_32F,
            alpha: a.tensor_scale_inv * b.tensor_scale_inv,
            a_scales: None,
            b_scales: None,
        })?;
        drop((_sa, _sb, _sd));
        Ok(out)
    }

    /// The emulated quantized GEMM (the Hopper path for NVFP4 and MX): both operands
    /// dequantized exactly to BF16 without their per-tensor factors, a BF16 GEMM with f32
    /// accumulation over the padded K (the padding is zero), `α = factor_A · factor_B` in the
    /// epilogue. Matches `quant::qgemm::quantized_matmul_tn` up to accumulation order.
    pub fn gemm_emulated(
        &self,
        a: &DeviceQuantized,
        b: &DeviceQuantized,
    ) -> Result<CudaSlice<f32>> {
        same_k(a, b)?;
        if a.padded_cols != b.padded_cols {
            return Err(KernelError::Unsupported(format!(
                "operands padded to different K ({} and {})",
                a.padded_cols, b.padded_cols
            )));
        }
        let (abf, fa) = self.operand_bf16(a)?;
        let (bbf, fb) = self.operand_bf16(b)?;
        self.gemm_bf16_f32(&abf, &bbf, a.rows, b.rows, a.padded_cols, fa * fb)
    }

    /// The Blackwell block-scaled GEMM (compute capability 10.x only): NVFP4 × NVFP4 with
    /// `VEC16_UE4M3` scales, MXFP8 (E4M3) × MXFP8 or MXFP4 × MXFP4 with `VEC32_UE8M0`
    /// scales, swizzled on the device into the 128x4 layout of [`crate::swizzle`].
    pub fn gemm_block_scaled(
        &self,
        a: &DeviceQuantized,
        b: &DeviceQuantized,
    ) -> Result<CudaSlice<f32>> {
        if self.cc.0 != 10 {
            return Err(KernelError::Unsupported(format!(
                "block-scaled FP4/FP8 GEMMs need compute capability 10.x, this device is {}.{}",
                self.cc.0, self.cc.1
            )));
        }
        use sys::cublasLtMatmulMatrixScale_t as S;
        let (ty, mode, block) = match (a.format, b.format) {
            (QuantFormat::Nvfp4 { .. }, QuantFormat::Nvfp4 { .. }) => (
                sys::cudaDataType_t::CUDA_R_4F_E2M1,
                S::CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3,
                16,
            ),
            (QuantFormat::Mx { element: ea, .. }, QuantFormat::Mx { element: eb, .. })
                if ea == eb =>
            {
                match ea {
                    MxElement::E4M3 => (
                        sys::cudaDataType_t::CUDA_R_8F_E4M3,
                        S::CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0,
                        32,
                    ),
                    MxElement::E2M1 => (
                        sys::cudaDataType_t::CUDA_R_4F_E2M1,
                        S::CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0,
                        32,
                    ),
                    e => {
                        return Err(KernelError::Unsupported(format!(
                            "block-scaled GEMM of MX {e:?}"
                        )))
                    }
                }
            }
            (fa, fb) => {
                return Err(KernelError::Unsupported(format!(
                    "block-scaled GEMM of {fa:?} x {fb:?}"
                )))
            }
        };
        same_k(a, b)?;
        let k = a.padded_cols;
        if b.padded_cols != k {
            return Err(KernelError::Unsupported(
                "operands padded to different K".into(),
            ));
        }
        let sa =
            self.swizzle_scales(a.scales.as_ref().expect("block scales"), a.rows, k / block)?;
        let sb =
            self.swizzle_scales(b.scales.as_ref().expect("block scales"), b.rows, k / block)?;
        // SAFETY: beta = 0: cuBLASLt writes every element of D and reads no C.
        let mut out = unsafe { self.uninit::<f32>(a.rows * b.rows)? };
        let (pa, _ga) = a.codes.device_ptr(&self.stream);
        let (pb, _gb) = b.codes.device_ptr(&self.stream);
        let (psa, _gsa) = sa.device_ptr(&self.stream);
        let (psb, _gsb) = sb.device_ptr(&self.stream);
        let (pd, _gd) = out.device_ptr_mut(&self.stream);
        self.lt_matmul(LtCall {
            m: a.rows,
            n: b.rows,
            k,
            a: pa,
            a_type: ty,
            b: pb,
            b_type: ty,
            d: pd,
            d_type: sys::cudaDataType_t::CUDA_R_32F,
            alpha: a.tensor_scale_inv * b.tensor_scale_inv,
            a_scales: Some(BlockScales { mode, ptr: psa }),
            b_scales: Some(BlockScales { mode, ptr: psb }),
        })?;
        drop((_ga, _gb, _gsa, _gsb, _gd));
        // The swizzled scales must live until the GEMM has run.
        self.stream.synchronize()?;
        drop((sa, sb));
        Ok(out)
    }

    /// The quantized GEMM for the operands' format and this device: native FP8 (emulated for
    /// E5M2 x E5M2, which cuBLASLt lacks, and for K not a multiple of 16), block-scaled
    /// NVFP4 / MX on compute capability 10.x, emulated NVFP4 / MX elsewhere.
    pub fn gemm_quantized(
        &self,
        a: &DeviceQuantized,
        b: &DeviceQuantized,
    ) -> Result<CudaSlice<f32>> {
        match (a.format, b.format) {
            (QuantFormat::Fp8 { .. }, QuantFormat::Fp8 { .. })
                if native_fp8_pair(a, b) && a.cols % 16 == 0 =>
            {
                self.gemm_fp8(a, b)
            }
            (QuantFormat::Fp8 { .. }, QuantFormat::Fp8 { .. }) => self.gemm_emulated(a, b),
            _ if self.cc.0 == 10 => self.gemm_block_scaled(a, b),
            _ => self.gemm_emulated(a, b),
        }
    }
}

fn safe_cfg(m: usize, n: usize, k: usize) -> MatmulConfig {
    MatmulConfig {
        transa: true,
        transb: false,
        transc: false,
        m: n as u64,
        n: m as u64,
        k: k as u64,
        alpha: 1.0,
        lda: k as i64,
        ldb: k as i64,
        beta: 0.0,
        ldc: n as i64,
        stride_a: None,
        stride_b: None,
        stride_c: None,
        stride_bias: None,
        batch_size: None,
    }
}

/// Whether cuBLASLt has a native kernel for this FP8 pair: E4M3 x E4M3, E4M3 x E5M2 and
/// E5M2 x E4M3 are in its FP8 type table, E5M2 x E5M2 is not.
fn native_fp8_pair(a: &DeviceQuantized, b: &DeviceQuantized) -> bool {
    !matches!(
        (a.format, b.format),
        (
            QuantFormat::Fp8 {
                element: Fp8Element::E5M2,
                ..
            },
            QuantFormat::Fp8 {
                element: Fp8Element::E5M2,
                ..
            }
        )
    )
}

fn fp8_type(e: Fp8Element) -> sys::cudaDataType {
    match e {
        Fp8Element::E4M3 => sys::cudaDataType_t::CUDA_R_8F_E4M3,
        Fp8Element::E5M2 => sys::cudaDataType_t::CUDA_R_8F_E5M2,
    }
}

fn check_len(got: usize, want: usize, what: &str) -> Result<()> {
    if got < want {
        return Err(KernelError::Unsupported(format!(
            "operand {what} has {got} elements, needs {want}"
        )));
    }
    Ok(())
}

fn same_k(a: &DeviceQuantized, b: &DeviceQuantized) -> Result<usize> {
    if a.cols != b.cols {
        return Err(KernelError::Quant(quant::QuantError::GemmShape(format!(
            "operand A is [{}, {}] and operand B is [{}, {}]: the reduction dimensions differ",
            a.rows, a.cols, b.rows, b.cols
        ))));
    }
    Ok(a.cols)
}

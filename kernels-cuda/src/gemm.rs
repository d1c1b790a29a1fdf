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
use crate::train_tc::{Bf16Gemm, Bf16GemmPtrs};
use crate::{KernelError, Result};

const WORKSPACE_BYTES: usize = 32 << 20;

/// How cuBLASLt should read one operand's block scales.
#[derive(Clone, Copy, Debug)]
struct BlockScales {
    mode: sys::cublasLtMatmulMatrixScale_t,
    ptr: u64,
}

/// One matrix of a cuBLASLt call in cuBLASLt's column-major terms: `rows x cols` with `ld`
/// elements between columns and batch items `stride` elements apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LtMat {
    pub(crate) ptr: u64,
    pub(crate) ty: sys::cudaDataType,
    pub(crate) rows: u64,
    pub(crate) cols: u64,
    pub(crate) ld: i64,
    pub(crate) stride: i64,
}

impl LtMat {
    /// A row-major `[rows, cols]` matrix with `ld` elements between rows, seen column-major:
    /// `[cols, rows]` with the same `ld`.
    fn row_major(
        ptr: u64,
        ty: sys::cudaDataType,
        (rows, cols): (usize, usize),
        ld: usize,
        stride: usize,
    ) -> Self {
        LtMat {
            ptr,
            ty,
            rows: cols as u64,
            cols: rows as u64,
            ld: ld as i64,
            stride: stride as i64,
        }
    }
}

/// One cuBLASLt matmul `D_i = alpha · op(A_i) · op(B_i) + beta · D_i` (column-major, `i <
/// batch`, `D` doubling as `C`). Nibble's row-major `C[m, n] = op(A) · op(B)` is computed as
/// `Cᵀ[n, m] = op(B)ᵀ · op(A)ᵀ`: cuBLASLt's "A" is our `B`, its "B" is our `A`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LtCall {
    pub(crate) a: LtMat,
    pub(crate) trans_a: bool,
    pub(crate) b: LtMat,
    pub(crate) trans_b: bool,
    pub(crate) d: LtMat,
    pub(crate) batch: i32,
    pub(crate) alpha: f32,
    pub(crate) beta: f32,
    /// Block scales of cuBLASLt's "A" (our `B`) and "B" (our `A`).
    a_scales: Option<BlockScales>,
    b_scales: Option<BlockScales>,
}

impl LtCall {
    /// The TN form of the module docs: `out[m, n] = alpha · A[m, k] · B[n, k]ᵀ`, both
    /// operands row-major with K contiguous, `out` row-major.
    #[allow(clippy::too_many_arguments)]
    fn tn(
        (m, n, k): (usize, usize, usize),
        (pa, ta): (u64, sys::cudaDataType),
        (pb, tb): (u64, sys::cudaDataType),
        d: u64,
        alpha: f32,
    ) -> Self {
        LtCall {
            // our B [n, k] (column-major [k, n]), transposed
            a: LtMat::row_major(pb, tb, (n, k), k, 0),
            trans_a: true,
            // our A [m, k] (column-major [k, m])
            b: LtMat::row_major(pa, ta, (m, k), k, 0),
            trans_b: false,
            d: LtMat::row_major(d, sys::cudaDataType_t::CUDA_R_32F, (m, n), n, 0),
            batch: 1,
            alpha,
            beta: 0.0,
            a_scales: None,
            b_scales: None,
        }
    }

    /// The training GEMM [`Bf16Gemm`] (BF16 in, f32 out and accumulation, any transposition,
    /// leading dimension and batch stride) as one call: cuBLASLt's "A" is our `B` stored
    /// row-major (`op` = our transposition), its "B" our `A`, `D` our `C` seen column-major.
    /// A pure function of the views (checked by [`Bf16Gemm::check`] first).
    pub(crate) fn training(g: &Bf16Gemm, p: Bf16GemmPtrs) -> Self {
        let bf = sys::cudaDataType_t::CUDA_R_16BF;
        let (sa, sb) = g.stored();
        LtCall {
            a: LtMat::row_major(p.b, bf, sb, g.b.ld, g.b.item),
            trans_a: g.b.trans,
            b: LtMat::row_major(p.a, bf, sa, g.a.ld, g.a.item),
            trans_b: g.a.trans,
            d: LtMat::row_major(
                p.c,
                sys::cudaDataType_t::CUDA_R_32F,
                (g.m, g.n),
                g.n,
                g.m * g.n,
            ),
            batch: g.batch as i32,
            alpha: g.alpha,
            beta: g.beta,
            a_scales: None,
            b_scales: None,
        }
    }
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

    /// Runs one matmul `D = alpha · op(A) · op(B) + beta · D` ([`LtCall`]) with f32
    /// accumulation (`CUBLAS_COMPUTE_32F`).
    pub(crate) fn lt_matmul(&self, c: LtCall) -> Result<()> {
        self.with_blas(|blas| {
            let desc = lt::create_matmul_desc(sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, sys::cudaDataType_t::CUDA_R_32F)?;
            let mut g = Guard { desc: vec![desc], layouts: Vec::new(), pref: Vec::new() };
            use sys::cublasLtMatmulDescAttributes_t as A;
            set_desc(desc, A::CUBLASLT_MATMUL_DESC_TRANSA, &i32::from(c.trans_a))?;
            set_desc(desc, A::CUBLASLT_MATMUL_DESC_TRANSB, &i32::from(c.trans_b))?;
            if let Some(s) = c.a_scales {
                set_desc(desc, A::CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &(s.mode as u32))?;
                set_desc(desc, A::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &s.ptr)?;
            }
            if let Some(s) = c.b_scales {
                set_desc(desc, A::CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &(s.mode as u32))?;
                set_desc(desc, A::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &s.ptr)?;
            }
            let mut layout = |m: &LtMat| -> Result<sys::cublasLtMatrixLayout_t> {
                let l = lt::create_matrix_layout(m.ty, m.rows, m.cols, m.ld)?;
                g.layouts.push(l);
                if c.batch != 1 {
                    use sys::cublasLtMatrixLayoutAttribute_t as L;
                    // SAFETY: an i32 and an i64 attribute of their documented sizes.
                    unsafe {
                        lt::set_matrix_layout_attribute(l, L::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &c.batch as *const i32 as *const _, 4)?;
                        lt::set_matrix_layout_attribute(l, L::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &m.stride as *const i64 as *const _, 8)?;
                    }
                }
                Ok(l)
            };
            let la = layout(&c.a)?;
            let lb = layout(&c.b)?;
            let ld = layout(&c.d)?;
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
            let (w, _sync) = blas.workspace.device_ptr(&self.stream);
            // SAFETY: the caller guarantees that the device pointers hold matrices of the
            // described shapes and types, alive until the stream reaches this GEMM.
            unsafe {
                lt::matmul(
                    blas.handle,
                    desc,
                    &c.alpha as *const f32 as *const _,
                    &c.beta as *const f32 as *const _,
                    c.a.ptr as *const _,
                    la,
                    c.b.ptr as *const _,
                    lb,
                    c.d.ptr as *const _,
                    ld,
                    c.d.ptr as *mut _,
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
        self.lt_matmul(LtCall::tn((m, n, k), (pa, bf), (pb, bf), pd, alpha))?;
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
        let alpha = a.tensor_scale_inv * b.tensor_scale_inv;
        self.lt_matmul(LtCall::tn(
            (a.rows, b.rows, k),
            (pa, ta),
            (pb, tb),
            pd,
            alpha,
        ))?;
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
        let mut call = LtCall::tn(
            (a.rows, b.rows, k),
            (pa, ty),
            (pb, ty),
            pd,
            a.tensor_scale_inv * b.tensor_scale_inv,
        );
        // cuBLASLt's "A" is our B (module docs)
        call.a_scales = Some(BlockScales { mode, ptr: psb });
        call.b_scales = Some(BlockScales { mode, ptr: psa });
        self.lt_matmul(call)?;
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
                if native_fp8_pair(a, b) && a.cols.is_multiple_of(16) =>
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

#[cfg(test)]
mod tests {
    //! `LtCall::training` against the row-major reference: the call is executed on the host
    //! with cuBLASLt's column-major semantics (op(A) = A or Aᵀ of a `rows x cols` matrix with
    //! `ld` between columns, items `stride` apart), summing in K order as the reference does,
    //! so every transposition, leading dimension, batch stride and β must give the same bits.
    use super::*;
    use crate::train_tc::{reference, Bf16View};

    /// cuBLASLt's `D = α · op(A) · op(B) + β · D` on host slices.
    fn run_lt(c: &LtCall, a: &[u16], b: &[u16], d: &mut [f32]) {
        let at = |m: &LtMat, x: &[u16], t: bool, item: usize, r: usize, col: usize| {
            let (r, col) = if t { (col, r) } else { (r, col) };
            assert!(
                (r as u64) < m.rows && (col as u64) < m.cols,
                "inside the layout"
            );
            let i = item as i64 * m.stride + r as i64 + col as i64 * m.ld;
            f32::from_bits(u32::from(x[i as usize]) << 16)
        };
        let op = |m: &LtMat, t: bool| {
            if t {
                (m.cols, m.rows)
            } else {
                (m.rows, m.cols)
            }
        };
        let ((ar, ak), (bk, bc)) = (op(&c.a, c.trans_a), op(&c.b, c.trans_b));
        assert_eq!((ak, ar, bc), (bk, c.d.rows, c.d.cols), "consistent shapes");
        assert!(
            c.d.ld >= c.d.rows as i64 && c.a.ld >= c.a.rows as i64 && c.b.ld >= c.b.rows as i64
        );
        for item in 0..c.batch as usize {
            for col in 0..bc as usize {
                for r in 0..ar as usize {
                    let mut s = 0.0f32;
                    for p in 0..ak as usize {
                        s += at(&c.a, a, c.trans_a, item, r, p)
                            * at(&c.b, b, c.trans_b, item, p, col);
                    }
                    let o = &mut d
                        [(item as i64 * c.d.stride + r as i64 + col as i64 * c.d.ld) as usize];
                    *o = if c.beta == 0.0 {
                        c.alpha * s
                    } else {
                        c.alpha * s + c.beta * *o
                    };
                }
            }
        }
    }

    fn bits(n: usize, seed: u32) -> Vec<u16> {
        (0..n as u32)
            .map(|i| {
                let x = ((i.wrapping_mul(2654435761) ^ seed.wrapping_mul(40503)) % 251) as f32;
                crate::train_tc::bf16_bits_of((x - 125.0) / 37.0)
            })
            .collect()
    }

    #[test]
    fn training_call_matches_the_reference_on_every_view() {
        let (m, n, k) = (5, 3, 7);
        let mut cases = 0;
        for batch in [1usize, 3] {
            for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
                for pad in [0usize, 2] {
                    for shared_b in [false, true] {
                        for beta in [0.0f32, 1.0] {
                            let view = |t: bool, (r, c): (usize, usize), shared: bool| {
                                let (rows, cols) = if t { (c, r) } else { (r, c) };
                                let ld = cols + pad;
                                let item = if shared { 0 } else { rows * ld + pad };
                                (
                                    Bf16View { trans: t, ld, item },
                                    (batch.max(1) - 1) * item + rows * ld,
                                )
                            };
                            let (va, la) = view(ta, (m, k), false);
                            let (vb, lb) = view(tb, (k, n), shared_b);
                            let g = Bf16Gemm {
                                batch,
                                m,
                                n,
                                k,
                                alpha: 0.75,
                                beta,
                                a: va,
                                b: vb,
                            };
                            let (a, b) = (bits(la, 1), bits(lb, 2));
                            let c0: Vec<f32> =
                                (0..batch * m * n).map(|i| i as f32 * 0.25).collect();
                            let mut want = c0.clone();
                            reference(&g, &a, &b, &mut want).unwrap();
                            let call = LtCall::training(&g, Bf16GemmPtrs { a: 1, b: 2, c: 3 });
                            assert_eq!(
                                (call.a.ptr, call.b.ptr, call.d.ptr),
                                (2, 1, 3),
                                "A and B swap"
                            );
                            let mut got = c0.clone();
                            run_lt(&call, &b, &a, &mut got);
                            assert_eq!(got, want, "{g:?}");
                            cases += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(cases, 64);
    }

    #[test]
    fn tn_call_is_the_training_call_of_a_rowwise_and_a_transposed_operand() {
        let bf = sys::cudaDataType_t::CUDA_R_16BF;
        let t = LtCall::tn((4, 6, 8), (10, bf), (20, bf), 30, 2.0);
        let g = Bf16Gemm::single((4, 6, 8), 2.0, Bf16View::rows(8), Bf16View::cols(8));
        let p = Bf16GemmPtrs {
            a: 10,
            b: 20,
            c: 30,
        };
        let mut r = LtCall::training(&g, p);
        // one item: the batch stride is not read
        r.d.stride = 0;
        assert_eq!((t.a, t.b, t.d), (r.a, r.b, r.d));
        assert_eq!(
            (t.trans_a, t.trans_b, t.batch),
            (r.trans_a, r.trans_b, r.batch)
        );
        assert_eq!(
            (t.trans_a, t.trans_b),
            (true, false),
            "Nibble's TN is cuBLASLt's T, N"
        );
    }
}

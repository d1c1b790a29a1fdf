//! The GPU implementation of `quant`'s one quantizer interface ([`QuantizerBackend`] for
//! [`GpuContext`]): the same validated [`Quantizer`], a [`DeviceQuantized`] output in
//! `quant::QuantizedTensor`'s layout.
//!
//! Each quantization is a [`QuantJob`]: planning and output allocation, then
//! [`QuantJob::launch`] (the amax pass and the quantization kernel, asynchronous; may be
//! repeated, e.g. for timing), then [`QuantJob::finish`] (one small device-to-host copy of the
//! amax / scale, the non-finite check, and the result). [`QuantizerBackend::quantize`] and
//! [`GpuContext::cast_transpose`] do all three.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use quant::{
    BlockShape, QuantFormat, QuantState, QuantizedTensor, Quantizer, QuantizerBackend, Usage,
};

use crate::abi::{self, AmaxPass, Args, Dims, OutPtrs, Plan, Side};
use crate::gpu::{grid_stride_cfg, to_i32, DeviceMatrix, GpuContext, THREADS};
use crate::{KernelError, Result};

// ------------------------------------------------------------------------------------------
// The output type
// ------------------------------------------------------------------------------------------

/// A quantized operand in device memory, laid out exactly like [`quant::QuantizedTensor`]
/// (stored shape, padding, packed codes, one scale byte per block; see its docs).
#[derive(Debug)]
pub struct DeviceQuantized {
    /// The format the data are stored in.
    pub format: QuantFormat,
    /// Block geometry.
    pub block: BlockShape,
    /// Which copy this is.
    pub usage: Usage,
    /// Stored rows.
    pub rows: usize,
    /// Stored columns.
    pub cols: usize,
    /// Rows after padding.
    pub padded_rows: usize,
    /// Columns after padding.
    pub padded_cols: usize,
    /// Packed codes (`codes_len` bytes are meaningful).
    pub codes: CudaSlice<u8>,
    /// Meaningful bytes of `codes`.
    pub codes_len: usize,
    /// One scale byte per block (`None` for per-tensor formats).
    pub scales: Option<CudaSlice<u8>>,
    /// Per-tensor amax (after the Hadamard transform when one was applied).
    pub amax: f32,
    /// Per-tensor decode factor (NVFP4 `S_dec`, FP8 `1 / scale`, MX 1 or 4/3).
    pub tensor_scale_inv: f32,
    /// The Hadamard transform's sign mask, if one was applied along the stored rows.
    pub hadamard: Option<u16>,
}

impl Drop for DeviceQuantized {
    /// The context made current before cudarc frees the codes and scales (see `GpuBuf`'s
    /// `Drop`).
    fn drop(&mut self) {
        let _ = self.codes.context().bind_to_thread();
    }
}

impl DeviceQuantized {
    /// Copies the tensor to the host as a [`quant::QuantizedTensor`] (synchronizes).
    pub fn to_host(&self) -> Result<QuantizedTensor> {
        let stream = self.codes.stream();
        let mut codes = stream.clone_dtoh(&self.codes)?;
        codes.truncate(self.codes_len);
        let scales = match &self.scales {
            Some(s) => {
                let mut v = stream.clone_dtoh(s)?;
                v.truncate(self.scale_len());
                v
            }
            None => Vec::new(),
        };
        Ok(QuantizedTensor {
            format: self.format,
            block: self.block,
            usage: self.usage,
            rows: self.rows,
            cols: self.cols,
            padded_rows: self.padded_rows,
            padded_cols: self.padded_cols,
            codes,
            scales,
            amax: self.amax,
            tensor_scale_inv: self.tensor_scale_inv,
            hadamard: self.hadamard,
        })
    }

    /// Number of scale bytes (`padded_rows * blocks per row`).
    pub fn scale_len(&self) -> usize {
        match self.format {
            QuantFormat::Nvfp4 { .. } => self.padded_rows * self.padded_cols / 16,
            QuantFormat::Mx { .. } => self.padded_rows * self.padded_cols / 32,
            _ => 0,
        }
    }
}

// ------------------------------------------------------------------------------------------
// Jobs
// ------------------------------------------------------------------------------------------

#[derive(Debug)]
struct Out {
    side: Side,
    codes: CudaSlice<u8>,
    scales: Option<CudaSlice<u8>>,
}

/// A prepared quantization: a validated [`Plan`], allocated outputs and kernel arguments.
/// [`QuantJob::launch`] enqueues the kernels (asynchronously; repeatable), [`QuantJob::finish`]
/// reads back the per-tensor values and returns the tensors.
#[derive(Debug)]
pub struct QuantJob<'a> {
    gpu: &'a GpuContext,
    x: &'a DeviceMatrix,
    plan: Plan,
    amax: CudaSlice<u32>,
    meta: CudaSlice<f32>,
    row: Option<Out>,
    col: Option<Out>,
}

fn ptr<T>(s: &CudaSlice<T>, gpu: &GpuContext) -> u64 {
    let (p, _sync) = s.device_ptr(&gpu.stream);
    p
}

fn ptr_mut<T>(s: &mut CudaSlice<T>, gpu: &GpuContext) -> u64 {
    let (p, _sync) = s.device_ptr_mut(&gpu.stream);
    p
}

impl GpuContext {
    fn alloc_out(&self, side: Option<Side>) -> Result<(Option<Out>, OutPtrs)> {
        let Some(side) = side else {
            return Ok((None, OutPtrs::default()));
        };
        let mut codes = self.zeros::<u8>(side.codes_len)?;
        let mut scales = if side.scale_len > 0 {
            Some(self.zeros::<u8>(side.scale_len)?)
        } else {
            None
        };
        let p = OutPtrs {
            codes: ptr_mut(&mut codes, self),
            scales: scales.as_mut().map_or(0, |s| ptr_mut(s, self)),
        };
        Ok((
            Some(Out {
                side,
                codes,
                scales,
            }),
            p,
        ))
    }

    fn job<'a>(&'a self, x: &'a DeviceMatrix, mut plan: Plan) -> Result<QuantJob<'a>> {
        let (row, rp) = self.alloc_out(plan.row)?;
        let (col, cp) = self.alloc_out(plan.col)?;
        let mut amax = self.zeros::<u32>(4)?;
        let mut meta = self.zeros::<f32>(2)?;
        plan.set_pointers(
            ptr(&x.data, self),
            ptr_mut(&mut amax, self),
            ptr_mut(&mut meta, self),
            rp,
            cp,
        );
        Ok(QuantJob {
            gpu: self,
            x,
            plan,
            amax,
            meta,
            row,
            col,
        })
    }

    /// Prepares a quantization of the rowwise copy (`row`, a rowwise [`Quantizer`]), the
    /// columnwise copy (`col`, a columnwise one) or both (the fused cast+transpose, one read
    /// of the input; both of one format family, and for MX and FP8 of the same element
    /// format). The settings were validated by [`Quantizer::new`]; the plan adds the GPU's
    /// own limits ([`KernelError::Unsupported`]: F32 / BF16, Four Over Six, MXFP6, empty or
    /// oversized tensors). Delayed FP8 scaling casts with `state.scale()`;
    /// [`QuantJob::finish_fp8`] records the amax in `state`.
    pub fn prepare<'a>(
        &'a self,
        x: &'a DeviceMatrix,
        row: Option<&Quantizer>,
        col: Option<&Quantizer>,
        state: &mut QuantState,
    ) -> Result<QuantJob<'a>> {
        self.job(x, abi::plan(dims(x), row, col, state)?)
    }

    /// The fused cast+transpose: the rowwise copy (quantized with `row`) and the columnwise
    /// copy (quantized with `col`, e.g. with RHT and stochastic rounding) from one read of
    /// the input. Each result equals the corresponding single quantization bit for bit.
    pub fn cast_transpose(
        &self,
        x: &DeviceMatrix,
        row: &Quantizer,
        col: &Quantizer,
        state: &mut QuantState,
    ) -> Result<(DeviceQuantized, DeviceQuantized)> {
        match self
            .prepare(x, Some(row), Some(col), state)?
            .run()?
            .finish_fp8(state)?
        {
            (Some(r), Some(c)) => Ok((r, c)),
            _ => Err(KernelError::Unsupported(
                "expected both copies from a cast+transpose".into(),
            )),
        }
    }

    // --------------------------------------------------------------------------------------
    // Dequantization
    // --------------------------------------------------------------------------------------

    /// Dequantizes to f32 in the stored layout (`rows x cols`, padding dropped), with the
    /// per-tensor factor: bit-identical to [`quant::QuantizedTensor::dequantize`].
    fn dequantize_device(&self, t: &DeviceQuantized) -> Result<CudaSlice<f32>> {
        let n = t.rows * t.cols;
        // SAFETY: each dequantization kernel writes all rows * cols outputs (the GPU tests
        // compare every element with quant's).
        let mut out = unsafe { self.uninit::<f32>(n)? };
        let (rows, cols, pcols) = (to_i32(t.rows)?, to_i32(t.cols)?, to_i32(t.padded_cols)?);
        match t.format {
            QuantFormat::Nvfp4 { .. } => {
                let scales = t.scales.as_ref().expect("NVFP4 scales");
                let mut b = self.stream.launch_builder(&self.k.nvfp4_dequantize);
                b.arg(&t.codes)
                    .arg(scales)
                    .arg(&rows)
                    .arg(&cols)
                    .arg(&pcols)
                    .arg(&t.tensor_scale_inv)
                    .arg(&mut out);
                // SAFETY: reads rows * padded_cols / 2 code bytes and the matching scales,
                // writes rows * cols floats.
                unsafe { b.launch(grid_stride_cfg(t.rows * t.padded_cols / 2))? };
            }
            QuantFormat::Mx { element, .. } => {
                let scales = t.scales.as_ref().expect("MX scales");
                let elem = abi::mx_elem(element)?;
                let mut b = self.stream.launch_builder(&self.k.mx_dequantize);
                b.arg(&t.codes)
                    .arg(scales)
                    .arg(&rows)
                    .arg(&cols)
                    .arg(&pcols)
                    .arg(&elem)
                    .arg(&t.tensor_scale_inv)
                    .arg(&mut out);
                // SAFETY: as above for the MX layout.
                unsafe { b.launch(grid_stride_cfg(n))? };
            }
            QuantFormat::Fp8 { element, .. } => {
                let elem = abi::fp8_elem(element);
                let n64 = n as u64;
                let mut b = self.stream.launch_builder(&self.k.fp8_dequantize);
                b.arg(&t.codes)
                    .arg(&n64)
                    .arg(&elem)
                    .arg(&t.tensor_scale_inv)
                    .arg(&mut out);
                // SAFETY: reads and writes n elements.
                unsafe { b.launch(grid_stride_cfg(n))? };
            }
            f => return Err(KernelError::Unsupported(format!("dequantizing {f:?}"))),
        }
        Ok(out)
    }

    /// The GEMM operand of an emulated quantized GEMM: the unscaled values (`e2m1 · s_b`,
    /// `element · 2^(b-127)`, `fp8(code)`; exact in BF16) as a row-major
    /// `[rows, padded_cols]` BF16 matrix (padding is zero), and the per-tensor factor.
    pub fn operand_bf16(&self, t: &DeviceQuantized) -> Result<(CudaSlice<half::bf16>, f32)> {
        let n = t.rows * t.padded_cols;
        // SAFETY: both conversion kernels write all rows * padded_cols elements (the padding
        // holds zero codes, which decode to zero).
        let mut out = unsafe { self.uninit::<half::bf16>(n)? };
        let (rows, pcols) = (to_i32(t.rows)?, to_i32(t.padded_cols)?);
        match t.format {
            QuantFormat::Nvfp4 { .. } => {
                let scales = t.scales.as_ref().expect("NVFP4 scales");
                let mut b = self.stream.launch_builder(&self.k.nvfp4_to_bf16);
                b.arg(&t.codes)
                    .arg(scales)
                    .arg(&rows)
                    .arg(&pcols)
                    .arg(&mut out);
                // SAFETY: reads rows * padded_cols / 2 code bytes, writes rows * padded_cols.
                unsafe { b.launch(grid_stride_cfg(n / 2))? };
            }
            QuantFormat::Mx { element, .. } => {
                let scales = t.scales.as_ref().expect("MX scales");
                let elem = abi::mx_elem(element)?;
                let mut b = self.stream.launch_builder(&self.k.mx_to_bf16);
                b.arg(&t.codes)
                    .arg(scales)
                    .arg(&rows)
                    .arg(&pcols)
                    .arg(&elem)
                    .arg(&mut out);
                // SAFETY: as above.
                unsafe { b.launch(grid_stride_cfg(n))? };
            }
            QuantFormat::Fp8 { .. } => {
                // fp8(code) = dequantized value / scale_inv: decode with factor 1, then round
                // (exact) to BF16.
                let mut f = self.clone_meta(t)?;
                f.tensor_scale_inv = 1.0;
                let vals = self.dequantize_device(&f)?;
                return Ok((self.to_bf16(&vals)?, t.tensor_scale_inv));
            }
            f => return Err(KernelError::Unsupported(format!("{f:?} GEMM operands"))),
        }
        Ok((out, t.tensor_scale_inv))
    }

    fn clone_meta(&self, t: &DeviceQuantized) -> Result<DeviceQuantized> {
        Ok(DeviceQuantized {
            format: t.format,
            block: t.block,
            usage: t.usage,
            rows: t.rows,
            cols: t.cols,
            padded_rows: t.padded_rows,
            padded_cols: t.padded_cols,
            codes: self.stream.clone_dtod(&t.codes)?,
            codes_len: t.codes_len,
            scales: t
                .scales
                .as_ref()
                .map(|s| self.stream.clone_dtod(s))
                .transpose()?,
            amax: t.amax,
            tensor_scale_inv: t.tensor_scale_inv,
            hadamard: t.hadamard,
        })
    }
}

/// The GPU quantizers behind `quant`'s one interface: the same validated [`Quantizer`], a
/// [`DeviceMatrix`] in, a [`DeviceQuantized`] out whose [`DeviceQuantized::to_host`] equals
/// `quant`'s [`QuantizedTensor`] byte for byte (NVFP4 without Four Over Six, MXFP8 / MXFP4,
/// FP8; other formats are [`KernelError::Unsupported`]).
impl QuantizerBackend for GpuContext {
    type Source<'a> = &'a DeviceMatrix;
    type Quantized = DeviceQuantized;
    type Values = CudaSlice<f32>;
    type Error = KernelError;

    fn quantize(
        &self,
        q: &Quantizer,
        x: &DeviceMatrix,
        state: &mut QuantState,
    ) -> Result<DeviceQuantized> {
        let (row, col) = match q.usage() {
            Usage::Rowwise => (Some(q), None),
            Usage::Columnwise => (None, Some(q)),
        };
        single(self.prepare(x, row, col, state)?.run()?.finish_fp8(state)?)
    }

    fn dequantize(&self, t: &DeviceQuantized) -> Result<CudaSlice<f32>> {
        self.dequantize_device(t)
    }
}

fn single(pair: (Option<DeviceQuantized>, Option<DeviceQuantized>)) -> Result<DeviceQuantized> {
    match pair {
        (Some(t), None) | (None, Some(t)) => Ok(t),
        _ => Err(KernelError::Unsupported(
            "expected exactly one output".into(),
        )),
    }
}

fn dims(x: &DeviceMatrix) -> Dims {
    Dims {
        rows: x.rows,
        cols: x.cols,
    }
}

impl<'a> QuantJob<'a> {
    /// [`QuantJob::launch`], returning the job.
    pub fn run(mut self) -> Result<Self> {
        self.launch()?;
        Ok(self)
    }

    /// Enqueues the amax pass and the quantization kernel (asynchronous). Repeatable: each
    /// launch recomputes everything from the input.
    pub fn launch(&mut self) -> Result<()> {
        let gpu = self.gpu;
        let x = self.x;
        let p = &self.plan;
        gpu.stream.memset_zeros(&mut self.amax)?;
        match p.amax_pass {
            AmaxPass::None => {}
            AmaxPass::Plain => gpu.launch_amax(&x.data, x.rows * x.cols, &mut self.amax)?,
            AmaxPass::RhtCol => {
                let Args::Nvfp4(a) = &p.args else {
                    unreachable!("RHT amax pass of a non-NVFP4 plan")
                };
                let (rows, cols, mask) = (a.rows, a.cols, a.rht_mask);
                let mut b = gpu.stream.launch_builder(&gpu.k.amax_rht_col);
                b.arg(&x.data)
                    .arg(&rows)
                    .arg(&cols)
                    .arg(&mask)
                    .arg(&mut self.amax);
                // SAFETY: rows % 16 == 0 was checked by the plan; reads x, writes amax[0..4].
                unsafe { b.launch(cfg(p.amax_grid))? };
            }
        }
        let f = match &p.args {
            Args::Nvfp4(_) => &gpu.k.nvfp4_quantize,
            Args::Mx(_) => &gpu.k.mx_quantize,
            Args::Fp8(_) => &gpu.k.fp8_quantize,
        };
        let mut b = gpu.stream.launch_builder(f);
        match &p.args {
            Args::Nvfp4(a) => b.arg(a),
            Args::Mx(a) => b.arg(a),
            Args::Fp8(a) => b.arg(a),
        };
        // SAFETY: the argument struct points at live buffers sized by the plan.
        unsafe { b.launch(cfg(p.grid))? };
        Ok(())
    }

    /// Reads back the per-tensor values (synchronizes) and returns `(rowwise, columnwise)`.
    ///
    /// # Errors
    /// [`KernelError::NonFinite`] when the input (or its Hadamard transform) holds NaN or
    /// ±Inf (NVFP4 and MX reject it, as `quant` does); delayed FP8 scaling needs
    /// [`QuantJob::finish_fp8`].
    pub fn finish(self) -> Result<(Option<DeviceQuantized>, Option<DeviceQuantized>)> {
        if self.plan.delayed_fp8 {
            return Err(abi::invalid(
                "a delayed-scaling FP8 job must finish with finish_fp8(state)",
            ));
        }
        self.finish_inner(None)
    }

    /// [`QuantJob::finish`] that records the amax in `state` for delayed FP8 scaling (any
    /// job may finish this way; only delayed FP8 must).
    pub fn finish_fp8(
        self,
        state: &mut QuantState,
    ) -> Result<(Option<DeviceQuantized>, Option<DeviceQuantized>)> {
        self.finish_inner(Some(state))
    }

    fn finish_inner(
        self,
        state: Option<&mut QuantState>,
    ) -> Result<(Option<DeviceQuantized>, Option<DeviceQuantized>)> {
        let bits = self.gpu.download(&self.amax)?;
        let meta = self.gpu.download(&self.meta)?;
        let (rv, cv) = self.plan.results(&bits, &meta)?;
        if self.plan.delayed_fp8 {
            let state =
                state.ok_or_else(|| abi::invalid("delayed FP8 scaling needs a QuantState"))?;
            state.record_amax(f32::from_bits(bits[0]));
        }
        let mk = |o: Out, (amax, tsi): (f32, f32)| DeviceQuantized {
            format: o.side.format,
            block: o.side.block,
            usage: o.side.usage,
            rows: o.side.rows,
            cols: o.side.cols,
            padded_rows: o.side.padded_rows,
            padded_cols: o.side.padded_cols,
            codes: o.codes,
            codes_len: o.side.codes_len,
            scales: o.scales,
            amax,
            tensor_scale_inv: tsi,
            hadamard: o.side.mask,
        };
        let row = self.row.zip(rv).map(|(o, v)| mk(o, v));
        let col = self.col.zip(cv).map(|(o, v)| mk(o, v));
        Ok((row, col))
    }
}

fn cfg(grid: (u32, u32, u32)) -> LaunchConfig {
    LaunchConfig {
        grid_dim: grid,
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

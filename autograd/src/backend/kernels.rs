//! [`KernelBackend`]: the CUDA kernels of `kernels-cuda` behind the [`Backend`] trait, on any
//! `kernels_cuda::train::Launcher`: the GPU ([`CudaBackend`]) or the CPU emulator (feature
//! `cuda-emu`). The reduction chunking that autograd's CPU kernels use (which depends only on
//! sizes, never on the thread count) is applied here, so the kernels reproduce its sums.

use kernels_cuda::train::{Activation, Launcher, TrainOps};
use kernels_cuda::{probe, Gpu, GpuContext};

use super::{Act, AdamWCoeffs, Backend, BackendError, NormKind, Out, Result};
use crate::cpu::{rows_per_task, PAR_MIN};
use crate::AttentionProducts;

/// The training kernels on a device `L` (a `GpuContext`, or `&Emu`).
#[derive(Debug)]
pub struct KernelBackend<L> {
    dev: L,
    name: &'static str,
}

/// The CUDA backend: every op on the GPU.
pub type CudaBackend = KernelBackend<GpuContext>;

impl CudaBackend {
    /// Opens the first CUDA device and loads the kernels.
    ///
    /// # Errors
    /// [`BackendError::NoDevice`] without a driver or a compute capability 9.0+ GPU (the
    /// message says what to do); [`BackendError::PtxLoad`] if the driver cannot JIT the PTX.
    pub fn new() -> Result<CudaBackend> {
        match probe() {
            Gpu::Unavailable(reason) => Err(BackendError::NoDevice { reason }),
            Gpu::Ready(ctx) => {
                let gpu = GpuContext::new(ctx).map_err(|e| match e {
                    kernels_cuda::KernelError::Unsupported(reason) => {
                        BackendError::NoDevice { reason }
                    }
                    e => e.into(),
                })?;
                Ok(KernelBackend {
                    dev: gpu,
                    name: "cuda",
                })
            }
        }
    }

    /// The GPU context (for `kernels-cuda`'s quantizers and cuBLASLt GEMMs).
    pub fn gpu(&self) -> &GpuContext {
        &self.dev
    }
}

impl<L: Launcher> KernelBackend<L> {
    /// The kernels on `dev`, reported as `name`.
    pub fn with_launcher(dev: L, name: &'static str) -> Self {
        KernelBackend { dev, name }
    }

    /// The launcher (e.g. [`DeviceLauncher::pool_stats`](super::DeviceLauncher::pool_stats)).
    pub fn launcher(&self) -> &L {
        &self.dev
    }

    /// A quantized GEMM operand: the row-major `[rows, cols]` tensor `x` quantized by `q`
    /// (NVFP4, MX or FP8, with its usage, key and `state`) and dequantized without the
    /// per-tensor factor into `out` in the copy's stored layout (columnwise: `[cols, rows]`);
    /// returns the factor. The values and factor of quant's `fake_quantize_into`, bit for bit
    /// (`kernels_cuda::train_quant`).
    ///
    /// # Errors
    /// Lengths that do not match, formats the GPU quantizers do not run, NaN / ±Inf input to
    /// NVFP4 / MX, allocation failures.
    pub fn fake_quantize(
        &self,
        q: &quant::Quantizer,
        x: &L::Buf<f32>,
        dims: (usize, usize),
        state: &mut quant::QuantState,
        out: &mut L::Buf<f32>,
    ) -> Result<f32> {
        use kernels_cuda::train_quant::QuantOps;
        Ok(self.dev.fake_quantize(q, x, dims, state, out)?)
    }

    /// Batched `c_i = op(a_i) · op(b_i) (+ beta · c_i)` through strides
    /// (`kernels_cuda::train_bmm`): `matmul` / `matmul_t` on the device.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_batched(
        &self,
        batch: usize,
        mnk: (usize, usize, usize),
        a: (&L::Buf<f32>, kernels_cuda::train_bmm::Strided),
        b: (&L::Buf<f32>, kernels_cuda::train_bmm::Strided),
        beta: f32,
        c: &mut L::Buf<f32>,
    ) -> Result<()> {
        use kernels_cuda::train_bmm::BmmOps;
        Ok(self.dev.sgemm_batched(batch, mnk, 1.0, a, b, beta, c)?)
    }
}

impl<L: Launcher> KernelBackend<L> {
    /// A new buffer of `x` rounded to BF16 bits (nearest even, `nb_f32_to_bf16`): exact on
    /// values that are already BF16 (quantized operands without their per-tensor factor).
    ///
    /// # Errors
    /// Allocation failures.
    pub fn to_bf16(&self, x: &L::Buf<f32>) -> Result<L::Buf<u16>> {
        use kernels_cuda::train_tc::TensorCoreOps;
        let mut out = self.dev.zeros::<u16>(self.dev.len(x))?;
        self.dev.to_bf16_bits(x, &mut out)?;
        Ok(out)
    }

    /// A quantized tensor-core GEMM operand: `x` quantized by `q` as in
    /// [`KernelBackend::fake_quantize`], its values without the factor as BF16 bits in the
    /// copy's stored layout `[outer, ld]` (`ld` ≥ K, the padding zero); returns the buffer,
    /// `ld` and the factor (`kernels_cuda::train_quant::QuantOps::quantize_bf16`).
    ///
    /// # Errors
    /// As [`KernelBackend::fake_quantize`].
    pub fn quantize_bf16(
        &self,
        q: &quant::Quantizer,
        x: &L::Buf<f32>,
        dims: (usize, usize),
        state: &mut quant::QuantState,
    ) -> Result<(L::Buf<u16>, usize, f32)> {
        use kernels_cuda::train_quant::QuantOps;
        Ok(self.dev.quantize_bf16(q, x, dims, state)?)
    }

    /// [`KernelBackend::quantize_bf16`]'s first half: every kernel launched, nothing read
    /// back (`kernels_cuda::train_quant::QuantOps::quantize_bf16_start`).
    ///
    /// # Errors
    /// As [`KernelBackend::fake_quantize`], but for the non-finite check.
    pub fn quantize_bf16_start(
        &self,
        q: &quant::Quantizer,
        x: &L::Buf<f32>,
        dims: (usize, usize),
        state: &mut quant::QuantState,
    ) -> Result<kernels_cuda::train_quant::PendingBf16<L>> {
        use kernels_cuda::train_quant::QuantOps;
        Ok(self.dev.quantize_bf16_start(q, x, dims, state)?)
    }

    /// [`KernelBackend::quantize_bf16`]'s second half: the amax read back (one
    /// synchronisation for everything started before it), the factor, the non-finite check,
    /// FP8's state.
    ///
    /// # Errors
    /// NaN or ±Inf input to NVFP4 / MX; copy failures.
    pub fn quantize_bf16_finish(
        &self,
        p: kernels_cuda::train_quant::PendingBf16<L>,
        state: &mut quant::QuantState,
    ) -> Result<(L::Buf<u16>, usize, f32)> {
        use kernels_cuda::train_quant::QuantOps;
        Ok(self.dev.quantize_bf16_finish(p, state)?)
    }

    /// The tensor-core GEMM `c_i = α · op(a_i) · op(b_i) + β · c_i` on BF16 operands with
    /// f32 accumulation (`kernels_cuda::train_tc`: cuBLASLt on a GPU, its host reference
    /// under the emulator).
    ///
    /// # Errors
    /// Views that do not fit the buffers ([`Bf16Gemm::check`](kernels_cuda::train_tc::Bf16Gemm::check)),
    /// cuBLASLt failures.
    pub fn gemm_bf16(
        &self,
        g: &kernels_cuda::train_tc::Bf16Gemm,
        a: &L::Buf<u16>,
        b: &L::Buf<u16>,
        c: &mut L::Buf<f32>,
    ) -> Result<()> {
        use kernels_cuda::train_tc::TensorCoreOps;
        Ok(self.dev.gemm_tc(g, a, b, c)?)
    }
}

fn act(k: Act) -> Activation {
    match k {
        Act::Gelu => Activation::Gelu,
        Act::Silu => Activation::Silu,
    }
}

impl<L: Launcher> Backend for KernelBackend<L> {
    type Buf = L::Buf<f32>;

    fn name(&self) -> &'static str {
        self.name
    }

    fn zeros(&self, n: usize) -> Result<Self::Buf> {
        Ok(self.dev.zeros(n)?)
    }

    fn upload(&self, data: &[f32]) -> Result<Self::Buf> {
        Ok(self.dev.upload(data)?)
    }

    fn download(&self, b: &Self::Buf) -> Result<Vec<f32>> {
        Ok(self.dev.download(b)?)
    }

    fn len(&self, b: &Self::Buf) -> usize {
        self.dev.len(b)
    }

    fn add(&self, a: &Self::Buf, b: &Self::Buf, out: &mut Self::Buf) -> Result<()> {
        Ok(self.dev.add(a, b, out)?)
    }

    fn mul(&self, a: &Self::Buf, b: &Self::Buf, out: Out<'_, Self::Buf>) -> Result<()> {
        Ok(self.dev.mul(a, b, out)?)
    }

    fn scale(&self, x: &Self::Buf, s: f32, out: Out<'_, Self::Buf>) -> Result<()> {
        Ok(self.dev.scale(x, s, out)?)
    }

    fn copy_or_add(&self, src: &Self::Buf, out: Out<'_, Self::Buf>) -> Result<()> {
        Ok(self.dev.copy_or_add(src, out)?)
    }

    fn sum_rows(&self, src: &Self::Buf, n: usize, dst: Out<'_, Self::Buf>) -> Result<()> {
        // cpu.rs `sum_rows`: row by row below PAR_MIN elements, else chunks of rows_per_task
        let per = (self.dev.len(src) >= PAR_MIN).then(|| rows_per_task(n));
        Ok(self.dev.sum_rows(src, n, per, dst)?)
    }

    fn sum(&self, x: &Self::Buf, factor: f64, out: &mut Self::Buf) -> Result<()> {
        // reduce.rs `sum_f64`: one chunk below PAR_MIN, else 16K-element chunks
        let chunk = (self.dev.len(x) >= PAR_MIN).then_some(1 << 14);
        Ok(self.dev.sum_all(x, chunk, factor, out)?)
    }

    fn fill_scaled(&self, dy: &Self::Buf, factor: f64, out: Out<'_, Self::Buf>) -> Result<()> {
        Ok(self.dev.fill_scaled(dy, factor, out)?)
    }

    fn swap_axes(
        &self,
        src: &Self::Buf,
        dims: [usize; 4],
        a: usize,
        b: usize,
        out: Out<'_, Self::Buf>,
    ) -> Result<()> {
        Ok(self.dev.swap_axes(src, dims, a, b, out)?)
    }

    fn columns(
        &self,
        src: &Self::Buf,
        c: usize,
        off: usize,
        s: usize,
        add: bool,
        out: &mut Self::Buf,
    ) -> Result<()> {
        Ok(self.dev.columns(src, c, off, s, add, out)?)
    }

    fn round_bf16(&self, x: &Self::Buf, out: &mut Self::Buf) -> Result<()> {
        Ok(self.dev.round_bf16(x, out)?)
    }

    fn act_fwd(&self, kind: Act, x: &Self::Buf, y: &mut Self::Buf) -> Result<()> {
        Ok(self.dev.act_fwd(act(kind), x, y)?)
    }

    fn act_bwd(
        &self,
        kind: Act,
        x: &Self::Buf,
        dy: &Self::Buf,
        dx: Out<'_, Self::Buf>,
    ) -> Result<()> {
        Ok(self.dev.act_bwd(act(kind), x, dy, dx)?)
    }

    fn swiglu_fwd(&self, gate: &Self::Buf, up: &Self::Buf, y: &mut Self::Buf) -> Result<()> {
        Ok(self.dev.swiglu_fwd(gate, up, y)?)
    }

    fn swiglu_bwd(
        &self,
        gate: &Self::Buf,
        up: &Self::Buf,
        dy: &Self::Buf,
        dgate: Option<Out<'_, Self::Buf>>,
        dup: Option<Out<'_, Self::Buf>>,
    ) -> Result<()> {
        Ok(self.dev.swiglu_bwd(gate, up, dy, dgate, dup)?)
    }

    fn rmsnorm_fwd(
        &self,
        x: &Self::Buf,
        w: &Self::Buf,
        eps: f32,
        y: &mut Self::Buf,
        rstd: Option<&mut Self::Buf>,
    ) -> Result<()> {
        Ok(self.dev.rms_fwd(x, w, eps, y, rstd)?)
    }

    fn layernorm_fwd(
        &self,
        x: &Self::Buf,
        w: &Self::Buf,
        b: Option<&Self::Buf>,
        eps: f32,
        y: &mut Self::Buf,
        stats: Option<&mut Self::Buf>,
    ) -> Result<()> {
        Ok(self.dev.ln_fwd(x, w, b, eps, y, stats)?)
    }

    fn norm_bwd(
        &self,
        kind: NormKind,
        x: &Self::Buf,
        w: &Self::Buf,
        stats: &Self::Buf,
        dy: &Self::Buf,
        dx: Option<Out<'_, Self::Buf>>,
        dw: Option<Out<'_, Self::Buf>>,
        db: Option<Out<'_, Self::Buf>>,
    ) -> Result<()> {
        // norm.rs `norm_bwd`: all rows in one chunk below PAR_MIN elements, else rows_per_task
        let (n, d) = (self.dev.len(x), self.dev.len(w));
        let per = if n < PAR_MIN {
            (n / d.max(1)).max(1)
        } else {
            rows_per_task(d)
        };
        let layer = kind == NormKind::Layer;
        Ok(self.dev.norm_bwd(layer, x, w, stats, dy, per, dx, dw, db)?)
    }

    fn rope(
        &self,
        x: &Self::Buf,
        table: &Self::Buf,
        t: usize,
        d: usize,
        inverse: bool,
        out: Out<'_, Self::Buf>,
    ) -> Result<()> {
        Ok(self.dev.rope(x, table, t, d, inverse, out)?)
    }

    fn embedding_fwd(
        &self,
        table: &Self::Buf,
        d: usize,
        ids: &[u32],
        out: &mut Self::Buf,
    ) -> Result<()> {
        Ok(self.dev.embedding_fwd(table, d, ids, out)?)
    }

    fn embedding_bwd(
        &self,
        ids: &[u32],
        dy: &Self::Buf,
        d: usize,
        table_grad: Out<'_, Self::Buf>,
    ) -> Result<()> {
        Ok(self.dev.embedding_bwd(ids, dy, d, table_grad)?)
    }

    fn cross_entropy_fwd(
        &self,
        logits: &Self::Buf,
        v: usize,
        targets: &[u32],
        ignore: Option<u32>,
        stats: &mut Self::Buf,
        loss: &mut Self::Buf,
    ) -> Result<usize> {
        Ok(self
            .dev
            .cross_entropy_fwd(logits, v, targets, ignore, stats, loss)?)
    }

    fn cross_entropy_bwd(
        &self,
        logits: &Self::Buf,
        v: usize,
        targets: &[u32],
        ignore: Option<u32>,
        stats: &Self::Buf,
        dy: &Self::Buf,
        dx: Out<'_, Self::Buf>,
    ) -> Result<()> {
        Ok(self
            .dev
            .cross_entropy_bwd(logits, v, targets, ignore, stats, dy, dx)?)
    }

    fn attention_fwd(
        &self,
        q: &Self::Buf,
        k: &Self::Buf,
        v: &Self::Buf,
        bh: usize,
        t: usize,
        d: usize,
        products: AttentionProducts,
        o: &mut Self::Buf,
        lse: &mut Self::Buf,
    ) -> Result<()> {
        let bf16 = products == AttentionProducts::Bf16;
        Ok(self.dev.attention_fwd(q, k, v, bh, t, d, bf16, o, lse)?)
    }

    fn attention_bwd(
        &self,
        qkvo: [&Self::Buf; 4],
        lse: &Self::Buf,
        dout: &Self::Buf,
        bh: usize,
        t: usize,
        d: usize,
        products: AttentionProducts,
        dq: Out<'_, Self::Buf>,
        dk: Out<'_, Self::Buf>,
        dv: Out<'_, Self::Buf>,
    ) -> Result<()> {
        let [q, k, v, o] = qkvo;
        let bf16 = products == AttentionProducts::Bf16;
        Ok(self
            .dev
            .attention_bwd(q, k, v, o, lse, dout, bh, t, d, bf16, dq, dk, dv)?)
    }

    fn gemm(
        &self,
        m: usize,
        n: usize,
        k: usize,
        alpha: f32,
        a: &Self::Buf,
        ta: bool,
        b: &Self::Buf,
        tb: bool,
        beta: f32,
        c: &mut Self::Buf,
    ) -> Result<()> {
        for (what, len, want) in [("a", self.dev.len(a), m * k), ("b", self.dev.len(b), k * n)] {
            if len != want {
                return Err(BackendError::InvalidArgument(format!(
                    "gemm: {what} has {len} elements, expected {want}"
                )));
            }
        }
        let sa = if ta { (1, m) } else { (k, 1) };
        let sb = if tb { (1, k) } else { (n, 1) };
        Ok(self.dev.sgemm(m, n, k, alpha, a, sa, b, sb, beta, c)?)
    }

    fn grad_norm(&self, grads: &[&Self::Buf]) -> Result<f32> {
        Ok(self.dev.grad_norm(grads)?)
    }

    fn adamw(
        &self,
        p: &mut Self::Buf,
        g: &Self::Buf,
        m: &mut Self::Buf,
        v: &mut Self::Buf,
        c: &AdamWCoeffs,
    ) -> Result<()> {
        Ok(self.dev.adamw(p, g, m, v, c)?)
    }
}

//! The device boundary: a [`Backend`] lists every kernel the ops of a training step need, with
//! autograd's semantics (`(acc, buf)` outputs write or accumulate, as the ops' gradient
//! buffers do), so that an op body can be written once against `B: Backend` and run on the CPU
//! ([`CpuBackend`], delegating to the ops' CPU kernels) or on a GPU ([`CudaBackend`], the CUDA
//! kernels of `kernels-cuda`, bit-exact with the CPU kernels wherever the CPU's order of
//! operations is mirrored; see `kernels-cuda/README.md`).
//!
//! The same trait runs over `kernels-cuda`'s CPU emulator ([`KernelBackend`] over
//! `kernels_cuda::emu::Emu`, feature `cuda-emu`), which is how `tests/cuda_emulated.rs`
//! checks the CUDA kernels against the CPU ops without a GPU.
//!
//! A `Graph` runs on a device through [`DeviceBackend`] (the CUDA kernels on the GPU, or on
//! the emulator in tests): `ParamStore::to_device`, then every op's `Cuda` arm in
//! `ops/device/` calls these methods; see `docs/architecture.md` ("The device boundary").
//!
//! ```
//! use autograd::backend::{Backend, CpuBackend};
//! let cpu = CpuBackend;
//! let x = cpu.upload(&[1.0, -2.0, 3.0, 4.0])?;
//! let w = cpu.upload(&[1.0, 1.0])?;
//! let mut y = cpu.zeros(4)?;
//! cpu.rmsnorm_fwd(&x, &w, 0.0, &mut y, None)?;
//! let v = cpu.download(&y)?;
//! assert!((v[0] - 1.0 / 2.5f32.sqrt()).abs() < 1e-6);
//! # Ok::<(), autograd::backend::BackendError>(())
//! ```

mod cpu;
mod device;
mod error;
mod kernels;
mod optimizer;

pub use crate::ops::device::linear_blocker;
pub use cpu::CpuBackend;
pub use device::{DeviceBackend, DeviceBuf, DeviceLauncher, PoolStats};
pub use error::BackendError;
pub use kernels::{CudaBackend, KernelBackend};

use crate::AttentionProducts;
pub use kernels_cuda::train::AdamWCoeffs;
pub use optimizer::DeviceMoments;

/// `Result` with [`BackendError`].
pub type Result<T, E = BackendError> = std::result::Result<T, E>;

/// An output that is written (`acc == false`) or accumulated into (`acc == true`).
pub type Out<'a, B> = (bool, &'a mut B);

/// The pointwise non-linearities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    /// GELU, tanh approximation ([`crate::Graph::gelu`]).
    Gelu,
    /// SiLU ([`crate::Graph::silu`]).
    Silu,
}

/// The two norms ([`crate::Graph::rmsnorm`], [`crate::Graph::layernorm`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormKind {
    /// RMSNorm: statistics `1/rms` per row.
    Rms,
    /// LayerNorm: statistics `(mean, 1/std)` per row.
    Layer,
}

/// The kernels of a training step on one device. Buffers are flat f32 arrays; shapes are
/// passed explicitly and checked (a mismatch is [`BackendError::InvalidArgument`], never a
/// panic). Every method matches the named `Graph` op's CPU kernel.
pub trait Backend {
    /// An f32 buffer on the device.
    type Buf;
    /// A short name (`cpu`, `cuda`, `cuda-emulated`).
    fn name(&self) -> &'static str;
    /// `n` zeros.
    fn zeros(&self, n: usize) -> Result<Self::Buf>;
    /// A copy of host data.
    fn upload(&self, data: &[f32]) -> Result<Self::Buf>;
    /// A copy on the host.
    fn download(&self, b: &Self::Buf) -> Result<Vec<f32>>;
    /// Number of elements.
    fn len(&self, b: &Self::Buf) -> usize;

    /// [`crate::Graph::add`]: `out = a + b`, `b` repeating over `a`.
    fn add(&self, a: &Self::Buf, b: &Self::Buf, out: &mut Self::Buf) -> Result<()>;
    /// [`crate::Graph::mul`] and its backward: `out (+)= a ⊙ b`, `b` repeating over `a`.
    fn mul(&self, a: &Self::Buf, b: &Self::Buf, out: Out<'_, Self::Buf>) -> Result<()>;
    /// [`crate::Graph::scale`]: `out (+)= s · x`.
    fn scale(&self, x: &Self::Buf, s: f32, out: Out<'_, Self::Buf>) -> Result<()>;
    /// Gradient pass-through: `out (+)= src`.
    fn copy_or_add(&self, src: &Self::Buf, out: Out<'_, Self::Buf>) -> Result<()>;
    /// Broadcast backward (bias gradients): column sums of `[rows, n]` into `dst: [n]`.
    fn sum_rows(&self, src: &Self::Buf, n: usize, dst: Out<'_, Self::Buf>) -> Result<()>;
    /// [`crate::Graph::sum`] / [`crate::Graph::mean`]: `(f32)(Σ x · factor)` summed in f64.
    fn sum(&self, x: &Self::Buf, factor: f64, out: &mut Self::Buf) -> Result<()>;
    /// Backward of `sum` / `mean`: `out (+)= (f32)(dy[0] · factor)`.
    fn fill_scaled(&self, dy: &Self::Buf, factor: f64, out: Out<'_, Self::Buf>) -> Result<()>;
    /// [`crate::Graph::transpose`] / `split_heads` / `merge_heads`: `out (+)= src` seen as 4-D
    /// `dims` with axes `a < b` swapped.
    fn swap_axes(
        &self,
        src: &Self::Buf,
        dims: [usize; 4],
        a: usize,
        b: usize,
        out: Out<'_, Self::Buf>,
    ) -> Result<()>;
    /// [`crate::Graph::split`]: columns `off .. off + s` of the rows of `c` of `src` into
    /// `out: [rows, s]`, or (`add`, the backward) `src: [rows, s]` added into those columns of
    /// `out`.
    fn columns(
        &self,
        src: &Self::Buf,
        c: usize,
        off: usize,
        s: usize,
        add: bool,
        out: &mut Self::Buf,
    ) -> Result<()>;
    /// [`crate::Graph::round_bf16`].
    fn round_bf16(&self, x: &Self::Buf, out: &mut Self::Buf) -> Result<()>;
    /// GELU / SiLU forward.
    fn act_fwd(&self, kind: Act, x: &Self::Buf, y: &mut Self::Buf) -> Result<()>;
    /// GELU / SiLU backward: `dx (+)= dy · f'(x)`.
    fn act_bwd(
        &self,
        kind: Act,
        x: &Self::Buf,
        dy: &Self::Buf,
        dx: Out<'_, Self::Buf>,
    ) -> Result<()>;
    /// [`crate::Graph::swiglu`]: `y = silu(gate) ⊙ up`.
    fn swiglu_fwd(&self, gate: &Self::Buf, up: &Self::Buf, y: &mut Self::Buf) -> Result<()>;
    /// SwiGLU backward into the wanted gradients.
    fn swiglu_bwd(
        &self,
        gate: &Self::Buf,
        up: &Self::Buf,
        dy: &Self::Buf,
        dgate: Option<Out<'_, Self::Buf>>,
        dup: Option<Out<'_, Self::Buf>>,
    ) -> Result<()>;
    /// RMSNorm forward over rows of `w.len()`; `rstd` (one per row) when wanted.
    fn rmsnorm_fwd(
        &self,
        x: &Self::Buf,
        w: &Self::Buf,
        eps: f32,
        y: &mut Self::Buf,
        rstd: Option<&mut Self::Buf>,
    ) -> Result<()>;
    /// LayerNorm forward; `stats` (two per row) when wanted.
    fn layernorm_fwd(
        &self,
        x: &Self::Buf,
        w: &Self::Buf,
        b: Option<&Self::Buf>,
        eps: f32,
        y: &mut Self::Buf,
        stats: Option<&mut Self::Buf>,
    ) -> Result<()>;
    /// Backward of both norms.
    #[allow(clippy::too_many_arguments)]
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
    ) -> Result<()>;
    /// [`crate::Graph::rope`] on `[.., t, d]` with the op's f64 table
    /// (`rope_table(t, d, base, offset)`); `inverse` is the backward pass.
    #[allow(clippy::too_many_arguments)]
    fn rope(
        &self,
        x: &Self::Buf,
        table: &Self::Buf,
        t: usize,
        d: usize,
        inverse: bool,
        out: Out<'_, Self::Buf>,
    ) -> Result<()>;
    /// [`crate::Graph::embedding`]: rows of a `[V, d]` table.
    fn embedding_fwd(
        &self,
        table: &Self::Buf,
        d: usize,
        ids: &[u32],
        out: &mut Self::Buf,
    ) -> Result<()>;
    /// Embedding backward: scatter-add in position order.
    fn embedding_bwd(
        &self,
        ids: &[u32],
        dy: &Self::Buf,
        d: usize,
        table_grad: Out<'_, Self::Buf>,
    ) -> Result<()>;
    /// [`crate::Graph::cross_entropy`]: per-row `(loss, lse)` in `stats`, the mean in `loss`;
    /// returns the number of counted rows.
    fn cross_entropy_fwd(
        &self,
        logits: &Self::Buf,
        v: usize,
        targets: &[u32],
        ignore: Option<u32>,
        stats: &mut Self::Buf,
        loss: &mut Self::Buf,
    ) -> Result<usize>;
    /// Cross-entropy backward (`dy`: the loss gradient, one element).
    #[allow(clippy::too_many_arguments)]
    fn cross_entropy_bwd(
        &self,
        logits: &Self::Buf,
        v: usize,
        targets: &[u32],
        ignore: Option<u32>,
        stats: &Self::Buf,
        dy: &Self::Buf,
        dx: Out<'_, Self::Buf>,
    ) -> Result<()>;
    /// [`crate::Graph::causal_attention_with`] forward on `[bh, t, d]`: `o` and `lse`
    /// (`bh · t`), the products in the arithmetic `products`.
    #[allow(clippy::too_many_arguments)]
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
    ) -> Result<()>;
    /// Causal attention backward, the products in the arithmetic `products`.
    #[allow(clippy::too_many_arguments)]
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
    ) -> Result<()>;
    /// `c = alpha · op(a) · op(b) + beta · c` for row-major `c: [m, n]`; `op(a): [m, k]` is `a`
    /// (`[m, k]`) or, with `ta`, `aᵀ` of `a: [k, m]`; likewise `op(b): [k, n]`. FP32 products
    /// (the linear op's FP32 policy; quantized policies dequantize their operands first).
    #[allow(clippy::too_many_arguments)]
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
    ) -> Result<()>;
    /// optim's `grad_norm` of all `grads` as one vector.
    fn grad_norm(&self, grads: &[&Self::Buf]) -> Result<f32>;
    /// One AdamW step (optim's arithmetic) with coefficients from [`AdamWCoeffs::new`].
    fn adamw(
        &self,
        p: &mut Self::Buf,
        g: &Self::Buf,
        m: &mut Self::Buf,
        v: &mut Self::Buf,
        c: &AdamWCoeffs,
    ) -> Result<()>;
}

/// autograd's RoPE table (`[t, d/2]` cosines then sines, computed in f64), for
/// [`Backend::rope`].
pub fn rope_table(t: usize, d: usize, base: f32, offset: usize) -> Vec<f32> {
    crate::ops::rope::rope_table(t, d, base, offset)
}

//! The training-step kernels (`cuda/{activation,attention,cross_entropy,elementwise,embedding,
//! gemm,norm,optim,rope}.cu`) behind one launcher, so that the same host code drives them on a
//! GPU ([`crate::GpuContext`]) and on the CPU through the emulator (`emu::Emu`, feature `emu`).
//!
//! [`Launcher`] is the device: buffers, copies and a raw launch of a kernel by name with an
//! [`Arg`] list. [`TrainOps`] (implemented for every launcher) is the safe layer: one method per
//! op of autograd's training step, checking every length before launching, composing the
//! multi-kernel ops (norm backward, column sums, cross-entropy, attention backward, gradient
//! norm) and doing the small host-side preparation (the embedding backward's CSR, the gradient
//! norm's chunk table). Every op gives the same bits on every run (no atomics), and the same
//! bits as autograd's CPU op where the CPU's order of operations is mirrored (all but attention
//! and the f32 GEMM; see `autograd/tests/cuda_emulated.rs` for the bounds).
//!
//! ```
//! use kernels_cuda::train::{AdamWCoeffs, Activation};
//! // optim's coefficients of step 1 at lr 1e-3, weight decay 0.1, betas (0.9, 0.95), eps 1e-8
//! let c = AdamWCoeffs::new(1e-3, 0.1, 0.9, 0.95, 1e-8, 1, 1.0);
//! assert_eq!(c.decay, (1.0 - 1e-3f32 as f64 * 0.1f32 as f64) as f32);
//! assert_eq!(Activation::Gelu as i32, 0);
//! ```

use crate::{KernelError, Result};

/// Threads per block of every training kernel (the emulator runs exactly this many).
pub const THREADS: u32 = 256;
/// Rows per block of the warp-per-row kernels (norms, cross-entropy, attention).
pub const ROWS_PER_BLOCK: usize = 8;
/// The largest head dimension the attention kernels take.
pub const MAX_HEAD_DIM: usize = 128;
/// Gradient-norm chunk length (optim's `CHUNK`).
pub const NORM_CHUNK: usize = 16 * 1024;

/// One kernel parameter, in declaration order.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    /// A device pointer (0 for a null pointer).
    Ptr(u64),
    /// `int`.
    I32(i32),
    /// `long long`.
    I64(i64),
    /// `u64` (`unsigned long long`).
    U64(u64),
    /// `float`.
    F32(f32),
    /// `double`.
    F64(f64),
    /// `AdamWCoeffs`, by value.
    AdamW(AdamWCoeffs),
    /// A quantization kernel's argument struct (`Nvfp4Args`, `MxArgs`, `Fp8Args`), by value.
    Quant(crate::abi::Args),
}

/// Element types of device buffers.
pub trait Elem:
    cudarc::driver::DeviceRepr
    + cudarc::driver::ValidAsZeroBits
    + Copy
    + Default
    + Send
    + Sync
    + Unpin
    + std::fmt::Debug
    + 'static
{
    /// All bits set (a NaN for floats): what the emulator fills [`Launcher::scratch`] with,
    /// so that a read of scratch that was never written shows.
    const POISON: Self;
}
impl Elem for u8 {
    const POISON: Self = u8::MAX;
}
impl Elem for u16 {
    const POISON: Self = u16::MAX;
}
impl Elem for f32 {
    const POISON: Self = f32::from_bits(u32::MAX);
}
impl Elem for f64 {
    const POISON: Self = f64::from_bits(u64::MAX);
}
impl Elem for u32 {
    const POISON: Self = u32::MAX;
}
impl Elem for u64 {
    const POISON: Self = u64::MAX;
}

/// A device that runs the training kernels: the GPU, or the CPU emulator.
pub trait Launcher {
    /// A buffer of `T` on the device.
    type Buf<T: Elem>;
    /// A zero-filled buffer of `n` elements.
    fn zeros<T: Elem>(&self, n: usize) -> Result<Self::Buf<T>>;
    /// A buffer of `n` elements with unspecified contents, for scratch whose every element is
    /// written before it is read: no fill on a GPU, [`Elem::POISON`] under the emulator. The
    /// default is [`Launcher::zeros`].
    fn scratch<T: Elem>(&self, n: usize) -> Result<Self::Buf<T>> {
        self.zeros(n)
    }
    /// A copy of host data on the device.
    fn upload<T: Elem>(&self, data: &[T]) -> Result<Self::Buf<T>>;
    /// A copy of device data on the host (synchronizes).
    fn download<T: Elem>(&self, b: &Self::Buf<T>) -> Result<Vec<T>>;
    /// Number of elements.
    fn len<T: Elem>(&self, b: &Self::Buf<T>) -> usize;
    /// The buffer's device address (kernels may write through it).
    fn ptr<T: Elem>(&self, b: &Self::Buf<T>) -> u64;
    /// Blocks for a grid-stride kernel over `n` elements (any count gives the same result).
    fn grid_stride_blocks(&self, n: usize) -> u32;
    /// Launches `kernel` on a `grid` of 256-thread blocks.
    ///
    /// # Safety
    /// `args` must match the kernel's parameter list and every pointer must be valid for the
    /// accesses the kernel makes with the other arguments.
    unsafe fn launch(&self, kernel: &'static str, grid: (u32, u32), args: &[Arg]) -> Result<()>;
    /// Runs the tensor-core GEMM `g` ([`crate::train_tc`]): cuBLASLt on a GPU, the host
    /// reference under the emulator.
    ///
    /// # Safety
    /// `p.a` and `p.b` must hold BF16 operands and `p.c` f32 output covering every element
    /// `g` reads and writes ([`crate::train_tc::Bf16Gemm::check`] against their lengths).
    unsafe fn launch_gemm_bf16(
        &self,
        g: &crate::train_tc::Bf16Gemm,
        p: crate::train_tc::Bf16GemmPtrs,
    ) -> Result<()>;
}

/// The pointwise non-linearities of `cuda/activation.cu`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// GELU, tanh approximation.
    Gelu = 0,
    /// SiLU.
    Silu = 1,
}

/// optim's AdamW coefficients of one step (scalars in f64, rounded to f32 once, as optim and
/// PyTorch do); the layout of `AdamWCoeffs` in `cuda/optim.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWCoeffs {
    /// Multiplier on the gradient (clip coefficient, 1/loss scale).
    pub grad_scale: f32,
    /// `1 - lr * wd`.
    pub decay: f32,
    /// `1 - beta1`.
    pub w1: f32,
    /// `1 - w1` in f32.
    pub one_minus_w1: f32,
    /// `beta2`.
    pub beta2: f32,
    /// `1 - beta2`.
    pub one_minus_beta2: f32,
    /// `sqrt(1 - beta2^t)`.
    pub bc2_sqrt: f32,
    /// `eps`.
    pub eps: f32,
    /// `-lr / (1 - beta1^t)`.
    pub neg_step_size: f32,
    /// 1 when `w1 < 0.5` (PyTorch's lerp form `m + w1 (g - m)`), else 0.
    pub small_w1: i32,
}

// SAFETY: plain-old-data, repr(C), the layout of the kernel's struct (ten 4-byte fields).
unsafe impl cudarc::driver::DeviceRepr for AdamWCoeffs {}

impl AdamWCoeffs {
    /// The coefficients of step `t` (counted from 1) at learning rate `lr` (already multiplied
    /// by the group's scale, in f32, as optim does) and weight decay `wd`.
    pub fn new(
        lr: f32,
        wd: f32,
        beta1: f32,
        beta2: f32,
        eps: f32,
        t: u64,
        grad_scale: f32,
    ) -> Self {
        let (lr64, wd) = (lr as f64, wd as f64);
        let (b1, b2) = (beta1 as f64, beta2 as f64);
        let tf = t as f64;
        let bc1 = 1.0 - b1.powf(tf);
        let bc2 = 1.0 - b2.powf(tf);
        let w1 = (1.0 - b1) as f32;
        AdamWCoeffs {
            grad_scale,
            decay: (1.0 - lr64 * wd) as f32,
            w1,
            one_minus_w1: 1.0 - w1,
            beta2,
            one_minus_beta2: (1.0 - b2) as f32,
            bc2_sqrt: bc2.sqrt() as f32,
            eps,
            neg_step_size: (-(lr64 / bc1)) as f32,
            small_w1: i32::from(w1 < 0.5),
        }
    }
}

fn bad(msg: String) -> KernelError {
    KernelError::InvalidArgument(msg)
}

pub(crate) fn i32_of(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| bad(format!("{what} = {v} exceeds the kernels' int range")))
}

pub(crate) fn u32_of(what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| bad(format!("{what} = {v} exceeds the grid limit")))
}

fn same_len(op: &str, what: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(bad(format!(
            "{op}: {what} has {got} elements, expected {want}"
        )));
    }
    Ok(())
}

/// The embedding backward's CSR: positions sorted by id (stable), `offsets[v]..offsets[v+1]`
/// indexing `order` for id `v`.
///
/// ```
/// let (off, order) = kernels_cuda::train::embedding_csr(&[2, 0, 2], 3).unwrap();
/// assert_eq!((off, order), (vec![0, 1, 1, 3], vec![1, 0, 2]));
/// ```
pub fn embedding_csr(ids: &[u32], vocab: usize) -> Result<(Vec<u32>, Vec<u32>)> {
    u32_of("embedding rows", ids.len())?;
    let mut counts = vec![0u32; vocab + 1];
    for &i in ids {
        if i as usize >= vocab {
            return Err(bad(format!(
                "embedding: id {i} out of range for {vocab} rows"
            )));
        }
        counts[i as usize + 1] += 1;
    }
    for v in 0..vocab {
        counts[v + 1] += counts[v];
    }
    let mut next = counts.clone();
    let mut order = vec![0u32; ids.len()];
    for (r, &i) in ids.iter().enumerate() {
        order[next[i as usize] as usize] = r as u32;
        next[i as usize] += 1;
    }
    Ok((counts, order))
}

/// The training-step ops on any [`Launcher`]: length checks, launches, composition.
/// `(acc, buf)` outputs write (`acc == false`) or add (`acc == true`), as autograd's kernels.
pub trait TrainOps: Launcher {
    /// `out = a + b`, `b` repeating over `a` (`a.len()` a multiple of `b.len()`).
    fn add(&self, a: &Self::Buf<f32>, b: &Self::Buf<f32>, out: &mut Self::Buf<f32>) -> Result<()> {
        let (n, nb) = (self.len(a), self.len(b));
        if n > 0 && (nb == 0 || n % nb != 0) {
            return Err(bad(format!("add: {nb} elements do not tile {n}")));
        }
        same_len("add", "out", self.len(out), n)?;
        let args = [
            Arg::Ptr(self.ptr(a)),
            Arg::Ptr(self.ptr(b)),
            Arg::U64(nb as u64),
            Arg::U64(n as u64),
            Arg::Ptr(self.ptr(out)),
        ];
        // SAFETY: reads n and nb elements, writes n.
        unsafe { self.launch("nb_add", (self.grid_stride_blocks(n), 1), &args) }
    }

    /// `out (+)= a ⊙ b`, `b` repeating over `a`.
    fn mul(
        &self,
        a: &Self::Buf<f32>,
        b: &Self::Buf<f32>,
        out: (bool, &mut Self::Buf<f32>),
    ) -> Result<()> {
        let (n, nb) = (self.len(a), self.len(b));
        if n > 0 && (nb == 0 || n % nb != 0) {
            return Err(bad(format!("mul: {nb} elements do not tile {n}")));
        }
        same_len("mul", "out", self.len(out.1), n)?;
        let args = [
            Arg::Ptr(self.ptr(a)),
            Arg::Ptr(self.ptr(b)),
            Arg::U64(nb as u64),
            Arg::U64(n as u64),
            Arg::I32(out.0 as i32),
            Arg::Ptr(self.ptr(out.1)),
        ];
        // SAFETY: as add.
        unsafe { self.launch("nb_mul", (self.grid_stride_blocks(n), 1), &args) }
    }

    /// `out (+)= s · x`.
    fn scale(&self, x: &Self::Buf<f32>, s: f32, out: (bool, &mut Self::Buf<f32>)) -> Result<()> {
        let n = self.len(x);
        same_len("scale", "out", self.len(out.1), n)?;
        let args = [
            Arg::Ptr(self.ptr(x)),
            Arg::F32(s),
            Arg::U64(n as u64),
            Arg::I32(out.0 as i32),
            Arg::Ptr(self.ptr(out.1)),
        ];
        // SAFETY: reads and writes n elements.
        unsafe { self.launch("nb_scale", (self.grid_stride_blocks(n), 1), &args) }
    }

    /// `out (+)= src`.
    fn copy_or_add(&self, src: &Self::Buf<f32>, out: (bool, &mut Self::Buf<f32>)) -> Result<()> {
        let n = self.len(src);
        same_len("copy_or_add", "out", self.len(out.1), n)?;
        let args = [
            Arg::Ptr(self.ptr(src)),
            Arg::U64(n as u64),
            Arg::I32(out.0 as i32),
            Arg::Ptr(self.ptr(out.1)),
        ];
        // SAFETY: reads and writes n elements.
        unsafe { self.launch("nb_copy_or_add", (self.grid_stride_blocks(n), 1), &args) }
    }

    /// `out (+)= src` seen as 4-D `dims` with axes `a` and `b` swapped (autograd's
    /// `transpose` / `split_heads` / `merge_heads`; their backward is the same swap of the
    /// output dims).
    fn swap_axes(
        &self,
        src: &Self::Buf<f32>,
        dims: [usize; 4],
        a: usize,
        b: usize,
        out: (bool, &mut Self::Buf<f32>),
    ) -> Result<()> {
        let n = dims.iter().try_fold(1usize, |p, &d| p.checked_mul(d));
        let n = n.ok_or_else(|| bad(format!("swap_axes: dims {dims:?} overflow")))?;
        if a > 3 || b > 3 {
            return Err(bad(format!("swap_axes: axes ({a}, {b}) out of range")));
        }
        same_len("swap_axes", "src", self.len(src), n)?;
        same_len("swap_axes", "out", self.len(out.1), n)?;
        if n == 0 {
            return Ok(());
        }
        let mut st = [1usize; 4];
        for i in (0..3).rev() {
            st[i] = st[i + 1] * dims[i + 1];
        }
        let (mut od, mut os) = (dims, st);
        od.swap(a, b);
        os.swap(a, b);
        let mut args = vec![Arg::Ptr(self.ptr(src))];
        args.extend(od[1..].iter().chain(&os).map(|&v| Arg::U64(v as u64)));
        args.extend([
            Arg::U64(n as u64),
            Arg::I32(out.0 as i32),
            Arg::Ptr(self.ptr(out.1)),
        ]);
        // SAFETY: every source index is a permutation of 0..n; writes n elements.
        unsafe { self.launch("nb_permute4", (self.grid_stride_blocks(n), 1), &args) }
    }

    /// Columns `off .. off + s` of the rows of `c` of `src` into `out` (`add == false`, `out`
    /// is `[rows, s]`), or `src: [rows, s]` added into those columns of `out` (`add == true`):
    /// autograd's `split` and its backward.
    fn columns(
        &self,
        src: &Self::Buf<f32>,
        c: usize,
        off: usize,
        s: usize,
        add: bool,
        out: &mut Self::Buf<f32>,
    ) -> Result<()> {
        let (full, part) = if add {
            (self.len(out), self.len(src))
        } else {
            (self.len(src), self.len(out))
        };
        if c == 0 || full % c != 0 || off.checked_add(s).is_none_or(|e| e > c) {
            return Err(bad(format!(
                "columns: {off}..{off}+{s} of rows of {c} in {full} elements"
            )));
        }
        let rows = full / c;
        same_len("columns", "part", part, rows * s)?;
        if part == 0 {
            return Ok(());
        }
        let name = if add { "nb_cols_add" } else { "nb_cols_get" };
        let args = [
            Arg::Ptr(self.ptr(src)),
            Arg::U64(c as u64),
            Arg::U64(off as u64),
            Arg::U64(s as u64),
            Arg::U64(part as u64),
            Arg::Ptr(self.ptr(out)),
        ];
        // SAFETY: indices stay within rows x c and rows x s.
        unsafe { self.launch(name, (self.grid_stride_blocks(part), 1), &args) }
    }

    /// `out (+)= (f32)(dy[0] · factor)` in every element (backward of `sum` / `mean`).
    fn fill_scaled(
        &self,
        dy: &Self::Buf<f32>,
        factor: f64,
        out: (bool, &mut Self::Buf<f32>),
    ) -> Result<()> {
        same_len("fill_scaled", "dy", self.len(dy), 1)?;
        let n = self.len(out.1);
        let args = [
            Arg::Ptr(self.ptr(dy)),
            Arg::F64(factor),
            Arg::U64(n as u64),
            Arg::I32(out.0 as i32),
            Arg::Ptr(self.ptr(out.1)),
        ];
        // SAFETY: reads one element, writes n.
        unsafe { self.launch("nb_fill_scaled", (self.grid_stride_blocks(n), 1), &args) }
    }

    /// `out = round_to_bf16(x)`.
    fn round_bf16(&self, x: &Self::Buf<f32>, out: &mut Self::Buf<f32>) -> Result<()> {
        let n = self.len(x);
        same_len("round_bf16", "out", self.len(out), n)?;
        let args = [
            Arg::Ptr(self.ptr(x)),
            Arg::U64(n as u64),
            Arg::Ptr(self.ptr(out)),
        ];
        // SAFETY: reads and writes n elements.
        unsafe { self.launch("nb_round_bf16", (self.grid_stride_blocks(n), 1), &args) }
    }

    /// Column sums of a row-major `[rows, n]` matrix into `dst: [n]`: `per == None` adds the
    /// rows one by one (autograd's small-input path), `Some(per)` sums chunks of `per` rows
    /// first and then the chunks in order (its parallel path).
    fn sum_rows(
        &self,
        src: &Self::Buf<f32>,
        n: usize,
        per: Option<usize>,
        dst: (bool, &mut Self::Buf<f32>),
    ) -> Result<()> {
        let len = self.len(src);
        same_len("sum_rows", "dst", self.len(dst.1), n)?;
        if n == 0 {
            return Ok(());
        }
        if len % n != 0 {
            return Err(bad(format!("sum_rows: {len} elements are not rows of {n}")));
        }
        let rows = len / n;
        let finish = |part: u64, nparts: usize| -> Result<()> {
            let args = [
                Arg::Ptr(part),
                Arg::U64(nparts as u64),
                Arg::U64(n as u64),
                Arg::I32(dst.0 as i32),
                Arg::Ptr(self.ptr(dst.1)),
            ];
            // SAFETY: reads nparts * n partials, reads and writes n outputs.
            unsafe { self.launch("nb_sum_rows_finish", (self.grid_stride_blocks(n), 1), &args) }
        };
        match per {
            None => finish(self.ptr(src), rows),
            Some(per) => {
                let per = per.max(1);
                let nchunks = rows.div_ceil(per);
                let part: Self::Buf<f32> = self.zeros(nchunks * n)?;
                let args = [
                    Arg::Ptr(self.ptr(src)),
                    Arg::U64(rows as u64),
                    Arg::U64(n as u64),
                    Arg::U64(per as u64),
                    Arg::U64(nchunks as u64),
                    Arg::Ptr(self.ptr(&part)),
                ];
                // SAFETY: reads rows * n elements, writes nchunks * n partials.
                unsafe {
                    self.launch(
                        "nb_sum_rows_part",
                        (self.grid_stride_blocks(nchunks * n), 1),
                        &args,
                    )?
                };
                finish(self.ptr(&part), nchunks)
            }
        }
    }

    /// `out[0] = (f32)(Σ x (in f64) · factor)`: chunks of `chunk` elements summed in order
    /// (`None`: one chunk), as autograd's `sum` / `mean`.
    fn sum_all(
        &self,
        x: &Self::Buf<f32>,
        chunk: Option<usize>,
        factor: f64,
        out: &mut Self::Buf<f32>,
    ) -> Result<()> {
        same_len("sum_all", "out", self.len(out), 1)?;
        let n = self.len(x);
        let chunk = chunk.unwrap_or(n).max(1);
        let nchunks = n.div_ceil(chunk);
        let part: Self::Buf<f64> = self.zeros(nchunks.max(1))?;
        let args = [
            Arg::Ptr(self.ptr(x)),
            Arg::U64(n as u64),
            Arg::U64(chunk as u64),
            Arg::U64(nchunks as u64),
            Arg::Ptr(self.ptr(&part)),
        ];
        // SAFETY: reads n elements, writes nchunks partials.
        unsafe {
            self.launch(
                "nb_sum_f64_part",
                (self.grid_stride_blocks(nchunks), 1),
                &args,
            )?
        };
        let args = [
            Arg::Ptr(self.ptr(&part)),
            Arg::U64(nchunks as u64),
            Arg::F64(factor),
            Arg::Ptr(self.ptr(out)),
        ];
        // SAFETY: reads nchunks partials, writes one element.
        unsafe { self.launch("nb_sum_f64_finish", (1, 1), &args) }
    }

    /// `y = f(x)`.
    fn act_fwd(&self, kind: Activation, x: &Self::Buf<f32>, y: &mut Self::Buf<f32>) -> Result<()> {
        let n = self.len(x);
        same_len("activation", "y", self.len(y), n)?;
        let args = [
            Arg::Ptr(self.ptr(x)),
            Arg::U64(n as u64),
            Arg::I32(kind as i32),
            Arg::Ptr(self.ptr(y)),
        ];
        // SAFETY: reads and writes n elements.
        unsafe { self.launch("nb_act_fwd", (self.grid_stride_blocks(n), 1), &args) }
    }

    /// `dx (+)= dy · f'(x)`.
    fn act_bwd(
        &self,
        kind: Activation,
        x: &Self::Buf<f32>,
        dy: &Self::Buf<f32>,
        dx: (bool, &mut Self::Buf<f32>),
    ) -> Result<()> {
        let n = self.len(x);
        same_len("activation backward", "dy", self.len(dy), n)?;
        same_len("activation backward", "dx", self.len(dx.1), n)?;
        let args = [
            Arg::Ptr(self.ptr(x)),
            Arg::Ptr(self.ptr(dy)),
            Arg::U64(n as u64),
            Arg::I32(kind as i32),
            Arg::I32(dx.0 as i32),
            Arg::Ptr(self.ptr(dx.1)),
        ];
        // SAFETY: reads and writes n elements.
        unsafe { self.launch("nb_act_bwd", (self.grid_stride_blocks(n), 1), &args) }
    }

    /// `y = silu(gate) ⊙ up`.
    fn swiglu_fwd(
        &self,
        gate: &Self::Buf<f32>,
        up: &Self::Buf<f32>,
        y: &mut Self::Buf<f32>,
    ) -> Result<()> {
        let n = self.len(gate);
        same_len("swiglu", "up", self.len(up), n)?;
        same_len("swiglu", "y", self.len(y), n)?;
        let args = [
            Arg::Ptr(self.ptr(gate)),
            Arg::Ptr(self.ptr(up)),
            Arg::U64(n as u64),
            Arg::Ptr(self.ptr(y)),
        ];
        // SAFETY: reads and writes n elements.
        unsafe { self.launch("nb_swiglu_fwd", (self.grid_stride_blocks(n), 1), &args) }
    }

    /// SwiGLU backward into the wanted gradients.
    fn swiglu_bwd(
        &self,
        gate: &Self::Buf<f32>,
        up: &Self::Buf<f32>,
        dy: &Self::Buf<f32>,
        dgate: Option<(bool, &mut Self::Buf<f32>)>,
        dup: Option<(bool, &mut Self::Buf<f32>)>,
    ) -> Result<()> {
        let n = self.len(gate);
        same_len("swiglu backward", "up", self.len(up), n)?;
        same_len("swiglu backward", "dy", self.len(dy), n)?;
        let out = |o: &Option<(bool, &mut Self::Buf<f32>)>| -> Result<(i32, u64)> {
            match o {
                Some((acc, b)) => {
                    same_len("swiglu backward", "gradient", self.len(b), n)?;
                    Ok((*acc as i32, self.ptr(b)))
                }
                None => Ok((0, 0)),
            }
        };
        let ((ag, pg), (au, pu)) = (out(&dgate)?, out(&dup)?);
        let args = [
            Arg::Ptr(self.ptr(gate)),
            Arg::Ptr(self.ptr(up)),
            Arg::Ptr(self.ptr(dy)),
            Arg::U64(n as u64),
            Arg::I32(ag),
            Arg::Ptr(pg),
            Arg::I32(au),
            Arg::Ptr(pu),
        ];
        // SAFETY: reads and writes n elements (null outputs are skipped).
        unsafe { self.launch("nb_swiglu_bwd", (self.grid_stride_blocks(n), 1), &args) }
    }

    /// RMSNorm forward over rows of `d = w.len()`; `rstd` gets `1/rms` per row when given.
    fn rms_fwd(
        &self,
        x: &Self::Buf<f32>,
        w: &Self::Buf<f32>,
        eps: f32,
        y: &mut Self::Buf<f32>,
        rstd: Option<&mut Self::Buf<f32>>,
    ) -> Result<()> {
        let (rows, d) = norm_rows(self, "rmsnorm", x, w, y)?;
        let rp = match rstd {
            Some(r) => {
                same_len("rmsnorm", "rstd", self.len(r), rows)?;
                self.ptr(r)
            }
            None => 0,
        };
        let args = [
            Arg::Ptr(self.ptr(x)),
            Arg::Ptr(self.ptr(w)),
            Arg::F32(eps),
            Arg::I32(i32_of("rows", rows)?),
            Arg::I32(i32_of("d", d)?),
            Arg::Ptr(self.ptr(y)),
            Arg::Ptr(rp),
        ];
        // SAFETY: rows * d inputs and outputs, d gains, rows statistics.
        unsafe {
            self.launch(
                "nb_rms_fwd",
                (u32_of("row blocks", rows.div_ceil(ROWS_PER_BLOCK))?, 1),
                &args,
            )
        }
    }

    /// LayerNorm forward; `stats` gets `(mean, 1/std)` per row when given.
    fn ln_fwd(
        &self,
        x: &Self::Buf<f32>,
        w: &Self::Buf<f32>,
        b: Option<&Self::Buf<f32>>,
        eps: f32,
        y: &mut Self::Buf<f32>,
        stats: Option<&mut Self::Buf<f32>>,
    ) -> Result<()> {
        let (rows, d) = norm_rows(self, "layernorm", x, w, y)?;
        let bp = match b {
            Some(b) => {
                same_len("layernorm", "bias", self.len(b), d)?;
                self.ptr(b)
            }
            None => 0,
        };
        let sp = match stats {
            Some(s) => {
                same_len("layernorm", "stats", self.len(s), 2 * rows)?;
                self.ptr(s)
            }
            None => 0,
        };
        let args = [
            Arg::Ptr(self.ptr(x)),
            Arg::Ptr(self.ptr(w)),
            Arg::Ptr(bp),
            Arg::F32(eps),
            Arg::I32(i32_of("rows", rows)?),
            Arg::I32(i32_of("d", d)?),
            Arg::Ptr(self.ptr(y)),
            Arg::Ptr(sp),
        ];
        // SAFETY: as rms_fwd, two statistics per row.
        unsafe {
            self.launch(
                "nb_ln_fwd",
                (u32_of("row blocks", rows.div_ceil(ROWS_PER_BLOCK))?, 1),
                &args,
            )
        }
    }

    /// Backward of both norms (`layer`: LayerNorm with `(mean, 1/std)` stats, else RMSNorm with
    /// `1/rms`); the gain / bias gradients sum chunks of `per` rows, then the chunks in order
    /// (autograd's `norm_bwd` chunking).
    #[allow(clippy::too_many_arguments)]
    fn norm_bwd(
        &self,
        layer: bool,
        x: &Self::Buf<f32>,
        w: &Self::Buf<f32>,
        stats: &Self::Buf<f32>,
        dy: &Self::Buf<f32>,
        per: usize,
        dx: Option<(bool, &mut Self::Buf<f32>)>,
        dw: Option<(bool, &mut Self::Buf<f32>)>,
        db: Option<(bool, &mut Self::Buf<f32>)>,
    ) -> Result<()> {
        let d = self.len(w);
        let n = self.len(x);
        if d == 0 {
            return Ok(());
        }
        if n % d != 0 {
            return Err(bad(format!(
                "norm backward: {n} elements are not rows of {d}"
            )));
        }
        let rows = n / d;
        same_len("norm backward", "dy", self.len(dy), n)?;
        same_len(
            "norm backward",
            "stats",
            self.len(stats),
            if layer { 2 * rows } else { rows },
        )?;
        let (ri, di) = (i32_of("rows", rows)?, i32_of("d", d)?);
        if let Some((acc, g)) = dx {
            same_len("norm backward", "dx", self.len(g), n)?;
            let args = [
                Arg::I32(layer as i32),
                Arg::Ptr(self.ptr(x)),
                Arg::Ptr(self.ptr(w)),
                Arg::Ptr(self.ptr(stats)),
                Arg::Ptr(self.ptr(dy)),
                Arg::I32(ri),
                Arg::I32(di),
                Arg::I32(acc as i32),
                Arg::Ptr(self.ptr(g)),
            ];
            // SAFETY: rows * d elements in and out, d gains, per-row statistics.
            unsafe {
                self.launch(
                    "nb_norm_bwd_dx",
                    (u32_of("row blocks", rows.div_ceil(ROWS_PER_BLOCK))?, 1),
                    &args,
                )?
            };
        }
        if dw.is_none() && db.is_none() {
            return Ok(());
        }
        let per = per.max(1);
        let nchunks = rows.div_ceil(per).max(1);
        let pw: Self::Buf<f32> = self.zeros(nchunks * d)?;
        let pb: Self::Buf<f32> = self.zeros(if db.is_some() { nchunks * d } else { 1 })?;
        let args = [
            Arg::I32(layer as i32),
            Arg::Ptr(self.ptr(x)),
            Arg::Ptr(self.ptr(stats)),
            Arg::Ptr(self.ptr(dy)),
            Arg::I32(ri),
            Arg::I32(di),
            Arg::I32(i32_of("per", per)?),
            Arg::I32(i32_of("chunks", nchunks)?),
            Arg::Ptr(self.ptr(&pw)),
            Arg::Ptr(if db.is_some() { self.ptr(&pb) } else { 0 }),
        ];
        // SAFETY: reads rows * d elements, writes nchunks * d partials per output.
        unsafe {
            self.launch(
                "nb_norm_bwd_params",
                (self.grid_stride_blocks(nchunks * d), 1),
                &args,
            )?
        };
        for (target, part) in [(dw, &pw), (db, &pb)] {
            if let Some((acc, t)) = target {
                same_len("norm backward", "parameter gradient", self.len(t), d)?;
                let args = [
                    Arg::Ptr(self.ptr(part)),
                    Arg::U64(nchunks as u64),
                    Arg::U64(d as u64),
                    Arg::I32(acc as i32),
                    Arg::Ptr(self.ptr(t)),
                ];
                // SAFETY: reads nchunks * d partials, reads and writes d outputs.
                unsafe {
                    self.launch("nb_sum_rows_finish", (self.grid_stride_blocks(d), 1), &args)?
                };
            }
        }
        Ok(())
    }

    /// RoPE of rows of `d` at positions `r % t` with autograd's `[T, D/2]` cos then sin table;
    /// `inverse` rotates back (the backward pass); `out (+)=`.
    #[allow(clippy::too_many_arguments)]
    fn rope(
        &self,
        x: &Self::Buf<f32>,
        table: &Self::Buf<f32>,
        t: usize,
        d: usize,
        inverse: bool,
        out: (bool, &mut Self::Buf<f32>),
    ) -> Result<()> {
        let n = self.len(x);
        if d == 0 || !d.is_multiple_of(2) || t == 0 || n % (t * d) != 0 {
            return Err(bad(format!(
                "rope: {n} elements are not [.., {t}, {d}] with even {d}"
            )));
        }
        same_len("rope", "table", self.len(table), t * d)?;
        same_len("rope", "out", self.len(out.1), n)?;
        let rows = n / d;
        let args = [
            Arg::Ptr(self.ptr(x)),
            Arg::Ptr(self.ptr(table)),
            Arg::U64(rows as u64),
            Arg::I32(i32_of("t", t)?),
            Arg::I32(i32_of("d", d)?),
            Arg::I32(inverse as i32),
            Arg::I32(out.0 as i32),
            Arg::Ptr(self.ptr(out.1)),
        ];
        // SAFETY: reads and writes n elements, reads t * d table entries.
        unsafe { self.launch("nb_rope", (self.grid_stride_blocks(n / 2), 1), &args) }
    }

    /// `out[r] = table[ids[r]]` for a `[vocab, d]` table.
    fn embedding_fwd(
        &self,
        table: &Self::Buf<f32>,
        d: usize,
        ids: &[u32],
        out: &mut Self::Buf<f32>,
    ) -> Result<()> {
        let tl = self.len(table);
        if d == 0 || tl % d != 0 {
            return Err(bad(format!(
                "embedding: a table of {tl} elements is not rows of {d}"
            )));
        }
        let vocab = tl / d;
        if let Some(&i) = ids.iter().find(|&&i| i as usize >= vocab) {
            return Err(bad(format!(
                "embedding: id {i} out of range for {vocab} rows"
            )));
        }
        same_len("embedding", "out", self.len(out), ids.len() * d)?;
        let ids_dev = self.upload(ids)?;
        let args = [
            Arg::Ptr(self.ptr(table)),
            Arg::Ptr(self.ptr(&ids_dev)),
            Arg::U64(ids.len() as u64),
            Arg::I32(i32_of("d", d)?),
            Arg::Ptr(self.ptr(out)),
        ];
        // SAFETY: ids checked < vocab; reads and writes ids.len() * d elements.
        unsafe {
            self.launch(
                "nb_embedding_fwd",
                (self.grid_stride_blocks(ids.len() * d), 1),
                &args,
            )
        }
    }

    /// `table_grad[ids[r]] += dy[r]` in position order (written from zero unless `acc`).
    fn embedding_bwd(
        &self,
        ids: &[u32],
        dy: &Self::Buf<f32>,
        d: usize,
        table_grad: (bool, &mut Self::Buf<f32>),
    ) -> Result<()> {
        let tl = self.len(table_grad.1);
        if d == 0 || tl % d != 0 {
            return Err(bad(format!(
                "embedding backward: a table of {tl} elements is not rows of {d}"
            )));
        }
        same_len("embedding backward", "dy", self.len(dy), ids.len() * d)?;
        let vocab = tl / d;
        let (off, order) = embedding_csr(ids, vocab)?;
        let (off, order) = (self.upload(&off)?, self.upload(&order)?);
        let args = [
            Arg::Ptr(self.ptr(dy)),
            Arg::Ptr(self.ptr(&off)),
            Arg::Ptr(self.ptr(&order)),
            Arg::U64(vocab as u64),
            Arg::I32(i32_of("d", d)?),
            Arg::I32(table_grad.0 as i32),
            Arg::Ptr(self.ptr(table_grad.1)),
        ];
        // SAFETY: the CSR indexes rows < ids.len(); writes vocab * d elements.
        unsafe { self.launch("nb_embedding_bwd", (self.grid_stride_blocks(tl), 1), &args) }
    }

    /// Mean cross-entropy of `logits: [rows, v]`: writes per-row `(loss, lse)` to `stats`
    /// (`2 * rows`) and the mean to `loss` (one element); returns the number of counted rows.
    fn cross_entropy_fwd(
        &self,
        logits: &Self::Buf<f32>,
        v: usize,
        targets: &[u32],
        ignore: Option<u32>,
        stats: &mut Self::Buf<f32>,
        loss: &mut Self::Buf<f32>,
    ) -> Result<usize> {
        let rows = targets.len();
        same_len("cross_entropy", "logits", self.len(logits), rows * v)?;
        same_len("cross_entropy", "stats", self.len(stats), 2 * rows)?;
        same_len("cross_entropy", "loss", self.len(loss), 1)?;
        let ignored = |t: u32| ignore == Some(t);
        if let Some(&t) = targets.iter().find(|&&t| !ignored(t) && t as usize >= v) {
            return Err(bad(format!(
                "cross_entropy: target {t} out of range for {v} classes"
            )));
        }
        let count = targets.iter().filter(|&&t| !ignored(t)).count();
        let ig = ignore.map_or(-1, i64::from);
        let t_dev = self.upload(targets)?;
        let (ri, vi) = (i32_of("rows", rows)?, i32_of("classes", v)?);
        let args = [
            Arg::Ptr(self.ptr(logits)),
            Arg::Ptr(self.ptr(&t_dev)),
            Arg::I32(ri),
            Arg::I32(vi),
            Arg::I64(ig),
            Arg::Ptr(self.ptr(stats)),
        ];
        // SAFETY: targets checked < v (or ignored); reads rows * v, writes 2 * rows.
        unsafe {
            self.launch(
                "nb_ce_fwd",
                (u32_of("row blocks", rows.div_ceil(ROWS_PER_BLOCK))?, 1),
                &args,
            )?
        };
        let args = [
            Arg::Ptr(self.ptr(stats)),
            Arg::I32(ri),
            Arg::I32(i32_of("count", count)?),
            Arg::Ptr(self.ptr(loss)),
        ];
        // SAFETY: reads 2 * rows statistics, writes one element.
        unsafe { self.launch("nb_ce_loss", (1, 1), &args)? };
        Ok(count)
    }

    /// Cross-entropy backward: `dx (+)= dy[0]/count · (softmax − onehot)` (0 for ignored rows).
    #[allow(clippy::too_many_arguments)]
    fn cross_entropy_bwd(
        &self,
        logits: &Self::Buf<f32>,
        v: usize,
        targets: &[u32],
        ignore: Option<u32>,
        stats: &Self::Buf<f32>,
        dy: &Self::Buf<f32>,
        dx: (bool, &mut Self::Buf<f32>),
    ) -> Result<()> {
        let rows = targets.len();
        same_len(
            "cross_entropy backward",
            "logits",
            self.len(logits),
            rows * v,
        )?;
        same_len("cross_entropy backward", "stats", self.len(stats), 2 * rows)?;
        same_len("cross_entropy backward", "dy", self.len(dy), 1)?;
        same_len("cross_entropy backward", "dx", self.len(dx.1), rows * v)?;
        let ignored = |t: u32| ignore == Some(t);
        if let Some(&t) = targets.iter().find(|&&t| !ignored(t) && t as usize >= v) {
            return Err(bad(format!(
                "cross_entropy: target {t} out of range for {v} classes"
            )));
        }
        let count = targets.iter().filter(|&&t| !ignored(t)).count();
        let t_dev = self.upload(targets)?;
        let args = [
            Arg::Ptr(self.ptr(logits)),
            Arg::Ptr(self.ptr(&t_dev)),
            Arg::Ptr(self.ptr(stats)),
            Arg::Ptr(self.ptr(dy)),
            Arg::U64(rows as u64),
            Arg::I32(i32_of("classes", v)?),
            Arg::I64(ignore.map_or(-1, i64::from)),
            Arg::I32(i32_of("count", count)?),
            Arg::I32(dx.0 as i32),
            Arg::Ptr(self.ptr(dx.1)),
        ];
        // SAFETY: as the forward; writes rows * v.
        unsafe { self.launch("nb_ce_bwd", (self.grid_stride_blocks(rows * v), 1), &args) }
    }

    /// Causal attention forward on `[bh, t, d]` tensors (`d <= 128`): `o` and `lse` (`bh * t`);
    /// `bf16`: every operand of the products rounded to BF16 (autograd's
    /// `AttentionProducts::Bf16`), the products then on the tensor cores (`train_attn`, up to
    /// 46340 positions), else the fused kernels.
    #[allow(clippy::too_many_arguments)]
    fn attention_fwd(
        &self,
        q: &Self::Buf<f32>,
        k: &Self::Buf<f32>,
        v: &Self::Buf<f32>,
        bh: usize,
        t: usize,
        d: usize,
        bf16: bool,
        o: &mut Self::Buf<f32>,
        lse: &mut Self::Buf<f32>,
    ) -> Result<()> {
        let grid = attn_check(self, q, k, v, bh, t, d)?;
        same_len("attention", "o", self.len(o), bh * t * d)?;
        same_len("attention", "lse", self.len(lse), bh * t)?;
        if bh * t * d == 0 {
            return Ok(());
        }
        let scale = 1.0 / (d as f32).sqrt();
        if bf16 && crate::train_attn::fits(t) {
            return crate::train_attn::forward(
                self,
                [q, k, v],
                (bh, t, d),
                scale,
                (o, lse),
                crate::train_attn::GROUP_BYTES,
            );
        }
        let args = [
            Arg::Ptr(self.ptr(q)),
            Arg::Ptr(self.ptr(k)),
            Arg::Ptr(self.ptr(v)),
            Arg::I32(i32_of("t", t)?),
            Arg::I32(i32_of("d", d)?),
            Arg::F32(scale),
            Arg::I32(bf16 as i32),
            Arg::Ptr(self.ptr(o)),
            Arg::Ptr(self.ptr(lse)),
        ];
        // SAFETY: shapes checked; reads and writes bh * t * d elements.
        unsafe { self.launch("nb_attn_fwd", grid, &args) }
    }

    /// Causal attention backward: `dq`, `dk`, `dv` written or accumulated; `bf16` as in
    /// [`Self::attention_fwd`].
    #[allow(clippy::too_many_arguments)]
    fn attention_bwd(
        &self,
        q: &Self::Buf<f32>,
        k: &Self::Buf<f32>,
        v: &Self::Buf<f32>,
        o: &Self::Buf<f32>,
        lse: &Self::Buf<f32>,
        dout: &Self::Buf<f32>,
        bh: usize,
        t: usize,
        d: usize,
        bf16: bool,
        dq: (bool, &mut Self::Buf<f32>),
        dk: (bool, &mut Self::Buf<f32>),
        dv: (bool, &mut Self::Buf<f32>),
    ) -> Result<()> {
        let grid = attn_check(self, q, k, v, bh, t, d)?;
        let n = bh * t * d;
        for (what, len) in [
            ("o", self.len(o)),
            ("dout", self.len(dout)),
            ("dq", self.len(dq.1)),
            ("dk", self.len(dk.1)),
            ("dv", self.len(dv.1)),
        ] {
            same_len("attention backward", what, len, n)?;
        }
        same_len("attention backward", "lse", self.len(lse), bh * t)?;
        if n == 0 {
            return Ok(());
        }
        let scale = 1.0 / (d as f32).sqrt();
        let delta: Self::Buf<f32> = self.zeros(bh * t)?;
        let args = [
            Arg::Ptr(self.ptr(dout)),
            Arg::Ptr(self.ptr(o)),
            Arg::U64((bh * t) as u64),
            Arg::I32(i32_of("d", d)?),
            Arg::Ptr(self.ptr(&delta)),
        ];
        // SAFETY: reads n elements twice, writes bh * t.
        unsafe {
            self.launch(
                "nb_attn_delta",
                (u32_of("row blocks", (bh * t).div_ceil(ROWS_PER_BLOCK))?, 1),
                &args,
            )?
        };
        if bf16 && crate::train_attn::fits(t) {
            return crate::train_attn::backward(
                self,
                [q, k, v, dout],
                (lse, &delta),
                (bh, t, d),
                scale,
                dq,
                dk,
                dv,
                crate::train_attn::GROUP_BYTES,
            );
        }
        let (ti, di) = (i32_of("t", t)?, i32_of("d", d)?);
        let common = [
            Arg::Ptr(self.ptr(q)),
            Arg::Ptr(self.ptr(k)),
            Arg::Ptr(self.ptr(v)),
            Arg::Ptr(self.ptr(dout)),
            Arg::Ptr(self.ptr(lse)),
            Arg::Ptr(self.ptr(&delta)),
            Arg::I32(ti),
            Arg::I32(di),
            Arg::F32(scale),
            Arg::I32(bf16 as i32),
        ];
        let mut a = common.to_vec();
        a.extend([Arg::I32(dq.0 as i32), Arg::Ptr(self.ptr(dq.1))]);
        // SAFETY: shapes checked; writes n elements of dq.
        unsafe { self.launch("nb_attn_bwd_dq", grid, &a)? };
        let mut a = common.to_vec();
        a.extend([
            Arg::I32(dk.0 as i32),
            Arg::Ptr(self.ptr(dk.1)),
            Arg::I32(dv.0 as i32),
            Arg::Ptr(self.ptr(dv.1)),
        ]);
        // SAFETY: shapes checked; writes n elements of dk and dv.
        unsafe { self.launch("nb_attn_bwd_dkdv", grid, &a) }
    }

    /// `c = alpha · A·B + beta · c` (`c: [m, n]`, `beta == 0` overwrites) with `A(i, k) =
    /// a[i·sa.0 + k·sa.1]`, `B(k, j) = b[k·sb.0 + j·sb.1]`; fixed summation order.
    #[allow(clippy::too_many_arguments)]
    fn sgemm(
        &self,
        m: usize,
        n: usize,
        k: usize,
        alpha: f32,
        a: &Self::Buf<f32>,
        sa: (usize, usize),
        b: &Self::Buf<f32>,
        sb: (usize, usize),
        beta: f32,
        c: &mut Self::Buf<f32>,
    ) -> Result<()> {
        same_len("sgemm", "c", self.len(c), m * n)?;
        let last = |rows: usize, cols: usize, s: (usize, usize)| {
            if rows == 0 || cols == 0 {
                0
            } else {
                (rows - 1) * s.0 + (cols - 1) * s.1 + 1
            }
        };
        if last(m, k, sa) > self.len(a) || last(k, n, sb) > self.len(b) {
            return Err(bad(format!(
                "sgemm: operands too short for {m}x{n}x{k} with strides {sa:?}, {sb:?}"
            )));
        }
        if m * n == 0 {
            return Ok(());
        }
        let args = [
            Arg::I32(i32_of("m", m)?),
            Arg::I32(i32_of("n", n)?),
            Arg::I32(i32_of("k", k)?),
            Arg::F32(alpha),
            Arg::Ptr(self.ptr(a)),
            Arg::I64(sa.0 as i64),
            Arg::I64(sa.1 as i64),
            Arg::Ptr(self.ptr(b)),
            Arg::I64(sb.0 as i64),
            Arg::I64(sb.1 as i64),
            Arg::F32(beta),
            Arg::Ptr(self.ptr(c)),
        ];
        let grid = (
            u32_of("column tiles", n.div_ceil(16))?,
            u32_of("row tiles", m.div_ceil(16))?,
        );
        if grid.1 > 65_535 {
            return Err(bad(format!("sgemm: {m} rows exceed the grid")));
        }
        // SAFETY: operand extents checked above.
        unsafe { self.launch("nb_sgemm", grid, &args) }
    }

    /// The global L2 norm of `grads` as optim's `grad_norm` (f64 squares over 16K chunks).
    fn grad_norm(&self, grads: &[&Self::Buf<f32>]) -> Result<f32> {
        let mut table = Vec::new();
        for g in grads {
            let (p, n) = (self.ptr(g), self.len(g));
            for c0 in (0..n).step_by(NORM_CHUNK) {
                table.push(p + 4 * c0 as u64);
                table.push((n - c0).min(NORM_CHUNK) as u64);
            }
        }
        let nchunks = table.len() / 2;
        if nchunks == 0 {
            return Ok(0.0);
        }
        let tab = self.upload(&table)?;
        let part: Self::Buf<f64> = self.zeros(nchunks)?;
        let out: Self::Buf<f32> = self.zeros(1)?;
        let args = [
            Arg::Ptr(self.ptr(&tab)),
            Arg::U64(nchunks as u64),
            Arg::Ptr(self.ptr(&part)),
        ];
        // SAFETY: each chunk entry points inside a live gradient buffer.
        unsafe {
            self.launch(
                "nb_sumsq_chunks",
                (
                    u32_of("chunk blocks", (nchunks * 8).div_ceil(THREADS as usize))?,
                    1,
                ),
                &args,
            )?
        };
        let args = [
            Arg::Ptr(self.ptr(&part)),
            Arg::U64(nchunks as u64),
            Arg::Ptr(self.ptr(&out)),
        ];
        // SAFETY: reads nchunks partials, writes one element.
        unsafe { self.launch("nb_norm_finish", (1, 1), &args)? };
        Ok(self.download(&out)?[0])
    }

    /// One AdamW step on `p` with moments `m`, `v` and gradient `g`.
    fn adamw(
        &self,
        p: &mut Self::Buf<f32>,
        g: &Self::Buf<f32>,
        m: &mut Self::Buf<f32>,
        v: &mut Self::Buf<f32>,
        c: &AdamWCoeffs,
    ) -> Result<()> {
        let n = self.len(p);
        for (what, len) in [("g", self.len(g)), ("m", self.len(m)), ("v", self.len(v))] {
            same_len("adamw", what, len, n)?;
        }
        let args = [
            Arg::Ptr(self.ptr(p)),
            Arg::Ptr(self.ptr(g)),
            Arg::Ptr(self.ptr(m)),
            Arg::Ptr(self.ptr(v)),
            Arg::U64(n as u64),
            Arg::AdamW(*c),
        ];
        // SAFETY: four buffers of n elements.
        unsafe { self.launch("nb_adamw", (self.grid_stride_blocks(n), 1), &args) }
    }
}

impl<L: Launcher> TrainOps for L {}

impl<L: Launcher + ?Sized> Launcher for &L {
    type Buf<T: Elem> = L::Buf<T>;
    fn zeros<T: Elem>(&self, n: usize) -> Result<Self::Buf<T>> {
        (**self).zeros(n)
    }
    fn scratch<T: Elem>(&self, n: usize) -> Result<Self::Buf<T>> {
        (**self).scratch(n)
    }
    fn upload<T: Elem>(&self, data: &[T]) -> Result<Self::Buf<T>> {
        (**self).upload(data)
    }
    fn download<T: Elem>(&self, b: &Self::Buf<T>) -> Result<Vec<T>> {
        (**self).download(b)
    }
    fn len<T: Elem>(&self, b: &Self::Buf<T>) -> usize {
        (**self).len(b)
    }
    fn ptr<T: Elem>(&self, b: &Self::Buf<T>) -> u64 {
        (**self).ptr(b)
    }
    fn grid_stride_blocks(&self, n: usize) -> u32 {
        (**self).grid_stride_blocks(n)
    }
    unsafe fn launch(&self, kernel: &'static str, grid: (u32, u32), args: &[Arg]) -> Result<()> {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { (**self).launch(kernel, grid, args) }
    }
    unsafe fn launch_gemm_bf16(
        &self,
        g: &crate::train_tc::Bf16Gemm,
        p: crate::train_tc::Bf16GemmPtrs,
    ) -> Result<()> {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { (**self).launch_gemm_bf16(g, p) }
    }
}

fn norm_rows<L: Launcher + ?Sized>(
    l: &L,
    op: &str,
    x: &L::Buf<f32>,
    w: &L::Buf<f32>,
    y: &L::Buf<f32>,
) -> Result<(usize, usize)> {
    let (n, d) = (l.len(x), l.len(w));
    if d == 0 || n % d != 0 {
        return Err(bad(format!(
            "{op}: {n} elements are not rows of the gain's {d}"
        )));
    }
    same_len(op, "y", l.len(y), n)?;
    Ok((n / d, d))
}

fn attn_check<L: Launcher + ?Sized>(
    l: &L,
    q: &L::Buf<f32>,
    k: &L::Buf<f32>,
    v: &L::Buf<f32>,
    bh: usize,
    t: usize,
    d: usize,
) -> Result<(u32, u32)> {
    if d > MAX_HEAD_DIM {
        return Err(KernelError::Unsupported(format!(
            "attention head dimension {d} > {MAX_HEAD_DIM}"
        )));
    }
    let n = bh * t * d;
    for (what, len) in [("q", l.len(q)), ("k", l.len(k)), ("v", l.len(v))] {
        same_len("attention", what, len, n)?;
    }
    if bh > 65_535 {
        return Err(bad(format!("attention: {bh} heads exceed the grid")));
    }
    Ok((
        u32_of("query blocks", t.div_ceil(ROWS_PER_BLOCK))?,
        bh as u32,
    ))
}

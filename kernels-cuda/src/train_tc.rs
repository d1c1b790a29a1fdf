//! The training step's tensor-core GEMM: BF16 operands, f32 products and accumulation, f32
//! output, `C_i = α · op(A_i) · op(B_i) + β · C_i` for `i < batch`, every operand read
//! through a strided, optionally transposed view. On a GPU it is one cuBLASLt call
//! (`CUBLAS_COMPUTE_32F`, the layouts built by `gemm.rs`'s `LtCall::training`, unit-tested
//! there against [`reference()`]); under the emulator it is [`reference()`] itself.
//!
//! autograd's device linear multiplies on it whenever both operands of a GEMM are exactly
//! BF16: BF16-recipe operands, and NVFP4 / MX / FP8 operands dequantized without their
//! per-tensor factor (α carries the factors). [`TensorCoreOps::to_bf16_bits`] (`nb_f32_to_bf16`,
//! round to nearest even) forms the BF16 buffers; on values that are already BF16 it is exact.
//!
//! ```no_run
//! # #[cfg(feature = "emu")] {
//! use kernels_cuda::emu::Emu;
//! use kernels_cuda::train::Launcher;
//! use kernels_cuda::train_tc::{Bf16Gemm, Bf16View, TensorCoreOps};
//! let emu = Emu::shared().expect("a C++20 compiler");
//! // [1, 2] · [2, 1]: A row-major [1, 2], B stored transposed as [1, 2]
//! let x = emu.upload(&[1.0f32, 2.0, 3.0, 4.0]).unwrap();
//! let mut h = emu.zeros::<u16>(4).unwrap();
//! emu.to_bf16_bits(&x, &mut h).unwrap();
//! let g = Bf16Gemm::single((1, 1, 2), 1.0, Bf16View::rows(2), Bf16View::cols(2));
//! let mut c = emu.zeros::<f32>(1).unwrap();
//! let a = emu.upload(&[0x3f80u16, 0x4000]).unwrap(); // 1, 2
//! emu.gemm_tc(&g, &a, &h, &mut c).unwrap(); // 1·1 + 2·2
//! assert_eq!(c.to_vec(), [5.0]);
//! # }
//! ```

use crate::train::{Arg, Launcher};
use crate::{KernelError, Result};

/// How a GEMM operand `op(X)` is read from its buffer: the stored matrix is row-major with
/// `ld` elements between rows, `op(X)` is it (`trans == false`) or its transpose, and batch
/// items are `item` elements apart (0: one matrix for every item).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bf16View {
    /// `op(X)` is the transpose of the stored matrix.
    pub trans: bool,
    /// Elements between rows of the stored matrix (at least its column count).
    pub ld: usize,
    /// Elements between batch items.
    pub item: usize,
}

impl Bf16View {
    /// `op(X)` is the stored row-major matrix of `ld` columns (one item).
    pub const fn rows(ld: usize) -> Self {
        Bf16View {
            trans: false,
            ld,
            item: 0,
        }
    }

    /// `op(X)` is the transpose of the stored row-major matrix of `ld` columns (one item).
    pub const fn cols(ld: usize) -> Self {
        Bf16View {
            trans: true,
            ld,
            item: 0,
        }
    }
}

/// One (batched) GEMM: `C_i[m, n] = alpha · op(A_i)[m, k] · op(B_i)[k, n] + beta · C_i`, `C`
/// row-major and contiguous (item `i` at `i · m · n`); `beta == 0` overwrites `C` without
/// reading it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bf16Gemm {
    /// Batch items.
    pub batch: usize,
    /// Rows of `op(A)` and `C`.
    pub m: usize,
    /// Columns of `op(B)` and `C`.
    pub n: usize,
    /// The reduction length.
    pub k: usize,
    /// Multiplies the f32 accumulator.
    pub alpha: f32,
    /// Multiplies the previous `C` (0: not read).
    pub beta: f32,
    /// How `op(A)` is read.
    pub a: Bf16View,
    /// How `op(B)` is read.
    pub b: Bf16View,
}

/// Device addresses of a [`Bf16Gemm`]'s operands (BF16 bits) and output (f32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bf16GemmPtrs {
    /// `A`'s BF16 buffer.
    pub a: u64,
    /// `B`'s BF16 buffer.
    pub b: u64,
    /// `C`'s f32 buffer.
    pub c: u64,
}

fn bad(msg: String) -> KernelError {
    KernelError::InvalidArgument(msg)
}

/// The stored `[rows, cols]` of an operand whose `op` is `[r, c]`.
const fn stored(v: Bf16View, r: usize, c: usize) -> (usize, usize) {
    if v.trans {
        (c, r)
    } else {
        (r, c)
    }
}

/// One past the last element `batch` items of a stored `[rows, cols]` view read.
fn extent(batch: usize, (rows, cols): (usize, usize), v: Bf16View) -> Option<usize> {
    if batch == 0 || rows == 0 || cols == 0 {
        return Some(0);
    }
    let last = (batch - 1)
        .checked_mul(v.item)?
        .checked_add((rows - 1).checked_mul(v.ld)?)?
        .checked_add(cols - 1)?;
    last.checked_add(1)
}

impl Bf16Gemm {
    /// A single (unbatched) product of `(m, n, k)` with `beta == 0`.
    pub fn single((m, n, k): (usize, usize, usize), alpha: f32, a: Bf16View, b: Bf16View) -> Self {
        Bf16Gemm {
            batch: 1,
            m,
            n,
            k,
            alpha,
            beta: 0.0,
            a,
            b,
        }
    }

    /// The stored `[rows, cols]` of `A` and `B`.
    pub fn stored(&self) -> ((usize, usize), (usize, usize)) {
        (
            stored(self.a, self.m, self.k),
            stored(self.b, self.k, self.n),
        )
    }

    /// How many elements of `A` and `B` the views reach (one past the last read), or `None`
    /// on overflow.
    pub fn extents(&self) -> Option<(usize, usize)> {
        let (sa, sb) = self.stored();
        Some((
            extent(self.batch, sa, self.a)?,
            extent(self.batch, sb, self.b)?,
        ))
    }

    /// Checks the views against buffers of `len_a`, `len_b` BF16 and `len_c` f32 elements:
    /// every leading dimension covers its row, every read lies inside its buffer, `C` has
    /// exactly `batch · m · n` elements, `k > 0` and the sizes fit cuBLASLt's integer types.
    ///
    /// # Errors
    /// [`KernelError::InvalidArgument`] naming the first violation.
    pub fn check(&self, len_a: usize, len_b: usize, len_c: usize) -> Result<()> {
        let (sa, sb) = self.stored();
        let want_c = self
            .batch
            .checked_mul(self.m)
            .and_then(|x| x.checked_mul(self.n));
        if want_c != Some(len_c) {
            return Err(bad(format!(
                "gemm_tc: c has {len_c} elements, expected {} x {} x {}",
                self.batch, self.m, self.n
            )));
        }
        if self.k == 0 {
            return Err(bad("gemm_tc: an empty reduction (k = 0)".into()));
        }
        for (what, s, v, len) in [("a", sa, self.a, len_a), ("b", sb, self.b, len_b)] {
            if v.ld < s.1 {
                return Err(bad(format!(
                    "gemm_tc: {what}'s leading dimension {} < its {} columns",
                    v.ld, s.1
                )));
            }
            if extent(self.batch, s, v).is_none_or(|e| e > len) {
                return Err(bad(format!(
                    "gemm_tc: {what} ({len} elements) is too short for {} items of {s:?} with {v:?}",
                    self.batch
                )));
            }
        }
        let big = [self.batch, self.m, self.n, self.k, self.a.ld, self.b.ld]
            .into_iter()
            .chain([self.a.item, self.b.item, self.m * self.n])
            .any(|x| i32::try_from(x).is_err());
        if big {
            return Err(bad(format!(
                "gemm_tc: a size of {self:?} exceeds the i32 range"
            )));
        }
        Ok(())
    }
}

/// The value of BF16 bits.
fn bf16(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// `x` rounded to BF16 bits (nearest even; NaN stays NaN): `nb_f32_to_bf16` on the host.
///
/// ```
/// assert_eq!(kernels_cuda::train_tc::bf16_bits_of(1.0), 0x3f80);
/// ```
pub fn bf16_bits_of(x: f32) -> u16 {
    quant::gemm::bf16::bf16_bits(x)
}

/// The host reference of the tensor-core GEMM (what the emulator runs), for each output
/// element: `s = +0`, then for `p = 0, 1, …, k-1`: `s = rn32(s + rn32(a·b))` (the product of
/// two BF16 values is exact in f32 unless it falls below f32's normal range), then
/// `c = rn32(α·s)` or, with `beta != 0`, `c = rn32(rn32(α·s) + rn32(β·c))`. cuBLASLt sums in
/// another (blocked, unspecified) order, so the two differ by at most `2 (k + 1) u Σ|a·b|·|α|`
/// plus the epilogue's rounding, `u = 2⁻²⁴`.
///
/// # Errors
/// [`Bf16Gemm::check`]'s.
///
/// ```
/// use kernels_cuda::train_tc::{reference, Bf16Gemm, Bf16View};
/// let one_two = [0x3f80u16, 0x4000]; // BF16 1, 2
/// let g = Bf16Gemm::single((1, 1, 2), 0.5, Bf16View::rows(2), Bf16View::cols(2));
/// let mut c = [0.0f32];
/// reference(&g, &one_two, &one_two, &mut c).unwrap();
/// assert_eq!(c, [2.5]);
/// ```
pub fn reference(g: &Bf16Gemm, a: &[u16], b: &[u16], c: &mut [f32]) -> Result<()> {
    g.check(a.len(), b.len(), c.len())?;
    let at = |v: Bf16View, x: &[u16], item: usize, r: usize, col: usize| {
        let (i, j) = if v.trans { (col, r) } else { (r, col) };
        bf16(x[item * v.item + i * v.ld + j])
    };
    for item in 0..g.batch {
        for i in 0..g.m {
            for j in 0..g.n {
                let mut s = 0.0f32;
                for p in 0..g.k {
                    s += at(g.a, a, item, i, p) * at(g.b, b, item, p, j);
                }
                let o = &mut c[(item * g.m + i) * g.n + j];
                *o = if g.beta == 0.0 {
                    g.alpha * s
                } else {
                    g.alpha * s + g.beta * *o
                };
            }
        }
    }
    Ok(())
}

/// The tensor-core GEMM and its BF16 conversion on any [`Launcher`].
pub trait TensorCoreOps: Launcher {
    /// `out = bf16(x)` (bits, round to nearest even, `nb_f32_to_bf16`): exact on values that
    /// are already BF16.
    ///
    /// # Errors
    /// [`KernelError::InvalidArgument`] when the lengths differ.
    fn to_bf16_bits(&self, x: &Self::Buf<f32>, out: &mut Self::Buf<u16>) -> Result<()> {
        let n = self.len(x);
        if self.len(out) != n {
            return Err(bad(format!(
                "to_bf16: out has {} elements, expected {n}",
                self.len(out)
            )));
        }
        let args = [
            Arg::Ptr(self.ptr(x)),
            Arg::U64(n as u64),
            Arg::Ptr(self.ptr(out)),
        ];
        // SAFETY: reads and writes n elements.
        unsafe { self.launch("nb_f32_to_bf16", (self.grid_stride_blocks(n), 1), &args) }
    }

    /// Runs `g` on `a`, `b` (BF16 bits) into `c`: cuBLASLt on a GPU, [`reference()`] under the
    /// emulator.
    ///
    /// # Errors
    /// [`Bf16Gemm::check`]'s; cuBLASLt's (no algorithm for the layouts, library missing).
    fn gemm_tc(
        &self,
        g: &Bf16Gemm,
        a: &Self::Buf<u16>,
        b: &Self::Buf<u16>,
        c: &mut Self::Buf<f32>,
    ) -> Result<()> {
        g.check(self.len(a), self.len(b), self.len(c))?;
        if g.m * g.n * g.batch == 0 {
            return Ok(());
        }
        let p = Bf16GemmPtrs {
            a: self.ptr(a),
            b: self.ptr(b),
            c: self.ptr(c),
        };
        // SAFETY: every read lies inside its buffer and c is exactly the output (checked).
        unsafe { self.launch_gemm_bf16(g, p) }
    }
}

impl<L: Launcher + ?Sized> TensorCoreOps for L {}

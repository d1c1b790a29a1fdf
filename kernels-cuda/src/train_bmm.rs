//! Batched products on any [`Launcher`]: `nb_sgemm` (the fixed-order f32 GEMM) once per batch
//! item, each item's operands and output at a fixed element stride from the previous one, so
//! that autograd's `matmul` / `matmul_t` (attention's `QKᵀ` and `PV` when computed unfused, the
//! sampler's cached attention) run on the device with any transposition by strides.
//!
//! ```no_run
//! # #[cfg(feature = "emu")] {
//! use kernels_cuda::emu::Emu;
//! use kernels_cuda::train::Launcher;
//! use kernels_cuda::train_bmm::{BmmOps, Strided};
//! let emu = Emu::shared().expect("a C++20 compiler");
//! // two items of [1, 2] · [2, 1]
//! let a = emu.upload(&[1.0f32, 2.0, 3.0, 4.0]).unwrap();
//! let b = emu.upload(&[1.0f32, 1.0, 2.0, 0.5]).unwrap();
//! let mut c = emu.zeros::<f32>(2).unwrap();
//! let sa = Strided { row: 2, col: 1, item: 2 };
//! let sb = Strided { row: 1, col: 1, item: 2 };
//! emu.sgemm_batched(2, (1, 1, 2), 1.0, (&a, sa), (&b, sb), 0.0, &mut c).unwrap();
//! assert_eq!(c.to_vec(), [3.0, 8.0]);
//! # }
//! ```

use crate::train::{Arg, Launcher};
use crate::{KernelError, Result};

/// Element strides of a batched operand: `X(r, c)` of item `i` is `x[i·item + r·row + c·col]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strided {
    /// Between rows.
    pub row: usize,
    /// Between columns.
    pub col: usize,
    /// Between batch items (0: one matrix shared by every item).
    pub item: usize,
}

/// Batched f32 GEMMs.
pub trait BmmOps: Launcher {
    /// For each item `i < batch`: `C_i = alpha · A_i · B_i + beta · C_i` with `A_i: [m, k]`,
    /// `B_i: [k, n]` read through their strides and `C_i` the `i`-th `[m, n]` block of `c`
    /// (`beta == 0` overwrites); `nb_sgemm`'s fixed summation order.
    ///
    /// # Errors
    /// [`KernelError::InvalidArgument`] when an operand or `c` is too short for the shape and
    /// strides, or a size exceeds the kernel's int range.
    #[allow(clippy::too_many_arguments)]
    fn sgemm_batched(
        &self,
        batch: usize,
        mnk: (usize, usize, usize),
        alpha: f32,
        a: (&Self::Buf<f32>, Strided),
        b: (&Self::Buf<f32>, Strided),
        beta: f32,
        c: &mut Self::Buf<f32>,
    ) -> Result<()>;
}

fn bad(msg: String) -> KernelError {
    KernelError::InvalidArgument(msg)
}

/// One past the last element an operand of `batch` items of `[rows, cols]` reads.
fn extent(batch: usize, rows: usize, cols: usize, s: Strided) -> Option<usize> {
    if batch == 0 || rows == 0 || cols == 0 {
        return Some(0);
    }
    let last = (batch - 1)
        .checked_mul(s.item)?
        .checked_add((rows - 1).checked_mul(s.row)?)?
        .checked_add((cols - 1).checked_mul(s.col)?)?;
    last.checked_add(1)
}

impl<L: Launcher + ?Sized> BmmOps for L {
    fn sgemm_batched(
        &self,
        batch: usize,
        (m, n, k): (usize, usize, usize),
        alpha: f32,
        (a, sa): (&Self::Buf<f32>, Strided),
        (b, sb): (&Self::Buf<f32>, Strided),
        beta: f32,
        c: &mut Self::Buf<f32>,
    ) -> Result<()> {
        let items = batch.checked_mul(m).and_then(|x| x.checked_mul(n));
        if items != Some(self.len(c)) {
            return Err(bad(format!(
                "sgemm_batched: c has {} elements, expected {batch} x {m} x {n}",
                self.len(c)
            )));
        }
        let (ea, eb) = (extent(batch, m, k, sa), extent(batch, k, n, sb));
        if ea.is_none_or(|e| e > self.len(a)) || eb.is_none_or(|e| e > self.len(b)) {
            return Err(bad(format!(
                "sgemm_batched: operands too short for {batch} x {m}x{n}x{k} with strides {sa:?}, {sb:?}"
            )));
        }
        if m * n == 0 {
            return Ok(());
        }
        let int = |what: &str, v: usize| {
            i32::try_from(v).map_err(|_| bad(format!("sgemm_batched: {what} = {v} > i32")))
        };
        let (mi, ni, ki) = (int("m", m)?, int("n", n)?, int("k", k)?);
        let grid = (n.div_ceil(16) as u32, m.div_ceil(16) as u32);
        if m.div_ceil(16) > 65_535 || n.div_ceil(16) > u32::MAX as usize {
            return Err(bad(format!("sgemm_batched: {m} x {n} exceeds the grid")));
        }
        let (pa, pb, pc) = (self.ptr(a), self.ptr(b), self.ptr(c));
        for i in 0..batch {
            let at = |p: u64, off: usize| p + (off * 4) as u64;
            let args = [
                Arg::I32(mi),
                Arg::I32(ni),
                Arg::I32(ki),
                Arg::F32(alpha),
                Arg::Ptr(at(pa, i * sa.item)),
                Arg::I64(sa.row as i64),
                Arg::I64(sa.col as i64),
                Arg::Ptr(at(pb, i * sb.item)),
                Arg::I64(sb.row as i64),
                Arg::I64(sb.col as i64),
                Arg::F32(beta),
                Arg::Ptr(at(pc, i * m * n)),
            ];
            // SAFETY: every item's extent lies inside its buffer (checked above); c's items
            // are disjoint blocks of it.
            unsafe { self.launch("nb_sgemm", grid, &args)? };
        }
        Ok(())
    }
}

//! BF16 causal attention on the tensor cores: [`TrainOps::attention_fwd`] and
//! [`TrainOps::attention_bwd`] with `bf16` set run here (FP32 attention keeps the fused kernels
//! of `cuda/attention.cu`).
//!
//! Every operand of attention's products is BF16 in this mode (Q, K, V, dO, and the
//! probabilities and score gradients as they enter a product), so the products are BF16 GEMMs
//! with f32 accumulation ([`crate::train_tc`]: cuBLASLt on a GPU, its host reference under the
//! emulator). A group of heads at a time, the score matrices are materialised:
//!
//! * forward: `S = scale · Q Kᵀ`, then `nb_attn_softmax_bf16` (row max, `l`, `lse = m + log l`,
//!   `P = bf16(exp(S − lse))`, zero past the diagonal), then `O = P V`;
//! * backward: `S` again and `dP = dO Vᵀ`, then `nb_attn_grad_bf16` (`P` and
//!   `dS = bf16(P ⊙ (dP − δ))`, `δ = rowsum(dO ⊙ O)` from `nb_attn_delta`), then
//!   `dV (+)= Pᵀ dO`, `dQ (+)= scale · dS K`, `dK (+)= scale · dSᵀ Q`.
//!
//! These are the fused kernels' formulas (the same rounding points; only summation orders
//! differ), so the checks against the CPU op are the same. The products over the masked upper
//! triangle are computed and multiplied by zeros: on tensor cores that costs less than the
//! fused kernels' FP32 dot products by far. A group holds at most [`GROUP_BYTES`] of score
//! matrices (12 bytes per score backward, 6 forward), one head at the least; the scratch is
//! never zero-filled ([`Launcher::scratch`]: every element is written before it is read, which
//! the emulator checks by filling it with NaN). Sequences longer
//! than 46340 positions (a score matrix past cuBLASLt's 32-bit sizes) keep the fused kernels.
//!
//! [`TrainOps::attention_fwd`]: crate::train::TrainOps::attention_fwd
//! [`TrainOps::attention_bwd`]: crate::train::TrainOps::attention_bwd

use crate::train::{i32_of, u32_of, Arg, Launcher, ROWS_PER_BLOCK};
use crate::train_tc::{Bf16Gemm, Bf16GemmPtrs, Bf16View, TensorCoreOps};
use crate::{KernelError, Result};

/// The most bytes of score-sized scratch one group of heads uses (at least one head's).
pub const GROUP_BYTES: usize = 1 << 30;

/// Whether sequences of `t` positions can take this path: a `[t, t]` score matrix must be
/// addressable by cuBLASLt's 32-bit sizes (t <= 46340); longer ones keep the fused kernels.
pub(crate) fn fits(t: usize) -> bool {
    t.checked_mul(t).is_some_and(|tt| tt <= i32::MAX as usize)
}

/// Heads per group when each head needs `per_head` bytes of scratch and a group may use
/// `limit`.
fn heads_per_group(bh: usize, per_head: usize, limit: usize) -> usize {
    (limit / per_head.max(1)).clamp(1, bh.max(1))
}

/// `bf16(x)` bits of a whole buffer.
fn to_bf16<L: Launcher + ?Sized>(l: &L, x: &L::Buf<f32>) -> Result<L::Buf<u16>> {
    let mut out = l.scratch::<u16>(l.len(x))?;
    l.to_bf16_bits(x, &mut out)?;
    Ok(out)
}

/// A batched BF16 GEMM `C = alpha · op(A) op(B) + beta C` over a group of heads; [`Self::run`]
/// takes each operand at an element offset into its buffer (for a group from head `h0`, `h0`
/// times the operand's per-head size; 0 for the group's own scratch).
struct Product<'a, L: Launcher + ?Sized> {
    l: &'a L,
    g: Bf16Gemm,
}

impl<L: Launcher + ?Sized> Product<'_, L> {
    fn run(
        &self,
        a: (&L::Buf<u16>, usize),
        b: (&L::Buf<u16>, usize),
        c: (&L::Buf<f32>, usize),
    ) -> Result<()> {
        let l = self.l;
        let len_c = self.g.batch * self.g.m * self.g.n;
        let rest = |len: usize, off: usize| len.checked_sub(off);
        let (Some(la), Some(lb), Some(lc)) = (
            rest(l.len(a.0), a.1),
            rest(l.len(b.0), b.1),
            rest(l.len(c.0), c.1),
        ) else {
            return Err(KernelError::InvalidArgument(
                "attention: a product's offset lies past its buffer".into(),
            ));
        };
        if lc < len_c {
            return Err(KernelError::InvalidArgument(format!(
                "attention: output has {lc} elements past its offset, the product writes {len_c}"
            )));
        }
        self.g.check(la, lb, len_c)?;
        let p = Bf16GemmPtrs {
            a: l.ptr(a.0) + 2 * a.1 as u64,
            b: l.ptr(b.0) + 2 * b.1 as u64,
            c: l.ptr(c.0) + 4 * c.1 as u64,
        };
        // SAFETY: `check` bounds every element the product reads inside the operands past
        // their offsets, and the output is `len_c` elements inside `c` past its offset.
        unsafe { l.launch_gemm_bf16(&self.g, p) }
    }
}

/// A product of `batch` items, `(m, n, k)`, `alpha`, `beta`, views `a` and `b`.
fn product<L: Launcher + ?Sized>(
    l: &L,
    batch: usize,
    (m, n, k): (usize, usize, usize),
    (alpha, beta): (f32, f32),
    a: Bf16View,
    b: Bf16View,
) -> Product<'_, L> {
    Product {
        l,
        g: Bf16Gemm {
            batch,
            m,
            n,
            k,
            alpha,
            beta,
            a,
            b,
        },
    }
}

/// One item of a `[heads, rows, cols]` operand: row-major, or read transposed.
const fn view(cols: usize, item: usize, trans: bool) -> Bf16View {
    Bf16View {
        trans,
        ld: cols,
        item,
    }
}

/// `alpha · X Yᵀ` for `heads` items of `[t, d]` row-major `X` and `Y` into `[t, t]` scores.
fn scores<L: Launcher + ?Sized>(
    l: &L,
    heads: usize,
    (t, d): (usize, usize),
    alpha: f32,
) -> Product<'_, L> {
    let td = t * d;
    product(
        l,
        heads,
        (t, t, d),
        (alpha, 0.0),
        view(d, td, false),
        view(d, td, true),
    )
}

/// BF16 causal attention forward on `[bh, t, d]` buffers (shapes checked by the caller):
/// `o` and `lse` written; groups of heads within `group_bytes` of scratch.
pub(crate) fn forward<L: Launcher + ?Sized>(
    l: &L,
    [q, k, v]: [&L::Buf<f32>; 3],
    (bh, t, d): (usize, usize, usize),
    scale: f32,
    (o, lse): (&mut L::Buf<f32>, &mut L::Buf<f32>),
    group_bytes: usize,
) -> Result<()> {
    let (qb, kb, vb) = (to_bf16(l, q)?, to_bf16(l, k)?, to_bf16(l, v)?);
    let (tt, td) = (t * t, t * d);
    let group = heads_per_group(bh, tt * 6, group_bytes);
    let s = l.scratch::<f32>(group * tt)?;
    let p = l.scratch::<u16>(group * tt)?;
    let ti = i32_of("t", t)?;
    for h0 in (0..bh).step_by(group) {
        let hn = group.min(bh - h0);
        // S = scale · Q Kᵀ
        scores(l, hn, (t, d), scale).run((&qb, h0 * td), (&kb, h0 * td), (&s, 0))?;
        let rows = hn * t;
        let args = [
            Arg::Ptr(l.ptr(&s)),
            Arg::U64(rows as u64),
            Arg::I32(ti),
            Arg::Ptr(l.ptr(lse) + 4 * (h0 * t) as u64),
            Arg::Ptr(l.ptr(&p)),
        ];
        let blocks = u32_of("row blocks", rows.div_ceil(ROWS_PER_BLOCK))?;
        // SAFETY: reads rows · t scores, writes rows · t probabilities and rows lse values
        // (lse holds bh · t; h0 + hn <= bh).
        unsafe { l.launch("nb_attn_softmax_bf16", (blocks, 1), &args)? };
        // O = P V
        product(
            l,
            hn,
            (t, d, t),
            (1.0, 0.0),
            view(t, tt, false),
            view(d, td, false),
        )
        .run((&p, 0), (&vb, h0 * td), (&*o, h0 * td))?;
    }
    Ok(())
}

/// BF16 causal attention backward (shapes checked by the caller, `delta = rowsum(dO ⊙ O)`
/// computed): each gradient written, or added when its flag is set; groups of heads within
/// `group_bytes` of scratch.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward<L: Launcher + ?Sized>(
    l: &L,
    [q, k, v, dout]: [&L::Buf<f32>; 4],
    (lse, delta): (&L::Buf<f32>, &L::Buf<f32>),
    (bh, t, d): (usize, usize, usize),
    scale: f32,
    dq: (bool, &mut L::Buf<f32>),
    dk: (bool, &mut L::Buf<f32>),
    dv: (bool, &mut L::Buf<f32>),
    group_bytes: usize,
) -> Result<()> {
    let (qb, kb, vb, dob) = (
        to_bf16(l, q)?,
        to_bf16(l, k)?,
        to_bf16(l, v)?,
        to_bf16(l, dout)?,
    );
    let (tt, td) = (t * t, t * d);
    let group = heads_per_group(bh, tt * 12, group_bytes);
    let s = l.scratch::<f32>(group * tt)?;
    let dp = l.scratch::<f32>(group * tt)?;
    let pb = l.scratch::<u16>(group * tt)?;
    let ds = l.scratch::<u16>(group * tt)?;
    let ti = i32_of("t", t)?;
    let beta = |acc: bool| if acc { 1.0 } else { 0.0 };
    for h0 in (0..bh).step_by(group) {
        let hn = group.min(bh - h0);
        let rows = hn * t;
        // S = scale · Q Kᵀ and dP = dO Vᵀ
        scores(l, hn, (t, d), scale).run((&qb, h0 * td), (&kb, h0 * td), (&s, 0))?;
        scores(l, hn, (t, d), 1.0).run((&dob, h0 * td), (&vb, h0 * td), (&dp, 0))?;
        let args = [
            Arg::Ptr(l.ptr(&s)),
            Arg::Ptr(l.ptr(&dp)),
            Arg::Ptr(l.ptr(lse) + 4 * (h0 * t) as u64),
            Arg::Ptr(l.ptr(delta) + 4 * (h0 * t) as u64),
            Arg::U64(rows as u64),
            Arg::I32(ti),
            Arg::Ptr(l.ptr(&pb)),
            Arg::Ptr(l.ptr(&ds)),
        ];
        // SAFETY: reads rows · t scores and dP values and rows lse and delta values (both
        // hold bh · t; h0 + hn <= bh), writes rows · t elements of pb and ds.
        unsafe {
            l.launch(
                "nb_attn_grad_bf16",
                (l.grid_stride_blocks(rows * t), 1),
                &args,
            )?
        };
        // dV (+)= Pᵀ dO, dQ (+)= scale · dS K, dK (+)= scale · dSᵀ Q
        let grad = |alpha, acc, a_trans| {
            product(
                l,
                hn,
                (t, d, t),
                (alpha, beta(acc)),
                view(t, tt, a_trans),
                view(d, td, false),
            )
        };
        grad(1.0, dv.0, true).run((&pb, 0), (&dob, h0 * td), (&*dv.1, h0 * td))?;
        grad(scale, dq.0, false).run((&ds, 0), (&kb, h0 * td), (&*dq.1, h0 * td))?;
        grad(scale, dk.0, true).run((&ds, 0), (&qb, h0 * td), (&*dk.1, h0 * td))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn score_matrices_must_fit_32_bit_sizes() {
        assert!(fits(1) && fits(1024) && fits(46340));
        assert!(!fits(46341) && !fits(usize::MAX));
    }

    #[test]
    fn groups_hold_at_most_the_limit_and_at_least_one_head() {
        // the `large` preset's backward: 12 MiB per head of 1024 queries
        let head = 1024 * 1024 * 12;
        assert_eq!(heads_per_group(192, head, GROUP_BYTES), 85);
        assert_eq!(heads_per_group(3, head, GROUP_BYTES), 3);
        // a head larger than the limit is a group of its own
        assert_eq!(heads_per_group(4, 2 * GROUP_BYTES, GROUP_BYTES), 1);
        assert_eq!(heads_per_group(0, 0, GROUP_BYTES), 1);
    }

    /// Under the emulator: splitting the heads into groups changes no bit (each head's products
    /// are its own), and a set accumulate flag adds the fresh gradient to what was there.
    #[cfg(feature = "emu")]
    #[test]
    fn groups_and_accumulation_change_no_bits() {
        let e = crate::emu::Emu::shared().expect("a C++20 compiler");
        let (bh, t, d) = (5, 37, 24);
        let n = bh * t * d;
        let data = |seed: u32| -> Vec<f32> {
            (0..n as u32)
                .map(|i| {
                    let h = (i ^ seed.wrapping_mul(0x9E37_79B9)).wrapping_mul(0x85EB_CA6B);
                    ((h >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 4.0
                })
                .collect()
        };
        let up = |v: &[f32]| e.upload(v).unwrap();
        let (q, k, v, dout) = (up(&data(1)), up(&data(2)), up(&data(3)), up(&data(4)));
        let scale = 1.0 / (d as f32).sqrt();
        let run = |group_bytes: usize, acc: bool| -> Vec<Vec<f32>> {
            let (mut o, mut lse) = (e.zeros::<f32>(n).unwrap(), e.zeros::<f32>(bh * t).unwrap());
            forward(
                e,
                [&q, &k, &v],
                (bh, t, d),
                scale,
                (&mut o, &mut lse),
                group_bytes,
            )
            .unwrap();
            // any fixed delta serves the comparison (nb_attn_delta's own is checked elsewhere)
            let (od, dd) = (e.download(&o).unwrap(), data(4));
            let rows: Vec<f32> = (0..bh * t)
                .map(|r| (0..d).map(|c| od[r * d + c] * dd[r * d + c]).sum())
                .collect();
            let delta = up(&rows);
            let init = data(5);
            let start = |on: bool| {
                if on {
                    up(&init)
                } else {
                    e.zeros::<f32>(n).unwrap()
                }
            };
            let (mut dq, mut dk, mut dv) = (start(acc), start(acc), start(acc));
            backward(
                e,
                [&q, &k, &v, &dout],
                (&lse, &delta),
                (bh, t, d),
                scale,
                (acc, &mut dq),
                (acc, &mut dk),
                (acc, &mut dv),
                group_bytes,
            )
            .unwrap();
            [&o, &lse, &dq, &dk, &dv]
                .map(|b| e.download(b).unwrap())
                .to_vec()
        };
        let whole = run(GROUP_BYTES, false);
        // several groups: backward two heads each (2, 2, 1), forward four (4, 1)
        let split = run(2 * t * t * 12, false);
        let names = ["o", "lse", "dq", "dk", "dv"];
        for ((a, b), name) in whole.iter().zip(&split).zip(names) {
            assert!(
                a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "{name}"
            );
            assert!(a.iter().any(|x| *x != 0.0), "{name} is all zeros");
            // the emulator's scratch is NaN until written: none may reach a result
            assert!(
                a.iter().all(|x| x.is_finite()),
                "{name} read unwritten scratch"
            );
        }
        let added = run(2 * t * t * 12, true);
        let init = data(5);
        for i in 2..5 {
            for (j, (&a, &b)) in added[i].iter().zip(&whole[i]).enumerate() {
                assert_eq!(a.to_bits(), (init[j] + b).to_bits(), "{} [{j}]", names[i]);
            }
        }
    }
}

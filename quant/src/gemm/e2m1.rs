//! The E2M1 block GEMM: `out[M, N] = A[M, K] · B[N, K]ᵀ` for operands whose values are E2M1
//! elements times a scale shared by each aligned group of 16 along K (NVFP4 with 1x16 blocks
//! or 16x16 tiles, MXFP4, both without their per-tensor factor), with each group's dot
//! product computed exactly in integers and the groups summed in FP32
//! (docs/numerics.md#the-e2m1-block-gemm).
//!
//! **Arithmetic.** For each output element `c = +0`, and for each group `g` of 16 along K
//! in order (K padded with zeros): `c = rn32(c + Σ_{k ∈ g} a[k]·b[k])`, the group's sum
//! exact, one rounding to nearest even per group, no flushing (no result is subnormal).
//! Each output element depends only on its two rows, never on M, N or the thread count.
//!
//! **Which operands qualify.** Every group of 16 of every row of both operands must split as
//! `v[k] = c[k] · t` with integers `|c[k]| <= 12` and one `t > 0` of at most 6 significant
//! bits in `[2^-50, 2^50]` (`split_group` looks for one from the values: `t = max|v| / d`
//! for `d` = 12, 8, 6, 4, 3, 2, 1, checked exactly). An NVFP4 group has `t = s/2` (its E4M3
//! scale halved: 4 significant bits) with `c` twice the E2M1 values; an MXFP4 group `t = 2^e
//! / 2`. Then `t_a · t_b` has at most 12 significant bits and `|Σ c_a · c_b| <= 16 · 144 <
//! 2^12`, so a group's product is exact in FP32 whichever split was found, and the result
//! does not depend on the split. When a group does not split, [`e2m1_gemm_tn`] reports it
//! and computes nothing; the caller multiplies on the BF16 GEMM instead.
//!
//! **On AVX2** (CPUs without a BF16 dot-product unit, where the BF16 GEMM runs on FMAs:
//! [`e2m1_native`]) the groups' integer dot products run on `vpmaddubsw` (32 byte products
//! per instruction against an FMA's 8 float ones): A's codes are stored as `c + 12` (0..24,
//! unsigned), B's as signed bytes, four K values per 32-bit lane; four `vpmaddubsw` and
//! `vpaddw` (sums of at most 2304) give a group's 16-bit sums, `vpmaddwd` with ones their
//! 32-bit sum, minus `12 · Σ c_b` (kept with B), converted to FP32 and added to the
//! accumulator with one FMA by `t_a · t_b`. That FMA rounds once, as the model does. A
//! register block is 2 rows x 16 columns over a slab of K whose B groups stay in L1.
//! Elsewhere [`e2m1_gemm_tn`] runs the scalar model (tests only: training uses the BF16 GEMM
//! there).

use std::sync::atomic::{AtomicBool, Ordering};

use rayon::prelude::*;

use super::{MatRef, TileWords};
use crate::dispatch::with_avx2;

/// K elements per group (the NVFP4 block; half an MX block).
pub const GROUP: usize = 16;
/// Rows of A per kernel call.
const MR: usize = 2;
/// Columns (rows of B) per packed B panel and kernel call.
const NR: usize = 16;
/// Added to A's codes so that they are unsigned bytes (`vpmaddubsw`'s first operand).
const A_OFFSET: i32 = 12;
/// Bytes of one B panel's record for one group: the codes (4 quads of K x 16 columns x 4
/// bytes: quad `q`, column `j`, element `i` at byte `64 q + 4 j + i`), 16 scales `t` (f32),
/// 16 corrections `A_OFFSET · Σ c` (i32).
const RECORD: usize = 4 * NR * 4 + NR * 4 + NR * 4;
const _: () = assert!(RECORD.is_multiple_of(64));
const SCALES_AT: usize = 4 * NR * 4;
const CORR_AT: usize = SCALES_AT + NR * 4;
/// Groups per slab of the K loop: 64 records of B (24 KiB) stay in a 32 KiB L1.
const SLAB_GROUPS: usize = 64;
/// `1.5 · 2^23`: adding and subtracting it rounds an f32 of magnitude below 2^22 to an integer
/// (nearest even).
const ROUND: f32 = 12_582_912.0;
/// The divisors tried by [`split_group`]: `2 · |e2m1|` of a group's largest element.
const DIVISORS: [f32; 7] = [12.0, 8.0, 6.0, 4.0, 3.0, 2.0, 1.0];
/// Their reciprocals, rounded.
const INV_DIVISORS: [f32; 7] = [1.0 / 12.0, 0.125, 1.0 / 6.0, 0.25, 1.0 / 3.0, 0.5, 1.0];

/// Whether `t` may scale a group: normal, in `[2^-50, 2^50]`, at most 6 significant bits.
#[inline(always)]
fn scale_ok(t: f32) -> bool {
    let bits = t.to_bits();
    let exp = (bits >> 23) as i32 - 127;
    bits >> 31 == 0 && (-50..=50).contains(&exp) && bits & 0x3_ffff == 0
}

/// `a > b ? a : b` (`maxps`: vectorises; a NaN is caught by the exact checks after it).
#[inline(always)]
fn max(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// Splits a group of 16 values as `v[k] = c[k] · t` (see the module docs): `Some((t,
/// c))`, `t = 0` for a zero group, or `None` when the values are not E2M1 codes times one
/// scale (NaN or infinity included). Every check is exact. Written for the vectoriser: a tree for the largest
/// magnitude, the rounding by `ROUND` (whose bits then hold the integer), no early exits
/// in the lanes.
#[inline(always)]
fn split_group(v: &[f32; GROUP]) -> Option<(f32, [i32; GROUP])> {
    let mut h = [0.0f32; 8];
    for k in 0..8 {
        h[k] = max(v[k].abs(), v[k + 8].abs());
    }
    let mut q = [0.0f32; 4];
    for k in 0..4 {
        q[k] = max(h[k], h[k + 4]);
    }
    let m = max(max(q[0], q[2]), max(q[1], q[3]));
    if m == 0.0 {
        // all zeros (a NaN fails here)
        let zero = v.iter().fold(true, |z, &x| z & (x == 0.0));
        return zero.then_some((0.0, [0; GROUP]));
    }
    // t = m / d where that is exact: m · (1/d) then rounds to it (t has at most 6
    // significant bits, the error of 1/d is 2^-24 relative); the check `t · d == m` is then
    // exact in f32 (6 by 4 bits). 1/t only rounds v/t to the nearest integer, which the
    // exact check `c · t == v` confirms.
    let inv_m = 1.0 / m;
    for (d, inv_d) in DIVISORS.into_iter().zip(INV_DIVISORS) {
        let t = m * inv_d;
        if !scale_ok(t) || t * d != m {
            continue;
        }
        let inv = d * inv_m;
        let mut c = [0i32; GROUP];
        let mut exact = true;
        for k in 0..GROUP {
            // |v · inv| <= d (1 + 2^-22): `r`'s low bits hold the nearest integer (<= 12)
            let r = v[k] * inv + ROUND;
            c[k] = r.to_bits() as i32 - ROUND.to_bits() as i32;
            exact &= (r - ROUND) * t == v[k];
        }
        if exact {
            return Some((t, c));
        }
    }
    None
}

/// Element `(r, k)` of a view, or 0 outside it.
#[inline(always)]
fn at(x: &MatRef<'_>, r: usize, k: usize) -> f32 {
    if r < x.rows && k < x.cols {
        x.data[r * x.row_stride + k * x.col_stride]
    } else {
        0.0
    }
}

/// Rows `r0 .. r0 + 16` of group `g` of a view (zero-padded): `t[i]` is row `r0 + i`.
/// Reads whichever axis is contiguous in the inner loop.
#[inline(always)]
fn load_tile(x: &MatRef<'_>, r0: usize, g: usize, t: &mut [[f32; GROUP]; 16]) {
    let k0 = g * GROUP;
    let whole = r0 + 16 <= x.rows && k0 + GROUP <= x.cols;
    if whole && x.col_stride == 1 {
        for (i, row) in t.iter_mut().enumerate() {
            let s = (r0 + i) * x.row_stride + k0;
            *row = x.data[s..s + GROUP].try_into().expect("16 elements");
        }
    } else if whole && x.row_stride == 1 {
        #[cfg(target_arch = "x86_64")]
        if fp_formats::cpu::has_avx2() {
            // SAFETY: AVX2 checked; the tile's 16 K lines of 16 rows lie inside the view
            // (`whole`), which fits its storage (checked by the callers).
            unsafe { load_tile_transposed_avx2(x, r0, k0, t) };
            return;
        }
        for kk in 0..GROUP {
            let s = (k0 + kk) * x.col_stride + r0;
            let line: &[f32; 16] = x.data[s..s + 16].try_into().expect("16 elements");
            for (row, &v) in t.iter_mut().zip(line) {
                row[kk] = v;
            }
        }
    } else {
        for (i, row) in t.iter_mut().enumerate() {
            for (kk, v) in row.iter_mut().enumerate() {
                *v = at(x, r0 + i, k0 + kk);
            }
        }
    }
}

/// The transposed branch of [`load_tile`] with four in-register 8x8 transposes, so that the
/// tile's rows are written (and later read) as whole vectors: scalar column writes made
/// each row's reload wait on eight separate stores.
///
/// # Safety
/// The CPU must have AVX2; `x` must hold rows `r0 .. r0 + 16` at K `k0 .. k0 + 16`, rows
/// contiguous (`row_stride == 1`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn load_tile_transposed_avx2(
    x: &MatRef<'_>,
    r0: usize,
    k0: usize,
    t: &mut [[f32; GROUP]; 16],
) {
    use std::arch::x86_64::*;
    let base = x.data.as_ptr().add(k0 * x.col_stride + r0);
    for rh in 0..2 {
        for kh in 0..2 {
            let lines: [__m256; 8] = std::array::from_fn(|i| {
                _mm256_loadu_ps(base.add((8 * kh + i) * x.col_stride + 8 * rh))
            });
            let rows = crate::nvfp4::avx2::transpose8(lines);
            for (i, row) in rows.iter().enumerate() {
                _mm256_storeu_ps(t[8 * rh + i][8 * kh..].as_mut_ptr(), *row);
            }
        }
    }
}

/// Operand A packed for the kernel: `rows` (M rounded up to [`MR`]) rows of `groups · 16`
/// codes `c + A_OFFSET` and `groups` scales each.
#[derive(Debug, Default)]
struct PackedA {
    codes: Vec<u8>,
    scales: Vec<f32>,
}

/// Reusable buffers of [`e2m1_gemm_tn`].
#[derive(Debug, Default)]
pub struct E2m1Workspace {
    a: PackedA,
    /// B's records, on cache lines: a record is six whole lines, so that no load of the
    /// kernel straddles two.
    b: TileWords,
}

impl E2m1Workspace {
    /// An empty workspace (buffers grow on first use and are then reused).
    pub fn new() -> Self {
        Self::default()
    }
}

/// Packs `x: [M, K]` as A into `p`; false when a group does not split.
fn pack_a(x: MatRef<'_>, p: &mut PackedA) -> bool {
    let groups = x.cols.div_ceil(GROUP);
    let rows = x.rows.next_multiple_of(MR);
    let row_bytes = groups * GROUP;
    // every byte and scale is written below: no clearing
    p.codes.resize(rows * row_bytes, 0);
    p.scales.resize(rows * groups, 0.0);
    let ok = AtomicBool::new(true);
    p.codes
        .par_chunks_mut(16 * row_bytes)
        .zip(p.scales.par_chunks_mut(16 * groups))
        .enumerate()
        .for_each(|(blk, (codes, scales))| {
            if !pack_a_rows(x, blk * 16, groups, codes, scales) {
                ok.store(false, Ordering::Relaxed);
            }
        });
    ok.into_inner()
}

/// Packs rows `r0 .. r0 + codes.len() / row_bytes` (at most 16) of A.
fn pack_a_rows(
    x: MatRef<'_>,
    r0: usize,
    groups: usize,
    codes: &mut [u8],
    scales: &mut [f32],
) -> bool {
    with_avx2(
        #[inline(always)]
        || {
            let row_bytes = groups * GROUP;
            let n = codes.len() / row_bytes;
            let mut t = [[0.0f32; GROUP]; 16];
            for g in 0..groups {
                load_tile(&x, r0, g, &mut t);
                for i in 0..n {
                    let Some((s, c)) = split_group(&t[i]) else {
                        return false;
                    };
                    scales[i * groups + g] = s;
                    let dst = &mut codes[i * row_bytes + g * GROUP..][..GROUP];
                    for (d, &c) in dst.iter_mut().zip(&c) {
                        *d = (c + A_OFFSET) as u8;
                    }
                }
            }
            true
        },
    )
}

/// Packs `x: [N, K]` as B: panels of 16 rows, each `groups` records of [`RECORD`] bytes;
/// false when a group does not split.
fn pack_b(x: MatRef<'_>, lines: &mut TileWords) -> bool {
    let groups = x.cols.div_ceil(GROUP);
    let panels = x.rows.div_ceil(NR);
    if groups == 0 {
        return true;
    }
    // every byte of every record is written below: no clearing
    let words = panels * groups * RECORD / 4;
    lines.grow_to(words);
    let out: &mut [u8] = bytemuck::cast_slice_mut(&mut lines[..words]);
    let ok = AtomicBool::new(true);
    out.par_chunks_mut(groups * RECORD)
        .enumerate()
        .for_each(|(j, panel)| {
            if !pack_b_panel(x, j * NR, panel) {
                ok.store(false, Ordering::Relaxed);
            }
        });
    ok.into_inner()
}

/// Packs rows `r0 .. r0 + 16` of B (zero-padded) into one panel.
fn pack_b_panel(x: MatRef<'_>, r0: usize, panel: &mut [u8]) -> bool {
    with_avx2(
        #[inline(always)]
        || {
            let mut t = [[0.0f32; GROUP]; 16];
            for (g, rec) in panel.chunks_exact_mut(RECORD).enumerate() {
                load_tile(&x, r0, g, &mut t);
                for (j, v) in t.iter().enumerate() {
                    let Some((s, c)) = split_group(v) else {
                        return false;
                    };
                    let sum: i32 = c.iter().sum();
                    for (k, &c) in c.iter().enumerate() {
                        rec[64 * (k / 4) + 4 * j + k % 4] = c as u8;
                    }
                    rec[SCALES_AT + 4 * j..][..4].copy_from_slice(&s.to_ne_bytes());
                    rec[CORR_AT + 4 * j..][..4].copy_from_slice(&(A_OFFSET * sum).to_ne_bytes());
                }
            }
            true
        },
    )
}

/// Whether [`e2m1_gemm_tn`] runs its AVX2 kernel on this CPU, and the quantized GEMMs of two
/// E2M1 operands run on it in training: CPUs with AVX2 and FMA but neither AVX512_BF16 nor
/// AMX-BF16 (where the BF16 GEMM runs on FMAs, at half the speed of this kernel; the BF16
/// units are faster than it), and not under `NIBBLE_FORCE_PORTABLE`.
///
/// ```
/// use fp_formats::cpu;
/// assert_eq!(
///     quant::gemm::e2m1::e2m1_native(),
///     cpu::has_avx2_fma() && !cpu::has_avx512_bf16() && !cpu::has_amx_bf16()
/// );
/// ```
pub fn e2m1_native() -> bool {
    use fp_formats::cpu;
    cfg!(target_arch = "x86_64")
        && cpu::has_avx2_fma()
        && !cpu::has_avx512_bf16()
        && !cpu::has_amx_bf16()
}

/// `out = A · Bᵀ` (`A: [M, K]`, `B: [N, K]`, any strides; `out` row-major `[M, N]`) in the
/// E2M1 block arithmetic (module docs), on the AVX2 kernel where [`e2m1_native`], on the
/// scalar model otherwise (the same bits). Returns false, with `out` unspecified, when a
/// group of either operand does not split into E2M1 codes times one scale.
///
/// # Panics
/// If the K dimensions differ, `out` does not hold `M · N` elements or a view does not fit
/// its storage.
///
/// ```
/// use quant::gemm::{e2m1::{e2m1_gemm_tn, E2m1Workspace}, MatRef};
/// let a = [0.5f32, 1.5, -6.0, 3.0]; // [2, 2], E2M1 values
/// let b = [1.0f32, 0.0, 0.0, 4.0, 2.0, 2.0]; // [3, 2]
/// let mut c = [0.0f32; 6];
/// let (av, bv) = (MatRef::row_major(&a, 2, 2), MatRef::row_major(&b, 3, 2));
/// assert!(e2m1_gemm_tn(av, bv, &mut c, &mut E2m1Workspace::new()));
/// assert_eq!(c, [0.5, 6.0, 4.0, -6.0, 12.0, -6.0]);
/// // 0.7 is no E2M1 value times the group's scale
/// let odd = [0.7f32, 6.0, 0.0, 0.0];
/// assert!(!e2m1_gemm_tn(MatRef::row_major(&odd, 2, 2), bv, &mut c, &mut E2m1Workspace::new()));
/// ```
pub fn e2m1_gemm_tn(a: MatRef<'_>, b: MatRef<'_>, out: &mut [f32], ws: &mut E2m1Workspace) -> bool {
    assert!(b.fits(), "e2m1_gemm_tn: a strided view exceeds its storage");
    check(a, (b.rows, b.cols), out);
    if !e2m1_native() {
        return e2m1_gemm_tn_portable(a, b, out);
    }
    if !pack_b(b, &mut ws.b) {
        return false;
    }
    e2m1_gemm_packed_b(a, (bytemuck::cast_slice(&ws.b[..]), b.rows), out, &mut ws.a)
}

/// The shape checks of [`e2m1_gemm_tn`] for A and a B of `(N, K)`.
fn check(a: MatRef<'_>, (n, kb): (usize, usize), out: &[f32]) {
    assert_eq!(a.cols, kb, "e2m1_gemm_tn: K differs ({} vs {kb})", a.cols);
    assert_eq!(out.len(), a.rows * n, "e2m1_gemm_tn: output length");
    assert!(a.fits(), "e2m1_gemm_tn: a strided view exceeds its storage");
}

/// [`e2m1_gemm_tn`] on the scalar model whatever the CPU (for tests; the same bits).
#[doc(hidden)]
pub fn e2m1_gemm_tn_portable(a: MatRef<'_>, b: MatRef<'_>, out: &mut [f32]) -> bool {
    assert!(b.fits(), "e2m1_gemm_tn: a strided view exceeds its storage");
    check(a, (b.rows, b.cols), out);
    let rows = |x: MatRef<'_>| -> Option<Vec<Vec<f32>>> {
        let k = x.cols.next_multiple_of(GROUP);
        let rows: Vec<Vec<f32>> = (0..x.rows)
            .map(|r| (0..k).map(|c| at(&x, r, c)).collect())
            .collect();
        let splits = rows.iter().all(|r| {
            r.chunks_exact(GROUP)
                .all(|g| split_group(g.try_into().expect("16 elements")).is_some())
        });
        splits.then_some(rows)
    };
    let (Some(ra), Some(rb)) = (rows(a), rows(b)) else {
        return false;
    };
    for (i, o) in out.chunks_mut(b.rows.max(1)).enumerate().take(a.rows) {
        for (j, o) in o.iter_mut().enumerate() {
            *o = e2m1_dot_reference(&ra[i], &rb[j]).expect("both rows split");
        }
    }
    true
}

/// The scalar reference of the arithmetic for one output element (rows `a` and `b` of
/// length K), written from the values alone: `None` when a group of either row does not
/// split (module docs).
///
/// ```
/// use quant::gemm::e2m1::e2m1_dot_reference;
/// // one rounding per group of 16: group 1 adds 1.5 · 2^-24 to 1 at once (0.75 of an ulp:
/// // up), where adding its two products one by one would round down twice
/// let h = 0.75 * 2f32.powi(-24);
/// let (mut a, b) = (vec![0.0f32; 32], vec![1.0f32; 32]);
/// (a[0], a[16], a[17]) = (1.0, h, h);
/// assert_eq!(e2m1_dot_reference(&a, &b), Some(1.0 + f32::EPSILON));
/// assert_eq!((1.0 + h) + h, 1.0);
/// assert_eq!(e2m1_dot_reference(&[0.7, 6.0], &[1.0, 1.0]), None);
/// ```
pub fn e2m1_dot_reference(a: &[f32], b: &[f32]) -> Option<f32> {
    assert_eq!(a.len(), b.len(), "e2m1_dot_reference: lengths differ");
    let group = |x: &[f32], g: usize| -> [f32; GROUP] {
        std::array::from_fn(|k| x.get(g * GROUP + k).copied().unwrap_or(0.0))
    };
    let mut c = 0.0f32;
    for g in 0..a.len().div_ceil(GROUP) {
        let (ga, gb) = (group(a, g), group(b, g));
        split_group(&ga)?;
        split_group(&gb)?;
        // exact: every product is an integer multiple (<= 144) of t_a · t_b
        let s: f64 = ga.iter().zip(&gb).map(|(&x, &y)| x as f64 * y as f64).sum();
        assert_eq!(s as f32 as f64, s, "a group's sum is exact in FP32");
        c += s as f32;
    }
    Some(c)
}

/// An operand packed once as the B of [`e2m1_gemm_tn`], for products that reuse it (a
/// weight frozen between two weight syncs of an RL sampler). Made only where the kernel runs
/// ([`e2m1_native`]) and the operand splits.
#[derive(Clone, Debug)]
pub struct PackedE2m1B {
    records: TileWords,
    rows: usize,
    k: usize,
}

impl PackedE2m1B {
    /// `b: [N, K]` (any strides) packed as B, or `None` where the kernel does not run or a
    /// group does not split.
    ///
    /// # Panics
    /// If the view does not fit its storage.
    pub fn new(b: MatRef<'_>) -> Option<PackedE2m1B> {
        assert!(b.fits(), "PackedE2m1B::new: the view exceeds its storage");
        let mut records = TileWords::default();
        (e2m1_native() && pack_b(b, &mut records)).then_some(PackedE2m1B {
            records,
            rows: b.rows,
            k: b.cols,
        })
    }

    /// `(N, K)` of the packed operand.
    pub fn dims(&self) -> (usize, usize) {
        (self.rows, self.k)
    }
}

/// [`e2m1_gemm_tn`] with B packed once ([`PackedE2m1B`]): the same bits. False when a group
/// of A does not split.
///
/// # Panics
/// As [`e2m1_gemm_tn`].
pub fn e2m1_gemm_tn_packed(
    a: MatRef<'_>,
    b: &PackedE2m1B,
    out: &mut [f32],
    ws: &mut E2m1Workspace,
) -> bool {
    check(a, (b.rows, b.k), out);
    e2m1_gemm_packed_b(
        a,
        (bytemuck::cast_slice(&b.records[..]), b.rows),
        out,
        &mut ws.a,
    )
}

/// The output as shared by the tasks of [`e2m1_gemm_packed_b`], each writing its own rows x
/// columns.
#[derive(Clone, Copy)]
struct SharedOut {
    ptr: *mut f32,
    n: usize,
}
// SAFETY: the tasks write disjoint parts of the output while the caller holds it.
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}

fn e2m1_gemm_packed_b(
    a: MatRef<'_>,
    (pb, n): (&[u8], usize),
    out: &mut [f32],
    pa: &mut PackedA,
) -> bool {
    let (m, k) = (a.rows, a.cols);
    if m == 0 || n == 0 {
        return true;
    }
    if k == 0 {
        out.fill(0.0);
        return true;
    }
    if !pack_a(a, pa) {
        return false;
    }
    let groups = k.div_ceil(GROUP);
    let panels = n.div_ceil(NR);
    assert!(pb.len() >= panels * groups * RECORD);
    assert!(pa.codes.len() >= m.next_multiple_of(MR) * groups * GROUP);
    // Tasks: bands of row pairs x bands of panels, about 4 per thread, rows first.
    let pairs = m.div_ceil(MR);
    let want = 4 * rayon::current_num_threads();
    let row_bands = pairs.min(want);
    let panel_bands = panels.min(want.div_ceil(row_bands));
    let shared = SharedOut {
        ptr: out.as_mut_ptr(),
        n,
    };
    let pa = &*pa;
    (0..row_bands * panel_bands).into_par_iter().for_each(|t| {
        let (br, bp) = (t / panel_bands, t % panel_bands);
        let rows = (br * pairs / row_bands)..((br + 1) * pairs / row_bands);
        let cols = (bp * panels / panel_bands)..((bp + 1) * panels / panel_bands);
        // SAFETY: the task writes only rows `2 · rows` x panels `cols` of the output, which
        // no other task touches; the packed operands hold those rows and panels (asserted).
        unsafe { band(pa, pb, (m, n, groups), rows, cols, shared) };
    });
    true
}

/// Rows pairs `rows` x panels `cols` of the output over all K, slab by slab.
///
/// # Safety
/// No other thread touches this part of the output meanwhile; the packed operands hold
/// these rows and panels over `groups` groups.
unsafe fn band(
    pa: &PackedA,
    pb: &[u8],
    (m, n, groups): (usize, usize, usize),
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    out: SharedOut,
) {
    let row_bytes = groups * GROUP;
    let mut tmp = [0.0f32; MR * NR];
    for g0 in (0..groups).step_by(SLAB_GROUPS) {
        let gn = (groups - g0).min(SLAB_GROUPS);
        let acc = g0 > 0;
        for j in cols.clone() {
            let b = pb[(j * groups + g0) * RECORD..].as_ptr();
            let n_here = (n - j * NR).min(NR);
            for i in rows.clone() {
                let r0 = i * MR;
                let m_here = (m - r0).min(MR);
                let a = pa.codes[r0 * row_bytes + g0 * GROUP..].as_ptr();
                let sa = pa.scales[r0 * groups + g0..].as_ptr();
                let c = out.ptr.add(r0 * out.n + j * NR);
                let ops = Kernel {
                    a,
                    lda: row_bytes,
                    sa,
                    ldsa: groups,
                    b,
                    groups: gn,
                };
                if m_here == MR && n_here == NR {
                    kernel(ops, c, out.n, acc);
                } else {
                    for r in 0..m_here {
                        for q in 0..n_here {
                            tmp[r * NR + q] = if acc { *c.add(r * out.n + q) } else { 0.0 };
                        }
                    }
                    kernel(ops, tmp.as_mut_ptr(), NR, acc);
                    for r in 0..m_here {
                        for q in 0..n_here {
                            *c.add(r * out.n + q) = tmp[r * NR + q];
                        }
                    }
                }
            }
        }
    }
}

/// One kernel call's operands: 2 rows of A's codes (`lda` bytes apart) and scales (`ldsa`
/// apart) from the slab's first group, B's panel records from the same group, `groups`
/// groups.
#[derive(Clone, Copy)]
struct Kernel {
    a: *const u8,
    lda: usize,
    sa: *const f32,
    ldsa: usize,
    b: *const u8,
    groups: usize,
}

/// `c[0..2][0..16] (+)= Σ_g` over the call's groups, rows `ldc` apart.
///
/// # Safety
/// The CPU has AVX2 and FMA ([`e2m1_native`]); the operands hold what [`Kernel`] says and
/// `c` two rows of 16 at stride `ldc`.
#[inline]
unsafe fn kernel(k: Kernel, c: *mut f32, ldc: usize, acc: bool) {
    #[cfg(target_arch = "x86_64")]
    {
        avx2::kernel_2x16(k, c, ldc, acc);
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (k, c, ldc, acc);
        unreachable!("the E2M1 kernel runs on x86_64 only");
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::asm;

    use super::{Kernel, CORR_AT, RECORD, SCALES_AT};

    /// One quad of K after the first: B's two 32-byte halves at byte offsets `$b0`, `$b1`
    /// of the record, both rows' words at byte `$a` of their group, products added to the
    /// 16-bit sums ymm4-7.
    macro_rules! quad {
        ($b0:literal, $b1:literal, $a:literal) => {
            concat!(
                "vmovdqu ymm8, ymmword ptr [{b} + ",
                $b0,
                "]\n",
                "vmovdqu ymm9, ymmword ptr [{b} + ",
                $b1,
                "]\n",
                "vpbroadcastd ymm10, dword ptr [{a0} + ",
                $a,
                "]\n",
                "vpbroadcastd ymm11, dword ptr [{a1} + ",
                $a,
                "]\n",
                "vpmaddubsw ymm12, ymm10, ymm8\n",
                "vpmaddubsw ymm13, ymm10, ymm9\n",
                "vpaddw ymm4, ymm4, ymm12\n",
                "vpaddw ymm5, ymm5, ymm13\n",
                "vpmaddubsw ymm12, ymm11, ymm8\n",
                "vpmaddubsw ymm13, ymm11, ymm9\n",
                "vpaddw ymm6, ymm6, ymm12\n",
                "vpaddw ymm7, ymm7, ymm13",
            )
        };
    }

    /// See [`super::kernel`]. Inline assembly, so that the 16 `ymm` registers hold the four
    /// FP32 accumulators (ymm0-3), the four 16-bit group sums (ymm4-7), B's quad (ymm8-9),
    /// A's two broadcasts (ymm10-11), temporaries (ymm12-13) and the ones (ymm14) with
    /// nothing spilled: a compiled version spilled accumulators to the stack, where their
    /// reloads ran at half the speed (stalls that depended on the addresses).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn kernel_2x16(k: Kernel, c: *mut f32, ldc: usize, acc: bool) {
        asm!(
            "vpcmpeqw ymm14, ymm14, ymm14",
            "vpsrlw ymm14, ymm14, 15",
            "test {acc:e}, {acc:e}",
            "jz 3f",
            "vmovups ymm0, ymmword ptr [{c}]",
            "vmovups ymm1, ymmword ptr [{c} + 32]",
            "vmovups ymm2, ymmword ptr [{c} + {ldc}]",
            "vmovups ymm3, ymmword ptr [{c} + {ldc} + 32]",
            "jmp 2f",
            "3:",
            "vxorps ymm0, ymm0, ymm0",
            "vxorps ymm1, ymm1, ymm1",
            "vxorps ymm2, ymm2, ymm2",
            "vxorps ymm3, ymm3, ymm3",
            "2:",
            "test {groups}, {groups}",
            "jz 5f",
            "4:",
            // quad 0 starts the 16-bit sums
            "vmovdqu ymm8, ymmword ptr [{b}]",
            "vmovdqu ymm9, ymmword ptr [{b} + 32]",
            "vpbroadcastd ymm10, dword ptr [{a0}]",
            "vpbroadcastd ymm11, dword ptr [{a1}]",
            "vpmaddubsw ymm4, ymm10, ymm8",
            "vpmaddubsw ymm5, ymm10, ymm9",
            "vpmaddubsw ymm6, ymm11, ymm8",
            "vpmaddubsw ymm7, ymm11, ymm9",
            // quads 1..3
            quad!(64, 96, 4),
            quad!(128, 160, 8),
            quad!(192, 224, 12),
            // 32-bit group sums minus the offset's share: exact integers below 2^12
            "vpmaddwd ymm4, ymm4, ymm14",
            "vpmaddwd ymm5, ymm5, ymm14",
            "vpmaddwd ymm6, ymm6, ymm14",
            "vpmaddwd ymm7, ymm7, ymm14",
            "vpsubd ymm4, ymm4, ymmword ptr [{b} + {corr}]",
            "vpsubd ymm5, ymm5, ymmword ptr [{b} + {corr} + 32]",
            "vpsubd ymm6, ymm6, ymmword ptr [{b} + {corr}]",
            "vpsubd ymm7, ymm7, ymmword ptr [{b} + {corr} + 32]",
            "vcvtdq2ps ymm4, ymm4",
            "vcvtdq2ps ymm5, ymm5",
            "vcvtdq2ps ymm6, ymm6",
            "vcvtdq2ps ymm7, ymm7",
            // scale products t_a · t_b (exact), then one rounding per group in the FMA
            "vbroadcastss ymm10, dword ptr [{sa0}]",
            "vbroadcastss ymm11, dword ptr [{sa1}]",
            "vmulps ymm8, ymm10, ymmword ptr [{b} + {scales}]",
            "vmulps ymm9, ymm10, ymmword ptr [{b} + {scales} + 32]",
            "vmulps ymm12, ymm11, ymmword ptr [{b} + {scales}]",
            "vmulps ymm13, ymm11, ymmword ptr [{b} + {scales} + 32]",
            "vfmadd231ps ymm0, ymm4, ymm8",
            "vfmadd231ps ymm1, ymm5, ymm9",
            "vfmadd231ps ymm2, ymm6, ymm12",
            "vfmadd231ps ymm3, ymm7, ymm13",
            "add {b}, {record}",
            "add {a0}, 16",
            "add {a1}, 16",
            "add {sa0}, 4",
            "add {sa1}, 4",
            "dec {groups}",
            "jnz 4b",
            "5:",
            "vmovups ymmword ptr [{c}], ymm0",
            "vmovups ymmword ptr [{c} + 32], ymm1",
            "vmovups ymmword ptr [{c} + {ldc}], ymm2",
            "vmovups ymmword ptr [{c} + {ldc} + 32], ymm3",
            acc = in(reg) acc as u32,
            c = in(reg) c,
            ldc = in(reg) ldc * 4,
            groups = inout(reg) k.groups => _,
            b = inout(reg) k.b => _,
            a0 = inout(reg) k.a => _,
            a1 = inout(reg) k.a.add(k.lda) => _,
            sa0 = inout(reg) k.sa => _,
            sa1 = inout(reg) k.sa.add(k.ldsa) => _,
            record = const RECORD,
            corr = const CORR_AT,
            scales = const SCALES_AT,
            out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _,
            out("ymm4") _, out("ymm5") _, out("ymm6") _, out("ymm7") _,
            out("ymm8") _, out("ymm9") _, out("ymm10") _, out("ymm11") _,
            out("ymm12") _, out("ymm13") _, out("ymm14") _,
            options(nostack),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fp_formats::ElementFormat;

    #[test]
    fn every_nvfp4_group_splits_with_its_half_scale() {
        // every E4M3 scale (positive, finite, nonzero) and a group holding every E2M1 value
        let grid = [0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        for code in 1u8..0x7f {
            let s = fp_formats::E4M3::from_bits(code).to_f32();
            for top in 1..8 {
                // the largest element decides the divisor tried first
                let v: [f32; GROUP] = std::array::from_fn(|k| {
                    let e = grid[k % (top + 1)];
                    if k % 3 == 0 {
                        -e * s
                    } else {
                        e * s
                    }
                });
                let (t, c) = split_group(&v).expect("an NVFP4 group splits");
                for k in 0..GROUP {
                    assert_eq!(c[k] as f32 * t, v[k], "scale {s}, top {top}");
                    assert!(c[k].abs() <= 12);
                }
            }
        }
    }

    #[test]
    fn values_off_the_grid_do_not_split() {
        let mut v = [0.0f32; GROUP];
        v[0] = 6.0;
        v[1] = 5.0; // 12 and 10 halves: integers of at most 12 steps split too
        assert_eq!(
            split_group(&v).map(|(t, c)| (t, c[0], c[1])),
            Some((0.5, 12, 10))
        );
        v[1] = 0.7; // no multiple of 6 / d for any d
        assert!(split_group(&v).is_none());
        v[1] = 0.25; // 6 / 0.25 = 24: beyond 12 steps of any scale
        assert!(split_group(&v).is_none());
        v[1] = f32::NAN;
        assert!(split_group(&v).is_none());
        let mut z = [0.0f32; GROUP];
        z[3] = f32::NAN;
        assert!(split_group(&z).is_none());
        z[3] = f32::INFINITY;
        assert!(split_group(&z).is_none());
        // a scale with too many significant bits
        let t = 1.0 + 2f32.powi(-10);
        assert!(split_group(&[t; GROUP]).is_none());
        // out of range
        assert!(split_group(&[2f32.powi(-60); GROUP]).is_none());
        assert_eq!(split_group(&[-0.0; GROUP]), Some((0.0, [0; GROUP])));
    }
}

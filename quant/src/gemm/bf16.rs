//! The BF16 GEMM: `out[M, N] = A[M, K] · B[N, K]ᵀ` with both operands rounded to BF16 and
//! the products accumulated in FP32, in one of two fixed arithmetics
//! ([`Bf16Arithmetic`], docs/numerics.md#the-bf16-gemm): those of the two x86 BF16
//! dot-product units, each computed by its unit where the CPU has it (the pairs also by
//! AVX2's FMAs, `fma_pairs.rs`) and reproduced bit for bit by portable code
//! everywhere.
//!
//! **What both share.** Inputs are rounded to BF16 (round to nearest even; a value that is
//! already BF16, as every quantized GEMM operand is, is unchanged); BF16 subnormals count as
//! zero (DAZ). K is padded with zeros to a multiple of 32. Each product of two BF16 values is
//! exact (also below FP32's normal range: the product is not flushed) and each `+` below is
//! one FP32 addition of exact operands rounded to nearest even, with a subnormal result
//! flushed to zero (FTZ, sign kept).
//!
//! **Tiles** (AMX-BF16 `tdpbf16ps`, as measured on an Intel Xeon): for each output element
//! `c = +0`, and for each chunk of 32
//!
//! ```text
//! e = +0, o = +0
//! for j in 0..16:  e = e + a[2j]·b[2j];  o = o + a[2j+1]·b[2j+1]
//! c = c + (e + o)
//! ```
//!
//! **Pairs** (AVX512-BF16 `vdpbf16ps`, as specified by Intel and measured on an AMD EPYC
//! Zen 4): one running sum, `c = +0`, and for each pair `j` of K in order
//!
//! ```text
//! c = c + a[2j+1]·b[2j+1];  c = c + a[2j]·b[2j]
//! ```
//!
//! (the odd product first, each step rounded and flushed on its own; a step's result is
//! flushed when it is tiny *after* rounding, x86's rule: see `add_exact_pairs`).
//!
//! Not modelled: overflow of a product or partial sum beyond FP32's range (where the tile
//! unit keeps a wider exponent than the model; `vdpbf16ps` overflows to infinity as modelled)
//! and NaN payloads; the quantizers never produce such operands. Each output element
//! depends only on its row of A and its row of B, so the result is the same for any M, N,
//! thread count or parallel split.

use std::cell::Cell;

use rayon::prelude::*;

use super::pack::{pack_view, packed_row_tiles};
use super::MatRef;
use super::TileWords;

/// K elements per chunk (one AMX tile row of BF16 pairs).
pub const CHUNK: usize = 32;
/// Rows (of A) or columns (of B) per tile.
pub(super) const TILE: usize = 16;
/// BF16 elements of one packed tile.
const TILE_ELEMS: usize = TILE * CHUNK;
/// 32-bit words (BF16 pairs along K) of one packed tile.
pub(super) const TILE_WORDS: usize = TILE_ELEMS / 2;
/// Rows and columns of the output block one kernel call computes (2 x 2 tiles).
pub(super) const BLOCK: usize = 2 * TILE;
/// Packed tiles of B one slab may hold at most (see [`slab_chunks`]): 1 MiB, half of a
/// core's L2 on the CPUs with AMX (all of it on a Zen 4, where the limit is not measured).
const SLAB_B_TILES: usize = 1024;

/// Column blocks of B per panel: B's tiles of one panel and slab stay within
/// [`SLAB_B_TILES`] at the shortest slab (16 chunks). A B wider than this (N > 1024) is
/// multiplied panel by panel, each panel's slab reused from L2 by every row block of a task,
/// instead of the whole slab streaming from the last-level cache for each row block
/// (N = 2048-4096 products ran at 0.15-0.2 of the AMX peak so, against 0.3-0.4 at N <= 1024).
const PANEL_BLOCKS: usize = SLAB_B_TILES / (2 * 16);

/// The most packed A tiles a task keeps for one slab when B comes in several panels
/// ([`PANEL_BLOCKS`]): each block of A is then packed once per slab into this buffer and read
/// by every panel, and the task's row blocks are capped to fit (2 MiB).
const GROUP_A_TILES: usize = 2048;

/// Products of at most this many multiply-adds (`M · N · K`, a few microseconds on one core)
/// run as one task: attention as a whole was 3-5% faster so (its products per head and query
/// block are 64 x 128 x 32 at the `small` preset, and attention already runs its heads in
/// parallel); the linear layers' products are far larger and still split by row blocks, and
/// the sampler's decoding read the same (`bench decode`).
const ONE_TASK_PRODUCT: usize = 1 << 21;

/// Chunks of K per slab of the GEMM's K loop for `kc` chunks and `nb` 32-column blocks of
/// B: as many as keep the slab of B's tiles (`nb · 2` tiles per chunk) within
/// [`SLAB_B_TILES`], between 16 and 64, and the slabs even. Long slabs store and reload the
/// output tiles less often (the K = 2048 Wgrad products of the training presets: 6-16%
/// faster at 64 chunks than at 16); short ones keep B's slab in the cache for every block
/// of a group.
fn slab_chunks(kc: usize, nb: usize) -> usize {
    let most = (SLAB_B_TILES / (2 * nb)).clamp(16, 64);
    kc.div_ceil(kc.div_ceil(most))
}

/// `x` rounded to BF16 (nearest even; NaN stays a quiet NaN), as bits.
#[inline(always)]
pub fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
    let quiet = ((b >> 16) | 0x0040) as u16;
    if x.is_nan() {
        quiet
    } else {
        rounded
    }
}

/// The FP32 value of BF16 bits with subnormals read as zero (DAZ).
#[inline(always)]
fn bf16_daz(h: u16) -> f32 {
    let h = if h & 0x7f80 == 0 { h & 0x8000 } else { h };
    f32::from_bits((h as u32) << 16)
}

/// Flush to zero: a subnormal becomes a zero of the same sign.
#[inline(always)]
fn ftz(x: f32) -> f32 {
    if x.is_subnormal() {
        f32::from_bits(x.to_bits() & 0x8000_0000)
    } else {
        x
    }
}

/// The FP32 value of the BF16 rounding of `x` with subnormals read as zero: a GEMM input.
#[inline(always)]
fn bf16_input(x: f32) -> f32 {
    bf16_daz(bf16_bits(x))
}

/// `ftz(rn32(s + p))` for an f32 `s` and an exact product `p` of two BF16 values (16
/// significant bits, exponent within f64's range): `s + p` is rounded once to f64 and then to
/// f32, which equals one rounding to f32 because f64 carries more than `2 · 24 + 2` bits
/// (double rounding is innocuous for a sum of two operands of at most 24 bits).
#[inline(always)]
fn add_exact(s: f32, p: f64) -> f32 {
    ftz((s as f64 + p) as f32)
}

/// `c + p` for an f32 `c` and an exact product `p` of two BF16 values, one step of the pair
/// arithmetic: rounded to nearest even, and flushed to a zero of its sign when **tiny after
/// rounding**, x86's rule for FTZ (the sum rounded to 24 bits with an unbounded exponent
/// lies below 2^-126; measured with MXCSR.FTZ on `vfmadd231ps`, which [`super::fma_pairs`]
/// computes the arithmetic with). That differs from [`add_exact`]'s flush of a subnormal
/// f32 result only for sums in `[2^-126 - 2^-150, 2^-126 - 2^-151)`: they round up to 2^-126
/// on FP32's subnormal grid, but down with 24 bits, so they are tiny and flushed. `c + p` in
/// f64 is exact wherever the comparison with the bound could depend on it (near 2^-126 both
/// operands lie on grids that f64 resolves).
#[inline(always)]
fn add_exact_pairs(c: f32, p: f64) -> f32 {
    const TINY: f64 = f64::from_bits(0x380f_ffff_f000_0000); // 2^-126 - 2^-151
    let r = c as f64 + p;
    if r.abs() < TINY {
        if r.is_sign_negative() {
            -0.0
        } else {
            0.0
        }
    } else {
        r as f32
    }
}

/// The order in which a BF16 GEMM sums the products of one output element: the arithmetic
/// of one of the two BF16 dot-product units (see the module docs). Both are exact products
/// summed in FP32 with round-to-nearest-even, DAZ and FTZ; they differ in the order of the
/// sums, hence in the last bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bf16Arithmetic {
    /// AMX-BF16 `tdpbf16ps`: per chunk of 32, the even and the odd products in two partial
    /// sums, added together and then to the running sum.
    Tiles,
    /// AVX512-BF16 `vdpbf16ps`: one running sum over K, per pair the odd product first
    /// (computed with FMAs where the CPU has AVX2 but not AVX512_BF16).
    Pairs,
}

impl Bf16Arithmetic {
    /// Whether this CPU computes the arithmetic in hardware (the AMX-BF16 tile unit for
    /// [`Tiles`](Self::Tiles); for [`Pairs`](Self::Pairs) AVX512_BF16's `vdpbf16ps`, or
    /// else AVX2's FMA under MXCSR's FTZ and DAZ, which computes the same steps), so that
    /// [`bf16_gemm_tn`] runs at the hardware's speed rather than on the portable model.
    ///
    /// ```
    /// use quant::gemm::bf16::Bf16Arithmetic;
    /// assert_eq!(Bf16Arithmetic::Tiles.native(), fp_formats::cpu::has_amx_bf16());
    /// assert_eq!(
    ///     Bf16Arithmetic::Pairs.native(),
    ///     fp_formats::cpu::has_avx512_bf16() || fp_formats::cpu::has_avx2_fma()
    /// );
    /// ```
    pub fn native(self) -> bool {
        match self {
            Bf16Arithmetic::Tiles => fp_formats::cpu::has_amx_bf16(),
            Bf16Arithmetic::Pairs => {
                fp_formats::cpu::has_avx512_bf16() || fp_formats::cpu::has_avx2_fma()
            }
        }
    }

    /// The scalar reference of the arithmetic for one output element (rows `a` and `b` of
    /// length K, rounded to BF16 here), written independently of the packed layouts: used
    /// by the tests.
    ///
    /// ```
    /// use quant::gemm::bf16::Bf16Arithmetic;
    /// for arith in [Bf16Arithmetic::Tiles, Bf16Arithmetic::Pairs] {
    ///     assert_eq!(arith.dot_reference(&[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0]), 32.0);
    /// }
    /// // the orders differ in the last bits: with h = 2^-24, the tiles sum the lanes
    /// // (1 + h) + 1.5h, the pairs run (1.5h + 1) + 0 + h
    /// let h = 2f32.powi(-24);
    /// let (a, b) = ([1.0, 1.5 * h, h, 0.0], [1.0f32; 4]);
    /// assert_eq!(Bf16Arithmetic::Tiles.dot_reference(&a, &b), 1.0 + 2.0 * h);
    /// assert_eq!(Bf16Arithmetic::Pairs.dot_reference(&a, &b), 1.0 + 4.0 * h);
    /// ```
    pub fn dot_reference(self, a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len(), "dot_reference: lengths differ");
        // K padded with zeros to whole chunks (which can turn a -0 sum into +0)
        let at = |x: &[f32], k: usize| bf16_input(x.get(k).copied().unwrap_or(0.0));
        let product = |k: usize| at(a, k) as f64 * at(b, k) as f64;
        let mut c = 0.0f32;
        for k0 in (0..a.len()).step_by(CHUNK) {
            match self {
                Bf16Arithmetic::Tiles => {
                    let (mut e, mut o) = (0.0f32, 0.0f32);
                    for k in (k0..k0 + CHUNK).step_by(2) {
                        e = add_exact(e, product(k));
                        o = add_exact(o, product(k + 1));
                    }
                    c = ftz(c + ftz(e + o));
                }
                Bf16Arithmetic::Pairs => {
                    for k in (k0..k0 + CHUNK).step_by(2) {
                        c = add_exact_pairs(c, product(k + 1));
                        c = add_exact_pairs(c, product(k));
                    }
                }
            }
        }
        c
    }
}

/// What computes a GEMM: one of the two units, the pairs on FMAs, or the portable model of
/// an arithmetic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Unit {
    Amx,
    Dpbf16,
    /// The pair arithmetic on AVX2 + FMA ([`super::fma_pairs`]).
    Fma,
    Portable(Bf16Arithmetic),
}

impl Unit {
    /// The unit of `arith` where the CPU has it, its portable model otherwise.
    fn of(arith: Bf16Arithmetic) -> Unit {
        match arith {
            Bf16Arithmetic::Tiles if arith.native() => Unit::Amx,
            Bf16Arithmetic::Pairs if fp_formats::cpu::has_avx512_bf16() => Unit::Dpbf16,
            Bf16Arithmetic::Pairs if fp_formats::cpu::has_avx2_fma() => Unit::Fma,
            _ => Unit::Portable(arith),
        }
    }
}

/// Packed operands, reusable across calls.
#[derive(Debug, Default)]
pub struct Bf16Workspace {
    /// Packed A tiles (filled by the GEMM for a transposed view of A, or by
    /// [`super::pack::pack_panels`]; a view with K contiguous is packed block by block into
    /// each thread's own buffer instead).
    pub(crate) a: TileWords,
    /// Packed B tiles.
    pub(crate) b: TileWords,
}

impl Bf16Workspace {
    /// An empty workspace (buffers grow on first use and are then reused).
    pub fn new() -> Self {
        Self::default()
    }
}

/// `out = A · Bᵀ` for `A: [M, K]` and `B: [N, K]` views (any strides), `out` row-major
/// `[M, N]`, in the arithmetic `arith` (module docs): on its unit where
/// [`Bf16Arithmetic::native`] says the CPU has it, on portable code otherwise (same bits).
///
/// # Panics
/// If the K dimensions differ, `out` does not hold `M · N` elements or a view does not fit
/// its storage (callers that take shapes from users check them first).
///
/// ```
/// use quant::gemm::{bf16::{bf16_gemm_tn, Bf16Arithmetic, Bf16Workspace}, MatRef};
/// let a = [1.0f32, 2.0, 3.0, 4.0]; // [2, 2]
/// let b = [1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0]; // [3, 2]
/// let mut c = [0.0f32; 6];
/// let (av, bv) = (MatRef::row_major(&a, 2, 2), MatRef::row_major(&b, 3, 2));
/// bf16_gemm_tn(Bf16Arithmetic::Pairs, av, bv, &mut c, &mut Bf16Workspace::new());
/// assert_eq!(c, [1.0, 2.0, 3.0, 3.0, 4.0, 7.0]);
/// ```
pub fn bf16_gemm_tn(
    arith: Bf16Arithmetic,
    a: MatRef<'_>,
    b: MatRef<'_>,
    out: &mut [f32],
    ws: &mut Bf16Workspace,
) {
    gemm_sides(Unit::of(arith), Side::View(a), Side::View(b), out, ws, 1.0);
}

/// The arithmetic of the BF16 kernel this CPU runs, which the quantized GEMMs of training run
/// on: [`Tiles`](Bf16Arithmetic::Tiles) on the AMX-BF16 unit where present, else
/// [`Pairs`](Bf16Arithmetic::Pairs) on AVX512-BF16 or else on AVX2's FMAs, else `None` (and
/// [`quantized_gemm_tn`] runs on the f32 GEMM). The portable models reproduce both units bit
/// for bit but run two orders of magnitude slower than the f32 GEMM, so they serve the
/// tests, not training.
///
/// ```
/// use quant::gemm::bf16::quantized_gemm_arithmetic;
/// if let Some(arith) = quantized_gemm_arithmetic() {
///     assert!(arith.native());
/// }
/// ```
pub fn quantized_gemm_arithmetic() -> Option<Bf16Arithmetic> {
    [Bf16Arithmetic::Tiles, Bf16Arithmetic::Pairs]
        .into_iter()
        .find(|a| a.native())
}

/// The GEMM that two quantized operands (values exactly BF16, see [`crate::qgemm`]) multiply
/// on in training: [`bf16_gemm_tn`] on the unit of [`quantized_gemm_arithmetic`] where the
/// CPU has one, the f32 GEMM ([`sgemm`](crate::gemm::sgemm), FP32 products and sums)
/// elsewhere (and under `NIBBLE_FORCE_PORTABLE`). Either way each output element depends
/// only on its two rows, never on `M` or the thread count; which arithmetic ran is a
/// property of the machine, so bitwise reproduction holds per machine
/// (docs/numerics.md#the-bf16-gemm).
///
/// ```
/// use quant::gemm::{bf16::{quantized_gemm_tn, Bf16Workspace}, MatRef};
/// let a = [1.0f32, 2.0, 3.0, 4.0]; // [2, 2]
/// let b = [1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0]; // [3, 2]
/// let mut c = [0.0f32; 6];
/// quantized_gemm_tn(MatRef::row_major(&a, 2, 2), MatRef::row_major(&b, 3, 2), &mut c, &mut Bf16Workspace::new());
/// assert_eq!(c, [1.0, 2.0, 3.0, 3.0, 4.0, 7.0]);
/// ```
pub fn quantized_gemm_tn(a: MatRef<'_>, b: MatRef<'_>, out: &mut [f32], ws: &mut Bf16Workspace) {
    match quantized_gemm_arithmetic() {
        Some(arith) => bf16_gemm_tn(arith, a, b, out, ws),
        None => crate::gemm::sgemm(1.0, a, b.t(), 0.0, out),
    }
}

/// Whether [`quantized_gemm_tn`] rounds its inputs to BF16 itself on this machine (a BF16
/// unit runs, whose operands are packed with round-to-nearest-even, exactly the BF16
/// quantizer's RNE values; NaN stays NaN): then an operand whose quantizer is BF16 with
/// nearest rounding may go in unrounded, with the same result bit for bit and no rounding
/// pass over it. False where the product runs on the f32 GEMM, which takes its inputs as
/// they are.
///
/// ```
/// assert_eq!(
///     quant::gemm::bf16::quantized_gemm_rounds_inputs(),
///     quant::gemm::bf16::quantized_gemm_arithmetic().is_some()
/// );
/// ```
pub fn quantized_gemm_rounds_inputs() -> bool {
    quantized_gemm_arithmetic().is_some()
}

/// [`bf16_gemm_tn`] on the portable code whatever the CPU (for tests and benchmarks that
/// compare the two; the bits are the same).
#[doc(hidden)]
pub fn bf16_gemm_tn_portable(
    arith: Bf16Arithmetic,
    a: MatRef<'_>,
    b: MatRef<'_>,
    out: &mut [f32],
    ws: &mut Bf16Workspace,
) {
    gemm_sides(
        Unit::Portable(arith),
        Side::View(a),
        Side::View(b),
        out,
        ws,
        1.0,
    );
}

/// One operand of [`quantized_gemm_sides`]: a view the GEMM packs, or an `[rows, k]` operand
/// already packed into the workspace's buffer of its side ([`Bf16Workspace`]'s `a` for A,
/// `b` for B) by [`super::pack::pack_panels`] with the same `rows` and `k`.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Side<'a> {
    /// Values to round and pack.
    View(MatRef<'a>),
    /// Tiles already in the workspace.
    Packed {
        /// Rows of the operand (M for A, N for B).
        rows: usize,
        /// The reduction dimension.
        k: usize,
        /// Chunk-major tiles ([`super::pack::pack_panels_chunk_major`]) rather than
        /// block-major ([`super::pack::pack_panels`]).
        chunk_major: bool,
    },
    /// B's tiles, packed once by the caller ([`PackedB`]; the B side only).
    PackedB(&'a PackedB),
}

impl Side<'_> {
    fn dims(&self) -> (usize, usize) {
        match self {
            Side::View(v) => (v.rows, v.cols),
            Side::Packed { rows, k, .. } => (*rows, *k),
            Side::PackedB(p) => (p.rows, p.k),
        }
    }
}

/// An operand packed once into the B tiles of [`quantized_gemm_tn`], for products that
/// reuse it (a weight frozen between two syncs of an RL sampler: its decode steps then
/// skip packing it). The tiles are exactly those the GEMM would pack from the same view, so
/// the products are the same bits. Made only where a BF16 kernel runs.
#[derive(Clone, Debug)]
pub struct PackedB {
    words: TileWords,
    rows: usize,
    k: usize,
}

impl PackedB {
    /// `b: [N, K]` (any strides) packed as B, or `None` where no BF16 kernel runs (there the
    /// product runs on the f32 GEMM, which packs nothing of its own).
    ///
    /// # Panics
    /// If the view does not fit its storage.
    ///
    /// ```
    /// use quant::gemm::{bf16::{quantized_gemm_arithmetic, PackedB}, MatRef};
    /// let b = [1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0]; // [3, 2]
    /// let packed = PackedB::new(MatRef::row_major(&b, 3, 2));
    /// assert_eq!(packed.is_some(), quantized_gemm_arithmetic().is_some());
    /// if let Some(p) = packed {
    ///     assert_eq!(p.dims(), (3, 2));
    /// }
    /// ```
    pub fn new(b: MatRef<'_>) -> Option<PackedB> {
        quantized_gemm_arithmetic()?;
        assert!(b.fits(), "PackedB::new: the view exceeds its storage");
        let mut words = TileWords::default();
        pack_view(b, false, &mut words);
        Some(PackedB {
            words,
            rows: b.rows,
            k: b.cols,
        })
    }

    /// `(N, K)` of the packed operand.
    pub fn dims(&self) -> (usize, usize) {
        (self.rows, self.k)
    }
}

/// Both operands of [`quantized_gemm_tn`] packed once, so that [`PackedPair::gemm`] runs the
/// BF16 kernel alone: the product's time without the operands' rounding and packing (what
/// `bench gemms` reports as the kernel alone). The tiles are exactly those the GEMM would pack
/// from the same views, so the product is the same bits. Made only where a BF16 kernel runs.
#[derive(Debug)]
pub struct PackedPair {
    ws: Bf16Workspace,
    m: usize,
    n: usize,
    k: usize,
}

impl PackedPair {
    /// `a: [M, K]` packed as A and `b: [N, K]` as B (any strides), or `None` where no BF16
    /// kernel runs.
    ///
    /// # Panics
    /// If the K dimensions differ or a view does not fit its storage.
    ///
    /// ```
    /// use quant::gemm::{bf16::{quantized_gemm_tn, Bf16Workspace, PackedPair}, MatRef};
    /// let a = [1.0f32, 2.0, 3.0, 4.0]; // [2, 2]
    /// let b = [1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0]; // [3, 2]
    /// let (av, bv) = (MatRef::row_major(&a, 2, 2), MatRef::row_major(&b, 3, 2));
    /// if let Some(mut pair) = PackedPair::new(av, bv) {
    ///     let (mut once, mut packed) = ([0.0f32; 6], [0.0f32; 6]);
    ///     pair.gemm(&mut packed);
    ///     quantized_gemm_tn(av, bv, &mut once, &mut Bf16Workspace::new());
    ///     assert_eq!(packed, once);
    ///     assert_eq!(packed, [1.0, 2.0, 3.0, 3.0, 4.0, 7.0]);
    /// }
    /// ```
    pub fn new(a: MatRef<'_>, b: MatRef<'_>) -> Option<PackedPair> {
        quantized_gemm_arithmetic()?;
        assert_eq!(a.cols, b.cols, "PackedPair::new: K differs");
        assert!(
            a.fits() && b.fits(),
            "PackedPair::new: a view exceeds its storage"
        );
        let mut ws = Bf16Workspace::new();
        pack_view(a, true, &mut ws.a);
        pack_view(b, false, &mut ws.b);
        Some(PackedPair {
            ws,
            m: a.rows,
            n: b.rows,
            k: a.cols,
        })
    }

    /// `(M, N, K)` of the product.
    pub fn dims(&self) -> (usize, usize, usize) {
        (self.m, self.n, self.k)
    }

    /// Bytes of the packed tiles of both operands (K padded to whole chunks, rows to whole
    /// 32-row blocks): what [`PackedPair::gemm`] reads at the least.
    pub fn packed_bytes(&self) -> usize {
        (self.ws.a.len() + self.ws.b.len()) * 4
    }

    /// `out = A · Bᵀ` (row-major `[M, N]`) from the packed tiles, on the current rayon
    /// pool: [`quantized_gemm_tn`] without its packing.
    ///
    /// # Panics
    /// If `out` does not hold `M · N` elements.
    pub fn gemm(&mut self, out: &mut [f32]) {
        let (m, n, k) = (self.m, self.n, self.k);
        let side = |rows| Side::Packed {
            rows,
            k,
            chunk_major: false,
        };
        quantized_gemm_sides(side(m), side(n), out, &mut self.ws, 1.0);
    }
}

/// `out = alpha · (A · Bᵀ)`: [`quantized_gemm_tn`] on operands that may come packed already
/// (quantized straight into the tile layout, see [`super::pack::pack_panels`]), each output
/// element multiplied by `alpha` once its sum is complete (`fl(fl(Σ) · alpha)`, the bits of
/// a pass over the product; none when `alpha` is 1 or K is 0). Only where a BF16 kernel runs
/// ([`quantized_gemm_rounds_inputs`]): the packed tiles are the input format of both.
///
/// # Panics
/// As [`bf16_gemm_tn`]; also when the CPU has no BF16 kernel or a packed side's buffer is too
/// short for its shape.
pub(crate) fn quantized_gemm_sides(
    a: Side<'_>,
    b: Side<'_>,
    out: &mut [f32],
    ws: &mut Bf16Workspace,
    alpha: f32,
) {
    let arith =
        quantized_gemm_arithmetic().expect("quantized_gemm_sides: no BF16 kernel on this CPU");
    gemm_sides(Unit::of(arith), a, b, out, ws, alpha);
}

/// `out = alpha · (A · Bᵀ)` on `unit` (see [`quantized_gemm_sides`] for `alpha`).
fn gemm_sides(
    unit: Unit,
    a: Side<'_>,
    b: Side<'_>,
    out: &mut [f32],
    ws: &mut Bf16Workspace,
    alpha: f32,
) {
    let ((m, k), (n, kb)) = (a.dims(), b.dims());
    assert_eq!(kb, k, "bf16_gemm_tn: K differs ({k} vs {kb})");
    assert_eq!(out.len(), m * n, "bf16_gemm_tn: output length");
    for side in [a, b] {
        if let Side::View(v) = side {
            assert!(v.fits(), "bf16_gemm_tn: a strided view exceeds its storage");
        }
    }
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        out.fill(0.0);
        return;
    }
    let kc = k.div_ceil(CHUNK);
    let (mb, nb) = (m.div_ceil(BLOCK), n.div_ceil(BLOCK));
    debug_assert_eq!((mb * 2, nb * 2), (packed_row_tiles(m), packed_row_tiles(n)));
    // A view of A with K contiguous is packed block by block by the task that multiplies it
    // (below): its tiles go from the packing to the kernel through the core's cache, not
    // memory. A transposed view (the Wgrad operands) is packed whole first, by runs of K
    // (`pack_view`): per block, its short strided K lines took longer than the round trip.
    let a_view = match a {
        Side::View(a) if a.col_stride == 1 => Some(a),
        Side::View(a) => {
            pack_view(a, true, &mut ws.a);
            None
        }
        Side::Packed { .. } => {
            assert!(ws.a.len() >= mb * 2 * kc * TILE_WORDS);
            None
        }
        Side::PackedB(_) => panic!("bf16_gemm_tn: B's tiles given as operand A"),
    };
    let pb: &[u32] = match b {
        Side::View(b) => {
            pack_view(b, false, &mut ws.b);
            &ws.b
        }
        Side::Packed { .. } => &ws.b,
        Side::PackedB(p) => &p.words,
    };
    assert!(pb.len() >= nb * 2 * kc * TILE_WORDS);
    let pa = &ws.a[..];
    let (la, lb) = (Layout::of(&a, kc, mb * 2), Layout::of(&b, kc, nb * 2));
    if a_view.is_none()
        && unit != Unit::Amx
        && m * n * k > ONE_TASK_PRODUCT
        && nb * 2 * kc <= SLAB_B_TILES
        && uneven_row_groups(mb, rayon::current_num_threads())
    {
        let tiles = (pa, la, pb, lb);
        block_tasks(unit, tiles, (m, n, kc), out, alpha);
        return;
    }
    // Each task owns a group of 32-row blocks of the output (written by it alone) and runs
    // over K in slabs of `slab` chunks, and within a slab over B in panels of at most
    // `PANEL_BLOCKS` column blocks, all its blocks per panel, so that the panel's slab of
    // B's tiles is reused from the cache by every block of the group. An output element
    // still takes its chunks in order (the tiles are stored and reloaded exactly between
    // slabs), so its bits do not depend on the grouping, the slab size, the panels or the
    // thread count.
    let panel = nb.min(PANEL_BLOCKS);
    let slab = slab_chunks(kc, panel);
    // with several panels, a task's A blocks of a slab are packed once for all of them
    let keep_a = nb > panel && a_view.is_some();
    // a small product (attention's, per query block and head) in one task: splitting it
    // costs the pool more than the second half's arithmetic saves
    let group = if m * n * k <= ONE_TASK_PRODUCT {
        mb
    } else if keep_a {
        let most = (GROUP_A_TILES / (2 * slab)).max(1);
        mb.div_ceil(2 * rayon::current_num_threads()).clamp(1, most)
    } else {
        mb.div_ceil(2 * rayon::current_num_threads()).max(1)
    };
    out.par_chunks_mut(group * BLOCK * n)
        .enumerate()
        .for_each(|(g, rows)| {
            let mut c = [0.0f32; BLOCK * BLOCK];
            let mut own = A_BLOCK.with(Cell::take);
            #[cfg(target_arch = "x86_64")]
            let _cfg = (unit == Unit::Amx).then(super::amx::TileConfig::load);
            let blocks = rows.len().div_ceil(BLOCK * n);
            for k0 in (0..kc).step_by(slab) {
                let kn = (kc - k0).min(slab);
                let acc = k0 > 0;
                // the epilogue's factor, applied to each block once its last slab is stored
                // (the block still in L1), instead of in a pass over the whole output
                let scale = (k0 + kn == kc && alpha != 1.0).then_some(alpha);
                let a_run = Layout { run: kn, step: 1 };
                if let (true, Some(a)) = (keep_a, a_view) {
                    own.grow_to(blocks * 2 * kn * TILE_WORDS);
                    for bi in 0..blocks {
                        let at = &mut own[bi * 2 * kn * TILE_WORDS..];
                        super::pack::pack_a_block(a, g * group + bi, (k0, kn), at);
                    }
                }
                for j0 in (0..nb).step_by(panel) {
                    for (bi, rows) in rows.chunks_mut(BLOCK * n).enumerate() {
                        let ib = g * group + bi;
                        let a_blk = match a_view {
                            Some(_) if keep_a => a_run.tiles(&own, bi, 0, kn),
                            Some(a) => {
                                own.grow_to(2 * kn * TILE_WORDS);
                                super::pack::pack_a_block(a, ib, (k0, kn), &mut own);
                                a_run.tiles(&own, 0, 0, kn)
                            }
                            None => la.tiles(pa, ib, k0, kn),
                        };
                        let m_here = rows.len() / n;
                        for jb in j0..(j0 + panel).min(nb) {
                            let b_blk = lb.tiles(pb, jb, k0, kn);
                            let n_here = (n - jb * BLOCK).min(BLOCK);
                            let tiles = (a_blk, b_blk, kn);
                            if m_here == BLOCK && n_here == BLOCK {
                                // a whole block: straight into the output rows
                                block(unit, tiles, acc, &mut rows[jb * BLOCK..], n, BLOCK);
                                if let Some(alpha) = scale {
                                    scale_block(&mut rows[jb * BLOCK..], n, BLOCK, alpha);
                                }
                            } else {
                                if acc {
                                    for r in 0..m_here {
                                        c[r * BLOCK..][..n_here]
                                            .copy_from_slice(&rows[r * n + jb * BLOCK..][..n_here]);
                                    }
                                }
                                block(unit, tiles, acc, &mut c, BLOCK, m_here);
                                if let Some(alpha) = scale {
                                    scale_block(&mut c, BLOCK, m_here, alpha);
                                }
                                for r in 0..m_here {
                                    rows[r * n + jb * BLOCK..][..n_here]
                                        .copy_from_slice(&c[r * BLOCK..][..n_here]);
                                }
                            }
                        }
                    }
                }
            }
            A_BLOCK.with(|cell| cell.set(own));
        });
}

/// Whether the row-block groups of [`gemm_sides`] (`⌈mb / 2T⌉` blocks each) leave the
/// busiest of `threads` threads more than 5% above an even share of the `mb` row blocks:
/// then [`block_tasks`] splits the output finer. (Where the groups divide evenly, as for
/// the 64 row blocks of a training step's Fprop and Dgrad, the finer tasks only cost: one per
/// 32 x 32 block of a K = 128 product is a few microseconds of work, and the recipes' steps
/// ran 2-5% slower with every product split so.)
fn uneven_row_groups(mb: usize, threads: usize) -> bool {
    if threads <= 1 {
        return false;
    }
    let group = mb.div_ceil(2 * threads);
    let busiest = mb.div_ceil(group).div_ceil(threads) * group;
    busiest * 100 > mb * 105 / threads
}

/// `out = alpha · (A · Bᵀ)` (`[m, n]`, `kc` chunks) from packed tiles of both operands, one
/// task per 32 x 32 output block, row block by row block, each over all of K in a local
/// accumulator and then copied out. For A packed whole beforehand (the Wgrad operands, and
/// any operand a quantizer packed), a B whose tiles stay in a core's L2 and row blocks
/// that do not divide evenly between the threads ([`uneven_row_groups`]): the `small`
/// preset's Wgrad has 11, so one of two threads took 6 and the other 5, and on `vdpbf16ps`
/// M = 320 and 384 ran as long as each other. Not on the AMX unit: its kernel alone ran no
/// faster with these tasks on the uneven Wgrad shapes (67 against 69 us, `small`, two
/// threads), and with every pre-packed product split so the FP8 recipes' steps ran about 5%
/// slower there. Each element still takes its chunks in order, so the bits are those of the
/// row-block tasks.
fn block_tasks(
    unit: Unit,
    (pa, la, pb, lb): (&[u32], Layout, &[u32], Layout),
    (m, n, kc): (usize, usize, usize),
    out: &mut [f32],
    alpha: f32,
) {
    // (the AMX kernel would also need its tile configuration loaded on each thread)
    debug_assert_ne!(unit, Unit::Amx);
    let (mb, nb) = (m.div_ceil(BLOCK), n.div_ceil(BLOCK));
    // the output, shared by the tasks (each writes its own block)
    let shared = super::OutPtr(out.as_mut_ptr());
    (0..mb * nb).into_par_iter().for_each_init(
        || [0.0f32; BLOCK * BLOCK],
        |c, u| {
            let (ib, jb) = (u / nb, u % nb);
            let (m_here, n_here) = ((m - ib * BLOCK).min(BLOCK), (n - jb * BLOCK).min(BLOCK));
            let tiles = (la.tiles(pa, ib, 0, kc), lb.tiles(pb, jb, 0, kc), kc);
            block(unit, tiles, false, c, BLOCK, m_here);
            if alpha != 1.0 {
                scale_block(c, BLOCK, m_here, alpha);
            }
            for r in 0..m_here {
                // SAFETY: row `ib · 32 + r` < m, columns `jb · 32 ..` + n_here <= n: inside
                // `out` (m · n elements), in this task's block, which no other task writes.
                unsafe {
                    let dst = shared.get().add((ib * BLOCK + r) * n + jb * BLOCK);
                    std::ptr::copy_nonoverlapping(c[r * BLOCK..].as_ptr(), dst, n_here);
                }
            }
        },
    );
}

/// `x *= alpha` on the first `rows` rows of a 32-wide block at row stride `ld`.
#[inline(always)]
fn scale_block(c: &mut [f32], ld: usize, rows: usize, alpha: f32) {
    #[cfg(target_arch = "x86_64")]
    if fp_formats::cpu::has_avx512f() {
        // SAFETY: the CPU has AVX-512F.
        unsafe { scale_block_avx512(c, ld, rows, alpha) };
        return;
    }
    scale_rows(c, ld, rows, alpha);
}

/// [`scale_block`]'s loop, compiled for AVX-512 (two vector multiplies per row).
///
/// # Safety
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn scale_block_avx512(c: &mut [f32], ld: usize, rows: usize, alpha: f32) {
    scale_rows(c, ld, rows, alpha);
}

#[inline(always)]
fn scale_rows(c: &mut [f32], ld: usize, rows: usize, alpha: f32) {
    for r in 0..rows {
        c[r * ld..][..BLOCK].iter_mut().for_each(|x| *x *= alpha);
    }
}

thread_local! {
    /// Each thread's tiles of the A block it multiplies (see [`gemm_sides`]), kept between
    /// calls: at most 2 x 64 tiles (128 KiB), which stay in the core's cache; or, where B
    /// comes in several panels, its group's A blocks of one slab (at most [`GROUP_A_TILES`],
    /// 2 MiB).
    static A_BLOCK: Cell<TileWords> = Cell::new(TileWords::default());
}

/// Where a packed operand's tiles lie: tile `(i, t)` (rows `16i ..`, chunk `t`) at tile
/// index `i · run + t · step`. Block-major (the GEMM's own packing and
/// [`super::pack::pack_panels`]): `run = kc`, `step = 1`; chunk-major
/// ([`super::pack::pack_panels_chunk_major`]): `run = 1`, `step =` the row tiles.
#[derive(Clone, Copy, Debug)]
struct Layout {
    run: usize,
    step: usize,
}

impl Layout {
    fn of(side: &Side<'_>, kc: usize, row_tiles: usize) -> Layout {
        match side {
            Side::Packed {
                chunk_major: true, ..
            } => Layout {
                run: 1,
                step: row_tiles,
            },
            _ => Layout { run: kc, step: 1 },
        }
    }

    /// The tiles of the 32-row block `ib` from chunk `k0` on, `kn` chunks: the slice from
    /// tile `(2 ib, k0)` and this layout's strides.
    fn tiles<'a>(&self, packed: &'a [u32], ib: usize, k0: usize, kn: usize) -> Tiles<'a> {
        let first = 2 * ib * self.run + k0 * self.step;
        let end = first + self.run + (kn - 1) * self.step + 1;
        Tiles {
            words: &packed[first * TILE_WORDS..end * TILE_WORDS],
            run: self.run,
            step: self.step,
        }
    }
}

/// Two runs of packed tiles of one operand: tile `(i, t)` (`i < 2`) at tile index `i · run
/// + t · step` of `words`.
#[derive(Clone, Copy)]
struct Tiles<'a> {
    words: &'a [u32],
    run: usize,
    step: usize,
}

impl Tiles<'_> {
    fn tile(&self, i: usize, t: usize) -> &[u16] {
        bytemuck::cast_slice(
            &self.words[(i * self.run + t * self.step) * TILE_WORDS..][..TILE_WORDS],
        )
    }

    fn holds(&self, chunks: usize) -> bool {
        chunks >= 1 && self.words.len() >= (self.run + (chunks - 1) * self.step + 1) * TILE_WORDS
    }
}

/// One 32 x 32 output block over `chunks` chunks of `(a, b, chunks)` (see [`Tiles`] and
/// [`super::amx::block_2x2`]), accumulated into `c` (row stride `ldc`; tile `(i, j)`: rows
/// `16i ..`, columns `16j ..`) when `acc`, written over it otherwise, on `unit`. `c` must
/// hold `31 · ldc + 32` elements; only its first `rows` rows are wanted (the pair kernel
/// skips 8-row groups past them; their contents are then unspecified).
#[inline]
fn block(
    unit: Unit,
    (a, b, chunks): (Tiles<'_>, Tiles<'_>, usize),
    acc: bool,
    c: &mut [f32],
    ldc: usize,
    rows: usize,
) {
    assert!(ldc >= BLOCK && c.len() >= (BLOCK - 1) * ldc + BLOCK);
    assert!(a.holds(chunks) && b.holds(chunks));
    let arith = match unit {
        #[cfg(target_arch = "x86_64")]
        Unit::Amx | Unit::Dpbf16 | Unit::Fma => {
            let (pa, pb) = (
                (a.words.as_ptr().cast(), a.run, a.step),
                (b.words.as_ptr().cast(), b.run, b.step),
            );
            // SAFETY: the unit comes from `Unit::of`, which checked the CPU's support (and
            // for AMX the OS permission; the caller loaded the tile configuration on this
            // thread); `a` and `b` hold their tiles (i, t) for i < 2, t < chunks at the
            // strides given, and `c` the 32 x 32 block at stride `ldc` (asserted above).
            unsafe {
                match unit {
                    Unit::Amx => super::amx::block_2x2(pa, pb, chunks, c.as_mut_ptr(), ldc, acc),
                    Unit::Dpbf16 => {
                        super::dpbf16::block_2x2(pa, pb, chunks, c.as_mut_ptr(), ldc, acc, rows)
                    }
                    _ => {
                        super::fma_pairs::block_2x2(pa, pb, chunks, c.as_mut_ptr(), ldc, acc, rows)
                    }
                }
            };
            return;
        }
        Unit::Portable(arith) => arith,
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("no BF16 unit off x86_64"),
    };
    if !acc {
        for r in 0..BLOCK {
            c[r * ldc..][..BLOCK].fill(0.0);
        }
    }
    for t in 0..chunks {
        for i in 0..2 {
            let at = a.tile(i, t);
            for j in 0..2 {
                let c = &mut c[i * TILE * ldc + j * TILE..];
                match arith {
                    Bf16Arithmetic::Tiles => tile_portable(c, ldc, at, b.tile(j, t)),
                    Bf16Arithmetic::Pairs => pairs_portable(c, ldc, at, b.tile(j, t)),
                }
            }
        }
    }
}

/// The portable model of one `tdpbf16ps` on 16 x 16 tiles: `c[r][n] += Σ a[r][k]·b[k][n]`
/// over one chunk of 32, in the tile arithmetic of the module docs; `c` has row stride `ldc`.
fn tile_portable(c: &mut [f32], ldc: usize, a: &[u16], b: &[u16]) {
    for r in 0..TILE {
        let (mut e, mut o) = ([0.0f32; TILE], [0.0f32; TILE]);
        let ar = &a[r * CHUNK..][..CHUNK];
        for p in 0..CHUNK / 2 {
            let (a0, a1) = (bf16_daz(ar[2 * p]), bf16_daz(ar[2 * p + 1]));
            let br = &b[p * 2 * TILE..][..2 * TILE];
            for nn in 0..TILE {
                e[nn] = add_exact(e[nn], a0 as f64 * bf16_daz(br[2 * nn]) as f64);
                o[nn] = add_exact(o[nn], a1 as f64 * bf16_daz(br[2 * nn + 1]) as f64);
            }
        }
        let cr = &mut c[r * ldc..][..TILE];
        for nn in 0..TILE {
            cr[nn] = ftz(cr[nn] + ftz(e[nn] + o[nn]));
        }
    }
}

/// The portable model of sixteen `vdpbf16ps` (one chunk of 32) on a 16 x 16 block: for each
/// pair `p` in order, `c[r][n] += a[r][2p+1]·b[2p+1][n]`, then `+= a[r][2p]·b[2p][n]`, in
/// the pair arithmetic of the module docs (the sum read with DAZ, as the instruction does);
/// `c` has row stride `ldc`.
fn pairs_portable(c: &mut [f32], ldc: usize, a: &[u16], b: &[u16]) {
    for r in 0..TILE {
        let ar = &a[r * CHUNK..][..CHUNK];
        let cr = &mut c[r * ldc..][..TILE];
        for p in 0..CHUNK / 2 {
            let (a0, a1) = (bf16_daz(ar[2 * p]) as f64, bf16_daz(ar[2 * p + 1]) as f64);
            let br = &b[p * 2 * TILE..][..2 * TILE];
            for (nn, s) in cr.iter_mut().enumerate() {
                let odd = add_exact_pairs(ftz(*s), a1 * bf16_daz(br[2 * nn + 1]) as f64);
                *s = add_exact_pairs(odd, a0 * bf16_daz(br[2 * nn]) as f64);
            }
        }
    }
}

/// Floating-point operations of `iters` rounds of the tile unit's peak loop on this thread
/// (four `tdpbf16ps` of 16 x 16 x 32 each per round), or `None` without AMX-BF16. For the
/// peak probe of `bench`; the caller times it.
#[doc(hidden)]
pub fn tile_peak_probe(iters: usize) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    if fp_formats::cpu::has_amx_bf16() && iters > 0 {
        let _cfg = super::amx::TileConfig::load();
        // SAFETY: AMX is usable and configured on this thread; the loop touches no memory.
        unsafe { super::amx::peak_loop(iters) };
        return Some((iters * 4 * TILE * TILE * CHUNK * 2) as f64);
    }
    let _ = iters;
    None
}

#[cfg(test)]
mod tests {
    use super::uneven_row_groups;

    /// The finer tasks take over exactly where the row-block groups leave a thread idle:
    /// the Wgrad products of the presets (11 and 22 row blocks on two threads), not the
    /// 64 of a training step's Fprop and Dgrad, an even count, or one thread.
    #[test]
    fn finer_tasks_only_for_uneven_row_groups() {
        for (mb, threads, uneven) in [
            (11, 2, true),
            (22, 2, true),
            (10, 2, true),
            (3, 2, true),
            (64, 2, false),
            (12, 2, false),
            (63, 2, false),
            (3, 3, false),
            (11, 1, false),
        ] {
            assert_eq!(
                uneven_row_groups(mb, threads),
                uneven,
                "{mb} blocks, {threads} threads"
            );
        }
    }
}

//! The pair arithmetic of [`super::bf16`] ([`super::bf16::Bf16Arithmetic::Pairs`]) on AVX2
//! and FMA, for CPUs without a BF16 dot-product unit: the same bits as `vdpbf16ps`.
//!
//! Why an FMA computes a `vdpbf16ps` step exactly: a product of two BF16 values has at most
//! 16 significant bits, so it is exact in FP32's 24, and `vfmadd231ps` rounds `c + a·b`
//! once, to nearest even, as the dot-product instruction rounds each of its two steps. What
//! remains is the instruction's fixed DAZ and FTZ: the kernel sets MXCSR's DAZ and FTZ bits
//! for its own duration (saved and restored inside the one `asm!` block, so no compiled Rust
//! code ever runs with them), which reads a subnormal BF16 input (a subnormal in FP32 too)
//! as zero and flushes a tiny sum to a zero of its sign. x86 detects tininess *after*
//! rounding (the sum rounded to 24 bits with an unbounded exponent is below 2^-126), which
//! is the rule the portable model follows (docs/numerics.md#the-bf16-gemm).
//!
//! Layout and blocking: B comes as the packed tiles of the other kernels (16 pair rows x 16
//! columns, pair `p` of column `n` at word `16 p + n`); A's tiles of one 32-row block are
//! first spread into FP32 ([`expand_a`]: each pair word as its odd and its even BF16 value,
//! exact), once per block and K slab, and reused by every column block. One kernel call
//! computes 6 (or 4) rows x 16 columns in twelve (eight) `ymm` accumulators; per pair it
//! splits B's two 32-byte lines into their odd halves (`& 0xffff0000`: the BF16 value as
//! FP32) and even halves (`<< 16`), broadcasts each row's odd and then even value, and
//! issues the odd products' FMAs before the even ones', as `vdpbf16ps` orders them. The loop
//! is inline assembly so that the instruction order, and with it the bits, are as written.

use std::arch::asm;

/// MXCSR inside the kernel: all exceptions masked, round to nearest, FTZ (bit 15) and DAZ
/// (bit 6) set.
const MXCSR_FTZ_DAZ: u32 = 0x1f80 | 0x8000 | 0x0040;

/// One call of the kernel: `rows` (6 or 4) x 16 columns over `chunks` chunks. `a` points at
/// the first of the rows in the spread A of chunk 0 ([`expand_a`]: 128 bytes per row, a
/// pair's odd value then its even one), chunk `t`'s `a_step` bytes further per chunk; `b` at
/// the B tile of chunk 0, `b_step` bytes per chunk; `c` at the first output element, rows
/// `ldc_bytes` apart. With `acc` the sums start from C, else from +0; they are stored back
/// at the end.
macro_rules! pairs_kernel {
    ($a:expr, $a_step:expr, $b:expr, $b_step:expr, $chunks:expr, $c:expr, $ldc:expr, $acc:expr;
     $( ($r:literal, $lo:literal, $hi:literal) ),+) => {{
        let mut saved = 0u32;
        let csr = MXCSR_FTZ_DAZ;
        asm!(
            "stmxcsr dword ptr [{saved}]",
            "ldmxcsr dword ptr [{csr}]",
            // ymm15 = 0xffff0000 in every lane: the odd BF16 of a pair word, as FP32
            "vpcmpeqd ymm15, ymm15, ymm15",
            "vpslld ymm15, ymm15, 16",
            "test {acc:e}, {acc:e}",
            "jz 3f",
            $(
                concat!("vmovups ymm", $lo, ", ymmword ptr [rax]"),
                concat!("vmovups ymm", $hi, ", ymmword ptr [rax + 32]"),
                "add rax, {ldc}",
            )+
            "jmp 2f",
            "3:",
            $(
                concat!("vxorps ymm", $lo, ", ymm", $lo, ", ymm", $lo),
                concat!("vxorps ymm", $hi, ", ymm", $hi, ", ymm", $hi),
            )+
            // chunks
            "2:",
            "mov r9d, 16",
            // the sixteen pairs of a chunk
            "4:",
            "vpand ymm12, ymm15, ymmword ptr [rdi]",
            "vpand ymm13, ymm15, ymmword ptr [rdi + 32]",
            $(
                concat!("vbroadcastss ymm14, dword ptr [rsi + 128*", $r, "]"),
                concat!("vfmadd231ps ymm", $lo, ", ymm14, ymm12"),
                concat!("vfmadd231ps ymm", $hi, ", ymm14, ymm13"),
            )+
            "vmovdqu ymm12, ymmword ptr [rdi]",
            "vmovdqu ymm13, ymmword ptr [rdi + 32]",
            "vpslld ymm12, ymm12, 16",
            "vpslld ymm13, ymm13, 16",
            $(
                concat!("vbroadcastss ymm14, dword ptr [rsi + 128*", $r, " + 4]"),
                concat!("vfmadd231ps ymm", $lo, ", ymm14, ymm12"),
                concat!("vfmadd231ps ymm", $hi, ", ymm14, ymm13"),
            )+
            "add rsi, 8",
            "add rdi, 64",
            "dec r9d",
            "jnz 4b",
            "add rsi, {sa}",
            "add rdi, {sb}",
            "dec rcx",
            "jnz 2b",
            $(
                concat!("vmovups ymmword ptr [rdx], ymm", $lo),
                concat!("vmovups ymmword ptr [rdx + 32], ymm", $hi),
                "add rdx, {ldc}",
            )+
            "ldmxcsr dword ptr [{saved}]",
            "vzeroupper",
            saved = in(reg) &mut saved,
            csr = in(reg) &csr,
            acc = in(reg) u32::from($acc),
            inout("rsi") $a => _,
            inout("rdi") $b => _,
            // the pair loop advanced rsi by 128 and rdi by 1024 bytes per chunk
            sa = in(reg) $a_step - 128,
            sb = in(reg) $b_step - 1024,
            inout("rcx") $chunks => _,
            inout("rax") $c => _,
            inout("rdx") $c => _,
            ldc = in(reg) $ldc,
            out("r9") _,
            clobber_abi("C"),
            options(nostack),
        )
    }};
}

/// Rows `r0 .. r0 + rows` (`rows` 6 or 4) x 16 columns of one output tile; arguments as in
/// the module's macro.
///
/// # Safety
/// The CPU must have AVX2 and FMA; `a` must be valid for reads of `rows` rows of 128 bytes
/// (stride 128) in each of `chunks` spread tiles `a_step` bytes apart (`a_step >= 128`),
/// `b` for 1024 bytes per chunk (`b_step >= 1024`), `c` for reads and writes of `rows` rows
/// of 16 f32 at stride `ldc_bytes`; `chunks >= 1`.
#[allow(clippy::too_many_arguments)]
unsafe fn rows_x16(
    rows: usize,
    a: *const u8,
    a_step: usize,
    b: *const u8,
    b_step: usize,
    chunks: usize,
    c: *mut f32,
    ldc_bytes: usize,
    acc: bool,
) {
    if rows == 6 {
        pairs_kernel!(a, a_step, b, b_step, chunks, c, ldc_bytes, acc;
            (0, 0, 1), (1, 2, 3), (2, 4, 5), (3, 6, 7), (4, 8, 9), (5, 10, 11));
    } else {
        debug_assert_eq!(rows, 4);
        pairs_kernel!(a, a_step, b, b_step, chunks, c, ldc_bytes, acc;
            (0, 0, 1), (1, 2, 3), (2, 4, 5), (3, 6, 7));
    }
}

/// The row groups of a 16-row tile: (first row, rows).
const GROUPS: [(usize, usize); 3] = [(0, 6), (6, 6), (12, 4)];

/// FP32 values of one spread A row chunk: 16 pairs, each its odd value then its even one.
const SPREAD_ROW: usize = 32;

/// Spreads A's packed tiles `(i, t)` (`i < 2`, `t < chunks`; tile `(i, t)` at tile index `i ·
/// run + t · step` of `words`, 16 rows x 16 pair words each) into `out` as FP32: element
/// `((i · chunks + t) · 16 + r) · 32 + 2p` is the odd BF16 value of row `r`'s pair `p`,
/// `+ 1` its even one (each exactly its BF16 value: a shift of the bits).
pub(super) fn expand_a(
    words: &[u32],
    (run, step): (usize, usize),
    chunks: usize,
    out: &mut Vec<f32>,
) {
    use super::bf16::TILE_WORDS;
    let len = 2 * chunks * TILE_WORDS * 2;
    if out.len() < len {
        out.resize(len, 0.0);
    }
    for i in 0..2 {
        for t in 0..chunks {
            let tile = &words[(i * run + t * step) * TILE_WORDS..][..TILE_WORDS];
            let dst = &mut out[(i * chunks + t) * TILE_WORDS * 2..][..TILE_WORDS * 2];
            for (d, &w) in dst.chunks_exact_mut(2).zip(tile) {
                d[0] = f32::from_bits(w & 0xffff_0000);
                d[1] = f32::from_bits(w << 16);
            }
        }
    }
    debug_assert_eq!(SPREAD_ROW * 16, TILE_WORDS * 2);
}

/// The 32 x 32 block `C (+)= Σ_t A(·, t) · B(·, t)` over `chunks` chunks: `a` is A's spread
/// tiles ([`expand_a`] with the same `chunks`), `b = (ptr, run, step)` points at packed B
/// tile `(0, 0)`, tile `(j, t)` (`j < 2`) at `(j · run + t · step) · 512` BF16 from it; tile
/// `(i, j)` of C at `c + 16 i · ldc + 16 j` (row stride `ldc` f32). With `acc` the sums start
/// from C's values, else from zero. Only the row groups that hold one of the first `rows`
/// rows are computed; the others are left as they were.
///
/// # Safety
/// The CPU must have AVX2 and FMA ([`fp_formats::cpu::has_avx2_fma`]); `a` must hold the
/// spread tiles of `chunks` chunks, `b` must be valid for reads of its tiles for `t <
/// chunks`, `c` for reads and writes of 32 rows of 32 f32 at stride `ldc`; `chunks >= 1`.
pub(super) unsafe fn block_2x2(
    a: &[f32],
    (b, b_run, b_step): (*const u16, usize, usize),
    chunks: usize,
    c: *mut f32,
    ldc: usize,
    acc: bool,
    rows: usize,
) {
    const TILE_BYTES: usize = 1024;
    const SPREAD_TILE: usize = 16 * SPREAD_ROW;
    debug_assert!(a.len() >= 2 * chunks * SPREAD_TILE);
    // K in runs of SUB chunks, every row group per run: the run's B tiles (16 KiB) are then
    // read from L1 by all six row groups instead of streaming from L2 for each (which capped
    // the kernel at L2's bandwidth). The sums are stored and reloaded exactly between runs.
    for t0 in (0..chunks).step_by(SUB) {
        let tn = SUB.min(chunks - t0);
        let acc = acc || t0 > 0;
        for i in 0..2 {
            for (r0, n) in GROUPS {
                if 16 * i + r0 >= rows {
                    break;
                }
                let a_rows = a
                    .as_ptr()
                    .add((i * chunks + t0) * SPREAD_TILE + r0 * SPREAD_ROW);
                for j in 0..2 {
                    let b_tile = b.cast::<u8>().add((j * b_run + t0 * b_step) * TILE_BYTES);
                    let c_rows = c.add((16 * i + r0) * ldc + 16 * j);
                    rows_x16(
                        n,
                        a_rows.cast(),
                        SPREAD_TILE * 4,
                        b_tile,
                        b_step * TILE_BYTES,
                        tn,
                        c_rows,
                        ldc * 4,
                        acc,
                    );
                }
            }
        }
    }
}

/// Chunks of K per run of [`block_2x2`]: 8 chunks of both B tiles are 16 KiB, half a Zen 3
/// core's L1 data cache.
const SUB: usize = 8;

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
//! Layout and blocking: the kernel reads the packed tiles of the other kernels (an A tile
//! is 16 rows x 16 pair words, row `r`'s pair `p` at word `16 r + p`; a B tile 16 pair rows
//! x 16 columns, pair `p` of column `n` at word `16 p + n`). One call computes 6 (or 4) rows
//! x 16 columns in twelve (eight) `ymm` accumulators; per pair it splits B's two 32-byte
//! lines into their odd halves (`& 0xffff0000`: the BF16 value as FP32) and even halves
//! (`<< 16`), broadcasts each row's pair word and splits it the same way, and issues the odd
//! products' FMAs before the even ones', as `vdpbf16ps` orders them. The loop is inline
//! assembly so that the instruction order, and with it the bits, are as written.

use std::arch::asm;

/// MXCSR inside the kernel: all exceptions masked, round to nearest, FTZ (bit 15) and DAZ
/// (bit 6) set.
const MXCSR_FTZ_DAZ: u32 = 0x1f80 | 0x8000 | 0x0040;

/// One call of the kernel: `rows` (6 or 4) x 16 columns over `chunks` chunks. `a` points at
/// the first of the rows in packed A tile `(·, 0)` (row stride 64 bytes), chunk `t`'s
/// `a_step` bytes further per chunk; `b` at the B tile of chunk 0, `b_step` bytes per chunk;
/// `c` at the first output element, rows `ldc_bytes` apart. With `acc` the sums start from
/// C, else from +0; they are stored back at the end.
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
                concat!("vpbroadcastd ymm14, dword ptr [rsi + 64*", $r, "]"),
                "vpand ymm14, ymm14, ymm15",
                concat!("vfmadd231ps ymm", $lo, ", ymm14, ymm12"),
                concat!("vfmadd231ps ymm", $hi, ", ymm14, ymm13"),
            )+
            "vmovdqu ymm12, ymmword ptr [rdi]",
            "vmovdqu ymm13, ymmword ptr [rdi + 32]",
            "vpslld ymm12, ymm12, 16",
            "vpslld ymm13, ymm13, 16",
            $(
                concat!("vpbroadcastd ymm14, dword ptr [rsi + 64*", $r, "]"),
                "vpslld ymm14, ymm14, 16",
                concat!("vfmadd231ps ymm", $lo, ", ymm14, ymm12"),
                concat!("vfmadd231ps ymm", $hi, ", ymm14, ymm13"),
            )+
            "add rsi, 4",
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
            // the pair loop advanced rsi by 64 and rdi by 1024 bytes per chunk
            sa = in(reg) $a_step - 64,
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
/// The CPU must have AVX2 and FMA; `a` must be valid for reads of `rows` rows of 64 bytes
/// (stride 64) in each of `chunks` tiles `a_step` bytes apart (`a_step >= 64`), `b` for 1024
/// bytes per chunk (`b_step >= 1024`), `c` for reads and writes of `rows` rows of 16 f32 at
/// stride `ldc_bytes`; `chunks >= 1`.
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

/// The 32 x 32 block `C (+)= Σ_t A(·, t) · B(·, t)` over `chunks` chunks, with the tile
/// arguments of [`super::dpbf16::block_2x2`]: tile `(i, t)` of A at `(i · run + t · step) ·
/// 512` BF16 from `a.0`, B likewise, tile `(i, j)` of C at `c + 16 i · ldc + 16 j`. With
/// `acc` the sums start from C's values, else from zero. Only the row groups that hold one
/// of the first `rows` rows are computed; the others are left as they were.
///
/// # Safety
/// The CPU must have AVX2 and FMA ([`fp_formats::cpu::has_avx2_fma`]); `a` and `b` must be
/// valid for reads of those tiles for `t < chunks`, `c` for reads and writes of 32 rows of
/// 32 f32 at stride `ldc`; `chunks >= 1`.
pub(super) unsafe fn block_2x2(
    (a, a_run, a_step): (*const u16, usize, usize),
    (b, b_run, b_step): (*const u16, usize, usize),
    chunks: usize,
    c: *mut f32,
    ldc: usize,
    acc: bool,
    rows: usize,
) {
    const TILE_BYTES: usize = 1024;
    for i in 0..2 {
        for (r0, n) in GROUPS {
            if 16 * i + r0 >= rows {
                return;
            }
            let a_rows = a.cast::<u8>().add(i * a_run * TILE_BYTES + r0 * 64);
            for j in 0..2 {
                let b_tile = b.cast::<u8>().add(j * b_run * TILE_BYTES);
                let c_rows = c.add((16 * i + r0) * ldc + 16 * j);
                rows_x16(
                    n,
                    a_rows,
                    a_step * TILE_BYTES,
                    b_tile,
                    b_step * TILE_BYTES,
                    chunks,
                    c_rows,
                    ldc * 4,
                    acc,
                );
            }
        }
    }
}

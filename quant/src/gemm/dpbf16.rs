//! The AVX512-BF16 kernel of [`super::bf16`] (the pair arithmetic,
//! [`super::bf16::Bf16Arithmetic::Pairs`]): a 32 x 32 output block computed as four 8 x 32
//! register blocks, each accumulated over all K chunks in sixteen `zmm` registers with
//! `vdpbf16ps` (per 32-bit lane: `c += a[2p+1]·b[2p+1]`, then `c += a[2p]·b[2p]`, each one
//! FP32 rounding, BF16 inputs and FP32 results flushed to zero). It reads the same packed
//! tiles as the AMX kernel: an A tile is 16 rows x 16 pair words (row `r`, pair `p` at word
//! `16 r + p`), so one word broadcast to all lanes is a row's pair; a B tile is 16 pair rows
//! x 16 columns (pair `p` of column `n` at word `16 p + n`), so one 64-byte line is a pair
//! of sixteen columns. The loop is inline assembly, like the AMX kernel's, so that the
//! register blocking (16 accumulators, 2 B lines, 8 broadcasts) and the instruction order are
//! exactly as written whatever the compiler (the assembler evaluates the constant offsets): rsi walks A, rdi and r8 the
//! two B tiles, rcx counts the chunks, rdx walks C.

use std::arch::asm;

/// One 8 x 32 register block over `chunks` chunks: `a` points at row 0 of the 8 rows in
/// packed A tile `(·, 0)`, chunk `t`'s tile `a_step` bytes further per chunk; `b0`, `b1` at
/// the B tiles of columns 0-15 and 16-31 of chunk 0, `b_step` bytes per chunk; `c` at the
/// block's first output element, rows `ldc_bytes` apart. With `acc` the sums start from C,
/// else from +0; they are stored back at the end.
///
/// # Safety
/// The CPU must have AVX-512F and AVX512_BF16; `a` must be valid for reads of 8 rows of 64
/// bytes (row stride 64) in each of `chunks` tiles, `b0` / `b1` for 1024 bytes per chunk,
/// `c` for reads and writes of 8 rows of 32 f32; `chunks >= 1`.
#[allow(clippy::too_many_arguments)]
unsafe fn rows8(
    a: *const u8,
    a_step: usize,
    (b0, b1): (*const u8, *const u8),
    b_step: usize,
    chunks: usize,
    c: *mut f32,
    ldc_bytes: usize,
    acc: bool,
) {
    // The sixteen pairs of one chunk: two B lines, then for each of the 8 rows one
    // broadcast pair of A and two dot products (zmm 2r and 2r+1 hold row r's 32 sums).
    macro_rules! kernel {
        ($init:literal, [$($extra:tt)*], $($p:literal)*) => {
            asm!(
                $init,
                "2:",
                $(
                    concat!("vmovups zmm16, zmmword ptr [rdi + 64*", $p, "]"),
                    concat!("vmovups zmm17, zmmword ptr [r8 + 64*", $p, "]"),
                    concat!("vpbroadcastd zmm18, dword ptr [rsi + 4*", $p, "]"),
                    concat!("vpbroadcastd zmm19, dword ptr [rsi + 64 + 4*", $p, "]"),
                    "vdpbf16ps zmm0, zmm18, zmm16",
                    "vdpbf16ps zmm1, zmm18, zmm17",
                    concat!("vpbroadcastd zmm20, dword ptr [rsi + 128 + 4*", $p, "]"),
                    "vdpbf16ps zmm2, zmm19, zmm16",
                    "vdpbf16ps zmm3, zmm19, zmm17",
                    concat!("vpbroadcastd zmm21, dword ptr [rsi + 192 + 4*", $p, "]"),
                    "vdpbf16ps zmm4, zmm20, zmm16",
                    "vdpbf16ps zmm5, zmm20, zmm17",
                    concat!("vpbroadcastd zmm22, dword ptr [rsi + 256 + 4*", $p, "]"),
                    "vdpbf16ps zmm6, zmm21, zmm16",
                    "vdpbf16ps zmm7, zmm21, zmm17",
                    concat!("vpbroadcastd zmm23, dword ptr [rsi + 320 + 4*", $p, "]"),
                    "vdpbf16ps zmm8, zmm22, zmm16",
                    "vdpbf16ps zmm9, zmm22, zmm17",
                    concat!("vpbroadcastd zmm24, dword ptr [rsi + 384 + 4*", $p, "]"),
                    "vdpbf16ps zmm10, zmm23, zmm16",
                    "vdpbf16ps zmm11, zmm23, zmm17",
                    concat!("vpbroadcastd zmm25, dword ptr [rsi + 448 + 4*", $p, "]"),
                    "vdpbf16ps zmm12, zmm24, zmm16",
                    "vdpbf16ps zmm13, zmm24, zmm17",
                    "vdpbf16ps zmm14, zmm25, zmm16",
                    "vdpbf16ps zmm15, zmm25, zmm17",
                )*
                "add rsi, {sa}",
                "add rdi, {sb}",
                "add r8, {sb}",
                "dec rcx",
                "jnz 2b",
                // store the 8 rows
                "vmovups zmmword ptr [rdx], zmm0",
                "vmovups zmmword ptr [rdx + 64], zmm1",
                "add rdx, {ldc}",
                "vmovups zmmword ptr [rdx], zmm2",
                "vmovups zmmword ptr [rdx + 64], zmm3",
                "add rdx, {ldc}",
                "vmovups zmmword ptr [rdx], zmm4",
                "vmovups zmmword ptr [rdx + 64], zmm5",
                "add rdx, {ldc}",
                "vmovups zmmword ptr [rdx], zmm6",
                "vmovups zmmword ptr [rdx + 64], zmm7",
                "add rdx, {ldc}",
                "vmovups zmmword ptr [rdx], zmm8",
                "vmovups zmmword ptr [rdx + 64], zmm9",
                "add rdx, {ldc}",
                "vmovups zmmword ptr [rdx], zmm10",
                "vmovups zmmword ptr [rdx + 64], zmm11",
                "add rdx, {ldc}",
                "vmovups zmmword ptr [rdx], zmm12",
                "vmovups zmmword ptr [rdx + 64], zmm13",
                "add rdx, {ldc}",
                "vmovups zmmword ptr [rdx], zmm14",
                "vmovups zmmword ptr [rdx + 64], zmm15",
                "vzeroupper",
                inout("rsi") a => _,
                inout("rdi") b0 => _,
                inout("r8") b1 => _,
                sa = in(reg) a_step,
                sb = in(reg) b_step,
                inout("rcx") chunks => _,
                inout("rdx") c => _,
                ldc = in(reg) ldc_bytes,
                $($extra)*
                clobber_abi("C"),
                options(nostack),
            )
        };
    }
    // The initial loads walk a copy of `c` (`rdx` itself walks the stores).
    if acc {
        kernel!(
            "vmovups zmm0, zmmword ptr [rax]
             vmovups zmm1, zmmword ptr [rax + 64]
             add rax, {ldc}
             vmovups zmm2, zmmword ptr [rax]
             vmovups zmm3, zmmword ptr [rax + 64]
             add rax, {ldc}
             vmovups zmm4, zmmword ptr [rax]
             vmovups zmm5, zmmword ptr [rax + 64]
             add rax, {ldc}
             vmovups zmm6, zmmword ptr [rax]
             vmovups zmm7, zmmword ptr [rax + 64]
             add rax, {ldc}
             vmovups zmm8, zmmword ptr [rax]
             vmovups zmm9, zmmword ptr [rax + 64]
             add rax, {ldc}
             vmovups zmm10, zmmword ptr [rax]
             vmovups zmm11, zmmword ptr [rax + 64]
             add rax, {ldc}
             vmovups zmm12, zmmword ptr [rax]
             vmovups zmm13, zmmword ptr [rax + 64]
             add rax, {ldc}
             vmovups zmm14, zmmword ptr [rax]
             vmovups zmm15, zmmword ptr [rax + 64]",
            [inout("rax") c => _,],
            0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15
        );
    } else {
        kernel!(
            "vpxord zmm0, zmm0, zmm0
             vpxord zmm1, zmm1, zmm1
             vpxord zmm2, zmm2, zmm2
             vpxord zmm3, zmm3, zmm3
             vpxord zmm4, zmm4, zmm4
             vpxord zmm5, zmm5, zmm5
             vpxord zmm6, zmm6, zmm6
             vpxord zmm7, zmm7, zmm7
             vpxord zmm8, zmm8, zmm8
             vpxord zmm9, zmm9, zmm9
             vpxord zmm10, zmm10, zmm10
             vpxord zmm11, zmm11, zmm11
             vpxord zmm12, zmm12, zmm12
             vpxord zmm13, zmm13, zmm13
             vpxord zmm14, zmm14, zmm14
             vpxord zmm15, zmm15, zmm15",
            [],
            0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15
        );
    }
}

/// The 32 x 32 block `C (+)= Σ_t A(·, t) · B(·, t)` over `chunks` chunks, with the tile
/// arguments of [`super::amx::block_2x2`]: `a = (ptr, run, step)` points at packed A tile
/// `(0, 0)`, tile `(i, t)` (`i < 2`) at `(i · run + t · step) · 512` BF16 from it; `b`
/// likewise; tile `(i, j)` of C at `c + 16 i · ldc + 16 j` (row stride `ldc` f32). With
/// `acc` the sums start from C's values, else from zero. Only the 8-row groups that hold
/// one of the first `rows` rows are computed (a partial block's others are not wanted: a
/// one-row decode step then costs one group, not four); the others are left as they were.
///
/// # Safety
/// The CPU must have AVX-512F and AVX512_BF16 ([`fp_formats::cpu::has_avx512_bf16`]); `a`
/// and `b` must be valid for reads of those tiles for `t < chunks`, `c` for reads and
/// writes of 32 rows of 32 f32 at stride `ldc`; `chunks >= 1`.
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
    let b0 = b.cast::<u8>();
    let b1 = b0.add(b_run * TILE_BYTES);
    for i in 0..2 {
        for half in 0..2 {
            if 16 * i + 8 * half >= rows {
                return;
            }
            let rows = a.cast::<u8>().add(i * a_run * TILE_BYTES + half * 8 * 64);
            let c_rows = c.add((16 * i + 8 * half) * ldc);
            rows8(
                rows,
                a_step * TILE_BYTES,
                (b0, b1),
                b_step * TILE_BYTES,
                chunks,
                c_rows,
                ldc * 4,
                acc,
            );
        }
    }
}

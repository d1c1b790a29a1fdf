//! The AMX-BF16 kernel of [`super::bf16`]: a 32 x 32 output block (2 x 2 tiles) accumulated
//! over all K chunks in the tile registers. Stable Rust has no AMX intrinsics, so the four
//! instructions it needs (`ldtilecfg`, `tileloadd`, `tdpbf16ps`, `tilestored`, plus
//! `tilezero` and `tilerelease`) are written as inline assembly.

use std::arch::asm;

use super::bf16::BLOCK;

/// The tile configuration (palette 1): all eight tiles 16 rows x 64 bytes.
#[repr(C, align(64))]
struct Config {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

/// The tile configuration loaded on this thread for the guard's lifetime (released on drop).
pub(super) struct TileConfig(());

impl TileConfig {
    /// Loads the configuration. Only call when [`fp_formats::cpu::has_amx_bf16`] is true.
    pub(super) fn load() -> Self {
        let mut cfg = Config {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        for t in 0..8 {
            cfg.colsb[t] = 64;
            cfg.rows[t] = 16;
        }
        debug_assert!(fp_formats::cpu::has_amx_bf16());
        // SAFETY: the caller checked AMX support and permission; `cfg` is a valid 64-byte
        // palette-1 configuration.
        unsafe {
            asm!("ldtilecfg [{}]", in(reg) &cfg as *const Config, options(nostack, readonly))
        };
        TileConfig(())
    }
}

impl Drop for TileConfig {
    fn drop(&mut self) {
        // SAFETY: releases the tile state this guard configured.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// The 32 x 32 block `C (+)= Σ_t A(·, t) · B(·, t)` over `chunks` chunks: `a = (ptr, run,
/// step)` points at packed A tile `(0, 0)`, tile `(i, t)` (`i < 2`) at `(i · run + t ·
/// step) · 512` BF16 from it; `b` likewise for B; tile `(i, j)` of C is at `c + 16 i · ldc +
/// 16 j` (f32 elements, row stride `ldc`). With `acc` the tiles start from C's values
/// (loaded), else from zero; either way they are stored back at the end.
///
/// # Safety
/// AMX-BF16 must be usable and a [`TileConfig`] loaded on this thread; `a` and `b` must be
/// valid for reads of those tiles for `t < chunks`, `c` for reads and writes of 32 rows of
/// 32 f32 at stride `ldc`; `chunks >= 1`.
pub(super) unsafe fn block_2x2(
    (a, a_run, a_step): (*const u16, usize, usize),
    (b, b_run, b_step): (*const u16, usize, usize),
    chunks: usize,
    c: *mut f32,
    ldc: usize,
    acc: bool,
) {
    let ldc_bytes = ldc * 4;
    // tiles (1, 0) and (1, 1)
    let c_low = c.add(16 * ldc);
    // Ask for the block's 64 output lines (two per row) in a writable state first, so that
    // fetching them overlaps the products instead of stalling the tile stores at the end: a
    // training GEMM's output is rarely in the cache. Prefetches never fault, and every CPU
    // with AMX has PREFETCHW.
    for r in 0..BLOCK {
        asm!(
            "prefetchw [{row}]",
            "prefetchw [{row} + 64]",
            row = in(reg) c.add(r * ldc),
            options(nostack, readonly, preserves_flags),
        );
    }
    macro_rules! kernel {
        ($($init:literal),*) => {
            asm!(
                $($init,)*
                "2:",
                "tileloadd tmm4, [{a0} + {s}*1]",
                "tileloadd tmm6, [{b0} + {s}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tileloadd tmm7, [{b1} + {s}*1]",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tileloadd tmm5, [{a1} + {s}*1]",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                "add {a0}, {sa}",
                "add {a1}, {sa}",
                "add {b0}, {sb}",
                "add {b1}, {sb}",
                "dec {n}",
                "jnz 2b",
                "tilestored [{c} + {ldc}*1], tmm0",
                "tilestored [{c} + {ldc}*1 + 64], tmm1",
                "tilestored [{cl} + {ldc}*1], tmm2",
                "tilestored [{cl} + {ldc}*1 + 64], tmm3",
                a0 = inout(reg) a => _,
                a1 = inout(reg) a.cast::<u8>().add(a_run * 1024) => _,
                b0 = inout(reg) b => _,
                b1 = inout(reg) b.cast::<u8>().add(b_run * 1024) => _,
                sa = in(reg) a_step * 1024,
                sb = in(reg) b_step * 1024,
                n = inout(reg) chunks => _,
                c = in(reg) c,
                cl = in(reg) c_low,
                ldc = in(reg) ldc_bytes,
                s = in(reg) 64usize,
                options(nostack),
            )
        };
    }
    if acc {
        kernel!(
            "tileloadd tmm0, [{c} + {ldc}*1]",
            "tileloadd tmm1, [{c} + {ldc}*1 + 64]",
            "tileloadd tmm2, [{cl} + {ldc}*1]",
            "tileloadd tmm3, [{cl} + {ldc}*1 + 64]"
        );
    } else {
        kernel!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3"
        );
    }
}

/// `iters` rounds of four independent `tdpbf16ps` on zeroed tiles (the peak probe).
///
/// # Safety
/// AMX-BF16 must be usable and a [`TileConfig`] loaded on this thread; `iters >= 1`.
pub(super) unsafe fn peak_loop(iters: usize) {
    asm!(
        "tilezero tmm0",
        "tilezero tmm1",
        "tilezero tmm2",
        "tilezero tmm3",
        "tilezero tmm4",
        "tilezero tmm5",
        "tilezero tmm6",
        "tilezero tmm7",
        "2:",
        "tdpbf16ps tmm0, tmm4, tmm6",
        "tdpbf16ps tmm1, tmm4, tmm7",
        "tdpbf16ps tmm2, tmm5, tmm6",
        "tdpbf16ps tmm3, tmm5, tmm7",
        "dec {n}",
        "jnz 2b",
        n = inout(reg) iters => _,
        options(nostack, nomem),
    );
}

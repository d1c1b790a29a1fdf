//! Run-time CPU feature dispatch, shared by every crate of the workspace: `fp-formats`'
//! kernels, `quant`'s fused quantizers and `autograd`'s element loops ask here, and only
//! here, whether their AVX2 builds (and `quant`'s AVX-512 kernels, [`has_avx512f`]) may run.
//!
//! Detection happens once per process. Setting `NIBBLE_FORCE_PORTABLE` (or, by its older
//! name, `FP_FORMATS_FORCE_PORTABLE`) to any value selects the portable code everywhere, for
//! testing and benchmarking the fallback that runs on other CPUs. Every AVX2 path computes
//! the same bits as its portable twin (each crate's tests compare them), so the choice
//! changes speed only.
//!
//! The same switch covers the two BF16 units of `quant`'s BF16 GEMM, the AVX-512 BF16
//! dot-product instruction (`vdpbf16ps`) and the AMX-BF16 tile unit: [`has_avx512_bf16`] and
//! [`has_amx_bf16`]. AMX also needs the kernel's permission to use the tile state, requested
//! once per process here (`arch_prctl(ARCH_REQ_XCOMP_PERM)` on Linux); without it the answer
//! is `false`. Each BF16 GEMM unit computes the same bits as its portable model too.
//!
//! Setting `NIBBLE_NO_AMX` ([`NO_AMX_ENV`]) to any value leaves the tile unit alone (and only
//! it): the BF16 GEMMs then run the pair arithmetic of `vdpbf16ps`, so an AMX machine
//! computes a quantized recipe's bits as a CPU with AVX512_BF16 and no AMX (a Zen 4) does, and
//! its `vdpbf16ps` GEMMs can be measured.
//!
//! ```
//! // Whatever the machine, the answer is stable within a process.
//! assert_eq!(fp_formats::cpu::has_avx2(), fp_formats::cpu::has_avx2());
//! if fp_formats::cpu::has_avx2_fma() {
//!     assert!(fp_formats::cpu::has_avx2());
//! }
//! ```

use std::sync::OnceLock;

/// Environment variables that select the portable code.
pub const FORCE_PORTABLE_ENV: [&str; 2] = ["NIBBLE_FORCE_PORTABLE", "FP_FORMATS_FORCE_PORTABLE"];

/// The environment variable that keeps the AMX tile unit unused (see the module docs).
pub const NO_AMX_ENV: &str = "NIBBLE_NO_AMX";

/// What this process may use.
#[derive(Clone, Copy, Debug)]
struct Features {
    avx2: bool,
    fma: bool,
    avx512f: bool,
    avx512_bf16: bool,
    amx_bf16: bool,
}

fn features() -> Features {
    static FEATURES: OnceLock<Features> = OnceLock::new();
    *FEATURES.get_or_init(|| {
        let forced = FORCE_PORTABLE_ENV
            .iter()
            .any(|v| std::env::var_os(v).is_some());
        #[cfg(target_arch = "x86_64")]
        let (avx2, fma) = (
            std::is_x86_feature_detected!("avx2"),
            std::is_x86_feature_detected!("fma"),
        );
        #[cfg(not(target_arch = "x86_64"))]
        let (avx2, fma) = (false, false);
        #[cfg(target_arch = "x86_64")]
        let avx512f =
            std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("popcnt");
        #[cfg(not(target_arch = "x86_64"))]
        let avx512f = false;
        #[cfg(target_arch = "x86_64")]
        let avx512_bf16 = avx512f && std::is_x86_feature_detected!("avx512bf16");
        #[cfg(not(target_arch = "x86_64"))]
        let avx512_bf16 = false;
        Features {
            avx2: avx2 && !forced,
            fma: fma && !forced,
            avx512f: avx512f && !forced,
            avx512_bf16: avx512_bf16 && !forced,
            amx_bf16: !forced && std::env::var_os(NO_AMX_ENV).is_none() && amx_bf16_usable(),
        }
    })
}

/// Whether AVX2 code may run: the CPU has AVX2 and the portable code is not forced.
#[inline]
pub fn has_avx2() -> bool {
    features().avx2
}

/// Whether AVX2 + FMA code may run (the CPU has both and the portable code is not forced).
#[inline]
pub fn has_avx2_fma() -> bool {
    let f = features();
    f.avx2 && f.fma
}

/// Whether AVX-512F code (with POPCNT, which every such CPU has) may run: `quant`'s AVX-512
/// quantizer kernels.
///
/// ```
/// if fp_formats::cpu::has_avx512f() {
///     assert!(std::env::var_os("NIBBLE_FORCE_PORTABLE").is_none());
/// }
/// ```
#[inline]
pub fn has_avx512f() -> bool {
    features().avx512f
}

/// Whether AVX-512F + AVX512_BF16 code (`vdpbf16ps`) may run.
#[inline]
pub fn has_avx512_bf16() -> bool {
    features().avx512_bf16
}

/// Whether AMX-BF16 tile code (`tdpbf16ps`) may run: the CPU has AMX-TILE and AMX-BF16, the
/// operating system granted this process the tile state, and neither the portable code nor
/// [`NO_AMX_ENV`] is set.
///
/// ```
/// if fp_formats::cpu::has_amx_bf16() {
///     assert!(std::env::var_os("NIBBLE_FORCE_PORTABLE").is_none());
/// }
/// ```
#[inline]
pub fn has_amx_bf16() -> bool {
    features().amx_bf16
}

/// CPUID leaf 7 (AMX-TILE: EDX bit 24, AMX-BF16: EDX bit 22), then the Linux permission
/// request for the tile data state (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`,
/// which fails on kernels or hypervisors without it).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn amx_bf16_usable() -> bool {
    // CPUID is safe on every x86_64 CPU; leaf 7 is read only when leaf 0 lists it.
    if std::arch::x86_64::__cpuid(0).eax < 7 {
        return false;
    }
    let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
    if leaf7.edx & (1 << 24) == 0 || leaf7.edx & (1 << 22) == 0 {
        return false;
    }
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    let ret: i64;
    // SAFETY: the arch_prctl system call only changes this process's permitted extended
    // state; it reads no memory of ours. rcx and r11 are clobbered by `syscall`.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret == 0
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn amx_bf16_usable() -> bool {
    false
}

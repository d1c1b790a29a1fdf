//! Run-time CPU feature dispatch, shared by every crate of the workspace: `fp-formats`'
//! kernels, `quant`'s fused quantizers and `autograd`'s element loops ask here, and only
//! here, whether their AVX2 builds may run.
//!
//! Detection happens once per process. Setting `NIBBLE_FORCE_PORTABLE` (or, by its older
//! name, `FP_FORMATS_FORCE_PORTABLE`) to any value selects the portable code everywhere, for
//! testing and benchmarking the fallback that runs on other CPUs. Every AVX2 path computes
//! the same bits as its portable twin (each crate's tests compare them), so the choice
//! changes speed only.
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

/// What this process may use.
#[derive(Clone, Copy, Debug)]
struct Features {
    avx2: bool,
    fma: bool,
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
        Features {
            avx2: avx2 && !forced,
            fma: fma && !forced,
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

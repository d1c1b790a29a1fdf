//! The one run-time AVX2 code-generation switch for loops written for the vectoriser (the
//! E2M1 packing, the Philox byte stream): the same Rust compiled for AVX2 where the CPU has
//! it, as is otherwise. Only a code-generation choice: the bits are the same.

/// Runs `f` compiled for AVX2 where the CPU has it (and `NIBBLE_FORCE_PORTABLE` is unset),
/// as is otherwise. Mark the closure `#[inline(always)]` so that its body is compiled inside
/// the AVX2 function.
#[inline(always)]
pub(crate) fn with_avx2<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if fp_formats::cpu::has_avx2() {
        #[target_feature(enable = "avx2")]
        unsafe fn avx2<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        // SAFETY: the CPU supports AVX2 (checked above).
        return unsafe { avx2(f) };
    }
    f()
}

//! The instruction peaks the GEMMs are measured against: FP32 FMA (`vfmadd231ps` on 512-bit
//! or 256-bit vectors, whichever the CPU has), the BF16 dot product (`vdpbf16ps`, 512-bit),
//! the AMX-BF16 tile unit (`tdpbf16ps`) and AVX2's byte dot product (`vpmaddubsw`), each on 1 and 2 threads, as GFLOP/s (a
//! multiply-add counts 2). Every probe runs enough independent accumulators to hide the
//! instruction's latency, on registers only.

use std::time::Instant;

use rayon::prelude::*;

use crate::harness::pool;

/// An instruction whose peak is probed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// FP32 fused multiply-add.
    Fma,
    /// AVX512_BF16 dot product of BF16 pairs into FP32.
    Dpbf16,
    /// AMX-BF16 tile dot product.
    Amx,
    /// AVX2 byte dot product `vpmaddubsw` (32 byte products per 256-bit instruction, a
    /// product counted as a multiply-add: 2 operations), the E2M1 block GEMM's instruction.
    ByteDot,
}

impl Unit {
    /// Metric name part.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Fma => "fp32_fma",
            Unit::Dpbf16 => "bf16_dot",
            Unit::Amx => "amx_bf16",
            Unit::ByteDot => "byte_dot",
        }
    }
}

/// GFLOP/s of `unit` on `threads` threads (each running the probe for about `secs`), or
/// `None` when this CPU (or `NIBBLE_FORCE_PORTABLE`) rules it out.
pub fn peak_gflops(unit: Unit, threads: usize, secs: f64) -> anyhow::Result<Option<f64>> {
    if probe(unit, 1).is_none() {
        return Ok(None);
    }
    // calibrate the iteration count on one call
    let mut iters = 1000usize;
    loop {
        let t = Instant::now();
        probe(unit, iters);
        if t.elapsed().as_secs_f64() > secs / 10.0 {
            break;
        }
        iters *= 4;
    }
    let t0 = Instant::now();
    let one = probe(unit, iters).unwrap_or(0.0);
    let per_call = t0.elapsed().as_secs_f64();
    let reps = ((secs / per_call) as usize).max(1);
    let pool = pool(threads)?;
    let best = pool.install(|| {
        (0..3)
            .map(|_| {
                let t = Instant::now();
                (0..threads).into_par_iter().for_each(|_| {
                    for _ in 0..reps {
                        probe(unit, iters);
                    }
                });
                (one * (reps * threads) as f64) / t.elapsed().as_secs_f64() / 1e9
            })
            .fold(0.0f64, f64::max)
    });
    Ok(Some(best))
}

/// The probe of `unit` as a case timed beside the GEMMs in the same rounds (see
/// [`PairedProbe::run`]), so that a GEMM's fraction of the peak is a ratio of two times taken
/// together: on a VM the clock of a core drifts by several percent between the start of a
/// suite and its last case.
#[derive(Clone, Copy, Debug)]
pub struct PairedProbe {
    unit: Unit,
    threads: usize,
    iters: usize,
    /// Operations of one thread's call.
    flops: f64,
}

impl PairedProbe {
    /// The probe of `unit` on `threads` threads, one call taking about `secs`; `None` where
    /// this CPU (or `NIBBLE_FORCE_PORTABLE`) rules the unit out.
    pub fn new(unit: Unit, threads: usize, secs: f64) -> Option<PairedProbe> {
        probe(unit, 1)?;
        let iters = iters_for(secs, |iters| {
            std::hint::black_box(probe(unit, iters));
        });
        Some(PairedProbe {
            unit,
            threads,
            iters,
            flops: probe(unit, iters)?,
        })
    }

    /// Runs one call: every thread of the current pool's first `threads` runs the probe.
    pub fn run(&self) {
        (0..self.threads).into_par_iter().for_each(|_| {
            std::hint::black_box(probe(self.unit, self.iters));
        });
    }

    /// Floating-point operations of one [`PairedProbe::run`].
    pub fn flops(&self) -> f64 {
        self.flops * self.threads as f64
    }
}

/// Name of the metric, within a group of 2-thread speed-ups (`step`, `quant`), that says how
/// much of a second core the host gave in the same rounds: see [`scaling_work`].
pub fn scaling_probe_metric(group: &str) -> String {
    format!("{group}/fma_probe/speedup_2t")
}

/// A 2-thread speed-up of training code is a property of the code only while the host gives
/// the second thread a whole core. A VM's two logical CPUs can be hyperthreads of one core, or
/// share a core with another tenant; then every 2-thread speed-up falls whatever the code
/// does. So the rounds that measure a speed-up also time this register-only work on a 1- and a
/// 2-thread pool: `units` runs of the FMA probe loop (a portable multiply-add loop where the
/// CPU has no FMA), `iters` rounds each, spread over `pool`'s threads. The same work on both
/// pools scales by ~2.0x on two full cores and by much less on a shared one.
pub fn scaling_work(pool: &rayon::ThreadPool, units: usize, iters: usize) {
    pool.install(|| {
        (0..units).into_par_iter().for_each(|_| {
            if probe(Unit::Fma, iters).is_none() {
                std::hint::black_box(portable_multiply_add(iters));
            }
        })
    });
}

/// Rounds of [`scaling_work`] for one unit to take about `secs` on this thread.
pub fn scaling_iters(secs: f64) -> anyhow::Result<usize> {
    let one = pool(1)?;
    Ok(iters_for(secs, |iters| scaling_work(&one, 1, iters)))
}

/// The iteration count for which one `run(iters)` on this thread takes about `secs`:
/// quadrupled from 1024 until a run takes over a quarter of it, then scaled to it.
fn iters_for(secs: f64, run: impl Fn(usize)) -> usize {
    let mut iters = 1usize << 10;
    loop {
        let t = Instant::now();
        run(iters);
        let took = t.elapsed().as_secs_f64();
        if took > secs / 4.0 || iters >= 1 << 30 {
            return ((iters as f64) * secs / took.max(1e-9)).clamp(1.0, (1u64 << 32) as f64)
                as usize;
        }
        iters *= 4;
    }
}

/// Median microseconds, over `samples` tries, for an idle worker of `pool` (two or more
/// threads) to wake up and take a task that the calling worker queued after sleeping 2 ms:
/// what every parallel region of a training step pays when the other thread has gone to
/// sleep. Bare-metal hosts wake a thread in a few microseconds; a VM whose idle vCPU has been
/// descheduled can take far longer, and then fine-grained parallel code scales worse on it
/// while coarse loops do not.
pub fn wake_latency_us(pool: &rayon::ThreadPool, samples: usize) -> f64 {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;
    let give_up = Duration::from_millis(50);
    let mut v: Vec<f64> = pool.install(|| {
        (0..samples.max(1))
            .map(|_| {
                std::thread::sleep(Duration::from_millis(2));
                let taken = AtomicBool::new(false);
                let t = Instant::now();
                rayon::join(
                    || {
                        // the task queued below runs elsewhere unless nobody takes it in time
                        while !taken.load(Ordering::Acquire) && t.elapsed() < give_up {
                            std::hint::spin_loop();
                        }
                    },
                    || taken.store(true, Ordering::Release),
                );
                t.elapsed().as_secs_f64() * 1e6
            })
            .collect()
    });
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Register-only multiply-adds without FMA: 64 independent accumulators.
fn portable_multiply_add(iters: usize) -> f32 {
    let mut acc = [1.0f32; 64];
    for _ in 0..iters {
        for a in acc.iter_mut() {
            *a = std::hint::black_box(*a) * 0.999_999 + 1e-7;
        }
    }
    acc.iter().sum()
}

/// Runs `iters` rounds of `unit`'s loop on this thread; the flops done, or `None`.
fn probe(unit: Unit, iters: usize) -> Option<f64> {
    match unit {
        Unit::Amx => quant::gemm::bf16::tile_peak_probe(iters),
        #[cfg(target_arch = "x86_64")]
        Unit::Fma if fp_formats::cpu::has_avx2_fma() => {
            let avx512 = std::is_x86_feature_detected!("avx512f");
            // SAFETY: the features were checked just above.
            unsafe {
                if avx512 {
                    x86::fma512(iters.max(1))
                } else {
                    x86::fma256(iters.max(1))
                }
            };
            Some((iters * x86::ACC * if avx512 { 32 } else { 16 }) as f64)
        }
        #[cfg(target_arch = "x86_64")]
        Unit::Dpbf16 if fp_formats::cpu::has_avx512_bf16() => {
            // SAFETY: `has_avx512_bf16` checked AVX-512F and AVX512_BF16.
            unsafe { x86::dpbf16(iters.max(1)) };
            Some((iters * x86::ACC * 64) as f64)
        }
        #[cfg(target_arch = "x86_64")]
        Unit::ByteDot if fp_formats::cpu::has_avx2() => {
            // SAFETY: AVX2 checked just above.
            unsafe { x86::byte_dot(iters.max(1)) };
            Some((iters * x86::ACC * 64) as f64)
        }
        _ => None,
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The probe loops in inline assembly (the workspace's MSRV predates the AVX-512
    //! intrinsics): 14 independent accumulators, sources zeroed (no subnormal assists).

    use std::arch::asm;

    /// Independent accumulators (more than latency x throughput of either unit).
    pub const ACC: usize = 14;

    macro_rules! probe_loop {
        ($zero:literal, $op:literal, $r:literal, $iters:expr) => {
            asm!(
                $zero,
                "2:",
                concat!($op, " ", $r, "0, ", $r, "14, ", $r, "15"),
                concat!($op, " ", $r, "1, ", $r, "14, ", $r, "15"),
                concat!($op, " ", $r, "2, ", $r, "14, ", $r, "15"),
                concat!($op, " ", $r, "3, ", $r, "14, ", $r, "15"),
                concat!($op, " ", $r, "4, ", $r, "14, ", $r, "15"),
                concat!($op, " ", $r, "5, ", $r, "14, ", $r, "15"),
                concat!($op, " ", $r, "6, ", $r, "14, ", $r, "15"),
                concat!($op, " ", $r, "7, ", $r, "14, ", $r, "15"),
                concat!($op, " ", $r, "8, ", $r, "14, ", $r, "15"),
                concat!($op, " ", $r, "9, ", $r, "14, ", $r, "15"),
                concat!($op, " ", $r, "10, ", $r, "14, ", $r, "15"),
                concat!($op, " ", $r, "11, ", $r, "14, ", $r, "15"),
                concat!($op, " ", $r, "12, ", $r, "14, ", $r, "15"),
                concat!($op, " ", $r, "13, ", $r, "14, ", $r, "15"),
                "dec rcx",
                "jnz 2b",
                inout("rcx") $iters => _,
                clobber_abi("C"),
                options(nostack, nomem),
            )
        };
    }

    /// `iters` rounds of 14 512-bit FMAs.
    ///
    /// # Safety
    /// The CPU must have AVX-512F; `iters >= 1`.
    pub unsafe fn fma512(iters: usize) {
        probe_loop!(
            "vpxord zmm14, zmm14, zmm14\nvpxord zmm15, zmm15, zmm15",
            "vfmadd231ps",
            "zmm",
            iters
        );
    }

    /// `iters` rounds of 14 256-bit FMAs.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA; `iters >= 1`.
    pub unsafe fn fma256(iters: usize) {
        probe_loop!(
            "vxorps ymm14, ymm14, ymm14\nvxorps ymm15, ymm15, ymm15",
            "vfmadd231ps",
            "ymm",
            iters
        );
    }

    /// `iters` rounds of 14 256-bit byte dot products (`vpmaddubsw`).
    ///
    /// # Safety
    /// The CPU must have AVX2; `iters >= 1`.
    pub unsafe fn byte_dot(iters: usize) {
        probe_loop!(
            "vpxor ymm14, ymm14, ymm14\nvpxor ymm15, ymm15, ymm15",
            "vpmaddubsw",
            "ymm",
            iters
        );
    }

    /// `iters` rounds of 14 512-bit BF16 dot products.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and AVX512_BF16; `iters >= 1`.
    pub unsafe fn dpbf16(iters: usize) {
        probe_loop!(
            "vpxord zmm14, zmm14, zmm14\nvpxord zmm15, zmm15, zmm15",
            "vdpbf16ps",
            "zmm",
            iters
        );
    }
}

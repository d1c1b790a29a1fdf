//! Keeping a rayon pool's threads awake through a training step.
//!
//! A step runs hundreds of short parallel regions (three per GEMM: two packings and the
//! product; one per element-wise op) with serial work between them. Rayon parks a worker
//! that finds nothing to do after a few dozen polls, and the next region then waits for
//! the OS to wake it: tens of microseconds on bare metal, 65 us to 2 ms on a virtual
//! machine whose idle vCPU halts. [`with_polling_workers`] runs a closure while the pool's
//! other threads poll for work instead of parking: they take each region's tasks as soon
//! as they are queued. Only scheduling changes; every kernel's bits are independent of
//! which thread runs which task.

use std::sync::atomic::{AtomicBool, Ordering};

/// Runs `f` on the current thread while the other threads of the current rayon pool poll
/// for its parallel work (a busy wait: each burns its core until `f` returns), then lets
/// them park again. On a thread outside any pool, or a pool of one thread, it just runs
/// `f`.
///
/// Meant for the compute-bound stretch of a training step on a pool the caller owns
/// (the trainer's and the benchmarks' pools), with no other work in flight on it, and not
/// for long waits on I/O: a thread that takes its poller while it waits inside some other
/// job stays in the poller until `f` returns.
///
/// ```
/// use rayon::prelude::*;
/// let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
/// let total: u64 = pool.install(|| {
///     autograd::with_polling_workers(|| (0..1000u64).into_par_iter().sum())
/// });
/// assert_eq!(total, 499_500);
/// ```
pub fn with_polling_workers<R>(f: impl FnOnce() -> R) -> R {
    let Some(me) = rayon::current_thread_index() else {
        return f();
    };
    if rayon::current_num_threads() <= 1 {
        return f();
    }
    let stop = AtomicBool::new(false);
    /// Sets the flag when dropped, also when `f` unwinds (else the scope would wait on
    /// the pollers forever).
    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }
    rayon::in_place_scope(|s| {
        // one poller per thread (a broadcast: each thread gets its own, which no other
        // thread can take); the calling thread's returns at once
        s.spawn_broadcast(|_, ctx| {
            if ctx.index() != me {
                poll(&stop);
            }
        });
        let _stop = Stop(&stop);
        f()
    })
}

/// Runs the pool's queued jobs until `stop`.
fn poll(stop: &AtomicBool) {
    while !stop.load(Ordering::Acquire) {
        if rayon::yield_now() != Some(rayon::Yield::Executed) {
            std::thread::yield_now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    /// Nested parallel work, many regions, and a closure that panics: results are the
    /// serial ones, the panic reaches the caller and the pool stays usable.
    #[test]
    fn regions_run_to_the_end_and_a_panic_does_not_hang_the_pool() {
        for threads in [1, 2, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let sums = pool.install(|| {
                with_polling_workers(|| {
                    (0..200u64)
                        .map(|r| {
                            (0..1000u64)
                                .into_par_iter()
                                .map(|i| (0..10u64).into_par_iter().map(|j| i * j + r).sum::<u64>())
                                .sum::<u64>()
                        })
                        .collect::<Vec<_>>()
                })
            });
            let want: Vec<u64> = (0..200u64)
                .map(|r| (0..1000u64).map(|i| 45 * i + 10 * r).sum())
                .collect();
            assert_eq!(sums, want, "{threads} threads");
            let caught = pool.install(|| {
                std::panic::catch_unwind(|| {
                    with_polling_workers(|| {
                        let _: u64 = (0..100u64).into_par_iter().sum();
                        panic!("inside the step")
                    })
                })
            });
            assert!(caught.is_err(), "{threads} threads");
            assert_eq!(pool.install(|| (0..10u64).into_par_iter().sum::<u64>()), 45);
        }
        // outside a pool: runs the closure
        assert_eq!(with_polling_workers(|| 7), 7);
    }
}

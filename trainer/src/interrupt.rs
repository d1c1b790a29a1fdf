//! Graceful stops and the test hooks of the crash-safety tests.
//!
//! * [`install_handlers`] makes SIGINT (Ctrl-C) and SIGTERM request a stop
//!   ([`request_stop`]) instead of killing the process: [`crate::train::Trainer::run`] finishes
//!   the current step, writes a checkpoint and returns [`crate::train::TrainError::Stopped`].
//!   A second signal ends the process at once (exit status 130).
//! * [`hook`] marks a point of the checkpoint protocol. When the environment variable
//!   [`PAUSE_ENV`] is `POINT:N`, the `N`-th time `POINT` is reached the process writes the
//!   point's name into the file named by [`MARKER_ENV`] and waits there until it is killed or
//!   a stop is requested. Tests use it to SIGKILL a child training process at exact points of
//!   a checkpoint write. It is read from the environment only, never from a configuration,
//!   and does nothing when the variable is unset.
//! * [`NAN_ENV`] (`N`) makes step `N`'s loss and first gradient NaN, to exercise the
//!   divergence guard from the command line ([`nan_step_from_env`]); library tests call
//!   [`crate::train::Trainer::set_inject_nan_at_step`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// `POINT:N`: pause the `N`-th (1-based) time [`hook`]`(POINT)` runs.
pub const PAUSE_ENV: &str = "NIBBLE_TEST_PAUSE_AT";
/// The file [`hook`] writes the point's name into when it pauses.
pub const MARKER_ENV: &str = "NIBBLE_TEST_PAUSE_MARKER";
/// `N`: make the loss and one gradient of step `N` NaN (a test of the divergence guard).
pub const NAN_ENV: &str = "NIBBLE_TEST_NAN_AT_STEP";

/// The step [`NAN_ENV`] names, if it is set to a number.
pub fn nan_step_from_env() -> Option<u64> {
    std::env::var(NAN_ENV).ok()?.trim().parse().ok()
}

/// The hook points, in the order a checkpoint write reaches them (`step` runs after every
/// optimizer step, before its evaluation and checkpoint).
pub const HOOK_POINTS: &[&str] = &[
    "step",
    "checkpoint-tmp-dir",
    "checkpoint-tensors",
    "checkpoint-optimizer",
    "checkpoint-state",
    "checkpoint-renamed",
    "checkpoint-latest-tmp",
    "checkpoint-latest",
    "checkpoint-pruned",
];

static STOP: AtomicBool = AtomicBool::new(false);

/// Asks a running [`crate::train::Trainer::run`] to stop after the current step.
pub fn request_stop() {
    STOP.store(true, Ordering::SeqCst);
}

/// Whether a stop was requested.
pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// The signal that requested the stop (0 when none or not a signal).
pub fn stop_signal() -> i32 {
    SIGNAL.load(Ordering::SeqCst) as i32
}

static SIGNAL: AtomicU64 = AtomicU64::new(0);

#[cfg(unix)]
extern "C" fn on_signal(sig: libc::c_int) {
    if STOP.swap(true, Ordering::SeqCst) {
        // second signal: leave now (only async-signal-safe calls here)
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(130) };
    }
    SIGNAL.store(sig as u64, Ordering::SeqCst);
}

/// Passes a stop on to a child process: SIGTERM on Unix, which a `trainer` child with
/// [`install_handlers`] takes as a graceful stop (it saves a checkpoint and exits); a kill
/// elsewhere. A child that already exited is left alone.
pub fn forward_stop(child: &mut std::process::Child) {
    if matches!(child.try_wait(), Ok(Some(_))) {
        return;
    }
    #[cfg(unix)]
    // SAFETY: kill(2) with our child's pid (not yet reaped: `try_wait` saw it running)
    // reads and writes no memory of ours.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
    #[cfg(not(unix))]
    let _ = child.kill();
}

/// Installs the SIGINT and SIGTERM handlers (see the module docs). Does nothing on
/// platforms without POSIX signals.
pub fn install_handlers() -> std::io::Result<()> {
    #[cfg(unix)]
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction with a handler that only touches atomics and calls
        // _exit, both async-signal-safe.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

struct PauseAt {
    point: String,
    nth: u64,
    marker: Option<std::path::PathBuf>,
}

fn pause_at() -> Option<&'static PauseAt> {
    static CELL: OnceLock<Option<PauseAt>> = OnceLock::new();
    CELL.get_or_init(|| {
        let spec = std::env::var(PAUSE_ENV).ok()?;
        let (point, nth) = spec.rsplit_once(':')?;
        Some(PauseAt {
            point: point.to_string(),
            nth: nth.parse().ok()?,
            marker: std::env::var_os(MARKER_ENV).map(Into::into),
        })
    })
    .as_ref()
}

/// A point of the checkpoint protocol (see the module docs); a no-op unless [`PAUSE_ENV`]
/// names it.
pub fn hook(point: &str) {
    let Some(p) = pause_at() else {
        return;
    };
    if p.point != point {
        return;
    }
    static COUNTS: Mutex<Vec<(String, u64)>> = Mutex::new(Vec::new());
    let n = {
        let mut counts = COUNTS.lock().unwrap_or_else(|e| e.into_inner());
        match counts.iter_mut().find(|(name, _)| name == point) {
            Some((_, c)) => {
                *c += 1;
                *c
            }
            None => {
                counts.push((point.to_string(), 1));
                1
            }
        }
    };
    if n != p.nth {
        return;
    }
    if let Some(m) = &p.marker {
        let _ = std::fs::write(m, point);
    }
    while !stop_requested() {
        std::thread::sleep(Duration::from_millis(5));
    }
}

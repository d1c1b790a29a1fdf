//! Finding a usable GPU without ever panicking.
//!
//! cudarc with `dynamic-loading` resolves the driver lazily and **panics** when `libcuda`
//! cannot be loaded (docs/architecture.md#no-driver-no-panic). [`probe`] therefore asks
//! `cudarc::driver::sys::is_culib_present()` first (it only `dlopen`s candidate library names),
//! then `cuInit` + `cuDeviceGetCount`, and only then creates a context.

use std::sync::Arc;

use cudarc::driver::CudaContext;

/// The outcome of [`probe`].
#[derive(Debug)]
pub enum Gpu {
    /// No usable GPU; the reason is meant for a `SKIP` line.
    Unavailable(String),
    /// The primary context of device 0.
    Ready(Arc<CudaContext>),
}

/// Looks for a CUDA driver and a device; never panics.
///
/// ```
/// // On a machine without a driver (CI) this returns Unavailable.
/// match kernels_cuda::probe() {
///     kernels_cuda::Gpu::Unavailable(why) => println!("no GPU: {why}"),
///     kernels_cuda::Gpu::Ready(ctx) => println!("GPU: {:?}", ctx.name()),
/// }
/// ```
pub fn probe() -> Gpu {
    // SAFETY: only dlopen()s the candidate library names; no CUDA call is made.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Gpu::Unavailable("no CUDA driver (libcuda) found".into());
    }
    match CudaContext::device_count() {
        Ok(n) if n > 0 => match CudaContext::new(0) {
            Ok(ctx) => Gpu::Ready(ctx),
            Err(e) => Gpu::Unavailable(format!("creating a context on device 0 failed: {e}")),
        },
        Ok(_) => Gpu::Unavailable("CUDA driver present but no device".into()),
        Err(e) => Gpu::Unavailable(format!("CUDA driver present but cuInit failed: {e}")),
    }
}

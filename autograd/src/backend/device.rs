//! The device a `Storage::Cuda` buffer lives on: the GPU, or (feature `cuda-emu`, for tests)
//! `kernels-cuda`'s CPU emulator standing in for it. [`DeviceLauncher`] is one
//! `kernels_cuda::train::Launcher` over either, so [`DeviceBackend`] (the CUDA kernels behind
//! [`Backend`](super::Backend)) is one concrete type and `Graph` needs no type parameter.
//!
//! A process opens at most one kind of device (the first [`DeviceBackend::cuda`] or
//! `DeviceBackend::emulated` call decides), so a buffer can never reach a launcher of the
//! other kind.

use std::sync::{Arc, OnceLock};

use kernels_cuda::train::{Arg, Elem, Launcher};
use kernels_cuda::{probe, Gpu, GpuBuf, GpuContext, KernelError};

use super::{BackendError, KernelBackend, Result};

/// The CUDA kernels on the GPU or on the emulator: what a device `ParamStore` and `Graph` use.
pub type DeviceBackend = KernelBackend<DeviceLauncher>;

/// The launcher of [`DeviceBackend`].
#[derive(Clone, Debug)]
pub struct DeviceLauncher(Kind);

#[derive(Clone, Debug)]
enum Kind {
    Gpu(Arc<GpuContext>),
    #[cfg(feature = "cuda-emu")]
    Emu(&'static kernels_cuda::emu::Emu),
}

/// A buffer of `T` on the device (opaque: only a [`DeviceLauncher`] makes one).
#[derive(Debug)]
pub struct DeviceBuf<T>(BufKind<T>);

#[derive(Debug)]
enum BufKind<T> {
    Gpu(GpuBuf<T>),
    #[cfg(feature = "cuda-emu")]
    Emu(kernels_cuda::emu::HostBuf<T>),
}

/// Which kind of device this process opened first ("cuda" or "cuda-emulated").
static OPENED: OnceLock<&'static str> = OnceLock::new();

fn claim(kind: &'static str) -> Result<()> {
    let first = *OPENED.get_or_init(|| kind);
    if first != kind {
        return Err(BackendError::InvalidArgument(format!(
            "this process already uses the {first} device; one process runs one kind of device"
        )));
    }
    Ok(())
}

impl DeviceBackend {
    /// Opens the first CUDA device and loads the kernels.
    ///
    /// # Errors
    /// [`BackendError::NoDevice`] without a driver or a compute capability 9.0+ GPU (the
    /// message says what to do); [`BackendError::PtxLoad`] if the driver cannot JIT the PTX.
    pub fn cuda() -> Result<Arc<DeviceBackend>> {
        let gpu = match probe() {
            Gpu::Unavailable(reason) => return Err(BackendError::NoDevice { reason }),
            Gpu::Ready(ctx) => GpuContext::new(ctx).map_err(|e| match e {
                KernelError::Unsupported(reason) => BackendError::NoDevice { reason },
                e => e.into(),
            })?,
        };
        claim("cuda")?;
        Ok(Arc::new(KernelBackend::with_launcher(
            DeviceLauncher(Kind::Gpu(Arc::new(gpu))),
            "cuda",
        )))
    }

    /// The CUDA kernels on `kernels-cuda`'s CPU emulator, standing in for a GPU in tests.
    #[cfg(feature = "cuda-emu")]
    pub fn emulated(emu: &'static kernels_cuda::emu::Emu) -> Result<Arc<DeviceBackend>> {
        claim("cuda-emulated")?;
        Ok(Arc::new(KernelBackend::with_launcher(
            DeviceLauncher(Kind::Emu(emu)),
            "cuda-emulated",
        )))
    }
}

impl Launcher for DeviceLauncher {
    type Buf<T: Elem> = DeviceBuf<T>;

    fn zeros<T: Elem>(&self, n: usize) -> kernels_cuda::Result<DeviceBuf<T>> {
        Ok(DeviceBuf(match &self.0 {
            Kind::Gpu(g) => BufKind::Gpu(<GpuContext as Launcher>::zeros(g, n)?),
            #[cfg(feature = "cuda-emu")]
            Kind::Emu(e) => BufKind::Emu(e.zeros(n)?),
        }))
    }

    fn upload<T: Elem>(&self, data: &[T]) -> kernels_cuda::Result<DeviceBuf<T>> {
        Ok(DeviceBuf(match &self.0 {
            Kind::Gpu(g) => BufKind::Gpu(<GpuContext as Launcher>::upload(g, data)?),
            #[cfg(feature = "cuda-emu")]
            Kind::Emu(e) => BufKind::Emu(e.upload(data)?),
        }))
    }

    fn download<T: Elem>(&self, b: &DeviceBuf<T>) -> kernels_cuda::Result<Vec<T>> {
        match (&self.0, &b.0) {
            (Kind::Gpu(g), BufKind::Gpu(b)) => <GpuContext as Launcher>::download(g, b),
            #[cfg(feature = "cuda-emu")]
            (Kind::Emu(e), BufKind::Emu(b)) => e.download(b),
            #[cfg(feature = "cuda-emu")]
            _ => Err(mismatch()),
        }
    }

    fn len<T: Elem>(&self, b: &DeviceBuf<T>) -> usize {
        match (&self.0, &b.0) {
            (Kind::Gpu(g), BufKind::Gpu(b)) => <GpuContext as Launcher>::len(g, b),
            #[cfg(feature = "cuda-emu")]
            (Kind::Emu(e), BufKind::Emu(b)) => e.len(b),
            #[cfg(feature = "cuda-emu")]
            _ => 0,
        }
    }

    fn ptr<T: Elem>(&self, b: &DeviceBuf<T>) -> u64 {
        // One kind of device per process (`claim`), so the kinds always agree; a null pointer
        // would be the answer otherwise.
        match (&self.0, &b.0) {
            (Kind::Gpu(g), BufKind::Gpu(b)) => <GpuContext as Launcher>::ptr(g, b),
            #[cfg(feature = "cuda-emu")]
            (Kind::Emu(e), BufKind::Emu(b)) => e.ptr(b),
            #[cfg(feature = "cuda-emu")]
            _ => 0,
        }
    }

    fn grid_stride_blocks(&self, n: usize) -> u32 {
        match &self.0 {
            Kind::Gpu(g) => <GpuContext as Launcher>::grid_stride_blocks(g, n),
            #[cfg(feature = "cuda-emu")]
            Kind::Emu(e) => e.grid_stride_blocks(n),
        }
    }

    unsafe fn launch(
        &self,
        kernel: &'static str,
        grid: (u32, u32),
        args: &[Arg],
    ) -> kernels_cuda::Result<()> {
        // SAFETY: forwarded with the caller's guarantees; the buffers' pointers came from this
        // launcher's kind (`ptr`).
        unsafe {
            match &self.0 {
                Kind::Gpu(g) => <GpuContext as Launcher>::launch(g, kernel, grid, args),
                #[cfg(feature = "cuda-emu")]
                Kind::Emu(e) => e.launch(kernel, grid, args),
            }
        }
    }
}

#[cfg(feature = "cuda-emu")]
fn mismatch() -> KernelError {
    KernelError::InvalidArgument("a buffer of another kind of device".into())
}

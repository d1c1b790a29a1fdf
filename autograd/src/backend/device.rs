//! The device a `Storage::Cuda` buffer lives on: the GPU, or (feature `cuda-emu`, for tests)
//! `kernels-cuda`'s CPU emulator standing in for it. [`DeviceLauncher`] is one
//! `kernels_cuda::train::Launcher` over either, so [`DeviceBackend`] (the CUDA kernels behind
//! [`Backend`](super::Backend)) is one concrete type and `Graph` needs no type parameter.
//!
//! A process opens at most one kind of device (the first [`DeviceBackend::cuda`] or
//! `DeviceBackend::emulated` call decides), so a buffer can never reach a launcher of the
//! other kind.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use kernels_cuda::train::{Arg, Elem, Launcher, TrainOps};
use kernels_cuda::{probe, Gpu, GpuBuf, GpuContext, KernelError};

use super::{BackendError, KernelBackend, Result};

/// The CUDA kernels on the GPU or on the emulator: what a device `ParamStore` and `Graph` use.
pub type DeviceBackend = KernelBackend<DeviceLauncher>;

/// The launcher of [`DeviceBackend`], with its buffer pool.
#[derive(Clone, Debug)]
pub struct DeviceLauncher {
    kind: Kind,
    pool: Arc<Pool>,
}

/// Freed f32 device buffers by exact length, reused by the next `zeros` of that length (a
/// training step asks for the same sizes every step), zero-filled by a kernel on reuse.
#[derive(Default)]
struct Pool {
    free: Mutex<HashMap<usize, Vec<Box<dyn Any + Send>>>>,
    /// One zero, the source of the fill that clears a reused buffer.
    zero: Mutex<Option<BufKind<f32>>>,
    allocated: AtomicU64,
    reused: AtomicU64,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (a, r) = (
            self.allocated.load(Ordering::Relaxed),
            self.reused.load(Ordering::Relaxed),
        );
        write!(f, "Pool {{ allocated: {a}, reused: {r} }}")
    }
}

impl Pool {
    fn free(&self) -> std::sync::MutexGuard<'_, HashMap<usize, Vec<Box<dyn Any + Send>>>> {
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// How many f32 buffers a [`DeviceLauncher`] has allocated from the device and how many it
/// served from its pool (`zeros` calls = the sum).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolStats {
    /// New device allocations.
    pub allocated: u64,
    /// Requests served by a freed buffer of the same length.
    pub reused: u64,
}

#[derive(Clone, Debug)]
enum Kind {
    Gpu(Arc<GpuContext>),
    #[cfg(feature = "cuda-emu")]
    Emu(&'static kernels_cuda::emu::Emu),
}

/// A buffer of `T` on the device (opaque: only a [`DeviceLauncher`] makes one). An f32 buffer
/// goes back to its launcher's pool when dropped.
pub struct DeviceBuf<T> {
    inner: Option<BufKind<T>>,
    /// Puts the buffer back into the pool (f32 buffers from `zeros`).
    ret: Option<Box<dyn FnOnce(BufKind<T>) + Send + Sync>>,
}

impl<T: std::fmt::Debug> std::fmt::Debug for DeviceBuf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceBuf({:?}, pooled: {})",
            self.inner,
            self.ret.is_some()
        )
    }
}

impl<T> Drop for DeviceBuf<T> {
    fn drop(&mut self) {
        if let (Some(ret), Some(b)) = (self.ret.take(), self.inner.take()) {
            ret(b);
        }
    }
}

impl<T> DeviceBuf<T> {
    fn kind(&self) -> &BufKind<T> {
        self.inner.as_ref().expect("a live buffer holds its memory")
    }

    /// The memory, out of the pool's reach.
    fn into_kind(mut self) -> Option<BufKind<T>> {
        self.ret = None;
        self.inner.take()
    }

    fn plain(b: BufKind<T>) -> Self {
        DeviceBuf {
            inner: Some(b),
            ret: None,
        }
    }
}

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
            DeviceLauncher::new(Kind::Gpu(Arc::new(gpu))),
            "cuda",
        )))
    }

    /// The CUDA kernels on `kernels-cuda`'s CPU emulator, standing in for a GPU in tests.
    #[cfg(feature = "cuda-emu")]
    pub fn emulated(emu: &'static kernels_cuda::emu::Emu) -> Result<Arc<DeviceBackend>> {
        claim("cuda-emulated")?;
        Ok(Arc::new(KernelBackend::with_launcher(
            DeviceLauncher::new(Kind::Emu(emu)),
            "cuda-emulated",
        )))
    }
}

impl DeviceLauncher {
    fn new(kind: Kind) -> Self {
        DeviceLauncher {
            kind,
            pool: Arc::default(),
        }
    }

    /// The buffer pool's counters so far.
    pub fn pool_stats(&self) -> PoolStats {
        PoolStats {
            allocated: self.pool.allocated.load(Ordering::Relaxed),
            reused: self.pool.reused.load(Ordering::Relaxed),
        }
    }

    /// Waits until every kernel launched so far has finished (a no-op under the emulator,
    /// whose launches finish before they return): op profiles time device work with it.
    ///
    /// # Errors
    /// The driver's, including a failure of earlier asynchronous work.
    pub fn synchronize(&self) -> kernels_cuda::Result<()> {
        match &self.kind {
            Kind::Gpu(g) => g.synchronize(),
            #[cfg(feature = "cuda-emu")]
            Kind::Emu(_) => Ok(()),
        }
    }

    /// Frees every pooled buffer (the device memory goes back to the driver).
    pub fn release_pool(&self) {
        self.pool.free().clear();
    }

    /// A new buffer of `n` elements: zeros, or (`zeroed == false`) unspecified contents
    /// ([`Launcher::scratch`]).
    fn alloc<T: Elem>(&self, n: usize, zeroed: bool) -> kernels_cuda::Result<BufKind<T>> {
        let fresh = || -> kernels_cuda::Result<BufKind<T>> {
            Ok(match (&self.kind, zeroed) {
                (Kind::Gpu(g), true) => BufKind::Gpu(<GpuContext as Launcher>::zeros(g, n)?),
                (Kind::Gpu(g), false) => BufKind::Gpu(<GpuContext as Launcher>::scratch(g, n)?),
                #[cfg(feature = "cuda-emu")]
                (Kind::Emu(e), true) => BufKind::Emu(e.zeros(n)?),
                #[cfg(feature = "cuda-emu")]
                (Kind::Emu(e), false) => BufKind::Emu(e.scratch(n)?),
            })
        };
        match fresh() {
            // pooled buffers hold memory a new allocation may need: free them, try again
            Err(KernelError::OutOfMemory { .. }) => {
                self.release_pool();
                fresh()
            }
            r => r,
        }
    }

    /// f32 buffers from the pool, others new: zeros or (`zeroed == false`) scratch.
    fn pooled_or_new<T: Elem>(&self, n: usize, zeroed: bool) -> kernels_cuda::Result<DeviceBuf<T>> {
        if TypeId::of::<T>() == TypeId::of::<f32>() {
            let b: Box<dyn Any> = Box::new(self.pooled_f32(n, zeroed)?);
            return Ok(*b.downcast::<DeviceBuf<T>>().expect("T is f32"));
        }
        Ok(DeviceBuf::plain(self.alloc(n, zeroed)?))
    }

    /// A pooled f32 buffer of `n` zeros (`zeroed`) or of unspecified contents: a freed one of
    /// that length (zero-filled by `nb_fill_scaled` from a zero scalar, or left as it is; under
    /// the emulator scratch is poisoned again) or a new one.
    fn pooled_f32(&self, n: usize, zeroed: bool) -> kernels_cuda::Result<DeviceBuf<f32>> {
        let reuse = self.pool.free().get_mut(&n).and_then(Vec::pop);
        let b = match reuse.map(|b| b.downcast::<BufKind<f32>>()) {
            Some(Ok(b)) if !zeroed => {
                self.pool.reused.fetch_add(1, Ordering::Relaxed);
                match (*b, &self.kind) {
                    #[cfg(feature = "cuda-emu")]
                    (BufKind::Emu(_), Kind::Emu(e)) => {
                        DeviceBuf::plain(BufKind::Emu(e.scratch(n)?))
                    }
                    (b, _) => DeviceBuf::plain(b),
                }
            }
            Some(Ok(b)) => {
                self.pool.reused.fetch_add(1, Ordering::Relaxed);
                let mut b = DeviceBuf::plain(*b);
                let mut slot = self.pool.zero.lock().unwrap_or_else(|p| p.into_inner());
                let zero = DeviceBuf::plain(match slot.take() {
                    Some(z) => z,
                    None => self.alloc::<f32>(1, true)?,
                });
                let r = self.fill_scaled(&zero, 0.0, (false, &mut b));
                *slot = zero.into_kind();
                r?;
                b
            }
            _ => {
                self.pool.allocated.fetch_add(1, Ordering::Relaxed);
                DeviceBuf::plain(self.alloc::<f32>(n, zeroed)?)
            }
        };
        let pool = Arc::clone(&self.pool);
        let mut b = b;
        b.ret = Some(Box::new(move |k: BufKind<f32>| {
            pool.free().entry(n).or_default().push(Box::new(k));
        }));
        Ok(b)
    }
}

impl Launcher for DeviceLauncher {
    type Buf<T: Elem> = DeviceBuf<T>;

    fn zeros<T: Elem>(&self, n: usize) -> kernels_cuda::Result<DeviceBuf<T>> {
        self.pooled_or_new(n, true)
    }

    fn scratch<T: Elem>(&self, n: usize) -> kernels_cuda::Result<DeviceBuf<T>> {
        self.pooled_or_new(n, false)
    }

    fn upload<T: Elem>(&self, data: &[T]) -> kernels_cuda::Result<DeviceBuf<T>> {
        Ok(DeviceBuf::plain(match &self.kind {
            Kind::Gpu(g) => BufKind::Gpu(<GpuContext as Launcher>::upload(g, data)?),
            #[cfg(feature = "cuda-emu")]
            Kind::Emu(e) => BufKind::Emu(e.upload(data)?),
        }))
    }

    fn download<T: Elem>(&self, b: &DeviceBuf<T>) -> kernels_cuda::Result<Vec<T>> {
        match (&self.kind, b.kind()) {
            (Kind::Gpu(g), BufKind::Gpu(b)) => <GpuContext as Launcher>::download(g, b),
            #[cfg(feature = "cuda-emu")]
            (Kind::Emu(e), BufKind::Emu(b)) => e.download(b),
            #[cfg(feature = "cuda-emu")]
            _ => Err(mismatch()),
        }
    }

    fn len<T: Elem>(&self, b: &DeviceBuf<T>) -> usize {
        match (&self.kind, b.kind()) {
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
        match (&self.kind, b.kind()) {
            (Kind::Gpu(g), BufKind::Gpu(b)) => <GpuContext as Launcher>::ptr(g, b),
            #[cfg(feature = "cuda-emu")]
            (Kind::Emu(e), BufKind::Emu(b)) => e.ptr(b),
            #[cfg(feature = "cuda-emu")]
            _ => 0,
        }
    }

    fn grid_stride_blocks(&self, n: usize) -> u32 {
        match &self.kind {
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
            match &self.kind {
                Kind::Gpu(g) => <GpuContext as Launcher>::launch(g, kernel, grid, args),
                #[cfg(feature = "cuda-emu")]
                Kind::Emu(e) => e.launch(kernel, grid, args),
            }
        }
    }

    unsafe fn launch_gemm_bf16(
        &self,
        g: &kernels_cuda::train_tc::Bf16Gemm,
        p: kernels_cuda::train_tc::Bf16GemmPtrs,
    ) -> kernels_cuda::Result<()> {
        // SAFETY: forwarded with the caller's guarantees (pointers of this launcher's kind).
        unsafe {
            match &self.kind {
                Kind::Gpu(g2) => <GpuContext as Launcher>::launch_gemm_bf16(g2, g, p),
                #[cfg(feature = "cuda-emu")]
                Kind::Emu(e) => e.launch_gemm_bf16(g, p),
            }
        }
    }
}

#[cfg(feature = "cuda-emu")]
fn mismatch() -> KernelError {
    KernelError::InvalidArgument("a buffer of another kind of device".into())
}

//! Where tensor data lives, and the buffer pool that recycles it between steps.
//!
//! The device boundary is an enum, as in candle: [`Storage`] has one variant per device. Every
//! op front-end in `ops/` matches on the graph's [`Device`]: the `Cpu` arm runs the op's CPU
//! kernel on host slices, the `Cuda` arm the CUDA kernel through
//! [`DeviceBackend`](crate::backend::DeviceBackend) on [`DeviceBuf`]s (a GPU's memory, or the
//! emulator's host memory standing in for it in tests).

use std::collections::BTreeMap;

use crate::backend::DeviceBuf;

/// The device a graph computes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// Host memory, f32, row-major; kernels in the `cpu` module of each op.
    #[default]
    Cpu,
    /// A CUDA device (or `kernels-cuda`'s emulator standing in for one): f32 device buffers,
    /// the kernels of `kernels-cuda` through [`DeviceBackend`](crate::backend::DeviceBackend).
    Cuda,
}

/// The data of one tensor on its device.
#[derive(Debug)]
pub enum Storage {
    /// A host buffer.
    Cpu(CpuBuf),
    /// A device buffer.
    Cuda(DeviceBuf<f32>),
}

impl Storage {
    /// The device the data lives on.
    pub fn device(&self) -> Device {
        match self {
            Storage::Cpu(_) => Device::Cpu,
            Storage::Cuda(_) => Device::Cuda,
        }
    }

    /// The host data. A graph's nodes all live on its device and the CPU kernels run only on
    /// a CPU graph, so a device buffer never reaches here; it would read as empty.
    pub(crate) fn cpu(&self) -> &[f32] {
        match self {
            Storage::Cpu(b) => b.as_slice(),
            Storage::Cuda(_) => &[],
        }
    }

    /// The device data (`None` for host data).
    pub(crate) fn cuda(&self) -> Option<&DeviceBuf<f32>> {
        match self {
            Storage::Cpu(_) => None,
            Storage::Cuda(b) => Some(b),
        }
    }
}

/// A host buffer of `len` f32 values carved from a (possibly larger) pooled allocation.
///
/// The backing `Vec` is always fully initialised (`data.len() == capacity used`), so handing
/// out a recycled buffer needs no `unsafe`; its stale contents are overwritten by the op.
#[derive(Debug, Default)]
pub struct CpuBuf {
    data: Vec<f32>,
    len: usize,
}

impl CpuBuf {
    /// Wraps a vector (no copy).
    pub fn from_vec(data: Vec<f32>) -> CpuBuf {
        let len = data.len();
        CpuBuf { data, len }
    }

    /// The values.
    #[inline]
    pub fn as_slice(&self) -> &[f32] {
        &self.data[..self.len]
    }

    /// The values, mutably.
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        &mut self.data[..self.len]
    }

    /// Number of values.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The values as a vector of exactly `len` elements.
    pub fn into_vec(mut self) -> Vec<f32> {
        self.data.truncate(self.len);
        self.data
    }
}

/// Recycles host buffers between graphs so a training loop does not allocate (and page-fault)
/// its activations afresh every step. Buffers are matched best-fit by capacity and never
/// handed out for a request less than half their size.
#[derive(Debug, Default)]
pub(crate) struct BufferPool {
    free: BTreeMap<usize, Vec<Vec<f32>>>,
}

impl BufferPool {
    /// A buffer of `n` values with unspecified (stale but initialised) contents.
    pub(crate) fn take(&mut self, n: usize) -> CpuBuf {
        if n == 0 {
            return CpuBuf::default();
        }
        let hit = self
            .free
            .range_mut(n..=n.saturating_mul(2))
            .find(|(_, v)| !v.is_empty());
        if let Some((&cap, list)) = hit {
            let data = list.pop().expect("non-empty list");
            if list.is_empty() {
                self.free.remove(&cap);
            }
            return CpuBuf { data, len: n };
        }
        CpuBuf {
            data: vec![0.0; n],
            len: n,
        }
    }

    /// A buffer of `n` zeros.
    pub(crate) fn take_zeroed(&mut self, n: usize) -> CpuBuf {
        let mut b = self.take(n);
        b.as_mut_slice().fill(0.0);
        b
    }

    /// A buffer holding a copy of `src`.
    pub(crate) fn take_copy(&mut self, src: &[f32]) -> CpuBuf {
        let mut b = self.take(src.len());
        b.as_mut_slice().copy_from_slice(src);
        b
    }

    /// Returns a buffer for reuse.
    pub(crate) fn give(&mut self, buf: CpuBuf) {
        let data = buf.data;
        if data.len() >= 1024 {
            self.free.entry(data.len()).or_default().push(data);
        }
    }

    /// Returns a storage's buffer for reuse.
    pub(crate) fn give_storage(&mut self, s: Storage) {
        match s {
            Storage::Cpu(b) => self.give(b),
            // device memory is freed (no device pool yet)
            Storage::Cuda(_) => {}
        }
    }

    /// Bytes held for reuse.
    pub(crate) fn bytes(&self) -> usize {
        self.free.iter().map(|(cap, v)| cap * v.len() * 4).sum()
    }

    /// Drops every pooled buffer.
    pub(crate) fn clear(&mut self) {
        self.free.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_reuses_best_fit() {
        let mut p = BufferPool::default();
        let a = p.take(4096);
        let ptr = a.as_slice().as_ptr();
        p.give(a);
        let b = p.take(3000);
        assert_eq!(b.as_slice().as_ptr(), ptr);
        assert_eq!(b.len(), 3000);
        p.give(b);
        // too small a request for a big buffer: fresh allocation
        let c = p.take(100);
        assert_ne!(c.as_slice().as_ptr(), ptr);
        assert!(p.bytes() >= 4096 * 4);
        p.clear();
        assert_eq!(p.bytes(), 0);
        assert_eq!(p.take_zeroed(5).as_slice(), &[0.0; 5]);
    }
}

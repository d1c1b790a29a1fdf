//! The CUDA emulator as a library (feature `emu`): compiles the training kernels of `cuda/`
//! as host C++20 through `emu/cuda_emu.h` (a block's 256 threads as fibers, barriers for
//! `__syncthreads` and warp shuffles), loads the result, and implements
//! [`Launcher`](crate::train::Launcher) on host buffers, so that every
//! [`TrainOps`](crate::train::TrainOps) op runs the real kernel code on the CPU. Other crates'
//! tests use it to compare the kernels with their CPU ops where no GPU exists (CI).
//!
//! Needs a C++20 compiler (`$CXX`, else `g++`) at run time; without one [`Emu::shared`] returns
//! [`EmuError::NoCompiler`] (tests print `SKIP` and return). It cannot see real-GPU block
//! concurrency or nvcc's code generation, and launches are serialized.
//!
//! ```no_run
//! use kernels_cuda::emu::Emu;
//! use kernels_cuda::train::{Launcher, TrainOps};
//! let emu = Emu::shared().expect("a C++20 compiler");
//! let x = emu.upload(&[1.0f32, 2.0, 3.0]).unwrap();
//! let mut y = emu.zeros::<f32>(3).unwrap();
//! emu.scale(&x, 2.0, (false, &mut y)).unwrap();
//! assert_eq!(y.to_vec(), [2.0, 4.0, 6.0]);
//! ```

use std::cell::UnsafeCell;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use crate::abi::Args;
use crate::train::{Arg, Elem, Launcher, THREADS};
use crate::{KernelError, Result};

/// Why the emulator is not available.
#[derive(Clone, Debug, thiserror::Error)]
pub enum EmuError {
    /// No C++ compiler could be started (set `CXX` to a C++20 compiler).
    #[error("no C++ compiler (`{0}`) to build the CUDA emulator; set CXX to a C++20 compiler")]
    NoCompiler(String),
    /// The compiler lacks C++20 `<barrier>` (GCC 11+ or Clang 14+ with libstdc++ 11+ have it).
    #[error("`{0}` lacks C++20 <barrier>: {1}")]
    NoCxx20(String, String),
    /// Compiling the kernels failed (a bug in `cuda/*.cu` or `emu/`).
    #[error("building the CUDA emulator failed:\n{0}")]
    Build(String),
    /// Loading the built library failed.
    #[error("loading the CUDA emulator: {0}")]
    Load(String),
}

/// A host buffer the emulated kernels read and write through raw pointers.
#[derive(Debug)]
pub struct HostBuf<T>(UnsafeCell<Vec<T>>);

impl<T: Clone> HostBuf<T> {
    /// A copy of the contents.
    pub fn to_vec(&self) -> Vec<T> {
        // SAFETY: no launch is running (launches are synchronous and take `&self` of the
        // emulator, which is not re-entered while this shared borrow lives).
        unsafe { (*self.0.get()).clone() }
    }

    /// Wraps a vector.
    pub fn from_vec(v: Vec<T>) -> Self {
        HostBuf(UnsafeCell::new(v))
    }
}

/// The loaded emulator.
#[derive(Debug)]
pub struct Emu {
    lib: libloading::Library,
}

type LaunchFn = unsafe extern "C" fn(u32, u32, *const u64);

impl Emu {
    /// The process-wide emulator, built on first use (a few seconds).
    pub fn shared() -> std::result::Result<&'static Emu, EmuError> {
        static EMU: OnceLock<std::result::Result<Emu, EmuError>> = OnceLock::new();
        EMU.get_or_init(Emu::build).as_ref().map_err(Clone::clone)
    }

    fn build() -> std::result::Result<Emu, EmuError> {
        Ok(Emu {
            lib: build_library("train.cpp")?,
        })
    }
}

/// Compiles one entry file of `emu/` (`train.cpp`: the training kernels [`Emu`] launches;
/// `emu.cpp`: the quantizer kernels `tests/emulated.rs` drives through their C ABI) with all
/// of `cuda/` as host C++20 through `emu/cuda_emu.h`, and loads it. The compiler is `$CXX`,
/// else `g++`; the flags keep IEEE arithmetic (`-ffp-contract=off -fno-fast-math`) so the
/// emulated kernels round as the CPU references do.
///
/// Errors: [`EmuError::NoCompiler`] and [`EmuError::NoCxx20`] (callers skip),
/// [`EmuError::Build`] and [`EmuError::Load`] (a bug).
pub fn build_library(entry: &str) -> std::result::Result<libloading::Library, EmuError> {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    if Command::new(&cxx).arg("--version").output().is_err() {
        return Err(EmuError::NoCompiler(cxx));
    }
    let stem = entry.trim_end_matches(".cpp");
    let dir = std::env::temp_dir().join(format!("nibble-emu-{stem}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| EmuError::Build(e.to_string()))?;
    let lib = dir.join(format!("libnbemu_{stem}.so"));
    let emu = crate_dir.join("emu");
    let out = Command::new(&cxx)
        .args([
            "-std=c++20",
            "-O2",
            "-ffp-contract=off",
            "-fno-fast-math",
            "-fPIC",
            "-shared",
            "-pthread",
        ])
        .arg(format!("-I{}", crate_dir.join("cuda").display()))
        .arg("-include")
        .arg(emu.join("cuda_emu.h"))
        .arg(emu.join(entry))
        .arg("-o")
        .arg(&lib)
        .output()
        .map_err(|e| EmuError::Build(e.to_string()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        if err.contains("c++20") || err.contains("barrier") && err.contains("No such file") {
            return Err(EmuError::NoCxx20(cxx, err));
        }
        return Err(EmuError::Build(err));
    }
    // SAFETY: loading our own freshly built library (no initialisers with side effects).
    let l = unsafe { libloading::Library::new(&lib) }.map_err(|e| EmuError::Load(e.to_string()))?;
    // The mapping stays valid after the file is gone.
    std::fs::remove_dir_all(&dir).ok();
    Ok(l)
}

impl Launcher for Emu {
    type Buf<T: Elem> = HostBuf<T>;

    fn zeros<T: Elem>(&self, n: usize) -> Result<HostBuf<T>> {
        Ok(HostBuf::from_vec(vec![T::default(); n]))
    }

    fn scratch<T: Elem>(&self, n: usize) -> Result<HostBuf<T>> {
        Ok(HostBuf::from_vec(vec![T::POISON; n]))
    }

    fn upload<T: Elem>(&self, data: &[T]) -> Result<HostBuf<T>> {
        Ok(HostBuf::from_vec(data.to_vec()))
    }

    fn download<T: Elem>(&self, b: &HostBuf<T>) -> Result<Vec<T>> {
        Ok(b.to_vec())
    }

    fn len<T: Elem>(&self, b: &HostBuf<T>) -> usize {
        // SAFETY: reading the length only; no launch is running.
        unsafe { (*b.0.get()).len() }
    }

    fn ptr<T: Elem>(&self, b: &HostBuf<T>) -> u64 {
        // SAFETY: the pointer is derived through the UnsafeCell, so kernels may write through it.
        unsafe { (*b.0.get()).as_mut_ptr() as u64 }
    }

    fn grid_stride_blocks(&self, n: usize) -> u32 {
        // a few blocks keep the emulation fast; grid-stride kernels give the same result
        n.div_ceil(THREADS as usize).clamp(1, 4) as u32
    }

    unsafe fn launch(&self, kernel: &'static str, grid: (u32, u32), args: &[Arg]) -> Result<()> {
        let mut adamw = Vec::new();
        for a in args {
            if let Arg::AdamW(c) = a {
                adamw.push(*c);
            }
        }
        let mut k = 0;
        let slots: Vec<u64> = args
            .iter()
            .map(|a| match a {
                Arg::Ptr(p) | Arg::U64(p) => *p,
                Arg::I32(v) => *v as i64 as u64,
                Arg::I64(v) => *v as u64,
                Arg::F32(v) => v.to_bits() as u64,
                Arg::F64(v) => v.to_bits(),
                Arg::AdamW(_) => {
                    k += 1;
                    &adamw[k - 1] as *const _ as u64
                }
                // by pointer into `args`, which outlives the call (emu/train.cpp copies it)
                Arg::Quant(Args::Nvfp4(s)) => s as *const _ as u64,
                Arg::Quant(Args::Mx(s)) => s as *const _ as u64,
                Arg::Quant(Args::Fp8(s)) => s as *const _ as u64,
            })
            .collect();
        let name = format!("emu_{kernel}\0");
        // SAFETY: every `emu_*` symbol of train.cpp has this signature.
        let f: libloading::Symbol<LaunchFn> = unsafe { self.lib.get(name.as_bytes()) }
            .map_err(|e| KernelError::Unsupported(format!("emulated kernel {kernel}: {e}")))?;
        if grid.0 == 0 || grid.1 == 0 {
            return Ok(());
        }
        // SAFETY: the caller guarantees the argument list and pointer validity.
        unsafe { f(grid.0, grid.1, slots.as_ptr()) };
        Ok(())
    }

    unsafe fn launch_gemm_bf16(
        &self,
        g: &crate::train_tc::Bf16Gemm,
        p: crate::train_tc::Bf16GemmPtrs,
    ) -> Result<()> {
        let (la, lb) = g.extents().ok_or_else(|| {
            KernelError::InvalidArgument(format!("gemm_tc: {g:?} overflows the address space"))
        })?;
        let lc = g.batch * g.m * g.n;
        // SAFETY: the caller guarantees that the pointers cover what `g` reads and writes
        // (exactly these extents); A and B are BF16 buffers, C an f32 buffer of its own.
        let (a, b, c) = unsafe {
            (
                std::slice::from_raw_parts(p.a as *const u16, la),
                std::slice::from_raw_parts(p.b as *const u16, lb),
                std::slice::from_raw_parts_mut(p.c as *mut f32, lc),
            )
        };
        crate::train_tc::reference(g, a, b, c)
    }
}

/// The emulated GPU quantizer behind `quant`'s one interface, for NVFP4 (the format whose
/// whole training step the emulator checks; MX and FP8 are [`KernelError::Unsupported`]
/// here): the emulated CUDA kernels (`nb_amax` or `nb_amax_rht_col`, then
/// `nb_nvfp4_quantize`; `nb_nvfp4_dequantize`), planned by
/// [`abi::plan`](crate::abi::plan) as on a GPU, on host buffers: the same codes, scales,
/// amax and factor as [`quant::Quantizer::quantize`] with the same quantizer.
///
/// Errors: the view's and the plan's errors (shape, GPU limits), [`KernelError::NonFinite`]
/// for NaN or ±Inf input, [`KernelError::Unsupported`] for a non-NVFP4 quantizer or tensor.
///
/// ```no_run
/// use kernels_cuda::emu::Emu;
/// use quant::{MatRef, OperandQuant, QuantState, Quantizer, QuantizerBackend, RngKey, Usage};
/// let emu = Emu::shared().expect("a C++20 compiler");
/// let x: Vec<f32> = (0..64).map(|i| i as f32 / 7.0).collect();
/// let q = Quantizer::new(OperandQuant::nvfp4(), Usage::Rowwise)?.with_key(RngKey { seed: 1, stream: 2 });
/// let t = emu.quantize(&q, MatRef::new(&x, 4, 16)?, &mut QuantState::new())?;
/// assert_eq!(emu.dequantize(&t)?, t.dequantize());
/// # Ok::<(), kernels_cuda::KernelError>(())
/// ```
impl quant::QuantizerBackend for Emu {
    type Source<'a> = quant::MatRef<'a>;
    type Quantized = quant::QuantizedTensor;
    type Values = Vec<f32>;
    type Error = KernelError;

    fn quantize(
        &self,
        q: &quant::Quantizer,
        x: quant::MatRef<'_>,
        state: &mut quant::QuantState,
    ) -> Result<quant::QuantizedTensor> {
        use crate::train_quant::{QuantBufs, QuantOps};
        if !matches!(q.spec().format, quant::QuantFormat::Nvfp4 { .. }) {
            return Err(KernelError::Unsupported(format!(
                "the emulated quantizer runs NVFP4 only, not {:?}",
                q.spec().format
            )));
        }
        let (rows, cols) = (x.rows, x.cols);
        let x = self.upload(x.contiguous()?)?;
        let QuantBufs {
            codes,
            scales,
            side,
            results,
            ..
        } = self.quantize_to_bufs(q, &x, (rows, cols), state)?;
        Ok(side.host_tensor(self.download(&codes)?, self.download(&scales)?, results))
    }

    fn dequantize(&self, t: &quant::QuantizedTensor) -> Result<Vec<f32>> {
        let pairs = t.padded_cols / 2;
        if !matches!(t.format, quant::QuantFormat::Nvfp4 { .. })
            || t.cols > t.padded_cols
            || t.codes.len() < t.rows * pairs
            || t.scales.len() < t.rows * t.padded_cols.div_ceil(16)
        {
            return Err(KernelError::Unsupported(format!(
                "dequantize: not an NVFP4 tensor of its shape ({:?}, {} x {})",
                t.format, t.rows, t.cols
            )));
        }
        let n = t.rows * t.cols;
        let mut out = vec![0f32; n];
        // SAFETY: buffers sized as the kernel reads and writes them (checked above).
        unsafe {
            self.launch(
                "nb_nvfp4_dequantize",
                (self.grid_stride_blocks(n), 1),
                &[
                    Arg::Ptr(t.codes.as_ptr() as u64),
                    Arg::Ptr(t.scales.as_ptr() as u64),
                    Arg::I32(t.rows as i32),
                    Arg::I32(t.cols as i32),
                    Arg::I32(t.padded_cols as i32),
                    Arg::F32(t.tensor_scale_inv),
                    Arg::Ptr(out.as_mut_ptr() as u64),
                ],
            )?;
        }
        Ok(out)
    }
}

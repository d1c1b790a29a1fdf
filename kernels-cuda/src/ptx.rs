//! The committed PTX, embedded at compile time (no build script: `cargo xtask ptx` builds
//! `ptx/*.ptx` from `cuda/*.cu` with pinned CUDA 13.0 wheels and writes `ptx/manifest.toml`).
//!
//! Each module exists for three targets: plain `compute_90` (the driver JIT-compiles it for
//! any GPU of compute capability 9.0 or later) and the arch-specific `sm_90a` (Hopper) and
//! `sm_100a` (Blackwell). The kernels use no arch-specific instruction today, so the three
//! differ only in how the compiler scheduled them; [`Arch::for_device`] picks one.

/// A PTX target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    /// Generic PTX for compute capability 9.0 and later.
    Compute90,
    /// Hopper-specific (H100, H200).
    Sm90a,
    /// Blackwell-specific (B200, GB200).
    Sm100a,
}

impl Arch {
    /// Every target, in manifest order.
    pub const ALL: [Arch; 3] = [Arch::Compute90, Arch::Sm90a, Arch::Sm100a];

    /// The file tag (`ptx/<module>.<tag>.ptx`) and manifest key.
    pub const fn tag(self) -> &'static str {
        match self {
            Arch::Compute90 => "compute_90",
            Arch::Sm90a => "sm_90a",
            Arch::Sm100a => "sm_100a",
        }
    }

    /// The PTX `.target` directive value.
    pub const fn ptx_target(self) -> &'static str {
        match self {
            Arch::Compute90 => "sm_90",
            Arch::Sm90a => "sm_90a",
            Arch::Sm100a => "sm_100a",
        }
    }

    /// The target to load on a device of compute capability `major.minor`: the arch-specific
    /// PTX on exactly 9.0 and 10.0, the generic PTX on any other 9.0+ device, none below.
    ///
    /// ```
    /// use kernels_cuda::ptx::Arch;
    /// assert_eq!(Arch::for_device(9, 0), Some(Arch::Sm90a));
    /// assert_eq!(Arch::for_device(10, 0), Some(Arch::Sm100a));
    /// assert_eq!(Arch::for_device(12, 0), Some(Arch::Compute90));
    /// assert_eq!(Arch::for_device(8, 9), None);
    /// ```
    pub const fn for_device(major: i32, minor: i32) -> Option<Arch> {
        match (major, minor) {
            (9, 0) => Some(Arch::Sm90a),
            (10, 0) => Some(Arch::Sm100a),
            (m, _) if m >= 9 => Some(Arch::Compute90),
            _ => None,
        }
    }
}

/// One CUDA source module and its PTX.
#[derive(Clone, Copy, Debug)]
pub struct Module {
    /// Module name (`cuda/<name>.cu`).
    pub name: &'static str,
    /// The `.cu` source, embedded so that tests can check the manifest's source hash.
    pub source: &'static str,
    /// PTX text per target, in [`Arch::ALL`] order.
    pub ptx: [&'static str; 3],
}

impl Module {
    /// The PTX for a target.
    pub fn ptx(&self, arch: Arch) -> &'static str {
        match arch {
            Arch::Compute90 => self.ptx[0],
            Arch::Sm90a => self.ptx[1],
            Arch::Sm100a => self.ptx[2],
        }
    }
}

macro_rules! module {
    ($name:literal) => {
        Module {
            name: $name,
            source: include_str!(concat!("../cuda/", $name, ".cu")),
            ptx: [
                include_str!(concat!("../ptx/", $name, ".compute_90.ptx")),
                include_str!(concat!("../ptx/", $name, ".sm_90a.ptx")),
                include_str!(concat!("../ptx/", $name, ".sm_100a.ptx")),
            ],
        }
    };
}

/// NVFP4 quantization, amax passes, dequantization, BF16 conversion, scale swizzle.
pub const NVFP4: Module = module!("nvfp4");
/// MX quantization and dequantization.
pub const MX: Module = module!("mx");
/// Per-tensor FP8 cast and dequantization.
pub const FP8: Module = module!("fp8");
/// GELU / SiLU / SwiGLU forward and backward.
pub const ACTIVATION: Module = module!("activation");
/// Fused causal attention: forward with log-sum-exp, tiled backward.
pub const ATTENTION: Module = module!("attention");
/// Fused softmax cross-entropy forward and backward.
pub const CROSS_ENTROPY: Module = module!("cross_entropy");
/// add / mul / scale / copy, column sums, f64 sums, BF16 rounding.
pub const ELEMENTWISE: Module = module!("elementwise");
/// Embedding gather and deterministic scatter-add.
pub const EMBEDDING: Module = module!("embedding");
/// A fixed-order f32 GEMM.
pub const GEMM: Module = module!("gemm");
/// RMSNorm and LayerNorm forward and backward.
pub const NORM: Module = module!("norm");
/// Gradient norm and AdamW.
pub const OPTIM: Module = module!("optim");
/// Rotary position embedding.
pub const ROPE: Module = module!("rope");

/// Every module, sorted by name (the manifest's order).
pub const MODULES: [Module; 12] = [
    ACTIVATION,
    ATTENTION,
    CROSS_ENTROPY,
    ELEMENTWISE,
    EMBEDDING,
    FP8,
    GEMM,
    MX,
    NORM,
    NVFP4,
    OPTIM,
    ROPE,
];

/// The headers every module includes (`cuda/*.cuh`, sorted by name).
pub const HEADERS: [(&str, &str); 1] = [("common.cuh", include_str!("../cuda/common.cuh"))];

/// `ptx/manifest.toml`: toolkit, flags, and the SHA-256 of every module's sources and PTX.
pub const MANIFEST: &str = include_str!("../ptx/manifest.toml");

/// `ptx/ptxas-report.txt`: registers, stack, spills and shared memory of every kernel.
pub const PTXAS_REPORT: &str = include_str!("../ptx/ptxas-report.txt");

/// The value of `key` in section `section` of the manifest (`""` for the top level).
///
/// ```
/// use kernels_cuda::ptx::manifest_value;
/// assert!(manifest_value("", "toolkit").unwrap().contains("13.0"));
/// assert_eq!(manifest_value("nvfp4", "sm_90a").unwrap().len(), 64);
/// ```
pub fn manifest_value(section: &str, key: &str) -> Option<&'static str> {
    let mut current = "";
    for line in MANIFEST.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            current = s;
            continue;
        }
        if current != section {
            continue;
        }
        if let Some((k, v)) = line.split_once('=') {
            if k.trim() == key {
                return Some(v.trim().trim_matches('"'));
            }
        }
    }
    None
}

//! Checks that need no GPU: the embedded PTX is present, current (its manifest's source hash
//! matches the embedded sources, so a `.cu` edit without `cargo xtask ptx` fails here) and
//! untouched (its hash matches the manifest); the ptxas report shows no spills; the probe
//! never panics.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::PathBuf;

use kernels_cuda::ptx::{manifest_value, Arch, HEADERS, MODULES, PTXAS_REPORT};
use sha2::{Digest, Sha256};

fn hex(d: &[u8]) -> String {
    d.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Same digest as xtask/src/ptx.rs `source_digest`.
fn source_digest(files: &[(&str, &[u8])]) -> String {
    let mut h = Sha256::new();
    for (name, data) in files {
        h.update(name.as_bytes());
        h.update([0u8]);
        h.update(data.len().to_string().as_bytes());
        h.update([0u8]);
        h.update(data);
    }
    hex(&h.finalize())
}

/// The crate directory: `CARGO_MANIFEST_DIR` at run time (cargo sets it; gpu-check.sh sets it
/// for prebuilt test binaries), else the build-time path.
fn crate_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

const STALE: &str = "run `cargo xtask ptx` and commit kernels-cuda/ptx";

#[test]
fn embedded_ptx_is_present_and_targets_each_arch() {
    for m in MODULES {
        for arch in Arch::ALL {
            let ptx = m.ptx(arch);
            assert!(ptx.len() > 1000, "{}.{} is empty", m.name, arch.tag());
            assert!(
                ptx.contains(".version 9.0"),
                "{}.{}: not PTX ISA 9.0",
                m.name,
                arch.tag()
            );
            let target = format!(".target {}", arch.ptx_target());
            assert!(
                ptx.contains(&target),
                "{}.{}: no `{target}`",
                m.name,
                arch.tag()
            );
            assert!(
                ptx.contains(".entry nb_"),
                "{}.{}: no kernels",
                m.name,
                arch.tag()
            );
        }
    }
}

#[test]
fn every_kernel_the_crate_loads_is_in_the_ptx() {
    let wanted = [
        ("nvfp4", "nb_amax"),
        ("nvfp4", "nb_amax_rht_col"),
        ("nvfp4", "nb_nvfp4_quantize"),
        ("nvfp4", "nb_nvfp4_dequantize"),
        ("nvfp4", "nb_nvfp4_to_bf16"),
        ("nvfp4", "nb_f32_to_bf16"),
        ("nvfp4", "nb_swizzle_scales"),
        ("mx", "nb_mx_quantize"),
        ("mx", "nb_mx_dequantize"),
        ("mx", "nb_mx_to_bf16"),
        ("fp8", "nb_fp8_quantize"),
        ("fp8", "nb_fp8_dequantize"),
    ];
    for (module, kernel) in wanted.into_iter().chain(kernels_cuda::train_kernel_names()) {
        let m = MODULES.iter().find(|m| m.name == module).expect("module");
        for arch in Arch::ALL {
            assert!(
                m.ptx(arch).contains(&format!(".entry {kernel}(")),
                "{kernel} missing from {module}.{}",
                arch.tag()
            );
        }
    }
}

#[test]
fn ptx_matches_manifest_hashes() {
    for m in MODULES {
        for arch in Arch::ALL {
            let want = manifest_value(m.name, arch.tag())
                .unwrap_or_else(|| panic!("manifest lacks {}.{}", m.name, arch.tag()));
            let got = hex(&Sha256::digest(m.ptx(arch).as_bytes()));
            assert_eq!(
                got,
                want,
                "{}.{}.ptx was modified after generation; {STALE}",
                m.name,
                arch.tag()
            );
        }
    }
}

#[test]
fn ptx_is_fresh_for_its_sources() {
    for m in MODULES {
        let cu = format!("{}.cu", m.name);
        let mut files: Vec<(&str, &[u8])> = vec![(cu.as_str(), m.source.as_bytes())];
        files.extend(HEADERS.iter().map(|(n, s)| (*n, s.as_bytes())));
        let want = manifest_value(m.name, "source_sha256").expect("source hash in manifest");
        assert_eq!(
            source_digest(&files),
            want,
            "cuda/{cu} (or a header) changed since the PTX was built; {STALE}"
        );
    }
}

#[test]
fn embedded_sources_are_all_the_sources_on_disk() {
    let dir = crate_dir().join("cuda");
    let mut cu = BTreeSet::new();
    let mut cuh = BTreeSet::new();
    for e in std::fs::read_dir(&dir).expect("cuda/") {
        let name = e.expect("entry").file_name().into_string().expect("utf-8");
        if let Some(n) = name.strip_suffix(".cu") {
            cu.insert(n.to_string());
        } else if name.ends_with(".cuh") {
            cuh.insert(name);
        }
    }
    let embedded: BTreeSet<String> = MODULES.iter().map(|m| m.name.to_string()).collect();
    assert_eq!(cu, embedded, "cuda/*.cu and ptx::MODULES differ");
    let headers: BTreeSet<String> = HEADERS.iter().map(|h| h.0.to_string()).collect();
    assert_eq!(cuh, headers, "cuda/*.cuh and ptx::HEADERS differ");
    for m in MODULES {
        let disk = std::fs::read_to_string(dir.join(format!("{}.cu", m.name))).expect("read");
        assert_eq!(disk, m.source);
    }
}

#[test]
fn manifest_records_the_pinned_toolchain() {
    let toolkit = manifest_value("", "toolkit").expect("toolkit");
    assert!(toolkit.contains("V13.0.88"), "{toolkit}");
    let req = std::fs::read(crate_dir().join("requirements-cuda.txt")).expect("requirements");
    assert_eq!(
        manifest_value("", "requirements_sha256"),
        Some(hex(&Sha256::digest(&req)).as_str()),
        "{STALE}"
    );
    let flags = manifest_value("", "nvcc_flags").expect("flags");
    assert!(
        flags.contains("--fmad=false") && !flags.contains("fast_math"),
        "{flags}"
    );
}

#[test]
fn ptxas_report_has_no_spills() {
    let mut kernels = 0;
    for line in PTXAS_REPORT
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        kernels += 1;
        assert!(
            line.contains(" 0 B spill stores, 0 B spill loads"),
            "spills: {line}"
        );
    }
    assert_eq!(
        kernels,
        49 * 3,
        "ptxas report covers every kernel for every target"
    );
}

#[test]
fn probe_never_panics_and_explains_itself() {
    // SAFETY: dlopen() probing only.
    let driver = unsafe { cudarc::driver::sys::is_culib_present() };
    match kernels_cuda::probe() {
        kernels_cuda::Gpu::Unavailable(why) => {
            assert!(!why.is_empty());
            if !driver {
                assert_eq!(why, "no CUDA driver (libcuda) found");
            }
        }
        kernels_cuda::Gpu::Ready(ctx) => {
            assert!(driver, "a context without a driver library");
            assert!(ctx.compute_capability().is_ok());
        }
    }
}

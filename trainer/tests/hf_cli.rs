//! `trainer export`, `trainer sample HF_DIR` and `trainer train --init HF_DIR` with the real
//! binary.

mod common;
use common::trainer;

use std::path::{Path, PathBuf};
use std::process::Output;

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn err(o: &Output) -> String {
    assert!(!o.status.success());
    String::from_utf8(o.stderr.clone()).unwrap()
}

struct TempDir(PathBuf);
impl TempDir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("nibble-hfcli-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn path(&self, p: &str) -> String {
        self.0.join(p).to_str().unwrap().to_string()
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tensors(p: &Path) -> Vec<(String, Vec<u8>)> {
    let b = std::fs::read(p).unwrap();
    let st = safetensors::SafeTensors::deserialize(&b).unwrap();
    let mut v: Vec<_> = st
        .tensors()
        .into_iter()
        .map(|(n, t)| (n, t.data().to_vec()))
        .collect();
    v.sort();
    v
}

#[test]
fn export_sample_and_init_round_trip() {
    let d = TempDir::new("rt");
    let run = d.path("run");
    ok(&trainer(&[
        "train", "--preset", "tiny", "--steps", "3", "--recipe", "nvfp4", "--quiet", "--out", &run,
    ]));
    let hf = d.path("hf");
    let out = ok(&trainer(&["export", &run, "--out", &hf]));
    assert!(out.contains("exported 21 tensors"), "{out}");
    for f in [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
    ] {
        assert!(d.0.join("hf").join(f).is_file(), "{f}");
    }
    // An existing export is refused and left alone.
    let e = err(&trainer(&["export", &run, "--out", &hf]));
    assert!(e.contains("the output exists and is not empty"), "{e}");

    // Sampling from the export gives the same text as from the checkpoint.
    let args = |src: &str| {
        vec![
            "sample".to_string(),
            src.to_string(),
            "--recipe".into(),
            "fp32".into(),
            "--tokens".into(),
            "20".into(),
            "--ids".into(),
        ]
    };
    let from_ck = ok(&trainer(
        &args(&run).iter().map(String::as_str).collect::<Vec<_>>(),
    ));
    let from_hf = ok(&trainer(
        &args(&hf).iter().map(String::as_str).collect::<Vec<_>>(),
    ));
    assert_eq!(from_ck, from_hf);

    // Training from the export starts from its weights: after one step, every weight is
    // within a few learning rates of the exported one (a fresh initialisation is not).
    let run2 = d.path("run2");
    ok(&trainer(&[
        "train", "--init", &hf, "--steps", "1", "--recipe", "fp32", "--quiet", "--out", &run2,
    ]));
    let hf2 = d.path("hf2");
    ok(&trainer(&["export", &run2, "--out", &hf2]));
    let fresh = d.path("fresh");
    ok(&trainer(&[
        "train", "--preset", "tiny", "--seed", "1", "--steps", "1", "--recipe", "fp32", "--quiet",
        "--out", &fresh,
    ]));
    let hf3 = d.path("hf3");
    ok(&trainer(&["export", &fresh, "--out", &hf3]));
    let a = tensors(&d.0.join("hf/model.safetensors"));
    let max_diff = |other: &str| {
        let b = tensors(&d.0.join(other).join("model.safetensors"));
        assert_eq!(a.len(), b.len());
        let mut m = 0.0f32;
        for (x, y) in a.iter().zip(&b) {
            assert_eq!((&x.0, x.1.len()), (&y.0, y.1.len()));
            for (p, q) in x.1.chunks_exact(4).zip(y.1.chunks_exact(4)) {
                let (p, q) = (
                    f32::from_le_bytes(p.try_into().unwrap()),
                    f32::from_le_bytes(q.try_into().unwrap()),
                );
                m = m.max((p - q).abs());
            }
        }
        m
    };
    let (near, far) = (max_diff("hf2"), max_diff("hf3"));
    eprintln!("max |w - w_exported|: after one step from --init {near}, fresh run {far}");
    assert!(near > 0.0 && near < 0.01, "{near}");
    assert!(far > 0.05, "{far}");
    let e = err(&trainer(&[
        "train",
        "--init",
        &hf,
        "--preset",
        "tiny",
        "--out",
        &d.path("x"),
    ]));
    assert!(e.contains("--preset"), "{e}");

    // Quantized exports.
    let q = d.path("q");
    let out = ok(&trainer(&[
        "export",
        &run,
        "--out",
        &q,
        "--quantize",
        "nvfp4",
    ]));
    assert!(out.contains("(14 linear weights quantized)"), "{out}");
    assert!(d.0.join("q/hf_quant_config.json").is_file());
    let q2 = d.path("q2");
    ok(&trainer(&[
        "export",
        &run,
        "--out",
        &q2,
        "--quantize",
        "mxfp8",
        "--layout",
        "compressed-tensors",
    ]));
    let e = err(&trainer(&[
        "export",
        &run,
        "--out",
        &d.path("q3"),
        "--quantize",
        "mxfp8",
    ]));
    assert!(e.contains("ModelOpt has no MXFP8"), "{e}");
    assert!(!d.0.join("q3").exists());
}

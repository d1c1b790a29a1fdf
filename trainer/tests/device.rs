//! The `--device` flag of `train`, `compare`, `sample` and `rl`: `cuda` fails before anything is
//! written, with a message that says what to do; `auto` and `cpu` train on the CPU and say so
//! on stdout.

mod common;
use common::{stderr, stdout, trainer};

#[test]
fn device_cuda_fails_cleanly_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let out_s = out.to_str().unwrap();
    for args in [
        &[
            "train", "--preset", "tiny", "--steps", "1", "--device", "cuda", "--out", out_s,
        ][..],
        &[
            "compare", "--preset", "tiny", "--steps", "1", "--device", "cuda", "--out", out_s,
        ],
        &["sample", out_s, "--device", "cuda"],
        &["rl", "--from", out_s, "--out", out_s, "--device", "cuda"],
    ] {
        // on a GPU machine they all run there
        if matches!(kernels_cuda::probe(), kernels_cuda::Gpu::Ready(_)) {
            continue;
        }
        let o = trainer(args);
        assert!(!o.status.success(), "{args:?}");
        let err = stderr(&o);
        assert!(
            err.contains("--device cuda: ") && err.contains("--device cpu"),
            "{args:?}: {err}"
        );
        assert!(
            err.starts_with("error: ") && !err.contains("panicked"),
            "{err}"
        );
        assert!(!out.exists(), "{args:?} wrote {}", out.display());
    }
    let o = trainer(&["train", "--device", "tpu"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("cpu, cuda"), "{}", stderr(&o));
}

#[test]
fn device_auto_and_cpu_train_on_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    for (dev, want) in [
        ("auto", "\ndevice: cpu (auto: "),
        ("cpu", "\ndevice: cpu\n"),
    ] {
        let out = dir.path().join(dev);
        let o = trainer(&[
            "train",
            "--preset",
            "tiny",
            "--steps",
            "2",
            "--quiet",
            "--device",
            dev,
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let log = stdout(&o);
        assert!(log.contains(want), "{log}");
        assert!(out.join("run.toml").is_file());
    }
}

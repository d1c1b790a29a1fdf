//! Malformed configs, recipes, data files and checkpoints give typed errors, never panics;
//! and the `train` / `compare` / `sample` commands end to end on a tiny model.

mod common;
use common::{opts, trainer};

use std::fs;
use std::path::Path;

use trainer::checkpoint::{self, CheckpointError, STATE_FILE, TENSORS_FILE};
use trainer::config::ConfigError;
use trainer::data::DataSource;
use trainer::model::{ModelConfig, ModelError};
use trainer::recipe::Recipe;
use trainer::train::{RunConfig, TrainError, Trainer};

const TINY: &str = r#"
[model]
vocab = 256
d_model = 32
n_layers = 3
n_heads = 2
hidden = 64
seq = 32

[train]
steps = 6
batch = 4
lr = 0.01
warmup_steps = 2
eval_every = 3
eval_batches = 1

[data]
kind = "corpus"
seed = 2
bytes = 60000
"#;

fn config_err(text: &str) -> String {
    match RunConfig::from_toml_str(text) {
        Err(e @ (ConfigError::Invalid(_) | ConfigError::Model(_))) => e.to_string(),
        Err(e) => panic!("unexpected error kind: {e}"),
        Ok(_) => panic!("accepted:\n{text}"),
    }
}

#[test]
fn malformed_run_configs_are_rejected_with_reasons() {
    assert!(RunConfig::from_toml_str(TINY).is_ok());
    assert!(config_err("preset = \"small\"\n[train]\nstepz = 3").contains("stepz"));
    assert!(config_err("preset = \"huge\"").contains("unknown model preset 'huge'"));
    assert!(config_err("[train]\nsteps = 3").contains("preset"));
    assert!(config_err(&TINY.replace("n_heads = 2", "n_heads = 3")).contains("n_heads"));
    assert!(config_err(&TINY.replace("d_model = 32", "d_model = 0")).contains("positive"));
    assert!(config_err(&TINY.replace("steps = 6", "steps = 0")).contains("steps"));
    assert!(config_err(&TINY.replace("lr = 0.01", "lr = -1.0")).contains("lr"));
    assert!(config_err(&TINY.replace("lr = 0.01", "lr = \"fast\"")).contains("lr"));
    assert!(config_err(&TINY.replace("warmup_steps = 2", "warmup_steps = 60")).contains("warmup"));
    assert!(config_err(&TINY.replace("vocab = 256", "vocab = 100")).contains("vocab"));
    assert!(config_err(&TINY.replace("kind = \"corpus\"", "kind = \"magic\"")).contains("magic"));
    assert!(config_err("not toml [[[").contains("invalid run config"));
    assert!(matches!(
        ModelConfig::preset("nope"),
        Err(ModelError::UnknownPreset { .. })
    ));
    let missing = Path::new("/nonexistent/run.toml");
    assert!(matches!(
        RunConfig::from_file(missing),
        Err(ConfigError::Io { .. })
    ));
}

#[test]
fn bad_recipes_and_data_files_are_typed_errors() {
    assert!(Recipe::resolve("nvfp5").is_err());
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = RunConfig::from_toml_str(TINY).unwrap();
    let bad_utf8 = tmp.path().join("bad.txt");
    fs::write(&bad_utf8, b"hello \xff world").unwrap();
    cfg.data = DataSource::Text { path: bad_utf8 };
    let r = Recipe::builtin("bf16").unwrap();
    assert!(matches!(
        Trainer::new(cfg.clone(), r.clone(), opts(tmp.path())),
        Err(TrainError::Data(_))
    ));
    cfg.data = DataSource::Text {
        path: tmp.path().join("missing.txt"),
    };
    assert!(matches!(
        Trainer::new(cfg.clone(), r.clone(), opts(tmp.path())),
        Err(TrainError::Data(_))
    ));
    let short = tmp.path().join("short.txt");
    fs::write(&short, "too short").unwrap();
    cfg.data = DataSource::Text { path: short };
    assert!(matches!(
        Trainer::new(cfg.clone(), r.clone(), opts(tmp.path())),
        Err(TrainError::Data(_))
    ));
    let shard = tmp.path().join("odd.bin");
    fs::write(&shard, [1u8, 2, 3]).unwrap();
    cfg.data = DataSource::Shard {
        path: shard,
        format: Default::default(),
        vocab_size: 256,
    };
    assert!(matches!(
        Trainer::new(cfg, r, opts(tmp.path())),
        Err(TrainError::Data(_))
    ));
}

fn trained(dir: &Path) -> std::path::PathBuf {
    let cfg = RunConfig::from_toml_str(TINY).unwrap();
    Trainer::new(cfg, Recipe::builtin("bf16").unwrap(), opts(dir))
        .unwrap()
        .run()
        .unwrap()
        .checkpoint
}

#[test]
fn a_checkpoint_whose_recipe_is_invalid_is_refused_on_resume() {
    // Found by the checkpoint fuzzer: a recipe edited in state.json (there, an FP8 amax
    // history of length 0) was resumed unchecked and failed at the next step.
    let tmp = tempfile::tempdir().unwrap();
    let good = trained(&tmp.path().join("run"));
    let mut state: serde_json::Value =
        serde_json::from_slice(&fs::read(good.join(STATE_FILE)).unwrap()).unwrap();
    state["recipe"]["name"] = "../elsewhere".into();
    fs::write(good.join(STATE_FILE), serde_json::to_vec(&state).unwrap()).unwrap();
    match Trainer::resume(&good, opts(&tmp.path().join("again"))) {
        Err(TrainError::Checkpoint(CheckpointError::BadState { message, .. })) => {
            assert!(
                message.contains("recipe") && message.contains("may only use"),
                "{message}"
            )
        }
        other => panic!("expected a bad state, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn corrupt_checkpoints_are_typed_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let good = trained(&tmp.path().join("run"));
    assert!(checkpoint::load(&good).is_ok());
    let copy = |name: &str| {
        let d = tmp.path().join(name);
        fs::create_dir_all(&d).unwrap();
        for f in fs::read_dir(&good).unwrap() {
            let f = f.unwrap();
            fs::copy(f.path(), d.join(f.file_name())).unwrap();
        }
        d
    };
    // missing
    assert!(matches!(
        checkpoint::load(&tmp.path().join("nothing")),
        Err(CheckpointError::NotACheckpoint(_))
    ));
    // truncated safetensors: checksum
    let d = copy("trunc");
    let t = fs::read(d.join(TENSORS_FILE)).unwrap();
    fs::write(d.join(TENSORS_FILE), &t[..t.len() / 2]).unwrap();
    assert!(matches!(
        checkpoint::load(&d),
        Err(CheckpointError::Checksum { .. })
    ));
    // truncated safetensors with a matching checksum: the parser's error
    let mut state: serde_json::Value =
        serde_json::from_slice(&fs::read(d.join(STATE_FILE)).unwrap()).unwrap();
    state["tensors_crc32"] = optim::crc32(&t[..t.len() / 2]).into();
    fs::write(d.join(STATE_FILE), serde_json::to_vec(&state).unwrap()).unwrap();
    assert!(matches!(
        checkpoint::load(&d),
        Err(CheckpointError::BadTensors { .. })
    ));
    assert!(checkpoint::tensors_from_bytes(&[1, 2, 3], Path::new("x")).is_err());
    assert!(checkpoint::tensors_from_bytes(&[], Path::new("x")).is_err());
    // bad state JSON
    let d = copy("json");
    fs::write(d.join(STATE_FILE), "{\"version\": 1, \"step\": ").unwrap();
    assert!(matches!(
        checkpoint::load(&d),
        Err(CheckpointError::BadState { .. })
    ));
    let d = copy("json2");
    let mut state: serde_json::Value =
        serde_json::from_slice(&fs::read(d.join(STATE_FILE)).unwrap()).unwrap();
    state["version"] = 99.into();
    fs::write(d.join(STATE_FILE), serde_json::to_vec(&state).unwrap()).unwrap();
    assert!(matches!(
        checkpoint::load(&d),
        Err(CheckpointError::BadState { .. })
    ));
    // wrong shapes: the state says a wider model than the tensors hold
    let d = copy("shape");
    let mut state: serde_json::Value =
        serde_json::from_slice(&fs::read(d.join(STATE_FILE)).unwrap()).unwrap();
    state["model"]["d_model"] = 64.into();
    fs::write(d.join(STATE_FILE), serde_json::to_vec(&state).unwrap()).unwrap();
    let ck = checkpoint::load(&d).unwrap();
    let err = Trainer::resume(&d, opts(&tmp.path().join("r")))
        .err()
        .unwrap();
    assert!(
        matches!(
            err,
            TrainError::Checkpoint(CheckpointError::Mismatch { .. })
        ),
        "{err}"
    );
    drop(ck);
    assert!(trainer::sample::Sampler::load(&d, Recipe::builtin("bf16").unwrap()).is_err());
    // corrupt optimizer state
    let d = copy("opt");
    fs::write(d.join(checkpoint::OPTIMIZER_FILE), b"garbage").unwrap();
    assert!(matches!(
        checkpoint::load(&d),
        Err(CheckpointError::Checksum { .. })
    ));
}

#[test]
fn cli_train_sample_compare_and_nan_exit_code() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("tiny.toml");
    fs::write(&cfg, TINY).unwrap();
    let cfg_s = cfg.to_str().unwrap();
    let out = tmp.path().join("run");
    let o = trainer(&[
        "train",
        "--config",
        cfg_s,
        "--recipe",
        "nvfp4",
        "--out",
        out.to_str().unwrap(),
        "--threads",
        "1",
        "--quiet",
    ]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        stdout.contains("metrics:") && stdout.contains("checkpoint:"),
        "{stdout}"
    );
    // resume of a finished run does nothing more and succeeds
    let o = trainer(&["train", "--resume", out.to_str().unwrap(), "--quiet"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let summary: serde_json::Value =
        serde_json::from_slice(&fs::read(out.join("summary.json")).unwrap()).unwrap();
    assert!(
        summary["final_val_loss"]
            .as_f64()
            .is_some_and(f64::is_finite),
        "{summary}"
    );
    assert!(
        summary["final_train_loss"]
            .as_f64()
            .is_some_and(f64::is_finite),
        "{summary}"
    );
    let o = trainer(&[
        "sample",
        out.to_str().unwrap(),
        "--recipe",
        "nvfp4",
        "--tokens",
        "20",
        "--prompt",
        "The",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("The"));
    let rep = tmp.path().join("cmp");
    let o = trainer(&[
        "compare",
        "--config",
        cfg_s,
        "--recipes",
        "bf16,mxfp8",
        "--out",
        rep.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for f in [
        "report.md",
        "loss.svg",
        "train-loss.svg",
        "bf16/metrics.jsonl",
        "mxfp8/summary.json",
    ] {
        assert!(rep.join(f).is_file(), "{f}");
    }
    // the NaN guard: non-zero exit, diagnosis, last checkpoint kept (the test hook comes
    // from the environment, never from the configuration)
    let nan_out = tmp.path().join("nan");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_trainer"))
        .args([
            "train",
            "--config",
            cfg_s,
            "--out",
            nan_out.to_str().unwrap(),
            "--quiet",
        ])
        .env(trainer::interrupt::NAN_ENV, "5")
        .output()
        .expect("run trainer");
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("diverged at step 5") && err.contains("blocks.0.attn.qkv.weight"),
        "{err}"
    );
    assert_eq!(checkpoint::load(&nan_out).unwrap().state.step, 3);
    // bad arguments are errors, not panics
    for args in [
        &["train", "--recipe", "nvfp5", "--steps", "1"][..],
        &["train", "--preset", "huge"],
        &["train", "--config", "/nonexistent.toml"],
        &["sample", "/nonexistent"],
        &["train", "--resume", "/nonexistent"],
        &["train", "--threads", "0"],
    ] {
        let o = trainer(args);
        assert!(!o.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.starts_with("error:") && !err.contains("panicked"),
            "{args:?}: {err}"
        );
    }
}

/// The message of `e` followed by those of its causes, as error reporters print it
/// (`anyhow`'s `{:#}`, which the binary's `error:` line uses: joined with ": ").
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut parts = vec![e.to_string()];
    let mut cause = e.source();
    while let Some(c) = cause {
        parts.push(c.to_string());
        cause = c.source();
    }
    parts.join(": ")
}

#[test]
fn file_errors_say_their_cause_once() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("missing");
    let not_found = fs::read(&missing).unwrap_err().to_string();
    // a run directory whose `latest` file is not text
    let ck = tmp.path().join("ck");
    fs::create_dir_all(&ck).unwrap();
    fs::write(ck.join("latest"), b"\xff\xfe").unwrap();
    let not_text = fs::read_to_string(ck.join("latest"))
        .unwrap_err()
        .to_string();
    let errors: Vec<(Box<dyn std::error::Error>, &str)> = vec![
        (
            Box::new(RunConfig::from_file(&missing).unwrap_err()),
            &not_found,
        ),
        (
            Box::new(TrainError::from(
                RunConfig::from_file(&missing).unwrap_err(),
            )),
            &not_found,
        ),
        (
            Box::new(Recipe::from_file(&missing).unwrap_err()),
            &not_found,
        ),
        (
            Box::new(trainer::rl::plan::Plan::resolve(missing.to_str().unwrap()).unwrap_err()),
            &not_found,
        ),
        (
            Box::new(trainer::data::Tokenizer::from_file(&missing).unwrap_err()),
            &not_found,
        ),
        (
            Box::new(
                DataSource::Text {
                    path: missing.clone(),
                }
                .load()
                .unwrap_err(),
            ),
            &not_found,
        ),
        (Box::new(checkpoint::load(&ck).unwrap_err()), &not_text),
    ];
    for (e, cause) in &errors {
        let said = with_causes(e.as_ref());
        assert_eq!(said.matches(*cause).count(), 1, "{said}");
        assert_eq!(
            said,
            e.to_string(),
            "the cause is in the message, not a source()"
        );
    }
}

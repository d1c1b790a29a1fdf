//! The defects of issue #13 ("runs that never lose work"), found by using the trainer as a
//! hostile user would: each test failed before its fix. (Kills, signals, locks and
//! `--overwrite` are in `tests/crash.rs`.)

mod common;
use common::{opts, stderr, trainer};

use std::fs;
use std::path::{Path, PathBuf};

use trainer::checkpoint::{self, CheckpointError};
use trainer::recipe::{Recipe, RecipeError};
use trainer::sample::{SampleConfig, Sampler};
use trainer::train::{read_metrics, RunConfig, TrainError, Trainer};

const TINY: &str = r#"
[model]
vocab = 256
d_model = 32
n_layers = 2
n_heads = 2
hidden = 64
seq = 16

[train]
steps = 6
batch = 2
lr = 0.01
warmup_steps = 2
eval_every = 3
eval_batches = 1

[data]
kind = "corpus"
seed = 2
bytes = 20000
"#;

/// Runs `args`, which must fail with one clear `error:` naming `needle`; returns the output.
fn refused(args: &[&str], needle: &str) -> std::process::Output {
    let o = trainer(args);
    let err = stderr(&o);
    assert!(!o.status.success(), "{args:?} succeeded");
    assert!(
        err.starts_with("error:") && !err.contains("panicked"),
        "{args:?}: {err}"
    );
    assert!(err.contains(needle), "{args:?}: {err}");
    o
}

/// [`refused`]; returns the error text.
fn fails_with(args: &[&str], needle: &str) -> String {
    stderr(&refused(args, needle))
}

/// [`fails_with`], with nothing printed before the refusal: no note on how the flags
/// adjusted the run, no device line, no half answer.
fn fails_silently(args: &[&str], needle: &str) -> String {
    let o = refused(args, needle);
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(said.is_empty(), "{args:?} printed first: {said}");
    stderr(&o)
}

fn tiny_run(dir: &Path, toml: &str) -> PathBuf {
    let cfg = RunConfig::from_toml_str(toml).unwrap();
    Trainer::new(cfg, Recipe::builtin("bf16").unwrap(), opts(dir))
        .unwrap()
        .run()
        .unwrap()
        .checkpoint
}

/// Item 3: a run whose warmup is the whole run (as `--steps` below the warmup makes it)
/// diverging during warmup is stopped; before, the guard was off during warmup and the run
/// ended "done".
#[test]
fn the_guard_watches_the_warmup() {
    let tmp = tempfile::tempdir().unwrap();
    let toml = TINY
        .replace("lr = 0.01", "lr = 50.0")
        .replace("warmup_steps = 2", "warmup_steps = 6")
        .replace("eval_every = 3", "eval_every = 100");
    let cfg = RunConfig::from_toml_str(&toml).unwrap();
    let out = tmp.path().join("run");
    let e = Trainer::new(cfg, Recipe::builtin("bf16").unwrap(), opts(&out))
        .unwrap()
        .run()
        .unwrap_err();
    match &e {
        TrainError::Diverged { reason, step, .. } => {
            assert!(reason.contains("the first step's loss"), "{e}");
            assert!(*step >= 2 && *step < 6, "{e}");
        }
        other => panic!("{other}"),
    }
    assert!(out.join("diagnosis.txt").is_file());
    assert!(!out.join("summary.json").exists());
}

/// Item 3: a checkpoint is written only for parameters whose validation loss passes the
/// guard, so the "last good checkpoint" of a divergence is good; before, checkpoints written
/// during warmup were never judged.
#[test]
fn the_last_good_checkpoint_is_good() {
    let tmp = tempfile::tempdir().unwrap();
    let toml = TINY
        .replace("lr = 0.01", "lr = 5.0")
        .replace("warmup_steps = 2", "warmup_steps = 6")
        .replace("eval_every = 3", "eval_every = 1");
    let cfg = RunConfig::from_toml_str(&toml).unwrap();
    let out = tmp.path().join("run");
    let e = Trainer::new(cfg, Recipe::builtin("bf16").unwrap(), opts(&out))
        .unwrap()
        .run()
        .unwrap_err();
    let TrainError::Diverged {
        reason,
        last_checkpoint,
        step,
        ..
    } = &e
    else {
        panic!("{e}")
    };
    assert!(reason.contains("validation loss"), "{e}");
    let metrics = read_metrics(&out.join("metrics.jsonl")).unwrap();
    let first = metrics[0].train_loss;
    let ck = checkpoint::load(&out).unwrap();
    assert_eq!(last_checkpoint, &ck.dir.display().to_string());
    assert_eq!(ck.state.step, step - 1);
    for m in &metrics {
        let v = m.val_loss.unwrap();
        if m.step <= ck.state.step {
            assert!(v <= 3.0 * first, "step {} val {v}, first {first}", m.step);
        }
    }
    assert!(!out.join(format!("checkpoints/step-{step:08}")).exists());
}

/// Item 4: two recipes with one name would share an output folder.
#[test]
fn compare_refuses_duplicate_recipe_names() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a.toml");
    let b = tmp.path().join("b.toml");
    fs::write(&a, "base = \"bf16\"\nname = \"same\"\n").unwrap();
    fs::write(&b, "base = \"mxfp8\"\nname = \"same\"\n").unwrap();
    let out = tmp.path().join("cmp");
    let recipes = format!("{},{}", a.display(), b.display());
    let err = fails_with(
        &[
            "compare",
            "--preset",
            "tiny",
            "--steps",
            "1",
            "--recipes",
            &recipes,
            "--out",
            out.to_str().unwrap(),
        ],
        "both named 'same'",
    );
    assert!(err.contains("a.toml") && err.contains("b.toml"), "{err}");
    fails_with(
        &["compare", "--recipes", "bf16,nvfp4,bf16", "--steps", "1"],
        "both named 'bf16'",
    );
    assert!(!out.exists());
}

/// A refused comparison says nothing about its settings first (the notes on what the flags
/// adjusted, the device) and leaves no folder behind, also when its data cannot be read.
#[test]
fn refused_comparisons_say_and_write_nothing_first() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("cmp");
    let out_s = out.to_str().unwrap();
    let latin1 = tmp.path().join("latin1.txt");
    fs::write(&latin1, b"caf\xe9 au lait\n").unwrap();
    let base = [
        "compare",
        "--recipes",
        "fp32,bf16",
        "--steps",
        "2",
        "--out",
        out_s,
    ];
    for (extra, needle) in [
        (["--seeds", "0"], "--seeds must be at least 1"),
        (["--reference", "nvfp4"], "--reference nvfp4 is not among"),
        (
            ["--data", "/nonexistent/text.txt"],
            "no such file or folder",
        ),
        // a file that exists but cannot be training data: read before the folder is made
        (["--data", latin1.to_str().unwrap()], "not valid UTF-8"),
    ] {
        let args: Vec<&str> = base.iter().chain(extra.iter()).copied().collect();
        if needle.contains("UTF-8") {
            // found when the data is read, after the notes and the device line
            fails_with(&args, needle);
        } else {
            fails_silently(&args, needle);
        }
        assert!(!out.exists(), "{args:?} left {out_s}");
    }
    // `train --data` names what it takes when the path is neither a file nor a tokenized
    // folder
    let folder = tmp.path().join("plain-folder");
    fs::create_dir_all(&folder).unwrap();
    for (data, needle) in [
        (folder.to_str().unwrap(), "a folder without tokenizer.json"),
        ("/nonexistent/text.txt", "no such file or folder"),
    ] {
        let err = fails_with(&["train", "--data", data, "--steps", "2"], needle);
        assert!(err.contains("--data takes"), "{err}");
    }
}

/// `trainer rl compare` checks the starting checkpoint and the output before it makes the
/// folder and starts the grid (every run would fail the same way); `trainer train --init`
/// prints no note on the flags before a refused initialisation.
#[test]
fn refused_rl_grids_and_inits_write_and_say_nothing_first() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("grid");
    let out_s = out.to_str().unwrap();
    fails_with(
        &[
            "rl",
            "compare",
            "--from",
            "/nonexistent",
            "--plans",
            "bf16",
            "--out",
            out_s,
        ],
        "not a checkpoint",
    );
    assert!(!out.exists());
    fails_silently(
        &["train", "--init", "/nonexistent", "--steps", "2", "--quiet"],
        "No such file",
    );
}

/// `trainer recipes show` checks `--plan` and `--progress` before it prints the recipe.
#[test]
fn recipes_show_prints_nothing_for_bad_flags() {
    fails_silently(
        &["recipes", "show", "nvfp4", "--plan", "0"],
        "error: --plan needs",
    );
    fails_silently(
        &[
            "recipes",
            "show",
            "nvfp4",
            "--plan",
            "4",
            "--progress",
            "-0.5",
        ],
        "error: --progress -0.5 must be",
    );
}

/// Item 5: recipe names become directory names and must not escape them.
#[test]
fn recipe_names_are_restricted_to_a_safe_character_set() {
    for bad in ["../../x", "/tmp/abs", "a/b", ".hidden", "", "x y", "ä"] {
        let toml = format!("base = \"bf16\"\nname = {bad:?}\n");
        let e = Recipe::from_toml_str(&toml).unwrap_err();
        assert!(matches!(e, RecipeError::Invalid { .. }), "{bad:?}: {e}");
        assert!(e.to_string().contains("name"), "{e}");
    }
    let long = format!("base = \"bf16\"\nname = \"{}\"\n", "x".repeat(65));
    assert!(Recipe::from_toml_str(&long).is_err());
    for good in ["mine", "nvfp4-v2.1_b", "A0"] {
        let toml = format!("base = \"bf16\"\nname = {good:?}\n");
        assert_eq!(Recipe::from_toml_str(&toml).unwrap().name, good);
    }
    let tmp = tempfile::tempdir().unwrap();
    let r = tmp.path().join("escape.toml");
    fs::write(&r, "base = \"bf16\"\nname = \"../../escaped\"\n").unwrap();
    fails_with(
        &["train", "--recipe", r.to_str().unwrap(), "--steps", "1"],
        "may only use",
    );
}

/// Item 6: sizes from the user are bounded and estimated before anything is allocated;
/// before, these panicked (capacity overflow) or aborted (allocation failure).
#[test]
fn huge_sizes_are_refused_with_the_estimate() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    tiny_run(&run, TINY);
    let run_s = run.to_str().unwrap();
    for n in ["18446744073709551615", "4000000000"] {
        fails_with(
            &["sample", run_s, "--tokens", n],
            "at most 1000000 per call",
        );
    }
    for spec in ["corpus:0:99999999999999", "corpus:0:18446744073709551615"] {
        fails_with(
            &["train", "--preset", "tiny", "--steps", "1", "--data", spec],
            "of memory (",
        );
    }
    fails_with(
        &["data", "sample", "--bytes", "99999999999999"],
        "needs about",
    );
    fails_with(
        &["data", "stats", "--bytes", "99999999999999"],
        "needs about",
    );
    let cfg = tmp.path().join("big.toml");
    // tens of TiB: refused on any machine
    let huge = TINY
        .replace("batch = 2", "batch = 1000000")
        .replace("seq = 16", "seq = 1024");
    fs::write(&cfg, huge).unwrap();
    let err = fails_with(
        &["train", "--config", cfg.to_str().unwrap(), "--steps", "1"],
        "needs about",
    );
    assert!(err.contains("batch 1000000 x seq 1024"), "{err}");
    assert!(err.contains(" TiB of memory ("), "{err}");
    fs::write(&cfg, TINY.replace("batch = 2", "batch = 100000000")).unwrap();
    fails_with(
        &["train", "--config", cfg.to_str().unwrap()],
        "must be at most 1048576",
    );
    fs::write(&cfg, TINY.replace("d_model = 32", "d_model = 4294967296")).unwrap();
    fails_with(&["train", "--config", cfg.to_str().unwrap()], "too large");
    fails_with(&["train", "--threads", "100000"], "--threads must be in");
    // a text file larger than memory is refused before it is read (a sparse file here)
    let big = tmp.path().join("big.txt");
    fs::File::create(&big).unwrap().set_len(1 << 40).unwrap();
    let err = fails_with(
        &["train", "--preset", "tiny", "--data", big.to_str().unwrap()],
        "needs about 1.0 TiB",
    );
    assert!(err.contains("big.txt (1099511627776 bytes)"), "{err}");
    fails_with(
        &["compare", "--seeds", "18446744073709551615"],
        "--seeds must be at least 1 and at most 1000",
    );
    fails_with(
        &["recipes", "show", "nvfp4", "--plan", "99999999999"],
        "--plan needs",
    );
    fails_with(
        &["data", "stats", "--shard", "x.bin", "--vocab", "4000000000"],
        "must be in 1..=65536",
    );
    // the library bound, and no preallocation below it
    let mut s = Sampler::load(&run, Recipe::builtin("bf16").unwrap()).unwrap();
    let e = s
        .generate(
            b"ab".map(u32::from).as_slice(),
            &SampleConfig {
                tokens: usize::MAX,
                temperature: 0.0,
                top_k: 0,
                top_p: 1.0,
                stop: vec![],
                seed: 0,
            },
        )
        .unwrap_err();
    assert!(matches!(e, TrainError::Sampling(_)), "{e}");
    // a memory estimate that cannot fit is refused by the library too
    let mut big = RunConfig::from_toml_str(TINY).unwrap();
    big.train.batch = 1 << 20;
    big.model.seq = 4096;
    assert!(matches!(
        Trainer::new(big, Recipe::builtin("bf16").unwrap(), opts(&run)),
        Err(TrainError::TooLarge(_))
    ));
}

/// Item 8: values that were silently wrong.
#[test]
fn silent_wrong_values_are_refused_or_right() {
    let tmp = tempfile::tempdir().unwrap();
    // a model beyond bytes: refuse text, print ids on request
    let run = tmp.path().join("v300");
    tiny_run(&run, &TINY.replace("vocab = 256", "vocab = 300"));
    let run_s = run.to_str().unwrap();
    fails_with(&["sample", run_s, "--tokens", "3"], "--ids");
    let o = trainer(&["sample", run_s, "--tokens", "3", "--ids", "--prompt", "ab"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ids: Vec<u32> = String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .map(|t| t.parse().unwrap())
        .collect();
    assert_eq!(ids.len(), 5);
    assert_eq!(&ids[..2], &[97, 98]);
    assert!(ids.iter().all(|&t| t < 300));
    // --resume with settings it would ignore
    fails_with(
        &["train", "--resume", run_s, "--seed", "3"],
        "--seed cannot",
    );
    fails_with(
        &["train", "--resume", run_s, "--eval-every", "2"],
        "--eval-every cannot",
    );
}

/// Item 9: messages that said something else than what was wrong.
#[test]
fn messages_name_the_real_problem() {
    let tmp = tempfile::tempdir().unwrap();
    // a missing recipe file is not an unknown recipe name
    let err = fails_with(
        &["train", "--recipe", "mine.toml", "--steps", "1"],
        "recipe file mine.toml",
    );
    assert!(!err.contains("unknown recipe"), "{err}");
    // I/O errors say their cause once
    let err = fails_with(
        &["train", "--config", "/nonexistent/run.toml"],
        "No such file",
    );
    assert_eq!(err.matches("No such file").count(), 1, "{err}");
    let text = tmp.path().join("a.txt");
    fs::write(&text, "some text").unwrap();
    let out = tmp.path().join("tok");
    for args in [
        vec![
            "tokenize",
            "--out",
            out.to_str().unwrap(),
            "--tokenizer",
            "/nonexistent/tokenizer.json",
            text.to_str().unwrap(),
        ],
        vec![
            "rl",
            "--from",
            "/nonexistent",
            "--plan",
            "/nonexistent/plan.toml",
            "--out",
            out.to_str().unwrap(),
        ],
    ] {
        let err = fails_with(&args, "No such file");
        assert_eq!(err.matches("No such file").count(), 1, "{err}");
    }
    let err = fails_with(&["sample", "/nonexistent"], "not a checkpoint");
    assert_eq!(err.lines().count(), 1, "{err}");
    // a run refused for its settings gets no note on how those settings were adjusted
    fails_silently(&["train", "--steps", "0", "--quiet"], "train.steps");
    // a `latest` naming a missing directory
    let run = tmp.path().join("run");
    let ck = tiny_run(&run, TINY);
    fs::remove_dir_all(&ck).unwrap();
    let e = checkpoint::load(&run).unwrap_err();
    assert!(matches!(e, CheckpointError::DanglingLatest { .. }), "{e}");
    assert!(e.to_string().contains("step-00000006"), "{e}");
    fails_with(
        &["train", "--resume", run.to_str().unwrap()],
        "which is missing",
    );
    fs::write(run.join("checkpoints/latest"), "../../etc").unwrap();
    assert!(matches!(
        checkpoint::resolve(&run),
        Err(CheckpointError::DanglingLatest { .. })
    ));
    // an optimizer-state error is printed once, not once per level of the error chain
    let opt_run = tmp.path().join("opt");
    let ck = tiny_run(&opt_run, TINY);
    let opath = ck.join(checkpoint::OPTIMIZER_FILE);
    let mut b = fs::read(&opath).unwrap();
    let mid = b.len() / 2;
    b[mid] ^= 0x55;
    fs::write(&opath, &b).unwrap();
    let spath = ck.join(checkpoint::STATE_FILE);
    let mut v: serde_json::Value = serde_json::from_slice(&fs::read(&spath).unwrap()).unwrap();
    v["optimizer_crc32"] = optim::crc32(&b).into();
    fs::write(&spath, serde_json::to_vec(&v).unwrap()).unwrap();
    let err = fails_with(
        &["train", "--resume", opt_run.to_str().unwrap()],
        "optimizer: cannot load optimizer state: checksum mismatch",
    );
    assert_eq!(err.matches("checksum mismatch").count(), 1, "{err}");
    // sampling settings are not "invalid run config"
    let good = tmp.path().join("good");
    tiny_run(&good, TINY);
    let err = fails_with(
        &[
            "sample",
            good.to_str().unwrap(),
            "--temperature=-1",
            "--tokens",
            "2",
        ],
        "invalid sampling settings: temperature -1 must be finite and >= 0",
    );
    assert!(!err.contains("run config"), "{err}");
    fails_with(
        &[
            "sample",
            good.to_str().unwrap(),
            "--temperature",
            "inf",
            "--tokens",
            "2",
        ],
        "temperature inf must be finite",
    );
    // an upper-case .BIN is a token shard, not text
    let shard = tmp.path().join("TOKENS.BIN");
    let tokens: Vec<u16> = trainer::data::generate(5, 20_000)
        .bytes()
        .map(u16::from)
        .collect();
    trainer::data::write_raw_shard(&shard, &tokens).unwrap();
    let out = tmp.path().join("shard-run");
    let o = trainer(&[
        "train",
        "--preset",
        "tiny",
        "--steps",
        "1",
        "--quiet",
        "--data",
        shard.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let run_toml = fs::read_to_string(out.join("run.toml")).unwrap();
    assert!(run_toml.contains("kind = \"shard\""), "{run_toml}");
}

/// Item 10: a failed checkpoint write leaves nothing behind.
#[test]
fn a_failed_checkpoint_write_leaves_no_temporary_files() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tiny_run(&tmp.path().join("run"), TINY);
    let mut c = checkpoint::load(&ck).unwrap();
    let root = tmp.path().join("other");
    fs::create_dir_all(&root).unwrap();
    c.state.step = 99;
    // a file where the step directory goes: the rename cannot replace it
    fs::write(root.join("step-00000099"), b"in the way").unwrap();
    let e = checkpoint::save(&root, &mut c.state, &c.tensors, &c.optimizer, 2).unwrap_err();
    assert!(matches!(e, CheckpointError::Io { .. }), "{e}");
    let names: Vec<String> = fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["step-00000099"], "{names:?}");
}

/// Found by the checkpoint fuzzer: a state whose batcher window or cursor overflowed
/// panicked (`attempt to add with overflow`), and a batcher configuration that disagreed
/// with the run's would have been used as is (a huge batch allocated at the next step).
#[test]
fn inconsistent_batcher_states_are_typed_errors() {
    use trainer::data::{split, Batcher, BatcherConfig, DataSource, Sampling};
    let tokens = DataSource::Corpus {
        seed: 0,
        bytes: 1000,
    }
    .load()
    .unwrap();
    let (train, _) = split(&tokens, 0.1).unwrap();
    let cfg = BatcherConfig {
        batch: 2,
        seq: 8,
        sampling: Sampling::Sequential,
        seed: 0,
    };
    let good = Batcher::new(train.clone(), cfg).unwrap().state();
    let mut s = good.clone();
    s.config.seq = usize::MAX;
    assert!(Batcher::from_state(train.clone(), &s).is_err());
    let mut s = good.clone();
    s.cursor = u64::MAX;
    assert!(Batcher::from_state(train.clone(), &s).is_err());
    assert!(Batcher::new(
        train,
        BatcherConfig {
            seq: usize::MAX,
            ..cfg
        }
    )
    .is_err());

    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let ck = tiny_run(&run, TINY);
    let state_path = ck.join(checkpoint::STATE_FILE);
    let state0: serde_json::Value =
        serde_json::from_slice(&fs::read(&state_path).unwrap()).unwrap();
    for (field, value) in [
        ("batch", serde_json::json!(1_000_000_000u64)),
        ("seq", serde_json::json!(u64::MAX)),
        ("seed", serde_json::json!(5)),
    ] {
        let mut v = state0.clone();
        v["batcher"]["config"][field] = value;
        fs::write(&state_path, serde_json::to_vec(&v).unwrap()).unwrap();
        let e = Trainer::resume(&run, opts(&run)).err().unwrap();
        assert!(
            matches!(e, TrainError::Checkpoint(CheckpointError::BadState { .. })),
            "{field}: {e}"
        );
    }
    let mut v = state0.clone();
    v["step"] = serde_json::json!(u64::MAX);
    fs::write(&state_path, serde_json::to_vec(&v).unwrap()).unwrap();
    let e = Trainer::resume(&run, opts(&run)).err().unwrap();
    assert!(e.to_string().contains("do not fit a run of 6 steps"), "{e}");
}

/// `trainer rl --pretrain-steps` checks its settings (steps, preset, tokenizer, `--out`)
/// before it writes anything: a refused run leaves no directory behind.
#[test]
fn refused_rl_pretraining_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let out_s = out.to_str().unwrap();
    for (extra, needle) in [
        (
            vec!["--pretrain-steps", "0"],
            "--pretrain-steps must be at least 1",
        ),
        (
            vec!["--pretrain-steps", "5", "--preset", "huge"],
            "unknown model preset",
        ),
        (
            vec!["--pretrain-steps", "5", "--bpe-vocab", "3"],
            "a BPE vocabulary needs",
        ),
        (
            vec![
                "--pretrain-steps",
                "5",
                "--tokenizer",
                "/nonexistent/t.json",
            ],
            "No such file",
        ),
        // a negative value reaches the setting's own check (not clap's "unexpected argument")
        (
            vec!["--pretrain-steps", "5", "--lr", "-1"],
            "must be positive",
        ),
    ] {
        let mut args = vec!["rl", "--out", out_s, "--quiet"];
        args.extend(extra);
        fails_with(&args, needle);
        assert!(!out.exists(), "{args:?} left {}", out.display());
    }
    let file = tmp.path().join("a-file");
    fs::write(&file, "x").unwrap();
    let args = [
        "rl",
        "--pretrain-steps",
        "5",
        "--out",
        file.to_str().unwrap(),
    ];
    fails_with(&args, "not a directory");
    assert_eq!(fs::read_to_string(&file).unwrap(), "x");
}

/// `trainer rl --resume DIR` takes the run's settings from its checkpoint: a flag that would
/// change them (`--steps`, `--plan`, any RL setting) is refused by name, not ignored.
#[test]
fn rl_resume_refuses_settings_it_would_ignore() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("nothing-yet");
    let run_s = run.to_str().unwrap();
    for (extra, named) in [
        (vec!["--steps", "5"], "drop --steps"),
        (vec!["--plan", "nvfp4", "--lr", "0.1"], "drop --plan, --lr"),
        (vec!["--no-std"], "drop --no-std"),
    ] {
        let mut args = vec!["rl", "--resume", run_s];
        args.extend(extra);
        fails_with(&args, named);
    }
}

//! Crash safety of the real `trainer` binary: a child training process is SIGKILLed at every
//! point of the checkpoint protocol (deterministically: the child pauses at the point through
//! the `NIBBLE_TEST_PAUSE_AT` hook, which is read from the environment and never part of the
//! run's configuration, and the test kills it once it has announced the pause), then the run
//! directory is resumed and must end bit-identical to an uninterrupted run. Also: SIGTERM and
//! SIGINT stop with a checkpoint and a resume command, a second process on a locked run
//! directory is refused with the holder's pid, and `train --out` refuses an existing run
//! unless `--overwrite`.

#![cfg(unix)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use trainer::interrupt::{HOOK_POINTS, MARKER_ENV, PAUSE_ENV};

/// 6 steps, a checkpoint every 2 (so the kills hit the first checkpoint, with nothing before
/// it, and the second, which prunes the first: keep_checkpoints = 1).
const CONFIG: &str = r#"
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
eval_every = 2
eval_batches = 1
keep_checkpoints = 1

[data]
kind = "corpus"
seed = 3
bytes = 20000
"#;

struct Setup {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    config: PathBuf,
}

fn setup() -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    let config = root.join("run.cfg.toml");
    fs::write(&config, CONFIG).unwrap();
    Setup {
        _tmp: tmp,
        root,
        config,
    }
}

fn trainer() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_trainer"));
    c.env_remove(PAUSE_ENV).env_remove(MARKER_ENV);
    c
}

fn train_args(s: &Setup, out: &Path) -> Vec<String> {
    [
        "train",
        "--config",
        s.config.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--quiet",
        "--threads",
        "1",
    ]
    .map(String::from)
    .to_vec()
}

fn run(mut c: Command) -> Output {
    c.output().expect("run trainer")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn resume(dir: &Path) -> Output {
    let mut c = trainer();
    c.args(["train", "--resume", dir.to_str().unwrap(), "--quiet"]);
    c.args(["--threads", "1"]);
    run(c)
}

/// Starts a child that pauses at `point` (its `nth` time) and waits until it says so.
fn paused_child(args: &[String], point: &str, nth: u32, marker: &Path) -> Child {
    let _ = fs::remove_file(marker);
    let mut c = trainer();
    c.args(args)
        .env(PAUSE_ENV, format!("{point}:{nth}"))
        .env(MARKER_ENV, marker)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("spawn trainer");
    let t0 = Instant::now();
    while !marker.exists() {
        if let Some(status) = child.try_wait().unwrap() {
            let o = child.wait_with_output().unwrap();
            panic!(
                "child ended ({status}) before reaching {point}:{nth}: {}",
                text(&o.stderr)
            );
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "{point}:{nth} never reached"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    child
}

/// The files that must be bit-identical between two finished runs, and the losses of every
/// metrics line (throughput differs).
fn final_state(dir: &Path) -> (Vec<Vec<u8>>, Vec<String>) {
    let ck = dir.join("checkpoints/step-00000006");
    let files = ["model.safetensors", "optimizer.bin", "state.json"]
        .iter()
        .map(|f| fs::read(ck.join(f)).unwrap_or_else(|e| panic!("{}: {e}", ck.display())))
        .collect();
    let metrics = fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
    let losses = metrics
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect(l);
            format!(
                "{} {} {} {} {}",
                v["step"], v["train_loss"], v["val_loss"], v["grad_norm"], v["lr"]
            )
        })
        .collect();
    (files, losses)
}

fn assert_clean(dir: &Path) {
    let ck = dir.join("checkpoints");
    let left: Vec<String> = fs::read_dir(&ck)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(left.is_empty(), "leftovers in {}: {left:?}", ck.display());
    assert_eq!(
        fs::read_to_string(ck.join("latest")).unwrap(),
        "step-00000006"
    );
}

fn reference(s: &Setup) -> (Vec<Vec<u8>>, Vec<String>) {
    let out = s.root.join("reference");
    let mut c = trainer();
    c.args(train_args(s, &out));
    let o = run(c);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r = final_state(&out);
    assert_eq!(r.1.len(), 6);
    r
}

#[test]
fn sigkill_at_every_point_of_a_checkpoint_write_resumes_bit_identically() {
    let s = setup();
    let want = reference(&s);
    let marker = s.root.join("marker");
    let points: Vec<&str> = HOOK_POINTS
        .iter()
        .copied()
        .filter(|p| p.starts_with("checkpoint-"))
        .collect();
    assert_eq!(points.len(), 8);
    let mut cases = 0;
    for nth in [1, 2] {
        for point in &points {
            let out = s.root.join(format!("{point}-{nth}"));
            let mut child = paused_child(&train_args(&s, &out), point, nth, &marker);
            child.kill().unwrap(); // SIGKILL
            child.wait().unwrap();
            let o = resume(&out);
            assert!(
                o.status.success(),
                "killed at {point}:{nth}, resume failed: {}",
                text(&o.stderr)
            );
            assert_clean(&out);
            let got = final_state(&out);
            assert_eq!(got.1, want.1, "metrics after a kill at {point}:{nth}");
            assert!(got.0 == want.0, "final state after a kill at {point}:{nth}");
            cases += 1;
        }
    }
    // killed after the final checkpoint, before the summary: the resume writes the summary
    // from the recorded steps (not 0 tokens/s)
    let out = s.root.join("final");
    let mut child = paused_child(&train_args(&s, &out), "checkpoint-pruned", 3, &marker);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!out.join("summary.json").exists());
    let o = resume(&out);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(final_state(&out), want);
    let summary: serde_json::Value =
        serde_json::from_slice(&fs::read(out.join("summary.json")).unwrap()).unwrap();
    let tps = summary["tokens_per_s"].as_f64().unwrap();
    assert!(tps > 0.0 && tps.is_finite(), "{summary}");
    assert_eq!(summary["steps"], 6);
    // and killed between steps, after the second checkpoint
    let out = s.root.join("step-5");
    let mut child = paused_child(&train_args(&s, &out), "step", 5, &marker);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(resume(&out).status.success());
    assert_eq!(final_state(&out), want);
    assert_eq!(cases, 16);
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on the pid of a child this test spawned and has not reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
}

#[test]
fn sigterm_and_sigint_stop_after_the_step_with_a_checkpoint_and_say_how_to_resume() {
    let s = setup();
    let want = reference(&s);
    let marker = s.root.join("marker");
    let out = s.root.join("stopped");
    // SIGTERM while step 3 is being finished (between evaluations): a checkpoint at step 3
    let child = paused_child(&train_args(&s, &out), "step", 3, &marker);
    signal(&child, libc::SIGTERM);
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(130), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(err.contains("stopped at step 3 of 6"), "{err}");
    assert!(
        err.contains(&format!(
            "resume with: trainer train --resume {}",
            out.display()
        )),
        "{err}"
    );
    assert_eq!(
        fs::read_to_string(out.join("checkpoints/latest")).unwrap(),
        "step-00000003"
    );
    // SIGINT (Ctrl-C) in the resumed run, at its second step (step 5)
    let mut args = vec!["train".to_string(), "--resume".into()];
    args.extend([out.to_str().unwrap().into(), "--quiet".into()]);
    args.extend(["--threads".into(), "1".into()]);
    let child = paused_child(&args, "step", 2, &marker);
    signal(&child, libc::SIGINT);
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(130), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("stopped at step 5 of 6"));
    let o = resume(&out);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(final_state(&out), want);
    // resuming the finished run changes nothing
    let summary = fs::read(out.join("summary.json")).unwrap();
    let o = resume(&out);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains("already finished"),
        "{}",
        text(&o.stdout)
    );
    assert_eq!(fs::read(out.join("summary.json")).unwrap(), summary);
}

#[test]
fn a_second_process_on_a_run_directory_is_refused_with_the_holder() {
    let s = setup();
    let marker = s.root.join("marker");
    let out = s.root.join("locked");
    let mut child = paused_child(&train_args(&s, &out), "step", 3, &marker);
    let o = resume(&out);
    let err = text(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("is in use by another process"), "{err}");
    assert!(err.contains(&format!("pid {}", child.id())), "{err}");
    let mut again = trainer();
    again.args(train_args(&s, &out)).arg("--overwrite");
    let o = run(again);
    assert!(text(&o.stderr).contains("in use by another process"));
    child.kill().unwrap();
    child.wait().unwrap();
    // the lock died with its holder
    let o = resume(&out);
    assert!(o.status.success(), "{}", text(&o.stderr));
}

#[test]
fn train_out_refuses_an_existing_run_unless_overwrite() {
    let s = setup();
    let out = s.root.join("run");
    let mut c = trainer();
    c.args(train_args(&s, &out));
    assert!(run(c).status.success());
    let before = final_state(&out);
    let mut c = trainer();
    c.args(train_args(&s, &out)).args(["--seed", "7"]);
    let o = run(c);
    let err = text(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("already holds a run") && err.contains("--overwrite"),
        "{err}"
    );
    assert!(err.contains("trainer train --resume"), "{err}");
    assert_eq!(final_state(&out), before, "the old run is untouched");
    let mut c = trainer();
    c.args(train_args(&s, &out))
        .args(["--seed", "7", "--overwrite"]);
    let o = run(c);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let after = final_state(&out);
    assert_ne!(after.0[0], before.0[0], "a new seed trained");
    // the checkpoints are the new run's only
    let steps: Vec<String> = fs::read_dir(out.join("checkpoints"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("step-"))
        .collect();
    assert_eq!(steps, ["step-00000006"]);
    let state = fs::read_to_string(out.join("checkpoints/step-00000006/state.json")).unwrap();
    assert!(state.contains("\"seed\": 7"), "{state}");
}

#[test]
fn a_second_comparison_into_the_same_folder_is_refused() {
    let s = setup();
    let marker = s.root.join("marker");
    let out = s.root.join("cmp");
    let args: Vec<String> = [
        "compare",
        "--config",
        s.config.to_str().unwrap(),
        "--recipes",
        "bf16",
        "--out",
        out.to_str().unwrap(),
        "--quiet",
        "--threads",
        "1",
    ]
    .map(String::from)
    .to_vec();
    let mut child = paused_child(&args, "step", 1, &marker);
    let mut c = trainer();
    c.args(&args);
    let o = run(c);
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(
        err.contains("in use by another process") && err.contains(&format!("pid {}", child.id())),
        "{err}"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    // the killed comparison continues where it was
    let mut c = trainer();
    c.args(&args);
    let o = run(c);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains("continuing the interrupted run"),
        "{}",
        text(&o.stdout)
    );
    assert!(out.join("report.md").is_file());
}

/// The same kills with FP8 delayed scaling (amax histories in `state.json`) and gradient
/// accumulation: the second checkpoint write at every point.
#[test]
fn sigkill_with_fp8_delayed_scaling_and_accumulation_resumes_bit_identically() {
    let s = setup();
    fs::write(
        &s.config,
        CONFIG.replace("batch = 2", "batch = 2\ngrad_accum = 2"),
    )
    .unwrap();
    let args = |out: &Path| {
        let mut a = train_args(&s, out);
        a.extend(["--recipe".into(), "fp8-delayed".into()]);
        a
    };
    let reference = s.root.join("reference");
    let mut c = trainer();
    c.args(args(&reference));
    let o = run(c);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let want = final_state(&reference);
    let state = String::from_utf8(want.0[2].clone()).unwrap();
    assert!(state.contains("amax_history"), "quantizer states are saved");
    let marker = s.root.join("marker");
    for point in HOOK_POINTS.iter().filter(|p| p.starts_with("checkpoint-")) {
        let out = s.root.join(point);
        let mut child = paused_child(&args(&out), point, 2, &marker);
        child.kill().unwrap();
        child.wait().unwrap();
        let o = resume(&out);
        assert!(o.status.success(), "{point}: {}", text(&o.stderr));
        assert_clean(&out);
        assert!(
            final_state(&out) == want,
            "final state after a kill at {point}:2"
        );
    }
}

/// `trainer rl compare` passes SIGTERM on to its runs: each saves a checkpoint and exits,
/// the command says how to continue, and no run outlives it (the runs went on as orphans
/// when a signal ended the grid's process); the same command then resumes them.
#[test]
fn sigterm_stops_an_rl_grid_with_its_runs() {
    let s = setup();
    let pre = s.root.join("pre");
    let o = trainer()
        .args([
            "train", "--preset", "tiny", "--steps", "2", "--quiet", "--out",
        ])
        .arg(&pre)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let grid = s.root.join("grid");
    let mut args: Vec<String> = ["rl", "compare", "--plans", "bf16", "--seeds", "2"]
        .map(String::from)
        .to_vec();
    args.extend(
        [
            "--jobs",
            "2",
            "--prompts",
            "2",
            "--group",
            "2",
            "--steps",
            "300",
        ]
        .map(String::from),
    );
    args.extend(["--eval-prompts", "2", "--eval-every", "1"].map(String::from));
    args.extend(["--from".into(), pre.to_str().unwrap().into()]);
    args.extend(["--out".into(), grid.to_str().unwrap().into()]);
    let run_dir = |seed: u32| grid.join("bf16-none").join(format!("seed{seed}"));
    let child = trainer()
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // both runs have checkpointed a step
    let t0 = Instant::now();
    while !(0..2).all(|s| run_dir(s).join("checkpoints/latest").is_file()) {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the runs never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(&child, libc::SIGTERM);
    let o = child.wait_with_output().unwrap();
    let err = text(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("run the same `trainer rl compare` command again"),
        "{err}"
    );
    for seed in 0..2 {
        // each run stopped on the forwarded signal with a checkpoint, and had exited when the
        // grid's process did (that process waits for its runs)
        let log = fs::read_to_string(run_dir(seed).with_extension("log")).unwrap();
        assert!(log.contains("stopped at step"), "{log}");
        assert!(run_dir(seed).join("checkpoints/latest").is_file());
    }
    assert!(!grid.join("report.md").exists());
    // the same command continues each run from its checkpoint to the end
    let o = trainer().args(&args).output().unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(grid.join("report.md").is_file());
    for seed in 0..2 {
        let log = fs::read_to_string(run_dir(seed).with_extension("log")).unwrap();
        assert_eq!(log.matches("stopped at step").count(), 1, "{log}");
        assert!(log.contains("held-out pass rate"), "{log}");
    }
}

/// `trainer rl --pretrain-steps N` stopped during its pretraining is continued by the same
/// command (it said "already holds a run" before, and only `trainer train --resume` went on);
/// a pretraining, stopped or finished, is not continued or reused for a command that asks for
/// another one (a finished one was reused whatever the command asked).
#[test]
fn a_stopped_rl_pretraining_continues_with_the_same_command() {
    let s = setup();
    let out = s.root.join("rl");
    let mut args: Vec<String> = ["rl", "--preset", "tiny", "--pretrain-steps", "8", "--quiet"]
        .map(String::from)
        .to_vec();
    args.extend(["--steps", "1", "--prompts", "2", "--group", "2"].map(String::from));
    args.extend(["--eval-prompts", "2", "--out"].map(String::from));
    args.push(out.to_str().unwrap().into());
    let marker = s.root.join("marker");
    let child = paused_child(&args, "step", 3, &marker);
    signal(&child, libc::SIGTERM);
    let o = child.wait_with_output().unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(130), "{err}");
    assert!(
        err.contains("the same `trainer rl` command continues"),
        "{err}"
    );
    // a different step count is refused, naming the one to pass
    let mut other = args.clone();
    other[4] = "9".into();
    let o = trainer().args(&other).output().unwrap();
    assert!(!o.status.success());
    let refused = "holds another pretraining: 8 steps (--pretrain-steps 9)";
    assert!(text(&o.stderr).contains(refused), "{}", text(&o.stderr));
    let o = trainer().args(&args).output().unwrap();
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("continuing the pretraining"), "{err}");
    assert!(err.contains("at step 3"), "{err}");
    assert!(out.join("pretrain/summary.json").is_file());
    assert!(out.join("summary.json").is_file());
    // a finished pretraining is not reused for a command that asks for another one
    let o = trainer().args(&other).output().unwrap();
    assert!(!o.status.success());
    assert!(text(&o.stderr).contains(refused), "{}", text(&o.stderr));
}

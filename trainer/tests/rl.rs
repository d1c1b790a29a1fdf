//! `trainer rl`: bitwise resume of a tiny RL run, the guard on NaN rewards, bad input.

mod common;

use std::path::{Path, PathBuf};

use trainer::data::{DataSource, ShardFormat};
use trainer::model::ModelConfig;
use trainer::recipe::Recipe;
use trainer::rl::config::{RlConfig, RlError};
use trainer::rl::plan::Plan;
use trainer::rl::run::{RlOptions, RlRun};
use trainer::rl::tasks::Task;
use trainer::train::{RunConfig, Trainer};

/// A tiny model pretrained on the add mix: as text (byte-level; 600 steps at lr 3e-3, enough
/// for a few of the tiny RL batch's completions to pass, so the policy-gradient steps are
/// not all zero), or as a raw token shard with a vocabulary of `vocab` (not byte-level; 6
/// steps, for the refusals).
fn pretrained(dir: &Path, vocab: usize) -> PathBuf {
    let text = Task::Add.mix(0, 2000, 20_000);
    let mut cfg = RunConfig::preset("tiny").unwrap();
    cfg.model = ModelConfig { vocab, ..cfg.model };
    let data = if vocab == 256 {
        let mix = dir.join("mix.txt");
        std::fs::write(&mix, text).unwrap();
        DataSource::Text { path: mix }
    } else {
        let shard = dir.join("mix.bin");
        let bytes: Vec<u8> = text
            .bytes()
            .flat_map(|b| (b as u16 + 1).to_le_bytes())
            .collect();
        std::fs::write(&shard, bytes).unwrap();
        DataSource::Shard {
            path: shard,
            format: ShardFormat::Raw,
            vocab_size: vocab as u32,
        }
    };
    cfg.train.steps = if vocab == 256 { 1000 } else { 6 };
    cfg.train.lr = 3e-3;
    cfg.train.warmup_steps = 2;
    cfg.train.eval_every = cfg.train.steps;
    cfg.train.eval_batches = 1;
    cfg.data = data;
    let out = dir.join("pre");
    let mut t = Trainer::new(cfg, Recipe::builtin("bf16").unwrap(), common::opts(&out)).unwrap();
    t.run().unwrap();
    out
}

fn tiny_cfg() -> RlConfig {
    common::tiny_rl_config(4, 2)
}

use common::quiet_rl as quiet;

/// metrics.jsonl without the timing fields.
fn metrics_without_timing(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            let o = v.as_object_mut().unwrap();
            for k in ["seconds", "sampler_tokens_per_s", "trainer_tokens_per_s"] {
                o.remove(k);
            }
            v
        })
        .collect()
}

fn final_tensors(dir: &Path) -> Vec<u8> {
    std::fs::read(dir.join("checkpoints/step-00000004/model.safetensors")).unwrap()
}

#[test]
fn rl_run_resumes_bit_for_bit_and_stops_on_nan_rewards() {
    let tmp = tempfile::tempdir().unwrap();
    let from = pretrained(tmp.path(), 256);
    let plan = Plan::builtin("bf16-nvfp4").unwrap();

    let a = tmp.path().join("a");
    let mut run = RlRun::new(tiny_cfg(), plan.clone(), &from, &a, quiet()).unwrap();
    let sa = run.run().unwrap();
    drop(run);
    assert_eq!(sa.steps, 4);
    assert!(
        sa.frac_bitwise_different > 0.0,
        "an NVFP4 sampler differs from a BF16 trainer"
    );
    let load = |p: &Path| trainer::any_checkpoint::AnyCheckpoint::load(p).unwrap();
    assert!(
        !same_tensors(load(&a).tensors(), load(&from).tensors()),
        "some completions passed: the policy moved, so resume has real state to restore"
    );

    // the same run stopped after 2 steps (a checkpoint), then resumed
    let b = tmp.path().join("b");
    let opts = RlOptions {
        stop_after: Some(1),
        ..quiet()
    };
    let mut run = RlRun::new(tiny_cfg(), plan.clone(), &from, &b, opts).unwrap();
    assert!(run.run().unwrap_err().to_string().contains("resume with"));
    drop(run);
    let mut run = RlRun::resume(&b, quiet()).unwrap();
    assert_eq!(run.step(), 1);
    let sb = run.run().unwrap();
    drop(run);
    assert_eq!(final_tensors(&a), final_tensors(&b));
    assert_eq!(metrics_without_timing(&a), metrics_without_timing(&b));
    assert_eq!(
        std::fs::read_to_string(a.join("eval.jsonl")).unwrap(),
        std::fs::read_to_string(b.join("eval.jsonl")).unwrap()
    );
    assert_eq!(sa.final_pass_rate, sb.final_pass_rate);

    // a NaN reward at step 3 stops the run with a diagnosis; step 2's checkpoint stays
    let c = tmp.path().join("c");
    let opts = RlOptions {
        nan_reward_at: Some(3),
        ..quiet()
    };
    let mut run = RlRun::new(tiny_cfg(), plan.clone(), &from, &c, opts).unwrap();
    let err = run.run().unwrap_err();
    drop(run);
    assert!(matches!(err, RlError::Diverged { step: 3, .. }), "{err}");
    assert!(err.to_string().contains("step-00000002"), "{err}");
    let diag = std::fs::read_to_string(c.join("diagnosis.txt")).unwrap();
    assert!(diag.contains("reward of rollout 0 is NaN"), "{diag}");
    // ... and the run continues from it (without the injected NaN) to the same end
    let mut run = RlRun::resume(&c, quiet()).unwrap();
    run.run().unwrap();
    drop(run);
    assert_eq!(final_tensors(&a), final_tensors(&c));

    // a broken sampler at step 3 (its log-probabilities 3 nats low, k3 about 16): the
    // mismatch guard stops the run before step 3 is recorded; step 2's checkpoint stays
    let d = tmp.path().join("d");
    let opts = RlOptions {
        sampler_fault_at: Some(3),
        ..quiet()
    };
    let mut run = RlRun::new(tiny_cfg(), plan, &from, &d, opts).unwrap();
    let err = run.run().unwrap_err();
    drop(run);
    assert!(matches!(err, RlError::Diverged { step: 3, .. }), "{err}");
    assert!(err.to_string().contains("step-00000002"), "{err}");
    let diag = std::fs::read_to_string(d.join("diagnosis.txt")).unwrap();
    assert!(diag.contains("mismatch spiked: k3 KL estimate"), "{diag}");
    assert!(!d.join("checkpoints/step-00000003").exists());
    assert_eq!(metrics_without_timing(&d).len(), 2);
    let mut run = RlRun::resume(&d, quiet()).unwrap();
    run.run().unwrap();
    drop(run);
    assert_eq!(final_tensors(&a), final_tensors(&d));
}

#[test]
fn bad_input_is_refused_before_anything_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let from = pretrained(tmp.path(), 256);
    let plan = Plan::builtin("bf16").unwrap();
    let out = tmp.path().join("x");
    let err = |cfg: RlConfig, from: &Path| {
        RlRun::new(cfg, plan.clone(), from, &out, quiet())
            .err()
            .expect("refused")
            .to_string()
    };
    let e = err(
        RlConfig {
            group: 1,
            ..tiny_cfg()
        },
        &from,
    );
    assert!(e.contains("at least 2"), "{e}");
    let e = err(
        RlConfig {
            max_tokens: 40,
            ..tiny_cfg()
        },
        &from,
    );
    assert!(e.contains("context of 32"), "{e}");
    assert!(!out.join("rl.toml").exists());
    // a model trained on bare token ids: no tokenizer to encode the prompts with
    let other = tempfile::tempdir().unwrap();
    let from_ids = pretrained(other.path(), 512);
    let e = err(tiny_cfg(), &from_ids);
    assert!(e.contains("no tokenizer was found"), "{e}");
    // an existing run is not overwritten
    let mut run = RlRun::new(
        RlConfig {
            steps: 1,
            ..tiny_cfg()
        },
        plan.clone(),
        &from,
        &out,
        quiet(),
    )
    .unwrap();
    run.run().unwrap();
    drop(run);
    let e = err(tiny_cfg(), &from);
    assert!(e.contains("already holds an RL run"), "{e}");

    // the command line: unknown plan, task, correction and settings fields list what is valid
    let f = from.display().to_string();
    let o = tmp.path().join("cli").display().to_string();
    for (args, want) in [
        (vec!["--plan", "nvfp5"], "valid: bf16, bf16-mxfp8"),
        (vec!["--task", "sort"], "valid: add, reverse"),
        (vec!["--correction", "tis"], "valid: none, token-tis"),
        (vec!["--group", "1"], "at least 2"),
        (
            vec!["--guard-collapse", "1.5"],
            "guard_collapse (1.5) must be in [0, 1)",
        ),
    ] {
        let mut a = vec!["rl", "--from", &f, "--out", &o, "--quiet"];
        a.extend(args);
        let r = common::trainer(&a);
        assert!(!r.status.success());
        assert!(common::stderr(&r).contains(want), "{}", common::stderr(&r));
    }
    let bad = tmp.path().join("bad.toml");
    std::fs::write(&bad, "stepz = 3\n").unwrap();
    let r = common::trainer(&[
        "rl",
        "--from",
        &f,
        "--out",
        &o,
        "--config",
        bad.to_str().unwrap(),
    ]);
    assert!(
        common::stderr(&r).contains("unknown field `stepz`"),
        "{}",
        common::stderr(&r)
    );
    let r = common::trainer(&["plans", "show", "bf16-nvfp4"]);
    assert!(common::stdout(&r).contains("activation-scales = \"static\""));
    let r = common::trainer(&["plans"]);
    assert!(common::stdout(&r).contains("mxfp8-nvfp4"));
}

/// Whether two parameter lists hold the same tensors bit for bit, in any order (without
/// printing them when they do not).
fn same_tensors(a: &[autograd::NamedTensor], b: &[autograd::NamedTensor]) -> bool {
    a.len() == b.len()
        && a.iter().all(|t| {
            b.iter().any(|u| {
                u.name == t.name
                    && u.shape == t.shape
                    && u.data
                        .iter()
                        .map(|x| x.to_bits())
                        .eq(t.data.iter().map(|x| x.to_bits()))
            })
        })
}

#[test]
fn an_rl_checkpoint_samples_exports_and_starts_another_rl_run() {
    use trainer::any_checkpoint::AnyCheckpoint;
    let tmp = tempfile::tempdir().unwrap();
    let from = pretrained(tmp.path(), 256);
    let plan = Plan::builtin("bf16").unwrap();
    // 16 prompts x 4 completions a step: enough that some group has both a solved and an
    // unsolved completion (all-equal rewards have no advantage, so no update)
    let cfg = RlConfig {
        prompts: 16,
        ..common::tiny_rl_config(2, 2)
    };
    let out = tmp.path().join("rl");
    let mut run = RlRun::new(cfg.clone(), plan.clone(), &from, &out, quiet()).unwrap();
    let summary = run.run().unwrap();
    let policy = run.params().export();
    drop(run);

    // the RL run directory resolves to its latest checkpoint: the policy after 2 steps
    let ck = AnyCheckpoint::load(&out).unwrap();
    assert_eq!((ck.step(), ck.trained_by().as_str()), (2, "rl:bf16"));
    assert!(same_tensors(ck.tensors(), &policy));
    assert!(!same_tensors(
        AnyCheckpoint::load(&from).unwrap().tensors(),
        &policy
    ));
    // so does a path to either kind's `checkpoints/latest` file
    for run in [&out, &from] {
        let by_file = AnyCheckpoint::load(&run.join("checkpoints/latest")).unwrap();
        assert_eq!(by_file.dir(), AnyCheckpoint::load(run).unwrap().dir());
    }

    // `trainer sample` reads it (byte-level: the RL run keeps no tokenizer.json)
    let args = [
        "sample",
        out.to_str().unwrap(),
        "--device",
        "cpu",
        "--prompt",
        "\n4+5=",
    ];
    let o = common::trainer(&[&args[..], &["--tokens", "3", "--temperature", "0"]].concat());
    assert!(o.status.success(), "{}", common::stderr(&o));

    // `trainer export` writes it as a Hugging Face folder that imports back to the policy
    let hf = tmp.path().join("hf");
    let report = trainer::hf::export(&out, &hf, &Default::default()).unwrap();
    assert!(
        report.files.iter().any(|f| f == "model.safetensors"),
        "{:?}",
        report.files
    );
    let (model, tensors) = trainer::hf::load_hf(&hf).unwrap();
    assert_eq!(&model, ck.model());
    assert!(same_tensors(&tensors, &policy));
    // an NVFP4 export calibrated on the data of the checkpoint RL started from; an error
    // naming that checkpoint once it is gone
    use fp_formats::checkpoint::{Layout, Scheme};
    let calibrated = trainer::hf::ExportOptions {
        quantize: Some((Scheme::Nvfp4, Layout::ModelOpt)),
        calibrate: Some(1),
        ..Default::default()
    };
    let report = trainer::hf::export(&out, &tmp.path().join("q"), &calibrated).unwrap();
    assert!(report.quantized > 0);
    let moved = tmp.path().join("pre-moved");
    std::fs::rename(&from, &moved).unwrap();
    let err = trainer::hf::export(&out, &tmp.path().join("q2"), &calibrated).unwrap_err();
    assert!(
        err.to_string().contains("the checkpoint RL started from"),
        "{err}"
    );
    std::fs::rename(&moved, &from).unwrap();

    // a second RL run starts from the RL-tuned policy: its held-out pass rate before the
    // first step is the first run's after its last
    let out2 = tmp.path().join("rl2");
    let run2 = RlRun::new(cfg, plan, &out, &out2, quiet()).unwrap();
    drop(run2);
    let first: serde_json::Value = serde_json::from_str(
        std::fs::read_to_string(out2.join("eval.jsonl"))
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        first["pass_rate"].as_f64().unwrap(),
        summary.final_pass_rate
    );
}

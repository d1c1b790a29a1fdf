//! RL through a BPE tokenizer: task prompts encode and decode back, rewards of hand-written
//! completions decoded through the tokenizer, a tiny `trainer rl` run (and its bitwise
//! resume) from a BPE-tokenized checkpoint, `--pretrain-steps` on a BPE-encoded mix, and the
//! tokenizers and checkpoints that cannot express the task.

mod common;

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use trainer::data::Tokenizer;
use trainer::model::ModelConfig;
use trainer::recipe::Recipe;
use trainer::rl::codec::TaskCodec;
use trainer::rl::config::RlConfig;
use trainer::rl::mix::{pretrain_data, MixTokenizer};
use trainer::rl::plan::Plan;
use trainer::rl::run::{RlOptions, RlRun};
use trainer::rl::tasks::{Example, Split, Task};
use trainer::train::{RunConfig, Trainer};

/// A BPE of `vocab` tokens trained on the add mix (the way `--pretrain-steps --bpe-vocab`
/// does), with the mix as a tokenized folder.
fn bpe_mix(dir: &Path, vocab: u32) -> (trainer::data::DataSource, Tokenizer) {
    pretrain_data(Task::Add, 0, 2000, 20_000, dir, &MixTokenizer::Train(vocab)).unwrap()
}

fn ex(prompt: &str, answer: &str) -> Example {
    Example {
        prompt: prompt.into(),
        answer: answer.into(),
    }
}

#[test]
fn prompts_round_trip_and_rewards_decode_through_a_bpe() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, tok) = bpe_mix(tmp.path(), 320);
    assert!(!tok.is_bytes());
    let codec = TaskCodec::new(tok.clone(), 330).unwrap();
    assert_eq!(tok.encode("\n").unwrap(), vec![codec.stop()]);
    for task in [Task::Add, Task::Reverse] {
        let examples = task.examples(7, Split::HeldOut, 100);
        codec.check(task, &examples).unwrap();
        let (mut tokens, mut bytes) = (0, 0);
        for e in &examples {
            let p = codec.prompt(e).unwrap();
            assert_eq!(tok.decode(&p).unwrap(), e.prompt);
            let full = codec.sequence(e).unwrap();
            assert!(full.starts_with(&p), "{e:?}: {p:?} {full:?}");
            assert_eq!(codec.reward(task, e, &full[p.len()..]), 1.0, "{e:?}");
            tokens += p.len();
            bytes += e.prompt.len();
        }
        if task == Task::Add {
            // the BPE was trained on the add mix: its prompts take fewer tokens than bytes
            assert!(tokens < bytes, "{tokens} tokens for {bytes} bytes");
        }
    }
    let e = ex("\n47+8=", "55");
    let enc = |s: &str| tok.encode(s).unwrap();
    let r = |ids: &[u32]| codec.reward(Task::Add, &e, ids);
    assert_eq!(r(&enc("55\n")), 1.0);
    // another segmentation of the same text earns the reward too
    let five = enc("5");
    assert_eq!(five.len(), 1);
    assert_eq!(r(&[five[0], five[0], codec.stop()]), 1.0);
    assert_eq!(r(&enc("55")), 0.0, "never stopped");
    assert_eq!(r(&enc("550\n")), 0.0);
    assert_eq!(r(&enc("5\n")), 0.0);
    assert_eq!(r(&enc("55\n\n")), 0.0);
    assert_eq!(r(&[]), 0.0);
    // an id the model has but the tokenizer does not has no text: no reward
    assert_eq!(r(&[five[0], five[0], 325, codec.stop()]), 0.0);
    assert_eq!(r(&[325]), 0.0);
}

/// The byte-level vocabulary as a `tokenizer.json` (no pre-tokenization regex), edited.
fn byte_json(edit: impl FnOnce(&mut Value)) -> Tokenizer {
    let mut v = trainer::hf::byte_tokenizer_json();
    edit(&mut v);
    Tokenizer::from_json(&v.to_string(), "test").unwrap()
}

#[test]
fn tokenizers_that_cannot_express_the_task_are_refused() {
    let add = [ex("\n7+5=", "12")];
    // more tokens than the model
    let t = byte_json(|_| {});
    let e = TaskCodec::new(t.clone(), 200).unwrap_err().to_string();
    assert!(
        e.contains("more tokens than the model's vocabulary (200)"),
        "{e}"
    );
    TaskCodec::new(t, 256)
        .unwrap()
        .check(Task::Add, &add)
        .unwrap();
    // no token for the stop `\n` (its byte symbol renamed)
    let t = byte_json(|v| {
        let vocab = v["model"]["vocab"].as_object_mut().unwrap();
        let id = vocab.remove("Ċ").unwrap();
        vocab.insert("ĊĊ".into(), id);
    });
    let e = TaskCodec::new(t, 256).unwrap_err().to_string();
    assert!(e.contains("no single token for the stop"), "{e}");
    // a merge across the end of the prompt: `=1` is one token in `=12`
    let t = byte_json(|v| {
        v["model"]["vocab"]
            .as_object_mut()
            .unwrap()
            .insert("=1".into(), json!(256));
        v["model"]["merges"] = json!(["= 1"]);
    });
    let c = TaskCodec::new(t, 257).unwrap();
    let e = c.check(Task::Add, &add).unwrap_err().to_string();
    assert!(e.contains("not a prefix"), "{e}");
    assert!(e.contains("cannot express the task add"), "{e}");
    // ... which is harmless when no answer starts with 1
    c.check(Task::Add, &[ex("\n7+2=", "9")]).unwrap();
}

fn tiny_cfg() -> RlConfig {
    common::tiny_rl_config(2, 1)
}

use common::quiet_rl as quiet;

fn pretrain(dir: &Path) -> (PathBuf, Tokenizer) {
    let (data, tok) = bpe_mix(dir, 320);
    let mut cfg = RunConfig::preset("tiny").unwrap();
    cfg.model = ModelConfig {
        vocab: tok.vocab_size() as usize,
        ..cfg.model
    };
    cfg.train.steps = 6;
    cfg.train.warmup_steps = 2;
    cfg.train.eval_every = 6;
    cfg.train.eval_batches = 1;
    cfg.data = data;
    let out = dir.join("pre");
    let mut t = Trainer::new(cfg, Recipe::builtin("bf16").unwrap(), common::opts(&out)).unwrap();
    t.run().unwrap();
    (out, tok)
}

#[test]
fn rl_from_a_bpe_checkpoint_runs_resumes_and_refuses_a_mismatched_tokenizer() {
    let tmp = tempfile::tempdir().unwrap();
    let (from, tok) = pretrain(tmp.path());
    assert_eq!(
        std::fs::read_to_string(from.join("tokenizer.json")).unwrap(),
        tok.to_json()
    );
    let plan = Plan::builtin("bf16-nvfp4").unwrap();
    let a = tmp.path().join("a");
    let mut run = RlRun::new(tiny_cfg(), plan.clone(), &from, &a, quiet()).unwrap();
    let sa = run.run().unwrap();
    drop(run);
    assert_eq!(sa.steps, 2);
    assert!(sa.final_pass_rate.is_finite());
    // the run keeps its tokenizer, so a resume encodes the same way
    assert_eq!(
        std::fs::read_to_string(a.join("tokenizer.json")).unwrap(),
        tok.to_json()
    );
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(a.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    // responses are counted in BPE tokens: at most the task's answer bytes + stop
    for l in &lines {
        let len = l["response_len"].as_f64().unwrap();
        assert!((1.0..=4.0).contains(&len), "{l}");
    }

    let b = tmp.path().join("b");
    let opts = RlOptions {
        stop_after: Some(1),
        ..quiet()
    };
    let mut run = RlRun::new(tiny_cfg(), plan.clone(), &from, &b, opts).unwrap();
    assert!(run.run().is_err());
    drop(run);
    let mut run = RlRun::resume(&b, quiet()).unwrap();
    run.run().unwrap();
    drop(run);
    let last = |d: &Path| std::fs::read(d.join("checkpoints/step-00000002/model.safetensors"));
    assert_eq!(last(&a).unwrap(), last(&b).unwrap());

    // the checkpoint's tokenizer replaced by a larger one than the model's vocabulary
    let other = tempfile::tempdir().unwrap();
    let (_, big) = bpe_mix(other.path(), 400);
    std::fs::write(from.join("tokenizer.json"), big.to_json()).unwrap();
    let e = RlRun::new(tiny_cfg(), plan, &from, &tmp.path().join("c"), quiet())
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("more tokens than the model's vocabulary (320)"),
        "{e}"
    );
    assert!(!tmp.path().join("c/rl.toml").exists());
}

#[test]
fn rl_pretrain_steps_encodes_the_mix_with_a_bpe() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let o = out.to_str().unwrap();
    let r = common::trainer(&[
        "rl",
        "--pretrain-steps",
        "2",
        "--preset",
        "tiny",
        "--bpe-vocab",
        "300",
        "--steps",
        "1",
        "--prompts",
        "2",
        "--group",
        "2",
        "--eval-prompts",
        "4",
        "--out",
        o,
        "--quiet",
    ]);
    let err = common::stderr(&r);
    assert!(r.status.success(), "{err}");
    assert!(err.contains("model vocabulary 256 -> 300"), "{err}");
    assert!(common::stdout(&r).contains("held-out pass rate"));
    let tok = Tokenizer::from_file(&out.join("pretrain-data/tokenizer.json")).unwrap();
    assert_eq!(tok.vocab_size(), 300);
    assert_eq!(
        std::fs::read_to_string(out.join("tokenizer.json")).unwrap(),
        tok.to_json()
    );
    let ck = trainer::checkpoint::load(&out.join("pretrain")).unwrap();
    assert_eq!(ck.state.model.vocab, 300);
    // a tokenizer without a run to pretrain is refused by the command line
    let r = common::trainer(&["rl", "--from", o, "--bpe-vocab", "300", "--out", o]);
    assert!(!r.status.success());
    assert!(
        common::stderr(&r).contains("--pretrain-steps"),
        "{}",
        common::stderr(&r)
    );
}

//! `trainer sample`'s generation settings: top-p reaches the sampler (a tiny top-p is greedy
//! decoding), stop tokens end generation, `--max-new-tokens` is `--tokens`, and out-of-range
//! values are refused.

mod common;
use common::{stderr, stdout, trainer};

use std::path::{Path, PathBuf};

use trainer::recipe::Recipe;
use trainer::sample::{SampleConfig, Sampler};
use trainer::train::{RunConfig, Trainer};

fn tiny_run(dir: &Path) -> PathBuf {
    let mut cfg = RunConfig::preset("tiny").unwrap();
    cfg.train.steps = 3;
    cfg.train.warmup_steps = 1;
    cfg.train.eval_every = 3;
    cfg.train.eval_batches = 1;
    let out = dir.join("run");
    Trainer::new(cfg, Recipe::builtin("bf16").unwrap(), common::opts(&out))
        .unwrap()
        .run()
        .unwrap();
    out
}

fn ok(args: &[&str]) -> String {
    let o = trainer(args);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    stdout(&o)
}

fn fails(args: &[&str], want: &str) {
    let o = trainer(args);
    assert!(!o.status.success(), "{args:?} succeeded");
    assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
}

#[test]
fn sample_flags_reach_the_sampler_and_are_validated() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tiny_run(tmp.path());
    let r = run.to_str().unwrap();
    let base = ["sample", r, "--ids", "--prompt", "The fox", "--seed", "5"];
    let with = |extra: &[&str]| -> Vec<u32> {
        let mut a = base.to_vec();
        a.extend_from_slice(extra);
        ok(&a)
            .split_whitespace()
            .map(|t| t.parse().unwrap())
            .collect()
    };
    // a top-p below any token's probability keeps only the most likely one: greedy
    let greedy = with(&["--tokens", "12", "--temperature", "0"]);
    let nucleus = with(&["--tokens", "12", "--temperature", "1", "--top-p", "1e-6"]);
    assert_eq!(greedy.len(), 7 + 12);
    assert_eq!(nucleus, greedy);
    // --max-new-tokens is --tokens; top-p sampling is seeded
    let a = with(&[
        "--max-new-tokens",
        "12",
        "--temperature",
        "1",
        "--top-p",
        "0.9",
    ]);
    assert_eq!(a.len(), 7 + 12);
    assert_eq!(
        a,
        with(&["--tokens", "12", "--temperature", "1", "--top-p", "0.9"])
    );
    // a stop token ends generation after it (here: the first token greedy decoding picks)
    let first = greedy[7];
    let stop = char::from_u32(first).unwrap().to_string();
    let stopped = with(&["--tokens", "12", "--temperature", "0", "--stop", &stop]);
    assert_eq!(stopped, greedy[..8]);

    for (extra, want) in [
        (&["--top-p", "0"][..], "top-p 0 must be in (0, 1]"),
        (&["--top-p", "1.5"], "top-p 1.5 must be in (0, 1]"),
        (&["--top-p", "NaN"], "top-p NaN must be in (0, 1]"),
        (
            &["--temperature=-1"],
            "temperature -1 must be finite and >= 0",
        ),
        (&["--tokens", "2000000"], "at most 1000000"),
        (&["--stop", "ab"], "a stop must be one token"),
        (&["--stop", ""], "a stop must be one token"),
    ] {
        let mut a = base.to_vec();
        a.extend_from_slice(extra);
        fails(&a, want);
    }
}

#[test]
fn stop_tokens_end_generation_in_the_library() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tiny_run(tmp.path());
    let mut s = Sampler::load(&run, Recipe::builtin("bf16").unwrap()).unwrap();
    let prompt: Vec<u32> = b"Once".iter().map(|&b| b as u32).collect();
    let cfg = SampleConfig {
        tokens: 40,
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        stop: vec![],
        seed: 1,
    };
    let free = s.generate(&prompt, &cfg).unwrap();
    assert_eq!(free.len(), 40);
    // every token stops: one token, the same one as without stops (same stream)
    let all = SampleConfig {
        stop: (0..256).collect(),
        ..cfg.clone()
    };
    assert_eq!(s.generate(&prompt, &all).unwrap(), free[..1]);
    // the 5th token as the only stop: generation ends at its first occurrence
    let t = free[4];
    let end = free.iter().position(|&x| x == t).unwrap();
    let one = SampleConfig {
        stop: vec![t],
        ..cfg.clone()
    };
    assert_eq!(s.generate(&prompt, &one).unwrap(), free[..=end]);
    let bad = SampleConfig {
        stop: vec![256],
        ..cfg
    };
    let e = s.generate(&prompt, &bad).unwrap_err().to_string();
    assert!(
        e.contains("stop token 256 is outside the vocabulary (256)"),
        "{e}"
    );
}

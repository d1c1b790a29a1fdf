//! Tests of the `trainer` binary.

mod common;
use common::{stderr, stdout, trainer};

use trainer::recipe::{Recipe, BUILTIN_NAMES};

#[test]
fn recipes_lists_every_builtin_with_a_description() {
    for args in [&["recipes"][..], &["recipes", "list"]] {
        let o = trainer(args);
        assert!(o.status.success(), "{}", stderr(&o));
        let out = stdout(&o);
        for name in BUILTIN_NAMES {
            let line = out
                .lines()
                .find(|l| l.split_whitespace().next() == Some(name))
                .expect(name);
            assert!(line.len() > name.len() + 10, "{line}");
        }
    }
}

#[test]
fn recipes_show_prints_parsable_toml() {
    for name in BUILTIN_NAMES {
        let o = trainer(&["recipes", "show", name]);
        assert!(o.status.success(), "{}", stderr(&o));
        let r = Recipe::from_toml_str(&stdout(&o)).unwrap();
        assert_eq!(r, Recipe::builtin(name).unwrap());
    }
    // With a plan: still TOML (the plan is comments).
    let o = trainer(&[
        "recipes",
        "show",
        "nvfp4",
        "--plan",
        "4",
        "--progress",
        "0.5",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("# block   1 mlp-up"), "{out}");
    assert_eq!(Recipe::from_toml_str(&out).unwrap().name, "nvfp4");
}

#[test]
fn recipes_show_reads_files_and_reports_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.toml");
    std::fs::write(&path, "base = \"mxfp8\"\nname = \"mine\"\n").unwrap();
    let o = trainer(&["recipes", "show", path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).starts_with("name = \"mine\""));

    let o = trainer(&["recipes", "show", "nvfp5"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("unknown recipe 'nvfp5'; valid: fp32, bf16"),
        "{err}"
    );
    assert!(!err.contains("backtrace"), "{err}");
}

#[test]
fn train_op_profile_prints_the_last_steps_ops() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let o = trainer(&[
        "train",
        "--preset",
        "tiny",
        "--steps",
        "2",
        "--recipe",
        "bf16",
        "--device",
        "cpu",
        "--quiet",
        "--op-profile",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    let table = text
        .split("op profile of the last step (ms):\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no op profile in:\n{text}"));
    // the tiny GPT's ops, forward and backward, each with its call count
    for (op, dir) in [
        ("linear", "fwd"),
        ("linear", "bwd"),
        ("qkv_attention", "bwd"),
    ] {
        assert!(
            table
                .lines()
                .any(|l| l.split_whitespace().take(2).eq([op, dir])),
            "{op} {dir} missing from:\n{table}"
        );
    }
    // without the flag, no table
    let plain = trainer(&[
        "train",
        "--preset",
        "tiny",
        "--steps",
        "1",
        "--device",
        "cpu",
        "--quiet",
        "--out",
        dir.path().join("plain").to_str().unwrap(),
    ]);
    assert!(plain.status.success(), "{}", stderr(&plain));
    assert!(!stdout(&plain).contains("op profile"));
}

#[test]
fn data_sample_is_the_corpus() {
    let o = trainer(&["data", "sample", "--seed", "4", "--bytes", "500"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), format!("{}\n", trainer::data::generate(4, 500)));
}

#[test]
fn data_stats_on_corpus_text_and_shards() {
    let o = trainer(&["data", "stats", "--bytes", "100000"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("tokens:          100000") && out.contains("unigram entropy: 4."),
        "{out}"
    );
    assert!(out.contains("H(next | previous 3)"), "{out}");

    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("t.txt");
    std::fs::write(&text, "abab").unwrap();
    let o = trainer(&["data", "stats", "--file", text.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("tokens:          4") && out.contains("1.0000 bits/token"),
        "{out}"
    );

    let shard = dir.path().join("s.bin");
    trainer::data::write_llmc_shard(&shard, &[1, 2, 3, 50000]).unwrap();
    let o = trainer(&["data", "stats", "--shard", shard.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("llm.c, version 1") && out.contains("vocab size:      50257"),
        "{out}"
    );
    assert!(out.contains("2.0000 bits/token"), "{out}");

    // A token outside a smaller vocabulary.
    let o = trainer(&[
        "data",
        "stats",
        "--shard",
        shard.to_str().unwrap(),
        "--vocab",
        "256",
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("token 50000 at index 3"),
        "{}",
        stderr(&o)
    );

    // Invalid UTF-8.
    std::fs::write(&text, b"ok\xC3(").unwrap();
    let o = trainer(&["data", "stats", "--file", text.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("not valid UTF-8 at byte 2"),
        "{}",
        stderr(&o)
    );

    // --file and --shard exclude each other.
    let o = trainer(&["data", "stats", "--file", "a", "--shard", "b"]);
    assert!(!o.status.success());
}

#[test]
fn compare_with_seeds_reports_statistics_and_reuses_finished_runs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cmp");
    let args = |seeds: &'static str| {
        vec![
            "compare".to_string(),
            "--preset".into(),
            "tiny".into(),
            "--steps".into(),
            "6".into(),
            "--eval-every".into(),
            "3".into(),
            "--recipes".into(),
            "bf16,fp8-current".into(),
            "--seeds".into(),
            seeds.into(),
            "--quiet".into(),
            "--out".into(),
            out.to_str().unwrap().into(),
        ]
    };
    let run = |a: Vec<String>| {
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        trainer(&a)
    };
    let o = run(args("2"));
    assert!(o.status.success(), "{}", stderr(&o));
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("| fp8-current | 2 | "), "{md}");
    assert!(md.contains("worse than bf16"), "{md}");
    assert!(out.join("fp8-current/seed1/summary.json").is_file());
    // One more seed: the four finished runs are reused, only seed 2 trains.
    let o = run(args("3"));
    assert!(o.status.success(), "{}", stderr(&o));
    let log = stdout(&o);
    assert_eq!(log.matches("reusing the finished run").count(), 4, "{log}");
    assert!(log.contains("bf16 seed 2: final validation loss"), "{log}");
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("| fp8-current | 3 | "), "{md}");
    // Gaps against another recipe; the runs are all reused.
    let mut a = args("3");
    a.extend(["--reference".to_string(), "fp8-current".to_string()]);
    let o = run(a.clone());
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).matches("reusing the finished run").count(), 6);
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        md.contains("| gap to fp8-current | worse than fp8-current |"),
        "{md}"
    );
    // Bad counts and references are refused.
    let o = run(args("0"));
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--seeds must be at least 1"));
    let mut a = args("1");
    a.extend(["--reference".to_string(), "mxfp8".to_string()]);
    let o = run(a);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--reference mxfp8 is not among the recipes (bf16, fp8-current)"),
        "{}",
        stderr(&o)
    );
}

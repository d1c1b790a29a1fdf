//! Fuzzing of every decoder of outside bytes in the trainer (issue #13): safetensors
//! tensors, whole checkpoints (state JSON, tensors and optimizer state with forged checksums,
//! then a resume and a training step), token shards (llm.c and raw), run configurations and
//! recipes (TOML). Each harness asserts no panic (proptest reports one as a failure), a typed
//! error or a consistent value. Case counts are bounded (`*_CASES`) so that the file runs in a
//! few seconds; the README reports them.

mod common;
use common::opts;

use std::fs;
use std::path::Path;

use autograd::NamedTensor;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use trainer::checkpoint::{self, CheckpointError, OPTIMIZER_FILE, STATE_FILE, TENSORS_FILE};
use trainer::config::ConfigError;
use trainer::data::{open_shard, DataError, ShardFormat, LLMC_MAGIC};
use trainer::recipe::{LayerKind, Recipe};
use trainer::train::{RunConfig, TrainError, Trainer};

/// Inputs of each safetensors harness.
const TENSOR_CASES: u32 = 3000;
/// Mutated checkpoints (each loaded, resumed and stepped when it loads).
const CHECKPOINT_CASES: u32 = 1000;
/// Inputs of each token-shard harness (one file each, opened 3 formats x 8 vocabularies).
const SHARD_CASES: u32 = 600;
/// Inputs of each TOML harness.
const TOML_CASES: u32 = 3000;
/// Mutated run configurations that parse, then build a trainer and take a step.
const TRAIN_CASES: u32 = 200;

/// Tokens that make mutated TOML and JSON interesting.
const TOKENS: &[&str] = &[
    "0",
    "1",
    "-1",
    "2",
    "7",
    "33",
    "255",
    "256",
    "65536",
    "4294967296",
    "18446744073709551615",
    "9223372036854775807",
    "-9223372036854775808",
    "1e308",
    "-1e308",
    "1e-45",
    "0.5",
    "nan",
    "inf",
    "-inf",
    "NaN",
    "null",
    "true",
    "false",
    "\"\"",
    "\"x\"",
    "\"../../x\"",
    "[]",
    "[1, 2]",
    "{}",
    "[",
    "]",
    "{",
    "}",
    "=",
    ",",
    ":",
    "\"",
    "\n",
    "#",
    ".",
    "[train]",
    "[model]",
    "[[overrides]]",
    "kind = \"shard\"",
];

/// A text edit: at a fraction of the length, replace `del` bytes with a token.
fn edits() -> impl Strategy<Value = Vec<(prop::sample::Index, usize, usize)>> {
    proptest::collection::vec(
        (any::<prop::sample::Index>(), 0usize..12, 0..TOKENS.len()),
        1..5,
    )
}

fn apply_edits(base: &str, edits: &[(prop::sample::Index, usize, usize)]) -> String {
    let mut s = base.as_bytes().to_vec();
    for (at, del, tok) in edits {
        let at = at.index(s.len() + 1);
        let end = (at + del).min(s.len());
        s.splice(at..end, TOKENS[*tok].bytes());
    }
    String::from_utf8(s).expect("ASCII edits of ASCII text")
}

/// Replaces the value of one `key = value` line (or `"key": value` in JSON) with a token.
fn replace_value(base: &str, line: prop::sample::Index, tok: usize, json: bool) -> String {
    let lines: Vec<&str> = base.lines().collect();
    let i = line.index(lines.len());
    let sep = if json { ':' } else { '=' };
    let mut out = String::new();
    for (k, l) in lines.iter().enumerate() {
        match l.find(sep) {
            Some(p) if k == i => {
                let comma = if json && l.trim_end().ends_with(',') {
                    ","
                } else {
                    ""
                };
                out.push_str(&l[..=p]);
                out.push(' ');
                out.push_str(TOKENS[tok]);
                out.push_str(comma);
            }
            _ => out.push_str(l),
        }
        out.push('\n');
    }
    out
}

const TINY: &str = r#"
[model]
vocab = 256
d_model = 32
n_layers = 2
n_heads = 2
hidden = 64
seq = 16

[train]
steps = 4
batch = 2
lr = 0.01
warmup_steps = 1
eval_every = 2
eval_batches = 1

[data]
kind = "corpus"
seed = 2
bytes = 20000
"#;

fn small_enough(cfg: &RunConfig) -> bool {
    cfg.model.num_params() <= 300_000
        && cfg.tokens_per_step() <= 4096
        && cfg.train.eval_batches <= 4
        && matches!(cfg.data, trainer::data::DataSource::Corpus { bytes, .. } if bytes <= 200_000)
}

// ---------------------------------------------------------------- safetensors

fn valid_tensors() -> Vec<u8> {
    checkpoint::tensors_to_bytes(&[
        NamedTensor {
            name: "a.weight".into(),
            shape: vec![2, 3],
            data: (0..6).map(|i| i as f32).collect(),
        },
        NamedTensor {
            name: "b".into(),
            shape: vec![4],
            data: vec![1.0, -2.0, 0.5, f32::MAX],
        },
    ])
    .unwrap()
}

fn check_tensors(bytes: &[u8]) -> Result<(), TestCaseError> {
    match checkpoint::tensors_from_bytes(bytes, Path::new("fuzz.safetensors")) {
        Ok(ts) => {
            for t in ts {
                let n = t.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
                prop_assert_eq!(n, Some(t.data.len()), "{}", t.name);
            }
        }
        Err(CheckpointError::BadTensors { .. }) => {}
        Err(e) => return Err(TestCaseError::fail(format!("unexpected error kind: {e}"))),
    }
    Ok(())
}

fn header_value() -> impl Strategy<Value = String> {
    let dims = prop_oneof![
        Just(0u64),
        Just(1),
        Just(2),
        Just(3),
        Just(4),
        Just(1 << 40),
        Just(u64::MAX),
        any::<u64>()
    ];
    let dtype = prop::sample::select(vec![
        "F32", "F16", "BF16", "F64", "I64", "U8", "BOOL", "F4", "X",
    ]);
    (
        dtype,
        proptest::collection::vec(dims.clone(), 0..4),
        dims.clone(),
        dims,
    )
        .prop_map(|(d, shape, a, b)| {
            format!(
                "{{\"dtype\":\"{d}\",\"shape\":[{}],\"data_offsets\":[{a},{b}]}}",
                shape
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(TENSOR_CASES))]

    #[test]
    fn safetensors_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        check_tensors(&bytes)?;
    }

    #[test]
    fn safetensors_byte_edits(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..6),
    ) {
        let mut b = valid_tensors();
        for (i, x, kind) in &edits {
            let at = i.index(b.len().max(1));
            match kind {
                0 if at < b.len() => b[at] ^= x | 1,
                1 => b.insert(at.min(b.len()), *x),
                _ if at < b.len() => { b.remove(at); }
                _ => {}
            }
        }
        check_tensors(&b)?;
    }

    #[test]
    fn safetensors_forged_headers(
        entries in proptest::collection::vec(header_value(), 0..3),
        data in proptest::collection::vec(any::<u8>(), 0..48),
        len_delta in -2i64..3,
        metadata in any::<bool>(),
    ) {
        let mut header = String::from("{");
        if metadata {
            header.push_str("\"__metadata__\":{\"k\":\"v\"}");
        }
        for (i, e) in entries.iter().enumerate() {
            if metadata || i > 0 {
                header.push(',');
            }
            header.push_str(&format!("\"t{i}\":{e}"));
        }
        header.push('}');
        let n = (header.len() as i64 + len_delta).max(0) as u64;
        let mut b = n.to_le_bytes().to_vec();
        b.extend_from_slice(header.as_bytes());
        b.extend_from_slice(&data);
        check_tensors(&b)?;
    }
}

// ---------------------------------------------------------------- checkpoints

/// Mutations of a checkpoint: which file, and how.
#[derive(Clone, Debug)]
enum CkMutation {
    StateEdits(Vec<(prop::sample::Index, usize, usize)>),
    StateValue(prop::sample::Index, usize),
    /// JSON-aware: set leaves (chosen by their path pattern, array indices ignored, so the
    /// long quantizer histories do not crowd out the rest) to interesting values.
    StateLeaves(Vec<(prop::sample::Index, prop::sample::Index, usize)>),
    /// Byte edits of a binary file, its checksum in `state.json` updated.
    Binary {
        tensors: bool,
        edits: Vec<(prop::sample::Index, u8)>,
        reseal_optimizer: bool,
    },
}

/// Values a JSON leaf is set to.
const JSON_VALUES: &[&str] = &[
    "0",
    "1",
    "-1",
    "3",
    "31",
    "1000000000",
    "4294967296",
    "18446744073709551615",
    "9223372036854775807",
    "1e300",
    "-0.5",
    "0.999",
    "null",
    "true",
    "\"\"",
    "\"zz\"",
    "\"0000000000000000\"",
    "[]",
    "{}",
];

/// Every leaf of `v` with its pattern (the path with array indices as `*`).
fn leaves(
    v: &serde_json::Value,
    pattern: String,
    path: Vec<String>,
    out: &mut Vec<(String, Vec<String>)>,
) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                let mut p = path.clone();
                p.push(k.clone());
                leaves(x, format!("{pattern}/{k}"), p, out);
            }
        }
        serde_json::Value::Array(a) if !a.is_empty() => {
            for (i, x) in a.iter().enumerate() {
                let mut p = path.clone();
                p.push(i.to_string());
                leaves(x, format!("{pattern}/*"), p, out);
            }
        }
        _ => out.push((pattern, path)),
    }
}

fn set_leaves(state: &str, picks: &[(prop::sample::Index, prop::sample::Index, usize)]) -> String {
    let mut v: serde_json::Value = serde_json::from_str(state).unwrap();
    for (pat, inst, val) in picks {
        let mut all = Vec::new();
        leaves(&v, String::new(), Vec::new(), &mut all);
        let mut patterns: Vec<&String> = all.iter().map(|(p, _)| p).collect();
        patterns.sort();
        patterns.dedup();
        let pattern = patterns[pat.index(patterns.len())].clone();
        let paths: Vec<&Vec<String>> = all
            .iter()
            .filter(|(p, _)| *p == pattern)
            .map(|(_, p)| p)
            .collect();
        let path = paths[inst.index(paths.len())].clone();
        let mut at = &mut v;
        for k in &path {
            at = match at {
                serde_json::Value::Array(a) => &mut a[k.parse::<usize>().unwrap()],
                other => &mut other[k.as_str()],
            };
        }
        *at = serde_json::from_str(JSON_VALUES[*val]).unwrap();
    }
    serde_json::to_string_pretty(&v).unwrap()
}

fn ck_mutation() -> impl Strategy<Value = CkMutation> {
    prop_oneof![
        edits().prop_map(CkMutation::StateEdits),
        (any::<prop::sample::Index>(), 0..TOKENS.len())
            .prop_map(|(l, t)| CkMutation::StateValue(l, t)),
        proptest::collection::vec(
            (
                any::<prop::sample::Index>(),
                any::<prop::sample::Index>(),
                0..JSON_VALUES.len()
            ),
            1..3
        )
        .prop_map(CkMutation::StateLeaves),
        proptest::collection::vec(
            (
                any::<prop::sample::Index>(),
                any::<prop::sample::Index>(),
                0..JSON_VALUES.len()
            ),
            1..3
        )
        .prop_map(CkMutation::StateLeaves),
        (
            any::<bool>(),
            proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..4),
            any::<bool>()
        )
            .prop_map(|(tensors, edits, reseal_optimizer)| CkMutation::Binary {
                tensors,
                edits,
                reseal_optimizer
            }),
    ]
}

#[test]
fn mutated_checkpoints_load_resume_and_step_or_fail_typed() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = RunConfig::from_toml_str(TINY).unwrap();
    let good = Trainer::new(
        cfg,
        Recipe::builtin("fp8-delayed").unwrap(),
        opts(&tmp.path().join("run")),
    )
    .unwrap()
    .run()
    .unwrap()
    .checkpoint;
    let read = |f: &str| fs::read(good.join(f)).unwrap();
    let (state0, tensors0, opt0) = (read(STATE_FILE), read(TENSORS_FILE), read(OPTIMIZER_FILE));
    let state0 = String::from_utf8(state0).unwrap();
    let dir = tmp.path().join("fuzz/checkpoints/step-00000004");
    fs::create_dir_all(&dir).unwrap();
    let mut runner = TestRunner::new(Config::with_cases(CHECKPOINT_CASES));
    let loaded = std::cell::Cell::new(0u32);
    runner
        .run(&ck_mutation(), |m| {
            let (mut tensors, mut opt) = (tensors0.clone(), opt0.clone());
            let state = match &m {
                CkMutation::StateEdits(e) => apply_edits(&state0, e),
                CkMutation::StateValue(l, t) => replace_value(&state0, *l, *t, true),
                CkMutation::StateLeaves(picks) => set_leaves(&state0, picks),
                CkMutation::Binary {
                    tensors: which,
                    edits,
                    reseal_optimizer,
                } => {
                    let b = if *which { &mut tensors } else { &mut opt };
                    for (i, x) in edits {
                        let at = i.index(b.len());
                        b[at] ^= x;
                    }
                    if !*which && *reseal_optimizer {
                        let body = b.len() - 4;
                        let crc = optim::crc32(&b[..body]);
                        b[body..].copy_from_slice(&crc.to_le_bytes());
                    }
                    let mut v: serde_json::Value = serde_json::from_str(&state0).unwrap();
                    v["tensors_crc32"] = optim::crc32(&tensors).into();
                    v["optimizer_crc32"] = optim::crc32(&opt).into();
                    serde_json::to_string_pretty(&v).unwrap()
                }
            };
            fs::write(dir.join(STATE_FILE), &state).unwrap();
            fs::write(dir.join(TENSORS_FILE), &tensors).unwrap();
            fs::write(dir.join(OPTIMIZER_FILE), &opt).unwrap();
            let ck = match checkpoint::load(&dir) {
                Ok(ck) => ck,
                Err(_) => return Ok(()),
            };
            let cfg = RunConfig {
                model: ck.state.model.clone(),
                train: ck.state.train.clone(),
                data: ck.state.data.clone(),
            };
            if cfg.validate().is_ok() && !small_enough(&cfg) {
                return Ok(()); // valid but too slow to build in a fuzz case
            }
            match Trainer::resume(&dir, opts(&tmp.path().join("out"))) {
                Ok(mut tr) => {
                    loaded.set(loaded.get() + 1);
                    if tr.step() < tr.config().train.steps {
                        match tr.train_step() {
                            Ok(_) | Err(TrainError::Diverged { .. }) => {}
                            Err(e) => {
                                return Err(TestCaseError::fail(format!("step after resume: {e}")))
                            }
                        }
                    }
                }
                Err(
                    TrainError::Config(_)
                    | TrainError::Model(_)
                    | TrainError::Data(_)
                    | TrainError::Optim(_)
                    | TrainError::Checkpoint(_)
                    | TrainError::TooLarge(_),
                ) => {}
                Err(e) => return Err(TestCaseError::fail(format!("unexpected error kind: {e}"))),
            }
            Ok(())
        })
        .unwrap();
    // the harness reached the resume path, not only the parsers
    let loaded = loaded.get();
    assert!(loaded > 10, "only {loaded} mutated checkpoints resumed");
}

// ---------------------------------------------------------------- token shards

fn shard_bytes() -> impl Strategy<Value = Vec<u8>> {
    let header = (
        prop_oneof![Just(LLMC_MAGIC), any::<i32>()],
        prop_oneof![Just(1i32), Just(2), any::<i32>()],
        prop_oneof![0i32..40, any::<i32>()],
        proptest::collection::vec(any::<u16>(), 0..40),
        -3i32..4,
    )
        .prop_map(|(magic, version, count, tokens, trunc)| {
            let mut h = vec![0i32; 256];
            h[0] = magic;
            h[1] = version;
            h[2] = count;
            let mut b: Vec<u8> = h.iter().flat_map(|v| v.to_le_bytes()).collect();
            b.extend(tokens.iter().flat_map(|t| t.to_le_bytes()));
            let n = (b.len() as i64 + trunc as i64).max(0) as usize;
            b.resize(n, 7);
            b
        });
    prop_oneof![proptest::collection::vec(any::<u8>(), 0..1100), header]
}

#[test]
fn token_shards_open_or_fail_typed() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("shard.bin");
    let mut runner = TestRunner::new(Config::with_cases(SHARD_CASES));
    runner
        .run(&shard_bytes(), |bytes| {
            fs::write(&path, &bytes).unwrap();
            for format in [ShardFormat::Auto, ShardFormat::LlmC, ShardFormat::Raw] {
                for vocab in [0u32, 1, 7, 256, 65535, 65536, 65537, u32::MAX] {
                    match open_shard(&path, format, vocab) {
                        Ok(s) => {
                            prop_assert!((1..=65536).contains(&vocab));
                            prop_assert!(!s.tokens.is_empty());
                            prop_assert!(s.tokens.len() * 2 <= bytes.len());
                            let mut ok = true;
                            s.tokens
                                .for_each_chunk(|c| ok &= c.iter().all(|&t| t < vocab));
                            prop_assert!(ok);
                        }
                        Err(DataError::Io { .. }) => {
                            return Err(TestCaseError::fail("I/O error on a readable file"))
                        }
                        Err(_) => {}
                    }
                }
            }
            Ok(())
        })
        .unwrap();
}

// ---------------------------------------------------------------- TOML

fn check_run_config(text: &str) -> Result<Option<RunConfig>, TestCaseError> {
    match RunConfig::from_toml_str(text) {
        Ok(cfg) => {
            prop_assert!(cfg.validate().is_ok());
            let _ = cfg.memory_estimate();
            let _ = cfg.check_memory();
            let _ = cfg.tokens_per_step();
            prop_assert!(RunConfig::from_toml_str(&cfg.to_toml()).is_ok());
            Ok(Some(cfg))
        }
        Err(ConfigError::Invalid(_) | ConfigError::Model(_)) => Ok(None),
        Err(e) => Err(TestCaseError::fail(format!("unexpected error kind: {e}"))),
    }
}

fn check_recipe(text: &str) -> Result<(), TestCaseError> {
    if let Ok(r) = Recipe::from_toml_str(text) {
        prop_assert!(trainer::recipe::check_name(&r.name).is_ok());
        for kind in [LayerKind::AttnQkv, LayerKind::MlpDown, LayerKind::LmHead] {
            for p in [0.0, 0.5, 1.0] {
                let _ = r.policy_for(1, 4, kind, p);
            }
        }
        let _ = r.plan(3, 0.9);
        prop_assert_eq!(Recipe::from_toml_str(&r.to_toml()).unwrap(), r);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(TOML_CASES))]

    #[test]
    fn run_config_text_edits(e in edits()) {
        check_run_config(&apply_edits(TINY, &e))?;
    }

    #[test]
    fn run_config_value_replacements(line in any::<prop::sample::Index>(), tok in 0..TOKENS.len(),
                                     line2 in any::<prop::sample::Index>(), tok2 in 0..TOKENS.len()) {
        let t = replace_value(TINY, line, tok, false);
        check_run_config(&replace_value(&t, line2, tok2, false))?;
    }

    #[test]
    fn run_config_arbitrary_text(s in "\\PC{0,200}") {
        check_run_config(&s)?;
    }

    #[test]
    fn recipe_text_edits(base in 0usize..3, e in edits()) {
        let text = [
            Recipe::builtin("nvfp4").unwrap().to_toml(),
            Recipe::builtin("fp8-delayed").unwrap().to_toml(),
            "base = \"mxfp4\"\nname = \"mine\"\n[linear.fprop.a]\nformat = \"bf16\"\n".to_string(),
        ][base].clone();
        check_recipe(&apply_edits(&text, &e))?;
    }

    #[test]
    fn recipe_value_replacements(base in 0usize..2, line in any::<prop::sample::Index>(), tok in 0..TOKENS.len()) {
        let text = [
            Recipe::builtin("nvfp4").unwrap().to_toml(),
            Recipe::builtin("mxfp4").unwrap().to_toml(),
        ][base].clone();
        check_recipe(&replace_value(&text, line, tok, false))?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(TRAIN_CASES))]

    /// Configurations that parse also build and take a training step (or fail typed).
    #[test]
    fn mutated_run_configs_train_a_step(line in any::<prop::sample::Index>(), tok in 0..TOKENS.len()) {
        let Some(cfg) = check_run_config(&replace_value(TINY, line, tok, false))? else {
            return Ok(());
        };
        if !small_enough(&cfg) {
            return Ok(());
        }
        let tmp = tempfile::tempdir().unwrap();
        match Trainer::new(cfg, Recipe::builtin("nvfp4").unwrap(), opts(tmp.path())) {
            Ok(mut tr) => match tr.train_step() {
                Ok(_) | Err(TrainError::Diverged { .. }) => {}
                Err(e) => return Err(TestCaseError::fail(format!("step: {e}"))),
            },
            Err(TrainError::Data(_) | TrainError::Config(_) | TrainError::TooLarge(_) | TrainError::Model(_) | TrainError::Optim(_)) => {}
            Err(e) => return Err(TestCaseError::fail(format!("unexpected error kind: {e}"))),
        }
    }
}

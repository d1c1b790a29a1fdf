//! Fuzzing of the Hugging Face folder import (`trainer::hf::load_hf`, used by `train --init`
//! and `sample`), a decoder of outside bytes (issue #13): `config.json` with leaves set to
//! interesting values and the safetensors file with edited bytes. Each input must load into
//! parameters that fit the model (the GPT builds and imports them) or be a typed
//! [`HfError`], never a panic. `HF_CASES` inputs per run (in the README).

use std::fs;
use std::path::Path;

use autograd::ParamStore;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::Value;
use trainer::hf::{self, HfError};
use trainer::model::Gpt;

/// Inputs per run.
const HF_CASES: u32 = 600;

const VALUES: &[&str] = &[
    "0",
    "1",
    "2",
    "3",
    "16",
    "31",
    "64",
    "-1",
    "1e300",
    "0.5",
    "4294967296",
    "1099511627776",
    "18446744073709551615",
    "null",
    "true",
    "\"\"",
    "\"llama\"",
    "\"gelu\"",
    "\"linear\"",
    "{}",
    "[]",
];

fn keys(v: &Value, path: Vec<String>, out: &mut Vec<Vec<String>>) {
    if let Value::Object(m) = v {
        for (k, x) in m {
            let mut p = path.clone();
            p.push(k.clone());
            keys(x, p.clone(), out);
            out.push(p);
        }
    }
}

#[derive(Clone, Debug)]
enum Mutation {
    Config(Vec<(prop::sample::Index, usize)>),
    Tensors(Vec<(prop::sample::Index, u8)>),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        3 => proptest::collection::vec((any::<prop::sample::Index>(), 0..VALUES.len()), 1..4)
            .prop_map(Mutation::Config),
        1 => proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..4)
            .prop_map(Mutation::Tensors),
    ]
}

#[test]
fn mutated_hf_folders_load_or_fail_typed() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/hf/tiny");
    let config0: Value =
        serde_json::from_slice(&fs::read(src.join("config.json")).unwrap()).unwrap();
    let tensors0 = fs::read(src.join("model.safetensors")).unwrap();
    let mut paths = Vec::new();
    keys(&config0, Vec::new(), &mut paths);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    fs::create_dir(&dir).unwrap();
    let loaded = std::cell::Cell::new(0u32);
    let mut runner = TestRunner::new(Config::with_cases(HF_CASES));
    runner
        .run(&mutation(), |m| {
            let mut config = config0.clone();
            let mut tensors = tensors0.clone();
            match &m {
                Mutation::Config(picks) => {
                    for (i, val) in picks {
                        let path = &paths[i.index(paths.len())];
                        let mut at = Some(&mut config);
                        for k in path {
                            // an earlier pick may have replaced a parent object
                            at = at.and_then(|v| v.get_mut(k.as_str()));
                        }
                        if let Some(at) = at {
                            *at = serde_json::from_str(VALUES[*val]).unwrap();
                        }
                    }
                }
                Mutation::Tensors(edits) => {
                    for (i, x) in edits {
                        let at = i.index(tensors.len());
                        tensors[at] ^= x;
                    }
                }
            }
            fs::write(
                dir.join("config.json"),
                serde_json::to_vec(&config).unwrap(),
            )
            .unwrap();
            fs::write(dir.join("model.safetensors"), &tensors).unwrap();
            match hf::load_hf(&dir) {
                Ok((cfg, t)) => {
                    loaded.set(loaded.get() + 1);
                    prop_assert!(cfg.validate().is_ok());
                    if cfg.num_params() <= 1_000_000 {
                        let mut ps = ParamStore::new();
                        let _model = Gpt::new(&mut ps, cfg, 0).unwrap();
                        prop_assert!(ps.import(&t).is_ok(), "loaded tensors fit the model");
                    }
                }
                Err(HfError::Io { .. }) => {
                    return Err(TestCaseError::fail("I/O error on readable files"))
                }
                Err(_) => {}
            }
            Ok(())
        })
        .unwrap();
    assert!(loaded.get() > 10, "only {} loaded", loaded.get());
}

/// A folder whose tensors cannot fit in memory is refused before it is read (a sparse file).
#[test]
fn a_huge_hf_folder_is_refused_with_the_estimate() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/hf/tiny");
    let tmp = tempfile::tempdir().unwrap();
    fs::copy(src.join("config.json"), tmp.path().join("config.json")).unwrap();
    fs::File::create(tmp.path().join("model.safetensors"))
        .unwrap()
        .set_len(1 << 40)
        .unwrap();
    let e = hf::load_hf(tmp.path()).unwrap_err();
    assert!(matches!(e, HfError::TooLarge(_)), "{e}");
    assert!(e.to_string().contains("needs about 5.0 TiB"), "{e}");
}

/// A killed export leaves its staging directory (`.NAME.export-PID`; its `Drop` never ran):
/// the next export into the same place removes those of processes that are gone.
#[test]
fn a_killed_exports_staging_directory_is_removed_by_the_next_export() {
    let tmp = tempfile::tempdir().unwrap();
    let stale = tmp.path().join(".m.export-999999999");
    fs::create_dir(&stale).unwrap();
    fs::write(stale.join("model.safetensors"), b"partial").unwrap();
    let unrelated = tmp.path().join(".m.export-notapid");
    fs::create_dir(&unrelated).unwrap();
    let (cfg, t) =
        hf::load_hf(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/hf/tiny")).unwrap();
    hf::export_model(&cfg, &t, &tmp.path().join("m"), &Default::default()).unwrap();
    assert!(!stale.exists());
    assert!(unrelated.exists());
    assert!(tmp.path().join("m/config.json").is_file());
}

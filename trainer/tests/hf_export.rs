//! Hugging Face export / import (`trainer::hf`), checked against `transformers`.
//!
//! `tests/data/hf/tiny/` is the export of a deterministic tiny model ([`golden_model`]);
//! `tests/data/hf/tiny-nvfp4-ct/` its NVFP4 export in the compressed-tensors layout;
//! `tests/data/hf/logits.safetensors` holds the logits `transformers` computes with both
//! (`trainer/golden/hf_logits.py`, pinned versions in `trainer/golden/requirements.txt`).
//! Regenerate the folder with `NIBBLE_WRITE_HF_GOLDEN=1 cargo test -p trainer --test
//! hf_export`, then rerun the script.

use std::path::{Path, PathBuf};

use autograd::{Graph, NamedTensor, ParamStore};
use fp_formats::checkpoint::{Layout, Scheme};
use trainer::hf::{self, ExportOptions, HfError};
use trainer::model::{Gpt, MlpKind, ModelConfig, Precision};
use trainer::recipe::Recipe;

fn data(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/hf")
        .join(p)
}

struct TempDir(PathBuf);
impl TempDir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("nibble-hf-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tiny_config() -> ModelConfig {
    ModelConfig {
        vocab: 256,
        d_model: 32,
        n_layers: 2,
        n_heads: 2,
        hidden: 64,
        mlp: MlpKind::Swiglu,
        seq: 32,
        tie_embeddings: false,
        rope_base: 10_000.0,
        norm_eps: 1e-5,
    }
}

/// A deterministic tiny model: the GPT's initialisation (seed 7) with norm gains moved away
/// from 1 (so their mapping is tested too) and weights scaled up (so logits are not flat).
fn golden_model() -> (ModelConfig, Vec<NamedTensor>) {
    let cfg = tiny_config();
    let mut ps = ParamStore::new();
    Gpt::new(&mut ps, cfg.clone(), 7).unwrap();
    let mut t = ps.export();
    for x in &mut t {
        let norm = x.name.contains("norm");
        for (i, v) in x.data.iter_mut().enumerate() {
            *v = if norm {
                1.0 + 0.25 * ((i as f32) * 0.7 + x.name.len() as f32).sin()
            } else {
                *v * 8.0
            };
        }
    }
    (cfg, t)
}

fn nvfp4_ct() -> ExportOptions {
    ExportOptions {
        quantize: Some((Scheme::Nvfp4, Layout::CompressedTensors)),
        ..Default::default()
    }
}

#[test]
fn export_is_the_committed_golden_folder() {
    let (cfg, t) = golden_model();
    if std::env::var_os("NIBBLE_WRITE_HF_GOLDEN").is_some() {
        let _ = std::fs::remove_dir_all(data("tiny"));
        hf::export_model(&cfg, &t, &data("tiny"), &ExportOptions::default()).unwrap();
        let _ = std::fs::remove_dir_all(data("tiny-nvfp4-ct"));
        hf::export_model(&cfg, &t, &data("tiny-nvfp4-ct"), &nvfp4_ct()).unwrap();
    }
    // The NVFP4 (compressed-tensors) export of the same model is the committed one too.
    let d = TempDir::new("golden-q");
    let out = d.0.join("q");
    let r = hf::export_model(&cfg, &t, &out, &nvfp4_ct()).unwrap();
    assert_eq!(r.quantized, 14);
    for f in &r.files {
        assert_eq!(
            std::fs::read(out.join(f)).unwrap(),
            std::fs::read(data("tiny-nvfp4-ct").join(f)).unwrap(),
            "{f} differs from the committed golden (regenerate it and the logits)"
        );
    }
    let d = TempDir::new("golden");
    let out = d.0.join("tiny");
    let r = hf::export_model(&cfg, &t, &out, &ExportOptions::default()).unwrap();
    assert_eq!(
        r.files,
        [
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json"
        ]
    );
    assert_eq!(r.tensors, 1 + 2 * 9 + 2);
    for f in &r.files {
        assert_eq!(
            std::fs::read(out.join(f)).unwrap(),
            std::fs::read(data("tiny").join(f)).unwrap(),
            "{f} differs from the committed golden (regenerate it and the logits)"
        );
    }
    // The safetensors metadata names the producer and the config.
    let bytes = std::fs::read(out.join("model.safetensors")).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let m = meta.metadata().as_ref().unwrap();
    assert!(m["producer"].starts_with("nibble trainer "));
    let back: ModelConfig = serde_json::from_str(&m["nibble_model_config"]).unwrap();
    assert_eq!(back, cfg);
}

#[test]
fn import_round_trips_bit_for_bit() {
    let (cfg, t) = golden_model();
    let (cfg2, t2) = hf::load_hf(&data("tiny")).unwrap();
    assert_eq!(cfg2, cfg);
    let mut a = t.clone();
    a.sort_by(|x, y| x.name.cmp(&y.name));
    assert_eq!(a.len(), t2.len());
    for (x, y) in a.iter().zip(&t2) {
        assert_eq!((&x.name, &x.shape), (&y.name, &y.shape));
        let same = x
            .data
            .iter()
            .zip(&y.data)
            .all(|(p, q)| p.to_bits() == q.to_bits());
        assert!(same, "{}", x.name);
    }
    // Tied embeddings export without lm_head and come back tied.
    let mut tied = cfg.clone();
    tied.tie_embeddings = true;
    let t3: Vec<NamedTensor> = t
        .iter()
        .filter(|x| x.name != "lm_head.weight")
        .cloned()
        .collect();
    let d = TempDir::new("tied");
    hf::export_model(&tied, &t3, &d.0.join("m"), &ExportOptions::default()).unwrap();
    let c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.0.join("m/config.json")).unwrap()).unwrap();
    assert_eq!(c["tie_word_embeddings"], true);
    let (cfg4, t4) = hf::load_hf(&d.0.join("m")).unwrap();
    assert_eq!(cfg4, tied);
    assert_eq!(t4.len(), t3.len());
}

/// Nibble's FP32 forward pass of the model in `dir` against `transformers`' logits
/// `{prefix}.{i}` of `logits.safetensors` (F32 `[len(ids), 256]` per prompt; the metadata's
/// `cases` is `[{"prompt": str, "ids": [u32]}]`); returns the largest difference.
fn compare_with_transformers(dir: &Path, prefix: &str) -> f32 {
    let bytes = std::fs::read(data("logits.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let cases: serde_json::Value =
        serde_json::from_str(&meta.metadata().as_ref().unwrap()["cases"]).unwrap();
    let (cfg, t) = hf::load_hf(dir).unwrap();
    let mut ps = ParamStore::new();
    let model = Gpt::new(&mut ps, cfg.clone(), 0).unwrap();
    ps.import(&t).unwrap();
    let recipe = Recipe::builtin("fp32").unwrap();
    let cases = cases.as_array().unwrap();
    assert_eq!(cases.len(), 3);
    let mut worst = 0.0f32;
    for (k, case) in cases.iter().enumerate() {
        let prompt = case["prompt"].as_str().unwrap();
        let ids: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        // transformers' tokenizer produced exactly the UTF-8 bytes.
        assert_eq!(ids, prompt.bytes().map(u32::from).collect::<Vec<_>>());
        let view = st.tensor(&format!("{prefix}.{k}")).unwrap();
        assert_eq!(view.shape(), [ids.len(), 256]);
        let expected: Vec<f32> = view
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let mut g = Graph::new(&mut ps).with_rng(0, 0);
        g.set_grad_enabled(false);
        let prec = Precision {
            recipe: &recipe,
            progress: 0.0,
        };
        let logits = model.forward_logits(&mut g, &ids, 1, &prec, None).unwrap();
        let ours = g.value(logits).unwrap().to_vec();
        assert_eq!(ours.len(), expected.len());
        let scale = expected.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert!(scale > 1.0, "logits are not flat ({scale})");
        eprintln!("{prefix} {prompt:?}: largest |logit| {scale}");
        for (i, (a, b)) in ours.iter().zip(&expected).enumerate() {
            let err = (a - b).abs();
            worst = worst.max(err);
            // Bound: 1e-5 of the largest |logit| (observed: 3.2e-6 absolute with logits up
            // to 3.7).
            assert!(err <= 1e-5 * scale, "{prompt:?} logit {i}: {a} vs {b}");
        }
        // Same greedy next token at every position.
        for p in 0..ids.len() {
            let row = |v: &[f32]| {
                let r = &v[p * 256..(p + 1) * 256];
                (0..256).max_by(|&i, &j| r[i].total_cmp(&r[j])).unwrap()
            };
            assert_eq!(row(&ours), row(&expected), "{prompt:?} position {p}");
        }
    }
    eprintln!("{prefix}: largest |Nibble - transformers| logit difference: {worst:e}");
    worst
}

#[test]
fn fp32_forward_matches_transformers() {
    compare_with_transformers(&data("tiny"), "logits");
}

/// transformers loads the compressed-tensors NVFP4 export (decompressing it to BF16 weights
/// with compressed-tensors); Nibble dequantizes the same folder with `fp_formats::checkpoint`
/// (BF16, the library's own decompression bit for bit) and runs its FP32 forward pass.
#[test]
fn nvfp4_export_runs_in_transformers_as_here() {
    let d = TempDir::new("nvfp4-fwd");
    let deq = d.0.join("deq");
    fp_formats::checkpoint::dequantize_checkpoint(
        &data("tiny-nvfp4-ct"),
        &deq,
        &fp_formats::checkpoint::DequantizeOptions::default(),
        &fp_formats::checkpoint::NoProgress,
    )
    .unwrap();
    compare_with_transformers(&deq, "nvfp4_ct_logits");
}

#[test]
fn unsupported_configurations_and_existing_outputs_are_refused() {
    let (mut cfg, t) = golden_model();
    cfg.mlp = MlpKind::Gelu;
    let d = TempDir::new("refuse");
    let e = hf::export_model(&cfg, &t, &d.0.join("gelu"), &ExportOptions::default()).unwrap_err();
    assert!(matches!(e, HfError::Unsupported(_)), "{e}");
    assert!(e.to_string().contains("GELU"), "{e}");
    assert!(!d.0.join("gelu").exists());
    let (cfg, t) = golden_model();
    hf::export_model(&cfg, &t, &d.0.join("m"), &ExportOptions::default()).unwrap();
    let e = hf::export_model(&cfg, &t, &d.0.join("m"), &ExportOptions::default()).unwrap_err();
    assert!(
        matches!(
            e,
            HfError::Output(trainer::rundir::StageError::OutputExists(_))
        ),
        "{e}"
    );
    // A config that the GPT cannot run: grouped-query attention.
    let mut c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.0.join("m/config.json")).unwrap()).unwrap();
    c["num_key_value_heads"] = 1.into();
    std::fs::write(d.0.join("m/config.json"), c.to_string()).unwrap();
    let e = hf::load_hf(&d.0.join("m")).unwrap_err();
    assert!(e.to_string().contains("grouped-query attention"), "{e}");
    // A config that does not match the tensors.
    c["num_key_value_heads"] = 2.into();
    c["intermediate_size"] = 96.into();
    std::fs::write(d.0.join("m/config.json"), c.to_string()).unwrap();
    let e = hf::load_hf(&d.0.join("m")).unwrap_err();
    assert!(
        e.to_string()
            .contains("has shape [64, 32], the config needs [96, 32]"),
        "{e}"
    );
}

#[test]
fn quantized_exports_reuse_fp_formats() {
    let (cfg, t) = golden_model();
    let d = TempDir::new("quant");
    for (scheme, layout, weight_file_tensor) in [
        (
            Scheme::Nvfp4,
            Layout::ModelOpt,
            "model.layers.0.mlp.up_proj.weight_scale_2",
        ),
        (
            Scheme::Nvfp4,
            Layout::CompressedTensors,
            "model.layers.0.mlp.up_proj.weight_global_scale",
        ),
        (
            Scheme::Mxfp8,
            Layout::CompressedTensors,
            "model.layers.1.self_attn.q_proj.weight_scale",
        ),
    ] {
        let out = d.0.join(format!("{scheme:?}-{layout:?}"));
        let opts = ExportOptions {
            quantize: Some((scheme, layout)),
            ..Default::default()
        };
        let r = hf::export_model(&cfg, &t, &out, &opts).unwrap();
        assert_eq!(r.quantized, 2 * 7, "{scheme:?} {layout:?}");
        assert!(r.files.contains(&"tokenizer.json".to_string()));
        let bytes = std::fs::read(out.join("model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert!(
            st.tensor(weight_file_tensor).is_ok(),
            "{weight_file_tensor}"
        );
        // Embedding, LM head and norms stay F32.
        assert_eq!(
            st.tensor("lm_head.weight").unwrap().dtype(),
            safetensors::Dtype::F32
        );
        let c: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap())
                .unwrap();
        assert_eq!(c["model_type"], "llama");
        assert!(c["quantization_config"].is_object());
        // A quantized folder is not loaded as if it were F32.
        let e = hf::load_hf(&out).unwrap_err();
        assert!(e.to_string().contains("dequantize it first"), "{e}");
    }
    let out = d.0.join("mxfp8-modelopt");
    let opts = ExportOptions {
        quantize: Some((Scheme::Mxfp8, Layout::ModelOpt)),
        ..Default::default()
    };
    let e = hf::export_model(&cfg, &t, &out, &opts).unwrap_err();
    assert!(e.to_string().contains("ModelOpt has no MXFP8"), "{e}");
    assert!(!out.exists());
    assert_eq!(
        std::fs::read_dir(&d.0).unwrap().count(),
        3,
        "no staging left behind"
    );
}

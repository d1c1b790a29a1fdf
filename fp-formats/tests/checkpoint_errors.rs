//! Bad input to `fp_formats::checkpoint`: each a clear, typed error, and nothing written.

use std::path::{Path, PathBuf};

use fp_formats::checkpoint::{
    dequantize_checkpoint, quantize_checkpoint, write_f32_checkpoint, CheckpointError,
    DequantizeOptions, Layout, NoProgress, QuantizeOptions, Scheme, Selection,
};
use safetensors::{tensor::TensorView, Dtype};

struct TempDir(PathBuf);
impl TempDir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("fpf-ckerr-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    /// Names in the directory (to check that nothing was left behind).
    fn entries(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn weights(rows: usize, cols: usize) -> Vec<f32> {
    (0..rows * cols)
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.05)
        .collect()
}

fn good_input(dir: &Path) -> PathBuf {
    let p = dir.join("model.safetensors");
    write_f32_checkpoint(
        &p,
        &[
            (
                "model.layers.0.mlp.up_proj.weight",
                vec![8, 64],
                weights(8, 64),
            ),
            (
                "model.layers.0.self_attn.k_proj.weight",
                vec![4, 32],
                weights(4, 32),
            ),
            ("model.embed_tokens.weight", vec![10, 32], weights(10, 32)),
            ("model.norm.weight", vec![32], vec![1.0; 32]),
        ],
    )
    .unwrap();
    p
}

fn quantize(input: &Path, out: &Path) -> Result<fp_formats::checkpoint::Report, CheckpointError> {
    quantize_checkpoint(input, out, &QuantizeOptions::default(), &NoProgress)
}

/// A tensor to serialize: name, dtype, shape, raw bytes.
type Raw<'a> = (&'a str, Dtype, Vec<usize>, Vec<u8>);

fn serialize(tensors: Vec<Raw>) -> Vec<u8> {
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.to_string(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize(views, None).unwrap()
}

#[test]
fn truncated_and_corrupt_files_are_refused() {
    let d = TempDir::new("corrupt");
    let good = std::fs::read(good_input(&d.0)).unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("short", good[..5].to_vec()),
        ("cut", good[..good.len() - 3].to_vec()),
        ("huge-header", {
            let mut b = good.clone();
            b[..8].copy_from_slice(&u64::MAX.to_le_bytes());
            b
        }),
        ("header-past-end", {
            let mut b = good.clone();
            b[..8].copy_from_slice(&(good.len() as u64).to_le_bytes());
            b
        }),
        ("bad-json", {
            let mut b = good.clone();
            b[8] = b'#';
            b
        }),
    ];
    for (name, bytes) in cases {
        let p = d.0.join(format!("{name}.safetensors"));
        std::fs::write(&p, &bytes).unwrap();
        let out = d.0.join(format!("{name}-out"));
        let e = quantize(&p, &out).unwrap_err();
        assert!(
            matches!(
                e,
                CheckpointError::Truncated { .. } | CheckpointError::Corrupt { .. }
            ),
            "{name}: {e}"
        );
        assert!(
            e.to_string().contains(&format!("{name}.safetensors")),
            "{e}"
        );
        assert!(!out.exists(), "{name}");
    }
    // Only the inputs are left: no partial output directory.
    assert!(d.entries().iter().all(|n| n.ends_with(".safetensors")));
}

#[test]
fn unsupported_dtype_names_the_tensor() {
    let d = TempDir::new("dtype");
    let p = d.0.join("m.safetensors");
    let bytes = serialize(vec![(
        "model.layers.0.mlp.up_proj.weight",
        Dtype::F64,
        vec![2, 16],
        vec![0u8; 2 * 16 * 8],
    )]);
    std::fs::write(&p, bytes).unwrap();
    let e = quantize(&p, &d.0.join("out")).unwrap_err();
    assert!(matches!(e, CheckpointError::UnsupportedDtype { .. }), "{e}");
    assert!(
        e.to_string().contains("up_proj.weight` has dtype F64"),
        "{e}"
    );
    assert_eq!(d.entries(), ["m.safetensors"]);
}

#[test]
fn inner_dimension_must_be_a_multiple_of_the_block() {
    let d = TempDir::new("block");
    let p = d.0.join("m.safetensors");
    write_f32_checkpoint(&p, &[("a.q_proj.weight", vec![2, 24], weights(2, 24))]).unwrap();
    let e = quantize(&p, &d.0.join("out")).unwrap_err();
    assert!(matches!(e, CheckpointError::BadShape { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("not a multiple of the block size 16"),
        "{e}"
    );
    // MXFP8 needs 32: 48 columns pass NVFP4 but not MXFP8.
    write_f32_checkpoint(&p, &[("a.q_proj.weight", vec![2, 48], weights(2, 48))]).unwrap();
    assert!(quantize(&p, &d.0.join("out4")).is_ok());
    let opts = QuantizeOptions {
        scheme: Scheme::Mxfp8,
        layout: Layout::CompressedTensors,
        ..Default::default()
    };
    let e = quantize_checkpoint(&p, &d.0.join("out8"), &opts, &NoProgress).unwrap_err();
    assert!(e.to_string().contains("block size 32"), "{e}");
    assert!(!d.0.join("out8").exists());
}

#[test]
fn non_finite_weights_give_tensor_and_index() {
    let d = TempDir::new("nan");
    let p = d.0.join("m.safetensors");
    let mut w = weights(4, 32);
    w[2 * 32 + 5] = f32::NAN;
    write_f32_checkpoint(
        &p,
        &[
            ("a.k_proj.weight", vec![4, 32], weights(4, 32)),
            ("a.v_proj.weight", vec![4, 32], w),
        ],
    )
    .unwrap();
    let e = quantize(&p, &d.0.join("out")).unwrap_err();
    match &e {
        CheckpointError::NonFinite {
            tensor, row, col, ..
        } => {
            assert_eq!((tensor.as_str(), *row, *col), ("a.v_proj.weight", 2, 5));
        }
        other => panic!("{other}"),
    }
    assert!(e
        .to_string()
        .contains("`a.v_proj.weight` holds the non-finite value NaN at index [2, 5]"));
    assert_eq!(d.entries(), ["m.safetensors"]);
}

#[test]
fn existing_output_is_refused_and_left_alone() {
    let d = TempDir::new("exists");
    let input = good_input(&d.0);
    let out = d.0.join("out");
    quantize(&input, &out).unwrap();
    let before = std::fs::read(out.join("model.safetensors")).unwrap();
    let e = quantize(&input, &out).unwrap_err();
    assert!(matches!(e, CheckpointError::OutputExists(_)), "{e}");
    assert_eq!(
        std::fs::read(out.join("model.safetensors")).unwrap(),
        before
    );
    // An empty directory is fine.
    let empty = d.0.join("empty");
    std::fs::create_dir(&empty).unwrap();
    quantize(&input, &empty).unwrap();
    assert!(empty.join("model.safetensors").exists());
}

#[test]
fn quantized_input_and_bad_options_are_refused() {
    let d = TempDir::new("twice");
    let input = good_input(&d.0);
    let out = d.0.join("out");
    quantize(&input, &out).unwrap();
    let e = quantize(&out.join("model.safetensors"), &d.0.join("again")).unwrap_err();
    assert!(e.to_string().contains("looks quantized already"), "{e}");
    let opts = QuantizeOptions {
        scheme: Scheme::Mxfp8,
        layout: Layout::ModelOpt,
        ..Default::default()
    };
    let e = quantize_checkpoint(&input, &d.0.join("o"), &opts, &NoProgress).unwrap_err();
    assert!(e.to_string().contains("ModelOpt has no MXFP8"), "{e}");
    // A scale tensor without its weight cannot be dequantized.
    let p = d.0.join("orphan.safetensors");
    std::fs::write(
        &p,
        serialize(vec![(
            "a.weight_scale",
            Dtype::F8_E4M3,
            vec![2, 1],
            vec![0x38; 2],
        )]),
    )
    .unwrap();
    let e = dequantize_checkpoint(
        &p,
        &d.0.join("deq"),
        &DequantizeOptions::default(),
        &NoProgress,
    )
    .unwrap_err();
    assert!(e.to_string().contains("has no matching `a.weight`"), "{e}");
    assert!(!d.0.join("deq").exists());
}

#[test]
fn selection_patterns_and_folders_with_shards() {
    let d = TempDir::new("sel");
    let model = d.0.join("model");
    std::fs::create_dir(&model).unwrap();
    for (i, names) in [
        [
            "model.layers.0.mlp.up_proj.weight",
            "model.embed_tokens.weight",
        ],
        ["model.layers.1.mlp.up_proj.weight", "lm_head.weight"],
    ]
    .iter()
    .enumerate()
    {
        let t: Vec<_> = names
            .iter()
            .map(|n| (*n, vec![4, 32], weights(4, 32)))
            .collect();
        write_f32_checkpoint(
            &model.join(format!("model-0000{}-of-00002.safetensors", i + 1)),
            &t,
        )
        .unwrap();
    }
    let index = serde_json::json!({
        "metadata": {"total_size": 0},
        "weight_map": {
            "model.layers.0.mlp.up_proj.weight": "model-00001-of-00002.safetensors",
            "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
            "model.layers.1.mlp.up_proj.weight": "model-00002-of-00002.safetensors",
            "lm_head.weight": "model-00002-of-00002.safetensors",
        }
    });
    std::fs::write(
        model.join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    std::fs::write(model.join("config.json"), r#"{"model_type": "llama"}"#).unwrap();
    std::fs::write(model.join("tokenizer.json"), "{}").unwrap();

    let opts = QuantizeOptions {
        layout: Layout::CompressedTensors,
        selection: Selection {
            include: vec!["*".into()],
            exclude: vec![
                "*embed*".into(),
                "*lm_head*".into(),
                "model.layers.1.*".into(),
            ],
        },
        ..Default::default()
    };
    let out = d.0.join("out");
    let r = quantize_checkpoint(&model, &out, &opts, &NoProgress).unwrap();
    let q: Vec<_> = r.quantized().map(|t| t.name.as_str()).collect();
    assert_eq!(q, ["model.layers.0.mlp.up_proj.weight"]);
    let idx: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("model.safetensors.index.json")).unwrap(),
    )
    .unwrap();
    let map = idx["weight_map"].as_object().unwrap();
    assert_eq!(
        map["model.layers.0.mlp.up_proj.weight_packed"],
        "model-00001-of-00002.safetensors"
    );
    assert!(!map.contains_key("model.layers.0.mlp.up_proj.weight"));
    assert_eq!(
        map["model.layers.1.mlp.up_proj.weight"],
        "model-00002-of-00002.safetensors"
    );
    assert_eq!(idx["metadata"]["total_size"], r.bytes_written);
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["model_type"], "llama");
    assert_eq!(
        cfg["quantization_config"]["ignore"],
        serde_json::json!([
            "lm_head",
            "model.embed_tokens",
            "model.layers.1.mlp.up_proj"
        ])
    );
    assert!(out.join("tokenizer.json").exists());

    // And back: the index and config lose the quantized names.
    let back = d.0.join("back");
    dequantize_checkpoint(&out, &back, &DequantizeOptions::default(), &NoProgress).unwrap();
    let idx: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(back.join("model.safetensors.index.json")).unwrap(),
    )
    .unwrap();
    assert!(idx["weight_map"]
        .as_object()
        .unwrap()
        .contains_key("model.layers.0.mlp.up_proj.weight"));
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(back.join("config.json")).unwrap()).unwrap();
    assert!(cfg.get("quantization_config").is_none());
}

#[test]
fn hostile_quantized_tensors_are_typed_errors() {
    let d = TempDir::new("hostile");
    let cases: Vec<(&str, Vec<Raw>)> = vec![
        (
            "F32 packed data",
            vec![
                ("a.weight_packed", Dtype::F32, vec![2, 8], vec![0; 64]),
                ("a.weight_scale", Dtype::F8_E4M3, vec![2, 1], vec![0x38; 2]),
                ("a.weight_global_scale", Dtype::F32, vec![1], vec![0; 4]),
            ],
        ),
        (
            "0-d packed data",
            vec![
                ("a.weight_packed", Dtype::U8, vec![], vec![0]),
                ("a.weight_scale", Dtype::F8_E4M3, vec![2, 1], vec![0x38; 2]),
                ("a.weight_global_scale", Dtype::F32, vec![1], vec![0; 4]),
            ],
        ),
        (
            "scale of the wrong shape",
            vec![
                ("a.weight", Dtype::U8, vec![2, 8], vec![0; 16]),
                ("a.weight_scale", Dtype::F8_E4M3, vec![2, 2], vec![0x38; 4]),
                ("a.weight_scale_2", Dtype::F32, vec![], vec![0; 4]),
            ],
        ),
        (
            "a global scale of two values",
            vec![
                ("a.weight_packed", Dtype::U8, vec![2, 8], vec![0; 16]),
                ("a.weight_scale", Dtype::F8_E4M3, vec![2, 1], vec![0x38; 2]),
                ("a.weight_global_scale", Dtype::F32, vec![2], vec![0; 8]),
            ],
        ),
        (
            "MXFP8 codes of the wrong dtype",
            vec![
                ("a.weight", Dtype::F16, vec![2, 32], vec![0; 128]),
                ("a.weight_scale", Dtype::U8, vec![2, 1], vec![127; 2]),
            ],
        ),
    ];
    for (i, (what, tensors)) in cases.into_iter().enumerate() {
        let p = d.0.join(format!("h{i}.safetensors"));
        std::fs::write(&p, serialize(tensors)).unwrap();
        let out = d.0.join(format!("h{i}-out"));
        let e = dequantize_checkpoint(&p, &out, &DequantizeOptions::default(), &NoProgress)
            .expect_err(what);
        assert!(matches!(e, CheckpointError::Layout { .. }), "{what}: {e}");
        assert!(!out.exists(), "{what}");
    }
    // A shard index that is not an object is copied through, not a panic.
    let model = d.0.join("model");
    std::fs::create_dir(&model).unwrap();
    good_input(&model);
    std::fs::write(model.join("model.safetensors.index.json"), "[1, 2]").unwrap();
    quantize(&model, &d.0.join("q")).unwrap();
}

/// Every single-byte corruption of a quantized checkpoint's header and data is either
/// dequantized or a typed error, never a panic (deterministic byte positions and values).
#[test]
fn corrupted_quantized_files_never_panic() {
    let d = TempDir::new("flip");
    let input = good_input(&d.0);
    let q = d.0.join("q");
    quantize(&input, &q).unwrap();
    let good = std::fs::read(q.join("model.safetensors")).unwrap();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let (mut ok, mut err) = (0, 0);
    for i in 0..300 {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut b = good.clone();
        // Half of the flips in the 8-byte length + JSON header, half anywhere.
        let header = 8 + u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
        let span = if i % 2 == 0 { header } else { good.len() };
        let pos = (state >> 33) as usize % span;
        b[pos] ^= 1 << ((state >> 20) % 8);
        let dir = d.0.join(format!("c{i}"));
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("model.safetensors"), &b).unwrap();
        let out = d.0.join(format!("c{i}-out"));
        match dequantize_checkpoint(&dir, &out, &DequantizeOptions::default(), &NoProgress) {
            Ok(_) => ok += 1,
            Err(_) => {
                assert!(!out.exists());
                err += 1
            }
        }
        let _ = std::fs::remove_dir_all(&out);
        let _ = std::fs::remove_dir_all(&dir);
    }
    assert!(ok > 0 && err > 0, "{ok} loaded, {err} refused");
}

/// The message of `e` followed by those of its causes, as error reporters print it
/// (`anyhow`'s `{:#}`: joined with ": ").
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
fn underlying_errors_are_reported_once() {
    let d = TempDir::new("once");
    // I/O: a missing input
    let e = quantize(&d.0.join("missing.safetensors"), &d.0.join("o1")).unwrap_err();
    assert!(matches!(e, CheckpointError::Io { .. }), "{e}");
    // the safetensors parser: a header that is not JSON
    let mut bad = serialize(vec![(
        "model.layers.0.mlp.up_proj.weight",
        Dtype::F32,
        vec![1, 16],
        vec![0u8; 64],
    )]);
    bad[8] = b'#';
    let corrupt = d.0.join("corrupt.safetensors");
    std::fs::write(&corrupt, &bad).unwrap();
    let e2 = quantize(&corrupt, &d.0.join("o2")).unwrap_err();
    assert!(matches!(e2, CheckpointError::Corrupt { .. }), "{e2}");
    // JSON: a folder whose config.json does not parse
    let folder = d.0.join("folder");
    std::fs::create_dir_all(&folder).unwrap();
    good_input(&folder);
    std::fs::write(folder.join("config.json"), "{ not json").unwrap();
    let e3 = quantize(&folder, &d.0.join("o3")).unwrap_err();
    assert!(matches!(e3, CheckpointError::Json { .. }), "{e3}");
    for (e, cause) in [
        (&e, "No such file"),
        (&e2, "invalid JSON in header"),
        (&e3, "key must be a string"),
    ] {
        let said = with_causes(e);
        assert_eq!(said.matches(cause).count(), 1, "{said}");
        assert_eq!(
            said,
            e.to_string(),
            "the cause is in the message, not a source()"
        );
    }
}

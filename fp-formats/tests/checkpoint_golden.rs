//! `fp_formats::checkpoint` against the producer libraries, bit for bit.
//!
//! The files under `tests/data/checkpoint/` come from
//! `fp-formats/golden/make_checkpoint_golden.py` (compressed-tensors 0.20.1, nvidia-modelopt
//! 0.47.0, torch 2.15.0 on the CPU; `versions.json`): the libraries' own quantization of
//! `input.safetensors`, and their decompression of Nibble's output.

use std::path::{Path, PathBuf};

use fp_formats::checkpoint::{
    dequantize_checkpoint, layouts::MxScale, quantize_checkpoint, Action, DequantizeOptions,
    FloatType, Layout, NoProgress, QuantizeOptions, Scheme,
};
use safetensors::SafeTensors;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/checkpoint")
        .join(name)
}

struct TempDir(PathBuf);
impl TempDir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!(
            "fpf-ckpt-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
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

const LINEAR: [&str; 3] = [
    "model.layers.0.mlp.up_proj",
    "model.layers.0.self_attn.q_proj",
    "model.layers.0.self_attn.o_proj",
];

/// Every tensor of `reference` is in `ours` with the same dtype, shape and bytes.
fn assert_same_tensors(ours: &Path, reference: &Path) -> usize {
    let (a, b) = (
        std::fs::read(ours).unwrap(),
        std::fs::read(reference).unwrap(),
    );
    let (ours_st, ref_st) = (
        SafeTensors::deserialize(&a).unwrap(),
        SafeTensors::deserialize(&b).unwrap(),
    );
    let mut n = 0;
    for (name, r) in ref_st.tensors() {
        let o = ours_st
            .tensor(&name)
            .unwrap_or_else(|_| panic!("{name} missing"));
        assert_eq!(o.dtype(), r.dtype(), "{name}");
        assert_eq!(o.shape(), r.shape(), "{name}");
        let diff = o.data().iter().zip(r.data()).position(|(x, y)| x != y);
        assert_eq!(diff, None, "{name}: first differing byte");
        n += 1;
    }
    n
}

fn quantize(scheme: Scheme, layout: Layout, mx: MxScale, out: &Path) {
    let opts = QuantizeOptions {
        scheme,
        layout,
        mx_scale: mx,
        ..Default::default()
    };
    let r = quantize_checkpoint(&data("input.safetensors"), out, &opts, &NoProgress).unwrap();
    let q: Vec<_> = r.quantized().map(|t| t.name.as_str()).collect();
    assert_eq!(
        q,
        [
            "model.layers.0.mlp.up_proj.weight",
            "model.layers.0.self_attn.o_proj.weight",
            "model.layers.0.self_attn.q_proj.weight"
        ]
    );
    // Embedding, LM head and norms copied byte for byte.
    let copied: Vec<_> = r
        .tensors
        .iter()
        .filter(|t| t.action == Action::Copied)
        .map(|t| t.name.as_str())
        .collect();
    assert_eq!(
        copied,
        [
            "lm_head.weight",
            "model.embed_tokens.weight",
            "model.layers.0.input_layernorm.weight",
            "model.norm.weight"
        ]
    );
    let (a, b) = (
        std::fs::read(out.join("input.safetensors")).unwrap(),
        std::fs::read(data("input.safetensors")).unwrap(),
    );
    let (o, i) = (
        SafeTensors::deserialize(&a).unwrap(),
        SafeTensors::deserialize(&b).unwrap(),
    );
    for name in copied {
        assert_eq!(
            o.tensor(name).unwrap().data(),
            i.tensor(name).unwrap().data()
        );
        assert_eq!(
            o.tensor(name).unwrap().dtype(),
            i.tensor(name).unwrap().dtype()
        );
    }
    // Every quantized weight has the SQNR NVFP4 / MXFP8 give Gaussian-like weights.
    for t in r.quantized() {
        let s = t.stats.unwrap();
        let lo = if scheme == Scheme::Nvfp4 { 15.0 } else { 28.0 };
        assert!(s.sqnr_db > lo && s.sqnr_db < lo + 15.0, "{}: {s:?}", t.name);
    }
}

fn json(p: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

#[test]
fn compressed_tensors_nvfp4_bytes_match_the_library() {
    let d = TempDir::new("ct4");
    let out = d.0.join("out");
    quantize(
        Scheme::Nvfp4,
        Layout::CompressedTensors,
        MxScale::Rceil,
        &out,
    );
    let n = assert_same_tensors(
        &out.join("input.safetensors"),
        &data("ct_nvfp4.safetensors"),
    );
    assert_eq!(n, 9);
    let cfg = json(&out.join("config.json"));
    let q = &cfg["quantization_config"];
    assert_eq!(q["format"], "nvfp4-pack-quantized");
    assert_eq!(q["quant_method"], "compressed-tensors");
    assert_eq!(q["config_groups"]["group_0"]["weights"]["group_size"], 16);
    assert_eq!(
        q["ignore"],
        serde_json::json!(["lm_head", "model.embed_tokens"])
    );
    assert!(!out.join("hf_quant_config.json").exists());

    // compressed-tensors' decompression of this output (BF16) = ours.
    let back = d.0.join("back");
    let opts = DequantizeOptions {
        dtype: FloatType::Bf16,
        reference: Some(data("input.safetensors")),
    };
    let r = dequantize_checkpoint(&out, &back, &opts, &NoProgress).unwrap();
    assert_eq!(
        assert_same_tensors(
            &back.join("input.safetensors"),
            &data("ct_nvfp4_decompressed.safetensors")
        ),
        3
    );
    let deq: Vec<_> = r
        .tensors
        .iter()
        .filter(|t| t.action == Action::Dequantized)
        .collect();
    assert_eq!(deq.len(), 3);
    assert!(deq.iter().all(|t| t.stats.unwrap().sqnr_db > 15.0));
    // config.json held only the quantization_config: nothing is left of it.
    assert!(!back.join("config.json").exists());
}

#[test]
fn modelopt_nvfp4_bytes_match_the_library() {
    let d = TempDir::new("mo");
    let out = d.0.join("out");
    quantize(Scheme::Nvfp4, Layout::ModelOpt, MxScale::Rceil, &out);
    let n = assert_same_tensors(
        &out.join("input.safetensors"),
        &data("modelopt_nvfp4.safetensors"),
    );
    assert_eq!(n, 9);
    let hf = json(&out.join("hf_quant_config.json"));
    assert_eq!(hf["quantization"]["quant_algo"], "NVFP4");
    assert_eq!(hf["quantization"]["group_size"], 16);
    let q = &json(&out.join("config.json"))["quantization_config"];
    assert_eq!(q["quant_method"], "modelopt");
    assert_eq!(q["quant_algo"], "NVFP4");

    // ModelOpt's NVFP4QTensor.dequantize(float32) of this output = ours.
    let back = d.0.join("back");
    let opts = DequantizeOptions {
        dtype: FloatType::F32,
        reference: None,
    };
    dequantize_checkpoint(&out, &back, &opts, &NoProgress).unwrap();
    assert_eq!(
        assert_same_tensors(
            &back.join("input.safetensors"),
            &data("modelopt_nvfp4_dequantized.safetensors")
        ),
        3
    );
}

#[test]
fn compressed_tensors_mxfp8_bytes_match_the_library() {
    let d = TempDir::new("ct8");
    let out = d.0.join("out");
    quantize(
        Scheme::Mxfp8,
        Layout::CompressedTensors,
        MxScale::CompressedTensors,
        &out,
    );
    let n = assert_same_tensors(
        &out.join("input.safetensors"),
        &data("ct_mxfp8.safetensors"),
    );
    assert_eq!(n, 6);
    let q = &json(&out.join("config.json"))["quantization_config"];
    assert_eq!(q["format"], "mxfp8-quantized");
}

#[test]
fn rceil_mxfp8_output_decompresses_in_compressed_tensors_as_here() {
    let d = TempDir::new("ct8r");
    let out = d.0.join("out");
    quantize(
        Scheme::Mxfp8,
        Layout::CompressedTensors,
        MxScale::Rceil,
        &out,
    );
    // RCEIL and compressed-tensors' rule differ on this input (significand 1.75, zero
    // blocks, -0.0), so the bytes differ from the library's own quantization ...
    let ours = std::fs::read(out.join("input.safetensors")).unwrap();
    let theirs = std::fs::read(data("ct_mxfp8.safetensors")).unwrap();
    let (o, t) = (
        SafeTensors::deserialize(&ours).unwrap(),
        SafeTensors::deserialize(&theirs).unwrap(),
    );
    let differing = LINEAR
        .iter()
        .filter(|p| {
            o.tensor(&format!("{p}.weight_scale")).unwrap().data()
                != t.tensor(&format!("{p}.weight_scale")).unwrap().data()
        })
        .count();
    assert!(differing > 0);
    // ... but the library decompresses them to what we do.
    let back = d.0.join("back");
    dequantize_checkpoint(&out, &back, &DequantizeOptions::default(), &NoProgress).unwrap();
    assert_eq!(
        assert_same_tensors(
            &back.join("input.safetensors"),
            &data("ct_mxfp8_rceil_decompressed.safetensors")
        ),
        3
    );
}

//! Calibrated activation scales in quantized checkpoints (`QuantizeOptions::input_amax`):
//! ModelOpt `input_scale`, compressed-tensors `input_global_scale`, against hand-computed
//! values; the refusals; and dequantization dropping them again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use fp_formats::checkpoint::{
    dequantize_checkpoint, quantize_checkpoint, write_f32_checkpoint, CheckpointError,
    DequantizeOptions, Layout, NoProgress, QuantizeOptions, Scheme,
};
use safetensors::{Dtype, SafeTensors};

struct TempDir(PathBuf);
impl TempDir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("fpf-ckcal-{tag}-{}", std::process::id()));
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

const UP: &str = "model.layers.0.mlp.up_proj";
const Q: &str = "model.layers.0.self_attn.q_proj";

fn input(dir: &Path) -> PathBuf {
    let w = |n: usize| -> Vec<f32> { (0..n).map(|i| (i % 13) as f32 / 16.0 - 0.4).collect() };
    let p = dir.join("model.safetensors");
    write_f32_checkpoint(
        &p,
        &[
            (&format!("{UP}.weight"), vec![8, 32], w(256)),
            (&format!("{Q}.weight"), vec![4, 32], w(128)),
            ("model.embed_tokens.weight", vec![10, 16], w(160)),
            ("model.norm.weight", vec![16], vec![1.0; 16]),
        ],
    )
    .unwrap();
    p
}

fn amax(up: f32, q: f32) -> BTreeMap<String, f32> {
    BTreeMap::from([(UP.to_string(), up), (Q.to_string(), q)])
}

fn opts(layout: Layout, input_amax: BTreeMap<String, f32>) -> QuantizeOptions {
    QuantizeOptions {
        layout,
        input_amax,
        no_stats: true,
        ..Default::default()
    }
}

/// `(dtype, shape, f32 value)` of a one-value F32 tensor.
fn scalar(file: &Path, name: &str) -> (Dtype, Vec<usize>, f32) {
    let bytes = std::fs::read(file).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor(name).unwrap();
    let d = t.data();
    assert_eq!(d.len(), 4, "{name}");
    (
        t.dtype(),
        t.shape().to_vec(),
        f32::from_le_bytes([d[0], d[1], d[2], d[3]]),
    )
}

fn config(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap()
}

#[test]
fn modelopt_input_scale_is_amax_over_2688() {
    let t = TempDir::new("mo");
    let inp = input(&t.0);
    let out = t.0.join("out");
    quantize_checkpoint(
        &inp,
        &out,
        &opts(Layout::ModelOpt, amax(3.5, 0.75)),
        &NoProgress,
    )
    .unwrap();
    let f = out.join("model.safetensors");
    // 3.5 / 2688 and 0.75 / 2688, rounded once to f32 (checked against the f64 quotient).
    for (m, a) in [(UP, 3.5f64), (Q, 0.75)] {
        let (dt, shape, v) = scalar(&f, &format!("{m}.input_scale"));
        assert_eq!((dt, shape), (Dtype::F32, vec![]));
        assert_eq!(v, (a / 2688.0) as f32, "{m}");
        // ModelOpt's input_scale uses the same formula as weight_scale_2.
        assert_eq!(
            v,
            fp_formats::checkpoint::layouts::modelopt_input_scale(a as f32)
        );
    }
    assert_eq!(scalar(&f, &format!("{UP}.input_scale")).2, 0.0013020834);
    // The config already describes NVFP4 activations (W4A4).
    let hf: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("hf_quant_config.json")).unwrap())
            .unwrap();
    assert_eq!(hf["quantization"]["quant_algo"], "NVFP4");
    // The embedding and the norm get none.
    let bytes = std::fs::read(&f).unwrap();
    let names = SafeTensors::deserialize(&bytes).unwrap().names().len();
    assert_eq!(names, 2 * 4 + 2);
}

#[test]
fn compressed_tensors_input_global_scale_is_the_reciprocal_convention() {
    let t = TempDir::new("ct");
    let inp = input(&t.0);
    let out = t.0.join("out");
    quantize_checkpoint(
        &inp,
        &out,
        &opts(Layout::CompressedTensors, amax(0.4375, 2688.0)),
        &NoProgress,
    )
    .unwrap();
    let f = out.join("model.safetensors");
    let (dt, shape, v) = scalar(&f, &format!("{UP}.input_global_scale"));
    assert_eq!((dt, shape), (Dtype::F32, vec![1]));
    // PyTorch's `2688 / amax` is `reciprocal(amax) * 2688`: fl(2.2857143 * 2688) = 6144.0005,
    // not the correctly rounded 6144.
    let recip = 1.0f32 / 0.4375;
    assert_eq!(recip, 2.2857143);
    assert_eq!(v, recip * 2688.0);
    assert_eq!(v, 6144.0005);
    assert_eq!(scalar(&f, &format!("{Q}.input_global_scale")).2, 1.0);
    // The NVFP4 (W4A4) scheme: calibrated global scale, block scales at run time.
    let c = config(&out);
    let ia = &c["quantization_config"]["config_groups"]["group_0"]["input_activations"];
    assert_eq!(ia["num_bits"], 4);
    assert_eq!(ia["strategy"], "tensor_group");
    assert_eq!(ia["dynamic"], "local");
    assert_eq!(ia["group_size"], 16);
    assert_eq!(ia["observer"], "static_minmax");

    // Without calibration the scheme stays weight-only.
    let out2 = t.0.join("out2");
    quantize_checkpoint(
        &inp,
        &out2,
        &opts(Layout::CompressedTensors, BTreeMap::new()),
        &NoProgress,
    )
    .unwrap();
    let c = config(&out2);
    assert!(c["quantization_config"]["config_groups"]["group_0"]["input_activations"].is_null());

    // Dequantization drops the activation scales with the quantized weights.
    let back = t.0.join("back");
    dequantize_checkpoint(&out, &back, &DequantizeOptions::default(), &NoProgress).unwrap();
    let bytes = std::fs::read(back.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "model.embed_tokens.weight",
            "model.layers.0.mlp.up_proj.weight",
            "model.layers.0.self_attn.q_proj.weight",
            "model.norm.weight"
        ]
    );
}

#[test]
fn bad_calibrations_are_refused_and_nothing_is_written() {
    let t = TempDir::new("bad");
    let inp = input(&t.0);
    let out = t.0.join("out");
    let refuse = |o: QuantizeOptions, needle: &str| {
        let e = quantize_checkpoint(&inp, &out, &o, &NoProgress).unwrap_err();
        assert!(matches!(e, CheckpointError::Options(_)), "{e}");
        assert!(e.to_string().contains(needle), "{e}");
        assert!(!out.exists());
        let left: Vec<_> = std::fs::read_dir(&t.0).unwrap().collect();
        assert_eq!(left.len(), 1, "only the input remains");
    };
    for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        refuse(
            opts(Layout::ModelOpt, amax(bad, 1.0)),
            "finite and positive",
        );
    }
    // 1 / 1e-45 overflows: no finite compressed-tensors global scale.
    refuse(
        opts(Layout::CompressedTensors, amax(1e-45, 1.0)),
        "finite and positive",
    );
    let mut partial = amax(1.0, 1.0);
    partial.remove(Q);
    refuse(
        opts(Layout::ModelOpt, partial),
        "every quantized layer or none",
    );
    let mut extra = amax(1.0, 1.0);
    extra.insert("model.embed_tokens".into(), 1.0);
    refuse(
        opts(Layout::ModelOpt, extra),
        "not a quantized linear layer",
    );
    let mx = QuantizeOptions {
        scheme: Scheme::Mxfp8,
        ..opts(Layout::CompressedTensors, amax(1.0, 1.0))
    };
    refuse(mx, "MXFP8");
}

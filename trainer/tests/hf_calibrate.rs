//! Activation calibration (`trainer::calibrate`) and `trainer export --quantize nvfp4
//! --calibrate N`: amaxes against values computed by hand, the exported `input_scale` /
//! `input_global_scale` against ModelOpt's and compressed-tensors' formulas, the refusals.

mod common;
use common::trainer;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use autograd::ParamStore;
use trainer::calibrate::{calibrate_checkpoint, input_amax, CalibrateError};
use trainer::data::Batch;
use trainer::model::{Gpt, ModelConfig};
use trainer::recipe::Recipe;

struct TempDir(PathBuf);
impl TempDir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("nibble-hfcal-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn path(&self, p: &str) -> String {
        self.0.join(p).to_str().unwrap().to_string()
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn batch(tokens: Vec<u32>, rows: usize) -> Batch {
    let seq = tokens.len() / rows;
    Batch {
        targets: tokens.clone(),
        inputs: tokens,
        batch: rows,
        seq,
    }
}

/// `max |rmsnorm(embed[t])|` of one token, computed here in f64 (gain 1 at initialisation).
fn normed_amax(embed: &[f32], d: usize, t: u32, eps: f32) -> f64 {
    let row = &embed[t as usize * d..(t as usize + 1) * d];
    let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / d as f64;
    let r = 1.0 / (ms + eps as f64).sqrt();
    row.iter()
        .map(|&v| (v as f64 * r).abs())
        .fold(0.0, f64::max)
}

#[test]
fn amax_of_the_first_linear_is_the_normed_embedding_of_every_row() {
    let cfg = ModelConfig::preset("tiny").unwrap();
    let (d, eps) = (cfg.d_model, cfg.norm_eps);
    let mut ps = ParamStore::new();
    let model = Gpt::new(&mut ps, cfg, 3).unwrap();
    let embed = ps.value(model.embed).unwrap().to_vec();
    // The token with the largest normed row, placed only at row 400 of a 16x32 batch: beyond
    // the 256 rows a probe keeps, so an amax of the kept rows only would miss it.
    let amax_of = |t| normed_amax(&embed, d, t, eps);
    let top = (0..256u32)
        .max_by(|&a, &b| amax_of(a).total_cmp(&amax_of(b)))
        .unwrap();
    let filler: Vec<u32> = (0..256u32).filter(|&t| t != top).collect();
    let mut tokens: Vec<u32> = (0..512).map(|i| filler[i * 7 % filler.len()]).collect();
    tokens[400] = top;
    let fp32 = Recipe::builtin("fp32").unwrap();
    let a = input_amax(&model, &mut ps, &fp32, [batch(tokens.clone(), 16)]).unwrap();
    assert_eq!(a.len(), 9);
    assert_eq!(a[0].name, "blocks.0.attn.qkv");
    let expect = amax_of(top);
    assert!(
        ((a[0].amax as f64) - expect).abs() <= 4e-7 * expect,
        "{} vs {expect}",
        a[0].amax
    );
    // Without the top token the amax is that of the filler's largest row.
    let second = filler.iter().map(|&t| amax_of(t)).fold(0.0, f64::max);
    assert!(second < expect * 0.999, "the test needs a unique top row");

    // Over several batches: the maximum of the per-batch amaxes, bit for bit; the same
    // bits on a second run.
    let b1 = batch(tokens[..256].to_vec(), 8);
    let b2 = batch(tokens[256..].to_vec(), 8);
    let both = input_amax(&model, &mut ps, &fp32, [b1.clone(), b2.clone()]).unwrap();
    let one = input_amax(&model, &mut ps, &fp32, [b1]).unwrap();
    let two = input_amax(&model, &mut ps, &fp32, [b2]).unwrap();
    for ((x, y), z) in both.iter().zip(&one).zip(&two) {
        assert_eq!(x.amax, y.amax.max(z.amax), "{}", x.name);
        assert!(x.amax > 0.0 && x.amax.is_finite());
    }
    assert_eq!(both[0].amax, a[0].amax);
    let again = input_amax(&model, &mut ps, &fp32, [batch(tokens, 16)]).unwrap();
    assert_eq!(again, a);

    // No batch at all.
    let none: [Batch; 0] = [];
    let e = input_amax(&model, &mut ps, &fp32, none).unwrap_err();
    assert!(matches!(e, CalibrateError::BadBatchCount(0)), "{e}");
}

fn scalars(p: &Path) -> BTreeMap<String, (Vec<usize>, f32)> {
    let b = std::fs::read(p).unwrap();
    let st = safetensors::SafeTensors::deserialize(&b).unwrap();
    st.tensors()
        .into_iter()
        .filter(|(n, _)| n.ends_with(".input_scale") || n.ends_with(".input_global_scale"))
        .map(|(n, t)| {
            let d = t.data();
            (
                n,
                (
                    t.shape().to_vec(),
                    f32::from_le_bytes([d[0], d[1], d[2], d[3]]),
                ),
            )
        })
        .collect()
}

#[test]
fn calibrated_nvfp4_exports_carry_the_producers_activation_scales() {
    let d = TempDir::new("cli");
    let run = d.path("run");
    let o = trainer(&[
        "train", "--preset", "tiny", "--steps", "2", "--recipe", "nvfp4", "--quiet", "--out", &run,
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let ck = trainer::checkpoint::load(Path::new(&run)).unwrap();
    let amax: BTreeMap<String, f32> = calibrate_checkpoint(&ck, 3)
        .unwrap()
        .into_iter()
        .map(|a| (a.name, a.amax))
        .collect();

    let mo = d.path("mo");
    let o = trainer(&[
        "export",
        &run,
        "--out",
        &mo,
        "--quantize",
        "nvfp4",
        "--calibrate",
        "3",
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    assert!(common::stdout(&o).contains("calibrated on 3 batches"));
    let s = scalars(&Path::new(&mo).join("model.safetensors"));
    assert_eq!(s.len(), 2 * 7, "{s:?}"); // q, k, v, o, gate, up, down per layer
    for i in 0..2 {
        let l = format!("model.layers.{i}");
        for (module, nibble) in [
            ("self_attn.q_proj", "attn.qkv"),
            ("self_attn.k_proj", "attn.qkv"),
            ("self_attn.v_proj", "attn.qkv"),
            ("self_attn.o_proj", "attn.out"),
            ("mlp.gate_proj", "mlp.up"),
            ("mlp.up_proj", "mlp.up"),
            ("mlp.down_proj", "mlp.down"),
        ] {
            let a = amax[&format!("blocks.{i}.{nibble}")];
            let (shape, v) = &s[&format!("{l}.{module}.input_scale")];
            assert!(shape.is_empty());
            assert_eq!(*v, a / 2688.0, "{l}.{module}");
        }
    }

    let ct = d.path("ct");
    let o = trainer(&[
        "export",
        &run,
        "--out",
        &ct,
        "--quantize",
        "nvfp4",
        "--layout",
        "compressed-tensors",
        "--calibrate",
        "3",
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let s = scalars(&Path::new(&ct).join("model.safetensors"));
    assert_eq!(s.len(), 2 * 7);
    let a = amax["blocks.1.mlp.down"];
    let (shape, v) = &s["model.layers.1.mlp.down_proj.input_global_scale"];
    assert_eq!(shape, &[1]);
    assert_eq!(*v, (1.0 / a) * 2688.0);
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(Path::new(&ct).join("config.json")).unwrap())
            .unwrap();
    let ia = &cfg["quantization_config"]["config_groups"]["group_0"]["input_activations"];
    assert_eq!(ia["dynamic"], "local");

    // Refusals: N = 0, more batches than the validation split holds, MXFP8, no --quantize;
    // nothing is written.
    for (args, needle) in [
        (
            vec!["--quantize", "nvfp4", "--calibrate", "0"],
            "1..=100000 batches, got 0",
        ),
        (
            vec!["--quantize", "nvfp4", "--calibrate", "100000"],
            "100000 requested",
        ),
        (
            vec![
                "--quantize",
                "mxfp8",
                "--layout",
                "compressed-tensors",
                "--calibrate",
                "2",
            ],
            "NVFP4",
        ),
        (vec!["--calibrate", "2"], "--quantize"),
    ] {
        let out = d.path("bad");
        let mut a = vec!["export", run.as_str(), "--out", out.as_str()];
        a.extend(args);
        let o = trainer(&a);
        assert!(!o.status.success());
        let e = common::stderr(&o);
        assert!(e.contains(needle), "{needle}: {e}");
        assert!(!Path::new(&out).exists());
    }
}

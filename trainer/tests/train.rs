//! Training-loop tests on tiny models: exact resume, every recipe learns, the divergence
//! guard, sampling, reports.

mod common;
use common::opts;

use std::path::Path;

use trainer::checkpoint;
use trainer::data::DataSource;
use trainer::model::{MlpKind, ModelConfig};
use trainer::recipe::{Recipe, BUILTIN_NAMES};
use trainer::report::{self, RunResult};
use trainer::sample::{SampleConfig, Sampler};
use trainer::train::{read_metrics, RunConfig, TrainConfig, TrainError, Trainer};

/// A tiny run: 3 blocks (so recipes that keep the first and last block in BF16 still
/// quantize one), d 32, seq 32, batch 8, on 150 KB of the default corpus.
fn tiny(steps: u64) -> RunConfig {
    RunConfig {
        model: ModelConfig {
            vocab: 256,
            d_model: 32,
            n_layers: 3,
            n_heads: 2,
            hidden: 64,
            mlp: MlpKind::Swiglu,
            seq: 32,
            tie_embeddings: false,
            rope_base: 10_000.0,
            norm_eps: 1e-5,
        },
        train: TrainConfig {
            steps,
            batch: 8,
            grad_accum: 1,
            lr: 1e-2,
            warmup_steps: 3,
            eval_every: 5,
            eval_batches: 2,
            ..TrainConfig::default()
        },
        data: DataSource::Corpus {
            seed: 1,
            bytes: 150_000,
        },
    }
}

/// 80 steps of 16 rows: enough for every recipe to learn bigram-level statistics.
fn learn_cfg() -> RunConfig {
    let mut c = tiny(80);
    c.train.batch = 16;
    c.train.warmup_steps = 8;
    c.train.eval_every = 20;
    c
}

fn losses(dir: &Path) -> Vec<(u64, u32, Option<u32>)> {
    read_metrics(&dir.join("metrics.jsonl"))
        .unwrap()
        .iter()
        .map(|m| (m.step, m.train_loss.to_bits(), m.val_loss.map(f32::to_bits)))
        .collect()
}

#[test]
fn resume_equals_uninterrupted_bitwise() {
    // fp8-delayed exercises the amax histories in the state file, nvfp4 the stochastic
    // rounding streams and the late switch to BF16; grad_accum 2 the accumulation.
    for recipe in ["fp8-delayed", "nvfp4"] {
        let tmp = tempfile::tempdir().unwrap();
        let mut cfg = tiny(12);
        cfg.train.grad_accum = 2;
        let r = Recipe::builtin(recipe).unwrap();
        let a = tmp.path().join("a");
        let sa = Trainer::new(cfg.clone(), r.clone(), opts(&a))
            .unwrap()
            .run()
            .unwrap();
        let b = tmp.path().join("b");
        let mut o = opts(&b);
        o.stop_after = Some(7); // not an evaluation step: the stop writes its own checkpoint
        let mut first = Trainer::new(cfg, r, o).unwrap();
        first.run().unwrap();
        assert_eq!(first.step(), 7);
        drop(first);
        let mut resumed = Trainer::resume(&b, opts(&b)).unwrap();
        assert_eq!(resumed.step(), 7);
        let sb = resumed.run().unwrap();
        assert_eq!(losses(&a), losses(&b), "{recipe}");
        assert_eq!(losses(&a).len(), 12);
        assert_eq!(sa.final_val_loss.to_bits(), sb.final_val_loss.to_bits());
        // identical parameters at the end
        let ca = checkpoint::load(&a).unwrap();
        let cb = checkpoint::load(&b).unwrap();
        assert_eq!(ca.state.step, 12);
        assert_eq!(ca.tensors, cb.tensors, "{recipe}");
        assert_eq!(ca.optimizer, cb.optimizer);
        assert_eq!(ca.state.quant_states, cb.state.quant_states);
        if recipe == "fp8-delayed" {
            assert!(ca
                .state
                .quant_states
                .iter()
                .any(|s| s.operands.iter().any(|o| o.amax_history.len() == 16)));
        }
    }
}

#[test]
fn every_builtin_recipe_learns_below_the_unigram_entropy() {
    let tmp = tempfile::tempdir().unwrap();
    let mut results = Vec::new();
    for name in BUILTIN_NAMES {
        let dir = tmp.path().join(name);
        let mut tr = Trainer::new(learn_cfg(), Recipe::builtin(name).unwrap(), opts(&dir)).unwrap();
        let s = tr.run().unwrap();
        assert!(
            (s.final_val_loss as f64) < s.unigram_nats - 0.3,
            "{name}: val loss {} vs unigram entropy {}",
            s.final_val_loss,
            s.unigram_nats
        );
        assert!(dir.join("summary.json").is_file());
        let metrics = read_metrics(&dir.join("metrics.jsonl")).unwrap();
        assert_eq!(metrics.len(), 80);
        results.push(RunResult {
            seed: 0,
            summary: s,
            metrics,
        });
    }
    // quantized recipes report per-layer errors of their quantized layers
    let nv = results
        .iter()
        .find(|r| r.summary.recipe == "nvfp4")
        .unwrap();
    let mid = nv
        .summary
        .layers
        .iter()
        .find(|l| l.layer == "blocks.1.mlp.up")
        .unwrap();
    let sqnr = mid.x.sqnr_db.unwrap();
    assert!((10.0..40.0).contains(&sqnr), "{sqnr}");
    let rep = tmp.path().join("report");
    report::write_report(&rep, &results, "# test\n", report::DEFAULT_REFERENCE).unwrap();
    let md = std::fs::read_to_string(rep.join("report.md")).unwrap();
    assert!(md.contains("| nvfp4 |") && md.contains("gap to bf16"));
    assert!(md.contains("### nvfp4"));
    let svg = std::fs::read_to_string(rep.join("loss.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("nvfp4"));
}

#[test]
fn nan_guard_stops_and_keeps_the_last_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tiny(20);
    let dir = tmp.path().join("run");
    let mut tr = Trainer::new(cfg, Recipe::builtin("nvfp4").unwrap(), opts(&dir)).unwrap();
    tr.set_inject_nan_at_step(Some(8));
    let err = tr.run().unwrap_err();
    match &err {
        TrainError::Diverged {
            step, bad_layers, ..
        } => {
            assert_eq!(*step, 8);
            assert!(
                bad_layers.contains("blocks.0.attn.qkv.weight"),
                "{bad_layers}"
            );
        }
        other => panic!("expected Diverged, got {other}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("step 8") && msg.contains("step-00000005"),
        "{msg}"
    );
    assert!(std::fs::read_to_string(dir.join("diagnosis.txt"))
        .unwrap()
        .contains("diverged"));
    // the last good checkpoint (step 5) is what `latest` names, and it loads and resumes
    let ck = checkpoint::load(&dir).unwrap();
    assert_eq!(ck.state.step, 5);
    let resumed = Trainer::resume(&dir, opts(&tmp.path().join("again"))).unwrap();
    assert_eq!(resumed.step(), 5);
    assert!(!dir.join("summary.json").exists());
}

#[test]
fn explosion_guard_trips_after_warmup() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = tiny(20);
    cfg.train.lr = 30.0; // absurd: the loss blows up
    cfg.train.clip = 1e9;
    cfg.train.warmup_steps = 1;
    let mut tr = Trainer::new(cfg, Recipe::builtin("bf16").unwrap(), opts(tmp.path())).unwrap();
    match tr.run() {
        Err(TrainError::Diverged { reason, .. }) => {
            assert!(
                reason.contains("exploded") || reason.contains("non-finite"),
                "{reason}"
            )
        }
        other => panic!(
            "expected Diverged, got {:?}",
            other.map(|s| s.final_val_loss)
        ),
    }
}

#[test]
fn sampling_is_seeded_and_runs_at_any_precision() {
    let tmp = tempfile::tempdir().unwrap();
    Trainer::new(tiny(5), Recipe::builtin("bf16").unwrap(), opts(tmp.path()))
        .unwrap()
        .run()
        .unwrap();
    let cfg = SampleConfig {
        tokens: 12,
        temperature: 0.8,
        top_k: 10,
        top_p: 1.0,
        stop: vec![],
        seed: 3,
    };
    let prompt: Vec<u32> = b"Once".iter().map(|&b| b as u32).collect();
    let mut outs = Vec::new();
    for recipe in ["bf16", "nvfp4", "mxfp8", "bf16"] {
        let mut s = Sampler::load(tmp.path(), Recipe::builtin(recipe).unwrap()).unwrap();
        let out = s.generate(&prompt, &cfg).unwrap();
        assert_eq!(out.len(), 12);
        assert!(out.iter().all(|&t| t < 256));
        outs.push(out);
    }
    assert_eq!(outs[0], outs[3]); // seeded
    let mut s = Sampler::load(tmp.path(), Recipe::builtin("bf16").unwrap()).unwrap();
    let greedy = SampleConfig {
        temperature: 0.0,
        ..cfg.clone()
    };
    assert_eq!(
        s.generate(&prompt, &greedy).unwrap(),
        s.generate(&prompt, &greedy).unwrap()
    );
    assert!(s.generate(&[], &cfg).is_err());
    assert!(s.generate(&[300], &cfg).is_err());
}

#[test]
fn tied_embeddings_and_gelu_train() {
    let tmp = tempfile::tempdir().unwrap();
    // tied tiny models sit on a plateau near the unigram entropy for ~100 steps first
    let mut cfg = learn_cfg();
    cfg.train.steps = 200;
    cfg.train.eval_every = 50;
    cfg.model.tie_embeddings = true;
    cfg.model.mlp = MlpKind::Gelu;
    let n = cfg.model.num_params();
    let mut tr = Trainer::new(cfg, Recipe::builtin("mxfp8").unwrap(), opts(tmp.path())).unwrap();
    assert_eq!(tr.params().num_elements(), n);
    let s = tr.run().unwrap();
    assert!(
        (s.final_val_loss as f64) < s.unigram_nats - 0.3,
        "{}",
        s.final_val_loss
    );
}

#[test]
fn presets_have_the_advertised_sizes() {
    let sizes: Vec<(String, usize)> = trainer::model::PRESET_NAMES
        .iter()
        .map(|p| (p.to_string(), ModelConfig::preset(p).unwrap().num_params()))
        .collect();
    let get = |n: &str| sizes.iter().find(|(p, _)| p == n).unwrap().1;
    assert!(
        get("small") > 500_000 && get("small") < 1_500_000,
        "{sizes:?}"
    );
    assert!(
        get("medium") > 20_000_000 && get("medium") < 30_000_000,
        "{sizes:?}"
    );
    assert!(
        get("large") > 90_000_000 && get("large") < 130_000_000,
        "{sizes:?}"
    );
    for p in trainer::model::PRESET_NAMES {
        ModelConfig::preset(p).unwrap().validate().unwrap();
    }
}

#[test]
fn op_profiling_times_every_op_of_the_step_and_changes_no_bits() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = tiny(3);
    cfg.train.grad_accum = 2;
    let make = |dir: &str| {
        Trainer::new(
            cfg.clone(),
            Recipe::builtin("nvfp4").unwrap(),
            opts(&tmp.path().join(dir)),
        )
        .unwrap()
    };
    let (mut plain, mut timed) = (make("plain"), make("timed"));
    timed.set_op_profiling(true);
    for _ in 0..2 {
        plain.train_step().unwrap();
        timed.train_step().unwrap();
    }
    assert!(plain.last_op_profile().is_none(), "off by default");
    let p = timed
        .last_op_profile()
        .expect("a profile after a profiled step");
    let calls = |op: &str, fwd: bool| {
        p.entries()
            .iter()
            .find(|e| e.op == op && e.forward == fwd)
            .map(|e| (e.calls, e.seconds))
    };
    // 3 blocks x (QKV, output, gate-and-up, down) + the LM head, per micro-batch, summed
    // over the step's two micro-batches
    for fwd in [true, false] {
        let (n, s) = calls("linear", fwd).expect("linear timed");
        assert_eq!(n, 2 * (3 * 4 + 1), "linear calls (forward {fwd})");
        assert!(s > 0.0);
    }
    assert!(calls("cross_entropy", true).is_some() && calls("rmsnorm", false).is_some());
    // the timer only reads the clock: the same parameters bit for bit
    for id in plain.params().ids() {
        let (a, b) = (
            plain.params().value(id).unwrap(),
            timed.params().value(id).unwrap(),
        );
        assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()));
    }
    timed.set_op_profiling(false);
    assert!(timed.last_op_profile().is_none());
}

//! Training on the CUDA device path, with `kernels-cuda`'s CPU emulator standing in for the
//! GPU (`DeviceBackend::emulated`): a tiny BF16 run's losses match the CPU run's, and a
//! checkpoint written by an emulated-device run resumes on the CPU and the reverse (the
//! checkpoint is the same file on either device). Without a C++20 compiler the test prints
//! `SKIP` and returns.

mod common;
use common::opts;

use std::path::Path;
use std::sync::Arc;

use autograd::backend::DeviceBackend;
use kernels_cuda::emu::{Emu, EmuError};
use trainer::checkpoint;
use trainer::data::DataSource;
use trainer::model::{MlpKind, ModelConfig};
use trainer::recipe::Recipe;
use trainer::train::{read_metrics, RunConfig, TrainConfig, Trainer};

fn cfg() -> RunConfig {
    RunConfig {
        model: ModelConfig {
            vocab: 256,
            d_model: 32,
            n_layers: 1,
            n_heads: 2,
            hidden: 64,
            mlp: MlpKind::Swiglu,
            seq: 16,
            tie_embeddings: false,
            rope_base: 10_000.0,
            norm_eps: 1e-5,
        },
        train: TrainConfig {
            steps: 4,
            batch: 4,
            grad_accum: 1,
            lr: 1e-2,
            warmup_steps: 2,
            eval_every: 2,
            eval_batches: 2,
            ..TrainConfig::default()
        },
        data: DataSource::Corpus {
            seed: 3,
            bytes: 40_000,
        },
    }
}

fn losses(dir: &Path) -> Vec<f32> {
    let m = read_metrics(&dir.join("metrics.jsonl")).unwrap();
    m.iter().map(|m| m.train_loss).collect()
}

/// Runs `cfg()` under BF16: the first `split` steps on `first`, the rest (resumed from the
/// checkpoint the stop writes) on `second`.
fn run(
    dir: &Path,
    split: u64,
    first: Option<&Arc<DeviceBackend>>,
    second: Option<&Arc<DeviceBackend>>,
) {
    let r = Recipe::builtin("bf16").unwrap();
    let mut o = opts(dir);
    o.stop_after = Some(split);
    let mut a = Trainer::new(cfg(), r, o).unwrap();
    a.set_device(first.cloned());
    a.run().unwrap();
    drop(a);
    let mut b = Trainer::resume(dir, opts(dir)).unwrap();
    assert_eq!(b.step(), split);
    b.set_device(second.cloned());
    b.run().unwrap();
}

/// Bound: one step's loss and gradients on the device are within 2e-3 of the CPU's under
/// BF16 operands (autograd's `tiny_model_graph_step_on_device_matches_cpu`, measured 2.5e-5);
/// AdamW's update is nearly scale-free in the gradient, so over 4 steps at lr 1e-2 the
/// parameters and hence the losses move apart by a few such differences: 1e-2 relative is
/// asserted, the measured value printed. (Evaluation also runs on the device after its first
/// batch: the second of the two evaluation batches here.)
#[test]
fn emulated_device_training_matches_cpu_and_resumes_across_devices() {
    let emu = match Emu::shared() {
        Ok(e) => e,
        Err(e @ (EmuError::NoCompiler(_) | EmuError::NoCxx20(..))) => {
            eprintln!("SKIP: {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let dev = DeviceBackend::emulated(emu).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let (cpu, d2c, c2d) = (
        tmp.path().join("cpu"),
        tmp.path().join("dev-then-cpu"),
        tmp.path().join("cpu-then-dev"),
    );
    run(&cpu, 2, None, None);
    run(&d2c, 2, Some(&dev), None);
    run(&c2d, 2, None, Some(&dev));
    let (lc, ld, lr) = (losses(&cpu), losses(&d2c), losses(&c2d));
    assert_eq!((lc.len(), ld.len(), lr.len()), (4, 4, 4));
    let rel = |a: &[f32]| {
        a.iter()
            .zip(&lc)
            .map(|(x, y)| ((x - y) / y).abs())
            .fold(0.0f32, f32::max)
    };
    eprintln!(
        "cpu losses {lc:?}\ndevice then cpu: worst rel {:.2e}; cpu then device: worst rel {:.2e}",
        rel(&ld),
        rel(&lr)
    );
    assert!(rel(&ld) <= 1e-2 && rel(&lr) <= 1e-2);
    // the CPU-first run equals the CPU run bit for bit until the switch
    assert_eq!(lr[..2], lc[..2]);
    // the device really ran: its losses are not the CPU's bits
    assert_ne!(ld[..2], lc[..2]);
    for d in [&cpu, &d2c, &c2d] {
        assert_eq!(checkpoint::load(d).unwrap().state.step, 4);
    }
}

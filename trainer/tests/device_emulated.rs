//! Training on the CUDA device path, with `kernels-cuda`'s CPU emulator standing in for the
//! GPU (`DeviceBackend::emulated`): a tiny BF16 run's losses match the CPU run's, and a
//! checkpoint written by an emulated-device run resumes on the CPU and the reverse (the
//! checkpoint is the same file on either device); an NVFP4 run (quantized device linear,
//! device AdamW) matches the CPU run, and the store stays on the device between steps.
//! Without a C++20 compiler the tests print `SKIP` and return.

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

/// The emulated device, or `None` (after printing `SKIP`) without a C++20 compiler.
fn device() -> Option<Arc<DeviceBackend>> {
    match Emu::shared() {
        Ok(e) => Some(DeviceBackend::emulated(e).unwrap()),
        Err(e @ (EmuError::NoCompiler(_) | EmuError::NoCxx20(..))) => {
            eprintln!("SKIP: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

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
    a.set_device(first.cloned()).unwrap();
    a.run().unwrap();
    drop(a);
    let mut b = Trainer::resume(dir, opts(dir)).unwrap();
    assert_eq!(b.step(), split);
    b.set_device(second.cloned()).unwrap();
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
    let Some(dev) = device() else { return };
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

/// NVFP4 (`nvfp4-no-bf16-layers`: the one block's linear layers quantized, 1x16 / 16x16,
/// stochastic rounding, RHT) on the device: the quantized device linear and the device
/// optimizer. Bound as for BF16 above: one step's loss and gradients are within 1e-4 of the
/// CPU's (autograd's `tiny_model_graph_step_on_device_matches_cpu`; quantized operands equal
/// the CPU's unless an input within ~1e-6 of a rounding boundary flips a code, which this data
/// does not hit), the device AdamW is optim's arithmetic bit for bit, so 4 steps at lr 1e-2 stay
/// within 1e-2 relative; measured values printed (identical on this data). Between steps the store stays on the device
/// (`train_step` leaves it there; a checkpoint brings it back).
#[test]
fn emulated_device_nvfp4_training_matches_cpu() {
    let Some(dev) = device() else { return };
    let r = Recipe::builtin("nvfp4-no-bf16-layers").unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let (cpu, on_dev) = (tmp.path().join("cpu"), tmp.path().join("dev"));
    let mut c = Trainer::new(cfg(), r.clone(), opts(&cpu)).unwrap();
    c.run().unwrap();
    let mut d = Trainer::new(cfg(), r, opts(&on_dev)).unwrap();
    d.set_device(Some(dev)).unwrap();
    let s1 = d.train_step().unwrap();
    assert_eq!(d.params().device(), autograd::Device::Cuda);
    d.save_checkpoint().unwrap();
    assert_eq!(d.params().device(), autograd::Device::Cpu);
    drop(d);
    let mut d = Trainer::resume(&on_dev, opts(&on_dev)).unwrap();
    d.set_device(device()).unwrap();
    d.run().unwrap();
    let (lc, ld) = (losses(&cpu), losses(&on_dev));
    assert_eq!((lc.len(), ld.len()), (4, 3)); // the first step ran outside `run`
    let mut ld = ld;
    ld.insert(0, s1.loss);
    let rel = ld
        .iter()
        .zip(&lc)
        .map(|(x, y)| ((x - y) / y).abs())
        .fold(0.0f32, f32::max);
    eprintln!("nvfp4 cpu losses {lc:?}\ndevice losses {ld:?}: worst rel {rel:.2e}");
    // (measured: identical - NVFP4 operands have so few significant bits that these short
    // sums are exact in f32 in any order; the device ran: the store was there after step 1)
    assert!(rel <= 1e-2, "{rel}");
    assert_eq!(checkpoint::load(&on_dev).unwrap().state.step, 4);
}

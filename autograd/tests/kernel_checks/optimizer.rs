//! The optimizer step of a device store (`ParamStore::device_grad_norm`, `device_adamw`,
//! `DeviceMoments`) against optim's host step on a CPU store, bit for bit: three steps of
//! gradient norm, clipping and AdamW with two parameter groups, a parameter without a
//! gradient, and a tensor over several of optim's 16K chunks.

use std::sync::Arc;

use autograd::backend::{AdamWCoeffs, DeviceBackend, DeviceMoments};
use autograd::{init, Graph, ParamId, ParamStore};
use optim::{AdamW, AdamWConfig, ParamGroup, ParamSpec};

use super::same_bits;

const SIZES: [usize; 3] = [40_000, 17, 300];

/// A store of three parameters; the step's gradients: `d(sum(x ⊙ p))/dp = x` for the first
/// two (the third gets none).
fn store() -> (ParamStore, Vec<ParamId>) {
    let mut ps = ParamStore::new();
    let ids = SIZES
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            ps.add(&format!("p{i}"), &[n], init::normal(n, 1.0, 80 + i as u64))
                .unwrap()
        })
        .collect();
    (ps, ids)
}

fn backward(ps: &mut ParamStore, ids: &[ParamId], step: u64) {
    let mut g = Graph::new(ps);
    let mut total = None;
    for (i, &id) in ids.iter().take(2).enumerate() {
        let x = init::normal(SIZES[i], 0.5 * step as f32, 90 + step * 7 + i as u64);
        let x = g.input(&x, &[SIZES[i]]).unwrap();
        let p = g.param(id).unwrap();
        let y = g.mul(x, p).unwrap();
        let s = g.sum(y).unwrap();
        total = Some(match total {
            None => s,
            Some(t) => g.add(t, s).unwrap(),
        });
    }
    g.backward(total.unwrap()).unwrap();
}

fn optimizer() -> AdamW {
    let cfg = AdamWConfig {
        beta2: 0.95,
        ..AdamWConfig::default()
    };
    let groups = [ParamGroup::new(0.1, 1.0), ParamGroup::no_decay()];
    let specs: Vec<ParamSpec> = SIZES
        .iter()
        .enumerate()
        .map(|(i, &n)| ParamSpec::new(n, usize::from(i == 1)))
        .collect();
    AdamW::with_groups(cfg, &groups, &specs).unwrap()
}

/// Three steps (clip at 1.0: the later steps' gradients clip) on the host and on `dev`.
pub fn device_optimizer_step_matches_optim(dev: &Arc<DeviceBackend>) {
    let (mut hp, ids) = store();
    let (mut dp, _) = store();
    let (mut ho, mut dopt) = (optimizer(), optimizer());
    dp.to_device(dev).unwrap();
    let mut mom = DeviceMoments::zeros(&dp).unwrap();
    for step in 1..=3u64 {
        let lr = 1e-3 * step as f32;
        backward(&mut hp, &ids, step);
        backward(&mut dp, &ids, step);
        let hn = optim::grad_norm(&hp.grads());
        let dn = dp.device_grad_norm().unwrap();
        same_bits(&format!("grad norm step {step}"), &[dn], &[hn]);
        let clip = optim::clip_coefficient(hn, 1.0).unwrap();
        {
            let (mut v, g) = hp.params_and_grads();
            ho.step_scaled(&mut v, &g, lr, clip).unwrap();
        }
        let cfg = *dopt.config();
        let t = dopt.step_count() + 1;
        let coeffs: Vec<AdamWCoeffs> = dopt
            .param_lr_wd(lr)
            .into_iter()
            .map(|(lr, wd)| AdamWCoeffs::new(lr, wd, cfg.beta1, cfg.beta2, cfg.eps, t, clip))
            .collect();
        dp.device_adamw(&mut mom, &coeffs).unwrap();
        dopt.record_external_step(lr, clip).unwrap();
        hp.zero_grad();
        dp.zero_grad();
        for (i, &id) in ids.iter().enumerate() {
            same_bits(
                &format!("value {i} after step {step}"),
                &dp.download_value(id).unwrap(),
                hp.value(id).unwrap(),
            );
        }
    }
    for (i, (m, v)) in mom.download(dev).unwrap().into_iter().enumerate() {
        same_bits(&format!("m {i}"), &m, ho.exp_avg(i).unwrap());
        same_bits(&format!("v {i}"), &v, ho.exp_avg_sq(i).unwrap());
        dopt.set_moments(i, &m, &v).unwrap();
    }
    // the mirrored optimizer saves the same state as the host one
    assert_eq!(dopt.save_state(), ho.save_state());
}

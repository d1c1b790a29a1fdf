//! The device half of the optimizer step: AdamW on the device store's FP32 master weights with
//! the moments in device memory (autograd's `ParamStore::device_adamw`, optim's arithmetic bit
//! for bit), and the host syncs the rest of the trainer needs (checkpoints, evaluation's
//! host probes): the store comes back with `to_host`, the moments into the host optimizer.
//! [`adamw_on_device`] and [`moments_to_host`] are shared with the RL trainer's update.

use autograd::backend::{AdamWCoeffs, DeviceBackend, DeviceMoments};
use autograd::ParamStore;
use optim::{AdamW, OptimError};

use super::{TrainError, Trainer};

/// One AdamW step of `opt` on the device store `ps` at learning rate `lr` with gradient
/// multiplier `coef`: the moments live in `moments` (uploaded from `opt` at the first call),
/// `opt` records the step (its step count, hence the bias correction, stays the host's).
pub(crate) fn adamw_on_device<E: From<autograd::Error> + From<OptimError>>(
    dev: &DeviceBackend,
    ps: &mut ParamStore,
    opt: &mut AdamW,
    moments: &mut Option<DeviceMoments>,
    lr: f32,
    coef: f32,
) -> Result<(), E> {
    if moments.is_none() {
        let n = opt.param_specs().len();
        let pairs: Vec<(&[f32], &[f32])> = (0..n)
            .map(|i| {
                let m = opt.exp_avg(i).expect("index in range");
                (m, opt.exp_avg_sq(i).expect("index in range"))
            })
            .collect();
        *moments = Some(DeviceMoments::upload(dev, &pairs)?);
    }
    let cfg = *opt.config();
    let t = opt.step_count() + 1;
    let coeffs: Vec<AdamWCoeffs> = opt
        .param_lr_wd(lr)
        .into_iter()
        .map(|(lr, wd)| AdamWCoeffs::new(lr, wd, cfg.beta1, cfg.beta2, cfg.eps, t, coef))
        .collect();
    let mom = moments.as_mut().expect("uploaded above");
    ps.device_adamw(mom, &coeffs)?;
    opt.record_external_step(lr, coef)?;
    Ok(())
}

/// Copies the device moments (if any) back into `opt` (before a checkpoint).
pub(crate) fn moments_to_host<E: From<autograd::Error> + From<OptimError>>(
    dev: &DeviceBackend,
    moments: Option<&DeviceMoments>,
    opt: &mut AdamW,
) -> Result<(), E> {
    if let Some(mom) = moments {
        for (i, (m, v)) in mom.download(dev)?.into_iter().enumerate() {
            opt.set_moments(i, &m, &v)?;
        }
    }
    Ok(())
}

impl Trainer {
    /// One AdamW step on the device at learning rate `lr` with gradient multiplier `coef`
    /// (the clip coefficient); the host optimizer records the step.
    pub(super) fn device_adamw(&mut self, lr: f32, coef: f32) -> Result<(), TrainError> {
        let Some(dev) = &self.device else {
            unreachable!("called for a device run only")
        };
        adamw_on_device(
            dev,
            &mut self.ps,
            &mut self.opt,
            &mut self.dev_moments,
            lr,
            coef,
        )
    }

    /// Brings the store back to the host and, with `moments`, the device AdamW moments into
    /// the host optimizer (before a checkpoint). A no-op on the CPU.
    pub(super) fn sync_host(&mut self, moments: bool) -> Result<(), TrainError> {
        if let (true, Some(dev)) = (moments, &self.device) {
            moments_to_host::<TrainError>(dev, self.dev_moments.as_ref(), &mut self.opt)?;
        }
        self.ps.to_host()?;
        Ok(())
    }
}

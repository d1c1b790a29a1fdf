//! The device half of the optimizer step: AdamW on the device store's FP32 master weights with
//! the moments in device memory (autograd's `ParamStore::device_adamw`, optim's arithmetic bit
//! for bit), and the host syncs the rest of the trainer needs (checkpoints, evaluation's
//! host probes): the store comes back with `to_host`, the moments into the host optimizer.
//! [`DeviceUpdate`] is shared with the RL trainer's update.

use std::sync::Arc;

use autograd::backend::{AdamWCoeffs, DeviceBackend, DeviceMoments};
use autograd::ParamStore;
use optim::{AdamW, OptimError};

use super::{TrainError, Trainer};

/// Where a run's optimizer step happens when it is on a device: the backend and, once the
/// first device AdamW step ran, the moments in its memory. Held by the pretraining
/// [`Trainer`] and the RL trainer's update alike.
pub(crate) struct DeviceUpdate {
    /// The device the passes, the gradient norm and AdamW run on.
    pub dev: Arc<DeviceBackend>,
    /// AdamW's moments on `dev` (uploaded from the host optimizer at the first step; the
    /// host optimizer mirrors them at each checkpoint, see [`DeviceUpdate::moments_to_host`]).
    moments: Option<DeviceMoments>,
}

impl DeviceUpdate {
    /// A device with no moments uploaded yet.
    pub fn new(dev: Arc<DeviceBackend>) -> Self {
        DeviceUpdate { dev, moments: None }
    }

    /// One AdamW step of `opt` on the device store `ps` at learning rate `lr` with gradient
    /// multiplier `coef`: the moments are uploaded from `opt` at the first call and stay on
    /// the device; `opt` records the step (its step count, hence the bias correction, stays
    /// the host's).
    pub fn adamw<E: From<autograd::Error> + From<OptimError>>(
        &mut self,
        ps: &mut ParamStore,
        opt: &mut AdamW,
        lr: f32,
        coef: f32,
    ) -> Result<(), E> {
        let moments = match &mut self.moments {
            Some(m) => m,
            none => {
                let n = opt.param_specs().len();
                let pairs: Vec<(&[f32], &[f32])> = (0..n)
                    .map(|i| {
                        let m = opt.exp_avg(i).expect("index in range");
                        (m, opt.exp_avg_sq(i).expect("index in range"))
                    })
                    .collect();
                none.insert(DeviceMoments::upload(&self.dev, &pairs)?)
            }
        };
        let cfg = *opt.config();
        let t = opt.step_count() + 1;
        let coeffs: Vec<AdamWCoeffs> = opt
            .param_lr_wd(lr)
            .into_iter()
            .map(|(lr, wd)| AdamWCoeffs::new(lr, wd, cfg.beta1, cfg.beta2, cfg.eps, t, coef))
            .collect();
        ps.device_adamw(moments, &coeffs)?;
        opt.record_external_step(lr, coef)?;
        Ok(())
    }

    /// Copies the device moments (if any) back into `opt` (before a checkpoint).
    pub fn moments_to_host<E: From<autograd::Error> + From<OptimError>>(
        &self,
        opt: &mut AdamW,
    ) -> Result<(), E> {
        if let Some(mom) = &self.moments {
            for (i, (m, v)) in mom.download(&self.dev)?.into_iter().enumerate() {
                opt.set_moments(i, &m, &v)?;
            }
        }
        Ok(())
    }
}

impl Trainer {
    /// One AdamW step on the device at learning rate `lr` with gradient multiplier `coef`
    /// (the clip coefficient); the host optimizer records the step.
    pub(super) fn device_adamw(&mut self, lr: f32, coef: f32) -> Result<(), TrainError> {
        let Some(dev) = &mut self.device else {
            unreachable!("called for a device run only")
        };
        dev.adamw(&mut self.ps, &mut self.opt, lr, coef)
    }

    /// Brings the store back to the host and, with `moments`, the device AdamW moments into
    /// the host optimizer (before a checkpoint). A no-op on the CPU.
    pub(super) fn sync_host(&mut self, moments: bool) -> Result<(), TrainError> {
        if let (true, Some(dev)) = (moments, &self.device) {
            dev.moments_to_host::<TrainError>(&mut self.opt)?;
        }
        self.ps.to_host()?;
        Ok(())
    }
}

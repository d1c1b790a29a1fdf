//! The device half of the optimizer step: AdamW on the device store's FP32 master weights with
//! the moments in device memory (autograd's `ParamStore::device_adamw`, optim's arithmetic bit
//! for bit), and the host syncs the rest of the trainer needs (checkpoints, evaluation's
//! host probes): the store comes back with `to_host`, the moments into the host optimizer.

use autograd::backend::{AdamWCoeffs, DeviceMoments};

use super::{TrainError, Trainer};

impl Trainer {
    /// One AdamW step on the device at learning rate `lr` with gradient multiplier `coef`
    /// (the clip coefficient); the host optimizer records the step.
    pub(super) fn device_adamw(&mut self, lr: f32, coef: f32) -> Result<(), TrainError> {
        let Some(dev) = &self.device else {
            unreachable!("called for a device run only")
        };
        if self.dev_moments.is_none() {
            let n = self.opt.param_specs().len();
            let pairs: Vec<(&[f32], &[f32])> = (0..n)
                .map(|i| {
                    let m = self.opt.exp_avg(i).expect("index in range");
                    (m, self.opt.exp_avg_sq(i).expect("index in range"))
                })
                .collect();
            self.dev_moments = Some(DeviceMoments::upload(dev, &pairs)?);
        }
        let cfg = *self.opt.config();
        let t = self.opt.step_count() + 1;
        let coeffs: Vec<AdamWCoeffs> = self
            .opt
            .param_lr_wd(lr)
            .into_iter()
            .map(|(lr, wd)| AdamWCoeffs::new(lr, wd, cfg.beta1, cfg.beta2, cfg.eps, t, coef))
            .collect();
        let mom = self.dev_moments.as_mut().expect("uploaded above");
        self.ps.device_adamw(mom, &coeffs)?;
        self.opt.record_external_step(lr, coef)?;
        Ok(())
    }

    /// Brings the store back to the host and, with `moments`, the device AdamW moments into
    /// the host optimizer (before a checkpoint). A no-op on the CPU.
    pub(super) fn sync_host(&mut self, moments: bool) -> Result<(), TrainError> {
        if let (true, Some(dev), Some(mom)) = (moments, &self.device, &self.dev_moments) {
            for (i, (m, v)) in mom.download(dev)?.into_iter().enumerate() {
                self.opt.set_moments(i, &m, &v)?;
            }
        }
        self.ps.to_host()?;
        Ok(())
    }
}

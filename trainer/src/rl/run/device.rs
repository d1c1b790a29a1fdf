//! The RL update on a CUDA device: the policy's store moves to the device for the trainer's
//! forward and backward passes (the same `Graph` device path as pretraining), and the
//! gradient norm and AdamW run on the device store with the moments in device memory (the
//! pretraining trainer's [`crate::train::device_step`] code). Only the logits (for the
//! log-probabilities and the loss's seed gradient, computed on the host as on the CPU) and
//! the gradient norm come back.
//!
//! The sampler's weight sync starts from the host: [`super::PolicySampler::sync`] quantizes
//! every weight with the sampler's recipe and (static scales) calibrates on the host
//! (`FrozenLinears::new`, `calibrate::input_amax`), so each step downloads the policy once
//! before the sync and uploads it again for the update; the AdamW moments stay on the
//! device. Checkpoints bring the store, the reference policy and the moments back first, so
//! they are the same files on either device.

use std::sync::Arc;

use autograd::backend::DeviceBackend;

use super::RlRun;
use crate::rl::config::RlError;
use crate::train::device_step::DeviceUpdate;

impl RlRun {
    /// Runs the RL update (the trainer's forward and backward passes, the gradient norm and
    /// AdamW) on a CUDA device (`None`: the CPU). Leaving a device brings the policy and the
    /// optimizer state back to the host first.
    ///
    /// # Errors
    /// A failed download when leaving a device.
    pub fn set_update_device(&mut self, dev: Option<Arc<DeviceBackend>>) -> Result<(), RlError> {
        self.sync_host()?;
        self.device = dev.map(DeviceUpdate::new);
        Ok(())
    }

    /// Brings the policy, the reference policy and the device AdamW moments back to the host
    /// (before a checkpoint). A no-op on the CPU.
    pub(super) fn sync_host(&mut self) -> Result<(), RlError> {
        if let Some(dev) = &self.device {
            dev.moments_to_host::<RlError>(&mut self.opt)?;
        }
        self.ps.to_host()?;
        if let Some(r) = self.reference.as_mut() {
            r.to_host()?;
        }
        Ok(())
    }

    /// The global gradient norm where the gradients are (the same bits on either device).
    pub(super) fn grad_norm(&self) -> Result<f32, RlError> {
        Ok(if self.device.is_some() {
            self.ps.device_grad_norm()?
        } else {
            optim::grad_norm(&self.ps.grads())
        })
    }

    /// One AdamW step at `lr` with gradient multiplier `coef`, where the store is.
    pub(super) fn adamw(&mut self, lr: f32, coef: f32) -> Result<(), RlError> {
        match &mut self.device {
            Some(dev) => dev.adamw(&mut self.ps, &mut self.opt, lr, coef),
            None => {
                let (mut values, grads) = self.ps.params_and_grads();
                self.opt.step_scaled(&mut values, &grads, lr, coef)?;
                Ok(())
            }
        }
    }
}

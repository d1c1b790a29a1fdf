//! Entry points for an AdamW step applied outside this crate with this optimizer's arithmetic
//! (autograd's device AdamW: the `nb_adamw` CUDA kernel, bit for bit [`AdamW::step_scaled`]):
//! the per-parameter learning rate and weight decay of a step, recording the step, and
//! mirroring the moments back before [`AdamW::save_state`]. The host arithmetic is unchanged.

use super::AdamW;
use crate::group::check_nonneg;
use crate::OptimError;

impl AdamW {
    /// For a step at learning rate `lr`: each parameter's `(lr · lr_scale, weight_decay)` from
    /// its group, the learning rate rounded to f32 as [`AdamW::step_scaled`] rounds it. The step
    /// number is `step_count() + 1`; the betas and eps are in [`AdamW::config`].
    ///
    /// ```
    /// use optim::{AdamW, AdamWConfig, ParamGroup, ParamSpec};
    /// let groups = [ParamGroup::new(0.1, 1.0), ParamGroup::new(0.0, 0.5)];
    /// let specs = [ParamSpec::new(3, 0), ParamSpec::new(2, 1)];
    /// let a = AdamW::with_groups(AdamWConfig::default(), &groups, &specs)?;
    /// assert_eq!(a.param_lr_wd(1e-3), vec![(1e-3, 0.1), (5e-4, 0.0)]);
    /// # Ok::<(), optim::OptimError>(())
    /// ```
    pub fn param_lr_wd(&self, lr: f32) -> Vec<(f32, f32)> {
        self.layout
            .specs
            .iter()
            .map(|s| {
                let g = &self.groups[s.group];
                (lr * g.lr_scale, g.weight_decay)
            })
            .collect()
    }

    /// Records one step that another implementation applied with this optimizer's arithmetic
    /// (checks `lr` and `grad_scale` as [`AdamW::step_scaled`] does, then advances
    /// [`AdamW::step_count`]). The host moments are stale until [`AdamW::set_moments`].
    ///
    /// ```
    /// use optim::{AdamW, AdamWConfig, ParamSpec};
    /// let mut a = AdamW::new(AdamWConfig::default(), &[ParamSpec::new(3, 0)])?;
    /// assert_eq!(a.record_external_step(1e-3, 1.0)?, 1);
    /// assert!(a.record_external_step(-1.0, 1.0).is_err());
    /// assert_eq!(a.step_count(), 1);
    /// # Ok::<(), optim::OptimError>(())
    /// ```
    pub fn record_external_step(&mut self, lr: f32, grad_scale: f32) -> Result<u64, OptimError> {
        check_nonneg("lr", lr)?;
        check_nonneg("grad_scale", grad_scale)?;
        self.step += 1;
        Ok(self.step)
    }

    /// Overwrites the first and second moments of parameter `index` (e.g. with a device copy).
    ///
    /// # Errors
    /// [`OptimError::ParamCountMismatch`] for an index out of range,
    /// [`OptimError::ParamLenMismatch`] for a slice of the wrong length.
    ///
    /// ```
    /// use optim::{AdamW, AdamWConfig, ParamSpec};
    /// let mut a = AdamW::new(AdamWConfig::default(), &[ParamSpec::new(2, 0)])?;
    /// a.set_moments(0, &[1.0, 2.0], &[3.0, 4.0])?;
    /// assert_eq!(a.exp_avg_sq(0), Some(&[3.0, 4.0][..]));
    /// assert!(a.set_moments(1, &[1.0, 2.0], &[3.0, 4.0]).is_err());
    /// # Ok::<(), optim::OptimError>(())
    /// ```
    pub fn set_moments(&mut self, index: usize, m: &[f32], v: &[f32]) -> Result<(), OptimError> {
        let n = self.layout.specs.len();
        let (Some(&off), Some(spec)) =
            (self.layout.offsets.get(index), self.layout.specs.get(index))
        else {
            return Err(OptimError::ParamCountMismatch {
                expected: n,
                got: index + 1,
            });
        };
        for x in [m, v] {
            if x.len() != spec.len {
                return Err(OptimError::ParamLenMismatch {
                    index,
                    expected: spec.len,
                    got: x.len(),
                });
            }
        }
        self.exp_avg[off..off + spec.len].copy_from_slice(m);
        self.exp_avg_sq[off..off + spec.len].copy_from_slice(v);
        Ok(())
    }
}

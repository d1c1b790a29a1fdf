//! One optimizer step (forward and backward of every micro-batch, clipping, AdamW) and the
//! divergence guard that judges it before anything is applied. On a device the whole step
//! runs there (`device_step.rs`); only the loss and the gradient norm come back.

use autograd::{Graph, OpProfile};

use super::{TrainError, Trainer};
use crate::model::Precision;

/// What [`Trainer::train_step`] reports of a step it applied.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepOutcome {
    /// Mean training loss of the step's micro-batches.
    pub loss: f32,
    /// Global gradient norm before clipping.
    pub grad_norm: f32,
    /// Learning rate used.
    pub lr: f32,
}

impl Trainer {
    /// The guard's reference loss: the first step's loss during warmup, the running
    /// minimum after it.
    pub(super) fn guard_reference(&self) -> Option<(f32, &'static str)> {
        if self.step < self.cfg.train.warmup_steps {
            self.initial_loss
                .or(self.running_min)
                .map(|l| (l, "the first step's loss"))
        } else {
            self.running_min.map(|l| (l, "the running minimum"))
        }
    }

    fn bad_layers(&self) -> String {
        let bad: Vec<String> = self
            .ps
            .ids()
            .filter(|&id| {
                self.ps
                    .download_grad(id)
                    .map(|g| g.iter().any(|v| !v.is_finite()))
                    .unwrap_or(false)
            })
            .filter_map(|id| self.ps.name(id).ok().map(str::to_string))
            .collect();
        if bad.is_empty() {
            "none".into()
        } else {
            bad.join(", ")
        }
    }

    /// One optimizer step (every micro-batch's forward and backward, clipping, AdamW):
    /// returns its [`StepOutcome`], or the divergence error (nothing applied). [`Trainer::run`]
    /// calls it in its loop; benchmarks call it directly. It writes nothing to disk. The
    /// other threads of the rayon pool it runs on poll for its parallel work meanwhile
    /// ([`autograd::with_polling_workers`]).
    pub fn train_step(&mut self) -> Result<StepOutcome, TrainError> {
        autograd::with_polling_workers(|| self.compute_step())
    }

    /// [`Trainer::train_step`]'s work.
    fn compute_step(&mut self) -> Result<StepOutcome, TrainError> {
        let accum = self.cfg.train.grad_accum;
        let progress = self.progress();
        let mut loss_sum = 0.0f64;
        let on_device = self.device.is_some();
        if let Some(dev) = &self.device {
            // the store stays on the device between steps (no-op then)
            self.ps.to_device(&dev.dev)?;
        }
        // a step that fails leaves no profile behind (one that diverges keeps its own)
        self.last_op_profile = None;
        let mut ops: Option<OpProfile> = None;
        for _ in 0..accum {
            let b = self.batcher.next_batch();
            let mut g = Graph::new(&mut self.ps).with_rng(self.cfg.train.seed, self.step);
            if self.op_profiling {
                g.enable_profiling();
            }
            let prec = Precision {
                recipe: &self.recipe,
                progress,
            };
            let loss = self
                .model
                .loss(&mut g, &b.inputs, &b.targets, b.batch, &prec, None)?;
            loss_sum += g.item(loss)? as f64;
            let scaled = if accum > 1 {
                g.scale(loss, 1.0 / accum as f32)?
            } else {
                loss
            };
            g.backward(scaled)?;
            match (ops.as_mut(), g.profile()) {
                (Some(total), Some(p)) => total.merge(p),
                (None, Some(p)) => ops = Some(p.clone()),
                _ => {}
            }
        }
        self.last_op_profile = ops;
        let mut loss = (loss_sum / accum as f64) as f32;
        let step_no = self.step + 1;
        let inject = self.inject_nan_at_step == Some(step_no);
        if inject {
            loss = f32::NAN;
            if !on_device {
                let id = self.model.blocks[0].qkv;
                if let Some(v) = self.ps.grad_mut(id)?.first_mut() {
                    *v = f32::NAN;
                }
            }
        }
        // the gradient norm where the gradients are (the same bits on either device)
        let mut grad_norm = if on_device {
            self.ps.device_grad_norm()?
        } else {
            optim::grad_norm(&self.ps.grads())
        };
        if inject {
            grad_norm = f32::NAN;
        }
        let lr = self.schedule.lr(self.step);
        let diverged = |reason: String, me: &Self| TrainError::Diverged {
            step: step_no,
            reason,
            loss,
            grad_norm,
            bad_layers: me.bad_layers(),
            last_checkpoint: me
                .last_checkpoint
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "none".into()),
        };
        if !loss.is_finite() || !grad_norm.is_finite() {
            return Err(diverged("non-finite loss or gradient norm".into(), self));
        }
        if let Some((m, what)) = self.guard_reference() {
            if loss > self.cfg.train.explode_factor * m {
                return Err(diverged(
                    format!(
                        "loss exploded above {}x {what} {m}",
                        self.cfg.train.explode_factor
                    ),
                    self,
                ));
            }
        }
        let coef = optim::clip_coefficient(grad_norm, self.cfg.train.clip)?;
        if on_device {
            self.device_adamw(lr, coef)?;
        } else {
            let (values, grads) = self.ps.params_and_grads();
            let mut values = values;
            self.opt.step_scaled(&mut values, &grads, lr, coef)?;
        }
        self.ps.end_quant_step()?;
        self.ps.zero_grad();
        self.step = step_no;
        self.tokens_seen += self.cfg.tokens_per_step();
        self.running_min = Some(self.running_min.map_or(loss, |m| m.min(loss)));
        self.initial_loss.get_or_insert(loss);
        Ok(StepOutcome {
            loss,
            grad_norm,
            lr,
        })
    }
}

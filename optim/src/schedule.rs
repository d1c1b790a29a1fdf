//! Learning-rate schedules.
//!
//! A schedule maps the number of optimizer steps already taken, `step` (0 for the first update), to
//! the learning rate of the next update. All arithmetic is f64, rounded to f32 once at the end.
//!
//! Conventions (pinned by the tests):
//! * Warmup is linear and starts above zero: `lr(step) = peak * (step + 1) / warmup_steps` for
//!   `step < warmup_steps`, so `lr(warmup_steps - 1) == peak` and no update is wasted at lr 0.
//! * A decay phase of length `D` starting at `s0` has progress `(step - s0) / D`, from 0 (lr = peak)
//!   up to 1 (lr = min) at `step == s0 + D`; every later step uses `min_lr`.

use crate::error::OptimError;

/// Shape of the decay tail of a [`LrSchedule::Wsd`] schedule, as a factor of progress `x` in
/// [0, 1] going from 1 to 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum DecayShape {
    /// `1 - x`
    Linear,
    /// `(1 + cos(pi x)) / 2`
    Cosine,
    /// `1 - sqrt(x)` (the "1-sqrt" cooldown of Hägele et al., 2024)
    Sqrt,
}

impl DecayShape {
    fn factor(self, x: f64) -> f64 {
        match self {
            DecayShape::Linear => 1.0 - x,
            DecayShape::Cosine => 0.5 * (1.0 + (std::f64::consts::PI * x).cos()),
            DecayShape::Sqrt => 1.0 - x.sqrt(),
        }
    }
}

/// A learning-rate schedule.
///
/// ```
/// use optim::{DecayShape, LrSchedule};
///
/// let cos = LrSchedule::warmup_cosine(1.0, 0.125, 100, 1100)?;
/// assert_eq!(cos.lr(0), 0.01);       // warmup starts at peak / warmup_steps
/// assert_eq!(cos.lr(99), 1.0);       // and reaches the peak at its last step
/// assert_eq!(cos.lr(600), 0.5625);   // half way through the decay: (peak + min) / 2
/// assert_eq!(cos.lr(1100), 0.125);   // min from total_steps on
///
/// let wsd = LrSchedule::wsd(3e-4, 0.0, 100, 200, 1000, DecayShape::Sqrt)?;
/// assert_eq!(wsd.lr(500), 3e-4);     // stable phase
/// assert_eq!(wsd.lr(800), 3e-4);     // the 200-step tail starts at progress 0
/// assert!((wsd.lr(850) - 1.5e-4).abs() < 1e-10); // 1 - sqrt(1/4) = 1/2
/// # Ok::<(), optim::OptimError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum LrSchedule {
    /// The same learning rate at every step.
    Constant {
        /// The learning rate.
        lr: f32,
    },
    /// Linear warmup to `peak_lr`, then cosine decay to `min_lr` at `total_steps`.
    WarmupCosine {
        /// Learning rate at the end of warmup.
        peak_lr: f32,
        /// Learning rate from `total_steps` on.
        min_lr: f32,
        /// Length of the warmup (0 for none).
        warmup_steps: u64,
        /// Step at which the decay reaches `min_lr`.
        total_steps: u64,
    },
    /// Warmup-stable-decay: linear warmup to `peak_lr`, constant, then a `decay_steps` tail of the
    /// given shape ending at `min_lr` at `total_steps`.
    Wsd {
        /// Learning rate of the stable phase.
        peak_lr: f32,
        /// Learning rate from `total_steps` on.
        min_lr: f32,
        /// Length of the warmup (0 for none).
        warmup_steps: u64,
        /// Length of the decay tail, which ends at `total_steps`.
        decay_steps: u64,
        /// Step at which the decay reaches `min_lr`.
        total_steps: u64,
        /// Shape of the tail.
        shape: DecayShape,
    },
}

impl LrSchedule {
    /// A constant schedule.
    pub fn constant(lr: f32) -> Result<Self, OptimError> {
        let s = LrSchedule::Constant { lr };
        s.validate().map(|()| s)
    }

    /// Linear warmup + cosine decay; see [`LrSchedule::WarmupCosine`].
    pub fn warmup_cosine(
        peak_lr: f32,
        min_lr: f32,
        warmup_steps: u64,
        total_steps: u64,
    ) -> Result<Self, OptimError> {
        let s = LrSchedule::WarmupCosine {
            peak_lr,
            min_lr,
            warmup_steps,
            total_steps,
        };
        s.validate().map(|()| s)
    }

    /// Warmup-stable-decay; see [`LrSchedule::Wsd`].
    pub fn wsd(
        peak_lr: f32,
        min_lr: f32,
        warmup_steps: u64,
        decay_steps: u64,
        total_steps: u64,
        shape: DecayShape,
    ) -> Result<Self, OptimError> {
        let s = LrSchedule::Wsd {
            peak_lr,
            min_lr,
            warmup_steps,
            decay_steps,
            total_steps,
            shape,
        };
        s.validate().map(|()| s)
    }

    /// Checks that rates are finite, `0 <= min_lr <= peak_lr`, and the phases fit in `total_steps`.
    pub fn validate(&self) -> Result<(), OptimError> {
        let bad = |name, value: f64, reason| {
            Err(OptimError::InvalidHyperparameter {
                name,
                value,
                reason,
            })
        };
        let rates = |peak: f32, min: f32| {
            if !(peak.is_finite() && peak >= 0.0) {
                return bad("peak_lr", peak as f64, "must be finite and >= 0");
            }
            if !(min.is_finite() && (0.0..=peak).contains(&min)) {
                return bad("min_lr", min as f64, "must be finite and in [0, peak_lr]");
            }
            Ok(())
        };
        match *self {
            LrSchedule::Constant { lr } => rates(lr, lr),
            LrSchedule::WarmupCosine {
                peak_lr,
                min_lr,
                warmup_steps,
                total_steps,
            } => {
                rates(peak_lr, min_lr)?;
                if warmup_steps > total_steps {
                    return bad(
                        "warmup_steps",
                        warmup_steps as f64,
                        "must not exceed total_steps",
                    );
                }
                Ok(())
            }
            LrSchedule::Wsd {
                peak_lr,
                min_lr,
                warmup_steps,
                decay_steps,
                total_steps,
                ..
            } => {
                rates(peak_lr, min_lr)?;
                if warmup_steps
                    .checked_add(decay_steps)
                    .is_none_or(|s| s > total_steps)
                {
                    return bad(
                        "decay_steps",
                        decay_steps as f64,
                        "warmup_steps + decay_steps must not exceed total_steps",
                    );
                }
                Ok(())
            }
        }
    }

    /// Learning rate for the update that follows `step` completed steps. Never panics, also for a
    /// schedule that fails [`validate`](LrSchedule::validate).
    pub fn lr(&self, step: u64) -> f32 {
        match *self {
            LrSchedule::Constant { lr } => lr,
            LrSchedule::WarmupCosine {
                peak_lr,
                min_lr,
                warmup_steps,
                total_steps,
            } => {
                if step < warmup_steps {
                    return warmup(peak_lr, step, warmup_steps);
                }
                let len = total_steps.saturating_sub(warmup_steps);
                decay(
                    peak_lr,
                    min_lr,
                    step - warmup_steps,
                    len,
                    DecayShape::Cosine,
                )
            }
            LrSchedule::Wsd {
                peak_lr,
                min_lr,
                warmup_steps,
                decay_steps,
                total_steps,
                shape,
            } => {
                if step < warmup_steps {
                    return warmup(peak_lr, step, warmup_steps);
                }
                let start = total_steps.saturating_sub(decay_steps).max(warmup_steps);
                if step < start {
                    return peak_lr;
                }
                decay(peak_lr, min_lr, step - start, total_steps - start, shape)
            }
        }
    }
}

fn warmup(peak: f32, step: u64, warmup_steps: u64) -> f32 {
    (peak as f64 * ((step + 1) as f64 / warmup_steps as f64)) as f32
}

fn decay(peak: f32, min: f32, into: u64, len: u64, shape: DecayShape) -> f32 {
    if into >= len {
        return min;
    }
    let x = into as f64 / len as f64;
    let (peak, min) = (peak as f64, min as f64);
    (min + (peak - min) * shape.factor(x)) as f32
}

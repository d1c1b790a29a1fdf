//! Parameter groups and the flat layout of a model's parameters.

use crate::error::OptimError;

/// Hyperparameters shared by a set of parameters.
///
/// The usual LLM split is two groups: matrices with weight decay, and norms, biases and embeddings
/// without. The learning rate of a group is `lr * lr_scale`, computed in f32, where `lr` is the
/// value passed to `step` (typically from an [`LrSchedule`](crate::LrSchedule)).
///
/// ```
/// use optim::ParamGroup;
///
/// let decayed = ParamGroup::new(0.1, 1.0);
/// let no_decay = ParamGroup::no_decay();
/// assert_eq!(no_decay, ParamGroup { weight_decay: 0.0, lr_scale: 1.0 });
/// assert_eq!(decayed.weight_decay, 0.1);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ParamGroup {
    /// Weight-decay coefficient (decoupled for AdamW, L2 added to the gradient for SGD).
    pub weight_decay: f32,
    /// Multiplier applied to the step's learning rate for this group.
    pub lr_scale: f32,
}

impl ParamGroup {
    /// A group with the given weight decay and learning-rate multiplier.
    pub fn new(weight_decay: f32, lr_scale: f32) -> Self {
        Self {
            weight_decay,
            lr_scale,
        }
    }

    /// No weight decay, full learning rate.
    pub fn no_decay() -> Self {
        Self::new(0.0, 1.0)
    }

    pub(crate) fn validate(&self) -> Result<(), OptimError> {
        check_nonneg("weight_decay", self.weight_decay)?;
        check_nonneg("lr_scale", self.lr_scale)
    }
}

/// One parameter tensor as the optimizer sees it: a flat length and the index of its group.
///
/// ```
/// use optim::ParamSpec;
///
/// // a 768x3072 matrix in group 0, a 768-element norm weight in group 1
/// let specs = [ParamSpec::new(768 * 3072, 0), ParamSpec::new(768, 1)];
/// assert_eq!(specs[1].len, 768);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ParamSpec {
    /// Number of f32 elements.
    pub len: usize,
    /// Index into the optimizer's groups.
    pub group: usize,
}

impl ParamSpec {
    /// A parameter of `len` elements in group `group`.
    pub fn new(len: usize, group: usize) -> Self {
        Self { len, group }
    }
}

/// Validated parameter layout: specs, their offsets into the flat state buffers, the total size.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Layout {
    pub specs: Vec<ParamSpec>,
    pub offsets: Vec<usize>,
    pub total: usize,
}

impl Layout {
    pub fn new(specs: &[ParamSpec], n_groups: usize) -> Result<Self, OptimError> {
        let mut offsets = Vec::with_capacity(specs.len());
        let mut total = 0usize;
        for (index, s) in specs.iter().enumerate() {
            if s.group >= n_groups {
                return Err(OptimError::UnknownGroup {
                    index,
                    group: s.group,
                    groups: n_groups,
                });
            }
            offsets.push(total);
            total = total
                .checked_add(s.len)
                .ok_or(OptimError::InvalidHyperparameter {
                    name: "total parameter count",
                    value: f64::INFINITY,
                    reason: "overflows usize",
                })?;
        }
        Ok(Self {
            specs: specs.to_vec(),
            offsets,
            total,
        })
    }

    /// Checks counts and lengths of `params` and `grads` against the layout.
    pub fn check(&self, params: &[&mut [f32]], grads: &[&[f32]]) -> Result<(), OptimError> {
        let expected = self.specs.len();
        if params.len() != expected {
            return Err(OptimError::ParamCountMismatch {
                expected,
                got: params.len(),
            });
        }
        if grads.len() != expected {
            return Err(OptimError::GradCountMismatch {
                expected,
                got: grads.len(),
            });
        }
        for (index, ((p, g), s)) in params.iter().zip(grads).zip(&self.specs).enumerate() {
            if p.len() != s.len {
                return Err(OptimError::ParamLenMismatch {
                    index,
                    expected: s.len,
                    got: p.len(),
                });
            }
            if g.len() != s.len {
                return Err(OptimError::GradLenMismatch {
                    index,
                    expected: s.len,
                    got: g.len(),
                });
            }
        }
        Ok(())
    }
}

pub(crate) fn validate_groups(groups: &[ParamGroup]) -> Result<(), OptimError> {
    if groups.is_empty() {
        return Err(OptimError::InvalidHyperparameter {
            name: "number of groups",
            value: 0.0,
            reason: "at least one group is required",
        });
    }
    groups.iter().try_for_each(ParamGroup::validate)
}

pub(crate) fn check_nonneg(name: &'static str, value: f32) -> Result<(), OptimError> {
    if value.is_finite() && value >= 0.0 {
        Ok(())
    } else {
        Err(OptimError::InvalidHyperparameter {
            name,
            value: value as f64,
            reason: "must be finite and >= 0",
        })
    }
}

pub(crate) fn check_unit_interval(name: &'static str, value: f32) -> Result<(), OptimError> {
    if (0.0..1.0).contains(&value) {
        Ok(())
    } else {
        Err(OptimError::InvalidHyperparameter {
            name,
            value: value as f64,
            reason: "must be in [0, 1)",
        })
    }
}

/// Elements per parallel work item (64 KiB per f32 stream).
pub(crate) const CHUNK: usize = 16 * 1024;

/// Default total element count from which updates run on the rayon pool.
pub(crate) const DEFAULT_PARALLEL_THRESHOLD: usize = 1 << 18;

//! SGD with momentum, dampening, Nesterov and (coupled, L2) weight decay.

use rayon::prelude::*;

use crate::error::{OptimError, StateError};
use crate::group::{
    check_nonneg, check_unit_interval, validate_groups, Layout, ParamGroup, ParamSpec, CHUNK,
    DEFAULT_PARALLEL_THRESHOLD,
};
use crate::state::{self, Writer, KIND_SGD};

/// SGD hyperparameters (the learning rate is passed to each [`Sgd::step`]).
///
/// `weight_decay` is the decay of the single group built by [`Sgd::new`]; with
/// [`Sgd::with_groups`] each [`ParamGroup`] carries its own.
///
/// ```
/// use optim::SgdConfig;
///
/// let c = SgdConfig { momentum: 0.9, nesterov: true, ..SgdConfig::default() };
/// assert_eq!(c.dampening, 0.0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct SgdConfig {
    /// Momentum factor in [0, 1); 0 disables the momentum buffer.
    pub momentum: f32,
    /// Dampening in [0, 1): the new gradient enters the buffer with weight `1 - dampening`.
    pub dampening: f32,
    /// L2 weight decay of the default group (added to the gradient, as in PyTorch's SGD).
    pub weight_decay: f32,
    /// Nesterov momentum (requires `momentum > 0` and `dampening == 0`).
    pub nesterov: bool,
}

impl SgdConfig {
    fn validate(&self) -> Result<(), OptimError> {
        check_unit_interval("momentum", self.momentum)?;
        check_unit_interval("dampening", self.dampening)?;
        check_nonneg("weight_decay", self.weight_decay)?;
        if self.nesterov && (self.momentum <= 0.0 || self.dampening != 0.0) {
            return Err(OptimError::InvalidHyperparameter {
                name: "nesterov",
                value: 1.0,
                reason: "Nesterov momentum requires momentum > 0 and dampening == 0",
            });
        }
        Ok(())
    }
}

/// Stochastic gradient descent following `torch.optim.SGD` (single-tensor path) step for step:
///
/// ```text
/// g = g + wd*p                     // if wd != 0
/// buf = g                          // first step
/// buf = buf*momentum + (1-dampening)*g   // later steps
/// g = nesterov ? g + momentum*buf : buf  // if momentum != 0
/// p = p + (-lr)*g
/// ```
///
/// ```
/// use optim::{ParamSpec, Sgd, SgdConfig};
///
/// let cfg = SgdConfig { momentum: 0.9, ..SgdConfig::default() };
/// let mut opt = Sgd::new(cfg, &[ParamSpec::new(2, 0)])?;
/// let (mut p, g) = (vec![1.0f32, 2.0], vec![1.0f32, 1.0]);
/// opt.step(&mut [&mut p[..]], &[&g[..]], 0.5)?; // buf = g
/// opt.step(&mut [&mut p[..]], &[&g[..]], 0.5)?; // buf = 0.9*g + g
/// assert_eq!(p, [1.0 - 0.5 - 0.5 * 1.9, 2.0 - 0.5 - 0.5 * 1.9]);
/// # Ok::<(), optim::OptimError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Sgd {
    config: SgdConfig,
    groups: Vec<ParamGroup>,
    layout: Layout,
    step: u64,
    /// Momentum buffers (empty when momentum == 0), valid once `step > 0`.
    buf: Vec<f32>,
    parallel_threshold: usize,
}

#[derive(Debug, Clone, Copy)]
struct Coeffs {
    grad_scale: f32,
    wd: f32,
    momentum: f32,
    one_minus_dampening: f32,
    neg_lr: f32,
    nesterov: bool,
    first: bool,
}

impl Sgd {
    /// One group for all parameters, with `config.weight_decay` and `lr_scale` 1.
    pub fn new(config: SgdConfig, params: &[ParamSpec]) -> Result<Self, OptimError> {
        let group = ParamGroup::new(config.weight_decay, 1.0);
        Self::with_groups(config, &[group], params)
    }

    /// Explicit groups; `params[i].group` indexes `groups`.
    pub fn with_groups(
        config: SgdConfig,
        groups: &[ParamGroup],
        params: &[ParamSpec],
    ) -> Result<Self, OptimError> {
        config.validate()?;
        validate_groups(groups)?;
        let layout = Layout::new(params, groups.len())?;
        let buf_len = if config.momentum != 0.0 {
            layout.total
        } else {
            0
        };
        Ok(Self {
            config,
            groups: groups.to_vec(),
            layout,
            step: 0,
            buf: vec![0.0; buf_len],
            parallel_threshold: DEFAULT_PARALLEL_THRESHOLD,
        })
    }

    /// One step at learning rate `lr` (each group uses `lr * lr_scale`). Shapes are checked before
    /// anything is modified.
    pub fn step(
        &mut self,
        params: &mut [&mut [f32]],
        grads: &[&[f32]],
        lr: f32,
    ) -> Result<(), OptimError> {
        self.step_scaled(params, grads, lr, 1.0)
    }

    /// Like [`step`](Sgd::step), with every gradient multiplied by `grad_scale` first.
    pub fn step_scaled(
        &mut self,
        params: &mut [&mut [f32]],
        grads: &[&[f32]],
        lr: f32,
        grad_scale: f32,
    ) -> Result<(), OptimError> {
        check_nonneg("lr", lr)?;
        check_nonneg("grad_scale", grad_scale)?;
        self.layout.check(params, grads)?;
        let cfg = self.config;
        let coeffs: Vec<Coeffs> = self
            .groups
            .iter()
            .map(|grp| Coeffs {
                grad_scale,
                wd: grp.weight_decay,
                momentum: cfg.momentum,
                one_minus_dampening: (1.0 - cfg.dampening as f64) as f32,
                neg_lr: -(lr * grp.lr_scale),
                nesterov: cfg.nesterov,
                first: self.step == 0,
            })
            .collect();

        let has_buf = cfg.momentum != 0.0;
        let parallel = self.layout.total >= self.parallel_threshold;
        let mut tasks = Vec::new();
        let mut b_rest = &mut self.buf[..];
        for ((p, g), spec) in params.iter_mut().zip(grads).zip(&self.layout.specs) {
            let c = &coeffs[spec.group];
            let b: &mut [f32] = if has_buf {
                let (b, tail) = b_rest.split_at_mut(spec.len);
                b_rest = tail;
                b
            } else {
                &mut []
            };
            if parallel {
                if has_buf {
                    let chunks = p
                        .chunks_mut(CHUNK)
                        .zip(g.chunks(CHUNK))
                        .zip(b.chunks_mut(CHUNK));
                    tasks.extend(chunks.map(|((p, g), b)| (p, g, b, c)));
                } else {
                    let chunks = p.chunks_mut(CHUNK).zip(g.chunks(CHUNK));
                    tasks.extend(chunks.map(|(p, g)| (p, g, &mut [][..], c)));
                }
            } else {
                update(p, g, b, c);
            }
        }
        if parallel {
            tasks
                .into_par_iter()
                .for_each(|(p, g, b, c)| update(p, g, b, c));
        }
        self.step += 1;
        Ok(())
    }

    /// Number of steps taken.
    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// The hyperparameters.
    pub fn config(&self) -> &SgdConfig {
        &self.config
    }

    /// The parameter groups.
    pub fn groups(&self) -> &[ParamGroup] {
        &self.groups
    }

    /// The parameter layout given at construction.
    pub fn param_specs(&self) -> &[ParamSpec] {
        &self.layout.specs
    }

    /// Momentum buffer of parameter `index`; `None` if out of range, if momentum is 0, or before
    /// the first step.
    pub fn momentum_buffer(&self, index: usize) -> Option<&[f32]> {
        if self.buf.is_empty() || self.step == 0 {
            return None;
        }
        let off = *self.layout.offsets.get(index)?;
        self.buf.get(off..off + self.layout.specs[index].len)
    }

    /// Total element count from which steps run in parallel (default 2^18).
    pub fn set_parallel_threshold(&mut self, elements: usize) {
        self.parallel_threshold = elements;
    }

    /// Serializes config, groups, layout, step count and momentum buffers.
    pub fn save_state(&self) -> Vec<u8> {
        let mut w = Writer::new(KIND_SGD, 64 + self.buf.len() * 4);
        w.f32(self.config.momentum);
        w.f32(self.config.dampening);
        w.f32(self.config.weight_decay);
        w.u8(self.config.nesterov as u8);
        w.layout(&self.groups, &self.layout.specs);
        w.u64(self.step);
        w.u8(!self.buf.is_empty() as u8);
        w.f32s(&self.buf);
        w.finish()
    }

    /// Rebuilds an optimizer from [`save_state`](Sgd::save_state) bytes.
    pub fn from_state(bytes: &[u8]) -> Result<Self, OptimError> {
        let mut r = state::open(bytes, KIND_SGD, "SGD")?;
        let config = SgdConfig {
            momentum: r.f32()?,
            dampening: r.f32()?,
            weight_decay: r.f32()?,
            nesterov: r.bool()?,
        };
        let (groups, specs) = r.layout(0)?;
        let step = r.u64()?;
        let has_buf = r.bool()?;
        let mut opt = Self::with_groups(config, &groups, &specs)
            .map_err(|_| StateError::Malformed("stored hyperparameters or layout are invalid"))?;
        let expects_buf = !opt.buf.is_empty();
        if has_buf != expects_buf {
            return Err(StateError::Malformed("momentum buffer flag contradicts momentum").into());
        }
        opt.buf = r.f32s(opt.buf.len())?;
        opt.step = step;
        r.finish()?;
        Ok(opt)
    }

    /// Restores step count and momentum buffers saved by an optimizer with the same layout, groups
    /// and config; anything else is a typed [`StateError`]. On error `self` is unchanged.
    pub fn load_state(&mut self, bytes: &[u8]) -> Result<(), OptimError> {
        let saved = Self::from_state(bytes)?;
        if let Some(d) = state::layout_diff(&self.layout.specs, &saved.layout.specs) {
            return Err(StateError::LayoutMismatch(d).into());
        }
        let key = |c: &SgdConfig| {
            (
                [c.momentum, c.dampening, c.weight_decay].map(f32::to_bits),
                c.nesterov,
            )
        };
        if key(&self.config) != key(&saved.config) {
            return Err(StateError::ConfigMismatch(format!(
                "optimizer {:?}, state {:?}",
                self.config, saved.config
            ))
            .into());
        }
        if let Some(d) = state::groups_diff(&self.groups, &saved.groups) {
            return Err(StateError::ConfigMismatch(d).into());
        }
        self.step = saved.step;
        self.buf = saved.buf;
        Ok(())
    }
}

#[inline]
fn update(p: &mut [f32], g: &[f32], b: &mut [f32], c: &Coeffs) {
    let c = *c;
    // The branches are loop-invariant; PyTorch skips the weight-decay add when wd == 0, which
    // matters for the sign of zero, so do we.
    let grad = |p: f32, g: f32| {
        let g = g * c.grad_scale;
        if c.wd != 0.0 {
            g + c.wd * p
        } else {
            g
        }
    };
    if b.is_empty() {
        for (p, &g) in p.iter_mut().zip(g) {
            *p = *p + c.neg_lr * grad(*p, g);
        }
        return;
    }
    for ((p, &g), b) in p.iter_mut().zip(g).zip(b.iter_mut()) {
        let g = grad(*p, g);
        let buf = if c.first {
            g
        } else {
            *b * c.momentum + c.one_minus_dampening * g
        };
        *b = buf;
        let d = if c.nesterov {
            g + c.momentum * buf
        } else {
            buf
        };
        *p += c.neg_lr * d;
    }
}

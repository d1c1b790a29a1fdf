//! AdamW with decoupled weight decay and bias correction, on FP32 master weights.

mod device;

use rayon::prelude::*;

use crate::error::{OptimError, StateError};
use crate::group::{
    check_nonneg, check_unit_interval, validate_groups, Layout, ParamGroup, ParamSpec, CHUNK,
    DEFAULT_PARALLEL_THRESHOLD,
};
use crate::state::{self, Writer, KIND_ADAMW};

/// AdamW hyperparameters (the learning rate is passed to each [`AdamW::step`]).
///
/// `weight_decay` is the decay of the single group built by [`AdamW::new`]; with
/// [`AdamW::with_groups`] each [`ParamGroup`] carries its own and this field is not used.
///
/// ```
/// use optim::AdamWConfig;
///
/// let c = AdamWConfig { beta2: 0.95, weight_decay: 0.1, ..AdamWConfig::default() };
/// assert_eq!((c.beta1, c.eps), (0.9, 1e-8));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct AdamWConfig {
    /// Decay of the first moment, in [0, 1).
    pub beta1: f32,
    /// Decay of the second moment, in [0, 1).
    pub beta2: f32,
    /// Added to the bias-corrected RMS in the denominator.
    pub eps: f32,
    /// Decoupled weight decay of the default group.
    pub weight_decay: f32,
}

impl Default for AdamWConfig {
    /// PyTorch's defaults: betas (0.9, 0.999), eps 1e-8, weight decay 0.01.
    fn default() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

impl AdamWConfig {
    fn validate(&self) -> Result<(), OptimError> {
        check_unit_interval("beta1", self.beta1)?;
        check_unit_interval("beta2", self.beta2)?;
        check_nonneg("eps", self.eps)?;
        check_nonneg("weight_decay", self.weight_decay)
    }
}

/// AdamW over a fixed list of f32 parameter slices.
///
/// Moments are FP32 and live in the optimizer, one flat buffer each, in the order of the
/// [`ParamSpec`]s. The update follows PyTorch's `torch.optim.AdamW` (single-tensor path) operation
/// for operation, with t the step number counted from 1:
///
/// ```text
/// p  = p * (1 - lr*wd)                      // decoupled weight decay
/// m  = m + (1-b1) * (g - m)                 // = b1*m + (1-b1)*g, computed as PyTorch's lerp
/// v  = v*b2 + (1-b2)*g*g
/// step_size = lr / (1 - b1^t)
/// denom = sqrt(v) / sqrt(1 - b2^t) + eps
/// p  = p + (-step_size * m) / denom
/// ```
///
/// Scalar coefficients (`1 - lr*wd`, `1 - b^t`, `lr / (1 - b1^t)`, `sqrt(1 - b2^t)`) are computed in
/// f64 and rounded to f32 once, as Python does; the element-wise part is plain f32 without fused
/// multiply-add. Given the same f32 inputs, this reproduces PyTorch's portable CPU kernels
/// (`ATEN_CPU_CAPABILITY=default`) bit for bit, and its AVX2/AVX-512 kernels (which fuse some
/// multiply-adds) to within an ulp or two. Results do not depend on the number of threads.
///
/// Each element's update is independent, so the loop over a slice vectorises; when the model has at
/// least [`parallel_threshold`](AdamW::set_parallel_threshold) elements (default 2^18) the work is
/// split into 16K-element chunks on the rayon pool.
///
/// ```
/// use optim::{AdamW, AdamWConfig, ParamGroup, ParamSpec};
///
/// // two matrices with weight decay, one norm weight without
/// let groups = [ParamGroup::new(0.1, 1.0), ParamGroup::no_decay()];
/// let specs = [ParamSpec::new(6, 0), ParamSpec::new(6, 0), ParamSpec::new(3, 1)];
/// let mut opt = AdamW::with_groups(AdamWConfig::default(), &groups, &specs)?;
///
/// let (mut w1, mut w2, mut norm) = (vec![1.0f32; 6], vec![-1.0f32; 6], vec![1.0f32; 3]);
/// let (g1, g2, gn) = (vec![0.5f32; 6], vec![-0.5f32; 6], vec![0.1f32; 3]);
/// opt.step(&mut [&mut w1[..], &mut w2[..], &mut norm[..]], &[&g1[..], &g2[..], &gn[..]], 1e-2)?;
///
/// assert_eq!(opt.step_count(), 1);
/// // first step of Adam moves every coordinate by ~lr against the gradient sign
/// assert!((norm[0] - (1.0 - 1e-2)).abs() < 1e-6);
/// assert!((w1[0] - (1.0 * (1.0 - 1e-3) - 1e-2)).abs() < 1e-6);
/// # Ok::<(), optim::OptimError>(())
/// ```
#[derive(Debug, Clone)]
pub struct AdamW {
    config: AdamWConfig,
    groups: Vec<ParamGroup>,
    layout: Layout,
    step: u64,
    exp_avg: Vec<f32>,
    exp_avg_sq: Vec<f32>,
    parallel_threshold: usize,
}

/// Per-group f32 coefficients of one step.
#[derive(Debug, Clone, Copy)]
struct Coeffs {
    grad_scale: f32,
    decay: f32,
    /// lerp weight 1 - beta1
    w1: f32,
    /// 1 - w1 in f32, for PyTorch's lerp form when w1 >= 0.5
    one_minus_w1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    bc2_sqrt: f32,
    eps: f32,
    neg_step_size: f32,
}

impl AdamW {
    /// One group for all parameters, with `config.weight_decay` and `lr_scale` 1. Every spec must
    /// name group 0.
    pub fn new(config: AdamWConfig, params: &[ParamSpec]) -> Result<Self, OptimError> {
        let group = ParamGroup::new(config.weight_decay, 1.0);
        Self::with_groups(config, &[group], params)
    }

    /// Explicit groups; `params[i].group` indexes `groups`.
    pub fn with_groups(
        config: AdamWConfig,
        groups: &[ParamGroup],
        params: &[ParamSpec],
    ) -> Result<Self, OptimError> {
        let layout = Self::validate(&config, groups, params)?;
        Ok(Self {
            config,
            groups: groups.to_vec(),
            exp_avg: vec![0.0; layout.total],
            exp_avg_sq: vec![0.0; layout.total],
            layout,
            step: 0,
            parallel_threshold: DEFAULT_PARALLEL_THRESHOLD,
        })
    }

    fn validate(
        config: &AdamWConfig,
        groups: &[ParamGroup],
        params: &[ParamSpec],
    ) -> Result<Layout, OptimError> {
        config.validate()?;
        validate_groups(groups)?;
        Layout::new(params, groups.len())
    }

    /// One AdamW step at learning rate `lr` (each group uses `lr * lr_scale`).
    ///
    /// Shapes are checked before anything is modified; on error the parameters and the optimizer
    /// are unchanged. Gradients are not checked for NaN/Inf here: use
    /// [`clip_grad_norm`](crate::clip_grad_norm) or [`grad_norm`](crate::grad_norm) first.
    pub fn step(
        &mut self,
        params: &mut [&mut [f32]],
        grads: &[&[f32]],
        lr: f32,
    ) -> Result<(), OptimError> {
        self.step_scaled(params, grads, lr, 1.0)
    }

    /// Like [`step`](AdamW::step), with every gradient multiplied by `grad_scale` first (in f32,
    /// exactly as if the gradients had been scaled in place). Pass the coefficient from
    /// [`clip_coefficient`](crate::clip_coefficient) to clip without writing to the gradients, or
    /// `1/loss_scale` to unscale.
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
        let t = self.step + 1;
        let coeffs: Vec<Coeffs> = self
            .groups
            .iter()
            .map(|g| self.coeffs(g, lr, grad_scale, t))
            .collect();

        let parallel = self.layout.total >= self.parallel_threshold;
        let mut tasks = Vec::new();
        let (mut m_rest, mut v_rest) = (&mut self.exp_avg[..], &mut self.exp_avg_sq[..]);
        for ((p, g), spec) in params.iter_mut().zip(grads).zip(&self.layout.specs) {
            let (m, m_tail) = m_rest.split_at_mut(spec.len);
            let (v, v_tail) = v_rest.split_at_mut(spec.len);
            (m_rest, v_rest) = (m_tail, v_tail);
            let c = &coeffs[spec.group];
            if parallel {
                let chunks = p
                    .chunks_mut(CHUNK)
                    .zip(g.chunks(CHUNK))
                    .zip(m.chunks_mut(CHUNK).zip(v.chunks_mut(CHUNK)));
                tasks.extend(chunks.map(|((p, g), (m, v))| (p, g, m, v, c)));
            } else {
                update(p, g, m, v, c);
            }
        }
        if parallel {
            tasks
                .into_par_iter()
                .for_each(|(p, g, m, v, c)| update(p, g, m, v, c));
        }
        self.step = t;
        Ok(())
    }

    fn coeffs(&self, group: &ParamGroup, lr: f32, grad_scale: f32, t: u64) -> Coeffs {
        let lr = lr * group.lr_scale; // f32, like the reference's group lr
        let (lr64, wd) = (lr as f64, group.weight_decay as f64);
        let (b1, b2) = (self.config.beta1 as f64, self.config.beta2 as f64);
        let t = t as f64;
        let bias_correction1 = 1.0 - b1.powf(t);
        let bias_correction2 = 1.0 - b2.powf(t);
        let w1 = (1.0 - b1) as f32;
        Coeffs {
            grad_scale,
            decay: (1.0 - lr64 * wd) as f32,
            w1,
            one_minus_w1: 1.0 - w1,
            beta2: self.config.beta2,
            one_minus_beta2: (1.0 - b2) as f32,
            bc2_sqrt: bias_correction2.sqrt() as f32,
            eps: self.config.eps,
            neg_step_size: (-(lr64 / bias_correction1)) as f32,
        }
    }

    /// Number of steps taken (the `t` of the next step is `step_count() + 1`).
    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// The hyperparameters.
    pub fn config(&self) -> &AdamWConfig {
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

    /// First moment of parameter `index`, or `None` if out of range.
    pub fn exp_avg(&self, index: usize) -> Option<&[f32]> {
        self.slice_of(&self.exp_avg, index)
    }

    /// Second moment of parameter `index`, or `None` if out of range.
    pub fn exp_avg_sq(&self, index: usize) -> Option<&[f32]> {
        self.slice_of(&self.exp_avg_sq, index)
    }

    fn slice_of<'a>(&self, buf: &'a [f32], index: usize) -> Option<&'a [f32]> {
        let off = *self.layout.offsets.get(index)?;
        buf.get(off..off + self.layout.specs[index].len)
    }

    /// Total element count from which steps run in parallel (default 2^18). `usize::MAX` keeps
    /// everything on the calling thread, `0` always uses the pool. Results are identical either way.
    pub fn set_parallel_threshold(&mut self, elements: usize) {
        self.parallel_threshold = elements;
    }

    /// Serializes config, groups, layout, step count and both moments (format in [`crate::state`]).
    ///
    /// ```
    /// use optim::{AdamW, AdamWConfig, ParamSpec};
    ///
    /// let specs = [ParamSpec::new(3, 0)];
    /// let mut a = AdamW::new(AdamWConfig::default(), &specs)?;
    /// let (mut p, g) = (vec![1.0f32; 3], vec![0.5f32; 3]);
    /// a.step(&mut [&mut p[..]], &[&g[..]], 1e-3)?;
    ///
    /// let bytes = a.save_state();
    /// let mut b = AdamW::new(AdamWConfig::default(), &specs)?;
    /// b.load_state(&bytes)?;
    /// assert_eq!(b.step_count(), 1);
    /// assert_eq!(b.exp_avg(0), a.exp_avg(0));
    ///
    /// let mut corrupt = bytes.clone();
    /// corrupt[40] ^= 1;
    /// assert!(b.load_state(&corrupt).is_err());
    /// # Ok::<(), optim::OptimError>(())
    /// ```
    pub fn save_state(&self) -> Vec<u8> {
        let mut w = Writer::new(KIND_ADAMW, 64 + self.layout.total * 8);
        w.f32(self.config.beta1);
        w.f32(self.config.beta2);
        w.f32(self.config.eps);
        w.f32(self.config.weight_decay);
        w.layout(&self.groups, &self.layout.specs);
        w.u64(self.step);
        w.f32s(&self.exp_avg);
        w.f32s(&self.exp_avg_sq);
        w.finish()
    }

    /// Rebuilds an optimizer (config, groups, layout, state) from [`save_state`](AdamW::save_state)
    /// bytes. The parallel threshold is the default.
    pub fn from_state(bytes: &[u8]) -> Result<Self, OptimError> {
        let mut r = state::open(bytes, KIND_ADAMW, "AdamW")?;
        let config = AdamWConfig {
            beta1: r.f32()?,
            beta2: r.f32()?,
            eps: r.f32()?,
            weight_decay: r.f32()?,
        };
        let (groups, specs) = r.layout(8)?;
        let step = r.u64()?;
        let layout = Self::validate(&config, &groups, &specs)
            .map_err(|_| StateError::Malformed("stored hyperparameters or layout are invalid"))?;
        let exp_avg = r.f32s(layout.total)?;
        let exp_avg_sq = r.f32s(layout.total)?;
        r.finish()?;
        Ok(Self {
            config,
            groups,
            layout,
            step,
            exp_avg,
            exp_avg_sq,
            parallel_threshold: DEFAULT_PARALLEL_THRESHOLD,
        })
    }

    /// Restores step count and moments saved by an optimizer with the same layout, groups and
    /// config (compared bit for bit); anything else is a typed [`StateError`]. On error `self` is
    /// unchanged. Continuing after a load is bit-identical to never having stopped.
    pub fn load_state(&mut self, bytes: &[u8]) -> Result<(), OptimError> {
        let saved = Self::from_state(bytes)?;
        if let Some(d) = state::layout_diff(&self.layout.specs, &saved.layout.specs) {
            return Err(StateError::LayoutMismatch(d).into());
        }
        let bits = |c: &AdamWConfig| [c.beta1, c.beta2, c.eps, c.weight_decay].map(f32::to_bits);
        if bits(&self.config) != bits(&saved.config) {
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
        self.exp_avg = saved.exp_avg;
        self.exp_avg_sq = saved.exp_avg_sq;
        Ok(())
    }
}

#[inline]
fn update(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], c: &Coeffs) {
    // PyTorch's lerp picks its formula by the size of the weight; so do we, outside the loop.
    if c.w1 < 0.5 {
        update_impl::<true>(p, g, m, v, c)
    } else {
        update_impl::<false>(p, g, m, v, c)
    }
}

#[inline]
fn update_impl<const SMALL_W1: bool>(
    p: &mut [f32],
    g: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    c: &Coeffs,
) {
    let c = *c;
    let it = p.iter_mut().zip(g).zip(m.iter_mut().zip(v.iter_mut()));
    for ((p, &g), (m, v)) in it {
        let g = g * c.grad_scale;
        let decayed = *p * c.decay;
        let m_new = if SMALL_W1 {
            *m + c.w1 * (g - *m)
        } else {
            g - (g - *m) * c.one_minus_w1
        };
        let v_new = *v * c.beta2 + c.one_minus_beta2 * g * g;
        let denom = v_new.sqrt() / c.bc2_sqrt + c.eps;
        *p = decayed + (c.neg_step_size * m_new) / denom;
        *m = m_new;
        *v = v_new;
    }
}

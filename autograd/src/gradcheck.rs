//! Finite-difference gradient checking: the test every op (and every model built from them)
//! must pass.
//!
//! The analytic side is one `backward_with(y, r)` for a fixed random projection `r`, i.e. the
//! gradient of `L = Σ r ⊙ f(θ)`. The numeric side perturbs each parameter element by `±h`
//! (in f32, then uses the perturbation actually applied) and evaluates `L` in f64 from the f32
//! outputs: a central difference `(L₊ − L₋) / (θ₊ − θ₋)`.

use std::fmt;

use crate::{init::Rng, Graph, ParamStore, Result, Tensor};

/// Settings of a gradient check.
#[derive(Clone, Copy, Debug)]
pub struct GradCheck {
    /// Perturbation `h`.
    pub step: f32,
    /// Absolute tolerance.
    pub atol: f64,
    /// Relative tolerance (of the larger magnitude of the two gradients).
    pub rtol: f64,
    /// Seed of the random output projection.
    pub seed: u64,
}

impl Default for GradCheck {
    fn default() -> Self {
        GradCheck {
            step: 1e-2,
            atol: 1e-3,
            rtol: 1e-2,
            seed: 0x5EED,
        }
    }
}

/// One gradient element outside tolerance.
#[derive(Clone, Debug)]
pub struct Mismatch {
    /// Parameter name.
    pub param: String,
    /// Element index.
    pub index: usize,
    /// From backward.
    pub analytic: f64,
    /// From central differences.
    pub numeric: f64,
}

/// Outcome of [`check_gradients`].
#[derive(Clone, Debug, Default)]
pub struct GradCheckReport {
    /// Elements compared.
    pub checked: usize,
    /// Largest `|analytic − numeric|`.
    pub max_abs_err: f64,
    /// Largest `|analytic| `, for scale.
    pub max_grad: f64,
    /// Elements outside tolerance (at most 20 kept).
    pub mismatches: Vec<Mismatch>,
    /// Total number of elements outside tolerance.
    pub failed: usize,
}

impl GradCheckReport {
    /// True when every element is within tolerance.
    pub fn passed(&self) -> bool {
        self.failed == 0 && self.checked > 0
    }
}

impl fmt::Display for GradCheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} elements checked, {} failed, max |err| {:.3e}, max |grad| {:.3e}",
            self.checked, self.failed, self.max_abs_err, self.max_grad
        )?;
        for m in &self.mismatches {
            write!(
                f,
                "\n  {}[{}]: analytic {:.6e}, numeric {:.6e}",
                m.param, m.index, m.analytic, m.numeric
            )?;
        }
        Ok(())
    }
}

/// Compares backward's gradients of every parameter in `store` with central differences of
/// `L = Σ r ⊙ f(store)`. `f` builds the computation on a fresh graph (it is called once with
/// gradients on and twice per element with gradients off). Zeroes the store's gradients first.
///
/// ```
/// use autograd::gradcheck::{check_gradients, GradCheck};
/// use autograd::{init, ParamStore};
/// let mut ps = ParamStore::new();
/// let x = ps.add("x", &[3, 8], init::normal(24, 1.0, 1))?;
/// let report = check_gradients(&mut ps, |g| { let x = g.param(x)?; g.gelu(x) }, &GradCheck::default())?;
/// assert!(report.passed(), "{report}");
/// # Ok::<(), autograd::Error>(())
/// ```
pub fn check_gradients<F>(store: &mut ParamStore, f: F, cfg: &GradCheck) -> Result<GradCheckReport>
where
    F: Fn(&mut Graph<'_>) -> Result<Tensor>,
{
    store.zero_grad();
    let r: Vec<f32> = {
        let mut g = Graph::new(store);
        let y = f(&mut g)?;
        let n = g.shape(y)?.numel();
        let mut rng = Rng::new(cfg.seed);
        let r: Vec<f32> = (0..n).map(|_| 2.0 * rng.uniform() - 1.0).collect();
        g.backward_with(y, &r)?;
        r
    };
    let analytic: Vec<Vec<f32>> = store.grads().iter().map(|g| g.to_vec()).collect();
    let loss = |store: &mut ParamStore| -> Result<f64> {
        let mut g = Graph::new(store);
        g.set_grad_enabled(false);
        let y = f(&mut g)?;
        Ok(g.value(y)?
            .iter()
            .zip(&r)
            .map(|(&y, &r)| y as f64 * r as f64)
            .sum())
    };
    let mut rep = GradCheckReport::default();
    let ids: Vec<_> = store.ids().collect();
    for id in ids {
        let grads = &analytic[id.index()];
        for (i, &a) in grads.iter().enumerate() {
            let orig = store.value(id)?[i];
            let (hi, lo) = (orig + cfg.step, orig - cfg.step);
            store.value_mut(id)?[i] = hi;
            let lp = loss(store)?;
            store.value_mut(id)?[i] = lo;
            let lm = loss(store)?;
            store.value_mut(id)?[i] = orig;
            let numeric = (lp - lm) / (hi as f64 - lo as f64);
            let a = a as f64;
            let err = (a - numeric).abs();
            rep.checked += 1;
            rep.max_abs_err = rep.max_abs_err.max(err);
            rep.max_grad = rep.max_grad.max(a.abs());
            let ok = err <= cfg.atol + cfg.rtol * a.abs().max(numeric.abs());
            if !ok {
                rep.failed += 1;
                if rep.mismatches.len() < 20 {
                    let param = store.name(id)?.to_string();
                    rep.mismatches.push(Mismatch {
                        param,
                        index: i,
                        analytic: a,
                        numeric,
                    });
                }
            }
        }
    }
    Ok(rep)
}

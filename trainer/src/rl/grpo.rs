//! GRPO: group-normalized advantages and the PPO-clipped policy-gradient loss.
//!
//! * Advantages: each prompt's `G` completions form a group; `A = (R − mean) / (std + 1e-4)`
//!   with the population standard deviation of the group's rewards, or `A = R − mean` when
//!   the std division is off (Dr. GRPO). A group whose rewards are all equal gets `A = 0`.
//! * Per completion token `t` with advantage `A`, correction weight `w`
//!   ([`super::correction`]), ratio `ρ = exp(logp_new − logp_old)` (`logp_old`: the RL
//!   trainer's log-probability before this batch's first update):
//!   `ℓ_t = −w · min(ρ A, clip(ρ, 1 − ε, 1 + ε) A) + β · k3(logp_ref, logp_new)` where
//!   `k3 = exp(ref − new) − (ref − new) − 1` is the KL penalty to the initial policy
//!   (`β = 0`: off).
//! * Token-level normalization: the loss of a (mini)batch is `Σ_t ℓ_t / N`, `N` = the number
//!   of completion tokens in it (every token weighs the same, whatever its sequence's length).
//!
//! The gradient is applied at the logits: `∂ℓ_t/∂logits = (∂ℓ_t/∂logp_new) · (onehot − softmax)`
//! with `∂ℓ_t/∂logp_new = −w A ρ` when the clip is inactive (0 when it is), plus
//! `β (1 − exp(ref − new))`; [`autograd::Graph::backward_with`] carries it into the weights.

/// Group-normalized advantages of `rewards` in groups of `group` consecutive entries.
///
/// ```
/// use trainer::rl::grpo::advantages;
/// let a = advantages(&[1.0, 0.0, 0.0, 0.0, 1.0, 1.0], 3, false);
/// assert_eq!(a.len(), 6);
/// assert!((a[0] - 2.0 / 3.0).abs() < 1e-6 && (a[1] + 1.0 / 3.0).abs() < 1e-6);
/// assert!((a[3] + 2.0 / 3.0).abs() < 1e-6);
/// ```
pub fn advantages(rewards: &[f32], group: usize, scale_std: bool) -> Vec<f32> {
    let mut out = Vec::with_capacity(rewards.len());
    for g in rewards.chunks(group.max(1)) {
        let n = g.len() as f64;
        let mean = g.iter().map(|&r| r as f64).sum::<f64>() / n;
        let var = g.iter().map(|&r| (r as f64 - mean).powi(2)).sum::<f64>() / n;
        let div = if scale_std { var.sqrt() + 1e-4 } else { 1.0 };
        out.extend(g.iter().map(|&r| ((r as f64 - mean) / div) as f32));
    }
    out
}

/// One token's terms.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenTerms {
    /// The loss `ℓ_t` (before division by `N`).
    pub loss: f64,
    /// `∂ℓ_t/∂logp_new`.
    pub dlogp: f64,
    /// Whether the PPO clip was active.
    pub clipped: bool,
}

/// The loss and its derivative for one token (see the module docs).
///
/// ```
/// use trainer::rl::grpo::token_terms;
/// // on-policy (ratio 1), advantage 2, weight 0.5: loss −1, gradient −1 per unit logp
/// let t = token_terms(-1.0, -1.0, 2.0, 0.5, 0.2, None, 0.0);
/// assert_eq!((t.loss, t.dlogp, t.clipped), (-1.0, -1.0, false));
/// ```
#[allow(clippy::too_many_arguments)]
pub fn token_terms(
    logp_new: f32,
    logp_old: f32,
    advantage: f32,
    weight: f64,
    clip_eps: f64,
    logp_ref: Option<f32>,
    kl_coef: f64,
) -> TokenTerms {
    let a = advantage as f64;
    let rho = (logp_new as f64 - logp_old as f64).exp();
    let unclipped = rho * a;
    let clipped_v = rho.clamp(1.0 - clip_eps, 1.0 + clip_eps) * a;
    let clipped = clipped_v < unclipped;
    let mut loss = -weight * unclipped.min(clipped_v);
    let mut dlogp = if clipped { 0.0 } else { -weight * a * rho };
    if let (Some(r), true) = (logp_ref, kl_coef != 0.0) {
        let d = r as f64 - logp_new as f64;
        loss += kl_coef * (d.exp() - d - 1.0);
        dlogp += kl_coef * (1.0 - d.exp());
    }
    TokenTerms {
        loss,
        dlogp,
        clipped,
    }
}

/// Writes `scale · (onehot(token) − softmax(logits))` into `grad` (f64 softmax).
pub fn logp_grad(logits: &[f32], token: usize, scale: f64, grad: &mut [f32]) {
    let m = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let s: f64 = logits.iter().map(|&x| (x as f64 - m).exp()).sum();
    for (i, (g, &x)) in grad.iter_mut().zip(logits).enumerate() {
        let p = (x as f64 - m).exp() / s;
        let one = if i == token { 1.0 } else { 0.0 };
        *g = (scale * (one - p)) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_by_hand() {
        let l2 = 2f32.ln();
        // ratio 2 with A > 0: clipped at 1.2, no gradient
        let t = token_terms(l2, 0.0, 1.0, 1.0, 0.2, None, 0.0);
        assert!(t.clipped && t.dlogp == 0.0 && (t.loss + 1.2).abs() < 1e-6);
        // ratio 2 with A < 0: the unclipped term is the minimum, gradient flows
        let t = token_terms(l2, 0.0, -1.0, 1.0, 0.2, None, 0.0);
        assert!(!t.clipped && (t.loss - 2.0).abs() < 1e-6 && (t.dlogp - 2.0).abs() < 1e-6);
        // ratio 0.5 with A < 0: clipped at 0.8
        let t = token_terms(-l2, 0.0, -1.0, 1.0, 0.2, None, 0.0);
        assert!(t.clipped && (t.loss - 0.8).abs() < 1e-6);
        // KL: ref − new = ln 2 → k3 = 2 − ln 2 − 1, derivative β (1 − 2)
        let t = token_terms(0.0, 0.0, 0.0, 1.0, 0.2, Some(l2), 0.5);
        assert!((t.loss - 0.5 * (1.0 - 2f64.ln())).abs() < 1e-6 && (t.dlogp + 0.5).abs() < 1e-6);
    }

    #[test]
    fn advantages_by_hand() {
        let a = advantages(&[1.0, 0.0], 2, true);
        assert!((a[0] - 0.5 / 0.5001).abs() < 1e-6 && (a[1] + 0.5 / 0.5001).abs() < 1e-6);
        assert_eq!(advantages(&[1.0, 1.0, 0.0, 0.0], 2, true), vec![0.0; 4]);
    }

    #[test]
    fn logp_grad_matches_finite_difference() {
        let logits = [0.3f32, -1.0, 2.0];
        let mut g = [0.0f32; 3];
        logp_grad(&logits, 1, 1.0, &mut g);
        for i in 0..3 {
            let mut up = logits;
            up[i] += 1e-3;
            let fd = (crate::rl::sampler::token_logprob(&up, 1)
                - crate::rl::sampler::token_logprob(&logits, 1))
                / 1e-3;
            assert!((fd - g[i]).abs() < 2e-3, "{i}: {fd} vs {}", g[i]);
        }
    }
}

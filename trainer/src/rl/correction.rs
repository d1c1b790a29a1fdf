//! Off-policy correction of the sampler/trainer mismatch, and the mismatch metrics.
//!
//! Per completion token, `r = p_trainer / p_sampler = exp(logp_trainer − logp_sampler)`, with
//! `logp_trainer` recomputed by the RL trainer (before its update) and `logp_sampler` recorded
//! by the sampler. The policy-gradient loss of each token is multiplied by a weight `w`:
//!
//! | correction | weight |
//! |---|---|
//! | `none` | 1 |
//! | `token-tis` | `min(r, C)` (truncated importance sampling) |
//! | `token-mis` | `r` if `1/C ≤ r ≤ C`, else 0 (masked importance sampling) |
//! | `seq-tis` | `min(R, C)` for every token of the sequence, `R = Π r` over its tokens |
//! | `seq-mis` | `R` if `1/C ≤ R ≤ C`, else 0, for every token of the sequence |
//!
//! `C = 2` by default. Everything is computed in f64 from the f32 log-probabilities.

use serde::{Deserialize, Serialize};

/// The correction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Correction {
    /// No weight.
    #[default]
    None,
    /// Token-level truncated importance sampling.
    TokenTis,
    /// Token-level masked importance sampling.
    TokenMis,
    /// Sequence-level truncated importance sampling.
    SeqTis,
    /// Sequence-level masked importance sampling.
    SeqMis,
}

/// Correction names (CLI and TOML spelling).
pub const CORRECTION_NAMES: [&str; 5] = ["none", "token-tis", "token-mis", "seq-tis", "seq-mis"];

impl Correction {
    /// By name.
    pub fn from_name(name: &str) -> Result<Correction, String> {
        Ok(match name {
            "none" => Correction::None,
            "token-tis" => Correction::TokenTis,
            "token-mis" => Correction::TokenMis,
            "seq-tis" => Correction::SeqTis,
            "seq-mis" => Correction::SeqMis,
            _ => {
                return Err(format!(
                    "unknown correction '{name}'; valid: {}",
                    CORRECTION_NAMES.join(", ")
                ))
            }
        })
    }

    /// The name.
    pub fn name(self) -> &'static str {
        CORRECTION_NAMES[self as usize]
    }
}

/// Per-token weights of `sequences` (each: trainer and sampler log-probabilities of its
/// tokens) and how many tokens were truncated (`*-tis`: ratio above `C`) or masked
/// (`*-mis`: outside `[1/C, C]`).
///
/// ```
/// use trainer::rl::correction::{weights, Correction};
/// let lt = [0.0f32, 0.0];
/// let ls = [(0.25f32).ln(), (2.0f32).ln()]; // ratios 4 and 0.5
/// let (w, n) = weights(Correction::TokenTis, 2.0, &[(&lt[..], &ls[..])]);
/// assert_eq!((w[0][0], n), (2.0, 1));
/// assert!((w[0][1] - 0.5).abs() < 1e-7);
/// ```
pub fn weights(kind: Correction, c: f64, sequences: &[(&[f32], &[f32])]) -> (Vec<Vec<f64>>, usize) {
    let mut affected = 0;
    let out = sequences
        .iter()
        .map(|(lt, ls)| {
            let r: Vec<f64> = lt
                .iter()
                .zip(ls.iter())
                .map(|(&t, &s)| (t as f64 - s as f64).exp())
                .collect();
            let seq_r = (lt
                .iter()
                .zip(ls.iter())
                .map(|(&t, &s)| t as f64 - s as f64)
                .sum::<f64>())
            .exp();
            let inside = |x: f64| x >= 1.0 / c && x <= c;
            match kind {
                Correction::None => vec![1.0; r.len()],
                Correction::TokenTis => r
                    .iter()
                    .map(|&x| {
                        affected += (x > c) as usize;
                        x.min(c)
                    })
                    .collect(),
                Correction::TokenMis => r
                    .iter()
                    .map(|&x| {
                        affected += (!inside(x)) as usize;
                        if inside(x) {
                            x
                        } else {
                            0.0
                        }
                    })
                    .collect(),
                Correction::SeqTis => {
                    affected += if seq_r > c { r.len() } else { 0 };
                    vec![seq_r.min(c); r.len()]
                }
                Correction::SeqMis => {
                    let ok = inside(seq_r);
                    affected += if ok { 0 } else { r.len() };
                    vec![if ok { seq_r } else { 0.0 }; r.len()]
                }
            }
        })
        .collect();
    (out, affected)
}

/// Sampler/trainer mismatch over a set of tokens.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Mismatch {
    /// Tokens compared.
    pub tokens: usize,
    /// Mean `|logp_sampler − logp_trainer|`.
    pub mean_abs_dlogp: f64,
    /// The k3 estimator of KL(sampler ‖ trainer): mean of `r − 1 − ln r`.
    pub k3: f64,
    /// Mean `exp(|Δlogp|)`.
    pub mean_exp_abs_dlogp: f64,
    /// Mean importance ratio `r`.
    pub ratio_mean: f64,
    /// Smallest ratio.
    pub ratio_min: f64,
    /// Largest ratio.
    pub ratio_max: f64,
    /// Fraction of tokens whose two log-probabilities differ in any bit.
    pub frac_bitwise_different: f64,
}

/// The mismatch of trainer (`lt`) and sampler (`ls`) log-probabilities, token by token.
///
/// ```
/// use trainer::rl::correction::mismatch;
/// let m = mismatch(&[-1.0, -2.0], &[-1.0, -2.0]);
/// assert_eq!((m.mean_abs_dlogp, m.k3, m.frac_bitwise_different), (0.0, 0.0, 0.0));
/// assert_eq!((m.ratio_min, m.ratio_max), (1.0, 1.0));
/// ```
pub fn mismatch(lt: &[f32], ls: &[f32]) -> Mismatch {
    let n = lt.len().min(ls.len());
    if n == 0 {
        return Mismatch::default();
    }
    let (mut abs, mut k3, mut eabs, mut rs, mut diff) = (0.0, 0.0, 0.0, 0.0, 0usize);
    let (mut rmin, mut rmax) = (f64::INFINITY, f64::NEG_INFINITY);
    for (&t, &s) in lt.iter().zip(ls) {
        let d = t as f64 - s as f64;
        let r = d.exp();
        abs += d.abs();
        k3 += r - 1.0 - d;
        eabs += d.abs().exp();
        rs += r;
        rmin = rmin.min(r);
        rmax = rmax.max(r);
        diff += (t.to_bits() != s.to_bits()) as usize;
    }
    let nf = n as f64;
    Mismatch {
        tokens: n,
        mean_abs_dlogp: abs / nf,
        k3: k3 / nf,
        mean_exp_abs_dlogp: eabs / nf,
        ratio_mean: rs / nf,
        ratio_min: rmin,
        ratio_max: rmax,
        frac_bitwise_different: diff as f64 / nf,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hand-computed: ratios e^{ln 3} = 3, e^{ln 1.5} = 1.5, e^{-ln 4} = 0.25 in one sequence
    /// (sequence ratio 1.125) and ratio 1 in another.
    #[test]
    fn correction_arithmetic_by_hand() {
        let lt1 = [3f32.ln(), 1.5f32.ln(), 0.0];
        let ls1 = [0.0f32, 0.0, 4f32.ln()];
        let (lt2, ls2) = ([-0.5f32], [-0.5f32]);
        let seqs = [(&lt1[..], &ls1[..]), (&lt2[..], &ls2[..])];
        let close = |a: &[Vec<f64>], b: &[&[f64]]| {
            a.iter()
                .zip(b)
                .all(|(x, y)| x.iter().zip(y.iter()).all(|(p, q)| (p - q).abs() < 1e-6))
        };
        let (w, n) = weights(Correction::None, 2.0, &seqs);
        assert!(close(&w, &[&[1.0, 1.0, 1.0], &[1.0]]) && n == 0);
        let (w, n) = weights(Correction::TokenTis, 2.0, &seqs);
        assert!(close(&w, &[&[2.0, 1.5, 0.25], &[1.0]]) && n == 1, "{w:?}");
        let (w, n) = weights(Correction::TokenMis, 2.0, &seqs);
        assert!(close(&w, &[&[0.0, 1.5, 0.0], &[1.0]]) && n == 2, "{w:?}");
        let (w, n) = weights(Correction::SeqTis, 2.0, &seqs);
        assert!(close(&w, &[&[1.125; 3], &[1.0]]) && n == 0, "{w:?}");
        let (w, n) = weights(Correction::SeqTis, 1.1, &seqs);
        assert!(close(&w, &[&[1.1; 3], &[1.0]]) && n == 3, "{w:?}");
        let (w, n) = weights(Correction::SeqMis, 1.1, &seqs);
        assert!(close(&w, &[&[0.0; 3], &[1.0]]) && n == 3, "{w:?}");
        let (w, n) = weights(Correction::SeqMis, 2.0, &seqs);
        assert!(close(&w, &[&[1.125; 3], &[1.0]]) && n == 0, "{w:?}");
    }

    #[test]
    fn mismatch_by_hand() {
        // d = ln 2 and -ln 2: r = 2 and 0.5
        let m = mismatch(&[2f32.ln(), 0.0], &[0.0, 2f32.ln()]);
        let l2 = 2f64.ln();
        assert!((m.mean_abs_dlogp - l2).abs() < 1e-6);
        assert!((m.k3 - 0.5 * ((2.0 - 1.0 - l2) + (0.5 - 1.0 + l2))).abs() < 1e-6);
        assert!((m.mean_exp_abs_dlogp - 2.0).abs() < 1e-6);
        assert!((m.ratio_mean - 1.25).abs() < 1e-6 && (m.ratio_min - 0.5).abs() < 1e-6);
        assert_eq!(m.frac_bitwise_different, 1.0);
        assert_eq!(
            Correction::from_name("tis").unwrap_err(),
            "unknown correction 'tis'; valid: none, token-tis, token-mis, seq-tis, seq-mis"
        );
        for n in CORRECTION_NAMES {
            assert_eq!(Correction::from_name(n).unwrap().name(), n);
        }
    }
}

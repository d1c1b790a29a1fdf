//! The RL sampler: batched autoregressive generation with a KV cache (a prefill of the
//! prompts, then one decode step per token), at the plan's sampler precision, recording each
//! sampled token's log-probability at that precision.
//!
//! * Prompts are grouped by length (each group is one batch: every row of a decode step sits
//!   at the same position); a row that reached a stop token keeps decoding with the others
//!   and its extra tokens are dropped (rows never influence each other's bits at a precision
//!   whose quantization is per row, see [`super::frozen`]).
//! * Each rollout draws from its own xoshiro256** stream seeded from `(seed, rollout index)`,
//!   so a rollout does not depend on which other prompts are in the batch, and a replay with
//!   the same seed gives the same tokens.
//! * Token choice: temperature (0 = greedy), then top-k (0 = all), then top-p (nucleus, 1 =
//!   all) on the temperature-scaled distribution, ties broken by token id. The recorded
//!   log-probability is the policy's own, `log softmax(logits)[token]` at temperature 1 over
//!   the full vocabulary ([`token_logprob`], in f64, rounded to f32), which is what the RL
//!   trainer recomputes from its logits with the same function.

use autograd::{Graph, ParamStore};
use serde::{Deserialize, Serialize};

use super::frozen::FrozenLinears;
use super::kv_cache::KvCache;
use super::plan::ActivationScales;
use crate::model::{Gpt, ModelError};
use crate::recipe::Recipe;
use crate::rng::{SplitMix64, Xoshiro256StarStar};

/// Generation settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenConfig {
    /// New tokens per rollout at most.
    pub max_tokens: usize,
    /// Softmax temperature (0 = greedy).
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p` (1 = all).
    pub top_p: f32,
    /// Tokens that end a rollout (kept as its last token).
    pub stop: Vec<u32>,
}

impl GenConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), ModelError> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(ModelError::Invalid(format!(
                "temperature {} must be finite and >= 0",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(ModelError::Invalid(format!(
                "top_p {} must be in (0, 1]",
                self.top_p
            )));
        }
        Ok(())
    }
}

/// One generated completion.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rollout {
    /// The prompt's tokens.
    pub prompt: Vec<u32>,
    /// The generated tokens (ending with a stop token when `stopped`).
    pub tokens: Vec<u32>,
    /// Sampler log-probability of each generated token.
    pub logprobs: Vec<f32>,
    /// Sampler entropy (nats) of the distribution each token was drawn from (temperature 1).
    pub entropies: Vec<f32>,
    /// Whether it ended with a stop token.
    pub stopped: bool,
}

/// `log softmax(logits)[token]`, computed in f64 (max-shifted) and rounded to f32.
///
/// ```
/// let lp = trainer::rl::sampler::token_logprob(&[0.0, 0.0], 1);
/// assert_eq!(lp, (0.5f64).ln() as f32);
/// ```
pub fn token_logprob(logits: &[f32], token: usize) -> f32 {
    let m = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let s: f64 = logits.iter().map(|&x| (x as f64 - m).exp()).sum();
    ((logits[token] as f64 - m) - s.ln()) as f32
}

/// Entropy (nats) of `softmax(logits)`, in f64.
pub fn entropy(logits: &[f32]) -> f32 {
    let m = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let e: Vec<f64> = logits.iter().map(|&x| (x as f64 - m).exp()).collect();
    let s: f64 = e.iter().sum();
    let h: f64 = e
        .iter()
        .filter(|&&p| p > 0.0)
        .map(|&p| -(p / s) * (p / s).ln())
        .sum();
    h as f32
}

/// Picks a token (see the module docs).
pub fn pick(logits: &[f32], cfg: &GenConfig, rng: &mut Xoshiro256StarStar) -> u32 {
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    if cfg.temperature == 0.0 || idx.len() == 1 {
        return idx[0] as u32;
    }
    let k = if cfg.top_k == 0 {
        idx.len()
    } else {
        cfg.top_k.min(idx.len())
    };
    let top = &idx[..k];
    let m = logits[top[0]] as f64;
    let t = cfg.temperature as f64;
    let w: Vec<f64> = top
        .iter()
        .map(|&i| ((logits[i] as f64 - m) / t).exp())
        .map(|x| if x.is_finite() { x } else { 0.0 })
        .collect();
    let total: f64 = w.iter().sum();
    if total.is_nan() || total <= 0.0 {
        return top[0] as u32;
    }
    let mut keep = k;
    if cfg.top_p < 1.0 {
        let mut acc = 0.0;
        for (j, wi) in w.iter().enumerate() {
            acc += wi / total;
            if acc >= cfg.top_p as f64 {
                keep = j + 1;
                break;
            }
        }
    }
    let total: f64 = w[..keep].iter().sum();
    let mut u = rng.next_f64() * total;
    for (&i, &wi) in top[..keep].iter().zip(&w) {
        if u < wi {
            return i as u32;
        }
        u -= wi;
    }
    top[keep - 1] as u32
}

/// The random stream of rollout `index` of a call seeded with `seed`.
pub fn rollout_rng(seed: u64, index: u64) -> Xoshiro256StarStar {
    let mut sm = SplitMix64::new(seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    Xoshiro256StarStar::seed_from_u64(sm.next_u64())
}

/// A policy copy for generation: its own parameters, weights frozen at the last sync.
pub struct PolicySampler {
    model: Gpt,
    ps: ParamStore,
    recipe: Recipe,
    scales: ActivationScales,
    frozen: FrozenLinears,
    /// The CUDA device the forward passes run on (`None`: the CPU).
    dev: Option<std::sync::Arc<autograd::backend::DeviceBackend>>,
}

impl PolicySampler {
    /// A sampler for `model` under `recipe` (Fprop policies at progress 0) with the weights of
    /// `ps` (see [`PolicySampler::sync`] for `calibration`).
    pub fn new(
        model: &Gpt,
        ps: &ParamStore,
        recipe: Recipe,
        scales: ActivationScales,
        calibration: &[Vec<u32>],
    ) -> Result<PolicySampler, ModelError> {
        let mut own = ParamStore::new();
        let model = Gpt::new(&mut own, model.cfg.clone(), 0)?;
        let frozen = FrozenLinears::new(&model, &own, &recipe)?;
        let mut s = PolicySampler {
            model,
            ps: own,
            recipe,
            scales,
            frozen,
            dev: None,
        };
        s.sync(ps, calibration)?;
        Ok(s)
    }

    /// Runs the forward passes on `dev` (its store moves there; `None`: back to the CPU).
    pub fn set_device(
        &mut self,
        dev: Option<std::sync::Arc<autograd::backend::DeviceBackend>>,
    ) -> Result<(), ModelError> {
        match &dev {
            Some(d) => self.ps.to_device(d)?,
            None => self.ps.to_host()?,
        }
        self.dev = dev;
        Ok(())
    }

    /// The model.
    pub fn model(&self) -> &Gpt {
        &self.model
    }

    /// The recipe.
    pub fn recipe(&self) -> &Recipe {
        &self.recipe
    }

    /// The frozen linear layers (their static amaxes, if any).
    pub fn frozen(&self) -> &FrozenLinears {
        &self.frozen
    }

    /// Weight sync: copies the policy's parameters from `ps`, quantizes every weight once
    /// and, with static activation scales, calibrates each linear layer's input amax on
    /// `calibration` (whole sequences, one batch per length) with the new weights, through
    /// [`crate::calibrate::input_amax`] in FP32.
    pub fn sync(&mut self, ps: &ParamStore, calibration: &[Vec<u32>]) -> Result<(), ModelError> {
        self.ps.to_host()?;
        self.ps.import(&ps.export())?;
        self.frozen = FrozenLinears::new(&self.model, &self.ps, &self.recipe)?;
        if self.scales == ActivationScales::Static {
            if calibration.is_empty() {
                return Err(ModelError::Invalid(
                    "static activation scales need calibration sequences".into(),
                ));
            }
            // trainer::calibrate's per-linear input amax, in FP32 (as ModelOpt's max
            // calibration observes the unquantized model), one batch per sequence length
            let batches: Vec<crate::data::Batch> = by_length(calibration)
                .into_iter()
                .map(|(len, rows)| {
                    let inputs: Vec<u32> =
                        rows.iter().flat_map(|&i| calibration[i].clone()).collect();
                    crate::data::Batch {
                        targets: inputs.clone(),
                        inputs,
                        batch: rows.len(),
                        seq: len,
                    }
                })
                .collect();
            let fp32 = Recipe::builtin("fp32").expect("built-in recipe");
            let amax = crate::calibrate::input_amax(&self.model, &mut self.ps, &fp32, batches)
                .map_err(|e| {
                    ModelError::Invalid(format!("calibrating static activation scales: {e}"))
                })?
                .into_iter()
                .map(|a| a.amax)
                .collect();
            self.frozen.set_static_amax(amax)?;
        }
        if let Some(d) = &self.dev {
            self.ps.to_device(d)?;
        }
        Ok(())
    }

    /// Logits `[rows, t, vocab]` of the next `t` tokens of every row (see
    /// [`Gpt::forward_cached`]); accumulates the linear inputs' amax into `amax` when given.
    pub fn forward(
        &mut self,
        tokens: &[u32],
        rows: usize,
        cache: &mut KvCache,
        mut amax: Option<&mut Vec<f32>>,
    ) -> Result<Vec<f32>, ModelError> {
        let vocab = self.model.cfg.vocab;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ModelError::Invalid(format!(
                "token {bad} is outside the vocabulary ({vocab})"
            )));
        }
        let frozen = &self.frozen;
        let mut g = Graph::new(&mut self.ps).with_rng(0, 0);
        g.set_grad_enabled(false);
        let mut lin = |g: &mut Graph<'_>, x, i: usize| {
            let (y, a) = frozen.apply(g, x, i)?;
            if let Some(m) = amax.as_deref_mut() {
                m[i] = m[i].max(a);
            }
            Ok(y)
        };
        let logits = self.model.forward_cached(
            &mut g,
            tokens,
            rows,
            self.recipe.attention,
            cache,
            &mut lin,
        )?;
        Ok(g.to_vec(logits)?)
    }

    /// Generates one completion per prompt (rollout `i` uses stream `rollout_rng(seed, i)`).
    /// Every prompt plus `max_tokens` must fit the model's context.
    pub fn generate(
        &mut self,
        prompts: &[Vec<u32>],
        cfg: &GenConfig,
        seed: u64,
    ) -> Result<Vec<Rollout>, ModelError> {
        cfg.validate()?;
        let seq = self.model.cfg.seq;
        let vocab = self.model.cfg.vocab;
        if let Some(p) = prompts
            .iter()
            .find(|p| p.is_empty() || p.len() + cfg.max_tokens > seq)
        {
            return Err(ModelError::Invalid(format!(
                "a prompt of {} tokens plus {} new tokens does not fit the model's context of {seq} (prompts must be non-empty)",
                p.len(),
                cfg.max_tokens
            )));
        }
        let mut out: Vec<Option<Rollout>> = vec![None; prompts.len()];
        for (len, rows) in by_length(prompts) {
            let r = rows.len();
            let mut cache = KvCache::new(&self.model.cfg, r, len + cfg.max_tokens)
                .map_err(|e| ModelError::Invalid(e.to_string()))?;
            let tokens: Vec<u32> = rows.iter().flat_map(|&i| prompts[i].clone()).collect();
            let logits = self.forward(&tokens, r, &mut cache, None)?;
            let mut last: Vec<Vec<f32>> = (0..r)
                .map(|j| logits[((j + 1) * len - 1) * vocab..(j + 1) * len * vocab].to_vec())
                .collect();
            let mut rngs: Vec<Xoshiro256StarStar> =
                rows.iter().map(|&i| rollout_rng(seed, i as u64)).collect();
            let mut rolls: Vec<Rollout> = rows
                .iter()
                .map(|&i| Rollout {
                    prompt: prompts[i].clone(),
                    tokens: vec![],
                    logprobs: vec![],
                    entropies: vec![],
                    stopped: false,
                })
                .collect();
            for step in 0..cfg.max_tokens {
                let mut next = Vec::with_capacity(r);
                for j in 0..r {
                    let t = pick(&last[j], cfg, &mut rngs[j]);
                    let ro = &mut rolls[j];
                    if !ro.stopped {
                        ro.tokens.push(t);
                        ro.logprobs.push(token_logprob(&last[j], t as usize));
                        ro.entropies.push(entropy(&last[j]));
                        ro.stopped = cfg.stop.contains(&t);
                    }
                    next.push(t);
                }
                if step + 1 == cfg.max_tokens || rolls.iter().all(|r| r.stopped) {
                    break;
                }
                let logits = self.forward(&next, r, &mut cache, None)?;
                last = logits.chunks_exact(vocab).map(|c| c.to_vec()).collect();
            }
            for (&i, ro) in rows.iter().zip(rolls) {
                out[i] = Some(ro);
            }
        }
        Ok(out.into_iter().flatten().collect())
    }
}

/// Indices of `seqs` grouped by length, shortest first.
fn by_length(seqs: &[Vec<u32>]) -> Vec<(usize, Vec<usize>)> {
    let mut groups: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
    for (i, s) in seqs.iter().enumerate() {
        groups.entry(s.len()).or_default().push(i);
    }
    groups.into_iter().filter(|(l, _)| *l > 0).collect()
}

//! Text generation from a checkpoint at a chosen precision (the "RL sampler" stage): the
//! forward pass runs with gradients off and every linear layer's Fprop under the chosen
//! recipe's policy at progress 0 (so a quantized recipe's late switch to BF16 does not
//! apply). Temperature, top-k and top-p sampling from seeded xoshiro256** streams, ending at
//! a stop token or after a number of tokens, through the KV-cache sampler of
//! [`crate::rl::sampler`]; [`Sampler::next_logits`] is the full
//! recomputation (the whole context re-run for one token), kept as the reference the cache is
//! tested and benchmarked against.

use std::path::Path;

use autograd::{Graph, ParamStore};
use serde::{Deserialize, Serialize};

use crate::any_checkpoint::AnyCheckpoint;
use crate::model::{Gpt, ModelError, Precision};
use crate::recipe::Recipe;
use crate::rl::plan::ActivationScales;
use crate::rl::sampler::{GenConfig, PolicySampler};
use crate::rng::Xoshiro256StarStar;
use crate::train::TrainError;

/// The most tokens [`Sampler::generate`] produces in one call.
pub const MAX_SAMPLE_TOKENS: usize = 1_000_000;

/// Sampling settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SampleConfig {
    /// Tokens to generate.
    pub tokens: usize,
    /// Softmax temperature (0 = greedy).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`, in
    /// `(0, 1]` (1 = all).
    #[serde(default = "one")]
    pub top_p: f32,
    /// Stop after generating one of these tokens (it is the last token returned).
    #[serde(default)]
    pub stop: Vec<u32>,
    /// Seed of the sampling stream.
    pub seed: u64,
}

fn one() -> f32 {
    1.0
}

impl SampleConfig {
    /// Checks the settings for a model of `vocab` tokens: temperature finite and `>= 0`,
    /// `top_p` in `(0, 1]`, at most [`MAX_SAMPLE_TOKENS`] tokens, stop tokens in the
    /// vocabulary.
    ///
    /// ```
    /// use trainer::sample::SampleConfig;
    /// let c = SampleConfig { tokens: 8, temperature: 0.8, top_k: 0, top_p: 0.9, stop: vec![10], seed: 0 };
    /// assert!(c.validate(256).is_ok());
    /// assert!(SampleConfig { top_p: 0.0, ..c.clone() }.validate(256).is_err());
    /// assert!(SampleConfig { stop: vec![300], ..c }.validate(256).is_err());
    /// ```
    pub fn validate(&self, vocab: usize) -> Result<(), TrainError> {
        let bad = |m: String| Err(TrainError::Sampling(m));
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad(format!(
                "temperature {} must be finite and >= 0",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(format!("top-p {} must be in (0, 1]", self.top_p));
        }
        if self.tokens > MAX_SAMPLE_TOKENS {
            return bad(format!(
                "{} tokens requested; at most {MAX_SAMPLE_TOKENS} per call",
                self.tokens
            ));
        }
        if let Some(&t) = self.stop.iter().find(|&&t| t as usize >= vocab) {
            return bad(format!(
                "stop token {t} is outside the vocabulary ({vocab})"
            ));
        }
        Ok(())
    }
}

/// A model loaded for inference.
pub struct Sampler {
    ps: ParamStore,
    model: Gpt,
    recipe: Recipe,
    dev: Option<std::sync::Arc<autograd::backend::DeviceBackend>>,
}

impl Sampler {
    /// Loads a checkpoint (pretraining or RL; directory or run directory), or a Hugging Face
    /// Llama folder
    /// ([`crate::hf::load_hf`]), and sets the precision recipe.
    pub fn load(path: &Path, recipe: Recipe) -> Result<Sampler, TrainError> {
        if crate::hf::is_hf_folder(path) {
            let (cfg, tensors) =
                crate::hf::load_hf(path).map_err(|e| TrainError::Sampling(e.to_string()))?;
            let mut ps = ParamStore::new();
            let model = Gpt::new(&mut ps, cfg, 0)?;
            ps.import(&tensors)
                .map_err(|e| TrainError::Sampling(format!("{}: {e}", path.display())))?;
            return Ok(Sampler {
                ps,
                model,
                recipe,
                dev: None,
            });
        }
        let ck = AnyCheckpoint::load(path)?;
        let mut ps = ParamStore::new();
        let model = Gpt::new(&mut ps, ck.model().clone(), 0)?;
        ck.apply(&mut ps)?;
        Ok(Sampler {
            ps,
            model,
            recipe,
            dev: None,
        })
    }

    /// Runs [`Sampler::generate`] on a CUDA device (`None`: the CPU): the KV-cache sampler's
    /// store on the device, every op's device kernel, its linear layers autograd's device
    /// linear ([`PolicySampler::set_device`]). [`Sampler::next_logits`] stays on the CPU.
    pub fn set_device(&mut self, dev: Option<std::sync::Arc<autograd::backend::DeviceBackend>>) {
        self.dev = dev;
    }

    /// The model's vocabulary size (256 for byte-level models).
    pub fn vocab(&self) -> usize {
        self.model.cfg.vocab
    }

    /// Next-token logits after `context` (its last `seq` tokens).
    pub fn next_logits(&mut self, context: &[u32]) -> Result<Vec<f32>, TrainError> {
        let seq = self.model.cfg.seq;
        let ctx = &context[context.len().saturating_sub(seq)..];
        if ctx.is_empty() {
            return Err(TrainError::Sampling(
                "sampling needs a non-empty prompt".into(),
            ));
        }
        let vocab = self.model.cfg.vocab;
        if let Some(&bad) = ctx.iter().find(|&&t| t as usize >= vocab) {
            return Err(TrainError::Model(ModelError::Invalid(format!(
                "prompt token {bad} is outside the vocabulary ({vocab})"
            ))));
        }
        let mut g = Graph::new(&mut self.ps).with_rng(0, 0);
        g.set_grad_enabled(false);
        let prec = Precision {
            recipe: &self.recipe,
            progress: 0.0,
        };
        let logits = self.model.forward_logits(&mut g, ctx, 1, &prec, None)?;
        let v = g.value(logits)?;
        Ok(v[(ctx.len() - 1) * vocab..ctx.len() * vocab].to_vec())
    }

    /// Generates `cfg.tokens` tokens after `prompt`, or fewer when a stop token comes
    /// first (it is the last token returned); returns only the new tokens.
    ///
    /// Runs the KV-cache sampler ([`crate::rl::sampler::PolicySampler`]: weights quantized
    /// once, a prefill, then one decode step per token). The context is the last `seq - 1`
    /// tokens of the prompt; when the cache is full, generation continues from a fresh prefill
    /// of the last `seq / 2` tokens (a context shift), each such window drawing from its own
    /// random stream (`seed + window`).
    pub fn generate(&mut self, prompt: &[u32], cfg: &SampleConfig) -> Result<Vec<u32>, TrainError> {
        cfg.validate(self.model.cfg.vocab)?;
        if prompt.is_empty() {
            return Err(TrainError::Sampling(
                "sampling needs a non-empty prompt".into(),
            ));
        }
        crate::memory::check(
            &format!("sampling {} tokens", cfg.tokens),
            (prompt.len() as u128 + cfg.tokens as u128) * 8,
        )?;
        let seq = self.model.cfg.seq;
        let mut sampler = PolicySampler::new(
            &self.model,
            &self.ps,
            self.recipe.clone(),
            ActivationScales::Dynamic,
            &[],
        )?;
        sampler.set_device(self.dev.clone())?;
        let mut ctx = prompt.to_vec();
        let mut out = Vec::with_capacity(cfg.tokens);
        let mut window = 0u64;
        while out.len() < cfg.tokens {
            let keep = if window == 0 {
                seq.saturating_sub(1)
            } else {
                seq / 2
            };
            let keep = keep.max(1).min(ctx.len());
            let tail = ctx[ctx.len() - keep..].to_vec();
            let n = (cfg.tokens - out.len()).min(seq.saturating_sub(keep).max(1));
            let gen = GenConfig {
                max_tokens: n,
                temperature: cfg.temperature,
                top_k: cfg.top_k,
                top_p: cfg.top_p,
                stop: cfg.stop.clone(),
            };
            let rolls = sampler.generate(&[tail], &gen, cfg.seed.wrapping_add(window))?;
            let new = &rolls[0].tokens;
            ctx.extend_from_slice(new);
            out.extend_from_slice(new);
            if rolls[0].stopped {
                break;
            }
            window += 1;
        }
        Ok(out)
    }
}

/// Samples one id from `logits` with temperature and top-k (greedy at temperature 0).
pub fn pick(logits: &[f32], temperature: f32, top_k: usize, rng: &mut Xoshiro256StarStar) -> u32 {
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    // NaN-safe descending order, ties by index (deterministic)
    idx.sort_by(|&a, &b| {
        logits[b]
            .partial_cmp(&logits[a])
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.cmp(&b))
    });
    if temperature == 0.0 || idx.len() == 1 {
        return idx[0] as u32;
    }
    let k = if top_k == 0 {
        idx.len()
    } else {
        top_k.min(idx.len())
    };
    let top = &idx[..k];
    let m = logits[top[0]];
    let w: Vec<f64> = top
        .iter()
        .map(|&i| (((logits[i] - m) / temperature) as f64).exp())
        .map(|x| if x.is_finite() { x } else { 0.0 })
        .collect();
    let total: f64 = w.iter().sum();
    if total.is_nan() || total <= 0.0 {
        return top[0] as u32;
    }
    let mut u = rng.next_f64() * total;
    for (&i, &wi) in top.iter().zip(&w) {
        if u < wi {
            return i as u32;
        }
        u -= wi;
    }
    top[k - 1] as u32
}

//! The RL loop. One step:
//!
//! 1. the next `prompts` training prompts of the task (the prompt cursor advances);
//! 2. weight sync: the sampler copies the policy, quantizes every weight once and (static
//!    scales) calibrates its activation amaxes on `calibration` training examples;
//! 3. `group` completions per prompt from the sampler (seed drawn from the run's stream),
//!    with their sampler log-probabilities; rewards; group-normalized advantages;
//! 4. the RL trainer recomputes every completion token's log-probability under the plan's
//!    `rl-trainer` recipe (rows `prompt + completion`, padded at the end; causal, so padding
//!    changes nothing before it); mismatch metrics against the sampler's; correction weights;
//! 5. `minibatches` AdamW updates of the clipped loss ([`super::grpo`]), the first on the
//!    first minibatch with `logp_old` from its own forward, the others with `logp_old` from a
//!    forward before any update.
//!
//! Every `eval_every` steps and at the end: held-out pass rate (greedy, BF16 copy of the
//! policy, the same for every plan) and a checkpoint. A non-finite reward, log-probability,
//! loss or gradient, or the divergence guard ([`super::guard`]: a mismatch spike, a collapse
//! of the rollout or held-out pass rate) stops the run with `diagnosis.txt`, keeping the last
//! good checkpoint.
//!
//! With a device for the update ([`RlRun::set_update_device`], `rl --device cuda`), step 4's
//! forward and backward passes and step 5's gradient norm and AdamW run there (`device.rs`).
//!
//! Prompts are encoded, and completions decoded for the reward, with the tokenizer of the
//! starting checkpoint ([`super::codec`]: byte-level, or the BPE its run kept as
//! `tokenizer.json`, copied into the RL run directory).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use autograd::{Graph, ParamStore};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use optim::{AdamW, AdamWConfig, ParamGroup, ParamSpec};

use super::checkpoint::{self as rlck, RlState, RL_STATE_VERSION};
use super::codec::TaskCodec;
use super::config::{io_err, RlConfig, RlError};
use super::correction::{mismatch, weights};
use super::grpo::{advantages, logp_grad, token_terms};
use super::guard::RlGuard;
use super::metrics::{self, EvalRecord, RlSummary, StepRecord};
use super::plan::{ActivationScales, Plan};
use super::sampler::{token_logprob, GenConfig, PolicySampler, Rollout};
use super::tasks::{Example, Split};
use crate::model::{Gpt, ModelConfig, Precision};
use crate::recipe::Recipe;
use crate::rng::Xoshiro256StarStar;

mod device;

/// The seed of the held-out set (the same for every run, so runs are compared on the same
/// prompts).
pub const EVAL_SEED: u64 = 0x5eed;

/// Files of an RL run directory.
pub const RL_RUN_FILES: &[&str] = &[
    "rl.toml",
    "plan.toml",
    "metrics.jsonl",
    "eval.jsonl",
    "summary.json",
    super::compare::DIAGNOSIS_FILE,
    "checkpoints",
    crate::data::TOKENIZER_FILE,
];

/// Options that are not part of the run's identity.
#[derive(Clone, Debug, Default)]
pub struct RlOptions {
    /// Hide the progress bar.
    pub quiet: bool,
    /// Stop after this many steps in this process (resume tests).
    pub stop_after: Option<u64>,
    /// Make the rewards of this step NaN (a test of the guard).
    pub nan_reward_at: Option<u64>,
    /// Lower the sampler's log-probabilities of this step by 3 nats, as a broken sampler
    /// would (a test of the guard's mismatch check).
    pub sampler_fault_at: Option<u64>,
}

/// An RL run in progress.
pub struct RlRun {
    cfg: RlConfig,
    plan: Plan,
    out: PathBuf,
    model: Gpt,
    ps: ParamStore,
    reference: Option<ParamStore>,
    opt: AdamW,
    sampler: PolicySampler,
    evaluator: PolicySampler,
    trainer_recipe: Recipe,
    step: u64,
    cursor: u64,
    rng: Xoshiro256StarStar,
    start: String,
    initial_pass_rate: f64,
    eval_set: Vec<Example>,
    calibration: Vec<Vec<u32>>,
    last_checkpoint: Option<PathBuf>,
    opts: RlOptions,
    codec: TaskCodec,
    guard: RlGuard,
    /// The device of the update, with the AdamW moments there once its first update ran
    /// (`None`: the CPU).
    device: Option<crate::train::device_step::DeviceUpdate>,
    _lock: Option<crate::rundir::RunLock>,
}

fn param_layout(ps: &ParamStore, model: &Gpt) -> Vec<ParamSpec> {
    ps.ids()
        .map(|id| {
            let len = ps.value(id).map(|v| v.len()).unwrap_or(0);
            ParamSpec::new(len, if model.decays(id) { 0 } else { 1 })
        })
        .collect()
}

/// Checks that the codec expresses the task on the held-out set and the first training and
/// calibration examples; returns the longest prompt in tokens.
fn check_task(
    cfg: &RlConfig,
    codec: &TaskCodec,
    eval: &[Example],
    calibration: &[Example],
) -> Result<usize, RlError> {
    let train = cfg.task.examples(cfg.seed, Split::Train, 256);
    let all: Vec<Example> = train.into_iter().chain(eval.iter().cloned()).collect();
    codec.check(cfg.task, &all)?;
    codec.check(cfg.task, calibration)?;
    let mut longest = 0;
    for e in &all {
        longest = longest.max(codec.prompt(e)?.len());
    }
    Ok(longest)
}

/// The tokenizer of the pretraining checkpoint `dir` (its run's `tokenizer.json`, or the one
/// its data implies) as a codec for a model of `vocab` tokens.
fn codec_of(from: &Path, dir: &Path, vocab: usize) -> Result<TaskCodec, RlError> {
    let tok = crate::hf::tokenizer_of(from).map_err(|e| RlError::Invalid(e.to_string()))?;
    match tok {
        None => Err(RlError::Invalid(format!(
            "{}: no tokenizer was found with this checkpoint (it was trained on a bare token \
             shard, vocabulary {vocab}), so the task's prompts cannot be encoded; train on a \
             `trainer tokenize` folder (its run keeps tokenizer.json) or on text",
            dir.display()
        ))),
        Some(t) if t.is_bytes() => {
            if vocab < crate::data::BYTE_VOCAB as usize {
                return Err(RlError::Invalid(format!(
                    "{}: the task's prompts are bytes, but this checkpoint's vocabulary ({vocab} \
                     tokens) is not byte-level",
                    dir.display()
                )));
            }
            Ok(TaskCodec::bytes())
        }
        Some(t) => TaskCodec::new(t, vocab)
            .map_err(|e| RlError::Invalid(format!("{}: {e}", dir.display()))),
    }
}

impl RlRun {
    /// Starts a run in `out` (which must not hold a run) from the policy in `from`: a
    /// pretraining or RL checkpoint, or a run directory of either kind
    /// ([`crate::any_checkpoint::AnyCheckpoint`]).
    pub fn new(
        cfg: RlConfig,
        plan: Plan,
        from: &Path,
        out: &Path,
        opts: RlOptions,
    ) -> Result<RlRun, RlError> {
        cfg.validate()?;
        plan.validate()?;
        let ck = crate::any_checkpoint::AnyCheckpoint::load(from)?;
        let codec = codec_of(from, ck.dir(), ck.model().vocab)?;
        let mut ps = ParamStore::new();
        let model = Gpt::new(&mut ps, ck.model().clone(), 0)?;
        ck.apply(&mut ps)?;
        let reference = (cfg.kl_coef > 0.0).then(|| {
            let mut r = ParamStore::new();
            let _ = Gpt::new(&mut r, model.cfg.clone(), 0);
            r.import(&ps.export()).map(|_| r)
        });
        let reference = reference.transpose()?;
        let opt = Self::optimizer(&ps, &model)?;
        let rng = Xoshiro256StarStar::seed_from_u64(cfg.seed ^ 0x726c);
        let mut run = Self::build(
            cfg,
            plan,
            out,
            model,
            ps,
            reference,
            opt,
            rng,
            ck.dir().display().to_string(),
            opts,
            codec,
        )?;
        run._lock = Some(crate::rundir::RunLock::acquire(out)?);
        let present: Vec<&str> = RL_RUN_FILES
            .iter()
            .copied()
            .filter(|f| out.join(f).exists())
            .collect();
        if !present.is_empty() {
            return Err(RlError::Invalid(format!(
                "{} already holds an RL run ({}); continue it with trainer rl --resume {}, or choose another --out",
                out.display(),
                present.join(", "),
                out.display()
            )));
        }
        fs::create_dir_all(out).map_err(io_err(out))?;
        let w = |name: &str, text: String| {
            let p = out.join(name);
            crate::rundir::write_atomic(&p, text.as_bytes()).map_err(io_err(&p))
        };
        w(
            "rl.toml",
            toml::to_string(&run.cfg).expect("config serializes"),
        )?;
        w("plan.toml", run.plan.to_toml())?;
        if !run.codec.tokenizer().is_bytes() {
            w(crate::data::TOKENIZER_FILE, run.codec.tokenizer().to_json())?;
        }
        let (greedy, sampled) = run.evaluate()?;
        run.initial_pass_rate = greedy;
        run.guard.record_eval(greedy);
        metrics::append(
            &out.join("eval.jsonl"),
            &EvalRecord {
                step: 0,
                pass_rate: greedy,
                sampled_pass_rate: sampled,
                prompts: run.eval_set.len(),
            },
        )?;
        Ok(run)
    }

    /// Continues the run in `dir` from its latest checkpoint.
    pub fn resume(dir: &Path, opts: RlOptions) -> Result<RlRun, RlError> {
        let ckdir = rlck::resolve(dir)
            .ok_or_else(|| RlError::Invalid(format!("{} holds no RL checkpoint", dir.display())))?;
        let ck = rlck::load(&ckdir)?;
        let s = ck.state;
        let mut ps = ParamStore::new();
        let model = Gpt::new(&mut ps, s.model.clone(), 0)?;
        ps.import(&ck.tensors)?;
        let reference = match ck.reference {
            Some(t) => {
                let mut r = ParamStore::new();
                Gpt::new(&mut r, s.model.clone(), 0)?;
                r.import(&t)?;
                Some(r)
            }
            None => None,
        };
        let mut opt = Self::optimizer(&ps, &model)?;
        opt.load_state(&ck.optimizer)?;
        let tpath = dir.join(crate::data::TOKENIZER_FILE);
        let codec = if tpath.is_file() {
            let t = crate::data::Tokenizer::from_file(&tpath)
                .map_err(|e| RlError::Invalid(e.to_string()))?;
            TaskCodec::new(t, s.model.vocab)?
        } else {
            TaskCodec::bytes()
        };
        let mut run = Self::build(
            s.config, s.plan, dir, model, ps, reference, opt, s.rng, s.start, opts, codec,
        )?;
        run._lock = Some(crate::rundir::RunLock::acquire(dir)?);
        run.step = s.step;
        run.cursor = s.cursor;
        run.initial_pass_rate = s.initial_pass_rate;
        run.last_checkpoint = Some(ckdir);
        metrics::trim(&dir.join("metrics.jsonl"), s.step)?;
        metrics::trim(&dir.join("eval.jsonl"), s.step)?;
        run.guard = RlGuard::replay(
            &run.cfg,
            &metrics::read(&dir.join("metrics.jsonl"))?,
            &metrics::read(&dir.join("eval.jsonl"))?,
        );
        Ok(run)
    }

    fn optimizer(ps: &ParamStore, model: &Gpt) -> Result<AdamW, RlError> {
        Ok(AdamW::with_groups(
            AdamWConfig {
                beta1: 0.9,
                beta2: 0.95,
                eps: 1e-8,
                weight_decay: 0.0,
            },
            &[ParamGroup::new(0.0, 1.0), ParamGroup::no_decay()],
            &param_layout(ps, model),
        )?)
    }

    #[allow(clippy::too_many_arguments)]
    fn build(
        cfg: RlConfig,
        plan: Plan,
        out: &Path,
        model: Gpt,
        ps: ParamStore,
        reference: Option<ParamStore>,
        opt: AdamW,
        rng: Xoshiro256StarStar,
        start: String,
        opts: RlOptions,
        codec: TaskCodec,
    ) -> Result<RlRun, RlError> {
        let eval_set = cfg
            .task
            .examples(EVAL_SEED, Split::HeldOut, cfg.eval_prompts);
        let cal_examples = cfg
            .task
            .examples(cfg.seed ^ 0xca1, Split::Train, cfg.calibration);
        let longest = check_task(&cfg, &codec, &eval_set, &cal_examples)?;
        if longest + cfg.gen_tokens() > model.cfg.seq {
            return Err(RlError::Invalid(format!(
                "prompts of up to {longest} tokens plus {} new tokens do not fit the model's context of {} tokens",
                cfg.gen_tokens(),
                model.cfg.seq
            )));
        }
        crate::memory::check(
            "the RL batch's logits and gradients",
            (cfg.prompts as u128 * cfg.group as u128)
                * model.cfg.seq as u128
                * model.cfg.vocab as u128
                * 12,
        )?;
        let calibration: Vec<Vec<u32>> = cal_examples
            .iter()
            .map(|e| codec.sequence(e))
            .collect::<Result<_, _>>()?;
        let trainer_recipe = plan.recipe("rl-trainer")?;
        let sampler = PolicySampler::new(
            &model,
            &ps,
            plan.recipe("sampler")?,
            plan.sampler.activation_scales,
            &calibration,
        )?;
        let evaluator = PolicySampler::new(
            &model,
            &ps,
            Recipe::builtin("bf16").expect("built-in"),
            ActivationScales::Dynamic,
            &[],
        )?;
        let guard = RlGuard::new(&cfg);
        Ok(RlRun {
            cfg,
            plan,
            out: out.into(),
            model,
            ps,
            reference,
            opt,
            sampler,
            evaluator,
            trainer_recipe,
            step: 0,
            cursor: 0,
            rng,
            start,
            initial_pass_rate: f64::NAN,
            eval_set,
            calibration,
            last_checkpoint: None,
            opts,
            guard,
            codec,
            device: None,
            _lock: None,
        })
    }

    /// Steps taken.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The policy's parameters (on the update's device between steps of a device run; a
    /// checkpoint brings them back to the host).
    pub fn params(&self) -> &ParamStore {
        &self.ps
    }

    /// The run's plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The run directory.
    pub fn out_dir(&self) -> &Path {
        &self.out
    }

    /// Runs the sampler and the held-out evaluator on a CUDA device (`None`: the CPU)
    /// ([`PolicySampler::set_device`]); the update's device is [`RlRun::set_update_device`].
    pub fn set_sampler_device(
        &mut self,
        dev: Option<std::sync::Arc<autograd::backend::DeviceBackend>>,
    ) -> Result<(), crate::model::ModelError> {
        self.sampler.set_device(dev.clone())?;
        self.evaluator.set_device(dev)
    }

    /// Held-out pass rates of the current policy (BF16 copy): greedy, and one sample per
    /// prompt at temperature 1 (seed 0). Like [`RlRun::train_step`], it runs with the pool's
    /// other threads polling for work.
    pub fn evaluate(&mut self) -> Result<(f64, f64), RlError> {
        autograd::with_polling_workers(|| self.compute_evaluation())
    }

    /// [`RlRun::evaluate`]'s work.
    fn compute_evaluation(&mut self) -> Result<(f64, f64), RlError> {
        self.ps.to_host()?;
        self.evaluator.sync(&self.ps, &[])?;
        let prompts: Vec<Vec<u32>> = self
            .eval_set
            .iter()
            .map(|e| self.codec.prompt(e))
            .collect::<Result<_, _>>()?;
        let mut rates = [0.0; 2];
        for (rate, temperature) in rates.iter_mut().zip([0.0, 1.0]) {
            let gen = GenConfig {
                max_tokens: self.cfg.gen_tokens(),
                temperature,
                top_k: 0,
                top_p: 1.0,
                stop: vec![self.codec.stop()],
            };
            let rolls = self.evaluator.generate(&prompts, &gen, 0)?;
            let pass = self
                .eval_set
                .iter()
                .zip(&rolls)
                .filter(|(e, r)| self.codec.reward(self.cfg.task, e, &r.tokens) == 1.0)
                .count();
            *rate = pass as f64 / prompts.len() as f64;
        }
        Ok((rates[0], rates[1]))
    }

    /// Log-probabilities of every rollout's tokens under the RL trainer's recipe, and with
    /// `terms` the update's gradient in the store: `terms(rollout, token, logp_new)` gives
    /// `∂ℓ/∂logp_new` (already divided by the token count).
    fn policy_pass(
        &mut self,
        rolls: &[&Rollout],
        mut terms: Option<&mut dyn FnMut(usize, usize, f32) -> f64>,
        graph_step: u64,
    ) -> Result<Vec<Vec<f32>>, RlError> {
        let r = rolls.len();
        let longest = rolls
            .iter()
            .map(|ro| ro.prompt.len() + ro.tokens.len() - 1)
            .max()
            .unwrap_or(1);
        let mut t = longest;
        while !(r * t).is_multiple_of(16) {
            t += 1;
        }
        let mut tokens = vec![self.codec.stop(); r * t];
        for (j, ro) in rolls.iter().enumerate() {
            let row = &mut tokens[j * t..(j + 1) * t];
            row[..ro.prompt.len()].copy_from_slice(&ro.prompt);
            let c = ro.tokens.len();
            row[ro.prompt.len()..ro.prompt.len() + c - 1].copy_from_slice(&ro.tokens[..c - 1]);
        }
        let vocab = self.model.cfg.vocab;
        let prec = Precision {
            recipe: &self.trainer_recipe,
            progress: 0.0,
        };
        if let Some(d) = &self.device {
            self.ps.to_device(&d.dev)?;
        }
        let mut g = Graph::new(&mut self.ps).with_rng(self.cfg.seed, graph_step);
        g.set_grad_enabled(terms.is_some());
        let logits = self.model.forward_logits(&mut g, &tokens, r, &prec, None)?;
        // the logits come back from a device (log-probabilities and the seed gradient are
        // computed here, as on the CPU)
        let lv: std::borrow::Cow<[f32]> = if self.device.is_some() {
            g.to_vec(logits)?.into()
        } else {
            g.value(logits)?.into()
        };
        let mut out = Vec::with_capacity(r);
        let mut grad = terms.as_ref().map(|_| vec![0.0f32; lv.len()]);
        for (j, ro) in rolls.iter().enumerate() {
            let mut lps = Vec::with_capacity(ro.tokens.len());
            for (k, &tok) in ro.tokens.iter().enumerate() {
                let pos = j * t + ro.prompt.len() - 1 + k;
                let row = &lv[pos * vocab..(pos + 1) * vocab];
                let lp = token_logprob(row, tok as usize);
                if let (Some(f), Some(gr)) = (terms.as_deref_mut(), grad.as_mut()) {
                    let d = f(j, k, lp);
                    logp_grad(
                        row,
                        tok as usize,
                        d,
                        &mut gr[pos * vocab..(pos + 1) * vocab],
                    );
                }
                lps.push(lp);
            }
            out.push(lps);
        }
        if let Some(gr) = grad {
            g.backward_with(logits, &gr)?;
        }
        Ok(out)
    }

    fn diverged(&self, step: u64, reason: String) -> RlError {
        let last = self
            .last_checkpoint
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "none".into());
        let path = self.out.join(super::compare::DIAGNOSIS_FILE);
        let text = format!(
            "RL run stopped at step {step}: {reason}\nlast good checkpoint: {last}\nplan: {}\ncorrection: {}\nresume with: trainer rl --resume {}\n",
            self.plan.name,
            self.cfg.correction.name(),
            self.out.display()
        );
        let _ = crate::rundir::write_atomic(&path, text.as_bytes());
        RlError::Diverged {
            step,
            reason,
            last_checkpoint: last,
            diagnosis: path.display().to_string(),
        }
    }

    /// One step (see the module docs). The other threads of the rayon pool it runs on poll
    /// for its parallel work meanwhile ([`autograd::with_polling_workers`]).
    pub fn train_step(&mut self) -> Result<StepRecord, RlError> {
        autograd::with_polling_workers(|| self.compute_step())
    }

    /// [`RlRun::train_step`]'s work.
    fn compute_step(&mut self) -> Result<StepRecord, RlError> {
        let t0 = Instant::now();
        let step_no = self.step + 1;
        let cfg = self.cfg.clone();
        let (p, gsize) = (cfg.prompts, cfg.group);
        let all = cfg
            .task
            .examples(cfg.seed, Split::Train, self.cursor as usize + p);
        let examples = &all[self.cursor as usize..];
        // the sampler's weight sync quantizes and calibrates on the host (`device.rs`)
        self.ps.to_host()?;
        self.sampler.sync(&self.ps, &self.calibration)?;
        let mut prompts: Vec<Vec<u32>> = Vec::with_capacity(p * gsize);
        for e in examples {
            let ids = self.codec.prompt(e)?;
            prompts.extend(std::iter::repeat_n(ids, gsize));
        }
        let gen = GenConfig {
            max_tokens: cfg.gen_tokens(),
            temperature: cfg.temperature,
            top_k: cfg.top_k,
            top_p: cfg.top_p,
            stop: vec![self.codec.stop()],
        };
        let seed = self.rng.next_u64();
        let ts = Instant::now();
        let mut rolls = self.sampler.generate(&prompts, &gen, seed)?;
        if self.opts.sampler_fault_at == Some(step_no) {
            for l in rolls.iter_mut().flat_map(|r| r.logprobs.iter_mut()) {
                *l -= 3.0;
            }
        }
        let sample_s = ts.elapsed().as_secs_f64();
        let sampled_tokens: usize = rolls.iter().map(|r| r.prompt.len() + r.tokens.len()).sum();
        let mut rewards: Vec<f32> = rolls
            .iter()
            .enumerate()
            .map(|(i, r)| self.codec.reward(cfg.task, &examples[i / gsize], &r.tokens))
            .collect();
        if self.opts.nan_reward_at == Some(step_no) {
            rewards[0] = f32::NAN;
        }
        if let Some(i) = rewards.iter().position(|r| !r.is_finite()) {
            return Err(self.diverged(step_no, format!("reward of rollout {i} is {}", rewards[i])));
        }
        if let Some(i) = rolls
            .iter()
            .position(|r| r.logprobs.iter().any(|l| !l.is_finite()))
        {
            return Err(self.diverged(
                step_no,
                format!("a sampler log-probability of rollout {i} is not finite"),
            ));
        }
        let adv = advantages(&rewards, gsize, cfg.scale_std);
        let tt = Instant::now();
        let n_roll = rolls.len();
        let mb = cfg.minibatches;
        let chunks: Vec<std::ops::Range<usize>> = (0..mb)
            .map(|k| k * n_roll / mb..(k + 1) * n_roll / mb)
            .filter(|r| !r.is_empty())
            .collect();
        // logp_old of every minibatch but the first (policy before any update)
        let mut old: Vec<Option<Vec<f32>>> = vec![None; n_roll];
        if chunks.len() > 1 {
            let rest: Vec<&Rollout> = rolls[chunks[1].start..].iter().collect();
            let lps = self.policy_pass(&rest, None, step_no)?;
            for (i, lp) in lps.into_iter().enumerate() {
                old[chunks[1].start + i] = Some(lp);
            }
        }
        let reference: Vec<Option<Vec<f32>>> = match self.reference.as_mut() {
            Some(rps) => {
                let all: Vec<&Rollout> = rolls.iter().collect();
                std::mem::swap(&mut self.ps, rps);
                let lps = self.policy_pass(&all, None, step_no);
                std::mem::swap(&mut self.ps, self.reference.as_mut().expect("some"));
                lps?.into_iter().map(Some).collect()
            }
            None => vec![None; n_roll],
        };
        let (mut loss, mut clipped, mut ntok_all, mut grad_norm) = (0.0f64, 0usize, 0usize, 0.0f64);
        let mut corrected = 0usize;
        let lr = cfg.lr * ((self.step + 1) as f32 / cfg.warmup_steps.max(1) as f32).min(1.0);
        let mut trainer_lp: Vec<Vec<f32>> = vec![vec![]; n_roll];
        for (ci, range) in chunks.iter().enumerate() {
            let sub: Vec<&Rollout> = rolls[range.clone()].iter().collect();
            let ntok: usize = sub.iter().map(|r| r.tokens.len()).sum();
            ntok_all += ntok;
            // correction weights from logp_old (known now for chunks > 0; for chunk 0 it is
            // logp_new of this pass, computed inside the closure)
            let c_kind = cfg.correction;
            let cc = cfg.correction_c;
            let mut first_lp: Vec<Vec<f32>> = sub
                .iter()
                .map(|r| Vec::with_capacity(r.tokens.len()))
                .collect();
            let mut seq_w: Vec<Vec<f64>> = vec![vec![]; sub.len()];
            let precomputed = ci > 0;
            if precomputed {
                let pairs: Vec<(&[f32], &[f32])> = sub
                    .iter()
                    .enumerate()
                    .map(|(j, r)| {
                        (
                            old[range.start + j].as_deref().unwrap_or(&[]),
                            &r.logprobs[..],
                        )
                    })
                    .collect();
                let (w, n) = weights(c_kind, cc, &pairs);
                corrected += n;
                seq_w = w;
            }
            let mut chunk_loss = 0.0f64;
            let mut chunk_clipped = 0usize;
            let start = range.start;
            let adv_ref = &adv;
            let old_ref = &old;
            let ref_ref = &reference;
            let nf = ntok as f64;
            // Sequence-level corrections on chunk 0 need every token's logp_old before the
            // first token's gradient: compute them with a no-grad pass first.
            let needs_seq = !precomputed
                && matches!(
                    c_kind,
                    super::correction::Correction::SeqTis | super::correction::Correction::SeqMis
                );
            if needs_seq {
                let lps = self.policy_pass(&sub, None, step_no)?;
                let pairs: Vec<(&[f32], &[f32])> = lps
                    .iter()
                    .zip(&sub)
                    .map(|(l, r)| (&l[..], &r.logprobs[..]))
                    .collect();
                let (w, n) = weights(c_kind, cc, &pairs);
                corrected += n;
                seq_w = w;
            }
            let mut tok_corrected = 0usize;
            let mut f = |j: usize, k: usize, lp: f32| -> f64 {
                let i = start + j;
                let lp_old = old_ref[i].as_ref().map(|o| o[k]).unwrap_or(lp);
                first_lp[j].push(lp);
                let w = if precomputed || needs_seq {
                    seq_w[j][k]
                } else {
                    let (w, n) =
                        weights(c_kind, cc, &[(&[lp_old][..], &sub[j].logprobs[k..k + 1])]);
                    tok_corrected += n;
                    w[0][0]
                };
                let lref = ref_ref[i].as_ref().map(|r| r[k]);
                let t = token_terms(lp, lp_old, adv_ref[i], w, cfg.clip_eps, lref, cfg.kl_coef);
                chunk_loss += t.loss / nf;
                chunk_clipped += t.clipped as usize;
                t.dlogp / nf
            };
            self.policy_pass(&sub, Some(&mut f), step_no * 1024 + ci as u64)?;
            corrected += tok_corrected;
            for (j, lp) in first_lp.into_iter().enumerate() {
                if ci == 0 {
                    trainer_lp[start + j] = lp;
                } else {
                    trainer_lp[start + j] = old[start + j].clone().unwrap_or_default();
                }
            }
            loss += chunk_loss;
            clipped += chunk_clipped;
            let gn = self.grad_norm()?;
            grad_norm = gn as f64;
            if !chunk_loss.is_finite() || !gn.is_finite() {
                self.ps.zero_grad();
                return Err(self.diverged(
                    step_no,
                    format!(
                        "non-finite loss ({chunk_loss}) or gradient norm ({gn}) in update {}",
                        ci + 1
                    ),
                ));
            }
            let coef = optim::clip_coefficient(gn, cfg.grad_clip)?;
            self.adamw(lr, coef)?;
            self.ps.end_quant_step()?;
            self.ps.zero_grad();
        }
        let train_s = tt.elapsed().as_secs_f64();
        let lt: Vec<f32> = trainer_lp.iter().flatten().copied().collect();
        let ls: Vec<f32> = rolls
            .iter()
            .flat_map(|r| r.logprobs.iter().copied())
            .collect();
        if lt.iter().any(|l| !l.is_finite()) {
            return Err(self.diverged(step_no, "a trainer log-probability is not finite".into()));
        }
        let mm = mismatch(&lt, &ls);
        let n = n_roll as f64;
        let pass_rate = rewards.iter().filter(|&&r| r == 1.0).count() as f64 / n;
        if let Some(why) = self.guard.check_step(pass_rate, mm.k3) {
            return Err(self.diverged(step_no, why));
        }
        self.guard.record_step(pass_rate);
        let trained_tokens: usize = rolls.iter().map(|r| r.prompt.len() + r.tokens.len()).sum();
        let ntok_f = ntok_all.max(1) as f64;
        self.step = step_no;
        self.cursor += p as u64;
        Ok(StepRecord {
            step: step_no,
            reward: rewards.iter().map(|&r| r as f64).sum::<f64>() / n,
            pass_rate,
            response_len: rolls.iter().map(|r| r.tokens.len() as f64).sum::<f64>() / n,
            entropy: rolls
                .iter()
                .flat_map(|r| r.entropies.iter())
                .map(|&e| e as f64)
                .sum::<f64>()
                / ntok_f,
            loss,
            grad_norm,
            lr: lr as f64,
            clip_frac: clipped as f64 / ntok_f,
            mismatch: mm,
            corrected_frac: corrected as f64 / ntok_f,
            sampler_tokens_per_s: sampled_tokens as f64 / sample_s.max(1e-9),
            trainer_tokens_per_s: trained_tokens as f64 * chunks.len().max(1) as f64
                / train_s.max(1e-9),
            seconds: t0.elapsed().as_secs_f64(),
        })
    }

    /// Writes a checkpoint of the current state.
    pub fn save_checkpoint(&mut self) -> Result<PathBuf, RlError> {
        self.sync_host()?;
        let mut state = RlState {
            version: RL_STATE_VERSION,
            step: self.step,
            cursor: self.cursor,
            rng: self.rng,
            model: self.model.cfg.clone(),
            plan: self.plan.clone(),
            config: self.cfg.clone(),
            start: self.start.clone(),
            initial_pass_rate: self.initial_pass_rate,
            tensors_crc32: 0,
            optimizer_crc32: 0,
            reference_crc32: None,
        };
        let refs = self.reference.as_ref().map(|r| r.export());
        let dir = rlck::save(
            &self.out.join("checkpoints"),
            &mut state,
            &self.ps.export(),
            &self.opt.save_state(),
            refs.as_deref(),
            self.cfg.keep_checkpoints,
        )?;
        self.last_checkpoint = Some(dir.clone());
        Ok(dir)
    }

    /// Runs the remaining steps; returns the summary (also written to `summary.json`).
    pub fn run(&mut self) -> Result<RlSummary, RlError> {
        let total = self.cfg.steps;
        let bar = if self.opts.quiet {
            ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden())
        } else {
            ProgressBar::new(total)
        };
        bar.set_style(
            ProgressStyle::with_template(
                "{prefix} [{elapsed_precise}] {bar:30} {pos}/{len} {msg} ETA {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_prefix(format!("{}/{}", self.plan.name, self.cfg.correction.name()));
        bar.set_position(self.step);
        let start = Instant::now();
        let stop_at = self.opts.stop_after.map(|n| self.step + n);
        let mpath = self.out.join("metrics.jsonl");
        let epath = self.out.join("eval.jsonl");
        let mut last_eval = f64::NAN;
        while self.step < total {
            let rec = self.train_step()?;
            metrics::append(&mpath, &rec)?;
            let m = &rec.mismatch;
            bar.set_message(format!(
                "pass {:.2} len {:.1} H {:.2} |Δlogp| {:.2e} k3 {:.1e} bitdiff {:.2} held-out {:.2}",
                rec.pass_rate, rec.response_len, rec.entropy, m.mean_abs_dlogp, m.k3, m.frac_bitwise_different, last_eval
            ));
            bar.set_position(self.step);
            if self.step.is_multiple_of(self.cfg.eval_every) || self.step == total {
                let (greedy, sampled) = self.evaluate()?;
                if let Some(why) = self.guard.check_eval(greedy, self.eval_set.len()) {
                    bar.abandon();
                    return Err(self.diverged(self.step, why));
                }
                self.guard.record_eval(greedy);
                last_eval = greedy;
                metrics::append(
                    &epath,
                    &EvalRecord {
                        step: self.step,
                        pass_rate: greedy,
                        sampled_pass_rate: sampled,
                        prompts: self.eval_set.len(),
                    },
                )?;
                self.save_checkpoint()?;
            }
            if stop_at == Some(self.step) || crate::interrupt::stop_requested() {
                if self
                    .last_checkpoint
                    .as_ref()
                    .is_none_or(|p| !p.ends_with(crate::checkpoint::step_dir_name(self.step)))
                {
                    self.save_checkpoint()?;
                }
                bar.abandon();
                return Err(RlError::Invalid(format!(
                    "stopped at step {} of {total}; resume with: trainer rl --resume {}",
                    self.step,
                    self.out.display()
                )));
            }
        }
        bar.finish_and_clear();
        self.summary(start.elapsed().as_secs_f64())
    }

    fn summary(&self, seconds: f64) -> Result<RlSummary, RlError> {
        let steps: Vec<StepRecord> = metrics::read(&self.out.join("metrics.jsonl"))?;
        let evals: Vec<EvalRecord> = metrics::read(&self.out.join("eval.jsonl"))?;
        let n = steps.len().max(1) as f64;
        let mean = |f: &dyn Fn(&StepRecord) -> f64| steps.iter().map(f).sum::<f64>() / n;
        let s = RlSummary {
            plan: self.plan.name.clone(),
            correction: self.cfg.correction.name().into(),
            seed: self.cfg.seed,
            steps: self.step,
            initial_pass_rate: self.initial_pass_rate,
            final_pass_rate: evals.last().map(|e| e.pass_rate).unwrap_or(f64::NAN),
            initial_sampled_pass_rate: evals
                .first()
                .map(|e| e.sampled_pass_rate)
                .unwrap_or(f64::NAN),
            final_sampled_pass_rate: evals
                .last()
                .map(|e| e.sampled_pass_rate)
                .unwrap_or(f64::NAN),
            mean_abs_dlogp: mean(&|r| r.mismatch.mean_abs_dlogp),
            k3: mean(&|r| r.mismatch.k3),
            frac_bitwise_different: mean(&|r| r.mismatch.frac_bitwise_different),
            sampler_tokens_per_s: mean(&|r| r.sampler_tokens_per_s),
            trainer_tokens_per_s: mean(&|r| r.trainer_tokens_per_s),
            seconds,
        };
        let p = self.out.join("summary.json");
        crate::rundir::write_atomic(
            &p,
            serde_json::to_string_pretty(&s)
                .expect("serializes")
                .as_bytes(),
        )
        .map_err(io_err(&p))?;
        Ok(s)
    }

    /// The model configuration.
    pub fn model_config(&self) -> &ModelConfig {
        &self.model.cfg
    }
}

//! [`Trainer::run`]: the loop with its outputs (run files, metrics lines, checkpoints at
//! evaluations, summary), the progress bar, stop requests and the validation guard.

use std::fs;
use std::io::Write as _;
use std::path::Path;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::error::io_err;
use super::{Evaluation, LayerError, RunSummary, StepMetrics, StepOutcome, TrainError, Trainer};
use crate::checkpoint;
use crate::interrupt;
use crate::rundir::{self, RunLock};

/// What a run reports at its end, kept up to date while it trains: the latest training and
/// validation losses, and the layer statistics of the latest evaluation that saw a quantized
/// layer (with its step).
struct LastSeen {
    train_loss: f32,
    layers: Vec<LayerError>,
    val_loss: f32,
    layers_step: u64,
}

impl Trainer {
    /// Runs to the end (or to `stop_after` steps in this process), evaluating and
    /// checkpointing every `eval_every` steps and at the end.
    ///
    /// Holds the run directory's lock throughout ([`TrainError::RunDir`] when another
    /// process holds it); a new run refuses a directory that holds another run unless
    /// [`Trainer::set_overwrite`]; a stop request ends the run after the current step with a
    /// checkpoint ([`TrainError::Stopped`]). A run that already finished returns its
    /// `summary.json` unchanged.
    pub fn run(&mut self) -> Result<RunSummary, TrainError> {
        let out = self.opts.out.clone();
        let _lock = RunLock::acquire(&out)?;
        let same_dir = |a: &Path, b: &Path| match (fs::canonicalize(a), fs::canonicalize(b)) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        };
        let continues_here = self
            .resumed_from
            .as_deref()
            .is_some_and(|d| same_dir(d, &out));
        if !continues_here {
            rundir::prepare_fresh(&out, self.overwrite)?;
        }
        rundir::remove_leftovers(&out.join("checkpoints"))?;
        rundir::remove_atomic_leftovers(&out)?;
        let write = |name: &str, text: String| -> Result<(), TrainError> {
            let p = out.join(name);
            rundir::write_atomic(&p, text.as_bytes()).map_err(io_err(&p))
        };
        let total = self.cfg.train.steps;
        if self.step >= total {
            let p = out.join("summary.json");
            if let Some(s) = fs::read_to_string(&p)
                .ok()
                .and_then(|t| serde_json::from_str::<RunSummary>(&t).ok())
            {
                return Ok(s);
            }
        }
        write("run.toml", self.cfg.to_toml())?;
        write("recipe.toml", self.recipe.to_toml())?;
        // A BPE-tokenized run keeps its tokenizer, so sample and export find it.
        if let Some(t) = self.cfg.data.tokenizer()?.filter(|t| !t.is_bytes()) {
            write(crate::data::TOKENIZER_FILE, t.to_json())?;
        }
        // metrics: keep the lines up to the current step (resume), then append
        let mpath = out.join("metrics.jsonl");
        let mut kept = String::new();
        if self.step > 0 {
            if let Ok(old) = fs::read_to_string(&mpath) {
                for line in old.lines() {
                    if let Ok(m) = serde_json::from_str::<StepMetrics>(line) {
                        if m.step <= self.step {
                            kept.push_str(line);
                            kept.push('\n');
                        }
                    }
                }
            }
        }
        rundir::write_atomic(&mpath, kept.as_bytes()).map_err(io_err(&mpath))?;
        let mut metrics = fs::OpenOptions::new()
            .append(true)
            .open(&mpath)
            .map_err(io_err(&mpath))?;

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
        bar.set_prefix(self.recipe.name.clone());
        bar.set_position(self.step);
        let start = Instant::now();
        let start_tokens = self.tokens_seen;
        let mut last = LastSeen {
            train_loss: f32::NAN,
            layers: Vec::new(),
            val_loss: f32::NAN,
            layers_step: 0,
        };
        let stop_at = self
            .opts
            .stop_after
            .map_or(total, |s| (self.step + s).min(total));
        let diverged = |e: TrainError, bar: &ProgressBar| {
            bar.abandon();
            let _ = write("diagnosis.txt", format!("{e}\n"));
            e
        };
        while self.step < stop_at {
            let t0 = Instant::now();
            let StepOutcome {
                loss,
                grad_norm,
                lr,
            } = match self.train_step() {
                Ok(v) => v,
                Err(e @ TrainError::Diverged { .. }) => return Err(diverged(e, &bar)),
                Err(e) => return Err(e),
            };
            interrupt::hook("step");
            let dt = t0.elapsed().as_secs_f64();
            let tps = self.cfg.tokens_per_step() as f64 / dt.max(1e-9);
            let eval_now =
                self.step.is_multiple_of(self.cfg.train.eval_every) || self.step == total;
            let (val_loss, layers) = if eval_now {
                let e = self.evaluate()?;
                (Some(e.val_loss), e.layers)
            } else {
                (None, Vec::new())
            };
            let m = StepMetrics {
                step: self.step,
                tokens: self.tokens_seen,
                train_loss: loss,
                val_loss,
                lr,
                grad_norm,
                tokens_per_s: tps,
                progress: self.progress(),
                layers,
            };
            let mut line = serde_json::to_string(&m).unwrap_or_default();
            line.push('\n');
            // one write call per line: a concurrent reader never sees half a line
            metrics.write_all(line.as_bytes()).map_err(io_err(&mpath))?;
            if let Some(v) = val_loss {
                if let Err(e) = self.judge_validation(v, loss, grad_norm) {
                    return Err(diverged(e, &bar));
                }
                last.val_loss = v;
                // keep the last statistics that saw a quantized layer (a recipe's late
                // switch to BF16 would otherwise leave only BF16 layers to report)
                let any_quantized = m.layers.iter().any(LayerError::is_quantized);
                let kept_quantized = last.layers.iter().any(LayerError::is_quantized);
                if any_quantized || !kept_quantized {
                    last.layers = m.layers.clone();
                    last.layers_step = m.step;
                }
                self.save_checkpoint()?;
            }
            last.train_loss = loss;
            let el = start.elapsed().as_secs_f64();
            let avg = (self.tokens_seen - start_tokens) as f64 / el.max(1e-9);
            bar.set_message(format!(
                "loss {loss:.4} val {} {avg:.0} tok/s",
                if last.val_loss.is_nan() {
                    "-".to_string()
                } else {
                    format!("{:.4}", last.val_loss)
                }
            ));
            bar.set_position(self.step);
            if interrupt::stop_requested() && self.step < total {
                bar.abandon();
                let checkpoint = match &self.last_checkpoint {
                    Some(p) if p.ends_with(checkpoint::step_dir_name(self.step)) => p.clone(),
                    _ => self.save_checkpoint()?,
                };
                return Err(TrainError::Stopped {
                    step: self.step,
                    steps: total,
                    checkpoint,
                    dir: out.clone(),
                });
            }
        }
        bar.finish();
        let saved_here = self
            .last_checkpoint
            .as_ref()
            .is_some_and(|p| p.ends_with(checkpoint::step_dir_name(self.step)));
        if self.step < total && !saved_here {
            // stopped early between evaluations: checkpoint anyway
            self.save_checkpoint()?;
        }
        if last.val_loss.is_nan() {
            // nothing evaluated in this process (e.g. resuming a finished run)
            let Evaluation {
                val_loss: v,
                layers: l,
            } = self.evaluate()?;
            let prev_train = kept
                .lines()
                .last()
                .and_then(|l| serde_json::from_str::<StepMetrics>(l).ok())
                .map_or(f32::NAN, |m| m.train_loss);
            last = LastSeen {
                train_loss: prev_train,
                layers: l,
                val_loss: v,
                layers_step: self.step,
            };
        }
        let mut wall_s = start.elapsed().as_secs_f64();
        let mut tokens_per_s = (self.tokens_seen - start_tokens) as f64 / wall_s.max(1e-9);
        if self.tokens_seen == start_tokens {
            // nothing trained in this process (killed after its last checkpoint, before the
            // summary): the training time and throughput of the recorded steps
            let per_step = self.cfg.tokens_per_step() as f64;
            let (tokens, secs) = kept
                .lines()
                .filter_map(|l| serde_json::from_str::<StepMetrics>(l).ok())
                .filter(|m| m.tokens_per_s > 0.0 && m.tokens_per_s.is_finite())
                .fold((0.0, 0.0), |(t, s), m| {
                    (t + per_step, s + per_step / m.tokens_per_s)
                });
            if secs > 0.0 {
                wall_s = secs;
                tokens_per_s = tokens / secs;
            }
        }
        let summary = RunSummary {
            recipe: self.recipe.name.clone(),
            steps: self.step,
            tokens: self.tokens_seen,
            params: self.ps.num_elements(),
            final_val_loss: last.val_loss,
            final_train_loss: last.train_loss,
            unigram_nats: self.unigram_nats,
            wall_s,
            tokens_per_s,
            layers: last.layers,
            layers_step: last.layers_step,
            out_dir: out.clone(),
            checkpoint: self.last_checkpoint.clone().unwrap_or_default(),
        };
        if self.step == total {
            write(
                "summary.json",
                serde_json::to_string_pretty(&summary).unwrap_or_default(),
            )?;
        }
        Ok(summary)
    }

    /// The guard applied to the parameters about to be checkpointed: a validation loss that
    /// is not finite or above `explode_factor` times the reference is a divergence, and the
    /// checkpoint is not written.
    ///
    /// The reference is the smaller of the first step's loss and the best validation loss so
    /// far (before the first evaluation: the training guard's reference). Validation is not
    /// compared with the training loss once it has a history of its own, so that a model
    /// that overfits (validation well above training) is not taken for a diverged one.
    fn judge_validation(
        &mut self,
        val_loss: f32,
        loss: f32,
        grad_norm: f32,
    ) -> Result<(), TrainError> {
        let reference = match (self.best_val, self.initial_loss) {
            (Some(b), Some(i)) if i < b => Some((i, "the first step's loss")),
            (Some(b), _) => Some((b, "the best validation loss")),
            (None, _) => self.guard_reference(),
        };
        let reason = if !val_loss.is_finite() {
            Some("non-finite validation loss".to_string())
        } else {
            reference.and_then(|(m, what)| {
                (val_loss > self.cfg.train.explode_factor * m).then(|| {
                    format!(
                        "validation loss {val_loss} above {}x {what} {m}",
                        self.cfg.train.explode_factor
                    )
                })
            })
        };
        if reason.is_none() {
            self.best_val = Some(self.best_val.map_or(val_loss, |b| b.min(val_loss)));
        }
        match reason {
            None => Ok(()),
            Some(reason) => Err(TrainError::Diverged {
                step: self.step,
                reason: format!("{reason}; the parameters after this step were not saved"),
                loss,
                grad_norm,
                bad_layers: "none".into(),
                last_checkpoint: self
                    .last_checkpoint
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| "none".into()),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recipe::Recipe;
    use crate::train::{RunConfig, TrainOptions};

    fn tiny() -> Trainer {
        let cfg = RunConfig::from_toml_str(
            "[model]\nvocab = 256\nd_model = 32\nn_layers = 1\nn_heads = 2\nhidden = 64\nseq = 16\n\
             [train]\nsteps = 200\nbatch = 2\nwarmup_steps = 10\n\
             [data]\nkind = \"corpus\"\nseed = 0\nbytes = 5000\n",
        )
        .unwrap();
        Trainer::new(
            cfg,
            Recipe::builtin("bf16").unwrap(),
            TrainOptions::default(),
        )
        .unwrap()
    }

    #[test]
    fn validation_is_judged_against_its_own_history_and_the_first_loss() {
        let mut tr = tiny();
        // in warmup, before any evaluation: against the first step's loss
        tr.step = 5;
        tr.initial_loss = Some(5.5);
        tr.running_min = Some(5.0);
        assert!(tr.judge_validation(17.0, 5.0, 1.0).is_err());
        assert_eq!(tr.best_val, None, "a failed evaluation is not a reference");
        tr.judge_validation(10.0, 5.0, 1.0).unwrap();
        assert_eq!(tr.best_val, Some(10.0));
        // the first step's loss stays an upper reference
        let e = tr.judge_validation(17.0, 5.0, 1.0).unwrap_err().to_string();
        assert!(e.contains("3x the first step's loss 5.5"), "{e}");
        // after warmup an overfitting model (validation 3.5x the training minimum, but
        // close to its best validation loss) is not a divergence
        tr.step = 100;
        tr.best_val = Some(1.0);
        tr.running_min = Some(0.2);
        tr.judge_validation(2.5, 0.2, 1.0).unwrap();
        let e = tr.judge_validation(3.5, 0.2, 1.0).unwrap_err().to_string();
        assert!(e.contains("3x the best validation loss 1"), "{e}");
        assert!(tr.judge_validation(f32::NAN, 0.2, 1.0).is_err());
    }
}

//! Recipe comparisons (`trainer compare`) as a library: several recipes, each over the same
//! seeds, on one model, data and schedule, then a report ([`crate::report`]).
//!
//! Each run goes into `OUT/<recipe>` (`OUT/<recipe>/seed<k>` with several seeds). Runs are
//! taken seed-major, so an interrupted comparison holds whole seeds of every recipe. A run
//! that already finished in its folder with the same `run.toml` and `recipe.toml` is reused
//! and an interrupted one continues from its last checkpoint, so running the same comparison
//! again, or extending it with seeds or recipes, trains only what is missing. One comparison
//! writes a folder at a time (its lock is held throughout).
//!
//! ```no_run
//! use trainer::compare::Comparison;
//! use trainer::recipe::Recipe;
//! use trainer::train::RunConfig;
//!
//! let cmp = Comparison::new(
//!     RunConfig::preset("tiny")?,
//!     vec![Recipe::builtin("bf16")?, Recipe::builtin("nvfp4")?],
//!     "runs/cmp".into(),
//! );
//! let outcome = cmp.run(|event| println!("{event}"))?;
//! println!("{}", outcome.report.display());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use autograd::backend::{Backend, DeviceBackend};

use crate::recipe::Recipe;
use crate::report::{self, RunResult};
use crate::rundir::{self, RunLock};
use crate::train::{read_metrics, RunConfig, RunSummary, TrainError, TrainOptions, Trainer};

/// The most seeds a comparison accepts.
pub const MAX_SEEDS: u64 = 1000;

/// Why a comparison could not run or finish.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    /// The comparison's settings are invalid (the message names the `trainer compare` flag).
    #[error("{0}")]
    Invalid(String),
    /// Two recipes (at these positions of [`Comparison::recipes`]) have the same name.
    #[error("recipes {} and {} are both named '{name}' and would share one output folder; give each recipe a distinct `name`", .first + 1, .second + 1)]
    DuplicateRecipe {
        /// The first one's position.
        first: usize,
        /// The second one's position.
        second: usize,
        /// The shared name.
        name: String,
    },
    /// A stop was requested between runs.
    #[error("comparison stopped between runs; run the same `trainer compare` command again to continue it")]
    Stopped,
    /// Every run failed.
    #[error("no run finished")]
    NoRunFinished,
    /// A run could not be set up or finish in a way that ends the comparison (a stop
    /// during a run, a locked folder, an unreadable report folder).
    #[error(transparent)]
    Train(#[from] TrainError),
}

/// A comparison to run: what [`Comparison::run`] needs.
#[derive(Clone, Debug)]
pub struct Comparison {
    /// Model, training settings and data of every run; `train.seed` is the first seed.
    pub run: RunConfig,
    /// The recipes, each with a distinct name (it names the run's folder).
    pub recipes: Vec<Recipe>,
    /// Seeds per recipe: `seed, seed+1, ..., seed+seeds-1`.
    pub seeds: u64,
    /// The recipe the report's gaps are measured against (default: bf16, and no gaps when
    /// it is not compared).
    pub reference: Option<String>,
    /// The report folder.
    pub out: PathBuf,
    /// Hide the runs' progress bars.
    pub quiet: bool,
    /// Retrain runs in `out` made with another configuration or recipe instead of refusing
    /// them.
    pub overwrite: bool,
    /// The command that started the comparison, quoted in the report's header.
    pub command: String,
    /// Where every run trains: `None` on the CPU, else on this CUDA device through
    /// [`Trainer::set_device`] (the runs one after another, as always). A run resumed from
    /// its checkpoint continues on this device whichever device wrote the checkpoint.
    pub device: Option<Arc<DeviceBackend>>,
}

/// What happened to one run of a comparison, as it happens.
#[derive(Debug)]
pub enum CompareEvent<'a> {
    /// The comparison starts: its size.
    Start {
        /// Recipes compared.
        recipes: usize,
        /// Seeds per recipe.
        seeds: usize,
        /// Parameters of the model.
        params: usize,
        /// Steps of each run.
        steps: u64,
        /// Tokens of each run.
        tokens: u64,
        /// The report folder.
        out: &'a Path,
    },
    /// A run that had finished in its folder is reused.
    Reused {
        /// Its seed.
        seed: u64,
        /// Its folder.
        dir: &'a Path,
        /// Its summary.
        summary: &'a RunSummary,
    },
    /// An interrupted run continues from its last checkpoint.
    Continuing {
        /// Its recipe.
        recipe: &'a str,
        /// Its seed.
        seed: u64,
        /// Its folder.
        dir: &'a Path,
        /// The step it continues at.
        step: u64,
    },
    /// A run finished.
    Finished {
        /// Its seed.
        seed: u64,
        /// Its summary.
        summary: &'a RunSummary,
    },
    /// A run failed (e.g. diverged); the comparison goes on without it.
    Failed {
        /// Its folder (holding `diagnosis.txt` when it diverged).
        dir: &'a Path,
        /// Why.
        error: &'a TrainError,
    },
}

impl fmt::Display for CompareEvent<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CompareEvent::Start {
                recipes,
                seeds,
                params,
                steps,
                tokens,
                out,
            } => write!(
                f,
                "comparing {recipes} recipe(s) x {seeds} seed(s) on {params} parameters, {steps} steps ({tokens} tokens each) -> {}",
                out.display()
            ),
            CompareEvent::Reused { seed, dir, summary } => write!(
                f,
                "{} seed {seed}: reusing the finished run in {} (final validation loss {:.4})",
                summary.recipe,
                dir.display(),
                summary.final_val_loss
            ),
            CompareEvent::Continuing {
                recipe,
                seed,
                dir,
                step,
            } => write!(
                f,
                "{recipe} seed {seed}: continuing the interrupted run in {} at step {step}",
                dir.display()
            ),
            CompareEvent::Finished { seed, summary } => write!(
                f,
                "{} seed {seed}: final validation loss {:.4}, {:.0} tokens/s, {:.0} s",
                summary.recipe, summary.final_val_loss, summary.tokens_per_s, summary.wall_s
            ),
            CompareEvent::Failed { dir, error } => {
                write!(f, "run {} failed: {error}; continuing", dir.display())?;
                if matches!(error, TrainError::Diverged { .. }) {
                    write!(
                        f,
                        " (diagnosis in {})",
                        dir.join("diagnosis.txt").display()
                    )?;
                }
                Ok(())
            }
        }
    }
}

/// What a finished comparison produced.
#[derive(Debug)]
pub struct CompareOutcome {
    /// The runs that finished, seed-major.
    pub results: Vec<RunResult>,
    /// The folders of the runs that failed.
    pub failed: Vec<PathBuf>,
    /// `report.md`.
    pub report: PathBuf,
    /// The SVG plots.
    pub plots: Vec<PathBuf>,
}

impl Comparison {
    /// One seed, default reference, quiet off, no overwrite.
    pub fn new(run: RunConfig, recipes: Vec<Recipe>, out: PathBuf) -> Comparison {
        Comparison {
            run,
            recipes,
            seeds: 1,
            reference: None,
            out,
            quiet: false,
            overwrite: false,
            command: String::new(),
            device: None,
        }
    }

    /// Checks the settings (messages name the `trainer compare` flags): at least one recipe, distinct recipe names, 1..=[`MAX_SEEDS`]
    /// seeds that do not overflow, a reference among the recipes, a valid run config.
    pub fn validate(&self) -> Result<(), CompareError> {
        let bad = |m: String| Err(CompareError::Invalid(m));
        if self.recipes.is_empty() {
            return bad("--recipes needs at least one recipe".into());
        }
        for (i, r) in self.recipes.iter().enumerate() {
            if let Some(j) = self.recipes[..i].iter().position(|o| o.name == r.name) {
                return Err(CompareError::DuplicateRecipe {
                    first: j,
                    second: i,
                    name: r.name.clone(),
                });
            }
        }
        if self.seeds == 0 || self.seeds > MAX_SEEDS {
            return bad(format!(
                "--seeds must be at least 1 and at most {MAX_SEEDS}, got {}",
                self.seeds
            ));
        }
        if self.run.train.seed.checked_add(self.seeds - 1).is_none() {
            return bad(format!(
                "--seeds: seeds from {} overflow a 64-bit seed",
                self.run.train.seed
            ));
        }
        if let Some(r) = &self.reference {
            if !self.recipes.iter().any(|x| &x.name == r) {
                return bad(format!(
                    "--reference {r} is not among the recipes ({})",
                    self.recipe_names().join(", ")
                ));
            }
        }
        self.run.validate().map_err(TrainError::from)?;
        Ok(())
    }

    fn recipe_names(&self) -> Vec<&str> {
        self.recipes.iter().map(|r| r.name.as_str()).collect()
    }

    /// The seeds of every recipe.
    pub fn seed_list(&self) -> Vec<u64> {
        (0..self.seeds)
            .map(|k| self.run.train.seed.saturating_add(k))
            .collect()
    }

    /// The folder of one run.
    pub fn run_dir(&self, recipe: &Recipe, seed: u64) -> PathBuf {
        if self.seeds > 1 {
            self.out.join(&recipe.name).join(format!("seed{seed}"))
        } else {
            self.out.join(&recipe.name)
        }
    }

    /// Trains every run that is missing, then writes the report (`report.md`, `loss.svg`,
    /// `train-loss.svg`) into [`Comparison::out`]. `on_event` hears about each run as it
    /// starts and ends. A failed run (e.g. a divergence) is reported and skipped; a stop
    /// request, a locked folder or a run folder holding another run end the comparison.
    pub fn run(
        &self,
        mut on_event: impl FnMut(CompareEvent<'_>),
    ) -> Result<CompareOutcome, CompareError> {
        self.validate()?;
        // the data before the folder: a comparison whose data cannot be read (a mistyped
        // --data path) leaves nothing behind
        self.run.data.load().map_err(TrainError::from)?;
        let out = &self.out;
        let _lock = RunLock::acquire(out).map_err(TrainError::from)?;
        rundir::remove_atomic_leftovers(out).map_err(TrainError::from)?;
        let seeds = self.seed_list();
        on_event(CompareEvent::Start {
            recipes: self.recipes.len(),
            seeds: seeds.len(),
            params: self.run.model.num_params(),
            steps: self.run.train.steps,
            tokens: self.run.train.steps * self.run.tokens_per_step(),
            out,
        });
        let mut results = Vec::new();
        let mut failed = Vec::new();
        for (&seed, recipe) in seeds
            .iter()
            .flat_map(|s| self.recipes.iter().map(move |r| (s, r)))
        {
            if crate::interrupt::stop_requested() {
                return Err(CompareError::Stopped);
            }
            let dir = self.run_dir(recipe, seed);
            let mut run_cfg = self.run.clone();
            run_cfg.train.seed = seed;
            if let Some(summary) = finished_run(&dir, &run_cfg, recipe) {
                on_event(CompareEvent::Reused {
                    seed,
                    dir: &dir,
                    summary: &summary,
                });
                let metrics = read_metrics(&dir.join("metrics.jsonl"))?;
                results.push(RunResult {
                    seed,
                    summary,
                    metrics,
                });
                continue;
            }
            let opts = TrainOptions {
                out: dir.clone(),
                quiet: self.quiet,
                stop_after: None,
            };
            let mut tr = if same_run(&dir, &run_cfg, recipe) {
                let tr = Trainer::resume(&dir, opts)?;
                on_event(CompareEvent::Continuing {
                    recipe: &recipe.name,
                    seed,
                    dir: &dir,
                    step: tr.step(),
                });
                tr
            } else {
                let mut tr = Trainer::new(run_cfg, recipe.clone(), opts)?;
                tr.set_overwrite(self.overwrite);
                tr
            };
            tr.set_device(self.device.clone())?;
            let summary = match tr.run() {
                Ok(s) => s,
                Err(e @ (TrainError::Stopped { .. } | TrainError::RunDir(_))) => {
                    return Err(e.into())
                }
                Err(error) => {
                    on_event(CompareEvent::Failed {
                        dir: &dir,
                        error: &error,
                    });
                    failed.push(dir);
                    continue;
                }
            };
            on_event(CompareEvent::Finished {
                seed,
                summary: &summary,
            });
            let metrics = read_metrics(&dir.join("metrics.jsonl"))?;
            results.push(RunResult {
                seed,
                summary,
                metrics,
            });
        }
        if results.is_empty() {
            return Err(CompareError::NoRunFinished);
        }
        let reference = self
            .reference
            .as_deref()
            .unwrap_or(report::DEFAULT_REFERENCE);
        report::write_report(out, &results, &self.header(&seeds), reference)?;
        Ok(CompareOutcome {
            results,
            failed,
            report: out.join("report.md"),
            plots: vec![out.join("loss.svg"), out.join("train-loss.svg")],
        })
    }

    /// The report's header: model, batch, data, seeds, device and the command.
    fn header(&self, seeds: &[u64]) -> String {
        let (m, t) = (&self.run.model, &self.run.train);
        let seeds = match seeds {
            [only] => format!("seed {only}"),
            [first, .., last] => format!("seeds {first}..={last}"),
            [] => String::new(),
        };
        format!(
            "# Recipe comparison\n\nModel: {} blocks, d_model {}, {} heads, hidden {}, seq {}, batch {} x {} micro-batches; data: {:?}; {seeds}; device: {}.\n\nRun: `trainer compare{}`\n",
            m.n_layers,
            m.d_model,
            m.n_heads,
            m.hidden,
            m.seq,
            t.batch,
            t.grad_accum,
            self.run.data,
            self.device.as_deref().map_or("cpu", Backend::name),
            self.command
        )
    }
}

/// The summary of a run that already finished in `dir` with exactly this configuration and
/// recipe (its `run.toml` and `recipe.toml` match and it wrote `summary.json`).
fn finished_run(dir: &Path, cfg: &RunConfig, recipe: &Recipe) -> Option<RunSummary> {
    if !same_run(dir, cfg, recipe) {
        return None;
    }
    let text = std::fs::read_to_string(dir.join("summary.json")).ok()?;
    serde_json::from_str(&text).ok()
}

/// Whether `dir` holds a run (finished or not) of exactly this configuration and recipe.
fn same_run(dir: &Path, cfg: &RunConfig, recipe: &Recipe) -> bool {
    let same = |name: &str, want: String| {
        std::fs::read_to_string(dir.join(name)).is_ok_and(|have| have == want)
    };
    same("run.toml", cfg.to_toml()) && same("recipe.toml", recipe.to_toml())
}

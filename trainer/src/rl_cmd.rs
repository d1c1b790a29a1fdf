//! `trainer plans` and `trainer rl` (run, pretrain + run, resume, compare).

use std::path::{Path, PathBuf};
use std::process::Command as Process;

use crate::run_cmds::{on_pool, set_threads};
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use trainer::recipe::Recipe;
use trainer::rl::compare::{write_report, GridRun};
use trainer::rl::config::RlConfig;
use trainer::rl::correction::Correction;
use trainer::rl::mix::{pretrain_data, MixTokenizer};
use trainer::rl::plan::Plan;
use trainer::rl::run::{RlOptions, RlRun};
use trainer::rl::tasks::Task;
use trainer::train::{RunConfig, TrainOptions, Trainer};

use crate::device_cmd::{self, DeviceArg};

/// `trainer plans`.
#[derive(Args, Debug)]
pub struct PlansArgs {
    #[command(subcommand)]
    command: Option<PlansCommand>,
}

#[derive(Subcommand, Debug)]
enum PlansCommand {
    /// List the built-in stage plans (the default).
    List,
    /// Print a plan (built-in name or TOML file) as TOML.
    Show {
        /// A built-in plan name or the path of a TOML plan file.
        name: String,
    },
}

/// Prints the plans.
pub fn run_plans(args: PlansArgs) -> Result<()> {
    match args.command.unwrap_or(PlansCommand::List) {
        PlansCommand::List => {
            for p in Plan::builtins() {
                println!("{:<20} {}", p.name, p.description);
            }
        }
        PlansCommand::Show { name } => print!("{}", Plan::resolve(&name)?.to_toml()),
    }
    Ok(())
}

/// RL settings shared by `rl` and `rl compare` (override `--config`).
#[derive(Args, Debug, Clone, Default)]
pub struct RlSettings {
    /// RL settings file (TOML, the fields of `rl.toml`).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Task: add or reverse.
    #[arg(long)]
    task: Option<String>,
    /// Policy-gradient steps.
    #[arg(long)]
    steps: Option<u64>,
    /// Prompts per step.
    #[arg(long)]
    prompts: Option<usize>,
    /// Completions per prompt (G >= 2).
    #[arg(long)]
    group: Option<usize>,
    /// Learning rate.
    #[arg(long)]
    lr: Option<f32>,
    /// Optimizer updates (minibatches) per batch.
    #[arg(long)]
    minibatches: Option<usize>,
    /// KL penalty to the initial policy.
    #[arg(long)]
    kl_coef: Option<f64>,
    /// Do not divide advantages by the group's standard deviation.
    #[arg(long)]
    no_std: bool,
    /// The correction's bound C.
    #[arg(long)]
    correction_c: Option<f64>,
    /// Evaluate and checkpoint every N steps.
    #[arg(long)]
    eval_every: Option<u64>,
    /// Held-out prompts.
    #[arg(long)]
    eval_prompts: Option<usize>,
    /// Divergence guard: stop when a step's sampler/trainer k3 KL estimate exceeds this (0 =
    /// off).
    #[arg(long)]
    guard_max_k3: Option<f64>,
    /// Divergence guard: stop when the rollout or held-out pass rate falls below this
    /// fraction of its best (0 = off).
    #[arg(long)]
    guard_collapse: Option<f64>,
}

impl RlSettings {
    fn resolve(&self, seed: Option<u64>, correction: Option<&str>) -> Result<RlConfig> {
        let mut c = match &self.config {
            Some(p) => {
                let text =
                    std::fs::read_to_string(p).with_context(|| format!("{}", p.display()))?;
                toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?
            }
            None => RlConfig::default(),
        };
        if let Some(t) = &self.task {
            c.task = Task::from_name(t)?;
        }
        macro_rules! set {
            ($($f:ident),*) => { $(if let Some(v) = self.$f { c.$f = v; })* };
        }
        set!(
            steps,
            prompts,
            group,
            lr,
            minibatches,
            kl_coef,
            correction_c,
            eval_every,
            eval_prompts,
            guard_max_k3,
            guard_collapse
        );
        if self.no_std {
            c.scale_std = false;
        }
        if let Some(s) = seed {
            c.seed = s;
        }
        if let Some(k) = correction {
            c.correction = Correction::from_name(k).map_err(anyhow::Error::msg)?;
        }
        c.validate()?;
        Ok(c)
    }

    fn to_args(&self) -> Vec<String> {
        let mut a = Vec::new();
        let mut push = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                a.push(format!("--{k}"));
                a.push(v);
            }
        };
        push(
            "config",
            self.config.as_ref().map(|p| p.display().to_string()),
        );
        push("task", self.task.clone());
        push("steps", self.steps.map(|v| v.to_string()));
        push("prompts", self.prompts.map(|v| v.to_string()));
        push("group", self.group.map(|v| v.to_string()));
        push("lr", self.lr.map(|v| v.to_string()));
        push("minibatches", self.minibatches.map(|v| v.to_string()));
        push("kl-coef", self.kl_coef.map(|v| v.to_string()));
        push("correction-c", self.correction_c.map(|v| v.to_string()));
        push("eval-every", self.eval_every.map(|v| v.to_string()));
        push("eval-prompts", self.eval_prompts.map(|v| v.to_string()));
        push("guard-max-k3", self.guard_max_k3.map(|v| v.to_string()));
        push("guard-collapse", self.guard_collapse.map(|v| v.to_string()));
        if self.no_std {
            a.push("--no-std".into());
        }
        a
    }
}

/// `trainer rl`.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct RlArgs {
    #[command(subcommand)]
    command: Option<RlCommand>,
    #[command(flatten)]
    run: RlRunArgs,
}

#[derive(Subcommand, Debug)]
enum RlCommand {
    /// A grid of plans x corrections x seeds from one checkpoint, and its report.
    Compare(RlCompareArgs),
}

#[derive(Args, Debug, Default)]
struct RlRunArgs {
    /// Checkpoint or run directory to start from (pretraining, or RL to continue from an RL-tuned policy).
    #[arg(long, conflicts_with_all = ["resume", "pretrain_steps"])]
    from: Option<PathBuf>,
    /// Pretrain the starting model first (on the task's mix, the plan's pretrain recipe) for
    /// this many steps into OUT/pretrain.
    #[arg(long)]
    pretrain_steps: Option<u64>,
    /// Model preset of --pretrain-steps.
    #[arg(long, default_value = "small")]
    preset: String,
    /// Encode the --pretrain-steps mix with this byte-level BPE (a tokenizer.json or a folder
    /// holding one) instead of bytes.
    #[arg(long, conflicts_with = "bpe_vocab")]
    tokenizer: Option<PathBuf>,
    /// Train a byte-level BPE of N tokens on the --pretrain-steps mix and encode it with it.
    #[arg(long, value_name = "N")]
    bpe_vocab: Option<u32>,
    /// Continue the RL run in this directory.
    #[arg(long)]
    resume: Option<PathBuf>,
    /// Stage plan: a built-in name or a TOML file [default: bf16].
    #[arg(long)]
    plan: Option<String>,
    /// Off-policy correction: none, token-tis, token-mis, seq-tis, seq-mis.
    #[arg(long)]
    correction: Option<String>,
    /// Seed.
    #[arg(long)]
    seed: Option<u64>,
    /// Run directory.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Worker threads.
    #[arg(long)]
    threads: Option<usize>,
    /// Where the sampler, the held-out evaluation and the RL update (the policy's forward,
    /// backward and AdamW) run: cpu, cuda or auto (the default keeps `rl compare`'s parallel
    /// runs on the host).
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    device: DeviceArg,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    #[command(flatten)]
    settings: RlSettings,
}

#[derive(Args, Debug)]
struct RlCompareArgs {
    /// Pretraining checkpoint or run directory every run starts from.
    #[arg(long)]
    from: PathBuf,
    /// Plans, comma-separated.
    #[arg(long, default_value = "bf16,bf16-mxfp8,bf16-nvfp4")]
    plans: String,
    /// Corrections, comma-separated (a plan whose sampler and trainer run the same recipe
    /// with dynamic scales has no mismatch; it runs `none` only).
    #[arg(long, default_value = "none,token-tis")]
    corrections: String,
    /// Seeds seed..seed+N-1.
    #[arg(long, default_value_t = 3)]
    seeds: u64,
    /// First seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Runs at once (separate processes, one thread each).
    #[arg(long, default_value_t = 1)]
    jobs: usize,
    /// Report folder.
    #[arg(long)]
    out: PathBuf,
    #[command(flatten)]
    settings: RlSettings,
}

/// Runs `trainer rl`.
pub fn run_rl(args: RlArgs) -> Result<()> {
    match args.command {
        Some(RlCommand::Compare(c)) => run_rl_compare(c),
        None => run_rl_run(args.run),
    }
}

fn pretrain(a: &RlRunArgs, plan: &Plan, cfg: &RlConfig, out: &Path, steps: u64) -> Result<PathBuf> {
    let dir = out.join("pretrain");
    // the settings first (the preset, the step count): a refused run writes nothing
    if steps == 0 {
        bail!("--pretrain-steps must be at least 1");
    }
    let mut rc = RunConfig::preset(&a.preset)?;
    rc.train.steps = steps;
    rc.train.seed = cfg.seed;
    rc.train.warmup_steps = rc.train.warmup_steps.min(steps);
    rc.train.eval_every = steps.div_ceil(4).max(1);
    rc.validate()?;
    let recipe: Recipe = plan.recipe("pretrain")?;
    if dir.join("summary.json").is_file() {
        let done = RunConfig::from_file(&dir.join("run.toml"))?;
        let done_recipe = Recipe::from_file(&dir.join("recipe.toml"))?;
        check_same_pretraining(&dir, (&done, &done_recipe.name), (&rc, &recipe.name))?;
        eprintln!("reusing the finished pretraining run {}", dir.display());
        return Ok(dir);
    }
    let opts = TrainOptions {
        out: dir.clone(),
        quiet: a.quiet,
        stop_after: None,
    };
    // a stopped or killed pretraining (a run folder without a summary) continues: the same
    // command resumes it
    if dir.join("run.toml").is_file() || trainer::checkpoint::resolve(&dir).is_ok() {
        let mut t = Trainer::resume(&dir, opts)?;
        check_same_pretraining(&dir, (t.config(), &t.recipe().name), (&rc, &recipe.name))?;
        eprintln!(
            "continuing the pretraining {} at step {}",
            dir.display(),
            t.step()
        );
        return finish_pretraining(&mut t, dir);
    }
    let how = match (&a.tokenizer, a.bpe_vocab) {
        (Some(p), _) => MixTokenizer::File(p.clone()),
        (None, Some(v)) => MixTokenizer::Train(v),
        (None, None) => MixTokenizer::Bytes,
    };
    let (data, tok) = pretrain_data(cfg.task, cfg.seed, 50_000, 200_000, out, &how)?;
    if !tok.is_bytes() {
        eprintln!(
            "the mix is encoded with {}; model vocabulary {} -> {}",
            tok.describe(),
            rc.model.vocab,
            tok.vocab_size()
        );
        rc.model.vocab = tok.vocab_size() as usize;
    }
    rc.data = data;
    eprintln!(
        "pretraining {} ({} steps, recipe {}) on the {} mix -> {}",
        a.preset,
        steps,
        recipe.name,
        cfg.task.name(),
        dir.display()
    );
    let mut t = Trainer::new(rc, recipe, opts)?;
    finish_pretraining(&mut t, dir)
}

/// Refuses to reuse or continue the pretraining in `dir` when this command asks for another
/// one (`(config, recipe name)` of each): its step count, seed, model (the vocabulary aside,
/// which the mix's tokenizer sets) or recipe. Reusing it would start RL from another model
/// than the one asked for, silently.
fn check_same_pretraining(
    dir: &Path,
    (done, done_recipe): (&RunConfig, &str),
    (want, recipe): (&RunConfig, &str),
) -> Result<()> {
    let mut diffs = Vec::new();
    if done.train.steps != want.train.steps {
        diffs.push(format!(
            "{} steps (--pretrain-steps {})",
            done.train.steps, want.train.steps
        ));
    }
    if done.train.seed != want.train.seed {
        diffs.push(format!(
            "seed {} (this command's {})",
            done.train.seed, want.train.seed
        ));
    }
    let mut model = done.model.clone();
    model.vocab = want.model.vocab;
    if model != want.model {
        diffs.push(format!(
            "a model of {} blocks x d_model {} (the --preset's {} x {})",
            done.model.n_layers, done.model.d_model, want.model.n_layers, want.model.d_model
        ));
    }
    if done_recipe != recipe {
        diffs.push(format!("recipe {done_recipe} (the plan's {recipe})"));
    }
    if !diffs.is_empty() {
        bail!(
            "{} holds another pretraining: {}; pass its settings to reuse or continue it, or \
             choose another --out",
            dir.display(),
            diffs.join(", ")
        );
    }
    Ok(())
}

/// Runs the pretraining `t` (in `dir`) to its end; a stop says that the same `trainer rl`
/// command continues it.
fn finish_pretraining(t: &mut Trainer, dir: PathBuf) -> Result<PathBuf> {
    match on_pool(|| t.run()) {
        Ok(s) => {
            eprintln!("pretraining done: validation loss {:.4}", s.final_val_loss);
            Ok(dir)
        }
        Err(e @ trainer::train::TrainError::Stopped { .. }) => {
            eprintln!("the same `trainer rl` command continues the pretraining");
            Err(e.into())
        }
        Err(e) => Err(e.into()),
    }
}

fn run_rl_run(a: RlRunArgs) -> Result<()> {
    if (a.tokenizer.is_some() || a.bpe_vocab.is_some()) && a.pretrain_steps.is_none() {
        bail!(
            "--tokenizer and --bpe-vocab encode the mix of --pretrain-steps; a run --from a \
             checkpoint uses the checkpoint's own tokenizer"
        );
    }
    set_threads(a.threads)?;
    trainer::interrupt::install_handlers().ok();
    let opts = RlOptions {
        quiet: a.quiet,
        stop_after: None,
        nan_reward_at: std::env::var("NIBBLE_TEST_NAN_REWARD_AT")
            .ok()
            .and_then(|s| s.parse().ok()),
        ..RlOptions::default()
    };
    let dev;
    let mut run = if let Some(dir) = &a.resume {
        // the run's settings are its checkpoint's: a flag that would change them is refused,
        // not silently ignored
        let mut given: Vec<String> = [
            ("--seed", a.seed.is_some()),
            ("--correction", a.correction.is_some()),
            ("--out", a.out.is_some()),
            ("--plan", a.plan.is_some()),
            ("--pretrain-steps", a.pretrain_steps.is_some()),
            ("--tokenizer", a.tokenizer.is_some()),
            ("--bpe-vocab", a.bpe_vocab.is_some()),
        ]
        .into_iter()
        .filter(|(_, on)| *on)
        .map(|(flag, _)| flag.to_string())
        .collect();
        given.extend(
            a.settings
                .to_args()
                .into_iter()
                .filter(|x| x.starts_with("--")),
        );
        if !given.is_empty() {
            bail!(
                "--resume continues a run with its own settings; drop {}",
                given.join(", ")
            );
        }
        let bf16 = Recipe::builtin("bf16").expect("built-in recipe");
        // the plan is the checkpoint's: checked against the device once it is read
        dev = device_cmd::resolve(a.device, &[&bf16])?;
        RlRun::resume(dir, opts)?
    } else {
        let Some(out) = a.out.clone() else {
            bail!("trainer rl needs --out DIR (or --resume DIR)");
        };
        if out.exists() && !out.is_dir() {
            bail!("--out {}: not a directory", out.display());
        }
        let plan = Plan::resolve(a.plan.as_deref().unwrap_or("bf16"))?;
        dev = device_cmd::resolve(
            a.device,
            &[&plan.recipe("sampler")?, &plan.recipe("rl-trainer")?],
        )?;
        let cfg = a.settings.resolve(a.seed, a.correction.as_deref())?;
        let from = match (&a.from, a.pretrain_steps) {
            (Some(f), _) => f.clone(),
            (None, Some(n)) => pretrain(&a, &plan, &cfg, &out, n)?,
            (None, None) => {
                bail!("trainer rl needs --from CHECKPOINT, --pretrain-steps N or --resume DIR")
            }
        };
        eprintln!(
            "RL on task {} with plan {} (sampler {}, trainer {}), correction {}, {} steps x {} prompts x {} completions -> {}",
            cfg.task.name(),
            plan.name,
            plan.sampler.recipe,
            plan.rl_trainer,
            cfg.correction.name(),
            cfg.steps,
            cfg.prompts,
            cfg.group,
            out.display()
        );
        RlRun::new(cfg, plan, &from, &out, opts)?
    };
    let (dev, line) = match (
        dev,
        run.plan().recipe("sampler"),
        run.plan().recipe("rl-trainer"),
    ) {
        ((Some(d), line), Ok(s), Ok(t)) => match device_cmd::blocked(&[&s, &t]) {
            None => (Some(d), line),
            Some(why) if a.device == DeviceArg::Cuda => {
                bail!("--device cuda: {why}; use --device cpu")
            }
            Some(why) => (
                None,
                format!("device: cpu (auto: a CUDA device is present, but {why})"),
            ),
        },
        (dev, _, _) => dev,
    };
    eprintln!("sampler and update {line}");
    run.set_sampler_device(dev.clone())?;
    run.set_update_device(dev)?;
    let s = on_pool(|| run.run())?;
    println!(
        "held-out pass rate {:.3} -> {:.3} in {:.0} s; mean |dlogp| {:.3e}, k3 {:.3e}, bitwise-different {:.3}",
        s.initial_pass_rate, s.final_pass_rate, s.seconds, s.mean_abs_dlogp, s.k3, s.frac_bitwise_different
    );
    println!("metrics: {}", run.out_dir().join("metrics.jsonl").display());
    Ok(())
}

fn run_rl_compare(c: RlCompareArgs) -> Result<()> {
    if c.seeds == 0 || c.seeds > 1000 || c.jobs == 0 || c.jobs > 64 {
        bail!("--seeds must be in 1..=1000 and --jobs in 1..=64");
    }
    let mut grid = Vec::new();
    for p in c.plans.split(',') {
        let plan = Plan::resolve(p.trim())?;
        let same = plan.sampler.recipe == plan.rl_trainer
            && plan.sampler.activation_scales == trainer::rl::plan::ActivationScales::Dynamic;
        for k in c.corrections.split(',') {
            let k = Correction::from_name(k.trim()).map_err(anyhow::Error::msg)?;
            if same && k != Correction::None {
                continue;
            }
            for s in c.seed..c.seed + c.seeds {
                c.settings.resolve(Some(s), Some(k.name()))?;
                grid.push(GridRun {
                    plan: p.trim().to_string(),
                    plan_name: plan.name.clone(),
                    correction: k,
                    seed: s,
                    dir: c
                        .out
                        .join(format!("{}-{}", plan.name, k.name()))
                        .join(format!("seed{s}")),
                });
            }
        }
    }
    // what every run of the grid would fail on, before the folder is made and the runs start
    trainer::any_checkpoint::AnyCheckpoint::load(&c.from)?;
    if c.out.exists() && !c.out.is_dir() {
        bail!("--out {}: not a directory", c.out.display());
    }
    std::fs::create_dir_all(&c.out).with_context(|| format!("--out {}", c.out.display()))?;
    let exe = std::env::current_exe().context("locating the trainer executable")?;
    let mut pending: Vec<&GridRun> = grid.iter().collect();
    let mut running: Vec<(std::process::Child, &GridRun)> = Vec::new();
    let mut failed = Vec::new();
    // A stop (SIGINT, SIGTERM) is passed on to the running runs, which save a checkpoint and
    // exit; nothing new starts, and the same command continues the grid. The runs are in
    // their own process groups, so a Ctrl-C at the terminal reaches them once, through here.
    trainer::interrupt::install_handlers().context("installing the SIGINT/SIGTERM handlers")?;
    let mut stopping = false;
    while !pending.is_empty() || !running.is_empty() {
        if !stopping && trainer::interrupt::stop_requested() {
            stopping = true;
            pending.clear();
            eprintln!(
                "stopping: {} running run(s) save a checkpoint and exit",
                running.len()
            );
            for (ch, _) in &mut running {
                trainer::interrupt::forward_stop(ch);
            }
        }
        while running.len() < c.jobs && !pending.is_empty() {
            let r = pending.remove(0);
            // finished, or stopped by the divergence guard: a result either way (a stopped
            // run resumed would stop at the same step again, bit for bit)
            if r.dir.join("summary.json").is_file() || trainer::rl::compare::stopped(&r.dir) {
                continue;
            }
            let mut cmd = Process::new(&exe);
            cmd.arg("rl").arg("--quiet").arg("--threads").arg("1");
            if trainer::rl::checkpoint::resolve(&r.dir).is_some() {
                cmd.arg("--resume").arg(&r.dir);
            } else {
                // a fresh start: nothing of an earlier attempt (its folder, its log) stays
                let _ = std::fs::remove_dir_all(&r.dir);
                let _ = std::fs::remove_file(r.dir.with_extension("log"));
                cmd.arg("--from")
                    .arg(&c.from)
                    .arg("--plan")
                    .arg(&r.plan)
                    .arg("--correction")
                    .arg(r.correction.name())
                    .arg("--seed")
                    .arg(r.seed.to_string())
                    .arg("--out")
                    .arg(&r.dir)
                    .args(c.settings.to_args());
            }
            std::fs::create_dir_all(&r.dir).with_context(|| r.dir.display().to_string())?;
            // appended to: a resumed run's log keeps the lines of its earlier parts
            let log_path = r.dir.with_extension("log");
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log_path)
                .with_context(|| log_path.display().to_string())?;
            cmd.stdout(log.try_clone()?).stderr(log);
            #[cfg(unix)]
            std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
            eprintln!(
                "start {} {} seed {}",
                r.plan_name,
                r.correction.name(),
                r.seed
            );
            running.push((cmd.spawn()?, r));
        }
        // short: a stop reaches the runs within this (a second signal in the meantime ends
        // this process at once, before it passed the first on)
        std::thread::sleep(std::time::Duration::from_millis(50));
        let mut still = Vec::new();
        for (mut ch, r) in running {
            match ch.try_wait()? {
                Some(st) => {
                    eprintln!(
                        "done {} {} seed {}: {st}",
                        r.plan_name,
                        r.correction.name(),
                        r.seed
                    );
                    if !st.success() && stopping {
                        eprintln!(
                            "  stopped: resumes from its checkpoint when the grid is run again"
                        );
                    } else if !st.success() && trainer::rl::compare::stopped(&r.dir) {
                        eprintln!(
                            "  stopped by the divergence guard: {}",
                            r.dir.join(trainer::rl::compare::DIAGNOSIS_FILE).display()
                        );
                    } else if !st.success() {
                        failed.push(format!(
                            "{} {} seed {} (log: {})",
                            r.plan_name,
                            r.correction.name(),
                            r.seed,
                            r.dir.with_extension("log").display()
                        ));
                    }
                }
                None => still.push((ch, r)),
            }
        }
        running = still;
    }
    if stopping {
        bail!(
            "stopped; run the same `trainer rl compare` command again to continue the grid \
             (finished runs are kept, stopped ones resume from their checkpoints)"
        );
    }
    let report = write_report(&c.out, &grid, &c.from)?;
    println!("report: {}", report.display());
    if !failed.is_empty() {
        bail!("{} runs failed: {}", failed.len(), failed.join("; "));
    }
    Ok(())
}

//! Helpers shared by the trainer's integration tests: running the real binary and quiet
//! training options. (Each test crate uses a subset, hence the `dead_code` allowance.)
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

use trainer::rl::config::RlConfig;
use trainer::rl::correction::Correction;
use trainer::rl::run::RlOptions;
use trainer::train::TrainOptions;

/// Runs the `trainer` binary with `args` and collects its output.
pub fn trainer(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trainer"))
        .args(args)
        .output()
        .expect("run trainer")
}

/// The output's stdout as text (lossy).
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The output's stderr as text (lossy).
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Options for a quiet run writing into `out`, with no early stop.
pub fn opts(out: &Path) -> TrainOptions {
    TrainOptions {
        out: out.to_path_buf(),
        quiet: true,
        stop_after: None,
    }
}

/// A tiny GRPO configuration (4 prompts x 4 completions, token TIS, 16 held-out prompts)
/// of `steps` steps, evaluated every `eval_every`.
pub fn tiny_rl_config(steps: u64, eval_every: u64) -> RlConfig {
    RlConfig {
        steps,
        prompts: 4,
        group: 4,
        eval_every,
        eval_prompts: 16,
        calibration: 8,
        lr: 1e-3,
        correction: Correction::TokenTis,
        ..RlConfig::default()
    }
}

/// RL options without the progress bar.
pub fn quiet_rl() -> RlOptions {
    RlOptions {
        quiet: true,
        ..RlOptions::default()
    }
}

//! Helpers shared by the trainer's integration tests: running the real binary and quiet
//! training options. (Each test crate uses a subset, hence the `dead_code` allowance.)
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

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

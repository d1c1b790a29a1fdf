//! Bad counts on the command line are refused by the parser with the allowed range, before
//! anything runs: no silent clamping of `--rounds 0`, no allocation sized by a huge
//! `--rounds`, no pool of a million threads.

use std::process::Command;

#[test]
fn out_of_range_counts_are_refused_with_their_range() {
    for (args, range) in [
        (&["kernels", "--rounds", "0"][..], "1..=100000"),
        (&["gemms", "--rounds", "100000000000"][..], "1..=100000"),
        (&["steps", "--scaling-rounds", "0"][..], "1..=100000"),
        (&["ops", "--warmup", "100001"][..], "0..=100000"),
        (&["gemms", "--threads", "0"][..], "1..=256"),
        (
            &["step", "--recipes", "fp32", "--threads", "1000000"][..],
            "1..=256",
        ),
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_bench"))
            .args(args)
            .output()
            .expect("run bench");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(&format!("is not in {range}")),
            "{args:?}: {err}"
        );
        assert!(o.stdout.is_empty(), "{args:?}");
    }
}

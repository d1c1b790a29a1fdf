//! `trainer::compare` as a library: the runs it makes, their reuse, its report and its
//! refusals, on a tiny model (a few seconds).

use trainer::compare::{CompareError, CompareEvent, Comparison};
use trainer::recipe::Recipe;
use trainer::train::RunConfig;

fn tiny() -> RunConfig {
    RunConfig::from_toml_str(
        "[model]\nvocab = 256\nd_model = 32\nn_layers = 1\nn_heads = 2\nhidden = 64\nseq = 16\n\
         [train]\nsteps = 3\nbatch = 2\nwarmup_steps = 1\neval_every = 3\neval_batches = 1\n\
         [data]\nkind = \"corpus\"\nseed = 0\nbytes = 6000\n",
    )
    .unwrap()
}

fn recipes(names: &[&str]) -> Vec<Recipe> {
    names.iter().map(|n| Recipe::builtin(n).unwrap()).collect()
}

/// Events as short strings: `finished bf16 seed 4`, `reused nvfp4 seed 5`, ...
fn run(
    cmp: &Comparison,
) -> (
    Result<trainer::compare::CompareOutcome, CompareError>,
    Vec<String>,
) {
    let mut events = Vec::new();
    let r = cmp.run(|e| {
        events.push(match e {
            CompareEvent::Start { recipes, seeds, .. } => format!("start {recipes}x{seeds}"),
            CompareEvent::Reused { seed, summary, .. } => {
                format!("reused {} seed {seed}", summary.recipe)
            }
            CompareEvent::Continuing { recipe, seed, .. } => {
                format!("continuing {recipe} seed {seed}")
            }
            CompareEvent::Finished { seed, summary } => {
                format!("finished {} seed {seed}", summary.recipe)
            }
            CompareEvent::Failed { dir, .. } => format!("failed {}", dir.display()),
        })
    });
    (r, events)
}

#[test]
fn runs_seed_major_reuses_finished_runs_and_writes_the_report() {
    let tmp = tempfile::tempdir().unwrap();
    let mut run_cfg = tiny();
    run_cfg.train.seed = 4;
    let mut cmp = Comparison::new(run_cfg, recipes(&["bf16", "nvfp4"]), tmp.path().join("cmp"));
    cmp.seeds = 2;
    cmp.quiet = true;
    let (outcome, events) = run(&cmp);
    let outcome = outcome.unwrap();
    assert_eq!(
        events,
        [
            "start 2x2",
            "finished bf16 seed 4",
            "finished nvfp4 seed 4",
            "finished bf16 seed 5",
            "finished nvfp4 seed 5"
        ]
    );
    assert_eq!(outcome.results.len(), 4);
    assert!(outcome.failed.is_empty());
    assert!(cmp.run_dir(&cmp.recipes[1], 5).ends_with("nvfp4/seed5"));
    let report = std::fs::read_to_string(&outcome.report).unwrap();
    assert!(report.contains("seeds 4..=5"), "{report}");
    assert!(report.contains("| nvfp4 |"), "{report}");
    for p in &outcome.plots {
        assert!(p.is_file(), "{}", p.display());
    }
    // The same comparison again trains nothing; the runs' results are identical.
    let (again, events) = run(&cmp);
    assert_eq!(
        events[1..],
        [
            "reused bf16 seed 4",
            "reused nvfp4 seed 4",
            "reused bf16 seed 5",
            "reused nvfp4 seed 5"
        ]
    );
    let again = again.unwrap();
    for (a, b) in outcome.results.iter().zip(&again.results) {
        assert_eq!(
            a.summary.final_val_loss.to_bits(),
            b.summary.final_val_loss.to_bits()
        );
        assert_eq!(a.metrics, b.metrics);
    }
}

#[test]
fn refuses_bad_settings_before_touching_the_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("cmp");
    let check = |cmp: Comparison, want: &str| {
        let (r, events) = run(&cmp);
        let e = r.unwrap_err();
        assert!(e.to_string().contains(want), "{e}");
        assert!(events.is_empty());
        assert!(!out.exists());
    };
    check(
        Comparison::new(tiny(), vec![], out.clone()),
        "at least one recipe",
    );
    let mut dup = Comparison::new(tiny(), recipes(&["bf16", "nvfp4", "bf16"]), out.clone());
    match dup.validate() {
        Err(CompareError::DuplicateRecipe {
            first: 0,
            second: 2,
            name,
        }) => assert_eq!(name, "bf16"),
        other => panic!("{other:?}"),
    }
    dup.recipes.pop();
    dup.seeds = 0;
    check(dup.clone(), "--seeds must be at least 1");
    dup.seeds = 2;
    dup.run.train.seed = u64::MAX;
    check(dup.clone(), "overflow");
    dup.run.train.seed = 0;
    dup.reference = Some("mxfp8".into());
    check(
        dup,
        "--reference mxfp8 is not among the recipes (bf16, nvfp4)",
    );
}

//! Tests of `trainer::recipe`: built-ins, TOML round trips, user recipes and their errors,
//! per-layer resolution.

use fp_formats::mx::{MxElement, ScaleRule};
use quant::{
    AmaxAlgo, BlockShape, Fp8Element, Fp8Scaling, GemmPolicy, OperandQuant, QuantFormat, Rht,
    RoundingMode,
};
use trainer::recipe::{
    AttentionPrecision, BlockRange, LayerKind, LayerOverride, Recipe, RecipeError, Schedule,
    BUILTIN_NAMES,
};

const KINDS: [LayerKind; 5] = [
    LayerKind::AttnQkv,
    LayerKind::AttnOut,
    LayerKind::MlpUp,
    LayerKind::MlpDown,
    LayerKind::LmHead,
];

#[test]
fn every_builtin_round_trips_through_toml_and_json() {
    assert_eq!(Recipe::builtins().len(), BUILTIN_NAMES.len());
    for r in Recipe::builtins() {
        assert!(BUILTIN_NAMES.contains(&r.name.as_str()));
        assert!(!r.description.is_empty(), "{}", r.name);
        r.validate().unwrap();
        let text = r.to_toml();
        let back =
            Recipe::from_toml_str(&text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", r.name));
        assert_eq!(back, r, "{}\n{text}", r.name);
        // Plain serde (what a checkpoint would store) agrees too.
        let plain: Recipe = toml::from_str(&toml::to_string(&r).unwrap()).unwrap();
        assert_eq!(plain, r);
        let json: Recipe = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(json, r);
    }
}

#[test]
fn unknown_recipe_names_list_the_valid_ones() {
    let e = Recipe::builtin("nvfp5").unwrap_err();
    assert!(matches!(e, RecipeError::UnknownRecipe { .. }));
    let msg = e.to_string();
    assert!(msg.starts_with("unknown recipe 'nvfp5'; valid: fp32, bf16, fp8-delayed, fp8-current, mxfp8, mxfp4, nvfp4, nvfp4-no-rht"), "{msg}");
    // A spec that looks like a path is a missing file, not an unknown name.
    for spec in ["no/such/file.toml", "mine.toml"] {
        let e = Recipe::resolve(spec).unwrap_err();
        assert!(matches!(e, RecipeError::Io { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(msg.starts_with(&format!("recipe file {spec}: ")), "{msg}");
        assert!(msg.contains("No such file"), "{msg}");
        // the cause is said in the message, not again as a source
        assert!(std::error::Error::source(&e).is_none());
    }
    assert!(matches!(
        Recipe::resolve("nvfp5"),
        Err(RecipeError::UnknownRecipe { .. })
    ));
}

#[test]
fn baselines() {
    let r = Recipe::builtin("fp32").unwrap();
    assert_eq!(r.attention, AttentionPrecision::Fp32);
    for k in KINDS {
        assert_eq!(r.policy_for(0, 2, k, 0.5), GemmPolicy::FP32);
    }
    let r = Recipe::builtin("bf16").unwrap();
    assert_eq!(r.attention, AttentionPrecision::Bf16);
    for k in KINDS {
        assert_eq!(r.policy_for(1, 2, k, 0.99), GemmPolicy::BF16);
    }
}

fn fp8(q: &OperandQuant) -> (Fp8Element, Fp8Scaling) {
    match q.format {
        QuantFormat::Fp8 { element, scaling } => (element, scaling),
        other => panic!("{other:?}"),
    }
}

#[test]
fn fp8_recipes_are_hybrid() {
    for name in ["fp8-delayed", "fp8-current"] {
        let r = Recipe::builtin(name).unwrap();
        let p = r.policy_for(0, 4, LayerKind::MlpUp, 0.0);
        // Forward operands (X, W, in any GEMM) E4M3; dY E5M2.
        for q in [p.fprop.a, p.fprop.b, p.dgrad.b, p.wgrad.b] {
            assert_eq!(fp8(&q).0, Fp8Element::E4M3, "{name}");
        }
        for q in [p.dgrad.a, p.wgrad.a] {
            assert_eq!(fp8(&q).0, Fp8Element::E5M2, "{name}");
        }
        for q in p.operands() {
            let scaling = fp8(&q).1;
            match name {
                "fp8-delayed" => assert_eq!(
                    scaling,
                    Fp8Scaling::Delayed {
                        history_len: 16,
                        margin: 0,
                        algo: AmaxAlgo::Max
                    }
                ),
                _ => assert_eq!(
                    scaling,
                    Fp8Scaling::Current {
                        power_of_two: false
                    }
                ),
            }
        }
        assert_eq!(r.policy_for(0, 4, LayerKind::LmHead, 0.0), GemmPolicy::BF16);
        assert!(r.schedule.is_none());
    }
}

#[test]
fn mx_recipes() {
    let r = Recipe::builtin("mxfp8").unwrap();
    let p = r.policy_for(2, 4, LayerKind::AttnOut, 0.3);
    for q in p.operands() {
        assert_eq!(
            q.format,
            QuantFormat::Mx {
                element: MxElement::E4M3,
                rule: ScaleRule::Rceil,
                sr_prescale: false
            }
        );
        assert_eq!(
            (q.block, q.rounding, q.rht),
            (BlockShape::Row32, RoundingMode::NearestEven, Rht::Off)
        );
    }
    let r = Recipe::builtin("mxfp4").unwrap();
    let p = r.policy_for(2, 4, LayerKind::MlpDown, 0.3);
    assert_eq!(
        (p.fprop.a, p.fprop.b),
        (OperandQuant::BF16, OperandQuant::BF16)
    );
    for q in [p.dgrad.a, p.dgrad.b, p.wgrad.a, p.wgrad.b] {
        assert_eq!(
            q.format,
            QuantFormat::Mx {
                element: MxElement::E2M1,
                rule: ScaleRule::Floor,
                sr_prescale: true
            }
        );
        assert_eq!(q.rounding, RoundingMode::Stochastic);
    }
    assert_eq!((p.dgrad.a.rht, p.dgrad.b.rht), (Rht::Off, Rht::Off));
    assert_eq!(
        (p.wgrad.a.rht, p.wgrad.b.rht),
        (Rht::FixedSigns, Rht::FixedSigns)
    );
}

#[test]
fn nvfp4_paper_recipe_per_layer() {
    let r = Recipe::builtin("nvfp4").unwrap();
    let nv = GemmPolicy::nvfp4_paper();
    let n = 6;
    for k in LayerKind::IN_BLOCK {
        assert_eq!(r.policy_for(0, n, k, 0.0), GemmPolicy::BF16, "first block");
        assert_eq!(r.policy_for(5, n, k, 0.0), GemmPolicy::BF16, "last block");
        for b in 1..5 {
            assert_eq!(r.policy_for(b, n, k, 0.79), nv);
            assert_eq!(
                r.policy_for(b, n, k, 0.8),
                GemmPolicy::BF16,
                "switched at 80%"
            );
        }
    }
    assert_eq!(r.policy_for(0, n, LayerKind::LmHead, 0.0), GemmPolicy::BF16);
    // The paper's operand table (docs/numerics.md#the-nvfp4-recipe-per-operand).
    assert_eq!(nv.fprop.b.block, BlockShape::Tile16);
    assert_eq!(nv.dgrad.a.rounding, RoundingMode::Stochastic);
    assert_eq!(
        (nv.wgrad.a.rht, nv.wgrad.b.rht),
        (Rht::FixedSigns, Rht::FixedSigns)
    );
    // A one-block model: the block is both first and last.
    assert_eq!(r.policy_for(0, 1, LayerKind::MlpUp, 0.0), GemmPolicy::BF16);
    assert_eq!(r.schedule.as_ref().unwrap().switch_at, 0.8);
}

#[test]
fn nvfp4_ablations_change_one_thing() {
    let nv = GemmPolicy::nvfp4_paper();
    let mid = |name: &str| {
        Recipe::builtin(name)
            .unwrap()
            .policy_for(2, 6, LayerKind::MlpUp, 0.1)
    };

    let mut want = nv;
    want.wgrad.a.rht = Rht::Off;
    want.wgrad.b.rht = Rht::Off;
    assert_eq!(mid("nvfp4-no-rht"), want);

    let mut want = nv;
    want.dgrad.a.rounding = RoundingMode::NearestEven;
    want.wgrad.a.rounding = RoundingMode::NearestEven;
    assert_eq!(mid("nvfp4-no-sr"), want);
    assert!(want
        .operands()
        .iter()
        .all(|q| q.rounding == RoundingMode::NearestEven));

    let mut want = nv;
    want.fprop.b.block = BlockShape::Row16;
    want.dgrad.b.block = BlockShape::Row16;
    assert_eq!(mid("nvfp4-no-2d"), want);

    let r = Recipe::builtin("nvfp4-no-bf16-layers").unwrap();
    assert_eq!(r.policy_for(0, 6, LayerKind::AttnQkv, 0.1), nv);
    assert_eq!(r.policy_for(5, 6, LayerKind::MlpDown, 0.1), nv);
    assert_eq!(r.policy_for(5, 6, LayerKind::LmHead, 0.1), GemmPolicy::BF16);

    // Everything else is shared with nvfp4.
    let base = Recipe::builtin("nvfp4").unwrap();
    for name in ["nvfp4-no-rht", "nvfp4-no-sr", "nvfp4-no-2d"] {
        let r = Recipe::builtin(name).unwrap();
        assert_eq!(
            (&r.overrides, &r.schedule, r.attention),
            (&base.overrides, &base.schedule, base.attention)
        );
    }
}

#[test]
fn overrides_select_blocks_and_kinds_later_wins() {
    let nv = GemmPolicy::nvfp4_paper();
    let mx = GemmPolicy::mxfp8();
    let r = Recipe {
        name: "t".into(),
        description: String::new(),
        attention: AttentionPrecision::Bf16,
        linear: nv,
        overrides: vec![
            LayerOverride {
                first: 0,
                last: 2,
                blocks: vec![BlockRange { start: 3, end: 5 }],
                kinds: vec![LayerKind::MlpUp, LayerKind::MlpDown],
                policy: mx,
            },
            LayerOverride::kinds(&[LayerKind::MlpDown], GemmPolicy::FP32),
            LayerOverride::kinds(&[], GemmPolicy::BF16).clone(),
        ],
        schedule: None,
    };
    // The last override selects everything (no kinds, no blocks), the LM head included.
    for k in KINDS {
        assert_eq!(r.policy_for(0, 10, k, 0.0), GemmPolicy::BF16);
    }
    let mut r2 = r.clone();
    r2.overrides.pop();
    let p = |b, k| r2.policy_for(b, 10, k, 0.0);
    assert_eq!(p(0, LayerKind::MlpUp), nv);
    assert_eq!(p(3, LayerKind::MlpUp), mx);
    assert_eq!(p(4, LayerKind::MlpUp), mx);
    assert_eq!(p(5, LayerKind::MlpUp), nv);
    assert_eq!(p(8, LayerKind::MlpUp), mx);
    assert_eq!(p(9, LayerKind::MlpUp), mx);
    assert_eq!(p(9, LayerKind::AttnQkv), nv, "kind not selected");
    assert_eq!(
        p(9, LayerKind::MlpDown),
        GemmPolicy::FP32,
        "later override wins"
    );
    assert_eq!(
        p(0, LayerKind::LmHead),
        nv,
        "block-restricted overrides never select the head"
    );
    // first/last larger than the model select every block.
    let o = LayerOverride::edge_blocks(5, 0, mx);
    assert!((0..3).all(|b| o.selects(b, 3, LayerKind::AttnOut)));
    assert!(!o.selects(0, 3, LayerKind::LmHead));
}

#[test]
fn forward_only_switch_and_never() {
    let mut r = Recipe::builtin("nvfp4").unwrap();
    let nv = GemmPolicy::nvfp4_paper();
    r.schedule = Some(Schedule {
        switch_at: 0.5,
        forward_only: true,
        target: GemmPolicy::BF16,
    });
    let p = r.policy_for(2, 6, LayerKind::MlpUp, 0.6);
    assert_eq!(p.fprop, GemmPolicy::BF16.fprop);
    assert_eq!((p.dgrad, p.wgrad), (nv.dgrad, nv.wgrad));
    assert_eq!(r.policy_for(2, 6, LayerKind::MlpUp, 0.4), nv);
    r.schedule = Some(Schedule {
        switch_at: 1.0,
        forward_only: false,
        target: GemmPolicy::BF16,
    });
    assert_eq!(
        r.policy_for(2, 6, LayerKind::MlpUp, 1.0),
        nv,
        "1.0 never switches"
    );
    r.schedule = Some(Schedule {
        switch_at: 0.0,
        forward_only: false,
        target: GemmPolicy::FP32,
    });
    assert_eq!(r.policy_for(0, 6, LayerKind::LmHead, 0.0), GemmPolicy::FP32);
}

// --- user recipes ------------------------------------------------------------------------

/// The example of the module docs.
const USER_EXAMPLE: &str = r#"
base = "nvfp4"
name = "nvfp4-2-2"
description = "nvfp4 with the first 2 and last 2 blocks in BF16, forward-only switch"

[[overrides]]
first = 2
last = 2
policy = "bf16"

[[overrides]]
kinds = ["lm-head"]
policy = "bf16"

[schedule]
switch_at = 0.9
forward_only = true
"#;

#[test]
fn user_recipe_on_a_base() {
    let r = Recipe::from_toml_str(USER_EXAMPLE).unwrap();
    assert_eq!(r.name, "nvfp4-2-2");
    assert_eq!(r.linear, GemmPolicy::nvfp4_paper());
    assert_eq!(
        r.policy_for(1, 8, LayerKind::AttnQkv, 0.0),
        GemmPolicy::BF16
    );
    assert_eq!(
        r.policy_for(6, 8, LayerKind::AttnQkv, 0.0),
        GemmPolicy::BF16
    );
    assert_eq!(
        r.policy_for(2, 8, LayerKind::AttnQkv, 0.0),
        GemmPolicy::nvfp4_paper()
    );
    let s = r.schedule.as_ref().unwrap();
    assert_eq!(
        (s.switch_at, s.forward_only, s.target),
        (0.9, true, GemmPolicy::BF16)
    );
    // It prints and parses back like a built-in.
    assert_eq!(Recipe::from_toml_str(&r.to_toml()).unwrap(), r);

    // Without a name, the name says where it came from.
    let r = Recipe::from_toml_str("base = \"mxfp8\"\nattention = \"fp32\"\n").unwrap();
    assert_eq!(
        (r.name.as_str(), r.attention),
        ("mxfp8-custom", AttentionPrecision::Fp32)
    );

    // Partial tables merge key by key: switch only Wgrad's X operand off RHT.
    let r = Recipe::from_toml_str(
        "base = \"nvfp4\"\nname = \"x\"\n[linear.wgrad.b]\nrht = \"off\"\n[linear.wgrad.a]\nrht = \"off\"\n",
    )
    .unwrap();
    assert_eq!(r.linear, Recipe::builtin("nvfp4-no-rht").unwrap().linear);
}

#[test]
fn user_recipe_in_full_from_a_file() {
    let text = r#"
name = "mixed"
attention = "bf16"

[linear.fprop]
a = { format = { format = "nvfp4" }, block = "row16", rounding = "nearest-even", rht = "off" }
b = { format = { format = "nvfp4", four_over_six = { error = "mse", e4m3_bound_256 = true } }, block = "tile16", rounding = "nearest-even", rht = "off" }

[linear.dgrad]
a = { format = { format = "fp8", element = "e5m2", scaling = { kind = "delayed", history_len = 1024, margin = 0, algo = "max" } }, block = "row16", rounding = "nearest-even", rht = "off" }
b = { format = { format = "mx", element = "e2m1", rule = "floor", sr_prescale = false }, block = "row32", rounding = "nearest-even", rht = "off" }

[linear.wgrad]
a = { format = { format = "bf16" }, block = "row16", rounding = "stochastic", rht = "off" }
b = { format = { format = "f32" }, block = "row16", rounding = "nearest-even", rht = "off" }

[[overrides]]
blocks = [{ start = 0, end = 2 }, { start = 7, end = 8 }]
kinds = ["attn-qkv"]
policy = "mxfp4"
"#;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mixed.toml");
    std::fs::write(&path, text).unwrap();
    let r = Recipe::resolve(path.to_str().unwrap()).unwrap();
    assert_eq!(r.name, "mixed");
    assert!(matches!(
        r.linear.fprop.b.format,
        QuantFormat::Nvfp4 {
            four_over_six: Some(_)
        }
    ));
    assert_eq!(r.linear.wgrad.a.rounding, RoundingMode::Stochastic);
    assert_eq!(
        r.overrides[0].blocks,
        vec![
            BlockRange { start: 0, end: 2 },
            BlockRange { start: 7, end: 8 }
        ]
    );
    assert_eq!(
        r.policy_for(7, 8, LayerKind::AttnQkv, 0.0),
        Recipe::builtin("mxfp4").unwrap().linear
    );
    assert!(r.schedule.is_none());
    assert_eq!(Recipe::from_toml_str(&r.to_toml()).unwrap(), r);
    assert!(r.linear.to_string().contains("4over6"));
    let e = Recipe::from_file(&dir.path().join("absent.toml")).unwrap_err();
    assert!(matches!(e, RecipeError::Io { .. }));
}

fn parse_err(text: &str) -> String {
    Recipe::from_toml_str(text).unwrap_err().to_string()
}

#[test]
fn invalid_fields_list_what_is_valid() {
    // A field of the recipe itself (serde, deny_unknown_fields).
    let e = parse_err("name = \"x\"\nlinear = \"bf16\"\nshedule = 1\n");
    assert!(
        e.contains("unknown field `shedule`") && e.contains("schedule"),
        "{e}"
    );
    // A field of an override.
    let e =
        parse_err("name = \"x\"\nlinear = \"bf16\"\n[[overrides]]\nfirts = 1\npolicy = \"bf16\"\n");
    assert!(
        e.contains("unknown field `firts`") && e.contains("first"),
        "{e}"
    );
    // A field inside quant's operand settings (which do not deny unknown fields themselves).
    let e = Recipe::from_toml_str(
        "base = \"nvfp4\"\n[linear.fprop.a]\nrounding_mode = \"stochastic\"\n",
    )
    .unwrap_err();
    match &e {
        RecipeError::UnknownField { path, field, known } => {
            assert_eq!(
                (path.as_str(), field.as_str()),
                ("linear.fprop.a", "rounding_mode")
            );
            assert!(
                known.contains("rounding") && known.contains("rht"),
                "{known}"
            );
        }
        other => panic!("{other:?}"),
    }
    let e = parse_err("base = \"nvfp4\"\n[linear.fprop.a.format]\nfour_over_sixx = 1\n");
    assert!(
        e.contains("`four_over_sixx`") && e.contains("four_over_six"),
        "{e}"
    );
    // Enum values list the valid variants.
    let e = parse_err("base = \"nvfp4\"\n[linear.fprop.a]\nrounding = \"down\"\n");
    assert!(
        e.contains("down") && e.contains("nearest-even") && e.contains("stochastic"),
        "{e}"
    );
    let e = parse_err("base = \"nvfp4\"\n[linear.fprop.a.format]\nformat = \"nvfp5\"\n");
    assert!(
        e.contains("nvfp5") && e.contains("nvfp4") && e.contains("bf16"),
        "{e}"
    );
    let e =
        parse_err("base = \"nvfp4\"\n[[overrides]]\nkinds = [\"mlp-gate\"]\npolicy = \"bf16\"\n");
    assert!(
        e.contains("mlp-gate") && e.contains("attn-qkv") && e.contains("lm-head"),
        "{e}"
    );
    // Policy presets.
    let e = parse_err("name = \"x\"\nlinear = \"fp4\"\n");
    assert!(
        e.contains("unknown policy preset 'fp4'")
            && e.contains(&GemmPolicy::PRESET_NAMES.join(", ")),
        "{e}"
    );
    // Unknown bases.
    let e = parse_err("base = \"nvfp5\"\n");
    assert!(e.starts_with("unknown recipe 'nvfp5'; valid: fp32"), "{e}");
    let e = parse_err("base = 3\n");
    assert!(e.contains("`base` must be"), "{e}");
    // Missing fields and bad syntax.
    let e = parse_err("name = \"x\"\n");
    assert!(e.contains("missing field `linear`"), "{e}");
    let e = parse_err("name = \"x\n");
    assert!(e.contains("invalid recipe TOML"), "{e}");
}

#[test]
fn semantically_invalid_recipes_are_rejected() {
    // RHT on a rowwise operand.
    let e = parse_err("base = \"nvfp4\"\n[linear.fprop.a]\nrht = \"fixed-signs\"\n");
    assert!(
        e.contains("linear.fprop.a (X)") && e.contains("columnwise"),
        "{e}"
    );
    // MX with 1x16 blocks.
    let e = parse_err("base = \"mxfp8\"\n[linear.dgrad.b]\nblock = \"row16\"\n");
    assert!(e.contains("linear.dgrad.b (W)"), "{e}");
    // Schedule fraction.
    let e = parse_err("base = \"nvfp4\"\n[schedule]\nswitch_at = 1.5\n");
    assert!(e.contains("switch_at = 1.5"), "{e}");
    // Empty range.
    let e = parse_err(
        "base = \"bf16\"\n[[overrides]]\nblocks = [{ start = 2, end = 2 }]\npolicy = \"fp32\"\n",
    );
    assert!(e.contains("empty range 2..2"), "{e}");
    // RHT on one Wgrad operand only, or random signs: the gradient itself would change.
    let e = parse_err("base = \"nvfp4\"\n[linear.wgrad.b]\nrht = \"off\"\n");
    assert!(e.contains("wgrad") && e.contains("both operands"), "{e}");
    let e = parse_err(
        "base = \"nvfp4\"\n[linear.wgrad.a]\nrht = \"random-signs\"\n[linear.wgrad.b]\nrht = \"random-signs\"\n",
    );
    assert!(e.contains("wgrad") && e.contains("random RHT signs"), "{e}");
    // Every built-in policy preset is valid.
    for name in GemmPolicy::PRESET_NAMES {
        let r = Recipe::from_toml_str(&format!("name = \"p\"\nlinear = \"{name}\"\n")).unwrap();
        r.validate().unwrap();
    }
}

#[test]
fn plans_and_descriptions() {
    let r = Recipe::builtin("nvfp4").unwrap();
    let plan = r.plan(3, 0.0);
    assert_eq!(plan.lines().count(), 3 * 4 + 1);
    assert!(plan.lines().next().unwrap().contains("all bf16"));
    assert!(plan
        .lines()
        .nth(4)
        .unwrap()
        .contains("wgrad[dY nvfp4/1x16/sr/rht, X nvfp4/1x16/rht]"));
    assert!(r.plan(3, 0.9).lines().all(|l| l.ends_with("all bf16")));
    let d = Recipe::builtin("fp8-delayed").unwrap().linear.to_string();
    assert!(
        d.contains("fp8-e4m3/delayed(h16,m0,max)") && d.contains("fp8-e5m2"),
        "{d}"
    );
    let d = Recipe::builtin("mxfp4").unwrap().linear.to_string();
    assert!(d.contains("mxfp4/1x32/floor/x3/4/sr/rht"), "{d}");
}

#[test]
fn readme_user_recipe_parses() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let toml_block = readme
        .split("```toml")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("README has a TOML example");
    let r = Recipe::from_toml_str(toml_block).unwrap();
    assert_eq!(r.name, "nvfp4-2-2");
    assert_eq!(r.linear.wgrad.a.rounding, RoundingMode::NearestEven);
    assert_eq!(r.linear.wgrad.a.rht, Rht::FixedSigns);
    assert_eq!(r.linear.wgrad.b.rht, Rht::FixedSigns);
    assert_eq!(r.policy_for(1, 8, LayerKind::MlpUp, 0.0), GemmPolicy::BF16);
}

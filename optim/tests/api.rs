//! Shapes, hyperparameter validation, groups, parallel/sequential equivalence, clipping, schedules.

use optim::{
    clip_coefficient, clip_grad_norm, grad_norm, AdamW, AdamWConfig, DecayShape, LrSchedule,
    OptimError, ParamGroup, ParamSpec, Sgd, SgdConfig,
};
use proptest::prelude::*;

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn muts(v: &mut [Vec<f32>]) -> Vec<&mut [f32]> {
    v.iter_mut().map(|x| &mut x[..]).collect()
}

fn refs(v: &[Vec<f32>]) -> Vec<&[f32]> {
    v.iter().map(|x| &x[..]).collect()
}

// ---------------------------------------------------------------- shapes and validation

#[test]
fn shape_errors_are_typed_and_leave_everything_unchanged() {
    let specs = [ParamSpec::new(3, 0), ParamSpec::new(2, 0)];
    let mut opt = AdamW::new(AdamWConfig::default(), &specs).unwrap();
    let mut p = vec![vec![1.0f32; 3], vec![1.0f32; 2]];
    let g = vec![vec![1.0f32; 3], vec![1.0f32; 2]];
    let before = opt.save_state();

    let e = opt
        .step(&mut muts(&mut p)[..1], &refs(&g), 0.1)
        .unwrap_err();
    assert_eq!(
        e,
        OptimError::ParamCountMismatch {
            expected: 2,
            got: 1
        }
    );
    let e = opt
        .step(&mut muts(&mut p), &refs(&g)[..1], 0.1)
        .unwrap_err();
    assert_eq!(
        e,
        OptimError::GradCountMismatch {
            expected: 2,
            got: 1
        }
    );
    let short = [vec![1.0f32; 3], vec![1.0f32; 1]];
    let e = opt.step(&mut muts(&mut p), &refs(&short), 0.1).unwrap_err();
    assert_eq!(
        e,
        OptimError::GradLenMismatch {
            index: 1,
            expected: 2,
            got: 1
        }
    );
    let mut long = vec![vec![1.0f32; 4], vec![1.0f32; 2]];
    let e = opt.step(&mut muts(&mut long), &refs(&g), 0.1).unwrap_err();
    assert_eq!(
        e,
        OptimError::ParamLenMismatch {
            index: 0,
            expected: 3,
            got: 4
        }
    );
    for lr in [f32::NAN, -1.0, f32::INFINITY] {
        let e = opt.step(&mut muts(&mut p), &refs(&g), lr).unwrap_err();
        assert!(matches!(
            e,
            OptimError::InvalidHyperparameter { name: "lr", .. }
        ));
        assert!(e.to_string().starts_with("invalid lr = "), "{e}");
    }
    assert_eq!(p, vec![vec![1.0f32; 3], vec![1.0f32; 2]]);
    assert_eq!(opt.save_state(), before);

    let mut sgd = Sgd::new(SgdConfig::default(), &specs).unwrap();
    let e = sgd.step(&mut muts(&mut p), &refs(&short), 0.1).unwrap_err();
    assert_eq!(
        e,
        OptimError::GradLenMismatch {
            index: 1,
            expected: 2,
            got: 1
        }
    );
    assert_eq!(sgd.step_count(), 0);
}

#[test]
fn invalid_construction_is_rejected() {
    let one = [ParamSpec::new(1, 0)];
    let bad = |c: AdamWConfig| AdamW::new(c, &one).unwrap_err();
    let d = AdamWConfig::default();
    for c in [
        AdamWConfig { beta1: 1.0, ..d },
        AdamWConfig { beta2: -0.1, ..d },
        AdamWConfig { eps: f32::NAN, ..d },
        AdamWConfig {
            weight_decay: -1.0,
            ..d
        },
    ] {
        assert!(
            matches!(bad(c), OptimError::InvalidHyperparameter { .. }),
            "{c:?}"
        );
    }
    assert_eq!(
        AdamW::new(d, &[ParamSpec::new(1, 1)]).unwrap_err(),
        OptimError::UnknownGroup {
            index: 0,
            group: 1,
            groups: 1
        }
    );
    assert!(AdamW::with_groups(d, &[], &[]).is_err());
    let g = [ParamGroup::new(0.0, f32::NAN)];
    assert!(AdamW::with_groups(d, &g, &one).is_err());
    for c in [
        SgdConfig {
            nesterov: true,
            ..SgdConfig::default()
        },
        SgdConfig {
            momentum: 0.9,
            dampening: 0.1,
            nesterov: true,
            ..SgdConfig::default()
        },
        SgdConfig {
            momentum: 1.5,
            ..SgdConfig::default()
        },
    ] {
        assert!(Sgd::new(c, &one).is_err(), "{c:?}");
    }
}

#[test]
fn empty_models_and_empty_parameters_are_fine() {
    let mut opt = AdamW::new(AdamWConfig::default(), &[]).unwrap();
    opt.step(&mut [], &[], 1e-3).unwrap();
    let mut opt = AdamW::new(AdamWConfig::default(), &[ParamSpec::new(0, 0)]).unwrap();
    opt.step(&mut [&mut []], &[&[]], 1e-3).unwrap();
    assert_eq!(opt.step_count(), 1);
    assert_eq!(opt.exp_avg(0), Some(&[][..]));
    assert_eq!(opt.exp_avg(1), None);
}

// ---------------------------------------------------------------- AdamW semantics

/// Independent f64 AdamW (textbook form), for comparison at f32 tolerance.
fn adamw_f64(
    p: &mut [f64],
    g: &[f64],
    m: &mut [f64],
    v: &mut [f64],
    t: i32,
    lr: f64,
    c: (f64, f64, f64, f64),
) {
    let (b1, b2, eps, wd) = c;
    for i in 0..p.len() {
        p[i] *= 1.0 - lr * wd;
        m[i] = b1 * m[i] + (1.0 - b1) * g[i];
        v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
        let mhat = m[i] / (1.0 - b1.powi(t));
        let vhat = v[i] / (1.0 - b2.powi(t));
        p[i] -= lr * mhat / (vhat.sqrt() + eps);
    }
}

#[test]
fn adamw_agrees_with_an_f64_reference_for_both_lerp_forms() {
    // beta1 = 0.3 takes PyTorch's other lerp formula (weight 0.7 >= 0.5).
    for beta1 in [0.9f32, 0.3] {
        let cfg = AdamWConfig {
            beta1,
            beta2: 0.99,
            eps: 1e-6,
            weight_decay: 0.05,
        };
        let n = 1000;
        let mut opt = AdamW::new(cfg, &[ParamSpec::new(n, 0)]).unwrap();
        let mut p = values(n, 1);
        let mut p64: Vec<f64> = p.iter().map(|&x| x as f64).collect();
        let (mut m, mut v) = (vec![0.0; n], vec![0.0; n]);
        let c = (beta1 as f64, 0.99f32 as f64, 1e-6f32 as f64, 0.05f32 as f64);
        for t in 1..=20 {
            let g = values(n, 100 + t as u64);
            opt.step(&mut [&mut p[..]], &[&g[..]], 1e-2).unwrap();
            let g64: Vec<f64> = g.iter().map(|&x| x as f64).collect();
            adamw_f64(&mut p64, &g64, &mut m, &mut v, t, 1e-2f32 as f64, c);
        }
        for (a, b) in p.iter().zip(&p64) {
            approx::assert_relative_eq!(*a as f64, *b, max_relative = 1e-5, epsilon = 1e-6);
        }
        for (a, b) in opt.exp_avg(0).unwrap().iter().zip(&m) {
            approx::assert_relative_eq!(*a as f64, *b, max_relative = 1e-5, epsilon = 1e-7);
        }
    }
}

#[test]
fn weight_decay_is_decoupled_and_per_group() {
    // Zero gradients: the Adam term is exactly -0, so only the decay acts.
    let groups = [
        ParamGroup::new(0.1, 1.0),
        ParamGroup::new(0.1, 0.5),
        ParamGroup::new(0.0, 1.0),
    ];
    let specs = [
        ParamSpec::new(4, 0),
        ParamSpec::new(4, 1),
        ParamSpec::new(4, 2),
    ];
    let mut opt = AdamW::with_groups(AdamWConfig::default(), &groups, &specs).unwrap();
    let mut p = vec![values(4, 1), values(4, 1), values(4, 1)];
    let p0 = p.clone();
    let g = vec![vec![0.0f32; 4]; 3];
    opt.step(&mut muts(&mut p), &refs(&g), 0.5).unwrap();
    let lr = 0.5f64;
    let wd = 0.1f32 as f64;
    for i in 0..4 {
        assert_eq!(p[0][i], p0[0][i] * (1.0 - lr * wd) as f32);
        assert_eq!(p[1][i], p0[1][i] * (1.0 - lr * 0.5 * wd) as f32);
        assert_eq!(p[2][i], p0[2][i]);
    }
}

#[test]
fn lr_scale_scales_the_update() {
    // lr_scale 0 freezes a group; the moments still update.
    let groups = [ParamGroup::new(0.0, 1.0), ParamGroup::new(0.1, 0.0)];
    let specs = [ParamSpec::new(8, 0), ParamSpec::new(8, 1)];
    let mut opt = AdamW::with_groups(AdamWConfig::default(), &groups, &specs).unwrap();
    let mut p = vec![values(8, 1), values(8, 2)];
    let p0 = p.clone();
    let g = vec![values(8, 3), values(8, 4)];
    opt.step(&mut muts(&mut p), &refs(&g), 0.1).unwrap();
    assert_eq!(p[1], p0[1]);
    assert_ne!(p[0], p0[0]);
    assert!(opt.exp_avg(1).unwrap().iter().any(|&m| m != 0.0));
    // First Adam step moves each coordinate by lr * sign(g) (up to eps).
    for i in 0..8 {
        let want = p0[0][i] - 0.1 * g[0][i].signum();
        assert!((p[0][i] - want).abs() < 1e-6, "{i}: {} vs {want}", p[0][i]);
    }
}

#[test]
fn fused_clipping_equals_clip_then_step_bitwise() {
    let specs = [ParamSpec::new(50, 0), ParamSpec::new(30, 0)];
    let mut a = AdamW::new(AdamWConfig::default(), &specs).unwrap();
    let mut b = a.clone();
    let mut pa = vec![values(50, 1), values(30, 2)];
    let mut pb = pa.clone();
    for s in 0..4 {
        let mut g: Vec<Vec<f32>> = vec![values(50, 10 + s), values(30, 20 + s)];
        for x in g.iter_mut().flatten() {
            *x *= 0.3 * (s + 1) as f32;
        }
        let coef = clip_coefficient(grad_norm(&refs(&g)), 1.0).unwrap();
        b.step_scaled(&mut muts(&mut pb), &refs(&g), 1e-2, coef)
            .unwrap();
        clip_grad_norm(&mut muts(&mut g), 1.0).unwrap();
        a.step(&mut muts(&mut pa), &refs(&g), 1e-2).unwrap();
        assert_eq!(pa, pb);
    }
    assert_eq!(a.save_state(), b.save_state());
}

fn run_adamw_with_threshold(lens: &[usize], threshold: usize) -> (Vec<Vec<f32>>, Vec<u8>) {
    let specs: Vec<ParamSpec> = lens
        .iter()
        .enumerate()
        .map(|(i, &n)| ParamSpec::new(n, i % 2))
        .collect();
    let groups = [ParamGroup::new(0.1, 1.0), ParamGroup::new(0.0, 0.5)];
    let mut opt = AdamW::with_groups(AdamWConfig::default(), &groups, &specs).unwrap();
    opt.set_parallel_threshold(threshold);
    let mut p: Vec<Vec<f32>> = lens
        .iter()
        .enumerate()
        .map(|(i, &n)| values(n, i as u64))
        .collect();
    for s in 0..3 {
        let g: Vec<Vec<f32>> = lens
            .iter()
            .enumerate()
            .map(|(i, &n)| values(n, 50 + s * 7 + i as u64))
            .collect();
        opt.step(&mut muts(&mut p), &refs(&g), 1e-3).unwrap();
    }
    (p, opt.save_state())
}

#[test]
fn parallel_and_sequential_adamw_are_bit_identical_on_a_large_model() {
    // Above the default threshold, with chunk-boundary-straddling lengths.
    let lens = [300_000, 16 * 1024 + 1, 7];
    let seq = run_adamw_with_threshold(&lens, usize::MAX);
    let par = run_adamw_with_threshold(&lens, 0);
    let default = run_adamw_with_threshold(&lens, 1 << 18);
    assert!(seq == par && seq == default);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn parallel_and_sequential_are_bit_identical(lens in proptest::collection::vec(0usize..40_000, 1..5)) {
        prop_assert!(run_adamw_with_threshold(&lens, usize::MAX) == run_adamw_with_threshold(&lens, 0));
        let specs: Vec<ParamSpec> = lens.iter().map(|&n| ParamSpec::new(n, 0)).collect();
        let cfg = SgdConfig { momentum: 0.9, weight_decay: 0.01, ..SgdConfig::default() };
        let mut seq = Sgd::new(cfg, &specs).unwrap();
        let mut par = seq.clone();
        seq.set_parallel_threshold(usize::MAX);
        par.set_parallel_threshold(0);
        let mut ps: Vec<Vec<f32>> = lens.iter().map(|&n| values(n, 3)).collect();
        let mut pp = ps.clone();
        for s in 0..2 {
            let g: Vec<Vec<f32>> = lens.iter().map(|&n| values(n, 9 + s)).collect();
            seq.step(&mut muts(&mut ps), &refs(&g), 0.1).unwrap();
            par.step(&mut muts(&mut pp), &refs(&g), 0.1).unwrap();
        }
        prop_assert!(ps == pp);
        prop_assert!(seq.save_state() == par.save_state());
    }

    #[test]
    fn grad_norm_matches_f64_and_ignores_partitioning(v in proptest::collection::vec(-1e3f32..1e3, 0..3000), cut in 0usize..3000) {
        let cut = cut.min(v.len());
        let exact = v.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>().sqrt() as f32;
        let whole = grad_norm(&[&v[..]]);
        let split = grad_norm(&[&v[..cut], &v[cut..]]);
        prop_assert!((whole - exact).abs() <= 1e-6 * exact.max(1e-30));
        prop_assert!((split - exact).abs() <= 1e-6 * exact.max(1e-30));
    }
}

// ---------------------------------------------------------------- SGD semantics

#[test]
fn sgd_plain_and_weight_decay() {
    let mut opt = Sgd::new(
        SgdConfig {
            weight_decay: 0.5,
            ..SgdConfig::default()
        },
        &[ParamSpec::new(2, 0)],
    )
    .unwrap();
    let mut p = vec![2.0f32, -4.0];
    opt.step(&mut [&mut p[..]], &[&[1.0, 1.0]], 0.25).unwrap();
    // g + wd*p = [2, -1]; p - 0.25*g
    assert_eq!(p, [1.5, -3.75]);
    assert_eq!(opt.momentum_buffer(0), None);
}

#[test]
fn sgd_nesterov_by_hand() {
    let cfg = SgdConfig {
        momentum: 0.5,
        nesterov: true,
        ..SgdConfig::default()
    };
    let mut opt = Sgd::new(cfg, &[ParamSpec::new(1, 0)]).unwrap();
    let mut p = vec![0.0f32];
    opt.step(&mut [&mut p[..]], &[&[1.0]], 1.0).unwrap(); // buf 1, d = 1 + 0.5 = 1.5
    assert_eq!(p, [-1.5]);
    opt.step(&mut [&mut p[..]], &[&[1.0]], 1.0).unwrap(); // buf 1.5, d = 1 + 0.75
    assert_eq!(p, [-3.25]);
    assert_eq!(opt.momentum_buffer(0), Some(&[1.5f32][..]));
}

// ---------------------------------------------------------------- clipping

#[test]
fn clipping_scales_to_max_norm_and_returns_the_pre_clip_norm() {
    let mut g = vec![vec![3.0f32, 0.0], vec![4.0f32]];
    let norm = clip_grad_norm(&mut muts(&mut g), 2.0).unwrap();
    assert_eq!(norm, 5.0);
    let coef = (1.0f32 / (5.0 + 1e-6)) * 2.0;
    assert_eq!(g, vec![vec![3.0 * coef, 0.0], vec![4.0 * coef]]);
    assert!((grad_norm(&refs(&g)) - 2.0).abs() < 1e-6);

    // below the threshold: untouched
    let mut h = vec![vec![0.3f32, -0.4]];
    assert_eq!(clip_grad_norm(&mut muts(&mut h), 1.0).unwrap(), 0.5);
    assert_eq!(h, vec![vec![0.3f32, -0.4]]);
}

#[test]
fn non_finite_norms_are_errors_and_leave_gradients_alone() {
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut g = vec![vec![1.0f32, bad], vec![2.0f32]];
        let e = clip_grad_norm(&mut muts(&mut g), 1.0).unwrap_err();
        match e {
            OptimError::NonFiniteGradNorm { norm } => assert!(!norm.is_finite()),
            other => panic!("{other:?}"),
        }
        assert_eq!(g[0][0], 1.0);
        assert_eq!(g[1][0], 2.0);
    }
    // Large but finite values do not overflow the f64 accumulator.
    let big = [f32::MAX; 4];
    assert_eq!(grad_norm(&[&big[..]]), f32::INFINITY); // 2 * f32::MAX is not an f32
    let big = vec![1e30f32; 1000];
    assert!((grad_norm(&[&big[..]]) / 1e30 - 1000f32.sqrt()).abs() < 1e-4);
    for max_norm in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        assert!(matches!(
            clip_grad_norm(&mut [], max_norm),
            Err(OptimError::InvalidHyperparameter {
                name: "max_norm",
                ..
            })
        ));
    }
    assert_eq!(clip_grad_norm(&mut [], 1.0), Ok(0.0));
}

#[test]
fn large_gradients_take_the_parallel_path_deterministically() {
    let g: Vec<Vec<f32>> = vec![values(700_000, 1), values(123_457, 2)];
    let exact = g
        .iter()
        .flatten()
        .map(|&x| (x as f64) * (x as f64))
        .sum::<f64>()
        .sqrt() as f32;
    let n1 = grad_norm(&refs(&g));
    let n2 = grad_norm(&refs(&g));
    assert_eq!(n1.to_bits(), n2.to_bits());
    assert!((n1 - exact).abs() <= 1e-6 * exact);
    let mut c = g.clone();
    let norm = clip_grad_norm(&mut muts(&mut c), 1.0).unwrap();
    assert_eq!(norm, n1);
    let coef = clip_coefficient(norm, 1.0).unwrap();
    assert!(c
        .iter()
        .flatten()
        .zip(g.iter().flatten())
        .all(|(a, b)| *a == *b * coef));
}

// ---------------------------------------------------------------- schedules

#[test]
fn warmup_cosine_key_steps() {
    // Peak and min are exact binary fractions so that the expected values can be written down.
    let s = LrSchedule::warmup_cosine(1.0, 0.125, 8, 108).unwrap();
    assert_eq!(s.lr(0), 0.125); // (0+1)/8 of peak
    assert_eq!(s.lr(3), 0.5);
    assert_eq!(s.lr(7), 1.0); // peak at the last warmup step
    assert_eq!(s.lr(8), 1.0); // decay starts at progress 0
    assert_eq!(s.lr(58), 0.5625); // half way: (peak + min) / 2
    let quarter = 0.125 + 0.875 * 0.5 * (1.0 + std::f64::consts::FRAC_1_SQRT_2);
    assert_eq!(s.lr(33), quarter as f32);
    assert_eq!(s.lr(108), 0.125);
    assert_eq!(s.lr(u64::MAX), 0.125);
    for t in 8..108 {
        assert!(s.lr(t + 1) <= s.lr(t));
    }
    // Realistic values: f64 arithmetic on the f32 inputs, one rounding.
    let s = LrSchedule::warmup_cosine(3e-4, 3e-5, 2000, 100_000).unwrap();
    assert_eq!(s.lr(999), (3e-4f32 as f64 * 0.5) as f32);
    assert_eq!(s.lr(1999), 3e-4);
    assert_eq!(
        s.lr(51_000),
        ((3e-4f32 as f64 + 3e-5f32 as f64) / 2.0) as f32
    );
    assert_eq!(s.lr(100_000), 3e-5);
    // No warmup: starts at the peak.
    let s = LrSchedule::warmup_cosine(2.0, 0.0, 0, 4).unwrap();
    assert_eq!([s.lr(0), s.lr(2), s.lr(4)], [2.0, 1.0, 0.0]);
}

#[test]
fn wsd_key_steps_for_each_shape() {
    for (shape, mid) in [
        (DecayShape::Linear, 0.5),
        (DecayShape::Cosine, 0.5),
        (DecayShape::Sqrt, 1.0 - 0.5f64.sqrt()),
    ] {
        let s = LrSchedule::wsd(1.0, 0.0, 4, 100, 1000, shape).unwrap();
        assert_eq!(s.lr(0), 0.25);
        assert_eq!(s.lr(3), 1.0);
        assert_eq!(s.lr(4), 1.0);
        assert_eq!(s.lr(900), 1.0, "{shape:?}: decay starts at progress 0");
        assert_eq!(s.lr(950), mid as f32, "{shape:?}");
        assert_eq!(s.lr(1000), 0.0);
        assert!(s.lr(999) > 0.0 && s.lr(999) < 0.1);
        for t in 4..1000 {
            assert!(s.lr(t + 1) <= s.lr(t), "{shape:?} not monotone at {t}");
        }
    }
    let s = LrSchedule::wsd(1e-3, 1e-5, 0, 10, 20, DecayShape::Linear).unwrap();
    assert_eq!(s.lr(0), 1e-3);
    assert_eq!(s.lr(15), ((1e-3f32 as f64 + 1e-5f32 as f64) / 2.0) as f32);
    assert_eq!(s.lr(20), 1e-5);
}

#[test]
fn schedules_validate_and_never_panic() {
    assert!(LrSchedule::warmup_cosine(1e-3, 1e-2, 0, 10).is_err()); // min > peak
    assert!(LrSchedule::warmup_cosine(1e-3, 0.0, 11, 10).is_err());
    assert!(LrSchedule::wsd(1e-3, 0.0, 6, 5, 10, DecayShape::Cosine).is_err());
    assert!(LrSchedule::wsd(1e-3, 0.0, u64::MAX, 5, 10, DecayShape::Cosine).is_err());
    assert!(LrSchedule::constant(f32::NAN).is_err());
    assert_eq!(LrSchedule::constant(3e-4).unwrap().lr(12345), 3e-4);
    // Unvalidated nonsense still yields a number.
    let weird = [
        LrSchedule::WarmupCosine {
            peak_lr: 1.0,
            min_lr: 0.0,
            warmup_steps: 50,
            total_steps: 10,
        },
        LrSchedule::Wsd {
            peak_lr: 1.0,
            min_lr: 0.0,
            warmup_steps: 8,
            decay_steps: 8,
            total_steps: 10,
            shape: DecayShape::Sqrt,
        },
        LrSchedule::WarmupCosine {
            peak_lr: 1.0,
            min_lr: 0.0,
            warmup_steps: 0,
            total_steps: 0,
        },
    ];
    for s in weird {
        for t in [0, 5, 9, 10, 11, 100, u64::MAX] {
            let _ = s.lr(t);
        }
    }
}

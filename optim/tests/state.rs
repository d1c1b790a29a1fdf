//! Save/load: exact resume, and typed errors (never panics) for corrupt or mismatched state.

use optim::{
    crc32, AdamW, AdamWConfig, OptimError, ParamGroup, ParamSpec, Sgd, SgdConfig, StateError,
};
use proptest::prelude::*;

const LENS: [usize; 3] = [37, 8, 100];

fn specs() -> Vec<ParamSpec> {
    vec![
        ParamSpec::new(LENS[0], 0),
        ParamSpec::new(LENS[1], 1),
        ParamSpec::new(LENS[2], 0),
    ]
}

fn groups() -> Vec<ParamGroup> {
    vec![ParamGroup::new(0.1, 1.0), ParamGroup::new(0.0, 0.5)]
}

fn cfg() -> AdamWConfig {
    AdamWConfig {
        beta2: 0.95,
        ..AdamWConfig::default()
    }
}

/// Deterministic pseudo-random values in [-1, 1).
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

fn params() -> Vec<Vec<f32>> {
    LENS.iter()
        .enumerate()
        .map(|(i, &n)| values(n, i as u64 + 1))
        .collect()
}

fn grads(step: u64) -> Vec<Vec<f32>> {
    LENS.iter()
        .enumerate()
        .map(|(i, &n)| values(n, 1000 * step + i as u64))
        .collect()
}

fn adamw_steps(opt: &mut AdamW, p: &mut [Vec<f32>], from: u64, to: u64) {
    for s in from..to {
        let g = grads(s);
        let g: Vec<&[f32]> = g.iter().map(|x| &x[..]).collect();
        let mut pr: Vec<&mut [f32]> = p.iter_mut().map(|x| &mut x[..]).collect();
        opt.step(&mut pr, &g, 1e-2 * (s + 1) as f32).unwrap();
    }
}

fn sgd_steps(opt: &mut Sgd, p: &mut [Vec<f32>], from: u64, to: u64) {
    for s in from..to {
        let g = grads(s);
        let g: Vec<&[f32]> = g.iter().map(|x| &x[..]).collect();
        let mut pr: Vec<&mut [f32]> = p.iter_mut().map(|x| &mut x[..]).collect();
        opt.step(&mut pr, &g, 0.1).unwrap();
    }
}

fn bits(v: &[Vec<f32>]) -> Vec<Vec<u32>> {
    v.iter()
        .map(|x| x.iter().map(|f| f.to_bits()).collect())
        .collect()
}

fn adamw_state_bits(o: &AdamW) -> Vec<Vec<u32>> {
    (0..LENS.len())
        .flat_map(|i| [o.exp_avg(i).unwrap(), o.exp_avg_sq(i).unwrap()])
        .map(|s| s.iter().map(|f| f.to_bits()).collect())
        .collect()
}

#[test]
fn adamw_resume_is_bit_identical() {
    for threshold in [usize::MAX, 0] {
        let mut a = AdamW::with_groups(cfg(), &groups(), &specs()).unwrap();
        a.set_parallel_threshold(threshold);
        let mut pa = params();
        adamw_steps(&mut a, &mut pa, 0, 3);
        let saved = a.save_state();
        let mut pb = pa.clone(); // parameters are checkpointed by the caller

        let mut b = AdamW::with_groups(cfg(), &groups(), &specs()).unwrap();
        b.load_state(&saved).unwrap();
        let mut c = AdamW::from_state(&saved).unwrap();
        let mut pc = pa.clone();
        assert_eq!((b.step_count(), c.step_count()), (3, 3));

        adamw_steps(&mut a, &mut pa, 3, 7);
        adamw_steps(&mut b, &mut pb, 3, 7);
        adamw_steps(&mut c, &mut pc, 3, 7);
        assert_eq!(bits(&pa), bits(&pb));
        assert_eq!(bits(&pa), bits(&pc));
        assert_eq!(adamw_state_bits(&a), adamw_state_bits(&b));
        assert_eq!(adamw_state_bits(&a), adamw_state_bits(&c));
        assert_eq!(a.save_state(), b.save_state());
        assert_eq!(a.save_state(), c.save_state());
    }
}

#[test]
fn sgd_resume_is_bit_identical() {
    let configs = [
        SgdConfig::default(),
        SgdConfig {
            momentum: 0.9,
            dampening: 0.1,
            weight_decay: 0.01,
            nesterov: false,
        },
        SgdConfig {
            momentum: 0.9,
            nesterov: true,
            ..SgdConfig::default()
        },
    ];
    for cfg in configs {
        let mut a = Sgd::with_groups(cfg, &groups(), &specs()).unwrap();
        let mut pa = params();
        sgd_steps(&mut a, &mut pa, 0, 2);
        let saved = a.save_state();
        let mut b = Sgd::with_groups(cfg, &groups(), &specs()).unwrap();
        b.load_state(&saved).unwrap();
        let mut pb = pa.clone();
        sgd_steps(&mut a, &mut pa, 2, 5);
        sgd_steps(&mut b, &mut pb, 2, 5);
        assert_eq!(bits(&pa), bits(&pb), "{cfg:?}");
        assert_eq!(a.save_state(), b.save_state());
        assert_eq!(Sgd::from_state(&saved).unwrap().save_state(), saved);
    }
}

#[test]
fn fresh_state_round_trips() {
    let a = AdamW::with_groups(cfg(), &groups(), &specs()).unwrap();
    let saved = a.save_state();
    assert_eq!(saved.len(), 24 + (16 + 4 + 16 + 8 + 36 + 8 + 145 * 8) + 4);
    assert_eq!(AdamW::from_state(&saved).unwrap().save_state(), saved);
    let empty = AdamW::new(cfg(), &[]).unwrap();
    assert_eq!(
        AdamW::from_state(&empty.save_state()).unwrap().step_count(),
        0
    );
}

fn saved_adamw() -> Vec<u8> {
    let mut a = AdamW::with_groups(cfg(), &groups(), &specs()).unwrap();
    adamw_steps(&mut a, &mut params(), 0, 2);
    a.save_state()
}

fn state_err(r: Result<(), OptimError>) -> StateError {
    match r {
        Err(OptimError::State(e)) => e,
        other => panic!("expected a state error, got {other:?}"),
    }
}

#[test]
fn every_single_byte_corruption_is_detected() {
    let saved = saved_adamw();
    let mut opt = AdamW::with_groups(cfg(), &groups(), &specs()).unwrap();
    let before = opt.save_state();
    for i in 0..saved.len() {
        for flip in [0x01u8, 0x80, 0xff] {
            let mut b = saved.clone();
            b[i] ^= flip;
            let e = state_err(opt.load_state(&b));
            let expected = match i {
                0..=7 => matches!(e, StateError::BadMagic),
                8..=11 => matches!(e, StateError::UnsupportedVersion { .. }),
                16..=23 => matches!(
                    e,
                    StateError::Truncated { .. }
                        | StateError::TrailingBytes { .. }
                        | StateError::Malformed(_)
                ),
                _ => matches!(e, StateError::ChecksumMismatch { .. }),
            };
            assert!(expected, "byte {i} ^ {flip:#x}: {e:?}");
        }
    }
    assert_eq!(
        opt.save_state(),
        before,
        "failed loads must not modify the optimizer"
    );
}

#[test]
fn truncation_and_extension_are_detected() {
    let saved = saved_adamw();
    for n in 0..saved.len() {
        assert!(AdamW::from_state(&saved[..n]).is_err(), "truncated to {n}");
    }
    let mut longer = saved.clone();
    longer.push(0);
    assert_eq!(
        AdamW::from_state(&longer).unwrap_err(),
        OptimError::State(StateError::TrailingBytes { extra: 1 })
    );
    assert_eq!(
        AdamW::from_state(b"definitely not a state").unwrap_err(),
        OptimError::State(StateError::BadMagic)
    );
    assert_eq!(
        AdamW::from_state(&[]).unwrap_err(),
        OptimError::State(StateError::Truncated {
            needed: 16,
            available: 0
        })
    );
}

/// Rewrites payload bytes and fixes up the checksum, to reach the payload checks.
fn with_payload_edit(saved: &[u8], edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut b = saved[..saved.len() - 4].to_vec();
    edit(&mut b);
    let len = (b.len() - 24) as u64;
    b[16..24].copy_from_slice(&len.to_le_bytes());
    let crc = crc32(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

#[test]
fn malformed_payloads_with_valid_checksums_are_rejected() {
    let saved = saved_adamw();
    // payload: 16 bytes config, u32 n_groups at 24+16 = 40, groups 16 bytes, u64 n_params at 60,
    // first param len at 68.
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "huge parameter length",
            with_payload_edit(&saved, |b| {
                b[68..76].copy_from_slice(&u64::MAX.to_le_bytes())
            }),
        ),
        (
            "length larger than the moments",
            with_payload_edit(&saved, |b| {
                b[68..76].copy_from_slice(&1_000_000u64.to_le_bytes())
            }),
        ),
        (
            "huge parameter count",
            with_payload_edit(&saved, |b| {
                b[60..68].copy_from_slice(&u64::MAX.to_le_bytes())
            }),
        ),
        (
            "zero groups",
            with_payload_edit(&saved, |b| b[40..44].copy_from_slice(&0u32.to_le_bytes())),
        ),
        (
            "missing group",
            with_payload_edit(&saved, |b| b[76..80].copy_from_slice(&7u32.to_le_bytes())),
        ),
        (
            "beta1 = 1",
            with_payload_edit(&saved, |b| {
                b[24..28].copy_from_slice(&1.0f32.to_bits().to_le_bytes())
            }),
        ),
        (
            "extra payload byte",
            with_payload_edit(&saved, |b| b.push(0)),
        ),
        (
            "missing payload byte",
            with_payload_edit(&saved, |b| {
                b.pop();
            }),
        ),
    ];
    for (what, bytes) in cases {
        match AdamW::from_state(&bytes) {
            Err(OptimError::State(StateError::Malformed(_))) => {}
            other => panic!("{what}: {other:?}"),
        }
    }
}

#[test]
fn mismatched_state_is_rejected_with_a_typed_error() {
    let saved = saved_adamw();

    let mut other_layout = AdamW::with_groups(cfg(), &groups(), &specs()[..2]).unwrap();
    assert!(matches!(
        state_err(other_layout.load_state(&saved)),
        StateError::LayoutMismatch(_)
    ));
    let mut swapped = specs();
    swapped[0].group = 1;
    let mut other_groups_ids = AdamW::with_groups(cfg(), &groups(), &swapped).unwrap();
    assert!(matches!(
        state_err(other_groups_ids.load_state(&saved)),
        StateError::LayoutMismatch(_)
    ));

    let other_cfg = AdamWConfig {
        beta2: 0.999,
        ..cfg()
    };
    let mut o = AdamW::with_groups(other_cfg, &groups(), &specs()).unwrap();
    assert!(matches!(
        state_err(o.load_state(&saved)),
        StateError::ConfigMismatch(_)
    ));

    let mut g = groups();
    g[1].lr_scale = 1.0;
    let mut o = AdamW::with_groups(cfg(), &g, &specs()).unwrap();
    assert!(matches!(
        state_err(o.load_state(&saved)),
        StateError::ConfigMismatch(_)
    ));
    assert_eq!(o.step_count(), 0);

    let mut sgd = Sgd::with_groups(SgdConfig::default(), &groups(), &specs()).unwrap();
    assert_eq!(
        state_err(sgd.load_state(&saved)),
        StateError::WrongKind {
            expected: "SGD",
            found: 1
        }
    );
    let sgd_state = sgd.save_state();
    assert_eq!(
        AdamW::from_state(&sgd_state).unwrap_err(),
        OptimError::State(StateError::WrongKind {
            expected: "AdamW",
            found: 2
        })
    );

    let mut v2 = saved.clone();
    v2[8] = 2;
    assert_eq!(
        AdamW::from_state(&v2).unwrap_err(),
        OptimError::State(StateError::UnsupportedVersion {
            found: 2,
            supported: 1
        })
    );
}

#[test]
fn crc32_matches_zlib() {
    assert_eq!(crc32(b""), 0);
    assert_eq!(crc32(b"a"), 0xE8B7_BE43);
    assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    assert_eq!(
        crc32(b"The quick brown fox jumps over the lazy dog"),
        0x414F_A339
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = AdamW::from_state(&bytes);
        let _ = Sgd::from_state(&bytes);
    }

    #[test]
    fn random_edits_of_a_valid_state_are_errors(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..4),
    ) {
        let saved = saved_adamw();
        let mut b = saved.clone();
        for (i, x) in &edits {
            let at = i.index(b.len());
            b[at] ^= x;
        }
        if b != saved {
            prop_assert!(AdamW::from_state(&b).is_err());
        }
    }
}

/// Inputs per harness of the checksum-forging fuzzer below (reported in the README).
const FORGED_CASES: u32 = 2048;

/// `bytes` with its trailing CRC-32 recomputed, so that a corruption reaches the parser.
fn reseal(mut b: Vec<u8>) -> Vec<u8> {
    if b.len() >= 4 {
        let body = b.len() - 4;
        let crc = crc32(&b[..body]);
        b[body..].copy_from_slice(&crc.to_le_bytes());
    }
    b
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(FORGED_CASES))]

    /// Issue #13: corrupt optimizer state with a valid checksum (edits, insertions,
    /// deletions, a forged payload length) is a typed error or a consistent state, never a
    /// panic or a huge allocation; `load_state` into the original layout leaves the
    /// optimizer usable either way.
    #[test]
    fn forged_checksums_never_panic(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..6),
        len_field in proptest::option::of(any::<u64>()),
    ) {
        let saved = saved_adamw();
        let mut b = saved.clone();
        for (i, x, kind) in &edits {
            let at = i.index(b.len().max(1));
            match kind {
                0 if at < b.len() => b[at] ^= x | 1,
                1 => b.insert(at.min(b.len()), *x),
                _ if at < b.len() => { b.remove(at); }
                _ => {}
            }
        }
        if let (Some(len), true) = (len_field, b.len() >= 24) {
            b[16..24].copy_from_slice(&len.to_le_bytes());
        }
        let b = reseal(b);
        let _ = Sgd::from_state(&b);
        if let Ok(a) = AdamW::from_state(&b) {
            // a state that parses describes itself consistently
            let again = a.save_state();
            prop_assert_eq!(AdamW::from_state(&again).unwrap().save_state(), again);
        }
        let mut a = AdamW::with_groups(cfg(), &groups(), &specs()).unwrap();
        let before = a.save_state();
        if a.load_state(&b).is_err() {
            prop_assert_eq!(a.save_state(), before);
        }
        adamw_steps(&mut a, &mut params(), 2, 3);
    }
}

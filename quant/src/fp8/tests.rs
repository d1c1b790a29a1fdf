//! The fused FP8 cast ([`super::fast`]) against the encoder path (scale into a buffer,
//! encode with fp-formats' encoders, decode the codes), bit for bit: values, codes, the
//! per-tensor factor, the clipped count and the [`QuantState`] afterwards, for E4M3 and
//! E5M2, current (with and without power-of-two scales) and delayed scaling over several
//! steps, RNE and SR, both usages, odd shapes, ±0, f32 subnormals, FP8 subnormal results,
//! clipping, NaN and ±Inf, on 1 and 2 threads, in the baseline and the widest vector build
//! this CPU runs (AVX-512 or AVX2). The element rounding itself is the shared
//! [`crate::grid`] code, checked exhaustively in `mx/fast.rs`; here its FP8 NaN handling and
//! code emission are checked element-wise too.

use super::*;
use fp_formats::{Overflow, Rounding};

// ---------------------------------------------------------------------------------------
// The encoder path (the reference): scale into a buffer, fp-formats' encoders, decode.
// ---------------------------------------------------------------------------------------

/// Picks the scale (current or delayed) and records the amax.
fn encoder_prepare(
    x: &[f32],
    rows: usize,
    cols: usize,
    q: &OperandQuant,
    key: RngKey,
    state: &mut QuantState,
) -> Result<(Cast, f32), QuantError> {
    panel::check_len(x, rows, cols)?;
    let (element, scaling) = settings(q)?;
    let amax = tensor_amax(x);
    let scale = match scaling {
        Fp8Scaling::Current { power_of_two } => {
            compute_scale_from_amax(amax, fp8_max(element), power_of_two)
        }
        Fp8Scaling::Delayed { history_len, .. } => {
            state.ensure_history(history_len)?;
            let s = state.scale;
            state.record_amax(amax);
            s
        }
    };
    state.last_amax = amax;
    state.last_scale = scale;
    let sr = (q.rounding == RoundingMode::Stochastic).then_some(key);
    Ok((Cast { element, scale, sr }, amax))
}

fn fp_formats_encode(element: Fp8Element, y: f32, r: Option<u8>) -> u8 {
    match (element, r) {
        (Fp8Element::E4M3, None) => E4M3::encode_rne_sat(y),
        (Fp8Element::E5M2, None) => E5M2::from_f32_rne_sat(y).0,
        (Fp8Element::E4M3, Some(r)) => {
            E4M3::from_f32(y, Rounding::Stochastic(r), Overflow::Saturate).0
        }
        (Fp8Element::E5M2, Some(r)) => {
            E5M2::from_f32(y, Rounding::Stochastic(r), Overflow::Saturate).0
        }
    }
}

/// Casts one contiguous run of stored elements into `codes`; returns the clipped count.
fn encoder_cast_run(c: &Cast, src: &[f32], rbits: Option<&[u8]>, codes: &mut [u8]) -> usize {
    let max = fp8_max(c.element);
    let scale = c.scale;
    let mut clipped = 0usize;
    match rbits {
        None => {
            let mut ys = [0.0f32; 512];
            for (o, v) in codes.chunks_mut(512).zip(src.chunks(512)) {
                let ys = &mut ys[..v.len()];
                for (y, &v) in ys.iter_mut().zip(v) {
                    *y = v * scale;
                    clipped += (y.abs() > max) as usize;
                }
                match c.element {
                    Fp8Element::E4M3 => E4M3::encode_slice_rne_sat(ys, o),
                    Fp8Element::E5M2 => E5M2::encode_slice_rne_sat(ys, o),
                }
            }
        }
        Some(rb) => {
            for ((o, &v), &r) in codes.iter_mut().zip(src).zip(rb) {
                let y = v * scale;
                clipped += (y.abs() > max) as usize;
                *o = fp_formats_encode(c.element, y, Some(r));
            }
        }
    }
    clipped
}

/// The encoder cast over the stored layout: codes, and (with `values`) the decoded codes.
fn encoder_cast_tensor(
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    c: &Cast,
    codes: &mut [u8],
    values: Option<&mut [f32]>,
) -> usize {
    let (srows, scols) = stored_shape(rows, cols, usage);
    if srows == 0 || scols == 0 {
        return 0;
    }
    let p = panel::panel_rows_for(scols, usage);
    let clipped = codes
        .par_chunks_mut(p * scols)
        .enumerate()
        .map(|(pi, o)| {
            let (r0, n) = (pi * p, o.len() / scols);
            with_scratch(|s| {
                let rb = c.sr.map(|key| {
                    let rb = grow(&mut s.rbits, n * scols);
                    crate::philox::fill_random_bytes(key, (r0 * scols) as u64, rb);
                    &*rb
                });
                let src = stored_panel(x, rows, cols, usage, r0, n, &mut s.panel);
                encoder_cast_run(c, src, rb, o)
            })
        })
        .sum();
    if let Some(v) = values {
        match c.element {
            Fp8Element::E4M3 => E4M3::decode_slice(codes, v),
            Fp8Element::E5M2 => E5M2::decode_slice(codes, v),
        }
    }
    clipped
}

/// What one cast gave: codes, values (without the factor), factor, amax, clipped count.
struct Result8 {
    codes: Vec<u8>,
    values: Vec<f32>,
    factor: f32,
    amax: f32,
    clipped: usize,
}

fn encoder_path(
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    q: &OperandQuant,
    key: RngKey,
    state: &mut QuantState,
) -> Result<Result8, QuantError> {
    let (c, amax) = encoder_prepare(x, rows, cols, q, key, state)?;
    let mut codes = vec![0u8; x.len()];
    let mut values = vec![0.0f32; x.len()];
    let clipped = encoder_cast_tensor(x, rows, cols, usage, &c, &mut codes, Some(&mut values));
    Ok(Result8 {
        codes,
        values,
        factor: 1.0 / c.scale,
        amax,
        clipped,
    })
}

/// The fused paths: `fake_impl` for the values and clipped count, `quantize_impl` for the
/// codes, amax and factor, each with its own copy of `state` (which must end equal).
#[allow(clippy::too_many_arguments)]
fn fused_path(
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    q: &OperandQuant,
    key: RngKey,
    state: &mut QuantState,
    portable: bool,
) -> Result<Result8, QuantError> {
    let mut s2 = state.clone();
    let mut values = vec![0.0f32; x.len()];
    let qz = Quantizer::new(*q, usage)?.with_key(key);
    let xm = MatRef::new(x, rows, cols)?;
    let (factor, clipped) = fake_impl(&qz, xm, state, &mut values, portable)?;
    let t = quantize_impl(&qz, xm, &mut s2, portable)?;
    assert!(
        same_state(state, &s2),
        "state after fake {state:?} vs quantize {s2:?}"
    );
    assert_eq!(t.tensor_scale_inv.to_bits(), factor.to_bits());
    Ok(Result8 {
        codes: t.codes,
        values,
        factor,
        amax: t.amax,
        clipped,
    })
}

/// Bitwise state equality (NaN scales compare equal to themselves).
fn same_state(a: &QuantState, b: &QuantState) -> bool {
    let bits = |s: &QuantState| {
        let mut v: Vec<u32> = s.amax_history.iter().map(|x| x.to_bits()).collect();
        v.extend([s.scale, s.scale_inv, s.last_amax, s.last_scale].map(f32::to_bits));
        v
    };
    bits(a) == bits(b)
}

/// First index where two f32 slices differ in bits.
fn first_diff(a: &[f32], b: &[f32]) -> Option<usize> {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .position(|(x, y)| x.to_bits() != y.to_bits())
}

fn assert_same(want: &Result8, got: &Result8, what: &str) {
    if let Some(i) = first_diff(&want.values, &got.values) {
        panic!(
            "{what}: value {i}: encoder {:e} ({:#010x}), fused {:e} ({:#010x})",
            want.values[i],
            want.values[i].to_bits(),
            got.values[i],
            got.values[i].to_bits()
        );
    }
    if let Some(i) = want.codes.iter().zip(&got.codes).position(|(a, b)| a != b) {
        panic!(
            "{what}: code {i}: encoder {:#04x}, fused {:#04x}",
            want.codes[i], got.codes[i]
        );
    }
    assert_eq!(
        want.factor.to_bits(),
        got.factor.to_bits(),
        "{what}: factor"
    );
    assert_eq!(want.amax.to_bits(), got.amax.to_bits(), "{what}: amax");
    assert_eq!(want.clipped, got.clipped, "{what}: clipped");
}

// ---------------------------------------------------------------------------------------
// Data and configurations
// ---------------------------------------------------------------------------------------

/// Test data: ±0, f32 subnormals, `m · 2^e` (grid points and ties after a power-of-two
/// scale), magnitudes that give FP8 subnormal results or round to zero, ordinary values;
/// `wild` adds outliers (clipping under a stale delayed scale), NaN (several payloads) and
/// ±Inf; `gain` multiplies everything (a step's magnitude).
fn data(n: usize, seed: u64, wild: bool, gain: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            let v = match (s >> 8) % 19 {
                0 => 0.0,
                1 => -0.0,
                2 => f32::from_bits((s >> 12) as u32 & 0x807F_FFFF),
                3 | 4 => {
                    let m = ((s >> 16) % 64) as f32 + 1.0;
                    let e = ((s >> 24) % 40) as i32 - 30;
                    let sign = if (s >> 30) & 1 == 1 { -1.0 } else { 1.0 };
                    sign * m * 2f32.powi(e)
                }
                5 | 6 => u * 10f32.powi(-(((s >> 20) % 9) as i32 + 2)),
                7 if wild => [f32::NAN, -f32::NAN, f32::from_bits(0x7F80_0001)][i % 3],
                8 if wild && i % 5 == 0 => [f32::INFINITY, f32::NEG_INFINITY][i % 2],
                9 if wild => u * 3e5,
                _ => u * 8.0,
            };
            v * gain
        })
        .collect()
}

fn fp8_q(element: Fp8Element, scaling: Fp8Scaling, sr: bool) -> OperandQuant {
    OperandQuant {
        format: QuantFormat::Fp8 { element, scaling },
        rounding: if sr {
            RoundingMode::Stochastic
        } else {
            RoundingMode::NearestEven
        },
        ..OperandQuant::F32
    }
}

/// Odd shapes (including several panels, chunk tails, empty tensors).
const SHAPES: [(usize, usize); 7] = [
    (1, 1),
    (3, 5),
    (37, 129),
    (64, 64),
    (300, 517),
    (0, 7),
    (5, 0),
];

const KEY: RngKey = RngKey {
    seed: 7,
    stream: 0x5EED,
};

/// Runs `f` on rayon pools of 1 and 2 threads.
fn on_pools(mut f: impl FnMut(usize) + Send) {
    for threads in [1, 2] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| f(threads));
    }
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

/// Current scaling (plain and power-of-two scales), RNE and SR, both usages and builds:
/// the fused fake and codes paths equal the encoder path bit for bit.
#[test]
fn current_scaling_fused_equals_encoder_path() {
    on_pools(|threads| {
        for (si, &(rows, cols)) in SHAPES.iter().enumerate() {
            for (di, wild) in [false, true].into_iter().enumerate() {
                let x = data(rows * cols, (si * 2 + di) as u64 + 1, wild, 1.0);
                for element in [Fp8Element::E4M3, Fp8Element::E5M2] {
                    for power_of_two in [false, true] {
                        for sr in [false, true] {
                            let q = fp8_q(element, Fp8Scaling::Current { power_of_two }, sr);
                            for usage in [Usage::Rowwise, Usage::Columnwise] {
                                let mut s0 = QuantState::new();
                                let want =
                                    encoder_path(&x, rows, cols, usage, &q, KEY, &mut s0).unwrap();
                                for portable in [false, true] {
                                    let what = format!(
                                        "{element:?} p2={power_of_two} sr={sr} {usage:?} \
                                         [{rows},{cols}] wild={wild} portable={portable} \
                                         {threads}t"
                                    );
                                    let mut s1 = QuantState::new();
                                    let got = fused_path(
                                        &x, rows, cols, usage, &q, KEY, &mut s1, portable,
                                    )
                                    .unwrap();
                                    assert_same(&want, &got, &what);
                                    assert!(same_state(&s0, &s1), "{what}: state");
                                }
                            }
                        }
                    }
                }
            }
        }
    });
}

/// Delayed scaling over several steps (several casts per step, both usages, end of step
/// in between): same values, codes, clipped counts (a stale scale clips), amaxes and
/// states as the encoder path, including steps with NaN / ±Inf input (the scale is kept) and
/// a step whose magnitude collapses.
#[test]
fn delayed_scaling_fused_equals_encoder_path_across_steps() {
    let gains = [1.0f32, 40.0, 0.01, 1.0, 1e-7, 3.0];
    on_pools(|threads| {
        for element in [Fp8Element::E4M3, Fp8Element::E5M2] {
            for (history_len, margin, algo) in [
                (3, 0, AmaxAlgo::Max),
                (1, 1, AmaxAlgo::MostRecent),
                (4, -2, AmaxAlgo::Max),
            ] {
                let scaling = Fp8Scaling::Delayed {
                    history_len,
                    margin,
                    algo,
                };
                for sr in [false, true] {
                    let q = fp8_q(element, scaling, sr);
                    for portable in [false, true] {
                        let (mut s_enc, mut s_fused) = (QuantState::new(), QuantState::new());
                        for (step, &gain) in gains.iter().enumerate() {
                            for (k, &(rows, cols)) in SHAPES[1..5].iter().enumerate() {
                                let wild = step % 3 == 2 && k == 1;
                                let x = data(rows * cols, (step * 10 + k) as u64, wild, gain);
                                let usage = [Usage::Rowwise, Usage::Columnwise][(step + k) % 2];
                                let key = RngKey {
                                    seed: 3,
                                    stream: (step * 10 + k) as u64,
                                };
                                let what = format!(
                                    "{element:?} delayed({history_len},{margin},{algo:?}) \
                                     sr={sr} step {step} [{rows},{cols}] {usage:?} \
                                     portable={portable} {threads}t"
                                );
                                let want = encoder_path(&x, rows, cols, usage, &q, key, &mut s_enc)
                                    .unwrap();
                                let got = fused_path(
                                    &x,
                                    rows,
                                    cols,
                                    usage,
                                    &q,
                                    key,
                                    &mut s_fused,
                                    portable,
                                )
                                .unwrap();
                                assert_same(&want, &got, &what);
                                assert!(same_state(&s_enc, &s_fused), "{what}: state");
                            }
                            s_enc.end_step(&q).unwrap();
                            s_fused.end_step(&q).unwrap();
                            assert!(same_state(&s_enc, &s_fused), "end of step {step}");
                        }
                    }
                }
            }
        }
    });
}

/// Scales no amax gives but a restored or hand-set state can hold (0, subnormal, huge,
/// negative, Inf): still the encoder path's bits, including the NaNs that `0 · Inf` makes.
/// (Not a NaN scale: the sign of `NaN_input · NaN_scale` depends on the operand order the
/// compiler picks, in the encoder path as in the fused one.)
#[test]
fn odd_delayed_scales_fused_equal_encoder_path() {
    let scaling = Fp8Scaling::Delayed {
        history_len: 2,
        margin: 0,
        algo: AmaxAlgo::Max,
    };
    let (rows, cols) = (37, 129);
    let x = data(rows * cols, 99, true, 1.0);
    for scale in [0.0, 1e-40, 1e-30, f32::MAX, -3.0, f32::INFINITY] {
        for element in [Fp8Element::E4M3, Fp8Element::E5M2] {
            for sr in [false, true] {
                let q = fp8_q(element, scaling, sr);
                for usage in [Usage::Rowwise, Usage::Columnwise] {
                    let mut s_enc = QuantState::with_history_len(2);
                    s_enc.set_scale(scale);
                    let want = encoder_path(&x, rows, cols, usage, &q, KEY, &mut s_enc).unwrap();
                    for portable in [false, true] {
                        let mut s_fused = QuantState::with_history_len(2);
                        s_fused.set_scale(scale);
                        let what = format!("{element:?} scale {scale:e} sr={sr} {usage:?}");
                        let got =
                            fused_path(&x, rows, cols, usage, &q, KEY, &mut s_fused, portable)
                                .unwrap();
                        assert_same(&want, &got, &what);
                        assert!(same_state(&s_enc, &s_fused), "{what}: state");
                    }
                }
            }
        }
    }
}

/// Element-wise: the value and code of every 1021st f32 bit pattern (NaN payloads and
/// infinities included) and of the NaN / Inf boundary patterns, against the encoder and
/// decoder, RNE and SR (a few random bytes).
#[test]
fn element_matches_encoder_and_decoder() {
    fn check<F: fast::Fp8>(element: Fp8Element) {
        let specials = [
            0x7F80_0000u32,
            0x7F80_0001,
            0x7FC0_0000,
            0x7FFF_FFFF,
            0x7F7F_FFFF,
            0,
            1,
        ];
        let patterns = (0..=u32::MAX)
            .step_by(1021)
            .chain(specials)
            .chain(specials.map(|b| b | 0x8000_0000));
        for b in patterns {
            let y = f32::from_bits(b);
            let code = fp_formats_encode(element, y, None);
            let v: f32 = fast::element_rne::<F, f32>(y);
            let c: u8 = fast::element_rne::<F, u8>(y);
            let want = decode(element, code);
            assert_eq!(v.to_bits(), want.to_bits(), "{element:?} RNE y = {b:#010x}");
            assert_eq!(c, code, "{element:?} RNE code y = {b:#010x}");
            for r in [0u8, 1, 127, 128, 255] {
                let code = fp_formats_encode(element, y, Some(r));
                let v: f32 = fast::element_sr::<F, f32>(y, r);
                let c: u8 = fast::element_sr::<F, u8>(y, r);
                let want = decode(element, code);
                assert_eq!(
                    v.to_bits(),
                    want.to_bits(),
                    "{element:?} SR y = {b:#010x} r {r}"
                );
                assert_eq!(c, code, "{element:?} SR code y = {b:#010x} r {r}");
            }
        }
    }
    check::<E4M3>(Fp8Element::E4M3);
    check::<E5M2>(Fp8Element::E5M2);
}

/// Errors come before any state change, as before: a history-length mismatch leaves the
/// state as it was.
#[test]
fn history_mismatch_leaves_state() {
    let q = fp8_q(
        Fp8Element::E4M3,
        Fp8Scaling::Delayed {
            history_len: 3,
            margin: 0,
            algo: AmaxAlgo::Max,
        },
        false,
    );
    let x = data(12, 1, false, 1.0);
    let mut s = QuantState::with_history_len(2);
    let before = s.clone();
    let mut out = vec![0.0f32; 12];
    let qz = Quantizer::new(q, Usage::Rowwise).unwrap().with_key(KEY);
    let xm = MatRef::new(&x, 3, 4).unwrap();
    assert!(fake_quantize_into(&qz, xm, &mut s, &mut out).is_err());
    assert!(quantize(&qz, xm, &mut s).is_err());
    assert_eq!(s, before);
}

/// The amax the delayed-scaling pass takes ignores NaN wherever it sits relative to the
/// maximum (after it in the same accumulator lane, at a chunk end, in the tail), as the
/// separate amax pass did.
#[test]
fn delayed_amax_ignores_nan_anywhere() {
    let scaling = Fp8Scaling::Delayed {
        history_len: 2,
        margin: 0,
        algo: AmaxAlgo::Max,
    };
    let q = fp8_q(Fp8Element::E4M3, scaling, false);
    let (rows, cols) = (3, 67);
    let n = rows * cols;
    for p in (0..n).step_by(5) {
        for gap in [1, 8, 64] {
            let mut x: Vec<f32> = (0..n).map(|i| 0.5 + (i % 7) as f32 * 0.125).collect();
            x[p] = -100.0;
            for i in (p + gap..n).step_by(gap) {
                x[i] = if i % 2 == 0 { f32::NAN } else { -f32::NAN };
            }
            for usage in [Usage::Rowwise, Usage::Columnwise] {
                let mut s_enc = QuantState::new();
                let want = encoder_path(&x, rows, cols, usage, &q, KEY, &mut s_enc).unwrap();
                assert_eq!(want.amax, 100.0);
                for portable in [false, true] {
                    let mut s_fused = QuantState::new();
                    let got =
                        fused_path(&x, rows, cols, usage, &q, KEY, &mut s_fused, portable).unwrap();
                    let what = format!("max at {p}, NaN every {gap} after it, {usage:?}");
                    assert_same(&want, &got, &what);
                    assert!(same_state(&s_enc, &s_fused), "{what}: state");
                }
            }
        }
    }
}

/// The parallel, vectorised tensor amax against a scalar fold, NaN-ignoring: lengths around
/// the 64-lane loop and the 64 Ki-element tasks, with NaN, ±Inf, -0, subnormals and the
/// largest magnitude at the start, inside the lanes, in the tail and across tasks.
#[test]
fn tensor_amax_equals_a_scalar_fold() {
    let scalar = |x: &[f32]| {
        x.iter()
            .fold(0.0f32, |m, v| if v.abs() > m { v.abs() } else { m })
    };
    let mut seed = 0x9E37_79B9u32;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
    };
    let lens = [
        0usize, 1, 15, 63, 64, 65, 127, 200, 65_535, 65_536, 65_537, 200_003,
    ];
    for &n in &lens {
        let base: Vec<f32> = (0..n).map(|_| rnd()).collect();
        let mut cases = vec![base.clone()];
        for (at, v) in [
            (0, f32::NAN),
            (n / 2, -f32::NAN),
            (n.saturating_sub(1), f32::NAN),
            (n / 3, -7.5),
            (n.saturating_sub(1), 9.0),
            (n / 2, f32::NEG_INFINITY),
            (n / 4, -0.0),
        ] {
            if n > 0 {
                let mut x = base.clone();
                x[at] = v;
                cases.push(x);
            }
        }
        cases.push(vec![f32::NAN; n]);
        cases.push(vec![-0.0; n]);
        cases.push(vec![f32::from_bits(1); n]);
        for x in &cases {
            let (got, want) = (tensor_amax(x), scalar(x));
            assert_eq!(got.to_bits(), want.to_bits(), "length {n}");
        }
    }
}

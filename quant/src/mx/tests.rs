//! The fused fake quantization ([`super::fast`]) against the codes path it replaced
//! (quantize to codes, then decode each code and multiply by its scale), bit for bit,
//! including the clipped count and the errors; and its stochastic element rounding against
//! the generic encoder. The RNE element rounding is checked exhaustively in `fast.rs`.

use super::*;
use crate::grid::Elem;
use fp_formats::mx::ScaleRule;
use fp_formats::{Overflow, Rounding};

/// Quantizes `n` stored rows (`src`, `[n, scols]`) to unpacked codes (`[n, pcols]`) and
/// scales (`[n, pcols / 32]`).
fn quantize_rows<F: Elem>(
    c: &MxCast,
    src: &[f32],
    rbits: Option<&[u8]>,
    scols: usize,
    codes: &mut [u8],
    scales: &mut [u8],
) -> PanelStats {
    let pcols = scols.div_ceil(BLOCK) * BLOCK;
    let bpr = pcols / BLOCK;
    let mut st = PanelStats::default();
    let mut pad = [0.0f32; BLOCK];
    for (r, row) in src.chunks_exact(scols).enumerate() {
        for b in 0..bpr {
            let start = b * BLOCK;
            let end = (start + BLOCK).min(scols);
            let rb = rbits.map(|rb| &rb[r * pcols + start..r * pcols + start + BLOCK]);
            let blk: &[f32] = if end - start == BLOCK {
                &row[start..end]
            } else {
                pad.fill(0.0);
                pad[..end - start].copy_from_slice(&row[start..end]);
                &pad[..]
            };
            let amax = fp_formats::nvfp4::block_amax(blk);
            let scale = c.rule.scale::<F>(amax);
            st.amax = st.amax.max(amax);
            scales[r * bpr + b] = scale.0;
            let inv = scale.reciprocal();
            let mul = if c.prescale { inv * 0.75 } else { inv };
            let out = &mut codes[r * pcols + start..r * pcols + start + BLOCK];
            let (mut clipped, mut bad) = (0usize, false);
            match rb {
                None => {
                    let mut ys = [0.0f32; BLOCK];
                    for (o, &v) in ys.iter_mut().zip(blk) {
                        let y = v * mul;
                        clipped += (y.abs() > F::MAX) as usize;
                        bad |= !y.is_finite();
                        *o = y;
                    }
                    F::rne_block(&ys, out);
                }
                Some(rb) => {
                    for ((o, &v), &r) in out.iter_mut().zip(blk).zip(rb) {
                        let y = v * mul;
                        let a = y.abs();
                        clipped += (a > F::MAX) as usize;
                        bad |= !y.is_finite();
                        *o = F::from_f32(y, Rounding::Stochastic(r), Overflow::Saturate).to_bits();
                    }
                }
            }
            st.clipped += clipped;
            st.non_finite |= bad;
        }
    }
    st
}

fn quantize_rows_dyn(
    c: &MxCast,
    src: &[f32],
    rbits: Option<&[u8]>,
    scols: usize,
    codes: &mut [u8],
    scales: &mut [u8],
) -> PanelStats {
    match c.element {
        MxElement::E4M3 => quantize_rows::<E4M3>(c, src, rbits, scols, codes, scales),
        MxElement::E5M2 => quantize_rows::<E5M2>(c, src, rbits, scols, codes, scales),
        MxElement::E2M3 => quantize_rows::<E2M3>(c, src, rbits, scols, codes, scales),
        MxElement::E3M2 => quantize_rows::<E3M2>(c, src, rbits, scols, codes, scales),
        MxElement::E2M1 => quantize_rows::<E2M1>(c, src, rbits, scols, codes, scales),
    }
}

/// The fake quantization as it was before the fused path: [`quantize_rows`] to unpacked
/// codes, then [`decode_row`] (without the per-tensor factor).
fn fake_reference(
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    q: &OperandQuant,
    key: RngKey,
    out: &mut [f32],
) -> Result<(f32, usize), QuantError> {
    let c = settings(q, usage, key)?;
    panel::check_len(x, rows, cols)?;
    panel::check_out(out, x.len())?;
    let (srows, scols) = stored_shape(rows, cols, usage);
    let pcols = scols.div_ceil(BLOCK) * BLOCK;
    let bpr = pcols / BLOCK;
    let mut scales = vec![0u8; srows * bpr];
    let st = run(
        MatRef::row_major(x, rows, cols),
        usage,
        &c,
        out,
        scols,
        &mut scales,
        |o, src, rb, sc, buf| {
            let u = grow(buf, o.len() / scols * pcols);
            let st = quantize_rows_dyn(&c, src, rb, scols, u, sc);
            for ((orow, crow), srow) in o
                .chunks_exact_mut(scols)
                .zip(u.chunks_exact(pcols))
                .zip(sc.chunks_exact(bpr))
            {
                decode_row(c.element, crow, srow, 1.0, orow);
            }
            st
        },
    )?;
    Ok((if c.prescale { PRESCALE_INV } else { 1.0 }, st.clipped))
}

/// Edge-case data: zeros of both signs, f32 subnormals, magnitudes near `f32::MAX` (when
/// `huge`), stretches far below the smallest scale, exact element grid points and ties,
/// and ordinary values.
fn edge_data(n: usize, seed: u64, huge: bool) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            match (s >> 8) % 23 {
                0 => 0.0,
                1 => -0.0,
                2 => f32::from_bits((s >> 12) as u32 & 0x807F_FFFF), // subnormal
                3 => [448.0f32, -464.0, 480.0, 57344.0, -61440.0, 6.0, -7.0, 5.0][i % 8],
                4 if huge => f32::MAX * u,
                5 => u * 1e-30,
                6 => ((s >> 20) % 64) as f32 * 0.25 - 8.0, // grid points and ties
                _ if i % 97 < 33 => u * 1e-39,             // whole blocks at the smallest scale
                _ if i % 61 < 3 => u * 3e5,                // outliers: clipping under FLOOR
                _ => u * 8.0,
            }
        })
        .collect()
}

/// The codes path: [`quantize`]'s panels with [`quantize_rows`] (the reference, `None`) or
/// the fused codes kernel (`Some(portable)`), packed as [`quantize`] packs them.
fn codes_with(
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    q: &OperandQuant,
    key: RngKey,
    fused: Option<bool>,
) -> Result<QuantizedTensor, QuantError> {
    let c = settings(q, usage, key)?;
    let (srows, scols) = stored_shape(rows, cols, usage);
    let pcols = scols.div_ceil(BLOCK) * BLOCK;
    let row_bytes = c.element.packed_len(pcols);
    let mut codes = vec![0u8; srows * row_bytes];
    let mut scales = vec![0u8; srows * (pcols / BLOCK)];
    let st = run(
        MatRef::row_major(x, rows, cols),
        usage,
        &c,
        &mut codes,
        row_bytes,
        &mut scales,
        |out, src, rb, sc, buf| {
            let u = grow(buf, out.len() / row_bytes * pcols);
            let st = match fused {
                None => quantize_rows_dyn(&c, src, rb, scols, u, sc),
                Some(portable) => fast::codes_panel(&c, src, rb, scols, u, sc, portable),
            };
            for (o, row) in out.chunks_exact_mut(row_bytes).zip(u.chunks_exact(pcols)) {
                match c.element.bits() {
                    8 => o.copy_from_slice(row),
                    6 => o.copy_from_slice(&fp_formats::pack::pack_fp6(row)),
                    _ => fp_formats::pack::pack_fp4_into(row, o),
                }
            }
            st
        },
    )?;
    Ok(QuantizedTensor {
        format: q.format,
        block: q.block,
        usage,
        rows: srows,
        cols: scols,
        padded_rows: srows,
        padded_cols: pcols,
        codes,
        scales,
        amax: st.amax,
        tensor_scale_inv: if c.prescale { PRESCALE_INV } else { 1.0 },
        hadamard: crate::hadamard::sign_mask(c.rht, c.key),
    })
}

/// Codes, scales, amax and factor of two quantized tensors, or where they differ.
fn same_tensor(a: &QuantizedTensor, b: &QuantizedTensor) -> Result<(), String> {
    if let Some(i) = a.codes.iter().zip(&b.codes).position(|(x, y)| x != y) {
        return Err(format!(
            "code byte {i}: {:#x} vs {:#x}",
            a.codes[i], b.codes[i]
        ));
    }
    if a.scales != b.scales {
        return Err("scales differ".into());
    }
    if a.amax.to_bits() != b.amax.to_bits() || a.tensor_scale_inv != b.tensor_scale_inv {
        return Err(format!("amax / factor: {:?} vs {:?}", a.amax, b.amax));
    }
    if (a.rows, a.cols, a.padded_rows, a.padded_cols)
        != (b.rows, b.cols, b.padded_rows, b.padded_cols)
    {
        return Err("shapes differ".into());
    }
    Ok(())
}

fn all_configs() -> Vec<(OperandQuant, bool)> {
    let mut v = Vec::new();
    for element in [
        MxElement::E4M3,
        MxElement::E5M2,
        MxElement::E2M3,
        MxElement::E3M2,
        MxElement::E2M1,
    ] {
        for rule in [
            ScaleRule::Floor,
            ScaleRule::Rceil,
            ScaleRule::Ceil,
            ScaleRule::Even,
        ] {
            let q = OperandQuant::mx(element, rule);
            let sr = q.with_rounding(RoundingMode::Stochastic);
            let pre = OperandQuant {
                format: QuantFormat::Mx {
                    element,
                    rule,
                    sr_prescale: true,
                },
                ..sr
            };
            for q in [q, sr, pre] {
                v.push((q, false));
                for rht in [Rht::FixedSigns, Rht::RandomSigns] {
                    v.push((q.with_rht(rht), true));
                }
            }
        }
    }
    v
}

fn same_bits(a: &[f32], b: &[f32]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x.to_bits() != y.to_bits())
}

/// Every element, rule, rounding (RNE, SR, prescaled SR), usage and RHT setting on shapes
/// whose stored rows are and are not multiples of 32, on 1 and 2 threads, in both builds.
#[test]
fn fused_equals_codes_path() {
    let pools: Vec<rayon::ThreadPool> = [1, 2]
        .iter()
        .map(|&n| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .unwrap()
        })
        .collect();
    let key = RngKey {
        seed: 0x3a7,
        stream: 5,
    };
    let shapes = [
        (1, 1),
        (3, 45),
        (7, 32),
        (32, 7),
        (48, 100),
        (64, 96),
        (160, 33),
    ];
    for (q, rht) in all_configs() {
        for &(rows, cols) in &shapes {
            for usage in [Usage::Rowwise, Usage::Columnwise] {
                if rht && (usage == Usage::Rowwise || rows % 16 != 0) {
                    continue;
                }
                for huge in [false, true] {
                    let x = edge_data(rows * cols, (rows * 131 + cols) as u64, huge);
                    let mut want = vec![f32::NAN; x.len()];
                    let r = fake_reference(&x, rows, cols, usage, &q, key, &mut want);
                    let t_ref = codes_with(&x, rows, cols, usage, &q, key, None);
                    for pool in &pools {
                        let what = format!("{q:?} {rows}x{cols} {usage:?} huge={huge}");
                        let t = pool.install(|| quantize(&x, rows, cols, usage, &q, key));
                        let tp = codes_with(&x, rows, cols, usage, &q, key, Some(true));
                        for t in [t, tp] {
                            match (&t, &t_ref) {
                                (Ok(t), Ok(t_ref)) => same_tensor(t, t_ref)
                                    .unwrap_or_else(|e| panic!("codes: {what}: {e}")),
                                (t, t_ref) => {
                                    assert!(rht && huge, "{what}: {t:?} vs {t_ref:?}");
                                    assert_eq!(
                                        t.as_ref().unwrap_err().to_string(),
                                        t_ref.as_ref().unwrap_err().to_string()
                                    );
                                }
                            }
                        }
                    }
                    for pool in &pools {
                        for portable in [false, true] {
                            let mut got = vec![f32::NAN; x.len()];
                            let g = pool.install(|| {
                                fake_quantize_impl(
                                    MatRef::row_major(&x, rows, cols),
                                    usage,
                                    &q,
                                    key,
                                    &mut got,
                                    portable,
                                )
                            });
                            let what = format!(
                                "{q:?} {rows}x{cols} {usage:?} huge={huge} portable={portable}"
                            );
                            let (g, r) = match (g, &r) {
                                (Ok(g), Ok(r)) => (g, *r),
                                (g, r) => {
                                    // Huge values overflow the Hadamard transform.
                                    assert!(rht && huge, "{what}: {g:?} vs {r:?}");
                                    assert_eq!(
                                        g.unwrap_err().to_string(),
                                        r.as_ref().unwrap_err().to_string(),
                                        "{what}"
                                    );
                                    continue;
                                }
                            };
                            assert_eq!(g, r, "factor / clipped: {what}");
                            if let Some(i) = same_bits(&got, &want) {
                                panic!(
                                    "{what}: element {i}: fused {:e}, codes path {:e}",
                                    got[i], want[i]
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Larger tensors (several panels per usage) with the MXFP8 training configuration.
#[test]
fn fused_equals_codes_path_large() {
    let key = RngKey { seed: 9, stream: 1 };
    for (rows, cols) in [(512, 200), (300, 1024)] {
        let x = edge_data(rows * cols, 77, false);
        for element in [MxElement::E4M3, MxElement::E5M2, MxElement::E2M1] {
            let q = OperandQuant::mx(element, ScaleRule::Rceil);
            for q in [q, q.with_rounding(RoundingMode::Stochastic)] {
                for usage in [Usage::Rowwise, Usage::Columnwise] {
                    let mut want = vec![0.0; x.len()];
                    let mut got = vec![0.0; x.len()];
                    let r = fake_reference(&x, rows, cols, usage, &q, key, &mut want).unwrap();
                    let g =
                        fake_quantize_counting(&x, rows, cols, usage, &q, key, &mut got).unwrap();
                    assert_eq!(g, r);
                    assert_eq!(same_bits(&got, &want), None, "{q:?} {usage:?}");
                }
            }
        }
    }
}

/// Non-finite input: the same error (naming the same element) as the codes path.
#[test]
fn fused_reports_non_finite_like_codes_path() {
    let (rows, cols) = (32, 48);
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -f32::NAN] {
        for at in [0, 5, 700, rows * cols - 1] {
            let mut x = edge_data(rows * cols, 3, false);
            x[at] = bad;
            for q in [
                OperandQuant::mx(MxElement::E4M3, ScaleRule::Rceil),
                OperandQuant::mx(MxElement::E2M1, ScaleRule::Floor)
                    .with_rounding(RoundingMode::Stochastic)
                    .with_rht(Rht::FixedSigns),
            ] {
                for usage in [Usage::Rowwise, Usage::Columnwise] {
                    if q.rht != Rht::Off && usage == Usage::Rowwise {
                        continue;
                    }
                    let mut o = vec![0.0; x.len()];
                    let want = fake_reference(&x, rows, cols, usage, &q, RngKey::default(), &mut o)
                        .unwrap_err()
                        .to_string();
                    let got = fake_quantize_counting(
                        &x,
                        rows,
                        cols,
                        usage,
                        &q,
                        RngKey::default(),
                        &mut o,
                    )
                    .unwrap_err()
                    .to_string();
                    assert_eq!(got, want);
                }
            }
        }
    }
}

/// Inputs where stochastic rounding decides: a stride through `[0, 2 MAX]`, every f32 within
/// 3 ulps of each point `g + j · step / 256` between neighbouring grid points `g` (grid
/// points included), and values far above the maximum.
fn sr_inputs<F: Elem>() -> Vec<f32> {
    let top = (2.0 * F::MAX).to_bits();
    let mut xs: Vec<f32> = (0..=top).step_by(9973).map(f32::from_bits).collect();
    let grid: Vec<f32> = (0..1u32 << F::BITS)
        .map(|c| F::from_bits(c as u8).to_f32())
        .filter(|v| v.is_finite() && *v >= 0.0 && v.to_bits() >> 31 == 0)
        .collect();
    let mut grid = grid;
    grid.sort_by(f32::total_cmp);
    grid.dedup();
    for w in grid.windows(2) {
        for j in 0..256 {
            let b = (w[0] as f64 + (w[1] - w[0]) as f64 * j as f64 / 256.0) as f32;
            let b = b.to_bits();
            xs.extend((b.saturating_sub(3)..=b + 3).map(f32::from_bits));
        }
    }
    xs.extend([F::MAX * 1.0001, F::MAX * 3.0, 1e30, f32::MAX, f32::INFINITY]);
    xs.extend([1, 2, 0x0080_0000].map(f32::from_bits));
    xs
}

/// The stochastic element rounding against the generic encoder + decoder for all 256
/// random bytes and both signs, on [`sr_inputs`].
#[test]
fn sr_element_matches_encoder() {
    fn check<F: Elem>() {
        for y in sr_inputs::<F>() {
            for y in [y, -y] {
                for r in 0..=255u8 {
                    let code = F::from_f32(y, Rounding::Stochastic(r), Overflow::Saturate);
                    let want = code.to_f32();
                    let got = fast::fake_sr::<F>(y, 1.0, r);
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{}: y = {y:e}, r = {r}: fast {got:e}, encoder {want:e}",
                        F::NAME
                    );
                    let got = fast::tests::code_sr::<F>(y, r);
                    assert_eq!(got, code.to_bits(), "{}: y = {y:e}, r = {r}", F::NAME);
                }
            }
        }
    }
    check::<E4M3>();
    check::<E5M2>();
    check::<E2M3>();
    check::<E3M2>();
    check::<E2M1>();
}

/// With a scale: the fused value is the decoder's `element · s` for every E8M0 scale
/// value, including the subnormal `2^-127` (products that are f32 subnormals or zero).
#[test]
fn element_times_every_scale() {
    fn check<F: Elem>() {
        for b in 0..=254u8 {
            let s = E8M0(b).value();
            for c in 0..1u32 << F::BITS {
                let v = F::from_bits(c as u8).to_f32();
                if !v.is_finite() {
                    continue;
                }
                let want = v * s;
                assert_eq!(
                    fast::fake_rne::<F>(v, s).to_bits(),
                    want.to_bits(),
                    "{} code {c:#x} scale {b}",
                    F::NAME
                );
                assert_eq!(
                    fast::fake_sr::<F>(v, s, 255).to_bits(),
                    want.to_bits(),
                    "{} code {c:#x} scale {b}",
                    F::NAME
                );
            }
        }
    }
    check::<E4M3>();
    check::<E5M2>();
    check::<E2M3>();
    check::<E3M2>();
    check::<E2M1>();
}

/// The codes path after its changes (MXFP8 codes written in place, `dequantize` without
/// per-row buffers) against the fused values times the per-tensor factor.
#[test]
fn dequantize_equals_fused_times_factor() {
    let key = RngKey { seed: 4, stream: 4 };
    let (rows, cols) = (48, 70);
    let x = edge_data(rows * cols, 11, true);
    for (q, rht) in all_configs() {
        for usage in [Usage::Rowwise, Usage::Columnwise] {
            if rht && usage == Usage::Rowwise {
                continue;
            }
            let mut f = vec![0.0; x.len()];
            let factor = match fake_quantize_into(&x, rows, cols, usage, &q, key, &mut f) {
                Ok(factor) => factor,
                Err(e) => {
                    // Huge values overflow the Hadamard transform.
                    assert!(rht, "{q:?} {usage:?}: {e}");
                    let t = quantize(&x, rows, cols, usage, &q, key);
                    assert_eq!(t.unwrap_err().to_string(), e.to_string());
                    continue;
                }
            };
            let t = quantize(&x, rows, cols, usage, &q, key).unwrap();
            let d = dequantize(&t);
            for v in f.iter_mut() {
                *v *= factor;
            }
            assert_eq!(same_bits(&d, &f), None, "{q:?} {usage:?}");
        }
    }
}

/// The source-layout columnwise kernel against the stored-layout fused path (transposed),
/// for every configuration without RHT, on shapes with partial strips and tiles and with
/// several tasks, in both builds and on 1 and 2 threads; and its errors.
#[test]
fn source_layout_equals_stored_layout() {
    let pools: Vec<rayon::ThreadPool> = [1, 2]
        .iter()
        .map(|&n| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .unwrap()
        })
        .collect();
    let key = RngKey {
        seed: 0x51,
        stream: 2,
    };
    let shapes = [(1, 1), (5, 17), (32, 16), (45, 33), (64, 70), (700, 130)];
    for (q, rht) in all_configs() {
        if rht {
            let mut o = vec![0.0; 32 * 16];
            let r =
                fake_quantize_columnwise_source_layout(&[0.0; 32 * 16], 32, 16, &q, key, &mut o);
            assert_eq!(r.unwrap(), None);
            continue;
        }
        for &(rows, cols) in &shapes {
            for huge in [false, true] {
                let x = edge_data(rows * cols, (rows * 7 + cols) as u64, huge);
                let mut stored = vec![0.0; x.len()];
                let want =
                    fake_quantize_counting(&x, rows, cols, Usage::Columnwise, &q, key, &mut stored)
                        .unwrap();
                for pool in &pools {
                    for portable in [false, true] {
                        let mut got = vec![f32::NAN; x.len()];
                        let g = pool.install(|| {
                            source_layout_impl(&x, rows, cols, &q, key, &mut got, portable)
                        });
                        let what = format!("{q:?} {rows}x{cols} huge={huge} portable={portable}");
                        assert_eq!(g.unwrap(), Some(want), "{what}");
                        for r in 0..rows {
                            for c in 0..cols {
                                let (a, b) = (got[r * cols + c], stored[c * rows + r]);
                                assert_eq!(a.to_bits(), b.to_bits(), "{what}: ({r}, {c})");
                            }
                        }
                    }
                }
            }
        }
    }
    // Non-finite input: the same error as the stored layout.
    let (rows, cols) = (40, 20);
    for at in [0, 333, rows * cols - 1] {
        let mut x = edge_data(rows * cols, 5, false);
        x[at] = f32::NAN;
        let q = OperandQuant::mx(MxElement::E4M3, ScaleRule::Rceil);
        let mut o = vec![0.0; x.len()];
        let want = fake_quantize_into(&x, rows, cols, Usage::Columnwise, &q, key, &mut o)
            .unwrap_err()
            .to_string();
        let got = fake_quantize_columnwise_source_layout(&x, rows, cols, &q, key, &mut o)
            .unwrap_err()
            .to_string();
        assert_eq!(got, want);
    }
}

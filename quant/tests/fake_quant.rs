//! The top-level dispatch: configuration validation, `quantize(..).dequantize() ==
//! fake_quantize(..)` for every format, and the error statistics.

mod common;
use common::*;

use fp_formats::mx::{MxElement, ScaleRule};
use quant::{
    BlockError, BlockShape, FourOverSix, Fp8Element, OperandQuant, QuantError, QuantFormat,
    QuantState, Rht, RngKey, RoundingMode, Usage,
};

fn data(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as f32 * 0.731).sin() * 2.0).powi(3))
        .collect()
}

fn all_configs() -> Vec<(OperandQuant, Usage)> {
    let sr = RoundingMode::Stochastic;
    let fos = Some(FourOverSix {
        error: BlockError::Mse,
        e4m3_bound_256: true,
    });
    let mut v = vec![
        (OperandQuant::F32, Usage::Rowwise),
        (OperandQuant::BF16, Usage::Columnwise),
        (OperandQuant::BF16.with_rounding(sr), Usage::Rowwise),
        (
            OperandQuant::fp8_current(Fp8Element::E4M3),
            Usage::Columnwise,
        ),
        (
            OperandQuant::fp8_current(Fp8Element::E5M2).with_rounding(sr),
            Usage::Rowwise,
        ),
        (OperandQuant::nvfp4(), Usage::Rowwise),
        (
            OperandQuant::nvfp4().with_block(BlockShape::Tile16),
            Usage::Columnwise,
        ),
        (
            OperandQuant::nvfp4()
                .with_rounding(sr)
                .with_rht(Rht::FixedSigns),
            Usage::Columnwise,
        ),
        (
            OperandQuant {
                format: QuantFormat::Nvfp4 { four_over_six: fos },
                ..OperandQuant::nvfp4()
            },
            Usage::Rowwise,
        ),
    ];
    for e in [
        MxElement::E4M3,
        MxElement::E5M2,
        MxElement::E2M3,
        MxElement::E3M2,
        MxElement::E2M1,
    ] {
        v.push((OperandQuant::mx(e, ScaleRule::Rceil), Usage::Rowwise));
        v.push((
            OperandQuant::mx(e, ScaleRule::Floor)
                .with_rounding(sr)
                .with_rht(Rht::RandomSigns),
            Usage::Columnwise,
        ));
    }
    v
}

#[test]
fn dequantize_equals_fake_quantize_for_every_format() {
    let (rows, cols) = (48, 40);
    let x = data(rows * cols);
    let key = RngKey {
        seed: 12,
        stream: 34,
    };
    for (q, usage) in all_configs() {
        let mut st = QuantState::new();
        let t = quantize_with(&x, rows, cols, usage, &q, key, &mut st).unwrap();
        let (sr, sc) = if usage == Usage::Rowwise {
            (rows, cols)
        } else {
            (cols, rows)
        };
        assert_eq!((t.rows, t.cols, t.usage), (sr, sc, usage));
        let d = t.dequantize();
        let y = fake_quantize_with(&x, rows, cols, usage, &q, key, &mut st).unwrap();
        assert_eq!(d.len(), x.len());
        assert!(
            d.iter().zip(&y).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{q:?}"
        );
        let mut u = vec![0.0f32; x.len()];
        let qz = quantizer(&q, usage, key).unwrap();
        let f = qz
            .fake_quantize_into(quant::MatRef::new(&x, rows, cols).unwrap(), &mut st, &mut u)
            .unwrap();
        assert_eq!(f, t.tensor_scale_inv, "{q:?}");
        let scaled: Vec<f32> = u
            .iter()
            .map(|v| if f == 1.0 { *v } else { v * f })
            .collect();
        assert!(
            scaled
                .iter()
                .zip(&y)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{q:?}"
        );
        let e = operand_error(&x, rows, cols, usage, &q, key, &mut st).unwrap();
        assert_eq!(e.count, x.len());
        assert!(e.sqnr_db > 12.0, "{q:?}: {e:?}");
    }
}

#[test]
fn validation_rules() {
    let invalid =
        |q: OperandQuant, u: Usage| matches!(validate(&q, u), Err(QuantError::InvalidConfig(_)));
    let fos = Some(FourOverSix {
        error: BlockError::Mae,
        e4m3_bound_256: false,
    });
    let nv_fos = OperandQuant {
        format: QuantFormat::Nvfp4 { four_over_six: fos },
        ..OperandQuant::nvfp4()
    };
    let mx = OperandQuant::mx(MxElement::E4M3, ScaleRule::Rceil);
    // Block shapes.
    assert!(invalid(mx.with_block(BlockShape::Tile16), Usage::Rowwise));
    assert!(invalid(mx.with_block(BlockShape::Row16), Usage::Rowwise));
    assert!(invalid(
        OperandQuant::nvfp4().with_block(BlockShape::Row32),
        Usage::Rowwise
    ));
    // RHT: columnwise only, block formats only.
    assert!(invalid(
        OperandQuant::nvfp4().with_rht(Rht::FixedSigns),
        Usage::Rowwise
    ));
    assert!(invalid(mx.with_rht(Rht::FixedSigns), Usage::Rowwise));
    assert!(invalid(
        OperandQuant::BF16.with_rht(Rht::FixedSigns),
        Usage::Columnwise
    ));
    assert!(invalid(
        OperandQuant::fp8_current(Fp8Element::E4M3).with_rht(Rht::FixedSigns),
        Usage::Columnwise
    ));
    assert!(validate(
        &OperandQuant::nvfp4()
            .with_block(BlockShape::Tile16)
            .with_rht(Rht::FixedSigns),
        Usage::Columnwise
    )
    .is_ok());
    // Four Over Six: not with RHT or SR.
    assert!(invalid(nv_fos.with_rht(Rht::FixedSigns), Usage::Columnwise));
    assert!(invalid(
        nv_fos.with_rounding(RoundingMode::Stochastic),
        Usage::Rowwise
    ));
    assert!(validate(&nv_fos, Usage::Columnwise).is_ok());
    // sr_prescale needs SR; F32 has no SR.
    let pre = OperandQuant {
        format: QuantFormat::Mx {
            element: MxElement::E2M1,
            rule: ScaleRule::Floor,
            sr_prescale: true,
        },
        ..mx
    };
    assert!(invalid(pre, Usage::Rowwise));
    assert!(validate(&pre.with_rounding(RoundingMode::Stochastic), Usage::Rowwise).is_ok());
    assert!(invalid(
        OperandQuant::F32.with_rounding(RoundingMode::Stochastic),
        Usage::Rowwise
    ));
    // Every valid configuration used above passes, and the dispatch reports the same errors.
    for (q, u) in all_configs() {
        assert!(validate(&q, u).is_ok(), "{q:?}");
    }
    let x = data(32);
    let r = quantize_with(
        &x,
        1,
        32,
        Usage::Rowwise,
        &mx.with_block(BlockShape::Tile16),
        RngKey::default(),
        &mut QuantState::new(),
    );
    assert!(matches!(r, Err(QuantError::InvalidConfig(_))));
}

#[test]
fn stats_clipping_and_flushing() {
    let key = RngKey::default();
    // The NVFP4 clipping example of docs/numerics.md#worked-examples: amax_g = 2688, block [546, 0 x 15] -> scale 88,
    // 546 clips to 528.
    let mut x = vec![0.0f32; 32];
    x[0] = 546.0;
    x[16] = 2688.0;
    let e = operand_error(
        &x,
        1,
        32,
        Usage::Rowwise,
        &OperandQuant::nvfp4(),
        key,
        &mut QuantState::new(),
    )
    .unwrap();
    // 546 · enc = 6.2045 clips; so does 2688 · fl(1/448) = 6.0000005 (encoded 6 exactly,
    // but its scaled magnitude, as the quantizer computed it, is above 6).
    assert_eq!(e.clipped_fraction, 2.0 / 32.0);
    assert_eq!(e.max_abs_error, 18.0);
    // Flushing: a value far below its block max vanishes in MXFP4.
    let mut x = vec![0.0f32; 32];
    x[0] = 6.0;
    x[1] = 0.01;
    let e = operand_error(
        &x,
        1,
        32,
        Usage::Rowwise,
        &OperandQuant::mx(MxElement::E2M1, ScaleRule::Rceil),
        key,
        &mut QuantState::new(),
    )
    .unwrap();
    assert_eq!(e.flushed_fraction, 1.0 / 32.0);
    assert_eq!(e.clipped_fraction, 0.0);
    // Bias: RNE on symmetric data is nearly unbiased; FLOOR clipping of positive maxima is not.
    let x: Vec<f32> = (0..32 * 64)
        .map(|i| {
            if i % 32 == 0 {
                7.0
            } else {
                (i % 13) as f32 * 0.3
            }
        })
        .collect();
    let floor = operand_error(
        &x,
        64,
        32,
        Usage::Rowwise,
        &OperandQuant::mx(MxElement::E2M1, ScaleRule::Floor),
        key,
        &mut QuantState::new(),
    )
    .unwrap();
    let rceil = operand_error(
        &x,
        64,
        32,
        Usage::Rowwise,
        &OperandQuant::mx(MxElement::E2M1, ScaleRule::Rceil),
        key,
        &mut QuantState::new(),
    )
    .unwrap();
    assert_eq!(floor.clipped_fraction, 1.0 / 32.0);
    assert_eq!(rceil.clipped_fraction, 0.0);
    assert!(floor.relative_bias < 0.0);
    // Exact formats.
    let e = operand_error(
        &x,
        64,
        32,
        Usage::Columnwise,
        &OperandQuant::F32,
        key,
        &mut QuantState::new(),
    )
    .unwrap();
    assert_eq!(
        (e.rmse, e.max_abs_error, e.sqnr_db),
        (0.0, 0.0, f64::INFINITY)
    );
}

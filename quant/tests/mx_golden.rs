//! MX quantizer against torchao's `to_mx` (tests/data/mx_golden.bin, see the README there):
//! scales and codes bit for bit, for 5 element formats x 4 scale rules, rowwise and
//! columnwise, plus fake quantization and dequantization of the same data.

mod common;
use common::*;

use fp_formats::mx::{MxElement, ScaleRule};
use fp_formats::pack;
use quant::{OperandQuant, QuantState, QuantizedTensor, RngKey, Usage};

struct Case {
    element: MxElement,
    rule: ScaleRule,
    n_flagged: u32,
    scales: Vec<u8>,
    codes: Vec<u8>,
    flags: Vec<u8>,
}

struct Golden {
    rows: usize,
    cols: usize,
    x: Vec<f32>,
    cases: Vec<Case>,
}

fn u32_at(b: &[u8], p: &mut usize) -> u32 {
    let v = u32::from_le_bytes(b[*p..*p + 4].try_into().unwrap());
    *p += 4;
    v
}

fn load() -> Golden {
    let b = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/mx_golden.bin"
    ))
    .unwrap();
    assert_eq!(&b[..8], b"NBMXGLD1");
    let mut p = 8;
    let rows = u32_at(&b, &mut p) as usize;
    let cols = u32_at(&b, &mut p) as usize;
    assert_eq!(u32_at(&b, &mut p), 32);
    let n = rows * cols;
    let x: Vec<f32> = b[p..p + 4 * n]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    p += 4 * n;
    let n_cases = u32_at(&b, &mut p);
    let nb = n / 32;
    let mut cases = Vec::new();
    for _ in 0..n_cases {
        let element = [
            MxElement::E4M3,
            MxElement::E5M2,
            MxElement::E2M3,
            MxElement::E3M2,
            MxElement::E2M1,
        ][b[p] as usize];
        let rule = [
            ScaleRule::Floor,
            ScaleRule::Rceil,
            ScaleRule::Ceil,
            ScaleRule::Even,
        ][b[p + 1] as usize];
        p += 2;
        let n_flagged = u32_at(&b, &mut p);
        let scales = b[p..p + nb].to_vec();
        p += nb;
        let codes = b[p..p + n].to_vec();
        p += n;
        let flags = b[p..p + nb].to_vec();
        p += nb;
        cases.push(Case {
            element,
            rule,
            n_flagged,
            scales,
            codes,
            flags,
        });
    }
    assert_eq!(p, b.len());
    assert_eq!(cases.len(), 20);
    Golden {
        rows,
        cols,
        x,
        cases,
    }
}

fn unpacked_codes(t: &QuantizedTensor, element: MxElement) -> Vec<u8> {
    let row_bytes = element.packed_len(t.padded_cols);
    let mut out = Vec::new();
    for row in t.codes.chunks_exact(row_bytes) {
        let codes = match element.bits() {
            8 => row.to_vec(),
            6 => pack::unpack_fp6(row, t.padded_cols).unwrap(),
            _ => pack::unpack_fp4(row, t.padded_cols).unwrap(),
        };
        out.extend_from_slice(&codes[..t.cols]);
    }
    out
}

fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0; x.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = x[r * cols + c];
        }
    }
    t
}

/// The largest scale code Nibble uses for an element format (`fp_formats::mx::max_scale`):
/// torchao (and the hardware) may pick one more for a block whose amax is within a factor
/// `F::MAX` of f32's maximum, where `F::MAX` times the scale overflows f32 (issue #13).
fn max_scale(element: MxElement) -> u8 {
    use fp_formats::mx::max_scale;
    use fp_formats::{E2M1, E2M3, E3M2, E4M3, E5M2};
    match element {
        MxElement::E4M3 => max_scale::<E4M3>().0,
        MxElement::E5M2 => max_scale::<E5M2>().0,
        MxElement::E2M3 => max_scale::<E2M3>().0,
        MxElement::E3M2 => max_scale::<E3M2>().0,
        MxElement::E2M1 => max_scale::<E2M1>().0,
    }
}

/// Compares scales and codes block by block with a readable failure message. Blocks where
/// torchao's scale exceeds [`max_scale`] must get the capped scale instead (their codes
/// saturate and differ; their values are checked finite by the fake-quantization test).
fn check(g: &Golden, c: &Case, t: &QuantizedTensor, what: &str) -> usize {
    assert_eq!((t.rows, t.cols, t.padded_cols), (g.rows, g.cols, g.cols));
    let codes = unpacked_codes(t, c.element);
    let mut capped = 0;
    for blk in 0..g.rows * g.cols / 32 {
        let (r, b) = (blk / (g.cols / 32), blk % (g.cols / 32));
        let src = &g.x[r * g.cols + 32 * b..][..32];
        if c.scales[blk] > max_scale(c.element) {
            assert_eq!(t.scales[blk], max_scale(c.element), "{what} block {blk}");
            capped += 1;
            continue;
        }
        assert_eq!(
            t.scales[blk], c.scales[blk],
            "{what} {:?} {:?}: scale of block ({r}, {b}) (flag {}), block {src:?}",
            c.element, c.rule, c.flags[blk]
        );
        assert_eq!(
            &codes[r * g.cols + 32 * b..][..32],
            &c.codes[r * g.cols + 32 * b..][..32],
            "{what} {:?} {:?}: codes of block ({r}, {b}) (flag {}), block {src:?}",
            c.element,
            c.rule,
            c.flags[blk]
        );
    }
    capped
}

#[test]
fn rowwise_matches_torchao() {
    let g = load();
    let mut flagged = 0;
    for c in &g.cases {
        let q = OperandQuant::mx(c.element, c.rule);
        let t = quantize(&g.x, g.rows, g.cols, Usage::Rowwise, &q, RngKey::default()).unwrap();
        let capped = check(&g, c, &t, "rowwise");
        assert!(
            capped <= 4,
            "{:?} {:?}: {capped} capped blocks",
            c.element,
            c.rule
        );
        assert_eq!(t.tensor_scale_inv, 1.0);
        flagged += c.n_flagged;
        assert_eq!(c.flags.iter().map(|&f| f as u32).sum::<u32>(), c.n_flagged);
    }
    // Every case checks at least 247 of its 256 blocks against torchao's own output.
    assert!(
        g.cases.iter().all(|c| c.n_flagged <= 13),
        "flagged blocks: {flagged}"
    );
}

#[test]
fn columnwise_matches_torchao_on_the_transpose() {
    // Quantizing xᵀ ([cols, rows]) columnwise stores x with 32x1 blocks down xᵀ's columns,
    // i.e. the golden rowwise layout of x.
    let g = load();
    let xt = transpose(&g.x, g.rows, g.cols);
    for c in &g.cases {
        let q = OperandQuant::mx(c.element, c.rule);
        let t = quantize(
            &xt,
            g.cols,
            g.rows,
            Usage::Columnwise,
            &q,
            RngKey::default(),
        )
        .unwrap();
        check(&g, c, &t, "columnwise");
    }
}

#[test]
fn fake_quantize_and_dequantize_match_golden_values() {
    let g = load();
    for c in &g.cases {
        let q = OperandQuant::mx(c.element, c.rule);
        let mut st = QuantState::new();
        let key = RngKey::default();
        let y = fake_quantize_with(&g.x, g.rows, g.cols, Usage::Rowwise, &q, key, &mut st).unwrap();
        let t = quantize_with(&g.x, g.rows, g.cols, Usage::Rowwise, &q, key, &mut st).unwrap();
        let d = t.dequantize();
        for i in 0..g.x.len() {
            if c.scales[i / 32] > max_scale(c.element) {
                // capped scale (issue #13): finite, saturated, same sign
                assert!(y[i].is_finite() && d[i].is_finite(), "element {i}");
                assert!(y[i] == 0.0 || y[i].signum() == g.x[i].signum());
                assert_eq!(y[i].to_bits(), d[i].to_bits());
                continue;
            }
            let want = mx_value(c.element, c.codes[i]) * fp_formats::E8M0(c.scales[i / 32]).value();
            assert_eq!(
                y[i].to_bits(),
                want.to_bits(),
                "{:?} {:?} element {i}",
                c.element,
                c.rule
            );
            assert_eq!(d[i].to_bits(), want.to_bits());
        }
    }
}

fn mx_value(e: MxElement, code: u8) -> f32 {
    fp_formats::mx::decode(e, code)
}

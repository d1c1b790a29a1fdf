//! `matmul` / `matmul_t` through `Graph` on the device against the CPU graph: forward and both
//! gradients, batched, transposed and with a shared right operand. Both sides multiply the
//! same f32 inputs and add `K` exact-in-f64 products in different orders, each within
//! `(K - 1) u Σ|ab|` of the exact sum (`u = 2⁻²⁴`); the two are checked within `2 (K + 1) u
//! Σ|ab|` per element, `Σ|ab|` computed here in f64.

use std::sync::Arc;

use autograd::backend::DeviceBackend;
use autograd::{init, Graph, ParamStore};

/// `S = |A| · |op(B)|` per output element for `batch` items of `A: [m, k]`, `B: [k, n]`
/// (`[n, k]` with `tb`), `B` shared when `b_items == 1`.
#[allow(clippy::too_many_arguments)]
fn abs_prod(
    a: &[f32],
    b: &[f32],
    (batch, m, k, n): (usize, usize, usize, usize),
    ta: bool,
    tb: bool,
    b_items: usize,
) -> Vec<f64> {
    let mut s = vec![0.0f64; batch * m * n];
    for i in 0..batch {
        let bi = if b_items == 1 { 0 } else { i };
        for r in 0..m {
            for c in 0..n {
                s[(i * m + r) * n + c] = (0..k)
                    .map(|q| {
                        let av = if ta {
                            a[(i * k + q) * m + r]
                        } else {
                            a[(i * m + r) * k + q]
                        };
                        let bv = if tb {
                            b[(bi * n + c) * k + q]
                        } else {
                            b[(bi * k + q) * n + c]
                        };
                        (av as f64 * bv as f64).abs()
                    })
                    .sum();
            }
        }
    }
    s
}

fn check(what: &str, got: &[f32], want: &[f32], s: &[f64], k: usize) -> f64 {
    assert_eq!(
        (got.len(), want.len()),
        (s.len(), s.len()),
        "{what}: lengths"
    );
    let u = f64::powi(2.0, -24);
    let mut worst = 0.0f64;
    for (i, ((&x, &y), &si)) in got.iter().zip(want).zip(s).enumerate() {
        let bound = 2.0 * (k as f64 + 1.0) * u * si;
        let d = (x as f64 - y as f64).abs();
        assert!(
            d <= bound,
            "{what}[{i}]: device {x} vs CPU {y}, |diff| {d:e} > {bound:e}"
        );
        if bound > 0.0 {
            worst = worst.max(d / bound);
        }
    }
    worst
}

/// Runs `c = a · op(b)` and its backward (seeded with `r`) on the CPU or `dev`: `(c, da, db)`.
fn run(
    dev: Option<&Arc<DeviceBackend>>,
    (a, sa): (&[f32], &[usize]),
    (b, sb): (&[f32], &[usize]),
    r: &[f32],
    trans: bool,
) -> [Vec<f32>; 3] {
    let mut ps = ParamStore::new();
    let pa = ps.add("a", sa, a.to_vec()).unwrap();
    let pb = ps.add("b", sb, b.to_vec()).unwrap();
    if let Some(d) = dev {
        ps.to_device(d).unwrap();
    }
    let mut g = Graph::new(&mut ps);
    let (ta, tb) = (g.param(pa).unwrap(), g.param(pb).unwrap());
    let c = if trans {
        g.matmul_t(ta, tb).unwrap()
    } else {
        g.matmul(ta, tb).unwrap()
    };
    let cv = g.to_vec(c).unwrap();
    g.backward_with(c, r).unwrap();
    drop(g);
    [
        cv,
        ps.download_grad(pa).unwrap(),
        ps.download_grad(pb).unwrap(),
    ]
}

/// The three products of autograd's matmul gradcheck, on the device against the CPU.
pub fn matmul_matches_cpu_within_bound(dev: &Arc<DeviceBackend>) {
    let (bt, m, k) = (6, 4, 37); // 2 x 3 batch items, K over two 16-wide tiles
    let a = init::normal(bt * m * k, 0.5, 1);
    let cases: [(&str, usize, bool, usize); 3] = [
        ("matmul", 5, false, bt),  // b: [2, 3, K, 5]
        ("matmul_t", 6, true, bt), // b: [2, 3, 6, K]
        ("shared", 3, false, 1),   // b: [K, 3]
    ];
    let mut worst = 0.0f64;
    for (name, n, trans, b_items) in cases {
        let b = init::normal(b_items * k * n, 0.5, 2 + n as u64);
        let sb: Vec<usize> = match (b_items, trans) {
            (1, _) => vec![k, n],
            (_, true) => vec![2, 3, n, k],
            _ => vec![2, 3, k, n],
        };
        let r = init::normal(bt * m * n, 1.0, 9);
        let sa = [2, 3, m, k];
        let cpu = run(None, (&a, &sa), (&b, &sb), &r, trans);
        let dv = run(Some(dev), (&a, &sa), (&b, &sb), &r, trans);
        // C = A · op(B)
        let s = abs_prod(&a, &b, (bt, m, k, n), false, trans, b_items);
        worst = worst.max(check(&format!("{name} C"), &dv[0], &cpu[0], &s, k));
        // dA = R · op(B)ᵀ: op(B)ᵀ is [n, k], i.e. B read with the other transposition
        let s = abs_prod(&r, &b, (bt, m, n, k), false, !trans, b_items);
        worst = worst.max(check(&format!("{name} dA"), &dv[1], &cpu[1], &s, n));
        // dB = Aᵀ · R ([k, n]) or Rᵀ · A ([n, k]); a shared B sums over all rows
        let (items, rows) = if b_items == 1 { (1, bt * m) } else { (bt, m) };
        let s = if trans {
            abs_prod(&r, &a, (items, n, rows, k), true, false, items)
        } else {
            abs_prod(&a, &r, (items, k, rows, n), true, false, items)
        };
        worst = worst.max(check(&format!("{name} dB"), &dv[2], &cpu[2], &s, rows));
    }
    eprintln!("matmul / matmul_t on the device: worst |diff| / bound {worst:.3}");
}

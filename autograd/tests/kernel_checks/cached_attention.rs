//! `cached_attention` (the sampler's decode step) on the device against the CPU op: both within
//! the componentwise bound of `attention_reference` (f64 causal attention with the error
//! bound of any f32 implementation) for every new query row, for a prefill (`past = 0`) and
//! decode steps (`Tn = 1` and `Tn = 3` after a prefix), with the cache filled beyond the
//! visible positions by garbage that must not leak in.

use std::sync::Arc;

use autograd::backend::DeviceBackend;
use autograd::{init, Graph, ParamStore};

use super::attention_reference;

fn run(
    dev: Option<&Arc<DeviceBackend>>,
    q: &[f32],
    kv: (&[f32], &[f32]),
    dims: [usize; 4],
    cap: usize,
    past: usize,
) -> Vec<f32> {
    let mut ps = ParamStore::new();
    if let Some(d) = dev {
        ps.to_device(d).unwrap();
    }
    let mut g = Graph::new(&mut ps);
    let qt = g.input(q, &dims).unwrap();
    let o = g.cached_attention(qt, kv.0, kv.1, cap, past).unwrap();
    g.to_vec(o).unwrap()
}

/// Device and CPU cached attention within the reference bound.
pub fn cached_attention_within_reference_bound(dev: &Arc<DeviceBackend>) {
    let (b, h, d, cap) = (1, 2, 16, 40);
    let bh = b * h;
    let mut k = init::normal(bh * cap * d, 1.0, 31);
    let mut v = init::normal(bh * cap * d, 1.0, 32);
    let mut worst = 0.0f64;
    for (past, tn) in [(0, 5), (7, 1), (20, 3)] {
        let t = past + tn;
        // invisible cache rows: large garbage
        for hh in 0..bh {
            for x in &mut k[hh * cap * d + t * d..(hh + 1) * cap * d] {
                *x = 1e4;
            }
            for x in &mut v[hh * cap * d + t * d..(hh + 1) * cap * d] {
                *x = -1e4;
            }
        }
        let q = init::normal(bh * tn * d, 1.0, 33 + past as u64);
        let dims = [b, h, tn, d];
        let cpu = run(None, &q, (&k, &v), dims, cap, past);
        let dv = run(Some(dev), &q, (&k, &v), dims, cap, past);
        for hh in 0..bh {
            // the head's first t positions, the new queries at their positions
            let kh = &k[hh * cap * d..hh * cap * d + t * d];
            let vh = &v[hh * cap * d..hh * cap * d + t * d];
            let mut qf = vec![0.0f32; t * d];
            qf[past * d..].copy_from_slice(&q[hh * tn * d..(hh + 1) * tn * d]);
            let r = attention_reference(&qf, kh, vh, &vec![0.0; t * d], t, d);
            for i in 0..tn * d {
                let (j, idx) = (hh * tn * d + i, past * d + i);
                let (exact, bound) = (r.o[idx], r.o_bound[idx]);
                for (who, got) in [("device", dv[j]), ("CPU", cpu[j])] {
                    let e = (got as f64 - exact).abs();
                    assert!(
                        e <= bound,
                        "past {past} tn {tn} head {hh} element {i}: {who} {got} vs exact {exact}, error {e:e} > {bound:e}"
                    );
                    worst = worst.max(e / bound);
                }
            }
        }
    }
    eprintln!("cached attention (device and CPU) vs f64: worst error / bound {worst:.3}");
}

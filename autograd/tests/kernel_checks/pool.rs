//! The device buffer pool: a second training step of the tiny model (a fresh store and graph,
//! the same shapes) allocates no new f32 device buffer, and its results are the first step's
//! bits (a reused buffer is zero-filled like a new one).

use std::sync::Arc;

use autograd::backend::{DeviceBackend, PoolStats};
use quant::GemmPolicy;

use super::{same_bits, TinyModel};

fn stats(dev: &DeviceBackend) -> PoolStats {
    dev.launcher().pool_stats()
}

/// Two NVFP4 steps of the tiny model on `dev` (no other test using it meanwhile).
pub fn pool_reuses_device_buffers(dev: &Arc<DeviceBackend>) {
    let m = TinyModel::new();
    let p = GemmPolicy::nvfp4_paper();
    // an empty pool (on a GPU the backend is shared by the tests, which run one at a time)
    dev.launcher().release_pool();
    let s0 = stats(dev);
    let (l1, g1) = m.graph_step_on(&p, Some(dev)).unwrap();
    let s1 = stats(dev);
    let (l2, g2) = m.graph_step_on(&p, Some(dev)).unwrap();
    let s2 = stats(dev);
    let req = |a: PoolStats, b: PoolStats| (b.allocated + b.reused) - (a.allocated + a.reused);
    eprintln!(
        "device buffers per step (f32 zeros requests / new allocations): first {} / {}, second {} / {}",
        req(s0, s1),
        s1.allocated - s0.allocated,
        req(s1, s2),
        s2.allocated - s1.allocated
    );
    assert!(s1.allocated > s0.allocated);
    assert_eq!(req(s0, s1), req(s1, s2), "the same requests each step");
    assert_eq!(
        s2.allocated, s1.allocated,
        "the second step reuses every buffer"
    );
    assert_eq!(l1.to_bits(), l2.to_bits());
    for (a, b) in g1.iter().zip(&g2) {
        same_bits("second-step gradient", a, b);
    }
    dev.launcher().release_pool();
}

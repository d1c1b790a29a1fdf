//! AdamW step on 10M parameters vs a memcpy touching the same number of bytes.
//!
//! Bytes touched per element by a step: parameter read + write, gradient read, both moments read +
//! write = 7 x 4 = 28 bytes. The memcpy copies 14 bytes per element (14 read + 14 written). Both are
//! reported by criterion as throughput of bytes touched, so their GB/s are directly comparable. A
//! memcpy writes to a second buffer (the CPU reads each destination line before writing it), so an
//! in-place read-modify-write of the same byte count (`x *= a` over 7 f32 per element) is reported
//! too: that is the roofline for an in-place update like AdamW's.
//!
//! Run: `cargo bench -p optim --bench adamw`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use optim::{AdamW, AdamWConfig, ParamGroup, ParamSpec};
use std::hint::black_box;
use std::time::Duration;

const N: usize = 10_000_000;
const BYTES_PER_ELEMENT: u64 = 28;

fn bench(c: &mut Criterion) {
    // A transformer-like split: three matrices with decay, one small no-decay vector.
    let lens = [6_000_000, 2_500_000, 1_496_000, 4_000];
    assert_eq!(lens.iter().sum::<usize>(), N);
    let specs: Vec<ParamSpec> = lens
        .iter()
        .enumerate()
        .map(|(i, &n)| ParamSpec::new(n, usize::from(i == 3)))
        .collect();
    let groups = [ParamGroup::new(0.1, 1.0), ParamGroup::no_decay()];
    let mut params: Vec<Vec<f32>> = lens
        .iter()
        .map(|&n| (0..n).map(|i| ((i % 1000) as f32 - 500.0) * 1e-3).collect())
        .collect();
    let grads: Vec<Vec<f32>> = lens
        .iter()
        .map(|&n| (0..n).map(|i| ((i % 777) as f32 - 388.0) * 1e-4).collect())
        .collect();
    let grad_refs: Vec<&[f32]> = grads.iter().map(|g| &g[..]).collect();

    let mut group = c.benchmark_group("adamw_10M");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .throughput(Throughput::Bytes(N as u64 * BYTES_PER_ELEMENT));

    for (name, threshold) in [("step_1thread", usize::MAX), ("step_rayon", 0)] {
        let mut opt = AdamW::with_groups(AdamWConfig::default(), &groups, &specs).unwrap();
        opt.set_parallel_threshold(threshold);
        group.bench_function(name, |b| {
            b.iter(|| {
                let mut refs: Vec<&mut [f32]> = params.iter_mut().map(|p| &mut p[..]).collect();
                opt.step(&mut refs, &grad_refs, 1e-4).unwrap();
            })
        });
    }

    let half = N * BYTES_PER_ELEMENT as usize / 2;
    let src = vec![1u8; half];
    let mut dst = vec![0u8; half];
    group.bench_function("memcpy_same_bytes", |b| {
        b.iter(|| {
            dst.copy_from_slice(black_box(&src));
            black_box(&mut dst);
        })
    });
    let mut rmw = vec![1.0f32; N * 7 / 2];
    group.bench_function("inplace_rmw_same_bytes", |b| {
        b.iter(|| {
            let a = black_box(1.000_001f32);
            rmw.iter_mut().for_each(|x| *x *= a);
            black_box(&mut rmw);
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

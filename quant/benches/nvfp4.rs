//! NVFP4 quantization throughput (bytes of f32 input per second) beside a memcpy of the same
//! bytes, on explicit 1- and 2-thread rayon pools.
//!
//! Shapes: 4096x4096 and 8192x1024 f32. Cases: rowwise 1x16 RNE (Fprop activations),
//! columnwise 1x16 + RHT + SR (Wgrad gradients), 16x16 tiles rowwise (weights), and the
//! fused fake-quantization path of the columnwise + RHT + SR case.
//!
//! Run: `cargo bench -p quant --bench nvfp4`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use quant::{
    BlockShape, MatRef, OperandQuant, QuantState, Quantizer, Rht, RngKey, RoundingMode, Usage,
};
use std::hint::black_box;
use std::time::Duration;

fn data(n: usize) -> Vec<f32> {
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let pools: Vec<(usize, rayon::ThreadPool)> = [1, 2]
        .into_iter()
        .map(|n| {
            (
                n,
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n)
                    .build()
                    .unwrap(),
            )
        })
        .collect();
    let key = RngKey { seed: 1, stream: 2 };
    let act = OperandQuant::nvfp4();
    let grad = act
        .with_rht(Rht::FixedSigns)
        .with_rounding(RoundingMode::Stochastic);
    let weight = act.with_block(BlockShape::Tile16);
    for (rows, cols) in [(4096usize, 4096usize), (8192, 1024)] {
        let x = data(rows * cols);
        let bytes = (rows * cols * 4) as u64;
        let mut group = c.benchmark_group(format!("nvfp4_{rows}x{cols}"));
        group
            .sample_size(10)
            .warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_secs(1))
            .throughput(Throughput::Bytes(bytes));
        let mut dst = vec![0.0f32; rows * cols];
        group.bench_function("memcpy", |b| {
            b.iter(|| dst.copy_from_slice(black_box(&x)));
        });
        for (threads, pool) in &pools {
            let cases = [
                ("row_1x16", Usage::Rowwise, act),
                ("col_rht_sr", Usage::Columnwise, grad),
                ("row_16x16", Usage::Rowwise, weight),
            ];
            for (name, usage, q) in cases {
                group.bench_function(BenchmarkId::new(name, format!("{threads}t")), |b| {
                    b.iter(|| {
                        let q = Quantizer::new(q, usage).unwrap().with_key(key);
                        let x = MatRef::new(black_box(&x), rows, cols).unwrap();
                        pool.install(|| q.quantize(x, &mut QuantState::new()))
                            .unwrap()
                    })
                });
            }
            group.bench_function(
                BenchmarkId::new("fake_col_rht_sr", format!("{threads}t")),
                |b| {
                    b.iter(|| {
                        let q = Quantizer::new(grad, Usage::Columnwise)
                            .unwrap()
                            .with_key(key);
                        let x = MatRef::new(black_box(&x), rows, cols).unwrap();
                        pool.install(|| q.fake_quantize_into(x, &mut QuantState::new(), &mut dst))
                            .unwrap()
                    })
                },
            );
        }
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);

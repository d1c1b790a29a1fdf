//! Throughput of the MXFP8 (rowwise, E4M3, RCEIL) and per-tensor FP8 (current scaling,
//! E4M3) quantizers on 4096x4096 and 8192x1024 f32 inputs, beside a memcpy of the same bytes,
//! on 1 and 2 rayon threads (explicit thread pools); and the emulated NVFP4 GEMM
//! (X 1x16 RNE, W 16x16 RNE) against the plain f32 GEMM at M=2048, N=1024, K=1024.
//!
//! `cargo bench -p quant --bench mx_fp8_gemm`. Criterion reports GB/s of f32 input; the
//! NVFP4 GEMM overhead ratio (median emulated / median f32) is printed at the end.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fp_formats::mx::{MxElement, ScaleRule};
use quant::gemm::matmul_tn;
use quant::qgemm::{quantized_matmul_tn, Operand};
use quant::{BlockShape, Fp8Element, MatRef, OperandQuant, QuantState, Quantizer, Usage};
use rayon::prelude::*;

fn data(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u32).wrapping_mul(2_654_435_761);
            ((h >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * (1.0 + (h & 7) as f32)
        })
        .collect()
}

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
}

fn quantizers(c: &mut Criterion) {
    let mxq = OperandQuant::mx(MxElement::E4M3, ScaleRule::Rceil);
    let fp8q = OperandQuant::fp8_current(Fp8Element::E4M3);
    for (rows, cols) in [(4096usize, 4096usize), (8192, 1024)] {
        let x = data(rows * cols);
        let mut dst = vec![0.0f32; rows * cols];
        let mut g = c.benchmark_group(format!("quantize_{rows}x{cols}"));
        g.sample_size(10)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2));
        g.throughput(Throughput::Bytes((rows * cols * 4) as u64));
        for threads in [1usize, 2] {
            let p = pool(threads);
            g.bench_function(BenchmarkId::new("memcpy", threads), |b| {
                p.install(|| {
                    b.iter(|| {
                        dst.par_chunks_mut(1 << 16)
                            .zip(x.par_chunks(1 << 16))
                            .for_each(|(d, s)| d.copy_from_slice(s));
                        black_box(&dst);
                    })
                })
            });
            g.bench_function(BenchmarkId::new("mxfp8_e4m3_rowwise", threads), |b| {
                p.install(|| {
                    b.iter(|| {
                        black_box(
                            Quantizer::new(mxq, Usage::Rowwise)
                                .unwrap()
                                .quantize(
                                    MatRef::new(&x, rows, cols).unwrap(),
                                    &mut QuantState::new(),
                                )
                                .unwrap(),
                        )
                    })
                })
            });
            g.bench_function(BenchmarkId::new("fp8_current_e4m3", threads), |b| {
                p.install(|| {
                    b.iter(|| {
                        let mut st = QuantState::new();
                        black_box(
                            Quantizer::new(fp8q, Usage::Rowwise)
                                .unwrap()
                                .quantize(MatRef::new(&x, rows, cols).unwrap(), &mut st)
                                .unwrap(),
                        )
                    })
                })
            });
        }
        g.finish();
    }
}

fn nvfp4_gemm(c: &mut Criterion) {
    let (m, n, k) = (2048usize, 1024usize, 1024usize);
    let x = data(m * k);
    let w = data(n * k);
    let xq = OperandQuant::nvfp4();
    let wq = OperandQuant::nvfp4().with_block(BlockShape::Tile16);
    let mut out = vec![0.0f32; m * n];
    let mut plain = || matmul_tn(&x, &w, m, n, k, black_box(&mut out));
    let mut g = c.benchmark_group("gemm_2048x1024x1024");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    g.throughput(Throughput::Elements((2 * m * n * k) as u64));
    g.bench_function("f32_sgemm", |b| b.iter(&mut plain));
    let (xm, wm) = (
        MatRef::new(&x, m, k).unwrap(),
        MatRef::new(&w, n, k).unwrap(),
    );
    let xqz = Quantizer::new(xq, Usage::Rowwise).unwrap();
    let wqz = Quantizer::new(wq, Usage::Rowwise).unwrap();
    let mut out2 = vec![0.0f32; m * n];
    let mut emulated = || {
        quantized_matmul_tn(
            Operand::new(xm, xqz),
            Operand::new(wm, wqz),
            black_box(&mut out2),
        )
        .unwrap()
    };
    g.bench_function("nvfp4_emulated", |b| b.iter(&mut emulated));
    g.finish();

    // The overhead ratio from interleaved runs (medians of 7).
    let median = |f: &mut dyn FnMut()| {
        let mut t: Vec<Duration> = (0..7)
            .map(|_| {
                let s = Instant::now();
                f();
                s.elapsed()
            })
            .collect();
        t.sort();
        t[3]
    };
    let mut out3 = vec![0.0f32; m * n];
    let tp = median(&mut || matmul_tn(&x, &w, m, n, k, black_box(&mut out3)));
    let te = median(&mut || {
        quantized_matmul_tn(
            Operand::new(xm, xqz),
            Operand::new(wm, wqz),
            black_box(&mut out3),
        )
        .unwrap()
    });
    let mut fq = vec![0.0f32; m * k];
    let tq = median(&mut || {
        let mut st = QuantState::new();
        xqz.fake_quantize_into(xm, &mut st, &mut fq).unwrap();
    });
    eprintln!(
        "NVFP4 emulated GEMM {m}x{n}x{k}: f32 {:.1} ms, emulated {:.1} ms, overhead ratio {:.3} \
         (X fake-quantize alone {:.1} ms)",
        tp.as_secs_f64() * 1e3,
        te.as_secs_f64() * 1e3,
        te.as_secs_f64() / tp.as_secs_f64(),
        tq.as_secs_f64() * 1e3
    );
}

criterion_group!(benches, quantizers, nvfp4_gemm);
criterion_main!(benches);

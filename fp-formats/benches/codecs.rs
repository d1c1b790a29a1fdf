//! Single-thread throughput of the hot conversion paths on a 4096 x 4096 f32 matrix, each
//! beside a `memcpy` (`copy_from_slice` into a preallocated buffer) of the same number of
//! bytes measured in the same run.
//!
//! Throughput is in bytes of **input**: the 64 MiB f32 matrix for the encoders and
//! quantizers, the codes plus scales for the dequantizers (whose output is the 64 MiB f32
//! matrix).
//!
//! ```text
//! CARGO_TARGET_DIR=/work/target-fpbench cargo bench -p fp-formats --bench codecs
//! ```
//!
//! Environment:
//! * `FP_FORMATS_BENCH_CLOCK=cpu` times with the thread's CPU clock (Linux) instead of wall
//!   time, which keeps the numbers meaningful on a machine shared with other jobs (time
//!   spent descheduled is not counted; cache and memory contention still is).
//! * `FP_FORMATS_FORCE_PORTABLE=1` (read by the library) measures the portable fallback
//!   instead of the AVX2 kernels.

use std::hint::black_box;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, Bencher, BenchmarkGroup, Criterion, Throughput};
use fp_formats::mx::{self, MxElement, MxOptions, ScaleRule};
use fp_formats::nvfp4::{self, Nvfp4Options};
use fp_formats::{E2M1, E4M3};

const ROWS: usize = 4096;
const COLS: usize = 4096;

/// Deterministic normal-ish data: a sum of four uniforms (Irwin-Hall), centred, with unit
/// variance, from a SplitMix64 stream.
fn matrix() -> Vec<f32> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    (0..ROWS * COLS)
        .map(|_| {
            let r = next();
            let s: u32 = (0..4).map(|k| ((r >> (16 * k)) & 0xFFFF) as u32).sum();
            ((s as f32 / 65536.0) - 2.0) * 3.0f32.sqrt()
        })
        .collect()
}

/// CPU time consumed by the calling thread so far (Linux), or `None`.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
fn thread_cpu_time() -> Option<Duration> {
    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut t = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid, writable timespec; clock_gettime only writes to it.
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut t) };
    (rc == 0).then(|| Duration::new(t.tv_sec as u64, t.tv_nsec as u32))
}

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
fn thread_cpu_time() -> Option<Duration> {
    None
}

fn cpu_clock() -> bool {
    std::env::var("FP_FORMATS_BENCH_CLOCK").is_ok_and(|v| v == "cpu") && thread_cpu_time().is_some()
}

/// `b.iter(f)`, or the same loop timed with the thread CPU clock.
fn run<O>(b: &mut Bencher<'_>, mut f: impl FnMut() -> O) {
    if cpu_clock() {
        b.iter_custom(|iters| {
            let start = thread_cpu_time().unwrap();
            for _ in 0..iters {
                black_box(f());
            }
            thread_cpu_time().unwrap() - start
        })
    } else {
        b.iter(f)
    }
}

fn memcpy_bench(group: &mut BenchmarkGroup<'_, WallTime>, bytes: usize) {
    let src = vec![0x5Au8; bytes];
    let mut dst = vec![0u8; bytes];
    group.bench_function("memcpy", |b| {
        run(b, || {
            dst.copy_from_slice(black_box(&src));
            black_box(&mut dst);
        })
    });
}

fn configure(group: &mut BenchmarkGroup<'_, WallTime>, bytes: usize) {
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .throughput(Throughput::Bytes(bytes as u64));
}

fn quantizers(c: &mut Criterion) {
    let x = matrix();
    let bytes = std::mem::size_of_val(&x[..]);
    let mut group = c.benchmark_group("f32_4096x4096");
    configure(&mut group, bytes);
    memcpy_bench(&mut group, bytes);

    let mut packed = vec![0u8; x.len() / 2];
    group.bench_function("e2m1_encode_packed", |b| {
        run(b, || E2M1::encode_slice_packed(black_box(&x), &mut packed))
    });
    let mut e4m3 = vec![0u8; x.len()];
    group.bench_function("e4m3_encode_rne_sat", |b| {
        run(b, || E4M3::encode_slice_rne_sat(black_box(&x), &mut e4m3))
    });
    group.bench_function("nvfp4_quantize", |b| {
        run(b, || {
            nvfp4::quantize(black_box(&x), ROWS, COLS, Nvfp4Options::default()).unwrap()
        })
    });
    let opts = MxOptions::new(MxElement::E4M3, ScaleRule::Rceil);
    group.bench_function("mxfp8_e4m3_rceil_quantize", |b| {
        run(b, || mx::quantize(black_box(&x), ROWS, COLS, opts).unwrap())
    });
    let opts = MxOptions::new(MxElement::E2M1, ScaleRule::Rceil);
    group.bench_function("mxfp4_rceil_quantize", |b| {
        run(b, || mx::quantize(black_box(&x), ROWS, COLS, opts).unwrap())
    });
    group.finish();
}

fn dequantizers(c: &mut Criterion) {
    let x = matrix();
    let mut out = vec![0.0f32; x.len()];

    let q = nvfp4::quantize(&x, ROWS, COLS, Nvfp4Options::default()).unwrap();
    let bytes = q.codes.len() + q.scales.len();
    let mut group = c.benchmark_group("nvfp4_dequantize_4096x4096");
    configure(&mut group, bytes);
    memcpy_bench(&mut group, bytes);
    group.bench_function("nvfp4_dequantize_into", |b| {
        run(b, || black_box(&q).dequantize_into(&mut out))
    });
    group.finish();

    let opts = MxOptions::new(MxElement::E4M3, ScaleRule::Rceil);
    let q = mx::quantize(&x, ROWS, COLS, opts).unwrap();
    let bytes = q.codes.len() + q.scales.len();
    let mut group = c.benchmark_group("mxfp8_dequantize_4096x4096");
    configure(&mut group, bytes);
    memcpy_bench(&mut group, bytes);
    group.bench_function("mxfp8_e4m3_dequantize_into", |b| {
        run(b, || black_box(&q).dequantize_into(&mut out))
    });
    group.finish();
}

criterion_group!(benches, quantizers, dequantizers);
criterion_main!(benches);

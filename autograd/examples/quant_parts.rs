//! Times the NVFP4 operand quantizations of one linear layer at the step_bench shapes (dev
//! aid): `cargo run --release -p autograd --example quant_parts -- [reps]`.
//!
//! For each operand of `GemmPolicy::nvfp4_paper()` (and BF16 for comparison): the fake
//! quantization that the emulated GEMM runs (`quant::Quantizer::fake_quantize_into`) on 1- and
//! 2-thread rayon pools, as the minimum over `reps` runs, in ms and ns per element; then a
//! memcpy of the same bytes, the f32 GEMM of the layer and the whole emulated Wgrad GEMM
//! (`quant::qgemm::quantized_matmul_tn`) in FP32 and NVFP4. Environment: `COLD=1` evicts the
//! caches (64 MiB of writes) before every run, as a training step's GEMMs do; `ONLY=<text>`
//! runs only the quantizer rows whose name contains the text. The MX rows time the
//! operands of `GemmPolicy::mxfp8()` (E4M3, RCEIL, RNE) and an MXFP4 (E2M1, FLOOR) case; the
//! FP8 rows those of `GemmPolicy::fp8_current_hybrid()` (the `fp8-current` recipe: E4M3 X and
//! W, E5M2 dY, current scaling; "col" is the stored layout, the emulated GEMM's columnwise
//! operand is the rowwise cast read through a transposed view), a delayed-scaling and a
//! stochastic-rounding case, and the codes path (`Quantizer::quantize`, "codes" rows).
use std::time::Instant;

use fp_formats::mx::{MxElement, ScaleRule};
use quant::gemm::{sgemm, MatRef};
use quant::qgemm::{quantized_matmul_tn, Operand};
use quant::{
    AmaxAlgo, Fp8Element, Fp8Scaling, GemmPolicy, OperandQuant, QuantFormat, QuantState, Quantizer,
    RngKey, RoundingMode, Usage,
};

fn best(reps: usize, mut f: impl FnMut()) -> f64 {
    let cold = std::env::var_os("COLD").is_some();
    let mut junk = if cold { vec![1.0f32; 16 << 20] } else { vec![] };
    let mut b = f64::MAX;
    for _ in 0..reps {
        for v in junk.iter_mut() {
            *v += 1.0;
        }
        let t0 = Instant::now();
        f();
        b = b.min(t0.elapsed().as_secs_f64());
    }
    b
}

fn main() {
    let reps: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let only = std::env::var("ONLY").ok();
    let p = GemmPolicy::nvfp4_paper();
    let (t, d, h) = (2048, 256, 768);
    let x = autograd::init::normal(2 * t * h, 1.0, 1);
    let key = RngKey { seed: 1, stream: 9 };
    let b = OperandQuant::BF16;
    let m8 = GemmPolicy::mxfp8().fprop.a;
    let m4 = OperandQuant::mx(MxElement::E2M1, ScaleRule::Floor);
    let f8 = GemmPolicy::fp8_current_hybrid();
    let (e4, e5) = (f8.fprop.a, f8.dgrad.a);
    let e4_delayed = OperandQuant {
        format: QuantFormat::Fp8 {
            element: Fp8Element::E4M3,
            scaling: Fp8Scaling::Delayed {
                history_len: 16,
                margin: 0,
                algo: AmaxAlgo::Max,
            },
        },
        ..e4
    };
    let e5_sr = e5.with_rounding(RoundingMode::Stochastic);
    let cases: [(&str, usize, usize, Usage, OperandQuant); 22] = [
        ("bf16 row [2048,768]", t, h, Usage::Rowwise, b),
        ("bf16 col [2048,768]", t, h, Usage::Columnwise, b),
        ("X row 1x16 [2048,256]", t, d, Usage::Rowwise, p.fprop.a),
        ("W row 16x16 [768,256]", h, d, Usage::Rowwise, p.fprop.b),
        ("dY row SR [2048,768]", t, h, Usage::Rowwise, p.dgrad.a),
        ("W col 16x16 [768,256]", h, d, Usage::Columnwise, p.dgrad.b),
        (
            "dY col RHT SR [2048,768]",
            t,
            h,
            Usage::Columnwise,
            p.wgrad.a,
        ),
        ("X col RHT [2048,256]", t, d, Usage::Columnwise, p.wgrad.b),
        ("mxfp8 X row [2048,256]", t, d, Usage::Rowwise, m8),
        ("mxfp8 W row [768,256]", h, d, Usage::Rowwise, m8),
        ("mxfp8 dY row [2048,768]", t, h, Usage::Rowwise, m8),
        ("mxfp8 dY col [2048,768]", t, h, Usage::Columnwise, m8),
        ("mxfp8 X col [2048,256]", t, d, Usage::Columnwise, m8),
        ("mxfp4 dY row [2048,768]", t, h, Usage::Rowwise, m4),
        ("fp8 X row e4m3 [2048,256]", t, d, Usage::Rowwise, e4),
        ("fp8 W row e4m3 [768,256]", h, d, Usage::Rowwise, e4),
        ("fp8 dY row e5m2 [2048,768]", t, h, Usage::Rowwise, e5),
        ("fp8 dY col e5m2 [2048,768]", t, h, Usage::Columnwise, e5),
        (
            "fp8 X row delayed [2048,256]",
            t,
            d,
            Usage::Rowwise,
            e4_delayed,
        ),
        ("fp8 dY row e5m2 SR [2048,768]", t, h, Usage::Rowwise, e5_sr),
        ("fp8 codes X row e4m3 [2048,256]", t, d, Usage::Rowwise, e4),
        ("fp8 codes dY row e5m2 [2048,768]", t, h, Usage::Rowwise, e5),
    ];
    for threads in [1, 2] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let selected = cases
                .iter()
                .filter(|c| only.as_deref().is_none_or(|o| c.0.contains(o)));
            for (name, r, c, usage, q) in selected {
                let n = r * c;
                let mut out = vec![0.0f32; n];
                let mut st = QuantState::new();
                let codes = name.contains("codes");
                let qz = Quantizer::new(*q, *usage).unwrap().with_key(key);
                let xm = MatRef::new(&x[..n], *r, *c).unwrap();
                let s = best(reps, || {
                    if codes {
                        let t = qz.quantize(xm, &mut st).unwrap();
                        std::hint::black_box(t);
                    } else {
                        qz.fake_quantize_into(xm, &mut st, &mut out).unwrap();
                    }
                });
                println!(
                    "{threads}t {name:<33} {:>8.3} ms {:>6.2} ns/elem",
                    s * 1e3,
                    s * 1e9 / n as f64
                );
            }
        });
    }
    if only.is_some() {
        return;
    }
    let n = t * h;
    let mut dst = vec![0.0f32; n];
    let s = best(reps, || {
        dst.copy_from_slice(std::hint::black_box(&x[..n]));
        std::hint::black_box(&mut dst);
    });
    println!(
        "memcpy [2048,768]              {:>8.3} ms {:>6.2} ns/elem",
        s * 1e3,
        s * 1e9 / n as f64
    );
    let (xs, dy) = (&x[..t * d], &x[t * h..2 * t * h]);
    let mut y = vec![0.0f32; t * h];
    let s = best(reps, || {
        sgemm(
            1.0,
            MatRef::row_major(xs, t, d),
            MatRef::row_major(&x[..h * d], h, d).t(),
            0.0,
            &mut y,
        )
    });
    println!(
        "sgemm [2048,256]x[256,768]     {:>8.3} ms ({:.0} GFLOP/s, 2 threads)",
        s * 1e3,
        2.0 * (t * d * h) as f64 / s * 1e-9
    );
    let mut dw = vec![0.0f32; h * d];
    for (name, pol) in [
        ("fp32", GemmPolicy::FP32),
        ("nvfp4", p),
        ("mxfp8", GemmPolicy::mxfp8()),
        ("fp8", f8),
    ] {
        let s = best(reps, || {
            quantized_matmul_tn(
                Operand::new(
                    MatRef::new(dy, t, h).unwrap(),
                    Quantizer::new(pol.wgrad.a, Usage::Columnwise)
                        .unwrap()
                        .with_key(key),
                ),
                Operand::new(
                    MatRef::new(xs, t, d).unwrap(),
                    Quantizer::new(pol.wgrad.b, Usage::Columnwise)
                        .unwrap()
                        .with_key(key),
                ),
                &mut dw,
            )
            .unwrap()
        });
        println!("Wgrad GEMM {name:<6}              {:>8.3} ms", s * 1e3);
    }
}

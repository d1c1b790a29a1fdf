//! The kernel checks shared by `cuda_emulated.rs` (the CUDA kernels on the CPU emulator) and
//! `cuda_gpu.rs` (the same kernels on a GPU): each compares a [`Backend`]'s kernels with
//! autograd's CPU ops through the public `Graph` API, bit for bit where the kernels mirror the
//! CPU's order of operations, otherwise within a bound derived in the check.
#![allow(dead_code)]

pub mod cached_attention;
pub mod matmul;
pub mod optimizer;
pub mod pool;
pub mod quant_linear;

use std::sync::Arc;

use autograd::backend::{
    rope_table, Act, AdamWCoeffs, Backend, BackendError, CpuBackend, CudaBackend, DeviceBackend,
    NormKind,
};
use autograd::{gemm_stream, init, AttentionProducts, Graph, OperandRole, ParamStore};
use quant::{GemmPolicy, OperandQuant, RngKey, Usage};

#[track_caller]
pub fn same_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!(
            "{what}: element {i} differs: kernel {:e} ({:#010x}) vs CPU {:e} ({:#010x})",
            got[i],
            got[i].to_bits(),
            want[i],
            want[i].to_bits()
        );
    }
}

pub fn up<B: Backend>(b: &B, x: &[f32]) -> B::Buf {
    b.upload(x).unwrap()
}

pub fn down<B: Backend>(b: &B, x: &B::Buf) -> Vec<f32> {
    b.download(x).unwrap()
}

pub fn zeros<B: Backend>(b: &B, n: usize) -> B::Buf {
    b.zeros(n).unwrap()
}

/// Row counts that take the CPU kernels' single-task path (< 2^15 elements) and their
/// parallel, chunked path.
pub const SHAPES: [(usize, usize); 3] = [(3, 20), (7, 48), (300, 128)];

pub fn elementwise_and_reductions_are_bit_exact<B: Backend>(e: &B, shapes: &[(usize, usize)]) {
    for (i, &(rows, n)) in shapes.iter().enumerate() {
        let s = i as u64 * 10;
        let (av, bv) = (
            init::normal(rows * n, 1.0, s + 1),
            init::normal(rows * n, 1.0, s + 2),
        );
        let (cv, r) = (
            init::normal(n, 1.0, s + 3),
            init::normal(rows * n, 1.0, s + 4),
        );
        let mut ps = ParamStore::new();
        let mut g = Graph::new(&mut ps);
        let a = g.variable(&av, &[rows, n]).unwrap();
        let b = g.variable(&bv, &[rows, n]).unwrap();
        let c = g.variable(&cv, &[n]).unwrap();
        let ab = g.mul(a, b).unwrap();
        let abc = g.mul(ab, c).unwrap();
        let s1 = g.add(abc, c).unwrap();
        let y = g.scale(s1, -1.5).unwrap();
        let yr = g.round_bf16(y).unwrap();
        let tot = g.sum(yr).unwrap();
        let mean = g.mean(y).unwrap();
        let (yv, yrv) = (g.to_vec(y).unwrap(), g.to_vec(yr).unwrap());
        let (tv, mv) = (g.item(tot).unwrap(), g.item(mean).unwrap());
        g.backward_with(y, &r).unwrap();
        let (ga, gb, gc) = (
            g.grad(a).unwrap().unwrap().to_vec(),
            g.grad(b).unwrap().unwrap().to_vec(),
            g.grad(c).unwrap().unwrap().to_vec(),
        );
        drop(g);

        let (da, db, dc, dr) = (up(e, &av), up(e, &bv), up(e, &cv), up(e, &r));
        let mut dab = zeros(e, rows * n);
        e.mul(&da, &db, (false, &mut dab)).unwrap();
        let mut dabc = zeros(e, rows * n);
        e.mul(&dab, &dc, (false, &mut dabc)).unwrap();
        let mut ds1 = zeros(e, rows * n);
        e.add(&dabc, &dc, &mut ds1).unwrap();
        let mut dy = zeros(e, rows * n);
        e.scale(&ds1, -1.5, (false, &mut dy)).unwrap();
        same_bits("add/mul/scale", &down(e, &dy), &yv);
        let mut dyr = zeros(e, rows * n);
        e.round_bf16(&dy, &mut dyr).unwrap();
        same_bits("round_bf16", &down(e, &dyr), &yrv);
        let mut out = zeros(e, 1);
        e.sum(&dyr, 1.0, &mut out).unwrap();
        same_bits("sum", &down(e, &out), &[tv]);
        e.sum(&dy, 1.0 / (rows * n) as f64, &mut out).unwrap();
        same_bits("mean", &down(e, &out), &[mv]);

        // backward, as the ops compose it: dS1 = -1.5 dY; dA = dABC ⊙ b ⊙ ...
        let mut gs1 = zeros(e, rows * n);
        e.scale(&dr, -1.5, (false, &mut gs1)).unwrap();
        let mut gc_k = zeros(e, n);
        e.sum_rows(&gs1, n, (false, &mut gc_k)).unwrap(); // add's broadcast operand
        let mut gab = zeros(e, rows * n);
        e.mul(&gs1, &dc, (false, &mut gab)).unwrap();
        let mut tmp = zeros(e, rows * n);
        e.mul(&gs1, &dab, (false, &mut tmp)).unwrap();
        e.sum_rows(&tmp, n, (true, &mut gc_k)).unwrap(); // mul's broadcast operand, accumulated
        let (mut ga_k, mut gb_k) = (zeros(e, rows * n), zeros(e, rows * n));
        e.mul(&gab, &db, (false, &mut ga_k)).unwrap();
        e.mul(&gab, &da, (false, &mut gb_k)).unwrap();
        same_bits("d/da", &down(e, &ga_k), &ga);
        same_bits("d/db", &down(e, &gb_k), &gb);
        same_bits("d/dc (column sums)", &down(e, &gc_k), &gc);
    }
}

pub fn activations_are_bit_exact<B: Backend>(e: &B) {
    let n = 3000;
    // wide range: exp's clamps, tanh's saturation, the small-|x| region
    let mut xv = init::normal(n, 4.0, 1);
    xv.extend([
        -100.0, -88.5, -87.0, -20.0, -1e-7, 0.0, -0.0, 1e-7, 20.0, 88.5, 100.0,
    ]);
    let n = xv.len();
    let uv = init::normal(n, 1.0, 2);
    let r = init::normal(n, 1.0, 3);
    let mut ps = ParamStore::new();
    let mut g = Graph::new(&mut ps);
    let x = g.variable(&xv, &[n]).unwrap();
    let u = g.variable(&uv, &[n]).unwrap();
    let outs = [
        g.gelu(x).unwrap(),
        g.silu(x).unwrap(),
        g.swiglu(x, u).unwrap(),
    ];
    let vals: Vec<Vec<f32>> = outs.iter().map(|&t| g.to_vec(t).unwrap()).collect();
    let s = g.add(outs[0], outs[1]).unwrap();
    let s = g.add(s, outs[2]).unwrap();
    g.backward_with(s, &r).unwrap();
    let (gx, gu) = (
        g.grad(x).unwrap().unwrap().to_vec(),
        g.grad(u).unwrap().unwrap().to_vec(),
    );
    drop(g);

    let (dx, du, dr) = (up(e, &xv), up(e, &uv), up(e, &r));
    let mut y = zeros(e, n);
    e.act_fwd(Act::Gelu, &dx, &mut y).unwrap();
    same_bits("gelu", &down(e, &y), &vals[0]);
    e.act_fwd(Act::Silu, &dx, &mut y).unwrap();
    same_bits("silu", &down(e, &y), &vals[1]);
    e.swiglu_fwd(&dx, &du, &mut y).unwrap();
    same_bits("swiglu", &down(e, &y), &vals[2]);
    // the graph accumulates x's gradient in op order: gelu, silu, swiglu (reverse creation:
    // swiglu first, then silu, then gelu)
    let (mut gx_k, mut gu_k) = (zeros(e, n), zeros(e, n));
    e.swiglu_bwd(
        &dx,
        &du,
        &dr,
        Some((false, &mut gx_k)),
        Some((false, &mut gu_k)),
    )
    .unwrap();
    e.act_bwd(Act::Silu, &dx, &dr, (true, &mut gx_k)).unwrap();
    e.act_bwd(Act::Gelu, &dx, &dr, (true, &mut gx_k)).unwrap();
    same_bits("activation grads (x)", &down(e, &gx_k), &gx);
    same_bits("swiglu grad (up)", &down(e, &gu_k), &gu);
}

pub fn norms_are_bit_exact<B: Backend>(e: &B, shapes: &[(usize, usize)]) {
    for (i, &(rows, d)) in shapes.iter().enumerate() {
        let s = 100 + i as u64 * 10;
        let xv: Vec<f32> = init::normal(rows * d, 1.0, s)
            .iter()
            .map(|v| v * 3.0 + 0.5)
            .collect();
        let (wv, bv) = (init::normal(d, 1.0, s + 1), init::normal(d, 1.0, s + 2));
        let (r1, r2) = (
            init::normal(rows * d, 1.0, s + 3),
            init::normal(rows * d, 1.0, s + 4),
        );
        for layer in [false, true] {
            let eps = 1e-5;
            let mut ps = ParamStore::new();
            let mut g = Graph::new(&mut ps);
            let x = g.variable(&xv, &[rows, d]).unwrap();
            let w = g.variable(&wv, &[d]).unwrap();
            let b = g.variable(&bv, &[d]).unwrap();
            let y = if layer {
                g.layernorm(x, w, Some(b), eps).unwrap()
            } else {
                g.rmsnorm(x, w, eps).unwrap()
            };
            let yv = g.to_vec(y).unwrap();
            g.backward_with(y, &r1).unwrap();
            let gx = g.grad(x).unwrap().unwrap().to_vec();
            let gw = g.grad(w).unwrap().unwrap().to_vec();
            let gb = layer.then(|| g.grad(b).unwrap().unwrap().to_vec());
            drop(g);

            let (dx, dw, db, dr) = (up(e, &xv), up(e, &wv), up(e, &bv), up(e, &r1));
            let mut y_k = zeros(e, rows * d);
            let mut st = zeros(e, if layer { 2 * rows } else { rows });
            let kind = if layer {
                e.layernorm_fwd(&dx, &dw, Some(&db), eps, &mut y_k, Some(&mut st))
                    .unwrap();
                NormKind::Layer
            } else {
                e.rmsnorm_fwd(&dx, &dw, eps, &mut y_k, Some(&mut st))
                    .unwrap();
                NormKind::Rms
            };
            let what = format!("{kind:?} [{rows}, {d}]");
            same_bits(&format!("{what} forward"), &down(e, &y_k), &yv);
            let (mut gx_k, mut gw_k, mut gb_k) = (zeros(e, rows * d), zeros(e, d), zeros(e, d));
            let gbo = layer.then_some((false, &mut gb_k));
            e.norm_bwd(
                kind,
                &dx,
                &dw,
                &st,
                &dr,
                Some((false, &mut gx_k)),
                Some((false, &mut gw_k)),
                gbo,
            )
            .unwrap();
            same_bits(&format!("{what} dx"), &down(e, &gx_k), &gx);
            same_bits(&format!("{what} dw"), &down(e, &gw_k), &gw);
            if let Some(gb) = gb {
                same_bits(&format!("{what} db"), &down(e, &gb_k), &gb);
            }
            // accumulation into existing gradients: the second seed adds
            let dr2 = up(e, &r2);
            e.norm_bwd(
                kind,
                &dx,
                &dw,
                &st,
                &dr2,
                Some((true, &mut gx_k)),
                Some((true, &mut gw_k)),
                None,
            )
            .unwrap();
            let cpu = CpuBackend;
            let (cx, cw, cs) = (
                cpu.upload(&xv).unwrap(),
                cpu.upload(&wv).unwrap(),
                down(e, &st),
            );
            let (mut cgx, mut cgw) = (gx.clone(), gw.clone());
            cpu.norm_bwd(
                kind,
                &cx,
                &cw,
                &cs,
                &r2,
                Some((true, &mut cgx)),
                Some((true, &mut cgw)),
                None,
            )
            .unwrap();
            same_bits(&format!("{what} dx accumulated"), &down(e, &gx_k), &cgx);
            same_bits(&format!("{what} dw accumulated"), &down(e, &gw_k), &cgw);
        }
    }
}

/// `exact_log`: the platform's `logf` is glibc's (the emulator) and cross-entropy is compared
/// bit for bit; on a GPU, CUDA's `logf` is within 1 ulp, which moves each row's log-sum-exp by
/// at most 2^-23 |lse| and so each gradient element `scale · exp(x − lse)` by a relative
/// 2^-23 |lse| (plus the exp's own rounding, identical on both): checked with 4× that.
pub fn rope_embedding_cross_entropy_are_bit_exact<B: Backend>(
    e: &B,
    exact_log: bool,
    ce: &[(usize, usize)],
) {
    // RoPE on [2, 3, 5, 8] at offset 4
    let (t, d) = (5, 8);
    let xv = init::normal(2 * 3 * t * d, 1.0, 1);
    let r = init::normal(xv.len(), 1.0, 2);
    let mut ps = ParamStore::new();
    let mut g = Graph::new(&mut ps);
    let x = g.variable(&xv, &[2, 3, t, d]).unwrap();
    let y = g.rope(x, 500.0, 4).unwrap();
    let yv = g.to_vec(y).unwrap();
    g.backward_with(y, &r).unwrap();
    let gx = g.grad(x).unwrap().unwrap().to_vec();
    drop(g);
    let tab = up(e, &rope_table(t, d, 500.0, 4));
    let (dx, dr) = (up(e, &xv), up(e, &r));
    let mut y_k = zeros(e, xv.len());
    e.rope(&dx, &tab, t, d, false, (false, &mut y_k)).unwrap();
    same_bits("rope", &down(e, &y_k), &yv);
    e.rope(&dr, &tab, t, d, true, (false, &mut y_k)).unwrap();
    same_bits("rope backward", &down(e, &y_k), &gx);

    // embedding with repeated ids
    let (vocab, dm) = (11, 24);
    let tv = init::normal(vocab * dm, 1.0, 3);
    let ids: Vec<u32> = (0..40u32).map(|i| (i * 7 + i / 3) % vocab as u32).collect();
    let r = init::normal(ids.len() * dm, 1.0, 4);
    let mut ps = ParamStore::new();
    let mut g = Graph::new(&mut ps);
    let table = g.variable(&tv, &[vocab, dm]).unwrap();
    let y = g.embedding(&ids, &[4, 10], table).unwrap();
    let yv = g.to_vec(y).unwrap();
    g.backward_with(y, &r).unwrap();
    let gt = g.grad(table).unwrap().unwrap().to_vec();
    drop(g);
    let dt = up(e, &tv);
    let mut y_k = zeros(e, ids.len() * dm);
    e.embedding_fwd(&dt, dm, &ids, &mut y_k).unwrap();
    same_bits("embedding", &down(e, &y_k), &yv);
    let mut gt_k = up(e, &vec![f32::NAN; vocab * dm]); // overwritten: acc = false
    e.embedding_bwd(&ids, &up(e, &r), dm, (false, &mut gt_k))
        .unwrap();
    same_bits("embedding backward", &down(e, &gt_k), &gt);

    // cross-entropy: V = 37 (two 16-lane chunks and a tail), one ignored row, huge logits
    for (k, &(rows, v)) in ce.iter().enumerate() {
        let ignore = (k == 0).then_some(v as u32 - 1);
        let mut lv = init::normal(rows * v, 3.0, 5);
        lv[3] = 80.0;
        lv[v + 1] = -90.0;
        let targets: Vec<u32> = (0..rows as u32).map(|i| (i * 5 + 1) % v as u32).collect();
        let mut targets = targets;
        if let Some(ig) = ignore {
            targets[2] = ig;
        }
        let mut ps = ParamStore::new();
        let mut g = Graph::new(&mut ps);
        let l = g.variable(&lv, &[rows, v]).unwrap();
        let loss = g.cross_entropy(l, &targets, ignore).unwrap();
        let loss = g.scale(loss, 0.7).unwrap();
        let lossv = g.item(loss).unwrap();
        g.backward(loss).unwrap();
        let gl = g.grad(l).unwrap().unwrap().to_vec();
        drop(g);
        let dl = up(e, &lv);
        let (mut st, mut lo) = (zeros(e, 2 * rows), zeros(e, 1));
        let count = e
            .cross_entropy_fwd(&dl, v, &targets, ignore, &mut st, &mut lo)
            .unwrap();
        assert_eq!(count, rows - ignore.is_some() as usize);
        let l0 = down(e, &lo)[0];
        let lse_max = down(e, &st)
            .chunks(2)
            .map(|s| s[1].abs())
            .fold(0.0f32, f32::max);
        let rel = 4.0 * (1.0 + lse_max as f64) * f32::EPSILON as f64;
        if exact_log {
            same_bits("cross_entropy loss", &[0.7 * l0], &[lossv]);
        } else {
            let d = ((0.7 * l0) as f64 - lossv as f64).abs();
            assert!(
                d <= rel * lossv.abs() as f64,
                "cross_entropy loss {} vs {lossv}",
                0.7 * l0
            );
        }
        let mut gl_k = zeros(e, rows * v);
        e.cross_entropy_bwd(
            &dl,
            v,
            &targets,
            ignore,
            &st,
            &up(e, &[0.7]),
            (false, &mut gl_k),
        )
        .unwrap();
        let gk = down(e, &gl_k);
        if exact_log {
            same_bits("cross_entropy backward", &gk, &gl);
        } else {
            let scale = 0.7 / count as f64;
            for (i, (&a, &b)) in gk.iter().zip(&gl).enumerate() {
                let tol = rel * (b.abs() as f64 + scale) + 1e-30;
                assert!(
                    ((a - b) as f64).abs() <= tol,
                    "cross_entropy backward element {i}: {a} vs {b}"
                );
            }
        }
    }
}

pub fn grad_norm_and_adamw_match_optim_bit_for_bit<B: Backend>(e: &B) {
    // three tensors, one spanning several 16K chunks
    let sizes = [40_000usize, 17, 3000];
    let grads: Vec<Vec<f32>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| init::normal(n, 0.3, 50 + i as u64))
        .collect();
    let want = optim::grad_norm(&grads.iter().map(|g| &g[..]).collect::<Vec<_>>());
    let dg: Vec<_> = grads.iter().map(|g| up(e, g)).collect();
    let got = e.grad_norm(&dg.iter().collect::<Vec<_>>()).unwrap();
    same_bits("grad_norm", &[got], &[want]);

    let cfg = optim::AdamWConfig {
        beta2: 0.95,
        weight_decay: 0.1,
        ..optim::AdamWConfig::default()
    };
    let specs: Vec<optim::ParamSpec> = sizes.iter().map(|&n| optim::ParamSpec::new(n, 0)).collect();
    let mut opt = optim::AdamW::new(cfg, &specs).unwrap();
    let mut params: Vec<Vec<f32>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| init::normal(n, 1.0, 60 + i as u64))
        .collect();
    let mut dp: Vec<_> = params.iter().map(|p| up(e, p)).collect();
    let mut dm: Vec<_> = sizes.iter().map(|&n| zeros(e, n)).collect();
    let mut dv: Vec<_> = sizes.iter().map(|&n| zeros(e, n)).collect();
    for step in 1..=3u64 {
        let lr = 1e-3 * step as f32;
        let clip = optim::clip_coefficient(want, 1.0).unwrap();
        {
            let mut ps: Vec<&mut [f32]> = params.iter_mut().map(|p| &mut p[..]).collect();
            let gs: Vec<&[f32]> = grads.iter().map(|g| &g[..]).collect();
            opt.step_scaled(&mut ps, &gs, lr, clip).unwrap();
        }
        let c = AdamWCoeffs::new(
            lr,
            cfg.weight_decay,
            cfg.beta1,
            cfg.beta2,
            cfg.eps,
            step,
            clip,
        );
        for i in 0..sizes.len() {
            e.adamw(&mut dp[i], &dg[i], &mut dm[i], &mut dv[i], &c)
                .unwrap();
        }
        for i in 0..sizes.len() {
            same_bits(
                &format!("adamw step {step} param {i}"),
                &down(e, &dp[i]),
                &params[i],
            );
            same_bits(
                &format!("adamw step {step} m {i}"),
                &down(e, &dm[i]),
                opt.exp_avg(i).unwrap(),
            );
        }
    }
}

/// Worst `|x - ref| / bound` over all elements (`bound > 0`).
fn worst(x: &[f32], r: &[f64], bound: &[f64]) -> f64 {
    x.iter()
        .zip(r)
        .zip(bound)
        .map(|((&x, &r), &b)| (x as f64 - r).abs() / b.max(1e-300))
        .fold(0.0, f64::max)
}

pub fn gemm_within_accumulation_bound<B: Backend>(e: &B) {
    let (m, n, k) = (37, 29, 70);
    let (av, bv) = (init::normal(m * k, 1.0, 1), init::normal(k * n, 1.0, 2));
    let u = f32::EPSILON as f64 / 2.0;
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        // A(i, kk), B(kk, j) under the transposition flags
        let a = |i: usize, kk: usize| if ta { av[kk * m + i] } else { av[i * k + kk] } as f64;
        let b = |kk: usize, j: usize| if tb { bv[j * k + kk] } else { bv[kk * n + j] } as f64;
        let c0 = init::normal(m * n, 1.0, 3);
        let (mut r, mut bound) = (vec![0.0; m * n], vec![0.0; m * n]);
        for i in 0..m {
            for j in 0..n {
                let (s, sa): (f64, f64) = (0..k)
                    .map(|kk| (a(i, kk) * b(kk, j), (a(i, kk) * b(kk, j)).abs()))
                    .fold((0.0, 0.0), |x, y| (x.0 + y.0, x.1 + y.1));
                r[i * n + j] = 0.5 * s + 2.0 * c0[i * n + j] as f64;
                // k products and sums in any order: (k + 1) u Σ|ab|, scaled by alpha; the beta
                // term and the final add: 2u |result| each
                bound[i * n + j] = 0.5 * (k as f64 + 1.0) * u * sa
                    + 3.0 * u * (r[i * n + j].abs() + 2.0 * (c0[i * n + j] as f64).abs())
                    + 1e-30;
            }
        }
        let mut c = up(e, &c0);
        e.gemm(m, n, k, 0.5, &up(e, &av), ta, &up(e, &bv), tb, 2.0, &mut c)
            .unwrap();
        let cpu = CpuBackend;
        let mut cc = c0.clone();
        cpu.gemm(m, n, k, 0.5, &av, ta, &bv, tb, 2.0, &mut cc)
            .unwrap();
        let (we, wc) = (worst(&down(e, &c), &r, &bound), worst(&cc, &r, &bound));
        assert!(
            we <= 1.0 && wc <= 1.0,
            "ta {ta} tb {tb}: kernel {we}, CPU {wc} of the bound"
        );
    }
}

/// f64 causal attention of one head and its gradients, with componentwise error bounds for
/// any f32 implementation (see the comment in the body).
struct AttnRef {
    o: Vec<f64>,
    o_bound: Vec<f64>,
    g: [Vec<f64>; 3],
    g_bound: [Vec<f64>; 3],
}

fn attention_reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dout: &[f32],
    t: usize,
    d: usize,
) -> AttnRef {
    // Error model (u = 2^-24, first order): a dot product of d terms in any order is within
    // (d + 1) u Σ|terms| of the exact value, plus u for the scale multiply. So every score
    // s_ij is within e_ij = (d + 2) u scale Σ_c |q_ic k_jc|. Softmax: p_ij = exp(s_ij - m)/l
    // with exp within 3 u (Cephes, 2 ulp, and the subtraction), the sum of up to t terms
    // within t u, the division and the log within 2 u: p's relative error is at most
    // r_i = 2 max_j e_ij + (t + 8) u. Then o_ic = Σ_j p_ij v_jc is within
    // (r_i + (t + 2) u) Σ_j p_ij |v_jc|. The backward terms follow the same rules:
    // dV_jc = Σ_i p_ij dO_ic within (r + (t + 2) u) Σ|p dO|; dP_ij = dO_i·v_j within
    // (d + 1) u Σ|dO v|; δ_i = dO_i·o_i within (d + 1) u Σ|dO o| + Σ|dO| |Δo|; dS = p (dP - δ)
    // within |p| (|ΔdP| + |Δδ|) + (r + 2 u) |p| |dP - δ|; dQ = scale dS K (dK = scale dSᵀ Q)
    // within scale (Σ|ΔdS| |K| + (t + 2) u Σ|dS K|). Bounds are doubled for second-order
    // terms and checked against both the kernel and the CPU op.
    let u = f32::EPSILON as f64 / 2.0;
    let sc = 1.0 / (d as f64).sqrt();
    let f = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<f64>>();
    let (q, k, v, dout) = (f(q), f(k), f(v), f(dout));
    let mut o = vec![0.0; t * d];
    let mut ob = vec![0.0; t * d];
    let mut p = vec![0.0; t * t];
    let mut rel = vec![0.0; t];
    for i in 0..t {
        let s: Vec<f64> = (0..=i)
            .map(|j| sc * (0..d).map(|c| q[i * d + c] * k[j * d + c]).sum::<f64>())
            .collect();
        let emax = (0..=i)
            .map(|j| {
                (d as f64 + 2.0)
                    * u
                    * sc
                    * (0..d)
                        .map(|c| (q[i * d + c] * k[j * d + c]).abs())
                        .sum::<f64>()
            })
            .fold(0.0, f64::max);
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let l: f64 = s.iter().map(|&x| (x - m).exp()).sum();
        for j in 0..=i {
            p[i * t + j] = (s[j] - m).exp() / l;
        }
        rel[i] = 2.0 * emax + (t as f64 + 8.0) * u;
        for c in 0..d {
            let (mut acc, mut mag) = (0.0, 0.0);
            for j in 0..=i {
                acc += p[i * t + j] * v[j * d + c];
                mag += p[i * t + j] * v[j * d + c].abs();
            }
            o[i * d + c] = acc;
            ob[i * d + c] = 2.0 * (rel[i] + (t as f64 + 2.0) * u) * mag + 1e-30;
        }
    }
    let mut ds = vec![0.0; t * t];
    let mut dsb = vec![0.0; t * t];
    for i in 0..t {
        let delta: f64 = (0..d).map(|c| dout[i * d + c] * o[i * d + c]).sum();
        let delta_b: f64 = (0..d)
            .map(|c| {
                (d as f64 + 1.0) * u * (dout[i * d + c] * o[i * d + c]).abs()
                    + dout[i * d + c].abs() * ob[i * d + c]
            })
            .sum();
        for j in 0..=i {
            let dp: f64 = (0..d).map(|c| dout[i * d + c] * v[j * d + c]).sum();
            let dp_b = (d as f64 + 1.0)
                * u
                * (0..d)
                    .map(|c| (dout[i * d + c] * v[j * d + c]).abs())
                    .sum::<f64>();
            let pij = p[i * t + j];
            ds[i * t + j] = pij * (dp - delta);
            dsb[i * t + j] =
                2.0 * (pij * (dp_b + delta_b) + (rel[i] + 2.0 * u) * pij * (dp - delta).abs());
        }
    }
    let mut g = [vec![0.0; t * d], vec![0.0; t * d], vec![0.0; t * d]];
    let mut gb = [vec![0.0; t * d], vec![0.0; t * d], vec![0.0; t * d]];
    let tu = (t as f64 + 2.0) * u;
    for c in 0..d {
        for i in 0..t {
            let (mut a, mut b) = (0.0, 0.0);
            for j in 0..=i {
                a += ds[i * t + j] * k[j * d + c];
                b +=
                    dsb[i * t + j] * k[j * d + c].abs() + tu * (ds[i * t + j] * k[j * d + c]).abs();
            }
            g[0][i * d + c] = sc * a;
            gb[0][i * d + c] = 2.0 * sc * b + 1e-30;
        }
        for j in 0..t {
            let (mut a, mut b, mut dv, mut dvb) = (0.0, 0.0, 0.0, 0.0);
            for i in j..t {
                a += ds[i * t + j] * q[i * d + c];
                b +=
                    dsb[i * t + j] * q[i * d + c].abs() + tu * (ds[i * t + j] * q[i * d + c]).abs();
                dv += p[i * t + j] * dout[i * d + c];
                dvb += (rel[i] + tu) * (p[i * t + j] * dout[i * d + c]).abs();
            }
            g[1][j * d + c] = sc * a;
            gb[1][j * d + c] = 2.0 * sc * b + 1e-30;
            g[2][j * d + c] = dv;
            gb[2][j * d + c] = 2.0 * dvb + 1e-30;
        }
    }
    AttnRef {
        o,
        o_bound: ob,
        g,
        g_bound: gb,
    }
}

pub fn attention_within_derived_bounds<B: Backend>(e: &B) {
    // T spans several 32-key tiles and the CPU's 64-query blocks; D = 40 is not a multiple of 32
    for (bh, t, d) in [(2, 70, 40), (1, 9, 128)] {
        let n = bh * t * d;
        let (qv, kv, vv) = (
            init::normal(n, 1.0, 1),
            init::normal(n, 1.0, 2),
            init::normal(n, 1.0, 3),
        );
        let r = init::normal(n, 1.0, 4);
        let mut ps = ParamStore::new();
        let mut g = Graph::new(&mut ps);
        let q = g.variable(&qv, &[1, bh, t, d]).unwrap();
        let k = g.variable(&kv, &[1, bh, t, d]).unwrap();
        let v = g.variable(&vv, &[1, bh, t, d]).unwrap();
        let o = g.causal_attention(q, k, v).unwrap();
        let ov = g.to_vec(o).unwrap();
        g.backward_with(o, &r).unwrap();
        let cg = [q, k, v].map(|x| g.grad(x).unwrap().unwrap().to_vec());
        drop(g);

        let (dq, dk, dv, dr) = (up(e, &qv), up(e, &kv), up(e, &vv), up(e, &r));
        let (mut o_k, mut lse) = (zeros(e, n), zeros(e, bh * t));
        e.attention_fwd(
            &dq,
            &dk,
            &dv,
            bh,
            t,
            d,
            AttentionProducts::F32,
            &mut o_k,
            &mut lse,
        )
        .unwrap();
        let (mut gq, mut gk, mut gv) = (zeros(e, n), zeros(e, n), zeros(e, n));
        e.attention_bwd(
            [&dq, &dk, &dv, &o_k],
            &lse,
            &dr,
            bh,
            t,
            d,
            AttentionProducts::F32,
            (false, &mut gq),
            (false, &mut gk),
            (false, &mut gv),
        )
        .unwrap();
        let kg = [down(e, &gq), down(e, &gk), down(e, &gv)];
        let ok = down(e, &o_k);
        // deterministic: a second run gives the same bits
        let mut o2 = zeros(e, n);
        e.attention_fwd(
            &dq,
            &dk,
            &dv,
            bh,
            t,
            d,
            AttentionProducts::F32,
            &mut o2,
            &mut lse,
        )
        .unwrap();
        same_bits("attention rerun", &down(e, &o2), &ok);
        let hd = t * d;
        for h in 0..bh {
            let sl = |x: &[f32]| x[h * hd..(h + 1) * hd].to_vec();
            let rf = attention_reference(&sl(&qv), &sl(&kv), &sl(&vv), &sl(&r), t, d);
            let (wk, wc) = (
                worst(&sl(&ok), &rf.o, &rf.o_bound),
                worst(&sl(&ov), &rf.o, &rf.o_bound),
            );
            eprintln!("[{bh},{t},{d}] head {h} output: kernel {wk:.3}, CPU {wc:.3} of the bound");
            assert!(
                wk <= 1.0 && wc <= 1.0,
                "[{bh},{t},{d}] head {h} output: kernel {wk}, CPU {wc} of the bound"
            );
            for (i, name) in ["dq", "dk", "dv"].iter().enumerate() {
                let wk = worst(&sl(&kg[i]), &rf.g[i], &rf.g_bound[i]);
                let wc = worst(&sl(&cg[i]), &rf.g[i], &rf.g_bound[i]);
                eprintln!(
                    "[{bh},{t},{d}] head {h} {name}: kernel {wk:.3}, CPU {wc:.3} of the bound"
                );
                assert!(
                    wk <= 1.0 && wc <= 1.0,
                    "[{bh},{t},{d}] head {h} {name}: kernel {wk}, CPU {wc} of the bound"
                );
            }
        }
    }
}

/// BF16 attention (`AttentionProducts::Bf16`: Q, K, V, P, dO and dS rounded to BF16 as
/// operands): the kernel's output and gradients against the CPU op's. Both multiply the same
/// rounded values except where a probability or score gradient, computed in FP32 in a different
/// order (the kernel forms `P = exp(s − lse)`, the CPU `exp(s − max) / l`), lies within an ulp
/// of a BF16 rounding boundary and the two round it differently: a rare change of 2⁻⁸ relative
/// in one term. So the two agree far more closely than either agrees with FP32 attention, which
/// is what is asserted: the kernel-CPU difference is at most 2e-3 of the largest value and
/// under a fifth of the BF16-FP32 difference (which shows that the kernel rounds too), for
/// each `[bh, t, d]` of `shapes`.
pub fn bf16_attention_matches_cpu<B: Backend>(e: &B, shapes: &[(usize, usize, usize)]) {
    for &shape in shapes {
        bf16_attention_shape_matches_cpu(e, shape);
    }
}

fn bf16_attention_shape_matches_cpu<B: Backend>(e: &B, (bh, t, d): (usize, usize, usize)) {
    let n = bh * t * d;
    let (qv, kv, vv, r) = (
        init::normal(n, 1.0, 5),
        init::normal(n, 1.0, 6),
        init::normal(n, 1.0, 7),
        init::normal(n, 1.0, 8),
    );
    let cpu = |products| {
        let mut ps = ParamStore::new();
        let mut g = Graph::new(&mut ps);
        let q = g.variable(&qv, &[1, bh, t, d]).unwrap();
        let k = g.variable(&kv, &[1, bh, t, d]).unwrap();
        let v = g.variable(&vv, &[1, bh, t, d]).unwrap();
        let o = g.causal_attention_with(q, k, v, products).unwrap();
        let mut out = vec![g.to_vec(o).unwrap()];
        g.backward_with(o, &r).unwrap();
        out.extend([q, k, v].map(|x| g.grad(x).unwrap().unwrap().to_vec()));
        out
    };
    let (cpu_bf16, cpu_f32) = (cpu(AttentionProducts::Bf16), cpu(AttentionProducts::F32));
    let (dq, dk, dv, dr) = (up(e, &qv), up(e, &kv), up(e, &vv), up(e, &r));
    let (mut o, mut lse) = (zeros(e, n), zeros(e, bh * t));
    let bf = AttentionProducts::Bf16;
    e.attention_fwd(&dq, &dk, &dv, bh, t, d, bf, &mut o, &mut lse)
        .unwrap();
    let (mut gq, mut gk, mut gv) = (zeros(e, n), zeros(e, n), zeros(e, n));
    e.attention_bwd(
        [&dq, &dk, &dv, &o],
        &lse,
        &dr,
        bh,
        t,
        d,
        bf,
        (false, &mut gq),
        (false, &mut gk),
        (false, &mut gv),
    )
    .unwrap();
    let kernel = [down(e, &o), down(e, &gq), down(e, &gk), down(e, &gv)];
    let rel = |a: &[f32], b: &[f32]| {
        let scale = b.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        a.iter()
            .zip(b)
            .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
            / scale
    };
    for (i, name) in ["o", "dq", "dk", "dv"].iter().enumerate() {
        let (kc, bf) = (
            rel(&kernel[i], &cpu_bf16[i]),
            rel(&cpu_f32[i], &cpu_bf16[i]),
        );
        eprintln!(
            "BF16 attention [{bh},{t},{d}] {name}: kernel vs CPU {kc:.2e}, CPU BF16 vs FP32 {bf:.2e}"
        );
        assert!(
            kc <= 2e-3 && kc < 0.2 * bf,
            "[{bh},{t},{d}] {name}: kernel vs CPU {kc:.2e}, BF16 vs FP32 {bf:.2e}"
        );
    }
}

pub fn bad_input_is_a_typed_error<B: Backend>(e: &B) {
    let (a, b) = (up(e, &[1.0; 6]), up(e, &[1.0; 4]));
    let mut out = zeros(e, 6);
    assert!(matches!(
        e.add(&a, &b, &mut out),
        Err(BackendError::InvalidArgument(_))
    ));
    let mut st = zeros(e, 4);
    let mut lo = zeros(e, 1);
    let r = e.cross_entropy_fwd(&a, 3, &[0, 3], None, &mut st, &mut lo);
    assert!(matches!(r, Err(BackendError::InvalidArgument(m)) if m.contains("target 3")));
    let big = zeros(e, 2 * 200);
    let mut o = zeros(e, 400);
    let mut lse = zeros(e, 2);
    assert!(matches!(
        e.attention_fwd(
            &big,
            &big,
            &big,
            1,
            2,
            200,
            AttentionProducts::F32,
            &mut o,
            &mut lse
        ),
        Err(BackendError::Kernel(_))
    ));
    let mut y = zeros(e, 2);
    assert!(matches!(
        e.embedding_fwd(&a, 3, &[2], &mut y),
        Err(BackendError::InvalidArgument(_))
    ));
    // no driver here: the CUDA backend says so and what to do (on a GPU machine it opens)
    if let Err(err) = CudaBackend::new() {
        let msg = err.to_string();
        assert!(matches!(err, BackendError::NoDevice { .. }), "{msg}");
        assert!(msg.contains("--device cpu"), "{msg}");
    }
}

/// A one-block GPT (RMSNorm, RoPE, causal attention with one head, SwiGLU MLP, untied head).
pub struct TinyModel {
    /// emb, n1, wq, wk, wv, wo, n2, w1, w3, w2, nf, head
    params: Vec<(Vec<f32>, Vec<usize>)>,
}

const TM_V: usize = 29;
const TM_D: usize = 32;
const TM_F: usize = 64;
const TM_B: usize = 2;
const TM_T: usize = 16;
const TM_BASE: f32 = 10000.0;
const TM_EPS: f32 = 1e-5;
/// The Graph step's random seed and step (`Graph::with_rng`), which key the GEMM operands.
const TM_SEED: u64 = 7;
const TM_STEP: u64 = 0;

/// An NVFP4 quantizer as the kernel step uses it: `(data, rows, cols, usage, quantizer, key)`
/// of a row-major `rows x cols` tensor to the dequantized values of its copy in the stored
/// layout (rowwise `[rows, cols]`, columnwise `[cols, rows]`), per-tensor factor applied.
pub type Quantizer<'a> = &'a dyn Fn(&[f32], usize, usize, Usage, &OperandQuant, RngKey) -> Vec<f32>;

/// How the kernel step forms its GEMM operands.
#[derive(Clone, Copy)]
pub enum StepGemm<'a> {
    /// f32 operands (`GemmPolicy::FP32`).
    F32,
    /// Operands rounded to BF16 by the `round_bf16` kernel (`GemmPolicy::BF16`).
    Bf16,
    /// Every operand quantized under the policy by the quantizer, with the keys of autograd's
    /// linear (`gemm_stream(layer, role, step)` under the Graph's seed), and the f32 GEMM on
    /// the dequantized values.
    Quantized(&'a GemmPolicy, Quantizer<'a>),
}

fn tm_key(layer: u64, role: OperandRole) -> RngKey {
    RngKey {
        seed: TM_SEED,
        stream: gemm_stream(layer, role, TM_STEP).unwrap(),
    }
}

impl TinyModel {
    pub fn new() -> Self {
        let (v, d, f) = (TM_V, TM_D, TM_F);
        let mat = |r: usize, c: usize, seed: u64| {
            (
                init::normal(r * c, 1.0 / (c as f32).sqrt(), seed),
                vec![r, c],
            )
        };
        let gain = |seed: u64| {
            (
                init::normal(d, 0.1, seed).iter().map(|x| 1.0 + x).collect(),
                vec![d],
            )
        };
        let params = vec![
            (init::normal(v * d, 1.0, 1), vec![v, d]),
            gain(2),
            mat(d, d, 3),
            mat(d, d, 4),
            mat(d, d, 5),
            mat(d, d, 6),
            gain(7),
            mat(f, d, 8),
            mat(f, d, 9),
            mat(d, f, 10),
            gain(11),
            mat(v, d, 12),
        ];
        TinyModel { params }
    }

    fn tokens() -> (Vec<u32>, Vec<u32>) {
        let n = TM_B * TM_T;
        let tok: Vec<u32> = (0..n as u32)
            .map(|i| (i * 11 + i / 5) % TM_V as u32)
            .collect();
        let tgt: Vec<u32> = (0..n as u32).map(|i| (i * 7 + 3) % TM_V as u32).collect();
        (tok, tgt)
    }

    /// The CPU reference: autograd's `Graph` step. Returns the loss and every gradient.
    fn graph_step(&self, policy: &quant::GemmPolicy) -> (f32, Vec<Vec<f32>>) {
        self.graph_step_on(policy, None).unwrap()
    }

    /// The same `Graph` step on `dev` (its store moved there with `ParamStore::to_device`),
    /// or on the CPU.
    pub fn graph_step_on(
        &self,
        policy: &quant::GemmPolicy,
        dev: Option<&Arc<DeviceBackend>>,
    ) -> autograd::Result<(f32, Vec<Vec<f32>>)> {
        let (tok, tgt) = Self::tokens();
        let (b, t, d) = (TM_B, TM_T, TM_D);
        let mut ps = ParamStore::new();
        let ids: Vec<_> = self
            .params
            .iter()
            .enumerate()
            .map(|(i, (v, s))| ps.add(&format!("p{i}"), s, v.clone()).unwrap())
            .collect();
        if let Some(be) = dev {
            ps.to_device(be)?;
        }
        let mut g = Graph::new(&mut ps).with_rng(TM_SEED, TM_STEP);
        let p: Vec<_> = ids.iter().map(|&i| g.param(i).unwrap()).collect();
        let x0 = g.embedding(&tok, &[b * t], p[0]).unwrap();
        let h1 = g.rmsnorm(x0, p[1], TM_EPS).unwrap();
        let lin = |g: &mut Graph<'_>, x, w, s: u64| g.linear(x, w, None, policy, s);
        let q = lin(&mut g, h1, p[2], 0)?;
        let k = lin(&mut g, h1, p[3], 1)?;
        let v = lin(&mut g, h1, p[4], 2)?;
        let r4 = |g: &mut Graph<'_>, x| g.reshape(x, &[b, 1, t, d]).unwrap();
        let (q, k, v) = (r4(&mut g, q), r4(&mut g, k), r4(&mut g, v));
        let q = g.rope(q, TM_BASE, 0).unwrap();
        let k = g.rope(k, TM_BASE, 0).unwrap();
        let a = g.causal_attention(q, k, v).unwrap();
        let a = g.reshape(a, &[b * t, d]).unwrap();
        let ao = lin(&mut g, a, p[5], 3)?;
        let x1 = g.add(x0, ao).unwrap();
        let h2 = g.rmsnorm(x1, p[6], TM_EPS).unwrap();
        let gt = lin(&mut g, h2, p[7], 4)?;
        let up = lin(&mut g, h2, p[8], 5)?;
        let s = g.swiglu(gt, up).unwrap();
        let mo = lin(&mut g, s, p[9], 6)?;
        let x2 = g.add(x1, mo).unwrap();
        let h3 = g.rmsnorm(x2, p[10], TM_EPS).unwrap();
        let logits = lin(&mut g, h3, p[11], 7)?;
        let loss = g.cross_entropy(logits, &tgt, None).unwrap();
        let lv = g.item(loss).unwrap();
        g.backward(loss).unwrap();
        drop(g);
        let grads = ids.iter().map(|&i| ps.download_grad(i).unwrap());
        Ok((lv, grads.collect()))
    }

    /// The same step composed from a backend's kernels, its GEMM operands formed as `how`
    /// says (the linear layers' stream ids as in [`TinyModel::graph_step`]).
    fn kernel_step<B: Backend>(&self, be: &B, how: StepGemm<'_>) -> (f32, Vec<Vec<f32>>) {
        let (tok, tgt) = Self::tokens();
        let (n, t, d, f, v) = (TM_B * TM_T, TM_T, TM_D, TM_F, TM_V);
        let p: Vec<B::Buf> = self
            .params
            .iter()
            .map(|(x, _)| be.upload(x).unwrap())
            .collect();
        let z = |len: usize| be.zeros(len).unwrap();
        // One GEMM operand: `x` (`rows x cols`) as the policy's `slot` quantizes it (BF16:
        // rounded), or `None` for the f32 tensor itself.
        let operand = |x: &B::Buf,
                       rows: usize,
                       cols: usize,
                       usage: Usage,
                       slot: fn(&GemmPolicy) -> &OperandQuant,
                       key: RngKey|
         -> Option<B::Buf> {
            match how {
                StepGemm::F32 => None,
                StepGemm::Bf16 => {
                    let mut r = z(be.len(x));
                    be.round_bf16(x, &mut r).unwrap();
                    Some(r)
                }
                StepGemm::Quantized(policy, q) => {
                    let host = be.download(x).unwrap();
                    Some(
                        be.upload(&q(&host, rows, cols, usage, slot(policy), key))
                            .unwrap(),
                    )
                }
            }
        };
        let (row, col) = (Usage::Rowwise, Usage::Columnwise);
        // y[rows, out] = x · Wᵀ
        let lin = |x: &B::Buf, w: &B::Buf, rows: usize, out: usize, inn: usize, layer: u64| {
            let xr = operand(
                x,
                rows,
                inn,
                row,
                |p| &p.fprop.a,
                tm_key(layer, OperandRole::FpropX),
            );
            let wr = operand(
                w,
                out,
                inn,
                row,
                |p| &p.fprop.b,
                tm_key(layer, OperandRole::FpropW),
            );
            let mut y = z(rows * out);
            be.gemm(
                rows,
                out,
                inn,
                1.0,
                xr.as_ref().unwrap_or(x),
                false,
                wr.as_ref().unwrap_or(w),
                true,
                0.0,
                &mut y,
            )
            .unwrap();
            y
        };
        // dx (+)= dy · W, dW = dyᵀ · x
        let lin_bwd = |x: &B::Buf,
                       w: &B::Buf,
                       dy: &B::Buf,
                       (rows, out, inn, layer): (usize, usize, usize, u64),
                       dx: &mut B::Buf,
                       acc: bool| {
            let beta = if acc { 1.0 } else { 0.0 };
            let key = |role| tm_key(layer, role);
            let dyr = operand(
                dy,
                rows,
                out,
                row,
                |p| &p.dgrad.a,
                key(OperandRole::DgradDy),
            );
            let dya = dyr.as_ref().unwrap_or(dy);
            match how {
                // autograd's linear: Dgrad's W operand is the transpose of the Fprop one when
                // the policy gives both the same transpose-exact quantizer
                StepGemm::Quantized(p, _)
                    if !(p.fprop.b == p.dgrad.b && quant::qgemm::transpose_exact(&p.dgrad.b)) =>
                {
                    let wc = operand(w, out, inn, col, |p| &p.dgrad.b, key(OperandRole::DgradW));
                    let wc = wc.unwrap(); // [inn, out]
                    be.gemm(rows, inn, out, 1.0, dya, false, &wc, true, beta, dx)
                        .unwrap();
                }
                _ => {
                    let wr = operand(w, out, inn, row, |p| &p.fprop.b, key(OperandRole::FpropW));
                    let wr = wr.as_ref().unwrap_or(w);
                    be.gemm(rows, inn, out, 1.0, dya, false, wr, false, beta, dx)
                        .unwrap();
                }
            }
            let mut dw = z(out * inn);
            match how {
                StepGemm::Quantized(..) => {
                    // the columnwise copies: dYᵀ [out, rows] and Xᵀ [inn, rows]
                    let dyc = operand(
                        dy,
                        rows,
                        out,
                        col,
                        |p| &p.wgrad.a,
                        key(OperandRole::WgradDy),
                    );
                    let xc = operand(x, rows, inn, col, |p| &p.wgrad.b, key(OperandRole::WgradX));
                    be.gemm(
                        out,
                        inn,
                        rows,
                        1.0,
                        &dyc.unwrap(),
                        false,
                        &xc.unwrap(),
                        true,
                        0.0,
                        &mut dw,
                    )
                    .unwrap();
                }
                _ => {
                    let xr = operand(x, rows, inn, row, |p| &p.fprop.a, key(OperandRole::FpropX));
                    let dyr = operand(
                        dy,
                        rows,
                        out,
                        row,
                        |p| &p.dgrad.a,
                        key(OperandRole::DgradDy),
                    );
                    let (xa, dya) = (xr.as_ref().unwrap_or(x), dyr.as_ref().unwrap_or(dy));
                    be.gemm(out, inn, rows, 1.0, dya, true, xa, false, 0.0, &mut dw)
                        .unwrap();
                }
            }
            dw
        };
        let rms = |x: &B::Buf, w: &B::Buf| {
            let (mut y, mut r) = (z(n * d), z(n));
            be.rmsnorm_fwd(x, w, TM_EPS, &mut y, Some(&mut r)).unwrap();
            (y, r)
        };
        let tab = be.upload(&rope_table(t, d, TM_BASE, 0)).unwrap();
        // forward
        let mut x0 = z(n * d);
        be.embedding_fwd(&p[0], d, &tok, &mut x0).unwrap();
        let (h1, r1) = rms(&x0, &p[1]);
        let (q, k, vv) = (
            lin(&h1, &p[2], n, d, d, 0),
            lin(&h1, &p[3], n, d, d, 1),
            lin(&h1, &p[4], n, d, d, 2),
        );
        let (mut qr, mut kr) = (z(n * d), z(n * d));
        be.rope(&q, &tab, t, d, false, (false, &mut qr)).unwrap();
        be.rope(&k, &tab, t, d, false, (false, &mut kr)).unwrap();
        let (mut a, mut lse) = (z(n * d), z(n));
        be.attention_fwd(
            &qr,
            &kr,
            &vv,
            TM_B,
            t,
            d,
            AttentionProducts::F32,
            &mut a,
            &mut lse,
        )
        .unwrap();
        let ao = lin(&a, &p[5], n, d, d, 3);
        let mut x1 = z(n * d);
        be.add(&x0, &ao, &mut x1).unwrap();
        let (h2, r2) = rms(&x1, &p[6]);
        let (gt, up) = (lin(&h2, &p[7], n, f, d, 4), lin(&h2, &p[8], n, f, d, 5));
        let mut s = z(n * f);
        be.swiglu_fwd(&gt, &up, &mut s).unwrap();
        let mo = lin(&s, &p[9], n, d, f, 6);
        let mut x2 = z(n * d);
        be.add(&x1, &mo, &mut x2).unwrap();
        let (h3, r3) = rms(&x2, &p[10]);
        let logits = lin(&h3, &p[11], n, v, d, 7);
        let (mut st, mut loss) = (z(2 * n), z(1));
        be.cross_entropy_fwd(&logits, v, &tgt, None, &mut st, &mut loss)
            .unwrap();
        // backward
        let mut g: Vec<Option<B::Buf>> = (0..12).map(|_| None).collect();
        let mut dlogits = z(n * v);
        be.cross_entropy_bwd(
            &logits,
            v,
            &tgt,
            None,
            &st,
            &be.upload(&[1.0]).unwrap(),
            (false, &mut dlogits),
        )
        .unwrap();
        let mut dh3 = z(n * d);
        g[11] = Some(lin_bwd(
            &h3,
            &p[11],
            &dlogits,
            (n, v, d, 7),
            &mut dh3,
            false,
        ));
        let (mut dx2, mut dnf) = (z(n * d), z(d));
        be.norm_bwd(
            NormKind::Rms,
            &x2,
            &p[10],
            &r3,
            &dh3,
            Some((false, &mut dx2)),
            Some((false, &mut dnf)),
            None,
        )
        .unwrap();
        g[10] = Some(dnf);
        let mut ds = z(n * f);
        g[9] = Some(lin_bwd(&s, &p[9], &dx2, (n, d, f, 6), &mut ds, false));
        let (mut dgt, mut dup) = (z(n * f), z(n * f));
        be.swiglu_bwd(
            &gt,
            &up,
            &ds,
            Some((false, &mut dgt)),
            Some((false, &mut dup)),
        )
        .unwrap();
        let mut dh2 = z(n * d);
        g[8] = Some(lin_bwd(&h2, &p[8], &dup, (n, f, d, 5), &mut dh2, false));
        g[7] = Some(lin_bwd(&h2, &p[7], &dgt, (n, f, d, 4), &mut dh2, true));
        let mut dx1 = z(n * d);
        be.copy_or_add(&dx2, (false, &mut dx1)).unwrap();
        let mut dn2 = z(d);
        be.norm_bwd(
            NormKind::Rms,
            &x1,
            &p[6],
            &r2,
            &dh2,
            Some((true, &mut dx1)),
            Some((false, &mut dn2)),
            None,
        )
        .unwrap();
        g[6] = Some(dn2);
        let mut da = z(n * d);
        g[5] = Some(lin_bwd(&a, &p[5], &dx1, (n, d, d, 3), &mut da, false));
        let (mut dqr, mut dkr, mut dv) = (z(n * d), z(n * d), z(n * d));
        be.attention_bwd(
            [&qr, &kr, &vv, &a],
            &lse,
            &da,
            TM_B,
            t,
            d,
            AttentionProducts::F32,
            (false, &mut dqr),
            (false, &mut dkr),
            (false, &mut dv),
        )
        .unwrap();
        let (mut dq, mut dk) = (z(n * d), z(n * d));
        be.rope(&dqr, &tab, t, d, true, (false, &mut dq)).unwrap();
        be.rope(&dkr, &tab, t, d, true, (false, &mut dk)).unwrap();
        let mut dh1 = z(n * d);
        g[4] = Some(lin_bwd(&h1, &p[4], &dv, (n, d, d, 2), &mut dh1, false));
        g[3] = Some(lin_bwd(&h1, &p[3], &dk, (n, d, d, 1), &mut dh1, true));
        g[2] = Some(lin_bwd(&h1, &p[2], &dq, (n, d, d, 0), &mut dh1, true));
        let mut dx0 = z(n * d);
        be.copy_or_add(&dx1, (false, &mut dx0)).unwrap();
        let mut dn1 = z(d);
        be.norm_bwd(
            NormKind::Rms,
            &x0,
            &p[1],
            &r1,
            &dh1,
            Some((true, &mut dx0)),
            Some((false, &mut dn1)),
            None,
        )
        .unwrap();
        g[1] = Some(dn1);
        let mut demb = z(v * d);
        be.embedding_bwd(&tok, &dx0, d, (false, &mut demb)).unwrap();
        g[0] = Some(demb);
        let loss = be.download(&loss).unwrap()[0];
        (
            loss,
            g.iter()
                .map(|x| be.download(x.as_ref().unwrap()).unwrap())
                .collect(),
        )
    }
}

/// `‖a − b‖ / ‖b‖` in f64.
fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y as f64).powi(2))
        .sum();
    let den: f64 = b.iter().map(|&y| (y as f64).powi(2)).sum();
    (num / den.max(1e-300)).sqrt()
}

/// The whole training step (forward + backward) of a tiny one-block GPT through autograd's
/// `Graph` on the device `dev` (every op's `Cuda` arm: the CUDA kernels) equals the same
/// `Graph` step on the CPU within a stated tolerance, for FP32, BF16 and the NVFP4, MXFP8 and
/// per-tensor FP8 recipes. Every op but the GEMMs and attention is bit-exact (tests above),
/// and those are within (k + 1) u Σ|ab| of exact, k <= 64, i.e. a relative error of order 4e-6
/// per product on this well-conditioned model; through about ten ops in series that stays well
/// below the 1e-4 asserted (loss and every gradient, Frobenius-relative).
///
/// Quantized operands: the quantizer kernels give quant's bits on the same input
/// ([`quant_linear`] checks the layer on identical inputs), but here the inputs of all but the
/// first GEMMs already differ by those ~1e-6 relative. An operand element whose input lies
/// within that distance of a rounding boundary (RNE: a midpoint; SR: its random threshold)
/// takes the neighbouring code: one BF16 ulp (2^-8) under BF16, hence 2e-3; one FP4 / FP8
/// step (up to 1/3 or 1/8 of the value, or a block scale when a block's amax moves) under
/// NVFP4 / MXFP8 / FP8, about 1e-2 Frobenius-relative per flip in these 32-row GEMMs, which no
/// bound that still catches a kernel bug could absorb. Data and arithmetic are fixed and
/// deterministic, so whether a flip happens is fixed too: on this model none does (measured:
/// loss identical, gradients at most 3.3e-7), and the test asserts the FP32 bound 1e-4 for the
/// quantized recipes. A change of model or data that makes a flip occur must raise it by
/// ~1e-2 per flip, not be read as a kernel bug. The measured values are printed; the device
/// step is deterministic (rerun bit for bit, stochastic rounding included).
pub fn tiny_model_graph_step_on_device_matches_cpu(dev: &Arc<DeviceBackend>) {
    let m = TinyModel::new();
    let cases = [
        ("fp32", 1e-4, true),
        ("bf16", 2e-3, true),
        ("nvfp4", 1e-4, true),
        ("mxfp8", 1e-4, false),
        ("fp8-current", 1e-4, false),
    ];
    for (name, tol, rerun) in cases {
        let policy = GemmPolicy::preset(name).unwrap();
        let (l_ref, g_ref) = m.graph_step(&policy);
        let (l_d, g_d) = m.graph_step_on(&policy, Some(dev)).unwrap();
        let lerr = ((l_d - l_ref) as f64 / l_ref as f64).abs();
        let gerr = worst_rel(&g_d, &g_ref);
        eprintln!(
            "{name}: loss {l_ref} (device graph {l_d}, rel {lerr:.2e}); worst gradient rel error {gerr:.2e}"
        );
        assert!(
            lerr <= tol && gerr <= tol,
            "{name}: loss rel {lerr:e}, grads rel {gerr:e} > {tol:e}"
        );
        if rerun {
            let (l2, g2) = m.graph_step_on(&policy, Some(dev)).unwrap();
            assert_eq!(l2.to_bits(), l_d.to_bits());
            for (a, b) in g2.iter().zip(&g_d) {
                same_bits("rerun gradient", a, b);
            }
        }
    }
    // quantization is real: the NVFP4 step is not the FP32 one
    let (l32, _) = m.graph_step(&GemmPolicy::FP32);
    let (l4, _) = m.graph_step(&GemmPolicy::nvfp4_paper());
    assert!((l32 - l4).abs() > 1e-3, "NVFP4 loss {l4} vs FP32 {l32}");
}

/// The layout ops the trainer's GPT uses (`split`, `split_heads`, `transpose`,
/// `merge_heads`), forward and backward, through `Graph` on `dev`: bit for bit the CPU graph's
/// values and gradients (pure copies and the same f32 adds), including a tensor split into
/// parts that all feed the loss and a gradient accumulated from two paths. Rows of fewer than
/// 32 elements and of 32 or more (a warp per row in the kernels) both.
pub fn layout_ops_are_bit_exact(dev: &Arc<DeviceBackend>) {
    for shape in [(2, 5, 3, 4), (2, 37, 2, 40)] {
        layout_shape_is_bit_exact(dev, shape);
    }
}

fn layout_shape_is_bit_exact(dev: &Arc<DeviceBackend>, (b, t, h, d): (usize, usize, usize, usize)) {
    let c = h * d;
    let xv = init::normal(b * t * 3 * c, 1.0, 41);
    let r = init::normal(b * t * c, 1.0, 42);
    let run = |on: Option<&Arc<DeviceBackend>>| {
        let mut ps = ParamStore::new();
        if let Some(be) = on {
            ps.to_device(be).unwrap();
        }
        let mut g = Graph::new(&mut ps);
        let x = g.variable(&xv, &[b, t, 3 * c]).unwrap();
        let p = g.split(x, &[c, c, c]).unwrap();
        let (q, k) = (
            g.split_heads(p[0], h).unwrap(),
            g.split_heads(p[1], h).unwrap(),
        );
        let kt = g.transpose(k, 2, 3).unwrap(); // [b, h, d, t]
        let kt = g.transpose(kt, 3, 2).unwrap(); // back to [b, h, t, d]
        let s = g.mul(q, kt).unwrap();
        let m = g.merge_heads(s).unwrap();
        let y = g.add(m, p[2]).unwrap();
        let y = g.add(y, p[0]).unwrap(); // p[0] reaches the loss twice
        let vals = [
            g.to_vec(p[1]).unwrap(),
            g.to_vec(kt).unwrap(),
            g.to_vec(y).unwrap(),
        ];
        g.backward_with(y, &r).unwrap();
        (vals, g.grad_vec(x).unwrap().unwrap())
    };
    let (cv, cg) = run(None);
    let (dv, dg) = run(Some(dev));
    for (i, (x, y)) in dv.iter().zip(&cv).enumerate() {
        same_bits(&format!("layout [{b},{t},{h},{d}] forward {i}"), x, y);
    }
    same_bits(&format!("layout [{b},{t},{h},{d}] backward"), &dg, &cg);
}

/// A device graph's op profile (each op synchronised with the device before it is timed):
/// every op kind recorded forward, the differentiable ones backward too, with their calls.
pub fn device_op_profile_records_each_op(dev: &Arc<DeviceBackend>) {
    let mut ps = ParamStore::new();
    let w = ps
        .add("w", &[2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
        .unwrap();
    ps.to_device(dev).unwrap();
    let mut g = Graph::new(&mut ps);
    g.enable_profiling();
    let x = g
        .variable(&[1.0, -1.0, 2.0, 0.5, 1.0, 1.0], &[2, 3])
        .unwrap();
    let wt = g.param(w).unwrap();
    let y = g.mul(x, wt).unwrap();
    let y = g.gelu(y).unwrap();
    let y = g.gelu(y).unwrap();
    let l = g.sum(y).unwrap();
    g.backward(l).unwrap();
    let p = g.profile().expect("profiling is on").clone();
    let calls = |op: &str, forward: bool| {
        p.entries()
            .iter()
            .find(|e| e.op == op && e.forward == forward)
            .map(|e| e.calls)
    };
    assert_eq!(calls("gelu", true), Some(2), "{p}");
    assert_eq!(calls("gelu", false), Some(2), "{p}");
    assert_eq!(calls("mul", true), Some(1), "{p}");
    assert_eq!(calls("mul", false), Some(1), "{p}");
    assert!(p.entries().iter().all(|e| e.seconds >= 0.0), "{p}");
}

/// A device graph: host reads are typed errors, ops without a kernel name themselves, the
/// store moves back to the host with its values and gradients.
pub fn device_graph_boundary(dev: &Arc<DeviceBackend>) {
    let mut ps = ParamStore::new();
    let w = ps
        .add("w", &[2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
        .unwrap();
    ps.to_device(dev).unwrap();
    assert_eq!(ps.device(), autograd::Device::Cuda);
    assert!(matches!(
        ps.value(w),
        Err(autograd::Error::WrongDevice { .. })
    ));
    let b = ps.add("b", &[3], vec![0.5; 3]).unwrap(); // added on the device
    let mut g = Graph::new(&mut ps);
    assert_eq!(g.device(), autograd::Device::Cuda);
    let x = g
        .variable(&[1.0, -1.0, 2.0, 0.0, 1.0, 1.0], &[2, 3])
        .unwrap();
    let (wt, bt) = (g.param(w).unwrap(), g.param(b).unwrap());
    let y = g.mul(x, wt).unwrap();
    let y = g.add(y, bt).unwrap();
    assert_eq!(g.to_vec(y).unwrap(), vec![1.5, -1.5, 6.5, 0.5, 5.5, 6.5]);
    assert!(matches!(
        g.value(y),
        Err(autograd::Error::WrongDevice { .. })
    ));
    assert!(matches!(
        g.cached_attention(y, &[], &[], 1, 0),
        Err(autograd::Error::Shape { .. })
    ));
    let yt = g.matmul_t(y, wt).unwrap(); // [2, 3] · [2, 3]ᵀ
    assert_eq!(g.to_vec(yt).unwrap().len(), 4);
    let l = g.sum(y).unwrap();
    assert_eq!(g.item(l).unwrap(), 19.0);
    g.backward(l).unwrap();
    assert_eq!(
        g.grad_vec(x).unwrap().unwrap(),
        vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    );
    drop(g);
    assert_eq!(ps.download_grad(b).unwrap(), vec![2.0; 3]);
    ps.to_host().unwrap();
    assert_eq!(ps.device(), autograd::Device::Cpu);
    assert_eq!(ps.grad(w).unwrap(), &[1.0, -1.0, 2.0, 0.0, 1.0, 1.0]);
    assert_eq!(ps.value(b).unwrap(), &[0.5; 3]);
    ps.zero_grad();
    assert_eq!(ps.grad(b).unwrap(), &[0.0; 3]);
}

/// The worst Frobenius-relative error over the gradients.
fn worst_rel(got: &[Vec<f32>], want: &[Vec<f32>]) -> f64 {
    got.iter()
        .zip(want)
        .map(|(a, b)| rel_err(a, b))
        .fold(0.0, f64::max)
}

/// quant's own NVFP4 quantizer (the CPU linear's), as a [`Quantizer`].
pub fn cpu_quantizer(
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    q: &OperandQuant,
    key: RngKey,
) -> quant::QuantizedTensor {
    let m = quant::MatRef::new(x, rows, cols).unwrap();
    let qz = quant::Quantizer::new(*q, usage).unwrap().with_key(key);
    qz.quantize(m, &mut quant::QuantState::new()).unwrap()
}

/// The tiny model's whole step under the NVFP4 paper policy, its GEMM operands quantized by
/// `quantize` (the backend's quantizer kernels, dequantized by its kernel) inside the
/// kernel-composed linear layers, against autograd's `Graph` step (NVFP4 operands on the
/// BF16 GEMM).
///
/// Bound. The quantizers give the CPU's bits on the same input (`quantize` asserts that for
/// every operand), so the steps differ by (a) the GEMMs: the f32 GEMM on dequantized values
/// (factor applied per element) against the BF16 GEMM on the unscaled values with α in the
/// epilogue - both with exact products (e2m1 x UE4M3 values have at most 6 significant
/// bits), summed in different orders, each within (k + 1) u Σ|ab| (k <= 64), the FP32 case's
/// bound: 1e-4 on the loss and every gradient; and (b) code flips: a quantizer input that
/// moved by such a δ (~1e-6 relative) takes another FP4 code only if it lies within δ of a
/// rounding boundary (RNE: a midpoint; SR: its random threshold), and a flip moves that
/// element by one FP4 step (up to 1/3 of its value, or a block's scale when the block's amax
/// moves), i.e. a Frobenius-relative change of up to ~1/(3·sqrt(32 · 16)) ≈ 1.5e-2 in a
/// 32-row GEMM's output. Data and arithmetic are fixed and deterministic, so whether a flip
/// happens is fixed too: on this model none does (measured: loss identical, gradients 5e-7,
/// the same as the CPU backend with quant's quantizer, i.e. (a) alone), and the test asserts
/// (a)'s bound. A change of model or data that makes a flip occur must raise it by 1.5e-2
/// per flip, not be read as a kernel bug.
pub fn tiny_model_nvfp4_step_matches_the_graph_step<B: Backend>(e: &B, quantize: Quantizer<'_>) {
    let m = TinyModel::new();
    let policy = GemmPolicy::nvfp4_paper();
    let (l_ref, g_ref) = m.graph_step(&policy);
    let cpu =
        |x: &[f32], r, c, u, q: &OperandQuant, k| cpu_quantizer(x, r, c, u, q, k).dequantize();
    let (l_c, g_c) = m.kernel_step(&CpuBackend, StepGemm::Quantized(&policy, &cpu));
    let (l_k, g_k) = m.kernel_step(e, StepGemm::Quantized(&policy, quantize));
    let rel = |a: f32| ((a - l_ref) as f64 / l_ref as f64).abs();
    let (gerr, cerr) = (worst_rel(&g_k, &g_ref), worst_rel(&g_c, &g_ref));
    eprintln!(
        "nvfp4: loss {l_ref} (kernels {l_k}, rel {:.2e}; CPU backend rel {:.2e}); worst gradient rel error: kernels {gerr:.2e}, CPU backend {cerr:.2e}",
        rel(l_k),
        rel(l_c)
    );
    let (ltol, gtol) = (1e-4, 1e-4);
    assert!(
        rel(l_k) <= ltol && gerr <= gtol,
        "nvfp4: loss rel {:e}, grads rel {gerr:e}",
        rel(l_k)
    );
    assert!(
        rel(l_c) <= ltol && cerr <= gtol,
        "nvfp4 CPU backend: loss rel {:e}, grads rel {cerr:e}",
        rel(l_c)
    );
    // quantization is real: the step is not the FP32 one
    let (l32, _) = m.graph_step(&GemmPolicy::FP32);
    assert!(
        rel(l32) > 10.0 * rel(l_k),
        "NVFP4 loss {l_ref} vs FP32 {l32}"
    );
    // the kernel step (stochastic rounding included) is deterministic
    let (l2, g2) = m.kernel_step(e, StepGemm::Quantized(&policy, quantize));
    assert_eq!(l2.to_bits(), l_k.to_bits());
    for (a, b) in g2.iter().zip(&g_k) {
        same_bits("rerun gradient", a, b);
    }
}

//! The CUDA training kernels (`kernels-cuda/cuda/*.cu`), run on the CPU through
//! `kernels_cuda::emu` and driven through autograd's [`Backend`] trait exactly as on a GPU,
//! compared with autograd's CPU ops (through the public `Graph` API) on the same inputs.
//!
//! Bit for bit: every op whose CPU order of operations the kernels mirror (elementwise,
//! column sums, f64 sums, BF16 rounding, GELU / SiLU / SwiGLU with the Cephes exp, RMSNorm /
//! LayerNorm with their 16-lane reductions and row chunking, RoPE, embedding, cross-entropy,
//! gradient norm, AdamW), on sizes that take both the CPU's single-task and parallel paths.
//! Within a bound: attention and the f32 GEMM, whose CPU versions use quant's blocked sgemm
//! (bounds derived in `attention_within_derived_bounds` and `gemm_within_accumulation_bound`).
//!
//! Without a C++20 compiler the tests print `SKIP` and return.

use autograd::backend::{
    rope_table, Act, AdamWCoeffs, Backend, BackendError, CpuBackend, CudaBackend, KernelBackend,
    NormKind,
};
use autograd::{init, Graph, ParamStore};
use kernels_cuda::emu::{Emu, EmuError};

type EmuBackend = KernelBackend<&'static Emu>;

fn emu(test: &str) -> Option<EmuBackend> {
    match Emu::shared() {
        Ok(e) => Some(KernelBackend::with_launcher(e, "cuda-emulated")),
        Err(e @ (EmuError::NoCompiler(_) | EmuError::NoCxx20(..))) => {
            eprintln!("SKIP {test}: {e}");
            None
        }
        Err(e) => panic!("{test}: {e}"),
    }
}

#[track_caller]
fn same_bits(what: &str, got: &[f32], want: &[f32]) {
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

fn up(b: &EmuBackend, x: &[f32]) -> <EmuBackend as Backend>::Buf {
    b.upload(x).unwrap()
}

fn down(b: &EmuBackend, x: &<EmuBackend as Backend>::Buf) -> Vec<f32> {
    b.download(x).unwrap()
}

fn zeros(b: &EmuBackend, n: usize) -> <EmuBackend as Backend>::Buf {
    b.zeros(n).unwrap()
}

/// Row counts that take the CPU kernels' single-task path (< 2^15 elements) and their
/// parallel, chunked path.
const SHAPES: [(usize, usize); 3] = [(3, 20), (7, 48), (300, 128)];

#[test]
fn elementwise_and_reductions_are_bit_exact() {
    let Some(e) = emu("elementwise_and_reductions_are_bit_exact") else {
        return;
    };
    for (i, &(rows, n)) in SHAPES.iter().enumerate() {
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

        let (da, db, dc, dr) = (up(&e, &av), up(&e, &bv), up(&e, &cv), up(&e, &r));
        let mut dab = zeros(&e, rows * n);
        e.mul(&da, &db, (false, &mut dab)).unwrap();
        let mut dabc = zeros(&e, rows * n);
        e.mul(&dab, &dc, (false, &mut dabc)).unwrap();
        let mut ds1 = zeros(&e, rows * n);
        e.add(&dabc, &dc, &mut ds1).unwrap();
        let mut dy = zeros(&e, rows * n);
        e.scale(&ds1, -1.5, (false, &mut dy)).unwrap();
        same_bits("add/mul/scale", &down(&e, &dy), &yv);
        let mut dyr = zeros(&e, rows * n);
        e.round_bf16(&dy, &mut dyr).unwrap();
        same_bits("round_bf16", &down(&e, &dyr), &yrv);
        let mut out = zeros(&e, 1);
        e.sum(&dyr, 1.0, &mut out).unwrap();
        same_bits("sum", &down(&e, &out), &[tv]);
        e.sum(&dy, 1.0 / (rows * n) as f64, &mut out).unwrap();
        same_bits("mean", &down(&e, &out), &[mv]);

        // backward, as the ops compose it: dS1 = -1.5 dY; dA = dABC ⊙ b ⊙ ...
        let mut gs1 = zeros(&e, rows * n);
        e.scale(&dr, -1.5, (false, &mut gs1)).unwrap();
        let mut gc_k = zeros(&e, n);
        e.sum_rows(&gs1, n, (false, &mut gc_k)).unwrap(); // add's broadcast operand
        let mut gab = zeros(&e, rows * n);
        e.mul(&gs1, &dc, (false, &mut gab)).unwrap();
        let mut tmp = zeros(&e, rows * n);
        e.mul(&gs1, &dab, (false, &mut tmp)).unwrap();
        e.sum_rows(&tmp, n, (true, &mut gc_k)).unwrap(); // mul's broadcast operand, accumulated
        let (mut ga_k, mut gb_k) = (zeros(&e, rows * n), zeros(&e, rows * n));
        e.mul(&gab, &db, (false, &mut ga_k)).unwrap();
        e.mul(&gab, &da, (false, &mut gb_k)).unwrap();
        same_bits("d/da", &down(&e, &ga_k), &ga);
        same_bits("d/db", &down(&e, &gb_k), &gb);
        same_bits("d/dc (column sums)", &down(&e, &gc_k), &gc);
    }
}

#[test]
fn activations_are_bit_exact() {
    let Some(e) = emu("activations_are_bit_exact") else {
        return;
    };
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

    let (dx, du, dr) = (up(&e, &xv), up(&e, &uv), up(&e, &r));
    let mut y = zeros(&e, n);
    e.act_fwd(Act::Gelu, &dx, &mut y).unwrap();
    same_bits("gelu", &down(&e, &y), &vals[0]);
    e.act_fwd(Act::Silu, &dx, &mut y).unwrap();
    same_bits("silu", &down(&e, &y), &vals[1]);
    e.swiglu_fwd(&dx, &du, &mut y).unwrap();
    same_bits("swiglu", &down(&e, &y), &vals[2]);
    // the graph accumulates x's gradient in op order: gelu, silu, swiglu (reverse creation:
    // swiglu first, then silu, then gelu)
    let (mut gx_k, mut gu_k) = (zeros(&e, n), zeros(&e, n));
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
    same_bits("activation grads (x)", &down(&e, &gx_k), &gx);
    same_bits("swiglu grad (up)", &down(&e, &gu_k), &gu);
}

#[test]
fn norms_are_bit_exact() {
    let Some(e) = emu("norms_are_bit_exact") else {
        return;
    };
    for (i, &(rows, d)) in SHAPES.iter().chain(&[(5, 33)]).enumerate() {
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

            let (dx, dw, db, dr) = (up(&e, &xv), up(&e, &wv), up(&e, &bv), up(&e, &r1));
            let mut y_k = zeros(&e, rows * d);
            let mut st = zeros(&e, if layer { 2 * rows } else { rows });
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
            same_bits(&format!("{what} forward"), &down(&e, &y_k), &yv);
            let (mut gx_k, mut gw_k, mut gb_k) = (zeros(&e, rows * d), zeros(&e, d), zeros(&e, d));
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
            same_bits(&format!("{what} dx"), &down(&e, &gx_k), &gx);
            same_bits(&format!("{what} dw"), &down(&e, &gw_k), &gw);
            if let Some(gb) = gb {
                same_bits(&format!("{what} db"), &down(&e, &gb_k), &gb);
            }
            // accumulation into existing gradients: the second seed adds
            let dr2 = up(&e, &r2);
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
                down(&e, &st),
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
            same_bits(&format!("{what} dx accumulated"), &down(&e, &gx_k), &cgx);
            same_bits(&format!("{what} dw accumulated"), &down(&e, &gw_k), &cgw);
        }
    }
}

#[test]
fn rope_embedding_cross_entropy_are_bit_exact() {
    let Some(e) = emu("rope_embedding_cross_entropy_are_bit_exact") else {
        return;
    };
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
    let tab = up(&e, &rope_table(t, d, 500.0, 4));
    let (dx, dr) = (up(&e, &xv), up(&e, &r));
    let mut y_k = zeros(&e, xv.len());
    e.rope(&dx, &tab, t, d, false, (false, &mut y_k)).unwrap();
    same_bits("rope", &down(&e, &y_k), &yv);
    e.rope(&dr, &tab, t, d, true, (false, &mut y_k)).unwrap();
    same_bits("rope backward", &down(&e, &y_k), &gx);

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
    let dt = up(&e, &tv);
    let mut y_k = zeros(&e, ids.len() * dm);
    e.embedding_fwd(&dt, dm, &ids, &mut y_k).unwrap();
    same_bits("embedding", &down(&e, &y_k), &yv);
    let mut gt_k = up(&e, &vec![f32::NAN; vocab * dm]); // overwritten: acc = false
    e.embedding_bwd(&ids, &up(&e, &r), dm, (false, &mut gt_k))
        .unwrap();
    same_bits("embedding backward", &down(&e, &gt_k), &gt);

    // cross-entropy: V = 37 (two 16-lane chunks and a tail), one ignored row, huge logits
    for (rows, v, ignore) in [(6, 37, Some(36u32)), (40, 1000, None)] {
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
        let dl = up(&e, &lv);
        let (mut st, mut lo) = (zeros(&e, 2 * rows), zeros(&e, 1));
        let count = e
            .cross_entropy_fwd(&dl, v, &targets, ignore, &mut st, &mut lo)
            .unwrap();
        assert_eq!(count, rows - ignore.is_some() as usize);
        let l0 = down(&e, &lo)[0];
        same_bits("cross_entropy loss", &[0.7 * l0], &[lossv]);
        let mut gl_k = zeros(&e, rows * v);
        e.cross_entropy_bwd(
            &dl,
            v,
            &targets,
            ignore,
            &st,
            &up(&e, &[0.7]),
            (false, &mut gl_k),
        )
        .unwrap();
        same_bits("cross_entropy backward", &down(&e, &gl_k), &gl);
    }
}

#[test]
fn grad_norm_and_adamw_match_optim_bit_for_bit() {
    let Some(e) = emu("grad_norm_and_adamw_match_optim_bit_for_bit") else {
        return;
    };
    // three tensors, one spanning several 16K chunks
    let sizes = [40_000usize, 17, 3000];
    let grads: Vec<Vec<f32>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| init::normal(n, 0.3, 50 + i as u64))
        .collect();
    let want = optim::grad_norm(&grads.iter().map(|g| &g[..]).collect::<Vec<_>>());
    let dg: Vec<_> = grads.iter().map(|g| up(&e, g)).collect();
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
    let mut dp: Vec<_> = params.iter().map(|p| up(&e, p)).collect();
    let mut dm: Vec<_> = sizes.iter().map(|&n| zeros(&e, n)).collect();
    let mut dv: Vec<_> = sizes.iter().map(|&n| zeros(&e, n)).collect();
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
                &down(&e, &dp[i]),
                &params[i],
            );
            same_bits(
                &format!("adamw step {step} m {i}"),
                &down(&e, &dm[i]),
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

#[test]
fn gemm_within_accumulation_bound() {
    let Some(e) = emu("gemm_within_accumulation_bound") else {
        return;
    };
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
        let mut c = up(&e, &c0);
        e.gemm(
            m,
            n,
            k,
            0.5,
            &up(&e, &av),
            ta,
            &up(&e, &bv),
            tb,
            2.0,
            &mut c,
        )
        .unwrap();
        let cpu = CpuBackend;
        let mut cc = c0.clone();
        cpu.gemm(m, n, k, 0.5, &av, ta, &bv, tb, 2.0, &mut cc)
            .unwrap();
        let (we, wc) = (worst(&down(&e, &c), &r, &bound), worst(&cc, &r, &bound));
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

#[test]
fn attention_within_derived_bounds() {
    let Some(e) = emu("attention_within_derived_bounds") else {
        return;
    };
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

        let (dq, dk, dv, dr) = (up(&e, &qv), up(&e, &kv), up(&e, &vv), up(&e, &r));
        let (mut o_k, mut lse) = (zeros(&e, n), zeros(&e, bh * t));
        e.attention_fwd(&dq, &dk, &dv, bh, t, d, &mut o_k, &mut lse)
            .unwrap();
        let (mut gq, mut gk, mut gv) = (zeros(&e, n), zeros(&e, n), zeros(&e, n));
        e.attention_bwd(
            [&dq, &dk, &dv, &o_k],
            &lse,
            &dr,
            bh,
            t,
            d,
            (false, &mut gq),
            (false, &mut gk),
            (false, &mut gv),
        )
        .unwrap();
        let kg = [down(&e, &gq), down(&e, &gk), down(&e, &gv)];
        let ok = down(&e, &o_k);
        // deterministic: a second run gives the same bits
        let mut o2 = zeros(&e, n);
        e.attention_fwd(&dq, &dk, &dv, bh, t, d, &mut o2, &mut lse)
            .unwrap();
        same_bits("attention rerun", &down(&e, &o2), &ok);
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

#[test]
fn bad_input_is_a_typed_error() {
    let Some(e) = emu("bad_input_is_a_typed_error") else {
        return;
    };
    let (a, b) = (up(&e, &[1.0; 6]), up(&e, &[1.0; 4]));
    let mut out = zeros(&e, 6);
    assert!(matches!(
        e.add(&a, &b, &mut out),
        Err(BackendError::InvalidArgument(_))
    ));
    let mut st = zeros(&e, 4);
    let mut lo = zeros(&e, 1);
    let r = e.cross_entropy_fwd(&a, 3, &[0, 3], None, &mut st, &mut lo);
    assert!(matches!(r, Err(BackendError::InvalidArgument(m)) if m.contains("target 3")));
    let big = zeros(&e, 2 * 200);
    let mut o = zeros(&e, 400);
    let mut lse = zeros(&e, 2);
    assert!(matches!(
        e.attention_fwd(&big, &big, &big, 1, 2, 200, &mut o, &mut lse),
        Err(BackendError::Kernel(_))
    ));
    let mut y = zeros(&e, 2);
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

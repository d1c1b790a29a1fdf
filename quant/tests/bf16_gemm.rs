//! The BF16 GEMM in both arithmetics against their scalar models (bit for bit, on the
//! dispatched path, which is the hardware unit where the CPU has it, and on the portable
//! one), independence of M and of the split, and f64 bounds.

use quant::gemm::bf16::{
    bf16_gemm_tn, bf16_gemm_tn_portable, quantized_gemm_arithmetic, quantized_gemm_tn,
    Bf16Arithmetic, Bf16Workspace, PackedPair,
};
use quant::gemm::MatRef;

const BOTH: [Bf16Arithmetic; 2] = [Bf16Arithmetic::Tiles, Bf16Arithmetic::Pairs];

fn lcg(seed: u64) -> impl FnMut() -> f32 {
    let mut s = seed;
    move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

fn bf(x: f32) -> f32 {
    f32::from_bits((quant::gemm::bf16::bf16_bits(x) as u32) << 16)
}

/// Both paths of both arithmetics, compared with [`Bf16Arithmetic::dot_reference`] element
/// by element.
fn check_model(a: &[f32], b: &[f32], m: usize, n: usize, k: usize) {
    let mut ws = Bf16Workspace::new();
    let (av, bv) = (MatRef::row_major(a, m, k), MatRef::row_major(b, n, k));
    for arith in BOTH {
        let mut c = vec![f32::NAN; m * n];
        let mut cp = vec![f32::NAN; m * n];
        bf16_gemm_tn(arith, av, bv, &mut c, &mut ws);
        bf16_gemm_tn_portable(arith, av, bv, &mut cp, &mut ws);
        for i in 0..m {
            for j in 0..n {
                let r = arith.dot_reference(&a[i * k..][..k], &b[j * k..][..k]);
                let (x, y) = (c[i * n + j], cp[i * n + j]);
                let native = arith.native();
                assert!(
                    x.to_bits() == r.to_bits() || (x.is_nan() && r.is_nan()),
                    "{arith:?} dispatched (native {native}) ({i},{j}) of [{m},{n},{k}]: {x:e} vs model {r:e}"
                );
                assert!(
                    y.to_bits() == r.to_bits() || (y.is_nan() && r.is_nan()),
                    "{arith:?} portable ({i},{j}) of [{m},{n},{k}]: {y:e} vs model {r:e}"
                );
            }
        }
    }
}

/// The two arithmetics are not the same function: data that separates them (the sum
/// orders differ) gives different bits, so a GEMM of one cannot pass the other's model.
#[test]
fn the_two_arithmetics_differ_where_the_order_matters() {
    let h = 2f32.powi(-24);
    // Tiles: even lane 1 + h -> 1 (tie to even), odd lane 1.5h, chunk sum 1 + 1.5h -> 1 + 2h.
    // Pairs: 1.5h, + 1 -> 1 + 2h, + 0, + h -> 1 + 3h, a tie -> 1 + 4h.
    let a = [1.0, 1.5 * h, h, 0.0];
    let b = [1.0f32; 4];
    let tiles = Bf16Arithmetic::Tiles.dot_reference(&a, &b);
    let pairs = Bf16Arithmetic::Pairs.dot_reference(&a, &b);
    assert_eq!((tiles, pairs), (1.0 + 2.0 * h, 1.0 + 4.0 * h));
    // the odd product goes first in a pair: 1, + 1.5h -> 1 + 2h, + h -> 1 + 4h (even first
    // would give 1 + h -> 1, + 1.5h -> 1 + 2h)
    let got = Bf16Arithmetic::Pairs.dot_reference(&[1.0, 0.0, h, 1.5 * h], &b);
    assert_eq!(got, 1.0 + 4.0 * h);
}

#[test]
fn matches_the_scalar_model_on_random_shapes() {
    let mut rnd = lcg(1);
    for &(m, n, k) in &[
        (1, 1, 1),
        (3, 5, 7),
        (17, 33, 31),
        (40, 20, 64),
        (33, 65, 100),
        // two K slabs (of at most 64 chunks), the last chunk partial
        (45, 70, 2100),
    ] {
        let a: Vec<f32> = (0..m * k).map(|_| rnd() * 3.0).collect();
        let b: Vec<f32> = (0..n * k).map(|_| rnd()).collect();
        check_model(&a, &b, m, n, k);
    }
}

/// Values chosen to separate the candidate arithmetics: cancellation between the even and
/// odd lanes, sums at the edge of the normal range, subnormal inputs and products, signed
/// zeros, huge values, infinities.
#[test]
fn matches_the_scalar_model_on_edge_data() {
    let tiny = f32::MIN_POSITIVE; // 2^-126
    let specials = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        1.0e18,
        -1.0e18,
        3.0e17,
        -7.0e16,
        tiny,
        -tiny,
        tiny * 1.5,
        tiny / 4.0, // subnormal input (DAZ)
        -tiny / 8.0,
        2f32.powi(-63),
        2f32.powi(-64),
        -2f32.powi(-70), // products with these are subnormal or tiny
        1.5 * 2f32.powi(-60),
        2f32.powi(50),
        2f32.powi(24),
        -2f32.powi(24),
        1.0 + 2f32.powi(-7),
        65504.0,
    ];
    let mut rnd = lcg(7);
    let (m, n, k) = (19, 21, 96);
    let pick =
        |r: f32| specials[((r + 1.0) * 0.5 * specials.len() as f32) as usize % specials.len()];
    let mut a: Vec<f32> = (0..m * k).map(|_| 0.0).collect();
    let mut b: Vec<f32> = (0..n * k).map(|_| 0.0).collect();
    for v in a.iter_mut().chain(b.iter_mut()) {
        let r = rnd();
        *v = pick(r);
    }
    // no infinities in B, so most rows stay finite (inf · 0 = NaN is checked on some)
    for v in b.iter_mut().skip(n * k / 2) {
        if v.is_infinite() {
            *v = 1.0;
        }
    }
    check_model(&a, &b, m, n, k);
    // rows built to cancel: large terms in even lanes cancel, small ones in odd lanes survive
    let mut a2 = vec![0.0f32; 4 * 64];
    let mut b2 = vec![0.0f32; 3 * 64];
    for kk in 0..64 {
        a2[kk] = if kk % 2 == 0 {
            [1.0e8, -1.0e8][kk / 2 % 2]
        } else {
            1.0
        };
        a2[64 + kk] = if kk % 4 == 0 { tiny } else { -tiny * 0.5 };
        a2[128 + kk] = if kk < 32 {
            2f32.powi(-63)
        } else {
            -2f32.powi(-63)
        };
        a2[192 + kk] = [1.0, 2f32.powi(-9), -1.0, 2f32.powi(-9)][kk % 4];
        b2[kk] = 1.0;
        b2[64 + kk] = 2f32.powi(-63) * (1.0 + (kk % 3) as f32);
        b2[128 + kk] = -0.0;
    }
    check_model(&a2, &b2, 4, 3, 64);
    // subnormal products (2^-127, 2^-128) next to normal ones, and sums of them that would
    // reach the normal range if they were kept
    let mut a3 = vec![0.0f32; 3 * 32];
    let mut b3 = vec![0.0f32; 2 * 32];
    for kk in 0..32 {
        a3[kk] = 2f32.powi(-64);
        a3[32 + kk] = if kk < 2 {
            2f32.powi(-60)
        } else {
            2f32.powi(-64)
        };
        a3[64 + kk] = if kk % 2 == 0 {
            2f32.powi(-64)
        } else {
            -2f32.powi(-64)
        };
        b3[kk] = 2f32.powi(-63);
        b3[32 + kk] = 2f32.powi(-63) * [1.0, 1.5, 1.75, 1.25][kk % 4];
    }
    check_model(&a3, &b3, 3, 2, 32);
}

/// `vdpbf16ps` as measured on an AMD EPYC Zen 4 (and as Intel specifies it): each case is a
/// dot product whose first pair sets the running sum (`c = +0 + 0 + a0·1`) and whose second
/// pair (even, odd) probes one property. The expected values are the measurements; the
/// pair model and, where the CPU has AVX512_BF16 or AVX2 + FMA, the hardware must give
/// them. The two cases at the edge of 2^-126 (x86 detects tininess after rounding) were
/// measured on an AMD EPYC Zen 3 with `vfmadd231ps` under MXCSR.FTZ, not yet on
/// `vdpbf16ps`: a CPU with AVX512_BF16 checks them here.
#[test]
fn the_pair_arithmetic_is_vdpbf16ps_as_measured() {
    let h = 2f32.powi(-24);
    let min = f32::MIN_POSITIVE; // 2^-126
    let p = |e: i32| 2f32.powi(e);
    // (start, [even a, odd a], [even b, odd b], expected, what)
    type Probe = (f32, [f32; 2], [f32; 2], f32, &'static str);
    let cases: [Probe; 9] = [
        (
            1.0,
            [h, h],
            [1.0, 1.0],
            1.0,
            "two roundings: 1 + h -> 1, + h -> 1",
        ),
        (
            1.0,
            [h, 1.5 * h],
            [1.0, 1.0],
            1.0 + 4.0 * h,
            "odd first: 1 + 1.5h -> 1 + 2h, + h -> 1 + 4h",
        ),
        (
            1.0,
            [1.5 * h, h],
            [1.0, 1.0],
            1.0 + 2.0 * h,
            "odd first: 1 + h -> 1, + 1.5h -> 1 + 2h",
        ),
        (
            min,
            [p(-64), 0.0],
            [p(-63), 0.0],
            1.5 * min,
            "a product of 2^-127 is not flushed",
        ),
        (
            1.5 * min,
            [p(-64), -p(-63)],
            [p(-63), p(-63)],
            0.0,
            "2^-127 between the steps is flushed",
        ),
        (
            min,
            [0.0, 1.5 * p(-63)],
            [0.0, -p(-88)],
            0.0,
            "2^-126 - 0.75·2^-150 rounds up on the subnormal grid, down with 24 bits: tiny, flushed",
        ),
        (
            min,
            [0.0, p(-63)],
            [0.0, -p(-88)],
            min,
            "2^-126 - 2^-151, a tie with 24 bits, rounds to 2^-126: not tiny",
        ),
        (
            1.0,
            [f32::from_bits(0x0040_0000), 0.0],
            [p(100), 0.0],
            1.0,
            "BF16 subnormal input reads as 0",
        ),
        (
            1.5 * p(127),
            [-p(64), p(64)],
            [p(63), p(63)],
            f32::INFINITY,
            "overflow to infinity stays",
        ),
    ];
    for (start, a2, b2, want, what) in cases {
        let a = [start, 0.0, a2[0], a2[1]];
        let b = [1.0, 0.0, b2[0], b2[1]];
        let model = Bf16Arithmetic::Pairs.dot_reference(&a, &b);
        assert_eq!(model.to_bits(), want.to_bits(), "model: {what}: {model:e}");
        let mut c = [f32::NAN];
        let (av, bv) = (MatRef::row_major(&a, 1, 4), MatRef::row_major(&b, 1, 4));
        bf16_gemm_tn(
            Bf16Arithmetic::Pairs,
            av,
            bv,
            &mut c,
            &mut Bf16Workspace::new(),
        );
        let native = Bf16Arithmetic::Pairs.native();
        assert_eq!(
            c[0].to_bits(),
            want.to_bits(),
            "GEMM (native {native}): {what}: {:e}",
            c[0]
        );
    }
}

/// A row's result does not depend on the other rows, on M, or on the number of threads.
#[test]
fn rows_do_not_depend_on_m_or_threads() {
    let mut rnd = lcg(3);
    // two K slabs; then N = 1100, 35 column blocks: B in two panels, each slab of A packed
    // once for both (a transposed A is packed whole instead: the same bits)
    for (m, n, k) in [(70, 48, 2100), (70, 1100, 600)] {
        let a: Vec<f32> = (0..m * k).map(|_| rnd()).collect();
        let b: Vec<f32> = (0..n * k).map(|_| rnd()).collect();
        for arith in BOTH {
            rows_independent(arith, &a, &b, (m, n, k));
        }
    }
}

fn rows_independent(arith: Bf16Arithmetic, a: &[f32], b: &[f32], (m, n, k): (usize, usize, usize)) {
    let mut ws = Bf16Workspace::new();
    let mut full = vec![0.0f32; m * n];
    bf16_gemm_tn(
        arith,
        MatRef::row_major(a, m, k),
        MatRef::row_major(b, n, k),
        &mut full,
        &mut ws,
    );
    for i in [0, 1, 31, 32, 69] {
        let mut one = vec![0.0f32; n];
        bf16_gemm_tn(
            arith,
            MatRef::row_major(&a[i * k..][..k], 1, k),
            MatRef::row_major(b, n, k),
            &mut one,
            &mut ws,
        );
        assert_eq!(one, full[i * n..][..n], "row {i}");
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let mut single = vec![0.0f32; m * n];
    pool.install(|| {
        bf16_gemm_tn(
            arith,
            MatRef::row_major(a, m, k),
            MatRef::row_major(b, n, k),
            &mut single,
            &mut ws,
        )
    });
    assert_eq!(single, full);
    // strided (transposed) views give the same bits as the contiguous copies
    let at: Vec<f32> = (0..k * m).map(|i| a[(i % m) * k + i / m]).collect();
    let mut tr = vec![0.0f32; m * n];
    bf16_gemm_tn(
        arith,
        MatRef::row_major(&at, k, m).t(),
        MatRef::row_major(b, n, k),
        &mut tr,
        &mut ws,
    );
    assert_eq!(tr, full);
}

/// Worst-case bound of each arithmetic against the exact product of the BF16-rounded
/// inputs (normal range): an output is a sum of K exact products through at most `n`
/// roundings of relative size `u = 2^-24`, so `|ĉ − c| ≤ γ_n Σ|a_k b_k|` with
/// `γ_n = n·u / (1 − n·u)`. Tiles: a product passes through at most 16 lane sums, the lane
/// merge and `ceil(K/32)` chunk sums, `n = 17 + ceil(K/32)`. Pairs: one running sum, `n = K`
/// (the f32-dequantize-then-sgemm path has the same order of bound, with its own order).
#[test]
fn within_the_derived_bound_of_the_f64_product_on_training_shapes() {
    let mut rnd = lcg(11);
    for &(m, n, k) in &[(64usize, 384, 128), (128, 128, 512), (32, 256, 2048)] {
        let a: Vec<f32> = (0..m * k).map(|_| rnd()).collect();
        let b: Vec<f32> = (0..n * k).map(|_| rnd() * 0.05).collect();
        for arith in BOTH {
            let nr = match arith {
                Bf16Arithmetic::Tiles => 17 + k.div_ceil(32),
                Bf16Arithmetic::Pairs => k,
            };
            check_bound(arith, &a, &b, (m, n, k), nr as f64);
        }
    }
}

fn check_bound(
    arith: Bf16Arithmetic,
    a: &[f32],
    b: &[f32],
    (m, n, k): (usize, usize, usize),
    nr: f64,
) {
    {
        let mut c = vec![0.0f32; m * n];
        bf16_gemm_tn(
            arith,
            MatRef::row_major(a, m, k),
            MatRef::row_major(b, n, k),
            &mut c,
            &mut Bf16Workspace::new(),
        );
        let u = 2f64.powi(-24);
        let gamma = nr * u / (1.0 - nr * u);
        let mut worst = 0.0f64;
        for i in 0..m {
            for j in 0..n {
                let (mut exact, mut abs) = (0.0f64, 0.0f64);
                for kk in 0..k {
                    let p = bf(a[i * k + kk]) as f64 * bf(b[j * k + kk]) as f64;
                    exact += p;
                    abs += p.abs();
                }
                let err = (c[i * n + j] as f64 - exact).abs();
                assert!(
                    err <= gamma * abs,
                    "{arith:?} [{m},{n},{k}] ({i},{j}): error {err:e} > bound {:e}",
                    gamma * abs
                );
                worst = worst.max(err / (gamma * abs).max(f64::MIN_POSITIVE));
            }
        }
        assert!(
            worst > 0.0,
            "the bound is not vacuous: some rounding happened"
        );
    }
}

/// Every packing path (K-contiguous rows, transposed views, general strides, on either
/// operand) gives the bits of the contiguous operands, including partial tiles and an odd K.
#[test]
fn every_operand_layout_packs_the_same_bits() {
    let mut rnd = lcg(11);
    for (m, n, k) in [
        (37, 21, 75),
        (16, 32, 64),
        (5, 48, 33),
        (33, 17, 1),
        (40, 50, 700),
        // K in two slabs of the GEMM's K loop, rows in a partial 32-row block
        (70, 40, 2100),
    ] {
        let a: Vec<f32> = (0..m * k).map(|_| rnd() * 7.0).collect();
        let b: Vec<f32> = (0..n * k).map(|_| rnd()).collect();
        // the same matrices stored transposed (with a padded row), with both strides > 1 and
        // row-major with padded rows
        let tr = |x: &[f32], rows: usize| -> Vec<f32> {
            let mut t = vec![f32::NAN; k * (rows + 3)];
            for i in 0..rows {
                for kk in 0..k {
                    t[kk * (rows + 3) + i] = x[i * k + kk];
                }
            }
            t
        };
        let wide = |x: &[f32], rows: usize| -> Vec<f32> {
            let mut w = vec![f32::NAN; rows * k * 2 + 1];
            for (i, &v) in x.iter().enumerate() {
                w[2 * i + 1] = v;
            }
            w
        };
        // row-major with padded rows (K contiguous, as the attention products' head views)
        let padded = |x: &[f32], rows: usize| -> Vec<f32> {
            let mut p = vec![f32::NAN; rows * (k + 5)];
            for i in 0..rows {
                p[i * (k + 5)..][..k].copy_from_slice(&x[i * k..][..k]);
            }
            p
        };
        let (at, bt, aw, bw) = (tr(&a, m), tr(&b, n), wide(&a, m), wide(&b, n));
        let (ap, bp) = (padded(&a, m), padded(&b, n));
        fn views<'a>(
            (xt, xw, xp): (&'a [f32], &'a [f32], &'a [f32]),
            rows: usize,
            k: usize,
        ) -> [MatRef<'a>; 3] {
            [
                MatRef {
                    data: xp,
                    rows,
                    cols: k,
                    row_stride: k + 5,
                    col_stride: 1,
                },
                MatRef {
                    data: xt,
                    rows,
                    cols: k,
                    row_stride: 1,
                    col_stride: rows + 3,
                },
                MatRef {
                    data: &xw[1..],
                    rows,
                    cols: k,
                    row_stride: 2 * k,
                    col_stride: 2,
                },
            ]
        }
        let mut ws = Bf16Workspace::new();
        let mut want = vec![0.0f32; m * n];
        let arith = [Bf16Arithmetic::Tiles, Bf16Arithmetic::Pairs][m % 2];
        bf16_gemm_tn(
            arith,
            MatRef::row_major(&a, m, k),
            MatRef::row_major(&b, n, k),
            &mut want,
            &mut ws,
        );
        let av = [MatRef::row_major(&a, m, k)]
            .into_iter()
            .chain(views((&at, &aw, &ap), m, k));
        for (ia, va) in av.enumerate() {
            let bv = [MatRef::row_major(&b, n, k)]
                .into_iter()
                .chain(views((&bt, &bw, &bp), n, k));
            for (ib, vb) in bv.enumerate() {
                let mut got = vec![f32::NAN; m * n];
                bf16_gemm_tn(arith, va, vb, &mut got, &mut ws);
                assert_eq!(got, want, "A layout {ia}, B layout {ib}, [{m},{n},{k}]");
                bf16_gemm_tn_portable(arith, va, vb, &mut got, &mut ws);
                assert_eq!(got, want, "portable, A layout {ia}, B layout {ib}");
            }
        }
    }
}

/// Transposed views (rows contiguous: the Wgrad operands) are packed by runs of K, one run
/// per task: the product has the bits of the row-major operands on pools of 1 to 3 threads,
/// with K split unevenly and a partial last chunk.
#[test]
fn transposed_views_pack_the_same_bits_on_any_pool() {
    let mut rnd = lcg(12);
    let (m, n, k) = (70, 45, 1000); // 32 chunks, the last holding 8 values
    let a: Vec<f32> = (0..m * k).map(|_| rnd() * 3.0).collect();
    let b: Vec<f32> = (0..n * k).map(|_| rnd()).collect();
    let transpose = |x: &[f32], rows: usize| -> Vec<f32> {
        (0..rows * k)
            .map(|j| x[(j % rows) * k + j / rows])
            .collect()
    };
    let (at, bt) = (transpose(&a, m), transpose(&b, n));
    let (av, bv) = (
        MatRef::row_major(&at, k, m).t(),
        MatRef::row_major(&bt, k, n).t(),
    );
    for arith in BOTH {
        let mut ws = Bf16Workspace::new();
        let mut want = vec![0.0f32; m * n];
        let rows = (MatRef::row_major(&a, m, k), MatRef::row_major(&b, n, k));
        bf16_gemm_tn(arith, rows.0, rows.1, &mut want, &mut ws);
        for threads in 1..=3 {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut got = vec![f32::NAN; m * n];
            pool.install(|| bf16_gemm_tn(arith, av, bv, &mut got, &mut ws));
            assert_eq!(got, want, "{arith:?}, {threads} threads");
        }
    }
}

/// Operands packed once ([`PackedPair`]) give the product of the GEMM that packs them, bit
/// for bit, for row-major and transposed views, partial blocks and chunks, on any pool, and
/// again on a second call; where no BF16 kernel runs there is nothing to pack.
#[test]
fn a_packed_pair_multiplies_to_the_same_bits() {
    let mut rnd = lcg(21);
    for (m, n, k) in [
        (70, 45, 1000),
        (33, 17, 40),
        (64, 96, 256),
        (1, 1, 1),
        (5, 3, 0),
    ] {
        let a: Vec<f32> = (0..m * k).map(|_| rnd() * 5.0).collect();
        let b: Vec<f32> = (0..n * k).map(|_| rnd()).collect();
        let (av, bv) = (MatRef::row_major(&a, m, k), MatRef::row_major(&b, n, k));
        let mut want = vec![0.0f32; m * n];
        quantized_gemm_tn(av, bv, &mut want, &mut Bf16Workspace::new());
        // the same values through transposed views
        let at: Vec<f32> = (0..m * k).map(|j| a[(j % m) * k + j / m]).collect();
        let tv = MatRef::row_major(&at, k, m).t();
        for (label, view) in [("row-major", av), ("transposed", tv)] {
            let Some(mut pair) = PackedPair::new(view, bv) else {
                assert!(quantized_gemm_arithmetic().is_none());
                eprintln!("SKIP: no BF16 kernel on this CPU, so no operand is ever packed");
                return;
            };
            assert_eq!(pair.dims(), (m, n, k));
            for threads in 1..=3 {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                for call in 0..2 {
                    let mut got = vec![f32::NAN; m * n];
                    pool.install(|| pair.gemm(&mut got));
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(g, w)| g.to_bits() == w.to_bits());
                    assert!(same, "{m}x{n}x{k} {label}, {threads} threads, call {call}");
                }
            }
        }
    }
}

/// A view whose strides overflow `usize` does not fit its storage: the GEMM refuses it (the
/// AVX-512 packing reads through raw pointers, so a wrapped offset must never get there).
#[test]
#[should_panic(expected = "exceeds its storage")]
fn a_view_with_overflowing_strides_is_refused() {
    let data = [1.0f32; 4];
    let wild = MatRef {
        data: &data,
        rows: 3,
        cols: 2,
        row_stride: 1 << (usize::BITS - 1),
        col_stride: 1,
    };
    let mut out = [0.0f32; 6];
    let b = MatRef::row_major(&data, 2, 2);
    bf16_gemm_tn(
        Bf16Arithmetic::Pairs,
        wild,
        b,
        &mut out,
        &mut Bf16Workspace::new(),
    );
}

/// The FMA kernel of the pair arithmetic sets MXCSR's FTZ and DAZ inside its own `asm!`
/// block only: after a product (a subnormal-producing one, and on the thread that ran it)
/// the control register is as before and this thread's arithmetic keeps subnormals again.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_gemm_leaves_the_floating_point_environment_as_it_was() {
    use std::hint::black_box;
    fn mxcsr() -> u32 {
        let mut v = 0u32;
        // SAFETY: stores the 32-bit control register into `v`.
        unsafe { std::arch::asm!("stmxcsr dword ptr [{}]", in(reg) &mut v, options(nostack)) };
        v
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("pool");
    pool.install(|| {
        let before = mxcsr();
        // products of 2^-64 · 2^-63: exact, below the normal range, flushed as sums
        let (m, n, k) = (40, 40, 64);
        let a = vec![2f32.powi(-64); m * k];
        let b = vec![2f32.powi(-63); n * k];
        let mut c = vec![f32::NAN; m * n];
        bf16_gemm_tn(
            Bf16Arithmetic::Pairs,
            MatRef::row_major(&a, m, k),
            MatRef::row_major(&b, n, k),
            &mut c,
            &mut Bf16Workspace::new(),
        );
        assert_eq!(mxcsr(), before, "MXCSR changed by the GEMM");
        let tiny = black_box(f32::MIN_POSITIVE) * black_box(0.5);
        assert!(
            tiny.is_subnormal(),
            "subnormals flushed after the GEMM: {tiny:e}"
        );
        // and the GEMM itself flushed: 2^-127 + 2^-127 + ... stays 0 after each FTZ step
        let model = Bf16Arithmetic::Pairs.dot_reference(&a[..k], &b[..k]);
        assert_eq!(c[0].to_bits(), model.to_bits());
    });
}

//! The CUDA kernels run on the CPU and compared with `quant` bit for bit, so that CI (which
//! has no GPU) checks the kernels' arithmetic, indexing, padding, Philox stream and packing.
//!
//! `emu/emu.cpp` compiles `cuda/*.cu` as host C++20 through the small CUDA emulator in
//! `emu/cuda_emu.h` (a block's 256 threads as fibers, barriers for `__syncthreads` and warp
//! shuffles); this test builds it with the host C++ compiler (`$CXX`, else `g++`), loads it,
//! and drives it with the same [`kernels_cuda::abi::Plan`]s (validation, flags, grids, output
//! shapes, per-tensor results) that the GPU path launches. Without a C++20 compiler the tests
//! print `SKIP` and return.
//!
//! What this cannot see: real-GPU concurrency between blocks (the emulator runs blocks one at
//! a time), the nvcc code generation itself, and cuBLASLt; `tests/gpu.rs` covers those on a GPU.

mod common;

use std::io::Write as _;
use std::sync::OnceLock;

use common::{
    assert_same, cpu_quantize, data, for_each_case, fp8_current_cases, fp8_delayed, mx_cases,
    mx_prescaled, nvfp4_cases, nvfp4_cast_transpose_cases, nvfp4_rht_cases, quantizer,
    rht_zero_sum_cases, rht_zero_sum_data, sweep, CT_COL_KEY, CT_ROW_KEY, KEY, USAGES,
};
use fp_formats::mx::{MxElement, ScaleRule};
use kernels_cuda::abi::{self, AmaxPass, Args, Dims, Fp8Args, MxArgs, Nvfp4Args, OutPtrs, Plan};
use kernels_cuda::KernelError;
use quant::{
    AmaxAlgo, Fp8Element, OperandQuant, QuantFormat, QuantState, QuantizedTensor, Rht, RngKey,
    RoundingMode, Usage,
};

type AmaxFn = unsafe extern "C" fn(u32, *const f32, u64, *mut u32);
type AmaxRhtFn = unsafe extern "C" fn(u32, u32, *const f32, i32, i32, u32, *mut u32);
type Nvfp4Fn = unsafe extern "C" fn(u32, u32, *const Nvfp4Args);
type MxFn = unsafe extern "C" fn(u32, u32, *const MxArgs);
type Fp8Fn = unsafe extern "C" fn(u32, u32, *const Fp8Args);
type Nvfp4DeqFn = unsafe extern "C" fn(u32, *const u8, *const u8, i32, i32, i32, f32, *mut f32);
type Nvfp4Bf16Fn = unsafe extern "C" fn(u32, *const u8, *const u8, i32, i32, *mut u16);
type MxDeqFn = unsafe extern "C" fn(u32, *const u8, *const u8, i32, i32, i32, i32, f32, *mut f32);
type MxBf16Fn = unsafe extern "C" fn(u32, *const u8, *const u8, i32, i32, i32, *mut u16);
type Fp8DeqFn = unsafe extern "C" fn(u32, *const u8, u64, i32, f32, *mut f32);
type ToBf16Fn = unsafe extern "C" fn(u32, *const f32, u64, *mut u16);
type SwizzleFn = unsafe extern "C" fn(u32, *const u8, i32, i32, *mut u8);

struct Emu {
    _lib: libloading::Library,
    amax: AmaxFn,
    amax_rht: AmaxRhtFn,
    nvfp4: Nvfp4Fn,
    mx: MxFn,
    fp8: Fp8Fn,
    nvfp4_deq: Nvfp4DeqFn,
    nvfp4_bf16: Nvfp4Bf16Fn,
    mx_deq: MxDeqFn,
    mx_bf16: MxBf16Fn,
    fp8_deq: Fp8DeqFn,
    to_bf16: ToBf16Fn,
    swizzle: SwizzleFn,
}

enum State {
    Ready(Box<Emu>),
    Skip(String),
}

fn build() -> Result<State, String> {
    use kernels_cuda::emu::{build_library, EmuError};
    let l = match build_library("emu.cpp") {
        Ok(l) => l,
        Err(e @ (EmuError::NoCompiler(_) | EmuError::NoCxx20(..))) => {
            return Ok(State::Skip(e.to_string()))
        }
        Err(e) => return Err(e.to_string()),
    };
    // SAFETY: the symbols have the declared signatures (emu/emu.cpp).
    unsafe {
        macro_rules! sym {
            ($name:literal) => {
                *l.get(concat!($name, "\0").as_bytes())
                    .map_err(|e| e.to_string())?
            };
        }
        let e = Emu {
            amax: sym!("emu_nb_amax"),
            amax_rht: sym!("emu_nb_amax_rht_col"),
            nvfp4: sym!("emu_nb_nvfp4_quantize"),
            mx: sym!("emu_nb_mx_quantize"),
            fp8: sym!("emu_nb_fp8_quantize"),
            nvfp4_deq: sym!("emu_nb_nvfp4_dequantize"),
            nvfp4_bf16: sym!("emu_nb_nvfp4_to_bf16"),
            mx_deq: sym!("emu_nb_mx_dequantize"),
            mx_bf16: sym!("emu_nb_mx_to_bf16"),
            fp8_deq: sym!("emu_nb_fp8_dequantize"),
            to_bf16: sym!("emu_nb_f32_to_bf16"),
            swizzle: sym!("emu_nb_swizzle_scales"),
            _lib: l,
        };
        Ok(State::Ready(Box::new(e)))
    }
}

fn emu(test: &str) -> Option<&'static Emu> {
    static EMU: OnceLock<Result<State, String>> = OnceLock::new();
    match EMU.get_or_init(build) {
        Ok(State::Ready(e)) => Some(e),
        Ok(State::Skip(why)) => {
            let _ = std::io::stderr().write_all(format!("SKIP {test}: {why}\n").as_bytes());
            None
        }
        Err(e) => panic!("{test}: {e}"),
    }
}

/// Grid-stride kernels: a few blocks are enough (and keep the emulation fast).
fn small_grid(n: usize) -> u32 {
    n.div_ceil(256).clamp(1, 4) as u32
}

/// Runs a plan through the emulated kernels exactly as `QuantJob::launch` + `finish` do.
fn run_plan(
    e: &Emu,
    x: &[f32],
    mut plan: Plan,
    state: Option<&mut QuantState>,
) -> Result<(Option<QuantizedTensor>, Option<QuantizedTensor>), KernelError> {
    let mut amax = [0u32; 4];
    let mut meta = [0f32; 2];
    let alloc =
        |s: &Option<abi::Side>| s.map(|s| (vec![0xA5u8; s.codes_len], vec![0xA5u8; s.scale_len]));
    let mut row = alloc(&plan.row);
    let mut col = alloc(&plan.col);
    let ptrs = |b: &mut Option<(Vec<u8>, Vec<u8>)>| match b {
        Some((c, s)) => OutPtrs {
            codes: c.as_mut_ptr() as u64,
            scales: if s.is_empty() {
                0
            } else {
                s.as_mut_ptr() as u64
            },
        },
        None => OutPtrs::default(),
    };
    let (rp, cp) = (ptrs(&mut row), ptrs(&mut col));
    plan.set_pointers(
        x.as_ptr() as u64,
        amax.as_mut_ptr() as u64,
        meta.as_mut_ptr() as u64,
        rp,
        cp,
    );
    let n = plan.dims.rows * plan.dims.cols;
    // SAFETY: every pointer in the plan refers to a live buffer of the size the plan asks for.
    unsafe {
        match plan.amax_pass {
            AmaxPass::None => {}
            AmaxPass::Plain => (e.amax)(
                small_grid(n.div_ceil(4)),
                x.as_ptr(),
                n as u64,
                amax.as_mut_ptr(),
            ),
            AmaxPass::RhtCol => {
                let Args::Nvfp4(a) = &plan.args else {
                    unreachable!()
                };
                (e.amax_rht)(
                    plan.amax_grid.0,
                    plan.amax_grid.1,
                    x.as_ptr(),
                    a.rows,
                    a.cols,
                    a.rht_mask,
                    amax.as_mut_ptr(),
                )
            }
        }
        match &plan.args {
            Args::Nvfp4(a) => (e.nvfp4)(plan.grid.0, plan.grid.1, a),
            Args::Mx(a) => (e.mx)(plan.grid.0, plan.grid.1, a),
            Args::Fp8(a) => (e.fp8)(plan.grid.0, plan.grid.1, a),
        }
    }
    let (rv, cv) = plan.results(&amax, &meta)?;
    if plan.delayed_fp8 {
        state.expect("state").record_amax(f32::from_bits(amax[0]));
    }
    let mk = |side: Option<abi::Side>, bufs: Option<(Vec<u8>, Vec<u8>)>, v: Option<(f32, f32)>| {
        side.zip(bufs)
            .zip(v)
            .map(|((s, (codes, scales)), v)| s.host_tensor(codes, scales, v))
    };
    Ok((mk(plan.row, row, rv), mk(plan.col, col, cv)))
}

fn plan_for(
    dims: Dims,
    usage: Usage,
    q: &OperandQuant,
    key: RngKey,
    state: &mut QuantState,
) -> Plan {
    let q = quantizer(q, usage, key);
    let (row, col) = match usage {
        Usage::Rowwise => (Some(&q), None),
        Usage::Columnwise => (None, Some(&q)),
    };
    abi::plan(dims, row, col, state).expect("plan")
}

/// One quantization through the emulator, compared with `quant` (codes, scales, amax, factor)
/// and then dequantized through the emulated dequantization kernel, compared too.
#[allow(clippy::too_many_arguments)]
fn check(
    e: &Emu,
    x: &[f32],
    rows: usize,
    cols: usize,
    usage: Usage,
    q: &OperandQuant,
    key: RngKey,
    what: &str,
) {
    let dims = Dims { rows, cols };
    let mut st = QuantState::new();
    let plan = plan_for(dims, usage, q, key, &mut st);
    let (r, c) = run_plan(e, x, plan, Some(&mut st)).unwrap_or_else(|err| panic!("{what}: {err}"));
    let got = r.or(c).expect("one copy");
    let cpu = cpu_quantize(
        x,
        (rows, cols),
        &quantizer(q, usage, key),
        &mut QuantState::new(),
    );
    assert_same(&got, &cpu, what);
    check_dequantize(e, &got, what);
}

fn check_dequantize(e: &Emu, t: &QuantizedTensor, what: &str) {
    let n = t.rows * t.cols;
    let mut out = vec![f32::NAN; n];
    let (rows, cols, pcols) = (t.rows as i32, t.cols as i32, t.padded_cols as i32);
    // SAFETY: buffers sized as the kernels expect.
    unsafe {
        match t.format {
            QuantFormat::Nvfp4 { .. } => {
                (e.nvfp4_deq)(
                    small_grid(n),
                    t.codes.as_ptr(),
                    t.scales.as_ptr(),
                    rows,
                    cols,
                    pcols,
                    t.tensor_scale_inv,
                    out.as_mut_ptr(),
                );
                let mut bf = vec![0u16; t.rows * t.padded_cols];
                (e.nvfp4_bf16)(
                    small_grid(bf.len() / 2),
                    t.codes.as_ptr(),
                    t.scales.as_ptr(),
                    rows,
                    pcols,
                    bf.as_mut_ptr(),
                );
                check_unscaled(t, &bf, what);
            }
            QuantFormat::Mx { element, .. } => {
                let el = abi::mx_elem(element).expect("elem");
                (e.mx_deq)(
                    small_grid(n),
                    t.codes.as_ptr(),
                    t.scales.as_ptr(),
                    rows,
                    cols,
                    pcols,
                    el,
                    t.tensor_scale_inv,
                    out.as_mut_ptr(),
                );
                let mut bf = vec![0u16; t.rows * t.padded_cols];
                (e.mx_bf16)(
                    small_grid(bf.len()),
                    t.codes.as_ptr(),
                    t.scales.as_ptr(),
                    rows,
                    pcols,
                    el,
                    bf.as_mut_ptr(),
                );
                check_unscaled(t, &bf, what);
            }
            QuantFormat::Fp8 { element, .. } => {
                (e.fp8_deq)(
                    small_grid(n),
                    t.codes.as_ptr(),
                    n as u64,
                    abi::fp8_elem(element),
                    t.tensor_scale_inv,
                    out.as_mut_ptr(),
                );
            }
            _ => unreachable!(),
        }
    }
    let want = t.dequantize();
    if let Some(i) = out
        .iter()
        .zip(&want)
        .position(|(a, b)| a.to_bits() != b.to_bits())
    {
        panic!(
            "{what}: dequantized element {i}: emulated {} cpu {}",
            out[i], want[i]
        );
    }
}

/// The emulated-GEMM operand (unscaled values as BF16) equals the dequantized values divided
/// by the per-tensor factor, exactly: `unscaled · factor == dequantized` bit for bit.
fn check_unscaled(t: &QuantizedTensor, bf: &[u16], what: &str) {
    let want = t.dequantize();
    for r in 0..t.rows {
        for c in 0..t.padded_cols {
            let v = f32::from_bits((bf[r * t.padded_cols + c] as u32) << 16);
            if c >= t.cols {
                assert_eq!(v, 0.0, "{what}: padding ({r}, {c}) of the BF16 operand");
                continue;
            }
            let w = want[r * t.cols + c];
            assert_eq!(
                (v * t.tensor_scale_inv).to_bits(),
                w.to_bits(),
                "{what}: BF16 operand ({r}, {c}): {v} * {}",
                t.tensor_scale_inv
            );
        }
    }
}

/// Small shapes keep the emulation fast (each emulated block costs milliseconds): two
/// multi-tile shapes, then padding in both dimensions, odd row strides, a single row.
const SHAPES: &[(usize, usize)] = &[
    (128, 96),
    (80, 144),
    (37, 100),
    (1, 16),
    (130, 202),
    (33, 7),
];
const RHT_SHAPES: &[(usize, usize)] = &[(96, 130), (48, 37), (16, 16), (272, 64)];

#[test]
fn emulated_nvfp4_matches_quant() {
    let Some(e) = emu("emulated_nvfp4_matches_quant") else {
        return;
    };
    sweep(
        SHAPES,
        1000,
        &nvfp4_cases(),
        &USAGES,
        |x, rows, cols, usage, q, what| check(e, x, rows, cols, usage, q, KEY, what),
    );
}

#[test]
fn emulated_nvfp4_rht_matches_quant() {
    let Some(e) = emu("emulated_nvfp4_rht_matches_quant") else {
        return;
    };
    sweep(
        RHT_SHAPES,
        2000,
        &nvfp4_rht_cases(),
        &[Usage::Columnwise],
        |x, rows, cols, usage, q, what| check(e, x, rows, cols, usage, q, KEY, what),
    );
}

/// RHT chunks with exact zero sums: the kernel's codes equal quant's, and a column of -0.0
/// (stored row 0) quantizes to code 0x0 everywhere (+0, as Transformer Engine's GEMM-based
/// transform gives), for NVFP4 and for MX with the RHT.
#[test]
fn emulated_rht_zero_sums_match_quant() {
    let Some(e) = emu("emulated_rht_zero_sums_match_quant") else {
        return;
    };
    let cases = rht_zero_sum_cases();
    for &(rows, cols) in &[(48usize, 30usize), (32, 12)] {
        let x = rht_zero_sum_data(rows, cols, 77);
        for_each_case(
            &cases,
            &[Usage::Columnwise],
            rows,
            cols,
            |usage, q, what| {
                check(e, &x, rows, cols, usage, q, KEY, what);
                let plan = plan_for(Dims { rows, cols }, usage, q, KEY, &mut QuantState::new());
                let (_, c) = run_plan(e, &x, plan, None).expect("run");
                let t = c.expect("columnwise");
                // Stored row 0 = input column 0; NVFP4 packs two codes per byte, MX E2M1 too.
                let row0 = &t.codes[..t.codes.len() / t.padded_rows];
                assert!(
                    row0.iter().all(|&b| b == 0),
                    "{what}: -0 column gave {row0:02x?}"
                );
            },
        );
    }
}

#[test]
fn emulated_nvfp4_cast_transpose_matches_two_quantizations() {
    let Some(e) = emu("emulated_nvfp4_cast_transpose_matches_two_quantizations") else {
        return;
    };
    let cases = nvfp4_cast_transpose_cases();
    let (kr, kc) = (CT_ROW_KEY, CT_COL_KEY);
    for &(rows, cols) in &[(256usize, 192usize), (96, 80), (272, 130)] {
        let x = data(rows, cols, (rows * cols) as u64);
        for (ci, (qr, qc)) in cases.iter().enumerate() {
            let (qr, qc) = (
                quantizer(qr, Usage::Rowwise, kr),
                quantizer(qc, Usage::Columnwise, kc),
            );
            let st = &mut QuantState::new();
            let plan = abi::plan(Dims { rows, cols }, Some(&qr), Some(&qc), st).expect("plan");
            let (r, c) = run_plan(e, &x, plan, None).expect("run");
            let cr = cpu_quantize(&x, (rows, cols), &qr, st);
            let cc = cpu_quantize(&x, (rows, cols), &qc, st);
            assert_same(
                &r.expect("row"),
                &cr,
                &format!("ct {ci} rowwise {rows}x{cols}"),
            );
            assert_same(
                &c.expect("col"),
                &cc,
                &format!("ct {ci} columnwise {rows}x{cols}"),
            );
        }
    }
}

#[test]
fn emulated_nvfp4_rejects_non_finite_input() {
    let Some(e) = emu("emulated_nvfp4_rejects_non_finite_input") else {
        return;
    };
    let dims = Dims { rows: 32, cols: 48 };
    for bad in [f32::NAN, f32::INFINITY, -f32::INFINITY] {
        let mut x = data(32, 48, 3);
        x[100] = bad;
        for q in [
            OperandQuant::nvfp4(),
            OperandQuant::nvfp4().with_rht(Rht::FixedSigns),
        ] {
            let q = quantizer(&q, Usage::Columnwise, KEY);
            let plan = abi::plan(dims, None, Some(&q), &mut QuantState::new()).expect("plan");
            assert!(
                matches!(run_plan(e, &x, plan, None), Err(KernelError::NonFinite(_))),
                "{bad} {q:?}"
            );
        }
        let q = OperandQuant::mx(MxElement::E4M3, ScaleRule::Rceil);
        let q = quantizer(&q, Usage::Rowwise, KEY);
        let plan = abi::plan(dims, Some(&q), None, &mut QuantState::new()).expect("plan");
        assert!(
            matches!(run_plan(e, &x, plan, None), Err(KernelError::NonFinite(_))),
            "MX {bad}"
        );
    }
}

#[test]
fn emulated_mx_matches_quant() {
    let Some(e) = emu("emulated_mx_matches_quant") else {
        return;
    };
    for (si, &(rows, cols)) in SHAPES.iter().enumerate() {
        let x = data(rows, cols, 3000 + si as u64);
        // Every rule on the first two shapes; RCEIL and FLOOR (the two in use) on all.
        let rules: &[ScaleRule] = if si < 2 {
            &[
                ScaleRule::Rceil,
                ScaleRule::Floor,
                ScaleRule::Ceil,
                ScaleRule::Even,
            ]
        } else {
            &[ScaleRule::Rceil, ScaleRule::Floor]
        };
        let mut cases = mx_cases(&[MxElement::E4M3, MxElement::E5M2, MxElement::E2M1], rules);
        cases.push(("mx prescale".into(), mx_prescaled()));
        for_each_case(&cases, &USAGES, rows, cols, |usage, q, what| {
            check(e, &x, rows, cols, usage, q, KEY, what)
        });
    }
    for (si, &(rows, cols)) in RHT_SHAPES.iter().enumerate() {
        let x = data(rows, cols, 4000 + si as u64);
        for element in [MxElement::E4M3, MxElement::E2M1] {
            let q = OperandQuant::mx(element, ScaleRule::Rceil)
                .with_rht(Rht::RandomSigns)
                .with_rounding(RoundingMode::Stochastic);
            check(
                e,
                &x,
                rows,
                cols,
                Usage::Columnwise,
                &q,
                KEY,
                &format!("mx RHT {element:?} {rows}x{cols}"),
            );
        }
    }
}

#[test]
fn emulated_mx_blocks_near_f32_max_match_quant() {
    let Some(e) = emu("emulated_mx_blocks_near_f32_max_match_quant") else {
        return;
    };
    // Block maxima up to f32::MAX, where every rule's scale is capped at mx::max_scale so
    // the elements saturate instead of dequantizing to +inf.
    let (rows, cols) = (32, 64);
    let big = [
        f32::MAX,
        -3.3e38,
        3.0e38,
        1.0e38,
        -2.5e38,
        1.0,
        0.0,
        -1.0e30,
    ];
    let x: Vec<f32> = (0..rows * cols)
        .map(|i| big[(i * 7 + i / cols) % big.len()])
        .collect();
    let rules = [
        ScaleRule::Rceil,
        ScaleRule::Floor,
        ScaleRule::Ceil,
        ScaleRule::Even,
    ];
    let cases = mx_cases(&[MxElement::E4M3, MxElement::E5M2, MxElement::E2M1], &rules);
    for_each_case(&cases, &USAGES, rows, cols, |usage, q, what| {
        check(
            e,
            &x,
            rows,
            cols,
            usage,
            q,
            KEY,
            &format!("near f32::MAX {what}"),
        )
    });
}

#[test]
fn emulated_mx_cast_transpose_matches_two_quantizations() {
    let Some(e) = emu("emulated_mx_cast_transpose_matches_two_quantizations") else {
        return;
    };
    let (rows, cols) = (160, 96);
    let x = data(rows, cols, 77);
    let qr = OperandQuant::mx(MxElement::E2M1, ScaleRule::Rceil);
    let qc = qr
        .with_rounding(RoundingMode::Stochastic)
        .with_rht(Rht::FixedSigns);
    let (qr, qc) = (
        quantizer(&qr, Usage::Rowwise, KEY),
        quantizer(&qc, Usage::Columnwise, KEY),
    );
    let st = &mut QuantState::new();
    let plan = abi::plan(Dims { rows, cols }, Some(&qr), Some(&qc), st).expect("plan");
    let (r, c) = run_plan(e, &x, plan, None).expect("run");
    assert_same(
        &r.unwrap(),
        &cpu_quantize(&x, (rows, cols), &qr, st),
        "mx ct rowwise",
    );
    assert_same(
        &c.unwrap(),
        &cpu_quantize(&x, (rows, cols), &qc, st),
        "mx ct columnwise",
    );
}

#[test]
fn emulated_fp8_matches_quant() {
    let Some(e) = emu("emulated_fp8_matches_quant") else {
        return;
    };
    sweep(
        SHAPES,
        5000,
        &fp8_current_cases(),
        &USAGES,
        |x, rows, cols, usage, q, what| check(e, x, rows, cols, usage, q, KEY, what),
    );
}

#[test]
fn emulated_fp8_delayed_scaling_tracks_quant_state() {
    let Some(e) = emu("emulated_fp8_delayed_scaling_tracks_quant_state") else {
        return;
    };
    let q = fp8_delayed(Fp8Element::E5M2, 3, 1, AmaxAlgo::MostRecent);
    let (rows, cols) = (64, 80);
    let (mut se, mut sc) = (QuantState::new(), QuantState::new());
    for step in 0..5u64 {
        let x: Vec<f32> = data(rows, cols, 6000 + step)
            .iter()
            .map(|v| v * (3 << step) as f32)
            .collect();
        let plan = plan_for(Dims { rows, cols }, Usage::Columnwise, &q, KEY, &mut se);
        let (_, c) = run_plan(e, &x, plan, Some(&mut se)).expect("run");
        let qz = quantizer(&q, Usage::Columnwise, KEY);
        let cpu = cpu_quantize(&x, (rows, cols), &qz, &mut sc);
        assert_same(&c.expect("col"), &cpu, &format!("delayed step {step}"));
        se.end_step(&q).unwrap();
        sc.end_step(&q).unwrap();
        assert_eq!(se.amax_history(), sc.amax_history());
        assert_eq!(se.scale().to_bits(), sc.scale().to_bits());
    }
}

#[test]
fn emulated_amax_bf16_and_swizzle_kernels() {
    let Some(e) = emu("emulated_amax_bf16_and_swizzle_kernels") else {
        return;
    };
    for &(rows, cols) in &[(100usize, 103usize), (1, 1), (64, 64)] {
        let mut x = data(rows, cols, 7);
        let mut amax = [0u32; 4];
        // SAFETY: sizes as declared.
        unsafe { (e.amax)(3, x.as_ptr(), x.len() as u64, amax.as_mut_ptr()) };
        let want = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert_eq!((amax[0], amax[1]), (want.to_bits(), 0));
        let mid = x.len() / 2;
        x[mid] = f32::NAN;
        let mut amax = [0u32; 4];
        // SAFETY: as above.
        unsafe { (e.amax)(2, x.as_ptr(), x.len() as u64, amax.as_mut_ptr()) };
        let want = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert_eq!(
            (amax[0], amax[1]),
            (want.to_bits(), 1),
            "NaN-ignoring max, NaN flagged"
        );
        let mut bf = vec![0u16; x.len()];
        // SAFETY: as above.
        unsafe { (e.to_bf16)(2, x.as_ptr(), x.len() as u64, bf.as_mut_ptr()) };
        for (i, (&b, &v)) in bf.iter().zip(&x).enumerate() {
            let w = fp_formats::round_to_bf16(v);
            assert!(
                b as u32 == w.to_bits() >> 16
                    || (v.is_nan() && f32::from_bits((b as u32) << 16).is_nan()),
                "bf16 {i}"
            );
        }
    }
    for &(rows, scols) in &[(1usize, 1usize), (130, 9), (256, 8)] {
        let s: Vec<u8> = (0..rows * scols).map(|i| (i * 13 + 1) as u8).collect();
        let (pr, pc) = kernels_cuda::swizzle::swizzled_shape(rows, scols);
        let mut out = vec![0u8; pr * pc];
        // SAFETY: as above.
        unsafe { (e.swizzle)(2, s.as_ptr(), rows as i32, scols as i32, out.as_mut_ptr()) };
        assert_eq!(out, kernels_cuda::swizzle::swizzle_scales(&s, rows, scols));
    }
}

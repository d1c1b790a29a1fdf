//! Inputs and comparisons shared by the GPU tests and the CPU emulation tests.
#![allow(dead_code)]

use fp_formats::mx::{MxElement, ScaleRule};
use kernels_cuda::emu::{Emu, EmuError};
use quant::{
    AmaxAlgo, BlockShape, Fp8Element, Fp8Scaling, OperandQuant, QuantFormat, QuantizedTensor, Rht,
    RngKey, RoundingMode, Usage,
};

pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    pub fn normal(&mut self) -> f32 {
        let (u1, u2) = (self.uniform().max(1e-7), self.uniform());
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f32::consts::PI * u2).cos()
    }
}

/// Activation-like data: Gaussian values with a per-16-element-chunk magnitude spread over
/// 2^-12 .. 2^8, some all-zero chunks, some tiny chunks (NVFP4 scales that flush to zero),
/// and exact grid values (ties of the E2M1 grid).
pub fn data(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut r = Rng(seed);
    let mut x = vec![0.0f32; rows * cols];
    for chunk in x.chunks_mut(16) {
        let kind = r.next() % 16;
        let scale = match kind {
            0 => 0.0,
            1 => 1e-30,
            2 => 2f32.powi(-40),
            _ => 2f32.powi((r.next() % 21) as i32 - 12),
        };
        for v in chunk.iter_mut() {
            *v = if kind == 3 {
                [0.25f32, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -2.5][(r.next() % 9) as usize]
            } else {
                r.normal() * scale
            };
        }
    }
    x
}

/// Columnwise-RHT inputs (`rows` a multiple of 16) whose transform has exact zero sums, which
/// must come out +0 (E2M1 code 0x0, as in Transformer Engine) on every path. Column `c % 6`
/// of each 16-row chunk: 0 all `-0.0`; 1 mixed `±0`; 2 after the fixed signs
/// `[-0 x 8, k, -k, +0 x 6]` (even outputs are exact zeros; a plain butterfly makes one of
/// them `-0 - (+0) = -0`); 3 one `±2^-133` among zeros (every output a tiny sum that BF16
/// rounds to a zero of the same sign); 4-5 Gaussian data. Column 0 of every chunk is all
/// `-0.0`.
pub fn rht_zero_sum_data(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
    assert_eq!(rows % 16, 0);
    let s = quant::hadamard::signs(quant::hadamard::TE_SIGN_MASK);
    let mut r = Rng(seed);
    let mut x = vec![0.0f32; rows * cols];
    for g in 0..rows / 16 {
        for c in 0..cols {
            let k = (1 + r.next() % 3) as f32;
            let one = (r.next() % 16) as usize;
            let neg = r.next() % 2 == 1;
            for i in 0..16 {
                x[(16 * g + i) * cols + c] = match c % 6 {
                    0 => -0.0,
                    1 if r.next() % 2 == 1 => -0.0,
                    1 => 0.0,
                    2 => match i {
                        0..=7 => -0.0 * s[i],
                        8 => k * s[i],
                        9 => -k * s[i],
                        _ => 0.0 * s[i],
                    },
                    3 if i == one => f32::from_bits(0x0001_0000 | (neg as u32) << 31),
                    3 => 0.0,
                    _ => r.normal(),
                };
            }
        }
    }
    x
}

pub const KEY: RngKey = RngKey {
    seed: 0x0123_4567_89AB_CDEF,
    stream: 0xFEED_0000_0042,
};

/// Both roundings, nearest-even first.
pub const ROUNDINGS: [RoundingMode; 2] = [RoundingMode::NearestEven, RoundingMode::Stochastic];
/// Both usages, rowwise first.
pub const USAGES: [Usage; 2] = [Usage::Rowwise, Usage::Columnwise];

/// A quantization setting and its name in failure messages.
pub type Case = (String, OperandQuant);

/// NVFP4 with each block shape and rounding.
pub fn nvfp4_cases() -> Vec<Case> {
    let mut v = Vec::new();
    for block in [BlockShape::Row16, BlockShape::Tile16] {
        for rounding in ROUNDINGS {
            v.push((
                format!("nvfp4 {block:?} {rounding:?}"),
                OperandQuant::nvfp4()
                    .with_block(block)
                    .with_rounding(rounding),
            ));
        }
    }
    v
}

/// The cases of the RHT zero-sum tests: every NVFP4 RHT case, and MX E4M3 / E2M1 with the
/// fixed-sign RHT.
pub fn rht_zero_sum_cases() -> Vec<Case> {
    let mut cases = nvfp4_rht_cases();
    for element in [MxElement::E4M3, MxElement::E2M1] {
        cases.push((
            format!("mx RHT {element:?}"),
            OperandQuant::mx(element, ScaleRule::Rceil).with_rht(Rht::FixedSigns),
        ));
    }
    cases
}

/// NVFP4 with the random Hadamard transform (columnwise only): each sign choice, rounding
/// and block shape.
pub fn nvfp4_rht_cases() -> Vec<Case> {
    let mut v = Vec::new();
    for rht in [Rht::FixedSigns, Rht::RandomSigns] {
        for rounding in ROUNDINGS {
            for block in [BlockShape::Row16, BlockShape::Tile16] {
                v.push((
                    format!("nvfp4 RHT {rht:?} {rounding:?} {block:?}"),
                    OperandQuant::nvfp4()
                        .with_rht(rht)
                        .with_rounding(rounding)
                        .with_block(block),
                ));
            }
        }
    }
    v
}

/// The paper's NVFP4 cast-transpose pairs `(rowwise, columnwise)`: gradients (1x16 SR /
/// 1x16 SR + RHT), weights (16x16 both), activations (1x16 RNE / 1x16 RNE + RHT); quantized
/// with [`CT_ROW_KEY`] and [`CT_COL_KEY`].
pub fn nvfp4_cast_transpose_cases() -> [(OperandQuant, OperandQuant); 3] {
    let paper = quant::GemmPolicy::nvfp4_paper();
    [
        (paper.dgrad.a, paper.wgrad.a),
        (paper.fprop.b, paper.dgrad.b),
        (paper.fprop.a, paper.wgrad.b),
    ]
}
pub const CT_ROW_KEY: RngKey = RngKey {
    seed: 11,
    stream: 1,
};
pub const CT_COL_KEY: RngKey = RngKey {
    seed: 12,
    stream: 2,
};

/// MX with each of `elements`, `rules` and both roundings.
pub fn mx_cases(elements: &[MxElement], rules: &[ScaleRule]) -> Vec<Case> {
    let mut v = Vec::new();
    for &element in elements {
        for &rule in rules {
            for rounding in ROUNDINGS {
                v.push((
                    format!("mx {element:?} {rule:?} {rounding:?}"),
                    OperandQuant::mx(element, rule).with_rounding(rounding),
                ));
            }
        }
    }
    v
}

/// Tseng et al.'s prescaled stochastic MXFP4.
pub fn mx_prescaled() -> OperandQuant {
    OperandQuant {
        format: QuantFormat::Mx {
            element: MxElement::E2M1,
            rule: ScaleRule::Floor,
            sr_prescale: true,
        },
        ..OperandQuant::mx(MxElement::E2M1, ScaleRule::Floor)
            .with_rounding(RoundingMode::Stochastic)
    }
}

/// FP8 with current scaling: each element, with and without power-of-two scales, each
/// rounding.
pub fn fp8_current_cases() -> Vec<Case> {
    let mut v = Vec::new();
    for element in [Fp8Element::E4M3, Fp8Element::E5M2] {
        for power_of_two in [false, true] {
            for rounding in ROUNDINGS {
                let q = OperandQuant {
                    format: QuantFormat::Fp8 {
                        element,
                        scaling: Fp8Scaling::Current { power_of_two },
                    },
                    ..OperandQuant::F32
                };
                v.push((
                    format!("fp8 {element:?} pow2={power_of_two} {rounding:?}"),
                    q.with_rounding(rounding),
                ));
            }
        }
    }
    v
}

/// FP8 with delayed scaling.
pub fn fp8_delayed(
    element: Fp8Element,
    history_len: usize,
    margin: i32,
    algo: AmaxAlgo,
) -> OperandQuant {
    OperandQuant {
        format: QuantFormat::Fp8 {
            element,
            scaling: Fp8Scaling::Delayed {
                history_len,
                margin,
                algo,
            },
        },
        ..OperandQuant::F32
    }
}

/// Calls `check(usage, q, what)` for every case and usage of a `rows` x `cols` input, with
/// `what` = `"{case name} {usage:?} {rows}x{cols}"`.
pub fn for_each_case(
    cases: &[Case],
    usages: &[Usage],
    rows: usize,
    cols: usize,
    mut check: impl FnMut(Usage, &OperandQuant, &str),
) {
    for (name, q) in cases {
        for &usage in usages {
            check(usage, q, &format!("{name} {usage:?} {rows}x{cols}"));
        }
    }
}

/// [`for_each_case`] on `data(rows, cols, seed + i)` for the `i`-th of `shapes`: calls
/// `check(x, rows, cols, usage, q, what)`.
pub fn sweep(
    shapes: &[(usize, usize)],
    seed: u64,
    cases: &[Case],
    usages: &[Usage],
    mut check: impl FnMut(&[f32], usize, usize, Usage, &OperandQuant, &str),
) {
    for (si, &(rows, cols)) in shapes.iter().enumerate() {
        let x = data(rows, cols, seed + si as u64);
        for_each_case(cases, usages, rows, cols, |usage, q, what| {
            check(&x, rows, cols, usage, q, what)
        });
    }
}

/// Byte-for-byte comparison with a readable first difference.
pub fn assert_same(gpu: &QuantizedTensor, cpu: &QuantizedTensor, what: &str) {
    assert_eq!(
        (gpu.rows, gpu.cols, gpu.padded_rows, gpu.padded_cols),
        (cpu.rows, cpu.cols, cpu.padded_rows, cpu.padded_cols),
        "{what}: shape"
    );
    assert_eq!(
        gpu.amax.to_bits(),
        cpu.amax.to_bits(),
        "{what}: amax {} vs {}",
        gpu.amax,
        cpu.amax
    );
    assert_eq!(
        gpu.tensor_scale_inv.to_bits(),
        cpu.tensor_scale_inv.to_bits(),
        "{what}: tensor_scale_inv"
    );
    assert_eq!(gpu.scales.len(), cpu.scales.len(), "{what}: scale count");
    if let Some(i) = gpu.scales.iter().zip(&cpu.scales).position(|(a, b)| a != b) {
        panic!(
            "{what}: first scale mismatch at {i}: gpu {:#04x} cpu {:#04x}",
            gpu.scales[i], cpu.scales[i]
        );
    }
    assert_eq!(gpu.codes.len(), cpu.codes.len(), "{what}: code bytes");
    let bad = gpu
        .codes
        .iter()
        .zip(&cpu.codes)
        .filter(|(a, b)| a != b)
        .count();
    if let Some(i) = gpu.codes.iter().zip(&cpu.codes).position(|(a, b)| a != b) {
        panic!(
            "{what}: {bad} code bytes differ, first at byte {i}: gpu {:#04x} cpu {:#04x}",
            gpu.codes[i], cpu.codes[i]
        );
    }
    assert_eq!(gpu, cpu, "{what}");
}

/// The validated quantizer for `q`, `usage` and `key` (the cases are valid settings).
pub fn quantizer(q: &OperandQuant, usage: Usage, key: RngKey) -> quant::Quantizer {
    quant::Quantizer::new(*q, usage)
        .expect("valid settings")
        .with_key(key)
}

/// `quant`'s CPU quantization of the `[rows, cols]` `x` (the reference of every comparison).
pub fn cpu_quantize(
    x: &[f32],
    (rows, cols): (usize, usize),
    q: &quant::Quantizer,
    state: &mut quant::QuantState,
) -> QuantizedTensor {
    let x = quant::MatRef::new(x, rows, cols).expect("shape");
    q.quantize(x, state).expect("cpu quantization")
}

/// The shared emulator (`Emu::shared`), or `None` with a SKIP line naming `test` when this
/// machine has no C++20 compiler to build it; any other failure panics.
pub fn shared_emu(test: &str) -> Option<&'static Emu> {
    match Emu::shared() {
        Ok(e) => Some(e),
        Err(e @ (EmuError::NoCompiler(_) | EmuError::NoCxx20(..))) => {
            eprintln!("SKIP {test}: {e}");
            None
        }
        Err(e) => panic!("{test}: {e}"),
    }
}

//! Inputs and comparisons shared by the GPU tests and the CPU emulation tests.
#![allow(dead_code)]

use quant::{QuantizedTensor, RngKey};

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

pub const KEY: RngKey = RngKey {
    seed: 0x0123_4567_89AB_CDEF,
    stream: 0xFEED_0000_0042,
};

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

//! The NVFP4 and MXFP8 arithmetic of the inference-checkpoint producers, tensor by tensor.
//!
//! Each producer fixes the bytes of a checkpoint through its own operation order, which is
//! not Transformer Engine's training recipe ([`crate::nvfp4`]). The conventions below were
//! read from the producers' sources (NVIDIA TensorRT Model Optimizer 0.47.0,
//! `modelopt/torch/quantization/qtensor/nvfp4_tensor.py`; compressed-tensors 0.20.1,
//! `quantization/utils/helpers.py`, `quantization/lifecycle/forward_helpers.py`,
//! `quantization/utils/mxfp_utils.py`, `compressors/nvfp4/`) and are checked bit for bit
//! against those libraries by `fp-formats/tests/checkpoint_golden.rs`. Every quantity is an
//! IEEE f32 operation on the exact f32 value of the weight (BF16 and F16 weights are
//! widened first, which is exact).
//!
//! | | Transformer Engine (training) | ModelOpt (`weight_scale_2`) | compressed-tensors (`weight_global_scale`) |
//! |---|---|---|---|
//! | tensor scale stored | amax (recomputes `S_enc`) | `s2 = fl(amax / 2688)` | `g = fl(fl(1 / max(amax, 2^-126)) · 2688)`, 1 if not finite |
//! | block scale before E4M3 | `fl(amax_b · fl(S_enc · fl(1/6)))` | `fl(amax_b / fl(6 · s2))` | `fl(g · fl(amax_b / 6))` |
//! | block scale that is 0 | stays 0 (block flushed) | exact 0 → 1.0; then clamped to `[2^-9, 448]` | rounds to 0 in E4M3 → 0.125 (code `0x20`) |
//! | element before E2M1 | `fl(x · fl(1 / fl(s_b · S_dec)))` | `fl(x / fl(s_b · s2))` | `fl(x / fl(s_b / g))`, clamped to ±6 |
//! | code of ±0 and of negatives rounding to 0 | sign kept (`-0.0` → `0x8`) | `x < 0` sets the sign: `-0.0` → `0x0`, `-0.1` → `0x8` | same as ModelOpt |
//! | dequantized value | `fl(fl(e2m1 · s_b) · S_dec)` | `fl(e2m1 · fl(s_b · s2))`; code `0x8` → `+0.0` | `fl(e2m1 · fl(s_b / g))`, then BF16; `0x8` → `-0.0` |
//!
//! All three pack element `2i` in the low nibble and store the block scales row-major,
//! `[N, K/16]`, without the 128x4 swizzle. An all-zero tensor gives ModelOpt `0/0 = NaN`
//! block scales; here it gets the zero-block scale 1.0 and `s2 = 0` instead.
//!
//! MXFP8 (compressed-tensors `mxfp8-quantized`): `weight` E4M3 `[N, K]`, `weight_scale`
//! E8M0 exponents as `uint8` `[N, K/32]`, `x̂ = e4m3 · 2^(s - 127)`. compressed-tensors picks
//! the block exponent as `floor(log2(r)) - 8 + 127` where `r` is the block amax with its
//! mantissa rounded to one bit (significands ≥ 1.75 round up to the next power of two);
//! that equals RCEIL (`ceil(log2(amax / 448))`, Transformer Engine and Nibble's training
//! recipe) except when the significand is exactly 1.75, where RCEIL keeps the smaller
//! scale (448 is representable). An all-zero block gets code 0, and `-0.0` weights
//! become `+0` (its quantizer adds the zero point 0.0).
//! [`MxScale`] offers RCEIL (default), the OCP floor rule and the compressed-tensors rule.

use crate::formats::{ElementFormat, E2M1, E4M3, E8M0};
use crate::mx::{self, MxElement, MxOptions, ScaleRule};
use crate::nvfp4::BLOCK;
use crate::FormatError;

/// `448 * 6`.
const RANGE: f32 = 2688.0;

/// The E2M1 code of a scaled value with the producers' sign rule: the sign bit is set only
/// for values `< 0` (so `±0` gives `0x0`); NaN gives `0x7`, as ModelOpt's `searchsorted` does.
#[inline(always)]
fn e2m1_code(v: f32) -> u8 {
    let c = E2M1::encode_rne_sat(v);
    c & !(((v == 0.0) as u8) << 3)
}

/// Packs 16 codes, element `2i` in the low nibble.
#[inline(always)]
fn pack16(q: &[u8; BLOCK], out: &mut [u8]) {
    for i in 0..BLOCK / 2 {
        out[i] = q[2 * i] | (q[2 * i + 1] << 4);
    }
}

/// The shape check of every quantizer of the crate (no padding), then the finite amax.
fn check(data: &[f32], rows: usize, cols: usize, block: usize) -> Result<f32, FormatError> {
    crate::check_shape(data, rows, cols, block, crate::Padding::Error)?;
    crate::finite_amax(data)
}

/// An NVFP4 weight in a checkpoint layout: packed codes `[N, K/2]`, E4M3 block scales
/// `[N, K/16]` and the layout's per-tensor FP32 scale.
#[derive(Clone, Debug, PartialEq)]
pub struct Nvfp4Weight {
    /// Rows `N` (output features).
    pub rows: usize,
    /// Columns `K` (input features), a multiple of 16.
    pub cols: usize,
    /// Packed E2M1 codes, element `2i` of a row in the low nibble.
    pub packed: Vec<u8>,
    /// E4M3 block-scale bytes, row-major.
    pub scales: Vec<u8>,
    /// ModelOpt: `weight_scale_2 = amax / 2688`; compressed-tensors:
    /// `weight_global_scale = 2688 / amax` (the reciprocal convention).
    pub tensor_scale: f32,
}

/// ModelOpt's NVFP4 weight quantization (`NVFP4QTensor.quantize` with block size 16).
///
/// ```
/// use fp_formats::checkpoint::layouts::modelopt_nvfp4_quantize;
/// let w: Vec<f32> = (0..32).map(|i| (i as f32 - 16.0) / 8.0).collect();
/// let q = modelopt_nvfp4_quantize(&w, 1, 32).unwrap();
/// assert_eq!(q.tensor_scale, 2.0 / 2688.0);     // weight_scale_2 = amax / (6 * 448)
/// assert_eq!(q.scales, vec![0x7E, 0x7D]);         // 448 (amax_b = 2) and 416 (1.875 -> 420)
/// assert_eq!(q.packed[0] & 0xF, 0xF);             // -2.0 -> -6 on the E2M1 grid
/// ```
pub fn modelopt_nvfp4_quantize(
    data: &[f32],
    rows: usize,
    cols: usize,
) -> Result<Nvfp4Weight, FormatError> {
    let amax = check(data, rows, cols, BLOCK)?;
    let s2 = amax / RANGE;
    let six_s2 = 6.0 * s2;
    let mut packed = vec![0u8; data.len() / 2];
    let mut scales = vec![0u8; data.len() / BLOCK];
    let mut q = [0u8; BLOCK];
    for ((x, out), s) in data
        .chunks_exact(BLOCK)
        .zip(packed.chunks_exact_mut(BLOCK / 2))
        .zip(scales.iter_mut())
    {
        let bamax = crate::nvfp4::block_amax(x);
        let mut bs = bamax / six_s2;
        if bs == 0.0 || amax == 0.0 {
            bs = 1.0;
        }
        // Clamped to [2^-9, 448] before the RNE cast.
        *s = E4M3::encode_rne_sat(bs.max(f32::from_bits(0x3B00_0000)));
        let d = E4M3(*s).to_f32() * s2;
        for i in 0..BLOCK {
            q[i] = e2m1_code(x[i] / d);
        }
        pack16(&q, out);
    }
    Ok(Nvfp4Weight {
        rows,
        cols,
        packed,
        scales,
        tensor_scale: s2,
    })
}

/// The compressed-tensors global scale `fl(fl(1 / max(amax, 2^-126)) · 2688)` (PyTorch
/// evaluates `2688 / amax` as a reciprocal and a product), 1 when not finite.
///
/// ```
/// use fp_formats::checkpoint::layouts::ct_global_scale;
/// assert_eq!(ct_global_scale(2688.0), 1.0);
/// assert_eq!(ct_global_scale(0.4375), 6144.0005); // not 2688 / 0.4375 = 6144
/// assert_eq!(ct_global_scale(0.0), 1.0); // 2688 / 2^-126 overflows f32
/// ```
pub fn ct_global_scale(amax: f32) -> f32 {
    // `2688.0 / tensor` is `tensor.reciprocal() * 2688.0` in PyTorch: two roundings.
    let g = (1.0 / amax.max(f32::MIN_POSITIVE)) * RANGE;
    if g.is_finite() {
        g
    } else {
        1.0
    }
}

/// ModelOpt's NVFP4 `input_scale` of a linear layer from its calibrated input amax:
/// `fl(amax / 2688)` (`NVFP4QTensor.get_activation_scaling_factor`: `amax.float() /
/// (maxbound * 448.0)` with `maxbound = 6`), the same formula as `weight_scale_2`.
///
/// ```
/// use fp_formats::checkpoint::layouts::modelopt_input_scale;
/// assert_eq!(modelopt_input_scale(2688.0), 1.0);
/// assert_eq!(modelopt_input_scale(3.5), 3.5 / 2688.0);
/// ```
pub fn modelopt_input_scale(amax: f32) -> f32 {
    amax / RANGE
}

/// compressed-tensors' NVFP4 `input_global_scale` of a linear layer from its calibrated
/// input amax: `generate_gparam` computes `448 * 6 / amax` in f32, which PyTorch evaluates
/// as `fl(fl(1 / amax) · 2688)` - the reciprocal convention of [`ct_global_scale`], and the
/// same arithmetic.
///
/// ```
/// use fp_formats::checkpoint::layouts::{ct_input_global_scale, modelopt_input_scale};
/// assert_eq!(ct_input_global_scale(0.4375), 6144.0005); // fl(fl(1 / 0.4375) * 2688)
/// assert_eq!(ct_input_global_scale(2688.0), 1.0 / modelopt_input_scale(2688.0));
/// ```
pub fn ct_input_global_scale(amax: f32) -> f32 {
    ct_global_scale(amax)
}

/// compressed-tensors' NVFP4 weight quantization (`nvfp4-pack-quantized`, the `NVFP4A16` /
/// `NVFP4` scheme: tensor-group strategy, group 16, E4M3 scales) on the f32 weight.
///
/// ```
/// use fp_formats::checkpoint::layouts::ct_nvfp4_quantize;
/// let mut w = vec![0.0f32; 32];
/// w[0] = 3.0;
/// let q = ct_nvfp4_quantize(&w, 1, 32).unwrap();
/// assert_eq!(q.tensor_scale, 896.0);          // 2688 / 3
/// assert_eq!(q.scales, vec![0x7E, 0x20]);      // 448, and 0.125 for the all-zero block
/// assert_eq!(q.packed[0], 0x07);               // 3.0 -> 6 on the grid
/// ```
pub fn ct_nvfp4_quantize(
    data: &[f32],
    rows: usize,
    cols: usize,
) -> Result<Nvfp4Weight, FormatError> {
    let amax = check(data, rows, cols, BLOCK)?;
    let g = ct_global_scale(amax);
    let mut packed = vec![0u8; data.len() / 2];
    let mut scales = vec![0u8; data.len() / BLOCK];
    let mut q = [0u8; BLOCK];
    for ((x, out), s) in data
        .chunks_exact(BLOCK)
        .zip(packed.chunks_exact_mut(BLOCK / 2))
        .zip(scales.iter_mut())
    {
        let bamax = crate::nvfp4::block_amax(x);
        let mut code = E4M3::encode_rne_sat(g * (bamax / 6.0));
        if code == 0 {
            code = 0x20; // 0.125, compressed-tensors' E4M3 "eps" for a zero scale
        }
        *s = code;
        let d = E4M3(code).to_f32() / g;
        for i in 0..BLOCK {
            q[i] = e2m1_code((x[i] / d).clamp(-6.0, 6.0));
        }
        pack16(&q, out);
    }
    Ok(Nvfp4Weight {
        rows,
        cols,
        packed,
        scales,
        tensor_scale: g,
    })
}

/// Which producer's dequantization formula to apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Nvfp4Convention {
    /// `x̂ = fl(e2m1 · fl(s_b · weight_scale_2))`.
    ModelOpt,
    /// `x̂ = fl(e2m1 · fl(s_b / weight_global_scale))`.
    CompressedTensors,
}

/// Dequantizes an NVFP4 checkpoint weight to f32 with the producer's operation order.
///
/// # Panics
/// If `out.len() != 2 * packed.len()` or `scales.len() * 16 != out.len()`.
///
/// ```
/// use fp_formats::checkpoint::layouts::{nvfp4_dequantize, Nvfp4Convention};
/// let mut out = [0.0f32; 16];
/// // code 0x7 (6.0) and 0xA (-1.0); scale 0x38 (1.0); weight_scale_2 0.5
/// nvfp4_dequantize(&[0xA7, 0, 0, 0, 0, 0, 0, 0], &[0x38], 0.5, Nvfp4Convention::ModelOpt, &mut out);
/// assert_eq!(&out[..3], &[3.0, -0.5, 0.0]);
/// ```
pub fn nvfp4_dequantize(
    packed: &[u8],
    scales: &[u8],
    tensor_scale: f32,
    convention: Nvfp4Convention,
    out: &mut [f32],
) {
    assert_eq!(out.len(), packed.len() * 2, "NVFP4 output length");
    assert_eq!(scales.len() * BLOCK, out.len(), "NVFP4 scale count");
    for ((o, c), &s) in out
        .chunks_exact_mut(BLOCK)
        .zip(packed.chunks_exact(BLOCK / 2))
        .zip(scales)
    {
        let sf = E4M3(s).to_f32();
        // ModelOpt's value table maps code 0x8 to +0.0 (adding +0.0 does exactly that);
        // compressed-tensors multiplies by -1.0 and keeps -0.0.
        let (d, zero) = match convention {
            Nvfp4Convention::ModelOpt => (sf * tensor_scale, 0.0),
            Nvfp4Convention::CompressedTensors => (sf / tensor_scale, -0.0),
        };
        for (pair, &b) in o.chunks_exact_mut(2).zip(c) {
            pair[0] = E2M1(b & 0xF).to_f32() * d + zero;
            pair[1] = E2M1(b >> 4).to_f32() * d + zero;
        }
    }
}

/// How MXFP8 block exponents are chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MxScale {
    /// `ceil(log2(amax / 448))` on the bits (Transformer Engine, cuBLAS, Nibble's MXFP8
    /// training recipe); never clips.
    #[default]
    Rceil,
    /// OCP MX v1.0: `floor(log2(amax)) - 8`; block maxima with significand above 1.75 clip.
    Floor,
    /// compressed-tensors' `generate_mx_scales`: the amax's mantissa rounded to one bit
    /// (half up), then `floor(log2) - 8`; zero blocks get exponent code 0; and, as its
    /// quantizer adds the symmetric zero point, `-0.0` weights get code `0x00`.
    CompressedTensors,
}

/// An MXFP8 (E4M3) weight: codes `[N, K]` and E8M0 exponents `[N, K/32]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Mxfp8Weight {
    /// Rows `N`.
    pub rows: usize,
    /// Columns `K`, a multiple of 32.
    pub cols: usize,
    /// E4M3 codes, row-major.
    pub codes: Vec<u8>,
    /// E8M0 biased exponents, row-major.
    pub scales: Vec<u8>,
}

/// compressed-tensors' E8M0 exponent for an E4M3 block with absolute maximum `amax`.
///
/// ```
/// use fp_formats::checkpoint::layouts::ct_mx_scale_e4m3;
/// assert_eq!(ct_mx_scale_e4m3(1.0), 127 - 8);
/// assert_eq!(ct_mx_scale_e4m3(1.75), 127 - 7); // rounds up to 2
/// assert_eq!(ct_mx_scale_e4m3(0.0), 0);
/// ```
pub fn ct_mx_scale_e4m3(amax: f32) -> u8 {
    // Add half of the mantissa's second bit and keep sign + exponent.
    let r = (amax.to_bits().wrapping_add(1 << 21)) & 0xFF80_0000;
    let biased = (r >> 23) as i32;
    if biased == 0 {
        // log2(0) = -inf, which compressed-tensors 0.20.1 turns into exponent code 0
        // through float-to-integer conversions of -inf (observed on x86-64).
        return 0;
    }
    (biased - 127 + 127 - 8).clamp(0, 254) as u8
}

/// Quantizes a `[rows, cols]` weight to MXFP8 (E4M3 elements, RNE, saturating at 448).
///
/// ```
/// use fp_formats::checkpoint::layouts::{mxfp8_quantize, MxScale};
/// let w: Vec<f32> = (0..32).map(|i| i as f32).collect();
/// let q = mxfp8_quantize(&w, 1, 32, MxScale::Rceil).unwrap();
/// assert_eq!(q.scales, vec![127 - 3]); // amax 31: ceil(log2(31 / 448)) = -3
/// ```
pub fn mxfp8_quantize(
    data: &[f32],
    rows: usize,
    cols: usize,
    rule: MxScale,
) -> Result<Mxfp8Weight, FormatError> {
    const MX: usize = mx::BLOCK;
    let rule = match rule {
        MxScale::Rceil => Some(ScaleRule::Rceil),
        MxScale::Floor => Some(ScaleRule::Floor),
        MxScale::CompressedTensors => None,
    };
    if let Some(rule) = rule {
        let m = mx::quantize(data, rows, cols, MxOptions::new(MxElement::E4M3, rule))?;
        return Ok(Mxfp8Weight {
            rows,
            cols,
            codes: m.codes,
            scales: m.scales.iter().map(|s| s.0).collect(),
        });
    }
    check(data, rows, cols, MX)?;
    let mut codes = vec![0u8; data.len()];
    let mut scales = vec![0u8; data.len() / MX];
    let mut tmp = [0.0f32; MX];
    for ((x, out), s) in data
        .chunks_exact(MX)
        .zip(codes.chunks_exact_mut(MX))
        .zip(scales.iter_mut())
    {
        *s = ct_mx_scale_e4m3(crate::nvfp4::block_amax(x));
        let r = E8M0(*s).reciprocal();
        for (t, &v) in tmp.iter_mut().zip(x) {
            // Exact (a power of two; x / 2^e rounds the same way). Adding the symmetric
            // zero point 0.0 turns -0.0 into +0.0, as compressed-tensors does.
            *t = v * r + 0.0;
        }
        E4M3::encode_slice_rne_sat(&tmp, out);
    }
    Ok(Mxfp8Weight {
        rows,
        cols,
        codes,
        scales,
    })
}

/// Dequantizes MXFP8 codes and E8M0 exponents: `x̂ = e4m3 · 2^(s - 127)` (exact in f32 and,
/// unless out of range, in BF16).
///
/// # Panics
/// If `out.len() != codes.len()` or `scales.len() * 32 != codes.len()`.
///
/// ```
/// use fp_formats::checkpoint::layouts::mxfp8_dequantize;
/// let mut out = [0.0f32; 32];
/// mxfp8_dequantize(&[0x38; 32], &[128], &mut out); // 1.0 * 2
/// assert_eq!(out[0], 2.0);
/// ```
pub fn mxfp8_dequantize(codes: &[u8], scales: &[u8], out: &mut [f32]) {
    assert_eq!(out.len(), codes.len(), "MXFP8 output length");
    assert_eq!(scales.len() * mx::BLOCK, codes.len(), "MXFP8 scale count");
    for ((o, c), &s) in out
        .chunks_exact_mut(mx::BLOCK)
        .zip(codes.chunks_exact(mx::BLOCK))
        .zip(scales)
    {
        let sv = E8M0(s).value();
        for (y, &b) in o.iter_mut().zip(c) {
            *y = E4M3(b).to_f32() * sv;
        }
    }
}

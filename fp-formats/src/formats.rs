//! The element formats: one `#[repr(transparent)]` byte newtype per format.
//!
//! | type | bits S/E/M | bias | max finite | min subnormal | Inf | NaN | NaN input → |
//! |---|---|---|---|---|---|---|---|
//! | [`E2M1`] (FP4) | 1/2/1 | 1 | 6 | 0.5 | — | — | +6 (`0x7`) |
//! | [`E2M3`] (FP6) | 1/2/3 | 1 | 7.5 | 0.125 | — | — | +7.5 (`0x1F`) |
//! | [`E3M2`] (FP6) | 1/3/2 | 3 | 28 | 0.0625 | — | — | +28 (`0x1F`) |
//! | [`E4M3`] (FP8, "fn") | 1/4/3 | 7 | 448 | 2^-9 | — | `S.1111.111` | `0x7F` / `0xFF` (sign kept) |
//! | [`UE4M3`] (NVFP4 scale) | 0/4/3 | 7 | 448 | 2^-9 | — | `0x7F` | `0x7F` |
//! | [`E5M2`] (FP8) | 1/5/2 | 15 | 57344 | 2^-16 | `S.11111.00` | `S.11111.xx`, xx≠0 | `0x7E` / `0xFE` |
//! | [`E8M0`] (MX scale) | 0/8/0 | 127 | 2^127 | — (min 2^-127) | — | `0xFF` | `0xFF` |
//!
//! Every format keeps signed zero where it has a sign bit (`-0.0` and negative values that
//! round to zero encode with the sign bit set). Subnormals are never flushed.
//! Formats without NaN map a NaN input to their largest positive finite value, as the PTX
//! `cvt.*.satfinite` instructions do; formats without Inf map ±Inf to ±max, or to NaN
//! under [`Overflow::Propagate`] where they have NaN (E4M3), as ml_dtypes does.
//!
//! Decoding is exact and goes through a 256-entry table built at compile time.

use crate::minifloat::Spec;
use crate::rounding::{Overflow, Rounding};

/// Common interface of the 4-, 6- and 8-bit element formats.
///
/// ```
/// use fp_formats::{E4M3, ElementFormat, Overflow, Rounding};
/// let q = E4M3::from_f32(1.0625, Rounding::NearestEven, Overflow::Saturate);
/// assert_eq!(q.to_bits(), 0x38); // tie to even: 1.0
/// assert_eq!(E4M3::from_f32(500.0, Rounding::NearestEven, Overflow::Saturate).to_f32(), 448.0);
/// assert!(E4M3::from_f32(500.0, Rounding::NearestEven, Overflow::Propagate).to_f32().is_nan());
/// ```
pub trait ElementFormat: Copy + Send + Sync + 'static {
    /// Short name, e.g. `"e4m3"`.
    const NAME: &'static str;
    /// Storage width in bits (4, 6 or 8); codes live in the low bits of the byte.
    const BITS: u32;
    /// Largest finite value.
    const MAX: f32;
    /// Exponent of the largest power of two not above [`Self::MAX`] (`emax_elem` of the OCP
    /// MX spec: E2M1 2, E2M3 2, E3M2 4, E4M3 8, E5M2 15).
    const EMAX: i32;
    /// Explicit mantissa bits (E2M1 1, E2M3 3, E3M2 2, E4M3 3, E5M2 2, E8M0 0).
    const MANTISSA_BITS: u32;
    /// Wraps a raw code (bits above [`Self::BITS`] must be zero).
    fn from_bits(bits: u8) -> Self;
    /// The raw code.
    fn to_bits(self) -> u8;
    /// Exact value of the code.
    fn to_f32(self) -> f32;
    /// Encodes with an explicit rounding mode and overflow policy.
    fn from_f32(x: f32, rounding: Rounding, overflow: Overflow) -> Self;
    /// Round-to-nearest-even with saturation: the cast every production kernel uses.
    #[inline]
    fn from_f32_rne_sat(x: f32) -> Self {
        Self::from_f32(x, Rounding::NearestEven, Overflow::Saturate)
    }
}

const fn build_lut(spec: &Spec, mask: u16) -> [f32; 256] {
    let mut lut = [0.0f32; 256];
    let mut i = 0;
    while i < 256 {
        lut[i] = spec.decode(i as u16 & mask);
        i += 1;
    }
    lut
}

macro_rules! element_format {
    ($(#[$doc:meta])* $name:ident, $lname:literal, $bits:expr, $emax:expr, $lut:ident, $mask:expr,
     $spec:expr) => {
        $(#[$doc])*
        #[repr(transparent)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
        pub struct $name(pub u8);

        impl $name {
            pub(crate) const SPEC: Spec = $spec;
        }

        static $lut: [f32; 256] = build_lut(&$name::SPEC, $mask);

        impl ElementFormat for $name {
            const NAME: &'static str = $lname;
            const BITS: u32 = $bits;
            const MAX: f32 = $name::SPEC.decode($name::SPEC.max_code);
            const EMAX: i32 = $emax;
            const MANTISSA_BITS: u32 = $name::SPEC.mbits;
            #[inline]
            fn from_bits(bits: u8) -> Self {
                debug_assert!(($bits == 8) || bits >> $bits == 0, "code out of range");
                Self(bits)
            }
            #[inline]
            fn to_bits(self) -> u8 {
                self.0
            }
            #[inline]
            fn to_f32(self) -> f32 {
                $lut[self.0 as usize]
            }
            #[inline]
            fn from_f32(x: f32, rounding: Rounding, overflow: Overflow) -> Self {
                Self(Self::SPEC.encode(x, rounding, overflow) as u8)
            }
        }
    };
}

element_format!(
    /// FP4 E2M1: values ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}; no Inf, no NaN.
    E2M1, "e2m1", 4, 2, E2M1_LUT, 0x0F,
    Spec { mbits: 1, emin: 0, max_code: 0x7, sign_bit: 0x8, inf_code: None, nan_code: None }
);
element_format!(
    /// FP6 E2M3 (OCP MX): max 7.5, no Inf, no NaN.
    E2M3, "e2m3", 6, 2, E2M3_LUT, 0x3F,
    Spec { mbits: 3, emin: 0, max_code: 0x1F, sign_bit: 0x20, inf_code: None, nan_code: None }
);
element_format!(
    /// FP6 E3M2 (OCP MX): max 28, no Inf, no NaN.
    E3M2, "e3m2", 6, 4, E3M2_LUT, 0x3F,
    Spec { mbits: 2, emin: -2, max_code: 0x1F, sign_bit: 0x20, inf_code: None, nan_code: None }
);
element_format!(
    /// FP8 E4M3 "fn" (OCP OFP8): max 448, NaN = `S.1111.111`, no Inf.
    E4M3, "e4m3", 8, 8, E4M3_LUT, 0xFF,
    Spec { mbits: 3, emin: -6, max_code: 0x7E, sign_bit: 0x80, inf_code: None, nan_code: Some(0x7F) }
);
element_format!(
    /// Unsigned E4M3, the NVFP4 block-scale format: E4M3 with the sign bit ignored on decode
    /// (as cuBLAS does) and never set on encode. Negative inputs encode to 0, or to NaN
    /// under [`Overflow::Propagate`].
    UE4M3, "ue4m3", 8, 8, UE4M3_LUT, 0x7F,
    Spec { mbits: 3, emin: -6, max_code: 0x7E, sign_bit: 0, inf_code: None, nan_code: Some(0x7F) }
);
element_format!(
    /// FP8 E5M2 (IEEE-like): max 57344, Inf `0x7C`, NaN `0x7D..=0x7F` (canonical `0x7E`).
    E5M2, "e5m2", 8, 15, E5M2_LUT, 0xFF,
    Spec { mbits: 2, emin: -14, max_code: 0x7B, sign_bit: 0x80, inf_code: Some(0x7C), nan_code: Some(0x7E) }
);

impl E2M1 {
    /// Fast branch-free RNE + saturating encode, bit-identical to
    /// `E2M1::from_f32(x, Rounding::NearestEven, Overflow::Saturate)` for every f32
    /// (checked exhaustively in the test suite). Written as comparisons against the
    /// midpoints so that loops over slices vectorise.
    #[inline(always)]
    pub fn encode_rne_sat(x: f32) -> u8 {
        let bits = x.to_bits();
        let a = f32::from_bits(bits & 0x7FFF_FFFF);
        let mag = (a > 0.25) as u8
            + (a >= 0.75) as u8
            + (a > 1.25) as u8
            + (a >= 1.75) as u8
            + (a > 2.5) as u8
            + (a >= 3.5) as u8
            + (a > 5.0) as u8;
        // NaN fails every comparison: it becomes +6 like the hardware cast.
        let is_nan = a.is_nan();
        let sign = ((bits >> 28) & 0x8) as u8;
        if is_nan {
            0x7
        } else {
            mag | sign
        }
    }
}

impl E4M3 {
    /// Fast RNE + saturating encode (the `cvt.rn.satfinite.e4m3x2.f32` cast), bit-identical
    /// to `E4M3::from_f32(x, Rounding::NearestEven, Overflow::Saturate)` for every f32
    /// (checked exhaustively in the test suite). Branch-free so loops vectorise.
    #[inline(always)]
    pub fn encode_rne_sat(x: f32) -> u8 {
        let bits = x.to_bits();
        let abs = bits & 0x7FFF_FFFF;
        let sign = ((bits >> 24) & 0x80) as u8;
        // Normal range (|x| >= 2^-6): round the f32 mantissa to 3 bits in place.
        let rounded = abs.wrapping_add(0x7FFFF + ((abs >> 20) & 1));
        let normal = (rounded >> 20).wrapping_sub(120 << 3);
        // Subnormal range: adding 2^14 (ulp 2^-9) rounds to the E4M3 subnormal grid.
        let sub = (f32::from_bits(abs) + 16384.0f32)
            .to_bits()
            .wrapping_sub(0x4680_0000);
        let mag = if abs < 0x3C80_0000 {
            sub
        } else {
            normal.min(0x7E)
        };
        let mag = if abs > 0x7F80_0000 { 0x7F } else { mag };
        mag as u8 | sign
    }
}

impl E2M1 {
    /// Encodes a slice with RNE + saturation (exactly [`E2M1::encode_rne_sat`] per element)
    /// and packs two codes per byte, element `2i` in the low nibble (see [`crate::pack`]).
    /// An odd length leaves the last high nibble zero.
    ///
    /// # Panics
    /// If `dst.len() != src.len().div_ceil(2)`.
    pub fn encode_slice_packed(src: &[f32], dst: &mut [u8]) {
        assert_eq!(
            dst.len(),
            src.len().div_ceil(2),
            "E2M1 packed output length"
        );
        let pairs = src.len() / 2;
        crate::kernels::e2m1_encode_packed(&src[..2 * pairs], &mut dst[..pairs]);
        if src.len() % 2 == 1 {
            dst[pairs] = E2M1::encode_rne_sat(src[2 * pairs]);
        }
    }

    /// Decodes `dst.len()` packed codes (the inverse of [`E2M1::encode_slice_packed`]).
    ///
    /// # Panics
    /// If `src.len() != dst.len().div_ceil(2)`.
    pub fn decode_slice_packed(src: &[u8], dst: &mut [f32]) {
        assert_eq!(src.len(), dst.len().div_ceil(2), "E2M1 packed input length");
        let pairs = dst.len() / 2;
        crate::kernels::e2m1_decode_packed(&src[..pairs], &mut dst[..2 * pairs]);
        if dst.len() % 2 == 1 {
            dst[2 * pairs] = E2M1(src[pairs] & 0xF).to_f32();
        }
    }
}

impl E4M3 {
    /// Encodes a slice with RNE + saturation, exactly [`E4M3::encode_rne_sat`] per element.
    ///
    /// # Panics
    /// If `dst.len() != src.len()`.
    pub fn encode_slice_rne_sat(src: &[f32], dst: &mut [u8]) {
        assert_eq!(dst.len(), src.len(), "E4M3 output length");
        crate::kernels::e4m3_encode(src, dst);
    }

    /// Decodes a slice of codes (exact).
    ///
    /// # Panics
    /// If `dst.len() != src.len()`.
    pub fn decode_slice(src: &[u8], dst: &mut [f32]) {
        assert_eq!(dst.len(), src.len(), "E4M3 output length");
        crate::kernels::e4m3_decode(src, dst);
    }
}

impl E5M2 {
    /// Fast RNE + saturating encode (the `cvt.rn.satfinite.e5m2x2.f32` cast), bit-identical
    /// to `E5M2::from_f32(x, Rounding::NearestEven, Overflow::Saturate)` for every f32
    /// (checked exhaustively in the test suite): infinities saturate to ±57344, NaN becomes
    /// the canonical NaN with its sign. Branch-free so loops vectorise.
    ///
    /// ```
    /// use fp_formats::{ElementFormat, E5M2, Overflow, Rounding};
    /// for x in [1.3f32, -1.0e-5, 6.0e4, f32::NEG_INFINITY] {
    ///     let slow = E5M2::from_f32(x, Rounding::NearestEven, Overflow::Saturate).0;
    ///     assert_eq!(E5M2::encode_rne_sat(x), slow);
    /// }
    /// ```
    #[inline(always)]
    pub fn encode_rne_sat(x: f32) -> u8 {
        let bits = x.to_bits();
        let abs = bits & 0x7FFF_FFFF;
        let sign = ((bits >> 24) & 0x80) as u8;
        // Normal range (|x| >= 2^-14): round the f32 mantissa to 2 bits in place.
        let rounded = abs.wrapping_add(0xFFFFF + ((abs >> 21) & 1));
        let normal = (rounded >> 21).wrapping_sub(112 << 2);
        // Subnormal range: adding 2^7 (ulp 2^-16) rounds to the E5M2 subnormal grid.
        let sub = (f32::from_bits(abs) + 128.0f32)
            .to_bits()
            .wrapping_sub(0x4300_0000);
        let mag = if abs < 0x3880_0000 {
            sub
        } else {
            normal.min(0x7B)
        };
        let mag = if abs > 0x7F80_0000 { 0x7E } else { mag };
        mag as u8 | sign
    }

    /// Encodes a slice with RNE + saturation, exactly [`E5M2::encode_rne_sat`] per element.
    ///
    /// # Panics
    /// If `dst.len() != src.len()`.
    pub fn encode_slice_rne_sat(src: &[f32], dst: &mut [u8]) {
        assert_eq!(dst.len(), src.len(), "E5M2 output length");
        for (d, &x) in dst.iter_mut().zip(src) {
            *d = E5M2::encode_rne_sat(x);
        }
    }

    /// Decodes a slice of codes (exact).
    ///
    /// # Panics
    /// If `dst.len() != src.len()`.
    pub fn decode_slice(src: &[u8], dst: &mut [f32]) {
        assert_eq!(dst.len(), src.len(), "E5M2 output length");
        for (d, &c) in dst.iter_mut().zip(src) {
            *d = E5M2(c).to_f32();
        }
    }
}

/// E8M0 (OCP MX scale): the value `2^(b - 127)` for `b` in `0..=254`, `0xFF` = NaN.
/// No sign, zero or infinity.
///
/// Encoding rounds on the exponent grid: `NearestEven` rounds `1.5·2^k` and above up
/// (with no mantissa bits, the kept significand is always odd, so ties go up; this matches
/// ml_dtypes' `float8_e8m0fnu`). Zero, negative values and NaN encode to NaN; positive values
/// below 2^-127 encode to 2^-127 (`0x00`); overflow above 2^127 saturates to `0xFE` or
/// becomes NaN under [`Overflow::Propagate`].
///
/// ```
/// use fp_formats::{E8M0, ElementFormat, Overflow, Rounding};
/// assert_eq!(E8M0(0x7F).to_f32(), 1.0);
/// assert_eq!(E8M0::from_f32(3.0, Rounding::NearestEven, Overflow::Saturate).0, 0x81); // 4
/// assert_eq!(E8M0::from_f32(3.0, Rounding::TowardZero, Overflow::Saturate).0, 0x80); // 2
/// ```
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
pub struct E8M0(pub u8);

impl E8M0 {
    /// The NaN code.
    pub const NAN: E8M0 = E8M0(0xFF);
    /// The scale 1.0.
    pub const ONE: E8M0 = E8M0(127);

    /// `2^(b - 127)` as f32 (`b = 0` gives the f32 subnormal 2^-127); NaN for `0xFF`.
    #[inline]
    pub const fn value(self) -> f32 {
        if self.0 == 0xFF {
            f32::NAN
        } else if self.0 == 0 {
            f32::from_bits(0x0040_0000)
        } else {
            f32::from_bits((self.0 as u32) << 23)
        }
    }

    /// The exact reciprocal `2^(127 - b)` used to scale data into the block (never a
    /// division). `b = 0` (2^-127) has reciprocal 2^127; `b = 254` gives 2^-127.
    /// NaN for `0xFF`.
    #[inline]
    pub const fn reciprocal(self) -> f32 {
        E8M0(254u8.wrapping_sub(self.0)).value_or_nan(self.0 == 0xFF)
    }

    #[inline]
    const fn value_or_nan(self, nan: bool) -> f32 {
        if nan {
            f32::NAN
        } else {
            self.value()
        }
    }

    /// Unbiased exponent `b - 127`, or `None` for NaN.
    #[inline]
    pub const fn exponent(self) -> Option<i32> {
        if self.0 == 0xFF {
            None
        } else {
            Some(self.0 as i32 - 127)
        }
    }

    /// The scale `2^e`, clamped to the representable exponents `[-127, 127]`.
    #[inline]
    pub const fn from_exponent_clamped(e: i32) -> Self {
        let e = if e < -127 {
            -127
        } else if e > 127 {
            127
        } else {
            e
        };
        E8M0((e + 127) as u8)
    }
}

impl ElementFormat for E8M0 {
    const NAME: &'static str = "e8m0";
    const BITS: u32 = 8;
    const MAX: f32 = E8M0(0xFE).value();
    const EMAX: i32 = 127;
    const MANTISSA_BITS: u32 = 0;
    #[inline]
    fn from_bits(bits: u8) -> Self {
        Self(bits)
    }
    #[inline]
    fn to_bits(self) -> u8 {
        self.0
    }
    #[inline]
    fn to_f32(self) -> f32 {
        self.value()
    }
    fn from_f32(x: f32, rounding: Rounding, overflow: Overflow) -> Self {
        let bits = x.to_bits();
        if x.is_nan() || x <= 0.0 || bits >> 31 != 0 {
            return Self::NAN;
        }
        if x.is_infinite() {
            return match overflow {
                Overflow::Saturate => E8M0(0xFE),
                Overflow::Propagate => Self::NAN,
            };
        }
        // x = sig * 2^(k - 23) with sig in [2^23, 2^24): k = floor(log2 x).
        let exp_field = (bits >> 23) as i32;
        let man = bits & 0x7F_FFFF;
        let (sig, k) = if exp_field == 0 {
            let lz = man.leading_zeros() as i32 - 8; // shift to put the top bit at 23
            (man << lz, -126 - lz)
        } else {
            (man | 0x80_0000, exp_field - 127)
        };
        if k < -127 {
            return E8M0(0);
        }
        let rem = (sig & 0x7F_FFFF) as u64;
        let up = crate::minifloat::round_up(1, rem, 23, false, rounding);
        let e = k + up as i32;
        if e > 127 {
            let toward_finite = matches!(rounding, Rounding::TowardZero | Rounding::TowardNegative);
            return match overflow {
                Overflow::Saturate => E8M0(0xFE),
                Overflow::Propagate if toward_finite => E8M0(0xFE),
                Overflow::Propagate => Self::NAN,
            };
        }
        E8M0((e + 127) as u8)
    }
}

/// Encodes to BF16 with an explicit rounding mode and overflow policy (same semantics as
/// the 8-bit formats; NaN becomes the canonical quiet NaN with the input's sign).
///
/// ```
/// use fp_formats::{bf16_from_f32, Overflow, Rounding};
/// let x = 1.0 + f32::EPSILON;
/// assert_eq!(bf16_from_f32(x, Rounding::NearestEven, Overflow::Propagate).to_f32(), 1.0);
/// assert_eq!(bf16_from_f32(x, Rounding::TowardPositive, Overflow::Propagate).to_f32(), 1.0078125);
/// ```
#[inline]
pub fn bf16_from_f32(x: f32, rounding: Rounding, overflow: Overflow) -> half::bf16 {
    const BF16: Spec = Spec {
        mbits: 7,
        emin: -126,
        max_code: 0x7F7F,
        sign_bit: 0x8000,
        inf_code: Some(0x7F80),
        nan_code: Some(0x7FC0),
    };
    half::bf16::from_bits(BF16.encode(x, rounding, overflow))
}

/// Encodes to IEEE binary16 with an explicit rounding mode and overflow policy.
///
/// ```
/// use fp_formats::{f16_from_f32, Overflow, Rounding};
/// assert_eq!(f16_from_f32(70000.0, Rounding::NearestEven, Overflow::Saturate).to_f32(), 65504.0);
/// assert!(f16_from_f32(70000.0, Rounding::NearestEven, Overflow::Propagate).to_f32().is_infinite());
/// ```
#[inline]
pub fn f16_from_f32(x: f32, rounding: Rounding, overflow: Overflow) -> half::f16 {
    const F16: Spec = Spec {
        mbits: 10,
        emin: -14,
        max_code: 0x7BFF,
        sign_bit: 0x8000,
        inf_code: Some(0x7C00),
        nan_code: Some(0x7E00),
    };
    half::f16::from_bits(F16.encode(x, rounding, overflow))
}

/// Fast RNE cast of f32 to BF16 and back (the BF16 "fake quantization" used on GEMM inputs).
/// Identical to `bf16_from_f32(x, NearestEven, Propagate).to_f32()` for non-NaN inputs;
/// NaN stays NaN.
#[inline(always)]
pub fn round_to_bf16(x: f32) -> f32 {
    let b = x.to_bits();
    let r = b.wrapping_add(0x7FFF + ((b >> 16) & 1)) & 0xFFFF_0000;
    // A bit mask, not a branch: in `*y = round_to_bf16(*y)` loops a branch that leaves NaN
    // untouched becomes a masked store (`vmaskmovps`), many times slower on AMD cores.
    let keep = (((b & 0x7FFF_FFFF) > 0x7F80_0000) as u32).wrapping_neg();
    f32::from_bits((b & keep) | (r & !keep))
}

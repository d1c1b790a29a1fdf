//! The one generic, bit-exact encoder and decoder behind every element format.
//!
//! A format is described by a [`Spec`]: mantissa width, minimum normal exponent, the largest
//! finite magnitude code and which codes (if any) mean Inf and NaN. Encoding works on the
//! integer significand of the f32 input, so every rounding mode is exact: there is no
//! floating-point arithmetic on the value and therefore no double rounding.

use crate::rounding::{Overflow, Rounding};

/// Bit-level description of a small floating-point format (sign-magnitude, IEEE-style
/// subnormals at the minimum exponent).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Spec {
    /// Explicit mantissa bits.
    pub mbits: u32,
    /// Unbiased exponent of the smallest normal number (`1 - bias`).
    pub emin: i32,
    /// Largest finite magnitude code (codes are ordered by magnitude).
    pub max_code: u16,
    /// The sign bit, or 0 for unsigned formats.
    pub sign_bit: u16,
    /// Magnitude code of +Inf, if the format has infinities.
    pub inf_code: Option<u16>,
    /// Magnitude code of the canonical (quiet) NaN, if the format has NaN.
    pub nan_code: Option<u16>,
}

impl Spec {
    /// Decodes a code to f32 (exact for every format in this crate).
    pub(crate) const fn decode(&self, code: u16) -> f32 {
        let neg = self.sign_bit != 0 && code & self.sign_bit != 0;
        let mag = code & !self.sign_bit;
        let v = self.decode_magnitude(mag);
        if neg {
            -v
        } else {
            v
        }
    }

    const fn decode_magnitude(&self, mag: u16) -> f32 {
        if let Some(i) = self.inf_code {
            // IEEE-style: the code after the largest finite one is Inf, everything above is NaN.
            if mag == i {
                return f32::INFINITY;
            } else if mag > i {
                return f32::NAN;
            }
        } else if let Some(n) = self.nan_code {
            if mag >= n {
                return f32::NAN;
            }
        }
        let m = mag as u32 & ((1 << self.mbits) - 1);
        let e_field = (mag as u32) >> self.mbits;
        // value = n * 2^(e - mbits) with n the integer significand.
        let (n, e) = if e_field == 0 {
            (m, self.emin)
        } else {
            (m | (1 << self.mbits), self.emin + e_field as i32 - 1)
        };
        pow2_times(n, e - self.mbits as i32)
    }

    /// Encodes `x` with the given rounding mode and overflow policy.
    #[inline]
    pub(crate) fn encode(&self, x: f32, rounding: Rounding, overflow: Overflow) -> u16 {
        let bits = x.to_bits();
        let neg = bits >> 31 != 0;
        let abs_bits = bits & 0x7FFF_FFFF;
        if abs_bits > 0x7F80_0000 {
            return self.encode_nan(neg);
        }
        let sign = if neg { self.sign_bit } else { 0 };
        if self.sign_bit == 0 && neg && abs_bits != 0 {
            // Negative value into an unsigned format: clamp to zero, or NaN when propagating.
            return match (overflow, self.nan_code) {
                (Overflow::Propagate, Some(n)) => n,
                _ => 0,
            };
        }
        if abs_bits == 0x7F80_0000 {
            let mag = match overflow {
                Overflow::Saturate => self.max_code,
                Overflow::Propagate => self.inf_code.or(self.nan_code).unwrap_or(self.max_code),
            };
            return mag | sign;
        }
        if abs_bits == 0 {
            return sign;
        }
        let exp_field = (abs_bits >> 23) as i32;
        let man = abs_bits & 0x7F_FFFF;
        // |x| = sig * 2^(ea - 23)
        let (sig, ea) = if exp_field == 0 {
            (man, -126)
        } else {
            (man | 0x80_0000, exp_field - 127)
        };
        let floor_log2 = if exp_field == 0 { i32::MIN } else { ea };
        let e = if floor_log2 > self.emin {
            floor_log2
        } else {
            self.emin
        };
        // Number of significand bits below the target quantum 2^(e - mbits); at least 1 here.
        let shift = (e - ea + 23 - self.mbits as i32).clamp(1, 50) as u32;
        let sig = sig as u64;
        let kept = sig >> shift;
        let rem = sig & ((1u64 << shift) - 1);
        let up = round_up(kept, rem, shift, neg, rounding);
        let n = kept + up as u64;
        let mag = (((e - self.emin) as u64) << self.mbits) + n;
        if mag > self.max_code as u64 {
            return self.overflow(neg, rounding, overflow) | sign;
        }
        mag as u16 | sign
    }

    #[inline]
    fn encode_nan(&self, neg: bool) -> u16 {
        match self.nan_code {
            Some(n) => n | if neg { self.sign_bit } else { 0 },
            // No NaN in the format: hardware satfinite gives +max (docs/numerics.md#saturation-and-special-values).
            None => self.max_code,
        }
    }

    #[inline]
    fn overflow(&self, neg: bool, rounding: Rounding, overflow: Overflow) -> u16 {
        match overflow {
            Overflow::Saturate => self.max_code,
            Overflow::Propagate => {
                let toward_finite = match rounding {
                    Rounding::TowardZero => true,
                    Rounding::TowardNegative => !neg,
                    Rounding::TowardPositive => neg,
                    Rounding::NearestEven | Rounding::Stochastic(_) => false,
                };
                if toward_finite {
                    self.max_code
                } else {
                    self.inf_code.or(self.nan_code).unwrap_or(self.max_code)
                }
            }
        }
    }
}

/// Decides whether the truncated significand `kept` (with `shift` discarded bits `rem`)
/// rounds up in magnitude.
#[inline(always)]
pub(crate) fn round_up(kept: u64, rem: u64, shift: u32, neg: bool, rounding: Rounding) -> bool {
    match rounding {
        Rounding::NearestEven => {
            let half = 1u64 << (shift - 1);
            rem > half || (rem == half && kept & 1 == 1)
        }
        Rounding::TowardZero => false,
        Rounding::TowardPositive => rem != 0 && !neg,
        Rounding::TowardNegative => rem != 0 && neg,
        Rounding::Stochastic(r) => {
            // floor(256 * f): the top 8 of the discarded bits.
            let k = if shift >= 8 {
                rem >> (shift - 8)
            } else {
                rem << (8 - shift)
            };
            r as u64 + k >= 256
        }
    }
}

/// `n * 2^e` as an f32, exact for the small values used by the formats in this crate
/// (including f32 subnormals such as E8M0's 2^-127).
pub(crate) const fn pow2_times(n: u32, e: i32) -> f32 {
    if n == 0 {
        return 0.0;
    }
    // Normalise n to 24 significant bits: n * 2^e = sig * 2^(exp - 23).
    let lz = n.leading_zeros() as i32; // n < 2^24 for every caller
    let msb = 31 - lz;
    let exp = e + msb;
    let sig = if msb <= 23 {
        n << (23 - msb)
    } else {
        n >> (msb - 23)
    };
    if exp >= -126 {
        f32::from_bits((((exp + 127) as u32) << 23) | (sig & 0x7F_FFFF))
    } else {
        // f32 subnormal: shift the 24-bit significand right; exact for our callers.
        f32::from_bits(sig >> (-126 - exp))
    }
}

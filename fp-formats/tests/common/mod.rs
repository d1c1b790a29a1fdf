//! Shared helpers for the integration tests: a uniform view of every format (the byte
//! formats through `ElementFormat`, BF16/F16 through the free functions) and a
//! search-based oracle encoder that is independent of the crate's bit-level encoder.
#![allow(dead_code)]

use fp_formats::{
    bf16, bf16_from_f32, f16, f16_from_f32, ElementFormat, Overflow, Rounding, E2M1, E2M3, E3M2,
    E4M3, E5M2, E8M0, UE4M3,
};

/// One format as the tests see it: codes widened to `u16`.
#[derive(Clone, Copy)]
pub struct Format {
    pub name: &'static str,
    /// Width of a code (4, 6, 8 or 16); codes are `0..1 << code_bits`.
    pub code_bits: u32,
    /// The sign bit, or 0 for the unsigned formats (UE4M3, E8M0).
    pub sign_bit: u16,
    pub encode: fn(f32, Rounding, Overflow) -> u16,
    pub decode: fn(u16) -> f32,
}

impl Format {
    pub fn n_codes(&self) -> u32 {
        1 << self.code_bits
    }
    pub fn signed(&self) -> bool {
        self.sign_bit != 0
    }
}

impl std::fmt::Debug for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

fn enc<F: ElementFormat>(x: f32, r: Rounding, o: Overflow) -> u16 {
    F::from_f32(x, r, o).to_bits() as u16
}

fn dec<F: ElementFormat>(c: u16) -> f32 {
    F::from_bits(c as u8).to_f32()
}

fn enc_bf16(x: f32, r: Rounding, o: Overflow) -> u16 {
    bf16_from_f32(x, r, o).to_bits()
}

fn dec_bf16(c: u16) -> f32 {
    bf16::from_bits(c).to_f32()
}

fn enc_f16(x: f32, r: Rounding, o: Overflow) -> u16 {
    f16_from_f32(x, r, o).to_bits()
}

fn dec_f16(c: u16) -> f32 {
    f16::from_bits(c).to_f32()
}

macro_rules! byte_format {
    ($t:ty, $sign:expr) => {
        Format {
            name: <$t as ElementFormat>::NAME,
            code_bits: <$t as ElementFormat>::BITS,
            sign_bit: $sign,
            encode: enc::<$t>,
            decode: dec::<$t>,
        }
    };
}

/// Every format, in the order of the golden tables.
pub const FORMATS: [Format; 9] = [
    byte_format!(E2M1, 0x8),
    byte_format!(E2M3, 0x20),
    byte_format!(E3M2, 0x20),
    byte_format!(E4M3, 0x80),
    byte_format!(UE4M3, 0),
    byte_format!(E5M2, 0x80),
    byte_format!(E8M0, 0),
    Format {
        name: "bf16",
        code_bits: 16,
        sign_bit: 0x8000,
        encode: enc_bf16,
        decode: dec_bf16,
    },
    Format {
        name: "f16",
        code_bits: 16,
        sign_bit: 0x8000,
        encode: enc_f16,
        decode: dec_f16,
    },
];

pub fn format(name: &str) -> Format {
    *FORMATS
        .iter()
        .find(|f| f.name == name)
        .expect("unknown format")
}

/// The modes exercised by the sweeps: the four deterministic ones and SR with a few bytes.
pub const MODES: [Rounding; 10] = [
    Rounding::NearestEven,
    Rounding::TowardZero,
    Rounding::TowardPositive,
    Rounding::TowardNegative,
    Rounding::Stochastic(0),
    Rounding::Stochastic(1),
    Rounding::Stochastic(127),
    Rounding::Stochastic(128),
    Rounding::Stochastic(200),
    Rounding::Stochastic(255),
];

pub const POLICIES: [Overflow; 2] = [Overflow::Saturate, Overflow::Propagate];

/// The non-negative finite values of a format (decoded by the crate, sorted by code and
/// checked to increase), with their codes, plus the first step of the grid above max.
pub struct Grid {
    pub vals: Vec<f64>,
    pub codes: Vec<u16>,
    /// The next grid point above max (where overflow starts).
    pub ovf: f64,
    /// Magnitude code an overflow produces under `Propagate` (Inf, else NaN, else max).
    pub ovf_code: u16,
    /// Canonical positive NaN code, if any.
    pub nan_code: Option<u16>,
}

impl Grid {
    pub fn new(f: &Format) -> Self {
        // Magnitude codes: below the sign bit, UE4M3 below 0x80 (higher codes alias),
        // E8M0 all codes.
        let n_mag = if f.signed() {
            f.sign_bit as u32
        } else if f.name == "ue4m3" {
            0x80
        } else {
            f.n_codes()
        };
        let mut vals = Vec::new();
        let mut codes = Vec::new();
        let mut inf_code = None;
        let mut nan_code = None;
        for c in 0..n_mag {
            let v = (f.decode)(c as u16);
            if v.is_finite() {
                vals.push(v as f64);
                codes.push(c as u16);
            } else if v.is_infinite() {
                inf_code.get_or_insert(c as u16);
            } else {
                nan_code.get_or_insert(c as u16);
            }
        }
        assert!(
            vals.windows(2).all(|w| w[0] < w[1]),
            "{}: values not increasing",
            f.name
        );
        let n = vals.len();
        let max = vals[n - 1];
        let ovf = if f.name == "e8m0" {
            2.0 * max
        } else {
            max + (max - vals[n - 2])
        };
        // Canonical NaN: what the encoder produces for a NaN input.
        let nan_code =
            nan_code.map(|_| (f.encode)(f32::NAN, Rounding::NearestEven, Overflow::Saturate));
        let ovf_code = inf_code.or(nan_code).unwrap_or(codes[n - 1]);
        Grid {
            vals,
            codes,
            ovf,
            ovf_code,
            nan_code,
        }
    }

    pub fn max(&self) -> f64 {
        *self.vals.last().unwrap()
    }

    pub fn max_code(&self) -> u16 {
        *self.codes.last().unwrap()
    }

    /// Smallest positive value.
    pub fn min_positive(&self) -> f64 {
        if self.vals[0] == 0.0 {
            self.vals[1]
        } else {
            self.vals[0]
        }
    }

    /// `(lo, hi)` indices with `vals[lo] <= a < vals[hi]`, `hi == vals.len()` meaning the
    /// overflow step; `lo == hi` when `a` is representable. `None` when `a >= ovf` or
    /// `a` is below the smallest value (E8M0 only).
    pub fn neighbours(&self, a: f64) -> Option<(usize, usize)> {
        if a >= self.ovf || a < self.vals[0] {
            return None;
        }
        let lo = self.vals.partition_point(|&v| v <= a) - 1;
        if self.vals[lo] == a {
            Some((lo, lo))
        } else {
            Some((lo, lo + 1))
        }
    }

    pub fn value(&self, i: usize) -> f64 {
        if i == self.vals.len() {
            self.ovf
        } else {
            self.vals[i]
        }
    }
}

/// Reference encoder: search the value set for the neighbours of |x| and apply the mode's
/// definition in exact f64 arithmetic (every quantity involved has < 53 significant bits).
/// Policies without an independent definition (NaN, Inf, unsigned formats) follow the
/// crate's documentation, exactly as the Python table generator does.
pub fn oracle(f: &Format, g: &Grid, x: f32, mode: Rounding, ovf: Overflow) -> u16 {
    let bits = x.to_bits();
    let mut neg = bits >> 31 != 0;
    let sat = ovf == Overflow::Saturate;
    if x.is_nan() {
        return match g.nan_code {
            Some(n) => n | if neg { f.sign_bit } else { 0 },
            None => g.max_code(),
        };
    }
    if f.name == "e8m0" && (neg || x == 0.0) {
        return g.nan_code.unwrap();
    }
    if f.name == "ue4m3" {
        if neg && x != 0.0 {
            return if sat { 0 } else { g.nan_code.unwrap() };
        }
        neg = false;
    }
    let sign = if neg { f.sign_bit } else { 0 };
    if x.is_infinite() {
        return if sat { g.max_code() } else { g.ovf_code } | sign;
    }
    let a = x.abs() as f64;
    let n = g.vals.len();
    let j = if a >= g.ovf {
        n
    } else if a < g.vals[0] {
        return g.codes[0]; // E8M0 below 2^-127
    } else {
        let (lo, hi) = g.neighbours(a).unwrap();
        if lo == hi {
            lo
        } else {
            match mode {
                Rounding::TowardZero => lo,
                Rounding::TowardPositive => {
                    if neg {
                        lo
                    } else {
                        hi
                    }
                }
                Rounding::TowardNegative => {
                    if neg {
                        hi
                    } else {
                        lo
                    }
                }
                Rounding::Stochastic(r) => {
                    let (vl, vh) = (g.value(lo), g.value(hi));
                    let k = (256.0 * (a - vl) / (vh - vl)).floor() as u32;
                    if r as u32 + k >= 256 {
                        hi
                    } else {
                        lo
                    }
                }
                Rounding::NearestEven => {
                    let (dl, dh) = (a - g.value(lo), g.value(hi) - a);
                    if dl < dh {
                        lo
                    } else if dh < dl || f.name == "e8m0" || g.codes[lo] % 2 == 1 {
                        hi
                    } else {
                        lo
                    }
                }
            }
        }
    };
    let code = if j == n {
        let toward_finite = match mode {
            Rounding::TowardZero => true,
            Rounding::TowardNegative => !neg,
            Rounding::TowardPositive => neg,
            _ => false,
        };
        if sat || toward_finite {
            g.max_code()
        } else {
            g.ovf_code
        }
    } else {
        g.codes[j]
    };
    code | sign
}

/// Runs `f(lo, hi)` over `0..n` split into `threads` contiguous chunks on scoped threads
/// and returns the per-chunk results.
pub fn par_chunks<T: Send>(n: u64, f: impl Fn(u64, u64) -> T + Sync) -> Vec<T> {
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, 8) as u64;
    let chunk = n.div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let f = &f;
                s.spawn(move || f(t * chunk, ((t + 1) * chunk).min(n)))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// The oracle's encoding as a step function of the magnitude bit pattern, for one mode,
/// policy and sign: `codes[i]` holds for `starts[i] <= abs < starts[i + 1]` over the finite
/// non-zero range `1..0x7F80_0000` (zero, Inf and NaN are left to the oracle itself). The
/// oracle is monotone in |x| there, so every change point is found by binary search.
pub struct Step {
    pub starts: Vec<u32>,
    pub codes: Vec<u16>,
}

impl Step {
    pub fn new(f: &Format, g: &Grid, mode: Rounding, ovf: Overflow, neg: bool) -> Self {
        let sign = if neg { 0x8000_0000 } else { 0 };
        let at = |abs: u32| oracle(f, g, f32::from_bits(abs | sign), mode, ovf);
        // Compare magnitudes only: strip the sign bit of the code.
        let key = |abs: u32| at(abs) & !f.sign_bit;
        const END: u32 = 0x7F80_0000;
        let mut starts = vec![1u32];
        let mut codes = vec![at(1)];
        let mut cur = 1u32;
        while cur < END {
            let k = key(cur);
            // Smallest abs in (cur, END) whose key differs (END if none).
            let (mut lo, mut hi) = (cur, END);
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                if key(mid) == k {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            if hi == END {
                break;
            }
            assert!(key(hi) > k, "{}: oracle not monotone at 0x{hi:08x}", f.name);
            starts.push(hi);
            codes.push(at(hi));
            cur = hi;
        }
        Step { starts, codes }
    }

    /// Index of the piece containing `abs` (which must be in `1..0x7F80_0000`).
    pub fn index(&self, abs: u32) -> usize {
        self.starts.partition_point(|&s| s <= abs) - 1
    }
}

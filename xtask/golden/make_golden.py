#!/usr/bin/env python3
"""Generate the golden tables checked by fp-formats/tests/golden.rs.

Run through `cargo xtask golden` (which pins the interpreter environment), or directly:

    python xtask/golden/make_golden.py --out fp-formats/tests/data

Requires exactly the versions pinned in xtask/golden/requirements.txt (ml_dtypes 0.6.0,
numpy 2.4.6). The output is a pure function of those versions and this file: every random
input comes from a SplitMix64 stream with a fixed per-format seed (no numpy RNG), so
`cargo xtask golden --check` can regenerate and compare byte for byte.

Two independent references produce the expected codes:

* ml_dtypes' own cast (`np.float32 -> ml_dtypes type`, numpy's cast for f16) gives the
  round-to-nearest-even columns: as-is for `Overflow::Propagate`, and after clipping finite
  inputs to +-max (Inf -> +-max) for `Overflow::Saturate`.
* The directed (RZ/RU/RD) and stochastic columns come from a separate method that only
  uses ml_dtypes' *value set*: all representable values are decoded with ml_dtypes, the two
  neighbours of |x| are found by search with exact rational arithmetic (fractions.Fraction),
  and the rounding mode's definition is applied. The same method also recomputes RNE and is
  asserted to agree with ml_dtypes' cast on every input, which cross-validates both.

The file layout is documented in the README.md this script writes next to the tables.
"""

from __future__ import annotations

import argparse
import bisect
import math
import os
import struct
import sys
from fractions import Fraction

import ml_dtypes
import numpy as np

ML_DTYPES_VERSION = "0.6.0"
NUMPY_VERSION = "2.4.6"

MAGIC = b"NBGOLD01"
FIXED_RBITS = (0, 1, 127, 128, 255)
COLUMNS = (
    ["rne_prop", "rne_sat", "rz_sat", "ru_sat", "rd_sat", "rz_prop", "ru_prop", "rd_prop"]
    + [f"sr{r}_sat" for r in FIXED_RBITS]
    + ["srR_sat"]
    + [f"sr{r}_prop" for r in FIXED_RBITS]
    + ["srR_prop"]
)

# Random inputs per format: bit patterns (3/4 of them with an exponent in the format's
# range, 1/4 anywhere in the finite f32 range) and values drawn in the format's range.
N_RANDOM_BITS = {8: 2048, 16: 1024}
N_RANDOM_RANGE = {8: 1024, 16: 512}


# --------------------------------------------------------------------------------------
# Deterministic randomness (independent of numpy's generator streams).
# --------------------------------------------------------------------------------------
class SplitMix64:
    def __init__(self, seed: int):
        self.state = seed & 0xFFFFFFFFFFFFFFFF

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        return self.next() % n

    def unit(self) -> float:
        """Uniform in [0, 1) with 53 random bits."""
        return (self.next() >> 11) / float(1 << 53)


def seed_of(name: str) -> int:
    # FNV-1a of the format name: a fixed, documented seed per format.
    h = 0xCBF29CE484222325
    for b in name.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


# --------------------------------------------------------------------------------------
# f32 helpers
# --------------------------------------------------------------------------------------
def f32_bits(x) -> int:
    return int(np.array([x], dtype=np.float32).view(np.uint32)[0])


def f32_from_bits(b: int) -> np.float32:
    return np.array([b], dtype=np.uint32).view(np.float32)[0]


def exact_f32(v: float) -> np.float32:
    f = np.float32(v)
    assert float(f) == v, f"{v!r} is not exactly representable in f32"
    return f


def floor_log2(v) -> int:
    """floor(log2(v)) for a positive rational/float, exactly (no libm)."""
    return math.frexp(float(v))[1] - 1


def next_up(f: np.float32) -> np.float32:
    return np.nextafter(np.float32(f), np.float32(np.inf))


def next_down(f: np.float32) -> np.float32:
    return np.nextafter(np.float32(f), np.float32(-np.inf))


# --------------------------------------------------------------------------------------
# Formats
# --------------------------------------------------------------------------------------
class Fmt:
    def __init__(self, name, dtype, code_bits, sign_bit, has_inf, has_nan, nan_code,
                 inf_code=None, derived=None):
        self.name = name
        self.dtype = dtype  # numpy/ml_dtypes scalar type, None when derived
        self.code_bits = code_bits
        self.code_bytes = 1 if code_bits <= 8 else 2
        self.sign_bit = sign_bit  # 0 for unsigned formats
        self.has_inf = has_inf
        self.has_nan = has_nan
        self.nan_code = nan_code  # canonical positive NaN code (None if no NaN)
        self.inf_code = inf_code
        self.derived = derived  # "ue4m3" rules applied on top of e4m3

    @property
    def signed(self):
        return self.sign_bit != 0

    @property
    def storage(self):
        return np.uint8 if self.code_bytes == 1 else np.uint16


E4M3 = Fmt("e4m3", ml_dtypes.float8_e4m3fn, 8, 0x80, False, True, 0x7F)
FORMATS = [
    Fmt("e2m1", ml_dtypes.float4_e2m1fn, 4, 0x8, False, False, None),
    Fmt("e2m3", ml_dtypes.float6_e2m3fn, 6, 0x20, False, False, None),
    Fmt("e3m2", ml_dtypes.float6_e3m2fn, 6, 0x20, False, False, None),
    E4M3,
    Fmt("ue4m3", None, 8, 0, False, True, 0x7F, derived="ue4m3"),
    Fmt("e5m2", ml_dtypes.float8_e5m2, 8, 0x80, True, True, 0x7E, inf_code=0x7C),
    Fmt("e8m0", ml_dtypes.float8_e8m0fnu, 8, 0, False, True, 0xFF),
    Fmt("bf16", ml_dtypes.bfloat16, 16, 0x8000, True, True, 0x7FC0, inf_code=0x7F80),
    Fmt("f16", np.float16, 16, 0x8000, True, True, 0x7E00, inf_code=0x7C00),
]


def ml_decode_codes(fmt: Fmt, codes: np.ndarray) -> np.ndarray:
    """f32 bit patterns of the given codes, decoded by ml_dtypes (numpy for f16)."""
    if fmt.derived == "ue4m3":
        # UE4M3: E4M3 with the sign bit ignored on decode.
        return ml_decode_codes(E4M3, codes & 0x7F)
    raw = np.asarray(codes, dtype=fmt.storage).view(fmt.dtype)
    return raw.astype(np.float32).view(np.uint32)


def ml_cast(fmt: Fmt, xs: np.ndarray) -> np.ndarray:
    """ml_dtypes' cast of f32 inputs, as raw codes (RNE, ml_dtypes overflow semantics)."""
    xs = np.asarray(xs, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        return xs.astype(fmt.dtype).view(fmt.storage).astype(np.int64)


class Grid:
    """The non-negative finite values of a format, decoded by ml_dtypes, with their codes."""

    def __init__(self, fmt: Fmt):
        n = 1 << fmt.code_bits
        bits = ml_decode_codes(fmt, np.arange(n, dtype=np.int64))
        self.decode_bits = [int(b) for b in bits]
        if fmt.signed:
            mag_codes = range(fmt.sign_bit)
        elif fmt.derived == "ue4m3":
            mag_codes = range(0x80)  # codes >= 0x80 alias 0x00..0x7F and are never produced
        else:
            mag_codes = range(n)
        vals, codes = [], []
        for c in mag_codes:
            v = float(f32_from_bits(self.decode_bits[c]))
            if math.isfinite(v):
                vals.append(Fraction(v))
                codes.append(c)
        # Codes must be ordered by magnitude, values strictly increasing.
        assert all(a < b for a, b in zip(vals, vals[1:])), fmt.name
        assert all(a < b for a, b in zip(codes, codes[1:])), fmt.name
        self.vals = vals
        self.codes = codes
        self.max = vals[-1]
        self.max_code = codes[-1]
        if fmt.name == "e8m0":
            self.ovf = 2 * self.max  # next power of two: the exponent grid continues
        else:
            self.ovf = self.max + (vals[-1] - vals[-2])  # next step of the top binade
        self.ext = vals + [self.ovf]  # index len(vals) is "overflowed"
        self.ovf_index = len(vals)
        if fmt.has_inf:
            self.ovf_code = fmt.inf_code
        elif fmt.has_nan:
            self.ovf_code = fmt.nan_code
        else:
            self.ovf_code = self.max_code


# --------------------------------------------------------------------------------------
# Independent reference: search on the value set, apply the mode's definition
# --------------------------------------------------------------------------------------
RNE, RZ, RU, RD, SR = "rne", "rz", "ru", "rd", "sr"


def ref_encode(fmt: Fmt, g: Grid, x: np.float32, mode: str, sat: bool, r: int = 0) -> int:
    bits = f32_bits(x)
    neg = bits >> 31 == 1
    xf = float(x)
    if math.isnan(xf):
        assert fmt.has_nan
        return fmt.nan_code | (fmt.sign_bit if neg else 0)
    if fmt.name == "e8m0" and (neg or xf == 0.0):
        return fmt.nan_code  # no sign, no zero: 0, -0 and negatives are NaN
    if fmt.derived == "ue4m3":
        if neg and xf != 0.0:
            return 0x00 if sat else fmt.nan_code  # documented unsigned policy
        neg = False  # -0.0 encodes as +0
    sign = fmt.sign_bit if neg else 0
    if math.isinf(xf):
        # Saturate: +-max. Propagate: Inf, else NaN, else max (the crate's documented
        # policy; for RNE it is also ml_dtypes' cast).
        return (g.max_code if sat else g.ovf_code) | sign
    a = Fraction(abs(xf))
    if a < g.ext[0]:
        # Only E8M0 (no zero): below 2^-127 every mode gives the smallest value 0x00
        # (documented crate policy; equals RNE, which ml_dtypes confirms).
        assert fmt.name == "e8m0"
        return g.codes[0]
    if a >= g.ovf:
        j = g.ovf_index
    else:
        lo = bisect.bisect_right(g.ext, a) - 1
        if g.ext[lo] == a:
            j = lo
        else:
            hi = lo + 1
            if mode == RZ:
                j = lo
            elif mode == RU:
                j = lo if neg else hi
            elif mode == RD:
                j = hi if neg else lo
            elif mode == SR:
                k = math.floor(256 * (a - g.ext[lo]) / (g.ext[hi] - g.ext[lo]))
                j = hi if r + k >= 256 else lo
            elif mode == RNE:
                dlo, dhi = a - g.ext[lo], g.ext[hi] - a
                if dlo != dhi:
                    j = lo if dlo < dhi else hi
                elif fmt.name == "e8m0":
                    j = hi  # no mantissa bits: ties round up (ml_dtypes, crate)
                else:
                    code_lo = g.codes[lo]
                    j = lo if code_lo % 2 == 0 else hi  # even last mantissa bit
            else:
                raise ValueError(mode)
    if j == g.ovf_index:
        if sat:
            code = g.max_code
        else:
            toward_finite = mode == RZ or (mode == RD and not neg) or (mode == RU and neg)
            code = g.max_code if toward_finite else g.ovf_code
    else:
        code = g.codes[j]
    return code | sign


def known_ml_dtypes_deviation(fmt: Fmt, x: np.float32, ml: int, ref: int) -> bool:
    """The one place where ml_dtypes 0.6.0's cast is not round-to-nearest.

    float8_e8m0fnu maps every f32 in the open interval (2^-127, 1.5 * 2^-127) (f32
    subnormals 0x00400001..0x005FFFFF) to 0x01 = 2^-126, although 2^-127 (0x00) is nearer
    (e.g. 0x00400001 = 2^-127 (1 + 2^-22)). Above 2^-126 it rounds to nearest correctly.
    There the RNE columns use the search-based reference (0x00) instead."""
    b = f32_bits(x)
    return fmt.name == "e8m0" and 0x00400001 <= b <= 0x005FFFFF and ml == 0x01 and ref == 0x00


# --------------------------------------------------------------------------------------
# ml_dtypes columns (RNE)
# --------------------------------------------------------------------------------------
def ml_rne(fmt: Fmt, g: Grid, xs: np.ndarray, sat: bool) -> np.ndarray:
    xs = np.asarray(xs, dtype=np.float32)
    if sat:
        m = np.float32(float(g.max))
        # Finite inputs clipped to +-max, +-Inf -> +-max, NaN stays NaN.
        xs = np.where(np.isnan(xs), xs, np.clip(xs, -m, m)).astype(np.float32)
    if fmt.derived == "ue4m3":
        base = ml_rne(E4M3, Grid(E4M3), xs, sat)
        bits = xs.view(np.uint32)
        out = np.empty(len(xs), dtype=np.int64)
        for i, (x, b, c) in enumerate(zip(xs, bits, base)):
            if np.isnan(x):
                out[i] = 0x7F
            elif b >> 31 and x != 0:
                out[i] = 0x00 if sat else 0x7F
            else:
                out[i] = c & 0x7F
        return out
    return ml_cast(fmt, xs)


# --------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------
def structured_inputs(fmt: Fmt, g: Grid) -> list[np.float32]:
    """Every code's value, every midpoint, their f32 neighbours, boundaries, specials.

    For the 16-bit formats only a subset of codes is used (see README)."""
    n = len(g.vals)
    if fmt.code_bits <= 8:
        idx = list(range(n))
    else:
        one = g.vals.index(Fraction(1))
        min_normal = {"bf16": 0x80, "f16": 0x400}[fmt.name]  # first code with exponent field 1
        sel = set(range(0, 24))
        sel |= set(range(min_normal - 12, min_normal + 12))
        sel |= set(range(one - 12, one + 12))
        sel |= set(range(n - 24, n))
        sel |= set(range(0, n, 509))
        idx = sorted(i for i in sel if 0 <= i < n)
    pos = []
    for i in idx:
        v = exact_f32(float(g.vals[i]))
        pos += [v, next_up(v), next_down(v)]
        hi = g.vals[i + 1] if i + 1 < n else g.ovf
        m = exact_f32(float((g.vals[i] + hi) / 2))
        pos += [m, next_up(m), next_down(m)]
    ovf = np.float32(float(g.ovf)) if g.ovf < 2**128 else np.float32(np.finfo(np.float32).max)
    min_sub = g.vals[1] if g.vals[0] == 0 else g.vals[0]
    ms = exact_f32(float(min_sub))
    pos += [ovf, next_up(ovf), next_down(ovf), np.float32(2 * float(ovf))]
    pos += [exact_f32(float(min_sub / 2)), exact_f32(float(min_sub / 4)), next_down(ms / 2),
            next_up(ms / 2)]
    pos += [f32_from_bits(0x00000001), f32_from_bits(0x00800000), f32_from_bits(0x007FFFFF),
            f32_from_bits(0x7F7FFFFF), np.float32(1.0), np.float32(np.inf)]
    out = []
    for k, v in enumerate(pos):
        out.append(np.float32(v))
        # Unsigned formats treat every negative input alike: keep a sample of them.
        if fmt.signed or k % 8 == 0:
            out.append(np.float32(-v))
    out += [np.float32(0.0), np.float32(-0.0), np.float32(-np.inf), np.float32(-1.0)]
    if fmt.has_nan:
        out += [f32_from_bits(0x7FC00000), f32_from_bits(0xFFC00000)]
        if fmt.code_bits <= 8:
            # Other payloads, including signalling NaNs (ml_dtypes: canonical NaN code).
            out += [f32_from_bits(0x7F800001), f32_from_bits(0xFFBFFFFF)]
    return out


def random_inputs(fmt: Fmt, g: Grid, rng: SplitMix64) -> list[np.float32]:
    n_bits = N_RANDOM_BITS[max(8, fmt.code_bits)]
    n_range = N_RANDOM_RANGE[max(8, fmt.code_bits)]
    min_sub = g.vals[1] if g.vals[0] == 0 else g.vals[0]
    e_lo = max(0, 127 + floor_log2(min_sub) - 4)
    e_hi = min(254, 127 + floor_log2(g.ovf) + 4)
    out = []
    for i in range(n_bits):
        sign = rng.below(2)
        if i % 4 == 3:
            exp = rng.below(255)  # anywhere in the finite f32 range
        else:
            exp = e_lo + rng.below(e_hi - e_lo + 1)
        man = rng.below(1 << 23)
        out.append(f32_from_bits((sign << 31) | (exp << 23) | man))
    maxf = float(g.max)
    for i in range(n_range):
        if fmt.name == "e8m0":
            # log-uniform over [2^-127, 2^128): random exponent and 23-bit mantissa, exact
            # in float64 (no libm), then rounded to f32 (only f32 subnormals round)
            e = -127 + rng.below(255)
            v = math.ldexp(1 + rng.below(1 << 23) / (1 << 23), e)
            out.append(np.float32(v))
        else:
            v = (2 * rng.unit() - 1) * maxf
            out.append(np.float32(v))
    return out


# --------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------
def decode_runs(bits: list[int]) -> list[tuple[int, int, int, int]]:
    """Run-length form: code start..start+len decodes to first + (code-start)*delta (mod 2^32)."""
    runs = []
    i, n = 0, len(bits)
    while i < n:
        if i + 1 == n:
            runs.append((i, 1, bits[i], 0))
            break
        delta = (bits[i + 1] - bits[i]) & 0xFFFFFFFF
        j = i + 1
        while j + 1 < n and (bits[j + 1] - bits[j]) & 0xFFFFFFFF == delta:
            j += 1
        runs.append((i, j - i + 1, bits[i], delta))
        i = j + 1
    # Self-check the expansion.
    exp = []
    for start, length, first, delta in runs:
        exp += [(first + k * delta) & 0xFFFFFFFF for k in range(length)]
    assert exp == bits
    return runs


def build(fmt: Fmt):
    np.seterr(over="ignore", invalid="ignore")
    g = Grid(fmt)
    rng = SplitMix64(seed_of(fmt.name))
    xs_all = structured_inputs(fmt, g) + random_inputs(fmt, g, rng)
    seen, xs = set(), []
    for x in xs_all:
        b = f32_bits(x)
        if math.isnan(float(x)) and not fmt.has_nan:
            continue  # ml_dtypes' NaN handling for NaN-less formats is undefined
        if b not in seen:
            seen.add(b)
            xs.append(x)
    xs_arr = np.array(xs, dtype=np.float32)
    r_rand = [rng.below(256) for _ in xs]

    rne_prop = ml_rne(fmt, g, xs_arr, sat=False)
    rne_sat = ml_rne(fmt, g, xs_arr, sat=True)
    rows = []
    overrides = 0
    for i, x in enumerate(xs):
        # Cross-validate the search-based reference against ml_dtypes' cast.
        for sat, ml in ((False, rne_prop), (True, rne_sat)):
            ref = ref_encode(fmt, g, x, RNE, sat)
            if ref == ml[i]:
                continue
            if known_ml_dtypes_deviation(fmt, x, int(ml[i]), ref):
                ml[i] = ref
                overrides += 1
                continue
            sys.exit(f"{fmt.name}: x={float(x)!r} (0x{f32_bits(x):08x}) sat={sat}: "
                     f"ml_dtypes 0x{int(ml[i]):x} != reference 0x{ref:x}")
        cols = [int(rne_prop[i]), int(rne_sat[i])]
        for sat in (True, False):
            cols += [ref_encode(fmt, g, x, m, sat) for m in (RZ, RU, RD)]
        for sat in (True, False):
            cols += [ref_encode(fmt, g, x, SR, sat, r) for r in FIXED_RBITS + (r_rand[i],)]
        assert len(cols) == len(COLUMNS)
        rows.append((f32_bits(x), r_rand[i], cols))

    out = bytearray()
    out += MAGIC
    out += fmt.name.encode().ljust(8, b"\0")
    out += bytes([fmt.code_bits, fmt.code_bytes, len(COLUMNS), len(FIXED_RBITS)])
    out += bytes(FIXED_RBITS)
    runs = decode_runs(g.decode_bits)
    out += struct.pack("<II", 1 << fmt.code_bits, len(runs))
    for run in runs:
        out += struct.pack("<IIII", *run)
    out += struct.pack("<I", len(rows))
    code_fmt = "<" + ("B" if fmt.code_bytes == 1 else "H") * len(COLUMNS)
    for xb, r, cols in rows:
        out += struct.pack("<IB", xb, r)
        out += struct.pack(code_fmt, *cols)
    stats = {"entries": len(rows), "runs": len(runs), "bytes": len(out), "overrides": overrides}
    return bytes(out), stats


README_HEAD = """\
# fp-formats golden tables

**Generated file: do not edit.** Produced by `xtask/golden/make_golden.py` with
ml_dtypes {mld} and numpy {np} (pinned in `xtask/golden/requirements.txt`), via
`cargo xtask golden`. `cargo xtask golden --check` regenerates the tables into a temporary
directory and fails if any byte differs. Checked entry by entry by
`fp-formats/tests/golden.rs` (which embeds the files with `include_bytes!`); CI needs no
Python.

## Files

One little-endian binary file per format:

| file | format | code bits | code bytes | decode runs | encode entries | overridden RNE cells | bytes |
| --- | --- | --- | --- | --- | --- | --- | --- |
"""

README_BODY = """
Layout of every file:

```
magic      8 bytes  "NBGOLD01"
name       8 bytes  ASCII, NUL padded
code_bits  u8       4, 6, 8 or 16
code_bytes u8       1 or 2 (width of each code below)
n_cols     u8       {ncols}
n_rbits    u8       {nrbits}, followed by that many bytes: the fixed SR random bits {rbits}
n_codes    u32      2^code_bits
n_runs     u32      decode table in run-length form:
runs       n_runs x (start u32, len u32, first u32, delta u32): code start+k (k < len)
                    decodes to the f32 with bits first + k*delta (mod 2^32)
n_entries  u32
entries    n_entries x (x u32 = f32 bits of the input, r u8 = a random SR byte,
                        n_cols codes of code_bytes each)
```

Columns, in order (`sat` = `Overflow::Saturate`, `prop` = `Overflow::Propagate`):

| # | column | mode | source |
| --- | --- | --- | --- |
| 0 | rne_prop | NearestEven, Propagate | ml_dtypes cast of x |
| 1 | rne_sat | NearestEven, Saturate | ml_dtypes cast of x clipped to +-max (Inf -> +-max) |
| 2-4 | rz_sat, ru_sat, rd_sat | TowardZero / TowardPositive / TowardNegative, Saturate | value-set search |
| 5-7 | rz_prop, ru_prop, rd_prop | same, Propagate | value-set search |
| 8-13 | sr0_sat ... sr255_sat, srR_sat | Stochastic(r) for r = {rbits} and r = the entry's byte, Saturate | value-set search |
| 14-19 | sr0_prop ... srR_prop | same, Propagate | value-set search |

## How the expected codes were computed

* **Decode**: every code of the format converted to f32 by ml_dtypes (numpy for f16). The
  test compares bits exactly, except that for NaN codes it only requires a NaN with the
  same sign bit (ml_dtypes/numpy keep NaN payloads and signalling bits; the crate's LUT and
  `half` return quiet NaNs).
* **RNE columns (0, 1)** are **ml_dtypes' cast** (`np.float32` array `.astype(dtype)`),
  i.e. ml_dtypes semantics = our `Overflow::Propagate`: ml_dtypes is non-saturating for
  e4m3 (|x| > 464 and +-Inf -> NaN 0x7F/0xFF), e5m2, bf16 and f16 (overflow -> Inf) and
  e8m0 (overflow -> NaN 0xFF); it saturates for e2m1, e2m3, e3m2 (no Inf/NaN; Inf -> +-max).
  The Saturate column casts `clip(x, -max, max)` instead (Inf -> +-max, NaN stays NaN).
* **Directed and stochastic columns (2-19) are not ml_dtypes casts.** They are derived
  from **ml_dtypes' value set**: every code is decoded with ml_dtypes, the non-negative
  finite values are sorted, the neighbours lo <= |x| < hi are found by binary search with
  exact rational arithmetic (`fractions.Fraction`), and the mode's definition is applied:
  RZ -> lo; RU -> hi for x > 0, lo for x < 0; RD the mirror image; SR(r) -> hi iff
  r + floor(256 (|x| - lo) / (hi - lo)) >= 256 (exact). Above max the grid continues with
  one more step (e2m1 8, e2m3 8, e3m2 32, e4m3 480, e5m2 65536, e8m0 2^128, bf16 2^128,
  f16 65536) and any result there, or any |x| at or beyond it, overflows: Saturate -> +-max;
  Propagate -> +-max for the modes that round toward zero for the sign (RZ, RD for x > 0,
  RU for x < 0, as in IEEE 754), otherwise Inf where the format has it, else NaN, else max.
  The same search also recomputes RNE (ties to the even code; e8m0 ties up) and the
  generator aborts unless it agrees with ml_dtypes' cast on every entry, with one known
  exception (the "overridden RNE cells" column above counts the affected cells of
  columns 0 and 1): ml_dtypes 0.6.0 casts every f32 in
  (2^-127, 1.5 * 2^-127) (f32 subnormals 0x00400001..0x005FFFFF) to e8m0 0x01 = 2^-126,
  although 0x00 = 2^-127 is nearer (it rounds to nearest correctly from 2^-126 up). For
  those inputs the RNE columns hold the nearest value 0x00, which the crate produces.
* Policies that no independent source defines are taken from the crate's documentation
  (`fp-formats/src/formats.rs`) and applied identically in every column:
  * **NaN inputs**: formats with NaN (e4m3, ue4m3, e5m2, e8m0, bf16, f16) map NaN to their
    canonical NaN with the input's sign (ml_dtypes agrees for the payloads used). Formats
    **without NaN (e2m1, e2m3, e3m2) have no NaN entries**: ml_dtypes' result there is
    undefined (it returns -0); the crate's +max rule is asserted in `tests/spec_vectors.rs`.
  * **+-Inf** under Propagate -> Inf, else NaN, else +-max in every mode (Saturate: +-max).
  * **e8m0**: 0, -0, negatives and -Inf -> NaN 0xFF in every mode; 0 < x < 2^-127 -> 0x00
    (2^-127) in every mode (no zero exists).
  * **ue4m3** is derived from e4m3 (ml_dtypes has no unsigned E4M3): the sign bit is ignored
    on decode (code c decodes as c & 0x7F); on encode -0.0 -> 0x00, NaN -> 0x7F, negative
    non-zero inputs (including -Inf) -> 0x00 under Saturate and NaN 0x7F under Propagate,
    in every mode; non-negative inputs give the e4m3 code.
  * **f16** uses numpy's float16 cast (ml_dtypes has no binary16 type of its own).

## Inputs (per format, duplicates removed)

* structured: every non-negative finite code's value, the midpoint to the next value
  (including max -> next grid step), each with its f32 neighbours (nextafter up/down);
  next grid step after max and its neighbours, twice it, half and a quarter of the minimum
  subnormal (and neighbours), f32 min subnormal/min normal/max subnormal/max, 1, +-Inf,
  +-0, NaNs; negated copies of all of them (unsigned formats: every 8th);
  for bf16/f16 only codes 0-23, +-12 codes around the smallest normal and 1.0, the top 24,
  and every 509th code;
* random: {nbits8} (bf16/f16: {nbits16}) f32 bit patterns from SplitMix64 seeded with the
  FNV-1a hash of the format name, 3/4 with an exponent from 4 binades below the minimum
  subnormal to 4 binades above the overflow step and 1/4 anywhere in the finite range,
  plus {nrange8} ({nrange16}) values uniform in [-max, max] (e8m0: log-uniform in
  [2^-127, 2^128)); the per-entry SR byte comes from the same stream.
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output directory")
    args = ap.parse_args()
    if ml_dtypes.__version__ != ML_DTYPES_VERSION or np.__version__ != NUMPY_VERSION:
        sys.exit(f"need ml_dtypes=={ML_DTYPES_VERSION} numpy=={NUMPY_VERSION}, found "
                 f"ml_dtypes=={ml_dtypes.__version__} numpy=={np.__version__}")
    os.makedirs(args.out, exist_ok=True)
    lines = []
    total = 0
    for fmt in FORMATS:
        data, st = build(fmt)
        path = os.path.join(args.out, f"{fmt.name}.bin")
        with open(path, "wb") as f:
            f.write(data)
        total += st["bytes"]
        lines.append(f"| `{fmt.name}.bin` | {fmt.name} | {fmt.code_bits} | {fmt.code_bytes} | "
                     f"{st['runs']} | {st['entries']} | {st['overrides']} | {st['bytes']} |\n")
        print(f"{fmt.name}: {st['entries']} entries, {st['runs']} decode runs, "
              f"{st['overrides']} overridden RNE cells, {st['bytes']} bytes")
    readme = README_HEAD.format(mld=ML_DTYPES_VERSION, np=NUMPY_VERSION)
    readme += "".join(lines)
    readme += f"| total | | | | | | | {total} |\n"
    readme += README_BODY.format(
        ncols=len(COLUMNS), nrbits=len(FIXED_RBITS), rbits=list(FIXED_RBITS),
        nbits8=N_RANDOM_BITS[8], nbits16=N_RANDOM_BITS[16],
        nrange8=N_RANDOM_RANGE[8], nrange16=N_RANDOM_RANGE[16])
    with open(os.path.join(args.out, "README.md"), "w", newline="\n") as f:
        f.write(readme)
    print(f"total {total} bytes")


if __name__ == "__main__":
    main()

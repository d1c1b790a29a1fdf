#!/usr/bin/env python3
"""Golden data for the quant crate's MX and per-tensor FP8 quantizers.

Writes (next to this script):
  mx_golden.bin   torchao `to_mx` (torchao.prototype.mx_formats.mx_tensor) on one
                  32x256 f32 matrix with outliers and edge blocks, for MXFP8 E4M3/E5M2,
                  MXFP6 E2M3/E3M2 and MXFP4 under ScaleCalculationMode FLOOR/RCEIL/CEIL/EVEN.
  fp8_golden.bin  a numpy + ml_dtypes transcription of Transformer Engine's per-tensor
                  current scaling (compute_scale_from_amax + satfinite RNE cast) for E4M3/E5M2,
                  power-of-two scales off/on.

Run with a venv holding torch 2.15.0, torchao 0.18.0, numpy and ml_dtypes 0.6.0:
    python quant/tests/data/make_mx_golden.py
The Rust tests (quant/tests/mx_golden.rs, quant/tests/fp8_scaling.rs) read the binaries;
CI needs no Python. See README.md in this directory for the format and for the blocks where
torchao's eager implementation deviates from the hardware/TE semantics (overridden, flagged).
"""

import os
import struct
import sys

import ml_dtypes
import numpy as np
import torch
import torchao
from torchao.prototype.mx_formats.config import ScaleCalculationMode
from torchao.prototype.mx_formats.constants import DTYPE_FP6_E2M3, DTYPE_FP6_E3M2
from torchao.prototype.mx_formats.kernels import (
    f32_to_f4_unpacked,
    f32_to_f6_e2m3_unpacked,
    f32_to_f6_e3m2_unpacked,
    unpack_uint4,
)
from torchao.prototype.mx_formats.mx_tensor import to_mx

HERE = os.path.dirname(os.path.abspath(__file__))
ROWS, COLS, BLOCK = 32, 256, 32

# (id, torch dtype, max, emax, mantissa bits)
ELEMENTS = [
    (0, "e4m3", torch.float8_e4m3fn, 448.0, 8, 3),
    (1, "e5m2", torch.float8_e5m2, 57344.0, 15, 2),
    (2, "e2m3", DTYPE_FP6_E2M3, 7.5, 2, 3),
    (3, "e3m2", DTYPE_FP6_E3M2, 28.0, 4, 2),
    (4, "e2m1", torch.float4_e2m1fn_x2, 6.0, 2, 1),
]
RULES = [
    (0, "floor", ScaleCalculationMode.FLOOR),
    (1, "rceil", ScaleCalculationMode.RCEIL),
    (2, "ceil", ScaleCalculationMode.CEIL),
    (3, "even", ScaleCalculationMode.EVEN),
]

f32 = np.float32


def bits(a):
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def from_bits(b):
    return np.asarray(b, dtype=np.uint32).view(np.float32)


# ----------------------------------------------------------------------------------------
# Input matrix
# ----------------------------------------------------------------------------------------


def make_input():
    rng = np.random.default_rng(20260830)
    x = np.zeros((ROWS, COLS), dtype=np.float32)
    blocks = [x[r, b * BLOCK:(b + 1) * BLOCK] for r in range(ROWS) for b in range(COLS // BLOCK)]
    # Rows 0-15 (128 blocks): Gaussian blocks over 40 binades, some with outliers.
    for i in range(128):
        mag = 2.0 ** rng.uniform(-20, 20)
        v = rng.standard_normal(BLOCK) * mag
        if i % 3 == 0:
            v[rng.integers(BLOCK)] *= 100.0  # outlier
        if i % 7 == 0:
            v[rng.integers(BLOCK)] = 0.0
        blocks[i][:] = v.astype(np.float32)

    def filled(amax, signed=True, frac_lo=0.0):
        v = rng.uniform(frac_lo, 1.0, BLOCK) * amax
        if signed:
            v *= rng.choice([-1.0, 1.0], BLOCK)
        v = v.astype(np.float32)
        v[rng.integers(BLOCK)] = f32(amax) * (1 if rng.random() < 0.5 else -1)
        return v

    edge = []
    edge.append(np.zeros(BLOCK, np.float32))                       # all zeros
    z = np.zeros(BLOCK, np.float32); z[5] = -0.0; edge.append(z)    # zeros and -0
    # f32-subnormal amax
    edge.append(from_bits(rng.integers(1, 0x007FFFFF, BLOCK, dtype=np.uint64).astype(np.uint32)).copy())
    edge.append(filled(from_bits(0x00000001)))                      # amax = min subnormal
    edge.append(filled(from_bits(0x00400000)))                      # amax = 2^-127
    edge.append(filled(2.0 ** -126))                                # min normal
    edge.append(filled(2.0 ** -125))
    edge.append(filled(2.0 ** -119))
    edge.append(filled(2.0 ** -118 * 1.3))
    edge.append(filled(2.0 ** -115 * 1.7))
    edge.append(filled(1e-30))
    # exact powers of two and element-max multiples (RCEIL / CEIL boundaries)
    for k in [-3, 0, 1, 5, 8, 15]:
        edge.append(filled(2.0 ** k))
    for m in [448.0, 57344.0, 7.5, 28.0, 6.0]:
        for k in [-10, 0, 3]:
            a = f32(m * 2.0 ** k)
            edge.append(filled(a))
            edge.append(filled(np.nextafter(a, f32(np.inf))))
            edge.append(filled(np.nextafter(a, f32(0))))
    # the examples of docs/numerics.md#scale-rules
    for a in [1.0, 449.0, 500.0, 7.0, 8.0, 6.0]:
        edge.append(filled(a))
    # EVEN boundaries: amax mantissa just below / at the rounding point for 1-3 mantissa bits
    for m in [1.9375, 1.9374999, 1.875, 1.8749999, 1.75, 1.7499999, 1.5]:
        edge.append(filled(m * 2.0 ** 4))
    # near FLT_MAX
    edge.append(filled(f32(3.0e38)))
    edge.append(filled(np.finfo(np.float32).max))
    # grid-point and midpoint values at scale 1 (amax 448 / 6 / 7.5 / 28 blocks)
    v = np.array([1.0625, 1.125, 1.1875, 232.0, 240.0, 448.0, 0.1, 2.0 ** -9, 2.0 ** -10,
                  1.5 * 2.0 ** -10, 3 * 2.0 ** -10, 96.0, 88.0, 44.8, 0.25, 0.75, 1.25, 1.75,
                  2.5, 3.5, 5.0, 5.5, 0.26, 6.5, 13.0, 26.0, 0.0625, 0.03125, 0.09375, 3.75,
                  7.25, 0.3], np.float32)
    edge.append(v)
    edge.append(-v[::-1].copy())
    edge.append((v / 64.0).astype(np.float32))
    # all-equal and single-value blocks
    edge.append(np.full(BLOCK, 3.0, np.float32))
    s = np.zeros(BLOCK, np.float32); s[31] = -1e-3; edge.append(s)
    # fill the remaining slots with wide-range random blocks (outliers over 2^30)
    while len(edge) < 128:
        v = (rng.standard_normal(BLOCK) * 2.0 ** rng.uniform(-30, 30, BLOCK)).astype(np.float32)
        edge.append(v)
    assert len(edge) == 128, len(edge)
    for i, v in enumerate(edge):
        blocks[128 + i][:] = v
    assert np.all(np.isfinite(x))
    return x


# ----------------------------------------------------------------------------------------
# Rule transcription (docs/numerics.md#scale-rules): used only to detect where torchao's eager code
# deviates from the hardware / Transformer Engine semantics.
# ----------------------------------------------------------------------------------------


def spec_scale(amax, rule, emax, mbits, vmax):
    b = int(bits(amax))
    if rule == "rceil":
        d = f32(amax) * (f32(1.0) / f32(vmax))
        db = int(bits(d))
        e, m = db >> 23, db & 0x7FFFFF
        r = (1 if m > 0x400000 else 0) if e == 0 else e + (1 if m else 0)
        return min(r, 254)
    if rule == "even":
        b = (b + (1 << (23 - mbits - 1))) & 0x7F800000
    e = ((b >> 23) & 0xFF) - 127
    if rule == "ceil":
        e += 1 if (b & 0x7FFFFF) else 0
    e -= emax
    return max(-127, min(127, e)) + 127


def cast_codes(y, dtype):
    """torchao's own element cast of already-scaled f32 values -> unpacked codes."""
    t = torch.from_numpy(np.ascontiguousarray(y, dtype=np.float32))
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        mx = torch.finfo(dtype).max
        return torch.clamp(t, -mx, mx).to(dtype).view(torch.uint8).numpy()
    if dtype == DTYPE_FP6_E2M3:
        return f32_to_f6_e2m3_unpacked(t).numpy()
    if dtype == DTYPE_FP6_E3M2:
        return f32_to_f6_e3m2_unpacked(t).numpy()
    return f32_to_f4_unpacked(t).numpy()


def torchao_case(x, dtype, mode):
    scale, data = to_mx(torch.from_numpy(x.copy()), dtype, BLOCK, mode)
    scales = scale.view(torch.uint8).numpy().reshape(ROWS, COLS // BLOCK).copy()
    if dtype == torch.float4_e2m1fn_x2:
        codes = unpack_uint4(data.view(torch.uint8).contiguous()).numpy().reshape(ROWS, COLS)
    elif dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        codes = data.view(torch.uint8).numpy().reshape(ROWS, COLS)
    else:
        codes = data.numpy().reshape(ROWS, COLS)
    return scales, codes.astype(np.uint8).copy()


def mx_golden(x):
    out = [b"NBMXGLD1", struct.pack("<III", ROWS, COLS, BLOCK), x.astype("<f4").tobytes()]
    cases = []
    summary = []
    for eid, ename, dtype, vmax, emax, mbits in ELEMENTS:
        for rid, rname, mode in RULES:
            scales, codes = torchao_case(x, dtype, mode)
            flags = np.zeros_like(scales)
            reasons = {}
            for r in range(ROWS):
                for b in range(COLS // BLOCK):
                    blk = x[r, b * BLOCK:(b + 1) * BLOCK]
                    amax = f32(np.max(np.abs(blk)))
                    sb = spec_scale(amax, rname, emax, mbits, vmax)
                    rcp = from_bits(np.uint32((254 - sb) << 23)) if sb != 0 else f32(2.0 ** 127)
                    if sb == 254:
                        rcp = from_bits(np.uint32(0x00400000))
                    y = (blk * rcp).astype(np.float32)
                    sc = cast_codes(y, dtype)
                    if scales[r, b] != sb or not np.array_equal(sc, codes[r, b * BLOCK:(b + 1) * BLOCK]):
                        if sb == 0 and rname != "rceil":
                            why = "b=0: torchao divides by F32_MIN_NORMAL (2^-126), not 2^-127"
                        elif sb == 0:
                            why = "b=0: torchao RCEIL fallback multiplies by 1.0, not 2^127"
                        elif scales[r, b] != sb and rname == "rceil":
                            why = "RCEIL scale: torchao eager ceil(log2(amax/max)) vs bits of fl(amax*fl(1/max))"
                        else:
                            why = "other"
                        reasons[why] = reasons.get(why, 0) + 1
                        flags[r, b] = 1
                        scales[r, b] = sb
                        codes[r, b * BLOCK:(b + 1) * BLOCK] = sc
            assert "other" not in reasons, (ename, rname, reasons)
            cases.append((eid, rid, scales, codes, flags))
            summary.append((ename, rname, int(flags.sum()), reasons))
    out.append(struct.pack("<I", len(cases)))
    for eid, rid, scales, codes, flags in cases:
        out.append(struct.pack("<BBI", eid, rid, int(flags.sum())))
        out.append(scales.tobytes())
        out.append(codes.tobytes())
        out.append(flags.astype(np.uint8).tobytes())
    return b"".join(out), summary


# ----------------------------------------------------------------------------------------
# Per-tensor FP8 current scaling (docs/numerics.md#current-scaling), numpy + ml_dtypes.
# ----------------------------------------------------------------------------------------


def te_compute_scale(amax, fp8_max, pow2):
    amax = f32(amax)
    if np.isinf(amax) or amax == 0 or np.isnan(amax):
        return f32(1.0)
    with np.errstate(over="ignore"):
        scale = f32(fp8_max) / amax  # correctly rounded f32 division (__fdiv_rn)
    if np.isinf(scale):
        scale = np.finfo(np.float32).max
    if pow2:
        scale = from_bits(bits(scale) & np.uint32(0xFF800000))
    return f32(scale)


def fp8_golden():
    rng = np.random.default_rng(5)
    n = 1024
    tensors = []
    t = (rng.standard_normal(n) * 3.0).astype(np.float32)
    t[17] = 250.0
    tensors.append(t)                                                   # outlier
    tensors.append((rng.standard_normal(n) * 1e-30).astype(np.float32))  # tiny
    t = (rng.uniform(-1, 1, n) * 2.0 ** -140).astype(np.float32)
    tensors.append(t)                                                   # subnormal amax
    t = rng.uniform(-1, 1, n).astype(np.float32)
    t[3] = 64.0
    tensors.append(t)                                                   # amax power of two
    tensors.append(np.zeros(n, np.float32))                             # zeros
    t = (rng.standard_normal(n) * 1e30).astype(np.float32)
    tensors.append(t)                                                   # huge
    t = rng.uniform(-1, 1, n).astype(np.float32)
    t[0] = 3.0
    tensors.append(t)                                                   # amax 3 (448/3 inexact)
    out = [b"NBF8GLD1", struct.pack("<II", len(tensors), n)]
    for t in tensors:
        out.append(t.astype("<f4").tobytes())
    cases = []
    for ti, t in enumerate(tensors):
        amax = f32(np.max(np.abs(t)))
        for eid, dt in [(0, ml_dtypes.float8_e4m3fn), (1, ml_dtypes.float8_e5m2)]:
            fmax = f32(448.0) if eid == 0 else f32(57344.0)
            for pow2 in (0, 1):
                scale = te_compute_scale(amax, fmax, pow2)
                y = (t * scale).astype(np.float32)
                codes = np.clip(y, -fmax, fmax).astype(dt).view(np.uint8)
                cases.append(struct.pack("<BBBxII", ti, eid, pow2, int(bits(amax)), int(bits(scale)))
                             + codes.tobytes())
    out.append(struct.pack("<I", len(cases)))
    out.extend(cases)
    return b"".join(out), len(cases)


def main():
    x = make_input()
    blob, summary = mx_golden(x)
    with open(os.path.join(HERE, "mx_golden.bin"), "wb") as f:
        f.write(blob)
    print(f"mx_golden.bin: {len(blob)} bytes; torch {torch.__version__}, torchao {torchao.__version__}")
    for ename, rname, n, reasons in summary:
        print(f"  {ename:5s} {rname:6s} overridden blocks: {n:3d} {reasons if reasons else ''}")
    blob, ncases = fp8_golden()
    with open(os.path.join(HERE, "fp8_golden.bin"), "wb") as f:
        f.write(blob)
    print(f"fp8_golden.bin: {len(blob)} bytes, {ncases} cases; numpy {np.__version__}, "
          f"ml_dtypes {ml_dtypes.__version__}")


if __name__ == "__main__":
    sys.exit(main())

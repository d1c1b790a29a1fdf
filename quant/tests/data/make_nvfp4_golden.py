#!/usr/bin/env python3
"""Golden NVFP4 quantization data for quant/tests/nvfp4_golden.rs.

An independent numpy transcription of Transformer Engine's pure-PyTorch reference quantizer
(transformer_engine/pytorch/custom_recipes/reference_nvfp4.py: `cast_to_fp4x2`,
`cast_to_e4m3`, `_quantize_blockwise_reference`, `_quantize_blockwise_4over6_reference`,
`_apply_rht`, `_pad_tensor`, `NVFP4QuantizerRef._quantize`), written from reading that file,
with E4M3 casts from ml_dtypes (`float8_e4m3fn`, round to nearest even, inputs clamped to
448 first as the reference does). Stochastic-rounding cases (not covered by TE's reference)
use an independent Python Philox4x32-10 and the SR rule of docs/numerics.md#stochastic-rounding evaluated in
exact arithmetic. See README.md in this directory for the list of deviations.

Usage (from the repository root):
    .venv-golden/bin/python quant/tests/data/make_nvfp4_golden.py          # write the files
    .venv-golden/bin/python quant/tests/data/make_nvfp4_golden.py --check  # compare only
"""

import math
import pathlib
import struct
import sys

import ml_dtypes
import numpy as np

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)
BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
TE_SIGN_MASK = 0xD7E8
OUT_DIR = pathlib.Path(__file__).resolve().parent

# ----------------------------------------------------------------------------------------
# Element casts (reference_nvfp4.py)
# ----------------------------------------------------------------------------------------


def cast_to_fp4x2(x):
    """E2M1 codes by the reference's threshold table, packed low nibble first.

    Deviation: the reference maps -0.0 to code 0; the PTX cvt.rn.satfinite.e2m1x2.f32 cast
    (and the Rust encoder) keep the sign of zero (code 8). -0.0 only reaches the cast when an
    input element is -0.0 (or a Hadamard output is -0.0); both codes decode to zero.
    """
    r = np.zeros(x.shape, np.uint8)
    r[(x >= 0.0) & (x <= 0.25)] = 0
    r[(x > 0.25) & (x < 0.75)] = 1
    r[(x >= 0.75) & (x <= 1.25)] = 2
    r[(x > 1.25) & (x < 1.75)] = 3
    r[(x >= 1.75) & (x <= 2.5)] = 4
    r[(x > 2.5) & (x < 3.5)] = 5
    r[(x >= 3.5) & (x <= 5.0)] = 6
    r[x > 5.0] = 7
    r[(x >= -0.25) & (x < -0.0)] = 8
    r[(x < -0.25) & (x > -0.75)] = 9
    r[(x <= -0.75) & (x >= -1.25)] = 10
    r[(x < -1.25) & (x > -1.75)] = 11
    r[(x <= -1.75) & (x >= -2.5)] = 12
    r[(x < -2.5) & (x > -3.5)] = 13
    r[(x <= -3.5) & (x >= -5.0)] = 14
    r[x < -5.0] = 15
    r[(x == 0.0) & np.signbit(x)] = 8  # sign of zero kept (see docstring)
    return r


def pack(codes):
    return (codes[:, ::2] | (codes[:, 1::2] << 4)).astype(np.uint8)


FP4_VALUES = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    dtype=F32,
)


def cast_to_e4m3(v):
    """`torch.clamp(v, -448, 448).to(torch.float8_e4m3fn)`."""
    return np.clip(v, F32(-448.0), F32(448.0)).astype(F32).astype(E4M3)


# ----------------------------------------------------------------------------------------
# Per-tensor scale
# ----------------------------------------------------------------------------------------


def global_encode_scale(amax, bound):
    """`min(fl(6 * bound / amax), FLT_MAX)`, 1 when that is 0.

    Deviation: the Python reference turns amax == 0 into S_enc = FLT_MAX (2688/0 = inf,
    clamped); TE's CUDA `compute_global_encode_scaling_factor_FP4` (and Rust) use 1. Codes,
    scales and amax are identical either way (every block is zero), and S_dec is not stored.
    """
    with np.errstate(divide="ignore"):
        s = F32(F32(bound) * F32(6.0)) / F32(amax)
    s = min(F32(s), FLT_MAX)
    if s == 0.0 or amax == 0.0:
        s = F32(1.0)
    return F32(s)


# ----------------------------------------------------------------------------------------
# Block quantization (_quantize_blockwise_reference)
# ----------------------------------------------------------------------------------------


def block_amax(x, tile_y):
    m, n = x.shape
    if tile_y == 16:
        t = np.abs(x).reshape(m // 16, 16, n // 16, 16).max(axis=(1, 3))
        return np.repeat(t, 16, axis=0)[:, :, None].astype(F32)
    return np.abs(x.reshape(m, n // 16, 16)).max(axis=-1, keepdims=True).astype(F32)


def quantize_blockwise(x, amax, tile_y, fos):
    """x: padded f32 [m, n]. Returns (codes [m, n] unpacked, scale bytes [m, n/16])."""
    m, n = x.shape
    vec_max = block_amax(x, tile_y)
    xb = x.reshape(m, n // 16, 16)
    bound = 256 if (fos is not None and fos[1]) else 448
    s_enc = global_encode_scale(amax, bound)
    s_dec = F32(F32(1.0) / s_enc)
    if fos is not None:
        return quantize_4over6(xb, vec_max, amax, s_enc, s_dec, tile_y, fos[0], bound)
    mult = F32(s_enc * F32(F32(1.0) / F32(6.0)))
    dsc = np.minimum(vec_max * mult, FLT_MAX)
    dsc = cast_to_e4m3(dsc)
    with np.errstate(divide="ignore"):
        enc = np.minimum(F32(1.0) / (dsc.astype(F32) * s_dec), FLT_MAX)
    scaled = np.clip(xb * enc, F32(-6.0), F32(6.0)).reshape(m, n)
    return cast_to_fp4x2(scaled), dsc.view(np.uint8)[:, :, 0]


def tree_sum_rows(err, tile_y):
    """`_sum_4over6_2d_error`: 16 row errors summed as a shuffle-down tree."""
    m, nb = err.shape[:2]
    r = err.reshape(m // tile_y, tile_y, nb)
    r = r[:, 0:8] + r[:, 8:16]
    r = r[:, 0:4] + r[:, 4:8]
    r = r[:, 0:2] + r[:, 2:4]
    return (r[:, 0] + r[:, 1])[:, :, None]


def quantize_4over6(xb, vec_max, amax, s_enc, s_dec, tile_y, mse, bound):
    """`_quantize_blockwise_4over6_reference` (default error path, not fast-math)."""
    m, nb, _ = xb.shape
    base = (vec_max / F32(6.0)) * s_enc
    d4 = cast_to_e4m3(base * F32(1.5))
    d6 = cast_to_e4m3(base)
    with np.errstate(divide="ignore"):
        enc4 = np.minimum(F32(1.0) / (d4.astype(F32) * s_dec), FLT_MAX)
        enc6 = np.minimum(F32(1.0) / (d6.astype(F32) * s_dec), FLT_MAX)
    q4 = cast_to_fp4x2(np.clip(xb * enc4, F32(-6.0), F32(6.0)).reshape(m, nb * 16))
    q6 = cast_to_fp4x2(np.clip(xb * enc6, F32(-6.0), F32(6.0)).reshape(m, nb * 16))
    v4 = FP4_VALUES[q4].reshape(m, nb, 16)
    v6 = FP4_VALUES[q6].reshape(m, nb, 16)
    denom = F32(6.0 * bound)
    sf4 = d4.astype(F32)[:, :, 0]
    sf6 = d6.astype(F32)[:, :, 0]
    e4 = np.zeros((m, nb), F32)
    e6 = np.zeros((m, nb), F32)
    amax = F32(amax)
    for idx in range(16):
        for v, sf, e in ((v4, sf4, e4), (v6, sf6, e6)):
            val = ((v[:, :, idx] * sf) * amax) / denom
            d = val - xb[:, :, idx]
            e += (d * d) if mse else np.abs(d)
    if tile_y == 1:
        pick4 = (e4 < e6)[:, :, None]
    else:
        pick4 = np.repeat(tree_sum_rows(e4, 16) < tree_sum_rows(e6, 16), 16, axis=0)
    codes = np.where(np.repeat(pick4, 16, axis=2).reshape(m, nb * 16), q4, q6)
    scales = np.where(pick4, d4.view(np.uint8), d6.view(np.uint8))[:, :, 0]
    return codes, scales


# ----------------------------------------------------------------------------------------
# Hadamard transform
# ----------------------------------------------------------------------------------------


def signs(mask):
    return np.array([-1.0 if (mask >> i) & 1 else 1.0 for i in range(16)], dtype=F32)


def rht_matmul(t, mask):
    """TE's `_apply_rht`: x_mat @ (diag(s) H16 * 0.25) with a BF16 matrix, FP32
    accumulation (numpy's BLAS order) and a BF16 result."""
    h = np.ones((1, 1), F32)
    while h.shape[0] < 16:
        h = np.block([[h, h], [h, -h]])
    h = (np.diag(signs(mask)) @ h).astype(BF16)
    transform = (h.astype(F32) * F32(0.25)).astype(BF16).astype(F32)
    out = t.reshape(-1, 16).astype(F32) @ transform
    return out.astype(BF16).astype(F32).reshape(t.shape)


def rht_butterfly(t, mask, zero_to_plus=True):
    """The documented reference order (quant::hadamard): negate, butterfly with strides
    1, 2, 4, 8, + 0 (a -0 sum becomes +0, as from the matmul, whose accumulator starts at
    +0), times 0.25, round to BF16 - all in float32. `zero_to_plus=False` skips the + 0 (the
    arithmetic before the sign-of-zero fix; used only to show what the zero cases test)."""
    v = t.reshape(-1, 16).astype(F32) * signs(mask)
    for h in (1, 2, 4, 8):
        v = v.reshape(-1, 16 // (2 * h), 2, h)
        a, b = v[:, :, 0, :], v[:, :, 1, :]
        v = np.stack([a + b, a - b], axis=2).reshape(-1, 16)
    if zero_to_plus:
        v = v + F32(0.0)
    v = v * F32(0.25)
    return v.astype(BF16).astype(F32).reshape(t.shape)


def rht_accumulate(t, mask):
    """TE's product written out: for each output, an f32 accumulator that starts at +0 and
    adds x_i * h_ij in order i = 0..15, then a BF16 result. Equal to the matmul form whenever
    the sums are exact (the zero cases), whatever order the BLAS uses."""
    h = np.ones((1, 1), F32)
    while h.shape[0] < 16:
        h = np.block([[h, h], [h, -h]])
    h = (np.diag(signs(mask)) @ h).astype(F32) * F32(0.25)
    x = t.reshape(-1, 16).astype(F32)
    acc = np.zeros(x.shape, F32)
    for i in range(16):
        acc = acc + x[:, i : i + 1] * h[i][None, :]
    return acc.astype(BF16).astype(F32).reshape(t.shape)


# ----------------------------------------------------------------------------------------
# Stochastic rounding (not in TE's reference): Philox stream + exact SR rule
# ----------------------------------------------------------------------------------------

MASK32 = 0xFFFFFFFF


def philox4x32_10(ctr, key):
    c = list(ctr)
    k = list(key)
    for r in range(10):
        if r:
            k = [(k[0] + 0x9E3779B9) & MASK32, (k[1] + 0xBB67AE85) & MASK32]
        p0 = 0xD2511F53 * c[0]
        p1 = 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k[0], p1 & MASK32, (p0 >> 32) ^ c[3] ^ k[1], p0 & MASK32]
    return c


# Random123 tests/kat_vectors, philox4x32 10.
assert philox4x32_10([0] * 4, [0, 0]) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
assert philox4x32_10([MASK32] * 4, [MASK32] * 2) == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
assert philox4x32_10(
    [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0]
) == [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]


def random_bytes(seed, stream, n):
    """Byte of element i (flat index in the stored, padded layout), for i < n."""
    key = [seed & MASK32, seed >> 32]
    out = np.zeros(n, np.uint8)
    for blk in range((n + 15) // 16):
        w = philox4x32_10([blk & MASK32, blk >> 32, stream & MASK32, stream >> 32], key)
        b = b"".join(x.to_bytes(4, "little") for x in w)
        m = min(16, n - 16 * blk)
        out[16 * blk : 16 * blk + m] = np.frombuffer(b[:m], np.uint8)
    return out


GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def sr_code(y, r):
    """Round |y| <= 6 up to the next grid point iff r + floor(256 f) >= 256 (f = fractional
    position between the neighbours), exactly; the sign bit of y is kept."""
    a = abs(float(y))
    sign = 8 if math.copysign(1.0, float(y)) < 0 else 0
    k = max(i for i, g in enumerate(GRID) if g <= a)
    if GRID[k] == a:
        return k | sign
    f = (a - GRID[k]) / (GRID[k + 1] - GRID[k])  # exact: power-of-two step
    up = r + math.floor(256.0 * f) >= 256
    return (k + up) | sign


def quantize_blockwise_sr(x, amax, tile_y, rbits):
    """`_quantize_blockwise_reference` with the final cast replaced by SR."""
    m, n = x.shape
    vec_max = block_amax(x, tile_y)
    xb = x.reshape(m, n // 16, 16)
    s_enc = global_encode_scale(amax, 448)
    s_dec = F32(F32(1.0) / s_enc)
    mult = F32(s_enc * F32(F32(1.0) / F32(6.0)))
    dsc = cast_to_e4m3(np.minimum(vec_max * mult, FLT_MAX))
    with np.errstate(divide="ignore"):
        enc = np.minimum(F32(1.0) / (dsc.astype(F32) * s_dec), FLT_MAX)
    scaled = np.clip(xb * enc, F32(-6.0), F32(6.0)).reshape(-1)
    codes = np.array([sr_code(y, int(r)) for y, r in zip(scaled, rbits)], np.uint8)
    return codes.reshape(m, n), dsc.view(np.uint8)[:, :, 0]


# ----------------------------------------------------------------------------------------
# The quantizer (NVFP4QuantizerRef._quantize, one usage at a time)
# ----------------------------------------------------------------------------------------


def pad(t, row_div, col_div):
    m, n = t.shape
    pm = (-m) % row_div
    pn = (-n) % col_div
    return np.pad(t, ((0, pm), (0, pn))) if (pm or pn) else t


def reference_quantize(x, usage, tile_y, rht, fos, sr):
    """x: f32 [M, N] (BF16 values). Returns (amax, packed codes, scales), padded layout."""
    if usage == 0:
        t = x
    else:
        t = np.ascontiguousarray(x.T)
        if rht == "matmul":
            t = rht_matmul(t, TE_SIGN_MASK)
        elif rht == "butterfly":
            t = rht_butterfly(t, TE_SIGN_MASK)
    amax = F32(np.abs(t).max()) if t.size else F32(0.0)
    tp = pad(t, tile_y, 16)
    if sr is not None:
        rbits = random_bytes(sr[0], sr[1], tp.size)
        codes, scales = quantize_blockwise_sr(tp, amax, tile_y, rbits)
    else:
        codes, scales = quantize_blockwise(tp, amax, tile_y, fos)
    return t.shape, tp.shape, amax, pack(codes), scales


# ----------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------


def normal_with_outliers(rng, m, n, tiny=False):
    """Standard normal data with a few large outliers, a block of exact zeros, blocks at
    1e-3 (subnormal E4M3 scales) and, with `tiny`, blocks at 1e-7 (scales flush to zero)."""
    x = rng.standard_normal((m, n)).astype(F32)
    k = max(1, m * n // 200)
    idx = rng.choice(m * n, size=k, replace=False)
    x.reshape(-1)[idx] *= F32(40.0)
    x[0, : min(16, n)] = 0.0
    if m > 2:
        x[2, : min(16, n)] *= F32(1e-3)
    if tiny and m > 3:
        x[3, :] *= F32(1e-7)
        x[1:, : min(16, n)] *= F32(3e-6)
    return x.astype(BF16).astype(F32)


def wide_range(rng, m, n):
    """Normal data times 2^k, k uniform in [-20, 20] per element: Hadamard sums of such BF16
    values are not exact in f32, so the butterfly order matters."""
    x = rng.standard_normal((m, n)) * np.exp2(rng.integers(-20, 21, size=(m, n)))
    return x.astype(F32).astype(BF16).astype(F32)


def small_ints(rng, m, n):
    return rng.integers(-8, 9, size=(m, n)).astype(F32)


BF16_MIN_SUB = F32(2.0**-133)  # smallest positive BF16 subnormal


def zero_sum_columns(rng, m, n):
    """Columnwise-RHT inputs whose transform has exact zero sums (m a multiple of 16, n >= 16).
    Small integers elsewhere, so every sum is exact and the matmul form is TE's to the bit.
    Per column c (the stored row the transform runs along), chunk by chunk of 16 rows:
      c % 8 == 0: all -0.0;            1: random signs of zero;
           2: -0.0 and tiny f32 values (+-1e-42, +-1e-45) that become +-0 in BF16;
           3: after the signs [-0 x 8, k, -k, +0 x 6]: the even outputs are exact zeros, and
              at output 8 a -0 half-sum meets a +0 one (-0 - (+0) = -0 in a plain butterfly);
           4: one +-2^-133 (BF16 subnormal) among zeros: the transform +-2^-135 rounds to a
              BF16 zero that keeps its sign (-0 in TE too);
           5: the transform's zero-sum pattern: x = s_i * (H16 row k), which maps to 4 * e_k
              times 0.25, i.e. one nonzero output and fifteen exact (cancelled) zeros;
         6-7: small integers (ordinary data).
    The first chunk of column 0 stays all -0.0 in every case."""
    x = rng.integers(-4, 5, size=(m, n)).astype(F32)
    hrow = np.ones((1, 1), F32)
    while hrow.shape[0] < 16:
        hrow = np.block([[hrow, hrow], [hrow, -hrow]])
    s = signs(TE_SIGN_MASK)
    for c in range(n):
        for g in range(m // 16):
            r = slice(16 * g, 16 * g + 16)
            kind = c % 8
            if kind == 0:
                x[r, c] = -0.0
            elif kind == 1:
                x[r, c] = np.where(rng.integers(0, 2, 16) == 1, F32(-0.0), F32(0.0))
            elif kind == 2:
                tiny = rng.choice(np.array([-1e-42, 1e-42, -1e-45, 1e-45, -0.0], F32), 16)
                x[r, c] = tiny
            elif kind == 3:
                k = int(rng.integers(1, 4))
                v = np.concatenate([np.full(8, -0.0, F32), np.zeros(8, F32)])
                v[8], v[9] = F32(k), F32(-k)
                x[r, c] = v * s  # the transform's signs cancel
            elif kind == 4:
                z = np.where(rng.integers(0, 2, 16) == 1, F32(-0.0), F32(0.0))
                z[int(rng.integers(0, 16))] = BF16_MIN_SUB * (1 if rng.integers(0, 2) else -1)
                x[r, c] = z
            elif kind == 5:
                k = int(rng.integers(0, 16))
                x[r, c] = hrow[k] * s * F32(rng.integers(1, 3))
    return x.astype(BF16).astype(F32)


# (name, input, usage, tile_y, rht, fos, sr)
#   usage: 0 rowwise, 1 columnwise; rht: None | "matmul" | "butterfly";
#   fos: None | (mse, bound_256); sr: None | (seed, stream)
def cases():
    rng = np.random.default_rng(20260801)
    nm = lambda m, n, tiny=False: normal_with_outliers(rng, m, n, tiny)  # noqa: E731
    return {
        "nvfp4_row16.bin": [
            ("row_normal_32x64", nm(32, 64), 0, 1, None, None, None),
            ("row_pad_17x40", nm(17, 40), 0, 1, None, None, None),
            ("row_tiny_16x48", nm(16, 48, tiny=True), 0, 1, None, None, None),
            ("row_zero_3x16", np.zeros((3, 16), F32), 0, 1, None, None, None),
            ("col_normal_40x24", nm(40, 24), 1, 1, None, None, None),
            ("col_pad_19x33", nm(19, 33, tiny=True), 1, 1, None, None, None),
        ],
        "nvfp4_tile16.bin": [
            ("tile_row_48x64", nm(48, 64), 0, 16, None, None, None),
            ("tile_col_48x64", None, 1, 16, None, None, None),  # same input as above
            ("tile_row_pad_20x35", nm(20, 35, tiny=True), 0, 16, None, None, None),
            ("tile_col_pad_20x35", None, 1, 16, None, None, None),
        ],
        "nvfp4_rht.bin": [
            ("rht_int_48x40", small_ints(rng, 48, 40), 1, 1, "matmul", None, None),
            ("rht_normal_64x24", nm(64, 24), 1, 1, "butterfly", None, None),
            ("rht_pad_32x20", nm(32, 20, tiny=True), 1, 1, "butterfly", None, None),
            ("rht_tile_32x20", None, 1, 16, "butterfly", None, None),
            ("rht_wide_32x32", wide_range(rng, 32, 32), 1, 1, "butterfly", None, None),
        ],
        "nvfp4_4over6.bin": [
            ("fos_mae256_row_32x48", nm(32, 48), 0, 1, None, (False, True), None),
            ("fos_mse256_row_32x48", None, 0, 1, None, (True, True), None),
            ("fos_mae448_row_32x48", None, 0, 1, None, (False, False), None),
            ("fos_mse448_col_32x48", None, 1, 1, None, (True, False), None),
            ("fos_mae256_tile_40x48", nm(40, 48), 0, 16, None, (False, True), None),
            ("fos_mse256_tcol_40x48", None, 1, 16, None, (True, True), None),
            ("fos_mae448_tile_40x48", None, 0, 16, None, (False, False), None),
        ],
        "nvfp4_sr.bin": [
            ("sr_row_pad_24x40", nm(24, 40), 0, 1, None, None, (0x1234_5678_9ABC_DEF0, 7)),
            ("sr_rht_col_32x40", nm(32, 40), 1, 1, "butterfly", None, (3, 0xFFFF_FFFF_0000_0005)),
        ],
        # Exact zero sums in the RHT come out +0 (TE's accumulator starts at +0). A separate
        # rng so the other files' inputs do not move.
        "nvfp4_rht_zero.bin": zero_cases(),
    }


def zero_cases():
    rng = np.random.default_rng(20261201)
    z = zero_sum_columns(rng, 48, 40)
    signed_zeros = np.where(rng.integers(0, 2, (32, 24)) == 1, F32(-0.0), F32(0.0))
    return [
        ("rhtz_col_48x40", z, 1, 1, "matmul", None, None),
        ("rhtz_tile_48x40", None, 1, 16, "matmul", None, None),
        ("rhtz_sr_48x40", None, 1, 1, "matmul", None, (0xC0FFEE, 9)),
        ("rhtz_all_zero_32x24", signed_zeros, 1, 1, "matmul", None, None),
    ]


def encode_case(name, x, usage, tile_y, rht, fos, sr):
    stored, padded, amax, codes, scales = reference_quantize(x, usage, tile_y, rht, fos, sr)
    fos_id = 0 if fos is None else 1 + (2 if fos[0] else 0) + (1 if fos[1] else 0)
    seed, stream = sr if sr is not None else (0, 0)
    b = bytearray()
    assert len(name) <= 24, name
    b += name.encode().ljust(24, b"\0")
    b += struct.pack("<II", *x.shape)
    b += struct.pack(
        "<BBBBB3x", usage, 1 if tile_y == 16 else 0, 1 if rht else 0, 1 if sr else 0, fos_id
    )
    b += struct.pack("<QQ", seed, stream)
    b += x.astype(BF16).view(np.uint16).astype("<u2").tobytes()
    b += struct.pack("<IIII", *stored, *padded)
    b += struct.pack("<I", int(np.array(amax, F32).view(np.uint32)))
    assert codes.size == padded[0] * padded[1] // 2 and scales.size == padded[0] * padded[1] // 16
    b += codes.tobytes() + scales.astype(np.uint8).tobytes()
    return bytes(b)


def self_checks():
    """The worked examples of docs/numerics.md#worked-examples, through this transcription."""
    x = np.zeros((1, 32), F32)
    x[0, :16] = np.array(
        [0, 0.1, -0.2, 0.3, 0.45, -0.6, 0.75, 0.9, 1.05, -1.2, 1.35, 1.5, -1.65, 1.8, 1.95, 2.1],
        F32,
    )
    x[0, 16:18] = [10, -10]
    x[0, 18:] = 0.5
    _, _, amax, codes, scales = reference_quantize(x, 0, 1, None, None, None)
    assert amax == 10.0
    assert list(scales[0]) == [0x6C, 0x7E], scales
    assert bytes(codes[0]).hex() == "1029b354d5667e77f711111111111111", bytes(codes[0]).hex()
    x = np.zeros((1, 32), F32)
    x[0, 0] = 546.0
    x[0, 16] = 2688.0
    _, _, _, codes, scales = reference_quantize(x, 0, 1, None, None, None)
    assert scales[0, 0] == 0x6B and codes[0, 0] & 0xF == 0x7
    # RHT vectors of section 10, both ways.
    v = np.zeros((1, 16), F32)
    v[0, 0] = 8.0
    assert (rht_matmul(v, TE_SIGN_MASK) == 2.0).all() and (rht_butterfly(v, TE_SIGN_MASK) == 2.0).all()
    v = np.arange(16, dtype=F32)[None, :]
    want = [-14.5, -7.5, 6.5, -0.5, 6.5, -0.5, -14.5, 8.5, 7.5, 14.5, 0.5, 1.5, 0.5, -2.5, 9.5, -15.5]
    assert list(rht_matmul(v, TE_SIGN_MASK)[0]) == want
    assert list(rht_butterfly(v, TE_SIGN_MASK)[0]) == want
    # Sign of zero: a chunk of -0.0 transforms to +0 (the accumulator starts at +0) ...
    v = np.full((1, 16), -0.0, F32)
    for f in (rht_matmul, rht_butterfly, rht_accumulate):
        assert (f(v, TE_SIGN_MASK).view(np.uint32) == 0).all(), f.__name__
    assert (rht_butterfly(v, TE_SIGN_MASK, zero_to_plus=False).view(np.uint32) == 0x80000000).any()
    # ... and a tiny negative sum keeps its sign through the BF16 rounding.
    # (x_0 = -2^-133, s_0 = +1 and row 0 of H16 is all ones: every output is -2^-135.)
    v = np.zeros((1, 16), F32)
    v[0, 0] = -BF16_MIN_SUB
    for f in (rht_matmul, rht_butterfly, rht_accumulate):
        assert (f(v, TE_SIGN_MASK).view(np.uint32) == 0x80000000).all(), f.__name__


def main():
    check = "--check" in sys.argv
    self_checks()
    all_cases = cases()
    stats = []
    ok = True
    for fname, cs in all_cases.items():
        blob = bytearray(b"NVFP4G01")
        blob += struct.pack("<I", len(cs))
        prev = None
        for name, x, usage, tile_y, rht, fos, sr in cs:
            x = prev if x is None else x
            prev = x
            if rht == "matmul":
                t = np.ascontiguousarray(x.T)
                a = rht_matmul(t, TE_SIGN_MASK)
                b = rht_butterfly(t, TE_SIGN_MASK)
                c = rht_accumulate(t, TE_SIGN_MASK)
                assert (a.view(np.uint32) == b.view(np.uint32)).all(), "matmul != butterfly"
                assert (a.view(np.uint32) == c.view(np.uint32)).all(), "matmul != accumulate"
                if fname == "nvfp4_rht_zero.bin":
                    old = rht_butterfly(t, TE_SIGN_MASK, zero_to_plus=False)
                    fixed = int(((old.view(np.uint32) == 0x80000000) & (a.view(np.uint32) == 0)).sum())
                    neg = int((a.view(np.uint32) == 0x80000000).sum())
                    assert fixed > 0, name
                    stats.append(
                        f"{name}: {fixed} of {t.size} transformed values are +0 where a plain "
                        f"butterfly gives -0; {neg} are -0 (tiny negative sums)"
                    )
            elif rht == "butterfly":
                t = np.ascontiguousarray(x.T)
                a = rht_matmul(t, TE_SIGN_MASK).view(np.uint32)
                diff = int((a != rht_butterfly(t, TE_SIGN_MASK).view(np.uint32)).sum())
                stats.append(f"{name}: matmul and butterfly BF16 results differ in {diff} of {t.size} (bits)")
            blob += encode_case(name, x, usage, tile_y, rht, fos, sr)
        path = OUT_DIR / fname
        if check:
            same = path.exists() and path.read_bytes() == bytes(blob)
            print(f"{fname}: {'ok' if same else 'DIFFERS'}")
            ok &= same
        else:
            path.write_bytes(bytes(blob))
            print(f"wrote {fname} ({len(blob)} bytes, {len(cs)} cases)")
    for s in stats:
        print(s)
    print(f"numpy {np.__version__}, ml_dtypes {ml_dtypes.__version__}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

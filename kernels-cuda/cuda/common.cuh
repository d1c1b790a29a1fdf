// Nibble kernels-cuda: device functions shared by every kernel module.
//
// Every function here is a line-by-line port of the CPU reference in `fp-formats` and `quant`
// (file and function named in each comment). All floating-point arithmetic uses the explicit
// round-to-nearest intrinsics (__fmul_rn, __fadd_rn, __fsub_rn, __fdiv_rn) and the modules are
// compiled with --fmad=false -ftz=false -prec-div=true, so no FMA contraction, no flush to zero
// and no approximate division can change a result bit. Integer bit tricks are copied verbatim.
#pragma once

#include <cstddef>

#define NB_DEV __device__ __forceinline__

namespace nb {

typedef unsigned int u32;
typedef unsigned long long u64;

constexpr float kFltMax = 3.40282346638528859812e+38f;

NB_DEV u32 f2u(float x) { return __float_as_uint(x); }
NB_DEV float u2f(u32 u) { return __uint_as_float(u); }
NB_DEV bool is_nan(float x) { return (f2u(x) & 0x7FFFFFFFu) > 0x7F800000u; }

// ------------------------------------------------------------------------------------------
// Element encoders
// ------------------------------------------------------------------------------------------

// fp-formats formats.rs `E2M1::encode_rne_sat`: RNE + saturation, NaN -> +6 (0x7).
NB_DEV u32 e2m1_rne(float x) {
  u32 bits = f2u(x);
  float a = u2f(bits & 0x7FFFFFFFu);
  u32 mag = (u32)(a > 0.25f) + (u32)(a >= 0.75f) + (u32)(a > 1.25f) + (u32)(a >= 1.75f) +
            (u32)(a > 2.5f) + (u32)(a >= 3.5f) + (u32)(a > 5.0f);
  u32 sign = (bits >> 28) & 0x8u;
  return is_nan(a) ? 0x7u : (mag | sign);
}

// fp-formats formats.rs `E4M3::encode_rne_sat` (the `cvt.rn.satfinite.e4m3x2.f32` cast).
NB_DEV u32 e4m3_rne(float x) {
  u32 bits = f2u(x);
  u32 abs = bits & 0x7FFFFFFFu;
  u32 sign = (bits >> 24) & 0x80u;
  u32 rounded = abs + (0x7FFFFu + ((abs >> 20) & 1u));
  u32 normal = (rounded >> 20) - (120u << 3);
  u32 sub = f2u(__fadd_rn(u2f(abs), 16384.0f)) - 0x46800000u;
  u32 mag = abs < 0x3C800000u ? sub : min(normal, 0x7Eu);
  mag = abs > 0x7F800000u ? 0x7Fu : mag;
  return (mag & 0xFFu) | sign;
}

// fp-formats minifloat.rs `Spec`: the generic bit-exact encoder (saturating overflow only,
// which is the only policy the kernels use). `nan_code`/`inf_code` < 0 mean "none".
struct Spec {
  u32 mbits;
  int emin;
  u32 max_code;
  u32 sign_bit;
  int inf_code;
  int nan_code;
};

NB_DEV Spec spec_e4m3() { return Spec{3u, -6, 0x7Eu, 0x80u, -1, 0x7F}; }
NB_DEV Spec spec_e5m2() { return Spec{2u, -14, 0x7Bu, 0x80u, 0x7C, 0x7E}; }
NB_DEV Spec spec_e2m1() { return Spec{1u, 0, 0x7u, 0x8u, -1, -1}; }

// minifloat.rs `round_up` for NearestEven (sr = false) and Stochastic(r) (sr = true).
NB_DEV bool round_up(u64 kept, u64 rem, u32 shift, bool sr, u32 r) {
  if (!sr) {
    u64 half = 1ull << (shift - 1);
    return rem > half || (rem == half && (kept & 1ull) == 1ull);
  }
  u64 k = shift >= 8 ? (rem >> (shift - 8)) : (rem << (8 - shift));
  return (u64)r + k >= 256ull;
}

// minifloat.rs `Spec::encode` with `Overflow::Saturate`.
NB_DEV u32 spec_encode(const Spec s, float x, bool sr, u32 r) {
  u32 bits = f2u(x);
  bool neg = (bits >> 31) != 0u;
  u32 abs_bits = bits & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) {
    return s.nan_code >= 0 ? ((u32)s.nan_code | (neg ? s.sign_bit : 0u)) : s.max_code;
  }
  u32 sign = neg ? s.sign_bit : 0u;
  if (s.sign_bit == 0u && neg && abs_bits != 0u) return 0u;
  if (abs_bits == 0x7F800000u) return s.max_code | sign;
  if (abs_bits == 0u) return sign;
  int exp_field = (int)(abs_bits >> 23);
  u32 man = abs_bits & 0x7FFFFFu;
  u32 sig;
  int ea;
  if (exp_field == 0) {
    sig = man;
    ea = -126;
  } else {
    sig = man | 0x800000u;
    ea = exp_field - 127;
  }
  int e = exp_field == 0 ? s.emin : max(ea, s.emin);
  int sh = e - ea + 23 - (int)s.mbits;
  u32 shift = (u32)min(max(sh, 1), 50);
  u64 sig64 = (u64)sig;
  u64 kept = sig64 >> shift;
  u64 rem = sig64 & ((1ull << shift) - 1ull);
  u64 n = kept + (round_up(kept, rem, shift, sr, r) ? 1ull : 0ull);
  u64 mag = ((u64)(e - s.emin) << s.mbits) + n;
  if (mag > (u64)s.max_code) return s.max_code | sign;
  return (u32)mag | sign;
}

// quant nvfp4.rs `encode_sr`: stochastic E2M1 of an already clamped |y| <= 6 with random byte r.
NB_DEV u32 e2m1_sr_clamped(float y, u32 r) {
  u32 bits = f2u(y);
  int sign = (int)((bits >> 28) & 0x8u);
  float a = fminf(u2f(bits & 0x7FFFFFFFu), 6.0f);
  int ge2 = (int)(a >= 2.0f);
  int ge4 = (int)(a >= 4.0f);
  float inv_step = u2f(0x40000000u - ((u32)(ge2 + ge4) << 23));
  int t256 = __float2int_rz(__fmul_rn(__fmul_rn(a, inv_step), 256.0f));
  int up = ((int)r + (t256 & 0xFF)) >> 8;
  int mag = (t256 >> 8) + up + 2 * (ge2 + ge4);
  return (u32)(mag | sign);
}

// ------------------------------------------------------------------------------------------
// Decoders (fp-formats kernels.rs `e2m1_value`, `ue4m3_value`, `e4m3_value`; formats.rs E8M0)
// ------------------------------------------------------------------------------------------

NB_DEV float e2m1_value(u32 code) {
  u32 m3 = code & 7u;
  u32 normal = (m3 + 252u) << 22;
  u32 small = m3 == 1u ? 0x3F000000u : 0u;
  u32 mag = m3 >= 2u ? normal : small;
  return u2f(mag | ((code & 8u) << 28));
}

NB_DEV float ue4m3_value(u32 code) {
  u32 c = code & 0x7Fu;
  u32 e = c >> 3;
  u32 m = c & 7u;
  float normal = u2f(((e + 120u) << 23) | (m << 20));
  float sub = __fmul_rn((float)m, 1.0f / 512.0f);
  float v = e == 0u ? sub : normal;
  return c == 0x7Fu ? u2f(0x7FC00000u) : v;
}

NB_DEV float e4m3_value(u32 code) {
  u32 sign = (code & 0x80u) << 24;
  return u2f(f2u(ue4m3_value(code)) | sign);
}

// E5M2 decode (the LUT of formats.rs built from minifloat.rs `Spec::decode`).
NB_DEV float e5m2_value(u32 code) {
  u32 sign = (code & 0x80u) << 24;
  u32 mag = code & 0x7Fu;
  u32 v;
  if (mag == 0x7Cu) {
    v = 0x7F800000u;
  } else if (mag > 0x7Cu) {
    v = 0x7FC00000u;
  } else if ((mag >> 2) == 0u) {
    v = f2u(__fmul_rn((float)(mag & 3u), 1.0f / 65536.0f));
  } else {
    v = (((mag >> 2) + 112u) << 23) | ((mag & 3u) << 21);
  }
  return u2f(v | sign);
}

// E8M0::value: 2^(b-127); b = 0 is the f32 subnormal 2^-127; 0xFF is NaN.
NB_DEV float e8m0_value(u32 b) {
  if (b == 0xFFu) return u2f(0x7FC00000u);
  if (b == 0u) return u2f(0x00400000u);
  return u2f(b << 23);
}

// E8M0::reciprocal: 2^(127-b), never a division.
NB_DEV float e8m0_reciprocal(u32 b) {
  if (b == 0xFFu) return u2f(0x7FC00000u);
  return e8m0_value(254u - b);
}

// fp-formats formats.rs `round_to_bf16` (RNE to BF16, held as f32; NaN passes through).
NB_DEV float round_bf16(float x) {
  u32 b = f2u(x);
  u32 r = (b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u;
  return is_nan(x) ? x : u2f(r);
}

NB_DEV unsigned short bf16_bits_exact(float x) { return (unsigned short)(f2u(round_bf16(x)) >> 16); }

// ------------------------------------------------------------------------------------------
// NVFP4 scales (fp-formats nvfp4.rs `GlobalScale`)
// ------------------------------------------------------------------------------------------

struct GlobalScale {
  float s_enc;
  float s_dec;
  float block_factor;
};

NB_DEV GlobalScale global_scale(float amax) {
  float s_enc = fminf(__fdiv_rn(2688.0f, amax), kFltMax);
  if (amax == 0.0f || s_enc == 0.0f) s_enc = 1.0f;
  GlobalScale g;
  g.s_enc = s_enc;
  g.s_dec = __fdiv_rn(1.0f, s_enc);
  g.block_factor = __fmul_rn(s_enc, u2f(0x3E2AAAABu));  // fl(1/6)
  return g;
}

// GlobalScale::block_scale: UE4M3 code of a block amax.
NB_DEV u32 nvfp4_block_scale(const GlobalScale& g, float block_amax) {
  return e4m3_rne(fminf(__fmul_rn(block_amax, g.block_factor), kFltMax));
}

// GlobalScale::block_encode_factor.
NB_DEV float nvfp4_encode_factor(const GlobalScale& g, u32 scale_code) {
  return fminf(__fdiv_rn(1.0f, __fmul_rn(ue4m3_value(scale_code), g.s_dec)), kFltMax);
}

// ------------------------------------------------------------------------------------------
// MX scale rules (fp-formats mx.rs `ScaleRule::scale`, `rceil_e8m0`)
// ------------------------------------------------------------------------------------------

enum MxElem { kE4M3 = 0, kE5M2 = 1, kE2M1 = 2 };
enum MxRule { kFloor = 0, kRceil = 1, kCeil = 2, kEven = 3 };

NB_DEV int elem_emax(int elem) { return elem == kE4M3 ? 8 : (elem == kE5M2 ? 15 : 2); }
NB_DEV u32 elem_mbits(int elem) { return elem == kE4M3 ? 3u : (elem == kE5M2 ? 2u : 1u); }
// fl(1 / F::MAX): 1/448, 1/57344, 1/6.
NB_DEV float elem_inv_max(int elem) {
  return u2f(elem == kE4M3 ? 0x3B124925u : (elem == kE5M2 ? 0x37924925u : 0x3E2AAAABu));
}

NB_DEV u32 e8m0_from_exponent_clamped(int e) { return (u32)(min(max(e, -127), 127) + 127); }

NB_DEV u32 rceil_e8m0(float d) {
  if (is_nan(d)) return 0xFFu;
  u32 bits = f2u(d) & 0x7FFFFFFFu;
  u32 exp = bits >> 23;
  u32 man = bits & 0x7FFFFFu;
  u32 b = exp == 0u ? (u32)(man > 0x400000u) : exp + (u32)(man != 0u);
  return min(b, 0xFEu);
}

NB_DEV u32 mx_scale(float amax, int elem, int rule) {
  u32 ab = f2u(amax) & 0x7FFFFFFFu;
  if (ab >= 0x7F800000u) return 0xFFu;  // !is_finite
  float a = u2f(ab);
  int emax = elem_emax(elem);
  u32 s;
  if (rule == kRceil) {
    s = rceil_e8m0(__fmul_rn(a, elem_inv_max(elem)));
  } else if (rule == kFloor) {
    s = e8m0_from_exponent_clamped((int)(ab >> 23) - 127 - emax);
  } else if (rule == kEven) {
    u32 mbits = elem_mbits(elem);
    u32 rounded = (ab + (1u << (23u - mbits - 1u))) & 0x7F800000u;
    s = e8m0_from_exponent_clamped((int)(rounded >> 23) - 127 - emax);
  } else {
    int e = (int)(ab >> 23) - 127 + (int)((ab & 0x7FFFFFu) != 0u);
    s = e8m0_from_exponent_clamped(e - emax);
  }
  // At most 2^(127 - emax) (fp_formats mx::max_scale): the largest element times the scale
  // stays finite in f32, so a block near f32's maximum saturates instead of becoming +inf.
  u32 cap = (u32)(254 - emax);
  return s < cap ? s : cap;
}

// ------------------------------------------------------------------------------------------
// Philox4x32-10 (quant philox.rs); the stochastic-rounding stream layout is documented there:
// key = seed, counter = [block lo, block hi, stream lo, stream hi], element j of a 16-element
// block uses byte j % 4 of output word j / 4.
// ------------------------------------------------------------------------------------------

NB_DEV uint4 philox4x32_10(uint4 c, uint2 k) {
  const u32 M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k.x += W0;
      k.y += W1;
    }
    u32 hi0 = __umulhi(M0, c.x), lo0 = M0 * c.x;
    u32 hi1 = __umulhi(M1, c.z), lo1 = M1 * c.z;
    c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
  }
  return c;
}

NB_DEV uint4 philox_block(u64 seed, u64 stream, u64 block) {
  uint4 c = make_uint4((u32)block, (u32)(block >> 32), (u32)stream, (u32)(stream >> 32));
  uint2 k = make_uint2((u32)seed, (u32)(seed >> 32));
  return philox4x32_10(c, k);
}

NB_DEV u32 philox_byte(const uint4& w, int j) {
  u32 word = (j >> 2) == 0 ? w.x : ((j >> 2) == 1 ? w.y : ((j >> 2) == 2 ? w.z : w.w));
  return (word >> (8 * (j & 3))) & 0xFFu;
}

// ------------------------------------------------------------------------------------------
// 16-point random Hadamard transform (quant hadamard.rs `rht16`): signs, butterfly with strides
// 1, 2, 4, 8 (sums first), + 0 (a -0 sum becomes +0, as from Transformer Engine's GEMM, whose
// accumulator starts at +0), times 0.25, round to BF16.
// ------------------------------------------------------------------------------------------

template <int H>
NB_DEV void butterfly_stage(float (&v)[16]) {
  float o[16];
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    o[j] = (j & H) == 0 ? __fadd_rn(v[j], v[j + H]) : __fsub_rn(v[j - H], v[j]);
  }
#pragma unroll
  for (int j = 0; j < 16; ++j) v[j] = o[j];
}

NB_DEV void rht16(float (&v)[16], u32 mask) {
#pragma unroll
  for (int i = 0; i < 16; ++i) v[i] = u2f(f2u(v[i]) ^ (((mask >> i) & 1u) << 31));
  butterfly_stage<1>(v);
  butterfly_stage<2>(v);
  butterfly_stage<4>(v);
  butterfly_stage<8>(v);
#pragma unroll
  for (int i = 0; i < 16; ++i) v[i] = round_bf16(__fmul_rn(__fadd_rn(v[i], 0.0f), 0.25f));
}

// ------------------------------------------------------------------------------------------
// Reductions
// ------------------------------------------------------------------------------------------

// Absolute-value bits for an unsigned max: equal to the float order for non-NaN values.
// NaN maps to 0 (ignored, like CUDA fmaxf and fp-formats `block_amax`); `nan_seen` records it.
NB_DEV u32 abs_bits_nan_ignoring(float x, u32& nan_seen) {
  u32 a = f2u(x) & 0x7FFFFFFFu;
  bool nan = a > 0x7F800000u;
  nan_seen |= (u32)nan;
  return nan ? 0u : a;
}

NB_DEV float amax16(const float (&v)[16]) {
  float m = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) m = fmaxf(m, fabsf(v[i]));
  return m;
}

// Max over the 16 lanes of a half warp (xor 8, 4, 2, 1). Every lane must call it.
NB_DEV float halfwarp_max(float m) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  return m;
}

// Warp max of u32 then one atomicMax per warp. Every lane must call it.
NB_DEV void warp_atomic_max(u32* dst, u32 v) {
  v = __reduce_max_sync(0xFFFFFFFFu, v);
  if ((threadIdx.x & 31u) == 0u) atomicMax(dst, v);
}

NB_DEV void warp_atomic_or(u32* dst, u32 v) {
  v = __reduce_or_sync(0xFFFFFFFFu, v);
  if ((threadIdx.x & 31u) == 0u && v != 0u) atomicOr(dst, v);
}

// ------------------------------------------------------------------------------------------
// The 64x64 input tile shared by the quantizers: loaded once into shared memory (float4 loads
// when the row stride allows it, zeros outside the tensor), then read along rows (rowwise
// copy) and down columns (columnwise / transposed copy) without bank conflicts.
// ------------------------------------------------------------------------------------------

constexpr int kTile = 64;
constexpr int kLd = kTile + 1;
constexpr int kThreads = 256;

NB_DEV void load_tile(float* smem, const float* __restrict__ x, int rows, int cols, int r0, int c0,
                      bool vec4) {
#pragma unroll
  for (int it = 0; it < (kTile * kTile / 4) / kThreads; ++it) {
    int k = (int)threadIdx.x + it * kThreads;
    int lr = k >> 4;
    int lc = (k & 15) * 4;
    int r = r0 + lr, c = c0 + lc;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r < rows) {
      const float* p = x + (size_t)r * (size_t)cols + (size_t)c;
      if (vec4 && c + 3 < cols) {
        v = __ldg(reinterpret_cast<const float4*>(p));
      } else {
        if (c < cols) v.x = __ldg(p);
        if (c + 1 < cols) v.y = __ldg(p + 1);
        if (c + 2 < cols) v.z = __ldg(p + 2);
        if (c + 3 < cols) v.w = __ldg(p + 3);
      }
    }
    float* s = smem + lr * kLd + lc;
    s[0] = v.x;
    s[1] = v.y;
    s[2] = v.z;
    s[3] = v.w;
  }
}

// Rowwise thread mapping: tile row `lr` (0..63) and 16-column block `lb` (0..3); the 16 lanes
// of a half warp hold 16 consecutive rows of the same block (a 16x16 tile for Tile16).
NB_DEV void row_map(int& lr, int& lb) {
  int w = (int)threadIdx.x >> 5, l = (int)threadIdx.x & 31;
  lb = (w & 1) * 2 + (l >> 4);
  lr = 16 * (w >> 1) + (l & 15);
}

// Columnwise thread mapping: tile column `lc` (0..63) and 16-row group `g` (0..3); the 16
// lanes of a half warp hold 16 consecutive columns (stored rows) of the same group.
NB_DEV void col_map(int& lc, int& g) {
  int w = (int)threadIdx.x >> 5, l = (int)threadIdx.x & 31;
  lc = 32 * (w & 1) + l;
  g = w >> 1;
}

NB_DEV void read_row16(const float* smem, int lr, int lb, float (&v)[16]) {
#pragma unroll
  for (int j = 0; j < 16; ++j) v[j] = smem[lr * kLd + lb * 16 + j];
}

NB_DEV void read_col16(const float* smem, int lc, int g, float (&v)[16]) {
#pragma unroll
  for (int i = 0; i < 16; ++i) v[i] = smem[(16 * g + i) * kLd + lc];
}

NB_DEV int round_up_int(int v, int m) { return (v + m - 1) / m * m; }


// ------------------------------------------------------------------------------------------
// Training-step helpers: ports of autograd/src/cpu.rs (Cephes exp, tanh, sigmoid, the
// 16-lane reduction tree) and warp-level reductions with a fixed (deterministic) order.
// ------------------------------------------------------------------------------------------

// autograd cpu.rs `exp`: branch-free Cephes expf (NaN propagates; 0 below -87; e^88 above 88).
NB_DEV float cephes_exp(float x0) {
  float x = x0 > 88.0f ? 88.0f : x0;
  x = x < -87.0f ? -87.0f : x;
  const float kMagic = 12582912.0f;
  const float t = __fadd_rn(__fmul_rn(x, 1.44269504088896340736f), kMagic);
  const float fx = __fsub_rn(t, kMagic);
  const u32 n = f2u(t) - f2u(kMagic);
  const float r = __fsub_rn(__fsub_rn(x, __fmul_rn(fx, 0.6933594f)), __fmul_rn(fx, -2.1219444e-4f));
  const float z = __fmul_rn(r, r);
  float p = 1.9875691e-4f;
  p = __fadd_rn(__fmul_rn(p, r), 1.3981999e-3f);
  p = __fadd_rn(__fmul_rn(p, r), 8.333452e-3f);
  p = __fadd_rn(__fmul_rn(p, r), 4.1665796e-2f);
  p = __fadd_rn(__fmul_rn(p, r), 1.6666665e-1f);
  p = __fadd_rn(__fmul_rn(p, r), 0.5f);
  const float y = __fadd_rn(__fadd_rn(__fmul_rn(p, z), r), 1.0f);
  const float res = __fmul_rn(y, u2f((n + 127u) << 23));
  return x0 < -87.0f ? 0.0f : res;
}

// autograd cpu.rs `tanh`: 1 - 2 / (e^{2x} + 1).
NB_DEV float cpu_tanh(float x) {
  return __fsub_rn(1.0f, __fdiv_rn(2.0f, __fadd_rn(cephes_exp(__fmul_rn(2.0f, x)), 1.0f)));
}

// autograd cpu.rs `sigmoid`: 1 / (1 + e^{-x}).
NB_DEV float cpu_sigmoid(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, cephes_exp(-x))); }

// Writes (acc == 0) or adds (acc != 0) `v` to `*d` (autograd cpu.rs `store`).
NB_DEV void store_acc(float* d, int acc, float v) { *d = acc ? __fadd_rn(*d, v) : v; }

// autograd cpu.rs `sum16` over the values held by lanes 0..15 of a warp (lane l holds a[l]):
// s[l] = a[l] + a[l+8]; ((s0+s4) + (s1+s5)) + ((s2+s6) + (s3+s7)). Every lane must call it;
// the result is valid in lane 0.
NB_DEV float warp_sum16_tree(float v) {
  v = __fadd_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, 8));
  v = __fadd_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, 4));
  v = __fadd_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, 1));
  v = __fadd_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, 2));
  return v;
}

// `acc.iter().sum::<f32>()` over lanes 0..15 (sequential from -0.0, which adds exactly like a
// start at lane 0's value). Every lane must call it; the result is valid in every lane.
NB_DEV float warp_sum16_seq(float v) {
  float s = -0.0f;
  for (int l = 0; l < 16; ++l) s = __fadd_rn(s, __shfl_sync(0xFFFFFFFFu, v, l));
  return s;
}

// A deterministic full-warp sum (xor butterfly 16, 8, 4, 2, 1): the same bits in every lane.
NB_DEV float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

// Full-warp maximum (exact; fmaxf ignores NaN, callers mask their inputs).
NB_DEV float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

}  // namespace nb

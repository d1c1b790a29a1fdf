// MX quantization (MXFP8 E4M3 / E5M2, MXFP4 E2M1; 32 elements per E8M0 scale), bit-exact with
// quant::mx (quant/src/mx.rs): every scale rule (FLOOR, RCEIL, CEIL, EVEN), round-to-nearest-even
// or stochastic rounding (8 Philox bits per element), Tseng et al.'s 3/4 prescale, the 16-point
// Hadamard transform on the columnwise copy, and rowwise + columnwise copies from one read of
// the input. Plus dequantization.
#include "common.cuh"

using namespace nb;

#define MX_ROW 1
#define MX_COL 2
#define MX_ROW_SR 16
#define MX_COL_SR 32
#define MX_COL_RHT 64
#define MX_VEC4 128
#define MX_ROW_PRESCALE 256
#define MX_COL_PRESCALE 512

struct MxArgs {
  const float* x;
  unsigned char* row_codes;
  unsigned char* row_scales;
  unsigned char* col_codes;
  unsigned char* col_scales;
  u32* amax;  // [0] row amax bits, [1] row NaN flag, [2] col amax bits, [3] col NaN flag
  u64 row_seed;
  u64 row_stream;
  u64 col_seed;
  u64 col_stream;
  int rows;
  int cols;
  int flags;
  u32 rht_mask;
  int elem;  // MxElem
  int rule;  // MxRule
};
static_assert(sizeof(MxArgs) == 104, "MxArgs layout");
static_assert(offsetof(MxArgs, rows) == 80, "MxArgs layout");
static_assert(offsetof(MxArgs, elem) == 96, "MxArgs layout");

NB_DEV u32 mx_encode(int elem, float y, bool sr, u32 r) {
  if (sr) {
    const Spec s = elem == kE4M3 ? spec_e4m3() : (elem == kE5M2 ? spec_e5m2() : spec_e2m1());
    return spec_encode(s, y, true, r);
  }
  if (elem == kE4M3) return e4m3_rne(y);
  if (elem == kE2M1) return e2m1_rne(y);
  return spec_encode(spec_e5m2(), y, false, 0u);
}

// Quantizes the thread's 16 elements (half of a 32-element block whose scale code is `scale`)
// and stores them at element offset `elem_off` of the stored, padded tensor.
NB_DEV void mx_store16(const float (&v)[16], int elem, u32 scale, bool prescale, bool sr, u64 seed,
                       u64 stream, u64 elem_off, unsigned char* codes) {
  const float inv = e8m0_reciprocal(scale);
  const float mul = prescale ? __fmul_rn(inv, 0.75f) : inv;
  uint4 rb = make_uint4(0u, 0u, 0u, 0u);
  if (sr) rb = philox_block(seed, stream, elem_off / 16);
  u32 q[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) q[i] = mx_encode(elem, __fmul_rn(v[i], mul), sr, philox_byte(rb, i));
  if (elem == kE2M1) {
    u32 lo = 0u, hi = 0u;
#pragma unroll
    for (int i = 0; i < 4; ++i) lo |= (q[2 * i] | (q[2 * i + 1] << 4)) << (8 * i);
#pragma unroll
    for (int i = 0; i < 4; ++i) hi |= (q[8 + 2 * i] | (q[8 + 2 * i + 1] << 4)) << (8 * i);
    *reinterpret_cast<uint2*>(codes + elem_off / 2) = make_uint2(lo, hi);
  } else {
    u32 w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      w[k] = q[4 * k] | (q[4 * k + 1] << 8) | (q[4 * k + 2] << 16) | (q[4 * k + 3] << 24);
    }
    *reinterpret_cast<uint4*>(codes + elem_off) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// Grid: (ceil(round_up(cols, 32) / 64), ceil(round_up(rows, 32) / 64)), 256 threads.
extern "C" __global__ void __launch_bounds__(256) nb_mx_quantize(const MxArgs a) {
  __shared__ float smem[kTile * kLd];
  __shared__ float half_amax[4][kTile];
  const int r0 = (int)blockIdx.y * kTile, c0 = (int)blockIdx.x * kTile;
  load_tile(smem, a.x, a.rows, a.cols, r0, c0, (a.flags & MX_VEC4) != 0);
  __syncthreads();

  if (a.flags & MX_ROW) {
    // Stored = x, [rows, round_up(cols, 32)]. Lanes l and l ^ 16 hold the two halves of a block.
    const int pcols = round_up_int(a.cols, 32);
    int lr, lb;
    row_map(lr, lb);
    const int r = r0 + lr, b = c0 / 32 + lb / 2, h = lb & 1;
    float v[16];
    read_row16(smem, lr, lb, v);
    u32 nan = 0u, m = 0u;
#pragma unroll
    for (int i = 0; i < 16; ++i) m = max(m, abs_bits_nan_ignoring(v[i], nan));
    const float amax = fmaxf(u2f(m), __shfl_xor_sync(0xFFFFFFFFu, u2f(m), 16));
    const bool active = r < a.rows && 32 * b < pcols;
    warp_atomic_max(a.amax, active ? f2u(amax) : 0u);
    warp_atomic_or(a.amax + 1, active ? nan : 0u);
    if (active) {
      const u32 scale = mx_scale(amax, a.elem, a.rule);
      if (h == 0) a.row_scales[(size_t)r * (pcols / 32) + b] = (unsigned char)scale;
      mx_store16(v, a.elem, scale, (a.flags & MX_ROW_PRESCALE) != 0, (a.flags & MX_ROW_SR) != 0, a.row_seed,
                 a.row_stream, (u64)r * (u64)pcols + (u64)(32 * b + 16 * h), a.row_codes);
    }
  }
  if (a.flags & MX_COL) {
    // Stored = x^T, [cols, round_up(rows, 32)]. Groups g and g ^ 1 (different warps) hold the two
    // halves of a block: their amaxes meet in shared memory.
    const int pcols = round_up_int(a.rows, 32);
    int lc, gi;
    col_map(lc, gi);
    const int s = c0 + lc, b = r0 / 32 + gi / 2, h = gi & 1;
    float v[16];
    read_col16(smem, lc, gi, v);
    // Only chunks of the tensor itself are transformed, as quant pads after the transform (a
    // zero chunk transforms to +0 since rht16 turns -0 sums into +0, so this only saves work).
    if ((a.flags & MX_COL_RHT) && s < a.cols && r0 + 16 * gi < a.rows) rht16(v, a.rht_mask);
    u32 nan = 0u, m = 0u;
#pragma unroll
    for (int i = 0; i < 16; ++i) m = max(m, abs_bits_nan_ignoring(v[i], nan));
    half_amax[gi][lc] = u2f(m);
    __syncthreads();
    const float amax = fmaxf(u2f(m), half_amax[gi ^ 1][lc]);
    const bool active = s < a.cols && 32 * b < pcols;
    warp_atomic_max(a.amax + 2, active ? f2u(amax) : 0u);
    warp_atomic_or(a.amax + 3, active ? nan : 0u);
    if (active) {
      const u32 scale = mx_scale(amax, a.elem, a.rule);
      if (h == 0) a.col_scales[(size_t)s * (pcols / 32) + b] = (unsigned char)scale;
      mx_store16(v, a.elem, scale, (a.flags & MX_COL_PRESCALE) != 0, (a.flags & MX_COL_SR) != 0, a.col_seed,
                 a.col_stream, (u64)s * (u64)pcols + (u64)(32 * b + 16 * h), a.col_codes);
    }
  }
}

NB_DEV u32 mx_code_at(const unsigned char* codes, int elem, u64 e) {
  if (elem == kE2M1) {
    const u32 byte = codes[e / 2];
    return (e & 1ull) ? (byte >> 4) : (byte & 0xFu);
  }
  return codes[e];
}

NB_DEV float mx_decode(int elem, u32 code) {
  return elem == kE4M3 ? e4m3_value(code) : (elem == kE5M2 ? e5m2_value(code) : e2m1_value(code));
}

// quant::mx::dequantize: out[r, c] = fl(fl(element(code) * 2^(b-127)) * factor), padding dropped.
extern "C" __global__ void __launch_bounds__(256) nb_mx_dequantize(const unsigned char* __restrict__ codes,
                                                                    const unsigned char* __restrict__ scales,
                                                                    int rows, int cols, int padded_cols, int elem,
                                                                    float factor, float* __restrict__ out) {
  const u64 n = (u64)rows * (u64)cols;
  const u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const u64 r = i / (u64)cols, c = i % (u64)cols;
    const u64 e = r * (u64)padded_cols + c;
    const float s = e8m0_value(scales[e / 32]);
    out[i] = __fmul_rn(__fmul_rn(mx_decode(elem, mx_code_at(codes, elem, e)), s), factor);
  }
}

// The emulated-GEMM operand: element(code) * 2^(b-127) as BF16 (exact for every scale a real
// tensor gets), [rows, padded_cols].
extern "C" __global__ void __launch_bounds__(256) nb_mx_to_bf16(const unsigned char* __restrict__ codes,
                                                                 const unsigned char* __restrict__ scales,
                                                                 int rows, int padded_cols, int elem,
                                                                 unsigned short* __restrict__ out) {
  const u64 n = (u64)rows * (u64)padded_cols;
  const u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
    const float s = e8m0_value(scales[e / 32]);
    out[e] = bf16_bits_exact(__fmul_rn(mx_decode(elem, mx_code_at(codes, elem, e)), s));
  }
}

// Per-tensor FP8 (E4M3 / E5M2) cast, bit-exact with quant::fp8 (quant/src/fp8.rs): the scale
// is computed on the device from the amax pass (current scaling, TE's compute_scale_from_amax)
// or passed in (delayed scaling), elements are satfinite RNE or stochastic (8 Philox bits per
// element at the flat stored index), and the rowwise and columnwise copies come from one read.
#include "common.cuh"

using namespace nb;

#define FP8_ROW 1
#define FP8_COL 2
#define FP8_ROW_SR 16
#define FP8_COL_SR 32
#define FP8_VEC4 128
#define FP8_SCALE_HOST 256
#define FP8_SCALE_POW2 512

struct Fp8Args {
  const float* x;
  unsigned char* row_codes;
  unsigned char* col_codes;
  const u32* amax;  // [0] NaN-ignoring amax bits (nb_amax)
  float* meta;      // out: [0] scale, [1] scale_inv = fl(1 / scale)
  u64 row_seed;
  u64 row_stream;
  u64 col_seed;
  u64 col_stream;
  int rows;
  int cols;
  int flags;
  int elem;  // 0 E4M3, 1 E5M2
  float host_scale;
  int pad;
};
static_assert(sizeof(Fp8Args) == 96, "Fp8Args layout");
static_assert(offsetof(Fp8Args, rows) == 72, "Fp8Args layout");
static_assert(offsetof(Fp8Args, host_scale) == 88, "Fp8Args layout");

// quant fp8.rs `compute_scale_from_amax`.
NB_DEV float fp8_scale_from_amax(float amax, float fp8_max, bool pow2) {
  u32 ab = f2u(amax) & 0x7FFFFFFFu;
  if (ab >= 0x7F800000u || amax == 0.0f) return 1.0f;
  float scale = __fdiv_rn(fp8_max, amax);
  if ((f2u(scale) & 0x7FFFFFFFu) == 0x7F800000u) scale = kFltMax;
  if (is_nan(scale)) scale = 1.0f;
  if (pow2) scale = u2f(f2u(scale) & 0xFF800000u);
  return scale;
}

NB_DEV u32 fp8_encode(int elem, float y, bool sr, u32 r) {
  if (elem == 0 && !sr) return e4m3_rne(y);
  return spec_encode(elem == 0 ? spec_e4m3() : spec_e5m2(), y, sr, r);
}

// Casts up to 16 consecutive stored elements starting at flat stored index `i0` (n valid).
NB_DEV void fp8_store16(const float (&v)[16], int n, float scale, int elem, bool sr, u64 seed, u64 stream,
                        u64 i0, bool aligned16, unsigned char* codes) {
  uint4 rb0 = make_uint4(0u, 0u, 0u, 0u), rb1 = rb0;
  if (sr) {
    rb0 = philox_block(seed, stream, i0 / 16);
    if ((i0 & 15ull) != 0ull) rb1 = philox_block(seed, stream, i0 / 16 + 1);
  }
  u32 q[16];
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const u64 i = i0 + (u64)j;
    const int byte = (int)(i & 15ull);
    const bool second = (i / 16) != (i0 / 16);
    const u32 r = sr ? philox_byte(second ? rb1 : rb0, byte) : 0u;
    q[j] = fp8_encode(elem, __fmul_rn(v[j], scale), sr, r);
  }
  if (aligned16 && n == 16) {
    u32 w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      w[k] = q[4 * k] | (q[4 * k + 1] << 8) | (q[4 * k + 2] << 16) | (q[4 * k + 3] << 24);
    }
    *reinterpret_cast<uint4*>(codes + i0) = make_uint4(w[0], w[1], w[2], w[3]);
  } else {
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      if (j < n) codes[i0 + (u64)j] = (unsigned char)q[j];
    }
  }
}

// Grid: (ceil(cols / 64), ceil(rows / 64)), 256 threads.
extern "C" __global__ void __launch_bounds__(256) nb_fp8_quantize(const Fp8Args a) {
  __shared__ float smem[kTile * kLd];
  const int r0 = (int)blockIdx.y * kTile, c0 = (int)blockIdx.x * kTile;
  const float fp8_max = a.elem == 0 ? 448.0f : 57344.0f;
  const float scale = (a.flags & FP8_SCALE_HOST)
                          ? a.host_scale
                          : fp8_scale_from_amax(u2f(a.amax[0]), fp8_max, (a.flags & FP8_SCALE_POW2) != 0);
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
    a.meta[0] = scale;
    a.meta[1] = __fdiv_rn(1.0f, scale);
  }
  load_tile(smem, a.x, a.rows, a.cols, r0, c0, (a.flags & FP8_VEC4) != 0);
  __syncthreads();
  if (a.flags & FP8_ROW) {
    int lr, lb;
    row_map(lr, lb);
    const int r = r0 + lr, c = c0 + 16 * lb;
    if (r < a.rows && c < a.cols) {
      float v[16];
      read_row16(smem, lr, lb, v);
      fp8_store16(v, min(16, a.cols - c), scale, a.elem, (a.flags & FP8_ROW_SR) != 0, a.row_seed, a.row_stream,
                  (u64)r * (u64)a.cols + (u64)c, (a.cols & 15) == 0, a.row_codes);
    }
  }
  if (a.flags & FP8_COL) {
    int lc, gi;
    col_map(lc, gi);
    const int s = c0 + lc, c = r0 + 16 * gi;
    if (s < a.cols && c < a.rows) {
      float v[16];
      read_col16(smem, lc, gi, v);
      fp8_store16(v, min(16, a.rows - c), scale, a.elem, (a.flags & FP8_COL_SR) != 0, a.col_seed, a.col_stream,
                  (u64)s * (u64)a.rows + (u64)c, (a.rows & 15) == 0, a.col_codes);
    }
  }
}

// quant::fp8::dequantize: fp8(code) * scale_inv.
extern "C" __global__ void __launch_bounds__(256) nb_fp8_dequantize(const unsigned char* __restrict__ codes, u64 n,
                                                                     int elem, float scale_inv,
                                                                     float* __restrict__ out) {
  const u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const u32 c = codes[i];
    out[i] = __fmul_rn(elem == 0 ? e4m3_value(c) : e5m2_value(c), scale_inv);
  }
}

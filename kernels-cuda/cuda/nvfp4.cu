// NVFP4 quantization, bit-exact with quant::nvfp4 (see quant/src/nvfp4.rs for the semantics):
// rowwise (1x16 blocks or 16x16 tiles), columnwise (the transposed copy, optionally with the
// 16-point random Hadamard transform), round-to-nearest-even or stochastic rounding from the
// Philox stream, and the fused cast+transpose that writes both copies from one read of the
// input. Plus the amax passes (plain and post-RHT) and dequantization.
#include "common.cuh"

using namespace nb;

// Flags of Nvfp4Args::flags (kernels-cuda/src/quantize.rs mirrors them).
#define NVFP4_ROW 1
#define NVFP4_COL 2
#define NVFP4_ROW_TILE 4
#define NVFP4_COL_TILE 8
#define NVFP4_ROW_SR 16
#define NVFP4_COL_SR 32
#define NVFP4_COL_RHT 64
#define NVFP4_VEC4 128

// Layout is checked on both sides (static_assert here, const asserts in Rust).
struct Nvfp4Args {
  const float* x;
  unsigned char* row_codes;
  unsigned char* row_scales;
  unsigned char* col_codes;
  unsigned char* col_scales;
  const u32* amax;  // [0] amax bits, [2] post-RHT amax bits (see nb_amax_rht_col)
  u64 row_seed;
  u64 row_stream;
  u64 col_seed;
  u64 col_stream;
  int rows;
  int cols;
  int flags;
  u32 rht_mask;
};
static_assert(sizeof(Nvfp4Args) == 96, "Nvfp4Args layout");
static_assert(offsetof(Nvfp4Args, row_seed) == 48, "Nvfp4Args layout");
static_assert(offsetof(Nvfp4Args, rows) == 80, "Nvfp4Args layout");

// Quantizes the 16 values of one block (or one row of a 16x16 tile) whose scale is `scale`:
// writes 8 packed code bytes (element 2i in the low nibble).
NB_DEV uint2 nvfp4_codes(const float (&v)[16], float enc, bool sr, const uint4& rbits) {
  u32 q[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    float y = __fmul_rn(v[i], enc);
    if (sr) {
      // quant: encode_sr((x * enc).clamp(-6, 6), r)
      float c = y < -6.0f ? -6.0f : (y > 6.0f ? 6.0f : y);
      q[i] = e2m1_sr_clamped(c, philox_byte(rbits, i));
    } else {
      q[i] = e2m1_rne(y);
    }
  }
  u32 lo = 0u, hi = 0u;
#pragma unroll
  for (int i = 0; i < 4; ++i) lo |= (q[2 * i] | (q[2 * i + 1] << 4)) << (8 * i);
#pragma unroll
  for (int i = 0; i < 4; ++i) hi |= (q[8 + 2 * i] | (q[8 + 2 * i + 1] << 4)) << (8 * i);
  return make_uint2(lo, hi);
}

// One NVFP4 block row: scale (per block, or per 16x16 tile via a half-warp max), codes, store.
// `active` may differ between lanes; every lane of the warp must call this (shuffles inside).
NB_DEV void nvfp4_emit(const float (&v)[16], const GlobalScale& g, bool tile, bool sr, u64 seed,
                       u64 stream, bool active, size_t stored_row, int block, int bpr,
                       unsigned char* codes, unsigned char* scales) {
  float a = amax16(v);
  if (tile) a = halfwarp_max(a);
  u32 scale = nvfp4_block_scale(g, a);
  float enc = nvfp4_encode_factor(g, scale);
  if (!active) return;
  size_t bidx = stored_row * (size_t)bpr + (size_t)block;
  uint4 rb = make_uint4(0u, 0u, 0u, 0u);
  if (sr) rb = philox_block(seed, stream, (u64)bidx);
  uint2 packed = nvfp4_codes(v, enc, sr, rb);
  *reinterpret_cast<uint2*>(codes + bidx * 8) = packed;
  scales[bidx] = (unsigned char)scale;
}

// Grid: (ceil(round_up(cols, 16) / 64), ceil(round_up(rows, 16) / 64)), 256 threads.
extern "C" __global__ void __launch_bounds__(256) nb_nvfp4_quantize(const Nvfp4Args a) {
  __shared__ float smem[kTile * kLd];
  const int r0 = (int)blockIdx.y * kTile, c0 = (int)blockIdx.x * kTile;
  load_tile(smem, a.x, a.rows, a.cols, r0, c0, (a.flags & NVFP4_VEC4) != 0);
  __syncthreads();

  if (a.flags & NVFP4_ROW) {
    // Stored tensor = x: [rows, cols] padded to [rows or round_up(rows, 16), round_up(cols, 16)].
    const bool tile = (a.flags & NVFP4_ROW_TILE) != 0;
    const int pcols = round_up_int(a.cols, 16);
    const int prows = tile ? round_up_int(a.rows, 16) : a.rows;
    const GlobalScale g = global_scale(u2f(a.amax[0]));
    int lr, lb;
    row_map(lr, lb);
    const int r = r0 + lr, b = c0 / 16 + lb;
    float v[16];
    read_row16(smem, lr, lb, v);
    nvfp4_emit(v, g, tile, (a.flags & NVFP4_ROW_SR) != 0, a.row_seed, a.row_stream,
               r < prows && 16 * b < pcols, (size_t)r, b, pcols / 16, a.row_codes, a.row_scales);
  }
  if (a.flags & NVFP4_COL) {
    // Stored tensor = x^T: [cols, rows] padded to [cols or round_up(cols, 16), round_up(rows, 16)].
    const bool tile = (a.flags & NVFP4_COL_TILE) != 0;
    const bool rht = (a.flags & NVFP4_COL_RHT) != 0;
    const int pcols = round_up_int(a.rows, 16);
    const int prows = tile ? round_up_int(a.cols, 16) : a.cols;
    const GlobalScale g = global_scale(u2f(a.amax[rht ? 2 : 0]));
    int lc, gi;
    col_map(lc, gi);
    const int s = c0 + lc, b = r0 / 16 + gi;
    float v[16];
    read_col16(smem, lc, gi, v);
    // quant transforms only the stored rows that exist (16x16 tiles pad after the transform); a
    // zero padding row would transform to +0 anyway (rht16 turns -0 sums into +0).
    if (rht && s < a.cols) rht16(v, a.rht_mask);
    nvfp4_emit(v, g, tile, (a.flags & NVFP4_COL_SR) != 0, a.col_seed, a.col_stream,
               s < prows && 16 * b < pcols, (size_t)s, b, pcols / 16, a.col_codes, a.col_scales);
  }
}

// Amax of a flat f32 buffer: out[0] = max |x| bits over non-NaN elements (Inf included),
// out[1] |= 1 if any NaN. `out` must be zeroed. Grid-stride, float4 loads.
extern "C" __global__ void __launch_bounds__(256) nb_amax(const float* __restrict__ x, u64 n, u32* out) {
  u32 m = 0u, nan = 0u;
  const u64 n4 = n / 4;
  const u64 stride = (u64)gridDim.x * blockDim.x;
  const float4* x4 = reinterpret_cast<const float4*>(x);
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
    float4 v = __ldg(x4 + i);
    m = max(m, abs_bits_nan_ignoring(v.x, nan));
    m = max(m, abs_bits_nan_ignoring(v.y, nan));
    m = max(m, abs_bits_nan_ignoring(v.z, nan));
    m = max(m, abs_bits_nan_ignoring(v.w, nan));
  }
  for (u64 i = 4 * n4 + (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    m = max(m, abs_bits_nan_ignoring(__ldg(x + i), nan));
  }
  warp_atomic_max(out, m);
  warp_atomic_or(out + 1, nan);
}

// Plain and post-RHT amax of the columnwise (transposed) copy, in one pass: out[0]/out[1] as
// nb_amax, out[2] = max |rht16(chunk)| bits, out[3] |= 1 if a transformed value is NaN.
// Each thread transforms one 16-element chunk x[16g .. 16g + 16, c] (stored row c); the 32 lanes
// of a warp read 32 consecutive columns, so every load is one coalesced 128-byte line.
// Requires rows % 16 == 0. Grid: (ceil(cols / 32), ceil(rows / 128)), 256 threads.
extern "C" __global__ void __launch_bounds__(256) nb_amax_rht_col(const float* __restrict__ x, int rows,
                                                                   int cols, u32 mask, u32* out) {
  const int c = (int)blockIdx.x * 32 + ((int)threadIdx.x & 31);
  const int gi = (int)blockIdx.y * 8 + ((int)threadIdx.x >> 5);
  u32 m = 0u, mr = 0u, nan = 0u, nanr = 0u;
  if (c < cols && 16 * gi < rows) {
    float v[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      v[i] = __ldg(x + (size_t)(16 * gi + i) * (size_t)cols + (size_t)c);
      m = max(m, abs_bits_nan_ignoring(v[i], nan));
    }
    rht16(v, mask);
#pragma unroll
    for (int i = 0; i < 16; ++i) mr = max(mr, abs_bits_nan_ignoring(v[i], nanr));
  }
  warp_atomic_max(out, m);
  warp_atomic_or(out + 1, nan);
  warp_atomic_max(out + 2, mr);
  warp_atomic_or(out + 3, nanr);
}

// quant::nvfp4::dequantize: out[r, c] = fl(fl(e2m1 * s_b) * s_dec) over the logical stored
// shape (padding dropped). One thread per pair of elements (one code byte).
extern "C" __global__ void __launch_bounds__(256) nb_nvfp4_dequantize(const unsigned char* __restrict__ codes,
                                                                       const unsigned char* __restrict__ scales,
                                                                       int rows, int cols, int padded_cols,
                                                                       float s_dec, float* __restrict__ out) {
  const u64 pairs = (u64)rows * (u64)(padded_cols / 2);
  const u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < pairs; i += stride) {
    const int r = (int)(i / (u64)(padded_cols / 2));
    const int c = 2 * (int)(i % (u64)(padded_cols / 2));
    const u32 byte = codes[i];
    const float s = ue4m3_value(scales[(size_t)r * (padded_cols / 16) + c / 16]);
    if (c < cols) out[(size_t)r * cols + c] = __fmul_rn(__fmul_rn(e2m1_value(byte & 0xFu), s), s_dec);
    if (c + 1 < cols) out[(size_t)r * cols + c + 1] = __fmul_rn(__fmul_rn(e2m1_value(byte >> 4), s), s_dec);
  }
}

// The emulated-GEMM operand: e2m1 * s_b (exact in BF16: at most 6 significant bits) as BF16,
// [rows, padded_cols] (the padding is zero, so a GEMM over the padded K is exact).
extern "C" __global__ void __launch_bounds__(256) nb_nvfp4_to_bf16(const unsigned char* __restrict__ codes,
                                                                    const unsigned char* __restrict__ scales,
                                                                    int rows, int padded_cols,
                                                                    unsigned short* __restrict__ out) {
  const u64 pairs = (u64)rows * (u64)(padded_cols / 2);
  const u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < pairs; i += stride) {
    const u32 byte = codes[i];
    const u64 e = 2 * i;  // element index in [rows, padded_cols]
    const float s = ue4m3_value(scales[e / 16]);
    const u32 lo = bf16_bits_exact(__fmul_rn(e2m1_value(byte & 0xFu), s));
    const u32 hi = bf16_bits_exact(__fmul_rn(e2m1_value(byte >> 4), s));
    reinterpret_cast<u32*>(out)[i] = lo | (hi << 16);
  }
}

// f32 -> BF16 with round-to-nearest-even (fp-formats round_to_bf16), for BF16 GEMM inputs.
extern "C" __global__ void __launch_bounds__(256) nb_f32_to_bf16(const float* __restrict__ x, u64 n,
                                                                  unsigned short* __restrict__ out) {
  const u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = bf16_bits_exact(__ldg(x + i));
  }
}

// Scale-factor swizzle for the Blackwell block-scaled GEMM (docs/numerics.md#scale-swizzle): the scale
// matrix [rows, scale_cols] goes into 128x4 tiles of a [round_up(rows, 128), round_up(scale_cols,
// 4)] buffer (which must be zeroed first) at
// ((rb * cbg_cnt + cbg) * 32 + d3) * 16 + d4 * 4 + d5 (kernels-cuda/src/swizzle.rs).
extern "C" __global__ void __launch_bounds__(256) nb_swizzle_scales(const unsigned char* __restrict__ in,
                                                                     int rows, int scale_cols,
                                                                     unsigned char* __restrict__ out) {
  const u64 n = (u64)rows * (u64)scale_cols;
  const u64 cbg_cnt = (u64)((scale_cols + 3) / 4);
  const u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const u64 r = i / (u64)scale_cols, c = i % (u64)scale_cols;
    const u64 rb = r / 128, rem = r % 128, d4 = rem / 32, d3 = rem % 32, cbg = c / 4, d5 = c % 4;
    out[((rb * cbg_cnt + cbg) * 32 + d3) * 16 + d4 * 4 + d5] = in[i];
  }
}

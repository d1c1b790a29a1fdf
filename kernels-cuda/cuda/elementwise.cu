// Elementwise and reduction kernels of autograd's op set, bit-exact with autograd's CPU
// kernels (autograd/src/ops/elementwise.rs, reduce.rs, round_bf16.rs, cpu.rs `sum_rows`):
// every element is computed with the same f32 operations in the same order, and every
// reduction adds in the CPU's order (sequential per column / per chunk, chunks in order), so
// no atomics and the same bits on every run. Grid-stride loops over 256-thread blocks.
#include "common.cuh"

using namespace nb;

#define NB_GRID_STRIDE(i, n) \
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (u64)gridDim.x * blockDim.x)

// out[i] = a[i] + b[i % nb] (nb == n: same shape; else b broadcast over leading dimensions).
extern "C" __global__ void __launch_bounds__(256) nb_add(const float* a, const float* b, u64 nb, u64 n,
                                                         float* out) {
  NB_GRID_STRIDE(i, n) { out[i] = __fadd_rn(a[i], b[i % nb]); }
}

// out[i] (+)= a[i] * b[i % nb] (elementwise.rs `mul_into`).
extern "C" __global__ void __launch_bounds__(256) nb_mul(const float* a, const float* b, u64 nb, u64 n, int acc,
                                                         float* out) {
  NB_GRID_STRIDE(i, n) { store_acc(out + i, acc, __fmul_rn(a[i], b[i % nb])); }
}

// out[i] (+)= s * x[i] (elementwise.rs `scale`); s = 1 is `copy_or_add`.
extern "C" __global__ void __launch_bounds__(256) nb_scale(const float* x, float s, u64 n, int acc, float* out) {
  NB_GRID_STRIDE(i, n) { store_acc(out + i, acc, __fmul_rn(s, x[i])); }
}

// out[i] (+)= src[i] (elementwise.rs `copy_or_add`; also the straight-through round_bf16 grad).
extern "C" __global__ void __launch_bounds__(256) nb_copy_or_add(const float* src, u64 n, int acc, float* out) {
  NB_GRID_STRIDE(i, n) { store_acc(out + i, acc, src[i]); }
}

// out[i] (+)= v, with v = (float)(dy[0] * factor) in f64 (reduce.rs backward of sum / mean).
extern "C" __global__ void __launch_bounds__(256) nb_fill_scaled(const float* dy, double factor, u64 n, int acc,
                                                                 float* out) {
  const float v = (float)((double)dy[0] * factor);
  NB_GRID_STRIDE(i, n) { store_acc(out + i, acc, v); }
}

// out[i] = round_to_bf16(x[i]) (round_bf16.rs; NaN passes through).
extern "C" __global__ void __launch_bounds__(256) nb_round_bf16(const float* x, u64 n, float* out) {
  NB_GRID_STRIDE(i, n) { out[i] = round_bf16(x[i]); }
}

// Column sums, stage 1 (cpu.rs `sum_rows`, parallel path): part[c * n + j] = 0 + the rows
// c*per .. min((c+1)*per, rows) of column j, added in row order.
extern "C" __global__ void __launch_bounds__(256) nb_sum_rows_part(const float* src, u64 rows, u64 n, u64 per,
                                                                   u64 nchunks, float* part) {
  NB_GRID_STRIDE(i, nchunks * n) {
    const u64 c = i / n, j = i % n;
    const u64 r1 = min((c + 1) * per, rows);
    float s = 0.0f;
    for (u64 r = c * per; r < r1; ++r) s = __fadd_rn(s, src[r * n + j]);
    part[i] = s;
  }
}

// Column sums, stage 2: dst[j] = (acc ? dst[j] : 0) + part[0][j] + part[1][j] + ... in order.
// With part = the matrix itself and nparts = rows this is `sum_rows`'s small-input path.
extern "C" __global__ void __launch_bounds__(256) nb_sum_rows_finish(const float* part, u64 nparts, u64 n,
                                                                     int acc, float* dst) {
  NB_GRID_STRIDE(j, n) {
    float s = acc ? dst[j] : 0.0f;
    for (u64 c = 0; c < nparts; ++c) s = __fadd_rn(s, part[c * n + j]);
    dst[j] = s;
  }
}

// Sum of all elements in f64 (reduce.rs `sum_f64`), stage 1: part[c] = the f64 sum of
// x[c*chunk .. (c+1)*chunk] in order, one thread per chunk.
extern "C" __global__ void __launch_bounds__(256) nb_sum_f64_part(const float* x, u64 n, u64 chunk, u64 nchunks,
                                                                  double* part) {
  NB_GRID_STRIDE(c, nchunks) {
    const u64 e = min((c + 1) * chunk, n);
    double s = -0.0;
    for (u64 i = c * chunk; i < e; ++i) s += (double)x[i];
    part[c] = s;
  }
}

// Stage 2 (one thread): out[0] = (float)((part[0] + part[1] + ...) * factor).
extern "C" __global__ void __launch_bounds__(256) nb_sum_f64_finish(const double* part, u64 nparts, double factor,
                                                                    float* out) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double s = -0.0;
  for (u64 c = 0; c < nparts; ++c) s += part[c];
  out[0] = (float)(s * factor);
}

// Layout copies of autograd's shape ops (shape_ops.rs): pure copies or f32 adds, so the same
// bits as the CPU.
// out[i] (+)= src[i0*s0 + i1*s1 + i2*s2 + i3*s3] for the output index i = ((i0*o1 + i1)*o2 +
// i2)*o3 + i3: a 4-D axis permutation with the source strides s permuted to output order
// (`swap_axes`, its backward with the inverse permutation).
extern "C" __global__ void __launch_bounds__(256) nb_permute4(const float* src, u64 o1, u64 o2, u64 o3, u64 s0,
                                                              u64 s1, u64 s2, u64 s3, u64 n, int acc, float* out) {
  if (o3 >= 32) {
    // a warp per output row of o3 elements: the index arithmetic (64-bit divisions) once per
    // row instead of once per element; coalesced where the source row is contiguous (s3 = 1)
    const u64 rows = n / o3, warps = (u64)gridDim.x * (blockDim.x / 32);
    const u64 lane = threadIdx.x % 32;
    for (u64 row = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; row < rows; row += warps) {
      const u64 i2 = row % o2, r2 = row / o2;
      const u64 i1 = r2 % o1, i0 = r2 / o1;
      const float* sr = src + i0 * s0 + i1 * s1 + i2 * s2;
      float* orow = out + row * o3;
      for (u64 j = lane; j < o3; j += 32) store_acc(orow + j, acc, sr[j * s3]);
    }
    return;
  }
  NB_GRID_STRIDE(i, n) {
    const u64 i3 = i % o3, r = i / o3;
    const u64 i2 = r % o2, r2 = r / o2;
    const u64 i1 = r2 % o1, i0 = r2 / o1;
    store_acc(out + i, acc, src[i0 * s0 + i1 * s1 + i2 * s2 + i3 * s3]);
  }
}

// Rows r of `rows = n / s` of `s` columns, a warp each (s >= 32) or an element per thread:
// calls f(r, j) for every element; the row split costs one division per row.
template <class F>
NB_DEV void for_row_cols(u64 s, u64 n, F f) {
  if (s >= 32) {
    const u64 rows = n / s, warps = (u64)gridDim.x * (blockDim.x / 32), lane = threadIdx.x % 32;
    for (u64 r = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; r < rows; r += warps)
      for (u64 j = lane; j < s; j += 32) f(r, j);
    return;
  }
  NB_GRID_STRIDE(i, n) { f(i / s, i % s); }
}

// out[r, j] = src[r*c + off + j] for j < s (`split`'s forward), n = rows * s.
extern "C" __global__ void __launch_bounds__(256) nb_cols_get(const float* src, u64 c, u64 off, u64 s, u64 n,
                                                              float* out) {
  for_row_cols(s, n, [&](u64 r, u64 j) { out[r * s + j] = src[r * c + off + j]; });
}

// dst[r*c + off + j] += src[r, j] for j < s (`split`'s backward), n = rows * s.
extern "C" __global__ void __launch_bounds__(256) nb_cols_add(const float* src, u64 c, u64 off, u64 s, u64 n,
                                                              float* dst) {
  for_row_cols(s, n, [&](u64 r, u64 j) {
    const u64 d = r * c + off + j;
    dst[d] = __fadd_rn(dst[d], src[r * s + j]);
  });
}

// A plain f32 GEMM with a fixed summation order, for exact FP32 work and for the emulator
// (which has no cuBLASLt): C[i, j] = alpha * sum_k A(i, k) B(k, j) + beta * C[i, j], with
// A(i, k) = a[i * sa_i + k * sa_k] and B(k, j) = b[k * sb_k + j * sb_j] (any transposition by
// strides); beta == 0 overwrites C without reading it. One thread per output element over
// 16 x 16 shared-memory tiles, k added in order: deterministic. cuBLASLt (kernels-cuda's
// gemm.rs) is the fast path for BF16 / FP8 operands.
#include "common.cuh"

using namespace nb;

extern "C" __global__ void __launch_bounds__(256) nb_sgemm(int m, int n, int k, float alpha, const float* a,
                                                           long long sa_i, long long sa_k, const float* b,
                                                           long long sb_k, long long sb_j, float beta, float* c) {
  __shared__ float as[16][17];
  __shared__ float bs[16][17];
  const int ti = threadIdx.x / 16, tj = threadIdx.x % 16;
  const int i = blockIdx.y * 16 + ti, j = blockIdx.x * 16 + tj;
  float s = 0.0f;
  for (int k0 = 0; k0 < k; k0 += 16) {
    __syncthreads();
    {
      const int ai = blockIdx.y * 16 + ti, ak = k0 + tj;
      as[ti][tj] = ai < m && ak < k ? a[ai * sa_i + ak * sa_k] : 0.0f;
      const int bk = k0 + ti, bj = blockIdx.x * 16 + tj;
      bs[ti][tj] = bk < k && bj < n ? b[bk * sb_k + bj * sb_j] : 0.0f;
    }
    __syncthreads();
    const int kk = min(16, k - k0);
    for (int q = 0; q < kk; ++q) s = __fadd_rn(s, __fmul_rn(as[ti][q], bs[q][tj]));
  }
  if (i < m && j < n) {
    const float v = __fmul_rn(alpha, s);
    c[(long long)i * n + j] = beta == 0.0f ? v : __fadd_rn(v, __fmul_rn(beta, c[(long long)i * n + j]));
  }
}

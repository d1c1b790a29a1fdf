// Gradient norm, clipping and AdamW on FP32 master weights, bit-exact with optim
// (optim/src/clip.rs `grad_norm`, optim/src/adamw.rs `update_impl`):
//
// * nb_sumsq_chunks: the global L2 norm's squares over the same fixed 16K-element chunks of
//   each gradient as optim, eight f64 lanes per chunk (lane l: elements l, l + 8, ...; every
//   square is exact in f64) combined in optim's tree; one chunk per 8 threads.
// * nb_norm_finish (one thread): the chunk sums added in order, sqrt in f64, rounded to f32.
//   The clip coefficient is computed on the host from that norm (optim::clip_coefficient, which
//   rejects a non-finite norm) and applied by AdamW's grad_scale (bit-identical to scaling the
//   gradients first, as optim documents) or by elementwise.cu's nb_scale.
// * nb_adamw: PyTorch's single-tensor AdamW, element by element, coefficients from the host.
#include "common.cuh"

using namespace nb;

struct NormChunk {
  const float* ptr;
  u64 len;
};

extern "C" __global__ void __launch_bounds__(256) nb_sumsq_chunks(const NormChunk* chunks, u64 nchunks,
                                                                  double* part) {
  const u64 c = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 8;
  const int l = threadIdx.x % 8;
  double a = 0.0;
  if (c < nchunks) {
    const float* x = chunks[c].ptr;
    for (u64 i = l; i < chunks[c].len; i += 8) {
      const double v = (double)x[i];
      a += v * v;
    }
  }
  // ((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 + a7)) within each group of 8 lanes
  a += __shfl_xor_sync(0xFFFFFFFFu, a, 4);
  a += __shfl_xor_sync(0xFFFFFFFFu, a, 1);
  a += __shfl_xor_sync(0xFFFFFFFFu, a, 2);
  if (c < nchunks && l == 0) part[c] = a;
}

// out[0] = (float)sqrt(part[0] + part[1] + ...).
extern "C" __global__ void __launch_bounds__(256) nb_norm_finish(const double* part, u64 nparts, float* out) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double s = -0.0;
  for (u64 c = 0; c < nparts; ++c) s += part[c];
  out[0] = (float)sqrt(s);
}

// optim adamw.rs `Coeffs` (f32 values computed on the host in f64 and rounded, as optim does).
struct AdamWCoeffs {
  float grad_scale;
  float decay;
  float w1;
  float one_minus_w1;
  float beta2;
  float one_minus_beta2;
  float bc2_sqrt;
  float eps;
  float neg_step_size;
  int small_w1;  // w1 < 0.5: PyTorch's lerp form m + w1 (g - m), else g - (g - m)(1 - w1)
};

extern "C" __global__ void __launch_bounds__(256) nb_adamw(float* p, const float* g, float* m, float* v, u64 n,
                                                           AdamWCoeffs c) {
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
    const float gi = __fmul_rn(g[i], c.grad_scale);
    const float decayed = __fmul_rn(p[i], c.decay);
    const float mi = m[i];
    const float m_new = c.small_w1 ? __fadd_rn(mi, __fmul_rn(c.w1, __fsub_rn(gi, mi)))
                                   : __fsub_rn(gi, __fmul_rn(__fsub_rn(gi, mi), c.one_minus_w1));
    const float v_new = __fadd_rn(__fmul_rn(v[i], c.beta2), __fmul_rn(__fmul_rn(c.one_minus_beta2, gi), gi));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v_new), c.bc2_sqrt), c.eps);
    p[i] = __fadd_rn(decayed, __fdiv_rn(__fmul_rn(c.neg_step_size, m_new), denom));
    m[i] = m_new;
    v[i] = v_new;
  }
}

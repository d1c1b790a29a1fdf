// Fused softmax cross-entropy, bit-exact with autograd/src/ops/cross_entropy.rs under the
// emulator: one warp per row, lanes 0..15 holding the CPU's 16 max / exp-sum accumulators,
// the tail and lane combination in the CPU's order, Cephes exp. The natural log is the
// platform's `logf` (glibc's under the emulator, as Rust's `f32::ln`; CUDA's, within 1 ulp, on
// a GPU). The mean over rows is an in-order f64 sum, as on the CPU.
#include "common.cuh"

using namespace nb;

// cpu.rs `max` over one row (NaN-propagating), by the calling warp; valid in every lane.
NB_DEV float row_max16(const float* x, int v) {
  const int lane = threadIdx.x % 32;
  const int n16 = v / 16 * 16;
  float m = -__uint_as_float(0x7F800000u);
  u32 nan = 0u;
  if (lane < 16) {
    for (int i = lane; i < n16; i += 16) {
      const float e = x[i];
      m = e > m ? e : m;
      nan |= is_nan(e) ? 1u : 0u;
    }
  }
  float r = -__uint_as_float(0x7F800000u);
  for (int l = 0; l < 16; ++l) {
    const float a = __shfl_sync(0xFFFFFFFFu, m, l);
    r = a > r ? a : r;
    nan |= __shfl_sync(0xFFFFFFFFu, nan, l);
  }
  for (int i = n16; i < v; ++i) {
    const float e = x[i];
    r = e > r ? e : r;
    nan |= is_nan(e) ? 1u : 0u;
  }
  return nan ? __uint_as_float(0x7FC00000u) : r;
}

// Per row r: stats[2r] = loss (0 for an ignored target), stats[2r + 1] = log-sum-exp.
// ignore < 0: no ignore index.
extern "C" __global__ void __launch_bounds__(256) nb_ce_fwd(const float* logits, const unsigned int* targets,
                                                            int rows, int v, long long ignore, float* stats) {
  const int r = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (r >= rows) return;
  const float* x = logits + (u64)r * v;
  const float m = row_max16(x, v);
  float lse;
  if (m == -__uint_as_float(0x7F800000u)) {
    lse = m;
  } else {
    const int n16 = v / 16 * 16;
    float acc = 0.0f;
    if (lane < 16) {
      for (int i = lane; i < n16; i += 16) acc = __fadd_rn(acc, cephes_exp(__fsub_rn(x[i], m)));
    }
    const float tree = __shfl_sync(0xFFFFFFFFu, warp_sum16_tree(acc), 0);
    float tail = -0.0f;
    for (int i = n16; i < v; ++i) tail = __fadd_rn(tail, cephes_exp(__fsub_rn(x[i], m)));
    lse = __fadd_rn(m, logf(__fadd_rn(tree, tail)));
  }
  if (lane == 0) {
    const unsigned int t = targets[r];
    const bool ignored = ignore >= 0 && (long long)t == ignore;
    stats[2 * r] = ignored ? 0.0f : __fsub_rn(lse, x[t]);
    stats[2 * r + 1] = lse;
  }
}

// One thread: out[0] = count == 0 ? 0 : (float)(sum_r (double)stats[2r] / count).
extern "C" __global__ void __launch_bounds__(256) nb_ce_loss(const float* stats, int rows, int count, float* out) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double s = -0.0;
  for (int r = 0; r < rows; ++r) s += (double)stats[2 * r];
  out[0] = count == 0 ? 0.0f : (float)(s / (double)count);
}

// dlogits (+)= scale * exp(x - lse), minus scale at the target; 0 (or unchanged when
// accumulating... the CPU stores 0, i.e. adds 0) for an ignored row. scale = dy[0] / count.
extern "C" __global__ void __launch_bounds__(256) nb_ce_bwd(const float* logits, const unsigned int* targets,
                                                            const float* stats, const float* dy, u64 rows, int v,
                                                            long long ignore, int count, int acc, float* dx) {
  const float scale = count == 0 ? 0.0f : __fdiv_rn(dy[0], (float)count);
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < rows * (u64)v; i += (u64)gridDim.x * blockDim.x) {
    const u64 r = i / v;
    const int j = (int)(i % v);
    const unsigned int t = targets[r];
    if (ignore >= 0 && (long long)t == ignore) {
      store_acc(dx + i, acc, 0.0f);
      continue;
    }
    store_acc(dx + i, acc, __fmul_rn(scale, cephes_exp(__fsub_rn(logits[i], stats[2 * r + 1]))));
    if ((unsigned int)j == t) dx[i] = __fsub_rn(dx[i], scale);
  }
}

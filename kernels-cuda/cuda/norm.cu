// RMSNorm and LayerNorm over the last dimension, forward and backward, bit-exact with
// autograd/src/ops/norm.rs: one warp per row, lanes 0..15 holding the CPU's 16 reduction
// accumulators (element i of each full 16-chunk goes to lane i % 16, in chunk order), lane 0
// adding the tail sequentially, and the CPU's combination of lanes (the `sum16` tree for
// `sum` / `dot`, a sequential sum elsewhere). The gain / bias gradients follow the CPU's
// fixed row chunking: per-chunk partial column sums (nb_norm_bwd_params) added in chunk order
// by elementwise.cu's nb_sum_rows_finish.
#include "common.cuh"

using namespace nb;

// cpu.rs `dot(a, b)` (b == a: `sum_sq`) or `sum(a)` (b == nullptr) of one row of length d,
// computed by the calling warp; valid in every lane.
NB_DEV float row_dot16(const float* a, const float* b, int d) {
  const int lane = threadIdx.x % 32;
  const int n16 = d / 16 * 16;
  float acc = 0.0f;
  if (lane < 16) {
    for (int i = lane; i < n16; i += 16) acc = __fadd_rn(acc, b ? __fmul_rn(a[i], b[i]) : a[i]);
  }
  const float tree = __shfl_sync(0xFFFFFFFFu, warp_sum16_tree(acc), 0);
  // tail: dot starts from 0.0; sum (`iter().sum()`) from -0.0
  float t = b ? 0.0f : -0.0f;
  for (int i = n16; i < d; ++i) t = __fadd_rn(t, b ? __fmul_rn(a[i], b[i]) : a[i]);
  return __fadd_rn(tree, t);
}

// y = x * rs * w, rs = 1 / sqrt(sum_sq(x) / d + eps); rstd[r] = rs when rstd is not null.
extern "C" __global__ void __launch_bounds__(256) nb_rms_fwd(const float* x, const float* w, float eps, int rows,
                                                             int d, float* y, float* rstd) {
  const int r = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (r >= rows) return;  // whole warps leave together
  const float* xr = x + (u64)r * d;
  const float ss = row_dot16(xr, xr, d);
  const float rs = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)d), eps)));
  for (int i = lane; i < d; i += 32) y[(u64)r * d + i] = __fmul_rn(__fmul_rn(xr[i], rs), w[i]);
  if (rstd && lane == 0) rstd[r] = rs;
}

// LayerNorm forward: mu = sum(x) / d; two-pass variance with 16 lanes plus a sequential tail;
// y = (x - mu) * rs * w (+ b); stats[2r] = mu, stats[2r + 1] = rs when stats is not null.
extern "C" __global__ void __launch_bounds__(256) nb_ln_fwd(const float* x, const float* w, const float* b,
                                                            float eps, int rows, int d, float* y, float* stats) {
  const int r = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (r >= rows) return;
  const float* xr = x + (u64)r * d;
  const float mu = __fdiv_rn(row_dot16(xr, nullptr, d), (float)d);
  const int n16 = d / 16 * 16;
  float acc = 0.0f;
  if (lane < 16) {
    for (int i = lane; i < n16; i += 16) {
      const float c = __fsub_rn(xr[i], mu);
      acc = __fadd_rn(acc, __fmul_rn(c, c));
    }
  }
  const float lanes = warp_sum16_seq(acc);
  float tail = -0.0f;
  for (int i = n16; i < d; ++i) {
    const float c = __fsub_rn(xr[i], mu);
    tail = __fadd_rn(tail, __fmul_rn(c, c));
  }
  const float var = __fdiv_rn(__fadd_rn(tail, lanes), (float)d);
  const float rs = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(var, eps)));
  for (int i = lane; i < d; i += 32) {
    const float v = __fmul_rn(__fmul_rn(__fsub_rn(xr[i], mu), rs), w[i]);
    y[(u64)r * d + i] = b ? __fadd_rn(v, b[i]) : v;
  }
  if (stats && lane == 0) {
    stats[2 * r] = mu;
    stats[2 * r + 1] = rs;
  }
}

// Backward, dx (norm.rs `norm_bwd`): layer != 0 for LayerNorm (stats = (mu, rs) per row), else
// RMSNorm (stats = rs per row). dx (+)= per acc.
extern "C" __global__ void __launch_bounds__(256) nb_norm_bwd_dx(int layer, const float* x, const float* w,
                                                                 const float* stats, const float* dy, int rows,
                                                                 int d, int acc, float* dx) {
  const int r = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (r >= rows) return;
  const float* xr = x + (u64)r * d;
  const float* dyr = dy + (u64)r * d;
  const float mu = layer ? stats[2 * r] : 0.0f;
  const float rs = layer ? stats[2 * r + 1] : stats[r];
  const int n16 = d / 16 * 16;
  float sgx = 0.0f, sg = 0.0f;
  if (lane < 16) {
    for (int i = lane; i < n16; i += 16) {
      const float g = __fmul_rn(w[i], dyr[i]);
      sgx = __fadd_rn(sgx, __fmul_rn(g, __fsub_rn(xr[i], mu)));
      sg = __fadd_rn(sg, g);
    }
  }
  const float lx = warp_sum16_seq(sgx), lg = warp_sum16_seq(sg);
  float ta = 0.0f, tb = 0.0f;
  for (int i = n16; i < d; ++i) {
    const float g = __fmul_rn(w[i], dyr[i]);
    ta = __fadd_rn(ta, __fmul_rn(g, __fsub_rn(xr[i], mu)));
    tb = __fadd_rn(tb, g);
  }
  const float s_gx = __fmul_rn(__fadd_rn(ta, lx), rs);
  const float s_g = __fadd_rn(tb, lg);
  const float inv_d = __fdiv_rn(1.0f, (float)d);
  float* dxr = dx + (u64)r * d;
  if (!layer) {
    const float c = __fmul_rn(__fmul_rn(s_gx, inv_d), rs);
    for (int i = lane; i < d; i += 32) {
      const float v = __fsub_rn(__fmul_rn(rs, __fmul_rn(w[i], dyr[i])), __fmul_rn(__fmul_rn(xr[i], rs), c));
      store_acc(dxr + i, acc, v);
    }
  } else {
    const float mg = __fmul_rn(s_g, inv_d), mgx = __fmul_rn(s_gx, inv_d);
    for (int i = lane; i < d; i += 32) {
      const float xh = __fmul_rn(__fsub_rn(xr[i], mu), rs);
      const float v = __fmul_rn(rs, __fsub_rn(__fsub_rn(__fmul_rn(w[i], dyr[i]), mg), __fmul_rn(xh, mgx)));
      store_acc(dxr + i, acc, v);
    }
  }
}

// Backward, gain / bias partials: for chunk c of `per` rows, pw[c * d + j] = 0 + sum over the
// chunk's rows in order of dy * (x - mu) * rs; pb[c * d + j] = 0 + sum of dy (pb may be null).
extern "C" __global__ void __launch_bounds__(256) nb_norm_bwd_params(int layer, const float* x,
                                                                     const float* stats, const float* dy,
                                                                     int rows, int d, int per, int nchunks,
                                                                     float* pw, float* pb) {
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (u64)nchunks * d;
       i += (u64)gridDim.x * blockDim.x) {
    const int c = (int)(i / d), j = (int)(i % d);
    const int r1 = min((c + 1) * per, rows);
    float sw = 0.0f, sb = 0.0f;
    for (int r = c * per; r < r1; ++r) {
      const float mu = layer ? stats[2 * r] : 0.0f;
      const float rs = layer ? stats[2 * r + 1] : stats[r];
      const float g = dy[(u64)r * d + j];
      sw = __fadd_rn(sw, __fmul_rn(__fmul_rn(g, __fsub_rn(x[(u64)r * d + j], mu)), rs));
      sb = __fadd_rn(sb, g);
    }
    if (pw) pw[i] = sw;
    if (pb) pb[i] = sb;
  }
}

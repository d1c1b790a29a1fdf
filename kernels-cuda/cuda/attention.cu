// Fused causal attention on [BH, T, D] tensors (D <= 128), forward saving the per-row
// log-sum-exp and a tiled backward, deterministic without atomics:
//
// * nb_attn_fwd: one warp per query row, 8 rows per block; key / value tiles of 32 rows in
//   shared memory; lane j scores key j (s = scale * q.k), online softmax per tile (Cephes exp),
//   lane c accumulates output columns c, c + 32, ...; o = acc / l, lse = m + log(l).
// * nb_attn_delta: delta[i] = dO_i . O_i.
// * nb_attn_bwd_dq: one warp per query row, recomputes P = exp(S - lse) tile by tile,
//   dS = P * (dO.V - delta), dQ = scale * dS K.
// * nb_attn_bwd_dkdv: one warp per key row, over the query tiles that see it:
//   dV = P^T dO, dK = scale * dS^T Q.
//
// With `bf16` set (BF16 attention, autograd/src/ops/attention_products.rs) every operand of the
// products is rounded to BF16 as on the CPU: Q, K, V and dO as they are loaded, the
// probabilities P and the score gradients dS before they multiply. The forward then runs in two
// passes over the keys, the online softmax for the log-sum-exp first and then
// o = sum bf16(exp(s - lse)) v, so that it rounds the normalised probabilities as the CPU does.
//
// BF16 attention on the tensor cores (kernels_cuda::train, `attention_fwd` / `attention_bwd`
// with `bf16` set) materialises a group of heads' score matrices instead: cuBLASLt forms
// S = scale * bf16(Q) bf16(K)^T in f32, and the two kernels below turn scores into the BF16
// operands of the next products, with the same formulas as the fused kernels above:
// * nb_attn_softmax_bf16: one warp per query row: m = max of the visible scores,
//   l = sum exp(s - m), lse = m + log(l), P = bf16(exp(s - lse)) (0 past the diagonal);
// * nb_attn_grad_bf16: elementwise over the rows' visible entries: p = exp(s - lse),
//   bf16(p) for dV = P^T dO and dS = bf16(p * (dP - delta)) for dQ and dK.
//
// Every sum has a fixed order (lane order, then tile order), so every run gives the same bits.
// The CPU op (autograd/src/ops/attention.rs) uses quant's blocked GEMMs, whose summation order
// differs: autograd/tests/cuda_emulated.rs compares within a derived bound, not bit for bit.
#include "common.cuh"

using namespace nb;

#define AT_KT 32
#define AT_DMAX 128
#define AT_ROWS 8

NB_DEV float neg_inf() { return -__uint_as_float(0x7F800000u); }

// x rounded to BF16 when `on` (BF16 attention), else x.
NB_DEV float op_round(float x, int on) { return on ? round_bf16(x) : x; }

// Loads rows j0 .. j0 + 31 of a [t, d] matrix into `dst` (row stride `ld`), zeros past t,
// rounded to BF16 when `rnd`.
NB_DEV void load_tile32(float* dst, int ld, const float* src, int j0, int t, int d, int rnd) {
  for (int e = threadIdx.x; e < AT_KT * d; e += 256) {
    const int jj = e / d, c = e % d, j = j0 + jj;
    dst[jj * ld + c] = j < t ? op_round(src[(u64)j * d + c], rnd) : 0.0f;
  }
}

// a . b over d elements from shared memory, sequential.
NB_DEV float dot_seq(const float* a, const float* b, int d) {
  float s = 0.0f;
  for (int c = 0; c < d; ++c) s = __fadd_rn(s, __fmul_rn(a[c], b[c]));
  return s;
}

extern "C" __global__ void __launch_bounds__(256) nb_attn_fwd(const float* q, const float* k, const float* v, int t,
                                                              int d, float scale, int bf16, float* o, float* lse) {
  __shared__ float ks[AT_KT * (AT_DMAX + 1)];
  __shared__ float vs[AT_KT * AT_DMAX];
  __shared__ float qs[AT_ROWS * AT_DMAX];
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  const u64 base = (u64)blockIdx.y * t * d;
  const int i = blockIdx.x * AT_ROWS + w;
  const bool active = i < t;
  for (int c = lane; c < d; c += 32)
    qs[w * AT_DMAX + c] = active ? op_round(q[base + (u64)i * d + c], bf16) : 0.0f;
  const int last = min((int)blockIdx.x * AT_ROWS + AT_ROWS - 1, t - 1);
  float m = neg_inf(), l = 0.0f, acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int j0 = 0; j0 <= last; j0 += AT_KT) {
    __syncthreads();
    load_tile32(ks, AT_DMAX + 1, k + base, j0, t, d, bf16);
    if (!bf16) load_tile32(vs, AT_DMAX, v + base, j0, t, d, 0);
    __syncthreads();
    if (active && j0 <= i) {  // warp-uniform
      const int j = j0 + lane;
      const bool vis = j <= i;
      const float s = __fmul_rn(scale, dot_seq(qs + w * AT_DMAX, ks + lane * (AT_DMAX + 1), d));
      const float mn = fmaxf(m, warp_max(vis ? s : neg_inf()));
      const float p = vis ? cephes_exp(__fsub_rn(s, mn)) : 0.0f;
      const float alpha = cephes_exp(__fsub_rn(m, mn));
      l = __fadd_rn(__fmul_rn(l, alpha), warp_sum(p));
      m = mn;
      if (bf16) continue;  // the second pass below multiplies
      const int nvis = min(AT_KT, i - j0 + 1);
#pragma unroll
      for (int cc = 0; cc < 4; ++cc) acc[cc] = __fmul_rn(acc[cc], alpha);
      for (int jj = 0; jj < nvis; ++jj) {
        const float pj = __shfl_sync(0xFFFFFFFFu, p, jj);
#pragma unroll
        for (int cc = 0; cc < 4; ++cc) {
          const int c = lane + 32 * cc;
          if (c < d) acc[cc] = __fadd_rn(acc[cc], __fmul_rn(pj, vs[jj * AT_DMAX + c]));
        }
      }
    }
  }
  const float li = __fadd_rn(m, logf(l));
  if (bf16) {
    // second pass: o = sum over visible keys of bf16(exp(s - lse)) bf16(v)
    for (int j0 = 0; j0 <= last; j0 += AT_KT) {
      __syncthreads();
      load_tile32(ks, AT_DMAX + 1, k + base, j0, t, d, 1);
      load_tile32(vs, AT_DMAX, v + base, j0, t, d, 1);
      __syncthreads();
      if (active && j0 <= i) {
        const bool vis = j0 + lane <= i;
        const float s = __fmul_rn(scale, dot_seq(qs + w * AT_DMAX, ks + lane * (AT_DMAX + 1), d));
        const float p = vis ? round_bf16(cephes_exp(__fsub_rn(s, li))) : 0.0f;
        const int nvis = min(AT_KT, i - j0 + 1);
        for (int jj = 0; jj < nvis; ++jj) {
          const float pj = __shfl_sync(0xFFFFFFFFu, p, jj);
#pragma unroll
          for (int cc = 0; cc < 4; ++cc) {
            const int c = lane + 32 * cc;
            if (c < d) acc[cc] = __fadd_rn(acc[cc], __fmul_rn(pj, vs[jj * AT_DMAX + c]));
          }
        }
      }
    }
  }
  if (!active) return;
#pragma unroll
  for (int cc = 0; cc < 4; ++cc) {
    const int c = lane + 32 * cc;
    if (c < d) o[base + (u64)i * d + c] = bf16 ? acc[cc] : __fdiv_rn(acc[cc], l);
  }
  if (lane == 0) lse[(u64)blockIdx.y * t + i] = li;
}

// delta[r] = dO_r . O_r for every row of [rows, d]; one warp per row.
extern "C" __global__ void __launch_bounds__(256) nb_attn_delta(const float* dout, const float* out, u64 rows,
                                                                int d, float* delta) {
  const u64 r = (u64)blockIdx.x * AT_ROWS + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  float s = 0.0f;
  for (int c = lane; c < d; c += 32) s = __fadd_rn(s, __fmul_rn(dout[r * d + c], out[r * d + c]));
  s = warp_sum(s);
  if (lane == 0) delta[r] = s;
}

extern "C" __global__ void __launch_bounds__(256) nb_attn_bwd_dq(const float* q, const float* k, const float* v,
                                                                 const float* dout, const float* lse,
                                                                 const float* delta, int t, int d, float scale,
                                                                 int bf16, int acc_dq, float* dq) {
  __shared__ float ks[AT_KT * (AT_DMAX + 1)];
  __shared__ float vs[AT_KT * (AT_DMAX + 1)];
  __shared__ float qs[AT_ROWS * AT_DMAX];
  __shared__ float dos[AT_ROWS * AT_DMAX];
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  const u64 base = (u64)blockIdx.y * t * d;
  const int i = blockIdx.x * AT_ROWS + w;
  const bool active = i < t;
  for (int c = lane; c < d; c += 32) {
    qs[w * AT_DMAX + c] = active ? op_round(q[base + (u64)i * d + c], bf16) : 0.0f;
    dos[w * AT_DMAX + c] = active ? op_round(dout[base + (u64)i * d + c], bf16) : 0.0f;
  }
  const float li = active ? lse[(u64)blockIdx.y * t + i] : 0.0f;
  const float di = active ? delta[(u64)blockIdx.y * t + i] : 0.0f;
  const int last = min((int)blockIdx.x * AT_ROWS + AT_ROWS - 1, t - 1);
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int j0 = 0; j0 <= last; j0 += AT_KT) {
    __syncthreads();
    load_tile32(ks, AT_DMAX + 1, k + base, j0, t, d, bf16);
    load_tile32(vs, AT_DMAX + 1, v + base, j0, t, d, bf16);
    __syncthreads();
    if (active && j0 <= i) {
      const int j = j0 + lane;
      const bool vis = j <= i;
      const float s = __fmul_rn(scale, dot_seq(qs + w * AT_DMAX, ks + lane * (AT_DMAX + 1), d));
      const float p = vis ? cephes_exp(__fsub_rn(s, li)) : 0.0f;
      const float dp = dot_seq(dos + w * AT_DMAX, vs + lane * (AT_DMAX + 1), d);
      const float ds = op_round(__fmul_rn(p, __fsub_rn(dp, di)), bf16);
      const int nvis = min(AT_KT, i - j0 + 1);
      for (int jj = 0; jj < nvis; ++jj) {
        const float dsj = __shfl_sync(0xFFFFFFFFu, ds, jj);
#pragma unroll
        for (int cc = 0; cc < 4; ++cc) {
          const int c = lane + 32 * cc;
          if (c < d) acc[cc] = __fadd_rn(acc[cc], __fmul_rn(dsj, ks[jj * (AT_DMAX + 1) + c]));
        }
      }
    }
  }
  if (!active) return;
#pragma unroll
  for (int cc = 0; cc < 4; ++cc) {
    const int c = lane + 32 * cc;
    if (c < d) store_acc(dq + base + (u64)i * d + c, acc_dq, __fmul_rn(scale, acc[cc]));
  }
}

extern "C" __global__ void __launch_bounds__(256) nb_attn_bwd_dkdv(const float* q, const float* k, const float* v,
                                                                   const float* dout, const float* lse,
                                                                   const float* delta, int t, int d, float scale,
                                                                   int bf16, int acc_dk, float* dk, int acc_dv,
                                                                   float* dv) {
  __shared__ float qs[AT_KT * (AT_DMAX + 1)];
  __shared__ float dos[AT_KT * (AT_DMAX + 1)];
  __shared__ float kw[AT_ROWS * AT_DMAX];
  __shared__ float vw[AT_ROWS * AT_DMAX];
  __shared__ float ls[AT_KT];
  __shared__ float dls[AT_KT];
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  const u64 base = (u64)blockIdx.y * t * d;
  const u64 sbase = (u64)blockIdx.y * t;
  const int jrow = blockIdx.x * AT_ROWS + w;
  const bool active = jrow < t;
  for (int c = lane; c < d; c += 32) {
    kw[w * AT_DMAX + c] = active ? op_round(k[base + (u64)jrow * d + c], bf16) : 0.0f;
    vw[w * AT_DMAX + c] = active ? op_round(v[base + (u64)jrow * d + c], bf16) : 0.0f;
  }
  float ak[4] = {0.0f, 0.0f, 0.0f, 0.0f}, av[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const int first = (int)blockIdx.x * AT_ROWS / AT_KT * AT_KT;
  for (int i0 = first; i0 < t; i0 += AT_KT) {
    __syncthreads();
    load_tile32(qs, AT_DMAX + 1, q + base, i0, t, d, bf16);
    load_tile32(dos, AT_DMAX + 1, dout + base, i0, t, d, bf16);
    if (threadIdx.x < AT_KT) {
      const int i = i0 + threadIdx.x;
      ls[threadIdx.x] = i < t ? lse[sbase + i] : 0.0f;
      dls[threadIdx.x] = i < t ? delta[sbase + i] : 0.0f;
    }
    __syncthreads();
    if (active && i0 + AT_KT - 1 >= jrow) {  // warp-uniform
      const int i = i0 + lane;
      const bool vis = i >= jrow && i < t;
      const float s = __fmul_rn(scale, dot_seq(qs + lane * (AT_DMAX + 1), kw + w * AT_DMAX, d));
      const float p = vis ? cephes_exp(__fsub_rn(s, ls[lane])) : 0.0f;
      const float dp = dot_seq(dos + lane * (AT_DMAX + 1), vw + w * AT_DMAX, d);
      const float ds = op_round(__fmul_rn(p, __fsub_rn(dp, dls[lane])), bf16);
      const float pr = op_round(p, bf16);
      const int lo = max(jrow - i0, 0), hi = min(AT_KT, t - i0);
      for (int ii = lo; ii < hi; ++ii) {
        const float pi = __shfl_sync(0xFFFFFFFFu, pr, ii);
        const float dsi = __shfl_sync(0xFFFFFFFFu, ds, ii);
#pragma unroll
        for (int cc = 0; cc < 4; ++cc) {
          const int c = lane + 32 * cc;
          if (c < d) {
            av[cc] = __fadd_rn(av[cc], __fmul_rn(pi, dos[ii * (AT_DMAX + 1) + c]));
            ak[cc] = __fadd_rn(ak[cc], __fmul_rn(dsi, qs[ii * (AT_DMAX + 1) + c]));
          }
        }
      }
    }
  }
  if (!active) return;
#pragma unroll
  for (int cc = 0; cc < 4; ++cc) {
    const int c = lane + 32 * cc;
    if (c < d) {
      store_acc(dk + base + (u64)jrow * d + c, acc_dk, __fmul_rn(scale, ak[cc]));
      store_acc(dv + base + (u64)jrow * d + c, acc_dv, av[cc]);
    }
  }
}

// Row softmax of `rows` score rows of `t` columns (`rows` a multiple of t: the query index is
// the row mod t), causal: lse[r] = m + log(sum_j<=i exp(s_ij - m)), p[r, j] = bf16 bits of
// exp(s_ij - lse) for j <= i, 0 after. One warp per row; lane-strided sums, then the warp's.
extern "C" __global__ void __launch_bounds__(256) nb_attn_softmax_bf16(const float* __restrict__ s, u64 rows,
                                                                       int t, float* __restrict__ lse,
                                                                       unsigned short* __restrict__ p) {
  const u64 r = (u64)blockIdx.x * AT_ROWS + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const int i = (int)(r % (u64)t);
  const float* row = s + r * (u64)t;
  float m = neg_inf();
  for (int j = lane; j <= i; j += 32) m = fmaxf(m, row[j]);
  m = warp_max(m);
  float l = 0.0f;
  for (int j = lane; j <= i; j += 32) l = __fadd_rn(l, cephes_exp(__fsub_rn(row[j], m)));
  l = warp_sum(l);
  const float li = __fadd_rn(m, logf(l));
  unsigned short* out = p + r * (u64)t;
  for (int j = lane; j < t; j += 32) out[j] = j <= i ? bf16_bits_exact(cephes_exp(__fsub_rn(row[j], li))) : 0;
  if (lane == 0) lse[r] = li;
}

// The backward's BF16 operands from the recomputed scores `s` and dP = dO V^T of `rows` rows of
// `t` columns (query index = row mod t): p = exp(s - lse) and, for j <= i, pb = bf16(p) and
// ds = bf16(p * (dp - delta)); both 0 for j > i. Grid-stride over the elements.
extern "C" __global__ void __launch_bounds__(256) nb_attn_grad_bf16(const float* __restrict__ s,
                                                                    const float* __restrict__ dp,
                                                                    const float* __restrict__ lse,
                                                                    const float* __restrict__ delta, u64 rows, int t,
                                                                    unsigned short* __restrict__ pb,
                                                                    unsigned short* __restrict__ ds) {
  const u64 n = rows * (u64)t, stride = (u64)gridDim.x * blockDim.x;
  for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
    const u64 r = e / (u64)t;
    const int j = (int)(e - r * (u64)t), i = (int)(r % (u64)t);
    if (j > i) {
      pb[e] = 0;
      ds[e] = 0;
      continue;
    }
    const float pr = cephes_exp(__fsub_rn(s[e], lse[r]));
    pb[e] = bf16_bits_exact(pr);
    ds[e] = bf16_bits_exact(__fmul_rn(pr, __fsub_rn(dp[e], delta[r])));
  }
}

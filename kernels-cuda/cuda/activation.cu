// Pointwise non-linearities, bit-exact with autograd/src/ops/activation.rs: GELU (tanh
// approximation), SiLU and SwiGLU forward and backward, with autograd's Cephes exp / tanh /
// sigmoid (common.cuh) and the CPU's operation order; backward kernels write or accumulate.
#include "common.cuh"

using namespace nb;

#define NB_GRID_STRIDE(i, n) \
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (u64)gridDim.x * blockDim.x)

constexpr float kSqrt2OverPi = 0.7978846f;
constexpr float kGeluC = 0.044715f;

// activation.rs `gelu_fwd`: 0.5 x (1 + tanh(sqrt(2/pi) (x + c x^3))).
NB_DEV float gelu_fwd(float x) {
  const float x3 = __fmul_rn(__fmul_rn(__fmul_rn(kGeluC, x), x), x);
  const float u = __fmul_rn(kSqrt2OverPi, __fadd_rn(x, x3));
  return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, cpu_tanh(u)));
}

// activation.rs `gelu_bwd`.
NB_DEV float gelu_bwd(float x) {
  const float x2 = __fmul_rn(x, x);
  const float t = cpu_tanh(__fmul_rn(kSqrt2OverPi, __fadd_rn(x, __fmul_rn(__fmul_rn(kGeluC, x2), x))));
  const float a = __fmul_rn(0.5f, __fadd_rn(1.0f, t));
  float b = __fmul_rn(__fmul_rn(0.5f, x), __fsub_rn(1.0f, __fmul_rn(t, t)));
  b = __fmul_rn(b, kSqrt2OverPi);
  b = __fmul_rn(b, __fadd_rn(1.0f, __fmul_rn(__fmul_rn(3.0f, kGeluC), x2)));
  return __fadd_rn(a, b);
}

// activation.rs `silu_fwd`: x / (1 + e^{-x}).
NB_DEV float silu_fwd(float x) { return __fdiv_rn(x, __fadd_rn(1.0f, cephes_exp(-x))); }

// activation.rs `silu_grad`: s (1 + x (1 - s)), s = sigmoid(x).
NB_DEV float silu_grad(float x) {
  const float s = cpu_sigmoid(x);
  return __fmul_rn(s, __fadd_rn(1.0f, __fmul_rn(x, __fsub_rn(1.0f, s))));
}

#define NB_ACT_GELU 0
#define NB_ACT_SILU 1

// y[i] = f(x[i]).
extern "C" __global__ void __launch_bounds__(256) nb_act_fwd(const float* x, u64 n, int kind, float* y) {
  NB_GRID_STRIDE(i, n) { y[i] = kind == NB_ACT_GELU ? gelu_fwd(x[i]) : silu_fwd(x[i]); }
}

// dx[i] (+)= dy[i] * f'(x[i]).
extern "C" __global__ void __launch_bounds__(256) nb_act_bwd(const float* x, const float* dy, u64 n, int kind,
                                                             int acc, float* dx) {
  NB_GRID_STRIDE(i, n) {
    const float d = kind == NB_ACT_GELU ? gelu_bwd(x[i]) : silu_grad(x[i]);
    store_acc(dx + i, acc, __fmul_rn(dy[i], d));
  }
}

// SwiGLU: y = gate * sigmoid(gate) * up.
extern "C" __global__ void __launch_bounds__(256) nb_swiglu_fwd(const float* gate, const float* up, u64 n,
                                                                float* y) {
  NB_GRID_STRIDE(i, n) {
    const float g = gate[i];
    y[i] = __fmul_rn(__fmul_rn(g, cpu_sigmoid(g)), up[i]);
  }
}

// SwiGLU backward: dgate (+)= dy * up * silu'(gate); dup (+)= dy * gate * sigmoid(gate).
// Either output may be null (not wanted).
extern "C" __global__ void __launch_bounds__(256) nb_swiglu_bwd(const float* gate, const float* up,
                                                                const float* dy, u64 n, int acc_gate,
                                                                float* dgate, int acc_up, float* dup) {
  NB_GRID_STRIDE(i, n) {
    const float g = gate[i];
    if (dgate) store_acc(dgate + i, acc_gate, __fmul_rn(__fmul_rn(dy[i], up[i]), silu_grad(g)));
    if (dup) store_acc(dup + i, acc_up, __fmul_rn(__fmul_rn(dy[i], g), cpu_sigmoid(g)));
  }
}

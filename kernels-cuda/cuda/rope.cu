// Rotary position embedding, "rotate half" convention, bit-exact with autograd/src/ops/rope.rs:
// the [T, D/2] cosine and sine table is computed on the host in f64 exactly as autograd does
// and uploaded; inverse != 0 rotates by minus the angles (the backward pass).
#include "common.cuh"

using namespace nb;

// out (+)= rope(x) for x of `rows` rows of d (row r at position r % t).
extern "C" __global__ void __launch_bounds__(256) nb_rope(const float* x, const float* tab, u64 rows, int t, int d,
                                                          int inverse, int acc, float* out) {
  const int h = d / 2;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < rows * (u64)h; i += (u64)gridDim.x * blockDim.x) {
    const u64 r = i / h;
    const int k = (int)(i % h);
    const int p = (int)(r % (u64)t);
    const float cs = tab[(u64)p * h + k];
    const float s = tab[((u64)t + p) * h + k];
    const float sn = inverse ? -s : s;
    const float x1 = x[r * d + k], x2 = x[r * d + h + k];
    store_acc(out + r * d + k, acc, __fsub_rn(__fmul_rn(x1, cs), __fmul_rn(x2, sn)));
    store_acc(out + r * d + h + k, acc, __fadd_rn(__fmul_rn(x1, sn), __fmul_rn(x2, cs)));
  }
}

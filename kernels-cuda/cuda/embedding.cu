// Embedding lookup and its backward, bit-exact with autograd/src/ops/embedding.rs. The
// backward's scatter-add is deterministic without atomics: the host sorts the token positions
// by id (stable, a CSR: `offsets[v]..offsets[v + 1]` index `order`), and one thread per table
// element adds that element's rows in position order, exactly the CPU's sequence of additions.
#include "common.cuh"

using namespace nb;

// out[r, :] = table[ids[r], :] (ids checked < vocab on the host).
extern "C" __global__ void __launch_bounds__(256) nb_embedding_fwd(const float* table, const unsigned int* ids,
                                                                   u64 rows, int d, float* out) {
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < rows * (u64)d; i += (u64)gridDim.x * blockDim.x) {
    const u64 r = i / d;
    out[i] = table[(u64)ids[r] * d + i % d];
  }
}

// gt[v, j] = (acc ? gt[v, j] : 0) + dy[order[k], j] for k in offsets[v] .. offsets[v + 1].
extern "C" __global__ void __launch_bounds__(256) nb_embedding_bwd(const float* dy, const unsigned int* offsets,
                                                                   const unsigned int* order, u64 vocab, int d,
                                                                   int acc, float* gt) {
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < vocab * (u64)d; i += (u64)gridDim.x * blockDim.x) {
    const u64 v = i / d;
    const int j = (int)(i % d);
    float s = acc ? gt[i] : 0.0f;
    for (unsigned int k = offsets[v]; k < offsets[v + 1]; ++k) s = __fadd_rn(s, dy[(u64)order[k] * d + j]);
    gt[i] = s;
  }
}

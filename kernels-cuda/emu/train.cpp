// The training-step kernels of ../cuda compiled for the CPU through cuda_emu.h, behind a C ABI
// that `kernels_cuda::emu` (feature `emu`) loads. Each `emu_<kernel>(gx, gy, args...)` runs
// the kernel on a gx x gy grid of 256-thread blocks. Build (the loader does this itself):
//   g++ -std=c++20 -O2 -ffp-contract=off -fno-fast-math -fPIC -shared -pthread \
//       -I../cuda -include cuda_emu.h train.cpp -o libnbemu_train.so
#include "cuda_emu.h"

#include "../cuda/activation.cu"
#include "../cuda/attention.cu"
#include "../cuda/cross_entropy.cu"
#include "../cuda/elementwise.cu"
#include "../cuda/embedding.cu"
#include "../cuda/gemm.cu"
#include "../cuda/norm.cu"
#include "../cuda/optim.cu"
#include "../cuda/rope.cu"

#define EMU(name, params, args)                                 \
  extern "C" void emu_##name(unsigned gx, unsigned gy, params) { \
    emu::launch(dim3{gx, gy, 1}, [&] { name args; });            \
  }
#define P(...) __VA_ARGS__

EMU(nb_add, P(const float* a, const float* b, u64 nb, u64 n, float* out), (a, b, nb, n, out))
EMU(nb_mul, P(const float* a, const float* b, u64 nb, u64 n, int acc, float* out), (a, b, nb, n, acc, out))
EMU(nb_scale, P(const float* x, float s, u64 n, int acc, float* out), (x, s, n, acc, out))
EMU(nb_copy_or_add, P(const float* src, u64 n, int acc, float* out), (src, n, acc, out))
EMU(nb_fill_scaled, P(const float* dy, double f, u64 n, int acc, float* out), (dy, f, n, acc, out))
EMU(nb_round_bf16, P(const float* x, u64 n, float* out), (x, n, out))
EMU(nb_sum_rows_part, P(const float* src, u64 rows, u64 n, u64 per, u64 nchunks, float* part),
    (src, rows, n, per, nchunks, part))
EMU(nb_sum_rows_finish, P(const float* part, u64 nparts, u64 n, int acc, float* dst), (part, nparts, n, acc, dst))
EMU(nb_sum_f64_part, P(const float* x, u64 n, u64 chunk, u64 nchunks, double* part), (x, n, chunk, nchunks, part))
EMU(nb_sum_f64_finish, P(const double* part, u64 nparts, double f, float* out), (part, nparts, f, out))
EMU(nb_act_fwd, P(const float* x, u64 n, int kind, float* y), (x, n, kind, y))
EMU(nb_act_bwd, P(const float* x, const float* dy, u64 n, int kind, int acc, float* dx), (x, dy, n, kind, acc, dx))
EMU(nb_swiglu_fwd, P(const float* g, const float* u, u64 n, float* y), (g, u, n, y))
EMU(nb_swiglu_bwd,
    P(const float* g, const float* u, const float* dy, u64 n, int ag, float* dg, int au, float* du),
    (g, u, dy, n, ag, dg, au, du))
EMU(nb_rms_fwd, P(const float* x, const float* w, float eps, int rows, int d, float* y, float* rstd),
    (x, w, eps, rows, d, y, rstd))
EMU(nb_ln_fwd, P(const float* x, const float* w, const float* b, float eps, int rows, int d, float* y, float* st),
    (x, w, b, eps, rows, d, y, st))
EMU(nb_norm_bwd_dx,
    P(int layer, const float* x, const float* w, const float* st, const float* dy, int rows, int d, int acc,
      float* dx),
    (layer, x, w, st, dy, rows, d, acc, dx))
EMU(nb_norm_bwd_params,
    P(int layer, const float* x, const float* st, const float* dy, int rows, int d, int per, int nchunks, float* pw,
      float* pb),
    (layer, x, st, dy, rows, d, per, nchunks, pw, pb))
EMU(nb_rope, P(const float* x, const float* tab, u64 rows, int t, int d, int inv, int acc, float* out),
    (x, tab, rows, t, d, inv, acc, out))
EMU(nb_embedding_fwd, P(const float* table, const unsigned* ids, u64 rows, int d, float* out),
    (table, ids, rows, d, out))
EMU(nb_embedding_bwd,
    P(const float* dy, const unsigned* off, const unsigned* order, u64 vocab, int d, int acc, float* gt),
    (dy, off, order, vocab, d, acc, gt))
EMU(nb_ce_fwd, P(const float* x, const unsigned* t, int rows, int v, long long ig, float* st), (x, t, rows, v, ig, st))
EMU(nb_ce_loss, P(const float* st, int rows, int count, float* out), (st, rows, count, out))
EMU(nb_ce_bwd,
    P(const float* x, const unsigned* t, const float* st, const float* dy, u64 rows, int v, long long ig, int count,
      int acc, float* dx),
    (x, t, st, dy, rows, v, ig, count, acc, dx))
EMU(nb_attn_fwd, P(const float* q, const float* k, const float* v, int t, int d, float sc, float* o, float* lse),
    (q, k, v, t, d, sc, o, lse))
EMU(nb_attn_delta, P(const float* dout, const float* out, u64 rows, int d, float* delta), (dout, out, rows, d, delta))
EMU(nb_attn_bwd_dq,
    P(const float* q, const float* k, const float* v, const float* dout, const float* lse, const float* delta, int t,
      int d, float sc, int acc, float* dq),
    (q, k, v, dout, lse, delta, t, d, sc, acc, dq))
EMU(nb_attn_bwd_dkdv,
    P(const float* q, const float* k, const float* v, const float* dout, const float* lse, const float* delta, int t,
      int d, float sc, int ak, float* dk, int av, float* dv),
    (q, k, v, dout, lse, delta, t, d, sc, ak, dk, av, dv))
EMU(nb_sumsq_chunks, P(const NormChunk* chunks, u64 n, double* part), (chunks, n, part))
EMU(nb_norm_finish, P(const double* part, u64 n, float* out), (part, n, out))
EMU(nb_adamw, P(float* p, const float* g, float* m, float* v, u64 n, const AdamWCoeffs* c), (p, g, m, v, n, *c))
EMU(nb_sgemm,
    P(int m, int n, int k, float alpha, const float* a, long long sai, long long sak, const float* b, long long sbk,
      long long sbj, float beta, float* c),
    (m, n, k, alpha, a, sai, sak, b, sbk, sbj, beta, c))

// A tiny CUDA emulator for the kernels in ../cuda: just enough of the CUDA C++ device API to
// compile them as host C++20 and run them on the CPU, so that `tests/emulated.rs` can compare
// their results with `quant` bit for bit on machines without a GPU (CI).
//
// Execution model: a launch starts 256 OS threads (one per CUDA thread of a block) that run the
// blocks of the grid one after another; `__shared__` variables are function statics (one block
// runs at a time), `__syncthreads` is a barrier of the 256 threads, warp shuffles and warp
// reductions go through a per-warp exchange buffer and a per-warp barrier. A kernel that lets
// only some threads reach a barrier deadlocks here, as it would misbehave on a GPU.
//
// Floating point: the host compiler must not contract or reassociate (`-ffp-contract=off`, no
// fast math); on x86-64 f32 arithmetic is SSE, IEEE round-to-nearest, with subnormals, which is
// what __fmul_rn & co. and the kernels' -ftz=false compile mode give on the GPU.
#pragma once

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct uint2 {
  unsigned int x, y;
};
struct uint4 {
  unsigned int x, y, z, w;
};
struct float4 {
  float x, y, z, w;
};
struct dim3 {
  unsigned int x = 1, y = 1, z = 1;
};

inline uint2 make_uint2(unsigned int x, unsigned int y) { return uint2{x, y}; }
inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) { return uint4{x, y, z, w}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

namespace emu {
inline thread_local dim3 thread_idx;
inline thread_local dim3 block_idx;
inline dim3 grid_dim;
inline dim3 block_dim;
constexpr int kBlock = 256;
constexpr int kWarps = kBlock / 32;

struct Sync {
  std::barrier<> block{kBlock};
  std::vector<std::barrier<>*> warp;
  unsigned long long exchange[kWarps][32];
  Sync() {
    for (int i = 0; i < kWarps; ++i) warp.push_back(new std::barrier<>(32));
  }
  ~Sync() {
    for (auto* b : warp) delete b;
  }
};
inline Sync* sync_state = nullptr;

inline int warp_id() { return (int)thread_idx.x / 32; }
inline int lane_id() { return (int)thread_idx.x % 32; }

inline std::mutex launch_lock;

// Runs `body` for every block of `grid` with 256 threads per block. Launches are serialized
// (the grid size, the barriers and the `__shared__` statics are process-wide).
inline void launch(dim3 grid, const std::function<void()>& body) {
  std::lock_guard<std::mutex> guard(launch_lock);
  grid_dim = grid;
  block_dim = dim3{kBlock, 1, 1};
  Sync s;
  sync_state = &s;
  std::vector<std::thread> threads;
  threads.reserve(kBlock);
  for (int t = 0; t < kBlock; ++t) {
    threads.emplace_back([&, t] {
      thread_idx = dim3{(unsigned)t, 0, 0};
      for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
          for (unsigned x = 0; x < grid.x; ++x) {
            block_idx = dim3{x, y, z};
            body();
            s.block.arrive_and_wait();  // the next block may reuse __shared__ statics
          }
    });
  }
  for (auto& th : threads) th.join();
  sync_state = nullptr;
}
}  // namespace emu

#define threadIdx (emu::thread_idx)
#define blockIdx (emu::block_idx)
#define gridDim (emu::grid_dim)
#define blockDim (emu::block_dim)

inline void __syncthreads() { emu::sync_state->block.arrive_and_wait(); }

inline unsigned int __float_as_uint(float f) {
  unsigned int u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __uint_as_float(unsigned int u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline unsigned int __umulhi(unsigned int a, unsigned int b) {
  return (unsigned int)(((unsigned long long)a * (unsigned long long)b) >> 32);
}
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline int __float2int_rz(float x) { return (int)x; }
template <class T>
inline T __ldg(const T* p) {
  return *p;
}

inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
inline unsigned int max(unsigned int a, unsigned int b) { return a > b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }

// Lane `src` of the calling warp's value `v` (every lane of the warp must call it).
template <class T>
inline T emu_warp_read(T v, int src) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "32- or 64-bit shuffles only");
  auto* s = emu::sync_state;
  const int w = emu::warp_id(), l = emu::lane_id();
  unsigned long long bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  s->exchange[w][l] = bits;
  s->warp[w]->arrive_and_wait();
  const unsigned long long got = s->exchange[w][src & 31];
  s->warp[w]->arrive_and_wait();
  T r;
  std::memcpy(&r, &got, sizeof(T));
  return r;
}

template <class T>
inline T emu_warp_exchange(T v, int src_lane_xor) {
  return emu_warp_read(v, emu::lane_id() ^ src_lane_xor);
}

template <class T>
inline T __shfl_xor_sync(unsigned int, T v, int lane_mask) {
  return emu_warp_exchange(v, lane_mask);
}

template <class T>
inline T __shfl_sync(unsigned int, T v, int src_lane) {
  return emu_warp_read(v, src_lane);
}

inline unsigned int emu_warp_reduce(unsigned int v, bool is_max) {
  auto* s = emu::sync_state;
  const int w = emu::warp_id(), l = emu::lane_id();
  s->exchange[w][l] = v;
  s->warp[w]->arrive_and_wait();
  unsigned int r = (unsigned int)s->exchange[w][0];
  for (int i = 1; i < 32; ++i) {
    const unsigned int e = (unsigned int)s->exchange[w][i];
    r = is_max ? std::max(r, e) : (r | e);
  }
  s->warp[w]->arrive_and_wait();
  return r;
}
inline unsigned int __reduce_max_sync(unsigned int, unsigned int v) { return emu_warp_reduce(v, true); }
inline unsigned int __reduce_or_sync(unsigned int, unsigned int v) { return emu_warp_reduce(v, false); }

inline unsigned int atomicMax(unsigned int* p, unsigned int v) {
  std::atomic_ref<unsigned int> a(*p);
  unsigned int old = a.load();
  while (old < v && !a.compare_exchange_weak(old, v)) {
  }
  return old;
}
inline unsigned int atomicOr(unsigned int* p, unsigned int v) { return std::atomic_ref<unsigned int>(*p).fetch_or(v); }

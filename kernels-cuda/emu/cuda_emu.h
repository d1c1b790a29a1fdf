// A tiny CUDA emulator for the kernels in ../cuda: just enough of the CUDA C++ device API to
// compile them as host C++20 and run them on the CPU, so that `tests/emulated.rs` can compare
// their results with `quant` bit for bit on machines without a GPU (CI).
//
// Execution model: a launch runs 256 fibers (one per CUDA thread of a block, see `Fiber`) that
// run the blocks of the grid one after another; `__shared__` variables are function statics
// (one block runs at a time), `__syncthreads` is a barrier of the 256 fibers, warp shuffles and
// warp reductions go through a per-warp exchange buffer and a per-warp barrier. A kernel that
// lets only some threads reach a barrier aborts here with "deadlock", as it would hang on a GPU.
//
// Floating point: the host compiler must not contract or reassociate (`-ffp-contract=off`, no
// fast math); on x86-64 f32 arithmetic is SSE, IEEE round-to-nearest, with subnormals, which is
// what __fmul_rn & co. and the kernels' -ftz=false compile mode give on the GPU.
#pragma once

#if !defined(__x86_64__)
#error "cuda_emu.h switches fibers with x86-64 assembly (switch_to); port it to run the emulator elsewhere"
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <cstdio>
#include <cstdlib>
#include <sys/mman.h>
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

// The 256 CUDA threads of a block are fibers (user-space contexts with their own stacks) run by
// one OS thread, the launching one: a fiber runs until it waits at a barrier or finishes, then
// the scheduler in `launch` resumes the next fiber that can run. No OS threads are created and
// no barrier sleeps in the kernel, so a launch costs microseconds instead of the milliseconds
// of 256 threads on a 2-core machine. Fibers switch only at barriers, in thread order, so a
// launch is deterministic.
struct Fiber;
inline Fiber* current = nullptr;

// Saves the callee-saved registers, MXCSR and the x87 control word on the current stack,
// stores the stack pointer in `*from` and continues on the stack `to`, saved the same way
// (x86-64 System V; no system call, unlike swapcontext).
[[gnu::naked, gnu::noinline]] static void switch_to(void** /*from*/, void* /*to*/) {
  __asm__(
      "pushq %rbp\n\t"
      "pushq %rbx\n\t"
      "pushq %r12\n\t"
      "pushq %r13\n\t"
      "pushq %r14\n\t"
      "pushq %r15\n\t"
      "subq $8, %rsp\n\t"
      "stmxcsr (%rsp)\n\t"
      "fnstcw 4(%rsp)\n\t"
      "movq %rsp, (%rdi)\n\t"
      "movq %rsi, %rsp\n\t"
      "ldmxcsr (%rsp)\n\t"
      "fldcw 4(%rsp)\n\t"
      "addq $8, %rsp\n\t"
      "popq %r15\n\t"
      "popq %r14\n\t"
      "popq %r13\n\t"
      "popq %r12\n\t"
      "popq %rbx\n\t"
      "popq %rbp\n\t"
      "ret\n\t");
}

// The first code a fiber runs (`switch_to` returns here): calls r13 with r12 as its argument.
[[gnu::naked, gnu::noinline]] static void fiber_start() {
  __asm__(
      "movq %r12, %rdi\n\t"
      "call *%r13\n\t"
      "ud2\n\t");
}

// A barrier of `count` fibers (the block: 256; a warp: 32), reusable phase after phase.
struct Barrier {
  explicit Barrier(int n) : count(n) {}
  const int count;
  int arrived = 0;
  unsigned long long phase = 0;
  void arrive_and_wait();
};

struct Fiber {
  void* sp = nullptr;  // its saved stack pointer while it does not run
  void* stack = nullptr;
  dim3 tid;
  dim3 bid;
  bool done = true;
  const Barrier* waits_on = nullptr;  // blocked until its phase moves past `waits_for`
  unsigned long long waits_for = 0;
};

constexpr std::size_t kStack = 256 * 1024;  // per fiber; the kernels' locals are a few KiB
constexpr std::size_t kGuard = 4096;        // a PROT_NONE page below each stack

struct Scheduler {
  void* main_sp = nullptr;  // the launching thread's stack while a fiber runs
  Fiber fibers[kBlock];
  const std::function<void()>* body = nullptr;
  dim3 grid;
  Scheduler() {
    for (auto& f : fibers) {
      void* m = mmap(nullptr, kStack + kGuard, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (m == MAP_FAILED) {
        std::perror("cuda_emu: fiber stack");
        std::abort();
      }
      mprotect(m, kGuard, PROT_NONE);
      f.stack = m;
    }
  }
};
inline Scheduler* scheduler = nullptr;

inline void Barrier::arrive_and_wait() {
  Fiber* me = current;
  if (++arrived == count) {  // the last to arrive opens the barrier and goes on
    arrived = 0;
    ++phase;
    return;
  }
  me->waits_on = this;
  me->waits_for = phase;
  switch_to(&me->sp, scheduler->main_sp);
}

struct Sync {
  Barrier block{kBlock};
  std::vector<Barrier*> warp;
  unsigned long long exchange[kWarps][32];
  Sync() {
    for (int i = 0; i < kWarps; ++i) warp.push_back(new Barrier(32));
  }
  ~Sync() {
    for (auto* b : warp) delete b;
  }
};
inline Sync* sync_state = nullptr;

inline int warp_id() { return (int)thread_idx.x / 32; }
inline int lane_id() { return (int)thread_idx.x % 32; }

inline std::mutex launch_lock;

// One CUDA thread: every block of the grid in order, a block barrier after each (the next
// block may reuse the `__shared__` statics); then back to the scheduler for good.
inline void fiber_main(long t) {
  Scheduler& s = *scheduler;
  Fiber& f = s.fibers[t];
  const dim3 grid = s.grid;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        f.bid = dim3{x, y, z};
        block_idx = f.bid;
        (*s.body)();
        sync_state->block.arrive_and_wait();
      }
  f.done = true;
  switch_to(&f.sp, s.main_sp);
}

// Runs `body` for every block of `grid` with 256 threads per block. Launches are serialized
// (the grid size, the barriers and the `__shared__` statics are process-wide).
inline void launch(dim3 grid, const std::function<void()>& body) {
  std::lock_guard<std::mutex> guard(launch_lock);
  static Scheduler sched;
  scheduler = &sched;
  grid_dim = grid;
  block_dim = dim3{kBlock, 1, 1};
  Sync s;
  sync_state = &s;
  sched.body = &body;
  sched.grid = grid;
  // A fresh fiber's stack holds what `switch_to` pops (top down): padding that leaves the
  // stack 16-byte aligned at `fiber_start`'s call, its address, rbp, rbx, r12 = the thread
  // index, r13 = fiber_main, r14, r15, then this thread's MXCSR and x87 control word.
  std::uint32_t mxcsr;
  std::uint16_t fpcw;
  __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
  __asm__ volatile("fnstcw %0" : "=m"(fpcw));
  for (int t = 0; t < kBlock; ++t) {
    Fiber& f = sched.fibers[t];
    auto* top = reinterpret_cast<std::uint64_t*>(static_cast<char*>(f.stack) + kGuard + kStack);
    top[-1] = 0;
    top[-2] = 0;
    top[-3] = reinterpret_cast<std::uint64_t>(&fiber_start);
    top[-4] = 0;                                                   // rbp
    top[-5] = 0;                                                   // rbx
    top[-6] = (std::uint64_t)t;                                    // r12
    top[-7] = reinterpret_cast<std::uint64_t>(&fiber_main);        // r13
    top[-8] = 0;                                                   // r14
    top[-9] = 0;                                                   // r15
    top[-10] = (std::uint64_t)mxcsr | ((std::uint64_t)fpcw << 32);  // MXCSR, x87 CW
    f.sp = &top[-10];
    f.tid = dim3{(unsigned)t, 0, 0};
    f.bid = dim3{0, 0, 0};
    f.done = false;
    f.waits_on = nullptr;
  }
  for (int live = kBlock; live > 0;) {
    bool progressed = false;
    live = 0;
    for (auto& f : sched.fibers) {
      if (f.done) continue;
      if (f.waits_on && f.waits_on->phase == f.waits_for) {  // its barrier is still closed
        ++live;
        continue;
      }
      f.waits_on = nullptr;
      current = &f;
      thread_idx = f.tid;
      block_idx = f.bid;
      switch_to(&sched.main_sp, f.sp);
      progressed = true;
      live += !f.done;
    }
    if (live > 0 && !progressed) {
      std::fprintf(stderr, "cuda_emu: deadlock: %d threads wait at a barrier the others never reach\n", live);
      std::abort();
    }
  }
  current = nullptr;
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

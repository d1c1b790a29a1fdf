// The training-step kernels of ../cuda compiled for the CPU through cuda_emu.h, behind one
// uniform C ABI that `kernels_cuda::emu` (feature `emu`) loads: `emu_<kernel>(gx, gy, args)`
// runs the kernel on a gx x gy grid of 256-thread blocks, its parameters read from `args`, one
// 64-bit slot each in declaration order (pointers and integers as values, f32 in the low 32
// bits, f64 as its bits, a struct by pointer) - the same list `kernels_cuda::train` passes to
// cuLaunchKernel on a GPU. Build (the loader does this itself):
//   g++ -std=c++20 -O2 -ffp-contract=off -fno-fast-math -fPIC -shared -pthread \
//       -I../cuda -include cuda_emu.h train.cpp -o libnbemu_train.so
#include "cuda_emu.h"

#include <type_traits>
#include <utility>

#include "../cuda/activation.cu"
#include "../cuda/attention.cu"
#include "../cuda/cross_entropy.cu"
#include "../cuda/elementwise.cu"
#include "../cuda/embedding.cu"
#include "../cuda/fp8.cu"
#include "../cuda/gemm.cu"
#include "../cuda/mx.cu"
#include "../cuda/norm.cu"
#include "../cuda/nvfp4.cu"
#include "../cuda/optim.cu"
#include "../cuda/rope.cu"

typedef unsigned long long slot;

template <class T>
static T arg(const slot* a, int i) {
  if constexpr (std::is_pointer_v<T>) {
    return reinterpret_cast<T>(static_cast<std::uintptr_t>(a[i]));
  } else if constexpr (std::is_same_v<T, float>) {
    return __uint_as_float((unsigned)a[i]);
  } else if constexpr (std::is_same_v<T, double>) {
    double d;
    std::memcpy(&d, &a[i], 8);
    return d;
  } else {
    return static_cast<T>(a[i]);
  }
}

// EMU(kernel, T0, T1, ...): emu_<kernel>(gx, gy, slots) calls kernel(arg<T0>(slots, 0), ...).
template <class... T, std::size_t... I>
static void call(void (*k)(T...), const slot* a, std::index_sequence<I...>) {
  k(arg<T>(a, (int)I)...);
}
template <class... T>
static void run(void (*k)(T...), unsigned gx, unsigned gy, const slot* a) {
  emu::launch(dim3{gx, gy, 1}, [&] { call(k, a, std::index_sequence_for<T...>{}); });
}
#define EMU(name) \
  extern "C" void emu_##name(unsigned gx, unsigned gy, const slot* a) { run(name, gx, gy, a); }

EMU(nb_add)
EMU(nb_mul)
EMU(nb_scale)
EMU(nb_copy_or_add)
EMU(nb_fill_scaled)
EMU(nb_round_bf16)
EMU(nb_permute4)
EMU(nb_cols_get)
EMU(nb_cols_add)
EMU(nb_sum_rows_part)
EMU(nb_sum_rows_finish)
EMU(nb_sum_f64_part)
EMU(nb_sum_f64_finish)
EMU(nb_act_fwd)
EMU(nb_act_bwd)
EMU(nb_swiglu_fwd)
EMU(nb_swiglu_bwd)
EMU(nb_rms_fwd)
EMU(nb_ln_fwd)
EMU(nb_norm_bwd_dx)
EMU(nb_norm_bwd_params)
EMU(nb_rope)
EMU(nb_embedding_fwd)
EMU(nb_embedding_bwd)
EMU(nb_ce_fwd)
EMU(nb_ce_loss)
EMU(nb_ce_bwd)
EMU(nb_attn_fwd)
EMU(nb_attn_delta)
EMU(nb_attn_bwd_dq)
EMU(nb_attn_bwd_dkdv)
EMU(nb_attn_softmax_bf16)
EMU(nb_attn_grad_bf16)
EMU(nb_sumsq_chunks)
EMU(nb_norm_finish)
EMU(nb_sgemm)
// the BF16 operands of the tensor-core GEMM (kernels_cuda::train_tc)
EMU(nb_f32_to_bf16)
EMU(nb_nvfp4_to_bf16)
EMU(nb_mx_to_bf16)
// the NVFP4 quantizer's amax passes and its dequantization (kernels_cuda::emu::Emu::quantize_nvfp4)
EMU(nb_amax)
EMU(nb_amax_rht_col)
EMU(nb_nvfp4_dequantize)
// the MX and FP8 quantizers' dequantization (kernels_cuda::train_quant::QuantOps)
EMU(nb_mx_dequantize)
EMU(nb_fp8_dequantize)

// nb_nvfp4_quantize takes its arguments by value: slot 0 points at them.
extern "C" void emu_nb_nvfp4_quantize(unsigned gx, unsigned gy, const slot* a) {
  const Nvfp4Args args = *arg<const Nvfp4Args*>(a, 0);
  emu::launch(dim3{gx, gy, 1}, [&] { nb_nvfp4_quantize(args); });
}

// nb_mx_quantize and nb_fp8_quantize likewise.
extern "C" void emu_nb_mx_quantize(unsigned gx, unsigned gy, const slot* a) {
  const MxArgs args = *arg<const MxArgs*>(a, 0);
  emu::launch(dim3{gx, gy, 1}, [&] { nb_mx_quantize(args); });
}

extern "C" void emu_nb_fp8_quantize(unsigned gx, unsigned gy, const slot* a) {
  const Fp8Args args = *arg<const Fp8Args*>(a, 0);
  emu::launch(dim3{gx, gy, 1}, [&] { nb_fp8_quantize(args); });
}

// nb_adamw takes its coefficients by value: slot 5 points at them.
extern "C" void emu_nb_adamw(unsigned gx, unsigned gy, const slot* a) {
  const AdamWCoeffs c = *arg<const AdamWCoeffs*>(a, 5);
  emu::launch(dim3{gx, gy, 1}, [&] {
    nb_adamw(arg<float*>(a, 0), arg<const float*>(a, 1), arg<float*>(a, 2), arg<float*>(a, 3), arg<u64>(a, 4), c);
  });
}

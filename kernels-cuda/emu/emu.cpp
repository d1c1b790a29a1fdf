// The kernels of ../cuda compiled for the CPU through cuda_emu.h, behind a C ABI that
// tests/emulated.rs loads. Build (the test does this itself):
//   g++ -std=c++20 -O2 -ffp-contract=off -fno-fast-math -fPIC -shared -pthread \
//       -I../cuda -include cuda_emu.h emu.cpp -o libnbemu.so
#include "cuda_emu.h"

#include "../cuda/fp8.cu"
#include "../cuda/mx.cu"
#include "../cuda/nvfp4.cu"

static dim3 g3(unsigned x, unsigned y) { return dim3{x, y, 1}; }

extern "C" {

void emu_nb_amax(unsigned gx, const float* x, u64 n, u32* out) {
  emu::launch(g3(gx, 1), [&] { nb_amax(x, n, out); });
}

void emu_nb_amax_rht_col(unsigned gx, unsigned gy, const float* x, int rows, int cols, u32 mask, u32* out) {
  emu::launch(g3(gx, gy), [&] { nb_amax_rht_col(x, rows, cols, mask, out); });
}

void emu_nb_nvfp4_quantize(unsigned gx, unsigned gy, const Nvfp4Args* a) {
  emu::launch(g3(gx, gy), [&] { nb_nvfp4_quantize(*a); });
}

void emu_nb_mx_quantize(unsigned gx, unsigned gy, const MxArgs* a) {
  emu::launch(g3(gx, gy), [&] { nb_mx_quantize(*a); });
}

void emu_nb_fp8_quantize(unsigned gx, unsigned gy, const Fp8Args* a) {
  emu::launch(g3(gx, gy), [&] { nb_fp8_quantize(*a); });
}

void emu_nb_nvfp4_dequantize(unsigned gx, const unsigned char* codes, const unsigned char* scales, int rows, int cols,
                             int padded_cols, float s_dec, float* out) {
  emu::launch(g3(gx, 1), [&] { nb_nvfp4_dequantize(codes, scales, rows, cols, padded_cols, s_dec, out); });
}

void emu_nb_nvfp4_to_bf16(unsigned gx, const unsigned char* codes, const unsigned char* scales, int rows,
                          int padded_cols, unsigned short* out) {
  emu::launch(g3(gx, 1), [&] { nb_nvfp4_to_bf16(codes, scales, rows, padded_cols, out); });
}

void emu_nb_mx_dequantize(unsigned gx, const unsigned char* codes, const unsigned char* scales, int rows, int cols,
                          int padded_cols, int elem, float factor, float* out) {
  emu::launch(g3(gx, 1), [&] { nb_mx_dequantize(codes, scales, rows, cols, padded_cols, elem, factor, out); });
}

void emu_nb_mx_to_bf16(unsigned gx, const unsigned char* codes, const unsigned char* scales, int rows,
                       int padded_cols, int elem, unsigned short* out) {
  emu::launch(g3(gx, 1), [&] { nb_mx_to_bf16(codes, scales, rows, padded_cols, elem, out); });
}

void emu_nb_fp8_dequantize(unsigned gx, const unsigned char* codes, u64 n, int elem, float scale_inv, float* out) {
  emu::launch(g3(gx, 1), [&] { nb_fp8_dequantize(codes, n, elem, scale_inv, out); });
}

void emu_nb_f32_to_bf16(unsigned gx, const float* x, u64 n, unsigned short* out) {
  emu::launch(g3(gx, 1), [&] { nb_f32_to_bf16(x, n, out); });
}

void emu_nb_swizzle_scales(unsigned gx, const unsigned char* in, int rows, int scale_cols, unsigned char* out) {
  emu::launch(g3(gx, 1), [&] { nb_swizzle_scales(in, rows, scale_cols, out); });
}

}  // extern "C"

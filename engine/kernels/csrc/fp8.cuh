// The per-row e4m3 quantization shared by `quantize_rows_fp8` and the kernels that quantize the rows they
// make (the RMSNorm and SiLU x up before an fp8 GEMM): scale = max(amax, 1e-12) / 448 and inverse = 448 /
// max(amax, 1e-12), each one correctly rounded division a row, then code = e4m3(x * inverse), so every kernel
// matches `reference.quantize_rows_fp8` bit for bit. A division an element made these kernels compute-bound.
#pragma once

#include <cuda_fp8.h>

#include "common.cuh"

namespace q3tts {

constexpr float kFp8E4M3Max = 448.0f;
constexpr float kMinAmax = 1e-12f;  // an all-zero row gets a tiny scale, not a division by zero

struct alignas(8) Fp8x8 {
  __nv_fp8_storage_t v[8];
};

__device__ __forceinline__ float fp8_amax(float amax, const Bf16x8& v) {
#pragma unroll
  for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(to_f(v.v[j])));
  return amax;
}

// A row's scale (what the GEMM multiplies back) and the inverse its elements are multiplied by.
struct Fp8RowScale {
  float scale;
  float inverse;
};

__device__ __forceinline__ Fp8RowScale fp8_row_scale(float row_amax) {
  const float amax = fmaxf(row_amax, kMinAmax);
  return {__fdiv_rn(amax, kFp8E4M3Max), __fdiv_rn(kFp8E4M3Max, amax)};
}

__device__ __forceinline__ Fp8x8 fp8_codes(const Bf16x8& v, float inverse) {
  Fp8x8 q;
#pragma unroll
  for (int j = 0; j < 8; ++j) q.v[j] = __nv_cvt_float_to_fp8(__fmul_rn(to_f(v.v[j]), inverse), __NV_SATFINITE, __NV_E4M3);
  return q;
}

}  // namespace q3tts

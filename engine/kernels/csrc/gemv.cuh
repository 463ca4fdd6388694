// The decode GEMVs' weight chunks: one 16-byte load of bf16 or 8-bit weights, unpacked to fp32. Shared by
// gemv.cu and gemv_fused.cu, whose per-row reduction orders must match bit for bit.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "common.cuh"
#include "launchers.h"

namespace q3tts {

template <WeightKind K>
struct Chunk;

template <>
struct Chunk<WeightKind::kBf16> {
  static constexpr int kElems = 8;
  __device__ static void unpack(const uint4& raw, float* out) {
    const bf16* v = reinterpret_cast<const bf16*>(&raw);
#pragma unroll
    for (int j = 0; j < 8; ++j) out[j] = to_f(v[j]);
  }
};

template <>
struct Chunk<WeightKind::kInt8> {
  static constexpr int kElems = 16;
  // int8 -> fp32 without I2F: bias to unsigned, splice under the exponent of 2^23, subtract 2^23 + 128.
  __device__ static void unpack(const uint4& raw, float* out) {
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint32_t u = words[w] ^ 0x80808080u;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        out[w * 4 + j] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7540u | j)) - 8388736.0f;
      }
    }
  }
};

template <>
struct Chunk<WeightKind::kFp8E4M3> {
  static constexpr int kElems = 16;
  __device__ static void unpack(const uint4& raw, float* out) {
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const __nv_fp8x2_storage_t pair = static_cast<__nv_fp8x2_storage_t>(words[w] >> (16 * h));
        const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&hr));
        out[w * 4 + h * 2] = f.x;
        out[w * 4 + h * 2 + 1] = f.y;
      }
    }
  }
};

}  // namespace q3tts

// Weight-streaming GEMV/skinny GEMM for decode: y[n, m] = x[n, k] @ W[m, k]^T (* per-row scale) (+ bias).
// One warp per output row; each lane streams 16-byte weight chunks (8 bf16 or 16 8-bit values), several in
// flight, and applies them to a tile of up to 16 activation rows read through L1. The per-row reduction
// order (lane -> chunk mapping, then a fixed butterfly) does not depend on n or on the tile split, so a
// row's result is the same whatever batch it is in.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "common.cuh"
#include "launch.cuh"
#include "launchers.h"

namespace q3tts {
namespace {

constexpr int kWarps = 4;
constexpr int kUnroll = 4;

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

template <WeightKind K, int NT>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(bf16* __restrict__ y, const bf16* __restrict__ x, const uint8_t* __restrict__ w,
                const float* __restrict__ scale, const bf16* __restrict__ bias, int n, int k, int m,
                int x_stride, int y_stride) {
  begin_dependent_kernel();
  using C = Chunk<K>;
  constexpr int E = C::kElems;
  const int row = blockIdx.x * kWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= m) return;
  const int chunks = k / E;
  const int64_t row_bytes = static_cast<int64_t>(k) * (K == WeightKind::kBf16 ? 2 : 1);
  const uint4* wrow = reinterpret_cast<const uint4*>(w + row * row_bytes);
  const int rows_here = min(NT, n);
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.0f;

  for (int base = lane; base < chunks; base += 32 * kUnroll) {
    uint4 raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = base + u * 32;
      raw[u] = c < chunks ? __ldg(wrow + c) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = base + u * 32;
      if (c >= chunks) break;
      float wf[E];
      C::unpack(raw[u], wf);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        if (t >= rows_here) break;
        const uint4* xv = reinterpret_cast<const uint4*>(x + static_cast<int64_t>(t) * x_stride + c * E);
#pragma unroll
        for (int h = 0; h < E / 8; ++h) {
          float xf[8];
          Chunk<WeightKind::kBf16>::unpack(__ldg(xv + h), xf);
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[t] = fmaf(wf[h * 8 + j], xf[j], acc[t]);
        }
      }
    }
  }
  const float s = scale != nullptr ? scale[row] : 1.0f;
  const float b = bias != nullptr ? to_f(bias[row]) : 0.0f;
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float v = warp_sum(acc[t]);
    if (lane == 0 && t < rows_here) y[static_cast<int64_t>(t) * y_stride + row] = to_bf(fmaf(v, s, b));
  }
}

template <WeightKind K>
cudaError_t launch(bf16* y, const bf16* x, const uint8_t* w, const float* scale, const bf16* bias, int n, int k,
                   int m, int x_stride, int y_stride, cudaStream_t stream) {
  const dim3 grid((m + kWarps - 1) / kWarps);
  for (int n0 = 0; n0 < n;) {
    const int left = n - n0;
    const bf16* xt = x + static_cast<int64_t>(n0) * x_stride;
    bf16* yt = y + static_cast<int64_t>(n0) * y_stride;
    int tile;
    if (left >= 16) {
      tile = 16;
      launch_kernel(gemv_kernel<K, 16>, grid, dim3(kWarps * 32), stream, yt, xt, w, scale, bias, tile, k, m, x_stride, y_stride);
    } else if (left >= 8) {
      tile = 8;
      launch_kernel(gemv_kernel<K, 8>, grid, dim3(kWarps * 32), stream, yt, xt, w, scale, bias, tile, k, m, x_stride, y_stride);
    } else if (left >= 4) {
      tile = 4;
      launch_kernel(gemv_kernel<K, 4>, grid, dim3(kWarps * 32), stream, yt, xt, w, scale, bias, tile, k, m, x_stride, y_stride);
    } else if (left >= 2) {
      tile = 2;
      launch_kernel(gemv_kernel<K, 2>, grid, dim3(kWarps * 32), stream, yt, xt, w, scale, bias, tile, k, m, x_stride, y_stride);
    } else {
      tile = 1;
      launch_kernel(gemv_kernel<K, 1>, grid, dim3(kWarps * 32), stream, yt, xt, w, scale, bias, tile, k, m, x_stride, y_stride);
    }
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    n0 += tile;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t gemv(void* y, const void* x, const void* w, const float* scale, const void* bias, int n, int k,
                 int m, int x_stride, int y_stride, WeightKind kind, cudaStream_t stream) {
  const int elems = kind == WeightKind::kBf16 ? 8 : 16;
  if (k % elems != 0 || x_stride % 8 != 0) return cudaErrorInvalidValue;
  auto* yb = static_cast<bf16*>(y);
  auto* xb = static_cast<const bf16*>(x);
  auto* wb = static_cast<const uint8_t*>(w);
  auto* bb = static_cast<const bf16*>(bias);
  switch (kind) {
    case WeightKind::kBf16: return launch<WeightKind::kBf16>(yb, xb, wb, scale, bb, n, k, m, x_stride, y_stride, stream);
    case WeightKind::kInt8: return launch<WeightKind::kInt8>(yb, xb, wb, scale, bb, n, k, m, x_stride, y_stride, stream);
    case WeightKind::kFp8E4M3: return launch<WeightKind::kFp8E4M3>(yb, xb, wb, scale, bb, n, k, m, x_stride, y_stride, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace q3tts

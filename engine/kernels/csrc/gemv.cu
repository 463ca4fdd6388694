// Weight-streaming GEMV/skinny GEMM for decode: y[n, m] = x[n, k] @ W[m, k]^T (* per-row scale) (+ bias).
// One warp per output row (or per R rows for one or two activation rows: more loads in flight per warp); each
// lane streams 16-byte weight chunks (8 bf16 or 16 8-bit values), several in flight, and applies them to a
// tile of up to 16 activation rows read through L1. The per-row reduction order (lane -> chunk mapping, then
// a fixed butterfly) does not depend on n, on the tile split or on R, so a row's result is the same whatever
// batch it is in and however many rows a warp takes.
#include "common.cuh"
#include "gemv.cuh"
#include "launch.cuh"
#include "launchers.h"

namespace q3tts {
namespace {

constexpr int kWarps = 4;
constexpr int kUnroll = 4;

template <WeightKind K, int NT, int R>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(bf16* __restrict__ y, const bf16* __restrict__ x, const uint8_t* __restrict__ w,
                const float* __restrict__ scale, const bf16* __restrict__ bias, int n, int k, int m,
                int x_stride, int y_stride) {
  begin_dependent_kernel();
  using C = Chunk<K>;
  constexpr int E = C::kElems;
  const int first_row = (blockIdx.x * kWarps + (threadIdx.x >> 5)) * R;
  const int lane = threadIdx.x & 31;
  if (first_row >= m) return;
  const int chunks = k / E;
  const int64_t row_bytes = static_cast<int64_t>(k) * (K == WeightKind::kBf16 ? 2 : 1);
  const uint4* wrow[R];
  bool live[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    live[r] = first_row + r < m;
    wrow[r] = reinterpret_cast<const uint4*>(w + (live[r] ? first_row + r : first_row) * row_bytes);
  }
  const int rows_here = min(NT, n);
  float acc[R][NT];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
  }

  for (int base = lane; base < chunks; base += 32 * kUnroll) {
    uint4 raw[R][kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = base + u * 32;
#pragma unroll
      for (int r = 0; r < R; ++r) raw[r][u] = c < chunks && live[r] ? __ldg(wrow[r] + c) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = base + u * 32;
      if (c >= chunks) break;
      float wf[R][E];
#pragma unroll
      for (int r = 0; r < R; ++r) C::unpack(raw[r][u], wf[r]);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        if (t >= rows_here) break;
        const uint4* xv = reinterpret_cast<const uint4*>(x + static_cast<int64_t>(t) * x_stride + c * E);
#pragma unroll
        for (int h = 0; h < E / 8; ++h) {
          float xf[8];
          Chunk<WeightKind::kBf16>::unpack(__ldg(xv + h), xf);
#pragma unroll
          for (int r = 0; r < R; ++r) {
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[r][t] = fmaf(wf[r][h * 8 + j], xf[j], acc[r][t]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (!live[r]) break;
    const int row = first_row + r;
    const float s = scale != nullptr ? scale[row] : 1.0f;
    const float b = bias != nullptr ? to_f(bias[row]) : 0.0f;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float v = warp_sum(acc[r][t]);
      if (lane == 0 && t < rows_here) y[static_cast<int64_t>(t) * y_stride + row] = to_bf(fmaf(v, s, b));
    }
  }
}

template <WeightKind K, int NT, int R>
void launch_tile(bf16* y, const bf16* x, const uint8_t* w, const float* scale, const bf16* bias, int k, int m,
                 int x_stride, int y_stride, cudaStream_t stream) {
  const dim3 grid((m + kWarps * R - 1) / (kWarps * R));
  launch_kernel(gemv_kernel<K, NT, R>, grid, dim3(kWarps * 32), stream, y, x, w, scale, bias, NT, k, m, x_stride,
                y_stride);
}

// Rows per warp for a lone token row (decode at batch 1): several rows give each warp more loads in flight
// and the grid fewer blocks. 0 picks the default.
template <WeightKind K, int NT>
void launch_rows(int rows_per_warp, bf16* y, const bf16* x, const uint8_t* w, const float* scale,
                 const bf16* bias, int k, int m, int x_stride, int y_stride, cudaStream_t stream) {
  switch (rows_per_warp) {
    case 2: launch_tile<K, NT, 2>(y, x, w, scale, bias, k, m, x_stride, y_stride, stream); break;
    case 4: launch_tile<K, NT, 4>(y, x, w, scale, bias, k, m, x_stride, y_stride, stream); break;
    default: launch_tile<K, NT, 1>(y, x, w, scale, bias, k, m, x_stride, y_stride, stream); break;
  }
}

template <WeightKind K>
cudaError_t launch(bf16* y, const bf16* x, const uint8_t* w, const float* scale, const bf16* bias, int n, int k,
                   int m, int x_stride, int y_stride, int rows_per_warp, cudaStream_t stream) {
  for (int n0 = 0; n0 < n;) {
    const int left = n - n0;
    const bf16* xt = x + static_cast<int64_t>(n0) * x_stride;
    bf16* yt = y + static_cast<int64_t>(n0) * y_stride;
    int tile;
    if (left >= 16) {
      tile = 16;
      launch_tile<K, 16, 1>(yt, xt, w, scale, bias, k, m, x_stride, y_stride, stream);
    } else if (left >= 8) {
      tile = 8;
      launch_tile<K, 8, 1>(yt, xt, w, scale, bias, k, m, x_stride, y_stride, stream);
    } else if (left >= 4) {
      tile = 4;
      launch_tile<K, 4, 1>(yt, xt, w, scale, bias, k, m, x_stride, y_stride, stream);
    } else if (left >= 2) {
      tile = 2;
      launch_rows<K, 2>(rows_per_warp, yt, xt, w, scale, bias, k, m, x_stride, y_stride, stream);
    } else {
      tile = 1;
      launch_rows<K, 1>(rows_per_warp, yt, xt, w, scale, bias, k, m, x_stride, y_stride, stream);
    }
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    n0 += tile;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t gemv(void* y, const void* x, const void* w, const float* scale, const void* bias, int n, int k,
                 int m, int x_stride, int y_stride, WeightKind kind, int rows_per_warp, cudaStream_t stream) {
  const int elems = kind == WeightKind::kBf16 ? 8 : 16;
  if (k % elems != 0 || x_stride % 8 != 0) return cudaErrorInvalidValue;
  auto* yb = static_cast<bf16*>(y);
  auto* xb = static_cast<const bf16*>(x);
  auto* wb = static_cast<const uint8_t*>(w);
  auto* bb = static_cast<const bf16*>(bias);
  switch (kind) {
    case WeightKind::kBf16: return launch<WeightKind::kBf16>(yb, xb, wb, scale, bb, n, k, m, x_stride, y_stride, rows_per_warp, stream);
    case WeightKind::kInt8: return launch<WeightKind::kInt8>(yb, xb, wb, scale, bb, n, k, m, x_stride, y_stride, rows_per_warp, stream);
    case WeightKind::kFp8E4M3: return launch<WeightKind::kFp8E4M3>(yb, xb, wb, scale, bb, n, k, m, x_stride, y_stride, rows_per_warp, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace q3tts

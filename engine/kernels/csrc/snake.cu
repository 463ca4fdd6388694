// SnakeBeta of the codec's waveform decoder, x + inv_beta * sin(x * freq)^2 per channel, in one pass,
// optionally on x + bias (the bias of the conv before it, which then need not be a kernel of its own).
// The unfused torch expression is 5 kernels; the codec applies it 29 times per frame.
#include "common.cuh"
#include "launch.cuh"
#include "launchers.h"
#include "snake.cuh"

namespace q3tts {
namespace {

// Two elements at a time (one instruction rounds two floats to a bf16 pair): the same ops and roundings, with
// the fast sine only; `uncovered` is set when an a is out of its range (the caller then takes `snake`).
__device__ __forceinline__ float2 to_f2(__nv_bfloat162 v) {  // the low element, then the high one
  const uint32_t bits = *reinterpret_cast<const uint32_t*>(&v);
  return make_float2(__uint_as_float(bits << 16), __uint_as_float(bits & 0xffff0000u));
}

__device__ __forceinline__ float2 round_bf2(float lo, float hi) { return to_f2(__floats2bfloat162_rn(lo, hi)); }

__device__ __forceinline__ __nv_bfloat162 snake2(__nv_bfloat162 x2, float freq, float inv_beta, bool& uncovered) {
  const float2 x = to_f2(x2);
  const float2 a = round_bf2(x.x * freq, x.y * freq);
  uncovered = uncovered | !fast_sine_covers(a.x) | !fast_sine_covers(a.y);
  const float2 s = round_bf2(fast_sin_of_bf16(a.x), fast_sin_of_bf16(a.y));
  const float2 p = round_bf2(s.x * s.x, s.y * s.y);
  const float2 q = round_bf2(inv_beta * p.x, inv_beta * p.y);
  return __floats2bfloat162_rn(x.x + q.x, x.y + q.y);
}

__device__ __forceinline__ float load(const float* p) { return *p; }
__device__ __forceinline__ bf16 load(const bf16* p) { return *p; }

template <typename T>
__global__ void snake_beta_kernel(T* __restrict__ out, const T* __restrict__ x, const T* __restrict__ freq,
                                  const T* __restrict__ inv_beta, const T* __restrict__ bias, int total,
                                  int channels, int length, int64_t batch_stride, int64_t channel_stride,
                                  int64_t time_stride) {
  begin_dependent_kernel();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const int t = i % length;
    const int row = i / length;
    const int c = row % channels;
    const int b = row / channels;
    out[i] = snake_of_channel(x[b * batch_stride + c * channel_stride + t * time_stride], freq, inv_beta, bias, c);
  }
}

// Eight consecutive time steps of one (batch, channel) row per thread, moved as 16-byte vectors: for rows
// that are contiguous in time, a multiple of 8 long and 16-byte aligned (the codec's channel-major GEMM
// outputs). The same per-element arithmetic as snake_beta_kernel, so the same bits (bf16 in pairs); one index
// division per eight elements instead of three per element, and a quarter (fp32) or an eighth (bf16) of the
// accesses.
template <typename T>
struct alignas(16) Pack8 {
  T v[8];
};

__device__ __forceinline__ void snake8(Pack8<float>& o, const Pack8<float>& v, float f, float beta,
                                       const float* bias, int c) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    float e = v.v[j];
    if (bias != nullptr) e = add(e, load(bias + c));
    store_float(&o.v[j], snake(e, f, beta));
  }
}

__device__ __forceinline__ void snake8(Pack8<bf16>& o, const Pack8<bf16>& v, bf16 f, bf16 beta,
                                       const bf16* bias, int c) {
  const auto* in = reinterpret_cast<const __nv_bfloat162*>(v.v);
  auto* result = reinterpret_cast<__nv_bfloat162*>(o.v);
  const float b = bias != nullptr ? to_f(load(bias + c)) : 0.0f;
  bool uncovered = false;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    __nv_bfloat162 e = in[j];
    if (bias != nullptr) {
      const float2 x = to_f2(e);
      e = __floats2bfloat162_rn(x.x + b, x.y + b);
    }
    result[j] = snake2(e, to_f(f), to_f(beta), uncovered);
  }
  if (uncovered) {  // some |x * freq| >= 2048 (rare): the scalar path, with sinf where needed
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      bf16 e = v.v[j];
      if (bias != nullptr) e = add(e, load(bias + c));
      store_float(&o.v[j], snake(e, f, beta));
    }
  }
}

template <typename T>
__global__ void snake_beta_rows_kernel(T* __restrict__ out, const T* __restrict__ x, const T* __restrict__ freq,
                                       const T* __restrict__ inv_beta, const T* __restrict__ bias, int64_t vecs,
                                       int channels, int length, int64_t batch_stride, int64_t channel_stride) {
  begin_dependent_kernel();
  const int per_row = length / 8;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < vecs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int row = static_cast<int>(i / per_row);
    const int t0 = static_cast<int>(i - static_cast<int64_t>(row) * per_row) * 8;
    const int c = row % channels;
    const int b = row / channels;
    const Pack8<T> v = *reinterpret_cast<const Pack8<T>*>(x + b * batch_stride + c * channel_stride + t0);
    Pack8<T> o;
    snake8(o, v, load(freq + c), load(inv_beta + c), bias, c);
    *reinterpret_cast<Pack8<T>*>(out + static_cast<int64_t>(row) * length + t0) = o;
  }
}

template <typename T>
cudaError_t launch(void* out, const void* x, const void* freq, const void* inv_beta, const void* bias,
                   int64_t batch, int64_t channels, int64_t length, int64_t batch_stride, int64_t channel_stride,
                   int64_t time_stride, cudaStream_t stream) {
  const int64_t total = batch * channels * length;
  if (total == 0) return cudaSuccess;
  if (total > (int64_t{1} << 30)) return cudaErrorInvalidValue;  // 32-bit index math, with room to step
  const int threads = 256;
  const bool rows = time_stride == 1 && length % 8 == 0 && batch_stride % 8 == 0 && channel_stride % 8 == 0 &&
                    reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
  if (rows) {
    const int64_t vecs = total / 8;
    const int64_t vec_blocks = (vecs + threads - 1) / threads;
    launch_kernel(snake_beta_rows_kernel<T>, dim3(static_cast<int>(vec_blocks < 65535 ? vec_blocks : 65535)),
                  dim3(threads), stream, static_cast<T*>(out), static_cast<const T*>(x),
                  static_cast<const T*>(freq), static_cast<const T*>(inv_beta), static_cast<const T*>(bias), vecs,
                  static_cast<int>(channels), static_cast<int>(length), batch_stride, channel_stride);
    return cudaGetLastError();
  }
  const int64_t blocks = (total + threads - 1) / threads;
  const int grid = static_cast<int>(blocks < 65535 ? blocks : 65535);
  launch_kernel(snake_beta_kernel<T>, dim3(grid), dim3(threads), stream,
      static_cast<T*>(out), static_cast<const T*>(x), static_cast<const T*>(freq),
      static_cast<const T*>(inv_beta), static_cast<const T*>(bias), static_cast<int>(total),
      static_cast<int>(channels), static_cast<int>(length), batch_stride, channel_stride, time_stride);
  return cudaGetLastError();
}

}  // namespace

cudaError_t snake_beta(void* out, const void* x, const void* freq, const void* inv_beta, const void* bias,
                       int64_t batch, int64_t channels, int64_t length, int64_t batch_stride, int64_t channel_stride,
                       int64_t time_stride, bool is_bf16, cudaStream_t stream) {
  if (is_bf16) {
    return launch<bf16>(out, x, freq, inv_beta, bias, batch, channels, length, batch_stride, channel_stride,
                        time_stride, stream);
  }
  return launch<float>(out, x, freq, inv_beta, bias, batch, channels, length, batch_stride, channel_stride,
                       time_stride, stream);
}

}  // namespace q3tts

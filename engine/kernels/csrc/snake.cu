// SnakeBeta of the codec's waveform decoder, x + inv_beta * sin(x * freq)^2 per channel, in one pass,
// optionally on x + bias (the bias of the conv before it, which then need not be a kernel of its own).
// The unfused torch expression is 5 kernels; the codec applies it 29 times per frame.
#include "common.cuh"
#include "launch.cuh"
#include "launchers.h"

namespace q3tts {
namespace {

// The reference's ops in its order, each rounded as torch rounds it: fp32 ops with explicit _rn intrinsics
// (no FMA contraction), bf16 ops computed in fp32 and rounded to bf16 after every op.
__device__ __forceinline__ float add(float x, float b) { return __fadd_rn(x, b); }
__device__ __forceinline__ bf16 add(bf16 x, bf16 b) { return to_bf(to_f(x) + to_f(b)); }

__device__ __forceinline__ float snake(float x, float freq, float inv_beta) {
  const float s = sinf(__fmul_rn(x, freq));
  return __fadd_rn(x, __fmul_rn(inv_beta, __fmul_rn(s, s)));
}

__device__ __forceinline__ float snake(bf16 x_bf, bf16 freq_bf, bf16 inv_beta_bf) {
  const float x = to_f(x_bf);
  const float s = round_bf(sinf(round_bf(x * to_f(freq_bf))));
  return x + round_bf(to_f(inv_beta_bf) * round_bf(s * s));
}

__device__ __forceinline__ float load(const float* p) { return *p; }
__device__ __forceinline__ bf16 load(const bf16* p) { return *p; }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(bf16* p, float v) { *p = to_bf(v); }

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
    T v = x[b * batch_stride + c * channel_stride + t * time_stride];
    if (bias != nullptr) v = add(v, load(bias + c));
    store(out + i, snake(v, load(freq + c), load(inv_beta + c)));
  }
}

// Eight consecutive time steps of one (batch, channel) row per thread, moved as 16-byte vectors: for rows
// that are contiguous in time, a multiple of 8 long and 16-byte aligned (the codec's channel-major GEMM
// outputs). The same per-element arithmetic as snake_beta_kernel, so the same bits; one index division per
// eight elements instead of three per element, and a quarter (fp32) or an eighth (bf16) of the accesses.
template <typename T>
struct alignas(16) Pack8 {
  T v[8];
};

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
    Pack8<T> v = *reinterpret_cast<const Pack8<T>*>(x + b * batch_stride + c * channel_stride + t0);
    const T f = load(freq + c), beta = load(inv_beta + c);
    Pack8<T> o;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      T e = v.v[j];
      if (bias != nullptr) e = add(e, load(bias + c));
      store(&o.v[j], snake(e, f, beta));
    }
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

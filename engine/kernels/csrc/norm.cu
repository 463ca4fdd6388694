// Fused (residual add +) RMSNorm, one block per row, 16-byte vectors held in registers between passes.
#include "common.cuh"
#include "launch.cuh"
#include "launchers.h"

namespace q3tts {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxVecPerThread = 4;  // hidden <= 256 * 8 * 4 = 8192

template <bool kResidual>
__global__ void __launch_bounds__(kThreads) rms_norm_kernel(bf16* __restrict__ out, const bf16* __restrict__ x,
                                                            bf16* __restrict__ residual,
                                                            const bf16* __restrict__ weight, int hidden,
                                                            int x_stride, int out_stride, float eps) {
  begin_dependent_kernel();
  __shared__ float scratch[32];
  const int row = blockIdx.x;
  const int vecs = hidden / 8;
  const Bf16x8* xv = reinterpret_cast<const Bf16x8*>(x + static_cast<int64_t>(row) * x_stride);
  Bf16x8* rv = kResidual ? reinterpret_cast<Bf16x8*>(residual + static_cast<int64_t>(row) * x_stride) : nullptr;
  Bf16x8 held[kMaxVecPerThread];
  float sum_sq = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxVecPerThread; ++i) {
    const int idx = threadIdx.x + i * kThreads;
    if (idx < vecs) {
      Bf16x8 a = xv[idx];
      if (kResidual) {
        const Bf16x8 r = rv[idx];
#pragma unroll
        for (int j = 0; j < 8; ++j) a.v[j] = to_bf(to_f(r.v[j]) + to_f(a.v[j]));
        rv[idx] = a;
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float f = to_f(a.v[j]);
        sum_sq += f * f;
      }
      held[i] = a;
    }
  }
  const float total = block_sum(sum_sq, scratch);
  const float inv = rsqrtf(total / static_cast<float>(hidden) + eps);
  const Bf16x8* wv = reinterpret_cast<const Bf16x8*>(weight);
  Bf16x8* ov = reinterpret_cast<Bf16x8*>(out + static_cast<int64_t>(row) * out_stride);
#pragma unroll
  for (int i = 0; i < kMaxVecPerThread; ++i) {
    const int idx = threadIdx.x + i * kThreads;
    if (idx < vecs) {
      const Bf16x8 w = wv[idx];
      Bf16x8 o;
#pragma unroll
      for (int j = 0; j < 8; ++j) o.v[j] = to_bf(to_f(w.v[j]) * round_bf(to_f(held[i].v[j]) * inv));
      ov[idx] = o;
    }
  }
}

}  // namespace

cudaError_t rms_norm(void* out, const void* x, void* residual, const void* weight, int rows, int hidden,
                     int x_stride, int out_stride, float eps, cudaStream_t stream) {
  if (hidden % 8 != 0 || hidden > kThreads * 8 * kMaxVecPerThread) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  const dim3 grid(rows);
  if (residual != nullptr) {
    launch_kernel(rms_norm_kernel<true>, dim3(grid), dim3(kThreads), stream,
        static_cast<bf16*>(out), static_cast<const bf16*>(x), static_cast<bf16*>(residual),
        static_cast<const bf16*>(weight), hidden, x_stride, out_stride, eps);
  } else {
    launch_kernel(rms_norm_kernel<false>, dim3(grid), dim3(kThreads), stream,
        static_cast<bf16*>(out), static_cast<const bf16*>(x), nullptr, static_cast<const bf16*>(weight),
        hidden, x_stride, out_stride, eps);
  }
  return cudaGetLastError();
}

}  // namespace q3tts

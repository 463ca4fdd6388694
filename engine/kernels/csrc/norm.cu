// Fused (residual add +) RMSNorm, one block per row, 16-byte vectors held in registers between passes. The
// fp8 form quantizes the normed row for the fp8 GEMM after it (fp8.cuh) instead of writing it as bf16.
#include "fp8.cuh"
#include "launch.cuh"
#include "launchers.h"

namespace q3tts {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxVecPerThread = 4;  // hidden <= 256 * 8 * 4 = 8192

// kFp8: `out` is e4m3 codes [rows, hidden] (contiguous; out_stride unused) and `scale` gets each row's scale.
template <bool kResidual, bool kFp8>
__global__ void __launch_bounds__(kThreads) rms_norm_kernel(void* __restrict__ out, float* __restrict__ scale,
                                                            const bf16* __restrict__ x, bf16* __restrict__ residual,
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
  Bf16x8* ov = reinterpret_cast<Bf16x8*>(static_cast<bf16*>(out) + static_cast<int64_t>(row) * out_stride);
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxVecPerThread; ++i) {
    const int idx = threadIdx.x + i * kThreads;
    if (idx < vecs) {
      const Bf16x8 w = wv[idx];
      Bf16x8 o;
#pragma unroll
      for (int j = 0; j < 8; ++j) o.v[j] = to_bf(to_f(w.v[j]) * round_bf(to_f(held[i].v[j]) * inv));
      if constexpr (kFp8) {
        held[i] = o;
        amax = fp8_amax(amax, o);
      } else {
        ov[idx] = o;
      }
    }
  }
  if constexpr (kFp8) {
    const Fp8RowScale s = fp8_row_scale(block_max(amax, scratch));
    if (threadIdx.x == 0) scale[row] = s.scale;
    Fp8x8* codes = static_cast<Fp8x8*>(out) + static_cast<int64_t>(row) * vecs;
#pragma unroll
    for (int i = 0; i < kMaxVecPerThread; ++i) {
      const int idx = threadIdx.x + i * kThreads;
      if (idx < vecs) codes[idx] = fp8_codes(held[i], s.inverse);
    }
  }
}

template <bool kFp8>
void launch_rms_norm(void* out, float* scale, const void* x, void* residual, const void* weight, int rows,
                     int hidden, int x_stride, int out_stride, float eps, cudaStream_t stream) {
  if (residual != nullptr) {
    launch_kernel(rms_norm_kernel<true, kFp8>, dim3(rows), dim3(kThreads), stream, out, scale,
                  static_cast<const bf16*>(x), static_cast<bf16*>(residual), static_cast<const bf16*>(weight), hidden,
                  x_stride, out_stride, eps);
  } else {
    launch_kernel(rms_norm_kernel<false, kFp8>, dim3(rows), dim3(kThreads), stream, out, scale,
                  static_cast<const bf16*>(x), nullptr, static_cast<const bf16*>(weight), hidden, x_stride,
                  out_stride, eps);
  }
}

}  // namespace

cudaError_t rms_norm(void* out, const void* x, void* residual, const void* weight, int rows, int hidden,
                     int x_stride, int out_stride, float eps, cudaStream_t stream) {
  if (hidden % 8 != 0 || hidden > kThreads * 8 * kMaxVecPerThread) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  launch_rms_norm<false>(out, nullptr, x, residual, weight, rows, hidden, x_stride, out_stride, eps, stream);
  return cudaGetLastError();
}

cudaError_t rms_norm_fp8(void* codes, float* scale, const void* x, void* residual, const void* weight, int rows,
                         int hidden, int x_stride, float eps, cudaStream_t stream) {
  if (hidden % 8 != 0 || hidden > kThreads * 8 * kMaxVecPerThread) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  launch_rms_norm<true>(codes, scale, x, residual, weight, rows, hidden, x_stride, hidden, eps, stream);
  return cudaGetLastError();
}

}  // namespace q3tts

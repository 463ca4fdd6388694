// Fused (residual add +) RMSNorm, one block per row, 16-byte vectors held in registers between passes.
#include "launch.cuh"
#include "launchers.h"
#include "norm.cuh"

namespace q3tts {
namespace {

template <bool kResidual>
__global__ void __launch_bounds__(kNormThreads) rms_norm_kernel(bf16* __restrict__ out, const bf16* __restrict__ x,
                                                                bf16* __restrict__ residual,
                                                                const bf16* __restrict__ weight, int hidden,
                                                                int x_stride, int out_stride, float eps) {
  begin_dependent_kernel();
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  add_rms_norm_row<kResidual>(out + row * out_stride, x + row * x_stride,
                              kResidual ? residual + row * x_stride : nullptr, weight, hidden, eps, scratch);
}

}  // namespace

cudaError_t rms_norm(void* out, const void* x, void* residual, const void* weight, int rows, int hidden,
                     int x_stride, int out_stride, float eps, cudaStream_t stream) {
  if (hidden % 8 != 0 || hidden > kNormThreads * 8 * kNormMaxVecPerThread) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  const dim3 grid(rows);
  if (residual != nullptr) {
    launch_kernel(rms_norm_kernel<true>, dim3(grid), dim3(kNormThreads), stream,
        static_cast<bf16*>(out), static_cast<const bf16*>(x), static_cast<bf16*>(residual),
        static_cast<const bf16*>(weight), hidden, x_stride, out_stride, eps);
  } else {
    launch_kernel(rms_norm_kernel<false>, dim3(grid), dim3(kNormThreads), stream,
        static_cast<bf16*>(out), static_cast<const bf16*>(x), nullptr, static_cast<const bf16*>(weight),
        hidden, x_stride, out_stride, eps);
  }
  return cudaGetLastError();
}

}  // namespace q3tts

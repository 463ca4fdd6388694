// Rows of bf16 activations to float8 e4m3 with one fp32 scale per row (amax / 448), the A operand of the
// fp8 tensor-core GEMM (`ops.fp8_linear`). One block per row: a max reduction, then the scaled cast.
#include <cuda_fp8.h>

#include "common.cuh"
#include "launch.cuh"
#include "launchers.h"

namespace q3tts {
namespace {

constexpr float kFp8E4M3Max = 448.0f;
constexpr float kMinAmax = 1e-12f;  // an all-zero row gets a tiny scale, not a division by zero

struct alignas(8) Fp8x8 {
  __nv_fp8_storage_t v[8];
};

__global__ void quantize_rows_fp8_kernel(Fp8x8* __restrict__ out, float* __restrict__ scale,
                                         const bf16* __restrict__ x, int cols, int x_stride) {
  __shared__ float scratch[32];
  begin_dependent_kernel();
  const int row = blockIdx.x;
  const Bf16x8* in = reinterpret_cast<const Bf16x8*>(x + static_cast<int64_t>(row) * x_stride);
  Fp8x8* dst = out + static_cast<int64_t>(row) * (cols / 8);
  float amax = 0.0f;
  for (int vec = threadIdx.x; vec < cols / 8; vec += blockDim.x) {
    const Bf16x8 v = in[vec];
#pragma unroll
    for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(to_f(v.v[j])));
  }
  amax = block_max(amax, scratch);
  // The reference's ops, correctly rounded (no reciprocal): scale = amax / 448, code = e4m3(x / scale).
  const float s = __fdiv_rn(fmaxf(amax, kMinAmax), kFp8E4M3Max);
  if (threadIdx.x == 0) scale[row] = s;
  for (int vec = threadIdx.x; vec < cols / 8; vec += blockDim.x) {
    const Bf16x8 v = in[vec];
    Fp8x8 q;
#pragma unroll
    for (int j = 0; j < 8; ++j) q.v[j] = __nv_cvt_float_to_fp8(__fdiv_rn(to_f(v.v[j]), s), __NV_SATFINITE, __NV_E4M3);
    dst[vec] = q;
  }
}

}  // namespace

cudaError_t quantize_rows_fp8(void* out, float* scale, const void* x, int rows, int cols, int x_stride,
                              cudaStream_t stream) {
  if (cols % 8 != 0 || x_stride % 8 != 0) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  const int threads = cols >= 2048 ? 256 : 128;
  launch_kernel(quantize_rows_fp8_kernel, dim3(rows), dim3(threads), stream, static_cast<Fp8x8*>(out), scale,
                static_cast<const bf16*>(x), cols, x_stride);
  return cudaGetLastError();
}

}  // namespace q3tts

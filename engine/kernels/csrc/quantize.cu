// Rows of bf16 activations to float8 e4m3 with one fp32 scale per row (amax / 448), the A operand of the
// fp8 tensor-core GEMM (`ops.fp8_linear`). One block per row: a max reduction, then the scaled cast.
#include "fp8.cuh"
#include "launch.cuh"
#include "launchers.h"

namespace q3tts {
namespace {

__global__ void quantize_rows_fp8_kernel(Fp8x8* __restrict__ out, float* __restrict__ scale,
                                         const bf16* __restrict__ x, int cols, int x_stride) {
  __shared__ float scratch[32];
  begin_dependent_kernel();
  const int row = blockIdx.x;
  const Bf16x8* in = reinterpret_cast<const Bf16x8*>(x + static_cast<int64_t>(row) * x_stride);
  Fp8x8* dst = out + static_cast<int64_t>(row) * (cols / 8);
  float amax = 0.0f;
  // Each vector copied whole first: read through a reference, the compiler loads it 2 bytes at a time.
  for (int vec = threadIdx.x; vec < cols / 8; vec += blockDim.x) {
    const Bf16x8 v = in[vec];
    amax = fp8_amax(amax, v);
  }
  const Fp8RowScale s = fp8_row_scale(block_max(amax, scratch));
  if (threadIdx.x == 0) scale[row] = s.scale;
  for (int vec = threadIdx.x; vec < cols / 8; vec += blockDim.x) {
    const Bf16x8 v = in[vec];
    dst[vec] = fp8_codes(v, s.inverse);
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

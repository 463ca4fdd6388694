// SiLU(gate) * up with torch's rounding: silu rounded to bf16, then the product rounded to bf16.
#include "common.cuh"
#include "launch.cuh"
#include "launchers.h"

namespace q3tts {
namespace {

__global__ void silu_mul_kernel(bf16* __restrict__ out, const bf16* __restrict__ gate, const bf16* __restrict__ up,
                                int cols, int gate_stride, int up_stride, int out_stride) {
  begin_dependent_kernel();
  const int row = blockIdx.y;
  const int vec = blockIdx.x * blockDim.x + threadIdx.x;
  if (vec * 8 >= cols) return;
  const Bf16x8 g = reinterpret_cast<const Bf16x8*>(gate + static_cast<int64_t>(row) * gate_stride)[vec];
  const Bf16x8 u = reinterpret_cast<const Bf16x8*>(up + static_cast<int64_t>(row) * up_stride)[vec];
  Bf16x8 o;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float x = to_f(g.v[j]);
    // Same expression as ATen's silu kernel (x / (1 + exp(-x)) in fp32), so the result is bit-identical.
    const float s = round_bf(x / (1.0f + expf(-x)));
    o.v[j] = to_bf(s * to_f(u.v[j]));
  }
  reinterpret_cast<Bf16x8*>(out + static_cast<int64_t>(row) * out_stride)[vec] = o;
}

}  // namespace

cudaError_t silu_mul(void* out, const void* gate, const void* up, int rows, int cols, int gate_stride,
                     int up_stride, int out_stride, cudaStream_t stream) {
  if (cols % 8 != 0) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  const int threads = 128;
  const dim3 grid((cols / 8 + threads - 1) / threads, rows);
  launch_kernel(silu_mul_kernel, dim3(grid), dim3(threads), stream, static_cast<bf16*>(out), static_cast<const bf16*>(gate),
                                                 static_cast<const bf16*>(up), cols, gate_stride, up_stride,
                                                 out_stride);
  return cudaGetLastError();
}

}  // namespace q3tts

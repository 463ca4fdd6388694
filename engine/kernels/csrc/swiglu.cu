// SiLU(gate) * up with torch's rounding: silu rounded to bf16, then the product rounded to bf16. The fp8 form
// quantizes each row for the fp8 GEMM after it (fp8.cuh) instead of writing it as bf16.
#include "fp8.cuh"
#include "launch.cuh"
#include "launchers.h"

namespace q3tts {
namespace {

__device__ __forceinline__ Bf16x8 silu_mul8(const Bf16x8& g, const Bf16x8& u) {
  Bf16x8 o;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float x = to_f(g.v[j]);
    // Same expression as ATen's silu kernel (x / (1 + exp(-x)) in fp32), so the result is bit-identical.
    const float s = round_bf(x / (1.0f + expf(-x)));
    o.v[j] = to_bf(s * to_f(u.v[j]));
  }
  return o;
}

__global__ void silu_mul_kernel(bf16* __restrict__ out, const bf16* __restrict__ gate, const bf16* __restrict__ up,
                                int cols, int gate_stride, int up_stride, int out_stride) {
  begin_dependent_kernel();
  const int row = blockIdx.y;
  const int vec = blockIdx.x * blockDim.x + threadIdx.x;
  if (vec * 8 >= cols) return;
  const Bf16x8 g = reinterpret_cast<const Bf16x8*>(gate + static_cast<int64_t>(row) * gate_stride)[vec];
  const Bf16x8 u = reinterpret_cast<const Bf16x8*>(up + static_cast<int64_t>(row) * up_stride)[vec];
  reinterpret_cast<Bf16x8*>(out + static_cast<int64_t>(row) * out_stride)[vec] = silu_mul8(g, u);
}

constexpr int kRowThreads = 256;
constexpr int kMaxVecPerThread = 4;  // cols <= 256 * 8 * 4 = 8192

// One block per row: the row's products held in registers for its max, then written as e4m3 codes.
__global__ void __launch_bounds__(kRowThreads)
    silu_mul_fp8_kernel(Fp8x8* __restrict__ codes, float* __restrict__ scale, const bf16* __restrict__ gate,
                        const bf16* __restrict__ up, int cols, int gate_stride, int up_stride) {
  begin_dependent_kernel();
  __shared__ float scratch[32];
  const int row = blockIdx.x;
  const int vecs = cols / 8;
  const Bf16x8* gv = reinterpret_cast<const Bf16x8*>(gate + static_cast<int64_t>(row) * gate_stride);
  const Bf16x8* uv = reinterpret_cast<const Bf16x8*>(up + static_cast<int64_t>(row) * up_stride);
  Bf16x8 held[kMaxVecPerThread];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxVecPerThread; ++i) {
    const int idx = threadIdx.x + i * kRowThreads;
    if (idx < vecs) {
      const Bf16x8 g = gv[idx], u = uv[idx];  // whole 16-byte loads (through a reference: 2 bytes at a time)
      held[i] = silu_mul8(g, u);
      amax = fp8_amax(amax, held[i]);
    }
  }
  const Fp8RowScale s = fp8_row_scale(block_max(amax, scratch));
  if (threadIdx.x == 0) scale[row] = s.scale;
  Fp8x8* dst = codes + static_cast<int64_t>(row) * vecs;
#pragma unroll
  for (int i = 0; i < kMaxVecPerThread; ++i) {
    const int idx = threadIdx.x + i * kRowThreads;
    if (idx < vecs) dst[idx] = fp8_codes(held[i], s.inverse);
  }
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

cudaError_t silu_mul_fp8(void* codes, float* scale, const void* gate, const void* up, int rows, int cols,
                         int gate_stride, int up_stride, cudaStream_t stream) {
  if (cols % 8 != 0 || cols > kRowThreads * 8 * kMaxVecPerThread) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  launch_kernel(silu_mul_fp8_kernel, dim3(rows), dim3(kRowThreads), stream, static_cast<Fp8x8*>(codes), scale,
                static_cast<const bf16*>(gate), static_cast<const bf16*>(up), cols, gate_stride, up_stride);
  return cudaGetLastError();
}

}  // namespace q3tts

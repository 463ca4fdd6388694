// Fused (residual add +) RMSNorm, one block per row, 16-byte vectors held in registers between passes. The
// fp8 form quantizes the normed row for the fp8 GEMM after it (fp8.cuh) instead of writing it as bf16. The
// split-sums form reads the added value as the float32 partial sums of a product split over k
// (triton_products' down product) and adds them in split order, rounded once, as that product's own reduce
// kernel would: the reduce's kernel and its bf16 round trip are saved.
#include "fp8.cuh"
#include "launch.cuh"
#include "launchers.h"

namespace q3tts {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxVecPerThread = 4;  // hidden <= 256 * 8 * 4 = 8192
constexpr int kSplitSums = 4;        // triton_products.DOWN_SPLITS

// Vector idx (8 columns) of a row of `splits` float32 partial sums `split_stride` elements apart: `load`
// issues every split's loads, `summed` adds them in split order from zero, rounded once to bf16.
template <int kSplits>
struct SplitLoads {
  float4 lo[kSplits > 0 ? kSplits : 1], hi[kSplits > 0 ? kSplits : 1];

  __device__ __forceinline__ void load(const float* __restrict__ row, int idx, int64_t split_stride) {
#pragma unroll
    for (int s = 0; s < kSplits; ++s) {
      const float4* v = reinterpret_cast<const float4*>(row + s * split_stride) + 2 * idx;
      lo[s] = v[0];
      hi[s] = v[1];
    }
  }

  __device__ __forceinline__ Bf16x8 summed() const {
    float acc[8] = {};
#pragma unroll
    for (int s = 0; s < kSplits; ++s) {
      const float parts[8] = {lo[s].x, lo[s].y, lo[s].z, lo[s].w, hi[s].x, hi[s].y, hi[s].z, hi[s].w};
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] += parts[j];
    }
    Bf16x8 out;
#pragma unroll
    for (int j = 0; j < 8; ++j) out.v[j] = to_bf(acc[j]);
    return out;
  }
};

// kFp8: `out` is e4m3 codes [rows, hidden] (contiguous; out_stride unused) and `scale` gets each row's scale.
// kSplits > 0: the added rows are `partials` (row r at r * hidden, splits split_stride apart; x unused).
template <bool kResidual, bool kFp8, int kSplits>
__global__ void __launch_bounds__(kThreads) rms_norm_kernel(void* __restrict__ out, float* __restrict__ scale,
                                                            const bf16* __restrict__ x, bf16* __restrict__ residual,
                                                            const bf16* __restrict__ weight, int hidden,
                                                            int x_stride, int out_stride, float eps,
                                                            const float* __restrict__ partials,
                                                            int64_t split_stride) {
  static_assert(kSplits == 0 || kResidual, "split sums are added to a residual");
  const int vecs = hidden / 8;
  // The norm weight before the wait (launch.cuh): no load of it follows the block's sum of squares.
  const Bf16x8* wv = reinterpret_cast<const Bf16x8*>(weight);
  Bf16x8 weights[kMaxVecPerThread];
#pragma unroll
  for (int i = 0; i < kMaxVecPerThread; ++i) {
    const int idx = threadIdx.x + i * kThreads;
    if (idx < vecs) weights[i] = load_before_wait(wv + idx);
  }
  begin_dependent_kernel();
  __shared__ float scratch[32];
  const int row = blockIdx.x;
  const Bf16x8* xv = reinterpret_cast<const Bf16x8*>(x + static_cast<int64_t>(row) * x_stride);
  Bf16x8* rv = kResidual ? reinterpret_cast<Bf16x8*>(residual + static_cast<int64_t>(row) * x_stride) : nullptr;
  // The split-sums form issues every vector's partial sums and residual before any add: with the residual
  // loaded in the loop that adds, ptxas issued it only after the first partial sums had arrived (a second L2
  // round trip). Its registers (208) do not matter: it runs at most 64 rows, a block each.
  SplitLoads<kSplits> parts[kMaxVecPerThread];
  Bf16x8 residual_parts[kMaxVecPerThread];
  if constexpr (kSplits > 0) {
#pragma unroll
    for (int i = 0; i < kMaxVecPerThread; ++i) {
      const int idx = threadIdx.x + i * kThreads;
      if (idx < vecs) {
        residual_parts[i] = rv[idx];
        parts[i].load(partials + static_cast<int64_t>(row) * hidden, idx, split_stride);
      }
    }
  }
  Bf16x8 held[kMaxVecPerThread];
  float sum_sq = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxVecPerThread; ++i) {
    const int idx = threadIdx.x + i * kThreads;
    if (idx < vecs) {
      Bf16x8 a, r;
      if constexpr (kSplits > 0) {
        a = parts[i].summed();
        r = residual_parts[i];
      } else {
        a = xv[idx];
        if (kResidual) r = rv[idx];
      }
      if (kResidual) {
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
  Bf16x8* ov = reinterpret_cast<Bf16x8*>(static_cast<bf16*>(out) + static_cast<int64_t>(row) * out_stride);
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxVecPerThread; ++i) {
    const int idx = threadIdx.x + i * kThreads;
    if (idx < vecs) {
      const Bf16x8& w = weights[i];
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
    launch_kernel(rms_norm_kernel<true, kFp8, 0>, dim3(rows), dim3(kThreads), stream, out, scale,
                  static_cast<const bf16*>(x), static_cast<bf16*>(residual), static_cast<const bf16*>(weight), hidden,
                  x_stride, out_stride, eps, nullptr, int64_t{0});
  } else {
    launch_kernel(rms_norm_kernel<false, kFp8, 0>, dim3(rows), dim3(kThreads), stream, out, scale,
                  static_cast<const bf16*>(x), nullptr, static_cast<const bf16*>(weight), hidden, x_stride,
                  out_stride, eps, nullptr, int64_t{0});
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

cudaError_t rms_norm_split_sums(void* out, float* scale, const float* partials, int splits, int64_t split_stride,
                                void* residual, const void* weight, int rows, int hidden, int residual_stride,
                                int out_stride, float eps, cudaStream_t stream) {
  if (hidden % 8 != 0 || hidden > kThreads * 8 * kMaxVecPerThread) return cudaErrorInvalidValue;
  if (splits != kSplitSums || split_stride % 4 != 0) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  auto* res = static_cast<bf16*>(residual);
  auto* w = static_cast<const bf16*>(weight);
  if (scale != nullptr) {
    launch_kernel(rms_norm_kernel<true, true, kSplitSums>, dim3(rows), dim3(kThreads), stream, out, scale, nullptr,
                  res, w, hidden, residual_stride, hidden, eps, partials, split_stride);
  } else {
    launch_kernel(rms_norm_kernel<true, false, kSplitSums>, dim3(rows), dim3(kThreads), stream, out, nullptr,
                  nullptr, res, w, hidden, residual_stride, out_stride, eps, partials, split_stride);
  }
  return cudaGetLastError();
}

}  // namespace q3tts

// (Residual add +) RMSNorm of one row by one block: the body of rms_norm_kernel (norm.cu), also run by the
// last block of the GEMV that produces the row (gemv.cu), so both round exactly alike.
#pragma once

#include "common.cuh"

namespace q3tts {

constexpr int kNormThreads = 256;
constexpr int kNormMaxVecPerThread = 4;  // hidden <= 256 * 8 * 4 = 8192

// out = bf16(bf16(s * rsqrt(mean(s^2) + eps)) * weight) with s = x, or s = bf16(residual + x) written back
// to residual when kResidual. x is read through L2 only (`__ldcg`): in the GEMV's last block it was written
// by other blocks of the same grid. Needs blockDim.x == kNormThreads; `scratch` holds 32 floats.
template <bool kResidual>
__device__ __forceinline__ void add_rms_norm_row(bf16* __restrict__ out, const bf16* x, bf16* __restrict__ residual,
                                                 const bf16* __restrict__ weight, int hidden, float eps,
                                                 float* scratch) {
  const int vecs = hidden / 8;
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  Bf16x8* rv = reinterpret_cast<Bf16x8*>(residual);
  Bf16x8 held[kNormMaxVecPerThread];
  float sum_sq = 0.0f;
#pragma unroll
  for (int i = 0; i < kNormMaxVecPerThread; ++i) {
    const int idx = threadIdx.x + i * kNormThreads;
    if (idx < vecs) {
      const uint4 raw = __ldcg(xv + idx);
      Bf16x8 a = *reinterpret_cast<const Bf16x8*>(&raw);
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
  Bf16x8* ov = reinterpret_cast<Bf16x8*>(out);
#pragma unroll
  for (int i = 0; i < kNormMaxVecPerThread; ++i) {
    const int idx = threadIdx.x + i * kNormThreads;
    if (idx < vecs) {
      const Bf16x8 w = wv[idx];
      Bf16x8 o;
#pragma unroll
      for (int j = 0; j < 8; ++j) o.v[j] = to_bf(to_f(w.v[j]) * round_bf(to_f(held[i].v[j]) * inv));
      ov[idx] = o;
    }
  }
}

}  // namespace q3tts

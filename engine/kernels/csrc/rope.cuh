// One head's RMSNorm + rotate-half RoPE, computed by one warp: shared by qk_norm_rope_cache (rope_cache.cu)
// and the short-cache attention that does it in its prologue (attention.cu), so the two are bit-identical.
// The rotation repeats torch's bf16 rounding (x*cos, rotated*sin, their sum, each rounded), so apart from
// the norm's fp32 reduction order the result is the reference's bit for bit.
#pragma once

#include "common.cuh"

namespace q3tts {

// P = head_dim / 64: lane owns elements [lane * P, lane * P + P) of each half of the head. `src` is the
// head's D = 64 * P values, `weight` the norm weight, `cos`/`sin` the table rows of the position; the rotated
// head goes to lo[j] (element lane * P + j) and hi[j] (element D / 2 + lane * P + j).
template <int P>
__device__ __forceinline__ void norm_rope_head(const bf16* __restrict__ src, const bf16* __restrict__ weight,
                                               const bf16* __restrict__ cos, const bf16* __restrict__ sin,
                                               float eps, bf16 (&lo)[P], bf16 (&hi)[P]) {
  constexpr int D = 64 * P;
  constexpr int H = D / 2;
  const int first = (threadIdx.x & 31) * P;
  float a[P], c[P];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < P; ++j) {
    a[j] = to_f(src[first + j]);
    c[j] = to_f(src[first + H + j]);
    ss += a[j] * a[j] + c[j] * c[j];
  }
  ss = warp_sum(ss);
  const float inv = rsqrtf(ss / static_cast<float>(D) + eps);
#pragma unroll
  for (int j = 0; j < P; ++j) {
    const float x1 = round_bf(to_f(weight[first + j]) * round_bf(a[j] * inv));
    const float x2 = round_bf(to_f(weight[first + H + j]) * round_bf(c[j] * inv));
    const float o1 = round_bf(x1 * to_f(cos[first + j])) + round_bf(-x2 * to_f(sin[first + j]));
    const float o2 = round_bf(x2 * to_f(cos[first + H + j])) + round_bf(x1 * to_f(sin[first + H + j]));
    lo[j] = to_bf(o1);
    hi[j] = to_bf(o2);
  }
}

}  // namespace q3tts

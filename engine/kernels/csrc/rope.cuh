// One head's RMSNorm + rotate-half RoPE, computed by one warp: shared by qk_norm_rope_cache (rope_cache.cu)
// and the short-cache attention that does it in its prologue (attention.cu), so the two are bit-identical.
// The rotation repeats torch's bf16 rounding (x*cos, rotated*sin, their sum, each rounded), so apart from
// the norm's fp32 reduction order the result is the reference's bit for bit.
#pragma once

#include "common.cuh"

namespace q3tts {

// P = head_dim / 64: lane owns elements [lane * P, lane * P + P) of each half of the head (lo: the first half,
// hi: the second). These are the lane's share of the constants of one head's norm and RoPE: a kernel may read
// them before it waits for the previous kernel (launch.cuh), since no kernel writes them.
template <int P>
struct NormSlice {
  float lo[P];
  float hi[P];
};

template <int P>
struct RopeRow {
  NormSlice<P> cos;
  NormSlice<P> sin;
};

template <int P>
__device__ __forceinline__ NormSlice<P> load_norm_slice(const bf16* __restrict__ row) {
  constexpr int H = 32 * P;
  const int first = (threadIdx.x & 31) * P;
  NormSlice<P> s;
#pragma unroll
  for (int j = 0; j < P; ++j) {
    s.lo[j] = to_f(row[first + j]);
    s.hi[j] = to_f(row[first + H + j]);
  }
  return s;
}

// The cos and sin table rows of one position.
template <int P>
__device__ __forceinline__ RopeRow<P> load_rope_row(const bf16* __restrict__ cos, const bf16* __restrict__ sin) {
  return {load_norm_slice<P>(cos), load_norm_slice<P>(sin)};
}

// `src` is the head's D = 64 * P values, `weight` this lane's share of the norm weight, `rope` of the
// position's table rows; the rotated head goes to lo[j] (element lane * P + j) and hi[j] (element
// D / 2 + lane * P + j).
template <int P>
__device__ __forceinline__ void norm_rope_head(const bf16* __restrict__ src, const NormSlice<P>& weight,
                                               const RopeRow<P>& rope, float eps, bf16 (&lo)[P], bf16 (&hi)[P]) {
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
    const float x1 = round_bf(weight.lo[j] * round_bf(a[j] * inv));
    const float x2 = round_bf(weight.hi[j] * round_bf(c[j] * inv));
    const float o1 = round_bf(x1 * rope.cos.lo[j]) + round_bf(-x2 * rope.sin.lo[j]);
    const float o2 = round_bf(x2 * rope.cos.hi[j]) + round_bf(x1 * rope.sin.hi[j]);
    lo[j] = to_bf(o1);
    hi[j] = to_bf(o2);
  }
}

}  // namespace q3tts

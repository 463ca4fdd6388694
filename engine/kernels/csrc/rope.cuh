// One head's RMSNorm + rotate-half RoPE, computed by one warp: shared by qk_norm_rope_cache (rope_cache.cu)
// and the short-cache attention that does it in its prologue (attention.cu), so the two are bit-identical.
// The rotation repeats torch's bf16 rounding (x*cos, rotated*sin, their sum, each rounded), so apart from
// the norm's fp32 reduction order the result is the reference's bit for bit.
#pragma once

#include "common.cuh"

namespace q3tts {

// P = head_dim / 64: a lane's slice of a head row is elements [lane * P, lane * P + P) (lo) and
// [D / 2 + lane * P, ...) (hi); slice element e is lo[e] for e < P, else hi[e - P]. The attention kernels keep
// heads in this layout too (attention.cu).
template <int P>
struct HeadSlice {
  bf16 lo[P];
  bf16 hi[P];
  __device__ __forceinline__ float at(int e) const { return to_f(e < P ? lo[e] : hi[e - P]); }
};

// This lane's slice of a head row. kBeforeWait: data no kernel writes (the RoPE tables, the norm weights),
// loaded before the wait (common.cuh's load_before_wait).
template <int P, bool kBeforeWait = false>
__device__ __forceinline__ HeadSlice<P> load_slice(const bf16* __restrict__ row) {
  constexpr int H = 32 * P;
  const int first = (threadIdx.x & 31) * P;
  HeadSlice<P> s;
#pragma unroll
  for (int j = 0; j < P; ++j) {
    if constexpr (kBeforeWait) {
      s.lo[j] = load_before_wait(row + first + j);
      s.hi[j] = load_before_wait(row + H + first + j);
    } else {
      s.lo[j] = row[first + j];
      s.hi[j] = row[H + first + j];
    }
  }
  return s;
}

// load_slice's kBeforeWait, named at the call.
constexpr bool kBeforeWait = true;

// Stores a lane's slice (a HeadSlice, or kv_cache.cuh's codes) into a row of the slice's element type.
template <int P, typename T, typename Slice>
__device__ __forceinline__ void store_slice(T* __restrict__ row, const Slice& s) {
  constexpr int H = 32 * P;
  const int first = (threadIdx.x & 31) * P;
#pragma unroll
  for (int j = 0; j < P; ++j) {
    row[first + j] = s.lo[j];
    row[H + first + j] = s.hi[j];
  }
}

// `src` is this lane's slice of the head's D = 64 * P values (load_slice); `weight`, `cos` and `sin` are its
// slices of the norm weight and of the position's RoPE table rows (constants: a kernel may load them before it
// waits for the previous kernel, launch.cuh). The rotated head goes to lo[j] (element lane * P + j) and hi[j]
// (element D / 2 + lane * P + j). Taking the slice already loaded lets a kernel issue other loads between.
template <int P>
__device__ __forceinline__ void norm_rope_slice(const HeadSlice<P>& src, const HeadSlice<P>& weight,
                                                const HeadSlice<P>& cos, const HeadSlice<P>& sin, float eps,
                                                bf16 (&lo)[P], bf16 (&hi)[P]) {
  constexpr int D = 64 * P;
  float a[P], c[P];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < P; ++j) {
    a[j] = to_f(src.lo[j]);
    c[j] = to_f(src.hi[j]);
    ss += a[j] * a[j] + c[j] * c[j];
  }
  ss = warp_sum(ss);
  const float inv = rsqrtf(ss / static_cast<float>(D) + eps);
#pragma unroll
  for (int j = 0; j < P; ++j) {
    const float x1 = round_bf(to_f(weight.lo[j]) * round_bf(a[j] * inv));
    const float x2 = round_bf(to_f(weight.hi[j]) * round_bf(c[j] * inv));
    const float o1 = round_bf(x1 * to_f(cos.lo[j])) + round_bf(-x2 * to_f(sin.lo[j]));
    const float o2 = round_bf(x2 * to_f(cos.hi[j])) + round_bf(x1 * to_f(sin.hi[j]));
    lo[j] = to_bf(o1);
    hi[j] = to_bf(o2);
  }
}

// norm_rope_slice of the head at `src`.
template <int P>
__device__ __forceinline__ void norm_rope_head(const bf16* __restrict__ src, const HeadSlice<P>& weight,
                                               const HeadSlice<P>& cos, const HeadSlice<P>& sin, float eps,
                                               bf16 (&lo)[P], bf16 (&hi)[P]) {
  norm_rope_slice<P>(load_slice<P>(src), weight, cos, sin, eps, lo, hi);
}

}  // namespace q3tts

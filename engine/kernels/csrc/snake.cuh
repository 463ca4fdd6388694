// SnakeBeta of one element, x + inv_beta * sin(x * freq)^2, as the reference rounds it: shared by the SnakeBeta
// kernels (snake.cu) and the unfold kernels that apply it to the samples they read (unfold.cu), so both give
// the same bits.
#pragma once

#include "common.cuh"

namespace q3tts {

// float32: the reference's ops in its order, each rounded as torch rounds it: explicit _rn intrinsics (no FMA
// contraction) and CUDA's own sinf.
__device__ __forceinline__ float add(float x, float b) { return __fadd_rn(x, b); }

__device__ __forceinline__ float snake(float x, float freq, float inv_beta) {
  const float s = sinf(__fmul_rn(x, freq));
  return __fadd_rn(x, __fmul_rn(inv_beta, __fmul_rn(s, s)));
}

// bf16: the same ops, each computed in fp32 and rounded to bf16 as torch rounds it, and one change: the sine.
// CUDA's accurate sinf (a long range reduction) made this kernel instruction-bound; here sin(a) is a
// Cody-Waite reduction to [-pi, pi] and the hardware sine (MUFU, absolute error <= 2^-21.41 there), and it
// still rounds to the very bf16 that sinf(a) rounds to, because a (x * freq rounded to bf16) takes only 65536
// values: for each bf16 a with 2^-4 <= |a| < 2048, sin(a) lies more than 1.4 times that error plus the
// reduction's (<= 2^-23) away from the nearest bf16 rounding boundary (computed for all of them; the nearest,
// at a = 12.8125). Below 2^-4, sin(a) rounds to a itself. From 2048 on, where the margin fails (a = 2480),
// and for inf and NaN: sinf.
__device__ __forceinline__ bf16 add(bf16 x, bf16 b) { return to_bf(to_f(x) + to_f(b)); }

constexpr float kFastSineLimit = 2048.0f;
constexpr float kInvTwoPi = 0x1.45f306p-3f;  // 1 / (2 pi)
constexpr float kTwoPiHi = 0x1.921fb6p+2f;   // 2 pi = kTwoPiHi + kTwoPiLo to about 2^-47
constexpr float kTwoPiLo = -0x1.777a5cp-23f;
constexpr float kRoundToInteger = 0x1.8p23f;  // x + 1.5 * 2^23 - 1.5 * 2^23 is x rounded to an integer

// sin(a) for a bf16 value a with |a| < kFastSineLimit: a float that rounds to the bf16 of sinf(a).
__device__ __forceinline__ float fast_sin_of_bf16(float a) {
  const float k = fmaf(a, kInvTwoPi, kRoundToInteger) - kRoundToInteger;  // the integer nearest a / (2 pi)
  const float r = fmaf(-k, kTwoPiLo, fmaf(-k, kTwoPiHi, a));               // exact but for its last rounding
  return fabsf(a) < 0x1p-4f ? a : __sinf(r);
}

__device__ __forceinline__ bool fast_sine_covers(float a) { return fabsf(a) < kFastSineLimit; }

__device__ __forceinline__ float snake(bf16 x_bf, bf16 freq_bf, bf16 inv_beta_bf) {
  const float x = to_f(x_bf);
  const float a = round_bf(x * to_f(freq_bf));
  const float s = round_bf(fast_sine_covers(a) ? fast_sin_of_bf16(a) : sinf(a));
  return x + round_bf(to_f(inv_beta_bf) * round_bf(s * s));  // products of bf16 values: exact in fp32
}

// SnakeBeta(v + bias[c]) of channel c (no bias when null), in v's type: what snake_beta writes for that element.
template <typename T>
__device__ __forceinline__ T snake_of_channel(T v, const T* __restrict__ freq, const T* __restrict__ inv_beta,
                                              const T* __restrict__ bias, int64_t c) {
  if (bias != nullptr) v = add(v, bias[c]);
  T out;
  store_float(&out, snake(v, freq[c], inv_beta[c]));
  return out;
}

}  // namespace q3tts

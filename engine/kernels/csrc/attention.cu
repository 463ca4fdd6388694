// Flash-decoding for one query token per row over a static [slots, kv_heads, max_len, D] cache.
// Pass 1: one block per (64-key split, kv head, row); the split's K and V are staged in shared memory with
// all loads in flight at once, and every query head of the GQA group reuses them. Pass 2 merges the splits (no pass 2 for a single split).
// Splits past a row's length exit at once, so the grid can be sized for max_len (graph capture) and the
// work still follows the real length.
#include <math_constants.h>

#include "common.cuh"
#include "launch.cuh"
#include "launchers.h"

namespace q3tts {
namespace {

constexpr int kTile = 64;
constexpr int kThreads = 128;

template <int D, int G>
__global__ void __launch_bounds__(kThreads)
    attention_split_kernel(float* __restrict__ ws, bf16* __restrict__ out, const bf16* __restrict__ q,
                           const bf16* __restrict__ k_cache,
                           const bf16* __restrict__ v_cache, const int64_t* __restrict__ slots,
                           const int64_t* __restrict__ lengths, int q_heads, int kv_heads, int max_len,
                           int num_splits, float scale) {
  begin_dependent_kernel();
  constexpr int kRow = D + 8;  // padded K rows: conflict-free 16-byte reads across a quarter warp
  __shared__ __align__(16) bf16 k_s[kTile * kRow];
  __shared__ __align__(16) bf16 v_s[kTile * D];
  __shared__ float q_s[G][D];
  __shared__ float p_s[G][kTile];
  __shared__ float red_s[G][2][2];

  const int split = blockIdx.x;
  const int kvh = blockIdx.y;
  const int b = blockIdx.z;
  const int len = static_cast<int>(lengths[b]);
  const int start = split * kTile;
  const int count = min(kTile, len - start);
  const int tid = threadIdx.x;
  float* part = ws + ((static_cast<int64_t>(b) * q_heads + kvh * G) * num_splits + split) * (D + 2);
  const int64_t part_head = static_cast<int64_t>(num_splits) * (D + 2);

  // One split (the predictor's short caches): normalise here and skip the merge kernel. The merge of one
  // split computes fmaf(acc, 1, 0) / fmaf(l, 1, 0), i.e. (acc + 0) / l, so this is the same result.
  bf16* single = num_splits == 1 ? out + (static_cast<int64_t>(b) * q_heads + kvh * G) * D : nullptr;
  if (count <= 0) {
    if (single != nullptr) {
      for (int i = tid; i < G * D; i += kThreads) single[i] = to_bf(0.0f);
      return;
    }
    for (int i = tid; i < G * (D + 2); i += kThreads) {
      const int g = i / (D + 2), j = i % (D + 2);
      part[g * part_head + j] = j == D ? -CUDART_INF_F : 0.0f;
    }
    return;
  }

  const int64_t slot = slots[b];
  const bf16* kb = k_cache + ((slot * kv_heads + kvh) * max_len + start) * D;
  const bf16* vb = v_cache + ((slot * kv_heads + kvh) * max_len + start) * D;
  constexpr int kVecsPerRow = D / 8;
#pragma unroll
  for (int i = tid; i < kTile * kVecsPerRow; i += kThreads) {
    const int row = i / kVecsPerRow, col = i % kVecsPerRow;
    Bf16x8 kv{}, vv{};
    if (row < count) {
      kv = reinterpret_cast<const Bf16x8*>(kb + row * D)[col];
      vv = reinterpret_cast<const Bf16x8*>(vb + row * D)[col];
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) kv.v[j] = vv.v[j] = to_bf(0.0f);
    }
    *reinterpret_cast<Bf16x8*>(k_s + row * kRow + col * 8) = kv;
    *reinterpret_cast<Bf16x8*>(v_s + row * D + col * 8) = vv;
  }
  for (int i = tid; i < G * D; i += kThreads) {
    const int g = i / D, d = i % D;
    q_s[g][d] = to_f(q[(static_cast<int64_t>(b) * q_heads + kvh * G + g) * D + d]) * scale;
  }
  __syncthreads();

  // Scores: thread -> (key, head); fp32 dot over D from shared memory.
  for (int i = tid; i < G * kTile; i += kThreads) {
    const int g = i / kTile, key = i % kTile;
    float s = -CUDART_INF_F;
    if (key < count) {
      s = 0.0f;
#pragma unroll
      for (int c = 0; c < kVecsPerRow; ++c) {
        const Bf16x8 kv = *reinterpret_cast<const Bf16x8*>(k_s + key * kRow + c * 8);
#pragma unroll
        for (int j = 0; j < 8; ++j) s = fmaf(q_s[g][c * 8 + j], to_f(kv.v[j]), s);
      }
    }
    p_s[g][key] = s;
  }
  __syncthreads();

  // Tile max and sum per head: one warp per (head, half of the 64 keys) pair.
  const int warp = tid >> 5, lane = tid & 31;
  if (warp < 2 * G) {
    const int g = warp >> 1, half = warp & 1;
    const float s = p_s[g][half * 32 + lane];
    const float m = warp_max(s);
    if (lane == 0) red_s[g][half][0] = m;
  }
  __syncthreads();
  if (warp < 2 * G) {
    const int g = warp >> 1, half = warp & 1;
    const float m = fmaxf(red_s[g][0][0], red_s[g][1][0]);
    const float s = p_s[g][half * 32 + lane];
    const float p = s == -CUDART_INF_F ? 0.0f : expf(s - m);
    p_s[g][half * 32 + lane] = p;
    const float l = warp_sum(p);
    if (lane == 0) red_s[g][half][1] = l;
  }
  __syncthreads();

  // P.V: thread -> output dimension, all heads of the group.
  for (int d = tid; d < D; d += kThreads) {
    float acc[G];
#pragma unroll
    for (int g = 0; g < G; ++g) acc[g] = 0.0f;
    for (int key = 0; key < count; ++key) {
      const float v = to_f(v_s[key * D + d]);
#pragma unroll
      for (int g = 0; g < G; ++g) acc[g] = fmaf(p_s[g][key], v, acc[g]);
    }
    if (single != nullptr) {
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float den = red_s[g][0][1] + red_s[g][1][1];
        single[g * D + d] = to_bf(den > 0.0f ? (acc[g] + 0.0f) / den : 0.0f);
      }
      continue;
    }
#pragma unroll
    for (int g = 0; g < G; ++g) part[g * part_head + d] = acc[g];
  }
  if (single != nullptr) return;
  if (tid < G) {
    const int g = tid;
    part[g * part_head + D] = fmaxf(red_s[g][0][0], red_s[g][1][0]);
    part[g * part_head + D + 1] = red_s[g][0][1] + red_s[g][1][1];
  }
}

template <int D>
__global__ void attention_merge_kernel(bf16* __restrict__ out, const float* __restrict__ ws, int num_splits) {
  begin_dependent_kernel();
  const int row_head = blockIdx.x;  // b * q_heads + h
  const float* part = ws + static_cast<int64_t>(row_head) * num_splits * (D + 2);
  float m = -CUDART_INF_F;
  for (int s = 0; s < num_splits; ++s) m = fmaxf(m, part[s * (D + 2) + D]);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float num = 0.0f, den = 0.0f;
    if (m != -CUDART_INF_F) {
      for (int s = 0; s < num_splits; ++s) {
        const float ms = part[s * (D + 2) + D];
        if (ms == -CUDART_INF_F) continue;
        const float f = expf(ms - m);
        num = fmaf(part[s * (D + 2) + d], f, num);
        den = fmaf(part[s * (D + 2) + D + 1], f, den);
      }
    }
    out[static_cast<int64_t>(row_head) * D + d] = to_bf(den > 0.0f ? num / den : 0.0f);
  }
}

}  // namespace

int decode_attention_splits(int max_len, int split_len) {
  (void)split_len;
  return (max_len + kTile - 1) / kTile;
}

cudaError_t decode_attention(void* out, const void* q, const void* k_cache, const void* v_cache,
                             const int64_t* slots, const int64_t* lengths, float* workspace, int batch,
                             int q_heads, int kv_heads, int head_dim, int max_len, int split_len,
                             float scale, cudaStream_t stream) {
  if (split_len != kTile || q_heads % kv_heads != 0) return cudaErrorInvalidValue;
  if (batch == 0) return cudaSuccess;
  const int groups = q_heads / kv_heads;
  const int splits = decode_attention_splits(max_len, split_len);
  const dim3 grid(splits, kv_heads, batch);
#define Q3TTS_SPLIT(D, G)                                                                              \
  launch_kernel(attention_split_kernel<D, G>, dim3(grid), dim3(kThreads), stream,                                          \
      workspace, static_cast<bf16*>(out), static_cast<const bf16*>(q),                                 \
      static_cast<const bf16*>(k_cache),                                                               \
      static_cast<const bf16*>(v_cache), slots, lengths, q_heads, kv_heads, max_len, splits, scale)
  if (head_dim == 128 && groups == 2) {
    Q3TTS_SPLIT(128, 2);
  } else if (head_dim == 128 && groups == 1) {
    Q3TTS_SPLIT(128, 1);
  } else if (head_dim == 64 && groups == 1) {
    Q3TTS_SPLIT(64, 1);
  } else if (head_dim == 64 && groups == 2) {
    Q3TTS_SPLIT(64, 2);
  } else {
    return cudaErrorInvalidValue;
  }
#undef Q3TTS_SPLIT
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || splits == 1) return err;
  if (head_dim == 128) {
    launch_kernel(attention_merge_kernel<128>, dim3(batch * q_heads), dim3(128), stream, static_cast<bf16*>(out), workspace, splits);
  } else {
    launch_kernel(attention_merge_kernel<64>, dim3(batch * q_heads), dim3(64), stream, static_cast<bf16*>(out), workspace, splits);
  }
  return cudaGetLastError();
}

}  // namespace q3tts

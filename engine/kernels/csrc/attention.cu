// Flash-decoding for one query token per row over a static [slots, kv_heads, max_len, D] cache.
// Pass 1: one block per (64-key split, kv head, row); the split's K and V are staged in shared memory with
// all loads in flight at once, and every query head of the GQA group reuses them. Pass 2 merges the splits
// (no pass 2 for a single split). For decode steps (distinct slots) pass 1 also does the q/k norm, RoPE and
// cache write of the new token (rope_attention_kernel).
// Splits past a row's length exit at once, so the grid can be sized for max_len (graph capture) and the
// work still follows the real length.
#include <math_constants.h>

#include "common.cuh"
#include "launch.cuh"
#include "launchers.h"
#include "rope.cuh"

namespace q3tts {
namespace {

constexpr int kTile = 64;
constexpr int kThreads = 128;

// A block's shared memory: one tile of keys and values, the group's scaled queries, scores and reductions.
template <int D, int G>
struct Tile {
  static constexpr int kRow = D + 8;  // padded K rows: conflict-free 16-byte reads across a quarter warp
  __align__(16) bf16 k[kTile * kRow];
  __align__(16) bf16 v[kTile * D];
  float q[G][D];
  float p[G][kTile];
  float red[G][2][2];
};

// The staged tile's `count` keys against the group's G queries: scores, the tile's softmax statistics, P.V.
// With `single` (the whole cache is one tile) the normalised heads go there; else the unnormalised partials
// and their max / sum go to `part` for the merge kernel. Call after a __syncthreads that ends the staging.
template <int D, int G>
__device__ __forceinline__ void attend_tile(Tile<D, G>& t, int count, bf16* single, float* part, int64_t part_head) {
  constexpr int kRow = Tile<D, G>::kRow;
  constexpr int kVecsPerRow = D / 8;
  const int tid = threadIdx.x;
  bf16* k_s = t.k;
  bf16* v_s = t.v;
  auto& q_s = t.q;
  auto& p_s = t.p;
  auto& red_s = t.red;
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

// Stage a tile's keys and values: rows below `cached` from the cache rows at kb / vb, zeros for the rest,
// except row `skip` (the new token, staged from registers by the caller), all loads in flight at once.
template <int D, int G>
__device__ __forceinline__ void stage_tile(Tile<D, G>& t, const bf16* kb, const bf16* vb, int cached, int skip) {
  constexpr int kRow = Tile<D, G>::kRow;
  constexpr int kVecsPerRow = D / 8;
#pragma unroll
  for (int i = threadIdx.x; i < kTile * kVecsPerRow; i += kThreads) {
    const int row = i / kVecsPerRow, col = i % kVecsPerRow;
    if (row == skip) continue;
    Bf16x8 kv{}, vv{};
    if (row < cached) {
      kv = reinterpret_cast<const Bf16x8*>(kb + row * D)[col];
      vv = reinterpret_cast<const Bf16x8*>(vb + row * D)[col];
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) kv.v[j] = vv.v[j] = to_bf(0.0f);
    }
    *reinterpret_cast<Bf16x8*>(t.k + row * kRow + col * 8) = kv;
    *reinterpret_cast<Bf16x8*>(t.v + row * D + col * 8) = vv;
  }
}

template <int D, int G>
__global__ void __launch_bounds__(kThreads)
    attention_split_kernel(float* __restrict__ ws, bf16* __restrict__ out, const bf16* __restrict__ q,
                           const bf16* __restrict__ k_cache,
                           const bf16* __restrict__ v_cache, const int64_t* __restrict__ slots,
                           const int64_t* __restrict__ lengths, int q_heads, int kv_heads, int max_len,
                           int num_splits, float scale) {
  begin_dependent_kernel();
  __shared__ Tile<D, G> t;

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
  if (count <= 0) {  // a split past the row's length: the merge reads only the live ones
    if (single != nullptr) {
      for (int i = tid; i < G * D; i += kThreads) single[i] = to_bf(0.0f);
    }
    return;
  }

  const int64_t slot = slots[b];
  const bf16* kb = k_cache + ((slot * kv_heads + kvh) * max_len + start) * D;
  const bf16* vb = v_cache + ((slot * kv_heads + kvh) * max_len + start) * D;
  stage_tile<D, G>(t, kb, vb, count, kTile);
  for (int i = tid; i < G * D; i += kThreads) {
    const int g = i / D, d = i % D;
    t.q[g][d] = to_f(q[(static_cast<int64_t>(b) * q_heads + kvh * G + g) * D + d]) * scale;
  }
  __syncthreads();
  attend_tile<D, G>(t, count, single, part, part_head);
}

// The whole decode step of one query token per row, for rows whose slots are distinct: q/k RMSNorm + RoPE
// of the new token (rope.cuh, as qk_norm_rope_cache computes them), its K/V written to the cache, and pass 1
// of the attention, in one block per (64-key split, KV head, row). Every split ropes the G queries (warps
// 0..G-1); the split that holds the new position ropes its key (warp G) and copies its value (warp G+1) to
// the cache and stages both from registers, the older keys and values come from the cache (another row's
// block never writes them: distinct slots). With one split (the code predictor's 16 positions) the heads
// are normalised here; else the merge kernel follows. The same values as qk_norm_rope_cache then
// decode_attention, bit for bit, one dependent kernel fewer.
template <int D, int G>
__global__ void __launch_bounds__(kThreads)
    rope_attention_kernel(float* __restrict__ ws, bf16* __restrict__ out, const bf16* __restrict__ q,
                          const bf16* __restrict__ k, const bf16* __restrict__ v, int q_stride, int k_stride,
                          int v_stride, const bf16* __restrict__ q_norm, const bf16* __restrict__ k_norm,
                          const bf16* __restrict__ cos_table, const bf16* __restrict__ sin_table,
                          const int64_t* __restrict__ positions, const int64_t* __restrict__ slots,
                          bf16* __restrict__ k_cache, bf16* __restrict__ v_cache, int q_heads, int kv_heads,
                          int max_len, int num_splits, float eps, float scale) {
  static_assert(G + 2 <= kThreads / 32, "one warp per query head, the key and the value");
  constexpr int P = D / 64;
  constexpr int H = D / 2;
  begin_dependent_kernel();
  __shared__ Tile<D, G> t;
  constexpr int kRow = Tile<D, G>::kRow;
  const int split = blockIdx.x;
  const int kvh = blockIdx.y;
  const int b = blockIdx.z;
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int first = (tid & 31) * P;
  const int pos = static_cast<int>(positions[b]);
  const int start = split * kTile;
  const int count = min(kTile, pos + 1 - start);
  float* part = ws + ((static_cast<int64_t>(b) * q_heads + kvh * G) * num_splits + split) * (D + 2);
  const int64_t part_head = static_cast<int64_t>(num_splits) * (D + 2);
  bf16* single = num_splits == 1 ? out + (static_cast<int64_t>(b) * q_heads + kvh * G) * D : nullptr;
  if (count <= 0) return;  // a split past the row's length (the grid is sized for max_len): nothing to merge
  const int fresh = pos - start;  // the new token's row in this split's tile, when < kTile
  const int64_t slot = slots[b];
  const int64_t cache_row = ((slot * kv_heads + kvh) * max_len + pos) * D;
  const bf16* cos = cos_table + static_cast<int64_t>(pos) * D;
  const bf16* sin = sin_table + static_cast<int64_t>(pos) * D;
  if (warp < G) {
    bf16 lo[P], hi[P];
    norm_rope_head<P>(q + static_cast<int64_t>(b) * q_stride + (kvh * G + warp) * D, q_norm, cos, sin, eps, lo, hi);
#pragma unroll
    for (int j = 0; j < P; ++j) {
      t.q[warp][first + j] = to_f(lo[j]) * scale;
      t.q[warp][first + H + j] = to_f(hi[j]) * scale;
    }
  } else if (warp == G && fresh < kTile) {
    bf16 lo[P], hi[P];
    norm_rope_head<P>(k + static_cast<int64_t>(b) * k_stride + kvh * D, k_norm, cos, sin, eps, lo, hi);
#pragma unroll
    for (int j = 0; j < P; ++j) {
      k_cache[cache_row + first + j] = t.k[fresh * kRow + first + j] = lo[j];
      k_cache[cache_row + first + H + j] = t.k[fresh * kRow + first + H + j] = hi[j];
    }
  } else if (warp == G + 1 && fresh < kTile) {
    const bf16* src = v + static_cast<int64_t>(b) * v_stride + kvh * D;
#pragma unroll
    for (int j = 0; j < P; ++j) {
      v_cache[cache_row + first + j] = t.v[fresh * D + first + j] = src[first + j];
      v_cache[cache_row + first + H + j] = t.v[fresh * D + first + H + j] = src[first + H + j];
    }
  }
  // The older keys and values of the split from the cache, zeros past the new one.
  const bf16* kb = k_cache + ((slot * kv_heads + kvh) * max_len + start) * D;
  const bf16* vb = v_cache + ((slot * kv_heads + kvh) * max_len + start) * D;
  stage_tile<D, G>(t, kb, vb, fresh, fresh);
  __syncthreads();
  attend_tile<D, G>(t, count, single, part, part_head);
}

// The splits a row of `lengths[b] + offset` keys has partials for: pass 1 writes nothing past them, so the
// work follows the real length, not max_len.
template <int D>
__global__ void attention_merge_kernel(bf16* __restrict__ out, const float* __restrict__ ws, int num_splits,
                                       const int64_t* __restrict__ lengths, int offset, int q_heads) {
  begin_dependent_kernel();
  const int row_head = blockIdx.x;  // b * q_heads + h
  const int len = static_cast<int>(lengths[row_head / q_heads]) + offset;
  const int live = min(num_splits, (len + kTile - 1) / kTile);
  const float* part = ws + static_cast<int64_t>(row_head) * num_splits * (D + 2);
  float m = -CUDART_INF_F;
  for (int s = 0; s < live; ++s) m = fmaxf(m, part[s * (D + 2) + D]);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float num = 0.0f, den = 0.0f;
    if (m != -CUDART_INF_F) {
      for (int s = 0; s < live; ++s) {
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

// Pass 2: one block per (row, query head) merges the splits' partials into out.
cudaError_t merge_splits(void* out, const float* workspace, int batch, int q_heads, int head_dim, int splits,
                         const int64_t* lengths, int offset, cudaStream_t stream) {
  const dim3 grid(batch * q_heads);
  if (head_dim == 128) {
    launch_kernel(attention_merge_kernel<128>, grid, dim3(128), stream, static_cast<bf16*>(out), workspace, splits,
                  lengths, offset, q_heads);
  } else {
    launch_kernel(attention_merge_kernel<64>, grid, dim3(64), stream, static_cast<bf16*>(out), workspace, splits,
                  lengths, offset, q_heads);
  }
  return cudaGetLastError();
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
  return merge_splits(out, workspace, batch, q_heads, head_dim, splits, lengths, 0, stream);
}

cudaError_t rope_attention(void* out, float* workspace, const void* q, const void* k, const void* v, int q_stride,
                           int k_stride, int v_stride, const void* q_norm, const void* k_norm, const void* cos,
                           const void* sin, const int64_t* positions, const int64_t* slots, void* k_cache,
                           void* v_cache, int batch, int q_heads, int kv_heads, int head_dim, int max_len,
                           float eps, float scale, cudaStream_t stream) {
  if (q_heads % kv_heads != 0) return cudaErrorInvalidValue;
  if (batch == 0) return cudaSuccess;
  const int groups = q_heads / kv_heads;
  const int splits = decode_attention_splits(max_len, kTile);
  if (splits > 1 && workspace == nullptr) return cudaErrorInvalidValue;
  const dim3 grid(splits, kv_heads, batch);
#define Q3TTS_ROPE(D, G)                                                                                     \
  launch_kernel(rope_attention_kernel<D, G>, grid, dim3(kThreads), stream, workspace, static_cast<bf16*>(out), \
                static_cast<const bf16*>(q), static_cast<const bf16*>(k), static_cast<const bf16*>(v), q_stride, \
                k_stride, v_stride, static_cast<const bf16*>(q_norm), static_cast<const bf16*>(k_norm),          \
                static_cast<const bf16*>(cos), static_cast<const bf16*>(sin), positions, slots,                  \
                static_cast<bf16*>(k_cache), static_cast<bf16*>(v_cache), q_heads, kv_heads, max_len, splits,   \
                eps, scale)
  if (head_dim == 128 && groups == 2) {
    Q3TTS_ROPE(128, 2);
  } else if (head_dim == 128 && groups == 1) {
    Q3TTS_ROPE(128, 1);
  } else if (head_dim == 64 && groups == 2) {
    Q3TTS_ROPE(64, 2);
  } else if (head_dim == 64 && groups == 1) {
    Q3TTS_ROPE(64, 1);
  } else {
    return cudaErrorInvalidValue;
  }
#undef Q3TTS_ROPE
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || splits == 1) return err;
  return merge_splits(out, workspace, batch, q_heads, head_dim, splits, positions, 1, stream);
}

}  // namespace q3tts

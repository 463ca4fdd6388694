// Flash-decoding for one query token per row over a static [slots, kv_heads, max_len, D] cache.
// Pass 1: one block per (64-key split, kv head, row), one warp per 16 keys of the split. A warp copies its
// keys and values into its own shared-memory tile (asynchronous 16-byte copies, all in flight at once, no
// block barrier); a lane owns the same slice of every head (rope.cuh's layout: P elements of each half),
// so the G query heads are dotted with the keys lane-wise and summed across the warp by one transposing
// reduction (31 shuffles for 32 scores). The warps then combine their softmax partials through shared
// memory (one barrier; none when a single warp holds the whole cache, as for the code predictor's 16
// positions). Pass 2 merges the splits (no pass 2 for a single split). For decode steps (distinct slots) pass 1 also does the q/k norm, RoPE and
// cache write of the new token (rope_attention_kernel).
// The cache is bf16 or e4m3 codes with a scale a row (kv_cache.cuh): the scales of a warp's 16 keys ride in
// registers, one key a lane, and multiply the key's score and probability (the codes' dot products and P.V
// sums are the same float32 sums as the bf16 cache's).
// Splits past a row's length exit at once, so the grid can be sized for max_len (graph capture) and the
// work still follows the real length; at many rows rope_attention's blocks take several splits each
// (rope_attention_blocks_per_head), so fewer blocks exit. decode_attention's grid covers only its `span` first positions when
// the caller knows a bound on the lengths (a prompt pass: its longest prompt), since at thousands of rows
// the blocks of dead splits cost more than the live ones.
#include <math_constants.h>

#include <type_traits>

#include "common.cuh"
#include "kv_cache.cuh"
#include "launch.cuh"
#include "launchers.h"
#include "rope.cuh"

namespace q3tts {
namespace {

constexpr int kTile = 64;      // keys per split
constexpr int kWarpKeys = 16;  // keys per warp
constexpr int kMaxWarps = kTile / kWarpKeys;

// Warps a block needs for a cache of max_len positions: one when the whole cache fits one warp's keys.
int block_warps(int max_len) { return max_len <= kWarpKeys ? 1 : kMaxWarps; }

// The head element that slice element e stands for, in this lane.
template <int P>
__device__ __forceinline__ int slice_element(int e) {
  const int first = (threadIdx.x & 31) * P;
  return e < P ? first + e : 32 * P + first + e - P;
}

// One halving exchange of transposed_warp_sum: lanes whose `kOffset` bit is set keep the upper half of the
// 2 * kHalf sums and send the lower half to their partner, which keeps the lower half.
template <int kHalf, int kOffset, int NV>
__device__ __forceinline__ void halve_sums(float (&v)[NV]) {
  const bool upper = (threadIdx.x & kOffset) != 0;
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const float send = upper ? v[i] : v[i + kHalf];
    const float keep = upper ? v[i + kHalf] : v[i];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, kOffset);
  }
}

// v[i] holds this lane's part of sum i (NV = 16 or 32 sums); returns the whole sum number lane / (32 / NV),
// reducing all of them in halving exchanges (NV - 1 shuffles) instead of NV warp sums.
template <int NV>
__device__ __forceinline__ float transposed_warp_sum(float (&v)[NV]) {
  static_assert(NV == 16 || NV == 32, "16 or 32 sums");
  if constexpr (NV == 32) halve_sums<16, 16>(v);
  halve_sums<8, NV == 32 ? 8 : 16>(v);
  halve_sums<4, NV == 32 ? 4 : 8>(v);
  halve_sums<2, NV == 32 ? 2 : 4>(v);
  halve_sums<1, NV == 32 ? 1 : 2>(v);
  float total = v[0];
  if constexpr (NV == 16) total += __shfl_xor_sync(0xffffffffu, total, 1);
  return total;
}

// One warp's share of a split: per query head the max score m, the sum l of exp(score - m) and the
// unnormalised P.V over the lane's slice.
template <int P, int G>
struct WarpPartial {
  float m[G];
  float l[G];
  float acc[G][2 * P];
};

// A warp's 16 keys and values in shared memory, the landing buffer of its asynchronous copies: the bytes a
// block has in flight are bounded by shared memory, not by registers (the talker at 64 streams and long
// contexts streams megabytes a layer and needs many blocks resident).
template <int P, typename T>
struct WarpKeys {
  __align__(16) T k[kWarpKeys][64 * P];
  __align__(16) T v[kWarpKeys][64 * P];
};

// An e4m3 cache's scales of key (lane % 16) of a warp's keys (1.0 for a bf16 cache, where they are not used).
struct KeyScales {
  float k = 1.0f;
  float v = 1.0f;
};

// Starts the copies of the warp's `keys` (<= 16; none when <= 0) keys and values from the cache rows at kb / vb
// into the warp's `tile`, all but key `fresh` (the new token, when in range), which attend_warp takes from
// registers. Issued after the new token's loads and before the RMSNorm + RoPE math on them, so that the
// cache's latency overlaps that math and does not delay those loads. For an e4m3 cache, also loads the scales
// of the rows (`scales` points at the first row's), one key a lane, into the returned registers; key `fresh`'s
// are stale until the caller sets them.
template <int P, typename T>
__device__ __forceinline__ KeyScales copy_warp_keys(const T* __restrict__ kb, const T* __restrict__ vb, int keys,
                                                    int fresh, WarpKeys<P, T>& tile, const CacheScales& scales,
                                                    int64_t first_row) {
  constexpr int D = 64 * P;
  constexpr int kPerVec = 16 / sizeof(T);  // elements in a 16-byte piece
  constexpr int kVecs = D / kPerVec;       // 16-byte pieces of a row
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = lane; i < kWarpKeys * kVecs; i += 32) {
    const int row = i / kVecs, col = i % kVecs;
    if (row < keys && row != fresh) {
      copy_async_16(&tile.k[row][col * kPerVec], kb + row * D + col * kPerVec);
      copy_async_16(&tile.v[row][col * kPerVec], vb + row * D + col * kPerVec);
    }
  }
  KeyScales s;
  if constexpr (kScaledCache<T>) {
    const int key = lane % kWarpKeys;
    if (key < keys) {
      s.k = scales.k[first_row + key];
      s.v = scales.v[first_row + key];
    }
  }
  return s;
}

// The warp's `keys` keys and values, those copy_warp_keys started plus key `fresh` from registers: scores
// against the G queries q (this lane's slices, already scaled), softmax statistics and P.V. `scales`: an e4m3
// cache's, as copy_warp_keys returned them (with the fresh key's).
template <int P, int G, typename T>
__device__ __forceinline__ WarpPartial<P, G> attend_warp(const float (&q)[G][2 * P], int keys, int fresh,
                                                        const CacheSlice<P, T>& fresh_k,
                                                        const CacheSlice<P, T>& fresh_v, const KeyScales& scales,
                                                        WarpKeys<P, T>& tile) {
  constexpr int NV = G * kWarpKeys;   // one score per (head, key)
  constexpr int kLanesPerScore = 32 / NV;
  constexpr int kSegment = 32 / G;    // lanes holding one head's scores
  const int lane = threadIdx.x & 31;
  if (fresh >= 0 && fresh < kWarpKeys) {
    store_slice<P>(tile.k[fresh], fresh_k);
    store_slice<P>(tile.v[fresh], fresh_v);
  }
  wait_async_copies();
  __syncwarp();
  float s[NV];
#pragma unroll
  for (int j = 0; j < kWarpKeys; ++j) {
    CacheSlice<P, T> k{};
    if (j < keys) k = load_cache_slice<P, T>(tile.k[j]);  // rows past `keys` were never copied
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float dot = 0.0f;
#pragma unroll
      for (int e = 0; e < 2 * P; ++e) dot = fmaf(q[g][e], k.at(e), dot);
      s[g * kWarpKeys + j] = dot;
    }
  }
  const int index = lane / kLanesPerScore;  // this lane's (head, key) = (index / 16, index % 16)
  float total = transposed_warp_sum<NV>(s);  // every lane takes part in the shuffles
  float value_scale = 1.0f;  // the key's value scale, folded into its probability for P.V
  if constexpr (kScaledCache<T>) {
    total *= __shfl_sync(0xffffffffu, scales.k, index % kWarpKeys);
    value_scale = __shfl_sync(0xffffffffu, scales.v, index % kWarpKeys);
  }
  const float score = (index % kWarpKeys) < keys ? total : -CUDART_INF_F;
  float m = score;
#pragma unroll
  for (int offset = kSegment / 2; offset > 0; offset >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
  const float p = score == -CUDART_INF_F ? 0.0f : expf(score - m);
  float l = lane % kLanesPerScore == 0 ? p : 0.0f;
  const float pv = kScaledCache<T> ? p * value_scale : p;
#pragma unroll
  for (int offset = kSegment / 2; offset > 0; offset >>= 1) l += __shfl_xor_sync(0xffffffffu, l, offset);

  WarpPartial<P, G> out;
#pragma unroll
  for (int g = 0; g < G; ++g) {
    out.m[g] = __shfl_sync(0xffffffffu, m, g * kSegment);
    out.l[g] = __shfl_sync(0xffffffffu, l, g * kSegment);
#pragma unroll
    for (int e = 0; e < 2 * P; ++e) out.acc[g][e] = 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kWarpKeys; ++j) {
    if (j >= keys) break;
    const CacheSlice<P, T> v = load_cache_slice<P, T>(tile.v[j]);
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float pj = __shfl_sync(0xffffffffu, pv, (g * kWarpKeys + j) * kLanesPerScore);
#pragma unroll
      for (int e = 0; e < 2 * P; ++e) out.acc[g][e] = fmaf(pj, v.at(e), out.acc[g][e]);
    }
  }
  return out;
}

// Where pass 1 of (row b, kv head kvh, split) writes: `single` (the output heads) when the cache is one
// split, else the split's partials `part`, `part_head` floats apart per query head.
struct SplitOutput {
  bf16* single;
  float* part;
  int64_t part_head;
};

template <int D, int G>
__device__ __forceinline__ SplitOutput split_output(float* ws, bf16* out, int q_heads, int num_splits, int split) {
  const int kvh = blockIdx.y, b = blockIdx.z;
  const int64_t first_head = static_cast<int64_t>(b) * q_heads + kvh * G;
  return {num_splits == 1 ? out + first_head * D : nullptr, ws + (first_head * num_splits + split) * (D + 2),
          static_cast<int64_t>(num_splits) * (D + 2)};
}

template <int P, int G, int W>
struct SplitScratch {
  float m[W][G];
  float l[W][G];
  float acc[W][G][64 * P];
};

// The split's result from its W warps' partials: with `single` (the whole cache is one split) the
// normalised heads go there; else the unnormalised P.V and its max / sum go to `part` for the merge kernel.
// With one warp there is nothing to combine and no barrier.
template <int P, int G, int W>
__device__ __forceinline__ void finish_split(const WarpPartial<P, G>& w, const SplitOutput& o) {
  constexpr int D = 64 * P;
  const int lane = threadIdx.x & 31;
  bf16* single = o.single;
  float* part = o.part;
  const int64_t part_head = o.part_head;
  if constexpr (W == 1) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
#pragma unroll
      for (int e = 0; e < 2 * P; ++e) {
        const int d = slice_element<P>(e);
        if (single != nullptr) {
          single[g * D + d] = to_bf(w.l[g] > 0.0f ? w.acc[g][e] / w.l[g] : 0.0f);
        } else {
          part[g * part_head + d] = w.acc[g][e];
        }
      }
      if (single == nullptr && lane == 0) {
        part[g * part_head + D] = w.m[g];
        part[g * part_head + D + 1] = w.l[g];
      }
    }
  } else {
    __shared__ SplitScratch<P, G, W> scratch;
    const int warp = threadIdx.x >> 5;
#pragma unroll
    for (int g = 0; g < G; ++g) {
#pragma unroll
      for (int e = 0; e < 2 * P; ++e) scratch.acc[warp][g][slice_element<P>(e)] = w.acc[g][e];
      if (lane == 0) {
        scratch.m[warp][g] = w.m[g];
        scratch.l[warp][g] = w.l[g];
      }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * D; i += W * 32) {
      const int g = i / D, d = i % D;
      float m = -CUDART_INF_F;
#pragma unroll
      for (int x = 0; x < W; ++x) m = fmaxf(m, scratch.m[x][g]);
      float num = 0.0f, den = 0.0f;
#pragma unroll
      for (int x = 0; x < W; ++x) {
        const float mx = scratch.m[x][g];
        const float f = mx == -CUDART_INF_F ? 0.0f : expf(mx - m);
        num = fmaf(scratch.acc[x][g][d], f, num);
        den = fmaf(scratch.l[x][g], f, den);
      }
      if (single != nullptr) {
        single[g * D + d] = to_bf(den > 0.0f ? num / den : 0.0f);
      } else {
        part[g * part_head + d] = num;
        if (d == 0) {
          part[g * part_head + D] = m;
          part[g * part_head + D + 1] = den;
        }
      }
    }
  }
}

template <int D, int G, int W, typename T>
__global__ void __launch_bounds__(W * 32)
    attention_split_kernel(float* __restrict__ ws, bf16* __restrict__ out, const bf16* __restrict__ q,
                           const T* __restrict__ k_cache, const T* __restrict__ v_cache, CacheScales scales,
                           const int64_t* __restrict__ slots, const int64_t* __restrict__ lengths, int q_heads,
                           int kv_heads, int max_len, int num_splits, float scale) {
  constexpr int P = D / 64;
  const int split = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x >> 5;
  // Before the wait (launch.cuh): the row's length and slot, so that the cache copies follow it at once.
  const int len = static_cast<int>(load_before_wait(lengths + b));
  const int64_t slot = load_before_wait(slots + b);
  begin_dependent_kernel();
  const int start = split * kTile;
  const int count = min(kTile, len - start);
  const SplitOutput o = split_output<D, G>(ws, out, q_heads, num_splits, split);
  if (count <= 0) {  // a split past the row's length: the merge reads only the live ones
    if (o.single != nullptr) {
      for (int i = threadIdx.x; i < G * D; i += W * 32) o.single[i] = to_bf(0.0f);
    }
    return;
  }
  const int64_t row0 = (slot * kv_heads + kvh) * max_len + start + warp * kWarpKeys;
  const int64_t key0 = row0 * D;
  __shared__ WarpKeys<P, T> tiles[W];
  HeadSlice<P> q_heads_raw[G];  // loaded before the copies are issued, as in rope_attention_kernel
#pragma unroll
  for (int g = 0; g < G; ++g) {
    q_heads_raw[g] = load_slice<P>(q + (static_cast<int64_t>(b) * q_heads + kvh * G + g) * D);
  }
  const KeyScales key_scales =
      copy_warp_keys<P, T>(k_cache + key0, v_cache + key0, count - warp * kWarpKeys, -1, tiles[warp], scales, row0);
  float qs[G][2 * P];
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int e = 0; e < 2 * P; ++e) qs[g][e] = q_heads_raw[g].at(e) * scale;
  }
  const CacheSlice<P, T> none{};
  const WarpPartial<P, G> w =
      attend_warp<P, G, T>(qs, count - warp * kWarpKeys, -1, none, none, key_scales, tiles[warp]);
  finish_split<P, G, W>(w, o);
}

// The whole decode step of one query token per row, for rows whose slots are distinct: q/k RMSNorm + RoPE
// of the new token (rope.cuh, as qk_norm_rope_cache computes them), its K/V written to the cache, and pass 1
// of the attention, in blocks per (KV head, row) that take the row's 64-key splits in turn: block x of
// gridDim.x takes splits x, x + gridDim.x, ... up to the row's length. Every warp ropes the G queries once;
// the warp whose keys include the new position ropes its key, writes it and its value to the cache and
// attends them from registers; the older keys and values come from the cache (another row's block never
// writes them: distinct slots). Each split's partial is computed and written as with a block of its own, so
// the values are those of qk_norm_rope_cache then decode_attention, bit for bit, one dependent kernel fewer.
template <int D, int G, int W, typename T>
__global__ void __launch_bounds__(W * 32)
    rope_attention_kernel(float* __restrict__ ws, bf16* __restrict__ out, const bf16* __restrict__ q,
                          const bf16* __restrict__ k, const bf16* __restrict__ v, int q_stride, int k_stride,
                          int v_stride, const bf16* __restrict__ q_norm, const bf16* __restrict__ k_norm,
                          const bf16* __restrict__ cos_table, const bf16* __restrict__ sin_table,
                          const int64_t* __restrict__ positions, const int64_t* __restrict__ slots,
                          T* __restrict__ k_cache, T* __restrict__ v_cache, CacheScales scales, int q_heads,
                          int kv_heads, int max_len, int num_splits, float eps, float scale) {
  constexpr int P = D / 64;
  const int kvh = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x >> 5;
  // Before waiting for the previous kernel (launch.cuh): the row's position and slot, the RoPE table rows and
  // the norm weights, so that only the loads of the new token and of the cache follow the wait.
  const int pos = static_cast<int>(load_before_wait(positions + b));
  if (static_cast<int>(blockIdx.x) * kTile > pos) return;  // no split of this block is in the row's length
  const int64_t slot = load_before_wait(slots + b);
  const HeadSlice<P> cos = load_slice<P, kBeforeWait>(cos_table + static_cast<int64_t>(pos) * D);
  const HeadSlice<P> sin = load_slice<P, kBeforeWait>(sin_table + static_cast<int64_t>(pos) * D);
  const HeadSlice<P> q_weight = load_slice<P, kBeforeWait>(q_norm);
  const HeadSlice<P> k_weight = load_slice<P, kBeforeWait>(k_norm);
  const int64_t warp_row0 = (slot * kv_heads + kvh) * max_len + warp * kWarpKeys;
  // The new token's key and value belong to one warp of the block whose splits include the one holding pos.
  const bool holds_fresh = (pos / kTile) % static_cast<int>(gridDim.x) == static_cast<int>(blockIdx.x) &&
                           (pos % kTile) / kWarpKeys == warp;
  __shared__ WarpKeys<P, T> tiles[W];
  begin_dependent_kernel();
  // The new token's loads go out first, then the first split's cache copies, and the RMSNorm + RoPE math runs
  // while both are in flight: copies issued before these loads delayed them (4- to 16-row frames 0.5-1.3%
  // longer), issued after the math they waited for it (64-row frames 2.1-2.3% longer; runs 131-134).
  HeadSlice<P> q_heads_raw[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    q_heads_raw[g] = load_slice<P>(q + static_cast<int64_t>(b) * q_stride + (kvh * G + g) * D);
  }
  HeadSlice<P> fresh_k{}, fresh_v{};
  if (holds_fresh) {
    fresh_k = load_slice<P>(k + static_cast<int64_t>(b) * k_stride + kvh * D);
    fresh_v = load_slice<P>(v + static_cast<int64_t>(b) * v_stride + kvh * D);
  }
  const auto copy_split = [&](int split) {
    const int start = split * kTile;
    const int64_t row0 = warp_row0 + start;
    return copy_warp_keys<P, T>(k_cache + row0 * D, v_cache + row0 * D, min(kTile, pos + 1 - start) - warp * kWarpKeys,
                                pos - start - warp * kWarpKeys, tiles[warp], scales, row0);
  };
  int split = blockIdx.x;
  KeyScales key_scales = copy_split(split);
  float qs[G][2 * P];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    HeadSlice<P> h;
    norm_rope_slice<P>(q_heads_raw[g], q_weight, cos, sin, eps, h.lo, h.hi);
#pragma unroll
    for (int e = 0; e < 2 * P; ++e) qs[g][e] = h.at(e) * scale;
  }
  CacheSlice<P, T> stored_k{}, stored_v{};  // the new token's K/V as the cache holds them
  KeyScales fresh_scales;
  if (holds_fresh) {
    norm_rope_slice<P>(fresh_k, k_weight, cos, sin, eps, fresh_k.lo, fresh_k.hi);
    const int64_t cache_row = ((slot * kv_heads + kvh) * max_len + pos) * D;
    fresh_scales.k = write_cache_row<P, T>(k_cache, scales.k, cache_row, fresh_k, stored_k);
    fresh_scales.v = write_cache_row<P, T>(v_cache, scales.v, cache_row, fresh_v, stored_v);
  }
  for (;;) {
    const int start = split * kTile;
    const int count = min(kTile, pos + 1 - start);
    const SplitOutput o = split_output<D, G>(ws, out, q_heads, num_splits, split);
    const int fresh = pos - start - warp * kWarpKeys;  // the new token's key in this warp's keys, when in [0, 16)
    if (kScaledCache<T> && (threadIdx.x & 31) % kWarpKeys == fresh) key_scales = fresh_scales;
    const WarpPartial<P, G> w = attend_warp<P, G, T>(qs, count - warp * kWarpKeys, fresh, stored_k, stored_v,
                                                     key_scales, tiles[warp]);
    finish_split<P, G, W>(w, o);
    split += gridDim.x;
    if (split * kTile > pos) break;
    __syncthreads();  // the last split's tiles and scratch are read
    key_scales = copy_split(split);
  }
}

// Splits whose partials a merge thread loads at once.
constexpr int kMergeBatch = 8;

// The partials of splits [first, first + kMergeBatch) at one head element: every load is issued before any
// is used (a loop over the splits waited for each split's max, then branched on it before its next loads:
// two L2 round trips a split). Splits at or past `live` read as empty (max -inf), which the merge skips.
template <int D>
struct MergeBatch {
  float m[kMergeBatch];
  float l[kMergeBatch];
  float acc[kMergeBatch];

  __device__ __forceinline__ void load(const float* __restrict__ part, int first, int live, int d) {
#pragma unroll
    for (int i = 0; i < kMergeBatch; ++i) {
      const bool present = first + i < live;
      const float* split = part + static_cast<int64_t>(first + i) * (D + 2);
      m[i] = present ? split[D] : -CUDART_INF_F;
      l[i] = present ? split[D + 1] : 0.0f;
      acc[i] = present ? split[d] : 0.0f;
    }
  }
};

// The splits a row of `lengths[b] + offset` keys has partials for: pass 1 writes nothing past them, so the
// work follows the real length, not max_len. One thread a head element (blockDim.x == D). The splits are
// combined in order, as a plain loop over them would: the same bits.
template <int D>
__global__ void __launch_bounds__(D) attention_merge_kernel(bf16* __restrict__ out, const float* __restrict__ ws,
                                                            int num_splits, const int64_t* __restrict__ lengths,
                                                            int offset, int q_heads) {
  const int row_head = blockIdx.x;  // b * q_heads + h
  const int len = static_cast<int>(load_before_wait(lengths + row_head / q_heads)) + offset;  // launch.cuh
  const int live = min(num_splits, (len + kTile - 1) / kTile);
  const int d = threadIdx.x;
  begin_dependent_kernel();
  const float* part = ws + static_cast<int64_t>(row_head) * num_splits * (D + 2);
  MergeBatch<D> batch;
  batch.load(part, 0, live, d);
  float m = -CUDART_INF_F;
#pragma unroll
  for (int i = 0; i < kMergeBatch; ++i) m = fmaxf(m, batch.m[i]);
  for (int first = kMergeBatch; first < live; first += kMergeBatch) {  // contexts past kMergeBatch splits
#pragma unroll
    for (int i = 0; i < kMergeBatch; ++i) {
      if (first + i < live) m = fmaxf(m, part[static_cast<int64_t>(first + i) * (D + 2) + D]);
    }
  }
  float num = 0.0f, den = 0.0f;
  if (m != -CUDART_INF_F) {
    for (int first = 0;;) {
#pragma unroll
      for (int i = 0; i < kMergeBatch; ++i) {
        if (batch.m[i] == -CUDART_INF_F) continue;
        const float f = expf(batch.m[i] - m);
        num = fmaf(batch.acc[i], f, num);
        den = fmaf(batch.l[i], f, den);
      }
      first += kMergeBatch;
      if (first >= live) break;
      batch.load(part, first, live, d);
    }
  }
  out[static_cast<int64_t>(row_head) * D + d] = to_bf(den > 0.0f ? num / den : 0.0f);
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

// Blocks a (KV head, row) of rope_attention: every split its own block while the grid stays within
// kRopeAttentionBlocks, else that many blocks in all, each taking several splits. The grid is sized for the
// whole cache (a graph replays it as the rows' lengths grow) and a block past a row's length exits at once,
// but those exits are most of the grid at 64 rows of short contexts (a 4096-position cache, ~170 positions
// live: 32,768 blocks, 1,536 of them live). H200, chained calls at 64 rows of a 4096-position cache, position
// 100: 26.7 -> 14.9 us (run 129); in the 64-stream frame, where a GEMM with few blocks precedes it, those
// exits cost little: 64-row frames 0.4-0.5% shorter than with a block a split (run 130).
constexpr int kRopeAttentionBlocks = 2048;

int rope_attention_blocks_per_head(int splits, int kv_heads, int batch) {
  const int share = (kRopeAttentionBlocks + kv_heads * batch - 1) / (kv_heads * batch);
  return max(1, min(splits, share));
}

int decode_attention_splits(int max_len, int split_len) {
  (void)split_len;
  return (max_len + kTile - 1) / kTile;
}

// Calls launch(D, G, W, T) as compile-time values for the supported head dims (64, 128), GQA groups (1, 2),
// warps per block (1 or 4, block_warps) and cache elements (bf16, or e4m3 codes when `scaled`); false for
// anything else.
template <typename Launch>
bool dispatch_attention(int head_dim, int groups, int warps, bool scaled, Launch&& launch) {
#define Q3TTS_CASE(D, G, W)                                                                     \
  if (head_dim == D && groups == G && warps == W) {                                             \
    if (scaled) {                                                                               \
      launch(std::integral_constant<int, D>{}, std::integral_constant<int, G>{}, std::integral_constant<int, W>{}, fp8{}); \
    } else {                                                                                    \
      launch(std::integral_constant<int, D>{}, std::integral_constant<int, G>{}, std::integral_constant<int, W>{}, bf16{}); \
    }                                                                                           \
    return true;                                                                                \
  }
  Q3TTS_CASE(128, 2, 1) Q3TTS_CASE(128, 2, 4) Q3TTS_CASE(128, 1, 1) Q3TTS_CASE(128, 1, 4)
  Q3TTS_CASE(64, 2, 1) Q3TTS_CASE(64, 2, 4) Q3TTS_CASE(64, 1, 1) Q3TTS_CASE(64, 1, 4)
#undef Q3TTS_CASE
  return false;
}

cudaError_t decode_attention(void* out, const void* q, const void* k_cache, const void* v_cache,
                             const float* k_scale, const float* v_scale, const int64_t* slots,
                             const int64_t* lengths, float* workspace, int batch, int q_heads, int kv_heads,
                             int head_dim, int max_len, int span, int split_len, float scale, cudaStream_t stream) {
  if (split_len != kTile || q_heads % kv_heads != 0 || span < 1 || span > max_len) return cudaErrorInvalidValue;
  if (batch == 0) return cudaSuccess;
  const int splits = decode_attention_splits(span, split_len);
  const int warps = block_warps(max_len);
  const dim3 grid(splits, kv_heads, batch);
  const CacheScales scales{const_cast<float*>(k_scale), const_cast<float*>(v_scale)};
  const bool scaled = k_scale != nullptr;
  const bool supported = dispatch_attention(head_dim, q_heads / kv_heads, warps, scaled, [&](auto d, auto g, auto w, auto t) {
    using T = decltype(t);
    launch_kernel(attention_split_kernel<d, g, w, T>, grid, dim3(w * 32), stream, workspace, static_cast<bf16*>(out),
                  static_cast<const bf16*>(q), static_cast<const T*>(k_cache), static_cast<const T*>(v_cache), scales,
                  slots, lengths, q_heads, kv_heads, max_len, splits, scale);
  });
  if (!supported) return cudaErrorInvalidValue;
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || splits == 1) return err;
  return merge_splits(out, workspace, batch, q_heads, head_dim, splits, lengths, 0, stream);
}

cudaError_t rope_attention(void* out, float* workspace, const void* q, const void* k, const void* v, int q_stride,
                           int k_stride, int v_stride, const void* q_norm, const void* k_norm, const void* cos,
                           const void* sin, const int64_t* positions, const int64_t* slots, void* k_cache,
                           void* v_cache, float* k_scale, float* v_scale, int batch, int q_heads, int kv_heads,
                           int head_dim, int max_len, float eps, float scale, cudaStream_t stream) {
  if (q_heads % kv_heads != 0) return cudaErrorInvalidValue;
  if (batch == 0) return cudaSuccess;
  const int splits = decode_attention_splits(max_len, kTile);
  if (splits > 1 && workspace == nullptr) return cudaErrorInvalidValue;
  const int warps = block_warps(max_len);
  const dim3 grid(rope_attention_blocks_per_head(splits, kv_heads, batch), kv_heads, batch);
  const CacheScales scales{k_scale, v_scale};
  const bool scaled = k_scale != nullptr;
  const bool supported = dispatch_attention(head_dim, q_heads / kv_heads, warps, scaled, [&](auto d, auto g, auto w, auto t) {
    using T = decltype(t);
    launch_kernel(rope_attention_kernel<d, g, w, T>, grid, dim3(w * 32), stream, workspace, static_cast<bf16*>(out),
                  static_cast<const bf16*>(q), static_cast<const bf16*>(k), static_cast<const bf16*>(v), q_stride,
                  k_stride, v_stride, static_cast<const bf16*>(q_norm), static_cast<const bf16*>(k_norm),
                  static_cast<const bf16*>(cos), static_cast<const bf16*>(sin), positions, slots,
                  static_cast<T*>(k_cache), static_cast<T*>(v_cache), scales, q_heads, kv_heads, max_len, splits, eps,
                  scale);
  });
  if (!supported) return cudaErrorInvalidValue;
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || splits == 1) return err;
  return merge_splits(out, workspace, batch, q_heads, head_dim, splits, positions, 1, stream);
}

}  // namespace q3tts

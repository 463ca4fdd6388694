// The whole sampling step of a row in one block: penalty, bans, greedy, temperature, top-k (ties kept),
// top-p (stable ascending order, HF rule), inverse-CDF draw. See launchers.h for the exact definition.
#include <climits>
#include <math_constants.h>

#include "common.cuh"
#include "launch.cuh"
#include "launchers.h"

namespace q3tts {
namespace {

constexpr int kMaxThreads = 1024;
constexpr int kPerThread = 4;
constexpr int kMaxVocab = kMaxThreads * kPerThread;

// Threads a row's block needs: 4 ids a thread over the vocabulary padded to a power of two (the top-p sort's
// size). The code predictor's 2048 codes take half the threads of the talker's 3072, so the block's barriers
// and reductions wait on 16 warps instead of 32; the ids a thread owns, and so every result, are the same.
int block_threads(int vocab) { return vocab <= 2048 ? 512 : kMaxThreads; }

// Monotone map of a float onto uint32 (-inf lowest, +inf highest; NaN is not expected here).
__device__ __forceinline__ uint32_t ordered(float f) {
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float unordered(uint32_t o) {
  return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}

// Exclusive block scan of doubles in thread order; `total` gets the block sum.
// Warps of fewer than 32 leave their entries of warp_sums unwritten: they count as 0.
__device__ double block_exclusive_scan(double v, double* warp_sums, double& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  double inclusive = v;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const double n = __shfl_up_sync(0xffffffffu, inclusive, off);
    if (lane >= off) inclusive += n;
  }
  __syncthreads();
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    double s = lane < warps ? warp_sums[lane] : 0.0;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const double n = __shfl_up_sync(0xffffffffu, s, off);
      if (lane >= off) s += n;
    }
    warp_sums[lane] = s;  // inclusive over warps
  }
  __syncthreads();
  total = warp_sums[31];
  const double warp_prefix = warp == 0 ? 0.0 : warp_sums[warp - 1];
  return warp_prefix + inclusive - v;
}

__device__ int block_min_int(int v, int* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, off));
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x >> 5) ? scratch[lane] : INT_MAX;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// (the block's minimum of `low`, its maximum of `high`) in one exchange: both reductions share their barriers.
// `scratch` holds 64 ints.
__device__ int2 block_min_max_int(int low, int high, int* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    low = min(low, __shfl_xor_sync(0xffffffffu, low, off));
    high = max(high, __shfl_xor_sync(0xffffffffu, high, off));
  }
  __syncthreads();
  if (lane == 0) {
    scratch[warp] = low;
    scratch[32 + warp] = high;
  }
  __syncthreads();
  const bool live = lane < static_cast<int>(blockDim.x >> 5);
  low = live ? scratch[lane] : INT_MAX;
  high = live ? scratch[32 + lane] : INT_MIN;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    low = min(low, __shfl_xor_sync(0xffffffffu, low, off));
    high = max(high, __shfl_xor_sync(0xffffffffu, high, off));
  }
  return make_int2(low, high);
}

// The k-th largest of the block's scores (k >= 1, counting repeats), in radix passes of 8 bits over the
// ordered keys: the value keys[size - k] of the sorted path, without sorting. Every thread returns it. With
// kBf16Scores the scores are bfloat16 values (the low 16 bits of each float are zero), so the ordered keys'
// low 16 bits follow from the sign and two passes find the value instead of four. Each pass has its own
// histogram and result slot (`hist` [4][256], `selected` [4][2]), all cleared before the first pass: two
// barriers a pass, not four.
template <bool kBf16Scores>
__device__ float block_kth_largest(const float (&s)[kPerThread], int vocab, int k, unsigned int (*hist)[256],
                                   int (*selected)[2]) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  constexpr int kPasses = kBf16Scores ? 2 : 4;
  for (int b = tid; b < kPasses * 256; b += blockDim.x) hist[b / 256][b % 256] = 0u;
  __syncthreads();
  uint32_t prefix = 0u, mask = 0u;
  int remaining = k;
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int shift = 24 - 8 * pass;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int i = tid * kPerThread + j;
      const uint32_t u = ordered(s[j]);
      if (i < vocab && (u & mask) == prefix) atomicAdd(&hist[pass][(u >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (warp == 0) {
      // Lane l holds the digits 255 - 8l down to 248 - 8l; counts accumulate from the largest digit.
      int count[8];
      int sum = 0;
#pragma unroll
      for (int t = 0; t < 8; ++t) {
        count[t] = static_cast<int>(hist[pass][255 - 8 * lane - t]);
        sum += count[t];
      }
      int inclusive = sum;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const int n = __shfl_up_sync(0xffffffffu, inclusive, off);
        if (lane >= off) inclusive += n;
      }
      const int exclusive = inclusive - sum;
      if (exclusive < remaining && remaining <= inclusive) {
        int run = exclusive;
#pragma unroll
        for (int t = 0; t < 8; ++t) {
          if (run < remaining && remaining <= run + count[t]) {
            selected[pass][0] = 255 - 8 * lane - t;
            selected[pass][1] = remaining - run;
          }
          run += count[t];
        }
      }
    }
    __syncthreads();
    prefix |= static_cast<uint32_t>(selected[pass][0]) << shift;
    mask |= 255u << shift;
    remaining = selected[pass][1];
  }
  // A non-negative bf16 value's ordered key ends in zeros, a negative one's in ones (ordered() flips it).
  if (kBf16Scores) prefix |= (prefix & 0x80000000u) ? 0u : 0xffffu;
  return unordered(prefix);
}

template <int kThreads>
__global__ void __launch_bounds__(kThreads) sample_kernel(SamplingArgs a) {
  begin_dependent_kernel();
  __shared__ unsigned long long keys[kThreads * kPerThread];
  __shared__ uint8_t dropped[kThreads * kPerThread];
  __shared__ double dscratch[32];
  __shared__ float fscratch[32];
  __shared__ int iscratch[64];
  __shared__ unsigned int hist[4][256];
  __shared__ int selected[4][2];

  const int row = blockIdx.x;
  const int tid = threadIdx.x;
  const int vocab = a.vocab;
  const int64_t logits_row = static_cast<int64_t>(row) * a.logits_stride;
  const float* logits = static_cast<const float*>(a.logits) + logits_row;
  const bf16* logits_bf16 = static_cast<const bf16*>(a.logits) + logits_row;
  const uint8_t* seen = a.seen != nullptr ? a.seen + static_cast<int64_t>(row) * a.seen_stride : nullptr;
  const float penalty = a.penalty != nullptr ? a.penalty[row] : 1.0f;
  const int ban_extra =
      (a.ban_count != nullptr && a.ban_count[row] < a.ban_below) ? a.ban_token : -1;
  const bool greedy = a.greedy[row];
  // Every other per-row input is loaded here too, with the scores, rather than where it is used: after the
  // block reductions (the draw's parameters and uniform) or after the store of `chosen` (the record's slot
  // and the frame's other codes, which the compiler must assume that store may alias), each was one more L2
  // round trip in the kernel's dependent chain.
  const float temperature = a.temperature[row];
  const int64_t top_k = a.top_k[row];
  const double top_p = a.top_p[row];
  const double uniform = a.uniforms[static_cast<int64_t>(row) * a.uniforms_stride];
  const bool records = a.record_slots != nullptr;
  const int64_t slot = records ? a.record_slots[row] : 0;
  const bool copies_code = records && a.codes_table != nullptr && tid < a.codes_width;
  const int64_t frame_code =
      copies_code && tid != a.codes_column ? a.frame_codes[static_cast<int64_t>(row) * a.codes_width + tid] : 0;

  // 1. scores: fp32 logits, repetition penalty, bans. Thread t owns ids [4t, 4t + 4). Every id's loads are
  // issued before any is used: with the penalty's and the suppression's branches between them, each id's
  // loads waited for the previous id's values (about two L2 round trips an id in the SASS).
  float logit[kPerThread];
  bool seen_id[kPerThread], suppressed[kPerThread];
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int i = min(tid * kPerThread + j, vocab - 1);  // ids past vocab load the last id's; masked below
    logit[j] = a.logits_bf16 ? to_f(logits_bf16[i]) : logits[i];
    seen_id[j] = seen != nullptr && seen[i] != 0;
    suppressed[j] = a.suppress != nullptr && a.suppress[i] != 0;
  }
  float s[kPerThread];
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int i = tid * kPerThread + j;
    float x = -CUDART_INF_F;
    if (i < vocab) {
      x = logit[j];
      if (seen_id[j]) x = x < 0.0f ? x * penalty : x / penalty;
      if (suppressed[j] || i == ban_extra) x = -CUDART_INF_F;
    }
    s[j] = x;
  }

  int64_t chosen;
  if (greedy) {
    // 2a. argmax, lowest index on ties.
    float best = -CUDART_INF_F;
    int best_i = vocab;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int i = tid * kPerThread + j;
      if (i < vocab && (s[j] > best || best_i == vocab)) {
        best = s[j];
        best_i = i;
      }
    }
    const float m = block_max(best, fscratch);
    chosen = block_min_int(best == m ? best_i : vocab, iscratch);
  } else {
    const bool cut_k = top_k > 0 && top_k < vocab;
    const bool cut_p = top_p < 1.0;
    float max_score;
    float kth = -CUDART_INF_F;
    int size = 1;
    while (size < vocab) size <<= 1;
    // Top-k alone needs only the k-th largest score and the maximum, not the order. Scores that are still the
    // bf16 logits (no penalty) take the two-pass selection, before the temperature: x / t is monotone in x,
    // so the k-th largest of the scaled scores is the scaled k-th largest, the same float.
    const bool kth_of_logits = cut_k && !cut_p && a.logits_bf16 && seen == nullptr;
    if (kth_of_logits) kth = block_kth_largest<true>(s, vocab, static_cast<int>(top_k), hist, selected) / temperature;
    // 2b. temperature (true division, as the reference's tensor division).
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) s[j] = s[j] / temperature;
    if (cut_k && !cut_p) {
      float m = -CUDART_INF_F;
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) m = fmaxf(m, s[j]);
      max_score = block_max(m, fscratch);
      if (!kth_of_logits) kth = block_kth_largest<false>(s, vocab, static_cast<int>(top_k), hist, selected);
    } else if (cut_p) {
      // Stable ascending order: key = (ordered value, id); padding keys (0) sort first.
      const int pad = size - vocab;
      for (int p = tid; p < size; p += kThreads) keys[p] = 0ull;
      __syncthreads();
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) {
        const int i = tid * kPerThread + j;
        if (i < vocab) keys[i + pad] = (static_cast<unsigned long long>(ordered(s[j])) << 32) | static_cast<uint32_t>(i);
      }
      // Padding occupies [0, pad) with key 0 and real keys are all > 0, so sorting keeps them in front.
      __syncthreads();
      for (int len = 2; len <= size; len <<= 1) {
        for (int stride = len >> 1; stride > 0; stride >>= 1) {
          for (int p = tid; p < size; p += kThreads) {
            const int q = p ^ stride;
            if (q > p) {
              const unsigned long long x = keys[p], y = keys[q];
              const bool up = (p & len) == 0;
              if ((x > y) == up) {
                keys[p] = y;
                keys[q] = x;
              }
            }
          }
          __syncthreads();
        }
      }
      max_score = unordered(static_cast<uint32_t>(keys[size - 1] >> 32));
      if (cut_k) kth = unordered(static_cast<uint32_t>(keys[size - static_cast<int>(top_k)] >> 32));
    } else {
      float m = -CUDART_INF_F;
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) m = fmaxf(m, s[j]);
      max_score = block_max(m, fscratch);
    }

    if (cut_p) {
      for (int p = tid; p < vocab; p += kThreads) dropped[p] = 0;
      __syncthreads();
      // 3. top-p over sorted positions: cumulative mass (float64 running sum, rounded to fp32) <= 1 - p
      // is dropped, the largest is always kept. Top-k's dropped values form a prefix with zero mass.
      const float threshold = static_cast<float>(1.0 - top_p);
      double w[kPerThread];
      double local = 0.0;
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) {
        const int p = tid * kPerThread + j;
        float v = -CUDART_INF_F;
        if (p < size) v = keys[p] == 0ull ? -CUDART_INF_F : unordered(static_cast<uint32_t>(keys[p] >> 32));
        const bool kept = v != -CUDART_INF_F && !(cut_k && v < kth);
        w[j] = kept ? static_cast<double>(expf(v - max_score)) : 0.0;
        local += w[j];
      }
      double total;
      double run = block_exclusive_scan(local, dscratch, total);
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) {
        const int p = tid * kPerThread + j;
        run += w[j];
        if (p < size && p != size - 1 && keys[p] != 0ull) {
          const float cumulative = static_cast<float>(run / total);
          if (cumulative <= threshold) dropped[static_cast<uint32_t>(keys[p])] = 1;
        }
      }
      __syncthreads();
    }

    // 4. inverse CDF in id order over w_i = exp(s_i - max) of the kept ids.
    double w[kPerThread];
    double local = 0.0;
    int last_nonzero = -1;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int i = tid * kPerThread + j;
      const bool kept = i < vocab && !(cut_k && s[j] < kth) && !(cut_p && dropped[min(i, vocab - 1)]);
      w[j] = kept ? static_cast<double>(expf(s[j] - max_score)) : 0.0;
      if (w[j] > 0.0) last_nonzero = i;
      local += w[j];
    }
    double total;
    double run = block_exclusive_scan(local, dscratch, total);
    const double threshold = uniform * total;
    int first = vocab;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      run += w[j];
      if (first == vocab && w[j] > 0.0 && run > threshold) first = tid * kPerThread + j;
    }
    const int2 first_last = block_min_max_int(first, last_nonzero, iscratch);
    chosen = min(first_last.x, first_last.y);
  }
  if (tid == 0) a.out[static_cast<int64_t>(row) * a.out_stride] = chosen;
  // `chosen` is the same in every thread; the padded rows of a graph share the scratch slot, whose records
  // never matter.
  if (records && a.history_table != nullptr && tid == 0 && chosen >= 0 && chosen < vocab) {
    a.history_table[slot * a.history_stride + chosen] = 1;
  }
  if (copies_code) a.codes_table[slot * a.codes_width + tid] = tid == a.codes_column ? chosen : frame_code;
  if (a.embed_table != nullptr) {
    // `chosen` is the same in every thread (block reductions), so the block copies one table row.
    const int vecs = a.embed_width / 8;
    Bf16x8* dst = static_cast<Bf16x8*>(a.embed_out) + static_cast<int64_t>(row) * (a.embed_stride / 8);
    const bool inside = chosen >= 0 && chosen < vocab;
    const Bf16x8* src = static_cast<const Bf16x8*>(a.embed_table) + (inside ? chosen : 0) * vecs;
    for (int c = tid; c < vecs; c += kThreads) {
      Bf16x8 v{};
      if (inside) {
        v = src[c];
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) v.v[j] = to_bf(0.0f);
      }
      dst[c] = v;
    }
  }
}

}  // namespace

cudaError_t sample(const SamplingArgs& args, cudaStream_t stream) {
  if (args.vocab > kMaxVocab || args.vocab < 1) return cudaErrorInvalidValue;
  if (args.rows == 0) return cudaSuccess;
  if (block_threads(args.vocab) == 512) {
    launch_kernel(sample_kernel<512>, dim3(args.rows), dim3(512), stream, args);
  } else {
    launch_kernel(sample_kernel<kMaxThreads>, dim3(args.rows), dim3(kMaxThreads), stream, args);
  }
  return cudaGetLastError();
}

}  // namespace q3tts

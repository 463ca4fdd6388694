// The talker's KV cache as the attention kernels read and write it: bf16 elements (exact mode), or e4m3 codes
// with a float32 scale per (slot, KV head, position) row (fast mode: half the bytes the decode attention
// streams). A row is quantized as `reference.quantize_rows_fp8` quantizes one (fp8.cuh), by the warp that holds
// it in rope.cuh's slice layout, so every kernel writes the codes and scale the reference does, bit for bit.
#pragma once

#include <cuda_fp16.h>

#include <type_traits>

#include "fp8.cuh"
#include "rope.cuh"

namespace q3tts {

using fp8 = __nv_fp8_storage_t;

// Whether a cache of element type T carries a scale a row.
template <typename T>
constexpr bool kScaledCache = std::is_same_v<T, fp8>;

// The scales of a cache's rows (null for a bf16 cache): [slots, kv_heads, max_len] each.
struct CacheScales {
  float* k;
  float* v;
};

__device__ __forceinline__ float cache_to_f(fp8 x) { return __half2float(__half(__nv_cvt_fp8_to_halfraw(x, __NV_E4M3))); }

// A lane's slice of one row of an e4m3 cache: rope.cuh's HeadSlice layout, codes; at(e) is slice element e
// as a float, unscaled.
template <int P>
struct CodeSlice {
  fp8 lo[P];
  fp8 hi[P];
  __device__ __forceinline__ float at(int e) const { return cache_to_f(e < P ? lo[e] : hi[e - P]); }
};

// A lane's slice of one cached row in the cache's element type: HeadSlice itself for a bf16 cache.
template <int P, typename T>
using CacheSlice = std::conditional_t<kScaledCache<T>, CodeSlice<P>, HeadSlice<P>>;

// The slice as the cache stores it: bf16 as it is; e4m3 codes of the row's scale, which the warp that holds the
// whole row computes (every lane takes part) and returns; 1.0 for bf16.
template <int P, typename T>
__device__ __forceinline__ float to_cache_slice(const HeadSlice<P>& s, CacheSlice<P, T>& out) {
  if constexpr (kScaledCache<T>) {
    float amax = 0.0f;
#pragma unroll
    for (int e = 0; e < 2 * P; ++e) amax = fmaxf(amax, fabsf(s.at(e)));
    const Fp8RowScale r = fp8_row_scale(warp_max(amax));
#pragma unroll
    for (int j = 0; j < P; ++j) {
      out.lo[j] = __nv_cvt_float_to_fp8(__fmul_rn(to_f(s.lo[j]), r.inverse), __NV_SATFINITE, __NV_E4M3);
      out.hi[j] = __nv_cvt_float_to_fp8(__fmul_rn(to_f(s.hi[j]), r.inverse), __NV_SATFINITE, __NV_E4M3);
    }
    return r.scale;
  } else {
    out = s;
    return 1.0f;
  }
}

// Quantizes (for an e4m3 cache) and writes one row of the cache at element offset `row` (a multiple of D), with
// its scale at scales[row / D]; returns the slice as stored and its scale (1.0 for bf16).
template <int P, typename T>
__device__ __forceinline__ float write_cache_row(T* __restrict__ cache, float* __restrict__ scales, int64_t row,
                                                 const HeadSlice<P>& s, CacheSlice<P, T>& stored) {
  const float scale = to_cache_slice<P, T>(s, stored);
  store_slice<P>(cache + row, stored);
  if constexpr (kScaledCache<T>) {
    if ((threadIdx.x & 31) == 0) scales[row / (64 * P)] = scale;
  }
  return scale;
}

template <int P, typename T>
__device__ __forceinline__ CacheSlice<P, T> load_cache_slice(const T* __restrict__ row) {
  constexpr int H = 32 * P;
  const int first = (threadIdx.x & 31) * P;
  CacheSlice<P, T> s;
#pragma unroll
  for (int j = 0; j < P; ++j) {
    s.lo[j] = row[first + j];
    s.hi[j] = row[H + first + j];
  }
  return s;
}

}  // namespace q3tts

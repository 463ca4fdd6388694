// q/k RMSNorm + rotate-half RoPE + KV-cache write in one pass, one warp per head (rope.cuh's norm_rope_head).
// With k_out, the roped keys also land in rows [batch, kv_heads, D]: a prompt pass attends over its own keys,
// which it would otherwise gather back out of the cache. The cache is bf16 or e4m3 codes with a scale a row
// (kv_cache.cuh): each warp quantizes the K or V row it writes.
#include "common.cuh"
#include "kv_cache.cuh"
#include "launch.cuh"
#include "launchers.h"
#include "rope.cuh"

namespace q3tts {
namespace {

constexpr int kWarps = 4;

// P = head_dim / 64: each lane owns P consecutive elements of each half of the head.
template <int P, typename T>
__global__ void __launch_bounds__(kWarps * 32)
    qk_norm_rope_cache_kernel(bf16* __restrict__ q_out, const bf16* __restrict__ q, const bf16* __restrict__ k,
                              const bf16* __restrict__ v, int q_stride, int k_stride, int v_stride,
                              const bf16* __restrict__ q_norm, const bf16* __restrict__ k_norm,
                              const bf16* __restrict__ cos_table, const bf16* __restrict__ sin_table,
                              const int64_t* __restrict__ positions, const int64_t* __restrict__ slots,
                              T* __restrict__ k_cache, T* __restrict__ v_cache, CacheScales scales,
                              bf16* __restrict__ k_out, int q_heads, int kv_heads, int max_len, float eps) {
  constexpr int D = 64 * P;
  const int b = blockIdx.y;
  const int head = blockIdx.x * kWarps + (threadIdx.x >> 5);
  const bool is_q = head < q_heads;
  // Before waiting for the previous kernel: the row's position and slot (see launch.cuh) and the constants.
  const int pos = static_cast<int>(load_before_wait(positions + b));
  const int64_t slot = load_before_wait(slots + b);
  const HeadSlice<P> cos = load_slice<P, kBeforeWait>(cos_table + static_cast<int64_t>(pos) * D);
  const HeadSlice<P> sin = load_slice<P, kBeforeWait>(sin_table + static_cast<int64_t>(pos) * D);
  const HeadSlice<P> weight = load_slice<P, kBeforeWait>(is_q ? q_norm : k_norm);
  begin_dependent_kernel();
  if (head >= q_heads + 2 * kv_heads) return;

  if (head >= q_heads + kv_heads) {  // V: copied (or quantized) into the cache
    const int kvh = head - q_heads - kv_heads;
    CacheSlice<P, T> stored;
    write_cache_row<P, T>(v_cache, scales.v, ((slot * kv_heads + kvh) * max_len + pos) * D,
                          load_slice<P>(v + static_cast<int64_t>(b) * v_stride + kvh * D), stored);
    return;
  }

  const int h = is_q ? head : head - q_heads;
  const bf16* src = is_q ? q + static_cast<int64_t>(b) * q_stride + h * D : k + static_cast<int64_t>(b) * k_stride + h * D;
  HeadSlice<P> out;
  norm_rope_head<P>(src, weight, cos, sin, eps, out.lo, out.hi);
  if (is_q) {
    store_slice<P>(q_out + (static_cast<int64_t>(b) * q_heads + h) * D, out);
    return;
  }
  CacheSlice<P, T> stored;
  write_cache_row<P, T>(k_cache, scales.k, ((slot * kv_heads + h) * max_len + pos) * D, out, stored);
  if (k_out != nullptr) store_slice<P>(k_out + (static_cast<int64_t>(b) * kv_heads + h) * D, out);
}

}  // namespace

cudaError_t qk_norm_rope_cache(void* q_out, const void* q, const void* k, const void* v, int q_stride,
                               int k_stride, int v_stride, const void* q_norm, const void* k_norm,
                               const void* cos, const void* sin, const int64_t* positions,
                               const int64_t* slots, void* k_cache, void* v_cache, float* k_scale,
                               float* v_scale, void* k_out, int batch,
                               int q_heads, int kv_heads, int head_dim, int max_len, float eps,
                               cudaStream_t stream) {
  if (batch == 0) return cudaSuccess;
  const dim3 grid((q_heads + 2 * kv_heads + kWarps - 1) / kWarps, batch);
  const CacheScales scales{k_scale, v_scale};
#define Q3TTS_LAUNCH(P, T)                                                                                \
  launch_kernel(qk_norm_rope_cache_kernel<P, T>, dim3(grid), dim3(kWarps * 32), stream,                   \
      static_cast<bf16*>(q_out), static_cast<const bf16*>(q), static_cast<const bf16*>(k),                \
      static_cast<const bf16*>(v), q_stride, k_stride, v_stride, static_cast<const bf16*>(q_norm),        \
      static_cast<const bf16*>(k_norm), static_cast<const bf16*>(cos), static_cast<const bf16*>(sin),     \
      positions, slots, static_cast<T*>(k_cache), static_cast<T*>(v_cache), scales, static_cast<bf16*>(k_out), \
      q_heads, kv_heads, max_len, eps)
  const bool scaled = k_scale != nullptr;
  switch (head_dim) {
    case 64: if (scaled) { Q3TTS_LAUNCH(1, fp8); } else { Q3TTS_LAUNCH(1, bf16); } break;
    case 128: if (scaled) { Q3TTS_LAUNCH(2, fp8); } else { Q3TTS_LAUNCH(2, bf16); } break;
    default: return cudaErrorInvalidValue;
  }
#undef Q3TTS_LAUNCH
  return cudaGetLastError();
}

}  // namespace q3tts

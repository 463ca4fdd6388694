// The codec transformer's sliding-window attention for one pass of n frames (codec.py,
// `SlidingWindowAttention`; `reference.codec_window_attention`), one kernel a layer: RoPE of the pass's
// queries and keys, the new keys and values joining the cached window (the state's next cache written out),
// and each query's attention over its own window.
// Why: torch ran it as 7 kernels a layer (RoPE as a mul, a roll and an addcmul, the cache's concatenation,
// two layout copies and an attention kernel of ~16 us for 4 query frames over <= 75 keys in float32: 0.13 of a
// 1.9 ms packet at one stream, 0.45-0.64 ms of a 64-stream packet, run 63).
//
// A block per (stream, KV head) stages the window's keys and values as floats in shared memory: the cached
// slots as stored (RoPE'd keys, values), then the pass's frames, whose keys it rotates the reference's way
// (torch's mul, then addcmul, each rounded as torch rounds it; `rotated`), from the same cos and sin tensors.
// It writes the last W - 1 slots out as the next cache. Then a warp per query row: the query rotated
// likewise, a lane per key slot for the scores (rows padded by one float, so the lanes' rows fall in
// different banks), the softmax in float32, a lane per two output dims for the values' weighted sum, rounded
// once to the element type.
#include "common.cuh"
#include "launch.cuh"
#include "launchers.h"

namespace q3tts {
namespace {

constexpr int kHeadDim = 64;
constexpr int kWarps = 8;
constexpr int kLoadsInFlight = 8;  // 16-byte loads a thread issues before it waits for any
constexpr int kRowFloats = 2 * kHeadDim + 1;  // key, value, one float of padding

template <typename T>
struct alignas(16) Vec16 {
  static constexpr int kElems = 16 / sizeof(T);
  T v[kElems];
};

__device__ __forceinline__ float round_to(float x, float) { return x; }
__device__ __forceinline__ float round_to(float x, bf16) { return round_bf(x); }

// Element d of a rotated head row x (kHeadDim elements), as torch computes qkv * cos, then
// addcmul(that, roll(qkv, D / 2), sin): round(fma(roll(x)[d], sin[d], round(x[d] * cos[d]))). Adding the
// product rounded to float32 first (`__fadd_rn(scaled, __fmul_rn(...))`) gave other float32 keys than torch's
// (run 65), so its addcmul kernel contracts `a + alpha * b * c` into one fused multiply-add.
template <typename T>
__device__ __forceinline__ float rotated(const T* x, const T* cos, const T* sin, int d) {
  const T zero{};
  const float scaled = round_to(__fmul_rn(to_float(x[d]), to_float(cos[d])), zero);
  return round_to(fmaf(to_float(x[(d + kHeadDim / 2) % kHeadDim]), to_float(sin[d]), scaled), zero);
}

template <typename T>
__global__ void __launch_bounds__(32 * kWarps)
    codec_window_attention_kernel(T* __restrict__ out, T* __restrict__ next_cache, const T* __restrict__ qkv,
                                  const T* __restrict__ cos, const T* __restrict__ sin, const T* __restrict__ cache,
                                  const int64_t* __restrict__ positions, CodecWindowShape shape) {
  extern __shared__ float staged[];
  const int frames = shape.frames, group = shape.group, kv_heads = shape.kv_heads;
  const int cached = shape.window - 1, slots = cached + frames;
  float* keys = staged;                                      // [slots][kRowFloats]
  float* query = keys + slots * kRowFloats;                  // [kWarps][kHeadDim]
  float* weights = query + kWarps * kHeadDim;                // [kWarps][slots]
  begin_dependent_kernel();
  const int b = blockIdx.x / kv_heads, h = blockIdx.x % kv_heads;
  const int row_elems = (group + 2) * kHeadDim;              // one frame's rows of this KV head
  const int64_t frame_stride = static_cast<int64_t>(kv_heads) * row_elems;
  const T* head_qkv = qkv + static_cast<int64_t>(b) * frames * frame_stride + static_cast<int64_t>(h) * row_elems;
  const T* frame_cos = cos + static_cast<int64_t>(b) * frames * row_elems;
  const T* frame_sin = sin + static_cast<int64_t>(b) * frames * row_elems;
  const T* head_cache = cache + b * shape.cache_strides[0] + h * shape.cache_strides[1];

  // The cached window, 16 bytes a load, kLoadsInFlight loads a thread before the first is waited for: one
  // load at a time, a block's ~70 dependent loads a thread made the kernel slower than the seven torch ops it
  // replaces at one stream (run 66).
  constexpr int E = Vec16<T>::kElems, kRowVecs = 2 * kHeadDim / E;
  const int cached_vecs = cached * kRowVecs;
  for (int first = threadIdx.x; first < cached_vecs; first += blockDim.x * kLoadsInFlight) {
    Vec16<T> v[kLoadsInFlight];
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      const int i = first + u * blockDim.x;
      if (i < cached_vecs) {
        v[u] = *reinterpret_cast<const Vec16<T>*>(head_cache + (i / kRowVecs) * shape.cache_strides[2] +
                                                  (i % kRowVecs) * E);
      }
    }
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      const int i = first + u * blockDim.x;
      if (i < cached_vecs) {
        float* row = keys + (i / kRowVecs) * kRowFloats + (i % kRowVecs) * E;
#pragma unroll
        for (int j = 0; j < E; ++j) row[j] = to_float(v[u].v[j]);
      }
    }
  }
  for (int i = threadIdx.x; i < frames * 2 * kHeadDim; i += blockDim.x) {
    const int frame = i / (2 * kHeadDim), e = i % (2 * kHeadDim);
    const T* rows = head_qkv + frame * frame_stride;
    float v;
    if (e < kHeadDim) {  // the key row, rotated
      const int key = group * kHeadDim;
      v = rotated(rows + key, frame_cos + frame * row_elems + key, frame_sin + frame * row_elems + key, e);
    } else {  // the value row: angle 0, so the reference's rotation leaves it as it is
      const T* value = rows + (group + 1) * kHeadDim;
      v = to_float(value[e - kHeadDim]);
    }
    keys[(cached + frame) * kRowFloats + e] = v;
  }
  __syncthreads();

  T* head_next = next_cache + (static_cast<int64_t>(b) * kv_heads + h) * cached * 2 * kHeadDim;
  for (int i = threadIdx.x; i < cached_vecs; i += blockDim.x) {
    const float* row = keys + (i / kRowVecs + frames) * kRowFloats + (i % kRowVecs) * E;
    Vec16<T> v;
#pragma unroll
    for (int j = 0; j < E; ++j) store_float(&v.v[j], row[j]);
    *reinterpret_cast<Vec16<T>*>(head_next + i * E) = v;
  }

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* my_query = query + warp * kHeadDim;
  float* my_weights = weights + warp * slots;
  const int64_t position = positions[b];
  const float scale = rsqrtf(static_cast<float>(kHeadDim));
  for (int row = warp; row < frames * group; row += kWarps) {
    const int frame = row / group, g = row % group;
    const T* q = head_qkv + frame * frame_stride + g * kHeadDim;
    const T* q_cos = frame_cos + frame * row_elems + g * kHeadDim;
    const T* q_sin = frame_sin + frame * row_elems + g * kHeadDim;
    for (int d = lane; d < kHeadDim; d += 32) my_query[d] = rotated(q, q_cos, q_sin, d);
    __syncwarp();
    // Slot s holds frame position - cached + s: the query sees slots frame .. cached + frame, from frame 0 on.
    const int first = position >= cached ? frame : max(frame, static_cast<int>(cached - position));
    const int last = cached + frame;
    float best = -INFINITY;
    for (int s = first + lane; s <= last; s += 32) {
      const float* key = keys + s * kRowFloats;
      float dot = 0.0f;
#pragma unroll 16
      for (int d = 0; d < kHeadDim; ++d) dot = fmaf(my_query[d], key[d], dot);
      my_weights[s - first] = dot * scale;
      best = fmaxf(best, dot * scale);
    }
    best = warp_max(best);
    float total = 0.0f;
    for (int s = first + lane; s <= last; s += 32) {
      const float p = expf(my_weights[s - first] - best);
      my_weights[s - first] = p;
      total += p;
    }
    total = warp_sum(total);
    __syncwarp();
    T* out_row = out + ((static_cast<int64_t>(b) * frames + frame) * kv_heads * group + h * group + g) * kHeadDim;
    for (int d = lane; d < kHeadDim; d += 32) {
      float acc = 0.0f;
      for (int s = first; s <= last; ++s) acc = fmaf(my_weights[s - first], keys[s * kRowFloats + kHeadDim + d], acc);
      store_float(out_row + d, acc / total);
    }
    __syncwarp();
  }
}

template <typename T>
cudaError_t launch(void* out, void* next_cache, const void* qkv, const void* cos, const void* sin, const void* cache,
                   const int64_t* positions, const CodecWindowShape& shape, cudaStream_t stream) {
  const int slots = shape.window - 1 + shape.frames;
  const size_t shared_bytes = (static_cast<size_t>(slots) * kRowFloats + kWarps * (kHeadDim + slots)) * sizeof(float);
  if (shared_bytes > 48 * 1024) {  // a one-shot decode's 32-frame passes; a packet's fits the default
    const cudaError_t err = cudaFuncSetAttribute(codec_window_attention_kernel<T>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(shared_bytes));
    if (err != cudaSuccess) return err;
  }
  launch_kernel_shared(codec_window_attention_kernel<T>, dim3(static_cast<unsigned>(shape.batch * shape.kv_heads)),
                       dim3(32 * kWarps), shared_bytes, stream, static_cast<T*>(out), static_cast<T*>(next_cache),
                       static_cast<const T*>(qkv), static_cast<const T*>(cos), static_cast<const T*>(sin),
                       static_cast<const T*>(cache), positions, shape);
  return cudaGetLastError();
}

}  // namespace

cudaError_t codec_window_attention(void* out, void* next_cache, const void* qkv, const void* cos, const void* sin,
                                   const void* cache, const int64_t* positions, const CodecWindowShape& shape,
                                   int element_bytes, cudaStream_t stream) {
  if (shape.head_dim != kHeadDim || shape.window < 2 || shape.frames < 1 || shape.group < 1 ||
      static_cast<int64_t>(shape.batch) * shape.kv_heads > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  if (element_bytes == 4) return launch<float>(out, next_cache, qkv, cos, sin, cache, positions, shape, stream);
  if (element_bytes == 2) return launch<bf16>(out, next_cache, qkv, cos, sin, cache, positions, shape, stream);
  return cudaErrorInvalidValue;
}

}  // namespace q3tts

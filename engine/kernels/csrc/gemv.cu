// Weight-streaming GEMV/skinny GEMM for decode: y[n, m] = x[n, k] @ W[m, k]^T (* per-row scale) (+ bias).
// One warp per output row (2 or 4 for weights of few, long rows: see gemv_kernel); each lane streams 16-byte
// weight chunks (8 bf16 or 16 8-bit values), several in flight, and applies them to a tile of up to 16
// activation rows read through L1. The per-row reduction order (lane -> chunk mapping, then a fixed
// butterfly, then the warps of a row in order) depends on the weight's shape only, not on n or on the tile
// split, so a row's result is the same whatever batch it is in. The SwiGLU variant computes the gate and up rows of the
// fused gate/up weight in one warp and writes only SiLU(gate) * up (the decoder block's MLP input). With an
// InputNorm, each block first norms its (residual + delta) activation rows into shared memory, so the RMSNorm
// before a decoder block's qkv and gate/up projections needs no kernel (and no dependency) of its own.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "common.cuh"
#include "launch.cuh"
#include "launchers.h"
#include "weight_load.cuh"

namespace q3tts {
namespace {

// Warps a block (run 53: 8 against 4 took a one-stream frame from 2.985 to 2.899 ms in exact mode and 2.525 to
// 2.407 in fast; 16 lost in fast): half the blocks to schedule per kernel, and the normed GEMVs' per-block
// RMSNorm spread over twice the threads.
constexpr int kWarps = 8;
constexpr int kUnroll = 4;
constexpr int kMaxNormRows = 4;  // activation rows a normed GEMV takes (one tile, normed by every block)

template <WeightKind K>
struct Chunk;

template <>
struct Chunk<WeightKind::kBf16> {
  static constexpr int kElems = 8;
  __device__ static void unpack(const uint4& raw, float* out) {
    const bf16* v = reinterpret_cast<const bf16*>(&raw);
#pragma unroll
    for (int j = 0; j < 8; ++j) out[j] = to_f(v[j]);
  }
};

template <>
struct Chunk<WeightKind::kInt8> {
  static constexpr int kElems = 16;
  // int8 -> fp32 without I2F: bias to unsigned, splice under the exponent of 2^23, subtract 2^23 + 128.
  __device__ static void unpack(const uint4& raw, float* out) {
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint32_t u = words[w] ^ 0x80808080u;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        out[w * 4 + j] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7540u | j)) - 8388736.0f;
      }
    }
  }
};

template <>
struct Chunk<WeightKind::kFp8E4M3> {
  static constexpr int kElems = 16;
  __device__ static void unpack(const uint4& raw, float* out) {
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const __nv_fp8x2_storage_t pair = static_cast<__nv_fp8x2_storage_t>(words[w] >> (16 * h));
        const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&hr));
        out[w * 4 + h * 2] = f.x;
        out[w * 4 + h * 2 + 1] = f.y;
      }
    }
  }
};

// One batch of this lane's weight chunks (base, base + 32 * S, ...; kUnroll of them) of each of the R rows.
template <int R, int S>
__device__ __forceinline__ void load_chunks(uint4 (&raw)[R][kUnroll], const uint4* const (&rows)[R], int base,
                                            int chunks, uint64_t policy) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int c = base + u * 32 * S;
#pragma unroll
    for (int r = 0; r < R; ++r) raw[r][u] = c < chunks ? load_weight(rows[r] + c, policy) : make_uint4(0, 0, 0, 0);
  }
}

// The weight-streaming loop of one warp over R weight rows (`rows[r]`, k wide) against the NT activation rows of
// x: acc[r][t] += sum_k W_r[k] x_t[k], this lane's share (acc starts at zero). With S warps to a row (S = 1: the whole row) the warp
// of `part` takes the row's 32-chunk groups part, part + S, ...; each lane its chunk of every group, in
// order, so a weight row's reduction order depends on S (a function of the weight's shape) but not on R,
// NT or n. `raw` holds the first batch, loaded by the
// caller with `load_chunks` before `wait_for_previous_kernel`: weights are never written by a kernel, so they
// stream in while the kernel that makes x still runs (for the code predictor's k = 1024 that batch is the
// whole row). x is in global memory, or in shared memory when kSharedX.
template <WeightKind K, int NT, int R, bool kSharedX, int S>
__device__ __forceinline__ void accumulate_rows(float (&acc)[R][NT], uint4 (&raw)[R][kUnroll],
                                                const uint4* const (&rows)[R], const bf16* __restrict__ x,
                                                int rows_here, int k, int x_stride, int part, uint64_t policy) {
  using C = Chunk<K>;
  constexpr int E = C::kElems;
  constexpr int kStep = 32 * S * kUnroll;
  const int lane = threadIdx.x & 31;
  const int chunks = k / E;
  for (int base = lane + 32 * part; base < chunks; base += kStep) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = base + u * 32 * S;
      if (c >= chunks) break;
      float wf[R][E];
#pragma unroll
      for (int r = 0; r < R; ++r) C::unpack(raw[r][u], wf[r]);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        if (t >= rows_here) break;
        const uint4* xv = reinterpret_cast<const uint4*>(x + static_cast<int64_t>(t) * x_stride + c * E);
#pragma unroll
        for (int h = 0; h < E / 8; ++h) {
          float xf[8];
          Chunk<WeightKind::kBf16>::unpack(kSharedX ? xv[h] : __ldg(xv + h), xf);
#pragma unroll
          for (int r = 0; r < R; ++r) {
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[r][t] = fmaf(wf[r][h * 8 + j], xf[j], acc[r][t]);
          }
        }
      }
    }
    if (base + kStep < chunks) load_chunks<R, S>(raw, rows, base + kStep, chunks, policy);
  }
}

// The RMSNorm a GEMV applies to its input rows on the way in (`gemv_rms_norm`, launchers.h).
struct InputNorm {
  const bf16* delta;   // added to x first (the residual add), or null
  bf16* sum_out;       // x + delta, written by block 0 when not null (the next residual stream)
  const bf16* weight;  // [k]
  float eps;
};

// The norm weight's vector threadIdx.x (8 columns; zeros past k): for k <= 8 * kWarps * 32 (the model's 1024
// and 2048) a thread's only one, loaded before the wait so that no load of it follows the block's sum of squares.
__device__ __forceinline__ Bf16x8 first_norm_weight(const InputNorm& norm, int k) {
  if (static_cast<int>(threadIdx.x) < k / 8) {
    return load_before_wait(reinterpret_cast<const Bf16x8*>(norm.weight) + threadIdx.x);
  }
  return Bf16x8{};
}

// RMSNorm(x + delta) * weight of the block's `rows` activation rows (x_stride apart, k wide) into `normed`
// ([rows, k], shared), rounded as rms_norm_kernel rounds them (norm.cu): s = bf16(x + delta), then
// bf16(w * bf16(s * rsqrt(mean(s^2) + eps))); only the fp32 sum of squares is added in another order. Block 0
// also writes s to norm.sum_out. `first_weight` is the weight's vector threadIdx.x (`first_norm_weight`),
// loaded before the wait. Every thread of the block must call it; it ends with a __syncthreads.
template <int NT>
__device__ __forceinline__ void norm_rows(bf16* normed, const bf16* __restrict__ x, int x_stride, int rows, int k,
                                          const InputNorm& norm, const Bf16x8& first_weight) {
  __shared__ float partial[NT][kWarps];
  const int vecs = k / 8;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const bool writes_sum = norm.sum_out != nullptr && blockIdx.x == 0;
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    float sum_sq = 0.0f;
    if (t < rows) {
      const int64_t offset = static_cast<int64_t>(t) * x_stride;
      for (int i = threadIdx.x; i < vecs; i += kWarps * 32) {
        Bf16x8 s = reinterpret_cast<const Bf16x8*>(x + offset)[i];
        if (norm.delta != nullptr) {
          const Bf16x8 d = reinterpret_cast<const Bf16x8*>(norm.delta + offset)[i];
#pragma unroll
          for (int j = 0; j < 8; ++j) s.v[j] = to_bf(to_f(s.v[j]) + to_f(d.v[j]));
        }
        if (writes_sum) reinterpret_cast<Bf16x8*>(norm.sum_out + offset)[i] = s;
#pragma unroll
        for (int j = 0; j < 8; ++j) sum_sq += to_f(s.v[j]) * to_f(s.v[j]);
        reinterpret_cast<Bf16x8*>(normed + static_cast<int64_t>(t) * k)[i] = s;
      }
    }
    sum_sq = warp_sum(sum_sq);
    if (lane == 0) partial[t][warp] = sum_sq;
  }
  __syncthreads();
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    if (t >= rows) break;
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += partial[t][w];
    const float inv = rsqrtf(total / static_cast<float>(k) + norm.eps);
    Bf16x8* row = reinterpret_cast<Bf16x8*>(normed + static_cast<int64_t>(t) * k);
    for (int i = threadIdx.x; i < vecs; i += kWarps * 32) {
      const Bf16x8 w =
          i == static_cast<int>(threadIdx.x) ? first_weight : reinterpret_cast<const Bf16x8*>(norm.weight)[i];
      Bf16x8 o = row[i];
#pragma unroll
      for (int j = 0; j < 8; ++j) o.v[j] = to_bf(to_f(w.v[j]) * round_bf(to_f(o.v[j]) * inv));
      row[i] = o;
    }
  }
  __syncthreads();
}

// The part every GEMV kernel shares: let the next kernel be scheduled, start this warp's weight rows, wait
// for the previous kernel, norm the input rows when kNorm, then stream: acc[r][t] for weight rows rows[r]
// (this warp's `part` of them when S warps share a row; zeros when not `active`). The weight loads are
// non-coherent (load_weight), which ptxas may move after the wait (common.cuh's load_before_wait); the branch
// on `active` around them keeps them before it (the SASS of every instance, CUDA 13.0).
template <WeightKind K, int NT, int R, bool kNorm, int S = 1>
__device__ __forceinline__ void gemv_rows(float (&acc)[R][NT], const uint4* const (&rows)[R], bool active,
                                          const bf16* __restrict__ x, int rows_here, int k, int x_stride,
                                          const InputNorm& norm, uint64_t policy, int part = 0) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  allow_next_kernel();
  uint4 raw[R][kUnroll];
  const int chunks = k / Chunk<K>::kElems;
  if (active) load_chunks<R, S>(raw, rows, (threadIdx.x & 31) + 32 * part, chunks, policy);
  Bf16x8 first_weight{};
  if constexpr (kNorm) first_weight = first_norm_weight(norm, k);
  wait_for_previous_kernel();
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
  }
  if constexpr (kNorm) {
    static_assert(S == 1, "a normed GEMV keeps one warp per row");
    bf16* normed = reinterpret_cast<bf16*>(shared_bytes);
    norm_rows<NT>(normed, x, x_stride, rows_here, k, norm, first_weight);
    if (active) accumulate_rows<K, NT, R, true, 1>(acc, raw, rows, normed, rows_here, k, k, 0, policy);
  } else {
    if (active) accumulate_rows<K, NT, R, false, S>(acc, raw, rows, x, rows_here, k, x_stride, part, policy);
  }
}

template <WeightKind K>
__device__ __forceinline__ const uint4* weight_row(const uint8_t* w, int row, int k) {
  const int64_t row_bytes = static_cast<int64_t>(k) * (K == WeightKind::kBf16 ? 2 : 1);
  return reinterpret_cast<const uint4*>(w + row * row_bytes);
}

__device__ __forceinline__ bf16 product(float lane_sum, RowFactors factors) {
  return scaled(warp_sum(lane_sum), factors);
}

// S warps to an output row (kWarps / S rows a block): for weights of few, long rows (the o and down
// projections, m <= 2048), where one warp a row leaves too few bytes in flight; the S partial sums are added
// in warp order.
template <WeightKind K, int NT, bool kNorm, int S>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(bf16* __restrict__ y, const bf16* __restrict__ x, const uint8_t* __restrict__ w,
                const float* __restrict__ scale, const bf16* __restrict__ bias, int n, int k, int m,
                int x_stride, int y_stride, InputNorm norm, L2Priority l2) {
  static_assert(kWarps % S == 0, "whole rows in a block");
  const int warp = threadIdx.x >> 5;
  const int row = blockIdx.x * (kWarps / S) + warp / S;
  const int part = warp % S;
  const bool active = row < m;
  const int rows_here = min(NT, n);
  const RowFactors factors = row_factors(scale, bias, active ? row : 0);
  const uint4* const rows[1] = {weight_row<K>(w, active ? row : 0, k)};
  float acc[1][NT];
  gemv_rows<K, NT, 1, kNorm, S>(acc, rows, active, x, rows_here, k, x_stride, norm, weight_policy(w, l2), part);
  if constexpr (S == 1) {
    if (!active) return;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const bf16 v = product(acc[0][t], factors);
      if ((threadIdx.x & 31) == 0 && t < rows_here) y[static_cast<int64_t>(t) * y_stride + row] = v;
    }
  } else {
    __shared__ float partial[kWarps][NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float sum = warp_sum(acc[0][t]);
      if ((threadIdx.x & 31) == 0) partial[warp][t] = sum;
    }
    __syncthreads();
    if (!active || part != 0) return;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      float sum = partial[warp][t];
#pragma unroll
      for (int p = 1; p < S; ++p) sum += partial[warp + p][t];
      const bf16 v = scaled(sum, factors);
      if ((threadIdx.x & 31) == 0 && t < rows_here) y[static_cast<int64_t>(t) * y_stride + row] = v;
    }
  }
}

// SiLU(gate) * up straight from the fused gate/up weight [2m, k] (gate rows first): one warp computes gate row
// i and up row m + i together and writes only the SwiGLU, with swiglu.cu's expression on the two bf16
// products. The products are the plain GEMV's, bit for bit, so the result equals linear then silu_mul.
// One stream's bf16 SwiGLU is held to 64 registers (4 blocks an SM instead of 3 at 67): run 55, one-stream frame
// 2.900 -> 2.850 ms in exact mode. The others keep the compiler's choice (0: no bound); the same bound made fast
// mode's fp8 kernel 3% slower.
template <WeightKind K, int NT, bool kNorm>
__global__ void __launch_bounds__(kWarps * 32, NT == 1 && K == WeightKind::kBf16 ? 4 : 0)
    gemv_swiglu_kernel(bf16* __restrict__ y, const bf16* __restrict__ x, const uint8_t* __restrict__ w,
                       const float* __restrict__ scale, int n, int k, int m, int x_stride, int y_stride,
                       InputNorm norm, L2Priority l2) {
  const int row = blockIdx.x * kWarps + (threadIdx.x >> 5);
  const bool active = row < m;
  const int rows_here = min(NT, n);
  const RowFactors gate = row_factors(scale, nullptr, active ? row : 0);
  const RowFactors up = row_factors(scale, nullptr, active ? m + row : 0);
  const uint4* const rows[2] = {weight_row<K>(w, active ? row : 0, k), weight_row<K>(w, active ? m + row : 0, k)};
  float acc[2][NT];
  gemv_rows<K, NT, 2, kNorm>(acc, rows, active, x, rows_here, k, x_stride, norm, weight_policy(w, l2));
  if (!active) return;
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const bf16 v = swiglu_of(product(acc[0][t], gate), product(acc[1][t], up));
    if ((threadIdx.x & 31) == 0 && t < rows_here) y[static_cast<int64_t>(t) * y_stride + row] = v;
  }
}

// Tiles of up to 16 activation rows, one launch each; `swiglu` picks the SwiGLU kernel (m = its outputs). With
// `norm`, one launch for all n <= kMaxNormRows rows, each block norming them into shared memory.
template <WeightKind K>
cudaError_t launch(void* y_out, const void* x_in, const void* w_in, const float* scale, const void* bias_in, int n,
                   int k, int m, int x_stride, int y_stride, bool swiglu, const InputNorm* norm, L2Priority l2,
                   cudaStream_t stream) {
  auto* y = static_cast<bf16*>(y_out);
  auto* x = static_cast<const bf16*>(x_in);
  auto* w = static_cast<const uint8_t*>(w_in);
  auto* bias = static_cast<const bf16*>(bias_in);
  const dim3 grid((m + kWarps - 1) / kWarps);
  const dim3 block(kWarps * 32);
  if (norm != nullptr) {
#define Q3TTS_NORMED(NT)                                                                                      \
  swiglu ? launch_kernel_shared(gemv_swiglu_kernel<K, NT, true>, grid, block, NT * k * sizeof(bf16), stream, y, x, \
                                w, scale, n, k, m, x_stride, y_stride, *norm, l2)                                  \
         : launch_kernel_shared(gemv_kernel<K, NT, true, 1>, grid, block, NT * k * sizeof(bf16), stream, y, x, w, \
                                scale, bias, n, k, m, x_stride, y_stride, *norm, l2)
    const cudaError_t err = n <= 1 ? Q3TTS_NORMED(1) : n <= 2 ? Q3TTS_NORMED(2) : Q3TTS_NORMED(kMaxNormRows);
#undef Q3TTS_NORMED
    return err;
  }
  const InputNorm none = {nullptr, nullptr, nullptr, 0.0f};
  // Warps to a row: a function of the weight's shape only, so a row's result does not depend on the batch.
  const int split = swiglu || k < 2048 ? 1 : m <= 1024 ? 4 : m <= 2048 ? 2 : 1;
  const dim3 split_grid((m + kWarps / split - 1) / (kWarps / split));
  for (int n0 = 0; n0 < n;) {
    const int left = n - n0;
    const int tile = left >= 16 ? 16 : left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
    const bf16* xt = x + static_cast<int64_t>(n0) * x_stride;
    bf16* yt = y + static_cast<int64_t>(n0) * y_stride;
#define Q3TTS_PLAIN(NT, S)                                                                                    \
  launch_kernel(gemv_kernel<K, NT, false, S>, split_grid, block, stream, yt, xt, w, scale, bias, tile, k, m,   \
                x_stride, y_stride, none, l2)
#define Q3TTS_TILE(NT)                                                                                        \
  swiglu ? launch_kernel(gemv_swiglu_kernel<K, NT, false>, grid, block, stream, yt, xt, w, scale, tile, k, m,  \
                         x_stride, y_stride, none, l2)                                                        \
         : split == 4 ? Q3TTS_PLAIN(NT, 4) : split == 2 ? Q3TTS_PLAIN(NT, 2) : Q3TTS_PLAIN(NT, 1)
    cudaError_t err;
    switch (tile) {
      case 16: err = Q3TTS_TILE(16); break;
      case 8: err = Q3TTS_TILE(8); break;
      case 4: err = Q3TTS_TILE(4); break;
      case 2: err = Q3TTS_TILE(2); break;
      default: err = Q3TTS_TILE(1); break;
    }
#undef Q3TTS_TILE
#undef Q3TTS_PLAIN
    if (err != cudaSuccess) return err;
    n0 += tile;
  }
  return cudaSuccess;
}

cudaError_t launch_any(void* y, const void* x, const void* w, const float* scale, const void* bias, int n, int k,
                       int m, int x_stride, int y_stride, WeightKind kind, bool swiglu, const InputNorm* norm,
                       int64_t l2_keep, cudaStream_t stream) {
  const int elems = kind == WeightKind::kBf16 ? 8 : 16;
  if (k % elems != 0 || x_stride % 8 != 0 || (swiglu && bias != nullptr)) return cudaErrorInvalidValue;
  const int64_t bytes = static_cast<int64_t>(swiglu ? 2 * m : m) * k * (kind == WeightKind::kBf16 ? 2 : 1);
  const L2Priority l2 = l2_priority(l2_keep, bytes);
  switch (kind) {
    case WeightKind::kBf16:
      return launch<WeightKind::kBf16>(y, x, w, scale, bias, n, k, m, x_stride, y_stride, swiglu, norm, l2, stream);
    case WeightKind::kInt8:
      return launch<WeightKind::kInt8>(y, x, w, scale, bias, n, k, m, x_stride, y_stride, swiglu, norm, l2, stream);
    case WeightKind::kFp8E4M3:
      return launch<WeightKind::kFp8E4M3>(y, x, w, scale, bias, n, k, m, x_stride, y_stride, swiglu, norm, l2,
                                          stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t gemv(void* y, const void* x, const void* w, const float* scale, const void* bias, int n, int k,
                 int m, int x_stride, int y_stride, WeightKind kind, bool swiglu, int64_t l2_keep,
                 cudaStream_t stream) {
  return launch_any(y, x, w, scale, bias, n, k, m, x_stride, y_stride, kind, swiglu, nullptr, l2_keep, stream);
}

cudaError_t gemv_rms_norm(void* y, const void* x, const void* delta, void* sum_out, const void* norm_weight,
                          float eps, const void* w, const float* scale, int n, int k, int m, int x_stride,
                          int y_stride, WeightKind kind, bool swiglu, int64_t l2_keep, cudaStream_t stream) {
  const bool fits = n >= 1 && n <= kMaxNormRows && k % 8 == 0 && kMaxNormRows * k * sizeof(bf16) <= 48 * 1024;
  if (!fits) return cudaErrorInvalidValue;
  const InputNorm norm = {static_cast<const bf16*>(delta), static_cast<bf16*>(sum_out),
                          static_cast<const bf16*>(norm_weight), eps};
  return launch_any(y, x, w, scale, nullptr, n, k, m, x_stride, y_stride, kind, swiglu, &norm, l2_keep, stream);
}

}  // namespace q3tts

// Decode GEMVs with their producer fused into the prologue, for products of a few rows:
//   silu_mul_gemv:     y = x @ W^T with x = bf16(bf16(silu(gate)) * up), the SwiGLU of swiglu.cu;
//   add_rms_norm_gemv: r' = bf16(residual + delta) (or residual), y = RMSNorm(r') @ W^T, the norm of norm.cu;
//                      block 0 writes r' to a separate tensor (the other blocks still read `residual`).
// Every block computes the whole input rows of its tile into shared memory (a row is 1024..6144 wide: cheap
// next to streaming the weights), then each of its warps runs gemv.cu's loop over one output row. This saves
// the producer's launch, its graph-node gap and the round trip of its output through memory.
//
// Bit-identical to the unfused kernels (producer, then gemv): the prologues are swiglu.cu's and norm.cu's
// expressions, the norm reduces over norm.cu's block (256 threads, same vector layout, same block_sum), and
// the GEMV keeps gemv.cu's per-row reduction order (lane -> chunk mapping, unroll, butterfly, epilogue).
// The weight chunks are gemv.cuh's, as in gemv.cu; the row loop is gemv.cu's at one row per warp, reading its
// input rows from shared memory, and the norm row is norm.cu's.
// Launched like the other kernels (launch.cuh: programmatic dependent launch, begin_dependent_kernel first).
#include "common.cuh"
#include "gemv.cuh"
#include "launch.cuh"
#include "launchers.h"

namespace q3tts {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;  // norm.cu's kThreads: the norm's sum of squares reduces in its order
constexpr int kUnroll = 4;             // gemv.cu's
constexpr int kNormVecs = 4;           // norm.cu's kMaxVecPerThread: hidden <= 256 * 8 * 4 = 8192
constexpr int kMaxTile = 4;
constexpr int kSmemBytes = 48 * 1024;  // static + dynamic shared memory without the opt-in attribute
constexpr int kNormScratchBytes = 32 * sizeof(float);

// The tile's input rows, NT x k bf16 (row t at t * k), 16-byte aligned.
__device__ __forceinline__ bf16* tile_rows() {
  extern __shared__ uint4 tile_smem[];
  return reinterpret_cast<bf16*>(tile_smem);
}

// gemv.cu's gemv_kernel body over rows in shared memory: one warp per output row; call after the prologue's
// last __syncthreads (warps past m return here).
template <WeightKind K, int NT>
__device__ __forceinline__ void gemv_rows(bf16* __restrict__ y, const bf16* xs, const uint8_t* __restrict__ w,
                                          const float* __restrict__ scale, const bf16* __restrict__ bias,
                                          int rows_here, int k, int m, int y_stride) {
  using C = Chunk<K>;
  constexpr int E = C::kElems;
  const int row = blockIdx.x * kWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= m) return;
  const int chunks = k / E;
  const int64_t row_bytes = static_cast<int64_t>(k) * (K == WeightKind::kBf16 ? 2 : 1);
  const uint4* wrow = reinterpret_cast<const uint4*>(w + row * row_bytes);
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.0f;

  for (int base = lane; base < chunks; base += 32 * kUnroll) {
    uint4 raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = base + u * 32;
      raw[u] = c < chunks ? __ldg(wrow + c) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = base + u * 32;
      if (c >= chunks) break;
      float wf[E];
      C::unpack(raw[u], wf);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        if (t >= rows_here) break;
        const uint4* xv = reinterpret_cast<const uint4*>(xs + t * k + c * E);
#pragma unroll
        for (int h = 0; h < E / 8; ++h) {
          float xf[8];
          Chunk<WeightKind::kBf16>::unpack(xv[h], xf);
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[t] = fmaf(wf[h * 8 + j], xf[j], acc[t]);
        }
      }
    }
  }
  const float s = scale != nullptr ? scale[row] : 1.0f;
  const float b = bias != nullptr ? to_f(bias[row]) : 0.0f;
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float v = warp_sum(acc[t]);
    if (lane == 0 && t < rows_here) y[static_cast<int64_t>(t) * y_stride + row] = to_bf(fmaf(v, s, b));
  }
}

template <WeightKind K, int NT>
__global__ void __launch_bounds__(kThreads)
    silu_mul_gemv_kernel(bf16* __restrict__ y, const bf16* __restrict__ gate, const bf16* __restrict__ up,
                         int gate_stride, int up_stride, const uint8_t* __restrict__ w,
                         const float* __restrict__ scale, const bf16* __restrict__ bias, int n, int k, int m,
                         int y_stride) {
  begin_dependent_kernel();
  bf16* xs = tile_rows();
  const int rows_here = min(NT, n);
  const int vecs = k / 8;
  for (int t = 0; t < rows_here; ++t) {
    const Bf16x8* gv = reinterpret_cast<const Bf16x8*>(gate + static_cast<int64_t>(t) * gate_stride);
    const Bf16x8* uv = reinterpret_cast<const Bf16x8*>(up + static_cast<int64_t>(t) * up_stride);
    Bf16x8* xv = reinterpret_cast<Bf16x8*>(xs + t * k);
    for (int i = threadIdx.x; i < vecs; i += kThreads) {
      const Bf16x8 g = gv[i];
      const Bf16x8 u = uv[i];
      Bf16x8 o;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float x = to_f(g.v[j]);
        // swiglu.cu's expression (ATen's silu, x / (1 + exp(-x)) in fp32, rounded; then the product).
        const float s = round_bf(x / (1.0f + expf(-x)));
        o.v[j] = to_bf(s * to_f(u.v[j]));
      }
      xv[i] = o;
    }
  }
  __syncthreads();
  gemv_rows<K, NT>(y, xs, w, scale, bias, rows_here, k, m, y_stride);
}

// kAdd: r' = bf16(residual + delta), written to new_residual by block 0; else r' = residual (nothing written).
template <WeightKind K, int NT, bool kAdd>
__global__ void __launch_bounds__(kThreads)
    add_rms_norm_gemv_kernel(bf16* __restrict__ y, bf16* __restrict__ new_residual, const bf16* __restrict__ delta,
                             const bf16* __restrict__ residual, int delta_stride, int residual_stride,
                             int new_stride, const bf16* __restrict__ norm_weight, float eps,
                             const uint8_t* __restrict__ w, const float* __restrict__ scale,
                             const bf16* __restrict__ bias, int n, int k, int m, int y_stride) {
  begin_dependent_kernel();
  __shared__ float scratch[32];
  bf16* xs = tile_rows();
  const int rows_here = min(NT, n);
  const int vecs = k / 8;
  const bool writer = kAdd && blockIdx.x == 0;
  const Bf16x8* wv = reinterpret_cast<const Bf16x8*>(norm_weight);
  for (int t = 0; t < rows_here; ++t) {
    // norm.cu's rms_norm_kernel for row t, with the sum going to new_residual instead of in place.
    const Bf16x8* rv = reinterpret_cast<const Bf16x8*>(residual + static_cast<int64_t>(t) * residual_stride);
    const Bf16x8* dv = kAdd ? reinterpret_cast<const Bf16x8*>(delta + static_cast<int64_t>(t) * delta_stride)
                            : nullptr;
    Bf16x8* nv = writer ? reinterpret_cast<Bf16x8*>(new_residual + static_cast<int64_t>(t) * new_stride) : nullptr;
    Bf16x8 held[kNormVecs];
    float sum_sq = 0.0f;
#pragma unroll
    for (int i = 0; i < kNormVecs; ++i) {
      const int idx = threadIdx.x + i * kThreads;
      if (idx < vecs) {
        Bf16x8 a;
        if (kAdd) {
          a = dv[idx];
          const Bf16x8 r = rv[idx];
#pragma unroll
          for (int j = 0; j < 8; ++j) a.v[j] = to_bf(to_f(r.v[j]) + to_f(a.v[j]));
          if (writer) nv[idx] = a;
        } else {
          a = rv[idx];
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float f = to_f(a.v[j]);
          sum_sq += f * f;
        }
        held[i] = a;
      }
    }
    const float total = block_sum(sum_sq, scratch);
    const float inv = rsqrtf(total / static_cast<float>(k) + eps);
    Bf16x8* ov = reinterpret_cast<Bf16x8*>(xs + t * k);
#pragma unroll
    for (int i = 0; i < kNormVecs; ++i) {
      const int idx = threadIdx.x + i * kThreads;
      if (idx < vecs) {
        const Bf16x8 wn = wv[idx];
        Bf16x8 o;
#pragma unroll
        for (int j = 0; j < 8; ++j) o.v[j] = to_bf(to_f(wn.v[j]) * round_bf(to_f(held[i].v[j]) * inv));
        ov[idx] = o;
      }
    }
  }
  __syncthreads();
  gemv_rows<K, NT>(y, xs, w, scale, bias, rows_here, k, m, y_stride);
}

// The largest tile of at most `left` rows (4, 2 or 1) whose input rows fit in `smem` bytes; 0 if none does.
int tile_for(int left, int k, int smem) {
  for (int tile = kMaxTile; tile >= 1; tile /= 2) {
    if (tile <= left && tile * k * static_cast<int>(sizeof(bf16)) <= smem) return tile;
  }
  return 0;
}

bool shape_ok(int k, int x_stride_a, int x_stride_b, WeightKind kind) {
  const int elems = kind == WeightKind::kBf16 ? 8 : 16;
  return k > 0 && k % elems == 0 && x_stride_a % 8 == 0 && x_stride_b % 8 == 0;
}

template <typename Kernel>
Kernel by_tile(int tile, Kernel four, Kernel two, Kernel one) {
  return tile == 4 ? four : tile == 2 ? two : one;
}

// Row tiles of gate/up, one launch each (the per-row result does not depend on the tile).
template <WeightKind K>
cudaError_t launch_silu(bf16* y, const bf16* gate, const bf16* up, int gate_stride, int up_stride,
                        const uint8_t* w, const float* scale, const bf16* bias, int n, int k, int m, int y_stride,
                        cudaStream_t stream) {
  const dim3 grid((m + kWarps - 1) / kWarps);
  for (int n0 = 0; n0 < n;) {
    const int tile = tile_for(n - n0, k, kSmemBytes);
    if (tile == 0) return cudaErrorInvalidValue;
    const auto kernel = by_tile(tile, silu_mul_gemv_kernel<K, 4>, silu_mul_gemv_kernel<K, 2>,
                                silu_mul_gemv_kernel<K, 1>);
    const cudaError_t err = launch_kernel_with_shared(
        kernel, grid, dim3(kThreads), static_cast<size_t>(tile) * k * sizeof(bf16), stream, y + static_cast<int64_t>(n0) * y_stride,
        gate + static_cast<int64_t>(n0) * gate_stride, up + static_cast<int64_t>(n0) * up_stride, gate_stride,
        up_stride, w, scale, bias, tile, k, m, y_stride);
    if (err != cudaSuccess) return err;
    n0 += tile;
  }
  return cudaSuccess;
}

// Row tiles of residual (and delta), one launch each; each tile's block 0 writes its rows of new_residual.
template <WeightKind K, bool kAdd>
cudaError_t launch_norm(bf16* y, bf16* new_residual, const bf16* delta, const bf16* residual, int delta_stride,
                        int residual_stride, int new_stride, const bf16* norm_weight, float eps, const uint8_t* w,
                        const float* scale, const bf16* bias, int n, int k, int m, int y_stride,
                        cudaStream_t stream) {
  const dim3 grid((m + kWarps - 1) / kWarps);
  for (int n0 = 0; n0 < n;) {
    const int tile = tile_for(n - n0, k, kSmemBytes - kNormScratchBytes);
    if (tile == 0) return cudaErrorInvalidValue;
    const auto kernel = by_tile(tile, add_rms_norm_gemv_kernel<K, 4, kAdd>, add_rms_norm_gemv_kernel<K, 2, kAdd>,
                                add_rms_norm_gemv_kernel<K, 1, kAdd>);
    const cudaError_t err = launch_kernel_with_shared(
        kernel, grid, dim3(kThreads), static_cast<size_t>(tile) * k * sizeof(bf16), stream, y + static_cast<int64_t>(n0) * y_stride,
        kAdd ? new_residual + static_cast<int64_t>(n0) * new_stride : nullptr,
        kAdd ? delta + static_cast<int64_t>(n0) * delta_stride : nullptr,
        residual + static_cast<int64_t>(n0) * residual_stride, delta_stride, residual_stride, new_stride,
        norm_weight, eps, w, scale, bias, tile, k, m, y_stride);
    if (err != cudaSuccess) return err;
    n0 += tile;
  }
  return cudaSuccess;
}

template <WeightKind K>
cudaError_t launch_norm_kind(bf16* y, bf16* new_residual, const bf16* delta, const bf16* residual,
                             int delta_stride, int residual_stride, int new_stride, const bf16* norm_weight,
                             float eps, const uint8_t* w, const float* scale, const bf16* bias, int n, int k,
                             int m, int y_stride, cudaStream_t stream) {
  if (delta != nullptr) {
    return launch_norm<K, true>(y, new_residual, delta, residual, delta_stride, residual_stride, new_stride,
                                norm_weight, eps, w, scale, bias, n, k, m, y_stride, stream);
  }
  return launch_norm<K, false>(y, nullptr, nullptr, residual, 0, residual_stride, 0, norm_weight, eps, w, scale,
                               bias, n, k, m, y_stride, stream);
}

}  // namespace

cudaError_t silu_mul_gemv(void* y, const void* gate, const void* up, int gate_stride, int up_stride, const void* w,
                          const float* scale, const void* bias, int n, int k, int m, int y_stride,
                          WeightKind kind, cudaStream_t stream) {
  if (!shape_ok(k, gate_stride, up_stride, kind) || tile_for(1, k, kSmemBytes) == 0) return cudaErrorInvalidValue;
  if (n == 0 || m == 0) return cudaSuccess;
  auto* yb = static_cast<bf16*>(y);
  auto* gb = static_cast<const bf16*>(gate);
  auto* ub = static_cast<const bf16*>(up);
  auto* wb = static_cast<const uint8_t*>(w);
  auto* bb = static_cast<const bf16*>(bias);
  switch (kind) {
    case WeightKind::kBf16:
      return launch_silu<WeightKind::kBf16>(yb, gb, ub, gate_stride, up_stride, wb, scale, bb, n, k, m, y_stride,
                                            stream);
    case WeightKind::kInt8:
      return launch_silu<WeightKind::kInt8>(yb, gb, ub, gate_stride, up_stride, wb, scale, bb, n, k, m, y_stride,
                                            stream);
    case WeightKind::kFp8E4M3:
      return launch_silu<WeightKind::kFp8E4M3>(yb, gb, ub, gate_stride, up_stride, wb, scale, bb, n, k, m,
                                               y_stride, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t add_rms_norm_gemv(void* y, void* new_residual, const void* delta, const void* residual,
                              int delta_stride, int residual_stride, int new_stride, const void* norm_weight,
                              float eps, const void* w, const float* scale, const void* bias, int n, int k, int m,
                              int y_stride, WeightKind kind, cudaStream_t stream) {
  const bool add = delta != nullptr;
  if (!shape_ok(k, residual_stride, add ? delta_stride : 0, kind) || k > kThreads * 8 * kNormVecs ||
      (add && (new_residual == nullptr || new_stride % 8 != 0))) {
    return cudaErrorInvalidValue;
  }
  if (n == 0) return cudaSuccess;
  if (m == 0 && add) return cudaErrorInvalidValue;  // no block would write new_residual
  if (m == 0) return cudaSuccess;
  auto* yb = static_cast<bf16*>(y);
  auto* nb = static_cast<bf16*>(new_residual);
  auto* db = static_cast<const bf16*>(delta);
  auto* rb = static_cast<const bf16*>(residual);
  auto* gb = static_cast<const bf16*>(norm_weight);
  auto* wb = static_cast<const uint8_t*>(w);
  auto* bb = static_cast<const bf16*>(bias);
  switch (kind) {
    case WeightKind::kBf16:
      return launch_norm_kind<WeightKind::kBf16>(yb, nb, db, rb, delta_stride, residual_stride, new_stride, gb, eps,
                                                 wb, scale, bb, n, k, m, y_stride, stream);
    case WeightKind::kInt8:
      return launch_norm_kind<WeightKind::kInt8>(yb, nb, db, rb, delta_stride, residual_stride, new_stride, gb, eps,
                                                 wb, scale, bb, n, k, m, y_stride, stream);
    case WeightKind::kFp8E4M3:
      return launch_norm_kind<WeightKind::kFp8E4M3>(yb, nb, db, rb, delta_stride, residual_stride, new_stride, gb,
                                                    eps, wb, scale, bb, n, k, m, y_stride, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace q3tts

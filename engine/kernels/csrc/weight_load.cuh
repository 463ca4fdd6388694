// What the weight-streaming kernels share: the GEMV's weight loads (gemv.cu: 16-byte loads through the read-only
// path, not allocated in L1, since a kernel reads each chunk once (run 79: fast frame loop RTF 0.0298 -> 0.0295),
// ranked in the L2 by an eviction policy: launchers.h, `gemv`'s l2_keep), and how a weight row's product is
// rounded, which the tensor-core products (tensor_core_linear.cu) share with the GEMV.
#pragma once

#include <stdint.h>

#include "common.cuh"

namespace q3tts {

// How a kernel's weight loads rank in the L2: the weight's first keep_bytes evict_last, the rest evict_first;
// total_bytes 0 leaves the loads unhinted (evict_normal).
struct L2Priority {
  uint32_t keep_bytes;
  uint32_t total_bytes;
};

// The L2Priority of a weight of `bytes` for a launcher's l2_keep (< 0: no hint). createpolicy takes 32-bit
// sizes, so a weight over 4 GB loads unhinted (a hint never changes the product).
inline L2Priority l2_priority(int64_t l2_keep, int64_t bytes) {
  const bool hinted = l2_keep >= 0 && bytes <= UINT32_MAX;
  return hinted ? L2Priority{static_cast<uint32_t>(l2_keep < bytes ? l2_keep : bytes), static_cast<uint32_t>(bytes)}
                : L2Priority{0, 0};
}

__device__ __forceinline__ uint64_t weight_policy(const void* w, L2Priority l2) {
  uint64_t policy;
  if (l2.total_bytes == 0) {
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(policy));
  } else if (l2.keep_bytes == 0) {
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  } else if (l2.keep_bytes >= l2.total_bytes) {
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  } else {
    asm volatile("createpolicy.range.global.L2::evict_last.L2::evict_first.b64 %0, [%1], %2, %3;"
                 : "=l"(policy)
                 : "l"(w), "r"(l2.keep_bytes), "r"(l2.total_bytes));
  }
  return policy;
}

// A 16-byte weight chunk, ranked in the L2 by `policy`.
__device__ __forceinline__ uint4 load_weight(const uint4* p, uint64_t policy) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(policy));
  return v;
}

// A weight row's scale (8-bit weights' per-row scale, or 1 where `scale` is null) and bias (0 where null).
// They are weights: a kernel loads them before it waits for the previous kernel (launch.cuh), so that the
// load's round trip is not added to the kernel's tail after its dot products.
struct RowFactors {
  float scale;
  float bias;
};

__device__ __forceinline__ RowFactors row_factors(const float* scale, const bf16* bias, int row) {
  return {scale != nullptr ? load_before_wait(scale + row) : 1.0f,
          bias != nullptr ? to_f(load_before_wait(bias + row)) : 0.0f};
}

// A weight row's product as the weight-streaming kernels round it: bf16(sum * scale + bias), sum its fp32 dot
// product with an activation row.
__device__ __forceinline__ bf16 scaled(float sum, RowFactors factors) {
  return to_bf(fmaf(sum, factors.scale, factors.bias));
}

// The same, loading the factors where it is (after the wait: the tensor-core products' epilogue).
__device__ __forceinline__ bf16 scaled(float sum, const float* scale, const bf16* bias, int row) {
  return scaled(sum, RowFactors{scale != nullptr ? scale[row] : 1.0f, bias != nullptr ? to_f(bias[row]) : 0.0f});
}

// SiLU(gate) * up of the two rounded products, with swiglu.cu's expression.
__device__ __forceinline__ bf16 swiglu_of(bf16 gate_product, bf16 up_product) {
  const float gate = to_f(gate_product);
  return to_bf(round_bf(gate / (1.0f + expf(-gate))) * to_f(up_product));
}

}  // namespace q3tts

// Shared device helpers: 16-byte vector access, warp/block reductions, bf16 rounding that mirrors torch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace q3tts {

using bf16 = __nv_bfloat16;

// Eight bf16 values moved as one 16-byte access.
struct alignas(16) Bf16x8 {
  bf16 v[8];
};

__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ bf16 to_bf(float x) { return __float2bfloat16_rn(x); }
// One torch bf16 elementwise op: compute in fp32, round once to bf16, return as float.
__device__ __forceinline__ float round_bf(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// An element of a kernel templated on float32 or bf16, read as float32, and a float32 stored as one (rounded
// to nearest for bf16).
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(bf16 v) { return to_f(v); }
__device__ __forceinline__ void store_float(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_float(bf16* p, float v) { *p = to_bf(v); }

// Programmatic dependent launch (launch.cuh), device side. `wait_for_previous_kernel` returns once the previous
// kernel in the stream has finished and its writes are visible; `allow_next_kernel` lets the next kernel's
// blocks be scheduled now (they run up to their own wait). Both are no-ops without a programmatic dependency.
__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_next_kernel() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// First statement of every kernel started by `launch_kernel` that reads nothing before its inputs are ready:
// wait for the previous kernel, then let the next one be scheduled. Before this point a kernel must not read
// or write global memory. (The GEMVs instead start loading their weights, which no kernel writes, first.)
__device__ __forceinline__ void begin_dependent_kernel() {
  wait_for_previous_kernel();
  allow_next_kernel();
}

// Loads of data no kernel writes (weights, norm weights, RoPE tables, index inputs: launch.cuh) that a kernel
// makes before `wait_for_previous_kernel`, so that their round trips overlap the previous kernel. They are
// coherent loads (ld.global): ptxas moves the wait above non-coherent loads (ld.global.nc, what nvcc makes of
// a `const __restrict__` pointer's reads) of the same basic block, so such a load written before the wait is
// issued after it (seen in the SASS of CUDA 13.0); it never moves the wait above a coherent load.
__device__ __forceinline__ Bf16x8 load_before_wait(const Bf16x8* p) {
  uint4 v;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return *reinterpret_cast<const Bf16x8*>(&v);
}

__device__ __forceinline__ float load_before_wait(const float* p) {
  float v;
  asm volatile("ld.global.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}

__device__ __forceinline__ bf16 load_before_wait(const bf16* p) {
  unsigned short v;
  asm volatile("ld.global.b16 %0, [%1];" : "=h"(v) : "l"(p));
  return __ushort_as_bfloat16(v);
}

__device__ __forceinline__ int64_t load_before_wait(const int64_t* p) {
  int64_t v;
  asm volatile("ld.global.s64 %0, [%1];" : "=l"(v) : "l"(p));
  return v;
}

// The shared-memory window address of a pointer into shared memory, as PTX shared-state spaces take it.
__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// A 16-byte copy from global to shared memory that does not wait for its data (cp.async, sm_80+), and the
// wait for all of this thread's copies.
__device__ __forceinline__ void copy_async_16(void* shared, const void* global) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_address(shared)), "l"(global));
#else
  *static_cast<Bf16x8*>(shared) = *static_cast<const Bf16x8*>(global);
#endif
}

__device__ __forceinline__ void wait_async_copies() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

// Bulk copies (TMA, sm_90+): one instruction moves `bytes` (a multiple of 16, both addresses 16-byte aligned) from
// global memory to this block's shared memory, with no per-thread addresses, and counts them on a shared-memory
// barrier (mbarrier). A barrier's phase ends once its one arrival (`expect_copy_bytes`, which also announces the
// phase's bytes) has come and all those bytes have landed; threads wait for a phase by its parity.

// Once per block, before the barrier is used (then a __syncthreads).
__device__ __forceinline__ void init_copy_barrier(uint64_t* barrier) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(shared_address(barrier)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void expect_copy_bytes(uint64_t* barrier, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(barrier)), "r"(bytes)
               : "memory");
#endif
}

__device__ __forceinline__ void copy_bulk(void* shared, const void* global, uint32_t bytes, uint64_t* barrier) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   shared_address(shared)),
               "l"(global), "r"(bytes), "r"(shared_address(barrier))
               : "memory");
#endif
}

__device__ __forceinline__ void wait_copy_barrier(uint64_t* barrier, uint32_t parity) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(shared_address(barrier)),
      "r"(parity)
      : "memory");
#endif
}

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Block-wide reduction of one float a thread by `WarpReduce` (warp_sum or warp_max); every thread gets the
// result. `scratch` holds one float per warp (<= 32); `identity` stands in for the lanes past the last warp.
template <float (*WarpReduce)(float)>
__device__ __forceinline__ float block_reduce(float v, float* scratch, float identity) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
  v = WarpReduce(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return WarpReduce(lane < warps ? scratch[lane] : identity);
}

__device__ __forceinline__ float block_sum(float v, float* scratch) {
  return block_reduce<warp_sum<float>>(v, scratch, 0.0f);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  return block_reduce<warp_max>(v, scratch, -INFINITY);
}

}  // namespace q3tts

// Kernel launches with programmatic dependent launch (PDL, Hopper and later).
//
// Why: a decode frame is ~1,100 small kernels replayed from one CUDA graph, and between two dependent
// kernels the GPU idles for the launch of the second (about 1-1.5 us a node on the H200, a quarter of a
// frame). With PDL the next kernel's blocks are scheduled while the previous kernel finishes, and wait in
// `begin_dependent_kernel` (device side, common.cuh) until its results are visible, so launch latency
// overlaps work. Graph capture keeps the dependency as a programmatic edge.
//
// Contract for every kernel launched here: call `wait_for_previous_kernel()` (common.cuh; most kernels call
// `begin_dependent_kernel()`, which also lets the next kernel be scheduled) before reading anything a kernel
// writes or writing anything. Before it a kernel may read only:
// - data no kernel writes: the weights, norm weights, RoPE tables;
// - the int64 index inputs (positions, slots, lengths), which only torch ops and host copies write. A kernel
//   launched without dependent launch (every torch op) starts after its predecessor has finished and lets
//   the next kernel start only once it has finished itself, so whatever ran before the chain of dependent
//   kernels a kernel belongs to (a graph's static inputs, loaded before the replay; an index made by a torch
//   op) is complete and visible when that kernel starts.
// The Triton kernels of the same chains (the 33-64-row products, the codec's implicit-GEMM conv) are launched
// dependently too, under the same switch and contract (kernels/triton_dependent.py).
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace q3tts {

// Process-wide switch (benchmarks compare graphs captured with and without it); on by default where the
// device supports it.
inline bool& dependent_launch_enabled() {
  static bool enabled = true;
  return enabled;
}

inline bool device_supports_dependent_launch() {
  int device = 0;
  int major = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return false;
  return major >= 9;
}

// A launch with `shared_bytes` of dynamic shared memory, its blocks grouped in thread block clusters of
// `cluster_y` blocks along y when cluster_y > 1 (Hopper and later; the grid's y must be a multiple of it).
template <typename... KernelArgs, typename... Args>
cudaError_t launch_kernel_clustered(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t shared_bytes,
                                    unsigned cluster_y, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[2];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed =
      dependent_launch_enabled() && device_supports_dependent_launch() ? 1 : 0;
  config.attrs = attribute;
  config.numAttrs = 1;
  if (cluster_y > 1) {
    attribute[1].id = cudaLaunchAttributeClusterDimension;
    attribute[1].val.clusterDim.x = 1;
    attribute[1].val.clusterDim.y = cluster_y;
    attribute[1].val.clusterDim.z = 1;
    config.numAttrs = 2;
  }
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

template <typename... KernelArgs, typename... Args>
cudaError_t launch_kernel_shared(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t shared_bytes,
                                 cudaStream_t stream, Args&&... args) {
  return launch_kernel_clustered(kernel, grid, block, shared_bytes, 1, stream, std::forward<Args>(args)...);
}

template <typename... KernelArgs, typename... Args>
cudaError_t launch_kernel(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, cudaStream_t stream,
                          Args&&... args) {
  return launch_kernel_shared(kernel, grid, block, 0, stream, std::forward<Args>(args)...);
}

}  // namespace q3tts

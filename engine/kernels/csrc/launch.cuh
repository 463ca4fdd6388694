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
// writes or writing anything; only data no kernel writes (the weights) may be read before it.
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

// Process-wide L2 persisting window for kernels launched from now on (graphs keep what was set when they were
// captured): accesses to [base, base + bytes) are cached as persisting with probability hit_ratio, so a part
// of weights that a frame re-reads (the code predictor's, 15 times) stays in the set-aside L2 between reads.
// Empty (bytes 0) by default: no attribute.
struct L2Window {
  void* base = nullptr;
  size_t bytes = 0;
  float hit_ratio = 0.0f;
};

inline L2Window& l2_persisting_window() {
  static L2Window window;
  return window;
}

template <typename... KernelArgs, typename... Args>
cudaError_t launch_kernel_shared(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t shared_bytes,
                                 cudaStream_t stream, Args&&... args) {
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
  const L2Window& window = l2_persisting_window();
  if (window.bytes > 0) {
    attribute[1].id = cudaLaunchAttributeAccessPolicyWindow;
    attribute[1].val.accessPolicyWindow.base_ptr = window.base;
    attribute[1].val.accessPolicyWindow.num_bytes = window.bytes;
    attribute[1].val.accessPolicyWindow.hitRatio = window.hit_ratio;
    attribute[1].val.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
    attribute[1].val.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
    config.numAttrs = 2;
  }
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

template <typename... KernelArgs, typename... Args>
cudaError_t launch_kernel(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, cudaStream_t stream,
                          Args&&... args) {
  return launch_kernel_shared(kernel, grid, block, 0, stream, std::forward<Args>(args)...);
}

}  // namespace q3tts

"""What a dependent step costs on this GPU, the number a persistent predictor kernel must beat: per kernel in
a CUDA graph of tiny kernels (plain launches and programmatic dependent launch), per grid-wide barrier inside
one cooperative kernel (cooperative_groups and a hand-rolled atomic barrier), and the bandwidth one kernel
reaches streaming 4-64 MB, alone and as a chain of such kernels (the frame's GEMVs stream 4-48 MB each).

Builds a small extension with torch.utils.cpp_extension.load_inline (ninja, sm_90a). Usage:
python benchmarks/device/sync_costs.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.cpp_extension import load_inline

from qwen3_tts_native.commands.bench import replay_ms

CUDA_SOURCE = r"""
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <cstdint>

namespace {

__device__ __forceinline__ void dependent_begin() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

__global__ void tiny_kernel(int* flag) {
  dependent_begin();
  if (threadIdx.x == 0 && blockIdx.x == 0) atomicAdd(flag, 1);
}

__global__ void cg_barriers_kernel(int* flag, int n) {
  auto grid = cooperative_groups::this_grid();
  for (int i = 0; i < n; ++i) grid.sync();
  if (threadIdx.x == 0 && blockIdx.x == 0) atomicAdd(flag, n);
}

// Sense-free barrier on a monotonically growing counter: arrival i waits for count >= (i + 1) * blocks.
__global__ void atomic_barriers_kernel(unsigned int* counter, int n) {
  const unsigned int blocks = gridDim.x;
  for (int i = 0; i < n; ++i) {
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(counter, 1u);
      const unsigned int target = (i + 1) * blocks;
      while (atomicAdd(counter, 0u) < target) {
      }
      __threadfence();
    }
    __syncthreads();
  }
}

__global__ void stream_kernel(const uint4* data, int64_t vecs, float* out) {
  dependent_begin();
  float acc = 0.0f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < vecs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint4 v = __ldg(data + i);
    acc += __uint_as_float(v.x) + __uint_as_float(v.y) + __uint_as_float(v.z) + __uint_as_float(v.w);
  }
  if (acc == 12345.0f) out[0] = acc;  // keeps the loads; never true for the zeroed buffer
}

template <typename... Args>
void launch(void (*kernel)(Args...), dim3 grid, dim3 block, bool dependent, cudaStream_t stream,
            Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = dependent ? 1 : 0;
  cudaLaunchKernelEx(&config, kernel, args...);
}

}  // namespace

void launch_tiny_chain(int* flag, int n, bool dependent, int blocks, cudaStream_t stream) {
  for (int i = 0; i < n; ++i) launch(tiny_kernel, dim3(blocks), dim3(128), dependent, stream, flag);
}

void launch_cg_barriers(int* flag, int n, int blocks, cudaStream_t stream) {
  void* args[] = {&flag, &n};
  cudaLaunchCooperativeKernel(reinterpret_cast<void*>(cg_barriers_kernel), dim3(blocks), dim3(128), args, 0,
                              stream);
}

void launch_atomic_barriers(unsigned int* counter, int n, int blocks, cudaStream_t stream) {
  atomic_barriers_kernel<<<blocks, 128, 0, stream>>>(counter, n);
}

void launch_stream_chain(const void* data, int64_t bytes, int n, bool dependent, int blocks, float* out,
                         cudaStream_t stream) {
  const auto* base = static_cast<const uint4*>(data);
  const int64_t vecs = bytes / 16;
  for (int i = 0; i < n; ++i) {
    launch(stream_kernel, dim3(blocks), dim3(256), dependent, stream, base + i * vecs, vecs, out);
  }
}
"""

CPP_SOURCE = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

void launch_tiny_chain(int* flag, int n, bool dependent, int blocks, cudaStream_t stream);
void launch_cg_barriers(int* flag, int n, int blocks, cudaStream_t stream);
void launch_atomic_barriers(unsigned int* counter, int n, int blocks, cudaStream_t stream);
void launch_stream_chain(const void* data, int64_t bytes, int n, bool dependent, int blocks, float* out,
                         cudaStream_t stream);

void tiny_chain(at::Tensor flag, int64_t n, bool dependent, int64_t blocks) {
  launch_tiny_chain(flag.data_ptr<int>(), n, dependent, blocks, c10::cuda::getCurrentCUDAStream());
}
void cg_barriers(at::Tensor flag, int64_t n, int64_t blocks) {
  launch_cg_barriers(flag.data_ptr<int>(), n, blocks, c10::cuda::getCurrentCUDAStream());
}
void atomic_barriers(at::Tensor counter, int64_t n, int64_t blocks) {
  launch_atomic_barriers(reinterpret_cast<unsigned int*>(counter.data_ptr<int>()), n, blocks,
                         c10::cuda::getCurrentCUDAStream());
}
void stream_chain(at::Tensor data, int64_t bytes, int64_t n, bool dependent, int64_t blocks, at::Tensor out) {
  TORCH_CHECK(data.numel() * data.element_size() >= bytes * n, "buffer too small");
  launch_stream_chain(data.data_ptr(), bytes, n, dependent, blocks, out.data_ptr<float>(),
                      c10::cuda::getCurrentCUDAStream());
}
"""

FUNCTIONS = ["tiny_chain", "cg_barriers", "atomic_barriers", "stream_chain"]
CHAIN = 500
MB = 1 << 20


def graph_us_per_step(run: Any, steps: int) -> float:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return replay_ms(graph, 10) * 1000 / steps


def eager_us_per_step(run: Any, steps: int, repeats: int = 5) -> float:
    run()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        run()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats / steps * 1e6


def main() -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    ext: Any = load_inline(
        "q3tts_sync_costs",
        cpp_sources=CPP_SOURCE,
        cuda_sources=CUDA_SOURCE,
        functions=FUNCTIONS,
        extra_cuda_cflags=["-O3", "-gencode=arch=compute_90a,code=sm_90a"],
    )
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    result: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "sms": sms}
    for blocks in (sms, 4 * sms):
        for dependent in (False, True):
            key = f"tiny_kernel_us_{blocks}_blocks_{'dependent' if dependent else 'plain'}"
            result[key] = round(
                graph_us_per_step(lambda b=blocks, d=dependent: ext.tiny_chain(flag, CHAIN, d, b), CHAIN), 3
            )
    for blocks in (sms, 2 * sms):
        result[f"cg_grid_sync_us_{blocks}_blocks"] = round(
            eager_us_per_step(lambda b=blocks: ext.cg_barriers(flag, 2000, b), 2000), 3
        )
        counter = torch.zeros(1, dtype=torch.int32, device="cuda")
        result[f"atomic_barrier_us_{blocks}_blocks"] = round(
            eager_us_per_step(lambda b=blocks, c=counter: (c.zero_(), ext.atomic_barriers(c, 2000, b)), 2000),
            3,
        )
    buffer = torch.zeros(1024 * MB, dtype=torch.uint8, device="cuda")
    out = torch.zeros(1, device="cuda")
    for size_mb in (4, 8, 16, 48, 64):
        n = max(1, 960 // size_mb)
        for dependent in (False, True):
            us = graph_us_per_step(
                lambda s=size_mb, k=n, d=dependent: ext.stream_chain(buffer, s * MB, k, d, 4 * sms, out), n
            )
            key = f"stream_{size_mb}MB_{'dependent' if dependent else 'plain'}"
            result[key] = {"us_per_kernel": round(us, 2), "gbps": round(size_mb * MB / us / 1e3, 1)}
    print(json.dumps(result, indent=1), flush=True)
    (args.out / "sync-costs.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

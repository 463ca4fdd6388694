"""What a kernel boundary costs in a CUDA graph with dependent launch, against a grid-wide barrier inside one
persistent kernel, on this GPU.

Why: the code predictor is latency-bound (runs 49 and 51): its ~22 kernels a step cost 4-7 us each whatever
they read. A persistent kernel per predictor step would replace those boundaries with grid-wide barriers;
that pays only if a barrier is cheaper than a boundary. Both are measured here on trivial work: every block
reads the value the previous link (or phase) wrote and block 0 writes it plus one, so each link really
depends on the last (the final value is checked).

- chain: N kernels of B blocks x 128 threads captured in one graph, launched as the engine launches its
  kernels (launch.cuh), with and without dependent launch; the time a link.
- barrier: one kernel of B blocks (at most what fits on the GPU at once) that runs N phases separated by a
  grid-wide barrier (an arrival counter in global memory, acquire loads); the time a phase.

Usage: python benchmarks/device/barrier_cost.py --out DIR [--links 256]
(compiles a small extension with torch's load_inline, ~40 s; writes barrier-cost.json)
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import torch
from torch.utils.cpp_extension import load_inline

from qwen3_tts_native.engine.kernels.loader import CSRC, arch_flags

CUDA_SOURCE = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

#include "common.cuh"
#include "launch.cuh"

namespace {

// A link: every block reads the previous link's value (slot `parity`), block 0 writes it + 1 to the other.
__global__ void link_kernel(int* values, int parity) {
  q3tts::allow_next_kernel();
  q3tts::wait_for_previous_kernel();
  __shared__ int seen;
  if (threadIdx.x == 0) seen = reinterpret_cast<volatile int*>(values)[parity];
  __syncthreads();
  if (blockIdx.x == 0 && threadIdx.x == 0) values[parity ^ 1] = seen + 1;
}

__device__ __forceinline__ unsigned load_acquire(const unsigned* address) {
  unsigned value;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(value) : "l"(address) : "memory");
  return value;
}

// `phases` phases of a link's work, a grid-wide barrier after each: the block's thread 0 publishes its
// writes (fence), counts its arrival and spins until every block of the phase has arrived. A barrier that
// waits more than ~2 s gives up and flags it (status[0] = 1), and every block then stops, instead of hanging
// the device.
__global__ void barrier_kernel(int* values, unsigned* arrivals, int* status, int phases) {
  __shared__ int seen, stop;
  for (int p = 0; p < phases; ++p) {
    if (threadIdx.x == 0) seen = reinterpret_cast<volatile int*>(values)[p & 1];
    __syncthreads();
    if (blockIdx.x == 0 && threadIdx.x == 0) reinterpret_cast<volatile int*>(values)[(p & 1) ^ 1] = seen + 1;
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(arrivals, 1u);
      const unsigned target = static_cast<unsigned>(p + 1) * gridDim.x;
      const long long start = clock64();
      unsigned spins = 0;
      while (load_acquire(arrivals) < target) {
        if ((++spins & 1023u) != 0) continue;
        if (clock64() - start > 4000000000LL || *reinterpret_cast<volatile int*>(status)) {
          status[0] = 1;
          break;
        }
      }
      stop = *reinterpret_cast<volatile int*>(status);
    }
    __syncthreads();
    if (stop) return;
  }
}

}  // namespace

void chain(torch::Tensor values, int64_t links, int64_t blocks, bool dependent) {
  q3tts::dependent_launch_enabled() = dependent;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  for (int64_t i = 0; i < links; ++i) {
    const cudaError_t err = q3tts::launch_kernel(link_kernel, dim3(blocks), dim3(128), stream,
                                                 values.data_ptr<int>(), static_cast<int>(i & 1));
    TORCH_CHECK(err == cudaSuccess, cudaGetErrorString(err));
  }
}

void barrier(torch::Tensor values, torch::Tensor arrivals, torch::Tensor status, int64_t phases,
             int64_t blocks) {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  barrier_kernel<<<blocks, 128, 0, stream>>>(values.data_ptr<int>(),
                                             reinterpret_cast<unsigned*>(arrivals.data_ptr<int>()),
                                             status.data_ptr<int>(), static_cast<int>(phases));
  TORCH_CHECK(cudaGetLastError() == cudaSuccess, "barrier_kernel launch failed");
}

int64_t resident_blocks() {
  int device = 0, sms = 0, per_sm = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, barrier_kernel, 128, 0);
  return static_cast<int64_t>(sms) * per_sm;
}
"""

CPP_SOURCE = """
void chain(torch::Tensor values, int64_t links, int64_t blocks, bool dependent);
void barrier(torch::Tensor values, torch::Tensor arrivals, torch::Tensor status, int64_t phases,
             int64_t blocks);
int64_t resident_blocks();
"""

REPEATS = 20


def timed_ms(run: Any) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end))


def chain_us(ext: Any, links: int, blocks: int, dependent: bool) -> float:
    """Microseconds a link, the median of REPEATS replays of one graph of `links` links."""
    values = torch.zeros(2, dtype=torch.int32, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        ext.chain(values, links, blocks, dependent)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ext.chain(values, links, blocks, dependent)
    times = []
    for _ in range(REPEATS):
        values.zero_()
        times.append(timed_ms(graph.replay))
        assert int(values[links % 2]) == links, "a link did not see its predecessor's write"
    return statistics.median(times) * 1000 / links


def barrier_us(ext: Any, phases: int, blocks: int) -> float:
    """Microseconds a phase, the median of REPEATS launches of one persistent kernel."""
    values = torch.zeros(2, dtype=torch.int32, device="cuda")
    arrivals = torch.zeros(1, dtype=torch.int32, device="cuda")
    status = torch.zeros(1, dtype=torch.int32, device="cuda")
    times = []
    for _ in range(REPEATS + 1):
        values.zero_()
        arrivals.zero_()
        times.append(timed_ms(lambda: ext.barrier(values, arrivals, status, phases, blocks)))
        assert int(status[0]) == 0, "a grid barrier timed out"
        assert int(values[phases % 2]) == phases, "a phase did not see the previous phase's write"
    return statistics.median(times[1:]) * 1000 / phases


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for barrier-cost.json")
    parser.add_argument(
        "--links", type=int, default=256, help="links in a chain, phases in a persistent kernel"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    capability = torch.cuda.get_device_capability()
    ext = load_inline(
        name="q3tts_barrier_cost",
        cpp_sources=CPP_SOURCE,
        cuda_sources=CUDA_SOURCE,
        functions=["chain", "barrier", "resident_blocks"],
        extra_include_paths=[str(CSRC)],
        extra_cuda_cflags=["-O3", *arch_flags(capability)],
    )
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    resident = int(ext.resident_blocks())
    result: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "sms": sms}
    result["resident_blocks"] = resident
    result["chain_us_per_link"] = {
        f"{blocks}_blocks_{'dependent' if dependent else 'plain'}": chain_us(
            ext, args.links, blocks, dependent
        )
        for blocks in (sms, 4 * sms, 1024)
        for dependent in (True, False)
    }
    result["barrier_us_per_phase"] = {
        f"{blocks}_blocks": barrier_us(ext, args.links, blocks)
        for blocks in sorted({sms, min(2 * sms, resident)})
    }
    print(json.dumps(result, indent=1), flush=True)
    (args.out / "barrier-cost.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What the transposed convs' reorder costs: the GEMM's [(channel, phase), (stream, frame)] rows put in
(channel, stream, frame, phase) order with the bias added (`conv_transpose1d_as_gemm`'s `torch.add(out=)`),
against a plain copy of the same bytes and a tiled kernel (a block stages one channel's phases for a run of
columns in shared memory, then writes them in order: reads and writes both coalesced). The four decoder
blocks' shapes of one packet, captured in one CUDA graph per variant, bf16 (fast) and float32 (exact), at 1,
16 and 64 streams; the kernel's output is checked against torch's (bit-identical: one rounding of a + b).

Why: run 137's op profile put the reorders at ~0.28 ms of the 6.84 ms fast 64-stream packet; a copy of their
bytes at the H200's bandwidth is ~0.12 ms. Measure what a better kernel could win before building it.

Usage: python benchmarks/device/transposed_reorder_cost.py --out DIR (compiles a small extension, ~40 s)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from torch.utils.cpp_extension import load_inline

from qwen3_tts_native.commands.bench import replay_ms
from qwen3_tts_native.engine.kernels.loader import CSRC, arch_flags

# (in channels, out channels, rate, input frames a stream) of the four decoder blocks for a 4-frame packet
BLOCKS = ((1536, 768, 8, 16), (768, 384, 5, 128), (384, 192, 4, 640), (192, 96, 3, 2560))
STREAMS = (1, 16, 64)

CPP_SOURCE = "void reorder(torch::Tensor blocks, torch::Tensor bias, torch::Tensor out, int64_t stride);"
CUDA_SOURCE = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

constexpr int kThreads = 256;

// blocks [O, s, N] (rows (o, r)), bias [O * s], out [O, N, s]:
// out[o, n, r] = blocks[o, r, n] + bias[o * s + r].
template <typename T>
__global__ void reorder_kernel(const T* __restrict__ blocks, const T* __restrict__ bias, T* __restrict__ out,
                               int stride, long long columns) {
  extern __shared__ unsigned char raw[];
  T* staged = reinterpret_cast<T*>(raw);  // [s][kThreads]
  const int o = blockIdx.y;
  const long long first = (long long)blockIdx.x * kThreads;
  const int count = (int)min((long long)kThreads, columns - first);
  const T* source = blocks + (long long)o * stride * columns + first;
  for (int r = 0; r < stride; ++r) {
    if (threadIdx.x < count) {
      staged[r * kThreads + threadIdx.x] = (T)((float)source[(long long)r * columns + threadIdx.x] +
                                               (float)bias[o * stride + r]);
    }
  }
  __syncthreads();
  T* target = out + ((long long)o * columns + first) * stride;
  for (int k = threadIdx.x; k < count * stride; k += kThreads) {
    target[k] = staged[(k % stride) * kThreads + k / stride];
  }
}

void reorder(torch::Tensor blocks, torch::Tensor bias, torch::Tensor out, int64_t stride) {
  const long long columns = blocks.size(1) / stride;
  const int channels = blocks.size(0);
  dim3 grid((columns + kThreads - 1) / kThreads, channels);
  auto stream = at::cuda::getCurrentCUDAStream();
  if (blocks.scalar_type() == at::kFloat) {
    reorder_kernel<float><<<grid, kThreads, stride * kThreads * 4, stream>>>(
        blocks.data_ptr<float>(), bias.data_ptr<float>(), out.data_ptr<float>(), stride, columns);
  } else {
    reorder_kernel<__nv_bfloat16><<<grid, kThreads, stride * kThreads * 2, stream>>>(
        (const __nv_bfloat16*)blocks.data_ptr(), (const __nv_bfloat16*)bias.data_ptr(),
        (__nv_bfloat16*)out.data_ptr(), stride, columns);
  }
}
"""


def torch_reorder(blocks: torch.Tensor, bias: torch.Tensor, out: torch.Tensor, stride: int) -> None:
    """The shipped form (`conv_transpose1d_as_gemm`)."""
    channels = blocks.shape[0] // stride
    ordered = blocks.view(channels, stride, -1).permute(0, 2, 1)
    torch.add(ordered, bias.view(channels, 1, stride), out=out.view(channels, -1, stride))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for transposed-reorder-cost.json")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    ext: Any = load_inline(
        name="q3tts_transposed_reorder",
        cpp_sources=CPP_SOURCE,
        cuda_sources=CUDA_SOURCE,
        functions=["reorder"],
        extra_include_paths=[str(CSRC)],
        extra_cuda_cflags=["-O3", *arch_flags(torch.cuda.get_device_capability())],
    )
    variants = {
        "torch_add": torch_reorder,
        "kernel": lambda b, bias, out, s: ext.reorder(b, bias, out, s),
        "plain_copy": lambda b, bias, out, s: out.view(-1).copy_(b.view(-1)),
    }
    result: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    for dtype in (torch.bfloat16, torch.float32):
        for streams in STREAMS:
            shapes = []
            for _, out_channels, rate, frames in BLOCKS:
                blocks = torch.randn(out_channels * rate, streams * frames, device="cuda", dtype=dtype)
                bias = torch.randn(out_channels, device="cuda", dtype=dtype).repeat_interleave(rate)
                shapes.append((blocks, bias, torch.empty_like(blocks), rate))
            outputs: dict[str, list[torch.Tensor]] = {}
            key = f"{str(dtype).removeprefix('torch.')}_{streams}_streams"
            figures: dict[str, Any] = {}
            for name, variant in variants.items():
                for blocks, bias, out, rate in shapes:
                    variant(blocks, bias, out, rate)
                outputs[name] = [out.clone() for *_, out in shapes]
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    for blocks, bias, out, rate in shapes:
                        variant(blocks, bias, out, rate)
                figures[f"{name}_ms"] = min(replay_ms(graph, 200) for _ in range(3))
            figures["bytes_moved_mb"] = sum(2 * b.numel() * b.element_size() for b, *_ in shapes) / 1e6
            figures["kernel_equals_torch"] = all(
                torch.equal(a, b) for a, b in zip(outputs["kernel"], outputs["torch_add"], strict=True)
            )
            result[key] = figures
            print(key, json.dumps(figures), flush=True)
    (args.out / "transposed-reorder-cost.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

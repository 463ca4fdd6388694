"""Same-process A/B of the fused decode attention (`ops.rope_attention`) against a saved copy of
attention.cu (--baseline-source, e.g. `git show <commit>:engine/kernels/csrc/attention.cu > old/attention.cu`,
with the headers it includes saved beside it when they have changed since: they are searched first): the
microseconds a call takes inside a CUDA graph of chained calls (dependent launch, as a frame runs them), at
the code predictor's (16 positions) and the talker's (4096-position cache) shapes, batch 1 and 64, at several
positions; and the relative L2 difference of the two outputs. Writes attention-ab.json to --out.

Usage: python benchmarks/device/attention_ab.py --baseline-source old.cu --out DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from torch.utils.cpp_extension import load_inline

from qwen3_tts_native.commands.bench import chained_call_us
from qwen3_tts_native.engine.kernels import loader, ops
from qwen3_tts_native.engine.model import layers

BF16 = torch.bfloat16
CSRC = Path(loader.__file__).parent / "csrc"
HEADS, KV_HEADS, HEAD_DIM = 16, 8, 128
CHAIN = 50

BASELINE_BINDING = r"""
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/extension.h>

namespace q3tts {  // the saved kernel's launcher, as it was declared then (launchers.h may have moved on)
cudaError_t rope_attention(void* out, float* workspace, const void* q, const void* k, const void* v,
                           int q_stride, int k_stride, int v_stride, const void* q_norm, const void* k_norm,
                           const void* cos, const void* sin, const int64_t* positions, const int64_t* slots,
                           void* k_cache, void* v_cache, int batch, int q_heads, int kv_heads, int head_dim,
                           int max_len, float eps, float scale, cudaStream_t stream);
}

void rope_attention(at::Tensor out, at::Tensor workspace, at::Tensor q, at::Tensor k, at::Tensor v,
                    at::Tensor q_norm, at::Tensor k_norm, at::Tensor cos, at::Tensor sin,
                    at::Tensor positions, at::Tensor slots, at::Tensor k_cache, at::Tensor v_cache,
                    double eps, double scale) {
  const cudaError_t err = q3tts::rope_attention(
      out.data_ptr(), workspace.numel() ? workspace.data_ptr<float>() : nullptr, q.data_ptr(), k.data_ptr(),
      v.data_ptr(), q.stride(0), k.stride(0), v.stride(0), q_norm.data_ptr(), k_norm.data_ptr(),
      cos.data_ptr(), sin.data_ptr(), positions.data_ptr<int64_t>(), slots.data_ptr<int64_t>(),
      k_cache.data_ptr(), v_cache.data_ptr(), q.size(0), q.size(1) / k_cache.size(3), k_cache.size(1),
      k_cache.size(3), k_cache.size(2), static_cast<float>(eps), static_cast<float>(scale),
      c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, cudaGetErrorString(err));
}
"""


def build_baseline(source: Path) -> Any:
    major, minor = torch.cuda.get_device_capability()
    return load_inline(
        name="q3tts_attention_baseline",
        cpp_sources=[BASELINE_BINDING],
        cuda_sources=[source.read_text()],
        functions=["rope_attention"],
        extra_include_paths=[str(source.parent), str(CSRC)],  # headers saved beside it first
        extra_cuda_cflags=["-O3", *loader.arch_flags((major, minor))],
        verbose=False,
    )


def measure(baseline: Any, batch: int, max_len: int, position: int) -> dict[str, Any]:
    width = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    qkv = torch.randn(batch, width, device="cuda", dtype=BF16)
    q, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=1)
    q_norm = (1 + 0.1 * torch.randn(HEAD_DIM, device="cuda")).to(BF16)
    k_norm = (1 + 0.1 * torch.randn(HEAD_DIM, device="cuda")).to(BF16)
    cos, sin = layers.rope_cos_sin(torch.arange(max_len, device="cuda"), HEAD_DIM, 1e6, BF16)
    positions = torch.full((batch,), position, device="cuda", dtype=torch.int64)
    slots = torch.arange(batch, device="cuda")
    k_cache = torch.randn(batch, KV_HEADS, max_len, HEAD_DIM, device="cuda", dtype=BF16)
    v_cache = torch.randn_like(k_cache)
    scale = HEAD_DIM**-0.5
    ext = loader.load()
    assert ext is not None, loader.load_error()
    size = ext.decode_attention_workspace(batch, HEADS, HEAD_DIM, max_len) if max_len > ops.SHORT_CACHE else 0
    workspace = torch.empty(size, dtype=torch.float32, device="cuda")
    new_out = torch.empty(batch, HEADS * HEAD_DIM, device="cuda", dtype=BF16)
    old_out = torch.empty_like(new_out)
    args = (q, k, v, q_norm, k_norm, cos, sin, positions, slots, k_cache, v_cache, 1e-6, scale)

    def new() -> None:
        ext.rope_attention(new_out, workspace if size else None, *args)

    def old() -> None:
        baseline.rope_attention(old_out, workspace, *args)

    new()
    old()
    torch.cuda.synchronize()
    difference = float((new_out.float() - old_out.float()).norm() / old_out.float().norm())
    identical = torch.equal(new_out, old_out)
    return {
        "batch": batch,
        "max_len": max_len,
        "position": position,
        "baseline_us": chained_call_us(old, CHAIN),
        "new_us": chained_call_us(new, CHAIN),
        "relative_l2_difference": difference,
        "bit_identical": identical,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--baseline-source", type=Path, required=True, help="a saved attention.cu to compare with"
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for attention-ab.json")
    options = parser.parse_args()
    torch.manual_seed(0)
    baseline = build_baseline(options.baseline_source)
    cases = [(b, 16, p) for b in (1, 4, 16, 64) for p in (2, 8, 15)]
    cases += [(b, 512, p) for b in (1, 64) for p in (150, 250)]
    cases += [(b, 4096, p) for b in (1, 4, 16, 64) for p in (100, 300, 1000)]
    rows = []
    for batch, max_len, position in cases:
        row = measure(baseline, batch, max_len, position)
        rows.append(row)
        print(json.dumps(row), flush=True)
    options.out.mkdir(parents=True, exist_ok=True)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "chain": CHAIN, "cases": rows}
    (options.out / "attention-ab.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""What the transposed convs' reorder costs: the GEMM's [(channel, phase), (stream, frame)] rows put in
(channel, stream, frame, phase) order with the bias added, as torch's add over the permuted view
(`reference.interleave_phases`, the form before adb248a) and as our kernel `ops.interleave_phases` (unfold.cu
says how it stages and writes), against a plain copy of the same bytes (the floor). The four decoder
blocks' shapes of one packet, captured in one CUDA graph per variant, bf16 (fast) and float32 (exact), at 1,
16 and 64 streams; the kernel's output is checked against torch's (bit-identical: one rounding of a + b).

Why: run 137's op profile put the reorders at ~0.28 ms of the 6.84 ms fast 64-stream packet; a copy of their
bytes at the H200's bandwidth is ~0.12 ms.

Usage: python benchmarks/device/transposed_reorder_cost.py --out DIR (after
`python -m qwen3_tts_native.engine.kernels build`)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import torch
from common import measurement_parser

from qwen3_tts_native.commands.bench import replay_ms
from qwen3_tts_native.engine.kernels import ops, reference

# (in channels, out channels, rate, input frames a stream) of the four decoder blocks for a 4-frame packet
BLOCKS = ((1536, 768, 8, 16), (768, 384, 5, 128), (384, 192, 4, 640), (192, 96, 3, 2560))
STREAMS = (1, 16, 64)

Reorder = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


def main() -> int:
    args = measurement_parser(__doc__, modes=False, model=False).parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not ops.kernels_available():
        raise SystemExit("the CUDA extension is not built: python -m qwen3_tts_native.engine.kernels build")
    variants: dict[str, Reorder] = {
        "torch_add": reference.interleave_phases,
        "kernel": ops.interleave_phases,
        "plain_copy": lambda rows, bias, phases: rows.clone(),
    }
    result: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    for dtype in (torch.bfloat16, torch.float32):
        for streams in STREAMS:
            shapes = []
            for _, out_channels, rate, frames in BLOCKS:
                blocks = torch.randn(out_channels * rate, streams * frames, device="cuda", dtype=dtype)
                bias = torch.randn(out_channels, device="cuda", dtype=dtype).repeat_interleave(rate)
                shapes.append((blocks, bias, rate))
            outputs: dict[str, list[torch.Tensor]] = {}
            key = f"{str(dtype).removeprefix('torch.')}_{streams}_streams"
            figures: dict[str, Any] = {}
            for name, variant in variants.items():
                outputs[name] = [variant(blocks, bias, rate) for blocks, bias, rate in shapes]
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    for blocks, bias, rate in shapes:
                        variant(blocks, bias, rate)
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

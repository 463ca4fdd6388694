"""The fast codec's 7-tap residual convs at 64 streams (one 4-frame packet each), as the engine ran them
before the implicit GEMM and as it runs them now, side by side in one process, and the implicit
GEMM's tilings.

Each conv is what a residual unit runs: SnakeBeta(x + bias) of a channel-major x, a history, the activation's
tail kept. Variants, each captured in a CUDA graph and replayed:
- `unfold_gemm`: `ops.conv_rows` without the tap-major weight (the K-times unfolded columns, then cuBLAS);
- `implicit`: `ops.conv_rows` with it (the samples copied once, time-major, then triton_conv's kernel);
- `samples`: that copy alone (`ops.time_major_samples`: one transposing kernel, SnakeBeta applied);
- `tiling <out>x<steps>x<channels> w<warps> s<stages>`: the kernel alone over those samples, per tiling.
Each result's relative L2 error to the float32 conv of the same activated bf16 samples is recorded.

Usage: python benchmarks/device/codec_conv_ab.py --out DIR [--streams 64] [--replays 20]
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from qwen3_tts_native.commands.bench import replay_ms
from qwen3_tts_native.engine.kernels import ops, reference, triton_conv
from qwen3_tts_native.engine.kernels.triton_conv import ConvBlocks

KERNEL = 7
STREAMS = 64
# (channels, samples of a 4-frame packet) after each decoder block (rates 8, 5, 4, 3 from 1536 channels).
STAGES = ((768, 128), (384, 640), (192, 2560), (96, 7680))
DILATIONS = (1, 3, 9)
# None spills (benchmarks/device/triton_pipelines.py reads the cubins: 128 x 128 on 4 warps and 128 x 256 on 8
# did, and are left out).
TILINGS = (
    ConvBlocks(64, 128, 32, 4, 4),
    ConvBlocks(128, 128, 32, 8, 4),
    ConvBlocks(128, 128, 32, 8, 3),
    ConvBlocks(128, 128, 64, 8, 3),
    ConvBlocks(64, 256, 32, 8, 4),
    ConvBlocks(128, 64, 32, 4, 4),
    ConvBlocks(64, 128, 64, 4, 3),
)


def graph_us(run: Callable[[], Tensor], replays: int) -> float:
    """One replay of a graph of `run`, in microseconds (after a warm-up run off the graph)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    us = replay_ms(graph, replays) * 1000
    del graph
    return round(us, 1)


def rel(a: Tensor, b: Tensor) -> float:
    return float((a.float() - b).norm() / b.norm())


def measure_shape(
    channels: int, length: int, dilation: int, streams: int, replays: int, g: torch.Generator
) -> dict[str, Any]:
    """Every variant of one conv shape: its time a replay and its error to the float32 conv."""
    bf16 = torch.bfloat16
    context = (KERNEL - 1) * dilation
    x = torch.randn(channels, streams, length, device="cuda", generator=g).to(bf16)
    x = x.transpose(0, 1)  # channel-major, as the GEMM convs leave it
    history = torch.randn(streams, channels, context, device="cuda", generator=g).to(bf16)
    weight = torch.randn(channels, channels, KERNEL, device="cuda", generator=g) / (channels * KERNEL) ** 0.5
    weight = weight.to(bf16)
    tap_major = weight.permute(0, 2, 1).contiguous()
    bias = (0.1 * torch.randn(channels, device="cuda", generator=g)).to(bf16)
    snake = reference.SnakeBetaParameters(
        (0.3 * torch.randn(channels, device="cuda", generator=g)).exp().to(bf16),
        (1.0 / ((0.3 * torch.randn(channels, device="cuda", generator=g)).exp() + 1e-9)).to(bf16),
        (0.1 * torch.randn(channels, device="cuda", generator=g)).to(bf16),
    )
    tail = torch.empty(streams, channels, context, device="cuda", dtype=bf16)
    activated = ops.snake_beta(x, *snake)
    expected = reference.conv_rows(activated.float(), weight.float(), bias.float(), dilation, history.float())
    samples = ops.time_major_samples(x, history, snake)
    variants: dict[str, Callable[[], Tensor]] = {
        "unfold_gemm": lambda: ops.conv_rows(x, weight, bias, dilation, history, snake, tail),
        "implicit": lambda: ops.conv_rows(x, weight, bias, dilation, history, snake, tail, tap_major),
        "samples": lambda: ops.time_major_samples(x, history, snake, tail),
    }
    for tiling in TILINGS:
        name = f"tiling {tiling.out}x{tiling.steps}x{tiling.channels} w{tiling.warps} s{tiling.stages}"
        variants[name] = functools.partial(
            triton_conv.conv_rows, samples, tap_major, bias, dilation, streams, tiling
        )
    row: dict[str, Any] = {"channels": channels, "samples": length, "dilation": dilation}
    for name, run in variants.items():
        try:
            out = run()
            torch.cuda.synchronize()
            if name != "samples":
                row[f"{name} rel_err"] = rel(out, expected)
            row[f"{name} us"] = graph_us(run, replays)
        except Exception as error:  # a tiling Triton cannot compile: record it and go on
            row[f"{name} error"] = f"{type(error).__name__}: {str(error)[:200]}"
    return row


def measure(streams: int, replays: int) -> list[dict[str, Any]]:
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for channels, length in STAGES:
        for dilation in DILATIONS:
            row = measure_shape(channels, length, dilation, streams, replays, g)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--streams", type=int, default=STREAMS)
    parser.add_argument("--replays", type=int, default=20)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = measure(args.streams, args.replays)
    names = sorted({key[:-3] for row in rows for key in row if key.endswith(" us")})
    totals = {name: round(sum(row.get(f"{name} us", float("nan")) for row in rows), 1) for name in names}
    for name, total in sorted(totals.items(), key=lambda item: item[1]):
        print(f"{total:10.1f} us  {name}", flush=True)
    result = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "streams": args.streams,
        "rows": rows,
        "total_us": totals,
    }
    (args.out / "codec-conv-ab.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

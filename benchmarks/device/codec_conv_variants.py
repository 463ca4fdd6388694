"""The codec's 7-tap residual convs at 64 streams, one 4-frame packet each, four ways: what the engine runs
today (`conv1d_as_gemm`: the unfolded input materialised, K times the activations, then one GEMM), cuDNN on
the [B, C, T] input, cuDNN on channels-last input and weights (conv2d over H = 1), and K accumulated GEMMs
over a time-major [B * T, C] input, where a tap is a row offset and no unfolded copy exists (the rows that
straddle two streams are computed and dropped). Each variant is captured in a CUDA graph and replayed; the
float32 ones run with TF32 off, as the exact codec does. The results are checked against the first.

It measures whether the copies that are 63% of the bf16 packet at 64 streams can go without a kernel of our
own. Usage: python benchmarks/device/codec_conv_variants.py --out DIR
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from qwen3_tts_native.commands.bench import replay_ms
from qwen3_tts_native.engine.model.codec import conv1d_as_gemm
from qwen3_tts_native.engine.runtime.codec_graphs import fp32_codec

KERNEL = 7
STREAMS = 64
# (channels, samples of a 4-frame packet) after each decoder block (rates 8, 5, 4, 3 from 1536 channels).
STAGES = ((768, 128), (384, 640), (192, 2560), (96, 7680))
DILATIONS = (1, 3, 9)


def time_major_taps(x_time_major: Tensor, weight: Tensor, bias: Tensor, dilation: int, length: int) -> Tensor:
    """The conv as K accumulated GEMMs: x [B, L + ctx, C] -> [B, L, O]; tap k reads rows k * dilation on."""
    batch, padded, channels = x_time_major.shape
    rows = x_time_major.reshape(batch * padded, channels)
    span = (KERNEL - 1) * dilation
    n = batch * padded - span
    out = torch.empty(batch * padded, weight.shape[0], dtype=x_time_major.dtype, device=x_time_major.device)
    valid = out[:n]
    torch.addmm(bias, rows[:n], weight[:, :, 0].t(), out=valid)
    for k in range(1, KERNEL):
        valid.addmm_(rows[k * dilation : k * dilation + n], weight[:, :, k].t())
    return out.view(batch, padded, -1)[:, :length]


def variants(
    x: Tensor, weight: Tensor, bias: Tensor, dilation: int, length: int
) -> dict[str, Callable[[], Tensor]]:
    x_channels_last = x.unsqueeze(2).contiguous(memory_format=torch.channels_last)
    weight_channels_last = weight.unsqueeze(2).contiguous(memory_format=torch.channels_last)
    x_time_major = x.transpose(1, 2).contiguous()
    return {
        "unfold_gemm": lambda: conv1d_as_gemm(x, weight, bias, dilation),
        "cudnn_ncw": lambda: F.conv1d(x, weight, bias, dilation=dilation),
        "cudnn_channels_last": lambda: F.conv2d(
            x_channels_last, weight_channels_last, bias, dilation=(1, dilation)
        ).squeeze(2),
        "time_major_taps": lambda: time_major_taps(x_time_major, weight, bias, dilation, length).transpose(
            1, 2
        ),
    }


def measure(dtype: torch.dtype, streams: int, replays: int) -> list[dict[str, Any]]:
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for channels, length in STAGES:
        for dilation in DILATIONS:
            ctx = (KERNEL - 1) * dilation
            x = torch.randn(streams, channels, ctx + length, device="cuda", generator=g).to(dtype)
            weight = (
                torch.randn(channels, channels, KERNEL, device="cuda", generator=g)
                / (channels * KERNEL) ** 0.5
            ).to(dtype)
            bias = (0.1 * torch.randn(channels, device="cuda", generator=g)).to(dtype)
            row: dict[str, Any] = {"channels": channels, "samples": length, "dilation": dilation}
            reference = None
            for name, run in variants(x, weight, bias, dilation, length).items():
                out = run()
                torch.cuda.synchronize()
                if reference is None:
                    reference = out.float()
                else:
                    err = (out.float() - reference).norm() / reference.norm()
                    row[f"{name}_rel_err"] = float(err)
                graph = torch.cuda.CUDAGraph()
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    run()
                torch.cuda.current_stream().wait_stream(side)
                with torch.cuda.graph(graph):
                    run()
                row[f"{name}_us"] = round(replay_ms(graph, replays) * 1000, 1)
                del graph
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main() -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--streams", type=int, default=STREAMS)
    parser.add_argument("--replays", type=int, default=10)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "streams": args.streams,
    }
    result["bf16"] = measure(torch.bfloat16, args.streams, args.replays)
    with fp32_codec():
        result["fp32"] = measure(torch.float32, args.streams, args.replays)
    for dtype in ("bf16", "fp32"):
        totals = {
            name: round(sum(r[f"{name}_us"] for r in result[dtype]), 1)
            for name in ("unfold_gemm", "cudnn_ncw", "cudnn_channels_last", "time_major_taps")
        }
        result[f"{dtype}_total_us"] = totals
        print(dtype, totals, flush=True)
    (args.out / "codec-conv-variants.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

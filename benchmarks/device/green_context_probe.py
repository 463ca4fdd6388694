"""Probe: could the codec's graphs run confined to a few SMs through a CUDA green context
(`torch.cuda.green_contexts`), so that the one-stream frame chain keeps the other SMs?

Measures on the device, torch only (no snapshot, no extension):
- whether green contexts are supported, and the SM count;
- a compute-bound float32 matmul on an ordinary stream and on the stream of green contexts of 16 / 33 / 66
  SMs: confined work takes about (all SMs / its SMs) times longer;
- a CUDA graph of small dependent kernels (a stand-in for the frame chain) replayed alone, and while the
  matmul runs on an ordinary stream or on a 16-SM green context's stream: how much the confined neighbour
  still slows the chain;
- whether a graph captured on an ordinary stream replays on a green context's stream, and whether it is
  then confined.

Usage: python benchmarks/device/green_context_probe.py --out DIR   (writes green-context-probe.json)
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

SIZE = 8192
CHAIN = 400


def wall_ms(work: Callable[[], None], stream: torch.cuda.Stream, runs: int = 5) -> float:
    """Median wall milliseconds of `work` enqueued on `stream` (after one warm run)."""
    values = []
    for index in range(runs + 1):
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.cuda.stream(stream):
            work()
        stream.synchronize()
        if index:
            values.append((time.perf_counter() - start) * 1000)
    return sorted(values)[len(values) // 2]


def chain_graph() -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """CHAIN dependent small kernels (a 1-row product and an add each), captured once."""
    x = torch.randn(1, 2048, device="cuda")
    w = torch.randn(2048, 2048, device="cuda") / 45.0
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        y = x
        for _ in range(3):
            y = torch.tanh(y @ w)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x
        for _ in range(CHAIN):
            y = torch.tanh(y @ w)
    return graph, y


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for green-context-probe.json")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    from torch.cuda import green_contexts

    props = torch.cuda.get_device_properties(0)
    result: dict[str, Any] = {
        "gpu": props.name,
        "torch": torch.__version__,
        "sms": props.multi_processor_count,
        "supported": bool(green_contexts.SUPPORTED),
        "errors": {},
    }
    a = torch.randn(SIZE, SIZE, device="cuda")
    b = torch.randn(SIZE, SIZE, device="cuda")

    def matmul() -> None:
        torch.mm(a, b)

    ordinary = torch.cuda.Stream()
    result["matmul_ms_all_sms"] = wall_ms(matmul, ordinary)
    graph, _ = chain_graph()

    def chain() -> None:
        graph.replay()

    result["chain_ms_alone"] = wall_ms(chain, ordinary)
    contexts: dict[int, Any] = {}
    for sms in (16, 33, 66):
        try:
            context: Any = green_contexts.GreenContext.create(num_sms=sms, device_id=0)
            contexts[sms] = context
            result[f"matmul_ms_{sms}_sms"] = wall_ms(matmul, context.Stream())
        except Exception:  # a probe records what fails
            result["errors"][f"green_context_{sms}"] = traceback.format_exc(limit=3)
    neighbours: dict[str, torch.cuda.Stream] = {"ordinary": torch.cuda.Stream()}
    if 16 in contexts:
        neighbours["green_16_sms"] = contexts[16].Stream()
    for label, stream in neighbours.items():
        try:
            torch.cuda.synchronize()
            with torch.cuda.stream(stream):
                for _ in range(4):
                    matmul()
            result[f"chain_ms_beside_matmul_on_{label}"] = wall_ms(chain, ordinary, runs=3)
            torch.cuda.synchronize()
        except Exception:
            result["errors"][f"neighbour_{label}"] = traceback.format_exc(limit=3)
    if 16 in contexts:
        try:
            big = torch.cuda.CUDAGraph()
            with torch.cuda.graph(big):
                matmul()
            result["graph_ms_replayed_on_ordinary"] = wall_ms(big.replay, ordinary)
            result["graph_ms_replayed_on_green_16_sms"] = wall_ms(big.replay, contexts[16].Stream())
        except Exception:
            result["errors"]["graph_on_green_stream"] = traceback.format_exc(limit=3)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "green-context-probe.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

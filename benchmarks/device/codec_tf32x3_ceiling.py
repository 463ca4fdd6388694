"""What the exact mode's float32 codec convs could gain from a three-pass TF32 product ("3xTF32": x = hi + lo
with hi exact in TF32, W x ~ W_hi x_hi + W_hi x_lo + W_lo x_hi, each on tensor cores with float32 sums), which
keeps float32's accuracy where one TF32 pass does not (seed-contract.md: TF32 raised the waveform's deviation
from 3.2e-6 to 9.2e-4 and was rejected for exact parity).

Per GEMM of the 64-stream 4-frame packet (the decoder's first conv, the transposed convs, the residual units'
7-tap convs): the float32 SGEMM's time, one TF32 pass, and the three-pass form as two cuBLAS calls over a
stacked input ([W_hi | W_hi] @ [x_hi; x_lo], then + W_lo @ x_hi), each captured in a CUDA graph; and the
relative error of each against float64 on one shape. The splitting itself is not timed: it would be the
unfold's to write (x_hi and x_lo instead of x, twice its bytes), which the sum of `unfold_extra_gb` prices.

Usage: python benchmarks/device/codec_tf32x3_ceiling.py --out DIR
"""

from __future__ import annotations

import json
from typing import Any

import torch
from common import measurement_parser

from qwen3_tts_native.commands.bench import replay_ms

STREAMS = 64
# (name, output rows, reduction, columns, repeats in a packet) at 64 streams x 4 frames
GEMMS = (
    ("first_conv", 1536, 1024 * 7, STREAMS * 16, 1),
    ("block1_transposed", 768 * 8, 1536 * 2, STREAMS * 16, 1),
    ("block1_units", 768, 768 * 7, STREAMS * 128, 3),
    ("block2_transposed", 384 * 5, 768 * 2, STREAMS * 128, 1),
    ("block2_units", 384, 384 * 7, STREAMS * 640, 3),
    ("block3_transposed", 192 * 4, 384 * 2, STREAMS * 640, 1),
    ("block3_units", 192, 192 * 7, STREAMS * 2560, 3),
    ("block4_transposed", 96 * 3, 192 * 2, STREAMS * 2560, 1),
    ("block4_units", 96, 96 * 7, STREAMS * 7680, 3),
)


def tf32_split(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x = hi + lo exactly, hi with TF32's 10 mantissa bits (rounded to nearest), lo the float32 rest."""
    bits = x.view(torch.int32)
    hi = ((bits + 0x1000) & ~0x1FFF).view(torch.float32)
    return hi, x - hi


def graphed_ms(operation: Any) -> float:
    operation()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        operation()
    return min(replay_ms(graph, 10) for _ in range(3))


def measure_gemm(rows: int, reduction: int, columns: int, with_errors: bool) -> dict[str, float]:
    """One product's times (float32, one TF32 pass, three) and, `with_errors`, each one's error to float64."""
    weight = torch.randn(rows, reduction, device="cuda") / reduction**0.5
    x = torch.randn(reduction, columns, device="cuda")
    weight_hi, weight_lo = tf32_split(weight)
    x_hi, x_lo = tf32_split(x)
    stacked = torch.cat([x_hi, x_lo])
    weight_twice = torch.cat([weight_hi, weight_hi], dim=1).contiguous()
    out = torch.empty(rows, columns, device="cuda")

    def three_pass() -> None:
        torch.mm(weight_lo, stacked[:reduction], out=out)
        out.addmm_(weight_twice, stacked)

    figures: dict[str, float] = {}
    results: dict[str, torch.Tensor] = {}
    try:
        for label, tf32, operation in (
            ("fp32", False, lambda: torch.mm(weight, x, out=out)),
            ("tf32", True, lambda: torch.mm(weight, x, out=out)),
            ("tf32x3", True, three_pass),
        ):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            figures[f"{label}_ms"] = graphed_ms(operation)
            results[label] = out.clone()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False
    if with_errors:
        reference = weight.double() @ x.double()
        for label, got in results.items():
            difference = got.double() - reference
            figures[f"{label}_relative_l2"] = float(difference.norm() / reference.norm())
            figures[f"{label}_max_abs"] = float(difference.abs().max())
    return figures


def main() -> int:
    args = measurement_parser(__doc__, modes=False, model=False).parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    totals = {"fp32_ms": 0.0, "tf32_ms": 0.0, "tf32x3_ms": 0.0, "unfold_extra_gb": 0.0}
    for name, rows, reduction, columns, repeats in GEMMS:
        figures = measure_gemm(rows, reduction, columns, with_errors=name == "block2_units")
        figures["repeats"] = repeats
        for key in ("fp32_ms", "tf32_ms", "tf32x3_ms"):
            totals[key] += figures[key] * repeats
        totals["unfold_extra_gb"] += reduction * columns * 4 * repeats / 1e9
        result[name] = figures
        print(name, json.dumps(figures), flush=True)
        torch.cuda.empty_cache()
    result["packet_totals"] = totals
    print("packet", json.dumps(totals), flush=True)
    (args.out / "codec-tf32x3-ceiling.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The talker's four prompt-pass products at the packed passes' row counts, timed in two operand orders: as
the engine runs them (`F.linear(x, W)`: exact's bf16, and fast's fp8 `torch._scaled_mm` of row-quantized
x) and transposed (W @ x^T, then the [out, rows] result copied back to [rows, out]). Random operands of the
real shapes; no snapshot.

Why: the GEMMs are ~60% of a 64-session prefill's GPU time (run 123: 36 of 59 ms in exact, ~780 TFLOP/s on
average; 22 of 49 ms in fast, ~1,300), and the profile names kernels, not products. cuBLAS picks its kernel by
(M, N, K); the transposed order is another (M, N) for it, and may find a faster one for some product.

Per (product, rows, dtype): median of `--reps` CUDA-event timings after warm-up, in us, and TFLOP/s.

Usage: python benchmarks/device/prefill_gemm_layouts.py --out DIR [--rows 1792,2560,8192]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from common import comma_ints

from qwen3_tts_native.engine.kernels import ops
from qwen3_tts_native.engine.kernels.reference import quantize_weight

HIDDEN, INTERMEDIATE, Q_WIDTH, KV_WIDTH = 2048, 6144, 16 * 128, 8 * 128
PRODUCTS = {
    "qkv": (HIDDEN, Q_WIDTH + 2 * KV_WIDTH),
    "o": (Q_WIDTH, HIDDEN),
    "gate_up": (HIDDEN, 2 * INTERMEDIATE),
    "down": (INTERMEDIATE, HIDDEN),
}
"""product -> (in features, out features) of the talker (config.json: hidden 2048, intermediate 6144, 16 query
and 8 key/value heads of 128)"""


def median_us(run: Callable[[], torch.Tensor], reps: int) -> float:
    for _ in range(5):
        run()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1000)
    return statistics.median(times)


def variants(x: torch.Tensor, weight: torch.Tensor) -> dict[str, Callable[[], torch.Tensor]]:
    """bf16 and fp8, each as the engine runs it and transposed."""
    quantized = quantize_weight(weight, "fp8")
    codes, scale = ops.quantize_rows_fp8(x)

    def fp8_transposed() -> torch.Tensor:
        out = torch._scaled_mm(
            quantized.data,
            codes.t(),
            scale_a=quantized.scale[:, None],
            scale_b=scale[None, :],
            out_dtype=x.dtype,
        )
        return out.t().contiguous()

    return {
        "bf16": lambda: F.linear(x, weight),
        "bf16_transposed": lambda: torch.mm(weight, x.t()).t().contiguous(),
        "fp8": lambda: torch._scaled_mm(
            codes,
            quantized.data.t(),
            scale_a=scale[:, None],
            scale_b=quantized.scale[None, :],
            out_dtype=x.dtype,
        ),
        "fp8_transposed": fp8_transposed,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON written")
    parser.add_argument("--rows", type=comma_ints, default="1792,2560,8192")
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    result: dict[str, object] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "us": {}}
    timings: dict[str, dict[str, float]] = {}
    for product, (features_in, features_out) in PRODUCTS.items():
        weight = torch.randn(features_out, features_in, device="cuda", dtype=torch.bfloat16) * 0.02
        for rows in args.rows:
            x = torch.randn(rows, features_in, device="cuda", dtype=torch.bfloat16)
            flop = 2 * rows * features_in * features_out
            key = f"{product}_{rows}"
            timings[key] = {name: median_us(run, args.reps) for name, run in variants(x, weight).items()}
            print(
                key,
                " ".join(
                    f"{name} {us:.1f} us ({flop / us / 1e6:.0f} TFLOP/s)" for name, us in timings[key].items()
                ),
                flush=True,
            )
    result["us"] = timings
    (args.out / "prefill-gemm-layouts.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

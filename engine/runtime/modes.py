"""Engine modes: "exact" (bf16, the reference math; default) and "fast" (8-bit decode weights, bf16 codec).

Selected by QWEN3_TTS_MODE (or an explicit argument). Only the GPU frame backend and the codec precision
differ between modes; prompts, sampling rules and the frame accounting are the same.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

import torch

MODE_ENV = "QWEN3_TTS_MODE"
ModeName = Literal["exact", "fast"]
WeightFormat = Literal["bf16", "int8", "fp8"]


@dataclass(frozen=True)
class Mode:
    """What a mode changes.

    exact: the frame is `runtime.step.decode_frames` itself, captured in CUDA graphs, so its codes equal
    the eager engine's bit for bit; fp32 codec.
    fast: the frame runs on the fused kernels of engine/kernels with weight-only 8-bit decode GEMVs
    (`weights`) for products of fewer than `gemm_min_rows` rows and bf16 cuBLAS for larger ones, and the
    codec runs in bf16.

    gemm_min_rows: the GEMV/cuBLAS crossover, from kernel-bench.json (H200: the int8 GEMV wins at 1 row,
    cuBLAS at 8 and above; 2 and 4 are measured by benchmarks/device/kernel_bench.py).
    """

    name: ModeName
    weights: WeightFormat
    codec_dtype: torch.dtype
    gemm_min_rows: int = 4


EXACT = Mode("exact", "bf16", torch.float32)
FAST = Mode("fast", "int8", torch.bfloat16)
MODES: dict[str, Mode] = {"exact": EXACT, "fast": FAST}


def resolve_mode(name: str | None = None) -> Mode:
    """The mode named (or QWEN3_TTS_MODE, or "exact"); ValueError for an unknown name."""
    chosen = (name or os.environ.get(MODE_ENV) or "exact").strip().lower()
    if chosen not in MODES:
        raise ValueError(f"unknown mode {chosen!r}: choose exact or fast ({MODE_ENV})")
    return MODES[chosen]

"""Engine modes on CUDA: "exact" (bf16 weights, float32 codec; default) and "fast" (8-bit decode weights,
bf16 codec).

Selected by QWEN3_TTS_MODE (or an explicit argument). Both run the frame on the fused kernels
(runtime/graphs.py); only the GEMV weights and the codec precision differ. Prompts, sampling rules and the
frame accounting are the same. On CPU there are no modes: the engine is the torch reference model.
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

    exact: the model's own bf16 weights (GEMV below `gemm_min_rows` rows, cuBLAS above) and a float32 codec:
    the reference math at bf16 precision, rounded by the kernels instead of by torch's ops.
    fast: weight-only fp8 (e4m3) decode GEMVs (`weights`) for products of fewer than `gemm_min_rows` rows,
    bf16 cuBLAS for larger ones, fp8 tensor-core GEMMs from `fp8_gemm_min_rows` rows on, and a bf16 codec.
    fp8 rather than int8 codes: the same bytes, and the frame replays faster (2.588 against 2.649 ms at one
    stream, benchmarks/results/2026-11-30-run35).

    gemm_min_rows: the GEMV/cuBLAS crossover, from kernel-bench.json (benchmarks/results/2026-11-30-run3,
    H200): the int8 GEMV beats cuBLAS at 1 and 2 rows and loses from 4 on; the bf16 GEMV only ties with
    cuBLAS at 1 row (ahead on the predictor's matrices, behind on the talker's) and loses from 2 on. Those
    are single products; inside the frame graph a GEMV also keeps the dependent-launch chain that a cuBLAS
    kernel breaks, so exact takes the GEMV for the predictor's 2-row step 0 too (3; A/B in
    benchmarks/results/2026-11-30-run11).

    fp8_gemm_min_rows: products of at least this many rows (prompt passes of several sessions) run as fp8
    tensor-core GEMMs over the fp8 weights, the activations quantized per row (`ops.fp8_linear`); None: bf16
    cuBLAS. Needs fp8 weights. Run 35: from 512 rows, the 64-stream prefill 64-69 -> 61 ms; from 64 rows
    (the 64-stream frames too) the frame replays 5.40 -> 6.74 ms (a quantization kernel per product).

    tensor_core_max_rows: products of `gemm_min_rows` to this many rows (below `fp8_gemm_min_rows`) run on
    our tensor-core kernel over the GEMV's weights (`ops.tensor_core_linear`: bf16 in exact, fp8 in fast)
    where the device and shapes allow, instead of bf16 cuBLAS. Run 98 (benchmarks/device/tensor_core_ab.py,
    one process): frame replay at 4 streams 4.78 -> 3.94 ms (exact), 4.79 -> 3.78 ms (fast); at 16 streams
    4.84 -> 4.39, 4.91 -> 4.28 ms; at 64 streams (every product on the kernel) 5.30 -> 6.71, 5.34 -> 6.62
    ms, slower. So the frames of up to 16 streams (their predictor's first step has 32 rows) take it, and
    larger products stay on cuBLAS. 0: cuBLAS everywhere (the A/B's base).

    triton_max_rows: the MLP's gate/up (with its SwiGLU) and down products and the attention's qkv and o
    products of more than `tensor_core_max_rows` rows, up to this many, run on Triton kernels
    (`ops.triton_linear_swiglu`, `ops.triton_linear_split_sums`, `ops.triton_linear`: wgmma, the weights
    streamed once) where Triton and the device allow, instead of bf16 cuBLAS with `silu_mul` and split-K
    reductions. Run 148 (benchmarks/device/triton_products_ceiling.py, H200, 64 rows, each product alone):
    gate/up 18.85 -> 15.98 us (talker), 8.75 -> 7.66 (predictor); down 12.45 -> 11.18 and 8.21 -> 7.22. The o
    product lost there (6.60 -> 7.18, 6.08 -> 6.50) as a product with its own reduce kernel; down and o only
    feed the residual add, so they hand the add-RMSNorm kernel their split sums (`Weight.residual_delta`) and
    have no reduce kernel. The qkv product lost too alone, but won in the frame as one kernel without a split
    (run 167, H100: the 64-row frame 4.74 -> 4.60 ms), where cuBLAS broke the dependent-launch chain; so did
    the heads (`KernelFrame`: run 170, 64-row frames -0.4..0.8%, fast's lockstep aggregate -1..2%). 128 rows
    (two activation tiles a weight tile): the predictor's first step at 64 streams leaves cuBLAS and
    `silu_mul` (run 170, H100: 64-row frames -0.4..1.0%, first audio not longer). 0: cuBLAS (the A/B's base).

    triton_fp8_rows: the qkv and gate/up products (and its SwiGLU) that run on Triton take the fp8 weights and
    the rows quantized by the RMSNorm before them (`ops.triton_fp8_linear`, `ops.triton_fp8_linear_swiglu`:
    the wgmma on e4m3 codes on both sides), not the bf16 weights: half the bytes and nothing widened. Runs
    172-173 (H100, two rounds): 64-row frames 4.535 / 4.516 -> 4.163 / 4.151 ms, 16 rows -4.5%, the
    64-stream lockstep aggregate 0.00147 -> 0.00139; weight-only e4m3, widened in the kernel, had been no
    faster than bf16 (runs 148, 171). The down product stays bf16: its rows quantized by the SwiGLU kernel a
    scale per 64 columns, each k step scaled as it is added, made the frame 4.565 ms (run 172). Needs fp8
    weights.

    kv_cache_fp8: the talker's KV cache holds e4m3 codes with a float32 scale a (slot, KV head, position) row
    (`VoiceDesignEngine.load` allocates it, `graphs.install` where a pool is not yet one; `ops.rope_attention`
    and its kernels quantize each new row as `reference.quantize_rows_fp8` does and attend over the codes
    times their scales): half the bytes the
    decode attention streams, which at 64 streams was bandwidth-bound (Nsight Compute, run 178: 21.5 us a
    layer at ~1.9 TB/s, a quarter of the talker's kernel time). The predictor's 16-position cache stays bf16.
    Runs 179-180 (H100, two rounds): 64-row frames 4.135 / 4.098 -> 4.102 / 4.095 ms, 16 rows -1.6%, the
    lockstep aggregate -0.3 / -0.9%; alone the attention 21.4 -> 19.5 us at half the DRAM bytes, now bound
    by its instructions (the codes' conversions and scales), which is what a further gain must cut.

    norm_in_gemv: on the GEMV path the RMSNorm before a block's qkv and gate/up projections is computed by
    the GEMV's own blocks (`ops.rms_norm_linear`) instead of by a kernel of its own. Off only in A/B runs
    (benchmarks/device/frame_variants.py).
    """

    name: ModeName
    weights: WeightFormat
    codec_dtype: torch.dtype
    gemm_min_rows: int = 4
    fp8_gemm_min_rows: int | None = None
    tensor_core_max_rows: int = 32
    triton_max_rows: int = 128
    triton_fp8_rows: bool = False
    kv_cache_fp8: bool = False
    norm_in_gemv: bool = True

    def __post_init__(self) -> None:
        if (self.fp8_gemm_min_rows is not None or self.triton_fp8_rows) and self.weights != "fp8":
            raise ValueError("fp8 GEMMs need fp8 weights")


EXACT = Mode("exact", "bf16", torch.float32, gemm_min_rows=3)
FAST = Mode("fast", "fp8", torch.bfloat16, fp8_gemm_min_rows=512, triton_fp8_rows=True, kv_cache_fp8=True)
MODES: dict[str, Mode] = {"exact": EXACT, "fast": FAST}


def resolve_mode(name: str | None = None) -> Mode:
    """The mode named (or QWEN3_TTS_MODE, or "exact"); ValueError for an unknown name."""
    chosen = (name or os.environ.get(MODE_ENV) or "exact").strip().lower()
    if chosen not in MODES:
        raise ValueError(f"unknown mode {chosen!r}: choose exact or fast ({MODE_ENV})")
    return MODES[chosen]

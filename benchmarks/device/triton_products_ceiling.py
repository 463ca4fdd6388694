"""Whether Triton's Hopper matrix products (wgmma, pipelined copies) can beat cuBLAS on the frame's 64-row
products, before anything is built into the engine.

Why: at 64 streams the frame is ~60% of the lockstep's time, and its products run on cuBLAS (run 142's
profile: `nvjet` kernels of 5.4-6.5 us for the predictor's 4-12 MB weights, ~1.4 TB/s, plus 103 split-K
reductions and 103 `silu_mul` kernels a frame); our own mma.sync kernel loses there, bound by the instructions
it issues (runs 100-106). Triton emits wgmma on sm_90, which takes the 64 activation rows in one warpgroup
instruction.

The product is swapped (W [m, k] is the wgmma's A, the activation rows x [n, k] its B, so a block owns weight
rows and every activation row) and split over k: a block's float32 partial sums [n, m] go to a workspace that
a second kernel adds in order (deterministic), scales (fp8 weights: a scale per output channel) and, for
gate/up, turns into silu(gate) * up: the work of cuBLAS's split-K reduction and our `silu_mul` in one kernel.
One split writes the result directly. Weights bf16 (exact's) and e4m3 (fast's, widened to bf16 in registers),
and e4m3 weights against e4m3 activation rows (`--fp8-rows`, kind "fp8xfp8": the wgmma takes both operands as
codes, nothing widened, a scale per output channel and per activation row applied to the sums; the rows are
quantized once outside the timed graph, as the kernel that makes them would: run 148 found widening the
weight's codes costlier than the bytes it saves, and the talker's 64-row products stream their bf16 weights
near the bandwidth, so whether 1-byte operands end to end halve them decides fast mode's next product).

Each product runs `GRAPH_CALLS` times back to back in one CUDA graph, each call on its own copy of the weight
from a ring larger than twice L2 (cold weights, as in a frame), against bf16 cuBLAS (`F.linear`, plus
`silu_mul` for gate/up) the same way. Every configuration's output is checked against the float32 product of
the same (dequantized) weight first. The frame estimate weighs each product by its calls in a 64-row frame.

Usage: python benchmarks/device/triton_products_ceiling.py --out DIR [--rows 64] [--shapes a,b] [--fp8-rows]
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from common import measurement_parser
from triton.testing import do_bench

from qwen3_tts_native.engine.kernels import ops, reference

BF16 = torch.bfloat16
L2_BYTES = 60 * 2**20
GRAPH_CALLS = 24
SHAPES = {  # (in, out) of the decode products, and their calls in one frame (28 talker layers, 75 predictor
    # layer passes: 15 predictor steps of 5 layers, 15 predictor heads)
    "talker.qkv": (2048, 4096, 28),
    "talker.o": (2048, 2048, 28),
    "talker.gate_up": (2048, 12288, 28),
    "talker.down": (6144, 2048, 28),
    "predictor.qkv": (1024, 4096, 75),
    "predictor.o": (2048, 1024, 75),
    "predictor.gate_up": (1024, 6144, 75),
    "predictor.down": (3072, 1024, 75),
    "predictor.lm_head": (1024, 2048, 15),
}
BLOCK_M = (64, 128)
BLOCK_K = (64, 128, 256)
SPLITS = (1, 2, 4, 8, 16)
SHARED_MEMORY = 200 * 1024


@triton.jit
def split_products_kernel(  # type: ignore[no-untyped-def]
    w_ptr,
    x_ptr,
    scale_ptr,
    row_scale_ptr,
    out_ptr,
    rows,
    m_out,
    k,
    k_split,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SCALED: tl.constexpr,
    CODES: tl.constexpr,
    PARTIAL: tl.constexpr,
    SWIGLU: tl.constexpr,
):
    """One block: weight rows [BLOCK_M] x every activation row, over k [split * k_split, + k_split).

    PARTIAL: float32 sums into out [split, BLOCK_N, m_out]. Otherwise (one split) the result into out
    [rows, m_out] (scaled), or with SWIGLU silu(gate) * up into out [rows, m_out / 2], the block's gate rows
    and their up rows (m_out / 2 further) multiplied together. CODES: x is e4m3 codes with a scale per row
    (`row_scale_ptr`), multiplied by the weight's codes as they are."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    split = tl.program_id(1)
    offs_n = tl.arange(0, BLOCK_N)
    offs_k = split * k_split + tl.arange(0, BLOCK_K)
    half = m_out // 2
    w_ptrs = w_ptr + offs_m[:, None] * k + offs_k[None, :]
    x_ptrs = x_ptr + offs_n[None, :] * k + offs_k[:, None]
    x_mask = offs_n[None, :] < rows
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in tl.range(0, k_split, BLOCK_K):
        x = tl.load(x_ptrs, mask=x_mask, other=0.0)
        if CODES:
            acc = tl.dot(tl.load(w_ptrs), x, acc)
            if SWIGLU:
                up = tl.dot(tl.load(w_ptrs + half * k), x, up)
        else:
            acc = tl.dot(tl.load(w_ptrs).to(tl.bfloat16), x, acc)
            if SWIGLU:
                up = tl.dot(tl.load(w_ptrs + half * k).to(tl.bfloat16), x, up)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    out_mask = offs_n[None, :] < rows
    if PARTIAL:
        tl.store(out_ptr + (split * BLOCK_N + offs_n[None, :]) * m_out + offs_m[:, None], acc, mask=out_mask)
    else:
        if SCALED:
            acc = acc * tl.load(scale_ptr + offs_m)[:, None]
            if SWIGLU:
                up = up * tl.load(scale_ptr + half + offs_m)[:, None]
        if CODES:
            row_scale = tl.load(row_scale_ptr + offs_n, mask=offs_n < rows, other=0.0)[None, :]
            acc = acc * row_scale
            if SWIGLU:
                up = up * row_scale
        width = m_out
        if SWIGLU:
            acc = acc / (1.0 + tl.exp(-acc)) * up
            width = half
        tl.store(out_ptr + offs_n[None, :] * width + offs_m[:, None], acc.to(tl.bfloat16), mask=out_mask)


@triton.jit
def reduce_splits_kernel(  # type: ignore[no-untyped-def]
    partial_ptr,
    scale_ptr,
    row_scale_ptr,
    out_ptr,
    m_out,
    width,
    split_stride,
    SPLITS: tl.constexpr,
    SCALED: tl.constexpr,
    CODES: tl.constexpr,
    SWIGLU: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """out[row, j] = sum over splits in order (scaled; CODES: times the row's scale too); SWIGLU: silu(gate_j)
    * up_j, up j + m_out / 2."""
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < width
    base = partial_ptr + row * m_out + offs
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    up = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLITS):
        acc += tl.load(base + s * split_stride, mask=mask, other=0.0)
        if SWIGLU:
            up += tl.load(base + width + s * split_stride, mask=mask, other=0.0)
    if SCALED:
        acc = acc * tl.load(scale_ptr + offs, mask=mask, other=0.0)
        if SWIGLU:
            up = up * tl.load(scale_ptr + width + offs, mask=mask, other=0.0)
    if CODES:
        acc = acc * tl.load(row_scale_ptr + row)
        if SWIGLU:
            up = up * tl.load(row_scale_ptr + row)
    if SWIGLU:
        acc = acc / (1.0 + tl.exp(-acc)) * up
    tl.store(out_ptr + row * width + offs, acc.to(tl.bfloat16), mask=mask)


def swapped_product(
    x: torch.Tensor | reference.QuantizedRows,
    data: torch.Tensor,
    scale: torch.Tensor | None,
    swiglu: bool,
    config: dict[str, int],
    workspace: torch.Tensor,
) -> torch.Tensor:
    """x [n, k] @ data^T (* scale), or silu(gate) * up: one launch for one split, else two. x as
    `QuantizedRows`: its codes against the weight's, the sums scaled by both."""
    codes = isinstance(x, reference.QuantizedRows)
    rows_data, row_scale = (x.codes, x.scale) if isinstance(x, reference.QuantizedRows) else (x, x)
    rows, k = rows_data.shape
    m_out = data.shape[0]
    block_m, block_k, splits = config["block_m"], config["block_k"], config["splits"]
    width = m_out // 2 if swiglu else m_out
    out = torch.empty(rows, width, device=rows_data.device, dtype=BF16)
    scale_arg = scale if scale is not None else rows_data
    common = dict(BLOCK_M=block_m, BLOCK_N=64, BLOCK_K=block_k, SCALED=scale is not None, CODES=codes)
    launch = dict(num_warps=config["warps"], num_stages=config["stages"])
    if splits == 1:
        grid = ((width if swiglu else m_out) // block_m, 1)
        split_products_kernel[grid](
            data,
            rows_data,
            scale_arg,
            row_scale,
            out,
            rows,
            m_out,
            k,
            k,
            PARTIAL=False,
            SWIGLU=swiglu,
            **common,
            **launch,
        )
        return out
    split_products_kernel[(m_out // block_m, splits)](
        data,
        rows_data,
        scale_arg,
        row_scale,
        workspace,
        rows,
        m_out,
        k,
        k // splits,
        PARTIAL=True,
        SWIGLU=False,
        **common,
        **launch,
    )
    block = 1024
    reduce_splits_kernel[(rows, triton.cdiv(width, block))](
        workspace,
        scale_arg,
        row_scale,
        out,
        m_out,
        width,
        64 * m_out,
        SPLITS=splits,
        SCALED=scale is not None,
        CODES=codes,
        SWIGLU=swiglu,
        BLOCK=block,
        num_warps=4,
    )
    return out


def configurations(
    k: int, m_out: int, swiglu: bool, weight_bytes: int, row_bytes: int = 2
) -> list[dict[str, int]]:
    """Block shapes and splits whose blocks tile the product exactly and number 32 to ~1,100 (one to eight
    waves of 132 SMs), with as many pipeline stages (3 or 4) as fit the shared memory (`row_bytes`: an
    activation element's)."""
    found = []
    for block_m, block_k, splits in itertools.product(BLOCK_M, BLOCK_K, SPLITS):
        direct_rows = m_out // 2 if (swiglu and splits == 1) else m_out
        if k % (splits * block_k) or direct_rows % block_m:
            continue
        blocks = direct_rows // block_m * splits
        if not 32 <= blocks <= 1100:
            continue
        weights_a_stage = block_m * block_k * weight_bytes * (2 if swiglu and splits == 1 else 1)
        stage = weights_a_stage + 64 * block_k * row_bytes
        stages = 4 if 4 * stage <= SHARED_MEMORY else 3
        if stages * stage > SHARED_MEMORY:
            continue
        for warps in (4, 8) if block_m == 128 else (4,):
            found.append(dict(block_m=block_m, block_k=block_k, splits=splits, stages=stages, warps=warps))
    return found


def graph_us(call: Callable[[int], object]) -> float:
    """Microseconds a call, `GRAPH_CALLS` calls captured back to back in one graph (a call each ring copy)."""
    call(0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in range(GRAPH_CALLS):
            call(c)
    return float(do_bench(graph.replay, warmup=5, rep=25, return_mode="median")) * 1000 / GRAPH_CALLS


def relative_error(out: torch.Tensor, expected: torch.Tensor) -> float:
    return float((out.float() - expected).norm() / expected.norm())


def measure_shape(
    name: str, k: int, m_out: int, rows: int, deadline: float, fp8_rows: bool
) -> list[dict[str, Any]]:
    """The product's entries for bf16 and fp8 weights (and, with `fp8_rows`, fp8 weights on fp8 rows):
    cuBLAS (bf16) and every Triton configuration."""
    w = (torch.randn(m_out, k, device="cuda") / k**0.5).to(BF16)
    x = torch.randn(rows, k, device="cuda", dtype=BF16)
    quantized = reference.quantize_weight(w, "fp8")
    entries = [
        measure_weights(name, x, w, None, deadline),
        measure_weights(name, x, quantized.data, quantized.scale, deadline),
    ]
    if fp8_rows:
        x_codes = reference.quantize_rows_fp8(x)
        entries.append(measure_weights(name, x_codes, quantized.data, quantized.scale, deadline))
    return entries


def measure_weights(
    name: str,
    x: torch.Tensor | reference.QuantizedRows,
    data: torch.Tensor,
    scale: torch.Tensor | None,
    deadline: float,
) -> dict[str, Any]:
    """One product of weight `data` (bf16, or e4m3 with a scale per output channel) on rows x (bf16, or e4m3
    codes with a scale per row: kind "fp8xfp8", against the float32 product of both dequantized)."""
    swiglu = name.endswith("gate_up")
    codes = isinstance(x, reference.QuantizedRows)
    rows_float = x.codes.float() * x.scale[:, None] if isinstance(x, reference.QuantizedRows) else x.float()
    rows, k = rows_float.shape
    m_out = data.shape[0]
    dense = data.float() if scale is None else data.float() * scale[:, None]
    expected = rows_float @ dense.T
    if swiglu:
        expected = F.silu(expected[:, : m_out // 2]) * expected[:, m_out // 2 :]
    copies = max(2, -(-2 * L2_BYTES // (data.numel() * data.element_size())))
    ring = [data] + [data.clone() for _ in range(copies - 1)]
    workspace = torch.empty(max(SPLITS) * 64 * m_out, device="cuda", dtype=torch.float32)
    kind = "bf16" if scale is None else "fp8xfp8" if codes else "fp8"
    entry: dict[str, Any] = {"op": name, "weights": kind, "rows": rows, "k": k, "m": m_out}
    if isinstance(x, torch.Tensor) and scale is None:
        bf16_rows = x

        def cublas(c: int) -> torch.Tensor:
            out = F.linear(bf16_rows, ring[c % copies])
            return ops.silu_mul(out[:, : m_out // 2], out[:, m_out // 2 :]) if swiglu else out

        entry["cublas_us"] = round(graph_us(cublas), 2)
        entry["cublas_error"] = relative_error(cublas(0), expected)
    tried: list[dict[str, Any]] = []
    for config in configurations(k, m_out, swiglu, data.element_size(), 1 if codes else 2):
        if time.monotonic() > deadline:
            entry["cut"] = "time budget"
            break

        def triton_call(c: int, config: dict[str, int] = config) -> torch.Tensor:
            return swapped_product(x, ring[c % copies], scale, swiglu, config, workspace)

        try:
            error = relative_error(triton_call(0), expected)
            us = graph_us(triton_call) if error < 2e-2 else None
        except Exception as failure:  # out of shared memory or registers for this block shape
            tried.append({**config, "failed": f"{type(failure).__name__}: {failure}"[:160]})
            continue
        tried.append({**config, "us": None if us is None else round(us, 2), "error": error})
    timed = [t for t in tried if t.get("us") is not None]
    entry["configurations"] = tried
    if timed:
        entry["best"] = min(timed, key=lambda t: t["us"])
    best = {key: value for key, value in entry.get("best", {}).items() if key != "error"}
    print(
        f"{name:>18} {kind} n={rows}: cublas {entry.get('cublas_us', '-')} us, "
        f"triton {best.pop('us', '-')} us {best} ({len(timed)} of {len(tried)} timed)",
        flush=True,
    )
    return entry


def frame_estimate(entries: list[dict[str, Any]]) -> dict[str, float]:
    """Microseconds of products in one 64-row frame: cuBLAS bf16, and the best Triton product of each
    weight format (where every shape was timed)."""
    calls = {name: count for name, (_, _, count) in SHAPES.items()}
    totals: dict[str, float] = {}
    for entry in entries:
        count = calls[entry["op"]]
        if "cublas_us" in entry:
            totals["cublas_bf16"] = totals.get("cublas_bf16", 0.0) + count * entry["cublas_us"]
        if "best" in entry:
            label = f"triton_{entry['weights']}"
            totals[label] = totals.get(label, 0.0) + count * entry["best"]["us"]
    return {key: round(value, 1) for key, value in totals.items()}


def main() -> int:
    parser = measurement_parser(__doc__, modes=False, model=False)
    parser.add_argument("--rows", type=int, default=64, help="activation rows (streams), at most 64")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma list of products to measure")
    parser.add_argument("--budget-s", type=float, default=240.0, help="stop trying configurations after this")
    parser.add_argument(
        "--fp8-rows", action="store_true", help="also e4m3 weights on e4m3 activation rows (kind fp8xfp8)"
    )
    args = parser.parse_args()
    if not 1 <= args.rows <= 64:
        raise SystemExit("--rows must be 1 to 64 (one 64-row block of activations)")
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget_s
    result: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "products": [],
    }
    for name in args.shapes.split(","):
        k, m_out, _ = SHAPES[name]
        result["products"].extend(measure_shape(name, k, m_out, args.rows, deadline, args.fp8_rows))
        result["frame_products_us"] = frame_estimate(result["products"])
        (args.out / f"triton-products-ceiling-n{args.rows}.json").write_text(json.dumps(result, indent=2))
    print("frame products (us):", json.dumps(result["frame_products_us"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

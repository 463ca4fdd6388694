"""The MLP, qkv, o and head products of 33 to 128 decode rows as Triton kernels (wgmma on Hopper), where they
beat cuBLAS.

Why: at 64 streams the frame's products are cuBLAS kernels with split-K reductions and a `silu_mul` after
every gate/up product. benchmarks/device/triton_products_ceiling.py timed each of the frame's 64-row products
both ways on the H200 (benchmarks/results/2026-12-05-run148, cold weights, in a graph): the gate/up products
with their SwiGLU 18.85 -> 15.98 us (talker) and 8.75 -> 7.66 (predictor), the down products with their
reduction 12.45 -> 11.18 and 8.21 -> 7.22; the qkv, o and head products lost (+2 to +21%). The o products
(6.60 -> 7.18 talker, 6.08 -> 6.50 predictor) lost with their own reduce kernel, which they do not need: their
split sums go to the add-RMSNorm kernel as the down products' do. qkv and the heads: below.

The product is swapped: the weight [m, k] is the wgmma's A and a tile of 64 activation rows its B, so a block
owns 64 weight rows and a row tile, and streams its weights once a tile (4-stage cp.async pipeline). 65-128
rows (the predictor's first step at 64 streams: two rows a stream) are two tiles, a grid dimension, each row's
result the same bits in either tile. The gate/up kernel holds the gate rows and their up rows in one block and
writes only the SwiGLU, rounded as torch and swiglu.cu round it (the products to bf16, silu to bf16, their
product to bf16). The plain products' kernel splits k over `DOWN_SPLITS` blocks (down, o) whose float32
partial sums a second kernel adds in split order (deterministic): the reduce kernel here (`added`), or, where
the product's output is only added to the residual stream before an RMSNorm, that norm's kernel (`split_sums`;
ops.add_rms_norm_ of ops.SplitSums); or it runs one block over all of k and rounds the product itself (qkv:
`linear`).
Letting each tile's last block to finish add them instead (a counter per tile, no second kernel) was slower:
the 64-row frame 5.38 -> 5.46 ms on an H100 (benchmarks/results/2026-12-06-run151).

Every kernel here is launched dependently where the extension's kernels are (`triton_dependent` says why). The
qkv product of 64 rows as split products and the reduce kernel (both dependent) lost to cuBLAS in the frame
(4.73 -> 4.92 ms), as did 3 stages instead of 4 (4.93 ms; 5.27 with 2 for the split products)
(benchmarks/results/2026-12-07-run166, an H100). As one kernel without a split (`linear`: 64 blocks, each its
64 weight rows over all of k, no partial sums) it won: the 64-row frame 4.74 -> 4.60 ms in exact and in fast
mode, the 64-stream lockstep's aggregate RTF 0.00305 -> 0.00298 (exact), 0.00152 -> 0.00150 (fast)
(benchmarks/results/2026-12-07-run167, an H100): cuBLAS's kernel broke the dependent-launch chain on both
sides in every layer. The heads on the split products and reduce kernel gained nothing there (4.74 -> 4.71 /
4.74 ms); as the one kernel they did, as did the 128-row tiles that took the predictor's first step at 64
streams off cuBLAS and `silu_mul` (benchmarks/results/2026-12-07-run170, an H100, two rounds: 64-row frames
-0.4 to -1.0% each, fast's 64-stream lockstep aggregate -1 to -2% with the heads).

In fast mode the qkv and gate/up kernels take e4m3 codes on both sides (`CODES`: the fp8 weights, and rows
the RMSNorm kernel before them quantized a scale a row), the wgmma on e4m3, each product scaled by its row's
and weight row's scales before the roundings: the fast 64-row frame 4.52-4.54 -> 4.15-4.16 ms, the 64-stream
lockstep aggregate -5% (benchmarks/results/2026-12-07-run172, -run173, an H100). Hopper's e4m3 wgmma sums
with less than float32's precision and Triton does not promote its sums on sm_90 unless asked: 2.4-3.0e-3
relative L2 to the float32 sums of the same codes, twenty times below the e4m3 quantization's own error
(run175); promoting every 128 columns cost 0.07 ms of the frame (run174). Only imported where Triton is
(ops.py guards it); the torch references are `reference.linear`, `reference.linear_swiglu`,
`reference.fp8_linear` and `reference.fp8_linear_swiglu`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .reference import QuantizedRows, QuantizedWeight
from .triton_dependent import begin_dependent_kernel

BLOCK_WEIGHT_ROWS = 64
BLOCK_ACTIVATION_ROWS = 64  # a block's activation rows; more rows take more blocks (`row_tiles`)
MAX_ROWS = 128  # the predictor's first step at 64 streams: two activation tiles
BLOCK_K = 128
STAGES = 4
DOWN_SPLITS = 4
REDUCE_BLOCK = 1024


@triton.jit
def _to_bf16(x):  # type: ignore[no-untyped-def]
    """float32 to bf16, rounded to nearest even as torch rounds (named: Triton's interpreter truncates)."""
    return x.to(tl.bfloat16, fp_downcast_rounding="rtne")


@triton.jit
def _bf16(x):  # type: ignore[no-untyped-def]
    """Round float32 to bf16 and back: one rounding as a bf16 tensor op makes it."""
    return _to_bf16(x).to(tl.float32)


@triton.jit
def _swiglu_kernel(  # type: ignore[no-untyped-def]
    w_ptr,
    x_ptr,
    w_scale_ptr,
    x_scale_ptr,
    out_ptr,
    rows,
    width,
    k,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    CODES: tl.constexpr,
    DEPENDENT: tl.constexpr,
):
    """out [rows, width] = silu(x @ gate^T) * (x @ up^T) for w = [gate; up] [2 * width, k]: a block's gate
    rows and the up rows `width` further, against the activation rows of its tile (program 1). CODES: w and x
    are e4m3 codes, the wgmma takes both as they are, and each product is scaled by its activation row's
    scale, then its weight row's (`reference.fp8_linear`'s order) before the roundings."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    begin_dependent_kernel(DEPENDENT)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    gate_ptrs = w_ptr + offs_m[:, None] * k + offs_k[None, :]
    x_ptrs = x_ptr + offs_n[None, :] * k + offs_k[:, None]
    row_mask = offs_n[None, :] < rows
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in tl.range(0, k, BLOCK_K):
        x = tl.load(x_ptrs, mask=row_mask, other=0.0)
        gate = tl.dot(tl.load(gate_ptrs), x, gate)
        up = tl.dot(tl.load(gate_ptrs + width * k), x, up)
        gate_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    if CODES:
        x_scale = tl.load(x_scale_ptr + offs_n, mask=offs_n < rows, other=0.0)[None, :]
        gate = gate * x_scale * tl.load(w_scale_ptr + offs_m)[:, None]
        up = up * x_scale * tl.load(w_scale_ptr + width + offs_m)[:, None]
    gate = _bf16(gate)
    silu = _bf16(gate / (1.0 + tl.exp(-gate)))
    out = _to_bf16(silu * _bf16(up))
    tl.store(out_ptr + offs_n[None, :] * width + offs_m[:, None], out, mask=row_mask)


@triton.jit
def _product_kernel(  # type: ignore[no-untyped-def]
    w_ptr,
    x_ptr,
    w_scale_ptr,
    x_scale_ptr,
    out_ptr,
    rows,
    m_out,
    k,
    k_split,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ROUNDED: tl.constexpr,
    CODES: tl.constexpr,
    DEPENDENT: tl.constexpr,
):
    """The block's weight rows against its tile's activation rows (program 2) over k [split * k_split,
    + k_split), split = program 1: float32 partial sums out [split, BLOCK_N * row tiles, m_out], or with
    ROUNDED (one split over all of k) the product out [rows, m_out] rounded once to bf16. CODES (ROUNDED
    only): w and x are e4m3 codes, the product scaled as `_swiglu_kernel`'s."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    split = tl.program_id(1)
    begin_dependent_kernel(DEPENDENT)
    offs_n = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    padded_rows = tl.num_programs(2) * BLOCK_N
    offs_k = split * k_split + tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + offs_m[:, None] * k + offs_k[None, :]
    x_ptrs = x_ptr + offs_n[None, :] * k + offs_k[:, None]
    row_mask = offs_n[None, :] < rows
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in tl.range(0, k_split, BLOCK_K):
        acc = tl.dot(tl.load(w_ptrs), tl.load(x_ptrs, mask=row_mask, other=0.0), acc)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    out_ptrs = out_ptr + (split * padded_rows + offs_n[None, :]) * m_out + offs_m[:, None]
    if CODES:
        x_scale = tl.load(x_scale_ptr + offs_n, mask=offs_n < rows, other=0.0)[None, :]
        acc = acc * x_scale * tl.load(w_scale_ptr + offs_m)[:, None]
    if ROUNDED:
        tl.store(out_ptrs, _to_bf16(acc), mask=row_mask)
    else:
        tl.store(out_ptrs, acc, mask=row_mask)


@triton.jit
def _reduce_kernel(  # type: ignore[no-untyped-def]
    partial_ptr,
    out_ptr,
    m_out,
    SPLITS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK: tl.constexpr,
    DEPENDENT: tl.constexpr,
):
    """out [rows, m_out] = the splits' partial sums added in split order, rounded once to bf16."""
    begin_dependent_kernel(DEPENDENT)
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < m_out
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for split in tl.static_range(SPLITS):
        acc += tl.load(partial_ptr + (split * BLOCK_N + row) * m_out + offs, mask=mask, other=0.0)
    tl.store(out_ptr + row * m_out + offs, _to_bf16(acc), mask=mask)


def suits(x: Tensor, weight: Tensor, swiglu: bool) -> bool:
    """Whether the kernels take these operands: a Hopper (or later) GPU, bf16 x [1..128, k] and weight [m, k],
    both contiguous, k a multiple of the blocks' k (times `DOWN_SPLITS` for a plain product) and m of 64
    weight rows (of 128 for [gate; up])."""
    return x.dtype == weight.dtype == torch.bfloat16 and _fits(x, weight, swiglu)


def suits_fp8(x: QuantizedRows, weight: QuantizedWeight, swiglu: bool) -> bool:
    """`suits` for `fp8_linear` (`fp8_linear_swiglu`): e4m3 codes on both sides, float32 scales."""
    codes, data = x.codes, weight.data
    scales = (x.scale, weight.scale)
    e4m3 = codes.dtype == data.dtype == torch.float8_e4m3fn
    scaled = all(s.dtype == torch.float32 and s.is_contiguous() for s in scales)
    return e4m3 and scaled and _fits(codes, data, swiglu)


def _fits(x: Tensor, weight: Tensor, swiglu: bool) -> bool:
    """The shapes, layouts and device the kernels take (`suits`)."""
    if not (x.is_cuda and weight.is_cuda) or x.dim() != 2 or weight.dim() != 2:
        return False
    if not (x.is_contiguous() and weight.is_contiguous()):
        return False
    if torch.cuda.get_device_capability(x.device)[0] < 9:
        return False
    rows, k = x.shape
    m_out = weight.shape[0]
    k_unit = BLOCK_K if swiglu else BLOCK_K * DOWN_SPLITS
    m_unit = 2 * BLOCK_WEIGHT_ROWS if swiglu else BLOCK_WEIGHT_ROWS
    shapes_fit = weight.shape[1] == k and k % k_unit == 0 and m_out % m_unit == 0
    return 1 <= rows <= MAX_ROWS and shapes_fit


def row_tiles(rows: int) -> int:
    """The activation tiles of `rows` rows: one block each per weight tile (and split)."""
    return triton.cdiv(rows, BLOCK_ACTIVATION_ROWS)


def linear_swiglu(x: Tensor, gate_up: Tensor, dependent: bool = False) -> Tensor:
    """silu(x @ gate^T) * (x @ up^T) for gate_up = [gate; up]: [rows, m / 2], one kernel. `dependent`: launch
    it with programmatic dependent launch (triton_dependent)."""
    return _swiglu(x, gate_up, None, dependent)


def fp8_linear_swiglu(x: QuantizedRows, gate_up: QuantizedWeight, dependent: bool = False) -> Tensor:
    """`linear_swiglu` of e4m3 rows and an e4m3 [gate; up] (fast mode's weights), both multiplied as codes:
    half the bytes of bf16 operands and nothing widened (run 171: the talker's 64-row gate/up 20.72 -> 12.44
    us, H100). bf16 [rows, m / 2]."""
    return _swiglu(x.codes, gate_up.data, (x.scale, gate_up.scale), dependent)


def _swiglu(x: Tensor, gate_up: Tensor, scales: tuple[Tensor, Tensor] | None, dependent: bool) -> Tensor:
    """`_swiglu_kernel` over bf16 operands, or e4m3 codes with their (row, weight row) `scales`."""
    rows, k = x.shape
    width = gate_up.shape[0] // 2
    out = torch.empty(rows, width, device=x.device, dtype=torch.bfloat16)
    x_scale, w_scale = scales if scales is not None else (out, out)
    _swiglu_kernel[(width // BLOCK_WEIGHT_ROWS, row_tiles(rows))](
        gate_up,
        x,
        w_scale,
        x_scale,
        out,
        rows,
        width,
        k,
        BLOCK_M=BLOCK_WEIGHT_ROWS,
        BLOCK_N=BLOCK_ACTIVATION_ROWS,
        BLOCK_K=BLOCK_K,
        CODES=scales is not None,
        DEPENDENT=dependent,
        num_warps=4,
        num_stages=STAGES,
        launch_pdl=dependent,
    )
    return out


def linear(x: Tensor, weight: Tensor, dependent: bool = False) -> Tensor:
    """x @ weight^T: [rows, m], one kernel, a block's weight rows over all of k (the qkv products)."""
    out = torch.empty(x.shape[0], weight.shape[0], device=x.device, dtype=x.dtype)
    return _product(x, weight, out, splits=1, dependent=dependent)


def fp8_linear(x: QuantizedRows, weight: QuantizedWeight, dependent: bool = False) -> Tensor:
    """`linear` of e4m3 rows and an e4m3 weight multiplied as codes (as `fp8_linear_swiglu` multiplies
    them): bf16 [rows, m]."""
    codes = x.codes
    out = torch.empty(codes.shape[0], weight.shape[0], device=codes.device, dtype=torch.bfloat16)
    return _product(codes, weight.data, out, splits=1, dependent=dependent, scales=(x.scale, weight.scale))


def split_sums(x: Tensor, weight: Tensor, dependent: bool = False) -> Tensor:
    """The float32 partial sums of x @ weight^T, [DOWN_SPLITS, rows rounded up to 64, m]: split s over k
    [s k / DOWN_SPLITS, + k / DOWN_SPLITS), row r of x at [s, r]; rows past x's are left unwritten."""
    shape = (DOWN_SPLITS, row_tiles(x.shape[0]) * BLOCK_ACTIVATION_ROWS, weight.shape[0])
    partial = torch.empty(shape, device=x.device, dtype=torch.float32)
    return _product(x, weight, partial, splits=DOWN_SPLITS, dependent=dependent)


def _product(
    x: Tensor,
    weight: Tensor,
    out: Tensor,
    splits: int,
    dependent: bool,
    scales: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """`_product_kernel` into `out`: k over `splits` blocks, their float32 sums, or with one split the product
    rounded to `out`'s bf16 (of e4m3 codes with their (row, weight row) `scales`)."""
    rows, k = x.shape
    m_out = weight.shape[0]
    x_scale, w_scale = scales if scales is not None else (out, out)
    _product_kernel[(m_out // BLOCK_WEIGHT_ROWS, splits, row_tiles(rows))](
        weight,
        x,
        w_scale,
        x_scale,
        out,
        rows,
        m_out,
        k,
        k // splits,
        BLOCK_M=BLOCK_WEIGHT_ROWS,
        BLOCK_N=BLOCK_ACTIVATION_ROWS,
        BLOCK_K=BLOCK_K,
        ROUNDED=splits == 1,
        CODES=scales is not None,
        DEPENDENT=dependent,
        num_warps=4,
        num_stages=STAGES,
        launch_pdl=dependent,
    )
    return out


def added(partial: Tensor, rows: int, dependent: bool = False) -> Tensor:
    """The first `rows` rows of `split_sums`' partial sums added in split order, rounded once: [rows, m]."""
    splits, _, m_out = partial.shape
    out = torch.empty(rows, m_out, device=partial.device, dtype=torch.bfloat16)
    _reduce_kernel[(rows, triton.cdiv(m_out, REDUCE_BLOCK))](
        partial,
        out,
        m_out,
        SPLITS=splits,
        BLOCK_N=partial.shape[1],
        BLOCK=REDUCE_BLOCK,
        DEPENDENT=dependent,
        num_warps=4,
        launch_pdl=dependent,
    )
    return out

"""Public kernel ops: the CUDA extension when it is loaded and the inputs suit it, else the torch reference.

Every op returns the same thing either way (within the per-op tolerances of tests/device); callers never
branch on the backend. Outputs are freshly allocated, so the ops are safe inside CUDA-graph capture.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

from ..model.layers import CacheScales
from ..runtime import sampling
from . import loader, reference
from .reference import QuantizedRows, QuantizedWeight, SnakeBetaParameters, SplitSums

try:
    from . import triton_conv, triton_products
except ImportError:  # no Triton (the CPU install): those products stay on cuBLAS or the torch reference
    triton_conv = None  # type: ignore[assignment]
    triton_products = None  # type: ignore[assignment]

__all__ = [
    "DrawRecord",
    "QuantizedRows",
    "QuantizedWeight",
    "SplitSums",
    "add_rms_norm_",
    "add_rms_norm_fp8_",
    "added",
    "codec_window_attention",
    "conv_rows",
    "conv_to_one_channel",
    "decode_attention",
    "dependent_launch",
    "fp8_linear",
    "gather_rows",
    "kernels_available",
    "linear",
    "linear_swiglu",
    "prompt_attention",
    "qk_norm_rope_cache",
    "quantize_rows_fp8",
    "rms_norm",
    "rms_norm_fp8",
    "rms_norm_linear",
    "rope_attention",
    "row_copy_suits",
    "sample_predictor",
    "sample_predictor_and_embed",
    "sample_talker",
    "scatter_rows_",
    "set_dependent_launch",
    "silu_mul",
    "silu_mul_fp8",
    "snake_beta",
    "tensor_core_linear",
    "tensor_core_linear_suits",
    "tensor_core_linear_swiglu",
    "time_major_samples",
    "triton_linear",
    "triton_linear_split_sums",
    "triton_linear_suits",
    "triton_linear_swiglu",
    "unfold_columns",
]


def kernels_available() -> bool:
    return loader.load() is not None


def set_dependent_launch(enabled: bool) -> None:
    """Launch the kernels with programmatic dependent launch (the default, Hopper+) or without; graphs keep
    what was set when they were captured. For benchmarks that measure what it saves."""
    ext = loader.load()
    if ext is not None:
        ext.set_dependent_launch(enabled)


def dependent_launch() -> bool:
    """Whether kernels launched now get programmatic dependent launch (the extension loaded, switched on and
    on Hopper+): the Triton kernels launched between the extension's follow it (triton_dependent says why)."""
    ext = loader.load()
    return ext is not None and bool(ext.dependent_launch())


def _ext(*tensors: Tensor, dtype: torch.dtype | None = torch.bfloat16):  # type: ignore[no-untyped-def]
    """The extension if every tensor is on CUDA (and of `dtype`, when given), else None."""
    if not all(t.is_cuda for t in tensors):
        return None
    if dtype is not None and not all(t.dtype == dtype for t in tensors):
        return None
    return loader.load()


def _rows(x: Tensor) -> Tensor | None:
    """x as [rows, hidden] with 16-byte aligned rows, or None when it cannot be viewed so."""
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1 or rows.stride(0) % 8 or rows.data_ptr() % 16:
        return None
    return rows


def _unit_rows(t: Tensor) -> bool:
    """Whether a 2-D tensor is rows the kernels can write as it is (`_rows` without a reshape)."""
    return t.dim() == 2 and _rows(t) is not None


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm over the last dim (reference: layers.rms_norm). Kernel tolerance: 1 bf16 ulp."""
    ext = _ext(x, weight)
    rows = _rows(x) if ext is not None else None
    if ext is None or rows is None or x.shape[-1] % 8:
        return reference.rms_norm(x, weight, eps)
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    ext.rms_norm(out, rows, None, weight, eps)
    return out.view(x.shape)


def add_rms_norm_(
    x: Tensor | SplitSums, residual: Tensor, weight: Tensor, eps: float, out: Tensor | None = None
) -> Tensor:
    """residual <- residual + x in place; returns rms_norm(residual). One pass over both in the kernel. `out`:
    where the norm is written ([rows, hidden], such as every second row of a buffer), not a new tensor. x may
    be a product's unadded split sums (`SplitSums`): the kernel adds them as `added` would, bit for bit."""
    if isinstance(x, SplitSums):
        return _add_split_sums_rms_norm_(x, residual, weight, eps, out)
    ext = _ext(x, residual, weight)
    rows, res = (_rows(x), _rows(residual)) if ext is not None else (None, None)
    if out is not None and out.shape[-1] != x.shape[-1]:
        raise ValueError(f"out must be [rows, {x.shape[-1]}], got {tuple(out.shape)}")
    if (
        ext is None
        or rows is None
        or res is None
        or rows.stride() != res.stride()
        or x.shape[-1] % 8
        or not (out is None or _unit_rows(out))
    ):
        normed = reference.add_rms_norm_(x, residual, weight, eps)
        return normed if out is None else out.copy_(normed.view(out.shape))
    target = torch.empty(rows.shape, dtype=x.dtype, device=x.device) if out is None else out
    ext.rms_norm(target, rows, res, weight, eps)
    return target.view(x.shape) if out is None else out


SPLIT_SUMS_SPLITS = 4
"""The split count the add-RMSNorm kernel adds (norm.cu's kSplitSums: triton_products.DOWN_SPLITS)."""


def _split_sums_kernel_takes(sums: SplitSums, residual_rows: Tensor) -> bool:
    """Whether norm.cu's split-sums form takes these operands (else the sums are `added` first)."""
    partials = sums.partials
    return (
        residual_rows.shape[0] == sums.rows
        and partials.is_cuda
        and partials.dtype == torch.float32
        and partials.is_contiguous()
        and partials.shape[0] == SPLIT_SUMS_SPLITS
        and residual_rows.shape[-1] % 8 == 0
    )


def _add_split_sums_rms_norm_(
    sums: SplitSums, residual: Tensor, weight: Tensor, eps: float, out: Tensor | None
) -> Tensor:
    """`add_rms_norm_` of split sums: one kernel reads the partial sums where `added` would be a kernel
    before the norm's (run 153: 98 reduce kernels of 1.5 us a 64-row frame)."""
    ext = _ext(residual, weight)
    res = _rows(residual) if ext is not None else None
    if (
        ext is None
        or res is None
        or not _split_sums_kernel_takes(sums, res)
        or not (out is None or _unit_rows(out))
    ):
        return add_rms_norm_(added(sums), residual, weight, eps, out)
    target = torch.empty(res.shape, dtype=residual.dtype, device=residual.device) if out is None else out
    ext.rms_norm_split_sums(target, None, sums.partials, res, weight, eps)
    return target.view(residual.shape) if out is None else out


def added(delta: Tensor | SplitSums) -> Tensor:
    """A product as a tensor: `delta` itself, or its split sums added in split order and rounded once
    (Triton's reduce kernel on the GPU, else reference.added; the same bits)."""
    if isinstance(delta, Tensor):
        return delta
    if triton_products is not None and delta.partials.is_cuda:
        return triton_products.added(delta.partials, delta.rows, dependent_launch())
    return reference.added(delta)


HELD_ROW_MAX_COLS = 8192
"""The row kernels that quantize what they make hold a row in registers (256 threads x 4 vectors of 8)."""


def _held_row(x: Tensor) -> bool:
    return x.shape[-1] % 8 == 0 and x.shape[-1] <= HELD_ROW_MAX_COLS


def _empty_rows_fp8(like: Tensor) -> QuantizedRows:
    """Codes and scales for the rows of `like` [M, K]."""
    return QuantizedRows(
        torch.empty(like.shape, dtype=torch.float8_e4m3fn, device=like.device),
        torch.empty(like.shape[0], dtype=torch.float32, device=like.device),
    )


def rms_norm_fp8(x: Tensor, weight: Tensor, eps: float) -> QuantizedRows:
    """`rms_norm` of x [M, H] quantized per row for `fp8_linear` (`reference.rms_norm_fp8`), in one kernel:
    the bf16 norm is never written. Kernel tolerance: bit-identical to `quantize_rows_fp8(rms_norm(x))` (the
    norm's kernel rounding, then the quantization's correctly rounded operations)."""
    ext = _ext(x, weight)
    rows = _rows(x) if ext is not None else None
    if ext is None or rows is None or x.dim() != 2 or not _held_row(x):
        return reference.rms_norm_fp8(x, weight, eps)
    out = _empty_rows_fp8(rows)
    ext.rms_norm_fp8(out.codes, out.scale, rows, None, weight, eps)
    return out


def add_rms_norm_fp8_(x: Tensor | SplitSums, residual: Tensor, weight: Tensor, eps: float) -> QuantizedRows:
    """`add_rms_norm_` (residual <- residual + x in place) with the norm quantized per row for `fp8_linear`,
    in one kernel; x may be a product's unadded split sums, added by that kernel as `added` would add them.
    Kernel tolerance: bit-identical to `quantize_rows_fp8(add_rms_norm_(...))`."""
    if isinstance(x, SplitSums):
        ext = _ext(residual, weight)
        res = _rows(residual) if ext is not None else None
        held = residual.dim() == 2 and _held_row(residual)
        if ext is None or res is None or not held or not _split_sums_kernel_takes(x, res):
            return add_rms_norm_fp8_(added(x), residual, weight, eps)
        out = _empty_rows_fp8(res)
        ext.rms_norm_split_sums(out.codes, out.scale, x.partials, res, weight, eps)
        return out
    ext = _ext(x, residual, weight)
    rows, res = (_rows(x), _rows(residual)) if ext is not None else (None, None)
    if (
        ext is None
        or rows is None
        or res is None
        or rows.stride() != res.stride()
        or x.dim() != 2
        or not _held_row(x)
    ):
        return reference.add_rms_norm_fp8_(x, residual, weight, eps)
    out = _empty_rows_fp8(rows)
    ext.rms_norm_fp8(out.codes, out.scale, rows, res, weight, eps)
    return out


def _cache_ext(k_cache: Tensor, v_cache: Tensor, scales: CacheScales | None, *tensors: Tensor):  # type: ignore[no-untyped-def]
    """The extension if the bf16 `tensors` are on CUDA and the caches are ones the attention kernels take:
    bf16 without scales, or e4m3 codes with contiguous float32 row scales (`CacheScales`); else None."""
    if scales is None:
        return _ext(*tensors, k_cache, v_cache)
    cache_ok = all(c.dtype == torch.float8_e4m3fn and c.is_cuda for c in (k_cache, v_cache)) and all(
        t.dtype == torch.float32 and t.is_cuda and t.is_contiguous() for t in scales
    )
    return _ext(*tensors) if cache_ok else None


def qk_norm_rope_cache(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_norm: Tensor,
    k_norm: Tensor,
    cos_table: Tensor,
    sin_table: Tensor,
    positions: Tensor,
    slots: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    eps: float,
    keys_out: Tensor | None = None,
    scales: CacheScales | None = None,
) -> Tensor:
    """Per-head q/k RMSNorm + RoPE + K/V cache write for one token per row; returns q [B, Hq, D]. `keys_out`
    [B, Hkv, D], when given, gets the roped keys too (the values the cache gets, bit for bit, in bf16).
    `scales`: the caches are e4m3 codes, each K/V row quantized as `reference.quantize_rows_fp8` does.

    Kernel tolerance: 1 bf16 ulp on q and k (the norm's fp32 sum order); v is copied exactly (its codes and
    scales are the reference's bit for bit).
    """
    ext = _cache_ext(k_cache, v_cache, scales, q, k, v, q_norm, k_norm, cos_table, sin_table)
    if (
        ext is None
        or positions.dtype != torch.int64
        or slots.dtype != torch.int64
        or k_cache.shape[-1] not in (64, 128)
    ):
        return reference.qk_norm_rope_cache(
            q,
            k,
            v,
            q_norm,
            k_norm,
            cos_table,
            sin_table,
            positions,
            slots,
            k_cache,
            v_cache,
            eps,
            keys_out,
            scales,
        )
    head_dim = k_cache.shape[-1]
    q_out = torch.empty(q.shape[0], q.shape[1] // head_dim, head_dim, dtype=q.dtype, device=q.device)
    ext.qk_norm_rope_cache(
        q_out,
        keys_out,
        q,
        k,
        v,
        q_norm,
        k_norm,
        cos_table,
        sin_table,
        positions,
        slots,
        k_cache,
        v_cache,
        eps,
        *_scale_args(scales),
    )
    return q_out


def _scale_args(scales: CacheScales | None) -> tuple[Tensor | None, Tensor | None]:
    """The bindings' trailing (k_scale, v_scale) arguments: (None, None) for a bf16 cache."""
    return (None, None) if scales is None else (scales.k, scales.v)


def decode_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    slots: Tensor,
    lengths: Tensor,
    scale: float,
    span: int | None = None,
    scales: CacheScales | None = None,
) -> Tensor:
    """One query per row over its slot's first `lengths` keys: [B, Hq, D] -> [B, Hq*D]. `scales`: the
    caches are e4m3 codes with these row scales.

    `span` (default: the cache's positions): a bound on every row's length that the caller guarantees; the
    kernel's grid covers only that many positions (a row longer than it would lose its later keys). The
    result does not depend on it.

    The kernel keeps scores and probabilities in fp32 (the reference rounds scores and weights to bf16),
    so it is judged against float64 attention over the same inputs: relative L2 <= 4e-3, and never
    farther from float64 than the reference (tests/device/test_kernel_parity.py says why); over an e4m3
    cache, against float64 attention over its dequantized rows (`reference.cache_rows`).
    """
    ext = _cache_ext(k_cache, v_cache, scales, q)
    supported = k_cache.shape[-1] in (64, 128) and q.shape[1] // k_cache.shape[1] in (1, 2)
    if ext is None or not supported or slots.dtype != torch.int64 or lengths.dtype != torch.int64:
        return reference.decode_attention(q, k_cache, v_cache, slots, lengths, scale, scales)
    batch, heads, head_dim = q.shape
    covered = k_cache.shape[2] if span is None else span
    workspace = torch.empty(
        ext.decode_attention_workspace(batch, heads, head_dim, covered),
        dtype=torch.float32,
        device=q.device,
    )
    out = torch.empty_like(q)
    ext.decode_attention(
        out, q.contiguous(), k_cache, v_cache, slots, lengths, workspace, scale, covered, *_scale_args(scales)
    )
    return out.view(batch, heads * head_dim)


def prompt_attention(q: Tensor, k: Tensor, v: Tensor, bounds: Tensor, span: int, scale: float) -> Tensor:
    """Causal attention inside each sequence of packed rows: rows bounds[i] .. bounds[i + 1] - 1 (int32,
    ascending, the row count last) are sequence i, in order; q [R, Hq, D], k/v [R, Hkv, D] (rows may be
    strided, the last dimension contiguous) -> [R, Hq * D].
    `span` bounds every sequence's length (the caller guarantees it).

    On CUDA this is torch's varlen flash attention (GQA native, fixed launch shapes for a given span, so a
    graph can capture it): scores and the online softmax in fp32, judged like `decode_attention` against
    float64 attention over the same inputs (tests/device/test_kernel_parity.py).
    """
    if not q.is_cuda or q.dtype not in (torch.float16, torch.bfloat16) or q.shape[-1] > 256:
        return reference.prompt_attention(q, k, v, bounds, scale)
    out = torch.ops.aten._flash_attention_forward(
        q, k, v, bounds, bounds, span, span, 0.0, True, False, scale=scale
    )[0]
    return out.view(q.shape[0], -1)


SHORT_CACHE = 64
"""Caches of at most this many positions (one attention tile: the code predictor's 16) need no split merge
in `rope_attention`, and no workspace."""


def rope_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_norm: Tensor,
    k_norm: Tensor,
    cos_table: Tensor,
    sin_table: Tensor,
    positions: Tensor,
    lengths: Tensor,
    slots: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    eps: float,
    scale: float,
    *,
    distinct_slots: bool,
    span: int | None = None,
    scales: CacheScales | None = None,
) -> Tensor:
    """`qk_norm_rope_cache` then `decode_attention` over positions 0..position (lengths = positions + 1, which
    the caller computes once for all layers): [B, Hq*D]. `span`: `decode_attention`'s bound on the lengths
    (used by the two-kernel path of rows that share a slot, i.e. prompt passes).

    For rows that all have `distinct_slots`, one kernel ropes and attends (its blocks rope the queries and
    the new key themselves and stage the new K/V from registers), plus the split merge when the cache holds
    more than `SHORT_CACHE` positions; bit-identical to the two kernels. Rows that share a slot (several
    tokens of one sequence in one call) must see each other's new K/V, so they run the two kernels.
    `scales`: the caches are e4m3 codes with these row scales (the new K/V quantized as
    `qk_norm_rope_cache` quantizes them, and attended as the cache then holds them).
    """
    ext = _cache_ext(k_cache, v_cache, scales, q, k, v, q_norm, k_norm, cos_table, sin_table)
    head_dim = k_cache.shape[-1]
    supported = (
        distinct_slots
        and head_dim in (64, 128)
        and q.shape[1] // k.shape[1] in (1, 2)
        and positions.dtype == torch.int64
        and slots.dtype == torch.int64
    )
    if ext is None or not supported:
        rotated = qk_norm_rope_cache(
            q,
            k,
            v,
            q_norm,
            k_norm,
            cos_table,
            sin_table,
            positions,
            slots,
            k_cache,
            v_cache,
            eps,
            None,
            scales,
        )
        return decode_attention(rotated, k_cache, v_cache, slots, lengths, scale, span, scales)
    out = torch.empty(q.shape[0], q.shape[1], dtype=q.dtype, device=q.device)
    workspace = None
    if k_cache.shape[2] > SHORT_CACHE:
        size = ext.decode_attention_workspace(q.shape[0], q.shape[1] // head_dim, head_dim, k_cache.shape[2])
        workspace = torch.empty(size, dtype=torch.float32, device=q.device)
    ext.rope_attention(
        out,
        workspace,
        q,
        k,
        v,
        q_norm,
        k_norm,
        cos_table,
        sin_table,
        positions,
        slots,
        k_cache,
        v_cache,
        eps,
        scale,
        *_scale_args(scales),
    )
    return out


def silu_mul(gate: Tensor, up: Tensor) -> Tensor:
    """SiLU(gate) * up; the kernel is bit-identical to the reference (same fp32 expression and roundings)."""
    ext = _ext(gate, up)
    g, u = (_rows(gate), _rows(up)) if ext is not None else (None, None)
    if ext is None or g is None or u is None or gate.shape != up.shape or gate.shape[-1] % 8:
        return reference.silu_mul(gate, up)
    out = torch.empty(g.shape, dtype=gate.dtype, device=gate.device)
    ext.silu_mul(out, g, u)
    return out.view(gate.shape)


def silu_mul_fp8(gate: Tensor, up: Tensor) -> QuantizedRows:
    """`silu_mul` of gate and up [M, I] quantized per row for `fp8_linear` (`reference.silu_mul_fp8`), in one
    kernel. Kernel tolerance: bit-identical to `quantize_rows_fp8(silu_mul(gate, up))`."""
    ext = _ext(gate, up)
    g, u = (_rows(gate), _rows(up)) if ext is not None else (None, None)
    if (
        ext is None
        or g is None
        or u is None
        or gate.shape != up.shape
        or gate.dim() != 2
        or not _held_row(gate)
    ):
        return reference.silu_mul_fp8(gate, up)
    out = _empty_rows_fp8(g)
    ext.silu_mul_fp8(out.codes, out.scale, g, u)
    return out


def snake_beta(x: Tensor, frequency: Tensor, inverse_beta: Tensor, bias: Tensor | None = None) -> Tensor:
    """The codec's SnakeBeta (optionally of x + bias), x [B, C, T] (any strides) -> contiguous [B, C, T],
    float32 or bf16: one kernel instead of five (six with the bias), bit-identical to the reference (the
    same ops in the same order, each rounded as torch rounds it; in bf16 the sine is the hardware's after a
    Cody-Waite reduction, not sinf, and rounds to the same bf16 at every bf16 argument: snake.cu says why)."""
    params = (frequency, inverse_beta) if bias is None else (frequency, inverse_beta, bias)
    ext = _ext(x, *params, dtype=None)
    supported = (
        x.dtype in (torch.float32, torch.bfloat16)
        and x.dim() == 3
        and x.numel() <= 2**30  # the kernel's 32-bit indexing
        and all(p.dtype == x.dtype and p.is_contiguous() for p in params)
    )
    if ext is None or not supported:
        return reference.snake_beta(x, frequency, inverse_beta, bias)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    ext.snake_beta(out, x, frequency, inverse_beta, bias)
    return out


def _conv_steps(x: Tensor, kernel: int, dilation: int, history: Tensor | None) -> int:
    """Output steps of a conv of `kernel` taps at `dilation` over the samples [history | x]."""
    context = 0 if history is None else history.shape[-1]
    return context + x.shape[-1] - (kernel - 1) * dilation


def _samples_extension(  # type: ignore[no-untyped-def]
    x: Tensor, history: Tensor | None, snake: SnakeBetaParameters | None, activation_tail: Tensor | None
):
    """The extension, when its kernels over a conv's samples [history | SnakeBeta(x)] (unfold.cu) take these
    operands: float32 or bf16 x [B, C, T], SnakeBeta's tensors and the tail contiguous and of x's type; None
    where the reference must run. A tail needs SnakeBeta: it holds the activation's samples."""
    if activation_tail is not None and snake is None:
        raise ValueError("activation_tail needs snake: it holds the activation's samples")
    snake_tensors = () if snake is None else tuple(t for t in snake if t is not None)
    tensors = (x, *snake_tensors) if history is None else (x, history, *snake_tensors)
    ext = _ext(*tensors, dtype=None)
    fits = (
        x.dtype in (torch.float32, torch.bfloat16)
        and x.dim() == 3
        and all(t.dtype == x.dtype and t.is_contiguous() and t.numel() == x.shape[1] for t in snake_tensors)
        and (
            activation_tail is None or (activation_tail.dtype == x.dtype and activation_tail.is_contiguous())
        )
    )
    return ext if fits else None


def unfold_columns(
    x: Tensor,
    kernel: int,
    dilation: int,
    history: Tensor | None = None,
    snake: SnakeBetaParameters | None = None,
    activation_tail: Tensor | None = None,
) -> Tensor:
    """The [C * kernel, B * T] columns of a conv as one GEMM over the samples [history | x]
    (`reference.unfold_columns`), float32 or bf16, any strides: one copy kernel moving 16 bytes a thread that
    reads the history or x by sample index, so the concatenation is never made; bit-identical. With `snake`
    the kernel puts x's samples through SnakeBeta(x + bias) as it reads them (snake.cuh, `snake_beta`'s
    arithmetic), so the activation before a conv is not written out and read back; it writes the activation
    of x's last n samples into `activation_tail` [B, C, n] (contiguous, n <= T) when given: the conv's next
    history, without a kernel of its own."""
    ext = _samples_extension(x, history, snake, activation_tail)
    # A 1-tap conv without history has nothing to unfold: torch's reshape is a view when the layout allows
    # one (a copy only when not), and the GEMM then reads x as it is stored.
    unfolds = kernel > 1 or history is not None
    if ext is None or not unfolds:
        return reference.unfold_columns(x, kernel, dilation, history, snake, activation_tail)
    batch, channels, _ = x.shape
    length = _conv_steps(x, kernel, dilation, history)
    out = torch.empty(channels * kernel, batch * length, dtype=x.dtype, device=x.device)
    frequency, inverse_beta, bias = snake if snake is not None else (None, None, None)
    ext.unfold_columns(out, x, history, kernel, dilation, frequency, inverse_beta, bias, activation_tail)
    return out


def interleave_phases(rows: Tensor, bias: Tensor, phases: int) -> Tensor:
    """`reference.interleave_phases` (a transposed conv's GEMM rows in sample order, bias added), float32 or
    bf16, an even number of columns: one kernel whose reads and writes are both coalesced (unfold.cu says
    why); bit-identical."""
    ext = _ext(rows, bias, dtype=None)
    fits = (
        rows.dtype in (torch.float32, torch.bfloat16)
        and rows.dim() == 2
        and rows.is_contiguous()
        and rows.shape[1] % 2 == 0
        and rows.data_ptr() % (2 * rows.element_size()) == 0
        and 1 <= phases <= 8
        and rows.shape[0] % phases == 0
        and rows.shape[0] // phases <= 65535
        and bias.dtype == rows.dtype
        and bias.is_contiguous()
        and bias.numel() == rows.shape[0]
    )
    if ext is None or not fits:
        return reference.interleave_phases(rows, bias, phases)
    out = torch.empty(rows.shape[0] // phases, rows.shape[1] * phases, dtype=rows.dtype, device=rows.device)
    ext.interleave_phases(out, rows, bias, phases)
    return out


def conv_rows(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    dilation: int,
    history: Tensor | None = None,
    snake: SnakeBetaParameters | None = None,
    activation_tail: Tensor | None = None,
    tap_major_weight: Tensor | None = None,
) -> Tensor:
    """`reference.conv_rows` (a codec conv of [history | x] as rows [O, B * T]). With `tap_major_weight`
    (weight as [O, K, C], contiguous, kept by the caller), bf16 on Hopper, at least `triton_conv.MIN_STEPS`
    steps a stream and a grid of a block a multiprocessor (`triton_conv.suits`): an implicit GEMM on Triton
    (triton_conv says why) over the samples [history | SnakeBeta(x)] written once, time-major
    (`time_major_samples`, which also fills `activation_tail`), instead of over the K-times unfolded columns.
    Elsewhere (float32: the exact codec; small grids) `unfold_columns` then one cuBLAS GEMM.
    Kernel tolerance: the fp32 sums of the same products in another order, rounded once to bf16 (relative L2
    <= 5e-3 to the reference); `activation_tail` bit-identical."""
    kernel = weight.shape[2]
    steps = _conv_steps(x, kernel, dilation, history)
    if (
        triton_conv is None
        or tap_major_weight is None
        or not triton_conv.suits(x, tap_major_weight, bias, steps)
    ):
        columns = unfold_columns(x, kernel, dilation, history, snake, activation_tail)
        return reference.product_of_columns(weight, bias, columns)
    samples = time_major_samples(x, history, snake, activation_tail)
    return triton_conv.conv_rows(
        samples, tap_major_weight, bias, dilation, x.shape[0], dependent=dependent_launch()
    )


def time_major_samples(
    x: Tensor,
    history: Tensor | None = None,
    snake: SnakeBetaParameters | None = None,
    activation_tail: Tensor | None = None,
) -> Tensor:
    """A conv's samples [history | SnakeBeta(x)] of x [B, C, T] as rows [B * L, C], contiguous (what
    `conv_rows`' implicit GEMM reads), filling `activation_tail` as `unfold_columns` does: one transposing
    kernel (unfold.cu), bit-identical to the reference, a 1-tap unfold then a transpose."""
    ext = _samples_extension(x, history, snake, activation_tail)
    if ext is None or x.shape[0] > 65535:
        return reference.time_major_samples(x, history, snake, activation_tail)
    length = _conv_steps(x, 1, 1, history)
    out = torch.empty(x.shape[0] * length, x.shape[1], dtype=x.dtype, device=x.device)
    frequency, inverse_beta, bias = snake if snake is not None else (None, None, None)
    ext.time_major_samples(out, x, history, frequency, inverse_beta, bias, activation_tail)
    return out


def conv_to_one_channel(
    x: Tensor, weight: Tensor, bias: Tensor | None, dilation: int, history: Tensor | None = None
) -> Tensor:
    """A conv to one output channel (`reference.conv_to_one_channel`: weight [1, C, K], samples
    [history | x], any strides) -> [B, 1, T], computed directly: the codec's last conv, where the GEMM
    formulation would unfold the input K times over to feed a single output row.
    Kernel tolerance: the fp32 sums in another order, rounded once (relative L2 <= 1e-5 in float32, one
    rounding to bf16 in bf16)."""
    tensors = [x, weight] + [t for t in (history, bias) if t is not None]
    ext = _ext(*tensors, dtype=x.dtype)
    fits = x.dim() == 3 and x.dtype in (torch.float32, torch.bfloat16) and weight.shape[0] == 1
    if ext is None or not fits or x.shape[0] > 65535:
        return reference.conv_to_one_channel(x, weight, bias, dilation, history)
    length = _conv_steps(x, weight.shape[-1], dilation, history)
    out = torch.empty(x.shape[0], 1, length, dtype=x.dtype, device=x.device)
    ext.conv_to_one_channel(out, x, history, weight.contiguous(), bias, dilation)
    return out


def codec_window_attention(
    qkv: Tensor, cos: Tensor, sin: Tensor, cache: Tensor, position: Tensor
) -> tuple[Tensor, Tensor]:
    """The codec transformer's attention for one pass (`reference.codec_window_attention`: the output
    [B, n, heads * dim] and the next cache), float32 or bf16: one kernel instead of seven a layer.
    Kernel tolerance: the RoPE'd keys and queries are the reference's bits (the same products and roundings,
    from the same cos and sin), so the next cache is bit-identical; the attention sums in another float32
    order than torch's (relative L2 <= 1e-5 in float32, one bf16 rounding in bf16)."""
    ext = _ext(qkv, cos, sin, cache, dtype=None)
    fits = (
        qkv.dtype in (torch.float32, torch.bfloat16)
        and qkv.dim() == 5
        and qkv.shape[-1] == 64
        and qkv.is_contiguous()
        and cos.is_contiguous()
        and sin.is_contiguous()
        and all(t.dtype == qkv.dtype for t in (cos, sin, cache))
        and cache.stride(-1) == 1
        and cache.data_ptr() % 16 == 0
        and all(stride * cache.element_size() % 16 == 0 for stride in cache.stride()[:-1])
        and position.is_cuda
    )
    if ext is None or not fits:
        return reference.codec_window_attention(qkv, cos, sin, cache, position)
    batch, frames, kv_heads, rows, dim = qkv.shape
    out = torch.empty(batch, frames, kv_heads * (rows - 2) * dim, dtype=qkv.dtype, device=qkv.device)
    next_cache = torch.empty(cache.shape, dtype=cache.dtype, device=cache.device)
    ext.codec_window_attention(out, next_cache, qkv, cos, sin, cache, position.contiguous())
    return out, next_cache


def rms_norm_linear(
    x: Tensor,
    norm_weight: Tensor,
    eps: float,
    weight: Tensor | QuantizedWeight,
    delta: Tensor | None = None,
    swiglu: bool = False,
    l2_keep: int | None = None,
) -> tuple[Tensor, Tensor]:
    """(product, s): s = x + delta (x itself when delta is None), the product `linear` (or `linear_swiglu`)
    of rms_norm(s) * norm_weight. x and delta are left as they are; s is a new tensor when delta is given.

    For 1 to 4 rows one kernel: every GEMV block norms the rows into shared memory before it streams its
    weights, so the norm costs no kernel and no dependency of its own. The norm rounds as `add_rms_norm_`
    does except for the order of the fp32 sum of squares (at most 1 bf16 ulp in the normed input).
    """
    operands = _gemv_operands(x, weight, None)
    rows = x.reshape(-1, x.shape[-1])
    fits = (
        rows.shape[0] <= 4
        and x.is_contiguous()
        and norm_weight.is_cuda
        and norm_weight.dtype == torch.bfloat16
        and (delta is None or (delta.is_cuda and delta.is_contiguous() and delta.shape == x.shape))
        and (delta is None or delta.dtype == torch.bfloat16)
    )
    if operands is None or not fits or rows.shape[0] == 0:
        s = x if delta is None else x.clone()
        h = rms_norm(x, norm_weight, eps) if delta is None else add_rms_norm_(delta, s, norm_weight, eps)
        return (linear_swiglu(h, weight, l2_keep) if swiglu else linear(h, weight, l2_keep=l2_keep)), s
    ext, x_rows, data, scale = operands
    width = data.shape[0] // 2 if swiglu else data.shape[0]
    y = torch.empty(x_rows.shape[0], width, dtype=x.dtype, device=x.device)
    s = x if delta is None else torch.empty_like(x)
    delta_rows = None if delta is None else delta.view(x_rows.shape)
    sum_rows = None if delta is None else s.view(x_rows.shape)
    keep = _l2_keep_argument(l2_keep)
    ext.gemv_rms_norm(y, x_rows, delta_rows, sum_rows, norm_weight, eps, data, scale, swiglu, keep)
    return y.view(*x.shape[:-1], width), s


def _gemv_operands(x: Tensor, weight: Tensor | QuantizedWeight, bias: Tensor | None):  # type: ignore[no-untyped-def]
    """(extension, x rows, weight data, scale) when the GEMV kernel takes these operands, else None."""
    data = weight if isinstance(weight, Tensor) else weight.data
    ext = _ext(x, dtype=torch.bfloat16)
    rows = _rows(x) if ext is not None else None
    ok = (
        rows is not None
        and data.is_cuda
        and (bias is None or (bias.is_cuda and bias.dtype == torch.bfloat16))
        and data.dtype in (torch.bfloat16, torch.int8, torch.float8_e4m3fn)
        and x.shape[-1] % 16 == 0
    )
    if not ok:
        return None
    return ext, rows, data, None if isinstance(weight, Tensor) else weight.scale


def row_copy_suits(t: Tensor) -> bool:
    """Whether `gather_rows` / `scatter_rows_` copy this tensor in their kernel (on CUDA): 1-4 dims, the last
    contiguous. Other tensors go to torch's index ops (the same values)."""
    return t.dim() <= 4 and (t.dim() == 1 or t.shape[-1] == 1 or t.stride(-1) == 1)


def _row_copy_split(ext: object, tensors: list[list[Tensor]]) -> tuple[list[int], list[int]]:
    """Positions whose tensors (one from each list) all suit the row-copy kernel, and the others."""
    positions = range(len(tensors[0]))
    suited = [] if ext is None else [i for i in positions if all(row_copy_suits(ts[i]) for ts in tensors)]
    return suited, [i for i in positions if i not in suited]


def gather_rows(sources: list[Tensor], index: Tensor) -> list[Tensor]:
    """`reference.gather_rows` (rows `index` of each source) in one kernel for all the sources that suit it
    (`row_copy_suits`), not one index op each: the codec graphs' per-packet state gather."""
    ext = _ext(index, dtype=None)
    suited, rest = _row_copy_split(ext, [sources])
    outputs = dict(zip(rest, reference.gather_rows([sources[i] for i in rest], index), strict=True))
    for i in suited:
        outputs[i] = sources[i].new_empty((index.numel(), *sources[i].shape[1:]))
    if suited:
        ext.copy_rows([outputs[i] for i in suited], [sources[i] for i in suited], index.contiguous(), True)
    return [outputs[i] for i in range(len(sources))]


def scatter_rows_(targets: list[Tensor], index: Tensor, sources: list[Tensor]) -> None:
    """`reference.scatter_rows_` (row index[r] of each target <- row r of its source, the indices distinct)
    in one kernel for all the pairs that suit it (`row_copy_suits`): the codec graphs' per-packet state
    scatter."""
    if len(targets) != len(sources):
        raise ValueError(f"scatter_rows_ needs as many sources as targets ({len(sources)} != {len(targets)})")
    ext = _ext(index, dtype=None)
    suited, rest = _row_copy_split(ext, [targets, sources])
    if suited:
        ext.copy_rows([targets[i] for i in suited], [sources[i] for i in suited], index.contiguous(), False)
    reference.scatter_rows_([targets[i] for i in rest], index, [sources[i] for i in rest])


def frame_embedding(
    codes: Tensor, first_table: Tensor, tables: Tensor, text: Tensor, code_rows: Tensor | None = None
) -> Tensor:
    """`reference.frame_embedding` (the talker's decode-step input) in one kernel instead of G gathers, a
    stack, a sum and an add. Row r embeds codes[code_rows[r]] when `code_rows` is given (the kernel reads
    each slot's last frame in place, no gather before it). Tolerance: the fp32 sum runs in codebook order
    where torch's reduction may group it otherwise, so an element can round 1 bf16 ulp apart before the text
    is added."""
    ext = _ext(codes, first_table, tables, text, dtype=None)
    fits = (
        ext is not None
        and first_table.dtype == tables.dtype == text.dtype == torch.bfloat16
        and codes.dtype == torch.int64
        and codes.dim() == 2
        and 1 <= codes.shape[1] <= 16
        and tables.dim() == 3
        and tables.shape[0] == codes.shape[1] - 1
        and text.shape[-1] % 8 == 0
        and (code_rows is None or (code_rows.dtype == torch.int64 and code_rows.device == codes.device))
    )
    rows = _rows(text) if fits else None
    if ext is None or rows is None:
        return reference.frame_embedding(codes, first_table, tables, text, code_rows)
    out = torch.empty(text.shape, dtype=text.dtype, device=text.device)
    ext.frame_embedding(
        out,
        codes.contiguous(),
        None if code_rows is None else code_rows.contiguous(),
        first_table.contiguous(),
        tables.contiguous(),
        rows,
    )
    return out


def _l2_keep_argument(keep: int | None) -> int:
    """The extension's form of `l2_keep`: -1 leaves the loads unhinted."""
    return -1 if keep is None else keep


def linear(
    x: Tensor, weight: Tensor | QuantizedWeight, bias: Tensor | None = None, l2_keep: int | None = None
) -> Tensor:
    """x @ W^T (+ bias) for bf16 or weight-only 8-bit W, one warp per output row (batch invariant).

    `l2_keep` ranks the kernel's weight loads in the L2 (no effect on the result): None, no hint; else the
    weight's first l2_keep bytes are kept (evict_last) and the rest streamed (evict_first).

    Kernel tolerance vs the reference: bf16 W, 1e-2 relative L2 (fp32 accumulation in another order);
    8-bit W, 1e-2 relative L2 against the fp32 product of the stored codes.
    """
    operands = _gemv_operands(x, weight, bias)
    if operands is None:
        return reference.linear(x, weight, bias)
    ext, rows, data, scale = operands
    out = torch.empty(rows.shape[0], data.shape[0], dtype=x.dtype, device=x.device)
    ext.gemv(out, rows, data, scale, bias, _l2_keep_argument(l2_keep))
    return out.view(*x.shape[:-1], data.shape[0])


def quantize_rows_fp8(x: Tensor) -> QuantizedRows:
    """x [M, K] bf16 -> (e4m3 codes [M, K], fp32 scale [M]), one scale per row
    (`reference.quantize_rows_fp8`). Kernel tolerance: bit-identical (the same correctly rounded divisions and
    products, the same round-to-nearest-even cast)."""
    ext = _ext(x)
    rows = _rows(x) if ext is not None else None
    if ext is None or rows is None or x.dim() != 2 or x.shape[1] % 8:
        return reference.quantize_rows_fp8(x)
    out = _empty_rows_fp8(rows)
    ext.quantize_rows_fp8(out.codes, out.scale, rows)
    return out


@lru_cache(maxsize=8)
def _has_fp8_tensor_cores(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device) >= (8, 9)


def fp8_linear(x: Tensor | QuantizedRows, weight: QuantizedWeight, bias: Tensor | None = None) -> Tensor:
    """x @ W^T (+ bias) as one fp8 tensor-core GEMM (`torch._scaled_mm`) for an e4m3 weight with per-channel
    scales: x is quantized per row first (`quantize_rows_fp8`) unless it comes quantized (rows [M, K] from
    `rms_norm_fp8`, `add_rms_norm_fp8_` or `silu_mul_fp8`), and the GEMM scales rows and columns back and
    rounds once to x's dtype (bf16 for quantized rows).

    Why: a prompt pass of many rows is compute-bound, and fp8 tensor cores run at twice bf16's rate. Not for
    decode rows: those read weights (the GEMV) and would pay a quantization kernel per product.
    Tolerance vs `reference.fp8_linear` (the fp32 product of the same codes): 1e-2 relative L2."""
    first = x.codes if isinstance(x, QuantizedRows) else x
    fits = (
        first.is_cuda
        and weight.data.dtype == torch.float8_e4m3fn
        and (isinstance(x, QuantizedRows) or x.dtype == torch.bfloat16)
        and first.shape[-1] % 16 == 0
        and weight.shape[0] % 16 == 0
        and _has_fp8_tensor_cores(first.device)
    )
    if not fits:
        return reference.fp8_linear(x, weight, bias)
    rows = x if isinstance(x, QuantizedRows) else quantize_rows_fp8(x.reshape(-1, x.shape[-1]))
    out = torch._scaled_mm(
        rows.codes,
        weight.data.t(),
        scale_a=rows.scale[:, None],
        scale_b=weight.scale[None, :],
        out_dtype=torch.bfloat16,
    )
    if bias is not None:
        out = out + bias
    return out.view(*first.shape[:-1], weight.shape[0])


def linear_swiglu(x: Tensor, gate_up: Tensor | QuantizedWeight, l2_keep: int | None = None) -> Tensor:
    """SiLU(x @ gate^T) * (x @ up^T) for the fused weight gate_up = [gate; up] [2I, in]: [.., I].

    One kernel instead of the GEMV and `silu_mul`: a warp computes gate row i and up row I + i and writes
    only their SwiGLU, so the [.., 2I] product never goes to memory. Bit-identical to `linear` then
    `silu_mul` (the same products, rounded the same way, and swiglu.cu's expression).
    """
    operands = _gemv_operands(x, gate_up, None)
    if operands is None or gate_up.shape[0] % 2:
        return reference.linear_swiglu(x, gate_up)
    ext, rows, data, scale = operands
    out = torch.empty(rows.shape[0], data.shape[0] // 2, dtype=x.dtype, device=x.device)
    ext.gemv_swiglu(out, rows, data, scale, _l2_keep_argument(l2_keep))
    return out.view(*x.shape[:-1], data.shape[0] // 2)


def _tensor_core_operands(x: Tensor, weight: Tensor | QuantizedWeight, bias: Tensor | None, swiglu: bool):  # type: ignore[no-untyped-def]
    """`_gemv_operands` when the tensor-core kernel takes them (its rules: tensor_core_linear_supported in
    launchers.h), else None."""
    operands = _gemv_operands(x, weight, bias)
    if operands is None or not operands[0].tensor_core_linear_supported(
        operands[1].shape[0], operands[2], swiglu
    ):
        return None
    return operands


def tensor_core_linear_suits(x: Tensor, weight: Tensor | QuantizedWeight, swiglu: bool = False) -> bool:
    """Whether `tensor_core_linear` (or, with `swiglu`, `tensor_core_linear_swiglu`) runs these operands on
    the tensor-core kernel rather than its torch reference: a Hopper GPU with the extension, bf16 x of 1 to
    128 rows, bf16 or fp8 weights whose shapes fill the kernel's tiles and whose blocks fit the device at
    once."""
    return _tensor_core_operands(x, weight, None, swiglu) is not None


def tensor_core_linear(x: Tensor, weight: Tensor | QuantizedWeight, bias: Tensor | None = None) -> Tensor:
    """`linear` on tensor cores for decode batches of 4 to 128 rows (`tensor_core_linear_suits`; else the
    torch reference): a block's 64 weight rows against all the rows, the weights streamed once, k split over
    a thread block cluster. No L2 ranks: ptxas 13.0 encodes a cache-hinted cp.async with its policy in an odd
    uniform register in some instantiations, which faults (illegal instruction; run 97). Kernel tolerance vs
    the reference: `linear`'s (the fp32 sums of the same products in another order; for 8-bit W the products
    of the stored codes)."""
    operands = _tensor_core_operands(x, weight, bias, False)
    if operands is None:
        return reference.linear(x, weight, bias)
    ext, rows, data, scale = operands
    out = torch.empty(rows.shape[0], data.shape[0], dtype=x.dtype, device=x.device)
    ext.tensor_core_linear(out, rows, data, scale, bias, False)
    return out.view(*x.shape[:-1], data.shape[0])


def tensor_core_linear_swiglu(x: Tensor, gate_up: Tensor | QuantizedWeight) -> Tensor:
    """`linear_swiglu` on tensor cores (`tensor_core_linear`): the gate and up rows of an output in one
    block, so only the SwiGLU goes to memory. The same products and roundings as `tensor_core_linear` then
    `silu_mul`."""
    operands = _tensor_core_operands(x, gate_up, None, True)
    if operands is None:
        return reference.linear_swiglu(x, gate_up)
    ext, rows, data, scale = operands
    out = torch.empty(rows.shape[0], data.shape[0] // 2, dtype=x.dtype, device=x.device)
    ext.tensor_core_linear(out, rows, data, scale, None, True)
    return out.view(*x.shape[:-1], data.shape[0] // 2)


def triton_linear_suits(x: Tensor, weight: Tensor, swiglu: bool = False) -> bool:
    """Whether `triton_linear` (or, with `swiglu`, `triton_linear_swiglu`) runs these operands on its Triton
    kernel rather than the torch reference: Triton installed, a Hopper GPU, bf16 x of 1 to 128 rows and a bf16
    weight whose shape fills the kernel's blocks (triton_products.suits)."""
    return triton_products is not None and triton_products.suits(x, weight, swiglu)


def triton_linear(x: Tensor, weight: Tensor) -> Tensor:
    """`linear` of up to 128 rows in one Triton kernel, where its wgmma beats cuBLAS (the qkv products;
    triton_products says why). Kernel tolerance vs the reference: `linear`'s (the fp32 sums of the same
    products in another order)."""
    if not triton_linear_suits(x, weight):
        return reference.linear(x, weight)
    return triton_products.linear(x, weight, dependent_launch())


def triton_linear_split_sums(x: Tensor, weight: Tensor) -> Tensor | SplitSums:
    """`linear` of up to 128 rows with k split over four Triton blocks, their float32 sums left unadded
    (`SplitSums`) for `add_rms_norm_` to add in split order: for a product that only feeds the residual stream
    (the MLP's down products, the o products), no kernel of its own for the sums. Where Triton does not run
    these operands, the product itself (`triton_linear`'s fallback)."""
    if not triton_linear_suits(x, weight):
        return reference.linear(x, weight)
    return SplitSums(triton_products.split_sums(x, weight, dependent_launch()), x.shape[0])


def triton_linear_swiglu(x: Tensor, gate_up: Tensor) -> Tensor:
    """`linear_swiglu` of up to 128 rows in one Triton kernel (the gate/up products and their SwiGLU; the
    roundings of the product then `silu_mul`). Kernel tolerance: `triton_linear`'s, then `silu_mul`'s
    roundings."""
    if not triton_linear_suits(x, gate_up, swiglu=True):
        return reference.linear_swiglu(x, gate_up)
    return triton_products.linear_swiglu(x, gate_up, dependent_launch())


def triton_fp8_linear_suits(x: QuantizedRows, weight: QuantizedWeight, swiglu: bool = False) -> bool:
    """Whether `triton_fp8_linear` (with `swiglu`, `triton_fp8_linear_swiglu`) runs these operands on its
    Triton kernel: `triton_linear_suits`' conditions for e4m3 rows and an e4m3 weight."""
    return triton_products is not None and triton_products.suits_fp8(x, weight, swiglu)


def triton_fp8_linear(x: QuantizedRows, weight: QuantizedWeight) -> Tensor:
    """`fp8_linear` of up to 128 e4m3 rows (`rms_norm_fp8`'s) and fast mode's e4m3 weight in one Triton
    kernel that multiplies both as codes (the qkv products). Kernel tolerance vs `reference.fp8_linear`:
    relative L2 <= 5e-3 (Hopper's e4m3 sums are less precise than float32's: 1.5-1.9e-3 measured, run 175)."""
    if not triton_fp8_linear_suits(x, weight):
        return reference.fp8_linear(x, weight)
    return triton_products.fp8_linear(x, weight, dependent_launch())


def triton_fp8_linear_swiglu(x: QuantizedRows, gate_up: QuantizedWeight) -> Tensor:
    """`linear_swiglu` of e4m3 rows (`rms_norm_fp8`'s) and fast mode's e4m3 [gate; up], up to 128 rows in one
    Triton kernel that multiplies both as codes. Kernel tolerance vs `reference.fp8_linear_swiglu`: relative
    L2 <= 5e-3 (Hopper's e4m3 sums are less precise than float32's: 2.4-3.0e-3 measured, run 175)."""
    if not triton_fp8_linear_suits(x, gate_up, swiglu=True):
        return reference.fp8_linear_swiglu(x, gate_up)
    return triton_products.fp8_linear_swiglu(x, gate_up, dependent_launch())


@lru_cache(maxsize=8)
def _suppressed(vocab: int, eos_id: int, device: torch.device) -> Tensor:
    """[vocab] bool: the control ids every talker row bans (EOS excluded; it has its own rule)."""
    return sampling.talker_banned_tokens(
        torch.full((1,), sampling.EOS_BAN_FRAMES, device=device), vocab, eos_id
    )[0]


@dataclass(frozen=True)
class DrawRecord:
    """What a frame's sampler also records in each row's slot, so that no kernel of its own follows the
    frame's last draw: the cb0 draw sets its bit of the slot's history (`history`, [slots, vocab] bool), and
    the last draw copies the row of `frame_codes` ([rows, width] int64, whose column it writes; the earlier
    draws wrote the others) to the slot's row of `last_codes` ([slots, width] int64). `slots`: [rows]."""

    slots: Tensor
    history: Tensor | None = None
    last_codes: Tensor | None = None
    frame_codes: Tensor | None = None

    def apply(self, codes: Tensor) -> None:
        """The records in torch, after a draw of `codes` [rows] (the reference path)."""
        if self.history is not None:
            self.history[self.slots, codes] = True
        if self.last_codes is not None:
            assert self.frame_codes is not None
            self.last_codes.index_copy_(0, self.slots, self.frame_codes)


def _sampler_ext(logits: Tensor):  # type: ignore[no-untyped-def]
    """The extension if the sampling kernel takes these logits: CUDA, float32 or bfloat16, vocab <= 4096."""
    if logits.dtype not in (torch.float32, torch.bfloat16) or logits.shape[-1] > 4096:
        return None
    return _ext(logits, dtype=None)


def sample_talker(
    logits: Tensor,
    uniforms: Tensor,
    params: sampling.SamplingRows,
    history: Tensor,
    frames_generated: Tensor,
    eos_id: int,
) -> Tensor:
    """cb0 for each row: penalty over `history`, control ids and (under 2 frames) EOS banned, then the draw.

    Same token as `sampling.sample_with_uniform` for the same uniform (tests/device checks 1M cases).
    `logits` float32 or bfloat16 (read as its exact float32 values).
    """
    return _sample(logits, uniforms, params, None, None, (history, frames_generated, eos_id))[0]


def sample_talker_and_embed(
    logits: Tensor,
    uniforms: Tensor,
    params: sampling.SamplingRows,
    history: Tensor,
    frames_generated: Tensor,
    eos_id: int,
    table: Tensor,
    out: Tensor | None = None,
    embed_out: Tensor | None = None,
    record: DrawRecord | None = None,
) -> tuple[Tensor, Tensor]:
    """(cb0, table[cb0]): `sample_talker` and the code's embedding row (the predictor's second input) in one
    kernel, as `sample_predictor_and_embed` does for the codebook steps. `out`: as `sample_predictor`'s;
    `embed_out`: where the embedding rows go ([rows, width], unit inner stride), instead of a new tensor;
    `record`: the draw's history bit (`DrawRecord.history`)."""
    codes, embedded = _sample(
        logits, uniforms, params, table, out, (history, frames_generated, eos_id), embed_out, record
    )
    assert embedded is not None
    return codes, embedded


def sample_predictor(
    logits: Tensor,
    uniforms: Tensor,
    params: sampling.SamplingRows,
    out: Tensor | None = None,
    record: DrawRecord | None = None,
) -> Tensor:
    """Codebooks 1..15: temperature, top-k, top-p and the draw (no penalty, no bans). `logits` float32 or
    bfloat16; the kernel reads bfloat16 as its exact float32 values. With `out` (an int64 [rows] view, such
    as a column of the frame's codes), the codes are written there and it is returned. `record`: the frame's
    last draw copies its rows of codes to their slots (`DrawRecord.last_codes`; `out` is a column of
    `DrawRecord.frame_codes`)."""
    return _sample(logits, uniforms, params, None, out, record=record)[0]


def sample_predictor_and_embed(
    logits: Tensor, uniforms: Tensor, params: sampling.SamplingRows, table: Tensor, out: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """(codes, table[codes]): `sample_predictor` and the next step's input row in one kernel, so a codebook
    step of the frame needs no gather kernel. `table` [vocab, width] bfloat16 (the projected embeddings).
    `out`: as `sample_predictor`'s."""
    codes, embedded = _sample(logits, uniforms, params, table, out)
    assert embedded is not None
    return codes, embedded


def _sample(
    logits: Tensor,
    uniforms: Tensor,
    params: sampling.SamplingRows,
    table: Tensor | None,
    out: Tensor | None,
    talker: tuple[Tensor, Tensor, int] | None = None,
    embed_out: Tensor | None = None,
    record: DrawRecord | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Every sampler: (codes, table[codes] or None). `talker` = (history, frames_generated, eos_id) adds cb0's
    rules (penalty over the history, control ids and early EOS banned); None is a codebook step's draw."""
    history: Tensor | None = None
    frames_generated: Tensor | None = None
    eos_id = -1
    if talker is not None:
        history, frames_generated, eos_id = talker
    ext = _sampler_ext(logits)
    column = _codes_column(out, record)
    if ext is None or not _embeds_in_kernel(table) or not _records_in_kernel(record, column, embed_out):
        banned = None
        if frames_generated is not None:
            banned = sampling.talker_banned_tokens(frames_generated, logits.shape[-1], eos_id)
        codes = _into(out, reference.sample(logits.float(), uniforms, params, history, banned))
        if record is not None:
            record.apply(codes)
        if table is None:
            return codes, None
        gathered = F.embedding(codes, table)
        return codes, (gathered if embed_out is None else embed_out.copy_(gathered))
    out = _codes_out(logits, out)
    embedded = _embedding_rows(logits.shape[0], table) if embed_out is None else embed_out
    ext.sample(
        out,
        logits,
        history,
        params.repetition_penalty,
        None if talker is None else _suppressed(logits.shape[-1], eos_id, logits.device),
        frames_generated,
        eos_id,
        0 if talker is None else sampling.EOS_BAN_FRAMES,
        params.greedy,
        params.temperature,
        params.top_k,
        params.top_p,
        uniforms,
        table,
        embedded,
        None if record is None else record.slots,
        None if record is None else record.history,
        None if record is None else record.last_codes,
        None if record is None else record.frame_codes,
        column,
    )
    return out, embedded


def _codes_out(logits: Tensor, out: Tensor | None) -> Tensor:
    """Where a sampler writes its codes: `out` (any [rows] int64 view, a column of a frame's codes, say), or
    a new tensor."""
    if out is None:
        return torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
    if out.shape != (logits.shape[0],) or out.dtype != torch.int64 or out.device != logits.device:
        raise ValueError("out must be an int64 [rows] tensor on the logits' device")
    return out


def _into(out: Tensor | None, codes: Tensor) -> Tensor:
    """The reference's codes, copied into `out` when one is given."""
    return codes if out is None else out.copy_(codes)


def _records_in_kernel(record: DrawRecord | None, column: int, embed_out: Tensor | None) -> bool:
    """Whether the sampling kernel takes these records and outputs (its binding's layouts; `column`:
    `_codes_column`'s): else the reference runs the draw and `DrawRecord.apply`."""
    if embed_out is not None and not _unit_rows(embed_out):
        return False
    if record is None:
        return True
    if record.slots.dtype != torch.int64 or not record.slots.is_contiguous():
        return False
    if record.history is not None and record.history.stride(-1) != 1:
        return False
    if record.last_codes is None:
        return True
    frame = record.frame_codes
    return frame is not None and record.last_codes.is_contiguous() and frame.is_contiguous() and column >= 0


def _codes_column(out: Tensor | None, record: DrawRecord | None) -> int:
    """The column of `record.frame_codes` that `out` is (-1: none, or not a column of it)."""
    frame = None if record is None else record.frame_codes
    if out is None or frame is None or out.stride(0) != frame.shape[1]:
        return -1
    column, rest = divmod(out.data_ptr() - frame.data_ptr(), out.element_size())
    return column if rest == 0 and 0 <= column < frame.shape[1] else -1


def _embeds_in_kernel(table: Tensor | None) -> bool:
    """Whether the sampling kernel can gather the drawn code's row of `table` (None: nothing to gather)."""
    return table is None or (
        table.is_cuda and table.dtype == torch.bfloat16 and table.is_contiguous() and table.shape[-1] % 8 == 0
    )


def _embedding_rows(rows: int, table: Tensor | None) -> Tensor | None:
    """The output of the sampler's gather: [rows, width] like `table`, or None without one."""
    if table is None:
        return None
    return torch.empty(rows, table.shape[1], dtype=table.dtype, device=table.device)

"""Torch reference of every kernel op: the definition the CUDA kernels are tested against.

Where engine/model/layers.py or engine/runtime/sampling.py defines the math, these call it; the only
additions are the shapes the kernels use (flattened rows, in-place residual, one layer's cache) and the
8-bit weight formats.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from ..model import layers
from ..model.layers import CacheScales
from ..runtime import sampling

INT8_MAX = 127.0
FP8_E4M3_MAX = 448.0


@dataclass(frozen=True)
class QuantizedWeight:
    """A weight-only 8-bit matrix: data [out, in] (int8 or float8_e4m3fn), scale [out] fp32.

    W ~= data.float() * scale[:, None]: one scale per output channel, symmetric, no zero point.
    """

    data: Tensor
    scale: Tensor

    @property
    def shape(self) -> torch.Size:
        return self.data.shape


class QuantizedRows(NamedTuple):
    """Activation rows in e4m3, the A operand of `fp8_linear`: codes [M, K] float8_e4m3fn, scale [M] fp32,
    rows ~= codes.float() * scale[:, None]. Made by `quantize_rows_fp8`, or by the RMSNorm and SiLU x up
    kernels that quantize the rows they make (`rms_norm_fp8`, `silu_mul_fp8`)."""

    codes: Tensor
    scale: Tensor


class SplitSums(NamedTuple):
    """A product's float32 partial sums over k, not yet added: partials [splits, >= rows, m], row r of split s
    at [s, r]. The kernel that reads the product adds them in split order from zero and rounds once to bf16
    (`added`), as the product's own reduce kernel would have: `ops.add_rms_norm_` takes them, so a product
    that only feeds the residual stream needs no reduce kernel of its own."""

    partials: Tensor
    rows: int


class SnakeBetaParameters(NamedTuple):
    """`snake_beta`'s per-channel parameters [C] (and the bias added first, if any), for a kernel that applies
    SnakeBeta(x + bias) to x's samples as it reads them (`unfold_columns(snake=)`)."""

    frequency: Tensor
    inverse_beta: Tensor
    bias: Tensor | None = None


def quantize_weight(weight: Tensor, kind: str) -> QuantizedWeight:
    """Per-output-channel symmetric quantization of a [out, in] weight to "int8" or "fp8" (e4m3; the rows
    quantized as `quantize_rows_fp8` quantizes activations)."""
    if kind == "fp8":
        data, scale = quantize_rows_fp8(weight)
    elif kind == "int8":
        w = weight.float()
        scale = w.abs().amax(dim=1).clamp_min(1e-12) / INT8_MAX
        data = torch.round(w / scale.unsqueeze(1)).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    else:
        raise ValueError(f"unknown weight format {kind!r} (int8 or fp8)")
    return QuantizedWeight(data.contiguous(), scale.contiguous())


def quantize_rows_fp8(x: Tensor) -> QuantizedRows:
    """x [M, K] -> (e4m3 codes [M, K], fp32 scale [M]): each row's scale max(amax, 1e-12) / 448, its codes
    x * (448 / max(amax, 1e-12)), so x ~= codes.float() * scale[:, None] (the activation side of
    `fp8_linear`). The inverse is one division a row, as the kernels compute it: a division an element made
    them compute-bound (H200, run 126)."""
    rows = x.float()
    amax = rows.abs().amax(dim=1).clamp_min(1e-12)
    limit = torch.full_like(amax, FP8_E4M3_MAX)
    scale, inverse = amax / limit, limit / amax  # true divisions (torch multiplies by a scalar's reciprocal)
    codes = (rows * inverse[:, None]).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return QuantizedRows(codes, scale)


def fp8_linear(x: Tensor | QuantizedRows, weight: QuantizedWeight, bias: Tensor | None = None) -> Tensor:
    """x @ W^T (+ bias) for an fp8 weight with x quantized per row (`quantize_rows_fp8`, or rows [M, K]
    quantized already): the fp32 product of the two sets of codes times both scales, rounded once to x's
    dtype (bf16 for quantized rows, the activations' dtype of the mode with fp8 weights), what the fp8 GEMM
    computes."""
    if isinstance(x, QuantizedRows):
        rows, lead, dtype = x, x.codes.shape[:-1], torch.bfloat16
    else:
        rows, lead, dtype = quantize_rows_fp8(x.reshape(-1, x.shape[-1])), x.shape[:-1], x.dtype
    out = (rows.codes.float() @ weight.data.float().t()) * rows.scale[:, None] * weight.scale
    if bias is not None:
        out = out + bias.float()
    return out.to(dtype).view(*lead, weight.shape[0])


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return layers.rms_norm(x, weight, eps)


def added(sums: SplitSums) -> Tensor:
    """The product `sums` holds: its partial sums added in split order from zero, rounded once to bf16."""
    total = torch.zeros(sums.rows, sums.partials.shape[-1], dtype=torch.float32, device=sums.partials.device)
    for partial in sums.partials:
        total += partial[: sums.rows]
    return total.to(torch.bfloat16)


def add_rms_norm_(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> Tensor:
    """residual <- residual + x (model dtype); returns rms_norm(residual)."""
    residual.copy_(residual + x)
    return layers.rms_norm(residual, weight, eps)


def fp8_linear_swiglu(x: QuantizedRows, gate_up: QuantizedWeight) -> Tensor:
    """SiLU(gate) * up of `fp8_linear` with the fused e4m3 weight [gate; up]: the products rounded to bf16,
    then `silu_mul`'s roundings."""
    product = fp8_linear(x, gate_up)
    width = product.shape[-1] // 2
    return silu_mul(product[..., :width], product[..., width:])


def rms_norm_fp8(x: Tensor, weight: Tensor, eps: float) -> QuantizedRows:
    """rms_norm(x) quantized per row, x [M, H]."""
    return quantize_rows_fp8(rms_norm(x, weight, eps))


def add_rms_norm_fp8_(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> QuantizedRows:
    """`add_rms_norm_` (residual updated in place) with the norm quantized per row."""
    return quantize_rows_fp8(add_rms_norm_(x, residual, weight, eps))


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
    """q [B, Hq*D], k/v [B, Hkv*D] of one token per row -> roped q [B, Hq, D]; K/V into the layer cache,
    and the roped keys into `keys_out` [B, Hkv, D] when given.

    The same ops as `layers.DecoderBlock.forward`: per-head RMSNorm, rotate-half RoPE from the table rows
    of `positions`, cache[slot, :, position] = k / v; with `scales` (an e4m3 cache) each K and V row is
    written as `quantize_rows_fp8` codes, its scale at scales[slot, head, position].
    """
    head_dim = k_cache.shape[-1]
    batch = q.shape[0]
    qh = layers.rms_norm(q.view(batch, -1, head_dim), q_norm, eps)
    kh = layers.rms_norm(k.view(batch, -1, head_dim), k_norm, eps)
    cos = cos_table[positions].unsqueeze(1)
    sin = sin_table[positions].unsqueeze(1)
    qh = layers.apply_rope(qh, cos, sin)
    kh = layers.apply_rope(kh, cos, sin)
    vh = v.view(batch, -1, head_dim)
    if scales is None:
        k_cache[slots, :, positions] = kh
        v_cache[slots, :, positions] = vh
    else:
        for cache, scale, rows in ((k_cache, scales.k, kh), (v_cache, scales.v, vh)):
            quantized = quantize_rows_fp8(rows.reshape(-1, head_dim))
            cache[slots, :, positions] = quantized.codes.view(rows.shape)
            scale[slots, :, positions] = quantized.scale.view(rows.shape[:-1])
    if keys_out is not None:
        keys_out.copy_(kh)
    return qh


def cache_rows(cache: Tensor, scales: Tensor | None, slots: Tensor) -> Tensor:
    """The cache rows of `slots` [B, kv_heads, max_len, D] as float32 values: an e4m3 cache's codes times
    their rows' `scales`, a bf16 cache's elements as they are."""
    rows = cache[slots].float()
    return rows if scales is None else rows * scales[slots].unsqueeze(-1)


def decode_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    slots: Tensor,
    lengths: Tensor,
    scale: float,
    scales: CacheScales | None = None,
) -> Tensor:
    """q [B, Hq, D] (position lengths-1) over each row's slot -> [B, Hq*D], via `layers.attention`; an e4m3
    cache (`scales` given) is first dequantized to q's dtype."""
    if scales is None:
        keys, values = k_cache[slots], v_cache[slots]
    else:
        keys = cache_rows(k_cache, scales.k, slots).to(q.dtype)
        values = cache_rows(v_cache, scales.v, slots).to(q.dtype)
    return layers.attention(q.unsqueeze(1), keys, values, (lengths - 1).unsqueeze(1), scale)[:, 0]


def prompt_attention(q: Tensor, k: Tensor, v: Tensor, bounds: Tensor, scale: float) -> Tensor:
    """Packed sequences (rows bounds[i] .. bounds[i + 1] - 1, each from position 0), q [R, Hq, D], k/v
    [R, Hkv, D] -> [R, Hq * D]: each sequence through `layers.attention` over its own keys."""
    edges = bounds.tolist()
    out = q.new_empty(q.shape[0], q.shape[1] * q.shape[2])
    for start, stop in itertools.pairwise(edges):
        if stop > start:
            keys = k[start:stop].transpose(0, 1).unsqueeze(0)
            values = v[start:stop].transpose(0, 1).unsqueeze(0)
            positions = torch.arange(stop - start, device=q.device).unsqueeze(0)
            out[start:stop] = layers.attention(q[start:stop].unsqueeze(0), keys, values, positions, scale)[0]
    return out


def silu_mul(gate: Tensor, up: Tensor) -> Tensor:
    return layers.swiglu(gate, up)


def silu_mul_fp8(gate: Tensor, up: Tensor) -> QuantizedRows:
    """silu_mul(gate, up) quantized per row, gate and up [M, I]."""
    return quantize_rows_fp8(silu_mul(gate, up))


def frame_embedding(
    codes: Tensor, first_table: Tensor, tables: Tensor, text: Tensor, code_rows: Tensor | None = None
) -> Tensor:
    """The talker's decode-step input [B, H]: the G codebooks' embeddings of codes [B, G] (rows code_rows
    [B] of codes when given) summed (first_table for codebook 0, tables [G - 1, vocab, H] for the others),
    plus text [B, H]."""
    chosen = codes if code_rows is None else codes.index_select(0, code_rows)
    return layers.summed_embeddings(chosen, [first_table, *tables.unbind(0)]) + text


def unfold_columns(
    x: Tensor,
    kernel: int,
    dilation: int,
    history: Tensor | None = None,
    snake: SnakeBetaParameters | None = None,
    activation_tail: Tensor | None = None,
) -> Tensor:
    """samples = [history | x] [B, C, (kernel - 1) * dilation + T] -> [C * kernel, B * T], row (c, k) * B + b
    holding samples[b, c, k * dilation :][:T]: the input of a conv as one GEMM (`codec.conv1d_as_gemm`). With
    `snake`, x's samples (not the history's) are SnakeBeta(x + bias) (`snake_beta`), and `activation_tail`
    [B, C, n] (n <= T), when given, is filled with the activation of x's last n samples."""
    if snake is not None:
        x = snake_beta(x, *snake)
        if activation_tail is not None:
            activation_tail.copy_(x[..., x.shape[-1] - activation_tail.shape[-1] :])
    samples = x if history is None else torch.cat([history, x], dim=-1)
    channels = x.shape[1]
    columns = samples.unfold(-1, (kernel - 1) * dilation + 1, 1)[..., ::dilation]  # [B, C, T, K]
    return columns.permute(1, 3, 0, 2).reshape(channels * kernel, -1)


def time_major_samples(
    x: Tensor,
    history: Tensor | None = None,
    snake: SnakeBetaParameters | None = None,
    activation_tail: Tensor | None = None,
) -> Tensor:
    """samples = [history | x] (x through SnakeBeta with `snake`, filling `activation_tail` as
    `unfold_columns` does) as rows [B * L, C], row b * L + s holding sample s of stream b: the operand of the
    implicit-GEMM conv, which reads each tap's columns as whole rows."""
    return unfold_columns(x, 1, 1, history, snake, activation_tail).t().contiguous()


def conv_rows(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    dilation: int,
    history: Tensor | None = None,
    snake: SnakeBetaParameters | None = None,
    activation_tail: Tensor | None = None,
) -> Tensor:
    """The conv (no padding, one group) of the samples [history | x] [B, C, L] with weight [O, C, K] (+ bias)
    as rows [O, B * T], T = L - (K - 1) * dilation, column b * T + t being step t of stream b: one GEMM over
    the unfolded samples (`unfold_columns`, whose `snake` and `activation_tail` it takes)."""
    columns = unfold_columns(x, weight.shape[2], dilation, history, snake, activation_tail)
    return product_of_columns(weight, bias, columns)


def product_of_columns(weight: Tensor, bias: Tensor | None, columns: Tensor) -> Tensor:
    """weight [O, C, K] as [O, C * K] @ columns [C * K, N] (+ bias [O]): a conv's GEMM over its unfolded
    input (`conv_rows`)."""
    flat = weight.reshape(weight.shape[0], -1)
    return torch.mm(flat, columns) if bias is None else torch.addmm(bias[:, None], flat, columns)


def interleave_phases(rows: Tensor, bias: Tensor, phases: int) -> Tensor:
    """A transposed conv's GEMM output in sample order: rows [C * phases, N] (row c * phases + r: channel c's
    phase r) plus bias [C * phases] -> [C, N * phases], out[c, n * phases + r] = rows[c * phases + r, n] +
    bias[c * phases + r] (`codec.conv_transpose1d_as_gemm`)."""
    channels = rows.shape[0] // phases
    ordered = rows.view(channels, phases, -1).permute(0, 2, 1)
    out = torch.empty(ordered.shape, dtype=rows.dtype, device=rows.device)
    torch.add(ordered, bias.view(channels, 1, phases), out=out)
    return out.view(channels, -1)


def conv_to_one_channel(
    x: Tensor, weight: Tensor, bias: Tensor | None, dilation: int, history: Tensor | None = None
) -> Tensor:
    """The conv of the samples [history | x] [B, C, (K - 1) * dilation + T] with weight [1, C, K] (+ bias):
    [B, 1, T]."""
    samples = x if history is None else torch.cat([history, x], dim=-1)
    return torch.nn.functional.conv1d(samples, weight, bias, dilation=dilation)


def codec_window_mask(position: Tensor, frames: int, group: int, window: int, dtype: torch.dtype) -> Tensor:
    """[B, 1, frames * group, window - 1 + frames] additive, for a pass of `frames` frames from `position` [B]
    over the cached window - 1 frames then the pass's (`codec_window_attention`): 0 where query frame i (its
    `group` rows alike) sees key slot s, else -inf. Slot s holds the frame at position - (window - 1) + s; a
    query sees the frames max(0, p - window + 1) .. p."""
    slots = torch.arange(window - 1 + frames, device=position.device)
    frame = torch.arange(frames, device=position.device).repeat_interleave(group)[:, None]
    in_window = (slots >= frame) & (slots <= frame + window - 1)
    started = slots >= (window - 1) - position[:, None, None]
    visible = in_window & started
    hidden = torch.full((), float("-inf"), dtype=dtype, device=position.device)
    return torch.where(visible, torch.zeros((), dtype=dtype, device=position.device), hidden)[:, None]


def codec_window_attention(
    qkv: Tensor, cos: Tensor, sin: Tensor, cache: Tensor, position: Tensor
) -> tuple[Tensor, Tensor]:
    """The codec transformer's attention for a pass of n frames from `position` [B]
    (`codec.SlidingWindowAttention`): qkv [B, n, kv_heads, group + 2, dim] (a KV head's query rows, key,
    value), cos and sin [B, n, 1, group + 2, dim] (`PreTransformer.rope`: the value rows at angle 0), cache
    [B, kv_heads, window - 1, 2 * dim] (RoPE'd keys then values, oldest first). Returns the attention output
    [B, n, kv_heads * group * dim] and the next cache (the last window - 1 of the cached frames and the
    pass's).

    One RoPE pass (q * cos + roll(q, dim / 2) * sin) covers queries, keys and values; a KV head's queries
    attend as n * group rows (frame-major) over its keys, so grouped KV heads need no repeat."""
    batch, frames, kv_heads, rows, dim = qkv.shape
    group, window = rows - 2, cache.shape[2] + 1
    qkv = torch.addcmul(qkv * cos, qkv.roll(dim // 2, dims=-1), sin)
    new = qkv[:, :, :, group:].transpose(1, 2)  # [B, kv_heads, n, 2, dim]
    kv = torch.cat([cache.view(*cache.shape[:3], 2, dim), new], dim=2).flatten(3)
    queries = qkv[:, :, :, :group].transpose(1, 2).reshape(batch, kv_heads, frames * group, dim)
    mask = codec_window_mask(position, frames, group, window, qkv.dtype)
    attention = torch.nn.functional.scaled_dot_product_attention
    out = attention(queries, kv[..., :dim], kv[..., dim:], attn_mask=mask)
    out = out.unflatten(2, (frames, group)).transpose(1, 2).reshape(batch, frames, kv_heads * group * dim)
    return out, kv[:, :, frames:]


def snake_beta(x: Tensor, frequency: Tensor, inverse_beta: Tensor, bias: Tensor | None = None) -> Tensor:
    """The codec's SnakeBeta of x [B, C, T] (plus a per-channel bias first, when given), from per-channel
    e^alpha and 1 / (e^beta + 1e-9) [C]: the official expression op by op,
    x + 1 / (e^beta + 1e-9) * sin(x * e^alpha)^2."""
    if bias is not None:
        x = x + bias[:, None]
    return x + inverse_beta[:, None] * torch.sin(x * frequency[:, None]).pow(2)


def linear(x: Tensor, weight: Tensor | QuantizedWeight, bias: Tensor | None = None) -> Tensor:
    """bf16 weights: `layers.linear` (the model's own product). 8-bit: fp32 product of the stored codes,
    times the channel scale, plus bias, rounded once to x's dtype (what the kernel computes)."""
    if isinstance(weight, Tensor):
        return layers.linear(x, weight, bias)
    out = (x.float() @ weight.data.float().t()) * weight.scale
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)


def linear_swiglu(x: Tensor, gate_up: Tensor | QuantizedWeight) -> Tensor:
    """SiLU(gate) * up of the product with the fused weight [gate; up] (gate rows first)."""
    product = linear(x, gate_up)
    width = product.shape[-1] // 2
    return silu_mul(product[..., :width], product[..., width:])


def rms_norm_linear(
    x: Tensor,
    norm_weight: Tensor,
    eps: float,
    weight: Tensor | QuantizedWeight,
    delta: Tensor | None = None,
    swiglu: bool = False,
) -> tuple[Tensor, Tensor]:
    """(linear or linear_swiglu of rms_norm(s) * norm_weight, s) with s = x + delta (x when delta is None):
    a decoder block's residual add, the RMSNorm after it and the projection that reads it."""
    s = x if delta is None else (x + delta).to(x.dtype)
    h = layers.rms_norm(s, norm_weight, eps)
    return (linear_swiglu(h, weight) if swiglu else linear(h, weight)), s


def sample(
    logits: Tensor,
    uniforms: Tensor,
    params: sampling.SamplingRows,
    penalized: Tensor | None = None,
    banned: Tensor | None = None,
) -> Tensor:
    """The engine's sampler, `sampling.sample_with_uniform`, unchanged."""
    return sampling.sample_with_uniform(logits, uniforms, params, penalized, banned)


def gather_rows(sources: list[Tensor], index: Tensor) -> list[Tensor]:
    """Rows `index` of each source, as new tensors [len(index), ...]."""
    return [source.index_select(0, index) for source in sources]


def scatter_rows_(targets: list[Tensor], index: Tensor, sources: list[Tensor]) -> None:
    """Row index[r] of each target <- row r of its source (the indices distinct)."""
    for target, source in zip(targets, sources, strict=True):
        target.index_copy_(0, index, source)

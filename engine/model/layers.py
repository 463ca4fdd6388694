"""Reference ops of the talker and the code predictor: the numerics every kernel is judged against.

The rules follow the official qwen-tts 0.1.1 code (model.md §8.5, §8.6):
- RMSNorm computes in fp32, casts back to the model dtype, then multiplies by the weight in that dtype.
- RoPE is plain 1D rotate-half with pairing (i, i + head_dim/2); cos/sin are computed in fp32 and cast.
- q/k RMSNorm is applied per head before RoPE; GQA groups are contiguous (query head h reads KV head
  h // (heads / kv_heads)).
- Attention follows one of the official backends (`AttentionImpl`): "eager" (the default, and what the CUDA
  graphs capture) or "sdpa" (CPU reference of HF's sdpa path). They are different math, not just different
  kernels; see `attention` and `sdpa_attention`.

Every op here treats sessions independently *and bit-reproducibly*: a session's result never depends on
how many other sessions share the call. That is what makes the batched frame step batch invariant (see
`linear`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm over the last dim: fp32 statistics, cast back, then scale in the model dtype."""
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and sin of shape [*positions.shape, head_dim], computed in fp32 (as HF does) and cast to dtype.

    Models call this once for a table of all positions and gather rows from it, so a position's angles
    never depend on how many positions are computed together (vectorized and scalar `cos` may differ).
    """
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    freqs = positions.float().unsqueeze(-1) * inv_freq
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate-half RoPE; cos/sin must broadcast against x (same last dim)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos) + (rotated * sin)


def summed_embeddings(codes: Tensor, tables: list[Tensor]) -> Tensor:
    """codes [B, G] -> [B, H]: sum_j tables[j][codes[:, j]] as one stacked reduction (model dtype, fp32
    accumulation, one rounding), as the reference sums a frame's codebook embeddings."""
    parts = [F.embedding(codes[:, j], table) for j, table in enumerate(tables)]
    return torch.stack(parts, dim=1).sum(dim=1)


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """SiLU(gate) * up, the MLP activation of the Qwen3 block."""
    return F.silu(gate) * up


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x @ weight.T (+ bias), as one product per session: x [..., T, in] -> [..., T, out].

    A 2-D x [rows, in] is `rows` sessions of one token each; a higher-rank x [*sessions, T, in] holds T
    tokens per session (a prompt, or the predictor's first two positions).

    Why not F.linear over all rows: CPU BLAS picks different kernels and blockings for different M, so a
    row of a [B, in] GEMM can round differently from the same row computed alone (measured: up to 6e-5
    apart for 2048x6144 fp32). A batched matmul whose batch elements are the sessions' [T, in] x [in, out]
    products does the same arithmetic for a session whatever the number of sessions, which is what batch
    invariance needs. The expanded weight has batch stride 0, so nothing is copied.

    Why a session's T tokens share one product (M = T) instead of one product per token: that is what the
    official model computes (nn.Linear over the [1, T, in] sequence), and a GEMM with M = T rounds
    differently from T products with M = 1. Measured on CPU in bf16 at the real 2048/6144 widths: about 2
    in 10,000 outputs of a 60-token prompt differ by one bf16 ulp between the two, while the bmm of M = T
    equals F.linear on those T rows bit for bit (M = 1 and M = 2 agree either way). A bias is added
    inside the product (baddbmm), with one rounding like F.linear's addmm.
    """
    if x.dim() == 2:
        x = x.unsqueeze(1)
        squeeze = True
    else:
        squeeze = False
    sessions = x.reshape(-1, x.shape[-2], x.shape[-1])
    weights = weight.t().unsqueeze(0).expand(sessions.shape[0], -1, -1)
    if bias is None:
        out = torch.bmm(sessions, weights)
    else:
        biases = bias.view(1, 1, -1).expand(sessions.shape[0], sessions.shape[1], -1)
        out = torch.baddbmm(biases, sessions, weights)
    out = out.reshape(*x.shape[:-1], weight.shape[0])
    return out.squeeze(1) if squeeze else out


class CacheScales(NamedTuple):
    """The float32 scales of an e4m3 KV cache's rows, one a (slot, KV head, position): a row holds
    `reference.quantize_rows_fp8` codes of its keys or values, which times its scale give them back."""

    k: Tensor
    v: Tensor


@dataclass
class KVCache:
    """Preallocated keys and values: [layers, slots, kv_heads, max_len, head_dim] each.

    A slot belongs to one session; a batch is the index set of its sessions' slots. Shapes never change
    after construction, so a step can be captured in a CUDA graph. An e4m3 cache (fast mode's talker, on the
    attention kernels) holds codes and their rows' `scales` [layers, slots, kv_heads, max_len]; only the
    kernels' ops (and their references) read and write it.
    """

    k: Tensor
    v: Tensor
    scales: CacheScales | None = None

    @staticmethod
    def position_bytes(layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """The bytes one position of one slot takes in a pool `allocate` makes: its keys and values in every
        layer and KV head, with an e4m3 pool's float32 scale a row."""
        scale = 4 if dtype == torch.float8_e4m3fn else 0
        return 2 * layers * kv_heads * (head_dim * dtype.itemsize + scale)

    @classmethod
    def allocate(
        cls,
        layers: int,
        slots: int,
        kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> KVCache:
        shape = (layers, slots, kv_heads, max_len, head_dim)
        scales = None
        if dtype == torch.float8_e4m3fn:
            scales = CacheScales(
                *(torch.zeros(shape[:-1], dtype=torch.float32, device=device) for _ in range(2))
            )
        return cls(
            torch.zeros(shape, dtype=dtype, device=device),
            torch.zeros(shape, dtype=dtype, device=device),
            scales,
        )


def _eager_core(q: Tensor, k: Tensor, v: Tensor, visible: Tensor | None, scale: float) -> Tensor:
    """HF's `eager_attention_forward`, op for op. q [B, T, heads, D]; k, v [B, kv_heads, S, D];
    visible [B, T, S] (None: every key is visible). Returns [B, T, heads * D].

    The roundings are the eager ones: Q @ K^T rounded to the model dtype, times the scale (a second
    rounding), softmax in fp32 over the masked scores, the probabilities rounded to the model dtype, @ V.

    The products have the eager shapes too: per query head, [T, D] x [D, S] and [T, S] x [S, D]. The
    official code repeats each KV head for its query heads (repeat_kv) and multiplies per head; here each
    group g of query heads (head h = kv * groups + g) is multiplied with the KV heads directly, the same
    per-head product without copying the cache. Folding the groups into the rows of one product
    ([T * groups, D] x [D, S]) would be cheaper but rounds differently: on CPU in bf16 at the real geometry
    (16 heads, 8 KV heads, D 128) 24 of 112 random decode cases differed from the official output by an
    ulp, against none this way.
    """
    batch, steps, heads, head_dim = q.shape
    kv_heads, length = k.shape[1], k.shape[2]
    groups = heads // kv_heads
    q = q.transpose(1, 2).reshape(batch, kv_heads, groups, steps, head_dim)
    keys = k.transpose(2, 3)
    scores = torch.stack([torch.matmul(q[:, :, g], keys) for g in range(groups)], dim=2) * scale
    if visible is not None:
        scores = scores.masked_fill(~visible.view(batch, 1, 1, steps, length), float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)  # [B, kv_heads, G, T, S]
    out = torch.stack([torch.matmul(weights[:, :, g], v) for g in range(groups)], dim=2)
    return out.reshape(batch, heads, steps, head_dim).transpose(1, 2).reshape(batch, steps, heads * head_dim)


def _visible(q_positions: Tensor, length: int) -> Tensor:
    """[B, T, length]: key j is visible to a query at position p when j <= p."""
    key_index = torch.arange(length, device=q_positions.device)
    return key_index.view(1, 1, length) <= q_positions.unsqueeze(-1)


def _per_row(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_positions: Tensor,
    attend: Callable[[Tensor, Tensor, Tensor, Tensor], Tensor],
) -> Tensor:
    """`attend(q, k, v, q_positions)` for each row alone, over exactly its keys 0 .. its last position.

    The official model attends over the keys written so far and nothing more, and the CPU kernels'
    reductions (the score and P @ V products, the softmax sums) block differently for different key
    counts: masking a longer cache gives the same math but not always the same roundings (measured on CPU
    in bf16 over the 2..16 predictor lengths in a 16-slot cache: about 1 in 2,000 softmaxes). One call per
    row is batch invariant by construction, but its shapes follow the rows' lengths, read on the host.
    """
    ends = (q_positions[:, -1] + 1).tolist()
    rows = []
    for row, end in enumerate(ends):
        one = slice(row, row + 1)
        rows.append(attend(q[one], k[one, :, :end], v[one, :, :end], q_positions[one]))
    return torch.cat(rows)


def attention(q: Tensor, k: Tensor, v: Tensor, q_positions: Tensor, scale: float) -> Tensor:
    """Causal GQA attention of new queries over a cache, with HF's eager roundings (`_eager_core`).

    q [B, T, heads, D]; k, v [B, kv_heads, S, D] (S = the cache length); q_positions [B, T].
    Key j is visible to a query at position p when j <= p. Returns [B, T, heads * D].

    On CPU each row attends over exactly its own keys (`_per_row`), which equals the official eager
    attention bit for bit. On CUDA every row attends over all S keys, the invisible ones masked to weight
    exactly 0: fixed shapes that a CUDA graph can capture and that do not depend on which rows share the
    batch, at the price of reductions over S rather than the official's L keys (the same math; on CPU it
    would round differently about once in 2,000 softmaxes, and cuBLAS makes no promise either way).
    """
    if q.is_cuda:
        return _eager_core(q, k, v, _visible(q_positions, k.shape[2]), scale)

    def attend(q: Tensor, k: Tensor, v: Tensor, positions: Tensor) -> Tensor:
        return _eager_core(q, k, v, _visible(positions, k.shape[2]) if q.shape[1] > 1 else None, scale)

    return _per_row(q, k, v, q_positions, attend)


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, q_positions: Tensor, scale: float) -> Tensor:
    """The same contract as `attention`, computed as HF's sdpa backend computes one unpadded sequence.

    For a single sequence HF passes no mask: `F.scaled_dot_product_attention(q, k, v, scale=scale,
    is_causal=T > 1, enable_gqa=True)` over exactly the keys written so far. That is different math from
    the eager backend: torch's fused kernel keeps the scores in fp32 (no rounding of Q @ K^T to the model
    dtype), runs an online softmax, rounds the *unnormalised* probabilities to the model dtype before @ V
    and divides by the fp32 sum at the end. In bf16 about a third of the attention outputs differ by an
    ulp from the eager ones, and greedy codes drift apart within a few frames.

    The fused kernel's reductions depend on the key count even more than the eager ones (masking a longer
    cache changed up to 1% of the outputs), so each row runs alone over its own keys (`_per_row`) with
    the official arguments: batch invariant and, on CPU, bit-exact against the official sdpa path. The
    host-read lengths keep it out of CUDA graphs: it is a CPU reference, not the GPU frame path. A chunk
    of queries that does not start at position 0 gets an explicit causal mask (the official model never
    runs one; torch's `is_causal` would align the diagonal to the top left).
    """

    def attend(q: Tensor, k: Tensor, v: Tensor, positions: Tensor) -> Tensor:
        _, steps, heads, head_dim = q.shape
        mask = None
        if steps > 1 and int(positions[0, 0]) != 0:
            mask = _visible(positions, k.shape[2]).unsqueeze(1)  # [1, 1, T, L]
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),  # [1, heads, T, D], the layout HF hands to sdpa
            k,
            v,
            attn_mask=mask,
            scale=scale,
            is_causal=steps > 1 and mask is None,
            enable_gqa=True,
        )
        return out.transpose(1, 2).reshape(1, steps, heads * head_dim)

    return _per_row(q, k, v, q_positions, attend)


AttentionImpl = Literal["eager", "sdpa"]
"""Which official attention backend a model reproduces (HF `attn_implementation`)."""

ATTENTION: dict[str, Callable[[Tensor, Tensor, Tensor, Tensor, float], Tensor]] = {
    "eager": attention,
    "sdpa": sdpa_attention,
}


class Linear(nn.Module):
    """A weight (and optional bias) applied with the batch-invariant `linear`."""

    def __init__(self, weight: Tensor, bias: Tensor | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    def __init__(self, weight: Tensor, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


@dataclass(frozen=True)
class BlockShape:
    """The geometry one decoder block needs besides its weights."""

    heads: int
    kv_heads: int
    head_dim: int
    eps: float


class DecoderBlock(nn.Module):
    """The Qwen3 block shared by talker and predictor: pre-norm attention (q/k norm, RoPE, GQA) + SwiGLU.

    `attention` picks the official backend whose roundings the block reproduces (`AttentionImpl`).
    """

    def __init__(
        self, shape: BlockShape, tensors: dict[str, Tensor], prefix: str, attention: AttentionImpl = "eager"
    ) -> None:
        super().__init__()
        self.shape = shape
        if attention not in ATTENTION:
            raise ValueError(f"unknown attention {attention!r} (eager or sdpa)")
        self.attention = ATTENTION[attention]

        def weight(name: str) -> Tensor:
            return tensors[f"{prefix}.{name}.weight"]

        self.input_layernorm = RMSNorm(weight("input_layernorm"), shape.eps)
        self.q_proj = Linear(weight("self_attn.q_proj"))
        self.k_proj = Linear(weight("self_attn.k_proj"))
        self.v_proj = Linear(weight("self_attn.v_proj"))
        self.o_proj = Linear(weight("self_attn.o_proj"))
        self.q_norm = RMSNorm(weight("self_attn.q_norm"), shape.eps)
        self.k_norm = RMSNorm(weight("self_attn.k_norm"), shape.eps)
        self.post_attention_layernorm = RMSNorm(weight("post_attention_layernorm"), shape.eps)
        self.gate_proj = Linear(weight("mlp.gate_proj"))
        self.up_proj = Linear(weight("mlp.up_proj"))
        self.down_proj = Linear(weight("mlp.down_proj"))

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        positions: Tensor,
        cache_k: Tensor,
        cache_v: Tensor,
        slots: Tensor,
    ) -> Tensor:
        """x [B, T, H] at `positions` [B, T]; cos/sin [B, T, D]; writes K/V into cache rows `slots` [B].

        cache_k / cache_v are this layer's [slots, kv_heads, max_len, D] views of a KVCache.
        """
        s = self.shape
        batch, steps, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_norm(self.q_proj(h).view(batch, steps, s.heads, s.head_dim))
        k = self.k_norm(self.k_proj(h).view(batch, steps, s.kv_heads, s.head_dim))
        v = self.v_proj(h).view(batch, steps, s.kv_heads, s.head_dim)
        q = apply_rope(q, cos.unsqueeze(2), sin.unsqueeze(2))
        k = apply_rope(k, cos.unsqueeze(2), sin.unsqueeze(2))
        slot_index = slots.unsqueeze(1).expand(batch, steps)
        cache_k[slot_index, :, positions] = k
        cache_v[slot_index, :, positions] = v
        attended = self.attention(q, cache_k[slots], cache_v[slots], positions, s.head_dim**-0.5)
        x = x + self.o_proj(attended)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(swiglu(self.gate_proj(h), self.up_proj(h)))

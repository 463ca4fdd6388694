"""Reference ops of the talker and the code predictor: the numerics every kernel is judged against.

The rules follow the official qwen-tts 0.1.1 code (model.md §8.5, §8.6):
- RMSNorm computes in fp32, casts back to the model dtype, then multiplies by the weight in that dtype.
- RoPE is plain 1D rotate-half with pairing (i, i + head_dim/2); cos/sin are computed in fp32 and cast.
- q/k RMSNorm is applied per head before RoPE; GQA groups are contiguous (query head h reads KV head
  h // (heads / kv_heads)); attention softmax runs in fp32 like the eager backend.

Every op here treats rows independently *and bit-reproducibly*: a row's result never depends on how many
other rows share the call. That is what makes the batched frame step batch invariant (see `linear`).
"""

from __future__ import annotations

from dataclasses import dataclass

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


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """SiLU(gate) * up, the MLP activation of the Qwen3 block."""
    return F.silu(gate) * up


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x @ weight.T (+ bias), computed as one M=1 product per row.

    Why not F.linear: CPU BLAS picks different kernels and blockings for different M, so a row of a
    [B, in] GEMM can round differently from the same row computed alone (measured: up to 6e-5 apart for
    2048x6144 fp32). A batched matmul whose every batch element is a [1, in] x [in, out] product does
    the same arithmetic for a row whatever B is, which is what batch invariance needs. The expanded
    weight has batch stride 0, so nothing is copied. A bias is added inside the product (baddbmm), with
    one rounding like F.linear's addmm.
    """
    rows = x.reshape(-1, 1, x.shape[-1])
    weights = weight.t().unsqueeze(0).expand(rows.shape[0], -1, -1)
    if bias is None:
        out = torch.bmm(rows, weights)
    else:
        out = torch.baddbmm(bias.view(1, 1, -1).expand(rows.shape[0], 1, -1), rows, weights)
    return out.reshape(*x.shape[:-1], weight.shape[0])


@dataclass
class KVCache:
    """Preallocated keys and values: [layers, slots, kv_heads, max_len, head_dim] each.

    A slot belongs to one session; a batch is the index set of its sessions' slots. Shapes never change
    after construction, so a step can be captured in a CUDA graph.
    """

    k: Tensor
    v: Tensor

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
        return cls(
            torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)
        )


def attention(q: Tensor, k: Tensor, v: Tensor, q_positions: Tensor, scale: float) -> Tensor:
    """Causal GQA attention of new queries over a whole cache, eager-style (fp32 softmax).

    q [B, T, heads, D]; k, v [B, kv_heads, S, D] (S = the cache length); q_positions [B, T].
    Key j is visible to a query at position p when j <= p. Every row attends over all S keys (the
    invisible ones get weight exactly 0), so the shapes, and with them the arithmetic, do not depend on
    which other rows share the batch. Returns [B, T, heads * D].
    """
    batch, steps, heads, head_dim = q.shape
    kv_heads, length = k.shape[1], k.shape[2]
    groups = heads // kv_heads
    # Query head h = kv * groups + g reads KV head kv: fold (T, groups) into the query rows of each KV head.
    q = q.reshape(batch, steps, kv_heads, groups, head_dim).permute(0, 2, 1, 3, 4)
    q = q.reshape(batch, kv_heads, steps * groups, head_dim)
    scores = torch.matmul(q, k.transpose(2, 3)) * scale
    key_index = torch.arange(length, device=q.device)
    visible = key_index.view(1, 1, length) <= q_positions.unsqueeze(-1)  # [B, T, S]
    visible = visible.repeat_interleave(groups, dim=1).unsqueeze(1)  # [B, 1, T*groups, S]
    scores = scores.masked_fill(~visible, float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    out = torch.matmul(weights, v)  # [B, kv_heads, T*groups, D]
    out = out.reshape(batch, kv_heads, steps, groups, head_dim).permute(0, 2, 1, 3, 4)
    return out.reshape(batch, steps, heads * head_dim)


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
    """The Qwen3 block shared by talker and predictor: pre-norm attention (q/k norm, RoPE, GQA) + SwiGLU."""

    def __init__(self, shape: BlockShape, tensors: dict[str, Tensor], prefix: str) -> None:
        super().__init__()
        self.shape = shape

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
        attended = attention(q, cache_k[slots], cache_v[slots], positions, s.head_dim**-0.5)
        x = x + self.o_proj(attended)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(swiglu(self.gate_proj(h), self.up_proj(h)))

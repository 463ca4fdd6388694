"""The official sampling rules as pure, batched functions over tensors (model.md §4).

Talker (codebook 0), in the order transformers 4.57.3 applies them: fp32 logits -> repetition penalty
over the unique cb0 history (a logit < 0 is multiplied by the penalty, any other divided) -> EOS banned
while fewer than 2 frames exist -> ids 2048..3071 except EOS suppressed -> temperature -> top-k (keeps
every score >= the k-th largest, so ties can keep more than k; 0 = off) -> top-p (HF style; 1.0 = off)
-> one draw. The predictor (codebooks 1..15) uses temperature, top-k and top-p only.

A draw is defined by `sample_with_uniform`: given the filtered scores and one uniform u in [0, 1) per row,
pick the token by inverse CDF in vocabulary index order. Precision, so that another implementation (the
CUDA sampling kernel) can pick the same token for the same u:
- the draw uses the unnormalized fp32 weights w = exp(s - max(s)) of the filtered scores (filtered ids get
  exactly 0), never a normalized softmax: normalizing divides by an fp32 sum whose rounding depends on the
  summation order, which no parallel kernel can reproduce, while exp of the same fp32 difference is the
  same correctly specified libm call on both sides. The distribution is the same (w / sum(w) = softmax);
- the weights' cumulative sum is taken in float64 in index order (any association: float64 rounding moves
  a boundary by ~1e-16 relative, far below what one fp32 weight can shift);
- the token is the first index whose cumulative sum is > u * total (total = the last cumulative sum),
  clamped to the last index with a non-zero weight (u * total can round up to total).
Top-p computes its cumulative mass from the same weights: fp32(float64 running sum / float64 total), in
stable ascending order. HF computes fp32 softmax then a cumulative sum; the two differ only when a mass
lies within an fp32 ulp of 1 - top_p.
Greedy rows take the argmax after penalty and bans (the lowest index on ties) and ignore u.
Every row carries its own parameters; nothing here holds state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..transfer import upload

EOS_BAN_FRAMES = 2
"""EOS is banned while fewer than this many cb0 tokens exist (official min_new_tokens=2)."""
CONTROL_TOKENS = 1024
"""The top 1024 ids of the talker vocabulary are control tokens; all but EOS are suppressed."""


@dataclass(frozen=True)
class SamplingRows:
    """Per-row sampling parameters of a batch, tensors of shape [B] on the logits' device.

    greedy bool; temperature fp32; top_k int64 (0 = off); top_p float64 (1.0 = off);
    repetition_penalty fp32 (1.0 = off, and ignored where no history mask is given).
    """

    greedy: Tensor
    temperature: Tensor
    top_k: Tensor
    top_p: Tensor
    repetition_penalty: Tensor

    @classmethod
    def single(
        cls,
        *,
        greedy: bool,
        temperature: float,
        top_k: int,
        top_p: float,
        repetition_penalty: float = 1.0,
        device: torch.device | str = "cpu",
    ) -> SamplingRows:
        """One row, made on the host and uploaded in one copy from pinned memory: `torch.tensor(...,
        device=cuda)` would wait for the stream, i.e. for the frames of the sessions already running
        (`transfer.upload`), and a copy per field costs host time while the GPU idles at a request's start.

        The fields travel as the bytes of one buffer and are views into it on the device: each value is
        converted on the host by `torch.tensor` in its own dtype, so the rows are what five tensors would be.
        """
        packed = torch.cat(
            [
                torch.tensor([top_p], dtype=torch.float64).view(torch.uint8),
                torch.tensor([top_k], dtype=torch.int64).view(torch.uint8),
                torch.tensor([temperature, repetition_penalty], dtype=torch.float32).view(torch.uint8),
                torch.tensor([greedy], dtype=torch.bool).view(torch.uint8),
            ]
        )
        fields = upload(packed, torch.device(device))
        scales = fields[16:24].view(torch.float32)
        return cls(
            greedy=fields[24:25].view(torch.bool),
            temperature=scales[0:1],
            top_k=fields[8:16].view(torch.int64),
            top_p=fields[0:8].view(torch.float64),
            repetition_penalty=scales[1:2],
        )

    @classmethod
    def cat(cls, rows: Sequence[SamplingRows]) -> SamplingRows:
        return cls(
            greedy=torch.cat([r.greedy for r in rows]),
            temperature=torch.cat([r.temperature for r in rows]),
            top_k=torch.cat([r.top_k for r in rows]),
            top_p=torch.cat([r.top_p for r in rows]),
            repetition_penalty=torch.cat([r.repetition_penalty for r in rows]),
        )


def apply_repetition_penalty(scores: Tensor, penalized: Tensor, penalty: Tensor) -> Tensor:
    """HF RepetitionPenalty: for tokens in the history, x < 0 -> x * p, else x / p (each token once)."""
    p = penalty.unsqueeze(-1)
    return torch.where(penalized, torch.where(scores < 0, scores * p, scores / p), scores)


def talker_banned_tokens(frames_generated: Tensor, vocab_size: int, eos_id: int) -> Tensor:
    """[B, vocab] bool: the suppressed control ids, plus EOS for rows with fewer than 2 frames."""
    index = torch.arange(vocab_size, device=frames_generated.device)
    control = (index >= vocab_size - CONTROL_TOKENS) & (index != eos_id)
    eos_banned = (index == eos_id).unsqueeze(0) & (frames_generated < EOS_BAN_FRAMES).unsqueeze(-1)
    return control.unsqueeze(0) | eos_banned


def top_k_filter(scores: Tensor, top_k: Tensor) -> Tensor:
    """Keep every score >= the row's k-th largest (ties survive); rows with k == 0 are untouched."""
    vocab = scores.shape[-1]
    descending = scores.sort(dim=-1, descending=True).values
    kth = descending.gather(-1, (top_k.clamp(1, vocab) - 1).unsqueeze(-1))
    drop = (scores < kth) & (top_k > 0).unsqueeze(-1)
    return scores.masked_fill(drop, float("-inf"))


def unnormalized_weights(scores: Tensor) -> Tensor:
    """fp32 exp(s - max(s)) per row: the draw's weights (0 for filtered ids; see the module docstring)."""
    return (scores - scores.max(dim=-1, keepdim=True).values).exp()


def top_p_filter(scores: Tensor, top_p: Tensor) -> Tensor:
    """HF TopP; rows with top_p >= 1.0 are untouched.

    Sort ascending (stable: among equal scores the lower index counts as smaller), cumulative mass =
    fp32(float64 running sum of the weights / float64 total), drop tokens whose cumulative mass is
    <= fp32(1 - top_p), always keep the largest.
    """
    ascending, order = scores.sort(dim=-1, descending=False, stable=True)
    running = unnormalized_weights(ascending).double().cumsum(dim=-1)
    cumulative = (running / running[:, -1:]).float()
    threshold = (1.0 - top_p).float().unsqueeze(-1)
    drop_sorted = cumulative <= threshold
    drop_sorted[:, -1] = False
    drop_sorted &= (top_p < 1.0).unsqueeze(-1)
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return scores.masked_fill(drop, float("-inf"))


def pick_with_uniform(scores: Tensor, u: Tensor) -> Tensor:
    """Inverse-CDF draw over fp32 scores [B, V] with uniforms u [B] (float64, in [0, 1))."""
    weights = unnormalized_weights(scores)
    cumulative = weights.double().cumsum(dim=-1)
    threshold = u.double() * cumulative[:, -1]
    token = torch.searchsorted(cumulative, threshold.unsqueeze(-1), right=True).squeeze(-1)
    vocab = scores.shape[-1]
    last_nonzero = vocab - 1 - (weights > 0).flip(-1).int().argmax(dim=-1)
    return torch.minimum(token, last_nonzero)


def filter_scores(
    logits: Tensor,
    params: SamplingRows,
    penalized: Tensor | None = None,
    banned: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """(processed, warped) fp32 scores [B, V]: processed = after penalty and bans (what greedy argmaxes),
    warped = processed after temperature, top-k and top-p (what a draw samples from).

    penalized [B, V] bool marks each row's history (repetition penalty); banned [B, V] bool marks ids
    set to -inf (suppression and the EOS ban). Both are None for the predictor.
    """
    processed = logits.float()
    if penalized is not None:
        processed = apply_repetition_penalty(processed, penalized, params.repetition_penalty)
    if banned is not None:
        processed = processed.masked_fill(banned, float("-inf"))
    temperature = torch.where(params.greedy, torch.ones_like(params.temperature), params.temperature)
    warped = processed / temperature.unsqueeze(-1)
    warped = top_k_filter(warped, params.top_k)
    return processed, top_p_filter(warped, params.top_p)


def sample_with_uniform(
    logits: Tensor,
    u: Tensor,
    params: SamplingRows,
    penalized: Tensor | None = None,
    banned: Tensor | None = None,
) -> Tensor:
    """One token per row: logits [B, V] (any float dtype), u [B] -> int64 [B] (see the module docstring)."""
    processed, warped = filter_scores(logits, params, penalized, banned)
    return torch.where(params.greedy, processed.argmax(dim=-1), pick_with_uniform(warped, u))

"""One lockstep frame for B sessions, as pure functions over tensors (no Session objects).

This is the boundary that stays the same on CPU, on the GPU eagerly and inside a CUDA graph: every input
is a per-row tensor, every shape depends on B only, and each row's arithmetic is independent of the other
rows (see `model.layers.linear` and `model.layers.attention`), so a session's codes do not depend on which
sessions share its batch.

Per frame: the talker's post-norm hidden -> cb0 (uniform 0 of the row) -> the code predictor -> cb1..15
(uniforms 1..15). Rows whose cb0 is EOS still run the predictor (fixed shapes); the caller drops them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from ..model.layers import KVCache
from ..model.predictor import CodePredictor
from ..model.talker import Talker
from .sampling import SamplingRows, sample_with_uniform, talker_banned_tokens

UNIFORMS_PER_FRAME = 16
"""Draws per frame, in this order: cb0, then cb1..cb15."""


@dataclass(frozen=True)
class FrameRows:
    """Per-row sampling state of one batched frame.

    uniforms [B, 16] float64; cb0_history [B, talker vocab] bool (every cb0 of the row so far);
    frames_generated [B] int64 (cb0 tokens so far, for the EOS ban).
    """

    uniforms: Tensor
    cb0_history: Tensor
    frames_generated: Tensor
    talker_sampling: SamplingRows
    predictor_sampling: SamplingRows


def complete_frames(talker: Talker, predictor: CodePredictor, hidden: Tensor, rows: FrameRows) -> Tensor:
    """From the talker's post-norm hidden [B, H] to the frame's codes [B, 16] (cb0 may be EOS)."""
    tc = talker.config.talker
    banned = talker_banned_tokens(rows.frames_generated, tc.vocab_size, tc.codec_eos_token_id)
    cb0 = sample_with_uniform(
        talker.logits(hidden), rows.uniforms[:, 0], rows.talker_sampling, rows.cb0_history, banned
    )

    def choose(logits: Tensor, group: int) -> Tensor:
        return sample_with_uniform(logits, rows.uniforms[:, 1 + group], rows.predictor_sampling)

    rest = predictor.generate(hidden, talker.codec_embed(cb0), choose)
    return torch.cat([cb0.unsqueeze(1), rest], dim=1)


def prefill_frames(
    talker: Talker,
    predictor: CodePredictor,
    cache: KVCache,
    prompts: list[Tensor],
    slots: Tensor,
    rows: FrameRows,
) -> Tensor:
    """Run B sessions' prompts (prompts[i] [L_i, H] into cache slot slots[i]) and produce their frame 0:
    codes [B, 16].

    Each prompt runs alone (a prompt is one product of M = L per linear, as the official model computes it,
    see `layers.linear`); the B last-token hiddens then complete their frames in one batch, which is batch
    invariant on CPU (tests/unit/test_engine_loop.py).
    """
    hidden = torch.cat([prefill_hidden(talker, cache, p, slots[i : i + 1]) for i, p in enumerate(prompts)])
    return complete_frames(talker, predictor, hidden, rows)


def prefill_hidden(talker: Talker, cache: KVCache, prompt: Tensor, slot: Tensor) -> Tensor:
    """The prompt [L, H] into cache slot `slot` [1] at positions 0..L-1: the last token's post-norm
    hidden [1, H]."""
    positions = torch.arange(prompt.shape[0], device=prompt.device).unsqueeze(0)
    return talker(prompt.unsqueeze(0), positions, slot, cache)[:, -1]


def frame_input(talker: Talker, previous_codes: Tensor, text: Tensor) -> Tensor:
    """The talker's input embedding [B, H] of a decode step: the previous frame's 16 codes [B, 16] embedded
    and summed, plus the row's text-stream element [B, H]."""
    return talker.frame_embedding(previous_codes) + text


def decode_frames(
    talker: Talker,
    predictor: CodePredictor,
    cache: KVCache,
    previous_codes: Tensor,
    text: Tensor,
    positions: Tensor,
    slots: Tensor,
    rows: FrameRows,
) -> Tensor:
    """One talker token per row + the predictor: the next frame's codes [B, 16].

    previous_codes [B, 16] is each row's last frame, text [B, H] its text-stream element for this step,
    positions [B] the talker position of the new token, slots [B] the rows' cache slots.
    """
    embeds = frame_input(talker, previous_codes, text)
    hidden = talker(embeds.unsqueeze(1), positions.unsqueeze(1), slots, cache)[:, 0]
    return complete_frames(talker, predictor, hidden, rows)


class FrameBackend(Protocol):
    """What `VoiceDesignEngine` calls to compute frames; a CUDA-graph backend replaces the eager one.

    scratch_slots: cache slots the backend needs beyond the engine's sessions (the engine never hands
    them out). The codes both entries return may be a buffer that the backend's next call overwrites (a
    graph's output): the caller copies what it keeps before calling again.
    """

    scratch_slots: int

    def decode_frames(
        self,
        talker: Talker,
        predictor: CodePredictor,
        cache: KVCache,
        previous_codes: Tensor,
        text: Tensor,
        positions: Tensor,
        slots: Tensor,
        rows: FrameRows,
    ) -> Tensor: ...

    def prefill_frames(
        self,
        talker: Talker,
        predictor: CodePredictor,
        cache: KVCache,
        prompts: list[Tensor],
        slots: Tensor,
        rows: FrameRows,
    ) -> Tensor: ...


class EagerFrameBackend:
    """The reference backend: the functions above, run eagerly (CPU, or GPU without graphs)."""

    scratch_slots = 0
    decode_frames = staticmethod(decode_frames)
    prefill_frames = staticmethod(prefill_frames)

"""One lockstep frame for B sessions, as pure functions over tensors (no Session objects).

This is the boundary that stays the same on CPU, on the GPU eagerly and inside a CUDA graph: every input
is a per-row tensor, every shape depends on B only, and each row's arithmetic is independent of the other
rows (see `model.layers.linear` and `model.layers.attention`), so a session's codes do not depend on which
sessions share its batch.

Per frame: the talker's post-norm hidden -> cb0 (uniform 0 of the row) -> the code predictor -> cb1..15
(uniforms 1..15). Rows whose cb0 is EOS still run the predictor (fixed shapes); the caller drops them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from ..model.layers import KVCache
from ..model.predictor import CodePredictor
from ..model.talker import Talker
from ..transfer import upload
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


@dataclass(frozen=True)
class StepIndex:
    """A batch's per-row integers, one int64 tensor [5, B] (one upload): the talker position of the row's
    new token (decode steps), its cache slot, its frames generated so far (the EOS ban), its row of
    `SlotState.uniforms`, and the keys its new token attends to (position + 1: made on the host, so a frame
    graph has no kernel for it)."""

    table: Tensor

    ROWS = 5  # the table's rows (a class constant, not a field)

    @staticmethod
    def host_table(
        positions: list[int], slots: list[int], frames: list[int], uniform_rows: list[int]
    ) -> Tensor:
        """The table of a batch on the host."""
        return torch.tensor(
            [positions, slots, frames, uniform_rows, [p + 1 for p in positions]], dtype=torch.int64
        )

    @property
    def positions(self) -> Tensor:
        return self.table[0]

    @property
    def slots(self) -> Tensor:
        return self.table[1]

    @property
    def frames_generated(self) -> Tensor:
        return self.table[2]

    @property
    def uniform_rows(self) -> Tensor:
        return self.table[3]

    @property
    def lengths(self) -> Tensor:
        return self.table[4]


@dataclass(frozen=True)
class SlotState:
    """What a frame reads and records per cache slot, on the frames' device: each slot's last frame's codes
    [S, 16] (its next step's input), every cb0 drawn on it [S, talker vocab] bool (the repetition penalty's
    history), and the uniforms of its session's current block of frames (`uniforms`, rows chosen by
    `StepIndex.uniform_rows`). The engine owns it; the backends gather a batch's rows from it and record
    the batch's codes into it, so a frame graph does both inside its replay instead of a dozen small host
    launches around it.

    Every row is recorded, EOS rows too (their session ends; the next session opened on the slot clears its
    history), so a record is two device ops with no host round trip first.
    """

    last_codes: Tensor
    cb0_history: Tensor
    uniforms: Tensor
    true: Tensor  # a device scalar, what `record` writes into the history

    @classmethod
    def zeros(cls, slots: int, groups: int, vocab: int, uniform_rows: int, device: torch.device) -> SlotState:
        """`slots` rows of `groups` codes and a `vocab`-wide history; `uniform_rows` rows of uniforms."""
        return cls(
            last_codes=torch.zeros(slots, groups, dtype=torch.int64, device=device),
            cb0_history=torch.zeros(slots, vocab, dtype=torch.bool, device=device),
            uniforms=torch.zeros(uniform_rows, UNIFORMS_PER_FRAME, dtype=torch.float64, device=device),
            true=torch.ones((), dtype=torch.bool, device=device),
        )

    def with_slots(self, slots: int) -> SlotState:
        """A copy with `slots` rows of codes and history (the first ones copied), e.g. for the scratch slots
        a graph backend adds to the KV pool."""
        groups, vocab = self.last_codes.shape[1], self.cb0_history.shape[1]
        grown = SlotState.zeros(slots, groups, vocab, self.uniforms.shape[0], self.true.device)
        kept = min(slots, self.last_codes.shape[0])
        grown.last_codes[:kept].copy_(self.last_codes[:kept])
        grown.cb0_history[:kept].copy_(self.cb0_history[:kept])
        grown.uniforms.copy_(self.uniforms)
        return grown

    def frame_rows(
        self,
        index: StepIndex,
        sampling: tuple[SamplingRows, SamplingRows],
        gather: Callable[[Tensor, Tensor], Tensor] | None = None,
    ) -> FrameRows:
        """The sampling rows of the batch `index` (sampling: its talker and predictor rows). `gather(table,
        rows)` takes a table's rows along dim 0 (index_select when None; a graph frame takes them on a
        second stream)."""
        if gather is None:
            gather = _rows_of
        return FrameRows(
            uniforms=gather(self.uniforms, index.uniform_rows),
            cb0_history=gather(self.cb0_history, index.slots),
            frames_generated=index.frames_generated,
            talker_sampling=sampling[0],
            predictor_sampling=sampling[1],
        )

    def previous_codes(self, index: StepIndex) -> Tensor:
        """The last frame [B, 16] of each row's slot: a decode step's input."""
        return self.last_codes.index_select(0, index.slots)

    def record(self, index: StepIndex, codes: Tensor) -> None:
        """A batch's new frames codes [B, 16]: each row's cb0 into its slot's history, its codes as the
        slot's last frame. (A decode graph's samplers record them themselves up to
        `graphs.SAMPLERS_RECORD_MAX_ROWS` rows: `ops.DrawRecord`.)"""
        self.record_history(index, codes)
        self.record_codes(index, codes)

    def record_history(self, index: StepIndex, codes: Tensor) -> None:
        """`record`'s first half: each row's cb0 into its slot's history."""
        self.cb0_history.index_put_((index.slots, codes[:, 0]), self.true)

    def record_codes(self, index: StepIndex, codes: Tensor) -> None:
        """`record`'s second half: each row's codes as its slot's last frame."""
        self.last_codes.index_copy_(0, index.slots, codes)


def _rows_of(table: Tensor, rows: Tensor) -> Tensor:
    return table.index_select(0, rows)


def recorded_frames(
    state: SlotState,
    index: StepIndex,
    sampling: tuple[SamplingRows, SamplingRows],
    frame: Callable[[FrameRows], Tensor],
) -> Tensor:
    """`frame` (codes [B, 16] from the batch's sampling rows) on the rows gathered from `state`, its codes
    recorded there: how every backend (and a decode graph) runs a batch."""
    codes = frame(state.frame_rows(index, sampling))
    state.record(index, codes)
    return codes


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

    Both entries take the batch's per-row integers as a host tensor [5, B] (`StepIndex`'s rows; a backend
    uploads them where its frame reads them), gather the rows' inputs from the engine's `SlotState` and
    record the frames' codes into it. scratch_slots: cache slots the backend needs beyond the engine's
    sessions (the engine never hands them out). The codes both entries return may be a buffer that the
    backend's next call overwrites (a graph's output): the caller copies what it keeps before calling again.
    """

    scratch_slots: int

    def decode_frames(
        self,
        talker: Talker,
        predictor: CodePredictor,
        cache: KVCache,
        state: SlotState,
        index: Tensor,
        text: list[Tensor],
        sampling: tuple[SamplingRows, SamplingRows],
    ) -> Tensor:
        """The next frame of every row: text holds each row's text-stream element [H]."""
        ...

    def prefill_frames(
        self,
        talker: Talker,
        predictor: CodePredictor,
        cache: KVCache,
        state: SlotState,
        index: Tensor,
        prompts: list[Tensor],
        sampling: tuple[SamplingRows, SamplingRows],
    ) -> Tensor:
        """Frame 0 of every row after its prompt (prompts[i] [L_i, H] into slot i's cache)."""
        ...


class EagerFrameBackend:
    """The reference backend: the functions above, run eagerly (CPU, or GPU without graphs)."""

    scratch_slots = 0

    @staticmethod
    def decode_frames(
        talker: Talker,
        predictor: CodePredictor,
        cache: KVCache,
        state: SlotState,
        index: Tensor,
        text: list[Tensor],
        sampling: tuple[SamplingRows, SamplingRows],
    ) -> Tensor:
        rows = StepIndex(upload(index, state.true.device))
        previous, embeds = state.previous_codes(rows), torch.stack(text)
        return recorded_frames(
            state,
            rows,
            sampling,
            lambda frame_rows: decode_frames(
                talker, predictor, cache, previous, embeds, rows.positions, rows.slots, frame_rows
            ),
        )

    @staticmethod
    def prefill_frames(
        talker: Talker,
        predictor: CodePredictor,
        cache: KVCache,
        state: SlotState,
        index: Tensor,
        prompts: list[Tensor],
        sampling: tuple[SamplingRows, SamplingRows],
    ) -> Tensor:
        rows = StepIndex(upload(index, state.true.device))
        return recorded_frames(
            state,
            rows,
            sampling,
            lambda frame_rows: prefill_frames(talker, predictor, cache, prompts, rows.slots, frame_rows),
        )

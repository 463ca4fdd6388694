"""One request's state between engine calls. Only `VoiceDesignEngine` mutates it (on the engine thread)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .request import FinishReason, SynthesisRequest
from .sampling import SamplingRows
from .step import UNIFORMS_PER_FRAME

UNIFORM_BLOCK_FRAMES = 64
"""Frames of uniforms drawn (and copied to the device) at once."""

if TYPE_CHECKING:
    from ..model.codec import CodecStreamState
    from ..model.talker import PromptPlanLike


@dataclass(eq=False)
class Session:
    """Cache slot, talker position, RNG, text stream, frame count, codec state.

    The last frame's codes, the cb0 history and the uniforms of the current block live in the engine's
    per-slot device buffers (engine.py), which each batched call updates in place.

    Two frame counts, because the engine may launch a frame before it has collected the one before it
    (`VoiceDesignEngine.launch_step`): `frames_launched` (frames enqueued, counted as if none were EOS)
    decides what the next launch computes: its text element, its uniform row (and when a block is
    drawn), the EOS ban, and whether `max_frames` allows another frame; `position` advances with it.
    `frames_emitted` (frames collected, EOS excluded) decides the results: the "length" finish. Without
    a frame in flight the two are equal, as in a synchronous `step`.

    The generator is a CPU `torch.Generator` seeded with `request.seed`; every frame takes
    `UNIFORMS_PER_FRAME` float64 uniforms from it (cb0 first, then cb1..cb15), so the draw order is:
    frame 0's cb0, frame 0's 15 predictor draws, frame 1's cb0, ... They are drawn `UNIFORM_BLOCK_FRAMES`
    frames at a time (`draw_uniform_block`) and moved to the device in one copy, into the engine's
    per-slot block: the CPU generator's float64 stream does not depend on how it is split into calls, so
    the values are the same as drawing frame by frame (a seeded request gives the same tokens on every
    device), and a GPU step does no per-frame host-to-device copy for them.
    """

    request: SynthesisRequest
    plan: PromptPlanLike
    slot: int
    prompt: Tensor | None  # [L, H] prefill embeddings; None once prefill has consumed them
    prompt_length: int
    trailing_text: Tensor  # [T, H]: element k is added to the talker input that feeds frame k
    tts_pad: Tensor  # [H]: the text-stream element once the trailing text is used up
    talker_sampling: SamplingRows
    predictor_sampling: SamplingRows
    generator: torch.Generator
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    codec_state: CodecStreamState | None = None
    position: int = 0  # talker position of the next input token (advanced when a frame is launched)
    frames_emitted: int = 0  # frames collected (EOS excluded)
    frames_in_flight: int = 0  # frames launched and not collected yet
    finish_reason: FinishReason | None = None
    released: bool = False

    @property
    def prefilled(self) -> bool:
        return self.prompt is None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def frames_launched(self) -> int:
        """Frames enqueued so far (frame 0 by the prefill), as if every frame in flight were not EOS."""
        return self.frames_emitted + self.frames_in_flight

    def draw_uniform_block(self) -> Tensor:
        """The next `UNIFORM_BLOCK_FRAMES` frames' uniforms in [0, 1): [frames, 16] float64 on the CPU."""
        return torch.rand(
            UNIFORM_BLOCK_FRAMES, UNIFORMS_PER_FRAME, generator=self.generator, dtype=torch.float64
        )

    def text_element(self) -> Tensor:
        """The text-stream vector added to the talker input that feeds frame `frames_launched - 1` (the
        input of the next frame launched)."""
        index = self.frames_launched - 1
        return self.trailing_text[index] if index < self.trailing_text.shape[0] else self.tts_pad

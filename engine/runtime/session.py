"""One request's state between engine calls. Only `VoiceDesignEngine` mutates it (on the engine thread)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .request import FinishReason, SynthesisRequest
from .sampling import SamplingRows
from .step import UNIFORMS_PER_FRAME

if TYPE_CHECKING:
    from ..model.codec import CodecStreamState
    from ..model.talker import PromptPlanLike


@dataclass(eq=False)
class Session:
    """Cache slot, talker position, RNG, cb0 history, last frame, text stream, frame count, codec state.

    The generator is a CPU `torch.Generator` seeded with `request.seed`; every frame draws
    `UNIFORMS_PER_FRAME` float64 uniforms from it in one call (cb0 first, then cb1..cb15), so the draw
    order is: frame 0's cb0, frame 0's 15 predictor draws, frame 1's cb0, ...
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
    cb0_history: Tensor  # [talker vocab] bool: every cb0 emitted so far (repetition penalty)
    generator: torch.Generator
    codec_state: CodecStreamState | None = None
    position: int = 0  # talker position of the next input token
    frames_emitted: int = 0
    last_codes: Tensor | None = None  # LongTensor[16] of the last emitted frame
    finish_reason: FinishReason | None = None
    released: bool = False

    @property
    def prefilled(self) -> bool:
        return self.prompt is None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def draw_uniforms(self) -> Tensor:
        """The next frame's 16 uniforms in [0, 1), float64, on the CPU."""
        return torch.rand(UNIFORMS_PER_FRAME, generator=self.generator, dtype=torch.float64)

    def text_element(self) -> Tensor:
        """The text-stream vector added to the talker input that feeds frame `frames_emitted - 1`."""
        index = self.frames_emitted - 1
        return self.trailing_text[index] if index < self.trailing_text.shape[0] else self.tts_pad

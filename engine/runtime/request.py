"""What a caller asks for and what the frame loop hands back (docs/architecture.md, "Requests")."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from ..errors import InvalidRequestError

MAX_SEED = 2**53 - 1
SAMPLING_SCALE_RANGE = (1e-6, 1e6)
"""Temperatures and the repetition penalty divide (or multiply) float32 logits: outside this range a score
can overflow to +-inf (1e-50 even rounds to 0, 1e300 to inf), the draw's weights turn NaN and the talker
emits a suppressed control id as cb0. Inside it every |logit| < 1e26 stays finite."""
FinishReason = Literal["stop", "length"]
TextMode = Literal["non_streaming", "streaming"]


@dataclass(frozen=True)
class TalkerSampling:
    """Sampling of codebook 0; the defaults are generation_config.json's."""

    greedy: bool = False
    temperature: float = 0.9
    top_k: int = 50  # 0 = no top-k cut
    top_p: float = 1.0  # 1.0 = no top-p step
    repetition_penalty: float = 1.05


@dataclass(frozen=True)
class PredictorSampling:
    """Sampling of codebooks 1..15 (no repetition penalty, no suppression)."""

    greedy: bool = False
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0


@dataclass(frozen=True)
class SynthesisRequest:
    text: str
    voice_description: str
    language: str = "auto"  # "auto" or one of the 10 names, case-insensitive
    seed: int = 0  # 0 .. 2**53-1
    max_frames: int = 1500  # emitted-frame ceiling (finish_reason "length")
    talker_sampling: TalkerSampling = TalkerSampling()
    predictor_sampling: PredictorSampling = PredictorSampling()
    text_mode: TextMode = "non_streaming"


@dataclass(frozen=True)
class FrameResult:
    codes: torch.Tensor | None  # LongTensor[16] of the frame just completed, None when the session ended
    finish_reason: FinishReason | None  # set on the step that ends the session


@dataclass(frozen=True)
class AudioPacket:
    sequence: int
    first_frame: int
    frame_count: int
    pcm: bytes
    is_final: bool
    finish_reason: FinishReason | None


def _in_scale_range(value: float) -> bool:
    low, high = SAMPLING_SCALE_RANGE
    return math.isfinite(value) and low <= value <= high


def _check_sampling(where: str, greedy: bool, temperature: float, top_k: int, top_p: float) -> None:
    if not greedy and not _in_scale_range(temperature):
        low, high = SAMPLING_SCALE_RANGE
        raise InvalidRequestError(
            f"{where}.temperature must be in {low:g}..{high:g} when sampling, got {temperature}"
        )
    if top_k < 0:
        raise InvalidRequestError(f"{where}.top_k must be >= 0 (0 = off), got {top_k}")
    if not (0.0 < top_p <= 1.0):
        raise InvalidRequestError(f"{where}.top_p must be in (0, 1], got {top_p}")


def validate_request(request: SynthesisRequest) -> None:
    """Reject numbers the frame loop cannot honour; text and language are checked by the prompt builder."""
    if isinstance(request.seed, bool) or not (0 <= request.seed <= MAX_SEED):
        raise InvalidRequestError(f"seed must be in 0..{MAX_SEED}, got {request.seed}")
    if request.max_frames < 1:
        raise InvalidRequestError(f"max_frames must be >= 1, got {request.max_frames}")
    if request.text_mode not in ("non_streaming", "streaming"):
        raise InvalidRequestError(
            f"text_mode must be 'non_streaming' or 'streaming', got {request.text_mode!r}"
        )
    ts, ps = request.talker_sampling, request.predictor_sampling
    _check_sampling("talker_sampling", ts.greedy, ts.temperature, ts.top_k, ts.top_p)
    _check_sampling("predictor_sampling", ps.greedy, ps.temperature, ps.top_k, ps.top_p)
    if not _in_scale_range(ts.repetition_penalty):
        low, high = SAMPLING_SCALE_RANGE
        raise InvalidRequestError(
            f"talker_sampling.repetition_penalty must be in {low:g}..{high:g}, got {ts.repetition_penalty}"
        )

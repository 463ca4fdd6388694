"""Request bodies as strict pydantic models: the JSON shape only.

Any shape error (unknown field at any depth, wrong type, missing field) is a 400 ``malformed_json``; value
rules (ranges, languages, ...) live in ``validation`` so they can be checked in the contract's order and
answered with their own 422 codes.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class PredictorSamplingBody(_Strict):
    strategy: Literal["sample", "greedy"] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None


class SamplingBody(_Strict):
    strategy: Literal["sample", "greedy"] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    predictor: PredictorSamplingBody | None = None


class VoiceDesignSpeechBody(_Strict):
    """``POST /v1/voice-design/speech``."""

    text: str
    voice_description: str
    language: str | None = None
    seed: int | None = None
    max_duration_seconds: float | None = None
    sampling: SamplingBody | None = None
    stream: bool | None = None
    output_format: Literal["pcm_s16le", "wav"] | None = None


class OpenAISpeechBody(_Strict):
    """``POST /v1/audio/speech``: the fields the official OpenAI SDK sends, plus optional extensions
    (``extra_body`` in the SDK) that mean exactly what they mean on the native endpoint."""

    model: str
    input: str
    voice: str | None = None
    instructions: str | None = None
    response_format: str | None = None
    stream_format: str | None = None
    speed: float | None = None
    language: str | None = None
    seed: int | None = None
    max_duration_seconds: float | None = None
    sampling: SamplingBody | None = None

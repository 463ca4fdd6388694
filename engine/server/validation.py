"""Value rules for a parsed body, in the contract's order, so a caller always sees the same error first.

Order for the canonical endpoint: text, voice description, language, duration, seed, output mode, sampling.
The OpenAI endpoint: model, input, voice description, then its optional extensions language, duration and
seed, then response format and speed, then sampling; each extension goes through the same validator as on
the canonical endpoint, so it has the same rules and error code.
The result is an engine ``SynthesisRequest`` plus the chosen output mode; nothing here touches the engine.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import Literal, TypeVar

from ..config import FRAMES_PER_SECOND, LANGUAGES
from ..runtime.request import MAX_SEED, PredictorSampling, SynthesisRequest, TalkerSampling
from .payloads import OpenAISpeechBody, PredictorSamplingBody, SamplingBody, VoiceDesignSpeechBody
from .problems import Problem
from .settings import MODEL_ID, ServerSettings

_MIN_TOP_P = 1.17549435e-38  # f32::MIN_POSITIVE, as in the seed contract
_T = TypeVar("_T")
OPENAI_MODEL_IDS = (MODEL_ID, "Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign")
# OpenAI's built-in voice names: they name a voice, they do not describe one.
OPENAI_VOICE_NAMES = frozenset(
    {
        "alloy",
        "ash",
        "ballad",
        "cedar",
        "coral",
        "echo",
        "fable",
        "marin",
        "nova",
        "onyx",
        "sage",
        "shimmer",
        "verse",
    }
)

OutputMode = Literal["multipart", "wav", "pcm", "sse"]


@dataclass(frozen=True)
class SpeechJob:
    """A validated synthesis: what to generate and how to put it on the wire."""

    request: SynthesisRequest
    mode: OutputMode


def _free_text(value: str, limit: int, code: str, what: str) -> str:
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise Problem(code, f"{what} must be valid Unicode (no lone surrogates)") from None
    if not value.strip():
        raise Problem(code, f"{what} must not be empty or whitespace")
    if size > limit:
        raise Problem(code, f"{what} is {size} UTF-8 bytes; the limit is {limit}")
    if "\x00" in value:
        raise Problem(code, f"{what} must not contain NUL")
    return value


def _language(value: str | None) -> str:
    if value is None:
        return "auto"
    name = value.strip()
    name = name.lower() if name.isascii() else name
    if name not in LANGUAGES:
        raise Problem("unsupported_language", f"language must be one of: {', '.join(LANGUAGES)}")
    return name


def _max_frames(value: float | None, settings: ServerSettings) -> int:
    seconds = settings.default_duration_seconds if value is None else value
    if not (math.isfinite(seconds) and 0.08 <= seconds <= settings.max_duration_seconds):
        raise Problem(
            "invalid_max_duration",
            f"max_duration_seconds must be finite and in 0.08..{settings.max_duration_seconds:g}",
        )
    return math.ceil(seconds * FRAMES_PER_SECOND)


def _seed(value: int | None) -> int:
    if value is None:
        return secrets.randbits(53)
    if not 0 <= value <= MAX_SEED:
        raise Problem("invalid_seed", f"seed must be in 0..{MAX_SEED}")
    return value


def _output_mode(stream: bool | None, output_format: str | None) -> OutputMode:
    if stream is None:
        return "wav" if output_format == "wav" else "multipart"
    if stream:
        if output_format == "wav":
            raise Problem("unsupported_response_format", "stream=true requires output_format pcm_s16le")
        return "multipart"
    if output_format == "pcm_s16le":
        raise Problem("unsupported_response_format", "stream=false requires output_format wav")
    return "wav"


def _in_range(value: float | None, low: float, high: float, name: str) -> None:
    if value is not None and not (math.isfinite(value) and low <= value <= high):
        raise Problem("invalid_sampling", f"{name} must be finite and in {low:g}..{high:g}")


def _check_level(
    level: SamplingBody | PredictorSamplingBody, greedy: bool, prefix: str, max_top_k: int
) -> None:
    if greedy:
        given = [name for name in ("temperature", "top_p", "top_k") if getattr(level, name) is not None]
        if given:
            raise Problem("invalid_sampling", f"{prefix}{given[0]} must be omitted with strategy greedy")
    _in_range(level.temperature, 0.01, 2.0, f"{prefix}temperature")
    _in_range(level.top_p, _MIN_TOP_P, 1.0, f"{prefix}top_p")
    if level.top_k is not None and not 0 <= level.top_k <= max_top_k:
        raise Problem("invalid_sampling", f"{prefix}top_k must be in 0..{max_top_k}")


def _sampling(body: SamplingBody | None) -> tuple[TalkerSampling, PredictorSampling]:
    if body is None:
        return TalkerSampling(), PredictorSampling()
    greedy = body.strategy == "greedy"
    _check_level(body, greedy, "sampling.", 3072)
    _in_range(body.repetition_penalty, 0.1, 2.0, "sampling.repetition_penalty")
    predictor = body.predictor or PredictorSamplingBody()
    predictor_greedy = greedy if predictor.strategy is None else predictor.strategy == "greedy"
    _check_level(predictor, predictor_greedy, "sampling.predictor.", 2048)
    talker_defaults, predictor_defaults = TalkerSampling(), PredictorSampling()
    talker = TalkerSampling(
        greedy=greedy,
        temperature=_pick(body.temperature, talker_defaults.temperature),
        top_k=_pick(body.top_k, talker_defaults.top_k),
        top_p=_pick(body.top_p, talker_defaults.top_p),
        repetition_penalty=_pick(body.repetition_penalty, talker_defaults.repetition_penalty),
    )
    return talker, PredictorSampling(
        greedy=predictor_greedy,
        temperature=_pick(predictor.temperature, predictor_defaults.temperature),
        top_k=_pick(predictor.top_k, predictor_defaults.top_k),
        top_p=_pick(predictor.top_p, predictor_defaults.top_p),
    )


def _pick(value: _T | None, default: _T) -> _T:
    return default if value is None else value


def voice_design_job(body: VoiceDesignSpeechBody, settings: ServerSettings) -> SpeechJob:
    text = _free_text(body.text, settings.max_text_bytes, "invalid_text", "text")
    description = _free_text(
        body.voice_description,
        settings.max_voice_description_bytes,
        "invalid_voice_description",
        "voice_description",
    )
    language = _language(body.language)
    max_frames = _max_frames(body.max_duration_seconds, settings)
    seed = _seed(body.seed)
    mode = _output_mode(body.stream, body.output_format)
    talker, predictor = _sampling(body.sampling)
    request = SynthesisRequest(
        text=text,
        voice_description=description,
        language=language,
        seed=seed,
        max_frames=max_frames,
        talker_sampling=talker,
        predictor_sampling=predictor,
    )
    return SpeechJob(request, mode)


def openai_job(body: OpenAISpeechBody, settings: ServerSettings) -> SpeechJob:
    """Map the OpenAI speech body: the description is ``voice`` (unless it is a built-in voice name) followed
    by ``instructions``, so ``voice="alloy", instructions="..."`` and ``voice="<description>"`` both work."""
    if body.model not in OPENAI_MODEL_IDS:
        raise Problem("unsupported_model", f"model must be {MODEL_ID}")
    text = _free_text(body.input, settings.max_text_bytes, "invalid_text", "input")
    names_a_voice = body.voice is None or body.voice.strip().lower() in OPENAI_VOICE_NAMES
    parts = [part for part in (None if names_a_voice else body.voice, body.instructions) if part is not None]
    if not parts or not all(part.strip() for part in parts):
        raise Problem(
            "invalid_voice_description",
            "describe the voice in voice, or in instructions when voice names a built-in voice; "
            "neither may be blank",
        )
    description = _free_text(
        " ".join(parts),
        settings.max_voice_description_bytes,
        "invalid_voice_description",
        "voice description",
    )
    language = _language(body.language)
    max_frames = _max_frames(body.max_duration_seconds, settings)
    seed = _seed(body.seed)
    response_format = body.response_format or "wav"
    stream_format = body.stream_format or "audio"
    if response_format not in ("wav", "pcm"):
        raise Problem("unsupported_response_format", "response_format must be wav or pcm")
    if stream_format not in ("audio", "sse"):
        raise Problem("unsupported_response_format", "stream_format must be audio or sse")
    if stream_format == "sse" and response_format != "pcm":
        raise Problem("unsupported_response_format", "stream_format sse requires response_format pcm")
    if body.speed is not None and not (math.isfinite(body.speed) and abs(body.speed - 1.0) <= 1.1920929e-07):
        raise Problem("unsupported_speed", "speed must be 1.0")
    mode: OutputMode = "sse" if stream_format == "sse" else ("pcm" if response_format == "pcm" else "wav")
    talker, predictor = _sampling(body.sampling)
    request = SynthesisRequest(
        text=text,
        voice_description=description,
        language=language,
        seed=seed,
        max_frames=max_frames,
        talker_sampling=talker,
        predictor_sampling=predictor,
    )
    return SpeechJob(request, mode)

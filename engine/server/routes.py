"""HTTP endpoints: each validates in the contract's order, then hands off to admission and streaming."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..config import LANGUAGES, SAMPLE_RATE_HZ, SAMPLES_PER_FRAME
from .admission import Admissions
from .ids import boundary_for, parse_request_id
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .metrics import ServerMetrics
from .openapi import openapi_document
from .payloads import OpenAISpeechBody, VoiceDesignSpeechBody
from .problems import Problem
from .settings import MAX_CODEC_FRAMES, MODEL_ID, MODEL_KIND, ServerSettings
from .streaming import SpeechResponse
from .validation import SpeechJob, openai_job, voice_design_job
from .wire import MultipartFormat, ProgressiveFormat, RawPcmFormat, SseFormat

_Body = TypeVar("_Body", bound=BaseModel)


@dataclass
class ServerState:
    """Everything the handlers share; ``admissions`` is None until the engine has warmed up."""

    settings: ServerSettings
    metrics: ServerMetrics
    admissions: Admissions | None = None


def _state(request: Request) -> ServerState:
    state: ServerState = request.app.state.server
    return state


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _shape_error(error: ValidationError) -> str:
    first = error.errors(include_input=False, include_url=False)[0]
    where = ".".join(str(part) for part in first["loc"]) or "body"
    if first["type"] == "extra_forbidden":
        return f"unknown field {where}"
    if first["type"] == "missing":
        return f"missing field {where}"
    return f"{where}: {first['msg']}"


async def read_body(request: Request, model: type[_Body], limit: int) -> _Body:
    """Content type (415), size (413), then shape (400): the contract's extraction order."""
    if not _is_json(request.headers.get("content-type", "")):
        raise Problem("unsupported_media_type", "the body must be application/json")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise Problem("request_too_large", f"the body is larger than {limit} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise Problem("request_too_large", f"the body is larger than {limit} bytes")
    try:
        return model.model_validate_json(bytes(body))
    except ValidationError as error:
        raise Problem("malformed_json", _shape_error(error)) from None


def _admissions(state: ServerState) -> Admissions:
    if state.admissions is None:
        raise Problem("backend_unavailable", "the engine is not ready")
    return state.admissions


def _speech(state: ServerState, request: Request, job: SpeechJob) -> Response:
    request_id = parse_request_id(request.headers.get("x-request-id"))
    admissions = _admissions(state)
    ticket = admissions.admit(request_id, job.request, streaming=job.mode != "wav")
    headers = {
        "cache-control": "no-store",
        "x-request-id": request_id,
        "x-qwen3-seed": str(job.request.seed),
    }
    body_format: ProgressiveFormat | None = None
    if job.mode == "multipart":
        body_format = MultipartFormat(request_id, boundary_for(request_id), job.request.seed)
        headers["x-accel-buffering"] = "no"
    elif job.mode == "pcm":
        body_format = RawPcmFormat()
    elif job.mode == "sse":
        body_format = SseFormat()
        headers["x-accel-buffering"] = "no"
    return SpeechResponse(admissions, ticket, headers, body_format)


async def voice_design_speech(request: Request) -> Response:
    state = _state(request)
    body = await read_body(request, VoiceDesignSpeechBody, state.settings.max_body_bytes)
    return _speech(state, request, voice_design_job(body, state.settings))


async def openai_speech(request: Request) -> Response:
    state = _state(request)
    body = await read_body(request, OpenAISpeechBody, state.settings.max_body_bytes)
    return _speech(state, request, openai_job(body, state.settings))


async def cancel_request(request: Request) -> Response:
    request_id = parse_request_id(request.path_params["request_id"])
    ticket = _admissions(_state(request)).get(request_id)
    if ticket is None or (ticket.retired and not ticket.tombstone):
        raise Problem("request_not_found", "no active request has this id", request_id)
    if ticket.tombstone:
        raise Problem(
            "native_retirement_timeout", "this request's engine slot could not be released", request_id
        )
    ticket.cancel("request_cancelled", "the request was cancelled by DELETE /v1/requests/{request_id}")
    return JSONResponse({"request_id": request_id, "status": "cancellation_requested"}, status_code=202)


async def live(request: Request) -> Response:
    return JSONResponse({"status": "live"})


async def ready(request: Request) -> Response:
    admissions = _state(request).admissions
    is_ready = admissions is not None and admissions.ready
    return JSONResponse(
        {
            "status": "ready" if is_ready else "not_ready",
            "model": MODEL_ID,
            "model_kind": MODEL_KIND,
            "sample_rate_hz": SAMPLE_RATE_HZ,
            "engine_loaded": is_ready,
        },
        status_code=200 if is_ready else 503,
    )


async def capabilities(request: Request) -> Response:
    settings = _state(request).settings
    return JSONResponse(
        {
            "model": MODEL_ID,
            "model_kind": MODEL_KIND,
            "voice_clone": False,
            "sample_rate_hz": SAMPLE_RATE_HZ,
            "channels": 1,
            "encoding": "pcm_s16le",
            "samples_per_codec_frame": SAMPLES_PER_FRAME,
            "max_codec_frames": MAX_CODEC_FRAMES,
            "max_concurrent_requests": settings.max_concurrent_requests,
            "max_text_bytes": settings.max_text_bytes,
            "max_voice_description_bytes": settings.max_voice_description_bytes,
            "max_duration_seconds": settings.max_duration_seconds,
            "languages": list(LANGUAGES),
            "streaming": "multipart/mixed",
        }
    )


async def metrics(request: Request) -> Response:
    return Response(_state(request).metrics.render(), headers={"content-type": METRICS_CONTENT_TYPE})


async def openapi(request: Request) -> Response:
    return JSONResponse(openapi_document(_state(request).settings))

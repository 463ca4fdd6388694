"""The OpenAPI 3.1 document of the served API, built from the live settings so its limits are the real ones.

Written out rather than generated: the wire contract (multipart parts, problem codes, headers) is the
product, and every object is closed with ``additionalProperties: false`` exactly as the server enforces.
"""

from __future__ import annotations

from typing import Any

from qwen3_tts_native import __version__

from ..config import LANGUAGES, SAMPLE_RATE_HZ, SAMPLES_PER_FRAME
from .problems import STATUS_BY_CODE
from .settings import MAX_CODEC_FRAMES, MODEL_ID, MODEL_KIND, ServerSettings
from .validation import MAX_SEED, OPENAI_MODEL_IDS

Schema = dict[str, Any]


def _object(properties: Schema, required: tuple[str, ...] = (), description: str = "") -> Schema:
    schema: Schema = {"type": "object", "additionalProperties": False, "properties": properties}
    if required:
        schema["required"] = list(required)
    if description:
        schema["description"] = description
    return schema


def _nullable(schema: Schema) -> Schema:
    """An optional request field: JSON null means "omitted", as the server reads it."""
    if "$ref" in schema:
        return {"anyOf": [schema, {"type": "null"}]}
    nullable = {**schema, "type": [schema["type"], "null"]}
    if "const" in schema:
        nullable["enum"] = [nullable.pop("const"), None]
    elif "enum" in schema:
        nullable["enum"] = [*schema["enum"], None]
    return nullable


def _request(properties: Schema, required: tuple[str, ...] = (), description: str = "") -> Schema:
    """A request body object: closed, and its optional fields nullable."""
    optional = {name: value if name in required else _nullable(value) for name, value in properties.items()}
    return _object(optional, required, description)


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _problem_response(*codes: str) -> Schema:
    return {
        "description": "Problem: " + ", ".join(f"`{code}`" for code in codes),
        "headers": {"X-Request-Id": {"$ref": "#/components/headers/RequestIdOptional"}},
        "content": {"application/problem+json": {"schema": _ref("Problem")}},
    }


def _errors(*codes: str) -> dict[str, Schema]:
    """Group problem codes by status into response objects; 429 also declares Retry-After."""
    by_status: dict[int, list[str]] = {}
    for code in codes:
        by_status.setdefault(STATUS_BY_CODE[code], []).append(code)
    responses = {str(status): _problem_response(*group) for status, group in sorted(by_status.items())}
    if "429" in responses:
        responses["429"]["headers"] = {
            **responses["429"]["headers"],
            "Retry-After": {"required": True, "schema": {"type": "string", "enum": ["1"]}},
        }
    return responses


_SPEECH_ERRORS = (
    "malformed_json",
    "invalid_request_id",
    "request_id_in_use",
    "request_cancelled",
    "request_too_large",
    "unsupported_media_type",
    "invalid_text",
    "invalid_voice_description",
    "invalid_request",
    "unsupported_response_format",
    "capacity_exhausted",
    "internal_error",
    "buffer_limit_exceeded",
    "backend_unavailable",
    "server_shutting_down",
)


def _synthesis_controls(settings: ServerSettings) -> dict[str, Schema]:
    """The optional controls both speech endpoints accept, with one meaning (and one validator) each."""
    return {
        "language": {
            "type": "string",
            "default": "auto",
            "description": "Case-insensitive, one of: " + ", ".join(LANGUAGES),
        },
        "seed": {
            "type": "integer",
            "minimum": 0,
            "maximum": MAX_SEED,
            "description": "Random (53 bits) when omitted; echoed in X-Qwen3-Seed.",
        },
        "max_duration_seconds": {
            "type": "number",
            "minimum": 0.08,
            "maximum": settings.max_duration_seconds,
            "default": settings.default_duration_seconds,
        },
        "sampling": _ref("Sampling"),
    }


_CONTROL_ERRORS = ("unsupported_language", "invalid_max_duration", "invalid_seed", "invalid_sampling")


def _schemas(settings: ServerSettings) -> dict[str, Schema]:
    unit = {"type": "number", "minimum": 0.01, "maximum": 2.0}
    top_p = {"type": "number", "exclusiveMinimum": 0, "maximum": 1.0}
    strategy = {"type": "string", "enum": ["sample", "greedy"]}
    metrics_fields = (
        "queue_microseconds",
        "prefill_microseconds",
        "first_codec_frame_microseconds",
        "first_audio_microseconds",
        "wall_microseconds",
        "generated_codec_frames",
        "emitted_samples",
        "emitted_packets",
        "talker_gpu_microseconds",
        "codec_gpu_microseconds",
        "peak_request_device_bytes",
        "peak_request_host_bytes",
    )
    return {
        "Problem": _object(
            {
                "type": {"type": "string"},
                "title": {"type": "string"},
                "status": {"type": "integer"},
                "code": {"type": "string", "enum": sorted(STATUS_BY_CODE)},
                "detail": {"type": "string"},
                "request_id": {"type": "string", "format": "uuid"},
            },
            ("type", "title", "status", "code", "detail"),
            "RFC 9457 problem document; branch on status and code only.",
        ),
        "PredictorSampling": _request(
            {
                "strategy": strategy,
                "temperature": unit,
                "top_p": top_p,
                "top_k": {"type": "integer", "minimum": 0, "maximum": 2048},
            },
            description="Codebooks 1..15; strategy defaults to the talker's; greedy: omit the other fields.",
        ),
        "Sampling": _request(
            {
                "strategy": strategy,
                "temperature": unit,
                "top_p": top_p,
                "top_k": {"type": "integer", "minimum": 0, "maximum": 3072},
                "repetition_penalty": {"type": "number", "minimum": 0.1, "maximum": 2.0},
                "predictor": _ref("PredictorSampling"),
            },
            description="Codebook 0. With strategy greedy, temperature, top_p and top_k must be omitted.",
        ),
        "VoiceDesignSpeechRequest": _request(
            {
                "text": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": settings.max_text_bytes,
                    "description": f"Non-blank, at most {settings.max_text_bytes} UTF-8 bytes, no NUL.",
                },
                "voice_description": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": settings.max_voice_description_bytes,
                    "description": f"Non-blank, <= {settings.max_voice_description_bytes} UTF-8 bytes.",
                },
                **_synthesis_controls(settings),
                "stream": {"type": "boolean"},
                "output_format": {"type": "string", "enum": ["pcm_s16le", "wav"]},
            },
            ("text", "voice_description"),
            "stream/output_format: omitted or pcm_s16le: progressive multipart; wav or stream=false: WAV.",
        ),
        "OpenAISpeechRequest": _request(
            {
                "model": {"type": "string", "enum": list(OPENAI_MODEL_IDS)},
                "input": {"type": "string", "minLength": 1, "maxLength": settings.max_text_bytes},
                "voice": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": settings.max_voice_description_bytes,
                    "description": "The voice description; a built-in OpenAI voice name (alloy, ...) adds "
                    "nothing. The description used is voice + instructions.",
                },
                "instructions": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": settings.max_voice_description_bytes,
                },
                "response_format": {"type": "string", "enum": ["wav", "pcm"], "default": "wav"},
                "stream_format": {"type": "string", "enum": ["audio", "sse"], "default": "audio"},
                "speed": {"type": "number", "const": 1.0},
                **_synthesis_controls(settings),
            },
            ("model", "input"),
            "The OpenAI fields plus optional extensions (the SDK's extra_body) language, seed, "
            "max_duration_seconds and sampling, with the same rules and error codes as on "
            "/v1/voice-design/speech.",
        ),
        "EndMetrics": _object(
            {
                name: {"type": "number" if "gpu" in name else "integer", "minimum": 0}
                for name in metrics_fields
            },
            metrics_fields,
            "Per-request metrics of the multipart end part (microseconds from admission).",
        ),
        "Readiness": _object(
            {
                "status": {"type": "string", "enum": ["ready", "not_ready"]},
                "model": {"type": "string", "const": MODEL_ID},
                "model_kind": {"type": "string", "const": MODEL_KIND},
                "sample_rate_hz": {"type": "integer", "const": SAMPLE_RATE_HZ},
                "engine_loaded": {"type": "boolean"},
            },
            ("status", "model", "model_kind", "sample_rate_hz", "engine_loaded"),
        ),
        "Capabilities": _object(
            {
                "model": {"type": "string", "const": MODEL_ID},
                "model_kind": {"type": "string", "const": MODEL_KIND},
                "voice_clone": {"type": "boolean", "const": False},
                "sample_rate_hz": {"type": "integer", "const": SAMPLE_RATE_HZ},
                "channels": {"type": "integer", "const": 1},
                "encoding": {"type": "string", "const": "pcm_s16le"},
                "samples_per_codec_frame": {"type": "integer", "const": SAMPLES_PER_FRAME},
                "max_codec_frames": {"type": "integer", "const": MAX_CODEC_FRAMES},
                "max_concurrent_requests": {"type": "integer", "minimum": 1},
                "max_text_bytes": {"type": "integer", "minimum": 1},
                "max_voice_description_bytes": {"type": "integer", "minimum": 1},
                "max_duration_seconds": {"type": "number"},
                "languages": {"type": "array", "items": {"type": "string", "enum": list(LANGUAGES)}},
                "streaming": {"type": "string", "const": "multipart/mixed"},
            },
            (
                "model",
                "model_kind",
                "voice_clone",
                "sample_rate_hz",
                "channels",
                "encoding",
                "samples_per_codec_frame",
                "max_codec_frames",
                "max_concurrent_requests",
                "max_text_bytes",
                "max_voice_description_bytes",
                "max_duration_seconds",
                "languages",
                "streaming",
            ),
        ),
        "SpeechEvent": _object(
            {
                "event": {"type": "string"},
                "data": {"type": "string", "contentMediaType": "application/json"},
            },
            ("data",),
            "One server-sent event: data is speech.audio.delta (base64 PCM), speech.audio.done or error.",
        ),
        "CancellationAccepted": _object(
            {
                "request_id": {"type": "string", "format": "uuid"},
                "status": {"type": "string", "const": "cancellation_requested"},
            },
            ("request_id", "status"),
        ),
    }


_REQUEST_ID_PARAMETER: Schema = {
    "name": "x-request-id",
    "in": "header",
    "required": False,
    "description": "A UUID naming the request (UUIDv7 generated when absent); unique among active ones.",
    "schema": {"type": "string", "format": "uuid"},
}

_STREAM_DESCRIPTION = (
    "multipart/mixed (boundary qwen3tts-<id hex>): a JSON start part, PCM16 audio parts with X-Sequence, "
    "X-First-Codec-Frame, X-First-Sample, X-Sample-Count, X-Codec-Frames and X-Final headers, then one JSON "
    "end or error part; or a buffered WAV."
)
_OPENAI_DESCRIPTION = (
    "OpenAI-compatible speech: wav (buffered), pcm (s16le 24 kHz mono, streamed as produced) or SSE "
    "speech.audio.delta events. Optional extensions pin the voice and the request as on "
    "/v1/voice-design/speech: seed, language, max_duration_seconds and sampling."
)

_SUCCESS_HEADERS: Schema = {
    "X-Request-Id": {"$ref": "#/components/headers/RequestId"},
    "X-Qwen3-Seed": {"required": True, "schema": {"type": "string", "pattern": "^[0-9]+$"}},
}


def _json_response(description: str, schema: str) -> Schema:
    return {"description": description, "content": {"application/json": {"schema": _ref(schema)}}}


def openapi_document(settings: ServerSettings) -> Schema:
    binary = {"type": "string", "format": "binary"}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "qwen3-tts-native",
            "version": __version__,
            "description": "Qwen3-TTS-12Hz-1.7B-VoiceDesign: text + voice description in, 24 kHz speech out.",
        },
        "paths": {
            "/health/live": {
                "get": {
                    "operationId": "live",
                    "responses": {
                        "200": {
                            "description": "The process answers.",
                            "content": {
                                "application/json": {
                                    "schema": _object(
                                        {"status": {"type": "string", "const": "live"}}, ("status",)
                                    )
                                }
                            },
                        }
                    },
                }
            },
            "/health/ready": {
                "get": {
                    "operationId": "ready",
                    "responses": {
                        "200": _json_response("Warmed up and admitting.", "Readiness"),
                        "503": _json_response(
                            "Not ready (starting, shutting down or unhealthy).", "Readiness"
                        ),
                    },
                }
            },
            "/v1/capabilities": {
                "get": {
                    "operationId": "capabilities",
                    "responses": {
                        "200": _json_response("Model and limits of this instance.", "Capabilities")
                    },
                }
            },
            "/v1/voice-design/speech": {
                "post": {
                    "operationId": "voiceDesignSpeech",
                    "parameters": [_REQUEST_ID_PARAMETER],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": _ref("VoiceDesignSpeechRequest")}},
                    },
                    "responses": {
                        "200": {
                            "description": _STREAM_DESCRIPTION,
                            "headers": {
                                **_SUCCESS_HEADERS,
                                "X-Finish-Reason": {
                                    "description": "WAV only.",
                                    "schema": {"type": "string", "enum": ["stop", "length"]},
                                },
                            },
                            "content": {
                                "multipart/mixed": {"schema": binary},
                                "audio/wav": {"schema": binary},
                            },
                        },
                        **_errors(*_SPEECH_ERRORS, *_CONTROL_ERRORS),
                    },
                }
            },
            "/v1/audio/speech": {
                "post": {
                    "operationId": "openaiSpeech",
                    "description": _OPENAI_DESCRIPTION,
                    "parameters": [_REQUEST_ID_PARAMETER],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": _ref("OpenAISpeechRequest")}},
                    },
                    "responses": {
                        "200": {
                            "description": "Audio in the requested format.",
                            "headers": _SUCCESS_HEADERS,
                            "content": {
                                "audio/wav": {"schema": binary},
                                "audio/pcm": {"schema": binary},
                                "text/event-stream": {"schema": _ref("SpeechEvent")},
                            },
                        },
                        **_errors(
                            *_SPEECH_ERRORS, *_CONTROL_ERRORS, "unsupported_model", "unsupported_speed"
                        ),
                    },
                }
            },
            "/v1/requests/{request_id}": {
                "delete": {
                    "operationId": "cancelRequest",
                    "parameters": [
                        {
                            "name": "request_id",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string", "format": "uuid"},
                        }
                    ],
                    "responses": {
                        "202": _json_response(
                            "Cancellation signalled (not yet completed).", "CancellationAccepted"
                        ),
                        **_errors(
                            "invalid_request_id",
                            "request_not_found",
                            "backend_unavailable",
                            "native_retirement_timeout",
                        ),
                    },
                }
            },
            "/metrics": {
                "get": {
                    "operationId": "metrics",
                    "responses": {
                        "200": {
                            "description": "Prometheus text exposition; no labels carry user data.",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        }
                    },
                }
            },
        },
        "components": {
            "schemas": _schemas(settings),
            "headers": {
                "RequestId": {"required": True, "schema": {"type": "string", "format": "uuid"}},
                "RequestIdOptional": {"schema": {"type": "string", "format": "uuid"}},
            },
        },
    }

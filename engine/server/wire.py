"""Byte encoders for every response body: progressive multipart PCM, raw PCM, OpenAI SSE, buffered WAV.

Each progressive format turns scheduler events into bytes through the same four calls (opening, audio,
closing, failure), so the streaming response does not care which one it is sending.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any, Protocol

from ..audio import wav_header
from ..config import SAMPLE_RATE_HZ, SAMPLES_PER_FRAME
from ..runtime.request import AudioPacket
from ..runtime.scheduler import RequestMetrics
from .settings import MODEL_ID

PCM_MEDIA_TYPE = "audio/pcm;rate=24000;channels=1;format=s16le"
CRLF = b"\r\n"


def _json(value: Mapping[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _rounded(values: dict[str, Any]) -> dict[str, Any]:
    """Microsecond floats to nanosecond precision: the rest is float noise."""
    return {name: round(value, 3) if isinstance(value, float) else value for name, value in values.items()}


class ProgressiveFormat(Protocol):
    """How one progressive body encodes the events of a request."""

    media_type: str

    def opening(self) -> bytes: ...

    def audio(self, packet: AudioPacket) -> bytes: ...

    def closing(self, finish_reason: str, metrics: RequestMetrics) -> bytes: ...

    def failure(self, code: str, detail: str) -> bytes | None:
        """Bytes that tell the client the stream failed, or None: abort the connection instead."""


class MultipartFormat:
    """``multipart/mixed``: a JSON start part, PCM parts with position headers, one JSON terminal part."""

    def __init__(self, request_id: str, boundary: str, seed: int) -> None:
        self.request_id = request_id
        self.boundary = boundary.encode("ascii")
        self.seed = seed
        self.media_type = f"multipart/mixed; boundary={boundary}"

    def part(self, content_type: str, payload: bytes, headers: Mapping[str, str] | None = None) -> bytes:
        lines = [
            b"--" + self.boundary,
            f"Content-Type: {content_type}".encode(),
            b"Content-Length: %d" % len(payload),
        ]
        lines += [f"{name}: {value}".encode("ascii") for name, value in (headers or {}).items()]
        return CRLF.join(lines) + CRLF + CRLF + payload + CRLF

    def opening(self) -> bytes:
        start = {
            "type": "start",
            "request_id": self.request_id,
            "model": MODEL_ID,
            "seed": self.seed,
            "audio": {
                "encoding": "pcm_s16le",
                "sample_rate_hz": SAMPLE_RATE_HZ,
                "channels": 1,
                "samples_per_codec_frame": SAMPLES_PER_FRAME,
            },
        }
        return self.part("application/json", _json(start))

    def audio(self, packet: AudioPacket) -> bytes:
        headers = {
            "X-Sequence": str(packet.sequence),
            "X-First-Codec-Frame": str(packet.first_frame),
            "X-First-Sample": str(packet.first_frame * SAMPLES_PER_FRAME),
            "X-Sample-Count": str(len(packet.pcm) // 2),
            "X-Codec-Frames": str(packet.frame_count),
            "X-Final": "true" if packet.is_final else "false",
        }
        return self.part(PCM_MEDIA_TYPE, packet.pcm, headers)

    def _terminal(self, body: Mapping[str, Any]) -> bytes:
        return self.part("application/json", _json(body)) + b"--" + self.boundary + b"--" + CRLF

    def closing(self, finish_reason: str, metrics: RequestMetrics) -> bytes:
        return self._terminal(
            {
                "type": "end",
                "request_id": self.request_id,
                "finish_reason": finish_reason,
                "metrics": _rounded(asdict(metrics)),
            }
        )

    def failure(self, code: str, detail: str) -> bytes | None:
        return self._terminal(
            {"type": "error", "request_id": self.request_id, "error": {"code": code, "detail": detail}}
        )


class RawPcmFormat:
    """OpenAI ``response_format=pcm``: s16le bytes as produced; a failure aborts the chunked body."""

    media_type = "audio/pcm"

    def opening(self) -> bytes:
        return b""

    def audio(self, packet: AudioPacket) -> bytes:
        return packet.pcm

    def closing(self, finish_reason: str, metrics: RequestMetrics) -> bytes:
        return b""

    def failure(self, code: str, detail: str) -> bytes | None:
        return None


class SseFormat:
    """OpenAI ``stream_format=sse``: ``speech.audio.delta`` events (base64 PCM), ``speech.audio.done``."""

    media_type = "text/event-stream"

    @staticmethod
    def event(body: Mapping[str, Any]) -> bytes:
        return b"data: " + _json(body) + b"\n\n"

    def opening(self) -> bytes:
        return b""

    def audio(self, packet: AudioPacket) -> bytes:
        return self.event(
            {"type": "speech.audio.delta", "audio": base64.b64encode(packet.pcm).decode("ascii")}
        )

    def closing(self, finish_reason: str, metrics: RequestMetrics) -> bytes:
        return self.event({"type": "speech.audio.done", "finish_reason": finish_reason})

    def failure(self, code: str, detail: str) -> bytes | None:
        return self.event({"type": "error", "error": {"code": code, "message": detail}})


def wav_bytes(pcm: bytes) -> bytes:
    return wav_header(len(pcm) // 2) + pcm

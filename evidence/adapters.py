"""API adapters: how a workload row becomes an HTTP request and how a response becomes audio packets.

The client measures every implementation the same way; only these adapters know a wire format:

- ``native``: our ``POST /v1/voice-design/speech`` (progressive multipart PCM, or buffered WAV when the row
  says ``stream: false``), with every contract invariant checked (seed contract §1.5).
- ``openai``: an OpenAI-style ``POST /v1/audio/speech`` (raw PCM stream, SSE deltas or a WAV body), the
  API most peers expose. The plain API carries no seed, language, duration cap or sampling controls;
  where a server accepts them as extensions (ours does, with the native endpoint's rules), ``fields``
  forwards those workload fields verbatim where the row has them, and only a request that carries both
  seed and sampling can qualify for sampling parity.
- ``wav``: a buffered-WAV server taking our JSON body (``stream: false``, ``output_format: wav``), e.g. the
  official generation loop behind a thin HTTP wrapper.

A decoder is fed body bytes with their arrival time and keeps one ``Packet`` per audio arrival: an
application packet for our multipart stream, otherwise each transport read that carried PCM.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from .wire import (
    MultipartParser,
    PartBegin,
    PartData,
    PartEnd,
    SseParser,
    StreamClosed,
    WavParser,
    WireError,
    boundary_from_content_type,
)
from .workload import WorkloadRow

SAMPLE_RATE_HZ = 24000
SAMPLES_PER_CODEC_FRAME = 1920
NATIVE_MODEL_ID = "qwen3-tts-1.7b-voice-design"
API_NAMES = ("native", "openai", "wav")
OPENAI_FIELDS = ("language", "seed", "max_duration_seconds", "sampling")
"""Workload fields the openai adapter can forward (``fields``) to a server that accepts them."""


class StreamFailure(Exception):
    """The server reported a failure inside an HTTP 200 body (a terminal error part or event)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class PreparedRequest:
    """The exact request an adapter sends for a row."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    streaming: bool
    api_parity_reasons: tuple[str, ...]


@dataclass
class Packet:
    """One audio arrival: its first payload byte's monotonic time and its decoded PCM payload."""

    arrival_ns: int
    byte_offset: int
    payload: bytearray = field(default_factory=bytearray)
    first_codec_frame: int | None = None
    first_sample: int | None = None
    sample_count: int | None = None
    codec_frames: int | None = None
    is_final: bool | None = None


class ResponseDecoder:
    """Shared PCM accounting for every response format."""

    kind = "raw_pcm_transport_arrival"

    def __init__(self) -> None:
        self.packets: list[Packet] = []
        self.audio = hashlib.sha256()
        self.pcm_bytes = 0
        self.sample_rate_hz: int | None = None
        self.server_request_id: str | None = None
        self.server_seed: int | None = None
        self.finish_reason: str | None = None
        self.end_metrics: dict[str, Any] | None = None
        self.final_flag_seen: bool | None = None
        self.continuity_valid = False

    def begin(self, headers: Mapping[str, str]) -> None:
        """Read the response headers of a 2xx response."""
        self.server_request_id = headers.get("x-request-id")
        seed = headers.get("x-qwen3-seed")
        self.server_seed = int(seed) if seed is not None and seed.isdigit() else None

    def feed(self, data: bytes, t_ns: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def _new_packet(self, t_ns: int) -> Packet:
        packet = Packet(arrival_ns=t_ns, byte_offset=self.pcm_bytes)
        self.packets.append(packet)
        return packet

    def _pcm(self, packet: Packet, data: bytes) -> None:
        packet.payload += data
        self.audio.update(data)
        self.pcm_bytes += len(data)

    def _arrival(self, data: bytes, t_ns: int) -> None:
        """One transport read of PCM: a packet of its own (non-packetized formats)."""
        if data:
            self._pcm(self._new_packet(t_ns), data)

    def _finish_arrivals(self) -> None:
        """Set the sample fields of 2-byte-aligned arrivals and require whole samples overall."""
        if self.pcm_bytes % 2:
            raise WireError("protocol_error", "PCM16 body has an odd number of bytes")
        for packet in self.packets:
            if packet.byte_offset % 2 == 0 and len(packet.payload) % 2 == 0:
                packet.first_sample = packet.byte_offset // 2
                packet.sample_count = len(packet.payload) // 2


def _media_type(headers: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    content_type = headers.get("content-type", "")
    media, _, rest = content_type.partition(";")
    params: dict[str, str] = {}
    for param in rest.split(";"):
        name, sep, value = param.strip().partition("=")
        if sep:
            params[name.strip().lower()] = value.strip().strip('"')
    return media.strip().lower(), params


def _int_header(headers: Mapping[str, str], name: str) -> int:
    value = headers.get(name)
    if value is None or not value.isdigit():
        raise WireError("protocol_error", f"audio part without a numeric {name}")
    return int(value)


class MultipartDecoder(ResponseDecoder):
    """Our progressive multipart stream: start part, audio parts, then exactly one end or error part."""

    kind = "native_audio_packet"

    def __init__(self, parser: MultipartParser) -> None:
        super().__init__()
        self._parser = parser
        self._stage = "start"
        self._part: PartBegin | None = None
        self._json = bytearray()
        self._packet: Packet | None = None
        self._start_request_id: str | None = None
        self._error: StreamFailure | None = None
        self.sample_rate_hz = SAMPLE_RATE_HZ
        self.final_flag_seen = False

    def feed(self, data: bytes, t_ns: int) -> None:
        for event in self._parser.feed(data):
            if isinstance(event, PartBegin):
                self._begin_part(event, t_ns)
            elif isinstance(event, PartData):
                if self._packet is not None:
                    if not self._packet.payload:
                        self._packet.arrival_ns = t_ns
                    self._pcm(self._packet, event.data)
                else:
                    self._json += event.data
            elif isinstance(event, PartEnd):
                self._end_part()
            elif isinstance(event, StreamClosed) and self._stage != "done":
                raise WireError("protocol_error", "multipart stream closed without an end part")

    def _begin_part(self, part: PartBegin, t_ns: int) -> None:
        media = part.headers.get("content-type", "").split(";")[0].strip().lower()
        self._part = part
        self._json.clear()
        self._packet = None
        if self._stage == "done":
            raise WireError("protocol_error", "a part follows the terminal part")
        if media == "application/json":
            return
        if media != "audio/pcm" or self._stage not in ("start_done", "audio"):
            raise WireError("protocol_error", f"unexpected {media or 'untyped'} part in stage {self._stage}")
        if self.final_flag_seen:
            raise WireError("protocol_error", "an audio part follows the final audio part")
        headers = part.headers
        sequence = _int_header(headers, "x-sequence")
        frames = _int_header(headers, "x-codec-frames")
        samples = _int_header(headers, "x-sample-count")
        final = headers.get("x-final")
        if final not in ("true", "false"):
            raise WireError("protocol_error", "audio part without X-Final true/false")
        previous = self.packets[-1] if self.packets else None
        expected_frame = (
            0 if previous is None else (previous.first_codec_frame or 0) + (previous.codec_frames or 0)
        )
        expected_sample = (
            0 if previous is None else (previous.first_sample or 0) + (previous.sample_count or 0)
        )
        packet = self._new_packet(t_ns)
        packet.first_codec_frame = _int_header(headers, "x-first-codec-frame")
        packet.first_sample = _int_header(headers, "x-first-sample")
        packet.sample_count = samples
        packet.codec_frames = frames
        packet.is_final = final == "true"
        if (
            sequence != len(self.packets) - 1
            or packet.first_codec_frame != expected_frame
            or packet.first_sample != expected_sample
        ):
            raise WireError("discontinuous_stream", f"audio part {sequence} does not continue the stream")
        if not 1 <= frames <= 4 or samples != frames * SAMPLES_PER_CODEC_FRAME:
            raise WireError(
                "protocol_error", f"audio part {sequence}: {frames} frames with {samples} samples"
            )
        if part.content_length != samples * 2:
            raise WireError("protocol_error", f"audio part {sequence}: Content-Length is not 2 x samples")
        self._packet = packet
        self._stage = "audio"

    def _end_part(self) -> None:
        if self._packet is not None:
            if self._packet.is_final:
                self.final_flag_seen = True
            self._packet = None
            return
        try:
            event = json.loads(bytes(self._json))
        except (ValueError, UnicodeDecodeError) as exc:
            raise WireError("protocol_error", f"JSON part does not parse: {exc}") from exc
        if not isinstance(event, dict):
            raise WireError("protocol_error", "JSON part is not an object")
        kind = event.get("type")
        if self._stage == "start":
            self._check_start(event)
            return
        if kind == "error":
            error = event.get("error")
            error = error if isinstance(error, dict) else {}
            self._stage = "done"
            self._error = StreamFailure(str(error.get("code", "stream_error")), str(error.get("detail", "")))
            return
        if kind != "end" or self._stage != "audio":
            raise WireError("protocol_error", f"unexpected JSON part {kind!r} in stage {self._stage}")
        self._check_end(event)
        self._stage = "done"

    def _check_start(self, event: dict[str, Any]) -> None:
        audio = event.get("audio")
        expected_audio = {
            "encoding": "pcm_s16le",
            "sample_rate_hz": SAMPLE_RATE_HZ,
            "channels": 1,
            "samples_per_codec_frame": SAMPLES_PER_CODEC_FRAME,
        }
        if event.get("type") != "start" or audio != expected_audio:
            raise WireError("protocol_error", "the first part is not a valid start part")
        if self.server_request_id is not None and event.get("request_id") != self.server_request_id:
            raise WireError("protocol_error", "start part request_id differs from X-Request-Id")
        self._start_request_id = str(event.get("request_id"))
        self._stage = "start_done"

    def _check_end(self, event: dict[str, Any]) -> None:
        if event.get("request_id") != self._start_request_id:
            raise WireError("protocol_error", "end part request_id differs from the start part")
        reason = event.get("finish_reason")
        if reason not in ("stop", "length"):
            raise WireError("protocol_error", f"end part finish_reason {reason!r}")
        if not self.final_flag_seen:
            raise WireError("protocol_error", "end part before the final audio part")
        metrics = event.get("metrics")
        if not isinstance(metrics, dict):
            raise WireError("protocol_error", "end part without metrics")
        total_samples = self.pcm_bytes // 2
        if "emitted_samples" in metrics and metrics["emitted_samples"] != total_samples:
            raise WireError("protocol_error", "end metrics emitted_samples differ from the stream")
        if "emitted_packets" in metrics and metrics["emitted_packets"] != len(self.packets):
            raise WireError("protocol_error", "end metrics emitted_packets differ from the stream")
        self.finish_reason = reason
        self.end_metrics = metrics

    def close(self) -> None:
        if self._error is not None:
            raise self._error
        if not self._parser.closed:
            raise WireError("truncated_stream", "multipart stream ended before its closing delimiter")
        if self._stage != "done" or not self.packets:
            raise WireError("protocol_error", "multipart stream without audio and an end part")
        self.continuity_valid = True


class WavDecoder(ResponseDecoder):
    """A WAV body; every transport read that carries data-chunk bytes is one arrival."""

    kind = "wav_data_arrival"

    def __init__(self) -> None:
        super().__init__()
        self._parser = WavParser()

    def begin(self, headers: Mapping[str, str]) -> None:
        super().begin(headers)
        reason = headers.get("x-finish-reason")
        if reason is not None:
            if reason not in ("stop", "length"):
                raise WireError("protocol_error", f"X-Finish-Reason {reason!r}")
            self.finish_reason = reason

    def feed(self, data: bytes, t_ns: int) -> None:
        pieces = self._parser.feed(data)
        self._arrival(b"".join(pieces), t_ns)

    def close(self) -> None:
        self._parser.close()
        fmt = self._parser.format
        assert fmt is not None
        if fmt.channels != 1:
            raise WireError("protocol_error", f"WAV has {fmt.channels} channels, expected mono")
        self.sample_rate_hz = fmt.sample_rate_hz
        if not self.pcm_bytes:
            raise WireError("empty_audio", "WAV without audio samples")
        self._finish_arrivals()
        self.continuity_valid = True


class RawPcmDecoder(ResponseDecoder):
    """A raw PCM16 stream (``response_format: pcm``); the rate comes from headers or defaults to 24 kHz."""

    kind = "raw_pcm_transport_arrival"

    def begin(self, headers: Mapping[str, str]) -> None:
        super().begin(headers)
        media, params = _media_type(headers)
        if media not in ("audio/pcm", "audio/l16", "application/octet-stream", "audio/raw"):
            raise WireError("unexpected_content_type", f"expected raw PCM, got {media!r}")
        rate = headers.get("x-sample-rate") or params.get("rate")
        self.sample_rate_hz = int(rate) if rate and rate.isdigit() else SAMPLE_RATE_HZ

    def feed(self, data: bytes, t_ns: int) -> None:
        self._arrival(data, t_ns)

    def close(self) -> None:
        if not self.pcm_bytes:
            raise WireError("empty_audio", "PCM stream without audio samples")
        self._finish_arrivals()
        self.continuity_valid = True


class SseDecoder(ResponseDecoder):
    """OpenAI speech SSE: ``speech.audio.delta`` events with base64 PCM, then ``speech.audio.done``."""

    kind = "sse_audio_delta"

    def __init__(self) -> None:
        super().__init__()
        self._parser = SseParser()
        self._done = False
        self.sample_rate_hz = SAMPLE_RATE_HZ

    def begin(self, headers: Mapping[str, str]) -> None:
        super().begin(headers)
        media, _ = _media_type(headers)
        if media != "text/event-stream":
            raise WireError("unexpected_content_type", f"expected text/event-stream, got {media!r}")

    def feed(self, data: bytes, t_ns: int) -> None:
        for text in self._parser.feed(data):
            if text.strip() == "[DONE]":
                continue
            try:
                event = json.loads(text)
            except ValueError as exc:
                raise WireError("protocol_error", f"SSE event is not JSON: {exc}") from exc
            kind = event.get("type") if isinstance(event, dict) else None
            if self._done:
                raise WireError("protocol_error", "an event follows speech.audio.done")
            if kind == "speech.audio.delta":
                try:
                    pcm = base64.b64decode(str(event.get("audio", "")), validate=True)
                except binascii.Error as exc:
                    raise WireError("protocol_error", "SSE delta audio is not base64") from exc
                self._arrival(pcm, t_ns)
            elif kind == "speech.audio.done":
                self._done = True
            elif kind == "error" or (isinstance(event, dict) and "error" in event):
                error = event.get("error")
                error = error if isinstance(error, dict) else {}
                raise StreamFailure(str(error.get("code", "stream_error")), str(error.get("message", "")))

    def close(self) -> None:
        self._parser.close()
        if not self._done:
            raise WireError("truncated_stream", "event stream ended without speech.audio.done")
        if not self.pcm_bytes:
            raise WireError("empty_audio", "event stream without audio samples")
        self._finish_arrivals()
        self.continuity_valid = True


class Adapter(Protocol):
    """Builds the request for a row and the decoder for its response."""

    @property
    def name(self) -> str: ...

    @property
    def path(self) -> str: ...

    def prepare(self, row: WorkloadRow, request_id: str) -> PreparedRequest: ...

    def decoder(self, headers: Mapping[str, str]) -> ResponseDecoder: ...


def _json_body(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


@dataclass(frozen=True)
class NativeAdapter:
    """Our canonical endpoint; the body is the workload row itself (minus its id)."""

    path: str = "/v1/voice-design/speech"
    name: str = "native"

    def prepare(self, row: WorkloadRow, request_id: str) -> PreparedRequest:
        body = {key: value for key, value in row.raw.items() if key != "id"}
        return PreparedRequest(
            method="POST",
            path=self.path,
            headers={
                "content-type": "application/json",
                "accept": "multipart/mixed, audio/wav",
                "x-request-id": request_id,
            },
            body=_json_body(body),
            streaming=row.streaming,
            api_parity_reasons=(),
        )

    def decoder(self, headers: Mapping[str, str]) -> ResponseDecoder:
        media, _ = _media_type(headers)
        if media == "audio/wav":
            return WavDecoder()
        return MultipartDecoder(MultipartParser(boundary_from_content_type(headers.get("content-type", ""))))


@dataclass(frozen=True)
class OpenAIAdapter:
    """``POST /v1/audio/speech`` with ``input`` = text and ``voice`` = the voice description, plus the
    workload fields named in ``fields`` (a subset of ``OPENAI_FIELDS``) where the row has them."""

    path: str = "/v1/audio/speech"
    model: str = NATIVE_MODEL_ID
    response: str = "pcm"
    fields: tuple[str, ...] = ()
    name: str = "openai"

    def __post_init__(self) -> None:
        unknown = sorted(set(self.fields) - set(OPENAI_FIELDS))
        if unknown:
            raise ValueError(f"openai fields {unknown}: choose from {', '.join(OPENAI_FIELDS)}")

    def prepare(self, row: WorkloadRow, request_id: str) -> PreparedRequest:
        body: dict[str, Any] = {"model": self.model, "input": row.text, "voice": row.voice_description}
        if self.response == "wav":
            body["response_format"] = "wav"
        else:
            body["response_format"] = "pcm"
            body["stream_format"] = "sse" if self.response == "sse" else "audio"
        body.update({name: row.raw[name] for name in self.fields if name in row.raw})
        missing = [name for name in ("seed", "sampling") if name not in self.fields]
        reasons = (f"the openai request carries no {' or '.join(missing)}",) if missing else ()
        return PreparedRequest(
            method="POST",
            path=self.path,
            headers={"content-type": "application/json", "x-request-id": request_id},
            body=_json_body(body),
            streaming=self.response != "wav",
            api_parity_reasons=reasons,
        )

    def decoder(self, headers: Mapping[str, str]) -> ResponseDecoder:
        if self.response == "wav":
            return WavDecoder()
        if self.response == "sse":
            return SseDecoder()
        return RawPcmDecoder()


@dataclass(frozen=True)
class WavAdapter:
    """A buffered-WAV server taking our JSON body."""

    path: str = "/v1/voice-design/speech"
    name: str = "wav"

    def prepare(self, row: WorkloadRow, request_id: str) -> PreparedRequest:
        body = {key: value for key, value in row.raw.items() if key not in ("id", "stream")}
        body["stream"] = False
        body["output_format"] = "wav"
        return PreparedRequest(
            method="POST",
            path=self.path,
            headers={"content-type": "application/json", "accept": "audio/wav"},
            body=_json_body(body),
            streaming=False,
            api_parity_reasons=(),
        )

    def decoder(self, headers: Mapping[str, str]) -> ResponseDecoder:
        return WavDecoder()


def make_adapter(
    api: str,
    path: str | None = None,
    model: str | None = None,
    response: str | None = None,
    fields: tuple[str, ...] = (),
) -> Adapter:
    """The adapter for an API name, with optional path / model / response-format / forwarded-field
    overrides (model, response and fields: openai only)."""
    if fields and api != "openai":
        raise ValueError("fields applies to the openai API only (native and wav send every workload field)")
    if api == "native":
        return NativeAdapter(path=path or NativeAdapter.path)
    if api == "openai":
        if response not in (None, "pcm", "wav", "sse"):
            raise ValueError("openai response must be pcm, wav or sse")
        return OpenAIAdapter(
            path=path or OpenAIAdapter.path,
            model=model or NATIVE_MODEL_ID,
            response=response or "pcm",
            fields=fields,
        )
    if api == "wav":
        return WavAdapter(path=path or WavAdapter.path)
    raise ValueError(f"unknown API {api!r}; choose one of {', '.join(API_NAMES)}")

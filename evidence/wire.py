"""Incremental (sans-IO) parsers for the response bodies the client measures.

They are fed bytes as they arrive and report payload bytes as soon as they are decoded, which is what
time-to-first-audio needs: the first non-empty decoded PCM byte, not the headers or JSON parts.

- ``MultipartParser``: our progressive ``multipart/mixed`` stream (seed contract §1.5), framed on the
  declared boundary and each part's Content-Length, never by scanning payload bytes for the boundary.
- ``WavParser``: a RIFF/WAVE body (PCM16); its data-chunk bytes are the audio.
- ``SseParser``: ``text/event-stream`` events (the OpenAI ``stream_format: sse`` speech stream).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

MAX_PART_HEADER_BYTES = 16 * 1024
MAX_PART_BYTES = 8 * 1024 * 1024
MAX_SSE_EVENT_BYTES = 16 * 1024 * 1024
UNKNOWN_WAV_SIZES = (0, 0xFFFFFFFF)


class WireError(ValueError):
    """The body violates its framing; ``code`` is the failure code recorded for the request."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class PartBegin:
    """A part's headers have been read (names lower-cased)."""

    headers: dict[str, str]
    content_length: int


@dataclass(frozen=True)
class PartData:
    """Payload bytes of the current part."""

    data: bytes


@dataclass(frozen=True)
class PartEnd:
    """The current part's payload is complete."""


@dataclass(frozen=True)
class StreamClosed:
    """The closing delimiter has been read."""


MultipartEvent = PartBegin | PartData | PartEnd | StreamClosed


def boundary_from_content_type(content_type: str) -> str:
    """The boundary parameter of a ``multipart/mixed`` Content-Type."""
    media, _, params = content_type.partition(";")
    if media.strip().lower() != "multipart/mixed":
        raise WireError("unexpected_content_type", f"expected multipart/mixed, got {content_type!r}")
    for param in params.split(";"):
        name, _, value = param.strip().partition("=")
        if name.strip().lower() == "boundary":
            value = value.strip().strip('"')
            if 1 <= len(value) <= 70:
                return value
    raise WireError("protocol_error", "multipart/mixed without a valid boundary parameter")


class MultipartParser:
    """Parses ``--B CRLF headers CRLF CRLF payload CRLF`` parts followed by ``--B--`` CRLF."""

    def __init__(self, boundary: str) -> None:
        self._delimiter = b"--" + boundary.encode("ascii")
        self._buffer = bytearray()
        self._state = "delimiter"
        self._remaining = 0

    @property
    def closed(self) -> bool:
        return self._state == "closed"

    def feed(self, data: bytes) -> list[MultipartEvent]:
        """Consume bytes; return the events they complete (payload data is reported incrementally)."""
        if self._state == "closed":
            if data:
                raise WireError("protocol_error", "bytes after the closing multipart delimiter")
            return []
        self._buffer += data
        events: list[MultipartEvent] = []
        while True:
            if self._state == "delimiter":
                needed = len(self._delimiter) + 2
                if len(self._buffer) < needed:
                    return events
                if not self._buffer.startswith(self._delimiter):
                    raise WireError("protocol_error", "expected a multipart delimiter")
                tail = bytes(self._buffer[len(self._delimiter) : needed])
                if tail == b"\r\n":
                    del self._buffer[:needed]
                    self._state = "headers"
                elif tail == b"--":
                    if len(self._buffer) < needed + 2:
                        return events
                    if self._buffer[needed : needed + 2] != b"\r\n":
                        raise WireError("protocol_error", "closing delimiter not followed by CRLF")
                    del self._buffer[: needed + 2]
                    self._state = "closed"
                    events.append(StreamClosed())
                    if self._buffer:
                        raise WireError("protocol_error", "bytes after the closing multipart delimiter")
                    return events
                else:
                    raise WireError("protocol_error", "malformed multipart delimiter line")
            elif self._state == "headers":
                end = self._buffer.find(b"\r\n\r\n")
                if end < 0:
                    if len(self._buffer) > MAX_PART_HEADER_BYTES:
                        raise WireError("protocol_error", "multipart part headers too large")
                    return events
                block = bytes(self._buffer[:end])
                del self._buffer[: end + 4]
                headers = _parse_headers(block)
                length_text = headers.get("content-length")
                if length_text is None or not length_text.isdigit():
                    raise WireError("protocol_error", "multipart part without a numeric Content-Length")
                length = int(length_text)
                if length > MAX_PART_BYTES:
                    raise WireError("protocol_error", f"multipart part of {length} bytes is too large")
                events.append(PartBegin(headers=headers, content_length=length))
                self._remaining = length
                self._state = "payload"
            elif self._state == "payload":
                if self._remaining:
                    if not self._buffer:
                        return events
                    take = min(self._remaining, len(self._buffer))
                    events.append(PartData(bytes(self._buffer[:take])))
                    del self._buffer[:take]
                    self._remaining -= take
                    if self._remaining:
                        return events
                if len(self._buffer) < 2:
                    return events
                if self._buffer[:2] != b"\r\n":
                    raise WireError("protocol_error", "multipart payload not followed by CRLF")
                del self._buffer[:2]
                events.append(PartEnd())
                self._state = "delimiter"


def _parse_headers(block: bytes) -> dict[str, str]:
    headers: dict[str, str] = {}
    try:
        text = block.decode("ascii")
    except UnicodeDecodeError as exc:
        raise WireError("protocol_error", "non-ASCII multipart part header") from exc
    for line in text.split("\r\n"):
        name, sep, value = line.partition(":")
        if not sep or not name.strip() or name != name.strip():
            raise WireError("protocol_error", f"malformed multipart header line {line!r}")
        key = name.lower()
        if key in headers:
            raise WireError("protocol_error", f"duplicate multipart header {name!r}")
        headers[key] = value.strip()
    return headers


@dataclass
class WavFormat:
    """The fmt chunk of a WAV body."""

    audio_format: int
    channels: int
    sample_rate_hz: int
    byte_rate: int
    block_align: int
    bits_per_sample: int


@dataclass
class WavParser:
    """Parses a PCM16 WAV body incrementally; ``feed`` returns the data-chunk bytes it completes."""

    _buffer: bytearray = field(default_factory=bytearray)
    _state: str = "riff"
    _riff_size: int = 0
    _seen: int = 0
    _data_size: int | None = None
    _data_received: int = 0
    _skip: int = 0
    format: WavFormat | None = None

    def feed(self, data: bytes) -> list[bytes]:
        self._seen += len(data)
        if self._state == "data":
            return self._take_data(data)
        self._buffer += data
        out: list[bytes] = []
        while True:
            if self._state == "riff":
                if len(self._buffer) < 12:
                    return out
                if self._buffer[:4] != b"RIFF" or self._buffer[8:12] != b"WAVE":
                    raise WireError("protocol_error", "body is not a RIFF/WAVE file")
                self._riff_size = struct.unpack_from("<I", self._buffer, 4)[0]
                del self._buffer[:12]
                self._state = "chunk"
            elif self._state == "chunk":
                if len(self._buffer) < 8:
                    return out
                chunk_id = bytes(self._buffer[:4])
                size = struct.unpack_from("<I", self._buffer, 4)[0]
                if chunk_id == b"data":
                    if self.format is None:
                        raise WireError("protocol_error", "WAV data chunk before the fmt chunk")
                    del self._buffer[:8]
                    self._data_size = None if size in UNKNOWN_WAV_SIZES else size
                    self._state = "data"
                    rest = bytes(self._buffer)
                    self._buffer.clear()
                    out.extend(self._take_data(rest))
                    return out
                if chunk_id == b"fmt ":
                    if len(self._buffer) < 8 + size:
                        return out
                    if size < 16:
                        raise WireError("protocol_error", "WAV fmt chunk too short")
                    fields = struct.unpack_from("<HHIIHH", self._buffer, 8)
                    self.format = WavFormat(*fields)
                    del self._buffer[: 8 + size + (size & 1)]
                    self._check_format()
                else:
                    del self._buffer[:8]
                    self._skip = size + (size & 1)
                    self._state = "skip"
            elif self._state == "skip":
                take = min(self._skip, len(self._buffer))
                del self._buffer[:take]
                self._skip -= take
                if self._skip:
                    return out
                self._state = "chunk"
            else:
                return out

    def _check_format(self) -> None:
        fmt = self.format
        assert fmt is not None
        if fmt.audio_format != 1 or fmt.bits_per_sample != 16:
            raise WireError("protocol_error", "WAV is not 16-bit integer PCM")
        if fmt.block_align != fmt.channels * 2 or fmt.byte_rate != fmt.sample_rate_hz * fmt.block_align:
            raise WireError("protocol_error", "WAV byte rate or block align is inconsistent")

    def _take_data(self, data: bytes) -> list[bytes]:
        if self._data_size is not None:
            room = self._data_size - self._data_received
            data = data[: max(room, 0)]
        self._data_received += len(data)
        return [data] if data else []

    def close(self) -> None:
        """Check the body is complete and its RIFF sizes are consistent."""
        if self._state != "data":
            raise WireError("protocol_error", "WAV body ended before its data chunk")
        if self._data_size is not None and self._data_received != self._data_size:
            raise WireError(
                "protocol_error",
                f"WAV data chunk declared {self._data_size} bytes, got {self._data_received}",
            )
        if self._riff_size not in UNKNOWN_WAV_SIZES and self._riff_size + 8 != self._seen:
            raise WireError("protocol_error", "WAV RIFF size does not match the body length")


@dataclass
class SseParser:
    """Splits a ``text/event-stream`` into the joined ``data`` fields of each event."""

    _buffer: bytearray = field(default_factory=bytearray)

    def feed(self, data: bytes) -> list[str]:
        self._buffer += data.replace(b"\r", b"")
        events: list[str] = []
        while True:
            end = self._buffer.find(b"\n\n")
            if end < 0:
                if len(self._buffer) > MAX_SSE_EVENT_BYTES:
                    raise WireError("protocol_error", "server-sent event too large")
                return events
            block = bytes(self._buffer[:end]).decode("utf-8", errors="strict")
            del self._buffer[: end + 2]
            lines = [line[5:].removeprefix(" ") for line in block.split("\n") if line.startswith("data:")]
            if lines:
                events.append("\n".join(lines))

    def close(self) -> None:
        if bytes(self._buffer).strip():
            raise WireError("protocol_error", "event stream ended inside an event")

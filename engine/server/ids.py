"""Request ids: any UUID from the caller, else a UUIDv7 (time-ordered, so logs and traces sort)."""

from __future__ import annotations

import os
import time
import uuid

from .problems import Problem


def uuid7() -> uuid.UUID:
    """RFC 9562 UUIDv7: 48-bit Unix milliseconds, version 7, 74 random bits."""
    value = (time.time_ns() // 1_000_000) << 80 | int.from_bytes(os.urandom(10), "big")
    value = (value & ~(0xF << 76)) | (0x7 << 76)
    value = (value & ~(0x3 << 62)) | (0x2 << 62)
    return uuid.UUID(int=value)


def parse_request_id(raw: str | None) -> str:
    """The canonical lowercase form of the caller's id, or a fresh UUIDv7 when absent."""
    if raw is None:
        return str(uuid7())
    if not raw.isascii():
        raise Problem("invalid_request_id", "x-request-id must be an ASCII UUID")
    try:
        return str(uuid.UUID(raw.strip()))
    except ValueError:
        raise Problem("invalid_request_id", "x-request-id must be a UUID") from None


def boundary_for(request_id: str) -> str:
    return "qwen3tts-" + uuid.UUID(request_id).hex

"""Container acceptance against a running server: readiness, one progressive request, one WAV.

``python -m qwen3_tts_native.release.acceptance --base-url http://127.0.0.1:18080`` (standard library
only, so it runs anywhere the repository is checked out). The release workflow starts the pushed digest
with the hardened profile, runs this, then stops the container with SIGTERM and requires exit 0.
Exit 0 accepted, 1 a check failed (named on stderr).
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import sys
import time
import wave
from collections.abc import Sequence
from urllib.parse import urlsplit

from .healthcheck import check_url, probe

SPEECH_PATH = "/v1/voice-design/speech"
REQUEST = {
    "text": "Release acceptance check.",
    "voice_description": "A calm, neutral adult voice.",
    "language": "english",
    "seed": 42,
    "max_duration_seconds": 2.0,
}


class AcceptanceError(Exception):
    """A check failed; the message says which and why."""


def wait_ready(base_url: str, deadline_s: float) -> float:
    """Seconds until /health/ready answered ready; AcceptanceError after ``deadline_s``."""
    host, port, path = check_url(base_url.rstrip("/") + "/health/ready")
    start = time.monotonic()
    reason: str | None = "not polled"
    while time.monotonic() - start < deadline_s:
        reason = probe(host, port, path)
        if reason is None:
            return time.monotonic() - start
        time.sleep(0.2)
    raise AcceptanceError(f"readiness: not ready within {deadline_s:.0f} s (last: {reason})")


def check_stream(base_url: str) -> int:
    """One progressive multipart request; returns the number of audio parts."""
    response, body = _post(base_url, {**REQUEST, "stream": True})
    content_type = response.getheader("Content-Type", "")
    if response.status != 200 or not content_type.startswith("multipart/mixed"):
        raise AcceptanceError(f"stream: HTTP {response.status} {content_type!r}: {body[:200]!r}")
    boundary = content_type.split("boundary=", 1)[-1].strip('"').encode()
    parts = _multipart(body, boundary)
    if len(parts) < 3 or json.loads(parts[0][1]).get("type") != "start":
        raise AcceptanceError("stream: expected a start part, audio parts and an end part")
    audio = parts[1:-1]
    for sequence, (headers, payload) in enumerate(audio):
        if not headers.get("content-type", "").startswith("audio/pcm"):
            raise AcceptanceError(f"stream: part {sequence + 1} is {headers.get('content-type')!r}")
        samples = int(headers["x-sample-count"])
        if int(headers.get("x-sequence", -1)) != sequence or len(payload) != 2 * samples:
            raise AcceptanceError(f"stream: audio part {sequence} is out of sequence or mis-sized")
        if (headers.get("x-final") == "true") != (sequence == len(audio) - 1):
            raise AcceptanceError("stream: exactly the last audio part must be final")
    end = json.loads(parts[-1][1])
    if end.get("type") != "end" or end.get("finish_reason") not in ("stop", "length"):
        raise AcceptanceError(f"stream: terminal part is not a clean end: {end!r}"[:300])
    return len(audio)


def check_wav(base_url: str) -> int:
    """One buffered WAV request; returns its sample count."""
    response, body = _post(base_url, {**REQUEST, "seed": 43, "stream": False})
    if response.status != 200 or response.getheader("Content-Type") != "audio/wav":
        raise AcceptanceError(f"wav: HTTP {response.status} {response.getheader('Content-Type')!r}")
    if int(response.getheader("Content-Length", "-1")) != len(body) or len(body) <= 44:
        raise AcceptanceError(f"wav: Content-Length does not match the {len(body)} bytes received")
    with wave.open(io.BytesIO(body)) as reader:
        shape = (reader.getframerate(), reader.getnchannels(), reader.getsampwidth(), reader.getcomptype())
        frames = reader.getnframes()
    if shape != (24000, 1, 2, "NONE") or frames <= 0 or 44 + 2 * frames != len(body):
        raise AcceptanceError(f"wav: expected 24 kHz mono 16-bit PCM, got {shape} with {frames} frames")
    return frames


def _post(base_url: str, payload: dict[str, object]) -> tuple[http.client.HTTPResponse, bytes]:
    parts = urlsplit(base_url)
    check_url(base_url.rstrip("/") + SPEECH_PATH)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port or 80, timeout=120)
    try:
        connection.request(
            "POST", SPEECH_PATH, body=json.dumps(payload), headers={"Content-Type": "application/json"}
        )
        response = connection.getresponse()
        return response, response.read()
    finally:
        connection.close()


def _multipart(body: bytes, boundary: bytes) -> list[tuple[dict[str, str], bytes]]:
    """Parts framed by boundary and Content-Length, never by scanning payloads."""
    parts: list[tuple[dict[str, str], bytes]] = []
    position = 0
    delimiter = b"--" + boundary
    while True:
        if not body.startswith(delimiter, position):
            raise AcceptanceError(f"stream: broken framing at byte {position}")
        position += len(delimiter)
        if body.startswith(b"--", position):
            return parts
        head_end = body.index(b"\r\n\r\n", position)
        headers = {}
        for line in body[position + 2 : head_end].decode("latin-1").split("\r\n"):
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        start = head_end + 4
        end = start + int(headers["content-length"])
        parts.append((headers, body[start:end]))
        position = end + 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qwen3_tts_native.release.acceptance")
    parser.add_argument("--base-url", default="http://127.0.0.1:8080", help="server on loopback")
    parser.add_argument("--ready-within", type=float, default=120.0, metavar="SECONDS", help="deadline")
    args = parser.parse_args(argv)
    try:
        ready = wait_ready(args.base_url, args.ready_within)
        print(f"ready after {ready:.1f} s")
        print(f"progressive request: {check_stream(args.base_url)} audio parts, clean end")
        print(f"WAV request: {check_wav(args.base_url)} samples at 24 kHz mono 16-bit")
    except (AcceptanceError, ValueError, KeyError, OSError, http.client.HTTPException) as error:
        print(f"ACCEPTANCE FAILED: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

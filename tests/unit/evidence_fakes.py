"""Test doubles for the evidence tests: a loopback server speaking the wire formats the client parses
(our multipart stream, buffered WAV, OpenAI-style raw PCM / SSE / WAV), and bundle tampering helpers.

The server is a stand-in for a peer's wire format, not for our engine: it emits deterministic PCM with
the contract's framing, and special texts trigger failures (``FAIL429``, ``ERRPART``, ``TRUNCATE``).
``FakeFasterModel`` stands in for a loaded faster-qwen3-tts model behind benchmarks/peers/faster_server.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import socket
import struct
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

SAMPLES_PER_FRAME = 1920
PACKET_DELAY_S = 0.004


def pcm_for(seed: int, frames: int) -> bytes:
    """Deterministic PCM16 for a seed."""
    count = frames * SAMPLES_PER_FRAME
    return struct.pack(f"<{count}h", *((seed * 7919 + i * 31) % 20000 - 10000 for i in range(count)))


def wav_bytes(pcm: bytes, rate: int = 24000) -> bytes:
    header = b"RIFF" + struct.pack("<I", 36 + len(pcm)) + b"WAVE"
    header += b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
    return header + b"data" + struct.pack("<I", len(pcm)) + pcm


def multipart_parts(
    request_id: str, seed: int, frames: int, finish: str = "length", error_after: int | None = None
) -> tuple[str, list[bytes]]:
    """(boundary, wire chunks) of one progressive multipart response, one chunk per part."""
    boundary = "qwen3tts-" + request_id.replace("-", "")
    pcm = pcm_for(seed, frames)

    def part(content_type: str, payload: bytes, extra: dict[str, str] | None = None) -> bytes:
        head = f"--{boundary}\r\nContent-Type: {content_type}\r\nContent-Length: {len(payload)}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in (extra or {}).items())
        return head.encode() + b"\r\n" + payload + b"\r\n"

    start = {
        "type": "start",
        "request_id": request_id,
        "model": "qwen3-tts-1.7b-voice-design",
        "seed": seed,
        "audio": {
            "encoding": "pcm_s16le",
            "sample_rate_hz": 24000,
            "channels": 1,
            "samples_per_codec_frame": 1920,
        },
    }
    chunks = [part("application/json", json.dumps(start).encode())]
    frame = 0
    sequence = 0
    while frame < frames:
        count = 1 if frame == 0 else min(4, frames - frame)
        if error_after is not None and sequence == error_after:
            error = {
                "type": "error",
                "request_id": request_id,
                "error": {"code": "internal_error", "detail": "injected"},
            }
            chunks.append(
                part("application/json", json.dumps(error).encode()) + f"--{boundary}--\r\n".encode()
            )
            return boundary, chunks
        payload = pcm[frame * 3840 : (frame + count) * 3840]
        chunks.append(
            part(
                "audio/pcm;rate=24000;channels=1;format=s16le",
                payload,
                {
                    "X-Sequence": str(sequence),
                    "X-First-Codec-Frame": str(frame),
                    "X-First-Sample": str(frame * 1920),
                    "X-Sample-Count": str(count * 1920),
                    "X-Codec-Frames": str(count),
                    "X-Final": "true" if frame + count == frames else "false",
                },
            )
        )
        frame += count
        sequence += 1
    end = {
        "type": "end",
        "request_id": request_id,
        "finish_reason": finish,
        "metrics": {"emitted_samples": frames * 1920, "emitted_packets": sequence},
    }
    chunks.append(part("application/json", json.dumps(end).encode()) + f"--{boundary}--\r\n".encode())
    return boundary, chunks


async def _paced(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk
        await asyncio.sleep(PACKET_DELAY_S)


def _frames(body: dict[str, Any]) -> int:
    return max(1, math.ceil(float(body.get("max_duration_seconds", 0.4)) * 12.5 - 1e-9))


async def voice_design(request: Request) -> Response:
    body = await request.json()
    text = body["text"]
    if "FAIL429" in text:
        return JSONResponse({"code": "capacity_exhausted"}, status_code=429, headers={"Retry-After": "1"})
    request_id = request.headers.get("x-request-id") or str(uuid.uuid4())
    seed = int(body.get("seed", 1))
    frames = _frames(body)
    headers = {"X-Request-Id": request_id, "X-Qwen3-Seed": str(seed)}
    if body.get("stream") is False or body.get("output_format") == "wav":
        data = wav_bytes(pcm_for(seed, frames))
        return StreamingResponse(
            _paced([data[i : i + 4096] for i in range(0, len(data), 4096)]),
            media_type="audio/wav",
            headers={**headers, "X-Finish-Reason": "length"},
        )
    boundary, chunks = multipart_parts(request_id, seed, frames, error_after=1 if "ERRPART" in text else None)
    if "TRUNCATE" in text:
        chunks = chunks[:-1]
    return StreamingResponse(
        _paced(chunks), media_type=f"multipart/mixed; boundary={boundary}", headers=headers
    )


async def openai_speech(request: Request) -> Response:
    body = await request.json()
    frames = 5
    pcm = pcm_for(len(body["input"]), frames)
    if body.get("response_format") == "wav":
        return Response(wav_bytes(pcm), media_type="audio/wav")
    if body.get("stream_format") == "sse":
        events = [
            b"data: "
            + json.dumps(
                {"type": "speech.audio.delta", "audio": base64.b64encode(pcm[i : i + 3841]).decode()}
            ).encode()
            + b"\n\n"
            for i in range(0, len(pcm), 3841)
        ]
        events.append(b'data: {"type": "speech.audio.done", "usage": {}}\n\n')
        return StreamingResponse(_paced(events), media_type="text/event-stream")
    return StreamingResponse(
        _paced([pcm[i : i + 3001] for i in range(0, len(pcm), 3001)]),
        media_type="audio/pcm",
        headers={"X-Sample-Rate": "24000"},
    )


async def ready(request: Request) -> Response:
    return JSONResponse({"status": "ready"})


def make_app() -> Starlette:
    return Starlette(
        routes=[
            Route("/v1/voice-design/speech", voice_design, methods=["POST"]),
            Route("/v1/audio/speech", openai_speech, methods=["POST"]),
            Route("/health/ready", ready),
        ]
    )


class _Languages:
    def _validate_languages(self, languages: list[str]) -> None:
        if any(
            language.lower() not in ("english", "german", "french", "italian", "auto")
            for language in languages
        ):
            raise ValueError(f"Unsupported languages: {languages}")


class FakeFasterModel:
    """faster-qwen3-tts's streaming VoiceDesign call: ``chunk_size`` frames of a constant level per chunk;
    it counts how many calls run at once."""

    model = _Languages()

    def __init__(self) -> None:
        self.active = 0
        self.most_active = 0
        self._guard = threading.Lock()

    def generate_voice_design_streaming(self, chunk_size: int, **kwargs: Any) -> Iterator[Any]:
        import numpy as np

        with self._guard:
            self.active += 1
            self.most_active = max(self.most_active, self.active)
        try:
            frames = int(kwargs["max_new_tokens"])
            for start in range(0, frames, chunk_size):
                count = min(chunk_size, frames - start)
                time.sleep(0.002 * count)
                yield np.full(count * SAMPLES_PER_FRAME, 0.25, dtype=np.float32), 24000, {}
        finally:
            with self._guard:
                self.active -= 1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class FakeServer:
    """The fake app served by uvicorn on a loopback port, in a background thread."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        config = uvicorn.Config(
            make_app(), host="127.0.0.1", port=self.port, log_level="error", lifespan="off"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FakeServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("fake server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def workload_lines(rows: int = 3, max_duration: float = 0.4, **extra: Any) -> bytes:
    """A small workload in the http-workload-10 format."""
    out = []
    for i in range(rows):
        row: dict[str, Any] = {
            "id": f"row-{i:02d}",
            "text": f"Sentence number {i}.",
            "voice_description": "A calm adult voice.",
            "language": "English",
            "seed": 40 + i,
            "max_duration_seconds": max_duration,
            "sampling": {
                "strategy": "sample",
                "temperature": 0.9,
                "top_p": 1.0,
                "top_k": 50,
                "repetition_penalty": 1.05,
                "predictor": {"strategy": "sample", "temperature": 0.9, "top_p": 1.0, "top_k": 50},
            },
            "stream": True,
        }
        row.update(extra)
        out.append(json.dumps(row))
    return ("\n".join(out) + "\n").encode()


def reseal(root: Path) -> None:
    """Re-hash a tampered bundle the way a careful forger would: manifest evidence entries and SHA256SUMS."""
    from qwen3_tts_native.evidence.bundle import sha256_file, write_sums

    manifest_path = root / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    for entry in manifest["evidence_files"]:
        path = root / entry["path"]
        entry["sha256"] = sha256_file(path)
        entry["bytes"] = path.stat().st_size
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    write_sums(root)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records))


def run_dirs(root: Path) -> Iterator[Path]:
    yield from sorted(p.parent for p in root.glob("runs/*/*/*/requests.jsonl"))


def build_bundle(
    server_url: str,
    out: Path,
    engines: list[str] | None = None,
    profiles: str = "B3,R40",
    requests: int = 4,
    warmups: int = 1,
    rounds: int = 1,
) -> Path:
    """Run ``evidence run`` in-process against the fake server and return the bundle directory."""
    import os

    from qwen3_tts_native.cli import main

    workload = out.parent / f"{out.name}-workload.jsonl"
    workload.write_bytes(workload_lines())
    pid = os.getpid()
    specs = engines or [
        f"id=ours,url={server_url},api=native,pid={pid},version=1.0",
        f"id=peer-sse,url={server_url},api=openai,response=sse,role=baseline,pid={pid}",
        f"id=peer-wav,url={server_url},api=wav,role=reference,pid={pid}",
    ]
    argv = [
        "evidence",
        "run",
        "--workload",
        str(workload),
        "--out",
        str(out),
        "--profile",
        profiles,
        "--requests",
        str(requests),
        "--warmups",
        str(warmups),
        "--rounds",
        str(rounds),
        "--idle-seconds",
        "0.3",
        "--quiet",
    ]
    for spec in specs:
        argv += ["--engine", spec]
    code = main(argv)
    assert code == 0, f"evidence run exited {code}"
    return out

"""Helpers for the server tests: real servers, an independent multipart reader, request bodies.

Real ``qwen3-tts serve`` processes on loopback with a tiny random checkpoint, and a multipart reader built
on Python's own MIME parser, not on the server's code. Servers run with one torch thread (``--threads 1``,
and OMP_NUM_THREADS=1 for any other OpenMP user): on a shared 2-core machine intra-op threads make tiny
matmuls thousands of times slower, and the in-process reference engine uses the same setting, so server
audio and offline audio are computed the same way.
"""

from __future__ import annotations

import email.message
import email.parser
import email.policy
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from qwen3_tts_native.engine.runtime.request import PredictorSampling, SynthesisRequest, TalkerSampling

STARTUP_TIMEOUT_S = 120.0


OfflinePcm = Callable[[SynthesisRequest], bytes]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ServerProcess:
    """One `python -m qwen3_tts_native serve` child; its stdout+stderr go to a log file."""

    model: Path | None  # None: the embedded demo checkpoint
    log_path: Path
    options: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    port: int = 0
    process: subprocess.Popen[bytes] | None = None

    @classmethod
    def launch(
        cls, model: Path | None, log_dir: Path, env: dict[str, str] | None = None, **options: str
    ) -> ServerProcess:
        """Start a server with ``--name value`` flags given as ``name="value"`` (a value of "" passes the
        bare flag) and extra environment variables, and wait until it is ready."""
        flags = {name.replace("_", "-"): value for name, value in options.items()}
        return cls(model, log_dir / "server.log", flags, env or {}).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> ServerProcess:
        self.port = free_port()
        args = [sys.executable, "-m", "qwen3_tts_native", "serve", "--port", str(self.port), "--threads", "1"]
        if self.model is not None:
            args += ["--model", str(self.model)]
        for name, value in self.options.items():
            args += [f"--{name}", value] if value else [f"--{name}"]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "QWEN3_TTS_DEVICE": "cpu", **self.env}
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/health/ready", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server not ready within {STARTUP_TIMEOUT_S} s:\n{self.log()}")

    def signal(self, number: int) -> None:
        assert self.process is not None
        self.process.send_signal(number)

    def wait(self, timeout: float) -> int:
        assert self.process is not None
        return self.process.wait(timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 30) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def metric(self, name: str) -> float:
        for line in httpx.get(f"{self.url}/metrics", timeout=5).text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise KeyError(name)


@dataclass
class Stream:
    """A progressive response taken apart by Python's own MIME parser (not the server's code)."""

    start: dict[str, Any]
    audio: list[tuple[dict[str, str], bytes]]
    terminal: dict[str, Any]

    @property
    def pcm(self) -> bytes:
        return b"".join(payload for _, payload in self.audio)


def _payload(part: email.message.Message) -> bytes:
    payload = part.get_payload(decode=True)
    assert isinstance(payload, bytes)
    return payload


def parse_multipart(content_type: str, body: bytes) -> Stream:
    """Parse with email.parser and check the part sequence: one start, audio parts, one terminal part."""
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body
    )
    assert message.is_multipart() and not message.defects, message.defects
    parts = list(message.iter_parts())  # type: ignore[attr-defined]
    kinds = [part.get_content_type() for part in parts]
    assert kinds[0] == "application/json" and kinds[-1] == "application/json", kinds
    assert set(kinds[1:-1]) == {"audio/pcm"}, kinds
    audio = []
    for part in parts[1:-1]:
        payload = _payload(part)
        assert int(part["Content-Length"]) == len(payload)
        audio.append(({name: str(value) for name, value in part.items()}, payload))
    start = json.loads(_payload(parts[0]))
    terminal = json.loads(_payload(parts[-1]))
    assert start["type"] == "start" and terminal["type"] in ("end", "error")
    return Stream(start, audio, terminal)


def check_positions(stream: Stream, complete: bool = True) -> None:
    """Contiguous zero-based positions, 1 frame first, then at most 4; a complete stream's last is final."""
    frame = sample = 0
    for index, (headers, payload) in enumerate(stream.audio):
        frames = int(headers["X-Codec-Frames"])
        assert int(headers["X-Sequence"]) == index
        assert int(headers["X-First-Codec-Frame"]) == frame
        assert int(headers["X-First-Sample"]) == sample
        assert int(headers["X-Sample-Count"]) == frames * 1920 == len(payload) // 2
        assert 1 <= frames <= 4 and (index > 0 or frames == 1)
        final = complete and index == len(stream.audio) - 1
        assert headers["X-Final"] == ("true" if final else "false")
        frame += frames
        sample += frames * 1920


def speech_body(**fields: Any) -> dict[str, Any]:
    return {"text": "Hello from the test suite.", "voice_description": "A calm, low voice.", **fields}


def synthesis_request(body: dict[str, Any]) -> SynthesisRequest:
    """The engine request a body means, written out independently of the server's mapping."""
    sampling = body.get("sampling", {})
    predictor = sampling.get("predictor", {})
    greedy = sampling.get("strategy") == "greedy"
    predictor_greedy = predictor["strategy"] == "greedy" if "strategy" in predictor else greedy
    return SynthesisRequest(
        text=body["text"],
        voice_description=body["voice_description"],
        language=body.get("language", "auto").strip().lower(),
        seed=body["seed"],
        max_frames=math.ceil(body["max_duration_seconds"] * 12.5),
        talker_sampling=TalkerSampling(
            greedy=greedy,
            temperature=sampling.get("temperature", 0.9),
            top_k=sampling.get("top_k", 50),
            top_p=sampling.get("top_p", 1.0),
            repetition_penalty=sampling.get("repetition_penalty", 1.05),
        ),
        predictor_sampling=PredictorSampling(
            greedy=predictor_greedy,
            temperature=predictor.get("temperature", 0.9),
            top_k=predictor.get("top_k", 50),
            top_p=predictor.get("top_p", 1.0),
        ),
    )


def read_until(chunks: Iterator[bytes], buffer: bytearray, marker: bytes) -> None:
    """Pull chunks of a streaming body into ``buffer`` until ``marker`` has arrived."""
    while marker not in buffer:
        buffer += next(chunks)


def stream_speech(
    url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[httpx.Response, bytes]:
    with httpx.stream(
        "POST", f"{url}/v1/voice-design/speech", json=body, headers=headers, timeout=120
    ) as response:
        return response, response.read()

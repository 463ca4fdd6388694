"""An OpenAI-style HTTP server around faster-qwen3-tts 0.5.4 on a snapshot: the peer baseline of
``benchmarks/device/evidence_run.py`` (measured by ``qwen3-tts evidence run`` with ``api=openai``).

``POST /v1/audio/speech`` takes ``{"model", "input", "voice" or "instructions", "response_format": "pcm"
| "wav", "stream_format": "audio", "language", "seed", "max_duration_seconds", "sampling"}``: ``input`` is
the text, ``instructions`` (else ``voice``) the voice description, ``language`` defaults to Auto. ``pcm``
streams 24 kHz PCM16 as faster-qwen3-tts's streaming generator yields it (every ``--chunk-size`` codec
frames; 8 is its published setting); ``wav`` answers one buffered WAV. ``GET /health/ready`` answers 200:
the port opens only after the model has loaded and a warm-up has captured its CUDA graphs.

- Single stream: faster-qwen3-tts has no batching and one static cache, so requests run one at a time
  under a lock, on one worker thread (queued requests wait, and their wait counts in their latency).
- Seed: ``torch.manual_seed(seed)`` before the request's generation; echoed as ``X-Qwen3-Seed``.
- Length: ``max_new_tokens = ceil(max_duration_seconds x 12.5)``, else ``--max-frames``, which is also
  the most a request may ask for.
- Sampling: the talker's strategy, temperature, top_k, top_p and repetition_penalty are honoured; the code
  predictor's are fixed in its CUDA graph (sample, temperature 0.9, top-k 50, top-p 1.0), so a request that
  asks for other predictor settings is refused (422) rather than silently served differently.

Loading and the transformers-5 workaround come from ``faster_qwen3_tts_peer.load_faster``. Run it with
faster-qwen3-tts, qwen-tts-hf, starlette and uvicorn importable (on the device:
``PYTHONPATH=/tmp/site_faster:/tmp/site_common``).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import math
import struct
import sys
from collections.abc import AsyncIterator, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

SAMPLE_RATE = 24_000
FRAMES_PER_SECOND = 12.5
FIXED_PREDICTOR = {"strategy": "sample", "temperature": 0.9, "top_k": 50, "top_p": 1.0}
BODY_FIELDS = frozenset(
    {
        "model",
        "input",
        "voice",
        "instructions",
        "response_format",
        "stream_format",
        "speed",
        "language",
        "seed",
        "max_duration_seconds",
        "sampling",
    }
)
TALKER_CONTROLS = ("temperature", "top_k", "top_p", "repetition_penalty")


class BadRequest(Exception):
    """A request this server refuses: HTTP ``status`` with a JSON error ``code``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


@dataclass(frozen=True)
class Job:
    """One synthesis: the keyword arguments of ``generate_voice_design_streaming`` plus seed and format."""

    kwargs: dict[str, Any]
    seed: int | None
    wav: bool


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadRequest(422, "invalid_value", f"{name} must be a finite number")
    return float(value)


def _sampling(sampling: Any) -> dict[str, Any]:
    """The talker keyword arguments for a ``sampling`` object (our workload's format)."""
    if sampling is None:
        return {}
    if not isinstance(sampling, dict):
        raise BadRequest(400, "malformed_json", "sampling must be an object")
    strategy = sampling.get("strategy", "sample")
    if strategy not in ("sample", "greedy"):
        raise BadRequest(422, "invalid_value", "sampling.strategy must be sample or greedy")
    predictor = sampling.get("predictor") or {}
    if not isinstance(predictor, dict):
        raise BadRequest(400, "malformed_json", "sampling.predictor must be an object")
    wanted = {"strategy": predictor.get("strategy", strategy)}
    wanted.update({k: predictor[k] for k in ("temperature", "top_k", "top_p") if k in predictor})
    if any(FIXED_PREDICTOR[k] != v for k, v in wanted.items()):
        raise BadRequest(
            422,
            "unsupported_sampling",
            f"the code predictor's sampling is fixed in its CUDA graph at {FIXED_PREDICTOR}",
        )
    kwargs: dict[str, Any] = {"do_sample": strategy == "sample"}
    for name in TALKER_CONTROLS:
        if name in sampling:
            value = _number(sampling[name], f"sampling.{name}")
            kwargs[name] = int(value) if name == "top_k" else value
    return kwargs


def parse_body(body: Any, max_frames: int) -> Job:
    """A request body as a Job (raises BadRequest)."""
    if not isinstance(body, dict):
        raise BadRequest(400, "malformed_json", "the body must be a JSON object")
    unknown = sorted(set(body) - BODY_FIELDS)
    if unknown:
        raise BadRequest(400, "malformed_json", f"unknown fields {unknown}")
    text = body.get("input")
    instruct = body.get("instructions") or body.get("voice")
    language = body.get("language", "Auto")
    if not isinstance(text, str) or not text.strip():
        raise BadRequest(422, "invalid_value", "input must be a non-empty string")
    if not isinstance(instruct, str) or not instruct.strip():
        raise BadRequest(422, "invalid_value", "instructions or voice must describe the voice")
    if not isinstance(language, str) or not language.strip():
        raise BadRequest(422, "invalid_value", "language must be a non-empty string")
    response_format = body.get("response_format", "pcm")
    if response_format not in ("pcm", "wav"):
        raise BadRequest(422, "unsupported_format", "response_format must be pcm or wav")
    if body.get("stream_format", "audio") != "audio":
        raise BadRequest(422, "unsupported_format", "stream_format must be audio")
    if body.get("speed", 1.0) != 1.0:
        raise BadRequest(422, "unsupported_speed", "speed must be 1.0")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise BadRequest(422, "invalid_value", "seed must be a non-negative integer")
    frames = max_frames
    if body.get("max_duration_seconds") is not None:
        seconds = _number(body["max_duration_seconds"], "max_duration_seconds")
        frames = math.ceil(seconds * FRAMES_PER_SECOND - 1e-9)
        if not 1 <= frames <= max_frames:
            raise BadRequest(
                422, "duration_out_of_range", f"max_duration_seconds allows 1..{max_frames} frames"
            )
    kwargs = {"text": text, "instruct": instruct, "language": language, "max_new_tokens": frames}
    kwargs.update(_sampling(body.get("sampling")))
    return Job(kwargs=kwargs, seed=seed, wav=response_format == "wav")


def pcm16(audio: Any) -> bytes:
    """Float audio in [-1, 1] as little-endian PCM16 bytes."""
    import numpy as np

    samples = np.clip(np.asarray(audio, dtype=np.float32).reshape(-1), -1.0, 1.0)
    return bytes((samples * 32767.0).round().astype("<i2").tobytes())


def wav_bytes(pcm: bytes) -> bytes:
    """A mono 24 kHz PCM16 WAV file around ``pcm``."""
    header = b"RIFF" + struct.pack("<I", 36 + len(pcm)) + b"WAVE"
    header += b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, SAMPLE_RATE, SAMPLE_RATE * 2, 2, 16)
    return header + b"data" + struct.pack("<I", len(pcm)) + pcm


@dataclass
class Synthesizer:
    """Runs one job at a time on one worker thread; a job's chunks are PCM16 bytes."""

    model: Any
    chunk_size: int
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    worker: concurrent.futures.ThreadPoolExecutor = field(
        default_factory=lambda: concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="faster-tts")
    )

    def _generate(self, job: Job) -> Generator[bytes, None, None]:
        if job.seed is not None:
            import torch

            torch.manual_seed(job.seed)
        for audio, sample_rate, _ in self.model.generate_voice_design_streaming(
            chunk_size=self.chunk_size, **job.kwargs
        ):
            if sample_rate != SAMPLE_RATE:
                raise RuntimeError(f"faster-qwen3-tts produced {sample_rate} Hz, expected {SAMPLE_RATE}")
            yield pcm16(audio)

    async def chunks(self, job: Job) -> AsyncIterator[bytes]:
        """The job's PCM chunks. Every step of the generator runs on the worker thread, and its close is
        queued there too (never awaited: a cancelled request must not skip it), so a later job's steps
        always follow it."""
        async with self.lock:
            loop = asyncio.get_running_loop()
            steps = self._generate(job)
            try:
                while (chunk := await loop.run_in_executor(self.worker, next, steps, None)) is not None:
                    if chunk:
                        yield chunk
            finally:
                self.worker.submit(steps.close)


def create_app(synthesizer: Synthesizer, max_frames: int, version: str) -> Starlette:
    """The HTTP app over a loaded (and warmed-up) model."""

    async def speech(request: Request) -> Response:
        try:
            try:
                body = await request.json()
            except ValueError as exc:
                raise BadRequest(400, "malformed_json", f"the body is not JSON: {exc}") from exc
            job = parse_body(body, max_frames)
            check = getattr(getattr(synthesizer.model, "model", None), "_validate_languages", None)
            if check is not None:
                try:
                    check([job.kwargs["language"]])
                except ValueError as exc:
                    raise BadRequest(422, "unsupported_language", str(exc)) from exc
        except BadRequest as exc:
            return JSONResponse({"error": {"code": exc.code, "message": str(exc)}}, status_code=exc.status)
        headers = {"X-Request-Id": request.headers.get("x-request-id", "")}
        if job.seed is not None:
            headers["X-Qwen3-Seed"] = str(job.seed)
        if job.wav:
            pcm = b"".join([chunk async for chunk in synthesizer.chunks(job)])
            return Response(wav_bytes(pcm), media_type="audio/wav", headers=headers)
        return StreamingResponse(
            synthesizer.chunks(job),
            media_type=f"audio/pcm;rate={SAMPLE_RATE};channels=1;format=s16le",
            headers={**headers, "X-Sample-Rate": str(SAMPLE_RATE)},
        )

    async def ready(request: Request) -> Response:
        return JSONResponse(
            {
                "status": "ready",
                "engine": "faster-qwen3-tts",
                "version": version,
                "chunk_size": synthesizer.chunk_size,
                "max_frames": max_frames,
            }
        )

    return Starlette(
        routes=[
            Route("/v1/audio/speech", speech, methods=["POST"]),
            Route("/health/ready", ready, methods=["GET"]),
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="snapshot directory")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8092)
    parser.add_argument(
        "--chunk-size", type=int, default=8, help="codec frames per streamed chunk (default 8)"
    )
    parser.add_argument(
        "--max-frames",
        type=int,
        default=256,
        help="frames without max_duration_seconds, and the most allowed",
    )
    args = parser.parse_args()
    if not 1 <= args.chunk_size <= 64 or not 1 <= args.max_frames <= 1536:
        parser.error("--chunk-size must be 1..64 and --max-frames 1..1536 (a 2048-position static cache)")

    from importlib.metadata import version

    import uvicorn

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from faster_qwen3_tts_peer import load_faster

    model = load_faster(args.model)
    for _ in model.generate_voice_design_streaming(  # warm-up: captures the CUDA graphs
        text="Warm up.",
        instruct="A calm voice.",
        language="English",
        max_new_tokens=16,
        chunk_size=args.chunk_size,
    ):
        pass
    app = create_app(Synthesizer(model, args.chunk_size), args.max_frames, version("faster-qwen3-tts"))
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The load client: runs one (engine, profile, round) against a server URL and streams raw records to disk.

Timing rules (seed contract §4.6): the client clock is ``time.monotonic_ns``; a request's ``t0`` is taken
immediately before the request is handed to the connection; time to first audio (TTFA) is when the first
non-empty decoded PCM byte arrived (headers, JSON parts, WAV headers and framing do not count); wall time
ends when the whole body and its protocol terminator have been consumed and checked.

Load shapes:

- closed loop ``B<n>``: ``n`` requests in flight. ``batch`` runs synchronized batches of width ``n`` (the
  seed protocol: a batch ends when its slowest request ends); ``continuous`` keeps ``n`` workers busy.
- open loop ``R<rate>``: Poisson arrivals at ``rate`` requests/s from a seeded generator, each request
  started on schedule whatever is still in flight.

Each run: an idle baseline (no requests, for telemetry), warm-ups (never recorded; any failure aborts the
run), then a fixed number of measured requests. Request ``i`` uses workload row ``i mod N``. Each finished
request is appended to ``requests.jsonl`` / ``packets.jsonl`` and flushed at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import re
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

from .adapters import Adapter, ResponseDecoder, StreamFailure
from .jsonio import jsonl_line
from .resources import PHASE_EVENTS
from .stats import underruns
from .wire import WireError
from .workload import Workload, normalized_sampling, normalized_sampling_sha256, parity_reasons

CLIENT_SCHEMA = "qwen3-tts-native-evidence-client/v1"
PHASE_SCHEMA = "qwen3-tts-native-evidence-phases/v1"
MAX_ERROR_BODY_BYTES = 64 * 1024
PROFILE_PATTERN = re.compile(r"(?:B(?P<concurrency>[1-9][0-9]{0,3})|R(?P<rate>[0-9]+(?:\.[0-9]+)?))")


class RunAborted(RuntimeError):
    """The run cannot produce evidence (server not ready, a warm-up failed)."""


@dataclass(frozen=True)
class Profile:
    """A load profile: ``B<n>`` closed loop with n in flight, ``R<rate>`` open-loop Poisson arrivals."""

    id: str
    load: str
    concurrency: int | None
    arrival_rate_per_second: float | None

    @classmethod
    def parse(cls, spec: str) -> Profile:
        match = PROFILE_PATTERN.fullmatch(spec)
        if match is None:
            raise ValueError(f"profile {spec!r} is neither B<concurrency> nor R<requests per second>")
        if match["concurrency"]:
            return cls(
                id=spec, load="closed", concurrency=int(match["concurrency"]), arrival_rate_per_second=None
            )
        rate = float(match["rate"])
        if not rate > 0:
            raise ValueError(f"profile {spec!r}: the arrival rate must be positive")
        return cls(id=spec, load="open", concurrency=None, arrival_rate_per_second=rate)


@dataclass(frozen=True)
class RunSpec:
    """Everything that defines one run."""

    engine_id: str
    base_url: str
    adapter: Adapter
    profile: Profile
    round: int
    warmups: int
    requests: int
    timeout_s: float
    closed_loop: str = "batch"
    arrival_seed: int = 0
    idle_seconds: float = 15.0


@dataclass
class PhaseClock:
    """The run's phase events, kept in memory and written after ``measured_end`` (no I/O in the window)."""

    events: list[dict[str, Any]] = field(default_factory=list)

    def mark(self, event: str) -> int:
        now = time.monotonic_ns()
        self.events.append(
            {
                "schema_version": PHASE_SCHEMA,
                "sequence": len(self.events),
                "event": event,
                "wall_time_unix_ns": time.time_ns(),
                "monotonic_ns": now,
            }
        )
        return now

    def time_of(self, event: str) -> int:
        return next(int(e["monotonic_ns"]) for e in self.events if e["event"] == event)


@dataclass
class RunFiles:
    """The run's raw record files, appended and flushed per request."""

    directory: Path
    requests: IO[bytes] = field(init=False)
    packets: IO[bytes] = field(init=False)

    def __post_init__(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.requests = (self.directory / "requests.jsonl").open("xb")
        self.packets = (self.directory / "packets.jsonl").open("xb")

    def append(self, request: dict[str, Any], packets: list[dict[str, Any]]) -> None:
        self.packets.write(b"".join(jsonl_line(p) for p in packets))
        self.packets.flush()
        self.requests.write(jsonl_line(request))
        self.requests.flush()

    def close(self) -> None:
        for handle in (self.packets, self.requests):
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()


@dataclass
class _Exchange:
    """What one HTTP exchange produced, before it becomes records."""

    t0_ns: int
    end_ns: int = 0
    http_status: int | None = None
    body_bytes: int = 0
    decoder: ResponseDecoder | None = None
    failure: dict[str, Any] | None = None


def _failure(code: str, message: str, body: bytes | None = None) -> dict[str, Any]:
    return {
        "code": code,
        "message": message[:500],
        "response_body_bytes": len(body) if body is not None else 0,
        "response_body_sha256": hashlib.sha256(body).hexdigest() if body else None,
    }


def _status_of(failure: dict[str, Any] | None) -> str:
    if failure is None:
        return "success"
    code = str(failure["code"])
    if "timeout" in code:
        return "timeout"
    if "cancel" in code:
        return "cancelled"
    return "error"


async def _exchange(
    client: httpx.AsyncClient, spec: RunSpec, body: bytes, method: str, path: str, headers: dict[str, str]
) -> _Exchange:
    request = client.build_request(method, path, content=body, headers=headers)
    result = _Exchange(t0_ns=time.monotonic_ns())
    try:
        async with asyncio.timeout(spec.timeout_s):
            response = await client.send(request, stream=True)
            try:
                result.http_status = response.status_code
                if not 200 <= response.status_code < 300:
                    error_body = bytearray()
                    async for chunk in response.aiter_raw():
                        error_body += chunk[: MAX_ERROR_BODY_BYTES - len(error_body)]
                    result.failure = _failure(
                        f"http_{response.status_code}", f"HTTP {response.status_code}", bytes(error_body)
                    )
                    return result
                decoder = spec.adapter.decoder(response.headers)
                decoder.begin(response.headers)
                result.decoder = decoder
                async for chunk in response.aiter_raw():
                    now = time.monotonic_ns()
                    result.body_bytes += len(chunk)
                    decoder.feed(chunk, now)
                decoder.close()
            finally:
                await response.aclose()
    except TimeoutError:
        result.failure = _failure("request_timeout", f"no complete response within {spec.timeout_s} s")
    except httpx.ConnectTimeout as exc:
        result.failure = _failure("connect_timeout", str(exc))
    except httpx.ConnectError as exc:
        result.failure = _failure("connect_error", str(exc))
    except httpx.TimeoutException as exc:
        result.failure = _failure("request_timeout", str(exc))
    except httpx.HTTPError as exc:
        result.failure = _failure("request_error", f"{type(exc).__name__}: {exc}")
    except WireError as exc:
        result.failure = _failure(exc.code, str(exc))
    except StreamFailure as exc:
        result.failure = _failure(exc.code, str(exc))
    finally:
        result.end_ns = time.monotonic_ns()
    return result


def _records(
    spec: RunSpec,
    workload: Workload,
    index: int,
    body: bytes,
    streaming: bool,
    api_reasons: tuple[str, ...],
    exchange: _Exchange,
    measured_start_ns: int,
    scheduled_offset_ms: float | None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    row = workload.row_for(index)
    sampling = normalized_sampling(row)
    reasons = [*parity_reasons(row), *api_reasons]
    decoder = exchange.decoder
    success = exchange.failure is None and decoder is not None
    wall_ms = (exchange.end_ns - exchange.t0_ns) / 1e6
    record: dict[str, Any] = {
        "schema_version": CLIENT_SCHEMA,
        "engine_id": spec.engine_id,
        "profile_id": spec.profile.id,
        "round": spec.round,
        "request_index": index,
        "workload_id": row.id,
        "backend": spec.adapter.name,
        "text_sha256": row.text_sha256,
        "voice_description_sha256": row.voice_description_sha256,
        "request_body_sha256": hashlib.sha256(body).hexdigest(),
        "normalized_sampling": sampling,
        "normalized_sampling_sha256": normalized_sampling_sha256(sampling),
        "sampling_parity_qualifying": not reasons,
        "sampling_parity_non_qualifying_reasons": reasons,
        "language": row.language,
        "streaming": streaming,
        "success": success,
        "status": _status_of(exchange.failure),
        "http_status": exchange.http_status,
        "server_request_id": decoder.server_request_id if decoder else None,
        "server_seed": decoder.server_seed if decoder else None,
        "scheduled_offset_ms": scheduled_offset_ms,
        "start_offset_ms": (exchange.t0_ns - measured_start_ns) / 1e6,
        "end_offset_ms": (exchange.end_ns - measured_start_ns) / 1e6,
        "ttfa_ms": None,
        "wall_ms": None,
        "sample_rate_hz": None,
        "samples": None,
        "audio_sha256": None,
        "audio_seconds": None,
        "rtf": None,
        "response_body_bytes": exchange.body_bytes,
        "packet_count": 0,
        "continuity_valid": False,
        "final_flag_seen": None,
        "underrun_count": None,
        "underrun_ms": None,
        "finish_reason": None,
        "natural_eos": None,
        "length_limited": None,
        "end_metrics": None,
        "failure": exchange.failure,
    }
    if not success or decoder is None:
        return record, []
    rate = int(decoder.sample_rate_hz or 0)
    samples = decoder.pcm_bytes // 2
    audio_seconds = samples / rate
    packets: list[dict[str, Any]] = []
    previous: float | None = None
    for sequence, packet in enumerate(decoder.packets):
        arrival = (packet.arrival_ns - exchange.t0_ns) / 1e6
        packets.append(
            {
                "schema_version": CLIENT_SCHEMA,
                "engine_id": spec.engine_id,
                "profile_id": spec.profile.id,
                "round": spec.round,
                "request_index": index,
                "workload_id": row.id,
                "backend": spec.adapter.name,
                "kind": decoder.kind,
                "sequence": sequence,
                "arrival_ms": arrival,
                "inter_arrival_ms": None if previous is None else arrival - previous,
                "payload_bytes": len(packet.payload),
                "payload_sha256": hashlib.sha256(packet.payload).hexdigest(),
                "byte_offset": packet.byte_offset,
                "first_codec_frame": packet.first_codec_frame,
                "first_sample": packet.first_sample,
                "sample_count": packet.sample_count,
                "codec_frames": packet.codec_frames,
                "is_first": sequence == 0,
                "is_final": packet.is_final,
            }
        )
        previous = arrival
    count, stalled = underruns(
        [p["arrival_ms"] for p in packets], [p["payload_bytes"] for p in packets], rate
    )
    finish = decoder.finish_reason
    record.update(
        {
            "ttfa_ms": packets[0]["arrival_ms"],
            "wall_ms": wall_ms,
            "sample_rate_hz": rate,
            "samples": samples,
            "audio_sha256": decoder.audio.hexdigest(),
            "audio_seconds": audio_seconds,
            "rtf": (wall_ms / 1000.0) / audio_seconds,
            "packet_count": len(packets),
            "continuity_valid": decoder.continuity_valid,
            "final_flag_seen": decoder.final_flag_seen,
            "underrun_count": count,
            "underrun_ms": stalled,
            "finish_reason": finish,
            "natural_eos": None if finish is None else finish == "stop",
            "length_limited": None if finish is None else finish == "length",
            "end_metrics": decoder.end_metrics,
        }
    )
    return record, packets


def arrival_offsets_s(rate: float, count: int, seed: int) -> list[float]:
    """Poisson arrival times (seconds after the window opens) for an open-loop profile."""
    generator = random.Random(seed)
    offsets: list[float] = []
    elapsed = 0.0
    for _ in range(count):
        elapsed += generator.expovariate(rate)
        offsets.append(elapsed)
    return offsets


async def check_ready(base_url: str, path: str, timeout_s: float) -> None:
    """Wait until ``GET path`` answers 200, or raise RunAborted."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    async with httpx.AsyncClient(base_url=base_url, timeout=5.0) as client:
        while time.monotonic() < deadline:
            try:
                response = await client.get(path)
                if response.status_code == 200:
                    return
                last = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            await asyncio.sleep(0.5)
    raise RunAborted(f"{base_url}{path} not ready within {timeout_s:.0f} s ({last})")


def wait_for_server(process: subprocess.Popen[Any], base_url: str, timeout_s: float) -> float:
    """Seconds until ``GET base_url/health/ready`` answers 200 while ``process`` (the server we started)
    runs; RunAborted if the process exits first or the time runs out."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if process.poll() is not None:
            raise RunAborted(f"the server exited with {process.returncode} before it was ready")
        try:
            if httpx.get(f"{base_url}/health/ready", timeout=2.0).status_code == 200:
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RunAborted(f"{base_url} not ready within {timeout_s:.0f} s")


async def run_load(
    spec: RunSpec, workload: Workload, files: RunFiles, phases: PhaseClock, on_request: Callable[[bool], None]
) -> None:
    """Idle baseline, warm-ups, then the measured requests of one run; records stream into ``files``.

    ``on_request(measured)`` is called after every finished request (for progress display)."""
    concurrency = spec.profile.concurrency or 1
    limits = httpx.Limits(
        max_connections=concurrency if spec.profile.load == "closed" else None,
        max_keepalive_connections=concurrency if spec.profile.load == "closed" else None,
    )
    timeout = httpx.Timeout(spec.timeout_s)
    async with httpx.AsyncClient(base_url=spec.base_url, timeout=timeout, limits=limits) as client:

        async def one(index: int, measured: bool, scheduled_ms: float | None = None) -> None:
            row = workload.row_for(index)
            prepared = spec.adapter.prepare(row, str(uuid.uuid4()))
            exchange = await _exchange(
                client, spec, prepared.body, prepared.method, prepared.path, prepared.headers
            )
            if not measured:
                if exchange.failure is not None:
                    raise RunAborted(
                        f"warm-up {index} ({row.id}) failed: {exchange.failure['code']} "
                        f"{exchange.failure['message']}"
                    )
                on_request(False)
                return
            record, packets = _records(
                spec,
                workload,
                index,
                prepared.body,
                prepared.streaming,
                prepared.api_parity_reasons,
                exchange,
                phases.time_of("measured_start"),
                scheduled_ms,
            )
            files.append(record, packets)
            on_request(True)

        async def closed_loop(count: int, measured: bool) -> None:
            if spec.closed_loop == "batch" or not measured:
                for start in range(0, count, concurrency):
                    await asyncio.gather(
                        *(one(i, measured) for i in range(start, min(start + concurrency, count)))
                    )
                return
            next_index = 0

            async def worker() -> None:
                nonlocal next_index
                while next_index < count:
                    index = next_index
                    next_index += 1
                    await one(index, measured)

            await asyncio.gather(*(worker() for _ in range(min(concurrency, count))))

        async def open_loop(count: int) -> None:
            assert spec.profile.arrival_rate_per_second is not None
            offsets = arrival_offsets_s(spec.profile.arrival_rate_per_second, count, spec.arrival_seed)
            origin = phases.time_of("measured_start")

            async def scheduled(index: int, offset_s: float) -> None:
                delay = origin / 1e9 + offset_s - time.monotonic_ns() / 1e9
                if delay > 0:
                    await asyncio.sleep(delay)
                await one(index, True, offset_s * 1000.0)

            await asyncio.gather(*(scheduled(i, o) for i, o in enumerate(offsets)))

        phases.mark("idle_start")
        await asyncio.sleep(spec.idle_seconds)
        phases.mark("idle_end")
        phases.mark("warmup_start")
        await closed_loop(spec.warmups, measured=False)
        phases.mark("warmup_end")
        phases.mark("measured_start")
        if spec.profile.load == "open":
            await open_loop(spec.requests)
        else:
            await closed_loop(spec.requests, measured=True)
        phases.mark("measured_end")
    assert [e["event"] for e in phases.events] == list(PHASE_EVENTS)

"""Engine faults seen through real HTTP: internal_error, backend_unavailable, native_retirement_timeout and
buffer_limit_exceeded (seed contract §1.5, §1.6, §1.8, §1.10, §1.11).

Each test runs the real app (``create_app`` + uvicorn on a loopback port, in a thread of this process) over
the real tiny engine, wrapped by ``FaultyEngine``: every call goes to the real engine unless the test arms a
fault at that boundary (a call that raises, a ``release`` that blocks, an engine that runs past the frame
ceiling it was given). Faults are armed only after the server has warmed up. Nothing in HTTP or in the
server is mocked; the in-process server only lets a test read the scheduler's slot count directly.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import uvicorn
from server_harness import check_positions, free_port, parse_multipart, speech_body

from qwen3_tts_native.engine.runtime.request import FrameResult, SynthesisRequest
from qwen3_tts_native.engine.runtime.scheduler import Scheduler
from qwen3_tts_native.engine.server.app import create_app
from qwen3_tts_native.engine.server.runner import load_engine
from qwen3_tts_native.engine.server.settings import ServerSettings

pytestmark = pytest.mark.integration

PROBLEM = "application/problem+json"
FAULT_WAIT_S = 60.0


class FaultyEngine:
    """Forwards to the real engine; a test arms at most a few faults at this boundary."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.step_error: Exception | None = None  # the next step raises this, once `step_gate` is set
        self.hold_steps = False  # steps wait for `step_gate` (and `step_held` is set)
        self.step_gate = threading.Event()
        self.step_held = threading.Event()
        self.decode_error: Exception | None = None  # the next collect_decode raises this
        self.real_decodes_left: int | None = None  # counts down real decodes; at 0 one returns half its PCM
        self.extra_frames = 0  # sessions started now run this many frames past the request's ceiling
        self.block_release = False  # release waits for `unblock_release` (and `release_blocked` is set)
        self.release_blocked = threading.Event()
        self.unblock_release = threading.Event()

    def start_session(self, request: SynthesisRequest) -> Any:
        if self.extra_frames:
            request = replace(request, max_frames=request.max_frames + self.extra_frames)
        return self.engine.start_session(request)

    def prefill_many(self, sessions: list[Any]) -> list[FrameResult]:
        return self.engine.prefill_many(sessions)  # type: ignore[no-any-return]

    def can_launch(self, session: Any) -> bool:
        return self.engine.can_launch(session)  # type: ignore[no-any-return]

    def launch_step(self, sessions: list[Any]) -> Any:
        return self.engine.launch_step(sessions)

    def collect_step(self, pending: Any) -> list[FrameResult | None]:
        """The step faults fire where the step's results arrive."""
        if self.hold_steps:
            self.step_held.set()
            assert self.step_gate.wait(FAULT_WAIT_S)
        if self.step_error is not None:
            assert self.step_gate.wait(FAULT_WAIT_S)
            error, self.step_error = self.step_error, None
            raise error
        return self.engine.collect_step(pending)  # type: ignore[no-any-return]

    def launch_decode(self, sessions: list[Any], frames: list[torch.Tensor]) -> Any:
        return self.engine.launch_decode(sessions, frames)

    def collect_decode(self, pending: Any) -> list[bytes]:
        """The decode faults fire where a decode's PCM arrives."""
        if self.decode_error is not None:
            error, self.decode_error = self.decode_error, None
            raise error
        pcms: list[bytes] = self.engine.collect_decode(pending)
        if self.real_decodes_left == 0:
            self.real_decodes_left = None
            return [pcm[: len(pcm) // 2] for pcm in pcms]
        if self.real_decodes_left is not None:
            self.real_decodes_left -= 1
        return pcms

    def release(self, session: Any) -> None:
        if self.block_release:
            self.release_blocked.set()
            self.unblock_release.wait(FAULT_WAIT_S)
        self.engine.release(session)


@dataclass
class InProcessServer:
    """``create_app`` served by uvicorn on loopback in a background thread, over a ``FaultyEngine``."""

    settings: ServerSettings
    engine: FaultyEngine | None = None
    server: uvicorn.Server | None = None
    thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.settings.port}"

    @property
    def scheduler(self) -> Scheduler:
        assert self.server is not None
        admissions = self.server.config.app.state.server.admissions  # type: ignore[union-attr]
        assert admissions is not None
        scheduler: Scheduler = admissions.scheduler
        return scheduler

    def start(self) -> InProcessServer:
        def factory(settings: ServerSettings) -> FaultyEngine:
            self.engine = FaultyEngine(load_engine(settings))
            return self.engine

        app = create_app(self.settings, factory)
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.settings.port, log_level="warning", lifespan="on"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="fault-server", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 120
        while not self.server.started:
            assert self.thread.is_alive(), "the server failed to start"
            assert time.monotonic() < deadline, "the server did not start within 120 s"
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.engine is not None:
            self.engine.step_gate.set()
            self.engine.unblock_release.set()
        if self.server is not None and self.thread is not None:
            self.server.should_exit = True
            self.thread.join(60)

    def metrics(self) -> dict[str, float]:
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        return {
            line.split()[0].removeprefix("qwen3_tts_"): float(line.split()[1])
            for line in text.splitlines()
            if line.startswith("qwen3_tts_") and "{" not in line
        }

    def ready_status(self) -> int:
        response = httpx.get(f"{self.url}/health/ready", timeout=10)
        body = response.json()
        assert body["status"] == ("ready" if response.status_code == 200 else "not_ready")
        assert body["engine_loaded"] is (response.status_code == 200)
        return response.status_code


@pytest.fixture
def serve(tiny_model: Path) -> Iterator[Callable[..., InProcessServer]]:
    """Start in-process servers with settings overrides; each is stopped (its faults lifted) afterwards."""
    torch.set_num_threads(1)
    servers: list[InProcessServer] = []

    def start(**overrides: Any) -> InProcessServer:
        options: dict[str, Any] = {
            "model": tiny_model,
            "port": free_port(),
            "device": "cpu",
            "max_concurrent_requests": 2,
            "max_duration_seconds": 12.0,
            "log_level": "warning",
            "threads": 1,
            **overrides,
        }
        server = InProcessServer(ServerSettings(**options).check())
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop()


def assert_problem(
    response: httpx.Response, status: int, code: str, request_id: str | None
) -> dict[str, Any]:
    """A problem+json document of this status and code; request_id in body and header exactly when given."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].split(";")[0] == PROBLEM
    body: dict[str, Any] = response.json()
    assert body["type"] == f"urn:qwen3-tts-native:problem:{code}"
    assert body["status"] == status and body["code"] == code
    assert isinstance(body["title"], str) and isinstance(body["detail"], str)
    if request_id is None:
        assert "request_id" not in body and "x-request-id" not in response.headers
    else:
        assert body["request_id"] == request_id and response.headers["x-request-id"] == request_id
    assert set(body) <= {"type", "title", "status", "code", "detail", "request_id"}
    return body


def post(url: str, body: dict[str, Any], request_id: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/voice-design/speech", json=body, headers={"x-request-id": request_id}, timeout=120
    )


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def settled(server: InProcessServer, **expected: float) -> dict[str, float]:
    """Metrics once the named series have the expected values (a response can end just before its
    bookkeeping does); every other series is returned as is."""
    values: dict[str, float] = {}

    def check() -> bool:
        values.update(server.metrics())
        return all(values[name] == value for name, value in expected.items())

    try:
        wait_for(check, f"metrics {expected}", timeout=10)
    except AssertionError:
        raise AssertionError(f"metrics {values} never matched {expected}") from None
    return values


def error_part_stream(
    server: InProcessServer, body: dict[str, Any], request_id: str, after_first_part: Callable[[], None]
) -> tuple[httpx.Response, Any]:
    """A progressive request whose 200 headers arrive (so its first packet was taken), then `after_first_part`
    runs, then the rest of the body is read and parsed."""
    with httpx.stream(
        "POST",
        f"{server.url}/v1/voice-design/speech",
        json=body,
        headers={"x-request-id": request_id},
        timeout=120,
    ) as response:
        assert response.status_code == 200
        after_first_part()
        raw = response.read()
    return response, parse_multipart(response.headers["content-type"], raw)


# -- internal_error ------------------------------------------------------------------------------------------


def test_step_failure_mid_stream_ends_with_an_internal_error_part(
    serve: Callable[..., InProcessServer],
) -> None:
    server = serve()
    assert server.engine is not None
    server.engine.step_error = RuntimeError("injected step failure")
    request_id = str(uuid.uuid4())
    response, stream = error_part_stream(server, speech_body(seed=1), request_id, server.engine.step_gate.set)

    assert response.headers["x-request-id"] == request_id
    assert stream.start["request_id"] == request_id
    assert len(stream.audio) == 1  # the first packet (prefill), then the step failed
    check_positions(stream, complete=False)
    assert stream.terminal["type"] == "error" and stream.terminal["request_id"] == request_id
    assert stream.terminal["error"]["code"] == "internal_error"
    assert set(stream.terminal) == {"type", "request_id", "error"} and set(stream.terminal["error"]) == {
        "code",
        "detail",
    }

    metrics = settled(server, failed_requests_total=1, active_requests=0)
    assert metrics["completed_requests_total"] == metrics["cancelled_requests_total"] == 0
    assert metrics["retirement_timeouts_total"] == 0 and metrics["emitted_samples_total"] == 0
    assert server.scheduler.used_slots == 0
    assert server.ready_status() == 200  # a per-request engine error does not make the server unready
    # The id is free again and the engine still serves.
    again = post(server.url, speech_body(seed=1, max_duration_seconds=0.4, stream=False), request_id)
    assert again.status_code == 200 and again.headers["content-type"] == "audio/wav"


@pytest.mark.parametrize("stream", [True, False], ids=["multipart", "wav"])
def test_decode_failure_before_any_audio_is_a_500_problem(
    serve: Callable[..., InProcessServer], stream: bool
) -> None:
    server = serve()
    assert server.engine is not None
    server.engine.decode_error = RuntimeError("injected codec failure")
    request_id = str(uuid.uuid4())
    response = post(server.url, speech_body(seed=2, stream=stream), request_id)

    assert_problem(response, 500, "internal_error", request_id)
    metrics = settled(server, failed_requests_total=1, active_requests=0)
    assert metrics["http_requests_total"] == 1 and metrics["rejected_requests_total"] == 0
    assert server.scheduler.used_slots == 0
    assert server.ready_status() == 200


def test_a_malformed_packet_cancels_the_stream_with_internal_error(
    serve: Callable[..., InProcessServer],
) -> None:
    """The server re-checks packet sizes: a packet with half its PCM is not sent, the stream fails."""
    server = serve()
    assert server.engine is not None
    server.engine.real_decodes_left = 1  # the first packet is right, the second is short
    request_id = str(uuid.uuid4())
    with httpx.stream(
        "POST",
        f"{server.url}/v1/voice-design/speech",
        json=speech_body(seed=3),
        headers={"x-request-id": request_id},
        timeout=120,
    ) as response:
        assert response.status_code == 200
        stream = parse_multipart(response.headers["content-type"], response.read())

    assert len(stream.audio) == 1
    check_positions(stream, complete=False)
    assert (
        stream.terminal["error"]["code"] == "internal_error" and stream.terminal["request_id"] == request_id
    )
    settled(server, failed_requests_total=1, active_requests=0)
    assert server.scheduler.used_slots == 0
    assert server.ready_status() == 200


# -- backend_unavailable -------------------------------------------------------------------------------------


def test_a_device_fault_mid_stream_is_backend_unavailable_for_good(
    serve: Callable[..., InProcessServer],
) -> None:
    server = serve()
    assert server.engine is not None
    assert server.ready_status() == 200
    server.engine.step_error = torch.OutOfMemoryError("CUDA out of memory (injected)")
    request_id = str(uuid.uuid4())
    _, stream = error_part_stream(server, speech_body(seed=4), request_id, server.engine.step_gate.set)

    assert len(stream.audio) == 1
    assert stream.terminal["type"] == "error" and stream.terminal["request_id"] == request_id
    assert stream.terminal["error"]["code"] == "backend_unavailable"
    assert server.ready_status() == 503

    # Every later request is refused at admission: 503 with its id, counted as rejected, never started.
    later = str(uuid.uuid4())
    assert_problem(post(server.url, speech_body(seed=5), later), 503, "backend_unavailable", later)
    wav = str(uuid.uuid4())
    assert_problem(post(server.url, speech_body(seed=5, stream=False), wav), 503, "backend_unavailable", wav)
    metrics = settled(server, failed_requests_total=1, active_requests=0, rejected_requests_total=2)
    assert metrics["http_requests_total"] == 1 and metrics["retirement_timeouts_total"] == 0
    assert server.scheduler.used_slots == 0
    # The flag never returns to true.
    time.sleep(0.5)
    assert server.ready_status() == 503
    assert httpx.get(f"{server.url}/health/live", timeout=10).status_code == 200


def test_a_device_fault_before_any_audio_is_a_503_problem(serve: Callable[..., InProcessServer]) -> None:
    server = serve()
    assert server.engine is not None
    server.engine.decode_error = torch.OutOfMemoryError("CUDA out of memory (injected)")
    request_id = str(uuid.uuid4())
    response = post(server.url, speech_body(seed=6, stream=False), request_id)

    assert_problem(response, 503, "backend_unavailable", request_id)
    assert server.ready_status() == 503
    metrics = settled(server, failed_requests_total=1, active_requests=0)
    assert metrics["rejected_requests_total"] == 0
    assert server.scheduler.used_slots == 0
    # The id is not held by the failed request: reusing it gets backend_unavailable, not request_id_in_use.
    assert_problem(post(server.url, speech_body(seed=6), request_id), 503, "backend_unavailable", request_id)


# -- native_retirement_timeout -------------------------------------------------------------------------------


def delete(server: InProcessServer, request_id: str) -> httpx.Response:
    return httpx.delete(f"{server.url}/v1/requests/{request_id}", timeout=10)


def assert_tombstoned(server: InProcessServer, request_id: str, cancelled: float = 0) -> None:
    """§1.8: unready, DELETE 503, the id still active (409 on reuse), the gauge not decremented."""
    metrics = settled(server, retirement_timeouts_total=1, failed_requests_total=1)
    assert metrics["active_requests"] == 1  # tombstones stay counted
    assert metrics["completed_requests_total"] == 0 and metrics["cancelled_requests_total"] == cancelled
    assert server.ready_status() == 503
    assert_problem(delete(server, request_id), 503, "native_retirement_timeout", request_id)
    reuse = post(server.url, speech_body(seed=8, max_duration_seconds=0.4), request_id)
    assert_problem(reuse, 409, "request_id_in_use", request_id)
    assert server.scheduler.used_slots == 1  # the engine still holds the slot


def test_a_cancelled_stream_whose_slot_is_not_freed_ends_with_native_retirement_timeout(
    serve: Callable[..., InProcessServer],
) -> None:
    server = serve(retirement_timeout_s=1.0)
    engine = server.engine
    assert engine is not None
    request_id = str(uuid.uuid4())
    timings: dict[str, float] = {}

    def cancel_with_a_stuck_release() -> None:
        engine.block_release = True
        accepted = delete(server, request_id)
        assert accepted.status_code == 202
        assert accepted.json() == {"request_id": request_id, "status": "cancellation_requested"}
        timings["cancelled"] = time.monotonic()

    _, stream = error_part_stream(server, speech_body(seed=7), request_id, cancel_with_a_stuck_release)
    elapsed = time.monotonic() - timings["cancelled"]

    assert engine.release_blocked.is_set()
    assert stream.audio and stream.start["request_id"] == request_id
    check_positions(stream, complete=False)
    assert stream.terminal["type"] == "error" and stream.terminal["request_id"] == request_id
    assert stream.terminal["error"]["code"] == "native_retirement_timeout"
    assert 0.9 <= elapsed < 10, elapsed  # the 1 s retirement timeout, not the 25 s default
    assert_tombstoned(server, request_id)

    # The slot comes back only when the engine lets go; the tombstone (and unreadiness) stay until restart.
    engine.unblock_release.set()
    wait_for(lambda: server.scheduler.used_slots == 0, "the blocked release to finish")
    time.sleep(0.2)
    assert server.ready_status() == 503
    assert_problem(delete(server, request_id), 503, "native_retirement_timeout", request_id)


def test_a_cancelled_wav_request_whose_slot_is_not_freed_is_a_503_problem(
    serve: Callable[..., InProcessServer],
) -> None:
    server = serve(retirement_timeout_s=1.0)
    engine = server.engine
    assert engine is not None
    request_id = str(uuid.uuid4())
    result: dict[str, httpx.Response] = {}
    client = threading.Thread(
        target=lambda: result.update(response=post(server.url, speech_body(seed=9, stream=False), request_id))
    )
    engine.hold_steps = True  # the request is generating (held in its first step) when it is cancelled
    client.start()
    try:
        assert engine.step_held.wait(FAULT_WAIT_S)
        engine.block_release = True
        assert delete(server, request_id).status_code == 202
    finally:
        engine.step_gate.set()
        client.join(60)
    assert engine.release_blocked.is_set()
    assert_problem(result["response"], 503, "native_retirement_timeout", request_id)
    assert_tombstoned(server, request_id)


# -- buffer_limit_exceeded -----------------------------------------------------------------------------------


def test_a_wav_larger_than_the_buffer_cap_is_buffer_limit_exceeded(
    serve: Callable[..., InProcessServer],
) -> None:
    """An engine that runs past the frame ceiling it was given cannot grow a WAV past the cap."""
    server = serve(max_duration_seconds=0.4, max_concurrent_requests=1)  # cap: 5 frames = 19,200 bytes
    engine = server.engine
    assert engine is not None
    assert server.settings.max_buffered_pcm_bytes == math.ceil(0.4 * 12.5) * 1920 * 2
    engine.extra_frames = 40
    request_id = str(uuid.uuid4())
    body = speech_body(
        seed=10, max_duration_seconds=0.4, output_format="wav", sampling={"repetition_penalty": 1.0}
    )
    response = post(server.url, body, request_id)

    assert_problem(response, 500, "buffer_limit_exceeded", request_id)
    metrics = settled(server, failed_requests_total=1, active_requests=0)
    assert metrics["completed_requests_total"] == 0 and metrics["emitted_samples_total"] == 0
    assert server.scheduler.used_slots == 0
    assert server.ready_status() == 200

    # The one slot is free: the same id and body succeed once the engine honours the ceiling again.
    engine.extra_frames = 0
    again = post(server.url, body, request_id)
    assert again.status_code == 200 and again.headers["x-request-id"] == request_id
    assert again.headers["x-finish-reason"] in ("stop", "length")
    assert len(again.content) - 44 <= server.settings.max_buffered_pcm_bytes
    settled(server, completed_requests_total=1, active_requests=0)

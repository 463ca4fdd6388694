"""Cancellation, disconnects, leaks and graceful shutdown against real server processes."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
import uuid
from pathlib import Path

import httpx
import psutil
import pytest
from server_harness import ServerProcess, check_positions, parse_multipart, read_until, speech_body

pytestmark = pytest.mark.integration

LONG = speech_body(max_duration_seconds=120)
FIRST_AUDIO = b"Content-Type: audio/pcm"


def wait_admitted(
    server: ServerProcess, client: httpx.Client, request_id: str, timeout: float = 5.0
) -> httpx.Response:
    """Open a long stream, retrying while the only slot is still being freed; fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        request = client.build_request(
            "POST", f"{server.url}/v1/voice-design/speech", json=LONG, headers={"x-request-id": request_id}
        )
        response = client.send(request, stream=True)
        if response.status_code != 429 or time.monotonic() > deadline:
            assert response.status_code == 200, response.read()
            return response
        response.close()
        time.sleep(0.02)


def test_delete_mid_stream_ends_with_cancelled_part(single_slot_server: ServerProcess) -> None:
    server = single_slot_server
    request_id = str(uuid.uuid4())
    with httpx.Client(timeout=60) as client:
        response = wait_admitted(server, client, request_id)
        chunks = response.iter_bytes()
        buffer = bytearray()
        read_until(chunks, buffer, b"X-Sequence: 1")
        cancelled_at = time.monotonic()
        assert client.delete(f"{server.url}/v1/requests/{request_id}").status_code == 202
        for chunk in chunks:
            buffer += chunk
        ended_after = time.monotonic() - cancelled_at
        response.close()

    stream = parse_multipart(response.headers["content-type"], bytes(buffer))
    check_positions(stream, complete=False)
    assert stream.terminal["type"] == "error" and stream.terminal["request_id"] == request_id
    assert stream.terminal["error"]["code"] == "request_cancelled"
    assert ended_after < 5
    assert httpx.delete(f"{server.url}/v1/requests/{request_id}").status_code == 404


def test_disconnect_frees_the_slot(single_slot_server: ServerProcess) -> None:
    server = single_slot_server
    with httpx.Client(timeout=60) as client:
        response = wait_admitted(server, client, str(uuid.uuid4()))
        read_until(response.iter_bytes(), bytearray(), FIRST_AUDIO)
        response.close()
    follow_up = speech_body(max_duration_seconds=0.3)
    deadline = time.monotonic() + 5
    while (
        answer := httpx.post(f"{server.url}/v1/voice-design/speech", json=follow_up, timeout=60)
    ).status_code == 429:
        assert time.monotonic() < deadline, "the disconnected request kept its slot"
        time.sleep(0.02)
    assert answer.status_code == 200
    assert parse_multipart(answer.headers["content-type"], answer.content).terminal["type"] == "end"


def test_cancel_and_disconnect_cycles_leak_nothing(single_slot_server: ServerProcess) -> None:
    server = single_slot_server
    process = psutil.Process(server.pid)
    started = server.metric("qwen3_tts_http_requests_total")
    cancelled = server.metric("qwen3_tts_cancelled_requests_total")
    baseline_rss = baseline_threads = 0
    with httpx.Client(timeout=60) as client:
        for cycle in range(50):
            if cycle == 10:
                baseline_rss, baseline_threads = process.memory_info().rss, process.num_threads()
            request_id = str(uuid.uuid4())
            response = wait_admitted(server, client, request_id)
            chunks = response.iter_bytes()
            read_until(chunks, bytearray(), FIRST_AUDIO)
            if cycle % 2:
                assert client.delete(f"{server.url}/v1/requests/{request_id}").status_code == 202
                tail = b"".join(chunks)
                assert b'"code":"request_cancelled"' in tail
            response.close()

    deadline = time.monotonic() + 5
    while server.metric("qwen3_tts_active_requests") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.metric("qwen3_tts_active_requests") == 0
    assert server.metric("qwen3_tts_http_requests_total") == started + 50
    assert server.metric("qwen3_tts_cancelled_requests_total") == cancelled + 50
    assert process.num_threads() <= baseline_threads
    assert process.memory_info().rss - baseline_rss < 32 * 2**20
    assert httpx.get(f"{server.url}/health/ready").status_code == 200


def test_sigterm_drains_then_exits_zero(tiny_model: Path, tmp_path: Path) -> None:
    server = ServerProcess.launch(
        tiny_model,
        tmp_path,
        max_concurrent_requests="3",
        max_duration_seconds="120",
        drain_timeout_s="2",
        shutdown_timeout_s="20",
    )
    bodies = [LONG, LONG, speech_body(text="Short.", max_duration_seconds=0.4)]
    results: dict[int, tuple[str, bytes]] = {}
    streaming = [threading.Event() for _ in bodies]

    def run(index: int) -> None:
        with httpx.stream(
            "POST", f"{server.url}/v1/voice-design/speech", json=bodies[index], timeout=60
        ) as response:
            assert response.status_code == 200
            buffer = bytearray()
            chunks = response.iter_bytes()
            read_until(chunks, buffer, FIRST_AUDIO)
            streaming[index].set()
            for chunk in chunks:
                buffer += chunk
            results[index] = (response.headers["content-type"], bytes(buffer))

    try:
        threads = [threading.Thread(target=run, args=(index,)) for index in range(len(bodies))]
        for index, thread in enumerate(threads):
            thread.start()
            assert streaming[index].wait(60)
        signalled = time.monotonic()
        server.signal(signal.SIGTERM)
        time.sleep(0.3)

        refused = httpx.post(f"{server.url}/v1/voice-design/speech", json=speech_body(), timeout=10)
        assert refused.status_code == 503 and refused.json()["code"] == "server_shutting_down"
        assert "request_id" not in refused.json()
        assert httpx.get(f"{server.url}/health/ready", timeout=10).status_code == 503
        assert server.wait(30) == 0
        assert time.monotonic() - signalled < 20
        for thread in threads:
            thread.join(10)
    finally:
        server.stop()

    assert sorted(results) == [0, 1, 2]
    terminals = [parse_multipart(*results[index]).terminal for index in range(3)]
    assert [t["error"]["code"] for t in terminals[:2]] == ["server_shutting_down"] * 2
    assert terminals[2]["type"] == "end"
    assert "drained; stopping" in server.log()


@pytest.mark.slow
def test_slow_client_is_cancelled_and_frees_the_slot(single_slot_server: ServerProcess) -> None:
    """A client that stops reading is cancelled after the slow-client timeout (2 s on this server).

    Slow because the loopback socket buffers absorb several hundred KB (minutes of tiny-model frames on a
    busy 2-core machine) before the server's send actually blocks.
    """
    server = single_slot_server
    cancelled = server.metric("qwen3_tts_cancelled_requests_total")
    body = json.dumps(LONG).encode()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", server.port))
        sock.sendall(
            b"POST /v1/voice-design/speech HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        deadline = time.monotonic() + 60
        while server.metric("qwen3_tts_cancelled_requests_total") == cancelled:
            assert time.monotonic() < deadline, "the stalled stream was never cancelled"
            time.sleep(0.2)
    assert server.metric("qwen3_tts_active_requests") == 0
    answer = httpx.post(
        f"{server.url}/v1/voice-design/speech", json=speech_body(max_duration_seconds=0.2), timeout=60
    )
    assert answer.status_code == 200

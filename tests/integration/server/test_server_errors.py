"""Every problem code a client can provoke, with its status, body shape and validation order."""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

import httpx
import pytest
from server_harness import ServerProcess, speech_body

pytestmark = pytest.mark.integration


def post(
    server: ServerProcess, body: Any, headers: dict[str, str] | None = None, raw: bytes | None = None
) -> httpx.Response:
    headers = {"content-type": "application/json", **(headers or {})}
    content = raw if raw is not None else json.dumps(body, ensure_ascii=False).encode()
    return httpx.post(f"{server.url}/v1/voice-design/speech", content=content, headers=headers, timeout=60)


def assert_problem(
    response: httpx.Response, status: int, code: str, request_id: str | None = None
) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["code"] == code and problem["status"] == status
    assert problem["type"] == f"urn:qwen3-tts-native:problem:{code}"
    assert isinstance(problem["title"], str) and isinstance(problem["detail"], str)
    assert problem.get("request_id") == request_id
    assert response.headers.get("x-request-id") == request_id
    return problem


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"{", "malformed_json"),
        (b"[]", "malformed_json"),
        (json.dumps(speech_body(colour="blue")).encode(), "malformed_json"),
        (
            json.dumps(speech_body(sampling={"predictor": {"top_k": 5, "min_p": 0.1}})).encode(),
            "malformed_json",
        ),
        (json.dumps(speech_body(seed="7")).encode(), "malformed_json"),
        (json.dumps({"text": "no voice"}).encode(), "malformed_json"),
        (json.dumps(speech_body(output_format="mp3")).encode(), "malformed_json"),
        (b"\xff\xfe not utf-8", "malformed_json"),
    ],
)
def test_body_shape_errors_are_400(server: ServerProcess, raw: bytes, code: str) -> None:
    assert_problem(post(server, None, raw=raw), 400, code)


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"text": "   "}, "invalid_text"),
        ({"text": "nul\u0000byte"}, "invalid_text"),
        ({"text": "é" * 16385}, "invalid_text"),
        ({"voice_description": ""}, "invalid_voice_description"),
        ({"voice_description": "x" * 4097}, "invalid_voice_description"),
        ({"language": "turkish"}, "unsupported_language"),
        ({"max_duration_seconds": 0.07}, "invalid_max_duration"),
        ({"max_duration_seconds": 3.01}, "invalid_max_duration"),
        ({"seed": 2**53}, "invalid_seed"),
        ({"seed": -1}, "invalid_seed"),
        ({"stream": True, "output_format": "wav"}, "unsupported_response_format"),
        ({"stream": False, "output_format": "pcm_s16le"}, "unsupported_response_format"),
        ({"sampling": {"temperature": 2.5}}, "invalid_sampling"),
        ({"sampling": {"strategy": "greedy", "top_k": 3}}, "invalid_sampling"),
        ({"sampling": {"top_p": 0}}, "invalid_sampling"),
        ({"sampling": {"repetition_penalty": 0.05}}, "invalid_sampling"),
        ({"sampling": {"predictor": {"top_k": 2049}}}, "invalid_sampling"),
    ],
)
def test_value_errors_are_422(server: ServerProcess, fields: dict[str, Any], code: str) -> None:
    assert_problem(post(server, speech_body(**{"max_duration_seconds": 0.2, **fields})), 422, code)


def test_validation_order_text_first_then_header(server: ServerProcess) -> None:
    body = speech_body(text=" ", language="klingon", seed=-1)
    assert_problem(post(server, body, {"x-request-id": "nope"}), 422, "invalid_text")
    body = speech_body(language="klingon", seed=-1)
    assert_problem(post(server, body, {"x-request-id": "nope"}), 422, "unsupported_language")
    assert_problem(post(server, speech_body(), {"x-request-id": "nope"}), 400, "invalid_request_id")


def test_media_type_size_and_engine_errors(server: ServerProcess) -> None:
    plain = httpx.post(
        f"{server.url}/v1/voice-design/speech", content=b"{}", headers={"content-type": "text/plain"}
    )
    assert_problem(plain, 415, "unsupported_media_type")
    huge = json.dumps(speech_body(text="a" * 60_000)).encode()
    assert_problem(post(server, None, raw=huge), 413, "request_too_large")
    assert_problem(post(server, speech_body(), {"x-request-id": "not-a-uuid"}), 400, "invalid_request_id")
    # A prompt longer than the engine's context is refused by the engine itself, before any audio.
    request_id = str(uuid.uuid4())
    long_text = speech_body(text="word " * 6000, max_duration_seconds=0.2)
    assert_problem(post(server, long_text, {"x-request-id": request_id}), 422, "invalid_request", request_id)


def test_delete_errors(server: ServerProcess) -> None:
    unknown = str(uuid.uuid4())
    assert_problem(httpx.delete(f"{server.url}/v1/requests/{unknown}"), 404, "request_not_found", unknown)
    assert_problem(httpx.delete(f"{server.url}/v1/requests/12345"), 400, "invalid_request_id")


def test_duplicate_id_capacity_and_cancelled_before_headers(single_slot_server: ServerProcess) -> None:
    server = single_slot_server
    rejected_before = server.metric("qwen3_tts_rejected_requests_total")
    request_id = str(uuid.uuid4())
    outcome: dict[str, httpx.Response] = {}

    def buffered() -> None:  # 120 s of WAV: busy until cancelled
        outcome["wav"] = post(
            server, speech_body(stream=False, max_duration_seconds=120), {"x-request-id": request_id}
        )

    thread = threading.Thread(target=buffered)
    thread.start()
    deadline = time.monotonic() + 30
    while server.metric("qwen3_tts_active_requests") < 1 and time.monotonic() < deadline:
        time.sleep(0.05)

    assert_problem(
        post(server, speech_body(), {"x-request-id": request_id}), 409, "request_id_in_use", request_id
    )
    other = str(uuid.uuid4())
    full = assert_problem(
        post(server, speech_body(), {"x-request-id": other}), 429, "capacity_exhausted", other
    )
    assert full["request_id"] == other
    assert post(server, speech_body()).headers["retry-after"] == "1"
    assert server.metric("qwen3_tts_rejected_requests_total") == rejected_before + 2

    accepted = httpx.delete(f"{server.url}/v1/requests/{request_id}")
    assert accepted.status_code == 202
    assert accepted.json() == {"request_id": request_id, "status": "cancellation_requested"}
    thread.join(30)
    assert_problem(outcome["wav"], 409, "request_cancelled", request_id)

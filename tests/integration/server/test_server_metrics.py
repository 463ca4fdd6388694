"""Metrics and logs carry no user data: no text, description, language or request id, no user labels."""

from __future__ import annotations

import re
import uuid

import httpx
import pytest
from server_harness import ServerProcess, speech_body

pytestmark = pytest.mark.integration

SAMPLE = re.compile(r'^(qwen3_tts_[a-z_]+?)(_bucket\{le="[^"]+"\})? (\S+)$')
SERIES = {
    "qwen3_tts_http_requests_total",
    "qwen3_tts_active_requests",
    "qwen3_tts_streaming_requests_total",
    "qwen3_tts_buffered_requests_total",
    "qwen3_tts_completed_requests_total",
    "qwen3_tts_failed_requests_total",
    "qwen3_tts_cancelled_requests_total",
    "qwen3_tts_rejected_requests_total",
    "qwen3_tts_retirement_timeouts_total",
    "qwen3_tts_emitted_samples_total",
    "qwen3_tts_time_to_first_audio_seconds",
    "qwen3_tts_time_to_first_audio_seconds_sum",
    "qwen3_tts_time_to_first_audio_seconds_count",
    "qwen3_tts_real_time_factor",
    "qwen3_tts_real_time_factor_sum",
    "qwen3_tts_real_time_factor_count",
}


def test_metrics_and_logs_hold_no_user_data(server: ServerProcess) -> None:
    text, description, request_id = (
        "Zebra quokka marmalade 7741.",
        "A purple walrus baritone.",
        str(uuid.uuid4()),
    )
    before = httpx.get(f"{server.url}/metrics").text
    for stream in (True, False):
        body = speech_body(
            text=text,
            voice_description=description,
            language="italian",
            max_duration_seconds=0.4,
            stream=stream,
        )
        headers = {"x-request-id": request_id if stream else str(uuid.uuid4())}
        assert (
            httpx.post(
                f"{server.url}/v1/voice-design/speech", json=body, headers=headers, timeout=60
            ).status_code
            == 200
        )
    httpx.post(f"{server.url}/v1/voice-design/speech", json=speech_body(text=text, language="klingon"))

    response = httpx.get(f"{server.url}/metrics")
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    exposition = response.text
    for secret in (
        "Zebra",
        "quokka",
        "walrus",
        "italian",
        "klingon",
        request_id,
        "voice_description",
        "request_id",
        "language",
    ):
        assert secret.lower() not in exposition.lower()
    samples = [line for line in exposition.splitlines() if line and not line.startswith("#")]
    for line in samples:
        match = SAMPLE.match(line)
        assert match is not None, line
        assert match.group(1) in SERIES, line
        float(match.group(3))
    counts = {line.split()[0]: float(line.split()[1]) for line in samples if "{" not in line}
    previous = {
        line.split()[0]: float(line.split()[1])
        for line in before.splitlines()
        if line[:1] != "#" and "{" not in line
    }
    assert counts["qwen3_tts_completed_requests_total"] - previous["qwen3_tts_completed_requests_total"] == 2
    assert counts["qwen3_tts_streaming_requests_total"] - previous["qwen3_tts_streaming_requests_total"] == 1
    assert counts["qwen3_tts_buffered_requests_total"] - previous["qwen3_tts_buffered_requests_total"] == 1
    assert counts["qwen3_tts_emitted_samples_total"] - previous["qwen3_tts_emitted_samples_total"] >= 2 * 1920
    assert counts["qwen3_tts_time_to_first_audio_seconds_count"] >= 2

    log = server.log()
    for secret in ("Zebra", "quokka", "walrus"):
        assert secret not in log

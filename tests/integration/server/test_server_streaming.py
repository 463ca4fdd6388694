"""Progressive multipart and buffered WAV over real HTTP: framing, positions, audio equal to offline."""

from __future__ import annotations

import math
import struct
import threading
import time
import uuid

import httpx
import pytest
from server_harness import (
    OfflinePcm,
    ServerProcess,
    check_positions,
    parse_multipart,
    read_until,
    speech_body,
    stream_speech,
    synthesis_request,
)

pytestmark = pytest.mark.integration

METRIC_FIELDS = {
    "queue_microseconds",
    "prefill_microseconds",
    "first_codec_frame_microseconds",
    "first_audio_microseconds",
    "wall_microseconds",
    "generated_codec_frames",
    "emitted_samples",
    "emitted_packets",
    "talker_gpu_microseconds",
    "codec_gpu_microseconds",
    "peak_request_device_bytes",
    "peak_request_host_bytes",
}


def test_multipart_stream_equals_offline_synthesis(server: ServerProcess, offline_pcm: OfflinePcm) -> None:
    body = speech_body(seed=11, max_duration_seconds=1.2, language=" English ")
    request_id = str(uuid.uuid4())
    response, raw = stream_speech(server.url, body, {"x-request-id": request_id})

    assert response.status_code == 200
    assert (
        response.headers["content-type"] == f"multipart/mixed; boundary=qwen3tts-{uuid.UUID(request_id).hex}"
    )
    assert response.headers["x-request-id"] == request_id
    assert response.headers["x-qwen3-seed"] == "11"
    assert response.headers["cache-control"] == "no-store"
    assert "content-length" not in response.headers
    stream = parse_multipart(response.headers["content-type"], raw)
    assert stream.start == {
        "type": "start",
        "request_id": request_id,
        "model": "qwen3-tts-1.7b-voice-design",
        "seed": 11,
        "audio": {
            "encoding": "pcm_s16le",
            "sample_rate_hz": 24000,
            "channels": 1,
            "samples_per_codec_frame": 1920,
        },
    }
    check_positions(stream)
    end = stream.terminal
    assert end["type"] == "end" and end["request_id"] == request_id
    assert end["finish_reason"] in ("stop", "length")
    assert set(end["metrics"]) == METRIC_FIELDS
    assert end["metrics"]["emitted_samples"] == len(stream.pcm) // 2
    assert end["metrics"]["emitted_packets"] == len(stream.audio)
    assert end["metrics"]["generated_codec_frames"] == len(stream.pcm) // 3840
    assert 0 < end["metrics"]["first_audio_microseconds"] <= end["metrics"]["wall_microseconds"]
    if end["finish_reason"] == "length":
        assert len(stream.pcm) == math.ceil(1.2 * 12.5) * 3840
    assert stream.pcm == offline_pcm(synthesis_request(body))


def test_buffered_wav_equals_offline_synthesis(server: ServerProcess, offline_pcm: OfflinePcm) -> None:
    body = speech_body(seed=5, max_duration_seconds=0.8, stream=False, sampling={"strategy": "greedy"})
    response = httpx.post(f"{server.url}/v1/voice-design/speech", json=body, timeout=120)

    assert response.status_code == 200
    assert response.headers["content-type"] == "audio/wav"
    assert response.headers["content-disposition"] == "inline; filename=voice-design.wav"
    assert response.headers["x-finish-reason"] in ("stop", "length")
    assert int(response.headers["content-length"]) == len(response.content)
    riff, size, wave, fmt, _, pcm_format, channels, rate, byte_rate, align, bits, data, data_size = (
        struct.unpack("<4sI4s4sIHHIIHH4sI", response.content[:44])
    )
    assert (riff, wave, fmt, data) == (b"RIFF", b"WAVE", b"fmt ", b"data")
    assert (pcm_format, channels, rate, byte_rate, align, bits) == (1, 1, 24000, 48000, 2, 16)
    assert data_size == len(response.content) - 44 and size == data_size + 36
    assert response.content[44:] == offline_pcm(synthesis_request(body))


def test_concurrent_requests_equal_solo(server: ServerProcess, offline_pcm: OfflinePcm) -> None:
    """Four overlapping requests, admitted at different times, each get exactly their solo audio."""
    bodies = [
        speech_body(
            text="The first request is fairly long and keeps going.", seed=1, max_duration_seconds=2.4
        ),
        speech_body(
            text="Zweite Anfrage.",
            voice_description="A bright voice.",
            language="german",
            seed=2**40,
            max_duration_seconds=1.2,
        ),
        speech_body(text="Third.", seed=3, max_duration_seconds=1.6, sampling={"strategy": "greedy"}),
        speech_body(
            text="La quatrième demande, en français.",
            language="french",
            seed=44,
            max_duration_seconds=0.8,
            sampling={
                "temperature": 0.7,
                "top_k": 20,
                "top_p": 0.9,
                "repetition_penalty": 1.2,
                "predictor": {"strategy": "greedy"},
            },
        ),
    ]
    # Each request starts once the previous one is streaming, so all four join a running batch in turn.
    streaming = [threading.Event() for _ in bodies]
    results: dict[int, tuple[float, float, str, bytes]] = {}

    def run(index: int) -> None:
        if index and not streaming[index - 1].wait(120):
            return
        began = time.monotonic()
        url = f"{server.url}/v1/voice-design/speech"
        with httpx.stream("POST", url, json=bodies[index], timeout=120) as response:
            assert response.status_code == 200
            chunks, buffer = response.iter_bytes(), bytearray()
            read_until(chunks, buffer, b"Content-Type: audio/pcm")
            streaming[index].set()
            buffer += b"".join(chunks)
            results[index] = (began, time.monotonic(), response.headers["content-type"], bytes(buffer))

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)

    assert sorted(results) == [0, 1, 2, 3]
    assert max(began for began, *_ in results.values()) < min(ended for _, ended, *_ in results.values())
    for index, body in enumerate(bodies):
        _, _, content_type, raw = results[index]
        stream = parse_multipart(content_type, raw)
        check_positions(stream)
        assert stream.terminal["type"] == "end"
        assert stream.pcm == offline_pcm(synthesis_request(body)), (
            f"request {index} differs from its solo run"
        )

"""The official openai SDK, unchanged, against /v1/audio/speech: streamed PCM, WAV, SSE, and clear 422s."""

from __future__ import annotations

import base64
import json
import math

import httpx
import openai
import pytest
from server_harness import OfflinePcm, ServerProcess

from qwen3_tts_native.engine.runtime.request import SynthesisRequest

pytestmark = pytest.mark.integration

MODEL = "qwen3-tts-1.7b-voice-design"
DEFAULT_FRAMES = math.ceil(3 * 12.5)  # the test server's max_duration_seconds is 3


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def test_sdk_streams_pcm_as_produced(client: openai.OpenAI, offline_pcm: OfflinePcm) -> None:
    text, voice = "Streaming through the SDK.", "A warm, slow voice."
    chunks: list[bytes] = []
    with client.audio.speech.with_streaming_response.create(
        model=MODEL, input=text, voice=voice, response_format="pcm"
    ) as response:
        assert response.headers["content-type"] == "audio/pcm"
        assert "content-length" not in response.headers
        seed = int(response.headers["x-qwen3-seed"])
        chunks.extend(response.iter_bytes())
    pcm = b"".join(chunks)
    assert pcm == offline_pcm(SynthesisRequest(text, voice, seed=seed, max_frames=DEFAULT_FRAMES))


def test_sdk_streams_wav_with_named_voice_and_instructions(
    client: openai.OpenAI, offline_pcm: OfflinePcm
) -> None:
    text, description = "A wave file, please.", "A bright, quick voice."
    with client.audio.speech.with_streaming_response.create(
        model=MODEL, input=text, voice="alloy", instructions=description, response_format="wav", speed=1.0
    ) as response:
        assert response.headers["content-type"] == "audio/wav"
        seed = int(response.headers["x-qwen3-seed"])
        data = response.read()
    assert (
        data[:4] == b"RIFF"
        and data[8:12] == b"WAVE"
        and int.from_bytes(data[40:44], "little") == len(data) - 44
    )
    assert data[44:] == offline_pcm(SynthesisRequest(text, description, seed=seed, max_frames=DEFAULT_FRAMES))


def test_sdk_sse_events(client: openai.OpenAI) -> None:
    with client.audio.speech.with_streaming_response.create(
        model=MODEL, input="Events.", voice="A quiet voice.", response_format="pcm", stream_format="sse"
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    assert [event["type"] for event in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
    assert events[-1]["type"] == "speech.audio.done"
    pcm = b"".join(base64.b64decode(event["audio"]) for event in events[:-1])
    assert len(pcm) % 3840 == 0 and len(base64.b64decode(events[0]["audio"])) == 3840


@pytest.mark.parametrize(
    ("arguments", "code"),
    [
        ({"model": "tts-1"}, "unsupported_model"),
        ({"speed": 1.25}, "unsupported_speed"),
        ({"response_format": "mp3"}, "unsupported_response_format"),
        ({"response_format": "wav", "stream_format": "sse"}, "unsupported_response_format"),
        ({"voice": "alloy"}, "invalid_voice_description"),
        ({"input": " "}, "invalid_text"),
    ],
)
def test_sdk_gets_clear_422(client: openai.OpenAI, arguments: dict[str, object], code: str) -> None:
    call = {"model": MODEL, "input": "Hello.", "voice": "A calm voice.", **arguments}
    with pytest.raises(openai.UnprocessableEntityError) as raised:
        client.audio.speech.create(**call)  # type: ignore[arg-type]
    assert raised.value.response.json()["code"] == code


def test_unknown_openai_field_is_400(server: ServerProcess) -> None:
    body = {"model": MODEL, "input": "Hi.", "voice": "A calm voice.", "temperature": 0.5}
    response = httpx.post(f"{server.url}/v1/audio/speech", json=body)
    assert response.status_code == 400 and response.json()["code"] == "malformed_json"

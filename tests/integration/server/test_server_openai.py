"""The official openai SDK, unchanged, against /v1/audio/speech: streamed PCM, WAV, SSE, clear 422s, and the
optional extensions (seed, language, max_duration_seconds, sampling) it sends through ``extra_body``."""

from __future__ import annotations

import base64
import json
import math
import uuid

import httpx
import openai
import pytest
from server_harness import OfflinePcm, ServerProcess, synthesis_request

from qwen3_tts_native.engine.runtime.request import (
    MAX_SEED,
    PredictorSampling,
    SynthesisRequest,
    TalkerSampling,
)
from qwen3_tts_native.evidence.adapters import OPENAI_FIELDS, make_adapter
from qwen3_tts_native.evidence.workload import parity_reasons, parse_workload

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


def test_sdk_extra_body_pins_seed_language_and_duration(
    client: openai.OpenAI, offline_pcm: OfflinePcm
) -> None:
    text, voice = "A pinned voice.", "A warm, slow voice."
    extra = {"seed": 7, "language": "english", "max_duration_seconds": 0.4}
    with client.audio.speech.with_streaming_response.create(
        model=MODEL, input=text, voice=voice, response_format="pcm", extra_body=extra
    ) as response:
        assert response.headers["content-type"] == "audio/pcm"
        assert response.headers["x-qwen3-seed"] == "7"
        pcm = b"".join(response.iter_bytes())
    expected = offline_pcm(SynthesisRequest(text, voice, language="english", seed=7, max_frames=5))
    assert 0 < len(pcm) <= 5 * 3840 and pcm == expected


def test_sdk_extra_body_sampling_matches_offline(client: openai.OpenAI, offline_pcm: OfflinePcm) -> None:
    text, description = "Greedy talker, sampled predictor.", "A bright, quick voice."
    sampling = {
        "strategy": "greedy",
        "repetition_penalty": 1.2,
        "predictor": {"strategy": "sample", "top_k": 5},
    }
    with client.audio.speech.with_streaming_response.create(
        model=MODEL,
        input=text,
        voice="alloy",
        instructions=description,
        response_format="wav",
        extra_body={
            "seed": MAX_SEED,
            "language": " German ",
            "max_duration_seconds": 0.3,
            "sampling": sampling,
        },
    ) as response:
        assert response.headers["x-qwen3-seed"] == str(MAX_SEED)
        data = response.read()
    request = SynthesisRequest(
        text,
        description,
        language="german",
        seed=MAX_SEED,
        max_frames=4,
        talker_sampling=TalkerSampling(greedy=True, repetition_penalty=1.2),
        predictor_sampling=PredictorSampling(greedy=False, top_k=5),
    )
    assert data[:4] == b"RIFF" and data[44:] == offline_pcm(request)


@pytest.mark.parametrize(
    ("extra", "code"),
    [
        ({"language": "klingon"}, "unsupported_language"),
        ({"language": " "}, "unsupported_language"),
        ({"max_duration_seconds": 0.05}, "invalid_max_duration"),
        ({"max_duration_seconds": 3.5}, "invalid_max_duration"),
        ({"seed": -1}, "invalid_seed"),
        ({"seed": MAX_SEED + 1}, "invalid_seed"),
        ({"sampling": {"temperature": 2.5}}, "invalid_sampling"),
        ({"sampling": {"strategy": "greedy", "top_k": 3}}, "invalid_sampling"),
        ({"sampling": {"predictor": {"top_k": 2049}}}, "invalid_sampling"),
        # the native order: language before duration before seed before the output format before sampling
        ({"language": "klingon", "seed": -1}, "unsupported_language"),
        ({"max_duration_seconds": 0, "seed": -1}, "invalid_max_duration"),
        ({"seed": -1, "response_format": "mp3"}, "invalid_seed"),
        ({"response_format": "mp3", "sampling": {"top_p": 0}}, "unsupported_response_format"),
    ],
)
def test_sdk_extension_errors_match_native(
    client: openai.OpenAI, server: ServerProcess, extra: dict[str, object], code: str
) -> None:
    with pytest.raises(openai.UnprocessableEntityError) as raised:
        client.audio.speech.create(model=MODEL, input="Hello.", voice="A calm voice.", extra_body=extra)
    assert raised.value.response.json()["code"] == code
    if "response_format" not in extra:  # the native endpoint answers the same code for the same value
        body = {"text": "Hello.", "voice_description": "A calm voice.", **extra}
        answer = httpx.post(f"{server.url}/v1/voice-design/speech", json=body)
        assert answer.status_code == 422 and answer.json()["code"] == code


@pytest.mark.parametrize(
    "extra",
    [
        {"seed": "7"},
        {"seed": 7.0},
        {"language": 1},
        {"sampling": {"seed": 1}},
        {"sampling": {"predictor": {"x": 1}}},
    ],
)
def test_extension_shape_errors_are_400(server: ServerProcess, extra: dict[str, object]) -> None:
    body = {"model": MODEL, "input": "Hi.", "voice": "A calm voice.", **extra}
    response = httpx.post(f"{server.url}/v1/audio/speech", json=body)
    assert response.status_code == 400 and response.json()["code"] == "malformed_json"


def test_evidence_openai_adapter_forwards_fields_to_our_server(
    server: ServerProcess, offline_pcm: OfflinePcm
) -> None:
    row = parse_workload(
        json.dumps(
            {
                "id": "pinned",
                "text": "Evidence through the OpenAI API.",
                "voice_description": "A calm adult voice.",
                "language": "English",
                "seed": 41,
                "max_duration_seconds": 0.4,
                "sampling": {
                    "strategy": "sample",
                    "temperature": 0.8,
                    "top_p": 0.95,
                    "top_k": 40,
                    "repetition_penalty": 1.05,
                    "predictor": {"strategy": "sample", "temperature": 0.9, "top_p": 1.0, "top_k": 50},
                },
            }
        ).encode()
        + b"\n"
    ).rows[0]
    adapter = make_adapter("openai", fields=OPENAI_FIELDS)
    prepared = adapter.prepare(row, str(uuid.uuid4()))
    assert prepared.api_parity_reasons == () and parity_reasons(row) == []
    response = httpx.post(
        f"{server.url}{prepared.path}", content=prepared.body, headers=prepared.headers, timeout=60
    )
    assert response.status_code == 200, response.text
    decoder = adapter.decoder(response.headers)
    decoder.begin(response.headers)
    decoder.feed(response.content, 0)
    decoder.close()
    assert decoder.server_seed == 41
    expected = offline_pcm(synthesis_request({**row.raw}))
    assert response.content == expected

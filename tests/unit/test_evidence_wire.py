"""The incremental parsers and response decoders: framing by Content-Length, any chunking, strict failures."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable

import pytest
from evidence_fakes import multipart_parts, pcm_for, wav_bytes

from qwen3_tts_native.evidence.adapters import (
    MultipartDecoder,
    RawPcmDecoder,
    SseDecoder,
    StreamFailure,
    WavDecoder,
    make_adapter,
)
from qwen3_tts_native.evidence.wire import MultipartParser, WireError, boundary_from_content_type
from qwen3_tts_native.evidence.workload import parse_workload

REQUEST_ID = "0190c0de-0000-7000-8000-000000000001"


def _decode_multipart(body: bytes, step: int) -> MultipartDecoder:
    boundary = "qwen3tts-" + REQUEST_ID.replace("-", "")
    decoder = MultipartDecoder(MultipartParser(boundary))
    decoder.begin({"x-request-id": REQUEST_ID, "x-qwen3-seed": "7"})
    for i in range(0, len(body), step):
        decoder.feed(body[i : i + step], t_ns=i)
    decoder.close()
    return decoder


@pytest.mark.parametrize("step", [1, 2, 7, 100, 1 << 20])
def test_multipart_any_chunking(step: int) -> None:
    _, chunks = multipart_parts(REQUEST_ID, 7, frames=6, finish="stop")
    decoder = _decode_multipart(b"".join(chunks), step)
    assert [p.codec_frames for p in decoder.packets] == [1, 4, 1]
    assert decoder.pcm_bytes == 6 * 1920 * 2
    assert b"".join(bytes(p.payload) for p in decoder.packets) == pcm_for(7, 6)
    assert decoder.finish_reason == "stop" and decoder.final_flag_seen and decoder.continuity_valid
    assert decoder.server_seed == 7


def test_payload_containing_the_boundary_is_not_a_delimiter() -> None:
    boundary = "qwen3tts-" + REQUEST_ID.replace("-", "")
    _, chunks = multipart_parts(REQUEST_ID, 1, frames=1)
    body = b"".join(chunks)
    # Overwrite the start of the single audio payload with the delimiter bytes: framing must ignore them.
    audio_at = body.index(b"X-Final: true\r\n\r\n") + len(b"X-Final: true\r\n\r\n")
    forged = f"\r\n--{boundary}--\r\n".encode()
    body = body[:audio_at] + forged + body[audio_at + len(forged) :]
    decoder = _decode_multipart(body, 5)
    assert decoder.pcm_bytes == 3840


def test_multipart_first_audio_time_is_first_payload_byte() -> None:
    _, chunks = multipart_parts(REQUEST_ID, 3, frames=2)
    boundary = "qwen3tts-" + REQUEST_ID.replace("-", "")
    decoder = MultipartDecoder(MultipartParser(boundary))
    decoder.begin({"x-request-id": REQUEST_ID})
    audio = chunks[1]
    header_end = audio.index(b"\r\n\r\n") + 4
    decoder.feed(chunks[0], 10)
    decoder.feed(audio[:header_end], 20)
    assert decoder.packets and not decoder.packets[0].payload
    decoder.feed(audio[header_end:], 30)
    assert decoder.packets[0].arrival_ns == 30


@pytest.mark.parametrize(
    ("mutate", "code"),
    [
        (lambda c: c[:-1], "truncated_stream"),
        (lambda c: [c[0], c[2], *c[1:2], *c[3:]], "discontinuous_stream"),
        (lambda c: c[1:], "protocol_error"),
        (
            lambda c: [c[0], c[1].replace(b"Content-Length: 3840", b"Content-Length: 3842"), *c[2:]],
            "protocol_error",
        ),
    ],
)
def test_multipart_violations(mutate: Callable[[list[bytes]], list[bytes]], code: str) -> None:
    _, chunks = multipart_parts(REQUEST_ID, 3, frames=9)
    with pytest.raises(WireError) as info:
        _decode_multipart(b"".join(mutate(chunks)), 64)
    assert info.value.code == code


def test_error_part_is_a_stream_failure() -> None:
    _, chunks = multipart_parts(REQUEST_ID, 3, frames=9, error_after=1)
    with pytest.raises(StreamFailure) as info:
        _decode_multipart(b"".join(chunks), 64)
    assert info.value.code == "internal_error"


def test_boundary_parsing() -> None:
    assert boundary_from_content_type('multipart/mixed; boundary="abc"') == "abc"
    with pytest.raises(WireError):
        boundary_from_content_type("audio/wav")
    with pytest.raises(WireError):
        boundary_from_content_type("multipart/mixed")


@pytest.mark.parametrize("step", [1, 3, 44, 4096])
def test_wav_decoder(step: int) -> None:
    pcm = pcm_for(2, 3)
    data = wav_bytes(pcm)
    decoder = WavDecoder()
    decoder.begin({"x-finish-reason": "stop"})
    for i in range(0, len(data), step):
        decoder.feed(data[i : i + step], i)
    decoder.close()
    assert decoder.pcm_bytes == len(pcm) and decoder.finish_reason == "stop"
    assert decoder.packets[0].arrival_ns == (44 // step) * step


def test_wav_decoder_rejects_short_body_and_stereo() -> None:
    decoder = WavDecoder()
    decoder.begin({})
    decoder.feed(wav_bytes(pcm_for(2, 1))[:-10], 0)
    with pytest.raises(WireError):
        decoder.close()
    stereo = bytearray(wav_bytes(pcm_for(2, 1)))
    stereo[22:24] = (2).to_bytes(2, "little")
    stereo[32:34] = (4).to_bytes(2, "little")
    stereo[28:32] = (96000).to_bytes(4, "little")
    decoder = WavDecoder()
    decoder.begin({})
    decoder.feed(bytes(stereo), 0)
    with pytest.raises(WireError):
        decoder.close()


def test_raw_pcm_arrivals_and_alignment() -> None:
    decoder = RawPcmDecoder()
    decoder.begin({"content-type": "audio/pcm;rate=16000"})
    for i, piece in enumerate([b"\x01\x02\x03", b"\x04", b"\x05\x06"]):
        decoder.feed(piece, i)
    decoder.close()
    assert decoder.sample_rate_hz == 16000 and decoder.pcm_bytes == 6
    assert [p.sample_count for p in decoder.packets] == [None, None, 1]
    odd = RawPcmDecoder()
    odd.begin({"content-type": "audio/pcm"})
    odd.feed(b"\x01", 0)
    with pytest.raises(WireError):
        odd.close()


def test_sse_decoder() -> None:
    pcm = pcm_for(4, 1)
    events = (
        b"".join(
            b"data: "
            + json.dumps(
                {"type": "speech.audio.delta", "audio": base64.b64encode(pcm[i : i + 1000]).decode()}
            ).encode()
            + b"\r\n\r\n"
            for i in range(0, len(pcm), 1000)
        )
        + b'data: {"type":"speech.audio.done"}\n\n'
    )
    decoder = SseDecoder()
    decoder.begin({"content-type": "text/event-stream"})
    for i in range(0, len(events), 13):
        decoder.feed(events[i : i + 13], i)
    decoder.close()
    assert decoder.pcm_bytes == len(pcm) and len(decoder.packets) == 4
    unfinished = SseDecoder()
    unfinished.begin({"content-type": "text/event-stream"})
    unfinished.feed(events[:100], 0)
    with pytest.raises(WireError):
        unfinished.close()


def test_adapters_build_the_documented_requests() -> None:
    row = parse_workload(
        b'{"id":"a","text":"Hi there","voice_description":"calm","seed":3,"stream":true}\n'
    ).rows[0]
    native = make_adapter("native").prepare(row, REQUEST_ID)
    assert native.path == "/v1/voice-design/speech" and native.headers["x-request-id"] == REQUEST_ID
    assert json.loads(native.body) == {
        "text": "Hi there",
        "voice_description": "calm",
        "seed": 3,
        "stream": True,
    }
    openai = make_adapter("openai", response="sse").prepare(row, REQUEST_ID)
    assert json.loads(openai.body) == {
        "model": "qwen3-tts-1.7b-voice-design",
        "input": "Hi there",
        "voice": "calm",
        "response_format": "pcm",
        "stream_format": "sse",
    }
    assert openai.api_parity_reasons
    wav = make_adapter("wav").prepare(row, REQUEST_ID)
    assert json.loads(wav.body)["stream"] is False and json.loads(wav.body)["output_format"] == "wav"
    with pytest.raises(ValueError):
        make_adapter("grpc")

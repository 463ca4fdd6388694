"""PCM16 conversion and the canonical WAV header."""

from __future__ import annotations

import io
import wave
from pathlib import Path

import torch

from qwen3_tts_native.engine.audio import float_to_pcm16, pcm16_bytes, pcm16_samples, wav_header, write_wav


def test_pcm16_rounds_and_clamps() -> None:
    wave_in = torch.tensor([-2.0, -1.0, -0.5, 0.0, 0.5 / 32767, 1.5 / 32767, 0.5, 1.0, 3.0])
    pcm = float_to_pcm16(wave_in)
    values = torch.frombuffer(bytearray(pcm), dtype=torch.int16).tolist()
    assert values == [-32767, -32767, -16384, 0, 0, 2, 16384, 32767, 32767]  # half to even
    assert float_to_pcm16(wave_in.to(torch.bfloat16))[:4] == pcm[:4]


def test_header_equals_the_wave_module(tmp_path: Path) -> None:
    pcm = float_to_pcm16(torch.linspace(-1, 1, 1000))
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as handle:
        handle.setnchannels(1)
        handle.setsampwidth(2)
        handle.setframerate(24000)
        handle.writeframes(pcm)
    assert len(wav_header(1000)) == 44
    assert buffer.getvalue()[:44] == wav_header(1000)
    write_wav(tmp_path / "x.wav", pcm)
    assert (tmp_path / "x.wav").read_bytes() == buffer.getvalue()


def test_pcm16_samples_keep_the_batch_and_match_the_bytes() -> None:
    """The engine converts a batch of packets with `pcm16_samples` and writes each row with `pcm16_bytes`:
    the same bytes as `float_to_pcm16` of the row."""
    batch = torch.linspace(-1.2, 1.2, 3 * 480, dtype=torch.float64).reshape(3, 480)
    samples = pcm16_samples(batch)
    assert samples.dtype == torch.int16 and samples.shape == (3, 480)
    for row in range(3):
        assert pcm16_bytes(samples[row]) == float_to_pcm16(batch[row])

"""PCM16 conversion and WAV framing for the 24 kHz mono output.

The engine hands out raw little-endian PCM16; every wire format (WAV file, HTTP WAV stream, raw PCM)
is built from these three helpers so that the bytes are the same everywhere.
"""

from __future__ import annotations

import struct
from pathlib import Path

import torch

from .config import SAMPLE_RATE_HZ

WAV_HEADER_BYTES = 44
_PCM16_MAX = 32767


def pcm16_samples(wave: torch.Tensor) -> torch.Tensor:
    """The PCM16 samples of a float waveform in [-1, 1], as int16 on the wave's device, any shape.

    Exactly ``round(clamp(x, -1, 1) * 32767)`` computed in float32, with round-half-to-even
    (``torch.round``). Any other implementation (a CUDA kernel, a wire encoder) must reproduce this bit for
    bit, so keep it the single definition. CPU and CUDA give the same samples (the clamp is exact, the one
    product is correctly rounded on both, and both round half to even), so the engine converts a batch of
    packets on the GPU and copies half the bytes to the host instead of converting each packet there.
    """
    samples = wave.detach().to(torch.float32)
    return torch.round(samples.clamp(-1.0, 1.0) * _PCM16_MAX).to(torch.int16)


def pcm16_bytes(samples: torch.Tensor) -> bytes:
    """int16 samples (a CPU tensor, any shape) as PCM16 little-endian bytes, in row-major order."""
    return samples.numpy().astype("<i2", copy=False).tobytes()


def float_to_pcm16(wave: torch.Tensor) -> bytes:
    """Convert a float waveform in [-1, 1] to PCM16 little-endian bytes (`pcm16_samples`, flattened)."""
    return pcm16_bytes(pcm16_samples(wave.reshape(-1)).cpu())


def wav_header(num_samples: int, sample_rate: int = SAMPLE_RATE_HZ) -> bytes:
    """The canonical 44-byte RIFF/WAVE header for mono 16-bit PCM with ``num_samples`` samples."""
    if num_samples < 0:
        raise ValueError(f"num_samples must be >= 0, got {num_samples}")
    data_bytes = num_samples * 2
    return struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF",
        36 + data_bytes,
        b"WAVE",
        b"fmt ",
        16,  # fmt chunk size
        1,  # PCM
        1,  # mono
        sample_rate,
        sample_rate * 2,  # byte rate
        2,  # block align
        16,  # bits per sample
        b"data",
        data_bytes,
    )


def write_wav(path: str | Path, pcm: bytes, sample_rate: int = SAMPLE_RATE_HZ) -> None:
    """Write PCM16 LE mono bytes as a WAV file (header + data)."""
    if len(pcm) % 2:
        raise ValueError("PCM16 data must have an even number of bytes")
    Path(path).write_bytes(wav_header(len(pcm) // 2, sample_rate) + pcm)

"""PCM16 conversion on the GPU: the engine converts decoded packets with `pcm16_samples` on CUDA before the
copy to the host, so the samples must equal the CPU's definition bit for bit."""

from __future__ import annotations

import pytest
import torch

from qwen3_tts_native.engine.audio import pcm16_samples


def waves() -> torch.Tensor:
    """Random audio, values past the clamp, and every rounding boundary of the int16 range with its float32
    neighbours (the products land on, just below and just above each half step)."""
    generator = torch.Generator().manual_seed(0)
    noise = torch.randn(1 << 20, generator=generator) * 0.6
    halves = (torch.arange(-32768, 32768, dtype=torch.float64) + 0.5) / 32767
    boundaries = halves.to(torch.float32)
    below = torch.nextafter(boundaries, torch.tensor(-2.0))
    above = torch.nextafter(boundaries, torch.tensor(2.0))
    extremes = torch.tensor([-3.0, -1.0, -0.0, 0.0, 1.0, 3.0, 1e-40, -1e-40])
    return torch.cat([noise, boundaries, below, above, extremes])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_cuda_pcm16_samples_equal_the_cpu_definition(dtype: torch.dtype) -> None:
    wave = waves().to(dtype).reshape(8, -1)  # a batch of packets, as the engine converts them
    on_gpu = pcm16_samples(wave.cuda())
    assert on_gpu.dtype == torch.int16 and on_gpu.is_cuda and on_gpu.shape == wave.shape
    assert torch.equal(on_gpu.cpu(), pcm16_samples(wave))

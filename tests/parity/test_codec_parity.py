"""SpeechDecoder against the official qwen-tts decoder on the same random weights (fp32, before the clamp).

The official decoder is run whole (its forward, not `chunked_decode`); for 300 frames or fewer the official
`chunked_decode` is the same computation. Ours computes frame by frame (codec.py), so it reproduces the
whole decode to float32 rounding, not bit for bit: the largest difference measured here is 6.9e-6 (the
8-layer, 400-frame test; 5.0e-6 at 80 tiny frames). Streamed and one-shot are bit-identical to each other.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from official_codec import official_decoder, official_waveform, random_decoder_tensors
from torch import nn

from qwen3_tts_native.engine.config import SpeechDecoderConfig, VoiceDesignConfig
from qwen3_tts_native.engine.model.codec import SpeechDecoder

pytestmark = pytest.mark.parity

TOLERANCE = 1e-5  # a third of one PCM16 step; the official decoder's own prefix-vs-whole noise is ~3e-6


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny shapes gain nothing from threads, and on a shared CPU the thread pools mostly contend."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _codes(batch: int, frames: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 2048, (batch, 16, frames), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def tiny_pair(tiny_voice_design_config: VoiceDesignConfig) -> tuple[nn.Module, SpeechDecoder]:
    config = tiny_voice_design_config.speech_decoder
    tensors = random_decoder_tensors(config, seed=7)
    return official_decoder(config, tensors), SpeechDecoder.from_tensors(config, tensors)


@pytest.mark.parametrize("frames", [1, 7, 80, 320])
def test_one_shot_matches_official(tiny_pair: tuple[nn.Module, SpeechDecoder], frames: int) -> None:
    official, ours = tiny_pair
    codes = _codes(2, frames, seed=frames)
    expected = official_waveform(official, codes)
    got = ours.decode(codes, clamp=False)
    assert got.shape == (2, frames * 1920)
    assert expected.abs().max() > 0.5  # a real signal, not the degenerate all-zero init
    assert (got - expected).abs().max().item() <= TOLERANCE


def test_clamped_output_matches_official(tiny_pair: tuple[nn.Module, SpeechDecoder]) -> None:
    official, ours = tiny_pair
    codes = _codes(1, 12, seed=3)
    with torch.no_grad():
        expected = official(codes).squeeze(1)
    assert (ours.decode(codes) - expected).abs().max().item() <= TOLERANCE


def test_gqa_eight_layers_long_stream_matches_official(
    deep_grouped_kv_decoder_config: SpeechDecoderConfig,
) -> None:
    """Full depth (8 layers: the attention field is 8 x 71 frames), grouped KV heads, 400 frames (> 300,
    where the official `chunked_decode` starts to differ): one-shot matches the whole official decode, and
    streamed in the engine's packets (1 then 4s) equals one-shot bit for bit."""
    config = deep_grouped_kv_decoder_config
    tensors = random_decoder_tensors(config, seed=11)
    official, ours = official_decoder(config, tensors), SpeechDecoder.from_tensors(config, tensors)
    codes = _codes(1, 400, seed=5)
    expected = official_waveform(official, codes)[0]
    one_shot = ours.decode(codes, clamp=False)[0]
    assert (one_shot - expected).abs().max().item() <= TOLERANCE

    state = ours.new_stream_state()
    packets, start = [], 0
    for size in [1] + [4] * 99 + [3]:
        packets.append(ours.decode_stream(codes[0, :, start : start + size].T, state, clamp=False))
        start += size
    assert torch.equal(torch.cat(packets), one_shot)

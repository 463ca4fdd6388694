"""The CUDA codec's GEMM formulation (codec.py: `conv1d_as_gemm` and its siblings), checked on CPU in float64,
where only the math counts: each GEMM form computes its layer for one stream and for a batch (the batch is
folded into the GEMM's N), from contiguous or channel-major inputs, and the whole decoder run through that
path equals the CPU path's decode.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_codec_streaming import random_tensors
from torch import Tensor

from qwen3_tts_native.engine.config import VoiceDesignConfig
from qwen3_tts_native.engine.model import codec
from qwen3_tts_native.engine.model.codec import (
    CausalConv1d,
    CausalConvTranspose1d,
    CodecStreamState,
    SnakeBeta,
    SpeechDecoder,
    conv1d_as_gemm,
    conv_transpose1d_as_gemm,
    pointwise_residual_as_gemm,
)

EXACT = 1e-12


def channel_major(x: Tensor) -> Tensor:
    """x's values in the layout the GEMM convs return ([C, B, T] storage seen as [B, C, T])."""
    return x.transpose(0, 1).contiguous().transpose(0, 1)


def is_channel_major(x: Tensor) -> bool:
    return x.transpose(0, 1).is_contiguous()


def randn(*shape: int, seed: int) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("layout", ["contiguous", "channel-major"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("steps", [1, 4, 9])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(
    ("in_channels", "out_channels", "kernel", "dilation"),
    [(24, 16, 7, 1), (16, 16, 7, 3), (16, 16, 7, 9), (8, 1, 7, 1), (12, 20, 3, 1), (10, 6, 1, 1)],
)
def test_conv1d_as_gemm_is_the_convolution(
    in_channels: int,
    out_channels: int,
    kernel: int,
    dilation: int,
    bias: bool,
    steps: int,
    batch: int,
    layout: str,
) -> None:
    seed = in_channels * 100 + kernel * 10 + dilation
    weight = randn(out_channels, in_channels, kernel, seed=seed)
    offset = randn(out_channels, seed=seed + 1) if bias else None
    x = randn(batch, in_channels, (kernel - 1) * dilation + steps, seed=seed + 2)
    if layout == "channel-major":
        x = channel_major(x)
    got = conv1d_as_gemm(x, weight, offset, dilation)
    expected = F.conv1d(x, weight, offset, dilation=dilation)
    assert got.shape == expected.shape == (batch, out_channels, steps)
    torch.testing.assert_close(got, expected, rtol=EXACT, atol=EXACT)
    assert is_channel_major(got)
    context = (kernel - 1) * dilation
    if context:  # the context as a separate history, never concatenated with the new samples
        split = conv1d_as_gemm(x[..., context:], weight, offset, dilation, history=x[..., :context])
        torch.testing.assert_close(split, expected, rtol=EXACT, atol=EXACT)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("frames", [1, 4, 5])
@pytest.mark.parametrize(
    ("in_channels", "out_channels", "kernel", "stride"),
    [(16, 8, 16, 8), (12, 6, 6, 3), (8, 8, 2, 2), (6, 4, 10, 5)],
)
def test_conv_transpose1d_as_gemm_is_the_transposed_convolution(
    in_channels: int, out_channels: int, kernel: int, stride: int, frames: int, batch: int
) -> None:
    """The GEMM form gives the module's new blocks, also after a dtype conversion re-derives its weights."""
    torch.manual_seed(in_channels + kernel)
    module = CausalConvTranspose1d(in_channels, out_channels, kernel, stride).requires_grad_(False).double()
    x = randn(batch, in_channels, module.context + frames, seed=kernel + frames)
    start = module.context * stride
    expected = module.conv(x)[..., start : start + frames * stride]
    for layout in (x, channel_major(x)):
        got = conv_transpose1d_as_gemm(layout, module.gemm_weight, module.gemm_bias, stride)
        assert got.shape == (batch, out_channels, frames * stride)
        torch.testing.assert_close(got, expected, rtol=EXACT, atol=EXACT)
        assert is_channel_major(got)
        context = module.context
        split = conv_transpose1d_as_gemm(
            layout[..., context:], module.gemm_weight, module.gemm_bias, stride, history=layout[..., :context]
        )
        torch.testing.assert_close(split, expected, rtol=EXACT, atol=EXACT)
    assert module.gemm_weight.dtype == torch.float64


def random_snake(channels: int, seed: int) -> SnakeBeta:
    activation = SnakeBeta(channels).requires_grad_(False).double()
    with torch.no_grad():
        activation.alpha.copy_(randn(channels, seed=seed))
        activation.beta.copy_(randn(channels, seed=seed + 1))
    activation._derive()
    return activation


@pytest.mark.parametrize("steps", [2, 6, 11])
def test_activated_conv_keeps_the_activations_context(steps: int, gemm_path: None) -> None:
    """A conv whose unfold applies SnakeBeta (the activation never written out whole) gives the conv of the
    activation and keeps the same context, packet after packet; inputs shorter than the context (6 samples)
    take the activation first."""
    layer = CausalConv1d(8, 8, kernel_size=7).requires_grad_(False).double()
    layer.state_key = "conv"
    activation, bias = random_snake(8, seed=5), randn(8, seed=7)
    start = randn(2, 8, layer.context, seed=8)
    fused = CodecStreamState(torch.zeros(2), [], {"conv": start})
    plain = CodecStreamState(torch.zeros(2), [], {"conv": start})
    for seed in range(3):
        x = randn(2, 8, steps, seed=10 + seed)
        got = layer(x, fused, activation=activation, activation_bias=bias)
        expected = layer(activation(x, bias), plain)
        torch.testing.assert_close(got, expected, rtol=EXACT, atol=EXACT)
        torch.testing.assert_close(fused.history["conv"], plain.history["conv"], rtol=0, atol=0)


def test_conv_transpose1d_as_gemm_applies_the_snake_to_x_only() -> None:
    """With `snake`, the GEMM transposed conv is that of [history | SnakeBeta(x + bias)], and the activation
    tail is the activation's last samples."""
    module = CausalConvTranspose1d(6, 4, 10, 5).requires_grad_(False).double()
    activation, bias = random_snake(6, seed=20), randn(6, seed=22)
    history, x = randn(3, 6, module.context, seed=23), channel_major(randn(3, 6, 4, seed=24))
    snake = activation.kernel_parameters(bias)
    tail = torch.empty(3, 6, 1, dtype=torch.float64)
    got = conv_transpose1d_as_gemm(x, module.gemm_weight, module.gemm_bias, 5, history, snake, tail)
    activated = activation(x, bias)
    expected = conv_transpose1d_as_gemm(activated, module.gemm_weight, module.gemm_bias, 5, history)
    torch.testing.assert_close(got, expected, rtol=EXACT, atol=EXACT)
    torch.testing.assert_close(tail, activated[..., -1:], rtol=0, atol=0)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("steps", [1, 7])
def test_pointwise_residual_as_gemm_is_conv_plus_residual(batch: int, steps: int) -> None:
    """The sum without the conv's bias; a channel-major residual is accumulated into in place."""
    weight = randn(12, 12, 1, seed=1)
    h, residual = randn(batch, 12, steps, seed=3), randn(batch, 12, steps, seed=4)
    expected = residual + F.conv1d(h, weight)
    for layout in (lambda t: t.clone(), channel_major):
        given = layout(residual)
        got = pointwise_residual_as_gemm(layout(h), given, weight[..., 0])
        torch.testing.assert_close(got, expected, rtol=EXACT, atol=EXACT)
        assert is_channel_major(got)
        if is_channel_major(given):
            assert got.data_ptr() == given.data_ptr()


@pytest.fixture
def gemm_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the CUDA formulation (GEMM convs, channel-major activations) on CPU tensors."""
    monkeypatch.setattr(codec, "_gemm_path", lambda x: True)


@pytest.fixture(scope="module")
def decoder64(tiny_voice_design_config: VoiceDesignConfig) -> SpeechDecoder:
    config = tiny_voice_design_config.speech_decoder
    tensors = {name: t.double() for name, t in random_tensors(config, seed=3).items()}
    return SpeechDecoder.from_tensors(config, tensors)


@pytest.fixture(scope="module")
def codes() -> Tensor:
    return torch.randint(0, 2048, (3, 16, 24), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def cpu_path(decoder64: SpeechDecoder, codes: Tensor) -> Tensor:
    return decoder64.decode(codes, clamp=False)


def test_decoder_on_the_gemm_path_equals_the_cpu_path(
    decoder64: SpeechDecoder, codes: Tensor, cpu_path: Tensor, gemm_path: None
) -> None:
    """Three streams decoded together, one-shot and in packets, through every GEMM form and the
    channel-major SnakeBeta: the same waveform as the CPU path's convolutions."""
    one_shot = decoder64.decode(codes, clamp=False)
    torch.testing.assert_close(one_shot, cpu_path, rtol=EXACT, atol=EXACT)
    state, packets = decoder64.new_stream_state(3), []
    for start, size in ((0, 1), (1, 4), (5, 3), (8, 16)):
        packets.append(decoder64(codes[..., start : start + size], state, clamp=False))
    torch.testing.assert_close(torch.cat(packets, dim=1), cpu_path, rtol=EXACT, atol=EXACT)


def test_causal_conv_derives_the_tap_major_weight_in_bf16_only() -> None:
    """The implicit GEMM's weight [O, K, C] follows the conv's weight through conversions and loads: derived
    for a bf16 conv of one group and several taps, empty otherwise (float32, one tap, grouped), so the exact
    codec and the convs the kernel cannot take carry no second copy."""
    conv = CausalConv1d(12, 20, kernel_size=7, dilation=3).requires_grad_(False)
    assert conv.tap_major_weight.numel() == 0
    conv = conv.to(torch.bfloat16)
    assert conv.tap_major_weight.shape == (20, 7, 12) and conv.tap_major_weight.is_contiguous()
    assert torch.equal(conv.tap_major_weight, conv.conv.weight.permute(0, 2, 1))
    loaded = {name: torch.randn_like(value, dtype=torch.float32) for name, value in conv.state_dict().items()}
    conv.load_state_dict(loaded)
    assert torch.equal(conv.tap_major_weight, loaded["conv.weight"].to(torch.bfloat16).permute(0, 2, 1))
    assert conv.float().tap_major_weight.numel() == 0
    for other in (CausalConv1d(12, 20, kernel_size=1), CausalConv1d(12, 12, kernel_size=7, groups=12)):
        assert other.to(torch.bfloat16).tap_major_weight.numel() == 0

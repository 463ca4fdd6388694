"""The bf16 codec's implicit-GEMM convs (engine/kernels/triton_conv.py over `ops.time_major_samples`)
against the torch reference: its error, its batch and split invariance, the samples it copies; and which
convs `ops.conv_rows` gives it when handed the tap-major weight.

Tolerances:
- conv_rows: relative L2 <= 5e-3 to the float32 conv of the same bf16 operands (`reference.conv_rows` in
  float32: one bf16 rounding of sums in another order), like the unfold-and-GEMM path it replaces.
- Invariance, bit for bit: a stream's steps alone equal the same steps in a batch of 64, and a conv of samples
  split into a history and the rest equals the conv of the whole (a streamed packet is a one-piece decode).
- The samples: the SnakeBeta's last `context` samples (`activation_tail`, the next history) are
  `snake_beta`'s bits, as the unfold path writes them.
"""

from __future__ import annotations

import pytest
import torch

from qwen3_tts_native.engine.kernels import ops, reference
from qwen3_tts_native.engine.model.codec import CausalConv1d, CodecStreamState

BF16 = torch.bfloat16
# (streams, channels, samples, dilation): the decoder blocks' residual convs in a 64-stream 4-frame packet
# (768 channels at 128 samples, 96 at 7680), a one-stream packet, and odd sizes (partial blocks everywhere).
SHAPES = [
    (64, 768, 128, 1),
    (64, 384, 640, 3),
    (64, 192, 2560, 9),
    (64, 96, 7680, 9),
    (1, 96, 1920, 3),
    (3, 40, 13, 3),
    (5, 24, 300, 9),
]


@pytest.fixture(scope="module")
def hopper() -> None:
    """A Hopper GPU, where the engine expects Triton: its absence there is a failure, not a skip."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the Triton convs need a Hopper (sm_90) or later GPU")
    assert ops.triton_conv is not None, "Triton did not import: the codec's convs fall back to the unfold"


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def operands(
    streams: int, channels: int, samples: int, dilation: int, taps: int = 7, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Channel-major x [B, C, T] (the GEMM convs' output layout), its history, a weight and a bias."""
    g = torch.Generator(device="cuda").manual_seed(seed + channels + samples)
    context = (taps - 1) * dilation
    x = torch.randn(channels, streams, samples, generator=g, device="cuda").to(BF16).transpose(0, 1)
    history = torch.randn(streams, channels, context, generator=g, device="cuda").to(BF16)
    weight = (
        torch.randn(channels, channels, taps, generator=g, device="cuda") / (channels * taps) ** 0.5
    ).to(BF16)
    bias = (0.1 * torch.randn(channels, generator=g, device="cuda")).to(BF16)
    return x, history, weight, bias


def tap_major(weight: torch.Tensor) -> torch.Tensor:
    return weight.permute(0, 2, 1).contiguous()


def implicit(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    dilation: int,
    history: torch.Tensor | None = None,
    snake: reference.SnakeBetaParameters | None = None,
    activation_tail: torch.Tensor | None = None,
) -> torch.Tensor:
    """The kernel's conv of [history | x] whatever the grid (`ops.conv_rows` routes small ones elsewhere)."""
    samples = ops.time_major_samples(x, history, snake, activation_tail)
    return ops.triton_conv.conv_rows(samples, tap_major(weight), bias, dilation, x.shape[0])


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("streams,channels,samples,dilation", SHAPES)
def test_conv_rows_is_the_conv(
    hopper: None, with_bias: bool, streams: int, channels: int, samples: int, dilation: int
) -> None:
    x, history, weight, bias = operands(streams, channels, samples, dilation)
    b = bias if with_bias else None
    got = implicit(x, weight, b, dilation, history)
    expected = reference.conv_rows(
        x.float(), weight.float(), None if b is None else b.float(), dilation, history.float()
    )
    assert got.shape == (channels, streams * samples) and got.dtype == BF16
    assert rel(got, expected) <= 5e-3
    assert torch.equal(got, implicit(x, weight, b, dilation, history))


@pytest.mark.parametrize("streams,channels,samples,dilation", [SHAPES[1], SHAPES[3], SHAPES[6]])
def test_conv_rows_is_batch_and_split_invariant(
    hopper: None, streams: int, channels: int, samples: int, dilation: int
) -> None:
    """A stream's steps do not depend on the other streams, nor on where the samples were cut into a
    history and the rest: the same bits either way."""
    x, history, weight, bias = operands(streams, channels, samples, dilation, seed=1)
    weights = (weight, bias, dilation)
    whole = implicit(x, *weights, history)
    per_stream = whole.view(channels, streams, samples)
    last = streams - 1
    alone = implicit(x[last:], *weights, history[last:])
    assert torch.equal(alone, per_stream[:, last])
    context = history.shape[-1]
    samples_whole = torch.cat([history, x], dim=-1)
    for cut in sorted({context + ops.triton_conv.MIN_STEPS, context + samples // 2}):
        first = implicit(samples_whole[..., :cut], *weights).view(channels, streams, -1)
        rest = implicit(samples_whole[..., cut:], *weights, samples_whole[..., cut - context : cut])
        assert torch.equal(torch.cat([first, rest.view(channels, streams, -1)], dim=-1), per_stream)


@pytest.mark.parametrize("streams,channels,samples,dilation", [SHAPES[0], SHAPES[3], SHAPES[6]])
def test_conv_rows_with_snake_fills_the_activation_tail(
    hopper: None, streams: int, channels: int, samples: int, dilation: int
) -> None:
    """The SnakeBeta before a residual unit's conv: applied to x (not the history) on its way to the
    samples, its last `context` samples written to `activation_tail`, bit for bit `snake_beta`'s."""
    x, history, weight, bias = operands(streams, channels, samples, dilation, seed=2)
    frequency = (0.3 * torch.randn(channels, device="cuda")).exp().to(BF16)
    inverse_beta = (1.0 / ((0.3 * torch.randn(channels, device="cuda")).exp() + 1e-9)).to(BF16)
    snake_bias = (0.1 * torch.randn(channels, device="cuda")).to(BF16)
    snake = reference.SnakeBetaParameters(frequency, inverse_beta, snake_bias)
    context = history.shape[-1]
    tail = torch.full((streams, channels, context), float("nan"), device="cuda").to(BF16)
    got = implicit(x, weight, bias, dilation, history, snake, tail)
    activated = ops.snake_beta(x, frequency, inverse_beta, snake_bias)
    assert torch.equal(tail, activated[..., samples - context :])
    assert torch.equal(got, implicit(activated, weight, bias, dilation, history))
    expected = reference.conv_rows(activated.float(), weight.float(), bias.float(), dilation, history.float())
    assert rel(got, expected) <= 5e-3


def test_conv_rows_of_few_steps_stays_on_the_unfold(hopper: None) -> None:
    """Below `MIN_STEPS` steps a stream (a one-frame packet's first stage), the unfold and cuBLAS's product,
    bit for bit, though the tap-major weight is given."""
    x, history, weight, bias = operands(4, 768, 32, 1, seed=4)
    got = ops.conv_rows(x, weight, bias, 1, history, tap_major_weight=tap_major(weight))
    expected = reference.product_of_columns(weight, bias, ops.unfold_columns(x, 7, 1, history))
    assert torch.equal(got, expected)


@pytest.mark.parametrize("streams,channels,samples", [(1, 768, 128), (1, 96, 7680), (16, 768, 128)])
def test_conv_rows_of_a_small_grid_stays_on_the_unfold(
    hopper: None, streams: int, channels: int, samples: int
) -> None:
    """A grid of fewer blocks than multiprocessors (a one-stream packet's convs, the 16-stream packet's
    768-channel one) goes to the unfold and cuBLAS's product, bit for bit, though the tap-major weight is
    given."""
    x, history, weight, bias = operands(streams, channels, samples, 1, seed=5)
    blocks = ops.triton_conv.grid_blocks(channels, samples, streams)
    assert blocks < torch.cuda.get_device_properties(0).multi_processor_count
    got = ops.conv_rows(x, weight, bias, 1, history, tap_major_weight=tap_major(weight))
    expected = reference.product_of_columns(weight, bias, ops.unfold_columns(x, 7, 1, history))
    assert torch.equal(got, expected)


def test_conv_rows_of_a_full_grid_takes_the_kernel(hopper: None) -> None:
    """The 64-stream packet's 96-channel conv (7,680 blocks): the kernel's bits."""
    x, history, weight, bias = operands(*SHAPES[3], seed=6)
    got = ops.conv_rows(x, weight, bias, SHAPES[3][3], history, tap_major_weight=tap_major(weight))
    assert torch.equal(got, implicit(x, weight, bias, SHAPES[3][3], history))


def test_the_bf16_codec_conv_takes_the_implicit_gemm(hopper: None) -> None:
    """A residual unit's conv derives its tap-major weight in bf16 (none in float32) and, fed a packet with
    its history, gives the implicit GEMM's bits (`triton_conv.conv_rows` over the time-major samples) and
    keeps the packet's last samples as the next history."""
    layer = CausalConv1d(96, 96, kernel_size=7, dilation=3).requires_grad_(False).cuda()
    assert layer.tap_major_weight.numel() == 0
    layer = layer.to(BF16)
    assert torch.equal(layer.tap_major_weight, layer.conv.weight.permute(0, 2, 1))
    layer.state_key = "conv"
    x, history, _, _ = operands(64, 96, 200, 3, seed=3)
    state = CodecStreamState(torch.zeros(64), [], {"conv": history})
    got = layer(x, state)
    samples = torch.cat([history, x], dim=-1).transpose(1, 2).reshape(-1, 96)
    expected = ops.triton_conv.conv_rows(samples, layer.tap_major_weight, layer.conv.bias, 3, 64)
    assert torch.equal(got, expected.view(96, 64, 200).transpose(0, 1))
    assert torch.equal(state.history["conv"], x[..., 200 - layer.context :])

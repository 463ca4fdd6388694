"""Programmatic dependent launch (every kernel may start while its predecessor finishes, csrc/launch.cuh)
must never change a result: the extension's kernels, and the Triton kernels launched between them
(kernels/triton_dependent.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from qwen3_tts_native.engine.kernels import ops, reference

BF16 = torch.bfloat16


def _chain(x: Tensor, weights: list[Tensor], down: Tensor, norm: Tensor) -> Tensor:
    """A decoder-like chain where every kernel reads what the previous one wrote and overwrites a buffer
    the previous one read (the residual), the two hazards dependent launch must respect. Every other step
    norms inside the gate/up GEMV (ops.rms_norm_linear: weights loaded before the wait, the input normed in
    shared memory, the next residual written by block 0 and read by the kernels after it)."""
    residual, delta = x.clone(), torch.zeros_like(x)
    for index, weight in enumerate(weights):
        if index % 2:
            mlp, residual = ops.rms_norm_linear(residual, norm, 1e-6, weight, delta=delta, swiglu=True)
        else:
            gate_up = ops.linear(ops.add_rms_norm_(delta, residual, norm, 1e-6), weight)
            half = gate_up.shape[1] // 2
            mlp = ops.silu_mul(gate_up[:, :half], gate_up[:, half:])
        delta = ops.linear(mlp, down)
    return ops.add_rms_norm_(delta, residual, norm, 1e-6)


def _equal_in_graph_and_plain(chain: Callable[[Tensor], Tensor], x: Tensor, replays: int = 20) -> None:
    """`chain` replayed from a graph captured with dependent launch gives the bits of its plain launches, and
    so does an eager run with dependent launch."""
    ops.set_dependent_launch(False)
    try:
        expected = chain(x)
    finally:
        ops.set_dependent_launch(True)
    static_x = x.clone()
    chain(static_x)  # warm-up outside capture: Triton compiles its dependently launched kernels here
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain(static_x)
    for _ in range(replays):
        graph.replay()
        assert torch.equal(out, expected)
    assert torch.equal(chain(x), expected)


def test_graph_with_dependent_launch_equals_plain_launches(ext) -> None:  # type: ignore[no-untyped-def]
    hidden = 2048
    weights = [(torch.randn(2 * hidden, hidden, device="cuda") / hidden**0.5).to(BF16) for _ in range(40)]
    down = (torch.randn(hidden, hidden, device="cuda") / hidden**0.5).to(BF16)
    norm = (1 + 0.1 * torch.randn(hidden, device="cuda")).to(BF16)
    x = torch.randn(1, hidden, device="cuda", dtype=BF16)
    _equal_in_graph_and_plain(lambda rows: _chain(rows, weights, down, norm), x)


@pytest.fixture
def hopper_triton(ext) -> None:  # type: ignore[no-untyped-def]
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the Triton products and conv need a Hopper (sm_90) or later GPU")
    assert ops.triton_products is not None, "Triton did not import"
    assert ops.dependent_launch(), "the Triton kernels would be launched plainly on this Hopper GPU"


def test_triton_products_between_the_extensions_kernels(hopper_triton: None) -> None:
    """The 64-row MLP chain of a frame: the extension's RMSNorm, Triton's gate/up and split products, the
    add-RMSNorm that adds their sums into the residual the next layer reads; the last down product added by
    Triton's reduce kernel, right after its split kernel."""
    hidden, intermediate = 2048, 6144
    g = torch.Generator(device="cuda").manual_seed(11)
    gate_ups = [
        (torch.randn(2 * intermediate, hidden, generator=g, device="cuda") / hidden**0.5).to(BF16)
        for _ in range(6)
    ]
    downs = [
        (torch.randn(hidden, intermediate, generator=g, device="cuda") / intermediate**0.5).to(BF16)
        for _ in range(6)
    ]
    norm = (1 + 0.1 * torch.randn(hidden, generator=g, device="cuda")).to(BF16)

    def chain(x: Tensor) -> Tensor:
        residual = x.clone()
        normed = ops.rms_norm(residual, norm, 1e-6)
        for gate_up, down in zip(gate_ups[:-1], downs[:-1], strict=True):
            delta = ops.triton_linear_split_sums(ops.triton_linear_swiglu(normed, gate_up), down)
            normed = ops.add_rms_norm_(delta, residual, norm, 1e-6)
        return ops.triton_linear(ops.triton_linear_swiglu(normed, gate_ups[-1]), downs[-1])

    x = torch.randn(64, hidden, generator=g, device="cuda").to(BF16)
    assert ops.triton_linear_suits(x, gate_ups[0], swiglu=True)
    assert ops.triton_linear_suits(torch.empty(64, intermediate, device="cuda", dtype=BF16), downs[0])
    _equal_in_graph_and_plain(chain, x)


def test_triton_conv_between_the_extensions_kernels(hopper_triton: None) -> None:
    """The codec's residual convs: the extension's time-major samples (SnakeBeta applied) then Triton's conv,
    which reads them, five times over, each conv's output the next one's input."""
    streams, channels, steps, taps = 64, 96, 512, 7
    g = torch.Generator(device="cuda").manual_seed(12)
    weights = [
        (torch.randn(channels, channels, taps, generator=g, device="cuda") / (channels * taps) ** 0.5).to(
            BF16
        )
        for _ in range(5)
    ]
    tap_major = [w.permute(0, 2, 1).contiguous() for w in weights]
    bias = (0.1 * torch.randn(channels, generator=g, device="cuda")).to(BF16)
    snake = reference.SnakeBetaParameters(
        (0.5 + torch.rand(channels, generator=g, device="cuda")).to(BF16),
        (0.5 + torch.rand(channels, generator=g, device="cuda")).to(BF16),
    )

    def chain(x: Tensor) -> Tensor:
        for dilation, (weight, tap_major_weight) in zip(
            (1, 3, 9, 1, 3), zip(weights, tap_major, strict=True), strict=True
        ):
            history = x[:, :, : (taps - 1) * dilation].contiguous()
            rows = ops.conv_rows(x, weight, bias, dilation, history, snake, None, tap_major_weight)
            x = rows.view(channels, streams, steps).transpose(0, 1).contiguous()
        return x

    x = torch.randn(streams, channels, steps, generator=g, device="cuda").to(BF16)
    assert ops.triton_conv.suits(x, tap_major[0], bias, steps)
    _equal_in_graph_and_plain(chain, x)

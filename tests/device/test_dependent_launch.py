"""Programmatic dependent launch (every kernel may start while its predecessor finishes, csrc/launch.cuh)
must never change a result."""

from __future__ import annotations

import torch
from torch import Tensor

from qwen3_tts_native.engine.kernels import ops

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


def test_graph_with_dependent_launch_equals_plain_launches(ext) -> None:  # type: ignore[no-untyped-def]
    hidden = 2048
    weights = [(torch.randn(2 * hidden, hidden, device="cuda") / hidden**0.5).to(BF16) for _ in range(40)]
    down = (torch.randn(hidden, hidden, device="cuda") / hidden**0.5).to(BF16)
    norm = (1 + 0.1 * torch.randn(hidden, device="cuda")).to(BF16)
    x = torch.randn(1, hidden, device="cuda", dtype=BF16)
    ops.set_dependent_launch(False)
    try:
        expected = _chain(x, weights, down, norm)
    finally:
        ops.set_dependent_launch(True)
    static_x = x.clone()
    graph = torch.cuda.CUDAGraph()
    _chain(static_x, weights, down, norm)  # warm-up outside capture
    with torch.cuda.graph(graph):
        out = _chain(static_x, weights, down, norm)
    for _ in range(20):
        graph.replay()
        assert torch.equal(out, expected)
    assert torch.equal(_chain(x, weights, down, norm), expected)  # eager, with dependent launch

"""Programmatic dependent launch (every kernel may start while its predecessor finishes, csrc/launch.cuh)
must never change a result."""

from __future__ import annotations

import torch
from torch import Tensor

from qwen3_tts_native.engine.kernels import ops

BF16 = torch.bfloat16


def _chain(x: Tensor, weights: list[Tensor], down: Tensor, norm: Tensor) -> Tensor:
    """A decoder-like chain where every kernel reads what the previous one wrote and overwrites a buffer
    the previous one read (the residual), the two hazards dependent launch must respect; the GEMVs load
    weights before they wait, and the fused o/down GEMV's last block norms what the other blocks wrote."""
    residual = x.clone()
    h = ops.rms_norm(residual, norm, 1e-6)
    for weight in weights:
        gate_up = ops.linear(h, weight)
        half = gate_up.shape[1] // 2
        h = ops.add_rms_norm_(ops.silu_mul(gate_up[:, :half], gate_up[:, half:]), residual, norm, 1e-6)
        h = ops.linear_add_rms_norm_(h, down, residual, norm, 1e-6)
    return h


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

"""Programmatic dependent launch (every kernel may start while its predecessor finishes, csrc/launch.cuh)
must never change a result."""

from __future__ import annotations

import torch

from qwen3_tts_native.engine.kernels import ops

BF16 = torch.bfloat16


def _chain(x: torch.Tensor, weights: list[torch.Tensor], norm: torch.Tensor) -> torch.Tensor:
    """A decoder-like chain where every kernel reads what the previous one wrote and overwrites a buffer
    the previous one read (the residual), the two hazards dependent launch must respect."""
    residual = x.clone()
    h = ops.rms_norm(residual, norm, 1e-6)
    for weight in weights:
        gate_up = ops.linear(h, weight)
        half = gate_up.shape[1] // 2
        h = ops.add_rms_norm_(ops.silu_mul(gate_up[:, :half], gate_up[:, half:]), residual, norm, 1e-6)
    return h


def test_graph_with_dependent_launch_equals_plain_launches(ext) -> None:  # type: ignore[no-untyped-def]
    hidden = 2048
    weights = [(torch.randn(2 * hidden, hidden, device="cuda") / hidden**0.5).to(BF16) for _ in range(40)]
    norm = (1 + 0.1 * torch.randn(hidden, device="cuda")).to(BF16)
    x = torch.randn(1, hidden, device="cuda", dtype=BF16)
    ops.set_dependent_launch(False)
    try:
        expected = _chain(x, weights, norm)
    finally:
        ops.set_dependent_launch(True)
    static_x = x.clone()
    graph = torch.cuda.CUDAGraph()
    _chain(static_x, weights, norm)  # warm-up outside capture
    with torch.cuda.graph(graph):
        out = _chain(static_x, weights, norm)
    for _ in range(20):
        graph.replay()
        assert torch.equal(out, expected)
    assert torch.equal(_chain(x, weights, norm), expected)  # eager, with dependent launch

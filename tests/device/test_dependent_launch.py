"""Launch-shape choices that must never change a result: the GEMV's rows per warp, and programmatic
dependent launch (every kernel may start while its predecessor finishes, csrc/launch.cuh)."""

from __future__ import annotations

import pytest
import torch

from qwen3_tts_native.engine.kernels import ops, reference

BF16 = torch.bfloat16


@pytest.mark.parametrize("kind", ["bf16", "int8", "fp8"])
@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("k,m", [(2048, 12288), (1024, 4096), (6144, 2048), (1024, 1003)])
def test_gemv_rows_per_warp_is_bit_identical(ext, kind: str, n: int, k: int, m: int) -> None:  # type: ignore[no-untyped-def]
    """m = 1003 leaves a partial warp of rows at the end for 2 and 4 rows per warp."""
    x = torch.randn(n, k, device="cuda", dtype=BF16)
    w = (torch.randn(m, k, device="cuda") / k**0.5).to(BF16)
    bias = (0.1 * torch.randn(m, device="cuda")).to(BF16)
    weight = w if kind == "bf16" else reference.quantize_weight(w, kind)
    data = weight if isinstance(weight, torch.Tensor) else weight.data
    scale = None if isinstance(weight, torch.Tensor) else weight.scale
    outputs = []
    for rows_per_warp in (1, 2, 4):
        out = torch.full((n, m), float("nan"), device="cuda", dtype=BF16)
        ext.gemv(out, x, data, scale, bias, rows_per_warp)
        outputs.append(out)
    assert not torch.isnan(outputs[0].float()).any()
    assert torch.equal(outputs[0], outputs[1]) and torch.equal(outputs[0], outputs[2])
    assert torch.equal(outputs[0], ops.linear(x, weight, bias))


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

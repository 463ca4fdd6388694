"""The L2 persisting window (runtime/l2_residency.py, csrc/launch.cuh): the device accepts it on every kernel
launch and in graph capture, it never changes a result, and an accelerated engine plans it over its code
predictor's weights without overcommitting the set-aside (which would make persisting lines thrash)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from qwen3_tts_native.engine.checkpoint import write_random_snapshot
from qwen3_tts_native.engine.kernels import ops
from qwen3_tts_native.engine.runtime import l2_residency
from qwen3_tts_native.engine.runtime.engine import VoiceDesignEngine
from qwen3_tts_native.engine.runtime.graphs import GraphFrameBackend
from qwen3_tts_native.engine.runtime.request import SynthesisRequest

BF16 = torch.bfloat16


def test_device_has_persisting_l2(ext) -> None:  # type: ignore[no-untyped-def]
    limits = ops.l2_persisting_limits()
    assert limits is not None
    l2, set_aside, window = limits
    assert 0 < set_aside <= l2 and window > 0


def test_a_graph_with_the_window_equals_plain_launches(ext) -> None:  # type: ignore[no-untyped-def]
    """Forty GEMVs over weights in one allocation, the window over it: eager and replayed results equal the
    launches without a window, bit for bit, with the L2 set aside and without."""
    hidden = 2048
    arena = torch.empty(40 * hidden * hidden, dtype=BF16, device="cuda").normal_(std=hidden**-0.5)
    weights = list(arena.view(40, hidden, hidden).unbind())
    x = torch.randn(1, hidden, device="cuda", dtype=BF16)

    def chain(h: torch.Tensor) -> torch.Tensor:
        for weight in weights:
            h = ops.linear(h, weight)
            h = h / h.norm()
        return h

    expected = chain(x)
    residency = l2_residency.plan(arena)
    assert residency is not None and residency.hit_ratio * residency.region.numel() <= residency.set_aside + 1
    l2_residency.reserve(residency)
    try:
        static_x = x.clone()
        with l2_residency.stamped(residency):
            assert torch.equal(chain(x), expected)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = chain(static_x)
        for size in (residency.set_aside, 0):
            ops.set_l2_persisting_size(size)
            for _ in range(5):
                graph.replay()
                assert torch.equal(out, expected)
    finally:
        l2_residency.reserve(None)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> VoiceDesignEngine:
    snapshot: Path = tmp_path_factory.mktemp("tiny")
    write_random_snapshot(snapshot, "tiny", 0)
    return VoiceDesignEngine.load(snapshot, device="cuda", dtype=BF16, max_sessions=2)


def test_an_accelerated_engine_keeps_part_of_its_predictor_in_l2(engine: VoiceDesignEngine) -> None:
    backend = engine.frame_backend
    assert isinstance(backend, GraphFrameBackend)
    residency = backend.residency
    assert residency is not None
    weights = backend.frame.predictor_weights
    assert residency.region.data_ptr() == weights.data_ptr()
    assert residency.region.numel() <= weights.numel()
    assert 0 < residency.hit_ratio <= 1
    assert residency.hit_ratio * residency.region.numel() <= residency.set_aside + 1
    request = SynthesisRequest("A short sentence.", "A calm voice.", seed=3, max_frames=24)
    with_l2 = engine.generate_codes(request)
    ops.set_l2_persisting_size(0)
    try:
        assert torch.equal(engine.generate_codes(request), with_l2)
    finally:
        l2_residency.reserve(residency)

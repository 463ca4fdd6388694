"""Server test fixtures: a tiny random checkpoint, an offline reference engine, long-lived servers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from server_harness import OfflinePcm, ServerProcess

from qwen3_tts_native.engine.checkpoint import write_random_snapshot
from qwen3_tts_native.engine.runtime.engine import VoiceDesignEngine
from qwen3_tts_native.engine.runtime.request import SynthesisRequest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_snapshot(tmp_path_factory.mktemp("model") / "tiny", "tiny", 7)


@pytest.fixture(scope="session")
def reference_engine(tiny_model: Path) -> VoiceDesignEngine:
    torch.set_num_threads(1)
    return VoiceDesignEngine.load(tiny_model, max_sessions=2)


@pytest.fixture(scope="session")
def offline_pcm(reference_engine: VoiceDesignEngine) -> OfflinePcm:
    """PCM16 bytes of VoiceDesignEngine.synthesize for a request, solo, cached per request."""
    cache: dict[SynthesisRequest, bytes] = {}

    def compute(request: SynthesisRequest) -> bytes:
        if request not in cache:
            cache[request] = b"".join(p.pcm for p in reference_engine.synthesize(request))
        return cache[request]

    return compute


def _server(model: Path, tmp: pytest.TempPathFactory, **options: str) -> Iterator[ServerProcess]:
    server = ServerProcess.launch(model, tmp.mktemp("server"), None, **options)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Four slots, short requests: streaming, batching, errors, metrics."""
    yield from _server(tiny_model, tmp_path_factory, max_concurrent_requests="4", max_duration_seconds="3")


@pytest.fixture(scope="session")
def single_slot_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One slot and long requests: capacity, duplicates, cancellation, disconnects, slow clients."""
    yield from _server(
        tiny_model,
        tmp_path_factory,
        max_concurrent_requests="1",
        max_duration_seconds="120",
        slow_client_timeout_s="2",
    )

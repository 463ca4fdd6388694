"""Device tests: run on a CUDA GPU (the lent H200); skipped elsewhere. The full random snapshot is named by
QWEN3_TTS_DEVICE_SNAPSHOT (benchmarks/device/run_all.sh makes it); tests that need it skip without it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "tests/device" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.device)
            if not torch.cuda.is_available():
                item.add_marker(skip)


@pytest.fixture(scope="session")
def ext():  # type: ignore[no-untyped-def]
    from qwen3_tts_native.engine.kernels import loader

    module = loader.load()
    if module is None:
        pytest.fail(f"the CUDA extension did not build: {loader.load_error()}")
    return module


@pytest.fixture(scope="session")
def device_snapshot() -> Path:
    value = os.environ.get("QWEN3_TTS_DEVICE_SNAPSHOT")
    if not value:
        pytest.skip("QWEN3_TTS_DEVICE_SNAPSHOT is not set")
    return Path(value)


@pytest.fixture(scope="session")
def report_dir() -> Path:
    path = Path(os.environ.get("QWEN3_TTS_REPORT_DIR", "benchmarks/results"))
    path.mkdir(parents=True, exist_ok=True)
    return path

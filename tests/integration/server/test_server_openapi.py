"""The served OpenAPI document: closed objects, in step with the request models, and honoured by the server.

schemathesis generates valid and invalid requests from the document (bounded, fixed seed) and checks every
response against it: no 5xx, documented status codes, content types, headers and bodies.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_harness import ServerProcess

from qwen3_tts_native.engine.server.payloads import (
    OpenAISpeechBody,
    PredictorSamplingBody,
    SamplingBody,
    VoiceDesignSpeechBody,
)

pytestmark = pytest.mark.integration

SCHEMATHESIS_CONFIG = """
[checks.negative_data_rejection]
expected-statuses = [400, 404, 409, 413, 415, 422, 429]
"""


@pytest.fixture(scope="module")
def fuzz_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Very short requests so that generated valid bodies are cheap to serve."""
    server = ServerProcess.launch(
        tiny_model, tmp_path_factory.mktemp("fuzz"), max_concurrent_requests="2", max_duration_seconds="0.4"
    )
    try:
        yield server
    finally:
        server.stop()


def _objects(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        if node.get("type") == "object" or "properties" in node:
            yield node
        for value in node.values():
            yield from _objects(value)
    elif isinstance(node, list):
        for value in node:
            yield from _objects(value)


def test_document_is_closed_and_matches_request_models(server: ServerProcess) -> None:
    document = httpx.get(f"{server.url}/openapi.json", timeout=10).json()
    assert document["openapi"] == "3.1.0"
    objects = list(_objects(document))
    assert objects and all(schema.get("additionalProperties") is False for schema in objects)
    schemas = document["components"]["schemas"]
    for name, model in (
        ("VoiceDesignSpeechRequest", VoiceDesignSpeechBody),
        ("OpenAISpeechRequest", OpenAISpeechBody),
        ("Sampling", SamplingBody),
        ("PredictorSampling", PredictorSamplingBody),
    ):
        assert set(schemas[name]["properties"]) == set(model.model_fields), name
        required = {field for field, info in model.model_fields.items() if info.is_required()}
        assert set(schemas[name].get("required", [])) == required, name
    assert schemas["VoiceDesignSpeechRequest"]["properties"]["max_duration_seconds"]["maximum"] == 3.0


def test_schemathesis_finds_no_violation(fuzz_server: ServerProcess, tmp_path: Path) -> None:
    config = tmp_path / "schemathesis.toml"
    config.write_text(SCHEMATHESIS_CONFIG)
    command = [
        sys.executable, "-m", "schemathesis.cli", "--config-file", str(config),
        "run", f"{fuzz_server.url}/openapi.json",
        "--checks", "all",
        "--exclude-checks",
        "positive_data_acceptance,ignored_auth,use_after_free,ensure_resource_availability,object_level_authorization",
        "--phases", "coverage,fuzzing",
        "--max-examples", "25",
        "--seed", "1",
        "--workers", "1",
        "--request-timeout", "60",
        "--no-color",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)  # its cache
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert httpx.get(f"{fuzz_server.url}/health/ready", timeout=5).status_code == 200

"""Our schema for evidence 1.0-1.2 accepts exactly what the seed's v1.2 reference schema accepts.

Both schemas judge hand-built valid documents of every kind (1.2 production, 1.2 fixture, 1.0/1.1 fixtures
with legacy and modern shapes), targeted invalid mutations, and hypothesis-generated random mutations; the
verdicts must agree on every one. The reference is read from shared/ (tests only; never shipped)."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema.protocols import Validator

from qwen3_tts_native.evidence.validate import load_schema, record_validator

ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("QWEN3_TTS_SHARED", ROOT.parent / "shared"))
REFERENCE = SHARED / "reference/evidence/evidence.schema.v1.2.json"
H = "ab" * 32
DIGEST = "sha256:" + "cd" * 32
FORMAT = jsonschema.Draft202012Validator.FORMAT_CHECKER


@pytest.fixture(scope="module")
def reference() -> jsonschema.Draft202012Validator:
    if not REFERENCE.is_file():
        pytest.skip(f"shared reference {REFERENCE} is not beside the repository")
    return jsonschema.Draft202012Validator(json.loads(REFERENCE.read_text()), format_checker=FORMAT)


@pytest.fixture(scope="module")
def ours() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(load_schema("evidence.schema.v1.json"), format_checker=FORMAT)


def common() -> dict[str, Any]:
    return {
        "report": {
            "benchmark_id": "native-vs-sglang-01",
            "title": "A benchmark of two engines",
            "generated_at": "2026-07-01T10:00:00Z",
            "authors": ["Ada"],
        },
        "system": {
            "host_model": "NVIDIA DGX Spark",
            "hostname_alias": "spark",
            "os": "Ubuntu 24.04",
            "kernel": "6.11.0",
            "architecture": "aarch64",
            "cpu": "Grace",
            "accelerator": "GB10",
            "driver_version": "580",
            "cuda_version": "13.0",
            "physical_unified_memory_bytes": 128 * 2**30,
            "power_measurement_source": "nvidia-smi power.draw",
            "notes": ["quiet host"],
        },
        "evidence_files": [
            {
                "role": "workload",
                "path": "workload/workload.jsonl",
                "format": "jsonl",
                "sha256": H,
                "bytes": 10,
            },
            {
                "role": "client_summary",
                "engine_id": "native",
                "profile_id": "B1",
                "round": 1,
                "path": "runs/a/summary.json",
                "format": "json",
                "sha256": H,
                "bytes": 5,
            },
            {
                "role": "raw",
                "engine_id": "sglang",
                "profile_id": "B1",
                "round": 1,
                "path": "runs/b/gpu.csv",
                "format": "csv",
                "sha256": H,
                "bytes": 5,
            },
        ],
        "limitations": ["single host only"],
    }


def modern_implementation(engine: str) -> dict[str, Any]:
    return {
        "id": engine,
        "role": engine,
        "name": f"{engine} engine",
        "version": "0.1.0",
        "source_commit": "1234567",
        "source_url": "https://example.org/src",
        "local_image": {"reference": f"{engine}:latest", "id": DIGEST, "unpacked_size_bytes": 1000},
        "registry_image": {
            "reference": f"ghcr.io/x/{engine}",
            "manifest_digest": DIGEST,
            "compressed_size_bytes": 10,
            "evidence": {"path": "r.json", "sha256": H},
        },
        "model_artifact": {
            "repository": "Qwen/Qwen3-TTS",
            "revision": "5ecdb67",
            "variant": "VoiceDesign",
            "parameter_count": 10,
            "precision": ["BF16"],
            "manifest_sha256": None,
            "weight_files": [
                {"path": "m.safetensors", "sha256": H, "bytes": 5, "parameter_count": 10, "precision": "BF16"}
            ],
            "evidence": {"path": "a.json", "sha256": H},
        },
        "api_protocol": "http multipart",
        "streaming_semantics": "progressive",
        "runtime_components": ["cuda"],
    }


def legacy_implementation(engine: str) -> dict[str, Any]:
    return {
        "id": engine,
        "role": engine,
        "name": f"{engine} engine",
        "version": "0.1",
        "source_commit": "abcdef0",
        "source_url": "https://example.org/x",
        "container_image": "img:1",
        "image_digest": DIGEST,
        "image_size_bytes": 5,
        "startup_ms": 12.5,
        "model_repository": "Qwen/Qwen3-TTS",
        "model_revision": "5ecdb67",
        "model_precision": "BF16",
        "model_manifest_sha256": H,
        "api_protocol": "http",
        "streaming_semantics": "buffered",
        "runtime_components": ["torch"],
        "command_sha256": H,
    }


def methodology(startup: bool) -> dict[str, Any]:
    text = "a definition of ten or more characters"
    document = {
        "clock_source": "monotonic",
        "ttfa_definition": text,
        "rtf_definition": text,
        "throughput_definition": text,
        "memory_definition": text,
        "power_definition": text,
        "energy_definition": text,
        "sampling_interval_ms": 100,
        "run_order": "alternating",
        "statistical_method": text,
        "environment_controls": ["quiet host"],
    }
    if startup:
        document["startup_definition"] = text
    return document


def modern_workload() -> dict[str, Any]:
    return {
        "corpus_sha256": H,
        "ordered_seeds": [42, 43],
        "sample_rate_hz": 24000,
        "channels": 1,
        "sample_format": "pcm_s16le",
        "response_mode": "streaming",
        "warmup_requests_per_run": 24,
        "minimum_measured_requests_per_profile": 200,
        "minimum_rounds_per_subject": 2,
        "profiles": [{"id": "B1", "concurrency": 1, "repetitions_per_request": 20}],
        "language_policy": "as written",
    }


def legacy_workload() -> dict[str, Any]:
    return {
        "corpus_sha256": H,
        "seed": 42,
        "sample_rate_hz": 24000,
        "channels": 1,
        "sample_format": "pcm_s16le",
        "response_mode": "buffered",
        "warmup_requests_per_engine": 2,
        "minimum_measured_requests_per_profile": 5,
        "profiles": [{"id": "B3", "concurrency": 3, "repetitions_per_request": 1}],
        "language_policy": "auto only",
        "voice_description_sha256": H,
        "generation": {"temperature": 0.9, "top_p": 1.0, "top_k": 50, "max_codec_frames": 256},
    }


def run_resource() -> dict[str, Any]:
    return {
        "engine_id": "native",
        "profile_id": "B1",
        "round": 1,
        "process_rss_peak_bytes": 10,
        "gpu_unified_memory_peak_bytes": 10,
        "average_power_w": 20.0,
        "peak_power_w": 30.0,
        "energy_j": 1.5,
        "sampling_interval_ms": 100,
        "competing_cuda_processes": 0,
        "telemetry_evidence_paths": ["runs/b/gpu.csv"],
    }


def valid_documents() -> dict[str, dict[str, Any]]:
    production = {
        "schema_version": "1.2",
        "evidence_kind": "production",
        **common(),
        "model": {"repository": "Qwen/Qwen3-TTS", "revision": "5ecdb67", "variant": "VoiceDesign"},
        "workload": modern_workload(),
        "implementations": [modern_implementation("native"), modern_implementation("sglang")],
        "methodology": methodology(False),
        "run_resources": [run_resource()],
    }
    fixture12 = copy.deepcopy(production)
    fixture12.update(
        evidence_kind="test_fixture", test_fixture_notice="TEST FIXTURE - NOT BENCHMARK EVIDENCE"
    )
    del fixture12["run_resources"]
    del fixture12["implementations"][1]["registry_image"]
    legacy10 = {
        "schema_version": "1.0",
        "evidence_kind": "test_fixture",
        "test_fixture_notice": "TEST FIXTURE - NOT BENCHMARK EVIDENCE",
        **common(),
        "model": {
            "repository": "Qwen/Qwen3-TTS",
            "revision": "5ecdb67",
            "variant": "VoiceDesign",
            "parameter_count": 10,
            "precision": "BF16",
            "manifest_sha256": H,
            "weight_files": [{"path": "m.safetensors", "sha256": H, "bytes": 5}],
        },
        "workload": legacy_workload(),
        "implementations": [legacy_implementation("native"), legacy_implementation("sglang")],
        "methodology": methodology(True),
    }
    modern11 = copy.deepcopy(fixture12)
    modern11["schema_version"] = "1.1"
    mixed11 = copy.deepcopy(legacy10)
    mixed11.update(schema_version="1.1", workload=modern_workload(), run_resources=[run_resource()])
    mixed11["implementations"][1] = modern_implementation("sglang")
    return {
        "production-1.2": production,
        "fixture-1.2": fixture12,
        "fixture-1.0-legacy": legacy10,
        "fixture-1.1-modern": modern11,
        "fixture-1.1-mixed": mixed11,
    }


def _delete(path: list[Any]) -> Callable[[dict[str, Any]], None]:
    def apply(document: dict[str, Any]) -> None:
        target: Any = document
        for part in path[:-1]:
            target = target[part]
        del target[path[-1]]

    return apply


def _set(path: list[Any], value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(document: dict[str, Any]) -> None:
        target: Any = document
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value

    return apply


INVALID = {
    "missing top-level field": ("production-1.2", _delete(["limitations"])),
    "missing nested field": ("production-1.2", _delete(["implementations", 0, "local_image", "id"])),
    "missing run_resources in production": ("production-1.2", _delete(["run_resources"])),
    "missing fixture notice": ("fixture-1.2", _delete(["test_fixture_notice"])),
    "extra top-level field": ("production-1.2", _set(["comment"], "x")),
    "extra nested field": ("fixture-1.0-legacy", _set(["workload", "generation", "seed"], 1)),
    "wrong evidence kind": ("production-1.2", _set(["evidence_kind"], "draft")),
    "wrong engine id": ("production-1.2", _set(["implementations", 0, "id"], "vllm")),
    "wrong file role": ("fixture-1.2", _set(["evidence_files", 0, "role"], "summary")),
    "wrong sample format": ("fixture-1.1-modern", _set(["workload", "sample_format"], "f32")),
    "bad sha256 pattern": ("production-1.2", _set(["workload", "corpus_sha256"], "AB" * 32)),
    "short sha256": ("fixture-1.2", _set(["evidence_files", 0, "sha256"], "ab" * 31)),
    "bad image digest": ("production-1.2", _set(["implementations", 1, "local_image", "id"], H)),
    "production 1.0": ("production-1.2", _set(["schema_version"], "1.0")),
    "production with notice": (
        "production-1.2",
        _set(["test_fixture_notice"], "a notice that is long enough"),
    ),
    "legacy model in 1.2": ("fixture-1.2", _set(["model"], valid_documents()["fixture-1.0-legacy"]["model"])),
    "legacy workload in 1.2": ("fixture-1.2", _set(["workload"], legacy_workload())),
    "one implementation": ("production-1.2", _set(["implementations"], [modern_implementation("native")])),
    "two evidence files": ("fixture-1.2", _set(["evidence_files"], common()["evidence_files"][:2])),
    "bad profile id": ("fixture-1.1-mixed", _set(["workload", "profiles", 0, "id"], "P1")),
    "zero concurrency": ("fixture-1.1-mixed", _set(["workload", "profiles", 0, "concurrency"], 0)),
    "negative energy": ("production-1.2", _set(["run_resources", 0, "energy_j"], -1)),
    "short title": ("production-1.2", _set(["report", "title"], "too short")),
    "schema 2.0": ("fixture-1.2", _set(["schema_version"], "2.0")),
    "duplicate precision": (
        "production-1.2",
        _set(["implementations", 0, "model_artifact", "precision"], ["BF16", "BF16"]),
    ),
}


@pytest.mark.parametrize("name", list(valid_documents()))
def test_valid_documents_are_accepted_by_both(name: str, reference: Validator, ours: Validator) -> None:
    document = valid_documents()[name]
    assert list(reference.iter_errors(document)) == []
    assert list(ours.iter_errors(document)) == []


@pytest.mark.parametrize("name", list(INVALID))
def test_invalid_documents_are_rejected_by_both(name: str, reference: Validator, ours: Validator) -> None:
    base, mutate = INVALID[name]
    document = copy.deepcopy(valid_documents()[base])
    mutate(document)
    assert not reference.is_valid(document)
    assert not ours.is_valid(document)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _paths(child, (*prefix, index))


VALUES: st.SearchStrategy[Any] = st.one_of(
    st.sampled_from(
        [
            None,
            True,
            0,
            -1,
            1,
            2.5,
            "",
            "x",
            "native",
            "sglang",
            "production",
            "test_fixture",
            "1.0",
            "1.1",
            "1.2",
            "B1",
            "B12",
            "streaming",
            "buffered",
            "pcm_s16le",
            "csv",
            "raw",
            H,
            H.upper(),
            DIGEST,
            "2026-07-01T10:00:00Z",
            "a long enough string value",
            [],
            {},
            ["ab"],
            [H],
        ]
    ),
    st.integers(min_value=-3, max_value=10**12),
    st.text(max_size=25),
)


def fresh(draw: st.DrawFn) -> Any:
    """A drawn value copied: VALUES holds mutable lists and dicts, and a later mutation may add to what one
    inserted, which must not change the strategy itself (Hypothesis would see other data on replay)."""
    return copy.deepcopy(draw(VALUES))


@st.composite
def mutated(draw: st.DrawFn) -> dict[str, Any]:
    documents = valid_documents()
    document = copy.deepcopy(documents[draw(st.sampled_from(sorted(documents)))])
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        paths = [p for p in _paths(document) if p]
        path = draw(st.sampled_from(paths))
        parent: Any = document
        for part in path[:-1]:
            parent = parent[part]
        operation = draw(st.sampled_from(["delete", "replace", "add"]))
        if operation == "delete":
            del parent[path[-1]]
        elif operation == "replace":
            parent[path[-1]] = fresh(draw)
        elif isinstance(parent, dict):
            parent[
                draw(
                    st.sampled_from(
                        [
                            "extra",
                            "seed",
                            "startup_definition",
                            "run_resources",
                            "test_fixture_notice",
                            "registry_image",
                        ]
                    )
                )
            ] = fresh(draw)
        else:
            parent.append(fresh(draw))
    return document


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=mutated())
def test_random_mutations_get_the_same_verdict(
    document: dict[str, Any], reference: Validator, ours: Validator
) -> None:
    assert reference.is_valid(document) == ours.is_valid(document)


@st.composite
def measurement_records(draw: st.DrawFn) -> dict[str, Any]:
    success = draw(st.booleans())
    metric = (lambda v: v) if success else (lambda v: None)
    record: dict[str, Any] = {
        "engine_id": "native",
        "request_id": "r-1",
        "profile_id": "B1",
        "repeat": 1,
        "status": "success" if success else "error",
        "http_status": 200 if success else None,
        "ttfa_ms": metric(12.5),
        "total_latency_ms": metric(80.0),
        "audio_duration_ms": metric(400.0),
        "rtf": metric(0.2),
        "packet_count": metric(2),
        "packet_intervals_ms": metric([10.0]),
        "output_bytes": metric(100),
        "process_rss_peak_bytes": 1,
        "gpu_unified_memory_peak_bytes": 1,
        "average_power_w": 1.0,
        "peak_power_w": 1.0,
        "energy_j": 0.0,
        "run_elapsed_start_ms": 0.0,
        "run_elapsed_end_ms": 1.0,
    }
    for _ in range(draw(st.integers(min_value=0, max_value=2))):
        key = draw(st.sampled_from([*sorted(record), "extra"]))
        if draw(st.booleans()) and key in record:
            del record[key]
        else:
            record[key] = fresh(draw)
    return record


@settings(max_examples=300, deadline=None)
@given(record=measurement_records())
def test_legacy_record_contracts_agree(record: dict[str, Any], reference: Validator) -> None:
    theirs = record_validator(reference.schema, "measurement_record")
    mine = record_validator(load_schema("evidence.schema.v1.json"), "legacyMeasurementRecord")
    assert theirs.is_valid(record) == mine.is_valid(record)


def test_v2_schema_is_a_valid_2020_12_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(load_schema("evidence.schema.v2.0.json"))
    jsonschema.Draft202012Validator.check_schema(load_schema("evidence.schema.v1.json"))

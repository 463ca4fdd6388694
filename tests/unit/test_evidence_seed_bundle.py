"""The validator's schema 1.2 path on a seed-format bundle (two engines, ``qwen3-tts-http-bench/v1``
records), built by converting a bundle our client measured against the loopback test double."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from evidence_fakes import FakeServer, build_bundle, read_jsonl, reseal, write_jsonl

from qwen3_tts_native.evidence.bundle import sha256_file
from qwen3_tts_native.evidence.jsonio import canonical_sha256
from qwen3_tts_native.evidence.stats import run_figures
from qwen3_tts_native.evidence.validate import validate_bundle
from qwen3_tts_native.evidence.workload import SEED_SAMPLING_CONTRACT, load_workload, normalized_sampling

H = "ab" * 32
DIGEST = "sha256:" + "cd" * 32
OUR_ONLY = (
    "engine_id",
    "profile_id",
    "round",
    "status",
    "scheduled_offset_ms",
    "start_offset_ms",
    "end_offset_ms",
    "underrun_count",
    "underrun_ms",
)


def _implementation(engine: str) -> dict[str, Any]:
    return {
        "id": engine,
        "role": engine,
        "name": f"{engine} engine",
        "version": "0.1.0",
        "source_commit": "1234567",
        "source_url": "https://example.org/src",
        "local_image": {"reference": f"{engine}:latest", "id": DIGEST, "unpacked_size_bytes": 1000},
        "model_artifact": {
            "repository": "Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign",
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
        "api_protocol": "http",
        "streaming_semantics": "progressive",
        "runtime_components": ["cuda"],
    }


def _convert(ours: Path, out: Path) -> Path:
    """Our 2.0 bundle (engines ours, peer-pcm; profile B3) -> a seed 1.2 fixture (native, sglang)."""
    workload = load_workload(ours / "workload/workload.jsonl")
    out.mkdir()
    shutil.copytree(ours / "workload", out / "workload")
    entries = [
        {
            "role": "workload",
            "path": "workload/workload.jsonl",
            "format": "jsonl",
            "sha256": sha256_file(out / "workload/workload.jsonl"),
            "bytes": (out / "workload/workload.jsonl").stat().st_size,
        }
    ]
    for source, engine, backend in (("ours", "native", "native"), ("peer-pcm", "sglang", "sglang-omni")):
        run = ours / "runs/round-01" / source / "B3"
        target = out / "runs" / engine / "B3"
        target.mkdir(parents=True)
        requests = []
        for record in read_jsonl(run / "requests.jsonl"):
            record = {k: v for k, v in record.items() if k not in OUR_ONLY}
            sampling = normalized_sampling(workload.row_for(record["request_index"]), SEED_SAMPLING_CONTRACT)
            record.update(
                schema_version="qwen3-tts-http-bench/v1",
                backend=backend,
                normalized_sampling=sampling,
                normalized_sampling_sha256=canonical_sha256(sampling),
                response_bytes=record.pop("response_body_bytes"),
            )
            requests.append(record)
        packets = [
            {
                **{k: v for k, v in p.items() if k not in OUR_ONLY},
                "schema_version": "qwen3-tts-http-bench/v1",
                "backend": backend,
            }
            for p in read_jsonl(run / "packets.jsonl")
        ]
        summary = json.loads((run / "summary.json").read_text())
        intervals = [p["inter_arrival_ms"] for p in packets if p["inter_arrival_ms"] is not None]
        figures = run_figures(
            sorted(requests, key=lambda r: r["request_index"]),
            intervals,
            summary["benchmark_wall_seconds"],
            len(requests),
        )
        seed_summary = {
            "schema_version": "qwen3-tts-http-bench/v1",
            "backend": backend,
            "concurrency": "B3",
            "synchronized_batch_width": 3,
            "warmups": 1,
            **figures,
        }
        write_jsonl(target / "requests.jsonl", requests)
        write_jsonl(target / "packets.jsonl", packets)
        (target / "summary.json").write_text(json.dumps(seed_summary, indent=2) + "\n")
        shutil.copy(run / "telemetry.jsonl", target / "telemetry.jsonl")
        for role, name, fmt in (
            ("client_requests", "requests.jsonl", "jsonl"),
            ("client_packets", "packets.jsonl", "jsonl"),
            ("client_summary", "summary.json", "json"),
            ("raw", "telemetry.jsonl", "jsonl"),
        ):
            entries.append(
                {
                    "role": role,
                    "engine_id": engine,
                    "profile_id": "B3",
                    "round": 1,
                    "path": f"runs/{engine}/B3/{name}",
                    "format": fmt,
                    "sha256": "0" * 64,
                    "bytes": 1,
                }
            )
    manifest = {
        "schema_version": "1.2",
        "evidence_kind": "test_fixture",
        "test_fixture_notice": "TEST FIXTURE - NOT BENCHMARK EVIDENCE: converted for tests",
        "report": {
            "benchmark_id": "seed-format",
            "title": "Seed-format conversion",
            "generated_at": "2026-07-01T10:00:00Z",
            "authors": ["tests"],
        },
        "system": {
            "host_model": "test host",
            "hostname_alias": "ci",
            "os": "Linux",
            "kernel": "6.0",
            "architecture": "x86_64",
            "cpu": "cpu",
            "accelerator": "none",
            "driver_version": "n/a",
            "cuda_version": "n/a",
            "physical_unified_memory_bytes": 1,
            "power_measurement_source": "none",
            "notes": [],
        },
        "model": {
            "repository": "Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign",
            "revision": "5ecdb67",
            "variant": "VoiceDesign",
        },
        "workload": {
            "corpus_sha256": workload.sha256,
            "ordered_seeds": workload.ordered_seeds,
            "sample_rate_hz": 24000,
            "channels": 1,
            "sample_format": "pcm_s16le",
            "response_mode": "streaming",
            "warmup_requests_per_run": 1,
            "minimum_measured_requests_per_profile": 4,
            "minimum_rounds_per_subject": 1,
            "profiles": [{"id": "B3", "concurrency": 3, "repetitions_per_request": 1}],
            "language_policy": "as written",
        },
        "implementations": [_implementation("native"), _implementation("sglang")],
        "methodology": {
            "clock_source": "monotonic",
            **{
                k: "a long enough definition"
                for k in (
                    "ttfa_definition",
                    "rtf_definition",
                    "throughput_definition",
                    "memory_definition",
                    "power_definition",
                    "energy_definition",
                    "statistical_method",
                )
            },
            "sampling_interval_ms": 100,
            "run_order": "as given",
            "environment_controls": ["one at a time"],
        },
        "evidence_files": entries,
        "limitations": ["converted test fixture"],
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    reseal(out)
    return out


@pytest.fixture(scope="module")
def seed_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("seed")
    with FakeServer() as server:
        ours = build_bundle(
            server.url,
            work / "ours",
            profiles="B3",
            engines=[
                f"id=ours,url={server.url},api=native",
                f"id=peer-pcm,url={server.url},api=openai,role=baseline",
            ],
        )
    return _convert(ours, work / "seed")


def test_consistent_seed_bundle_validates(seed_bundle: Path) -> None:
    result = validate_bundle(seed_bundle, allow_test_fixture=True)
    assert result.ok, [str(f) for f in result.findings.failures]
    assert result.schema_version == "1.2" and result.runs == 2 and result.requests == 8


def test_seed_bundle_tampering(seed_bundle: Path, tmp_path: Path) -> None:
    copy = tmp_path / "seed"
    shutil.copytree(seed_bundle, copy)
    requests = read_jsonl(copy / "runs/native/B3/requests.jsonl")
    requests[0]["rtf"] *= 2
    write_jsonl(copy / "runs/native/B3/requests.jsonl", requests)
    summary = json.loads((copy / "runs/sglang/B3/summary.json").read_text())
    summary["successful_requests"] += 1
    (copy / "runs/sglang/B3/summary.json").write_text(json.dumps(summary) + "\n")
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["implementations"][1]["model_artifact"]["parameter_count"] = 11
    (copy / "manifest.json").write_text(json.dumps(manifest) + "\n")
    reseal(copy)
    found = validate_bundle(copy, allow_test_fixture=True).findings.checks()
    assert {"rtf.request", "summary.recomputed", "model.artifact"} <= found

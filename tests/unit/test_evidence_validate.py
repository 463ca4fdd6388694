"""A bundle measured against the loopback test double validates; every tampering fails under its check name;
the report renders from it. Forged edits are re-sealed (hashes recomputed) so that the semantic check, not
the hash check, has to catch them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from evidence_fakes import FakeServer, build_bundle, read_jsonl, reseal, run_dirs, write_jsonl

from qwen3_tts_native.cli import main
from qwen3_tts_native.evidence.bundle import bundle_files, pack
from qwen3_tts_native.evidence.resources import reduce_run
from qwen3_tts_native.evidence.validate import validate_bundle


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    with FakeServer() as server:
        return build_bundle(server.url, tmp_path_factory.mktemp("evidence") / "bundle")


@pytest.fixture
def bundle(pristine: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "bundle"
    shutil.copytree(pristine, copy)
    return copy


def checks(path: Path, allow: bool = True) -> set[str]:
    return validate_bundle(path, allow_test_fixture=allow).findings.checks()


def test_pristine_bundle_and_archive_validate(pristine: Path) -> None:
    result = validate_bundle(pristine, allow_test_fixture=True)
    assert result.ok, [str(f) for f in result.findings.failures]
    assert result.schema_version == "2.0" and result.runs == 6 and result.requests == 24
    archive = pristine.with_name(pristine.name + ".tar.zst")
    assert validate_bundle(archive, allow_test_fixture=True).ok
    manifest = json.loads((pristine / "manifest.json").read_text())
    assert [i["role"] for i in manifest["implementations"]] == ["candidate", "baseline", "reference"]
    assert manifest["system"]["gpu_telemetry"] in ("nvml", "unavailable")


def test_cli_exit_codes(pristine: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["evidence", "validate", str(pristine), "--allow-test-fixture"]) == 0
    assert main(["evidence", "validate", str(pristine)]) == 1
    assert "fixture.flag" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["evidence", "validate"])
    assert info.value.code == 2


def test_fixture_needs_the_flag(bundle: Path) -> None:
    assert checks(bundle, allow=False) == {"fixture.flag"}


def _all_files(pristine: Path) -> list[str]:
    return [*bundle_files(pristine), "SHA256SUMS"]


def test_flipped_byte_in_any_file_fails(pristine: Path, tmp_path: Path) -> None:
    for index, name in enumerate(_all_files(pristine)):
        copy = tmp_path / f"b{index}"
        shutil.copytree(pristine, copy)
        data = bytearray((copy / name).read_bytes())
        data[len(data) // 2] ^= 0x01
        (copy / name).write_bytes(bytes(data))
        assert "hash.sums" in checks(copy), name


def test_flipped_byte_in_archive_fails(pristine: Path, tmp_path: Path) -> None:
    archive = pack(pristine, tmp_path / "bundle.tar.zst")
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0x40
    archive.write_bytes(bytes(data))
    found = checks(archive)
    assert found & {"bundle.read", "hash.sums", "manifest.json", "records.schema"}, found


def _edit_requests(bundle: Path, edit: Any) -> Path:
    run = next(run_dirs(bundle))
    records = read_jsonl(run / "requests.jsonl")
    edit(run, records)
    write_jsonl(run / "requests.jsonl", records)
    reseal(bundle)
    return run


def test_removed_request_fails_counts(bundle: Path) -> None:
    def remove(run: Path, records: list[dict[str, Any]]) -> None:
        dropped = records.pop()
        packets = [
            p for p in read_jsonl(run / "packets.jsonl") if p["request_index"] != dropped["request_index"]
        ]
        write_jsonl(run / "packets.jsonl", packets)

    _edit_requests(bundle, remove)
    assert "counts.requests" in checks(bundle)


def test_edited_rtf_fails(bundle: Path) -> None:
    def edit(run: Path, records: list[dict[str, Any]]) -> None:
        records[0]["rtf"] *= 0.5

    _edit_requests(bundle, edit)
    assert "rtf.request" in checks(bundle)


def test_edited_summary_fails(bundle: Path) -> None:
    run = next(run_dirs(bundle))
    summary = json.loads((run / "summary.json").read_text())
    summary["aggregate_rtf"] *= 0.9
    summary["ttfa_ms"]["p95"] -= 1.0
    (run / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    reseal(bundle)
    assert checks(bundle) == {"summary.recomputed"}


def _rewrite_telemetry(bundle: Path, edit: Any) -> Path:
    """Edit one run's samples and forge a matching run resource (manifest too), then re-seal."""
    run = next(run_dirs(bundle))
    samples = read_jsonl(run / "telemetry.jsonl")
    samples = edit(samples)
    write_jsonl(run / "telemetry.jsonl", samples)
    phases = {e["event"]: e["monotonic_ns"] for e in read_jsonl(run / "phase-events.jsonl")}
    resource = json.loads((run / "run-resource.json").read_text())
    resource.update(reduce_run(samples, phases, resource["sampling_interval_ms"]))
    (run / "run-resource.json").write_text(json.dumps(resource, indent=2) + "\n")
    manifest = json.loads((bundle / "manifest.json").read_text())
    key = (resource["engine_id"], resource["profile_id"], resource["round"])
    manifest["run_resources"] = [
        resource if (r["engine_id"], r["profile_id"], r["round"]) == key else r
        for r in manifest["run_resources"]
    ]
    if any(s["gpu"] == "nvml" for s in samples):
        manifest["system"]["gpu_telemetry"] = "nvml"
    (bundle / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    reseal(bundle)
    return run


def test_telemetry_gap_fails(bundle: Path) -> None:
    def drop_middle(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
        middle = len(samples) // 2
        return samples[: middle - 2] + samples[middle + 2 :]

    _rewrite_telemetry(bundle, drop_middle)
    assert "telemetry.continuity" in checks(bundle)


def test_competing_process_fails(bundle: Path) -> None:
    def competing(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for sample in samples:
            target = sample["target_pids"][0]
            sample.update(
                gpu="nvml",
                gpus=[
                    {
                        "index": 0,
                        "uuid": "GPU-test",
                        "power_w": 100.0,
                        "memory_used_bytes": 2**30,
                        "memory_total_bytes": 2**34,
                        "utilization_gpu_percent": 50.0,
                        "utilization_memory_percent": 10.0,
                        "sm_clock_mhz": 1500,
                        "memory_clock_mhz": 2600,
                    }
                ],
                gpu_processes=[{"gpu_index": 0, "pid": target, "used_memory_bytes": 2**29, "target": True}],
            )
        middle = samples[len(samples) // 2]
        middle["gpu_processes"].append(
            {"gpu_index": 0, "pid": 4242, "used_memory_bytes": 2**20, "target": False}
        )
        middle["competing_gpu_processes"] = 1
        return samples

    _rewrite_telemetry(bundle, competing)
    found = checks(bundle)
    assert "telemetry.competing_process" in found
    assert found <= {"telemetry.competing_process", "telemetry.mode"}


def test_every_failure_is_reported(bundle: Path) -> None:
    def edit(run: Path, records: list[dict[str, Any]]) -> None:
        records[0]["rtf"] += 1.0
        records[1]["workload_id"] = "row-99"

    _edit_requests(bundle, edit)
    run = next(run_dirs(bundle))
    (run / "summary.json").write_text(
        (run / "summary.json").read_text().replace('"warmups": 1', '"warmups": 24')
    )
    (bundle / "stray.txt").write_text("not declared\n")
    found = checks(bundle, allow=False)
    assert {"rtf.request", "records.identity", "summary.identity", "hash.sums", "fixture.flag"} <= found


def test_production_claim_enforces_the_protocol(bundle: Path) -> None:
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["evidence_kind"] = "production"
    del manifest["test_fixture_notice"]
    (bundle / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    reseal(bundle)
    result = validate_bundle(bundle)
    assert result.findings.checks() == {"production.protocol"}
    messages = " ".join(f.message for f in result.findings.failures)
    assert "warm-ups" in messages and "rounds" in messages and "successes" in messages


def test_unsupported_version_and_bad_json(bundle: Path) -> None:
    manifest_path = bundle / "manifest.json"
    manifest_path.write_text(
        manifest_path.read_text().replace('"schema_version": "2.0"', '"schema_version": "3.0"')
    )
    assert "manifest.version" in checks(bundle)
    manifest_path.write_text('{"a": 1, "a": 2}')
    assert {"manifest.json", "hash.sums"} <= checks(bundle)
    assert checks(bundle / "missing") == {"bundle.read"}


def test_report_renders(pristine: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    assert (
        main(
            [
                "evidence",
                "report",
                str(pristine.with_name(pristine.name + ".tar.zst")),
                "-o",
                str(out),
                "--allow-test-fixture",
            ]
        )
        == 0
    )
    html = (out / "index.html").read_text()
    images = [part.split('"', 1)[0] for part in html.split('<img src="')[1:]]
    assert len(images) >= 4
    for image in images:
        assert (out / image).is_file() and (out / image).stat().st_size > 0
    assert "ttfa_cdf_B3.png" in html and "TEST FIXTURE" in html
    assert (out / "report.pdf").read_bytes().startswith(b"%PDF")
    assert main(["evidence", "report", str(pristine), "-o", str(tmp_path / "refused")]) == 1

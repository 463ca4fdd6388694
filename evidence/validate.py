"""``evidence validate``: the fail-closed validator for evidence bundles (directory or ``.tar.zst``).

Schema 1.0-1.2 manifests (the seed's two-engine format) are checked against our own JSON Schema, which
accepts exactly what the v1.2 reference accepts; schema 2.0 manifests (ours, N implementations) against
``evidence.schema.v2.0.json``, whose record contracts are also applied to every line of every evidence file.
Then semantic checks recompute everything derived: file hashes, request RTFs, packet continuity,
underruns, summaries, run resources from telemetry; counts per profile, identical workloads across
engines and rounds, telemetry continuity, competing GPU processes, and the production protocol
thresholds. Every failure is reported under a stable check name, not just the first.
"""

from __future__ import annotations

import datetime as dt
import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any

import jsonschema

from .bundle import (
    MANIFEST,
    RUN_FILES,
    SUMS,
    BundleError,
    RunKey,
    bundle_files,
    open_bundle,
    parse_sums,
    sha256_file,
)
from .findings import Findings
from .jsonio import StrictJSONError, iter_jsonl_strict, load_strict, loads_strict
from .run_checks import (
    RunData,
    check_counts,
    check_identity,
    check_packets,
    check_phases,
    check_requests,
    check_summary,
    check_telemetry,
    identity_tuples,
)
from .workload import Workload, WorkloadError, parse_workload

FIXTURE_MARK = "TEST FIXTURE - NOT BENCHMARK EVIDENCE"
V1_SCHEMA = "evidence.schema.v1.json"
V2_SCHEMA = "evidence.schema.v2.0.json"
PRODUCTION = {"warmups": 24, "requests": 200, "rounds": 2, "idle_seconds": 15.0, "interval_ms": 100}
SEED_PRODUCTION_PROFILES = {"B1": 1, "B3": 3, "B6": 6}
_EXTENSIONS = {
    "json": ".json",
    "jsonl": ".jsonl",
    "csv": ".csv",
    "txt": ".txt",
    "log": ".log",
    "stdout": ".stdout",
    "stderr": ".stderr",
}
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")
_RECORD_DEFS = {
    "client_requests": "request_record",
    "client_packets": "packet_record",
    "client_summary": "run_summary",
    "phase_events": "phase_event",
    "telemetry": "telemetry_sample",
    "run_resource": "run_resource",
}


def load_schema(name: str) -> dict[str, Any]:
    """One of the shipped JSON Schemas (package data of ``qwen3_tts_native.schemas``)."""
    text = resources.files("qwen3_tts_native.schemas").joinpath(name).read_text(encoding="utf-8")
    schema: dict[str, Any] = loads_strict(text)
    return schema


def schema_errors(schema: Mapping[str, Any], document: Any) -> list[str]:
    """Every JSON Schema violation, as "path: message" lines (format assertions on)."""
    validator = jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    errors = []
    for error in sorted(validator.iter_errors(document), key=lambda e: list(map(str, e.absolute_path))):
        path = "/".join(str(p) for p in error.absolute_path) or "(root)"
        message = error.message if len(error.message) < 300 else error.message[:300] + "..."
        errors.append(f"{path}: {message}")
    return errors


def record_validator(schema: Mapping[str, Any], definition: str) -> jsonschema.Draft202012Validator:
    """A validator for one record contract of a schema's ``$defs``."""
    return jsonschema.Draft202012Validator(
        {"$schema": schema["$schema"], "$defs": schema["$defs"], "$ref": f"#/$defs/{definition}"},
        format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER,
    )


@dataclass
class ValidationResult:
    """The outcome: failures (empty when the bundle is accepted) and facts worth printing."""

    findings: Findings = field(default_factory=Findings)
    schema_version: str | None = None
    evidence_kind: str | None = None
    runs: int = 0
    requests: int = 0

    @property
    def ok(self) -> bool:
        return self.findings.ok


def _safe_relative(path: str) -> bool:
    pure = PurePosixPath(path)
    return (
        bool(path)
        and not pure.is_absolute()
        and all(p not in ("", ".", "..") for p in pure.parts)
        and pure.as_posix() == path
    )


def check_sums(f: Findings, root: Path, required: bool) -> None:
    """SHA256SUMS must list every other file exactly, with matching digests."""
    sums_path = root / SUMS
    if not sums_path.is_file():
        if required:
            f.fail("hash.sums", "SHA256SUMS is missing")
        return
    try:
        entries = parse_sums(sums_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        f.fail("hash.sums", str(exc), SUMS)
        return
    present = set(bundle_files(root))
    for name in sorted(set(entries) - present):
        f.fail("hash.sums", "listed file is missing", name)
    for name in sorted(present - set(entries)):
        f.fail("hash.sums", "file is not listed in SHA256SUMS", name)
    for name in sorted(set(entries) & present):
        if sha256_file(root / name) != entries[name]:
            f.fail("hash.sums", "SHA-256 differs from SHA256SUMS", name)
    for path in root.rglob("*"):
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            f.fail("hash.sums", "bundle contains a link or special file", path.relative_to(root).as_posix())


def check_evidence_files(f: Findings, root: Path, entries: list[dict[str, Any]]) -> None:
    """Each declared evidence file: a safe relative path to a regular file of the declared size and digest."""
    seen: set[str] = set()
    for entry in entries:
        path = str(entry.get("path", ""))
        if path in seen:
            f.fail("files.layout", "evidence file declared twice", path)
        seen.add(path)
        if not _safe_relative(path):
            f.fail("files.layout", "evidence path is not a normalized relative path", path)
            continue
        target = root / path
        if (
            any(p.is_symlink() for p in [target, *target.parents] if p != root and root in p.parents)
            or not target.is_file()
        ):
            f.fail("files.layout", "evidence file is missing or not a regular file", path)
            continue
        if not path.endswith(_EXTENSIONS.get(str(entry.get("format")), "\0")):
            f.fail("files.layout", f"format {entry.get('format')} does not match the extension", path)
        if target.stat().st_size != entry.get("bytes"):
            f.fail(
                "hash.evidence_file",
                f"size {target.stat().st_size} differs from declared {entry.get('bytes')}",
                path,
            )
        if sha256_file(target) != entry.get("sha256"):
            f.fail("hash.evidence_file", "SHA-256 differs from the manifest", path)


def _load_workload(
    f: Findings, root: Path, manifest: Mapping[str, Any], entries: list[dict[str, Any]]
) -> Workload | None:
    workloads = [e for e in entries if e.get("role") == "workload"]
    if (
        len(workloads) != 1
        or any(k in workloads[0] for k in ("engine_id", "profile_id", "round"))
        or workloads[0].get("format") != "jsonl"
    ):
        f.fail("workload.corpus", "exactly one unscoped JSONL workload file is required")
        return None
    path = root / str(workloads[0]["path"])
    if not path.is_file():
        return None
    try:
        workload = parse_workload(path.read_bytes(), source=str(workloads[0]["path"]))
    except WorkloadError as exc:
        f.fail("workload.corpus", str(exc), str(workloads[0]["path"]))
        return None
    spec = manifest.get("workload", {})
    if workload.sha256 != spec.get("corpus_sha256"):
        f.fail(
            "workload.corpus",
            "workload digest differs from workload.corpus_sha256",
            str(workloads[0]["path"]),
        )
    if "ordered_seeds" in spec and workload.ordered_seeds != spec["ordered_seeds"]:
        f.fail("workload.corpus", "row seeds differ from workload.ordered_seeds")
    if "row_count" in spec and len(workload.rows) != spec["row_count"]:
        f.fail("workload.corpus", "row count differs from workload.row_count")
    return workload


def _read_records(
    f: Findings, root: Path, entry: Mapping[str, Any], validator: jsonschema.Draft202012Validator | None
) -> Any:
    path = str(entry["path"])
    try:
        if entry["format"] == "jsonl":
            records = [r for _, r in iter_jsonl_strict(root / path)]
        else:
            records = load_strict(root / path)
    except (StrictJSONError, OSError) as exc:
        f.fail("records.schema", str(exc), path)
        return None
    if validator is not None:
        for number, record in enumerate(records if isinstance(records, list) else [records], start=1):
            for error in validator.iter_errors(record):
                location = "/".join(str(p) for p in error.absolute_path) or "(record)"
                f.fail("records.schema", f"record {number} {location}: {error.message[:200]}", path)
    return records


def _check_kind(f: Findings, manifest: Mapping[str, Any], allow_test_fixture: bool) -> None:
    if manifest.get("evidence_kind") == "test_fixture":
        if not allow_test_fixture:
            f.fail("fixture.flag", "a test fixture is accepted only with --allow-test-fixture")
        if FIXTURE_MARK not in str(manifest.get("test_fixture_notice", "")):
            f.fail("fixture.notice", f"the fixture notice must contain {FIXTURE_MARK!r}")


def _check_date(f: Findings, manifest: Mapping[str, Any]) -> None:
    value = str(manifest.get("report", {}).get("generated_at", ""))
    try:
        if not _RFC3339.fullmatch(value):
            raise ValueError(value)
        dt.datetime.fromisoformat(value.replace("z", "Z").replace("Z", "+00:00").replace("t", "T"))
    except ValueError:
        f.fail("manifest.schema", f"report.generated_at {value!r} is not an RFC 3339 date-time")


def validate_bundle(path: Path, allow_test_fixture: bool = False) -> ValidationResult:
    """Validate a bundle directory or archive; never raises for bad evidence, only reports it."""
    result = ValidationResult()
    try:
        with open_bundle(path) as root:
            _validate_root(result, root, allow_test_fixture)
    except BundleError as exc:
        result.findings.fail("bundle.read", str(exc))
    return result


def _validate_root(result: ValidationResult, root: Path, allow_test_fixture: bool) -> None:
    f = result.findings
    manifest_path = root / MANIFEST
    if manifest_path.is_symlink() or not manifest_path.is_file():
        f.fail("manifest.json", "manifest.json is missing or not a regular file")
        return
    try:
        manifest = load_strict(manifest_path)
    except StrictJSONError as exc:
        f.fail("manifest.json", str(exc), MANIFEST)
        check_sums(f, root, required=True)
        return
    if not isinstance(manifest, dict):
        f.fail("manifest.json", "the manifest is not a JSON object", MANIFEST)
        return
    version = manifest.get("schema_version")
    result.schema_version = str(version)
    result.evidence_kind = str(manifest.get("evidence_kind"))
    if version in ("1.0", "1.1", "1.2"):
        schema = load_schema(V1_SCHEMA)
    elif version == "2.0":
        schema = load_schema(V2_SCHEMA)
    else:
        f.fail("manifest.version", f"unsupported schema_version {version!r} (supported: 1.0, 1.1, 1.2, 2.0)")
        return
    schema_ok = True
    for error in schema_errors(schema, manifest):
        schema_ok = False
        f.fail("manifest.schema", error, MANIFEST)
    _check_date(f, manifest)
    _check_kind(f, manifest, allow_test_fixture)
    check_sums(f, root, required=version == "2.0")
    if not schema_ok:
        return
    entries: list[dict[str, Any]] = manifest["evidence_files"]
    check_evidence_files(f, root, entries)
    workload = _load_workload(f, root, manifest, entries)
    if version == "2.0":
        _validate_v2(result, root, manifest, schema, entries, workload)
    else:
        _validate_v1(result, root, manifest, entries, workload)


def _run_entries(
    f: Findings, entries: list[dict[str, Any]], roles: tuple[str, ...]
) -> dict[RunKey, dict[str, dict[str, Any]]]:
    runs: dict[RunKey, dict[str, dict[str, Any]]] = defaultdict(dict)
    for entry in entries:
        role = entry.get("role")
        if role not in roles:
            continue
        if not all(k in entry for k in ("engine_id", "profile_id", "round")):
            f.fail("files.layout", f"{role} file without engine, profile and round", str(entry.get("path")))
            continue
        key = RunKey(str(entry["engine_id"]), str(entry["profile_id"]), int(entry["round"]))
        if role in runs[key]:
            f.fail("files.layout", f"two {role} files for {key.path}", str(entry.get("path")))
        runs[key][role] = entry
    for key, files in runs.items():
        missing = sorted(set(roles) - set(files))
        if missing:
            f.fail("files.layout", f"run {key.path} lacks {missing}")
    return runs


def _check_matrix(
    f: Findings,
    runs: Mapping[RunKey, Any],
    engine_ids: list[str],
    profile_ids: list[str],
    minimum_rounds: int,
) -> list[int]:
    """Every engine ran every profile in the same rounds 1..N, N >= the declared minimum."""
    rounds: dict[tuple[str, str], set[int]] = defaultdict(set)
    for key in runs:
        if key.engine_id not in engine_ids:
            f.fail("counts.runs", f"run {key.path} names an undeclared implementation")
        if key.profile_id not in profile_ids:
            f.fail("counts.runs", f"run {key.path} names an undeclared profile")
        rounds[(key.engine_id, key.profile_id)].add(key.round)
    expected: list[int] | None = None
    for engine in engine_ids:
        for profile in profile_ids:
            got = sorted(rounds.get((engine, profile), set()))
            if got != list(range(1, len(got) + 1)) or len(got) < minimum_rounds:
                f.fail(
                    "counts.runs", f"{engine}/{profile}: rounds {got}, need 1..N with N >= {minimum_rounds}"
                )
            if expected is None:
                expected = got
            elif got != expected:
                f.fail("counts.runs", f"{engine}/{profile}: rounds {got} differ from other runs {expected}")
    return expected or []


def _check_identical(f: Findings, loaded: Mapping[RunKey, RunData]) -> None:
    by_profile: dict[str, list[tuple[RunKey, list[tuple[Any, ...]]]]] = defaultdict(list)
    for key, run in sorted(loaded.items(), key=lambda kv: (kv[0].profile_id, kv[0].round, kv[0].engine_id)):
        by_profile[key.profile_id].append((key, identity_tuples(run)))
    for profile, items in by_profile.items():
        reference_key, reference = items[0]
        for key, tuples in items[1:]:
            if tuples != reference:
                f.fail(
                    "workload.identical",
                    f"profile {profile}: {key.path} requests differ from {reference_key.path}",
                )


def _validate_v2(
    result: ValidationResult,
    root: Path,
    manifest: Mapping[str, Any],
    schema: Mapping[str, Any],
    entries: list[dict[str, Any]],
    workload: Workload | None,
) -> None:
    f = result.findings
    implementations = manifest["implementations"]
    engine_ids = [i["id"] for i in implementations]
    if len(set(engine_ids)) != len(engine_ids):
        f.fail("implementations.unique", "implementation ids are not unique")
    profiles = {p["id"]: p for p in manifest["workload"]["profiles"]}
    if len(profiles) != len(manifest["workload"]["profiles"]):
        f.fail("counts.runs", "profile ids are not unique")
    for profile in profiles.values():
        expected_id = f"B{profile['concurrency']}" if profile["load"] == "closed" else None
        if expected_id is not None and profile["id"] != expected_id:
            f.fail("counts.runs", f"profile {profile['id']} must be named {expected_id}")
        if profile["load"] == "open" and float(profile["id"][1:]) != profile["arrival_rate_per_second"]:
            f.fail("counts.runs", f"profile {profile['id']} does not name its arrival rate")
        if profile["measured_requests"] < manifest["workload"]["minimum_measured_requests_per_profile"]:
            f.fail(
                "counts.requests", f"profile {profile['id']} plans fewer requests than the declared minimum"
            )
    runs = _run_entries(f, entries, tuple(RUN_FILES))
    _check_matrix(f, runs, engine_ids, list(profiles), manifest["workload"]["minimum_rounds_per_subject"])
    resources_by_key = {
        RunKey(r["engine_id"], r["profile_id"], r["round"]): r for r in manifest["run_resources"]
    }
    if len(resources_by_key) != len(manifest["run_resources"]) or set(resources_by_key) != set(runs):
        f.fail("resources.recomputed", "run_resources must hold exactly one record per run")
    validators = {role: record_validator(schema, name) for role, name in _RECORD_DEFS.items()}
    implementation_by_id = {i["id"]: i for i in implementations}
    loaded: dict[RunKey, RunData] = {}
    interval = int(manifest["methodology"]["sampling_interval_ms"])
    for key, files in sorted(runs.items(), key=lambda kv: kv[0].path):
        if set(files) != set(RUN_FILES) or workload is None:
            continue
        before = sum(1 for x in f.failures if x.check == "records.schema")
        parsed = {role: _read_records(f, root, files[role], validators[role]) for role in RUN_FILES}
        if any(v is None for v in parsed.values()):
            continue
        schema_clean = before == sum(1 for x in f.failures if x.check == "records.schema")
        for role in RUN_FILES:
            if files[role]["path"] != f"{key.path}/{RUN_FILES[role][0]}":
                f.fail(
                    "files.layout", f"{role} of {key.path} is not at its canonical path", files[role]["path"]
                )
        run = RunData(
            key=key,
            path=key.path,
            requests=list(parsed["client_requests"] or []),
            packets=list(parsed["client_packets"] or []),
            summary=parsed["client_summary"],
            phases=list(parsed["phase_events"] or []),
            telemetry=list(parsed["telemetry"] or []),
            resource=parsed["run_resource"],
        )
        loaded[key] = run
        profile = profiles.get(key.profile_id)
        implementation = implementation_by_id.get(key.engine_id)
        if not schema_clean or profile is None or implementation is None:
            continue
        try:
            _check_run_v2(
                f, run, workload, manifest, profile, implementation, resources_by_key.get(key), interval
            )
        except (KeyError, TypeError, ValueError) as exc:
            f.fail("records.schema", f"records cannot be checked: {type(exc).__name__}: {exc}", key.path)
        result.runs += 1
        result.requests += len(run.requests)
    _check_identical(f, loaded)
    if manifest["evidence_kind"] == "production":
        _check_production_v2(f, manifest, loaded)


def _check_run_v2(
    f: Findings,
    run: RunData,
    workload: Workload,
    manifest: Mapping[str, Any],
    profile: Mapping[str, Any],
    implementation: Mapping[str, Any],
    stored: Mapping[str, Any] | None,
    interval: int,
) -> None:
    key = run.key
    planned = int(profile["measured_requests"])
    check_identity(f, run, workload)
    check_counts(f, run, planned)
    check_requests(f, run)
    intervals = check_packets(f, run)
    times = check_phases(f, run)
    wall = (times["measured_end"] - times["measured_start"]) / 1e9 if times else None
    meta = {
        "engine_id": key.engine_id,
        "profile_id": key.profile_id,
        "round": key.round,
        "endpoint": implementation["endpoint"],
        "backend": implementation["api"],
        "load": profile["load"],
        "concurrency": profile["concurrency"],
        "closed_loop": profile["closed_loop"],
        "arrival_rate_per_second": profile["arrival_rate_per_second"],
        "arrival_seed": manifest["workload"]["arrival_seed"],
        "warmups": manifest["workload"]["warmup_requests_per_run"],
    }
    check_summary(f, run, intervals, planned, wall, meta)
    check_telemetry(f, run, times, interval)
    if run.resource is not None and run.resource.get("gpu") != manifest["system"]["gpu_telemetry"]:
        f.fail("telemetry.mode", "the run's GPU telemetry mode differs from system.gpu_telemetry", key.path)
    if stored is not None and stored != run.resource:
        f.fail(
            "resources.recomputed", "manifest run_resources entry differs from run-resource.json", key.path
        )


def _check_production_v2(f: Findings, manifest: Mapping[str, Any], loaded: Mapping[RunKey, RunData]) -> None:
    workload = manifest["workload"]
    methodology = manifest["methodology"]
    if workload["warmup_requests_per_run"] < PRODUCTION["warmups"]:
        f.fail("production.protocol", f"fewer than {PRODUCTION['warmups']} warm-ups per run")
    if workload["minimum_rounds_per_subject"] < PRODUCTION["rounds"]:
        f.fail("production.protocol", f"fewer than {PRODUCTION['rounds']} rounds")
    if methodology["sampling_interval_ms"] > PRODUCTION["interval_ms"]:
        f.fail("production.protocol", f"telemetry interval above {PRODUCTION['interval_ms']} ms")
    if methodology["idle_baseline_seconds"] < PRODUCTION["idle_seconds"]:
        f.fail("production.protocol", f"idle baseline shorter than {PRODUCTION['idle_seconds']} s")
    if manifest["system"]["gpu_telemetry"] != "nvml":
        f.fail("production.protocol", "production evidence needs GPU telemetry (gpu: unavailable)")
    if manifest["model"]["revision"] == "unpinned":
        f.fail("production.protocol", "the model revision is not pinned")
    for implementation in manifest["implementations"]:
        if implementation["version"] == "unrecorded":
            f.fail("production.protocol", f"implementation {implementation['id']} has no recorded version")
    for key, run in loaded.items():
        successes = [r for r in run.requests if r.get("success")]
        if len(successes) < PRODUCTION["requests"]:
            f.fail(
                "production.protocol",
                f"{key.path}: {len(successes)} successes, need {PRODUCTION['requests']}",
            )
        if any(r.get("sampling_parity_qualifying") is not True for r in run.requests):
            f.fail("production.protocol", f"{key.path}: a request does not qualify for sampling parity")
        if any(r.get("length_limited") is True for r in successes):
            f.fail("production.protocol", f"{key.path}: a success was length-limited, not a natural end")
        resource = run.resource or {}
        if resource.get("target_gpu_process_seen") is not True:
            f.fail("production.protocol", f"{key.path}: the server process was never seen on the GPU")
        if resource.get("idle_seconds", 0) < PRODUCTION["idle_seconds"]:
            f.fail(
                "production.protocol",
                f"{key.path}: idle baseline shorter than {PRODUCTION['idle_seconds']} s",
            )


def _validate_v1(
    result: ValidationResult,
    root: Path,
    manifest: Mapping[str, Any],
    entries: list[dict[str, Any]],
    workload: Workload | None,
) -> None:
    """The seed's rules for two-engine (native, sglang) bundles, client records included where present."""
    f = result.findings
    implementations = manifest["implementations"]
    for implementation in implementations:
        if implementation["id"] != implementation["role"]:
            f.fail(
                "implementations.unique", f"implementation id {implementation['id']} differs from its role"
            )
    if sorted(i["role"] for i in implementations) != ["native", "sglang"]:
        f.fail("implementations.unique", "the implementations must be exactly native and sglang")
    for implementation in implementations:
        artifact = implementation.get("model_artifact")
        if artifact is None:
            continue
        for name in ("repository", "revision", "variant"):
            if artifact[name] != manifest["model"].get(name):
                f.fail(
                    "model.artifact", f"{implementation['id']}: model_artifact.{name} differs from the model"
                )
        precisions = sorted({w["precision"] for w in artifact["weight_files"]})
        if artifact["precision"] != precisions:
            f.fail(
                "model.artifact", f"{implementation['id']}: precision must be the sorted weight precisions"
            )
        if artifact["parameter_count"] != sum(w["parameter_count"] for w in artifact["weight_files"]):
            f.fail("model.artifact", f"{implementation['id']}: parameter_count is not the weight-file sum")
        paths = [w["path"] for w in artifact["weight_files"]]
        if len(set(paths)) != len(paths):
            f.fail("model.artifact", f"{implementation['id']}: weight paths are not unique")
    profiles = {p["id"]: p for p in manifest["workload"]["profiles"]}
    for profile in manifest["workload"]["profiles"]:
        if profile["id"] != f"B{profile['concurrency']}":
            f.fail("counts.runs", f"profile {profile['id']} must equal B<concurrency>")
    if len(profiles) != len(manifest["workload"]["profiles"]):
        f.fail("counts.runs", "profile ids are not unique")
    roles = ("client_summary", "client_requests", "client_packets")
    runs = _run_entries(f, entries, roles)
    for entry in entries:
        scope = [k for k in ("engine_id", "profile_id", "round") if k in entry]
        if entry.get("role") == "raw" and scope and len(scope) != 3:
            f.fail(
                "files.layout",
                "a run-scoped raw file must carry engine, profile and round",
                str(entry["path"]),
            )
    minimum_rounds = int(manifest["workload"].get("minimum_rounds_per_subject", 1))
    _check_matrix(f, runs, ["native", "sglang"], list(profiles), minimum_rounds)
    for resource in manifest.get("run_resources", []):
        if resource["peak_power_w"] < resource["average_power_w"]:
            f.fail("resources.recomputed", "peak power below average power")
        paths = resource["telemetry_evidence_paths"]
        scoped = {e["path"]: e for e in entries if e.get("role") == "raw"}
        for telemetry_path in paths:
            raw = scoped.get(telemetry_path)
            if raw is None or (raw.get("engine_id"), raw.get("profile_id"), raw.get("round")) != (
                resource["engine_id"],
                resource["profile_id"],
                resource["round"],
            ):
                f.fail(
                    "resources.recomputed", f"telemetry path {telemetry_path} is not a raw file of its run"
                )
        if resource["sampling_interval_ms"] != manifest["methodology"]["sampling_interval_ms"]:
            f.fail("resources.recomputed", "sampling_interval_ms differs from the methodology")
        if manifest["evidence_kind"] == "production":
            if resource["competing_cuda_processes"] != 0:
                f.fail("telemetry.competing_process", "competing CUDA processes during a production run")
            if resource["sampling_interval_ms"] > 200:
                f.fail("production.protocol", "telemetry interval above 200 ms")
    loaded: dict[RunKey, RunData] = {}
    for key, files in sorted(runs.items(), key=lambda kv: kv[0].path):
        if set(files) != set(roles) or workload is None:
            continue
        parsed = {role: _read_records(f, root, files[role], None) for role in roles}
        if any(v is None for v in parsed.values()):
            continue
        run = RunData(
            key=key,
            path=str(PurePosixPath(files["client_requests"]["path"]).parent),
            requests=list(parsed["client_requests"] or []),
            packets=list(parsed["client_packets"] or []),
            summary=parsed["client_summary"],
        )
        try:
            check_identity(f, run, workload)
            check_counts(f, run, None)
            check_requests(f, run)
            intervals = check_packets(f, run)
            check_summary(f, run, intervals, len(run.requests), None, {})
        except (KeyError, TypeError, ValueError) as exc:
            f.fail("records.schema", f"client records are malformed: {exc}", run.path)
            continue
        loaded[key] = run
        result.runs += 1
        result.requests += len(run.requests)
    _check_identical(f, loaded)
    if manifest["evidence_kind"] == "production":
        workload_spec = manifest["workload"]
        if workload_spec.get("warmup_requests_per_run", 0) < PRODUCTION["warmups"]:
            f.fail("production.protocol", f"fewer than {PRODUCTION['warmups']} warm-ups per run")
        if workload_spec["minimum_measured_requests_per_profile"] < PRODUCTION["requests"]:
            f.fail(
                "production.protocol", f"fewer than {PRODUCTION['requests']} measured requests per profile"
            )
        if workload_spec.get("minimum_rounds_per_subject", 0) < PRODUCTION["rounds"]:
            f.fail("production.protocol", f"fewer than {PRODUCTION['rounds']} rounds")
        if {p["id"]: p["concurrency"] for p in workload_spec["profiles"]} != SEED_PRODUCTION_PROFILES:
            f.fail("production.protocol", "production profiles must be exactly B1=1, B3=3, B6=6")
        if workload_spec["response_mode"] != "streaming":
            f.fail("production.protocol", "production response_mode must be streaming")

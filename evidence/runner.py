"""``evidence run``: measures engines x profiles x rounds and writes a sealed schema 2.0 bundle.

Order (seed protocol): rounds alternate the engine order (round 1 as given, round 2 reversed, ...) so
that no engine always runs first on a cold or a warm machine. Every run gets its own telemetry file,
idle baseline and warm-ups. The bundle is built in ``<out>.partial`` and renamed only when complete, so
a crash leaves every record measured so far in the partial directory and never a half-sealed bundle.

Engines are either already running (their URLs answer for the whole run) or brought up one at a time by
a ``serve`` hook: a context manager entered around each stretch of consecutive runs of one engine, which
starts its server, yields the live spec (its pid), and stops it on exit, so that no two engines share the
GPU. Server pids are recorded while each engine is measured, not when the manifest is written.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import itertools
import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .adapters import API_NAMES, OPENAI_FIELDS, Adapter, make_adapter
from .bundle import MANIFEST, RUN_FILES, WORKLOAD_PATH, RunKey, pack, sha256_file, write_sums
from .client import CLIENT_SCHEMA, PhaseClock, Profile, RunFiles, RunSpec, check_ready, run_load
from .jsonio import iter_jsonl_strict, jsonl_line, pretty_bytes
from .resources import reduce_run
from .stats import run_figures
from .system import describe_system
from .telemetry import MAXIMUM_GAP_MS, TelemetryConfig, TelemetrySampler, discover_server_pid
from .workload import Workload

FIXTURE_NOTICE = (
    "TEST FIXTURE - NOT BENCHMARK EVIDENCE: a small run for tests and development; "
    "it does not meet the production protocol."
)
ROLES = ("candidate", "baseline", "reference", "variant")
ENGINE_KEYS = frozenset(
    {
        "id",
        "url",
        "api",
        "role",
        "name",
        "version",
        "pid",
        "gpu",
        "path",
        "model",
        "response",
        "commit",
        "source",
        "fields",
    }
)

METHODOLOGY = {
    "clock_source": "client CLOCK_MONOTONIC (time.monotonic_ns), one clock for client and telemetry",
    "ttfa_definition": "from t0, taken immediately before the request is handed to the connection, to the "
    "arrival of the first non-empty decoded PCM payload byte (headers, JSON parts, WAV "
    "headers and framing excluded)",
    "rtf_definition": "request RTF = wall seconds / audio seconds (samples / sample rate); aggregate RTF = "
    "measured window seconds / total successful audio seconds",
    "throughput_definition": "successful requests / measured window seconds; attempted requests / measured "
    "window seconds",
    "memory_definition": "process RSS: peak summed RSS of the server process tree in the measured window; "
    "GPU "
    "memory: peak summed NVML used memory of the server's compute processes (device "
    "memory used where the driver reports no per-process figure)",
    "power_definition": "NVML board power summed over the engine's GPUs; "
    "average is the time-weighted mean over "
    "the measured window",
    "energy_definition": "trapezoidal integral of board power over the measured window (edges interpolated) "
    "minus idle-baseline mean watts x window seconds, floored at 0",
    "underrun_definition": "playback starts at the first audio arrival and plays received audio in real "
    "time; "
    "a packet arriving after all earlier audio has finished playing is an underrun, "
    "and playback stalls until it arrives",
    "run_order": "rounds alternate the engine order (odd rounds as given, even rounds reversed); profiles in "
    "the order given",
    "statistical_method": "percentiles by linear interpolation at (n-1)q over successful requests; failed "
    "requests count toward reliability only",
}


@dataclass(frozen=True)
class EngineSpec:
    """One implementation under test, from ``--engine id=...,url=...[,key=value...]``."""

    id: str
    url: str
    api: str = "native"
    role: str = "candidate"
    name: str | None = None
    version: str = "unrecorded"
    pid: int | None = None
    gpus: tuple[int, ...] | None = None
    path: str | None = None
    model: str | None = None
    response: str | None = None
    commit: str | None = None
    source: str | None = None
    fields: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> EngineSpec:
        fields: dict[str, str] = {}
        for item in text.split(","):
            key, sep, value = item.partition("=")
            key = key.strip()
            if not sep or key not in ENGINE_KEYS or key in fields or not value.strip():
                raise ValueError(
                    f"engine spec item {item!r}: expected one of {sorted(ENGINE_KEYS)} as key=value"
                )
            fields[key] = value.strip()
        if "id" not in fields or "url" not in fields:
            raise ValueError("an engine spec needs id=... and url=...")
        parts = urlsplit(fields["url"])
        if (
            parts.scheme not in ("http", "https")
            or not parts.netloc
            or parts.path not in ("", "/")
            or parts.query
            or parts.fragment
        ):
            raise ValueError(f"engine url {fields['url']!r} must be http(s)://host:port with no path")
        api = fields.get("api", "native")
        role = fields.get("role", "candidate")
        if api not in API_NAMES:
            raise ValueError(f"engine api must be one of {API_NAMES}")
        if role not in ROLES:
            raise ValueError(f"engine role must be one of {ROLES}")
        if "fields" in fields and not set(fields["fields"].split("+")) <= set(OPENAI_FIELDS):
            raise ValueError(f"engine fields must be '+'-joined names from {OPENAI_FIELDS}")
        spec = cls(
            id=fields["id"],
            url=f"{parts.scheme}://{parts.netloc}",
            api=api,
            role=role,
            name=fields.get("name"),
            version=fields.get("version", "unrecorded"),
            pid=int(fields["pid"]) if "pid" in fields else None,
            gpus=tuple(int(g) for g in fields["gpu"].split("+")) if "gpu" in fields else None,
            path=fields.get("path"),
            model=fields.get("model"),
            response=fields.get("response"),
            commit=fields.get("commit"),
            source=fields.get("source"),
            fields=tuple(fields["fields"].split("+")) if "fields" in fields else (),
        )
        spec.adapter()
        return spec

    def adapter(self) -> Adapter:
        """This engine's API adapter (raises ValueError for an inconsistent spec)."""
        return make_adapter(self.api, self.path, self.model, self.response, self.fields)

    def manifest_notes(self) -> list[str]:
        """The implementation's notes: the given ones plus the forwarded openai fields."""
        notes = list(self.notes)
        if self.fields:
            notes.append(f"openai requests carry the workload fields {', '.join(self.fields)}")
        return notes

    @property
    def response_format(self) -> str:
        if self.api == "native":
            return "multipart"
        if self.api == "wav":
            return "wav"
        return self.response or "pcm"

    def server_pids(self) -> tuple[int, ...]:
        """The given pid, or the listener of a loopback port when this user can see it."""
        if self.pid is not None:
            return (self.pid,)
        parts = urlsplit(self.url)
        host = parts.hostname or ""
        try:
            loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        port = parts.port or (443 if parts.scheme == "https" else 80)
        found = discover_server_pid(port) if loopback else None
        return (found,) if found is not None else ()


@dataclass
class RunOptions:
    """Everything ``evidence run`` was asked to do."""

    engines: list[EngineSpec]
    profiles: list[Profile]
    workload: Workload
    out: Path
    requests: int
    warmups: int
    rounds: int = 1
    idle_seconds: float = 15.0
    interval_ms: int = 100
    timeout_s: float = 600.0
    closed_loop: str = "batch"
    arrival_seed: int = 0
    production: bool = False
    benchmark_id: str = "qwen3-tts-benchmark"
    title: str = "qwen3-tts-native benchmark evidence"
    authors: list[str] = field(default_factory=lambda: ["qwen3-tts-native"])
    hostname_alias: str = "benchmark-host"
    model_repository: str = "Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign"
    model_revision: str = "unpinned"
    model_variant: str = "VoiceDesign"
    limitations: list[str] = field(default_factory=list)
    ready_timeout_s: float = 120.0


ServeHook = Callable[["EngineSpec"], AbstractContextManager["EngineSpec"]]
"""Brings one engine's server up for a stretch of its runs and yields the live spec (with its pid)."""


def run_order(
    engines: Sequence[EngineSpec], profiles: Sequence[Profile], rounds: int
) -> list[tuple[EngineSpec, Profile, int]]:
    """Every run in execution order."""
    order: list[tuple[EngineSpec, Profile, int]] = []
    for round_number in range(1, rounds + 1):
        ordered = list(engines) if round_number % 2 else list(reversed(engines))
        order.extend((engine, profile, round_number) for engine in ordered for profile in profiles)
    return order


def _write_new(path: Path, data: bytes) -> None:
    with path.open("xb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def measure_run(
    options: RunOptions,
    engine: EngineSpec,
    profile: Profile,
    round_number: int,
    root: Path,
    on_request: Callable[[bool], None],
    server_pids: tuple[int, ...],
) -> dict[str, Any]:
    """Run one (engine, profile, round) with telemetry; write its six files; return its run resource."""
    key = RunKey(engine.id, profile.id, round_number)
    run_dir = root / key.path
    run_dir.mkdir(parents=True, exist_ok=False)
    spec = RunSpec(
        engine_id=engine.id,
        base_url=engine.url,
        adapter=engine.adapter(),
        profile=profile,
        round=round_number,
        warmups=options.warmups,
        requests=options.requests,
        timeout_s=options.timeout_s,
        closed_loop=options.closed_loop,
        arrival_seed=options.arrival_seed,
        idle_seconds=options.idle_seconds,
    )
    phases = PhaseClock()
    files = RunFiles(run_dir)
    telemetry = TelemetryConfig(
        path=run_dir / RUN_FILES["telemetry"][0],
        interval_ms=options.interval_ms,
        server_pids=server_pids,
        gpu_indices=engine.gpus,
    )
    try:
        with TelemetrySampler(telemetry):
            asyncio.run(run_load(spec, options.workload, files, phases, on_request))
    finally:
        files.close()
    _write_new(run_dir / RUN_FILES["phase_events"][0], b"".join(jsonl_line(e) for e in phases.events))
    records = [r for _, r in iter_jsonl_strict(run_dir / RUN_FILES["client_requests"][0])]
    records.sort(key=lambda r: int(r["request_index"]))
    successes = {r["request_index"] for r in records if r["success"]}
    intervals = [
        float(p["inter_arrival_ms"])
        for _, p in iter_jsonl_strict(run_dir / RUN_FILES["client_packets"][0])
        if p["request_index"] in successes and p["inter_arrival_ms"] is not None
    ]
    wall_seconds = (phases.time_of("measured_end") - phases.time_of("measured_start")) / 1e9
    summary = {
        "schema_version": CLIENT_SCHEMA,
        "engine_id": engine.id,
        "profile_id": profile.id,
        "round": round_number,
        "endpoint": engine.url,
        "backend": engine.api,
        "load": profile.load,
        "concurrency": profile.concurrency,
        "closed_loop": options.closed_loop if profile.load == "closed" else None,
        "arrival_rate_per_second": profile.arrival_rate_per_second,
        "arrival_seed": options.arrival_seed,
        "warmups": options.warmups,
        "timeout_seconds": options.timeout_s,
        **run_figures(records, intervals, wall_seconds, options.requests),
    }
    _write_new(run_dir / RUN_FILES["client_summary"][0], pretty_bytes(summary))
    samples = [s for _, s in iter_jsonl_strict(run_dir / RUN_FILES["telemetry"][0])]
    resource = {
        "engine_id": engine.id,
        "profile_id": profile.id,
        "round": round_number,
        **reduce_run(samples, {e["event"]: e["monotonic_ns"] for e in phases.events}, options.interval_ms),
        "telemetry_evidence_paths": [f"{key.path}/{RUN_FILES['telemetry'][0]}"],
    }
    _write_new(run_dir / RUN_FILES["run_resource"][0], pretty_bytes(resource))
    return resource


def _evidence_files(root: Path, runs: Sequence[RunKey]) -> list[dict[str, Any]]:
    entries = [
        {
            "role": "workload",
            "path": WORKLOAD_PATH,
            "format": "jsonl",
            "sha256": sha256_file(root / WORKLOAD_PATH),
            "bytes": (root / WORKLOAD_PATH).stat().st_size,
        }
    ]
    for key in runs:
        for role, (name, fmt) in RUN_FILES.items():
            path = root / key.path / name
            entries.append(
                {
                    "role": role,
                    "engine_id": key.engine_id,
                    "profile_id": key.profile_id,
                    "round": key.round,
                    "path": f"{key.path}/{name}",
                    "format": fmt,
                    "sha256": sha256_file(path),
                    "bytes": path.stat().st_size,
                }
            )
    return entries


def build_manifest(
    options: RunOptions,
    root: Path,
    runs: Sequence[RunKey],
    resources: Sequence[dict[str, Any]],
    server_pids: Mapping[str, Sequence[int]],
) -> dict[str, Any]:
    """The schema 2.0 manifest for a finished set of runs (``server_pids``: per engine id, as measured)."""
    system = describe_system(options.hostname_alias)
    limitations = list(options.limitations)
    if system["gpu_telemetry"] == "unavailable":
        limitations.append("gpu: unavailable - GPU memory, power and energy were not measured on this host")
    if not options.production:
        limitations.append("test fixture: too few requests, warm-ups and rounds for a performance claim")
    if not limitations:
        limitations.append("results hold for this host, workload and software versions only")
    manifest: dict[str, Any] = {
        "schema_version": "2.0",
        "evidence_kind": "production" if options.production else "test_fixture",
    }
    if not options.production:
        manifest["test_fixture_notice"] = FIXTURE_NOTICE
    manifest.update(
        {
            "report": {
                "benchmark_id": options.benchmark_id,
                "title": options.title,
                "generated_at": dt.datetime.now(dt.UTC)
                .replace(microsecond=0)
                .isoformat()
                .replace("+00:00", "Z"),
                "authors": options.authors,
            },
            "system": system,
            "model": {
                "repository": options.model_repository,
                "revision": options.model_revision,
                "variant": options.model_variant,
            },
            "workload": {
                "corpus_sha256": options.workload.sha256,
                "row_count": len(options.workload.rows),
                "ordered_seeds": options.workload.ordered_seeds,
                "sample_rate_hz": 24000,
                "channels": 1,
                "sample_format": "pcm_s16le",
                "warmup_requests_per_run": options.warmups,
                "minimum_measured_requests_per_profile": options.requests,
                "minimum_rounds_per_subject": options.rounds,
                "arrival_seed": options.arrival_seed,
                "profiles": [
                    {
                        "id": p.id,
                        "load": p.load,
                        "concurrency": p.concurrency,
                        "closed_loop": options.closed_loop if p.load == "closed" else None,
                        "arrival_rate_per_second": p.arrival_rate_per_second,
                        "measured_requests": options.requests,
                    }
                    for p in options.profiles
                ],
                "language_policy": "each request carries its workload row's language field, unchanged",
            },
            "implementations": [
                {
                    "id": e.id,
                    "role": e.role,
                    "name": e.name or e.id,
                    "version": e.version,
                    "api": e.api,
                    "endpoint": e.url,
                    "request_path": e.adapter().path,
                    "response_format": e.response_format,
                    "streaming_semantics": {
                        "multipart": "progressive multipart PCM packets",
                        "pcm": "raw PCM byte stream",
                        "sse": "server-sent base64 PCM deltas",
                        "wav": "buffered WAV body",
                    }[e.response_format],
                    "server_pids": list(server_pids.get(e.id, ())),
                    "gpu_indices": list(e.gpus) if e.gpus else None,
                    "source_commit": e.commit,
                    "source_url": e.source,
                    "runtime_components": [],
                    "notes": e.manifest_notes(),
                }
                for e in options.engines
            ],
            "methodology": {
                **METHODOLOGY,
                "sampling_interval_ms": options.interval_ms,
                "maximum_telemetry_gap_ms": MAXIMUM_GAP_MS,
                "idle_baseline_seconds": options.idle_seconds,
                "environment_controls": ["one engine measured at a time", "client and servers on one host"],
            },
            "evidence_files": _evidence_files(root, runs),
            "run_resources": list(resources),
            "limitations": limitations,
        }
    )
    return manifest


def execute(
    options: RunOptions,
    on_request: Callable[[bool], None],
    on_run: Callable[[EngineSpec, Profile, int], None],
    serve: ServeHook | None = None,
) -> Path:
    """Measure every run and seal the bundle; returns the bundle directory (raises RunAborted on failure).

    Without ``serve`` every engine must already be up (native-API engines are checked for readiness
    first); with it, each stretch of consecutive runs of one engine runs inside ``serve(engine)``."""
    if options.out.exists():
        raise FileExistsError(f"{options.out} already exists")
    partial = options.out.with_name(options.out.name + ".partial")
    partial.mkdir(parents=True)
    (partial / WORKLOAD_PATH).parent.mkdir()
    _write_new(partial / WORKLOAD_PATH, options.workload.data)

    def ready(engine: EngineSpec) -> None:
        if engine.api == "native":
            asyncio.run(check_ready(engine.url, "/health/ready", options.ready_timeout_s))

    if serve is None:
        for engine in options.engines:
            ready(engine)
    runs: list[RunKey] = []
    resources: list[dict[str, Any]] = []
    pids: dict[str, list[int]] = {}
    order = run_order(options.engines, options.profiles, options.rounds)
    for engine, stretch in itertools.groupby(order, key=lambda item: item[0]):
        with serve(engine) if serve is not None else nullcontext(engine) as live:
            if (live.id, live.url) != (engine.id, engine.url):
                raise ValueError(f"the serve hook changed engine {engine.id}'s id or url")
            if serve is not None:
                ready(live)
            live_pids = live.server_pids()
            pids.setdefault(engine.id, []).extend(p for p in live_pids if p not in pids[engine.id])
            for _, profile, round_number in stretch:
                on_run(live, profile, round_number)
                resources.append(
                    measure_run(options, live, profile, round_number, partial, on_request, live_pids)
                )
                runs.append(RunKey(engine.id, profile.id, round_number))
    manifest = build_manifest(options, partial, runs, resources, pids)
    _write_new(partial / MANIFEST, pretty_bytes(manifest))
    write_sums(partial)
    os.replace(partial, options.out)
    pack(options.out)
    return options.out

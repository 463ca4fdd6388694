"""Semantic checks of one run's raw records: every derived figure is recomputed from what it derives from.

The checks hold for our client's records (schema 2.0 bundles) and, where the fields overlap, for the seed
benchmark client's ``qwen3-tts-http-bench/v1`` records (schema 1.x bundles). Check names:

- ``records.identity``: a record belongs to its run and its workload row (hashes of the text and voice
  description, the normalized sampling object and its hash, language, parity flag recomputed);
- ``counts.requests``: one record per planned request, indices contiguous from 0;
- ``rtf.request``: audio seconds = samples / rate, RTF = wall / audio, TTFA <= wall, success fields;
- ``packets.continuity``: packet count, sequence, offsets, arrival times and payload totals per request;
- ``underrun.request``: playback underruns recomputed from the packet arrivals;
- ``phases.order`` / ``phases.window``: the client's phase events and the request times inside the window;
- ``summary.recomputed`` / ``summary.identity``: the summary follows from the records and the manifest;
- ``telemetry.*`` and ``resources.recomputed``: continuity, competing processes and the run resources.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .bundle import RunKey
from .findings import Findings
from .resources import PHASE_EVENTS, phase_times, reduce_run
from .stats import close, differing_fields, run_figures, underruns
from .workload import (
    SEED_SAMPLING_CONTRACT,
    Workload,
    normalized_sampling,
    normalized_sampling_sha256,
    parity_reasons,
)

SEED_CLIENT_SCHEMA = "qwen3-tts-http-bench/v1"
_KIND_BY_BACKEND = {
    "native": {"native_audio_packet", "wav_data_arrival"},
    "openai": {"raw_pcm_transport_arrival", "wav_data_arrival", "sse_audio_delta"},
    "wav": {"wav_data_arrival"},
    "sglang-omni": {"raw_pcm_transport_arrival"},
}
_SEED_SUMMARY_FIELDS = (
    "planned_requests",
    "completed_requests",
    "successful_requests",
    "failed_requests",
    "natural_eos_requests",
    "length_limited_requests",
    "eos_unknown_requests",
    "sampling_parity_qualifying_requests",
    "sampling_parity_non_qualifying_requests",
    "normalized_sampling_sha256s",
    "attempted_requests_per_second",
    "throughput_requests_per_second",
    "total_audio_seconds",
    "aggregate_rtf",
    "summed_request_wall_rtf",
    "ttfa_ms",
    "wall_ms",
    "request_rtf",
)


@dataclass
class RunData:
    """One run's parsed files (None where the file is absent or did not parse)."""

    key: RunKey
    path: str
    requests: list[dict[str, Any]]
    packets: list[dict[str, Any]]
    summary: dict[str, Any] | None
    phases: list[dict[str, Any]] | None = None
    telemetry: list[dict[str, Any]] | None = None
    resource: dict[str, Any] | None = None

    @property
    def seed_flavor(self) -> bool:
        return any(r.get("schema_version") == SEED_CLIENT_SCHEMA for r in self.requests)


def _status(record: Mapping[str, Any]) -> str:
    failure = record.get("failure")
    if not failure:
        return "success"
    code = str(failure.get("code", ""))
    return "timeout" if "timeout" in code else "cancelled" if "cancel" in code else "error"


def check_identity(f: Findings, run: RunData, workload: Workload) -> None:
    contract = SEED_SAMPLING_CONTRACT if run.seed_flavor else None
    for record in run.requests:
        where = f"{run.path}/requests.jsonl#{record.get('request_index')}"
        if not run.seed_flavor:
            owner = (record.get("engine_id"), record.get("profile_id"), record.get("round"))
            if owner != (run.key.engine_id, run.key.profile_id, run.key.round):
                f.fail("records.identity", f"record belongs to {owner}, not to its run", where)
        index = record.get("request_index")
        if not isinstance(index, int) or index < 0:
            continue
        row = workload.row_for(index)
        expected: dict[str, Any] = {
            "workload_id": row.id,
            "text_sha256": row.text_sha256,
            "voice_description_sha256": row.voice_description_sha256,
            "language": row.language,
        }
        sampling = normalized_sampling(row, contract) if contract else normalized_sampling(row)
        expected["normalized_sampling"] = sampling
        expected["normalized_sampling_sha256"] = normalized_sampling_sha256(sampling)
        for name, value in expected.items():
            if record.get(name) != value:
                f.fail("records.identity", f"{name} does not match workload row {row.id}", where)
        reasons = record.get("sampling_parity_non_qualifying_reasons") or []
        if record.get("sampling_parity_qualifying") is not (not reasons):
            f.fail("records.identity", "sampling_parity_qualifying contradicts its reasons", where)
        missing = [] if run.seed_flavor else [r for r in parity_reasons(row) if r not in reasons]
        if missing:
            f.fail("records.identity", f"parity reasons omit {missing}", where)
        if record.get("backend") in ("native", "wav") and not run.seed_flavor:
            streaming = row.streaming if record.get("backend") == "native" else False
            if record.get("streaming") is not streaming:
                f.fail("records.identity", "streaming flag differs from the request the API sends", where)


def check_counts(f: Findings, run: RunData, planned: int | None) -> None:
    indices = [r.get("request_index") for r in run.requests]
    if sorted(i for i in indices if isinstance(i, int)) != list(range(len(indices))):
        f.fail(
            "counts.requests",
            "request_index values are not unique and contiguous from 0",
            f"{run.path}/requests.jsonl",
        )
    if planned is not None and len(run.requests) != planned:
        f.fail(
            "counts.requests",
            f"{len(run.requests)} request records, {planned} planned",
            f"{run.path}/requests.jsonl",
        )


def check_requests(f: Findings, run: RunData) -> None:
    for record in run.requests:
        where = f"{run.path}/requests.jsonl#{record.get('request_index')}"
        success = record.get("success") is True
        if not run.seed_flavor and record.get("status") != _status(record):
            f.fail("rtf.request", "status does not follow from the failure code", where)
        if not success:
            if record.get("failure") is None:
                f.fail("rtf.request", "a failed request without a failure object", where)
            continue
        try:
            rate = int(record["sample_rate_hz"])
            samples = int(record["samples"])
            wall = float(record["wall_ms"])
            ttfa = float(record["ttfa_ms"])
            audio = float(record["audio_seconds"])
            rtf = float(record["rtf"])
        except (KeyError, TypeError, ValueError):
            f.fail("rtf.request", "a success lacks its timing or audio fields", where)
            continue
        status = record.get("http_status")
        if not isinstance(status, int) or not 200 <= status < 300:
            f.fail("rtf.request", "a success without a 2xx HTTP status", where)
        if rate <= 0 or samples <= 0 or not close(audio, samples / rate):
            f.fail("rtf.request", "audio_seconds is not samples / sample_rate_hz", where)
        elif not close(rtf, (wall / 1000.0) / audio):
            f.fail("rtf.request", f"rtf {rtf} is not wall/audio = {(wall / 1000.0) / audio}", where)
        if ttfa > wall:
            f.fail("rtf.request", "ttfa_ms exceeds wall_ms", where)
        if record.get("continuity_valid") is not True or record.get("failure") is not None:
            f.fail("rtf.request", "a success with invalid continuity or a failure", where)
        if (
            not run.seed_flavor
            and not close(float(record["end_offset_ms"]) - float(record["start_offset_ms"]), wall)
            and not math.isclose(
                float(record["end_offset_ms"]) - float(record["start_offset_ms"]), wall, abs_tol=1e-3
            )
        ):
            f.fail("rtf.request", "end_offset_ms - start_offset_ms differs from wall_ms", where)
        finish = record.get("finish_reason")
        if record.get("natural_eos") != (None if finish is None else finish == "stop") or record.get(
            "length_limited"
        ) != (None if finish is None else finish == "length"):
            f.fail("rtf.request", "natural_eos / length_limited do not follow from finish_reason", where)


def check_packets(f: Findings, run: RunData) -> dict[int, list[float]]:
    """Packet checks; returns the inter-arrival times of each successful request."""
    by_request: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for packet in run.packets:
        by_request[int(packet.get("request_index", -1))].append(packet)
    records = {int(r["request_index"]): r for r in run.requests if isinstance(r.get("request_index"), int)}
    intervals: dict[int, list[float]] = {}
    for index in sorted(set(by_request) - set(records)):
        f.fail("packets.continuity", f"packets for unknown request {index}", f"{run.path}/packets.jsonl")
    for index, record in records.items():
        where = f"{run.path}/packets.jsonl#{index}"
        packets = sorted(by_request.get(index, []), key=lambda p: int(p.get("sequence", -1)))
        if record.get("success") is not True:
            if packets:
                f.fail("packets.continuity", "a failed request has packets", where)
            continue
        if len(packets) != record.get("packet_count"):
            f.fail(
                "packets.continuity",
                f"{len(packets)} packets, record says {record.get('packet_count')}",
                where,
            )
            continue
        if [p.get("sequence") for p in packets] != list(range(len(packets))):
            f.fail("packets.continuity", "packet sequences are not 0..n-1", where)
            continue
        kinds = {p.get("kind") for p in packets}
        allowed = _KIND_BY_BACKEND.get(str(record.get("backend")), set())
        if len(kinds) != 1 or not kinds <= allowed:
            f.fail(
                "packets.continuity", f"packet kinds {sorted(map(str, kinds))} do not fit the backend", where
            )
        offset = 0
        previous: float | None = None
        gaps: list[float] = []
        for packet in packets:
            arrival = float(packet["arrival_ms"])
            size = int(packet["payload_bytes"])
            if packet.get("is_first") is not (packet["sequence"] == 0) or packet.get("byte_offset") != offset:
                f.fail(
                    "packets.continuity", f"packet {packet['sequence']}: is_first or byte_offset wrong", where
                )
            if previous is None:
                if packet.get("inter_arrival_ms") is not None or not math.isclose(
                    arrival, float(record["ttfa_ms"]), rel_tol=0, abs_tol=1e-6
                ):
                    f.fail("packets.continuity", "first packet arrival differs from ttfa_ms", where)
            else:
                gap = packet.get("inter_arrival_ms")
                if arrival < previous or gap is None or not close(float(gap), arrival - previous):
                    f.fail(
                        "packets.continuity", f"packet {packet['sequence']}: inter_arrival_ms wrong", where
                    )
                else:
                    gaps.append(float(gap))
            offset += size
            previous = arrival
        if offset != 2 * int(record["samples"]):
            f.fail("packets.continuity", f"payload total {offset} bytes is not 2 x samples", where)
        if kinds == {"native_audio_packet"}:
            _check_native_packets(f, packets, where)
        if previous is not None and previous > float(record["wall_ms"]) + 1e-6:
            f.fail("packets.continuity", "a packet arrived after the request ended", where)
        intervals[index] = gaps
        if not run.seed_flavor:
            count, stalled = underruns(
                [float(p["arrival_ms"]) for p in packets],
                [int(p["payload_bytes"]) for p in packets],
                int(record["sample_rate_hz"]),
            )
            if record.get("underrun_count") != count or not close(record.get("underrun_ms"), stalled):
                f.fail(
                    "underrun.request",
                    f"stored underruns differ from the packets ({count}, {stalled:.3f} ms)",
                    where,
                )
    return intervals


def _check_native_packets(f: Findings, packets: Sequence[Mapping[str, Any]], where: str) -> None:
    frame = sample = 0
    for packet in packets:
        count = packet.get("sample_count")
        frames = packet.get("codec_frames")
        if (
            not isinstance(count, int)
            or not isinstance(frames, int)
            or count * 2 != packet.get("payload_bytes")
            or packet.get("first_sample") != sample
            or packet.get("first_codec_frame") != frame
        ):
            f.fail("packets.continuity", f"native packet {packet.get('sequence')} is not contiguous", where)
            return
        if packet.get("is_final") is not (packet is packets[-1]):
            f.fail("packets.continuity", "is_final is not set on exactly the last packet", where)
            return
        frame += frames
        sample += count


def check_phases(f: Findings, run: RunData) -> dict[str, int] | None:
    if run.phases is None:
        return None
    try:
        times = phase_times(run.phases)
    except (ValueError, KeyError, TypeError) as exc:
        f.fail("phases.order", str(exc), f"{run.path}/phase-events.jsonl")
        return None
    if [e.get("sequence") for e in run.phases] != list(range(len(PHASE_EVENTS))):
        f.fail("phases.order", "phase event sequences are not 0..5", f"{run.path}/phase-events.jsonl")
    window_ms = (times["measured_end"] - times["measured_start"]) / 1e6
    for record in run.requests:
        start, end = float(record.get("start_offset_ms", -1)), float(record.get("end_offset_ms", math.inf))
        if start < 0 or end > window_ms + 1e-6:
            f.fail(
                "phases.window",
                f"request {record.get('request_index')} lies outside the measured window",
                f"{run.path}/requests.jsonl",
            )
    return times


def check_summary(
    f: Findings,
    run: RunData,
    intervals: Mapping[int, list[float]],
    planned: int,
    wall_seconds: float | None,
    expected_meta: Mapping[str, Any],
) -> None:
    where = f"{run.path}/summary.json"
    summary = run.summary
    if summary is None:
        return
    if wall_seconds is None:
        wall_seconds = float(summary.get("benchmark_wall_seconds") or 0.0)
    elif not close(summary.get("benchmark_wall_seconds"), wall_seconds):
        f.fail("summary.recomputed", "benchmark_wall_seconds differs from the phase events", where)
    ordered = sorted(run.requests, key=lambda r: int(r.get("request_index", 0)))
    flat = [v for i in sorted(intervals) for v in intervals[i]]
    figures = run_figures(ordered, flat, wall_seconds, planned)
    if run.seed_flavor:
        figures = {k: figures[k] for k in _SEED_SUMMARY_FIELDS}
    for name in differing_fields(summary, figures):
        f.fail("summary.recomputed", f"{name} does not follow from the raw records", where)
    for name, value in expected_meta.items():
        if summary.get(name) != value:
            f.fail("summary.identity", f"{name} is {summary.get(name)!r}, expected {value!r}", where)


def check_telemetry(f: Findings, run: RunData, times: Mapping[str, int] | None, interval_ms: int) -> None:
    if run.telemetry is None or run.resource is None or times is None:
        return
    where = f"{run.path}/telemetry.jsonl"
    try:
        recomputed = reduce_run(run.telemetry, times, interval_ms)
    except (KeyError, TypeError, ValueError) as exc:
        f.fail("telemetry.continuity", f"telemetry cannot be reduced: {exc}", where)
        return
    gap = recomputed["observed_max_gap_ms"]
    if gap > recomputed["maximum_gap_ms"]:
        f.fail(
            "telemetry.continuity",
            f"a {gap:.1f} ms gap between samples (limit {recomputed['maximum_gap_ms']} ms)",
            where,
        )
    if any("bracket" in r for r in recomputed["rejection_reasons"]):
        f.fail("telemetry.continuity", "samples do not bracket the idle baseline and measured window", where)
    if any("incomplete" in r for r in recomputed["rejection_reasons"]):
        f.fail("telemetry.incomplete", "an incomplete telemetry sample in the run window", where)
    if recomputed["competing_gpu_processes"]:
        f.fail(
            "telemetry.competing_process",
            f"competing GPU compute processes {recomputed['competing_gpu_pids']} during the run",
            where,
        )
    stored = {
        k: v
        for k, v in run.resource.items()
        if k not in ("engine_id", "profile_id", "round", "telemetry_evidence_paths")
    }
    for name in differing_fields(stored, recomputed):
        f.fail(
            "resources.recomputed",
            f"{name} does not follow from the telemetry samples",
            f"{run.path}/run-resource.json",
        )
    extra = sorted(set(stored) - set(recomputed))
    if extra:
        f.fail("resources.recomputed", f"unexpected fields {extra}", f"{run.path}/run-resource.json")
    owner = (run.resource.get("engine_id"), run.resource.get("profile_id"), run.resource.get("round"))
    if owner != (run.key.engine_id, run.key.profile_id, run.key.round):
        f.fail("resources.recomputed", "run resource belongs to another run", f"{run.path}/run-resource.json")
    if run.resource.get("telemetry_evidence_paths") != [where]:
        f.fail(
            "resources.recomputed",
            "telemetry_evidence_paths must name this run's telemetry file",
            f"{run.path}/run-resource.json",
        )


def identity_tuples(run: RunData) -> list[tuple[Any, ...]]:
    """What must be identical across engines and rounds for one profile: the ordered request identities."""
    return [
        (
            r.get("request_index"),
            r.get("workload_id"),
            r.get("text_sha256"),
            r.get("voice_description_sha256"),
            r.get("normalized_sampling_sha256"),
            r.get("language"),
        )
        for r in sorted(run.requests, key=lambda r: int(r.get("request_index", 0)))
    ]

"""Statistics shared by the client (which writes summaries) and the validator (which recomputes them).

One implementation on both sides is deliberate: the validator's job is to prove that the stored summary
follows from the stored raw records, so both must use the same definitions (linear-interpolation
percentiles at (n-1)q, the playback underrun model, the run-level throughput and RTF figures)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

PERCENTILES = (("p50", 0.50), ("p90", 0.90), ("p95", 0.95), ("p99", 0.99))
RELATIVE_TOLERANCE = 1e-9
ABSOLUTE_TOLERANCE = 1e-9


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks at position (n-1)q of an ascending sequence."""
    if not sorted_values:
        raise ValueError("percentile of an empty sequence")
    position = (len(sorted_values) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    fraction = position - low
    return float(sorted_values[low] + (sorted_values[high] - sorted_values[low]) * fraction)


def distribution(values: Iterable[float]) -> dict[str, float | int | None]:
    """{count, min, mean, p50, p90, p95, p99, max}; every figure is null for an empty input."""
    ordered = sorted(float(v) for v in values)
    if not ordered:
        return {
            "count": 0,
            "min": None,
            "mean": None,
            "p50": None,
            "p90": None,
            "p95": None,
            "p99": None,
            "max": None,
        }
    result: dict[str, float | int | None] = {
        "count": len(ordered),
        "min": ordered[0],
        "mean": math.fsum(ordered) / len(ordered),
    }
    for name, q in PERCENTILES:
        result[name] = percentile(ordered, q)
    result["max"] = ordered[-1]
    return result


def underruns(
    arrivals_ms: Sequence[float], payload_bytes: Sequence[int], sample_rate_hz: int, bytes_per_sample: int = 2
) -> tuple[int, float]:
    """Playback underruns of one stream: (count, total stalled milliseconds).

    Playback starts when the first packet arrives and plays received audio at real time. A packet that
    arrives after everything received before it has finished playing is an underrun; playback then stalls
    until it arrives and resumes from there."""
    if len(arrivals_ms) != len(payload_bytes):
        raise ValueError("arrivals and payload sizes differ in length")
    count = 0
    stalled = 0.0
    play_end: float | None = None
    for arrival, size in zip(arrivals_ms, payload_bytes, strict=True):
        duration = size / bytes_per_sample / sample_rate_hz * 1000.0
        if play_end is None:
            play_end = arrival + duration
            continue
        if arrival > play_end:
            count += 1
            stalled += arrival - play_end
            play_end = arrival + duration
        else:
            play_end += duration
    return count, stalled


def close(a: Any, b: Any) -> bool:
    """Numeric equality within the evidence tolerance; other values must be exactly equal."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(a, b, rel_tol=RELATIVE_TOLERANCE, abs_tol=ABSOLUTE_TOLERANCE)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def differing_fields(stored: Mapping[str, Any], recomputed: Mapping[str, Any]) -> list[str]:
    """Names of the recomputed fields whose stored value differs (missing counts as differing)."""
    return [key for key, value in recomputed.items() if key not in stored or not close(stored[key], value)]


def run_figures(
    records: Sequence[Mapping[str, Any]], intervals_ms: Iterable[float], wall_seconds: float, planned: int
) -> dict[str, Any]:
    """The recomputable part of a run summary, from the run's raw records.

    ``records`` are the measured requests (one per request, success or not); ``intervals_ms`` the packet
    inter-arrival times of the successful ones; ``wall_seconds`` the measured window from the client's
    phase events."""
    successes = [r for r in records if r.get("success") is True]
    statuses = {"success": 0, "error": 0, "timeout": 0, "cancelled": 0}
    for record in records:
        status = record.get("status")
        if status in statuses:
            statuses[status] += 1
    total_audio = math.fsum(float(r["audio_seconds"]) for r in successes)
    total_wall_ms = math.fsum(float(r["wall_ms"]) for r in successes)
    return {
        "planned_requests": planned,
        "completed_requests": len(records),
        "successful_requests": len(successes),
        "failed_requests": len(records) - len(successes),
        "status_counts": statuses,
        "natural_eos_requests": sum(1 for r in successes if r.get("natural_eos") is True),
        "length_limited_requests": sum(1 for r in successes if r.get("length_limited") is True),
        "eos_unknown_requests": sum(1 for r in successes if r.get("finish_reason") is None),
        "sampling_parity_qualifying_requests": sum(
            1 for r in records if r.get("sampling_parity_qualifying") is True
        ),
        "sampling_parity_non_qualifying_requests": sum(
            1 for r in records if r.get("sampling_parity_qualifying") is not True
        ),
        "normalized_sampling_sha256s": sorted({str(r["normalized_sampling_sha256"]) for r in records}),
        "benchmark_wall_seconds": wall_seconds,
        "attempted_requests_per_second": len(records) / wall_seconds if wall_seconds > 0 else None,
        "throughput_requests_per_second": len(successes) / wall_seconds if wall_seconds > 0 else None,
        "total_audio_seconds": total_audio,
        "aggregate_rtf": wall_seconds / total_audio if total_audio > 0 else None,
        "summed_request_wall_rtf": total_wall_ms / 1000.0 / total_audio if total_audio > 0 else None,
        "underrun_requests": sum(1 for r in successes if int(r.get("underrun_count") or 0) > 0),
        "underrun_events": sum(int(r.get("underrun_count") or 0) for r in successes),
        "underrun_ms_total": math.fsum(float(r.get("underrun_ms") or 0.0) for r in successes),
        "ttfa_ms": distribution(float(r["ttfa_ms"]) for r in successes),
        "wall_ms": distribution(float(r["wall_ms"]) for r in successes),
        "request_rtf": distribution(float(r["rtf"]) for r in successes),
        "packet_interval_ms": distribution(intervals_ms),
    }

"""Run resources: what a run cost, reduced from its telemetry samples and its client phase events.

The same reduction runs when the bundle is written and when it is validated, so a stored run-resource
record is only accepted if it follows from the stored samples. Definitions:

- windows come from the client's phase events: idle baseline [idle_start, idle_end], measured window
  [measured_start, measured_end];
- process RSS peak: the largest summed RSS of the server's process tree in the measured window;
- GPU memory peak: the largest summed NVML ``used_memory`` of the target processes (or, where the driver
  reports no per-process figure, of the device) in the measured window;
- power: board power summed over the monitored GPUs; average = time-weighted (trapezoids, window edges
  linearly interpolated), energy = that integral minus idle-mean watts x measured seconds, floored at 0;
- continuity: samples must bracket [idle_start, measured_end] and no two consecutive samples in it may be
  more than 200 ms apart; any competing GPU compute process in it rejects the run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Any

from .telemetry import MAXIMUM_GAP_MS

PHASE_EVENTS = ("idle_start", "idle_end", "warmup_start", "warmup_end", "measured_start", "measured_end")


def phase_times(events: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Monotonic ns of each phase event; raises ValueError unless all six are present, once, in order."""
    names = [str(e.get("event")) for e in events]
    if names != list(PHASE_EVENTS):
        raise ValueError(f"phase events must be {list(PHASE_EVENTS)} in order, got {names}")
    times = {str(e["event"]): int(e["monotonic_ns"]) for e in events}
    ordered = [times[name] for name in PHASE_EVENTS]
    if any(b < a for a, b in pairwise(ordered)):
        raise ValueError("phase event times are not monotonic")
    return times


def _power(sample: Mapping[str, Any]) -> float | None:
    values = [g.get("power_w") for g in sample.get("gpus") or []]
    if not values or any(v is None for v in values):
        return None
    return float(math.fsum(float(v) for v in values))


def _interpolated_integral(
    points: Sequence[tuple[float, float]], start: float, end: float
) -> tuple[float, float | None]:
    """Trapezoidal integral and maximum of a piecewise-linear series over [start, end] (seconds)."""
    if end <= start or len(points) < 2:
        return 0.0, None

    def value_at(t: float) -> float:
        for (t0, v0), (t1, v1) in pairwise(points):
            if t0 <= t <= t1:
                return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
        return points[0][1] if t < points[0][0] else points[-1][1]

    inner = [(t, v) for t, v in points if start < t < end]
    series = [(start, value_at(start)), *inner, (end, value_at(end))]
    integral = math.fsum((t1 - t0) * (v0 + v1) / 2.0 for (t0, v0), (t1, v1) in pairwise(series))
    return integral, max(v for _, v in series)


def reduce_run(
    samples: Sequence[Mapping[str, Any]], phases: Mapping[str, int], interval_ms: int
) -> dict[str, Any]:
    """The run-resource figures and the rejection reasons for one run."""
    reasons: list[str] = []
    idle_start, idle_end = phases["idle_start"], phases["idle_end"]
    m_start, m_end = phases["measured_start"], phases["measured_end"]
    ordered = sorted(samples, key=lambda s: int(s["monotonic_ns"]))
    times = [int(s["monotonic_ns"]) for s in ordered]
    if not ordered or times[0] > idle_start or times[-1] < m_end:
        reasons.append("telemetry does not bracket the idle baseline and measured window")
    first = max([i for i, t in enumerate(times) if t <= idle_start], default=0)
    last = min([i for i, t in enumerate(times) if t >= m_end], default=len(times) - 1)
    span = ordered[first : last + 1]
    gaps = [(b - a) / 1e6 for a, b in pairwise(times[first : last + 1])]
    max_gap = max(gaps, default=0.0)
    if max_gap > MAXIMUM_GAP_MS:
        reasons.append(f"telemetry gap of {max_gap:.1f} ms exceeds {MAXIMUM_GAP_MS} ms")
    if any(s.get("sample_complete") is not True for s in span):
        reasons.append("an incomplete telemetry sample in the run window")
    competing = sorted(
        {int(p["pid"]) for s in span for p in s.get("gpu_processes") or [] if not p.get("target")}
    )
    if competing:
        reasons.append(f"competing GPU compute processes {competing}")
    gpu_modes = {s.get("gpu") for s in ordered}
    gpu = "nvml" if gpu_modes == {"nvml"} else "unavailable"
    if len(gpu_modes) > 1:
        reasons.append("GPU telemetry availability changed during the run")

    measured = [s for s in ordered if m_start <= int(s["monotonic_ns"]) <= m_end]
    rss = [int(s["target_rss_bytes"]) for s in measured if s.get("target_rss_bytes") is not None]
    cpu = [float(s["target_cpu_percent"]) for s in measured if s.get("target_cpu_percent") is not None]
    system_cpu = [float(s["system_cpu_percent"]) for s in measured]
    result: dict[str, Any] = {
        "gpu": gpu,
        "sampling_interval_ms": interval_ms,
        "maximum_gap_ms": MAXIMUM_GAP_MS,
        "observed_max_gap_ms": max_gap,
        "telemetry_samples": len(span),
        "idle_seconds": (idle_end - idle_start) / 1e9,
        "measured_seconds": (m_end - m_start) / 1e9,
        "process_rss_peak_bytes": max(rss) if rss else None,
        "process_cpu_percent_mean": math.fsum(cpu) / len(cpu) if cpu else None,
        "system_cpu_percent_mean": math.fsum(system_cpu) / len(system_cpu) if system_cpu else None,
        "gpu_memory_peak_bytes": None,
        "gpu_memory_source": None,
        "gpu_utilization_percent_mean": None,
        "idle_power_w": None,
        "average_power_w": None,
        "peak_power_w": None,
        "energy_gross_j": None,
        "energy_j": None,
        "target_gpu_process_seen": None,
        "competing_gpu_processes": len(competing),
        "competing_gpu_pids": competing,
    }
    if gpu == "nvml":
        result.update(_gpu_figures(ordered, measured, phases))
    result["rejected"] = bool(reasons)
    result["rejection_reasons"] = reasons
    return result


def _gpu_figures(
    ordered: Sequence[Mapping[str, Any]], measured: Sequence[Mapping[str, Any]], phases: Mapping[str, int]
) -> dict[str, Any]:
    idle = [s for s in ordered if phases["idle_start"] <= int(s["monotonic_ns"]) <= phases["idle_end"]]
    idle_power = [p for p in (_power(s) for s in idle) if p is not None]
    points = [(int(s["monotonic_ns"]) / 1e9, p) for s in ordered if (p := _power(s)) is not None]
    start, end = phases["measured_start"] / 1e9, phases["measured_end"] / 1e9
    gross, peak = _interpolated_integral(points, start, end)
    duration = end - start
    idle_mean = math.fsum(idle_power) / len(idle_power) if idle_power else None
    process_memory: list[int] = []
    device_memory: list[int] = []
    seen = False
    for sample in measured:
        targets = [p for p in sample.get("gpu_processes") or [] if p.get("target")]
        seen = seen or bool(targets)
        used = [p.get("used_memory_bytes") for p in targets]
        if targets and all(u is not None for u in used):
            process_memory.append(sum(int(u) for u in used if u is not None))
        device = [g.get("memory_used_bytes") for g in sample.get("gpus") or []]
        if device and all(d is not None for d in device):
            device_memory.append(sum(int(d) for d in device if d is not None))
    util = [
        float(g["utilization_gpu_percent"])
        for s in measured
        for g in s.get("gpus") or []
        if g.get("utilization_gpu_percent") is not None
    ]
    return {
        "gpu_memory_peak_bytes": max(process_memory)
        if process_memory
        else (max(device_memory) if device_memory else None),
        "gpu_memory_source": "process" if process_memory else ("device" if device_memory else None),
        "gpu_utilization_percent_mean": math.fsum(util) / len(util) if util else None,
        "idle_power_w": idle_mean,
        "average_power_w": gross / duration if peak is not None else None,
        "peak_power_w": peak,
        "energy_gross_j": gross if peak is not None else None,
        "energy_j": max(0.0, gross - (idle_mean or 0.0) * duration) if peak is not None else None,
        "target_gpu_process_seen": seen,
    }

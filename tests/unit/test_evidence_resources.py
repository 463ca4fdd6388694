"""Run-resource reduction: power integration against an idle baseline, peaks, gaps and competing processes."""

from __future__ import annotations

from typing import Any

import pytest

from qwen3_tts_native.evidence.resources import phase_times, reduce_run

MS = 1_000_000
PHASES = {
    "idle_start": 0,
    "idle_end": 1000 * MS,
    "warmup_start": 1000 * MS,
    "warmup_end": 1000 * MS,
    "measured_start": 1000 * MS,
    "measured_end": 3000 * MS,
}


def _sample(
    t_ms: int, power: float, processes: list[dict[str, Any]] | None = None, memory: int = 2**30
) -> dict[str, Any]:
    return {
        "monotonic_ns": t_ms * MS,
        "gpu": "nvml",
        "sample_complete": True,
        "target_rss_bytes": 100 + t_ms,
        "target_cpu_percent": 50.0,
        "system_cpu_percent": 25.0,
        "gpus": [{"power_w": power, "memory_used_bytes": memory, "utilization_gpu_percent": 90.0}],
        "gpu_processes": processes
        if processes is not None
        else [{"gpu_index": 0, "pid": 10, "used_memory_bytes": memory // 2, "target": True}],
    }


def test_energy_is_above_idle_baseline() -> None:
    samples = [_sample(t, 100.0 if t <= 1000 else 300.0) for t in range(0, 3100, 100)]
    result = reduce_run(samples, PHASES, 100)
    assert not result["rejected"]
    assert result["idle_power_w"] == pytest.approx(100.0)
    assert result["average_power_w"] == pytest.approx(290.0, rel=0.05)
    assert result["energy_j"] == pytest.approx(result["energy_gross_j"] - 100.0 * 2.0)
    assert result["peak_power_w"] >= result["average_power_w"]
    assert result["gpu_memory_peak_bytes"] == 2**29 and result["gpu_memory_source"] == "process"
    assert result["process_rss_peak_bytes"] == 3100 and result["target_gpu_process_seen"] is True


def test_gap_bracket_and_competitor_reject() -> None:
    samples = [_sample(t, 100.0) for t in range(0, 3100, 100) if not 1500 <= t <= 1700]
    result = reduce_run(samples, PHASES, 100)
    assert result["observed_max_gap_ms"] == pytest.approx(400.0) and result["rejected"]
    late = reduce_run([_sample(t, 100.0) for t in range(100, 2900, 100)], PHASES, 100)
    assert any("bracket" in r for r in late["rejection_reasons"])
    crowded = [_sample(t, 100.0) for t in range(0, 3100, 100)]
    crowded[5]["gpu_processes"].append({"gpu_index": 0, "pid": 99, "used_memory_bytes": 1, "target": False})
    result = reduce_run(crowded, PHASES, 100)
    assert result["competing_gpu_pids"] == [99] and result["rejected"]


def test_device_memory_fallback_and_cpu_only() -> None:
    samples = [
        _sample(t, 50.0, processes=[{"gpu_index": 0, "pid": 10, "used_memory_bytes": None, "target": True}])
        for t in range(0, 3100, 100)
    ]
    assert reduce_run(samples, PHASES, 100)["gpu_memory_source"] == "device"
    cpu = [
        {**_sample(t, 0.0), "gpu": "unavailable", "gpus": [], "gpu_processes": []}
        for t in range(0, 3100, 100)
    ]
    result = reduce_run(cpu, PHASES, 100)
    assert result["gpu"] == "unavailable" and result["average_power_w"] is None and not result["rejected"]


def test_phase_order_is_enforced() -> None:
    events = [{"event": name, "monotonic_ns": t} for name, t in PHASES.items()]
    assert phase_times(events)["measured_end"] == 3000 * MS
    with pytest.raises(ValueError):
        phase_times(list(reversed(events)))

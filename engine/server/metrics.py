"""Prometheus text exposition with no labels that could carry user data.

Ten label-free series as in the seed contract plus two histograms (time to first audio, real-time factor)
whose only label is the bucket bound ``le``. Written by hand rather than with prometheus_client so the
exposition is exactly this and nothing (``_created`` series, process collectors) leaks in.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

TTFA_BUCKETS = (0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0)
RTF_BUCKETS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0)


@dataclass
class _Histogram:
    name: str
    help: str
    bounds: Sequence[float]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.bounds)

    def observe(self, value: float) -> None:
        for index, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[index] += 1
        self.total += value
        self.count += 1

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        lines += [
            f'{self.name}_bucket{{le="{bound:g}"}} {n}'
            for bound, n in zip(self.bounds, self.counts, strict=True)
        ]
        lines += [
            f'{self.name}_bucket{{le="+Inf"}} {self.count}',
            f"{self.name}_sum {self.total:.6f}",
            f"{self.name}_count {self.count}",
        ]
        return lines


_SERIES: tuple[tuple[str, str, str], ...] = (
    ("http_requests_total", "counter", "Requests that started in the engine."),
    ("active_requests", "gauge", "Admitted requests not yet retired."),
    ("streaming_requests_total", "counter", "Started progressive (streamed) requests."),
    ("buffered_requests_total", "counter", "Started buffered (WAV) requests."),
    ("completed_requests_total", "counter", "Requests that delivered their terminal output and retired."),
    ("failed_requests_total", "counter", "Requests that failed, including retirement timeouts."),
    (
        "cancelled_requests_total",
        "counter",
        "Requests cancelled by caller, disconnect, slow client or shutdown.",
    ),
    (
        "rejected_requests_total",
        "counter",
        "Requests refused at admission for lack of capacity or engine start.",
    ),
    ("retirement_timeouts_total", "counter", "Requests whose engine slot was not freed in time."),
    ("emitted_samples_total", "counter", "PCM samples delivered by completed requests."),
)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


class ServerMetrics:
    """Thread-safe counters; the HTTP layer updates them, ``/metrics`` renders them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, float] = {name: 0 for name, _, _ in _SERIES}
        self._ttfa = _Histogram(
            "qwen3_tts_time_to_first_audio_seconds",
            "Seconds from admission to the first audio bytes handed to the client.",
            TTFA_BUCKETS,
        )
        self._rtf = _Histogram(
            "qwen3_tts_real_time_factor",
            "Generation wall time over audio duration, per completed request.",
            RTF_BUCKETS,
        )

    def add(self, name: str, amount: float = 1) -> None:
        with self._lock:
            self._values[name] += amount

    def value(self, name: str) -> float:
        with self._lock:
            return self._values[name]

    def observe_first_audio(self, seconds: float) -> None:
        with self._lock:
            self._ttfa.observe(seconds)

    def observe_real_time_factor(self, rtf: float) -> None:
        with self._lock:
            self._rtf.observe(rtf)

    def render(self) -> str:
        lines: list[str] = []
        with self._lock:
            for name, kind, help_text in _SERIES:
                full = f"qwen3_tts_{name}"
                lines += [
                    f"# HELP {full} {help_text}",
                    f"# TYPE {full} {kind}",
                    f"{full} {_number(self._values[name])}",
                ]
            lines += self._ttfa.render() + self._rtf.render()
        return "\n".join(lines) + "\n"

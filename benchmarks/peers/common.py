"""Shared by the peer runners: the workload, timing helpers and the JSON record.

The runners are standalone scripts (each peer runs in its own process with its own PYTHONPATH, since the
peers need other transformers versions than the image's), so this file imports nothing from the project.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

SAMPLE_RATE = 24_000
SAMPLES_PER_FRAME = 1920
TEXT = (
    "Ladies and gentlemen, I have just been informed that this speech is being generated faster than I can "
    "speak it. The quick brown fox jumps over the lazy dog."
)
INSTRUCT = "A warm, calm female voice with a slight smile, speaking at a relaxed pace."


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", required=True, type=Path, help="snapshot directory (EOS row zeroed for timing)")
    p.add_argument("--out", required=True, type=Path, help="JSON file to write")
    p.add_argument("--frames", type=int, default=100, help="frames per timed synthesis")
    p.add_argument("--runs", type=int, default=3, help="timed syntheses for the RTF")
    p.add_argument("--ttfa-runs", type=int, default=5, help="timed first-audio measurements")
    p.add_argument("--text", default=TEXT)
    p.add_argument("--instruct", default=INSTRUCT)
    p.add_argument("--language", default="English")
    return p


def cuda_sync() -> None:
    import torch

    torch.cuda.synchronize()


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    cuda_sync()
    start = time.perf_counter()
    value = fn()
    cuda_sync()
    return time.perf_counter() - start, value


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summarize(values: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def timed_syntheses(synth: Callable[[], Any], runs: int) -> tuple[int, list[float], list[float]]:
    """`runs` timed calls of `synth() -> (waves, sample_rate)`: (frames of the last, RTFs, seconds)."""
    frames, rtfs, seconds = 0, [], []
    for _ in range(runs):
        elapsed, (waves, sample_rate) = timed(synth)
        samples = sum(len(wave) for wave in waves)
        frames = samples // SAMPLES_PER_FRAME
        rtfs.append(elapsed / (samples / sample_rate))
        seconds.append(elapsed)
    return frames, rtfs, seconds


def run(out: Path, record: dict[str, Any], measure: Callable[[dict[str, Any]], None]) -> int:
    """Run `measure(record)` (an exception becomes `error` + `traceback`), then write the record.

    Returns the exit code: 0, or 1 on error."""
    try:
        measure(record)
    except Exception as error:
        record["error"] = f"{type(error).__name__}: {error}"
        record["traceback"] = traceback.format_exc()
    write(out, record)
    return 0 if "error" not in record else 1


def write(path: Path, record: dict[str, Any]) -> None:
    import torch

    record.setdefault("torch", torch.__version__)
    record.setdefault("python", sys.version.split()[0])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, sort_keys=True))
    print(json.dumps({k: record[k] for k in ("peer", "single_stream_rtf", "ttfa_ms") if k in record}))

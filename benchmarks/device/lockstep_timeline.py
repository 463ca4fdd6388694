"""Where a lockstep concurrency level's wall time goes: the prompt prefill, the frames, the codec and the
GPU's idle time, per CUDA stream, from a torch profiler trace of one warm run (the bench's
`run_concurrent`), and the solo `synthesize` loop the same way.

Why: the bench reports one wall time per level. Its 64-stream worst stream (fast 0.147 against 0.125) and the
16-stream HTTP level are missed by 15-25%, and whether the gap is the prefill, the frames, the codec or host
stalls decides the next change. Kernel intervals come from the trace (CUPTI, graph kernels included); "busy"
is the union of a stream's kernel and copy intervals, "overlap" the time both the frame and codec streams
are busy, "idle" the wall time no stream is. The largest level also runs once under cProfile: where the host's
time goes (`lockstep-host-<mode>.txt`), which is what the level waits for when the GPU idles.

Usage: python benchmarks/device/lockstep_timeline.py --model SNAPSHOT --out DIR [--streams 1,16,64]
"""

from __future__ import annotations

import cProfile
import io
import json
import pstats
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from common import comma_ints, load_timing_engine, measurement_parser, modes_result

from qwen3_tts_native.commands.bench import make_request, run_concurrent, zero_eos_copy
from qwen3_tts_native.engine.runtime.engine import VoiceDesignEngine

FRAMES = 32
SOLO_FRAMES = 64

Interval = tuple[float, float]


def union_us(intervals: list[Interval]) -> float:
    """Total length of the union of [start, end) intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def intersect(a: list[Interval], b: list[Interval]) -> float:
    """Length of the time covered by both interval sets."""
    return union_us(a) + union_us(b) - union_us(a + b)


def device_intervals(trace: Path) -> tuple[dict[int, list[Interval]], int | None]:
    """Kernel and copy intervals (us) of a chrome trace, by CUDA stream, and the stream of the marker kernel
    (`torch.cuda._sleep`'s spin kernel, which is left out)."""
    events = json.loads(trace.read_text())["traceEvents"]
    streams: dict[int, list[Interval]] = {}
    marked = None
    for event in events:
        if event.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset") or "dur" not in event:
            continue
        stream = int(event.get("args", {}).get("stream", event.get("tid", -1)))
        if "spin_kernel" in event.get("name", ""):
            marked = stream
            continue
        streams.setdefault(stream, []).append((float(event["ts"]), float(event["ts"]) + float(event["dur"])))
    return streams, marked


def summarize(streams: dict[int, list[Interval]], codec_stream: int | None) -> dict[str, Any]:
    everything = [i for v in streams.values() for i in v]
    start = min(s for s, _ in everything)
    end = max(e for _, e in everything)
    codec = streams.get(codec_stream, []) if codec_stream is not None else []
    others = [i for s, v in streams.items() if s != codec_stream for i in v]
    return {
        "device_span_ms": (end - start) / 1e3,
        "busy_ms": union_us(everything) / 1e3,
        "idle_ms": (end - start - union_us(everything)) / 1e3,
        "frame_side_busy_ms": union_us(others) / 1e3,
        "codec_busy_ms": union_us(codec) / 1e3,
        "frame_codec_overlap_ms": intersect(others, codec) / 1e3,
        "per_stream": {str(s): {"busy_ms": union_us(v) / 1e3, "ops": len(v)} for s, v in streams.items()},
    }


def profiled(run: Any, codec: torch.cuda.Stream | None) -> dict[str, Any]:
    """The trace's summary of one `run()`; a spin kernel on the codec's stream first tells which trace stream
    that is."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        if codec is not None:
            with torch.cuda.stream(codec):
                torch.cuda._sleep(1000)
            torch.cuda.synchronize()
        run()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        streams, codec_stream = device_intervals(path)
    return summarize(streams, codec_stream)


def codec_stream(engine: VoiceDesignEngine) -> torch.cuda.Stream | None:
    return engine.codec_backend.stream if engine.codec_backend is not None else None


def solo(engine: VoiceDesignEngine) -> dict[str, Any]:
    def run() -> float:
        start = time.perf_counter()
        for _ in engine.synthesize(make_request(SOLO_FRAMES, seed=7)):
            pass
        return time.perf_counter() - start

    run()
    unprofiled = [run() for _ in range(3)]
    return {"wall_s": sorted(unprofiled)[1], "frames": SOLO_FRAMES, **profiled(run, codec_stream(engine))}


def level(engine: VoiceDesignEngine, streams: int) -> dict[str, Any]:
    run_concurrent(engine, streams, FRAMES, 60)
    unprofiled = [run_concurrent(engine, streams, FRAMES, 60) for _ in range(3)]
    median = sorted(unprofiled, key=lambda r: r["wall_s"])[1]
    trace = profiled(lambda: run_concurrent(engine, streams, FRAMES, 60), codec_stream(engine))
    keep = ("wall_s", "prefill_s", "aggregate_rtf", "worst_stream_rtf", "codec_s", "steps")
    return {**{k: median.get(k) for k in keep}, **trace}


def host_profile(engine: VoiceDesignEngine, streams: int, path: Path) -> None:
    """One warm run of the level under cProfile: its functions by own time, then by cumulative time."""
    profiler = cProfile.Profile()
    profiler.enable()
    run_concurrent(engine, streams, FRAMES, 60)
    profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("cumulative").print_stats(50)
    path.write_text(text.getvalue())


def main() -> int:
    parser = measurement_parser(__doc__)
    parser.add_argument("--streams", default="1,16,64")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    timing_model = zero_eos_copy(args.model)
    levels = comma_ints(args.streams)
    result = modes_result()
    for mode in args.modes:
        engine = load_timing_engine(timing_model, mode, max(levels))
        figures = {"solo": solo(engine), **{f"{n}_streams": level(engine, n) for n in levels}}
        host_profile(engine, max(levels), args.out / f"lockstep-host-{mode}.txt")
        for name, data in figures.items():
            print(mode, name, json.dumps({k: v for k, v in data.items() if k != "per_stream"}), flush=True)
        result["modes"][mode] = figures
        del engine
        torch.cuda.empty_cache()
    (args.out / "lockstep-timeline.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

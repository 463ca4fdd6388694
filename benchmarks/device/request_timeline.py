"""Where one solo request's wall time goes, in the order it happens: host work before the first GPU op, the
prompt pass and frame 0, the first packet, the frames with the codec beside them, and the tail after the
last frame; with the GPU's idle gaps and the prefill window's top kernels and host ops. From a torch profiler
trace of one warm `synthesize` of 64 frames (the bench's single-stream request), per mode. Before it,
unprofiled requests with Python's garbage collector on and off, alternating (medians): the wall time and the
longest wait between two packets, where a host stall would show. After it, the SHA-256 of a seeded request's
codes, so two trees run with this script show whether a change kept the codes.

Why: exact's single-stream RTF (0.0406, run 57) is 208 ms for 64 frames, of which the frames' replays are
~179 ms. What the other ~29 ms are (prefill, the synchronous first and last packets, the codec's slowing of
the frames, host gaps) decides whether a cut outside the frame graph can reach 0.04 (204.8 ms).

Usage: python benchmarks/device/request_timeline.py --model SNAPSHOT --out DIR [--modes fast] [--tag NAME]
(the tree on PYTHONPATH is the one timed; the figures go to DIR/request-timeline[-NAME].json)
"""

from __future__ import annotations

import gc
import hashlib
import itertools
import json
import statistics
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import torch
from common import load_timing_engine, measurement_parser, modes_result
from lockstep_timeline import Interval, device_intervals, union_us
from torch.profiler import ProfilerActivity, profile, record_function

from qwen3_tts_native.commands.bench import make_request, measure_ttfa, zero_eos_copy
from qwen3_tts_native.engine.runtime.engine import VoiceDesignEngine

FRAMES = 64
REQUEST = "request_timeline.request"
PACKET = "request_timeline.packet"
GAP_US = 20.0
ROUNDS = 8


def gaps(intervals: list[Interval], start: float, end: float) -> list[Interval]:
    """The idle stretches of a set of intervals within [start, end)."""
    found, reach = [], start
    for first, last in sorted(intervals):
        if first > reach:
            found.append((reach, min(first, end)))
        reach = max(reach, last)
    if reach < end:
        found.append((reach, end))
    return [(a, b) for a, b in found if b > a]


def trace_request(engine: VoiceDesignEngine, seed: int, path: Path) -> None:
    """Write the chrome trace of one profiled request to `path` (a spin kernel on the codec stream first
    names that stream)."""
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        backend = engine.codec_backend
        if backend is not None:
            with torch.cuda.stream(backend.stream):
                torch.cuda._sleep(1000)
        torch.cuda.synchronize()
        with record_function(REQUEST):
            for _ in engine.synthesize(make_request(FRAMES, seed=seed)):
                with record_function(PACKET):
                    pass
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(path))


def timeline(path: Path) -> dict[str, Any]:
    """The request's phases, idle gaps and prefill-window tables from its trace (times in ms)."""
    events = json.loads(path.read_text())["traceEvents"]
    streams, codec_stream = device_intervals(path)
    marks = [e for e in events if e.get("name") in (REQUEST, PACKET) and e.get("ph") == "X"]
    request = next(e for e in marks if e["name"] == REQUEST)
    start, end = float(request["ts"]), float(request["ts"]) + float(request["dur"])
    packets = sorted(float(e["ts"]) for e in marks if e["name"] == PACKET)
    inside = {s: [(a, b) for a, b in v if a >= start] for s, v in streams.items()}
    codec = inside.get(codec_stream, []) if codec_stream is not None else []
    frame_side = [i for s, v in inside.items() if s != codec_stream for i in v]
    everything = frame_side + codec
    first_gpu = min(a for a, _ in everything)
    last_frame_op = max(b for _, b in frame_side)
    first_packet = packets[0]
    idle = gaps(everything, first_gpu, end)

    def ms(us: float) -> float:
        return round(us / 1e3, 3)

    def window_table(category: str, lo: float, hi: float, rows: int) -> list[list[Any]]:
        """[name, count, total us] of the window's events of one trace category, largest total first."""
        total: defaultdict[str, float] = defaultdict(float)
        count: Counter[str] = Counter()
        for e in events:
            if (
                e.get("cat") == category
                and lo <= float(e.get("ts", -1)) < hi
                and "spin_kernel" not in e["name"]
            ):
                total[e["name"][:70]] += float(e.get("dur", 0))
                count[e["name"][:70]] += 1
        largest = sorted(total.items(), key=lambda item: -item[1])[:rows]
        return [[name, count[name], round(us, 1)] for name, us in largest]

    return {
        "request_ms": ms(end - start),
        "packets": len(packets),
        "host_before_first_gpu_op_ms": ms(first_gpu - start),
        "first_packet_ms": ms(first_packet - start),
        "frames_phase_ms": ms(last_frame_op - first_packet),
        "tail_after_last_frame_op_ms": ms(end - last_frame_op),
        "frame_side_busy_ms": ms(union_us(frame_side)),
        "codec_busy_ms": ms(union_us(codec)),
        "codec_busy_after_last_frame_op_ms": ms(
            union_us([(max(a, last_frame_op), b) for a, b in codec if b > last_frame_op])
        ),
        "gpu_idle_ms": ms(sum(b - a for a, b in idle)),
        "gpu_idle_before_first_packet_ms": ms(
            sum(min(b, first_packet) - a for a, b in idle if a < first_packet)
        ),
        "gpu_idle_gaps_over_20us": len([1 for a, b in idle if b - a > GAP_US]),
        "largest_gpu_idle_gaps_ms_at": [
            [ms(b - a), ms(a - start)] for a, b in sorted(idle, key=lambda g: g[0] - g[1])[:12]
        ],
        "frame_side_ops": len(frame_side),
        "codec_ops": len(codec),
        "prefill_window_kernels_us": window_table("kernel", start, first_packet, 12),
        "prefill_window_host_ops_us": window_table("cpu_op", start, first_packet, 15),
    }


def unprofiled_request(engine: VoiceDesignEngine, seed: int, collect_garbage: bool) -> dict[str, float]:
    """One request's wall time and its longest wait between two packets (a host stall shows there), with
    Python's garbage collector on or off."""
    torch.cuda.synchronize()
    if not collect_garbage:
        gc.disable()
    try:
        begin = time.perf_counter()
        arrivals = [time.perf_counter() for _ in engine.synthesize(make_request(FRAMES, seed=seed))]
    finally:
        gc.enable()
    intervals = [b - a for a, b in itertools.pairwise(arrivals)]
    return {
        "request_ms": (arrivals[-1] - begin) * 1e3,
        "longest_packet_interval_ms": max(intervals) * 1e3,
        "median_packet_interval_ms": statistics.median(intervals) * 1e3,
    }


def main() -> int:
    parser = measurement_parser(__doc__)
    parser.add_argument("--tag", default="", help="a name for the tree timed, in the output file's name")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    timing_model = zero_eos_copy(args.model)
    result = modes_result()
    for mode in args.modes:
        engine = load_timing_engine(timing_model, mode, 1)
        unprofiled_request(engine, 0, True)
        runs: dict[str, list[dict[str, float]]] = {"gc_on": [], "gc_off": []}
        for seed in range(ROUNDS):  # alternating, so drift touches both alike
            runs["gc_on"].append(unprofiled_request(engine, seed, True))
            runs["gc_off"].append(unprofiled_request(engine, seed, False))
        unprofiled = {
            name: {key: round(statistics.median(r[key] for r in rows), 3) for key in rows[0]}
            for name, rows in runs.items()
        }
        with tempfile.TemporaryDirectory() as tmp:
            trace = Path(tmp) / "trace.json"
            trace_request(engine, 9, trace)
            figures = {
                "unprofiled_medians": unprofiled,
                "ttfa_ms": measure_ttfa(engine, 10),
                **timeline(trace),
            }
        codes = engine.generate_codes(make_request(FRAMES, seed=0))
        figures["codes_sha256"] = hashlib.sha256(codes.cpu().numpy().tobytes()).hexdigest()
        result["modes"][mode] = figures
        print(mode, json.dumps(figures, indent=1), flush=True)
        del engine
        torch.cuda.empty_cache()
    name = f"request-timeline-{args.tag}.json" if args.tag else "request-timeline.json"
    (args.out / name).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

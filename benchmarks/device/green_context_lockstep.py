"""Probe: the bench's 64-stream lockstep with the frames and the codec on disjoint SM partitions (two CUDA
green contexts made from one split of the device, so they cannot share an SM), against the shipped full-GPU
graphs, on a full random snapshot, in one process.

Why: at 64 streams a lockstep of 32 frames takes ~265 ms (fast, run 111): prefill 50, frames 31 x 5.1 = 158
and ~56 ms of codec that overlaps the frames for only 14 ms (run 112's timeline). Stream priorities cannot
share the GPU (run 112): the codec's long blocks, once resident, keep the SMs the frame chain's next kernel
waits for. A partition can: the frame chain keeps its SMs and the codec runs beside it. Run 24 found the two
conditions: both need a partition of their own, and a graph is confined only when captured on a stream of
its green context. Torch's `GreenContext.create` splits the whole device anew each call (two contexts would
overlap), so the split here is the driver's (`cuda.bindings`): `cuDevSmResourceSplitByCount` once, the first
group for the frames, the remaining SMs for the codec.

For each split (`--frame-sms`; 0 = the shipped graphs on all SMs), per mode:
- the 64-row decode graph replayed alone (captured on the frames' green stream; the prompt and frame-0 graphs
  stay on all SMs: nothing else runs during a prefill);
- the codec's 64-session 4-frame packet alone (its graphs captured on the codec's green stream);
- the lockstep at 64 and 16 streams (`run_concurrent`, 32 frames a stream): aggregate and worst-stream RTF;
- for the splits in `--timeline`, the 64-stream lockstep's trace summary (frame and codec streams' busy time,
  their overlap, idle time: `lockstep_timeline.profiled`).

Usage: python benchmarks/device/green_context_lockstep.py --model SNAPSHOT --out DIR [--frame-sms 0,112,104]
"""

from __future__ import annotations

import json
import statistics
import time
import traceback
from functools import partial
from typing import Any

import torch
from common import comma_ints, load_timing_engine, measurement_parser, modes_result
from lockstep_timeline import profiled

from qwen3_tts_native.commands.bench import make_request, replay_ms, run_concurrent, zero_eos_copy
from qwen3_tts_native.engine.runtime.codec_graphs import CodecGraphs
from qwen3_tts_native.engine.runtime.graphs import GraphFrameBackend

LOCKSTEP_FRAMES = 32
LEVELS = (64, 16)
RUNS = 5


def _checked(result: tuple[Any, ...]) -> Any:
    """A cuda.bindings call's values after its CUresult, or an error naming the code."""
    from cuda.bindings import driver

    error, *values = result
    if error != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA driver error {error}")
    return values[0] if len(values) == 1 else values


class SmPartition:
    """Two green contexts over disjoint SMs of device 0: `frame_sms` (rounded up by the driver) and the rest.
    Each has two streams (a graph's capture stream and its side branch / replay stream). Kept alive while any
    graph captured on them exists."""

    def __init__(self, frame_sms: int) -> None:
        from cuda.bindings import driver

        _checked(driver.cuInit(0))
        device = _checked(driver.cuDeviceGet(0))
        sm_type = driver.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM
        whole = _checked(driver.cuDeviceGetDevResource(device, sm_type))
        groups, _, remaining = _checked(driver.cuDevSmResourceSplitByCount(1, whole, 0, frame_sms))
        self.sm_counts: list[int] = []
        self.streams: list[tuple[torch.cuda.Stream, torch.cuda.Stream]] = []
        self._contexts = []
        for resource in (groups[0], remaining):
            description = _checked(driver.cuDevResourceGenerateDesc([resource], 1))
            context = _checked(
                driver.cuGreenCtxCreate(
                    description, device, driver.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM
                )
            )
            self._contexts.append(context)
            self.sm_counts.append(int(resource.sm.smCount))
            pair = []
            for _ in range(2):
                handle = _checked(
                    driver.cuGreenCtxStreamCreate(context, driver.CUstream_flags.CU_STREAM_NON_BLOCKING, 0)
                )
                pair.append(torch.cuda.get_stream_from_external(int(handle), torch.device("cuda", 0)))
            self.streams.append((pair[0], pair[1]))


def frame_capture_on(backend: GraphFrameBackend, stream: torch.cuda.Stream) -> None:
    """Decode graphs captured from now on are captured on `stream` (torch's default capture stream while
    `_decode_static` runs; the prompt and complete-frames graphs keep the shipped one); every graph is
    dropped first."""

    def decode_static(*args: Any) -> Any:
        shipped = torch.cuda.graph.default_capture_stream
        torch.cuda.graph.default_capture_stream = stream
        try:
            return GraphFrameBackend._decode_static(backend, *args)
        finally:
            torch.cuda.graph.default_capture_stream = shipped

    backend.release_graphs()
    backend._decode_static = decode_static  # type: ignore[method-assign,assignment]


def codec_capture_on(codec: CodecGraphs, capture: torch.cuda.Stream, replay: torch.cuda.Stream) -> None:
    """Codec packets captured from now on are captured on `capture` and replayed on `replay`; every packet
    graph is dropped first, and a new pool taken (as `GraphFrameBackend.release_graphs` does)."""
    torch.cuda.synchronize()
    codec._packets.clear()
    codec._graph_pool = torch.cuda.graph_pool_handle()
    codec._capture_stream = capture
    codec.stream = replay


def frame_replay_64_ms(engine: Any) -> float:
    sessions = [engine.start_session(make_request(64, seed=5000 + i)) for i in range(64)]
    try:
        engine.prefill_many(sessions)
        engine.step(sessions)
        return replay_ms(engine.frame_backend.decode_graph(64), 20)
    finally:
        for session in sessions:
            engine.release(session)


def codec_packet_64_ms(engine: Any) -> float:
    codec = engine.codec_backend
    codes = torch.randint(0, 2048, (64, 16, 4), device=engine.device)
    slots = list(range(64))
    values = []
    for run in range(11):
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.cuda.stream(codec.stream):
            codec.decode(slots, codes)
        codec.stream.synchronize()
        if run:
            values.append((time.perf_counter() - start) * 1000)
    for slot in slots:
        codec.reset(slot)
    torch.cuda.synchronize()
    return statistics.median(values)


def split_figures(engine: Any) -> dict[str, Any]:
    figures: dict[str, Any] = {
        "frame_replay_64_ms": frame_replay_64_ms(engine),
        "codec_packet_64x4_ms": codec_packet_64_ms(engine),
    }
    for streams in LEVELS:
        run_concurrent(engine, streams, LOCKSTEP_FRAMES, 60)
        levels = [run_concurrent(engine, streams, LOCKSTEP_FRAMES, 60) for _ in range(RUNS)]
        for key in ("aggregate_rtf", "worst_stream_rtf", "wall_s", "prefill_s"):
            figures[f"lockstep_{streams}_{key}"] = statistics.median(level[key] for level in levels)
    return figures


def measure_mode(args: Any, timing_model: Any, mode: str) -> dict[str, Any]:
    engine = load_timing_engine(timing_model, mode, 64)
    backend, codec = engine.frame_backend, engine.codec_backend
    shipped_codec = (codec._capture_stream, codec.stream)
    shipped_side = backend.frame._side._stream
    out: dict[str, Any] = {}
    partitions = []
    for frame_sms in args.frame_sms:
        name = "all_sms" if frame_sms == 0 else f"frames_{frame_sms}"
        try:
            if frame_sms == 0:
                backend.release_graphs()
                backend.__dict__.pop("_decode_static", None)
                backend.frame._side._stream = shipped_side
                codec_capture_on(codec, *shipped_codec)
                all_sms = torch.cuda.get_device_properties(0).multi_processor_count
                figures: dict[str, Any] = {"sm_counts": [all_sms]}
            else:
                partition = SmPartition(frame_sms)
                partitions.append(partition)
                (frame_capture, frame_side), (codec_capture, codec_replay) = partition.streams
                frame_capture_on(backend, frame_capture)
                backend.frame._side._stream = frame_side
                codec_capture_on(codec, codec_capture, codec_replay)
                figures = {"sm_counts": partition.sm_counts}
            figures.update(split_figures(engine))
            if frame_sms in args.timeline:
                level = partial(run_concurrent, engine, 64, LOCKSTEP_FRAMES, 60)
                figures["timeline_64"] = profiled(level, codec.stream)
        except Exception:  # a probe records what fails and goes on
            figures = {"error": traceback.format_exc(limit=6)}
        out[name] = figures
        print(mode, name, json.dumps(figures), flush=True)
    del engine
    torch.cuda.empty_cache()
    return out


def main() -> int:
    parser = measurement_parser(__doc__)
    parser.add_argument(
        "--frame-sms",
        type=comma_ints,
        default="0,120,112,104,96,88,0",
        help="SMs for the frames' partition, the rest the codec's; 0 = the shipped graphs on all SMs",
    )
    parser.add_argument(
        "--timeline",
        type=comma_ints,
        default="",
        help="splits (as in --frame-sms) whose 64-stream lockstep is also traced (`profiled`)",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    timing_model = zero_eos_copy(args.model)
    result = modes_result()
    for mode in args.modes:
        result["modes"][mode] = measure_mode(args, timing_model, mode)
        (args.out / "green-context-lockstep.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

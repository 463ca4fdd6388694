"""Probe: 64 streams' frame as one 64-row graph, against two 32-row graphs (two cohorts of 32 sessions, each
on a frame backend of its own) replayed at once on two CUDA streams, on a full random snapshot.

Why: the 64-row frame (5.1 ms) is mostly a chain of ~1,000 dependent kernels, not throughput: confined to 96
of the 132 SMs it is only 9% longer (run 116). If the chain's latency, not the SMs, sets its time, two
half-size chains side by side fill each other's gaps, and a lockstep of two cohorts would step 64 streams in
less than one 64-row frame. The figures say whether that holds before any scheduler work.

Per mode: the 64-row graph replayed back to back; one 32-row graph alone; both cohorts' 32-row graphs
replayed together (A on one stream, B on another, `--replays` each) and in turn on one stream; the same for
four cohorts of 16 rows.

Usage: python benchmarks/device/concurrent_cohorts.py --model SNAPSHOT --out DIR [--modes fast]
"""

from __future__ import annotations

import json
import time
from typing import Any

import torch
from common import load_timing_engine, measurement_parser, modes_result

from qwen3_tts_native.commands.bench import make_request, replay_ms, zero_eos_copy
from qwen3_tts_native.engine.runtime.graphs import GraphFrameBackend

STREAMS = 64


def together_ms(graphs: list[torch.cuda.CUDAGraph], replays: int) -> float:
    """Milliseconds per round when each graph replays `replays` times back to back on a stream of its own,
    all streams at once."""
    streams = [torch.cuda.Stream() for _ in graphs]

    def run(count: int) -> None:
        for stream in streams:
            stream.wait_stream(torch.cuda.current_stream())
        for _ in range(count):
            for stream, graph in zip(streams, graphs, strict=True):
                with torch.cuda.stream(stream):
                    graph.replay()
        for stream in streams:
            torch.cuda.current_stream().wait_stream(stream)

    run(1)
    torch.cuda.synchronize()
    start = time.perf_counter()
    run(replays)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / replays * 1000


def in_turn_ms(graphs: list[torch.cuda.CUDAGraph], replays: int) -> float:
    """Milliseconds per round when the graphs replay one after another on one stream."""
    for graph in graphs:
        graph.replay()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(replays):
        for graph in graphs:
            graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / replays * 1000


def cohort_backends(engine: Any, sessions: list[Any], cohorts: int) -> list[GraphFrameBackend]:
    """A frame backend per cohort (its own static buffers, scratch and weights), its decode graph captured by
    one step of the cohort's sessions. The graphs replay into the backends' buffers: keep them alive."""
    shipped = engine.frame_backend
    size = len(sessions) // cohorts
    backends = []
    try:
        for index in range(cohorts):
            backend = GraphFrameBackend(
                engine.talker, engine.predictor, shipped.mode, buckets=shipped.buckets
            )
            engine.frame_backend = backend
            engine.step(sessions[index * size : (index + 1) * size])
            backends.append(backend)
    finally:
        engine.frame_backend = shipped
    return backends


def measure_mode(timing_model: Any, mode: str, replays: int) -> dict[str, float]:
    engine = load_timing_engine(timing_model, mode, STREAMS)
    sessions = [engine.start_session(make_request(128, seed=7000 + i)) for i in range(STREAMS)]
    figures: dict[str, float] = {}
    try:
        engine.prefill_many(sessions)
        engine.step(sessions)
        figures["one_64_row_graph_ms"] = replay_ms(engine.frame_backend.decode_graph(STREAMS), replays)
        for cohorts in (2, 4):
            rows = STREAMS // cohorts
            backends = cohort_backends(engine, sessions, cohorts)
            graphs = [backend.decode_graph(rows) for backend in backends]
            figures[f"one_{rows}_row_graph_alone_ms"] = replay_ms(graphs[0], replays)
            figures[f"{cohorts}_cohorts_of_{rows}_together_ms"] = together_ms(graphs, replays)
            figures[f"{cohorts}_cohorts_of_{rows}_in_turn_ms"] = in_turn_ms(graphs, replays)
            torch.cuda.synchronize()
            del graphs, backends
            torch.cuda.empty_cache()
    finally:
        for session in sessions:
            engine.release(session)
    del engine
    torch.cuda.empty_cache()
    return figures


def main() -> int:
    parser = measurement_parser(__doc__)
    parser.add_argument("--replays", type=int, default=20)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    timing_model = zero_eos_copy(args.model)
    result = modes_result()
    for mode in args.modes:
        result["modes"][mode] = measure_mode(timing_model, mode, args.replays)
        print(mode, json.dumps(result["modes"][mode]), flush=True)
        (args.out / "concurrent-cohorts.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

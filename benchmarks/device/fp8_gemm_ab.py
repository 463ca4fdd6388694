"""A/B, in one process, of fast mode's weight formats and of fp8 tensor-core GEMMs for its large products:
int8 weights (fast mode before run 35), fp8 weights (same GEMV, other codes), and fp8 weights whose products
of at least N rows run as fp8 GEMMs instead of bf16 cuBLAS (`Mode.fp8_gemm_min_rows`, `ops.fp8_linear`;
fast mode since, N = 512).

Why: at 64 streams the prefill of the 64 prompts is ~65 ms of a ~330 ms lockstep run, and its bf16 GEMMs are
34 ms of that at ~800 TFLOP/s (run 28's profile), compute-bound; the H200's fp8 rate is twice bf16's.

Per variant: `prefill_many` of 16 and 64 sessions (median of 5), the lockstep run at 64 streams (median of
3: wall, prefill, worst-stream and aggregate RTF), single-stream RTF (median of 3; the GEMV at one row reads
int8 or fp8 codes) and the frame graph's replay at 1 and 64 streams.

Usage: python benchmarks/device/fp8_gemm_ab.py --model SNAPSHOT --out DIR [--variants int8,fp8,fp8-gemm512]
"""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from typing import Any

import torch
from common import comma_names, load_timing_engine, measurement_parser, modes_result
from prefill_profile import prefill_s

from qwen3_tts_native.commands.bench import (
    graph_replay_ms,
    make_request,
    measure_single,
    run_concurrent,
    zero_eos_copy,
)
from qwen3_tts_native.engine.runtime.modes import EXACT, FAST, Mode

RUNS = 3
FRAMES = 32


def variant_mode(name: str) -> Mode:
    """ "exact", "int8", "fp8" or "fp8-gemm<N>" (fp8 weights, fp8 GEMMs from N rows)."""
    if name == "exact":
        return EXACT
    if name == "int8":
        return replace(FAST, weights="int8", fp8_gemm_min_rows=None, triton_fp8_rows=False)
    if name == "fp8":
        return replace(FAST, fp8_gemm_min_rows=None)
    if name.startswith("fp8-gemm"):
        return replace(FAST, fp8_gemm_min_rows=int(name.removeprefix("fp8-gemm")))
    raise ValueError(f"unknown variant {name!r}")


def frame_replay_ms(engine: Any, streams: int) -> float:
    sessions = [engine.start_session(make_request(64, seed=5000 + i)) for i in range(streams)]
    try:
        engine.prefill_many(sessions)
        engine.step(sessions)
        return float(graph_replay_ms(engine, engine.frame_backend, sessions)["graph_replay_ms"])
    finally:
        for session in sessions:
            engine.release(session)


def measure(engine: Any) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for streams in (16, 64):
        prefill_s(engine, streams)
        walls = [prefill_s(engine, streams) for _ in range(5)]
        figures[f"prefill_{streams}_ms"] = statistics.median(walls) * 1e3
    run_concurrent(engine, 64, FRAMES, 60)
    levels = [run_concurrent(engine, 64, FRAMES, 60) for _ in range(RUNS)]
    for figure in ("wall_s", "prefill_s", "worst_stream_rtf", "aggregate_rtf"):
        figures[f"lockstep64_{figure}"] = statistics.median(level[figure] for level in levels)
    figures["lockstep64_worst_stream_rtf_runs"] = [level["worst_stream_rtf"] for level in levels]
    single = measure_single(engine, 64, RUNS)
    figures["single_stream_rtf"] = single["rtf"]["median"]
    figures["frame_loop_rtf"] = single["frame_loop_rtf"]["median"]
    for streams in (1, 64):
        figures[f"frame_replay_{streams}_ms"] = frame_replay_ms(engine, streams)
    return figures


def main() -> int:
    parser = measurement_parser(__doc__, modes=False)
    parser.add_argument("--variants", type=comma_names, default="int8,fp8,fp8-gemm512,fp8-gemm64")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    timing_model = zero_eos_copy(args.model)
    result = modes_result()
    for name in args.variants:
        engine = load_timing_engine(timing_model, variant_mode(name), 64)
        result["modes"][name] = measure(engine)
        print(name, json.dumps(result["modes"][name]), flush=True)
        (args.out / "fp8-gemm-ab.json").write_text(json.dumps(result, indent=2))
        del engine
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Where the time of one `prefill_many` of B fresh sessions goes (the prompt pass of all their prompts and
their frames 0): wall time (median of 3) and a profiler kernel table per batch size.

Why: `lockstep_timeline.py` (run 26) found the 64-stream prefill at 88 ms of a 376 ms lockstep run (fast): a
quarter of every stream's time, against ~22 ms for the pass's GEMM FLOPs at the H200's bf16 rate.

Usage: python benchmarks/device/prefill_profile.py --model SNAPSHOT --out DIR [--streams 16,64]
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import torch
from common import comma_ints, load_timing_engine, measurement_parser, modes_result

from qwen3_tts_native.commands.bench import make_request, zero_eos_copy
from qwen3_tts_native.engine.runtime.engine import VoiceDesignEngine


def prefill_s(engine: VoiceDesignEngine, streams: int) -> float:
    sessions = [engine.start_session(make_request(32, seed=1000 + i)) for i in range(streams)]
    try:
        start = time.perf_counter()
        engine.prefill_many(sessions)
        return time.perf_counter() - start
    finally:
        for session in sessions:
            engine.release(session)


def profile_table(engine: VoiceDesignEngine, streams: int) -> str:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        prefill_s(engine, streams)
        torch.cuda.synchronize()
    return str(prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=90))


def main() -> int:
    parser = measurement_parser(__doc__)
    parser.add_argument("--streams", default="16,64")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    timing_model = zero_eos_copy(args.model)
    levels = comma_ints(args.streams)
    result = modes_result()
    tables = []
    for mode in args.modes:
        engine = load_timing_engine(timing_model, mode, max(levels))
        figures: dict[str, Any] = {}
        for streams in levels:
            prefill_s(engine, streams)
            walls = [prefill_s(engine, streams) for _ in range(3)]
            figures[f"{streams}_streams_prefill_ms"] = statistics.median(walls) * 1e3
            tables.append(f"# {mode}, prefill_many of {streams} sessions\n{profile_table(engine, streams)}\n")
        result["modes"][mode] = figures
        print(mode, json.dumps(figures), flush=True)
        del engine
        torch.cuda.empty_cache()
    (args.out / "prefill-profile.json").write_text(json.dumps(result, indent=2))
    (args.out / "prefill-profile.txt").write_text("\n".join(tables))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The prefill of a lockstep concurrency level (the bench's `run_concurrent`) for the tree on PYTHONPATH: its
wall time over a few runs, and one prefill profiled inside a run (host ops and CUDA runtime calls by self CPU
time, kernels by CUDA time).

Why: run 87 put fast's 64-stream prefill at 91 ms against 51-60 ms before, and run 90 seemed to pin it on
e6d54f2 (slower than its parent f248803 in both alternating pairs, the SM clock the same). Run for each
tree carried under `.whl/` (PYTHONPATH), one process each, and compare the tables. Run 91 did: the same tree
was fast in one process and slow in another, the GPU time the same in every process, the host's time per op
about 2x apart. A prefill of several sessions is host-bound: its wall time follows the host speed.

Usage: python benchmarks/device/lockstep_prefill_profile.py --model SNAPSHOT --out DIR --tag NAME
    [--streams 16]
"""

from __future__ import annotations

import json
import statistics
from typing import Any

import torch
from common import load_timing_engine, measurement_parser, modes_result

from qwen3_tts_native.commands.bench import run_concurrent, zero_eos_copy

FRAMES = 32
RUNS = 3


def main() -> int:
    parser = measurement_parser(__doc__)
    parser.add_argument("--tag", required=True, help="a name for the tree timed, in the output files' names")
    parser.add_argument("--streams", type=int, default=16, help="the level's stream count")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from torch.profiler import ProfilerActivity, profile

    timing_model = zero_eos_copy(args.model)
    result = modes_result()
    tables = []
    for mode in args.modes:
        engine = load_timing_engine(timing_model, mode, args.streams)
        run_concurrent(engine, args.streams, FRAMES, 60)
        walls = [run_concurrent(engine, args.streams, FRAMES, 60)["prefill_s"] for _ in range(RUNS)]
        original = engine.prefill_many
        captured: list[Any] = []

        def profiled(sessions: list[Any], original: Any = original, captured: list[Any] = captured) -> Any:
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                results = original(sessions)
                torch.cuda.synchronize()
            captured.append(prof)
            return results

        engine.prefill_many = profiled
        run_concurrent(engine, args.streams, FRAMES, 60)
        engine.prefill_many = original
        averages = captured[0].key_averages()
        result["modes"][mode] = {
            "streams": args.streams,
            "prefill_ms_runs": [w * 1e3 for w in walls],
            "prefill_ms_median": statistics.median(walls) * 1e3,
        }
        print(mode, json.dumps(result["modes"][mode]), flush=True)
        for key in ("self_cpu_time_total", "cuda_time_total"):
            table = averages.table(sort_by=key, row_limit=30, max_name_column_width=60)
            title = f"# {args.tag} {mode}, prefill of {args.streams} sessions in a lockstep run, by {key}"
            tables.append(f"{title}\n{table}\n")
        del engine
        torch.cuda.empty_cache()
    (args.out / f"lockstep-prefill-{args.tag}.json").write_text(json.dumps(result, indent=2))
    (args.out / f"lockstep-prefill-{args.tag}.txt").write_text("\n".join(tables))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

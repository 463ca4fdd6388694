"""The frame for the code on PYTHONPATH: its graph's replay at 1, 4, 8, 16 and 64 streams, the single-stream
RTF (with and without the codec), the time to first audio and the bench's 64-stream lockstep (aggregate and
worst-stream RTF and the prefill's time, medians; host-bound on a slow host), exact and fast; and the engine's
start (load and every graph's capture, 64 session slots), which the captures set. Run it for
two trees in one call to compare them on one machine (`--compare`), as `codec_packet_time.py` does for the
codec.

Why: a kernel change inside the frame (a GEMV's loads, say) is one build or the other; its effect on the
frame is what counts, and device machines differ by more than such a change.

Usage: python benchmarks/device/frame_time.py --model SNAPSHOT --out DIR --tag NAME
       python benchmarks/device/frame_time.py --compare DIR BASE NEW
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

LOCKSTEP_FRAMES = 32  # the bench's --concurrency-frames in run_all.sh
REPLAY_STREAMS = (1, 4, 8, 16, 64)


def measure(args: argparse.Namespace) -> int:
    import torch
    from common import load_timing_engine, modes_result
    from fp8_gemm_ab import frame_replay_ms

    from qwen3_tts_native.commands.bench import measure_single, measure_ttfa, run_concurrent, zero_eos_copy

    timing_model = zero_eos_copy(args.model)
    result = modes_result()
    for mode in args.modes:
        start = time.perf_counter()
        engine = load_timing_engine(timing_model, mode, 64)
        engine_start_s = time.perf_counter() - start
        figures = {f"frame_replay_{n}_ms": frame_replay_ms(engine, n) for n in REPLAY_STREAMS}
        figures["engine_start_s"] = engine_start_s
        measure_single(engine, 64, 1)
        single = measure_single(engine, 64, args.runs)
        figures["single_stream_rtf"] = single["rtf"]["median"]
        figures["frame_loop_rtf"] = single["frame_loop_rtf"]["median"]
        figures["ttfa_p50_ms"] = measure_ttfa(engine, 20)["p50"]
        run_concurrent(engine, 64, LOCKSTEP_FRAMES, 60)
        levels = [run_concurrent(engine, 64, LOCKSTEP_FRAMES, 60) for _ in range(args.runs)]
        for key in ("aggregate_rtf", "worst_stream_rtf", "prefill_s"):
            figures[f"lockstep_64_{key}"] = statistics.median(level[key] for level in levels)
        result["modes"][mode] = figures
        print(args.tag, mode, json.dumps(figures), flush=True)
        del engine
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"frame-time-{args.tag}.json").write_text(json.dumps(result, indent=2))
    return 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--compare":
        from codec_packet_time import compare

        return compare(Path(sys.argv[2]), sys.argv[3], sys.argv[4], prefix="frame-time")
    from common import measurement_parser

    parser = measurement_parser(__doc__)
    parser.add_argument("--tag", required=True, help="names the JSON written")
    parser.add_argument("--runs", type=int, default=3, help="timed single-stream requests (median taken)")
    return measure(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())

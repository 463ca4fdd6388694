"""A/B, in one process and alternating run by run, of the lockstep concurrency levels with the packed
prompt passes (several sessions prefilled together) replayed on their CUDA graphs (as shipped) and run
eagerly (before: `PACKED_PROMPT_BUCKETS` empty, so such a pass runs its tokens' rows unpadded, from
Python), on a full random snapshot.

Why: run 91 found the 64-stream prefill host-bound when eager (~2,000 host ops a pass, 24-47 ms of host for
15.5 ms of GPU at 16 sessions); only a same-process comparison separates that from the machine's host speed.

Usage: python benchmarks/device/prefill_ab.py --model SNAPSHOT --out DIR [--streams 16,64]
"""

from __future__ import annotations

import json

import torch
from common import comma_ints, load_timing_engine, measurement_parser, modes_result, record_medians

from qwen3_tts_native.commands.bench import run_concurrent, zero_eos_copy
from qwen3_tts_native.engine.runtime import graphs

RUNS = 3
FRAMES = 32


def main() -> int:
    parser = measurement_parser(__doc__)
    parser.add_argument("--streams", default="16,64")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    timing_model = zero_eos_copy(args.model)
    levels = comma_ints(args.streams)
    result = modes_result()
    shipped = graphs.PACKED_PROMPT_BUCKETS
    variants = {"packed_graphs": shipped, "eager": ()}
    for mode in args.modes:
        engine = load_timing_engine(timing_model, mode, max(levels))
        samples: dict[str, dict[str, list[float]]] = {}
        try:
            for streams in levels:
                run_concurrent(engine, streams, FRAMES, 60)
                for _ in range(RUNS):
                    for name, buckets in variants.items():
                        graphs.PACKED_PROMPT_BUCKETS = buckets
                        level = run_concurrent(engine, streams, FRAMES, 60)
                        key = f"{streams}_streams_{name}"
                        for figure in ("wall_s", "prefill_s", "worst_stream_rtf", "aggregate_rtf"):
                            samples.setdefault(key, {}).setdefault(figure, []).append(level[figure])
        finally:
            graphs.PACKED_PROMPT_BUCKETS = shipped
        record_medians(result, mode, samples)
        del engine
        torch.cuda.empty_cache()
    (args.out / "prefill-ab.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

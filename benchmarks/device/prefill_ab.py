"""A/B, in one process and alternating run by run, of the lockstep concurrency levels with the prompt passes
above the graph buckets attending through `PromptLayout` (torch's flash attention over each prompt, as
shipped) and through the per-row decode kernel over the whole cache (before), on a full random snapshot.

Why: run 28's lockstep walls moved the other way from its GPU time (busy -27 ms at 64 streams, wall +32 ms),
on a machine whose host ran slower than run 26's; only a same-process comparison separates the two.

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
    shipped = graphs.PromptLayout.of
    variants = {"layout": shipped, "per_row_kernel": lambda prompts, slots: None}
    for mode in args.modes:
        engine = load_timing_engine(timing_model, mode, max(levels))
        samples: dict[str, dict[str, list[float]]] = {}
        try:
            for streams in levels:
                run_concurrent(engine, streams, FRAMES, 60)
                for _ in range(RUNS):
                    for name, of in variants.items():
                        graphs.PromptLayout.of = of  # type: ignore[method-assign]
                        level = run_concurrent(engine, streams, FRAMES, 60)
                        key = f"{streams}_streams_{name}"
                        for figure in ("wall_s", "prefill_s", "worst_stream_rtf", "aggregate_rtf"):
                            samples.setdefault(key, {}).setdefault(figure, []).append(level[figure])
        finally:
            graphs.PromptLayout.of = shipped  # type: ignore[method-assign]
        record_medians(result, mode, samples)
        del engine
        torch.cuda.empty_cache()
    (args.out / "prefill-ab.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

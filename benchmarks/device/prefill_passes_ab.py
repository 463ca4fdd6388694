"""A/B of a multi-session prefill as bucketed passes (each prompt group within the largest prompt bucket,
replayed from its graph: `graphs.prompt_passes`) against one eager pass of all the prompts, on a full random
snapshot, in one process, variants alternating round by round.

Why: the eager pass above the prompt buckets is about 2,000 host ops (run 91). A prefill of a few sessions
waits on the host: 3 sessions of the bench's 152-token prompt took 15 ms on run 111's host and 26 ms on run
117's, against a few ms of GPU. Bucketed passes are a handful of host ops each, but each pass reads the
weights again, so past some number of passes the one eager pass wins. The figures set
`graphs.BUCKETED_PASSES_MAX`.

Per mode and session count (`--streams`): `prefill_many`'s wall time (`prefill_profile.prefill_s`: sessions
opened before the clock starts, as the bench's lockstep does), median of `--rounds`; and the bench's lockstep
at `--lockstep` streams (`run_concurrent`, 32 frames): aggregate RTF and prefill.

Usage: python benchmarks/device/prefill_passes_ab.py --model SNAPSHOT --out DIR [--modes fast]
"""

from __future__ import annotations

import json
from typing import Any

import torch
from common import comma_ints, load_timing_engine, measurement_parser, modes_result, record_medians
from prefill_profile import prefill_s

from qwen3_tts_native.commands.bench import run_concurrent, zero_eos_copy
from qwen3_tts_native.engine.runtime import graphs

VARIANTS = {"one_eager_pass": 0, "bucketed_passes": 1 << 20}
"""variant -> `graphs.BUCKETED_PASSES_MAX` (0: the eager pass whenever the prompts need more than one)"""
LOCKSTEP_FRAMES = 32


def round_figures(engine: Any, args: Any) -> dict[str, float]:
    figures = {f"prefill_{n}_ms": prefill_s(engine, n) * 1000 for n in args.streams}
    for streams in args.lockstep:
        level = run_concurrent(engine, streams, LOCKSTEP_FRAMES, 60)
        figures[f"lockstep_{streams}_aggregate_rtf"] = level["aggregate_rtf"]
        figures[f"lockstep_{streams}_prefill_ms"] = level["prefill_s"] * 1000
    return figures


def main() -> int:
    parser = measurement_parser(__doc__)
    parser.add_argument("--streams", type=comma_ints, default="2,3,4,6,8,12,16,32,64")
    parser.add_argument("--lockstep", type=comma_ints, default="3,6,16")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (after one warm-up round)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    timing_model = zero_eos_copy(args.model)
    result = modes_result()
    shipped = graphs.BUCKETED_PASSES_MAX
    for mode in args.modes:
        engine = load_timing_engine(timing_model, mode, max([*args.streams, *args.lockstep]))
        samples: dict[str, dict[str, list[float]]] = {variant: {} for variant in VARIANTS}
        for run in range(args.rounds + 1):
            for variant, passes_max in VARIANTS.items():
                graphs.BUCKETED_PASSES_MAX = passes_max
                figures = round_figures(engine, args)
                if run:
                    for key, value in figures.items():
                        samples[variant].setdefault(key, []).append(value)
        graphs.BUCKETED_PASSES_MAX = shipped
        record_medians(result, mode, samples)
        result["modes"][mode]["spread"] = {
            variant: {key: [min(v), max(v)] for key, v in figures_of.items()}
            for variant, figures_of in samples.items()
        }
        (args.out / "prefill-passes-ab.json").write_text(json.dumps(result, indent=2))
        del engine
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

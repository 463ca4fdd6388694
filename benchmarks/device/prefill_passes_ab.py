"""A/B of how a multi-session prefill's prompt passes run, on a full random snapshot, in one process, variants
alternating round by round (`--variants`, each a setting of engine/runtime/graphs.py): `packed_eager` (a pass
above the prompt buckets run eagerly, unpadded) against `packed_graphs` (the shipped settings: padded to a
`graphs.PACKED_PROMPT_BUCKETS` entry and replayed from its graph).

Why: the eager pass above the prompt buckets is about 2,000 host ops (run 91), so a prefill of several
sessions waits on the host where the host is slow: fast's 64-stream prefill took 50 ms on run 111's host and
91 ms on run 117's, with the same GPU work. A replayed pass is a handful of host ops, but runs up to 255
padding rows. Runs 119 and 121 timed bucketed passes (a pass a session, within the largest prompt bucket)
with this script's `BUCKETED_PASSES_MAX` variants as of c0ab73b; run 121 retired that setting.

Per mode and session count (`--streams`): `prefill_many`'s wall time (`prefill_profile.prefill_s`: sessions
opened before the clock starts, as the bench's lockstep does), median of `--rounds`; and the bench's lockstep
at `--lockstep` streams (`run_concurrent`, 32 frames): aggregate RTF and prefill. `load_s`: the engine's load
with every graph captured (the packed passes' among them), once per mode.

Usage: python benchmarks/device/prefill_passes_ab.py --model SNAPSHOT --out DIR [--modes fast]
"""

from __future__ import annotations

import json
import time
from typing import Any

import torch
from common import comma_ints, load_timing_engine, measurement_parser, modes_result, record_medians
from prefill_profile import prefill_s

from qwen3_tts_native.commands.bench import run_concurrent, zero_eos_copy
from qwen3_tts_native.engine.runtime import graphs

VARIANTS: dict[str, dict[str, Any]] = {"packed_eager": {"PACKED_PROMPT_BUCKETS": ()}, "packed_graphs": {}}
"""variant -> the settings of engine/runtime/graphs.py it changes (no `PACKED_PROMPT_BUCKETS`: passes above
the buckets run eagerly, unpadded)"""
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
    parser.add_argument(
        "--variants",
        default="packed_eager,packed_graphs",
        help=f"comma list of two or more of {', '.join(VARIANTS)}",
    )
    args = parser.parse_args()
    variants = {name: VARIANTS[name] for name in args.variants.split(",")}
    args.out.mkdir(parents=True, exist_ok=True)
    timing_model = zero_eos_copy(args.model)
    result = modes_result()
    shipped = {name: getattr(graphs, name) for settings in VARIANTS.values() for name in settings}
    for mode in args.modes:
        start = time.perf_counter()
        engine = load_timing_engine(timing_model, mode, max([*args.streams, *args.lockstep]))
        load_s = time.perf_counter() - start
        samples: dict[str, dict[str, list[float]]] = {variant: {} for variant in variants}
        for run in range(args.rounds + 1):
            for variant, settings in variants.items():
                for name, value in {**shipped, **settings}.items():
                    setattr(graphs, name, value)
                figures = round_figures(engine, args)
                if run:
                    for key, value in figures.items():
                        samples[variant].setdefault(key, []).append(value)
        for name, value in shipped.items():
            setattr(graphs, name, value)
        record_medians(result, mode, samples)
        result["modes"][mode]["load_s"] = load_s
        result["modes"][mode]["spread"] = {
            variant: {key: [min(v), max(v)] for key, v in figures_of.items()}
            for variant, figures_of in samples.items()
        }
        (args.out / f"prefill-ab-{'-'.join(variants)}.json").write_text(json.dumps(result, indent=2))
        del engine
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

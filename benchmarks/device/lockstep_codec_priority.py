"""A/B of the codec stream's priority under load: the bench's lockstep at 64 and 16 streams, one-stream
synthesis and the first packet alone, with the codec graphs on their own high-priority stream (as shipped),
on a stream of the frames' (default) priority, and below the frames (the engine run from a stream of higher
priority than the codec's), on a full random snapshot, in one process, variants alternating run by run.

Why: at 64 streams a lockstep step takes the frame's 5.1 ms plus about the codec's whole share (7.1 ms of GPU
a 4-frame packet, run 111), although the frame's cuBLAS products fill a few dozen SMs at a time. A
high-priority codec takes the SMs first whenever both wait; below the frames, its blocks would fill only what
the frame's chain leaves. Runs 13 and 50 compared priorities at one stream only, where the GEMVs fill the GPU.

Usage: python benchmarks/device/lockstep_codec_priority.py --model SNAPSHOT --out DIR [--rounds N]
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import torch
from common import load_timing_engine, measurement_parser, modes_result, record_medians
from ttfa_codec_stream import StreamVariants, first_audio_figures, stream_priorities, variant_round

from qwen3_tts_native.commands.bench import run_concurrent, zero_eos_copy

LOCKSTEP_FRAMES = 32  # the bench's --concurrency-frames in run_all.sh
LEVELS = (64, 16)


def round_figures(engine: Any, run: int) -> dict[str, float]:
    """A round's figures under one variant: the lockstep levels, then `first_audio_figures`."""
    figures: dict[str, float] = {}
    for streams in LEVELS:
        level = run_concurrent(engine, streams, LOCKSTEP_FRAMES, 60)
        figures[f"lockstep_{streams}_aggregate_rtf"] = level["aggregate_rtf"]
        figures[f"lockstep_{streams}_worst_stream_rtf"] = level["worst_stream_rtf"]
        figures[f"lockstep_{streams}_prefill_s"] = level["prefill_s"]
    figures.update(first_audio_figures(engine, run))
    torch.cuda.synchronize()
    return figures


def main() -> int:
    parser = measurement_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=6, help="timed rounds (after one warm-up round)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    timing_model = zero_eos_copy(args.model)
    result = modes_result()
    for mode in args.modes:
        engine = load_timing_engine(timing_model, mode, 64)
        backend = engine.codec_backend
        assert backend is not None
        own_stream, main_stream = backend.stream, torch.cuda.current_stream()
        even = torch.cuda.Stream(priority=0)
        above_codec = torch.cuda.Stream(priority=even.priority - 1)
        variants: StreamVariants = {
            "codec_high": (own_stream, main_stream),
            "codec_even": (even, main_stream),
            "codec_below": (even, above_codec),
        }
        result.setdefault("stream_priorities", {})[mode] = stream_priorities(variants)
        samples: dict[str, dict[str, list[float]]] = {variant: {} for variant in variants}
        for run in range(args.rounds + 1):
            variant_round(backend, variants, partial(round_figures, engine, run), samples, keep=run > 0)
        backend.stream = own_stream
        record_medians(result, mode, samples)
        del engine
        torch.cuda.empty_cache()
    (args.out / "lockstep-codec-priority.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

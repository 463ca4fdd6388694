"""A/B of time to first audio and one-stream RTF with the codec graphs on their own high-priority CUDA stream,
as shipped, on a stream of their own at the frames' (default) priority, on the engine's main stream, and on
their own stream below the frames (the engine run from a stream of higher priority than the codec's), on a
full random snapshot, in one process; the frame loop alone (`generate_codes`, no codec) is the ceiling.

The first packet's path is timed in parts too (prefill, then the 1-frame packet's decode), so a difference
shows where it comes from. Variants alternate run by run, so drift hits both alike.

Usage: python benchmarks/device/ttfa_codec_stream.py --model SNAPSHOT --out DIR
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from common import load_timing_engine, measurement_parser, modes_result, record_medians

from qwen3_tts_native.commands.bench import FRAME_SECONDS, make_request, zero_eos_copy
from qwen3_tts_native.engine.runtime.engine import VoiceDesignEngine

RUNS = 12
StreamVariants = dict[str, tuple[torch.cuda.Stream, torch.cuda.Stream]]
"""variant name -> (the codec graphs' stream, the stream the engine runs its frames from)"""


def stream_priorities(variants: StreamVariants) -> dict[str, list[int]]:
    """Each variant's [codec stream priority, frame stream priority], for the JSON written."""
    return {name: [codec.priority, frames.priority] for name, (codec, frames) in variants.items()}


def variant_round(
    backend: Any,
    variants: StreamVariants,
    measure: Callable[[], dict[str, float]],
    samples: dict[str, dict[str, list[float]]],
    keep: bool,
) -> None:
    """One round: `measure()` under each variant in turn, the codec backend's stream set and the frames run
    from the variant's stream; its figures are appended to samples[variant] unless `keep` is False (a
    warm-up). The backend keeps the last variant's stream: the caller restores its own."""
    for variant, (codec_stream, frame_stream) in variants.items():
        backend.stream = codec_stream
        with torch.cuda.stream(frame_stream):
            figures = measure()
        if keep:
            for key, value in figures.items():
                samples[variant].setdefault(key, []).append(value)


def first_packet_parts(engine: VoiceDesignEngine, seed: int) -> dict[str, float]:
    start = time.perf_counter()
    session = engine.start_session(make_request(16, seed=seed))
    try:
        result = engine.prefill(session)
        prefilled = time.perf_counter()
        assert result.codes is not None
        engine.decode_packet(session, result.codes.unsqueeze(0))
        done = time.perf_counter()
    finally:
        engine.release(session)
    return {
        "prefill_ms": (prefilled - start) * 1000,
        "decode_ms": (done - prefilled) * 1000,
        "first_audio_ms": (done - start) * 1000,
    }


def synthesize_ms(engine: VoiceDesignEngine, frames: int, seed: int) -> tuple[float, float]:
    start = time.perf_counter()
    packets = engine.synthesize(make_request(frames, seed=seed))
    first_packet = next(packets)
    first = time.perf_counter()
    produced = first_packet.frame_count + sum(p.frame_count for p in packets)
    return (first - start) * 1000, (time.perf_counter() - start) / (produced * FRAME_SECONDS)


def first_audio_figures(engine: VoiceDesignEngine, run: int) -> dict[str, float]:
    """A round's one-stream figures: the first packet's parts, a 48-frame request's first audio and RTF."""
    parts = first_packet_parts(engine, seed=run)
    ttfa, rtf = synthesize_ms(engine, 48, seed=100 + run)
    return {**parts, "synthesize_ttfa_ms": ttfa, "synthesize_rtf": rtf}


def main() -> int:
    args = measurement_parser(__doc__).parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    timing_model = zero_eos_copy(args.model)
    result = modes_result()
    for mode in args.modes:
        engine = load_timing_engine(timing_model, mode, 1)
        backend = engine.codec_backend
        assert backend is not None
        own_stream, main_stream = backend.stream, torch.cuda.current_stream()
        above_codec = torch.cuda.Stream(priority=own_stream.priority - 1)
        variants: StreamVariants = {
            "own_stream": (own_stream, main_stream),
            "own_stream_default_priority": (torch.cuda.Stream(priority=0), main_stream),
            "main_stream": (main_stream, main_stream),
            "frames_above_codec": (own_stream, above_codec),
        }
        result.setdefault("stream_priorities", {})[mode] = stream_priorities(variants)
        samples: dict[str, dict[str, list[float]]] = {variant: {} for variant in [*variants, "frame_loop"]}
        for run in range(RUNS + 1):
            variant_round(backend, variants, partial(first_audio_figures, engine, run), samples, keep=run > 0)
            start = time.perf_counter()
            codes = engine.generate_codes(make_request(48, seed=100 + run))
            if run:
                loop_rtf = (time.perf_counter() - start) / (codes.shape[0] * FRAME_SECONDS)
                samples["frame_loop"].setdefault("generate_codes_rtf", []).append(loop_rtf)
        backend.stream = own_stream
        record_medians(result, mode, samples)
        del engine
        torch.cuda.empty_cache()
    (args.out / "ttfa-codec-stream.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

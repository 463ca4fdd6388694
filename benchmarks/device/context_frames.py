"""A/B, in one process, of fast mode's talker KV cache in e4m3 (`Mode.kv_cache_fp8`, as shipped) against bf16,
as the sessions' context grows: the 64-stream frame graph's replay after 1, 400 and 1200 frames (~150, ~550
and ~1350 positions).

Why: the talker's decode attention reads every cached position of every session, so its share of the frame
grows with the context, while the bench's frames sit at ~150-180 positions, where the e4m3 cache saved
0.1-0.8% of the 64-row frame (run 179): Nsight Compute showed the attention at half the DRAM bytes but bound
by its instructions (run 180). Whether it pays at the lengths a long utterance reaches is measured here.

Both engines (2048 positions a slot) are loaded side by side and measured in alternating rounds.

Usage: python benchmarks/device/context_frames.py --model SNAPSHOT --out DIR [--rounds 2]
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from common import load_timing_engine, measurement_parser, modes_result, record_medians

from qwen3_tts_native.commands.bench import make_request, replay_ms, zero_eos_copy
from qwen3_tts_native.engine.runtime.modes import FAST

STREAMS = 64
MEASURED_AFTER_FRAMES = (1, 400, 1200)


def measure(engine: Any) -> dict[str, float]:
    """The 64-row frame graph's replay (ms) after each of `MEASURED_AFTER_FRAMES` frames of 64 sessions."""
    sessions = [engine.start_session(make_request(1800, seed=7000 + i)) for i in range(STREAMS)]
    figures, stepped = {}, 0
    try:
        engine.prefill_many(sessions)
        for frames in MEASURED_AFTER_FRAMES:
            while stepped < frames:
                engine.step(sessions)
                stepped += 1
            graph = engine.frame_backend.decode_graph(STREAMS)
            figures[f"replay_after_{frames}_frames_ms"] = replay_ms(graph, 20)
    finally:
        for session in sessions:
            engine.release(session)
    return figures


def main() -> int:
    parser = measurement_parser(__doc__, modes=False)
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds")
    args = parser.parse_args()
    timing_model = zero_eos_copy(args.model)
    result = modes_result()
    variants = {"bf16_cache": replace(FAST, kv_cache_fp8=False), "e4m3_cache": FAST}
    engines = {name: load_timing_engine(timing_model, mode, STREAMS, 2048) for name, mode in variants.items()}
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in engines}
    for _ in range(args.rounds):
        for name, engine in engines.items():
            for key, value in measure(engine).items():
                samples[name].setdefault(key, []).append(value)
    record_medians(result, "fast", samples)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "context-frames.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

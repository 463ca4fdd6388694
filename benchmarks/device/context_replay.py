"""What a large talker context costs: the frame graph's replay at 1 and 16 streams (sessions ~160 positions
in) and the time to first audio, at 512 positions a slot (the bench's) and 4096 (the server's cap), with the
prompt graphs' attention spanning their rows (as shipped) and the whole cache (before), in one process.

Why: the server sizes its pool at 4096 positions, where a prompt pass's attention grid had 64 splits a row
and a decode frame's 64 (most of them exiting at once), against 8 at the bench's 512.

Usage: python benchmarks/device/context_replay.py --model SNAPSHOT --out DIR [--modes exact]
"""

from __future__ import annotations

import json
from typing import Any

import torch
from common import load_timing_engine, measurement_parser, modes_result

from qwen3_tts_native.commands.bench import make_request, measure_ttfa, replay_ms, zero_eos_copy
from qwen3_tts_native.engine.runtime import graphs
from qwen3_tts_native.engine.runtime.engine import VoiceDesignEngine

STREAMS = 16


def measure(engine: VoiceDesignEngine) -> dict[str, float]:
    sessions = [engine.start_session(make_request(64, seed=100 + i)) for i in range(STREAMS)]
    try:
        engine.prefill_many(sessions)
        for _ in range(8):
            engine.step(sessions)
        figures = {}
        for batch in (1, STREAMS):
            engine.step(sessions[:batch])
            figures[f"replay_b{batch}_ms"] = replay_ms(engine.frame_backend.decode_graph(batch), 50)  # type: ignore[attr-defined]
    finally:
        for session in sessions:
            engine.release(session)
    figures["ttfa_p50_ms"] = measure_ttfa(engine, 10)["p50"]
    return figures


def main() -> int:
    parser = measurement_parser(__doc__)
    parser.set_defaults(modes="exact")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    timing_model = zero_eos_copy(args.model)
    result = modes_result()
    shipped = graphs.KernelFrame.prompt_hidden

    def whole_cache(
        self: graphs.KernelFrame, rows: graphs.PromptRows, cache: Any, sequences: Any = None
    ) -> Any:
        return self.talker_hidden(
            rows.embeds, rows.positions, rows.slots, cache, distinct_slots=False, sequences=sequences
        )

    for mode in args.modes:
        figures: dict[str, Any] = {}
        for context in (512, 4096):
            for span, prompt_hidden in (("rows", shipped), ("whole_cache", whole_cache)):
                graphs.KernelFrame.prompt_hidden = prompt_hidden  # type: ignore[method-assign]
                try:
                    engine = load_timing_engine(timing_model, mode, STREAMS, context)
                    figures[f"context_{context}_prompt_span_{span}"] = measure(engine)
                finally:
                    graphs.KernelFrame.prompt_hidden = shipped  # type: ignore[method-assign]
                print(
                    mode,
                    context,
                    span,
                    json.dumps(figures[f"context_{context}_prompt_span_{span}"]),
                    flush=True,
                )
                del engine
                torch.cuda.empty_cache()
        result["modes"][mode] = figures
    (args.out / "context-replay.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

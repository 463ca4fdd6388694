"""The codec's residual-unit convs as accumulated taps or on the unfolded copy: one captured 4-frame packet's
replay time at 1, 16 and 64 streams for several `codec.TAP_MIN_COLUMNS` thresholds (never, 32768, 8192,
2048, always), float32 (exact) and bf16 (fast) codecs, in one process; and each variant's waveform against
the never-taps one.

Why: run 14 measured the twelve 7-tap convs alone at 64 streams (bf16 7.29 ms as the engine ran them, 4.50 ms
as taps); this measures the whole packet, and where small passes, which are launch bound, stop gaining.

Usage: python benchmarks/device/codec_taps_ab.py --model SNAPSHOT --out DIR
"""

from __future__ import annotations

import json
from typing import Any

import torch
from common import measurement_parser

from qwen3_tts_native.commands.bench import replay_ms
from qwen3_tts_native.engine.model import codec
from qwen3_tts_native.engine.runtime.codec_graphs import CodecGraphs
from qwen3_tts_native.engine.runtime.engine import VoiceDesignEngine

THRESHOLDS = {"never": 2**62, "32768": 32768, "8192": 8192, "2048": 2048, "always": 0}
BATCHES = (1, 16, 64)
FRAMES = 4


def main() -> int:
    parser = measurement_parser(__doc__)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "modes": {}}
    shipped = codec.TAP_MIN_COLUMNS
    codes = torch.randint(0, 2048, (max(BATCHES), 16, FRAMES), device="cuda", generator=None)
    for mode in [m for m in args.modes.split(",") if m]:
        engine = VoiceDesignEngine.load(
            args.model,
            device="cuda",
            dtype=torch.bfloat16,
            max_sessions=max(BATCHES),
            max_context=512,
            mode=mode,
        )
        assert engine.decoder is not None
        figures: dict[str, Any] = {}
        reference: dict[int, torch.Tensor] = {}
        try:
            for name, threshold in THRESHOLDS.items():
                codec.TAP_MIN_COLUMNS = threshold
                backend = CodecGraphs(engine.decoder, max(BATCHES))
                row: dict[str, float] = {}
                for batch in BATCHES:
                    backend.capture_all([batch])
                    packet = backend._packets[(backend._bucket(batch), FRAMES)]
                    row[f"b{batch}_ms"] = replay_ms(packet.graph, 20)
                    for slot in range(batch):
                        backend.reset(slot)
                    with torch.cuda.stream(backend.stream):
                        wave = backend.decode(list(range(batch)), codes[:batch]).float()
                    torch.cuda.synchronize()
                    if name == "never":
                        reference[batch] = wave
                    else:
                        row[f"b{batch}_max_abs_vs_never"] = float((wave - reference[batch]).abs().max())
                figures[name] = row
                print(mode, name, json.dumps(row), flush=True)
                del backend
                torch.cuda.empty_cache()
        finally:
            codec.TAP_MIN_COLUMNS = shipped
        result["modes"][mode] = figures
        del engine
        torch.cuda.empty_cache()
    (args.out / "codec-taps-ab.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A/B of the bench's lockstep concurrency levels with the codec decodes collected once done (frames go on
while the codec works; `qwen3-tts bench` as shipped) and waited for at once (the server scheduler's way), on a
full random snapshot, in one process, alternating run by run.

Usage: python benchmarks/device/decode_ahead_ab.py --model SNAPSHOT --out DIR
"""

from __future__ import annotations

import json

import torch
from common import comma_ints, load_timing_engine, measurement_parser, modes_result, record_medians

from qwen3_tts_native.commands.bench import run_concurrent, zero_eos_copy

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
    for mode in args.modes:
        engine = load_timing_engine(timing_model, mode, max(levels))
        samples: dict[str, dict[str, list[float]]] = {}
        for streams in levels:
            run_concurrent(engine, streams, FRAMES, 60)  # warm every packet size of this bucket
            for _ in range(RUNS):
                for ahead in (True, False):
                    level = run_concurrent(engine, streams, FRAMES, 60, decode_ahead=ahead)
                    key = f"{streams}_streams_{'ahead' if ahead else 'blocking'}"
                    for name in ("aggregate_rtf", "worst_stream_rtf", "wall_s", "codec_s"):
                        samples.setdefault(key, {}).setdefault(name, []).append(level[name])
        record_medians(result, mode, samples)
        del engine
        torch.cuda.empty_cache()
    (args.out / "decode-ahead-ab.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

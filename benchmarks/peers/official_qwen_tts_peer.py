"""The official qwen-tts 0.1.1 model loop (HF generate, transformers 4.57.3) on a snapshot.

It has no streaming API, so its time to first audio is the time to the whole utterance. With
max_new_tokens=N it returns N-1 frames (model.md §2.6), so N = frames + 1 is asked for.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import parser, run, summarize, timed, timed_syntheses


def main() -> int:
    args = parser(__doc__ or "").parse_args()

    def measure(record: dict[str, Any]) -> None:
        from importlib.metadata import version

        import torch
        from qwen_tts import Qwen3TTSModel

        record["version"] = version("qwen-tts")
        record["transformers"] = version("transformers")
        load_s, model = timed(
            lambda: Qwen3TTSModel.from_pretrained(
                str(args.model), device_map="cuda", dtype=torch.bfloat16, attn_implementation="sdpa"
            )
        )
        record["load_s"] = load_s

        def synth() -> Any:
            return model.generate_voice_design(
                text=args.text, instruct=args.instruct, language=args.language, max_new_tokens=args.frames + 1
            )

        torch.cuda.reset_peak_memory_stats()
        synth()
        frames, rtfs, seconds = timed_syntheses(synth, args.runs)
        record["frames_generated"] = frames
        record["rtf"] = summarize(rtfs)
        record["single_stream_rtf"] = record["rtf"]["median"]
        record["ttfa"] = {"whole_utterance": summarize([s * 1000 for s in seconds])}
        record["ttfa_ms"] = record["ttfa"]["whole_utterance"]["p50"]
        record["ttfa_note"] = "no streaming API: time to the whole utterance of the timed runs"
        record["peak_gpu_memory_bytes"] = torch.cuda.max_memory_allocated()

    return run(args.out, {"peer": "qwen-tts (official loop)", "frames_requested": args.frames}, measure)


if __name__ == "__main__":
    sys.exit(main())

"""faster-qwen3-tts 0.5.4 (CUDA graphs over HF StaticCache) on a snapshot: single-stream RTF and TTFA.

Runs under transformers 5.x with qwen-tts-hf 0.1.1.post1 (the Transformers-5 build of the official package)
and the workaround of shared/docs/peers.md (appendix, b): the 12 Hz tokenizer's Mimi encoder keeps
rope_theta only in `rope_parameters`, so the registered default RoPE init falls back to it.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import parser, run, summarize, timed, timed_syntheses


def patch_rope_default() -> None:
    import torch
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    def default(config: Any, device: Any = None, seq_len: Any = None, layer_type: Any = None) -> Any:
        theta = getattr(config, "rope_theta", None)
        if theta is None:
            params = getattr(config, "rope_parameters", None) or {}
            if layer_type is not None and isinstance(params.get(layer_type), dict):
                params = params[layer_type]
            theta = params.get("rope_theta", 10000.0)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        dim = int(head_dim * getattr(config, "partial_rotary_factor", 1.0))
        exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim
        return 1.0 / (theta**exponents), 1.0

    ROPE_INIT_FUNCTIONS["default"] = default


def load_faster(model: Path) -> Any:
    """FasterQwen3TTS on CUDA (bf16, sdpa, 2048-position static cache) with the RoPE workaround applied."""
    import qwen_tts  # noqa: F401  (registers its compat helpers before we patch)
    import torch

    patch_rope_default()
    from faster_qwen3_tts import FasterQwen3TTS

    return FasterQwen3TTS.from_pretrained(
        str(model), device="cuda", dtype=torch.bfloat16, attn_implementation="sdpa", max_seq_len=2048
    )


def main() -> int:
    args = parser(__doc__ or "").parse_args()

    def measure(record: dict[str, Any]) -> None:
        from importlib.metadata import version

        import torch

        record["version"] = version("faster-qwen3-tts")
        record["transformers"] = version("transformers")
        load_s, model = timed(partial(load_faster, args.model))
        record["load_s"] = load_s

        def synth() -> Any:
            return model.generate_voice_design(
                text=args.text, instruct=args.instruct, language=args.language, max_new_tokens=args.frames
            )

        torch.cuda.reset_peak_memory_stats()
        synth()  # warm-up: graph capture and the first call at this length
        frames, rtfs, _ = timed_syntheses(synth, args.runs)
        record["frames_generated"] = frames
        record["rtf"] = summarize(rtfs)
        record["single_stream_rtf"] = record["rtf"]["median"]
        ttfa: dict[str, Any] = {}
        for chunk in (1, 12):
            values = []
            for _ in range(args.ttfa_runs + 1):
                stream = model.generate_voice_design_streaming(
                    text=args.text,
                    instruct=args.instruct,
                    language=args.language,
                    max_new_tokens=args.frames,
                    chunk_size=chunk,
                )
                seconds, _ = timed(partial(next, stream))
                stream.close()
                values.append(seconds * 1000)
            ttfa[f"chunk_{chunk}"] = summarize(values[1:])
        record["ttfa"] = ttfa
        record["ttfa_ms"] = ttfa["chunk_1"]["p50"]
        record["ttfa_note"] = "in process, time to the first yielded chunk (chunk_size 1 and its default 12)"
        record["peak_gpu_memory_bytes"] = torch.cuda.max_memory_allocated()

    return run(args.out, {"peer": "faster-qwen3-tts", "frames_requested": args.frames}, measure)


if __name__ == "__main__":
    sys.exit(main())

"""A/B, in one process, of the tensor-core products (`ops.tensor_core_linear`, `Mode.tensor_core_max_rows`)
against bf16 cuBLAS for the frame's products of 4 rows to the mode's `tensor_core_max_rows` (or every product
the kernel takes, up to 128 rows, with --max-rows 128), in each mode.

Why: at 64 streams the frame's products are cuBLAS kernels of 5-6 us each (no dependent launch, bf16 weights
in fast mode too) plus split-K reductions and SwiGLU kernels: most of run 95's 5.3 ms 64-stream frame.

For each mode both engines are loaded side by side (the same snapshot; the variant's Mode differs only in
`tensor_core_max_rows`) and measured in alternating rounds: the frame graph's replay at 4, 16, 32 and 64
streams and the bench's 64-stream lockstep (aggregate and worst-stream RTF, prefill). A torch-profiler
table of one 64-stream frame of each variant goes to --out beside the JSON.

Usage: python benchmarks/device/tensor_core_ab.py --model SNAPSHOT --out DIR [--rounds 3] [--max-rows N]
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import torch
from common import load_timing_engine, measurement_parser, modes_result, record_medians
from fp8_gemm_ab import frame_replay_ms

from qwen3_tts_native.commands.bench import profile_frame, run_concurrent, zero_eos_copy
from qwen3_tts_native.engine.runtime.modes import resolve_mode

LOCKSTEP_FRAMES = 32  # the bench's --concurrency-frames in run_all.sh
REPLAY_STREAMS = (4, 16, 32, 64)


def measure(engine: Any) -> dict[str, float]:
    figures = {f"frame_replay_{s}_ms": frame_replay_ms(engine, s) for s in REPLAY_STREAMS}
    level = run_concurrent(engine, 64, LOCKSTEP_FRAMES, 60)
    for key in ("aggregate_rtf", "worst_stream_rtf", "prefill_s", "wall_s"):
        figures[f"lockstep_64_{key}"] = level[key]
    return figures


def main() -> int:
    parser = measurement_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per mode")
    parser.add_argument(
        "--max-rows", type=int, default=None, help="the variant's tensor_core_max_rows (default: the mode's)"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    timing_model = zero_eos_copy(args.model)
    result = modes_result()
    for mode_name in args.modes:
        mode = resolve_mode(mode_name)
        rows = mode.tensor_core_max_rows if args.max_rows is None else args.max_rows
        variants = {
            "cublas": replace(mode, tensor_core_max_rows=0),
            "tensor_cores": replace(mode, tensor_core_max_rows=rows),
        }
        engines = {name: load_timing_engine(timing_model, variant, 64) for name, variant in variants.items()}
        for engine in engines.values():
            run_concurrent(engine, 64, LOCKSTEP_FRAMES, 60)  # warm: every bucket's graphs, the allocator
        samples: dict[str, dict[str, list[float]]] = {name: {} for name in engines}
        for _ in range(args.rounds):
            for name, engine in engines.items():
                for key, value in measure(engine).items():
                    samples[name].setdefault(key, []).append(value)
        record_medians(result, mode_name, samples)
        for name, engine in engines.items():
            path = args.out / f"tc-ab-{mode_name}-{name}-b64.txt"
            profile = profile_frame(engine, engine.frame_backend, 64, path)
            result["modes"][mode_name][f"profile_b64_{name}"] = profile
        medians = result["modes"][mode_name]["median"]
        print(
            mode_name,
            "64-stream replay",
            f"{medians['cublas']['frame_replay_64_ms']:.3f} ->",
            f"{medians['tensor_cores']['frame_replay_64_ms']:.3f} ms",
            flush=True,
        )
        del engines
        torch.cuda.empty_cache()
    (args.out / "tensor-core-ab.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

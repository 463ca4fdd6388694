"""A/B, in one process, of the 33-64-row products on Triton (the MLP's and o: `Mode.triton_max_rows`, 64)
against bf16 cuBLAS with `silu_mul` and split-K reductions (0), in each mode.

Why: run 148 (triton_products_ceiling.py) timed the gate/up and down products alone faster on Triton at 64
rows, ~0.27 ms of a 5.1 ms 64-stream frame in all; a product's time alone does not carry to the frame (run
107), so the frames decide.

Both engines of a mode are loaded side by side (the same snapshot) and measured in alternating rounds as
tensor_core_ab.py measures: the frame graph's replay at 4, 16, 32 and 64 streams and the bench's 64-stream
lockstep (aggregate and worst-stream RTF, prefill). A torch-profiler table of one 64-stream frame of each
variant goes to --out beside the JSON.

Usage: python benchmarks/device/triton_mlp_ab.py --model SNAPSHOT --out DIR [--rounds 2]
"""

from __future__ import annotations

import json
from dataclasses import replace

import torch
from common import load_timing_engine, measurement_parser, modes_result, record_medians
from tensor_core_ab import LOCKSTEP_FRAMES, measure

from qwen3_tts_native.commands.bench import profile_frame, run_concurrent, zero_eos_copy
from qwen3_tts_native.engine.runtime.modes import resolve_mode


def main() -> int:
    parser = measurement_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per mode")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    timing_model = zero_eos_copy(args.model)
    result = modes_result()
    for mode_name in args.modes:
        mode = resolve_mode(mode_name)
        variants = {"cublas": replace(mode, triton_max_rows=0), "triton": mode}
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
            path = args.out / f"triton-mlp-ab-{mode_name}-{name}-b64.txt"
            result["modes"][mode_name][f"profile_b64_{name}"] = profile_frame(
                engine, engine.frame_backend, 64, path
            )
        medians = result["modes"][mode_name]["median"]
        for key in sorted(medians["cublas"]):
            base, new = medians["cublas"][key], medians["triton"][key]
            print(f"{mode_name} {key}: {base:.5g} -> {new:.5g}", flush=True)
        (args.out / "triton-mlp-ab.json").write_text(json.dumps(result, indent=2))
        del engines
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

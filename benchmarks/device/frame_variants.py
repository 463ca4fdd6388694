"""A/B of the one-stream CUDA frame on a full random snapshot: with and without programmatic dependent launch
(kernels/csrc/launch.cuh), with the RMSNorms as kernels of their own instead of inside the GEMVs
(`Mode.norm_in_gemv`), and with another GEMV/cuBLAS crossover (`Mode.gemm_min_rows`) where asked.

For each mode, the frame graph of bucket 1 is captured once per variant and replayed back to back (no host
work), so the differences are the GPU's alone. A torch-profiler kernel table of the frame (plain launches)
goes to --out too. `--max-context` sizes the talker cache (the attention grid follows it; the server's
default is 4096), so two runs show what a longer cache costs a frame at the same position.

Usage: python benchmarks/device/frame_variants.py --model SNAPSHOT --out DIR [--gemm-min-rows exact=3,fast=2]
       [--max-context 4096]
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import torch
from common import measurement_parser

from qwen3_tts_native.commands.bench import make_request, replay_ms, zero_eos_copy
from qwen3_tts_native.engine.kernels import ops
from qwen3_tts_native.engine.runtime import graphs
from qwen3_tts_native.engine.runtime.engine import VoiceDesignEngine
from qwen3_tts_native.engine.runtime.modes import resolve_mode

REPLAYS = 30


def kernel_table(engine: VoiceDesignEngine, session: Any) -> str:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        engine.step([session])
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.device_time for e in kernels) / 1000
    header = f"kernels {len(kernels)}, GPU busy {busy:.3f} ms\n"
    return header + prof.key_averages().table(sort_by="cuda_time_total", row_limit=14)


def main() -> int:
    parser = measurement_parser(__doc__)
    parser.add_argument(
        "--max-context",
        type=int,
        default=512,
        help="talker positions per session (the server's default is 4096)",
    )
    parser.add_argument(
        "--gemm-min-rows",
        default="",
        help="an extra variant per mode with this crossover, e.g. exact=3,fast=2 (dependent launch on)",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    crossovers = dict(item.split("=") for item in args.gemm_min_rows.split(",") if item)
    timing_model = zero_eos_copy(args.model)
    base = VoiceDesignEngine.load(
        timing_model,
        device="cuda",
        dtype=torch.bfloat16,
        max_sessions=1,
        max_context=args.max_context,
        accelerate=False,
    )
    result: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "max_context": args.max_context,
        "modes": {},
    }
    tables = []
    for mode_name in args.modes:
        mode = resolve_mode(mode_name)
        variants = [
            ("plain_launch", False, mode),
            ("dependent_launch", True, mode),
            ("norm_kernels", True, replace(mode, norm_in_gemv=False)),
        ]
        if mode_name in crossovers:
            rows = int(crossovers[mode_name])
            variants.append((f"gemm_min_rows_{rows}", True, replace(mode, gemm_min_rows=rows)))
        figures: dict[str, float] = {"gemm_min_rows": mode.gemm_min_rows}
        for label, dependent, variant_mode in variants:
            backend = graphs.GraphFrameBackend(base.talker, base.predictor, variant_mode, buckets=(1,))
            undo = graphs.install(base, backend)
            session = base.start_session(make_request(300, seed=7))
            try:
                base.prefill(session)
                ops.set_dependent_launch(dependent)
                backend.release_graphs()
                base.step([session])  # captures bucket 1 with this variant
                figures[label] = replay_ms(backend.decode_graph(1), REPLAYS)
                if not dependent:
                    tables.append(f"# {mode_name}, plain launches\n{kernel_table(base, session)}\n")
            finally:
                ops.set_dependent_launch(True)
                base.release(session)
                undo()
                backend.release_graphs()
        result["modes"][mode_name] = figures
        print(mode_name, json.dumps(figures, indent=1), flush=True)
    suffix = "" if args.max_context == 512 else f"-context{args.max_context}"
    (args.out / f"frame-variants{suffix}.json").write_text(json.dumps(result, indent=2))
    (args.out / f"frame-variants-kernels{suffix}.txt").write_text("\n".join(tables))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Engine-side time to first audio of several engine variants loaded side by side in one process, measured in
alternating rounds (`qwen3-tts bench`'s `measure_ttfa`: a 16-frame request, until its first packet).

Why: run 37's bench put fast mode's first audio at 11.7 ms against 10.3 ms in run 33 (a spread of 9.4-11.6
ms there), after fast mode moved from int8 to fp8 weights; only one process and one machine tell a change
from the machine.

Usage: python benchmarks/device/ttfa_ab.py --model SNAPSHOT --out DIR [--variants exact,int8,fp8-gemm512]
"""

from __future__ import annotations

import json
import statistics
from typing import Any

from common import comma_names, load_timing_engine, measurement_parser, modes_result
from fp8_gemm_ab import variant_mode

from qwen3_tts_native.commands.bench import measure_ttfa, zero_eos_copy

ROUNDS = 4
RUNS = 10


def main() -> int:
    parser = measurement_parser(__doc__, modes=False)
    parser.add_argument("--variants", type=comma_names, default="exact,int8,fp8-gemm512")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    timing_model = zero_eos_copy(args.model)
    names = args.variants
    engines: dict[str, Any] = {
        name: load_timing_engine(timing_model, variant_mode(name), 4) for name in names
    }
    samples: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(ROUNDS):
        for name, engine in engines.items():
            samples[name].append(measure_ttfa(engine, RUNS)["median"])
    result = modes_result()
    result["modes"] = {
        name: {"ttfa_median_ms": statistics.median(values), "round_medians_ms": values}
        for name, values in samples.items()
    }
    print(json.dumps(result["modes"], indent=1), flush=True)
    (args.out / "ttfa-ab.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

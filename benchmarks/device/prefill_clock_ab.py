"""The lockstep levels' prefill for the tree on PYTHONPATH, with the engine's heap frozen for the collector
(as `accelerate` leaves it) and unfrozen, alternating run by run in one process, beside the GPU's SM clock and
power draw sampled every 100 ms while they run (`nvidia-smi`).

Why: run 87 put fast's 64-stream prefill at 91 ms against 51-60 ms in every earlier bench, while the
latency-bound frame replays matched run 84 to 0.01 ms. Run for this tree and for its parent (a tree carried
under `.whl/`) in one call: the same figures for both trees say the machine (a lower clock under load shows in
the samples), a gap between them says the code, and a gap between frozen and unfrozen says the collector.

Usage: python benchmarks/device/prefill_clock_ab.py --model SNAPSHOT --out DIR --tag NAME [--streams 16,64]
"""

from __future__ import annotations

import gc
import json
import statistics
import subprocess
import threading

import torch
from common import comma_ints, load_timing_engine, measurement_parser, modes_result, record_medians

from qwen3_tts_native.commands.bench import run_concurrent, zero_eos_copy

RUNS = 3
FRAMES = 32
SAMPLE_MS = 100


class ClockSampler:
    """`nvidia-smi`'s SM clock (MHz) and power draw (W) of GPU 0, every `SAMPLE_MS`, while it runs."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self._process: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None

    def __enter__(self) -> ClockSampler:
        command = [
            "nvidia-smi",
            "--id=0",
            "--query-gpu=clocks.sm,power.draw",
            "--format=csv,noheader,nounits",
            f"--loop-ms={SAMPLE_MS}",
        ]
        self._process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            try:
                clock, power = (float(part) for part in line.split(","))
            except ValueError:  # "[N/A]" where the driver does not report a value
                continue
            self.samples.append((clock, power))

    def __exit__(self, *exc: object) -> None:
        assert self._process is not None and self._reader is not None
        self._process.terminate()
        self._process.wait()
        self._reader.join(timeout=5)

    def summary(self) -> dict[str, float]:
        clocks, powers = [c for c, _ in self.samples], [p for _, p in self.samples]
        return {
            "samples": len(self.samples),
            "sm_clock_mhz_median": statistics.median(clocks) if clocks else float("nan"),
            "sm_clock_mhz_min": min(clocks) if clocks else float("nan"),
            "power_w_median": statistics.median(powers) if powers else float("nan"),
            "power_w_max": max(powers) if powers else float("nan"),
        }


def main() -> int:
    parser = measurement_parser(__doc__)
    parser.add_argument("--tag", required=True, help="a name for the tree timed, in the output file's name")
    parser.add_argument("--streams", type=comma_ints, default="16,64", help="comma list of stream counts")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    timing_model = zero_eos_copy(args.model)
    result = modes_result()
    for mode in args.modes:
        engine = load_timing_engine(timing_model, mode, max(args.streams))
        gc.collect()
        gc.freeze()  # what `accelerate` does since e6d54f2; a parent tree's engine is frozen here too
        samples: dict[str, dict[str, list[float]]] = {}
        with ClockSampler() as sampler:
            for streams in args.streams:
                run_concurrent(engine, streams, FRAMES, 60)
                for _ in range(RUNS):
                    for heap in ("frozen", "unfrozen"):
                        if heap == "unfrozen":
                            gc.unfreeze()
                        level = run_concurrent(engine, streams, FRAMES, 60)
                        if heap == "unfrozen":
                            gc.collect()
                            gc.freeze()
                        key = f"{streams}_streams_{heap}"
                        for figure in ("prefill_s", "wall_s", "aggregate_rtf", "worst_stream_rtf"):
                            samples.setdefault(key, {}).setdefault(figure, []).append(level[figure])
        record_medians(result, mode, samples)
        result["modes"][mode]["gpu_while_running"] = sampler.summary()
        print(mode, json.dumps(result["modes"][mode]["gpu_while_running"]), flush=True)
        del engine
        torch.cuda.empty_cache()
    (args.out / f"prefill-clock-{args.tag}.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

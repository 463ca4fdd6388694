"""Shared by the device acceptance scripts: SIGTERM handling, package versions, command output, snapshots.

The scripts run standalone (``python benchmarks/device/X.py``, so this folder is on ``sys.path``), and
foundation_parity.py also runs as its own reference worker under the official package's PYTHONPATH, so this
file imports only the standard library (the project only inside `ensure_snapshot`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]


class Terminated(BaseException):
    """SIGTERM (e.g. from `timeout`): stop measuring, stop the children, write what was measured."""


def terminate(signum: int, frame: object) -> None:
    """The SIGTERM handler: `signal.signal(signal.SIGTERM, terminate)`."""
    raise Terminated(f"signal {signum}")


def package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def run_commit() -> str | None:
    """The commit measured: the COMMIT variable when set (run_all.sh's; a checkout's .git, when it travels,
    may be older than its files), else HEAD of the checkout, else None."""
    return os.environ.get("COMMIT") or command_output(["git", "rev-parse", "HEAD"])


def command_output(command: list[str]) -> str | None:
    """First line of a command's output (run in the repository), or None if it fails."""
    try:
        done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.strip().splitlines()
    return lines[0] if lines else None


def ensure_snapshot(model: Path, preset: str, seed: int) -> bool:
    """Write a random snapshot of `preset`/`seed` into `model` unless one is there; True if written."""
    if (model / "config.json").is_file():
        return False
    from qwen3_tts_native.engine.checkpoint import write_random_snapshot

    write_random_snapshot(model, "full" if preset == "full" else "tiny", seed)
    return True


def add_snapshot_arguments(parser: argparse.ArgumentParser) -> None:
    """--model, --preset and --seed: which snapshot a script measures, written first if missing."""
    parser.add_argument(
        "--model",
        type=Path,
        default=None,
        help="snapshot directory; written first (random, --preset/--seed) if it has no config.json "
        "(default: /tmp/q3tts/<preset>-seed<seed>)",
    )
    parser.add_argument("--preset", choices=("full", "tiny"), default="full", help="preset of a new snapshot")
    parser.add_argument("--seed", type=int, default=0, help="seed of a new snapshot (default 0)")


def snapshot_path(args: argparse.Namespace) -> Path:
    """The absolute snapshot directory the arguments of `add_snapshot_arguments` name."""
    return (args.model or Path(f"/tmp/q3tts/{args.preset}-seed{args.seed}")).absolute()


def measurement_parser(
    description: str | None, modes: bool = True, model: bool = True
) -> argparse.ArgumentParser:
    """The arguments of the one-process measurement scripts: --model SNAPSHOT (unless `model` is off: a
    micro-benchmark of ops on made-up tensors) and --out DIR, both required, and --modes (default
    exact,fast)."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    if model:
        parser.add_argument("--model", type=Path, required=True, help="full random snapshot directory")
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON written")
    if modes:
        parser.add_argument(
            "--modes", type=comma_names, default="exact,fast", help="comma list of engine modes"
        )
    return parser


def modes_result() -> dict[str, Any]:
    """The JSON a per-mode measurement script fills: the GPU's name, torch's version, an empty "modes"."""
    import torch

    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "modes": {}}


def load_timing_engine(model: Path, mode: Any, max_sessions: int, max_context: int = 512) -> Any:
    """The engine the measurement scripts time: bf16 on CUDA in `mode` (a name or a `Mode`), graphs
    captured, `max_context` positions a slot (the bench's default)."""
    import torch

    from qwen3_tts_native.engine.runtime.engine import VoiceDesignEngine

    return VoiceDesignEngine.load(
        model,
        device="cuda",
        dtype=torch.bfloat16,
        max_sessions=max_sessions,
        max_context=max_context,
        mode=mode,
    )


def median_request_ms(engine: Any, flow: Callable[[Any, int], object], runs: int) -> float:
    """The median wall time (ms) of `runs` requests of a flow (`flow(engine, seed)`, seeds 0..runs-1), each
    started from an idle GPU and waited for (the in-process A/B scripts' timing)."""
    import time

    import torch

    values = []
    for seed in range(runs):
        torch.cuda.synchronize()
        start = time.perf_counter()
        flow(engine, seed)
        values.append((time.perf_counter() - start) * 1e3)
        torch.cuda.synchronize()
    return statistics.median(values)


def comma_names(text: str) -> list[str]:
    """ "exact, fast," -> ["exact", "fast"] (a --modes or --variants argument: an argparse `type`)."""
    return [part.strip() for part in text.split(",") if part.strip()]


def comma_ints(text: str) -> list[int]:
    """ "1,16,64" -> [1, 16, 64] (a --streams argument)."""
    return [int(part) for part in comma_names(text)]


def record_medians(result: dict[str, Any], mode: str, samples: dict[str, dict[str, list[float]]]) -> None:
    """Store one mode's samples (variant -> figure -> values) and their medians in result["modes"], and print
    the medians."""
    medians = {v: {k: statistics.median(x) for k, x in d.items()} for v, d in samples.items()}
    result["modes"][mode] = {"median": medians, "samples": samples}
    print(mode, json.dumps(medians, indent=1), flush=True)

"""``qwen3-tts model make-random``: write a random-weight snapshot in the real Hugging Face layout."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import usage_error


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "make-random",
        help="write a random-weight snapshot (tiny or full size) in the real layout",
        description=(
            "Write a snapshot with random weights and the real file layout, tensor names and token ids. "
            "The official qwen-tts package and this engine both load it, so it serves parity tests, demos "
            "and benchmarks without the real checkpoint. The same preset and seed give the same bytes. "
            "It produces noise, not speech. DIR/qwen3-tts-manifest.json records its identity, so "
            "`qwen3-tts serve --model DIR` accepts it."
        ),
    )
    parser.add_argument(
        "--preset",
        choices=("tiny", "full"),
        default="tiny",
        help=(
            "tiny: small widths for tests and demos (about 30 MB, written in seconds); full: exactly the "
            "tensor names, shapes and dtypes of the real 1.7B checkpoint (about 4.5 GB). Default: tiny"
        ),
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights (default: 0)")
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="DIR",
        help="directory to create; it must not exist yet or be empty",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    from ..engine.checkpoint import planned_bytes, write_random_snapshot
    from ..engine.identity import MANIFEST_FILENAME, load_manifest

    console = Console(stderr=True)
    out: Path = args.out
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        return usage_error(f"{out} exists and is not empty; choose a new or empty directory")
    if not 0 <= args.seed < 2**63:
        return usage_error(f"--seed must be in 0 .. 2**63-1, got {args.seed}")
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(f"writing {args.preset} snapshot", total=planned_bytes(args.preset))

        def report(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        try:
            path = write_random_snapshot(out, args.preset, args.seed, report)
        except OSError as error:
            print(f"error: cannot write {out}: {error}", file=sys.stderr)
            return 1
    manifest = load_manifest(path / MANIFEST_FILENAME)
    print(f"wrote {args.preset} snapshot (seed {args.seed}, random weights) to {path}")
    print(f"identity {manifest.repository}@{manifest.revision} in {MANIFEST_FILENAME}")
    return 0

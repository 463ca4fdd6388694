"""The ``qwen3-tts`` command line: composes the engine, release and evidence groups."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import __version__
from .commands import bench, evidence, model_identity, model_random, release, serve, synthesize


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qwen3-tts",
        description=(
            "Serve Qwen3-TTS-12Hz-1.7B-VoiceDesign: text + a voice description in, 24 kHz speech out. "
            "Without --model every command uses a tiny demo checkpoint with random weights "
            "(it produces noise, not speech)."
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    groups = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    synthesize.register(groups)
    serve.register(groups)
    model_parser = groups.add_parser(
        "model",
        help="make, pin, fetch and verify model snapshots",
        description="Model snapshots: make random ones of the real layout, pin, fetch and verify real ones.",
    )
    model_commands = model_parser.add_subparsers(dest="model_command", metavar="SUBCOMMAND", required=True)
    model_random.register(model_commands)
    model_identity.register(model_commands)
    bench.register(groups)
    release.register(groups)
    evidence.register(groups)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        return int(handler(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130

"""``qwen3-tts serve``: the HTTP API on one engine, configured by flags or ``QWEN3_TTS_*`` variables."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXIT_USAGE = 2

_FLAGS: tuple[tuple[str, type, str, str], ...] = (
    (
        "--model",
        Path,
        "DIR",
        "snapshot directory (default: the embedded tiny demo checkpoint, random weights)",
    ),
    ("--host", str, "HOST", "listen address (default: 127.0.0.1)"),
    ("--port", int, "PORT", "listen port (default: 8080)"),
    ("--device", str, "DEVICE", "cpu, cuda or cuda:N (default: cuda when available, else cpu)"),
    (
        "--max-concurrent-requests",
        int,
        "N",
        "synthesis slots, streamed and buffered together (default: 8 on CUDA, 1 on CPU)",
    ),
    ("--max-text-bytes", int, "N", "largest text in UTF-8 bytes (default: 32768)"),
    ("--max-voice-description-bytes", int, "N", "largest voice description in UTF-8 bytes (default: 4096)"),
    ("--max-duration-seconds", float, "S", "longest audio a request may ask for (default: 120)"),
    (
        "--slow-client-timeout-s",
        float,
        "S",
        "cancel a stream whose client does not take a chunk in S (default: 5)",
    ),
    (
        "--retirement-timeout-s",
        float,
        "S",
        "mark the engine unhealthy if a slot is not freed in S (default: 25)",
    ),
    (
        "--drain-timeout-s",
        float,
        "S",
        "on SIGTERM, let running requests finish for S, then cancel them (default: 20)",
    ),
    ("--shutdown-timeout-s", float, "S", "on SIGTERM, exit within S no matter what (default: 35)"),
    ("--log-level", str, "LEVEL", "critical, error, warning, info or debug (default: info)"),
)


def _env_name(flag: str) -> str:
    return "QWEN3_TTS_" + flag.removeprefix("--").replace("-", "_").upper()


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "serve",
        help="serve the HTTP API (progressive multipart PCM, WAV, OpenAI-compatible /v1/audio/speech)",
        description=(
            "Serve the HTTP API. Every flag has an environment variable (in brackets); a flag wins over its "
            "variable. The port opens only after the engine has loaded and a warm-up request has produced "
            "audio. SIGTERM drains: new requests get 503, running ones finish or are cancelled, exit 0."
        ),
    )
    for flag, kind, metavar, help_text in _FLAGS:
        parser.add_argument(flag, type=kind, metavar=metavar, help=f"{help_text} [{_env_name(flag)}]")
    parser.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    from ..engine.server.runner import load_engine, run
    from ..engine.server.settings import SettingsError, load_settings

    names = [flag.removeprefix("--").replace("-", "_") for flag, *_ in _FLAGS]
    try:
        settings = load_settings(**{name: getattr(args, name) for name in names})
    except SettingsError as error:
        print(f"qwen3-tts serve: {error}", file=sys.stderr)
        return EXIT_USAGE
    if settings.model is None:
        from ..engine.demo import DEMO_NOTICE

        print(DEMO_NOTICE, file=sys.stderr)
    import torch

    return run(settings.resolved(torch.cuda.is_available()), load_engine)

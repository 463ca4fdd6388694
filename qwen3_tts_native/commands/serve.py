"""``qwen3-tts serve``: the HTTP API on one engine, configured by flags or ``QWEN3_TTS_*`` variables."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from . import EXIT_USAGE

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
    (
        "--max-duration-seconds",
        float,
        "S",
        "longest audio a request may ask for, also its default (default: 120; 3.2 with the demo checkpoint)",
    ),
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
    (
        "--threads",
        int,
        "N",
        "torch CPU threads (default: OMP_NUM_THREADS if set, else 1 for the demo checkpoint and "
        "min(4, cores) for a real model)",
    ),
)
_ALLOW_UNVERIFIED = "--allow-unverified-model"
_EPILOG = (
    "Model identity: a --model snapshot is checked against its manifest (DIR/qwen3-tts-manifest.json, "
    "or the shipped pin of the real model; see `qwen3-tts model verify`) before it is loaded. "
    "Exit status: 0 after a clean stop; 1 if the server could not start (engine load or warm-up failed); "
    "2 for a bad setting or a model that fails its identity check; 124 if shutdown hung."
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
        epilog=_EPILOG,
    )
    for flag, kind, metavar, help_text in _FLAGS:
        parser.add_argument(flag, type=kind, metavar=metavar, help=f"{help_text} [{_env_name(flag)}]")
    parser.add_argument(
        _ALLOW_UNVERIFIED,
        action="store_true",
        default=None,
        help="serve a --model that fails its identity check anyway; a warning is logged "
        f"[{_env_name(_ALLOW_UNVERIFIED)}=1]",
    )
    parser.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    from ..engine.server.runner import configure_logging, load_engine, run
    from ..engine.server.settings import SettingsError, load_settings

    flags = [*(flag for flag, *_ in _FLAGS), _ALLOW_UNVERIFIED]
    names = [flag.removeprefix("--").replace("-", "_") for flag in flags]
    try:
        settings = load_settings(**{name: getattr(args, name) for name in names})
    except SettingsError as error:
        print(f"qwen3-tts serve: {error}", file=sys.stderr)
        return EXIT_USAGE
    configure_logging(settings)
    logger = logging.getLogger("qwen3_tts.server")
    if settings.model is None:
        from ..engine.demo import DEMO_NOTICE

        print(DEMO_NOTICE, file=sys.stderr)
    elif not _model_verified(settings.model, settings.allow_unverified_model, logger):
        return EXIT_USAGE
    import torch

    from ..engine.threads import configure_cpu_threads

    threads = configure_cpu_threads(settings.threads or None, demo=settings.model is None)
    logger.info("torch CPU threads: %d", threads)
    return run(settings.resolved(torch.cuda.is_available()), load_engine)


def _model_verified(model: Path, allow_unverified: bool, logger: logging.Logger) -> bool:
    """Check ``model`` against its manifest; False (after saying why and what to do) if it must not serve."""
    from ..engine.identity import verify_snapshot_for_serving

    logger.info("verifying the model snapshot against its manifest")
    result = verify_snapshot_for_serving(model)
    if result.ok:
        logger.info("model verified: %s", result.identity)
        return True
    if allow_unverified:
        logger.warning(
            "serving an UNVERIFIED model: %d identity problem(s) ignored because of %s",
            len(result.problems),
            _ALLOW_UNVERIFIED,
        )
        return True
    print(f"qwen3-tts serve: {model} failed its identity check ({result.manifest_source}):", file=sys.stderr)
    for problem in result.problems:
        print(f"  {problem}", file=sys.stderr)
    print(
        f"Refusing to serve it. Fix or re-fetch the snapshot (`qwen3-tts model verify {model}` repeats the "
        f"check), or pass {_ALLOW_UNVERIFIED} ({_env_name(_ALLOW_UNVERIFIED)}=1) to serve it anyway.",
        file=sys.stderr,
    )
    return False

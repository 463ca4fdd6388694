"""``qwen3-tts synthesize``: one request, solo, from the command line to a WAV file."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from . import EXIT_FAILED, EXIT_USAGE

if TYPE_CHECKING:
    import torch
    from rich.console import Console

    from ..engine.runtime.engine import VoiceDesignEngine
    from ..engine.runtime.request import SynthesisRequest

DEMO_DEFAULT_MAX_FRAMES = 40  # 3.2 s: the random demo model rarely emits EOS, so keep its noise short


class _UserError(Exception):
    """A problem the user can fix; printed as one line, exit code 2."""


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "synthesize",
        help="synthesize one utterance into a WAV file",
        description=(
            "Synthesize speech for TEXT in a voice described in words, and write 24 kHz mono 16-bit WAV. "
            "Without --model a tiny random-weight demo checkpoint is used (generated on first use and "
            "cached); it produces noise, not speech."
        ),
    )
    parser.add_argument("--text", required=True, help="the text to speak")
    parser.add_argument(
        "--voice",
        default="",
        metavar="DESCRIPTION",
        help='the voice, described in words, e.g. "a calm low female voice"; empty = no description',
    )
    parser.add_argument(
        "--language",
        default="auto",
        help="auto, or one of chinese, english, japanese, korean, german, french, russian, portuguese, "
        "spanish, italian (case-insensitive; default: auto)",
    )
    parser.add_argument(
        "--max-frames",
        type=int,
        default=None,
        metavar="N",
        help="stop after N frames of 80 ms (default: 1500 = 120 s; 40 with the demo checkpoint)",
    )
    parser.add_argument("--seed", type=int, default=0, help="sampling seed; same seed, same audio")
    parser.add_argument(
        "--greedy",
        action="store_true",
        help="pick the most likely code at every step instead of sampling (talker and code predictor)",
    )
    parser.add_argument(
        "--text-mode",
        choices=("non_streaming", "streaming"),
        default="non_streaming",
        help="non_streaming: the whole text in the prompt (the official default); streaming: one text token "
        "per frame (default: non_streaming)",
    )
    parser.add_argument(
        "--stream",
        action="store_true",
        help="write audio packets to the WAV file as they are produced (the header is fixed up at the end)",
    )
    parser.add_argument(
        "--codes-out",
        type=Path,
        metavar="FILE",
        help="also write the generated codec codes (frames x 16) as JSON; runs the frame loop a second "
        "time with the same seed, which yields the same codes",
    )
    parser.add_argument(
        "--model",
        type=Path,
        metavar="DIR",
        help="snapshot directory of Qwen3-TTS-12Hz-1.7B-VoiceDesign (default: the random demo checkpoint)",
    )
    parser.add_argument("--device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda:N")
    parser.add_argument(
        "--dtype",
        choices=("auto", "bfloat16", "float16", "float32"),
        default="auto",
        help="talker and code predictor precision (auto: bfloat16 on cuda, float32 on cpu); "
        "the speech decoder always runs in float32",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="torch CPU threads (default: QWEN3_TTS_THREADS, else OMP_NUM_THREADS if set, else 1 with the "
        "demo checkpoint and min(4, cores) with --model)",
    )
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="WAV", help="WAV file to write")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ..engine.errors import EngineError

    console = Console(stderr=True)
    try:
        return _run(args, console)
    except (_UserError, EngineError) as error:
        _error(error)
        return EXIT_USAGE
    except OSError as error:
        _error(error)
        return EXIT_FAILED


def _error(error: Exception) -> None:
    """One unwrapped line on stderr: a multi-line message (a SnapshotError's list) is folded with ' | '."""
    print(
        "error: " + " | ".join(line.strip() for line in str(error).splitlines() if line.strip()),
        file=sys.stderr,
    )


def _check_arguments(args: argparse.Namespace) -> None:
    """Cheap checks before any model is loaded, so typos fail in milliseconds."""
    from ..engine.config import LANGUAGES

    if not args.text.strip():
        raise _UserError("--text must not be empty or only whitespace")
    if args.language.strip().lower() not in LANGUAGES:
        raise _UserError(
            f"unknown --language {args.language!r}; accepted (case-insensitive): {', '.join(LANGUAGES)}"
        )
    if args.max_frames is not None and args.max_frames < 1:
        raise _UserError(f"--max-frames must be >= 1, got {args.max_frames}")
    if args.threads is not None and args.threads < 1:
        raise _UserError(f"--threads must be >= 1, got {args.threads}")
    if not 0 <= args.seed <= 2**53 - 1:
        raise _UserError(f"--seed must be in 0 .. 2**53-1, got {args.seed}")
    if args.model is not None and not args.model.is_dir():
        raise _UserError(f"model directory does not exist: {args.model}")
    if not args.output.parent.is_dir():
        raise _UserError(f"output directory does not exist: {args.output.parent}")


def _device_and_dtype(args: argparse.Namespace) -> tuple[str, torch.dtype]:
    import torch

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except RuntimeError as error:
        raise _UserError(f"bad --device {args.device!r}: {error}") from error
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise _UserError(f"--device {device} asked for, but no CUDA device is available")
    if args.dtype == "auto":
        return device, torch.bfloat16 if parsed.type == "cuda" else torch.float32
    return device, getattr(torch, args.dtype)


def _run(args: argparse.Namespace, console: Console) -> int:
    _check_arguments(args)
    device, dtype = _device_and_dtype(args)

    if args.model is None:
        from ..engine.demo import DEMO_NOTICE, demo_checkpoint_dir, ensure_demo_checkpoint

        print(DEMO_NOTICE, file=sys.stderr)
        if not demo_checkpoint_dir().is_dir():
            print(f"generating it once into {demo_checkpoint_dir()} ...", file=sys.stderr)
        model_dir = ensure_demo_checkpoint()
        max_frames = args.max_frames or DEMO_DEFAULT_MAX_FRAMES
    else:
        model_dir = args.model
        max_frames = args.max_frames or 1500

    from ..engine.runtime.engine import VoiceDesignEngine
    from ..engine.runtime.request import PredictorSampling, SynthesisRequest, TalkerSampling
    from ..engine.threads import configure_cpu_threads

    try:
        configure_cpu_threads(args.threads, demo=args.model is None)
    except ValueError as error:
        raise _UserError(str(error)) from None
    started = time.monotonic()
    with console.status(f"loading {model_dir} on {device} ({str(dtype).removeprefix('torch.')})"):
        engine = VoiceDesignEngine.load(model_dir, device=device, dtype=dtype)
    request = SynthesisRequest(
        text=args.text,
        voice_description=args.voice,
        language=args.language,
        seed=args.seed,
        max_frames=max_frames,
        talker_sampling=TalkerSampling(greedy=args.greedy),
        predictor_sampling=PredictorSampling(greedy=args.greedy),
        text_mode=args.text_mode,
    )
    loaded = time.monotonic()
    frames, finish_reason = _synthesize(engine, request, args.output, args.stream, console)
    elapsed = time.monotonic() - loaded
    if args.codes_out is not None:
        codes = engine.generate_codes(request)
        args.codes_out.write_text(json.dumps(codes.tolist()) + "\n", encoding="utf-8")
    seconds = frames * 0.08
    print(
        f"wrote {args.output}: {frames} frames = {seconds:.2f} s of audio, finish_reason={finish_reason}, "
        f"generated in {elapsed:.2f} s (load {loaded - started:.2f} s)",
        file=sys.stdout,
    )
    return 0


def _synthesize(
    engine: VoiceDesignEngine, request: SynthesisRequest, output: Path, stream: bool, console: Console
) -> tuple[int, str | None]:
    """Run the solo frame loop with a progress bar; returns (frames written, finish reason)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..engine.audio import WAV_HEADER_BYTES, wav_header

    frames = 0
    finish_reason: str | None = None
    chunks: list[bytes] = []
    handle: BinaryIO | None = None
    if stream:
        handle = output.open("wb")
        handle.write(wav_header(0))  # placeholder, patched once the length is known
    columns = (TextColumn("frames"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task("frames", total=request.max_frames)
            for packet in engine.synthesize(request):
                if handle is not None:
                    handle.write(packet.pcm)
                    handle.flush()
                else:
                    chunks.append(packet.pcm)
                frames += packet.frame_count
                finish_reason = packet.finish_reason or finish_reason
                progress.update(task, completed=frames)
        if handle is None:
            from ..engine.audio import write_wav

            write_wav(output, b"".join(chunks))
    finally:
        if handle is not None:  # also on errors and Ctrl-C: what was streamed stays a valid WAV
            samples = (handle.tell() - WAV_HEADER_BYTES) // 2
            handle.seek(0)
            handle.write(wav_header(samples))
            handle.close()
    return frames, finish_reason

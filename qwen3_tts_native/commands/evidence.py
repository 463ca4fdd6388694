"""``qwen3-tts evidence``: measure servers, validate evidence bundles, render reports.

Exit codes (all subcommands): 0 success; 1 the evidence is rejected (validation findings, or a measured
run that fails its own validation); 2 usage error; 3 ``run`` aborted before a bundle was sealed (server
not ready, a warm-up failed; every record measured so far stays in ``<out>.partial``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import EXIT_FAILED, EXIT_OK, usage_error

EXIT_REJECTED = EXIT_FAILED
EXIT_ABORTED = 3

_EPILOG = "Exit codes: 0 success, 1 evidence rejected, 2 usage error, 3 run aborted (partial records kept)."


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``evidence run|validate|report``."""
    parser = subparsers.add_parser(
        "evidence",
        help="benchmark servers and validate/report evidence bundles",
        description="Controlled HTTP benchmarks with telemetry, written as sealed evidence bundles "
        "(schema 2.0); a fail-closed validator (schemas 1.0-1.2 and 2.0) and HTML/PDF reports.",
        epilog=_EPILOG,
    )
    commands = parser.add_subparsers(dest="evidence_command", metavar="SUBCOMMAND", required=True)
    _register_run(commands)
    _register_validate(commands)
    _register_report(commands)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def _nonnegative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def _nonnegative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def _register_run(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    run = commands.add_parser(
        "run",
        help="benchmark one or more running servers and write an evidence bundle",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_EPILOG,
        description="""Benchmark running servers over HTTP; write a sealed schema 2.0 bundle (OUT + .tar.zst).

Each engine is measured under each profile in each round (rounds alternate the engine order). A run is:
an idle baseline (telemetry only), warm-ups (not recorded; any failure aborts), then a fixed number of
measured requests whose records are streamed to disk as they finish.

ENGINE spec (comma-separated key=value): id=ID,url=http://HOST:PORT are required; optional
  api=native|openai|wav   native: POST /v1/voice-design/speech (multipart PCM); openai: POST
                          /v1/audio/speech; wav: buffered-WAV server taking our JSON body
  role=candidate|baseline|reference|variant, name=..., version=..., commit=..., source=URL
  pid=N                   server pid for telemetry (default: the listener of a loopback port)
  gpu=0[+1...]            GPU indices to watch (default: all); other GPU processes count as competing
  path=/..., model=..., response=pcm|wav|sse   adapter overrides (model/response: openai only)
  fields=seed+language+max_duration_seconds+sampling   openai only: workload fields to forward to a
                          server that accepts them (a request qualifies for sampling parity only with
                          seed and sampling)

PROFILE: B<n> closed loop with n requests in flight; R<rate> open-loop Poisson arrivals (requests/s).

Without --production the bundle is a test fixture (validate it with --allow-test-fixture).""",
    )
    run.add_argument(
        "--engine", action="append", required=True, metavar="ENGINE", help="an engine spec (repeat)"
    )
    run.add_argument(
        "--workload", type=Path, required=True, help="JSONL corpus (format of http-workload-10.jsonl)"
    )
    run.add_argument(
        "--profile",
        action="append",
        metavar="PROFILE",
        help="B<n> or R<rate>; repeat or comma-separate (default: B1)",
    )
    run.add_argument("--out", type=Path, required=True, help="bundle directory to create (must not exist)")
    run.add_argument(
        "--requests", type=_positive_int, default=200, help="measured requests per run (default 200)"
    )
    run.add_argument(
        "--warmups", type=_nonnegative_int, default=24, help="warm-up requests per run (default 24)"
    )
    run.add_argument(
        "--rounds", type=_positive_int, default=2, help="rounds per engine and profile (default 2)"
    )
    run.add_argument(
        "--idle-seconds",
        type=_nonnegative_float,
        default=15.0,
        help="idle telemetry baseline before each run (default 15)",
    )
    run.add_argument(
        "--interval-ms", type=_positive_int, default=100, help="telemetry interval (default 100)"
    )
    run.add_argument("--timeout-seconds", type=float, default=600.0, help="per-request timeout (default 600)")
    run.add_argument(
        "--closed-loop",
        choices=("batch", "continuous"),
        default="batch",
        help="B<n>: synchronized batches of n (default, the seed protocol) or n busy workers",
    )
    run.add_argument(
        "--arrival-seed", type=_nonnegative_int, default=0, help="seed of open-loop arrival times"
    )
    run.add_argument(
        "--production",
        action="store_true",
        help="claim production evidence (the validator then enforces the full protocol)",
    )
    run.add_argument("--benchmark-id", default="qwen3-tts-benchmark", help="lower-case id of this benchmark")
    run.add_argument(
        "--title", default="qwen3-tts-native benchmark evidence", help="report title (>= 12 chars)"
    )
    run.add_argument("--author", action="append", help="author (repeat; default qwen3-tts-native)")
    run.add_argument(
        "--hostname-alias", default="benchmark-host", help="name recorded instead of the hostname"
    )
    run.add_argument("--model-repository", default="Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign")
    run.add_argument(
        "--model-revision", default="unpinned", help="model revision served (production: required)"
    )
    run.add_argument("--model-variant", default="VoiceDesign")
    run.add_argument("--limitation", action="append", default=[], help="a limitation to state (repeat)")
    run.add_argument(
        "--ready-timeout",
        type=float,
        default=120.0,
        help="seconds to wait for /health/ready of native-API engines (default 120)",
    )
    run.add_argument("--quiet", action="store_true", help="no progress bars")
    run.set_defaults(handler=_run)


def _register_validate(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    validate = commands.add_parser(
        "validate",
        help="validate an evidence bundle (directory or .tar.zst); fail-closed",
        description="Check a bundle against its schema (1.0-1.2: the seed's two-engine format; 2.0: ours) "
        "and "
        "recompute every hash, RTF, summary and run resource from the raw records. Every failure "
        "is listed under its check name.",
        epilog=_EPILOG,
    )
    validate.add_argument("bundle", type=Path, help="bundle directory or BUNDLE.tar.zst")
    validate.add_argument(
        "--allow-test-fixture",
        action="store_true",
        help="accept evidence_kind test_fixture (never for publication)",
    )
    validate.set_defaults(handler=_validate)


def _register_report(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    report = commands.add_parser(
        "report",
        help="render an HTML (and PDF) report with plots from a valid bundle",
        description="Validate the bundle, then write DIR/index.html, DIR/report.pdf and DIR/plots/*.png: "
        "TTFA "
        "CDFs per profile and engine, RTF per profile, packet cadence, GPU memory and power over "
        "time, and the summary table. An invalid bundle gets no report.",
        epilog=_EPILOG,
    )
    report.add_argument("bundle", type=Path, help="bundle directory or BUNDLE.tar.zst")
    report.add_argument("-o", "--output", type=Path, required=True, metavar="DIR", help="output directory")
    report.add_argument(
        "--allow-test-fixture", action="store_true", help="accept (and banner) a test fixture"
    )
    report.set_defaults(handler=_report)


def _print_findings(result: object) -> None:
    from rich.console import Console

    from ..evidence.validate import ValidationResult

    assert isinstance(result, ValidationResult)
    console = Console(stderr=True, highlight=False)
    for finding in result.findings.failures:
        console.print(f"[red]FAIL[/red] {finding}", markup=True, soft_wrap=True)
    for check, count in result.findings.suppressed.items():
        console.print(f"[red]FAIL[/red] {check}: {count} more findings not listed", soft_wrap=True)


def _validate(args: argparse.Namespace) -> int:
    from ..evidence.validate import validate_bundle

    result = validate_bundle(args.bundle, allow_test_fixture=args.allow_test_fixture)
    if not result.ok:
        _print_findings(result)
        print(f"REJECTED: {len(result.findings.failures)} findings in {args.bundle}", file=sys.stderr)
        return EXIT_REJECTED
    print(
        f"OK: {args.bundle} (schema {result.schema_version}, {result.evidence_kind}, {result.runs} runs, "
        f"{result.requests} measured requests)"
    )
    return EXIT_OK


def _report(args: argparse.Namespace) -> int:
    from ..evidence.report import ReportError, render_report

    try:
        written = render_report(args.bundle, args.output, allow_test_fixture=args.allow_test_fixture)
    except ReportError as exc:
        _print_findings(exc.result)
        print(f"no report: {exc}", file=sys.stderr)
        return EXIT_REJECTED
    print(f"wrote {written[0]} ({len(written) - 1} more files)")
    return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    from ..evidence.client import Profile, RunAborted
    from ..evidence.runner import EngineSpec, RunOptions, execute
    from ..evidence.validate import validate_bundle
    from ..evidence.workload import WorkloadError, load_workload

    try:
        engines = [EngineSpec.parse(text) for text in args.engine]
        specs = [p.strip() for item in (args.profile or ["B1"]) for p in item.split(",") if p.strip()]
        profiles = [Profile.parse(p) for p in dict.fromkeys(specs)]
        workload = load_workload(args.workload)
    except (ValueError, WorkloadError, OSError) as exc:
        return usage_error(exc)
    if len({e.id for e in engines}) != len(engines):
        return usage_error("engine ids must be unique")
    if args.out.exists() or args.out.with_name(args.out.name + ".partial").exists():
        return usage_error(f"{args.out} (or its .partial) already exists")
    options = RunOptions(
        engines=engines,
        profiles=profiles,
        workload=workload,
        out=args.out,
        requests=args.requests,
        warmups=args.warmups,
        rounds=args.rounds,
        idle_seconds=args.idle_seconds,
        interval_ms=args.interval_ms,
        timeout_s=args.timeout_seconds,
        closed_loop=args.closed_loop,
        arrival_seed=args.arrival_seed,
        production=args.production,
        benchmark_id=args.benchmark_id,
        title=args.title,
        authors=args.author or ["qwen3-tts-native"],
        hostname_alias=args.hostname_alias,
        model_repository=args.model_repository,
        model_revision=args.model_revision,
        model_variant=args.model_variant,
        limitations=args.limitation,
        ready_timeout_s=args.ready_timeout,
    )
    console = Console(stderr=True)
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=args.quiet,
    )
    current: list[TaskID] = []

    def on_run(engine: EngineSpec, profile: Profile, round_number: int) -> None:
        current.append(
            progress.add_task(
                f"{engine.id} {profile.id} round {round_number}", total=args.warmups + args.requests
            )
        )

    def on_request(measured: bool) -> None:
        progress.advance(current[-1])

    try:
        with progress:
            bundle = execute(options, on_request, on_run)
    except RunAborted as exc:
        print(f"aborted: {exc}; records so far are in {args.out}.partial", file=sys.stderr)
        return EXIT_ABORTED
    result = validate_bundle(bundle, allow_test_fixture=not args.production)
    if not result.ok:
        _print_findings(result)
        print(
            f"wrote {bundle} but it is REJECTED ({len(result.findings.failures)} findings)", file=sys.stderr
        )
        return EXIT_REJECTED
    print(
        f"wrote {bundle} and {bundle}.tar.zst: {result.runs} runs, {result.requests} measured requests, valid"
    )
    return EXIT_OK

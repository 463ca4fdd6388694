"""One evidence bundle (schema 2.0) of our server beside faster-qwen3-tts, measured one engine at a time.

For each engine in turn: start its server on a loopback port (ours: ``qwen3-tts serve``; the peer:
``benchmarks/peers/faster_server.py``), wait for ``/health/ready``, measure every profile (B1, B3, B6 by
default) with ``qwen3-tts evidence``'s runner, and stop it (SIGTERM, then wait for its GPU memory to be
released) before the next engine starts, so that neither is a competing GPU process of the other. All
runs go into ONE sealed bundle (ours: role candidate; faster-qwen3-tts: role baseline), which is then
validated and rendered. Into ``--out`` go exactly three files:

- ``evidence-bundle.tar.zst``: the sealed bundle;
- ``evidence-report.tgz``: ``report/`` (index.html, report.pdf, plots/*.png), the validation output and
  the servers' logs;
- ``evidence-validation.txt``: the output of ``qwen3-tts evidence validate --allow-test-fixture``.

When the run aborts, ``evidence-partial.tgz`` (the records measured so far) and the report archive (with
the server logs) come back instead.

The workload is ``benchmarks/workloads/http-workload-10.jsonl`` (a copy of the reference corpus) with
every ``max_duration_seconds`` capped (5.12 s by default), so that the run fits its budget. The bundle is
a test fixture (a few requests per profile, one round): it validates with ``--allow-test-fixture`` and
makes no performance claim. Prints a budget line per phase; exits 0 when the bundle validates, 1 when
it is rejected, 3 when the run aborted (a server did not come up, a warm-up failed, SIGTERM).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from common import run_commit  # noqa: E402

from qwen3_tts_native import __version__  # noqa: E402
from qwen3_tts_native.evidence.client import Profile, RunAborted, wait_for_server  # noqa: E402
from qwen3_tts_native.evidence.runner import EngineSpec, RunOptions, execute  # noqa: E402
from qwen3_tts_native.evidence.workload import Workload, parse_workload  # noqa: E402

WORKLOAD = ROOT / "benchmarks" / "workloads" / "http-workload-10.jsonl"
FASTER_SERVER = ROOT / "benchmarks" / "peers" / "faster_server.py"
ENGINES = ("ours", "faster")
PEER_FIELDS = ("language", "seed", "max_duration_seconds", "sampling")
"""The workload fields the faster-qwen3-tts wrapper accepts on its OpenAI-style endpoint."""
PEER_CHUNK_SIZE = 8  # codec frames per streamed chunk: faster-qwen3-tts's published streaming setting
BUNDLE_FILE = "evidence-bundle.tar.zst"
REPORT_FILE = "evidence-report.tgz"
VALIDATION_FILE = "evidence-validation.txt"
EXIT_REJECTED = 1
EXIT_ABORTED = 3
STOP_TIMEOUT_S = 45.0
GPU_RELEASE_TIMEOUT_S = 15.0


class Budget:
    """Wall-clock budget of the whole script, with one printed line per phase."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.start = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return self.seconds - self.elapsed()

    def phase(self, name: str) -> None:
        print(
            f"=== evidence: {name} | {self.elapsed():.0f}s elapsed, "
            f"{self.left():.0f}s left of {self.seconds:.0f}s",
            flush=True,
        )


def capped_workload(source: Path, max_duration_s: float) -> Workload:
    """The corpus with every row's max_duration_seconds capped at ``max_duration_s``, in its order."""
    lines = []
    for line in source.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        row["max_duration_seconds"] = min(
            float(row.get("max_duration_seconds", max_duration_s)), max_duration_s
        )
        lines.append(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")
    return parse_workload("".join(lines).encode("utf-8"), source=source.name)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_command(engine: str, model: Path, port: int, concurrency: int) -> list[str]:
    """The command line of an engine's server."""
    if engine == "ours":
        return [
            sys.executable,
            "-m",
            "qwen3_tts_native",
            "serve",
            "--model",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-concurrent-requests",
            str(max(6, concurrency)),
            "--log-level",
            "warning",
        ]
    return [
        sys.executable,
        str(FASTER_SERVER),
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--chunk-size",
        str(PEER_CHUNK_SIZE),
    ]


def engine_spec(engine: str, port: int, commit: str | None) -> EngineSpec:
    """How the runner sees an engine (the pid is filled in once its server runs)."""
    url = f"http://127.0.0.1:{port}"
    if engine == "ours":
        return EngineSpec(
            id="qwen3-tts-native",
            url=url,
            api="native",
            role="candidate",
            name="qwen3-tts-native",
            version=__version__,
            commit=commit,
        )
    return EngineSpec(
        id="faster-qwen3-tts",
        url=url,
        api="openai",
        role="baseline",
        name="faster-qwen3-tts",
        version="0.5.4",
        response="pcm",
        fields=PEER_FIELDS,
        source="https://github.com/andimarafioti/faster-qwen3-tts",
        notes=(
            "served by benchmarks/peers/faster_server.py: one request at a time (no batching), PCM chunks "
            f"of {PEER_CHUNK_SIZE} codec frames as its streaming generator yields them",
        ),
    )


def wait_gpu_released(pid: int, timeout_s: float) -> None:
    """Wait until NVML lists no GPU compute process, so that the next engine starts on a GPU of its own
    (no-op without NVML)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no NVML: nothing to wait for
        return
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pids = {p.pid for h in handles for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)}
            if not pids:
                return
            time.sleep(0.25)
        print(f"warning: GPU compute processes {sorted(pids)} remain after server {pid} exited", flush=True)
    finally:
        pynvml.nvmlShutdown()


@contextlib.contextmanager
def served(
    spec: EngineSpec, command: list[str], env: dict[str, str], log: IO[bytes], budget: Budget
) -> Iterator[EngineSpec]:
    """Run an engine's server for the duration of the block; yields the spec with the server's pid."""
    budget.phase(f"start {spec.id}")
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        wait_for_server(process, spec.url, max(30.0, budget.left()))
        print(f"{spec.id}: ready after {time.monotonic() - started:.1f}s (pid {process.pid})", flush=True)
        budget.phase(f"measure {spec.id}")
        yield replace(spec, pid=process.pid)
    finally:
        budget.phase(f"stop {spec.id}")
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # any child left behind
        print(f"{spec.id}: exited {process.returncode}", flush=True)
        wait_gpu_released(process.pid, GPU_RELEASE_TIMEOUT_S)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "qwen3_tts_native", "evidence", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, required=True, help="snapshot directory served by every engine")
    parser.add_argument("--out", type=Path, required=True, help="directory for the three result files")
    parser.add_argument(
        "--engines",
        default=",".join(ENGINES),
        help="comma list, measured in this order (default ours,faster)",
    )
    parser.add_argument(
        "--profiles", default="B1,B3,B6", help="comma list of B<n> / R<rate> (default B1,B3,B6)"
    )
    parser.add_argument("--requests", type=int, default=6, help="measured requests per profile (default 6)")
    parser.add_argument("--warmups", type=int, default=2, help="warm-up requests per run (default 2)")
    parser.add_argument("--idle-seconds", type=float, default=3.0, help="idle baseline per run (default 3)")
    parser.add_argument(
        "--max-duration-seconds",
        type=float,
        default=5.12,
        help="cap of every row's audio length (default 5.12)",
    )
    parser.add_argument(
        "--zero-eos",
        action="store_true",
        help="serve the snapshot's EOS-free timing copy (<MODEL>-noeos, as `qwen3-tts bench` makes it), so "
        "that random weights yield the frames asked for",
    )
    parser.add_argument(
        "--faster-pythonpath",
        default="",
        help="PYTHONPATH of the faster-qwen3-tts server, e.g. /tmp/site_faster:/tmp/site_common",
    )
    parser.add_argument(
        "--budget-s", type=float, default=240.0, help="the whole script's budget (default 240)"
    )
    args = parser.parse_args(argv)
    args.engine_list = [e.strip() for e in args.engines.split(",") if e.strip()]
    if (
        not args.engine_list
        or any(e not in ENGINES for e in args.engine_list)
        or len(set(args.engine_list)) < len(args.engine_list)
    ):
        parser.error(f"--engines must list distinct names from {', '.join(ENGINES)}")
    try:
        args.profile_list = [Profile.parse(p.strip()) for p in args.profiles.split(",") if p.strip()]
    except ValueError as exc:
        parser.error(str(exc))
    if args.requests < 1 or args.warmups < 1:
        parser.error("--requests and --warmups must be >= 1")
    return args


def _terminated(signum: int, frame: object) -> None:
    raise RunAborted(f"stopped by signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _terminated)  # `timeout`: stop the server, keep the records
    try:
        return run(args, Budget(args.budget_s))
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(args: argparse.Namespace, budget: Budget) -> int:
    """Measure, seal, validate and render; the three files land in ``args.out``."""
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.model.resolve()
    if args.zero_eos:
        budget.phase("EOS-free snapshot copy")
        from qwen3_tts_native.commands.bench import zero_eos_copy

        model = zero_eos_copy(model)
    concurrency = max(p.concurrency or 1 for p in args.profile_list)
    commit = run_commit()
    ports = {engine: free_port() for engine in args.engine_list}
    specs = {engine: engine_spec(engine, ports[engine], commit) for engine in args.engine_list}
    by_id = {spec.id: engine for engine, spec in specs.items()}
    with tempfile.TemporaryDirectory(prefix="qwen3-tts-evidence-") as tmp:
        work = Path(tmp)
        logs = work / "logs"
        logs.mkdir()
        base_env = {**os.environ, "PYTHONUNBUFFERED": "1", "QWEN3_TTS_ALLOW_UNVERIFIED_MODEL": "1"}

        @contextlib.contextmanager
        def serve(spec: EngineSpec) -> Iterator[EngineSpec]:
            engine = by_id[spec.id]
            env = dict(base_env)
            if engine == "faster" and args.faster_pythonpath:
                env["PYTHONPATH"] = os.pathsep.join(
                    p for p in (args.faster_pythonpath, env.get("PYTHONPATH")) if p
                )
            command = server_command(engine, model, ports[engine], concurrency)
            with (
                (logs / f"{engine}-server.log").open("ab") as log,
                served(spec, command, env, log, budget) as live,
            ):
                yield live

        def on_run(engine: EngineSpec, profile: Profile, round_number: int) -> None:
            print(f"  {engine.id} {profile.id} round {round_number} at {budget.elapsed():.0f}s", flush=True)

        options = RunOptions(
            engines=[specs[e] for e in args.engine_list],
            profiles=args.profile_list,
            workload=capped_workload(WORKLOAD, args.max_duration_seconds),
            out=work / "bundle",
            requests=args.requests,
            warmups=args.warmups,
            idle_seconds=args.idle_seconds,
            timeout_s=120.0,
            benchmark_id="device-acceptance-evidence",
            title="qwen3-tts-native beside faster-qwen3-tts: device acceptance evidence",
            hostname_alias="device",
            limitations=[
                f"snapshot {args.model.name}{' (EOS row zeroed)' if args.zero_eos else ''}: random weights "
                "unless it is the pinned model, so the audio is not speech; timing only",
                f"{args.requests} measured requests and {args.warmups} warm-ups per run, one round, audio "
                f"capped at {args.max_duration_seconds} s: a smoke-scale run, not a performance claim",
                "faster-qwen3-tts has no batching: its server queues concurrent requests (B3/B6 wait)",
            ],
            ready_timeout_s=30.0,
        )
        try:
            execute(options, lambda measured: None, on_run, serve)
        except Exception as exc:  # servers are stopped by now; return the records and logs there are
            budget.phase("aborted")
            if not isinstance(exc, RunAborted):
                traceback.print_exc()
            print(f"evidence run aborted: {exc}", flush=True)
            pack_report(work, args.out, None)
            return EXIT_ABORTED
        bundle = args.out / BUNDLE_FILE
        shutil.move(work / "bundle.tar.zst", bundle)
        budget.phase("validate")
        validated = cli("validate", str(bundle), "--allow-test-fixture")
        text = validated.stdout + validated.stderr
        (args.out / VALIDATION_FILE).write_text(text)
        print(text.strip(), flush=True)
        budget.phase("report")
        report = cli("report", str(bundle), "-o", str(work / "report"), "--allow-test-fixture")
        print((report.stdout + report.stderr).strip(), flush=True)
        pack_report(work, args.out, text)
    budget.phase("done")
    return 0 if validated.returncode == 0 else EXIT_REJECTED


def pack_report(work: Path, out: Path, validation: str | None) -> None:
    """``REPORT_FILE``: the rendered report (if any), the validation output and the server logs."""
    if validation is not None:
        (work / "validation.txt").write_text(validation)
    with tarfile.open(out / REPORT_FILE, "w:gz") as archive:
        for name in ("report", "validation.txt", "logs"):
            if (work / name).exists():
                archive.add(work / name, arcname=name)
    partial = work / "bundle.partial"
    if partial.exists():
        with tarfile.open(out / "evidence-partial.tgz", "w:gz") as archive:
            archive.add(partial, arcname="bundle.partial")


if __name__ == "__main__":
    sys.exit(main())

"""Serving acceptance: aggregate codec frames per second over HTTP at 1, 4 and 16 concurrent streams.

Starts ``python -m qwen3_tts_native serve`` on a snapshot (capacity = the largest concurrency), waits for
``/health/ready``, then for each concurrency c runs one untimed warm-up round and one timed round of c
concurrent streaming ``POST /v1/voice-design/speech`` requests (seeded sampling, a fixed
``max_duration_seconds``; the random model rarely stops early, and the frames actually received are
counted). The multipart stream is parsed just enough to count PCM bytes (frames = bytes / 3840) and to read
the terminal part. Aggregate fps = all frames of the round / its wall time.

Acceptance: fps(16) / fps(1) >= 8.

    python benchmarks/device/http_scaling.py --out DIR --model /tmp/q3tts/full

writes DIR/http-scaling.json and prints a table. Exit 0 when every level was measured without failed
requests (the verdict is in the JSON), 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from common import (
    REPO_ROOT,
    Terminated,
    add_snapshot_arguments,
    comma_ints,
    command_output,
    ensure_snapshot,
    package_version,
    run_commit,
    snapshot_path,
    terminate,
)

from qwen3_tts_native.evidence.client import wait_for_server

TEXT = (
    "Ladies and gentlemen, this stream measures how many codec frames the server produces per second "
    "when many listeners arrive at once."
)
VOICE_DESCRIPTION = "A warm, calm adult voice speaking at a relaxed pace."
BYTES_PER_FRAME = 1920 * 2  # PCM16 mono samples of one 80 ms codec frame
WARM_UP_SECONDS = 0.96  # 12 frames per warm-up request
ACCEPTANCE_RATIO = 8.0


@dataclass
class StreamResult:
    """One streamed request as the client saw it."""

    status: int
    pcm_bytes: int = 0
    frames: int = 0
    ttfa_s: float | None = None  # request sent -> first PCM part parsed
    total_s: float = 0.0
    finish_reason: str | None = None
    error: str | None = None


class MultipartCounter:
    """Minimal incremental reader of the ``multipart/mixed`` body: counts PCM bytes, keeps the last JSON part.

    Every part carries Content-Length, so a part is: ``--boundary`` CRLF, headers, CRLF CRLF, payload, CRLF.
    """

    def __init__(self, boundary: str) -> None:
        self.delimiter = b"--" + boundary.encode("ascii")
        self.buffer = b""
        self.pending: tuple[str, int] | None = None  # (content type, length) of the part being read
        self.pcm_bytes = 0
        self.audio_parts = 0
        self.last_json: dict[str, Any] | None = None

    def feed(self, chunk: bytes) -> None:
        self.buffer += chunk
        while True:
            if self.pending is None:
                end = self.buffer.find(b"\r\n\r\n")
                if end < 0:
                    return
                lines = self.buffer[:end].decode("latin-1").split("\r\n")
                self.buffer = self.buffer[end + 4 :]
                if lines[0].encode("latin-1") != self.delimiter:
                    raise ValueError(f"expected a part delimiter, got {lines[0][:60]!r}")
                headers = {
                    k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])
                }
                self.pending = (headers.get("content-type", ""), int(headers["content-length"]))
            content_type, length = self.pending
            if len(self.buffer) < length + 2:
                return
            payload, self.buffer = self.buffer[:length], self.buffer[length + 2 :]
            self.pending = None
            if content_type.startswith("audio/pcm"):
                self.pcm_bytes += length
                self.audio_parts += 1
            elif content_type.startswith("application/json"):
                self.last_json = json.loads(payload)


async def stream_one(client: httpx.AsyncClient, body: dict[str, Any]) -> StreamResult:
    started = time.perf_counter()
    try:
        async with client.stream("POST", "/v1/voice-design/speech", json=body) as response:
            result = StreamResult(status=response.status_code)
            if response.status_code != 200:
                result.error = (await response.aread()).decode(errors="replace")[:500]
                return result
            _, _, boundary = response.headers.get("content-type", "").partition("boundary=")
            counter = MultipartCounter(boundary.strip().strip('"'))
            async for chunk in response.aiter_bytes():
                counter.feed(chunk)
                if result.ttfa_s is None and counter.audio_parts:
                    result.ttfa_s = time.perf_counter() - started
        result.total_s = time.perf_counter() - started
        result.pcm_bytes = counter.pcm_bytes
        result.frames = counter.pcm_bytes // BYTES_PER_FRAME
        end = counter.last_json or {}
        result.finish_reason = end.get("finish_reason")
        if end.get("type") != "end":
            result.error = f"stream ended without an end part: {json.dumps(end)[:300]}"
        return result
    except (httpx.HTTPError, ValueError, KeyError) as error:
        return StreamResult(
            status=-1, total_s=time.perf_counter() - started, error=f"{type(error).__name__}: {error}"
        )


async def run_round(base_url: str, concurrency: int, seconds: float, seed_base: int) -> dict[str, Any]:
    """c concurrent streams; aggregate frames per second over the round's wall time."""
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    timeout = httpx.Timeout(600.0, connect=30.0)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout) as client:
        bodies = [
            {
                "text": TEXT,
                "voice_description": VOICE_DESCRIPTION,
                "language": "english",
                "seed": seed_base + index,
                "max_duration_seconds": seconds,
                "stream": True,
            }
            for index in range(concurrency)
        ]
        started = time.perf_counter()
        results = await asyncio.gather(*(stream_one(client, body) for body in bodies))
        wall = time.perf_counter() - started
    frames = sum(r.frames for r in results)
    ttfa = [r.ttfa_s for r in results if r.ttfa_s is not None]
    per_stream = [r.frames / r.total_s for r in results if r.total_s > 0 and r.frames]
    return {
        "concurrency": concurrency,
        "wall_s": wall,
        "frames": frames,
        "frames_per_request_requested": math.ceil(seconds * 12.5),
        "aggregate_fps": frames / wall if wall > 0 else 0.0,
        "aggregate_realtime_x": frames * 0.08 / wall if wall > 0 else 0.0,
        "per_stream_fps_min": min(per_stream) if per_stream else None,
        "per_stream_fps_median": statistics.median(per_stream) if per_stream else None,
        "ttfa_s_p50": statistics.median(ttfa) if ttfa else None,
        "ttfa_s_max": max(ttfa) if ttfa else None,
        "finish_reasons": {
            reason: sum(1 for r in results if r.finish_reason == reason)
            for reason in sorted({str(r.finish_reason) for r in results})
        },
        "failed": [asdict(r) for r in results if r.error is not None],
    }


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop(server: subprocess.Popen[bytes]) -> int | None:
    """SIGTERM (the server drains), then SIGKILL after 30 s."""
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    return server.returncode


def machine_facts() -> dict[str, Any]:
    gpu = command_output(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    name, _, driver = (gpu or "").partition(",")
    return {
        "python": sys.version.split()[0],
        "torch": package_version("torch"),
        "transformers": package_version("transformers"),
        "httpx": package_version("httpx"),
        "uvicorn": package_version("uvicorn"),
        "gpu": name.strip() or None,
        "driver": driver.strip() or None,
        "cpu_count": os.cpu_count(),
        "commit": run_commit(),
        "qwen3_tts_mode": os.environ.get("QWEN3_TTS_MODE"),
    }


def measure(args: argparse.Namespace, levels: list[int], report: dict[str, Any], log_path: Path) -> None:
    made = ensure_snapshot(args.model, args.preset, args.seed)
    report["snapshot"] = {"path": str(args.model), "written_here": made}
    if made:
        report["snapshot"].update(preset=args.preset, seed=args.seed)
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    command = [
        sys.executable, "-m", "qwen3_tts_native", "serve",
        "--model", str(args.model), "--host", "127.0.0.1", "--port", str(port),
        "--max-concurrent-requests", str(max(levels)),
        "--max-duration-seconds", str(max(args.max_duration_seconds, WARM_UP_SECONDS)),
        # Small request limits keep the KV pool (sized from them) short: exact-mode attention reads it whole.
        "--max-text-bytes", "1024", "--max-voice-description-bytes", "512",
        "--log-level", "warning",
    ]  # fmt: skip
    if args.device:
        command += ["--device", args.device]
    report["server_command"] = command
    with log_path.open("wb") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
    try:
        report["server_ready_s"] = wait_for_server(server, base_url, args.startup_timeout_s)
        for level in levels:
            warm = asyncio.run(run_round(base_url, level, WARM_UP_SECONDS, 10_000_000 + 1000 * level))
            timed = asyncio.run(run_round(base_url, level, args.max_duration_seconds, 1000 * level))
            timed["warm_up_failed"] = len(warm["failed"])
            report["levels"].append(timed)
            print(
                f"c={level:<3} frames={timed['frames']:<6} wall={timed['wall_s']:7.2f} s  "
                f"fps={timed['aggregate_fps']:8.1f}  failed={len(timed['failed'])}",
                flush=True,
            )
    finally:
        report["server_exit_code"] = stop(server)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="directory for http-scaling.json")
    add_snapshot_arguments(parser)
    parser.add_argument("--concurrency", default="1,4,16", help="levels, comma-separated (default 1,4,16)")
    parser.add_argument(
        "--max-duration-seconds",
        type=float,
        default=10.24,
        help="audio asked for per timed request (default 10.24 = 128 frames)",
    )
    parser.add_argument("--device", default="", help="--device of the server (default: its own choice)")
    parser.add_argument("--startup-timeout-s", type=float, default=420.0, help="limit for /health/ready")
    args = parser.parse_args()
    try:
        levels = sorted(set(comma_ints(args.concurrency)))
    except ValueError:
        parser.error("--concurrency takes comma-separated integers")
    if not levels or levels[0] < 1 or levels[-1] > 64:
        parser.error("--concurrency levels must be in 1..64")
    args.model = snapshot_path(args)
    args.out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, terminate)
    report: dict[str, Any] = {
        "schema": "qwen3-tts-native/http-scaling/1",
        "created_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine_facts(),
        "settings": {
            "endpoint": "POST /v1/voice-design/speech (stream=true, multipart/mixed)",
            "concurrency": levels,
            "max_duration_seconds": args.max_duration_seconds,
            "sampling": "server defaults (seeded sampling), seeds 1000*c + i",
            "warm_up": f"one untimed round of c requests of {WARM_UP_SECONDS} s before each level",
            "text": TEXT,
            "voice_description": VOICE_DESCRIPTION,
        },
        "levels": [],
        "errors": [],
    }
    with tempfile.TemporaryDirectory(prefix="http-scaling-") as tmp:
        log_path = Path(tmp) / "server.log"
        try:
            measure(args, levels, report, log_path)
        except (Exception, Terminated) as error:
            report["errors"].append(f"{type(error).__name__}: {error}\n{traceback.format_exc()}")
        if report["errors"] or any(level["failed"] for level in report["levels"]):
            report["server_log_tail"] = (
                log_path.read_text(errors="replace")[-6000:] if log_path.exists() else ""
            )
    fps = {level["concurrency"]: level["aggregate_fps"] for level in report["levels"]}
    ratio = fps[16] / fps[1] if fps.get(1) and 16 in fps else None
    complete = (
        not report["errors"]
        and len(fps) == len(levels)
        and not any(level["failed"] for level in report["levels"])
    )
    report["acceptance"] = {
        "fps_16_over_fps_1": ratio,
        "threshold": ACCEPTANCE_RATIO,
        "pass": bool(complete and ratio is not None and ratio >= ACCEPTANCE_RATIO),
        "complete": complete,
    }
    (args.out / "http-scaling.json").write_text(json.dumps(report, indent=2))
    print_table(report)
    return 0 if complete else 1


def print_table(report: dict[str, Any]) -> None:
    gpu, seconds = report["machine"]["gpu"] or "no GPU", report["settings"]["max_duration_seconds"]
    print(f"\nHTTP scaling: {gpu}, {seconds} s of audio per request")
    print(
        f"{'c':>4}{'frames':>8}{'wall s':>9}{'agg fps':>10}{'x realtime':>12}{'ttfa p50 ms':>13}{'failed':>8}"
    )
    for level in report["levels"]:
        ttfa = level["ttfa_s_p50"]
        print(
            f"{level['concurrency']:>4}{level['frames']:>8}{level['wall_s']:>9.2f}{level['aggregate_fps']:>10.1f}"
            f"{level['aggregate_realtime_x']:>12.2f}{'-' if ttfa is None else f'{ttfa * 1000:.0f}':>13}"
            f"{len(level['failed']):>8}"
        )
    acceptance = report["acceptance"]
    ratio = acceptance["fps_16_over_fps_1"]
    shown = "n/a" if ratio is None else f"{ratio:.2f}"
    verdict = "PASS" if acceptance["pass"] else "FAIL"
    print(f"fps(16)/fps(1) = {shown} (acceptance >= {acceptance['threshold']:g}): {verdict}")
    for error in report["errors"]:
        print("ERROR:", error.splitlines()[0])


if __name__ == "__main__":
    sys.exit(main())

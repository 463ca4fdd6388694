"""End to end: a real ``qwen3-tts serve`` (tiny random checkpoint), a small B1/B3 benchmark against it, the
sealed bundle validated, and the report rendered.

Everything goes through the CLI in child processes, as an operator would run it; the benchmark is tiny
(a few requests of 0.4 s of audio per profile) so that CI stays fast on CPU.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("QWEN3_TTS_SHARED", ROOT.parent / "shared"))
STARTUP_TIMEOUT_S = 180.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "qwen3_tts_native", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    work = tmp_path_factory.mktemp("evidence-e2e")
    made = _cli("model", "make-random", "--preset", "tiny", "--seed", "0", "--out", str(work / "tiny"))
    assert made.returncode == 0, made.stderr
    port = _free_port()
    log = (work / "server.log").open("wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "qwen3_tts_native",
            "serve",
            "--model",
            str(work / "tiny"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--device",
            "cpu",
            "--max-concurrent-requests",
            "3",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        # a random snapshot made here is not the pinned model; serve it anyway (the server warns)
        env={**os.environ, "OMP_NUM_THREADS": "1", "QWEN3_TTS_ALLOW_UNVERIFIED_MODEL": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            assert process.poll() is None, (work / "server.log").read_text()
            try:
                if httpx.get(f"{url}/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "server not ready in time"
            time.sleep(0.5)
        yield url, process.pid
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _workload(path: Path) -> Path:
    reference = SHARED / "reference/corpora/http-workload-10.jsonl"
    rows = (
        [json.loads(line) for line in reference.read_text().splitlines()][:3]
        if reference.is_file()
        else [
            {
                "id": f"row-{i}",
                "text": f"Sentence {i}.",
                "voice_description": "A calm voice.",
                "language": "English",
                "seed": 42 + i,
                "stream": True,
            }
            for i in range(3)
        ]
    )
    for row in rows:
        row["max_duration_seconds"] = 0.4
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path


def test_benchmark_validate_report(server: tuple[str, int], tmp_path: Path) -> None:
    url, pid = server
    bundle = tmp_path / "bundle"
    run = _cli(
        "evidence",
        "run",
        "--engine",
        f"id=native,url={url},pid={pid},name=qwen3-tts-native,version=test",
        "--workload",
        str(_workload(tmp_path / "workload.jsonl")),
        "--profile",
        "B1,B3",
        "--requests",
        "3",
        "--warmups",
        "1",
        "--rounds",
        "1",
        "--idle-seconds",
        "1",
        "--benchmark-id",
        "ci-e2e",
        "--out",
        str(bundle),
        "--quiet",
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert bundle.is_dir() and bundle.with_name("bundle.tar.zst").is_file()

    refused = _cli("evidence", "validate", str(bundle))
    assert refused.returncode == 1 and "fixture.flag" in refused.stderr
    for target in (bundle, bundle.with_name("bundle.tar.zst")):
        valid = _cli("evidence", "validate", str(target), "--allow-test-fixture")
        assert valid.returncode == 0, valid.stdout + valid.stderr
        assert "2 runs, 6 measured requests" in valid.stdout

    requests = [
        json.loads(line)
        for run_dir in sorted((bundle / "runs/round-01/native").iterdir())
        for line in (run_dir / "requests.jsonl").read_text().splitlines()
    ]
    assert len(requests) == 6 and all(r["success"] for r in requests)
    assert all(r["samples"] > 0 and 0 < r["ttfa_ms"] <= r["wall_ms"] for r in requests)
    resource = json.loads((bundle / "runs/round-01/native/B3/run-resource.json").read_text())
    assert resource["process_rss_peak_bytes"] > 0 and not resource["rejected"]

    out = tmp_path / "report"
    report = _cli("evidence", "report", str(bundle), "-o", str(out), "--allow-test-fixture")
    assert report.returncode == 0, report.stdout + report.stderr
    html = (out / "index.html").read_text()
    images = [part.split('"', 1)[0] for part in html.split('<img src="')[1:]]
    assert {
        "plots/ttfa_cdf_B1.png",
        "plots/ttfa_cdf_B3.png",
        "plots/rtf_by_profile.png",
        "plots/packet_cadence.png",
        "plots/resources_over_time.png",
    } <= set(images)
    for image in images:
        assert (out / image).stat().st_size > 0

"""CPU smoke runs of the device acceptance scripts (benchmarks/device/) on a tiny random snapshot.

They check that each script runs end to end and writes its JSON; the numbers mean nothing on a CPU.
About 15-20 s each on 2 idle cores.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from qwen3_tts_native.engine.checkpoint import write_random_snapshot

HAS_QWEN_TTS = importlib.util.find_spec("qwen_tts") is not None
SCRIPTS = Path(__file__).resolve().parents[2] / "benchmarks" / "device"


@pytest.fixture(scope="module")
def tiny_snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_snapshot(tmp_path_factory.mktemp("device-scripts") / "tiny", "tiny", 0)


def run_script(name: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPTS / name), *args], capture_output=True, text=True, timeout=timeout
    )


def test_http_scaling_runs_on_cpu(tiny_snapshot: Path, tmp_path: Path) -> None:
    done = run_script(
        "http_scaling.py",
        "--out", str(tmp_path),
        "--model", str(tiny_snapshot),
        "--concurrency", "1,16",
        "--max-duration-seconds", "0.24",
        "--device", "cpu",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "http-scaling.json").read_text())
    assert [level["concurrency"] for level in report["levels"]] == [1, 16]
    for level in report["levels"]:
        assert level["failed"] == []
        assert level["frames"] == 3 * level["concurrency"]  # 0.24 s = 3 frames; EOS is banned for 2 frames
        assert level["aggregate_fps"] > 0
    assert report["acceptance"]["complete"] is True
    assert report["acceptance"]["fps_16_over_fps_1"] > 0
    assert report["server_exit_code"] == 0
    assert "fps(16)/fps(1)" in done.stdout


@pytest.mark.parity
@pytest.mark.skipif(not HAS_QWEN_TTS, reason="needs the official qwen-tts package")
def test_foundation_parity_runs_on_cpu(tiny_snapshot: Path, tmp_path: Path) -> None:
    done = run_script(
        "foundation_parity.py",
        "--out", str(tmp_path),
        "--model", str(tiny_snapshot),
        "--frames", "3",
        "--device", "cpu",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "foundation-parity.json").read_text())
    assert report["errors"] == []
    assert set(report["codes"]) == {"non_streaming", "streaming"}
    for row in report["codes"].values():
        assert row["official_frames"] == row["ours_frames"] == 3
        assert row["codes_total"] == 48
    codec = report["codec"]
    assert codec["frames"] == 3
    # fp32 vs fp32 on the same codes: the two decoders agree far below one PCM16 step.
    assert codec["ours_fp32_vs_official_fp32"]["rel_l2"] < 1e-4
    assert codec["ours_streamed_vs_one_shot_max_abs"] < 1e-4
    assert report["machine"]["reference"]["qwen-tts"] == "0.1.1"

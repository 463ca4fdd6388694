"""``qwen3-tts synthesize`` and ``model make-random``: WAV output, streaming, codes, threads, clean errors.

Every synthesize call passes ``--threads 1`` so the result does not depend on OMP_NUM_THREADS.
"""

from __future__ import annotations

import json
import shutil
import wave
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from qwen3_tts_native.cli import main
from qwen3_tts_native.engine.checkpoint import write_random_snapshot
from qwen3_tts_native.engine.demo import DEMO_NOTICE
from qwen3_tts_native.engine.identity import MANIFEST_FILENAME, verify_snapshot_for_serving
from qwen3_tts_native.engine.threads import THREADS_ENV, configure_cpu_threads, usable_cores

pytest.importorskip("qwen3_tts_native.engine.runtime.engine")


@pytest.fixture(autouse=True)
def _restore_torch_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_snapshot(tmp_path_factory.mktemp("cli") / "tiny", "tiny", seed=11)


def _wav_frames(path: Path) -> int:
    with wave.open(str(path)) as handle:
        assert handle.getframerate() == 24000 and handle.getnchannels() == 1 and handle.getsampwidth() == 2
        return handle.getnframes()


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("error: ")
    return lines[-1]


def test_stream_and_buffered_give_the_same_wav_and_codes(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = [
        "synthesize",
        "--model",
        str(tiny),
        "--text",
        "Hello there.",
        "--voice",
        "A calm voice",
        "--language",
        "English",
        "--max-frames",
        "3",
        "--seed",
        "5",
        "--device",
        "cpu",
        "--threads",
        "1",
    ]
    assert main([*common, "-o", str(tmp_path / "a.wav"), "--codes-out", str(tmp_path / "codes.json")]) == 0
    assert main([*common, "--stream", "-o", str(tmp_path / "b.wav")]) == 0
    out = capsys.readouterr().out
    assert "3 frames" in out and "finish_reason=length" in out
    assert _wav_frames(tmp_path / "a.wav") == 3 * 1920
    assert (tmp_path / "a.wav").read_bytes() == (tmp_path / "b.wav").read_bytes()
    codes = json.loads((tmp_path / "codes.json").read_text())
    assert len(codes) == 3 and all(len(row) == 16 for row in codes)
    assert all(0 <= code < 2048 for row in codes for code in row)


def test_demo_checkpoint_is_generated_once_and_announced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    args = ["synthesize", "--text", "Hi", "--greedy", "--max-frames", "2", "--device", "cpu"]
    args += ["--threads", "1"]
    assert main([*args, "-o", str(tmp_path / "a.wav")]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert DEMO_NOTICE in err and "generating it once" in err
    assert main([*args, "-o", str(tmp_path / "b.wav")]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert DEMO_NOTICE in err and "generating it once" not in err
    assert _wav_frames(tmp_path / "b.wav") == 2 * 1920
    assert (tmp_path / "a.wav").read_bytes() == (tmp_path / "b.wav").read_bytes()


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--text", "   "], "--text must not be empty"),
        (["--text", "Hi", "--language", "klingon"], "unknown --language 'klingon'"),
        (["--text", "Hi", "--max-frames", "0"], "--max-frames must be >= 1"),
        (["--text", "Hi", "--model", "/nonexistent/model"], "model directory does not exist"),
        (["--text", "Hi", "--threads", "0"], "--threads must be >= 1"),
    ],
)
def test_usage_errors_exit_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], fragment: str
) -> None:
    assert main(["synthesize", *extra, "-o", str(tmp_path / "x.wav")]) == 2
    assert fragment in _one_error_line(capsys)
    assert not (tmp_path / "x.wav").exists()


def test_corrupt_snapshot_exits_2(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = Path(shutil.copytree(tiny, tmp_path / "broken"))
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:50])
    code = main(
        [
            "synthesize",
            "--model",
            str(broken),
            "--text",
            "Hi",
            "--device",
            "cpu",
            "--threads",
            "1",
            "-o",
            str(tmp_path / "x.wav"),
        ]
    )
    assert code == 2
    assert "truncated" in _one_error_line(capsys)


def test_make_random_writes_and_refuses_non_empty(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "snap"
    assert main(["model", "make-random", "--preset", "tiny", "--seed", "2", "--out", str(out)]) == 0
    assert (out / "model.safetensors").is_file() and (
        out / "speech_tokenizer" / "model.safetensors"
    ).is_file()
    out_text = capsys.readouterr().out
    assert "random weights" in out_text and "identity local/random-tiny-seed2@sha256:" in out_text
    assert (out / MANIFEST_FILENAME).is_file() and verify_snapshot_for_serving(out).ok
    assert main(["model", "make-random", "--preset", "tiny", "--seed", "2", "--out", str(out)]) == 2
    assert "not empty" in _one_error_line(capsys)


def test_synthesize_applies_threads_flag_over_the_environment(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(THREADS_ENV, "3")
    args = ["synthesize", "--model", str(tiny), "--text", "Hi", "--max-frames", "1", "--device", "cpu"]
    assert main([*args, "--threads", "1", "-o", str(tmp_path / "a.wav")]) == 0
    assert torch.get_num_threads() == 1


@pytest.mark.parametrize(
    ("setting", "environ", "demo", "expected"),
    [
        (2, {THREADS_ENV: "3", "OMP_NUM_THREADS": "1"}, True, 2),  # the flag wins
        (None, {THREADS_ENV: "3", "OMP_NUM_THREADS": "1"}, True, 3),  # then QWEN3_TTS_THREADS
        (None, {}, True, 1),  # the demo: one thread
        (None, {}, False, min(4, usable_cores())),  # a real model: up to four
    ],
)
def test_thread_precedence(setting: int | None, environ: dict[str, str], demo: bool, expected: int) -> None:
    assert configure_cpu_threads(setting, demo=demo, environ=environ) == expected
    assert torch.get_num_threads() == expected


def test_omp_num_threads_is_left_to_torch_and_bad_values_are_named() -> None:
    torch.set_num_threads(1)
    assert configure_cpu_threads(None, demo=False, environ={"OMP_NUM_THREADS": "1"}) == 1
    with pytest.raises(ValueError, match=THREADS_ENV):
        configure_cpu_threads(None, environ={THREADS_ENV: "many"})

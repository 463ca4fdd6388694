"""``qwen3-tts synthesize`` and ``model make-random``: WAV output, streaming, codes, clean errors."""

from __future__ import annotations

import json
import shutil
import wave
from pathlib import Path

import pytest

from qwen3_tts_native.cli import main
from qwen3_tts_native.engine.checkpoint import write_random_snapshot
from qwen3_tts_native.engine.demo import DEMO_NOTICE

pytest.importorskip("qwen3_tts_native.engine.runtime.engine")


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
    assert "random weights" in capsys.readouterr().out
    assert main(["model", "make-random", "--preset", "tiny", "--seed", "2", "--out", str(out)]) == 2
    assert "not empty" in _one_error_line(capsys)

"""`qwen3-tts bench` runs each mode in a process of its own: the child gets every option that times a mode,
a child that fails leaves an error in the parent's figures instead of ending the run, and the engines it
times share one set of weights."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest
import torch

from qwen3_tts_native.cli import build_parser
from qwen3_tts_native.commands.bench import engine_factory, mode_process_command, run_mode_process
from qwen3_tts_native.engine.checkpoint import write_random_snapshot
from qwen3_tts_native.engine.runtime.engine import VoiceDesignEngine

# Options only the parent uses (the peers and the HTTP server run from it), and those it sets per child.
PARENT_ONLY = {"peers", "peer_pythonpath", "peer_frames", "peer_timeout_s", "http", "http_runs"}
SET_PER_CHILD = {"modes", "timing_model", "mode_json", "profile_dir"}


def parse_bench(tmp_path: Path) -> argparse.Namespace:
    options = "--modes exact,fast --frames 37 --runs 2 --ttfa-runs 4 --concurrency 1,5 --concurrency-frames 9"
    options += " --level-timeout-s 12.5 --level-runs 2 --max-context 300 --peers none --no-http"
    model, out = str(tmp_path / "snapshot"), str(tmp_path / "out")
    return build_parser().parse_args(["bench", "--model", model, "--out-dir", out, *options.split()])


def test_a_mode_process_gets_every_option_that_times_a_mode(tmp_path: Path) -> None:
    args = parse_bench(tmp_path)
    timing_model, out = tmp_path / "snapshot-noeos", tmp_path / "out" / "mode-fast.json"
    command = mode_process_command(args, "fast", timing_model, out)
    assert command[:4] == [sys.executable, "-m", "qwen3_tts_native", "bench"]
    child = build_parser().parse_args(command[3:])
    parent_options, child_options = vars(args), vars(child)
    for name, value in parent_options.items():
        if name not in PARENT_ONLY | SET_PER_CHILD:
            assert child_options[name] == value, name
    assert (child.modes, child.timing_model, child.mode_json) == ("fast", timing_model, out)
    assert child.profile_dir == tmp_path / "out"


def test_a_mode_process_that_fails_leaves_an_error_not_a_crash(tmp_path: Path) -> None:
    # On this CUDA-less machine the child exits 2 ("needs a CUDA device") before writing figures.
    args = parse_bench(tmp_path)
    record = run_mode_process(args, "exact", tmp_path / "snapshot-noeos")
    assert record == {"error": "the exact process exited 2 without figures (its log is above)"}
    assert not (tmp_path / "out" / "mode-exact.json").exists()


def test_timed_engines_share_the_weights_and_copy_only_a_float32_codec(tmp_path: Path) -> None:
    snapshot = write_random_snapshot(tmp_path / "tiny", "tiny", 0)

    def base(codec_dtype: torch.dtype) -> VoiceDesignEngine:
        return VoiceDesignEngine.load(
            snapshot, codec_dtype=codec_dtype, max_sessions=1, max_context=64, accelerate=False
        )

    float32_base = base(torch.float32)
    load_engine = engine_factory(float32_base, 64, torch.float32)
    engine = load_engine(2)
    assert engine.max_sessions == 2
    assert engine.talker is float32_base.talker and engine.decoder is float32_base.decoder
    bf16 = load_engine(1, torch.bfloat16)
    assert next(bf16.decoder.parameters()).dtype == torch.bfloat16
    assert load_engine(1, torch.bfloat16).decoder is bf16.decoder  # copied once
    bf16_base = base(torch.bfloat16)
    assert engine_factory(bf16_base, 64, torch.bfloat16)(1).decoder is bf16_base.decoder
    with pytest.raises(ValueError, match="only be copied from a float32"):
        engine_factory(bf16_base, 64, torch.bfloat16)(1, torch.float32)

"""`qwen3-tts bench` runs each mode in a process of its own: the child gets every option that times a mode,
and a child that fails leaves an error in the parent's figures instead of ending the run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from qwen3_tts_native.cli import build_parser
from qwen3_tts_native.commands.bench import mode_process_command, run_mode_process

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

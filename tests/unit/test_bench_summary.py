"""The bench's summary: the keys runs are compared by, and each peer's figures beside how many times faster
the mode is than that peer, from the same run (issue 4: "the same run shows our figures and the peers'
side by side, with the ratio")."""

from __future__ import annotations

from typing import Any

import pytest

from qwen3_tts_native.commands.bench import build_summary, print_table


def bench_result() -> dict[str, Any]:
    level = {"aggregate_rtf": 0.002, "worst_stream_rtf": 0.12}
    return {
        "system": {"gpu": "NVIDIA H200"},
        "modes": {
            "fast": {
                "single": {"rtf": {"median": 0.03}, "frame_loop_rtf": {"median": 0.029}},
                "ttfa_ms": {"p50": 8.0, "p95": 9.0},
                "concurrency": {"1": level, "64": level},
                "peak_gpu_memory_bytes_b1": 6_000_000_000,
            }
        },
        "http": {"fast": {"ttfa_ms": {"p50": 10.0}}},
        "peers": {
            "faster": {"single_stream_rtf": 0.27, "ttfa_ms": 96.0, "rtf": {"median": 0.27}},
            "official": {"error": "the peer timed out after 150 s"},
        },
    }


def test_each_peer_is_given_beside_how_many_times_faster_the_mode_is() -> None:
    summary = build_summary(bench_result(), "fast")
    faster = summary["peers"]["faster"]
    assert faster["single_stream_rtf"] == 0.27 and faster["ttfa_ms"] == 96.0
    assert faster["single_stream_rtf_times_faster"] == pytest.approx(9.0)
    assert faster["ttfa_times_faster"] == pytest.approx(12.0)
    assert "rtf" not in faster  # only the compared figures travel
    assert summary["peers"]["official"] == {"error": "the peer timed out after 150 s"}


def test_the_summary_keeps_the_keys_runs_are_compared_by() -> None:
    summary = build_summary(bench_result(), "fast")
    for key in ("mode", "gpu", "single_stream_rtf", "ttfa_p50_ms", "ttfa_p95_ms", "peak_gpu_memory_bytes_b1"):
        assert summary[key] is not None, key
    assert summary["aggregate_rtf"] == {"1": 0.002, "64": 0.002}
    assert summary["worst_stream_rtf"] == {"1": 0.12, "64": 0.12}


def test_a_mode_without_figures_gives_no_ratio() -> None:
    """A mode whose process failed has no single-stream RTF: its peers keep their figures and get no ratio."""
    result = bench_result()
    result["modes"]["fast"] = {"error": "the fast process exited 1 without figures"}
    faster = build_summary(result, "fast")["peers"]["faster"]
    assert faster == {"single_stream_rtf": 0.27, "ttfa_ms": 96.0}


def test_the_table_prints_the_ratios(capsys: pytest.CaptureFixture[str]) -> None:
    print_table(build_summary(bench_result(), "fast"))
    out = capsys.readouterr().out
    line = "peer faster: single-stream RTF 0.2700 (ours 9.0x faster)   TTFA 96.0000 ms (ours 12.0x faster)"
    assert line in out
    assert "peer official: the peer timed out after 150 s" in out

"""Workload parsing and sampling normalization; the shared statistics (percentiles, underruns)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from qwen3_tts_native.evidence.stats import distribution, percentile, underruns
from qwen3_tts_native.evidence.workload import (
    WorkloadError,
    load_workload,
    max_codec_frames,
    normalized_sampling,
    normalized_sampling_sha256,
    parity_reasons,
    parse_workload,
)

ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("QWEN3_TTS_SHARED", ROOT.parent / "shared"))
HTTP_WORKLOAD = SHARED / "reference/corpora/http-workload-10.jsonl"


def _row(**fields: object) -> bytes:
    base: dict[str, object] = {"id": "r1", "text": "Hello.", "voice_description": "calm"}
    base.update(fields)
    return (json.dumps(base) + "\n").encode()


def test_reference_workload_parses_and_qualifies() -> None:
    if not HTTP_WORKLOAD.is_file():
        pytest.skip(f"shared reference {HTTP_WORKLOAD} is not beside the repository")
    workload = load_workload(HTTP_WORKLOAD)
    assert len(workload.rows) == 10
    assert workload.ordered_seeds == list(range(42, 52))
    assert all(parity_reasons(row) == [] for row in workload.rows)
    assert workload.row_for(13).id == workload.rows[3].id


@pytest.mark.parametrize(
    "line",
    [
        b"",
        b'{"id":"a","text":"x","voice_description":"y"}',
        _row(extra=1),
        _row(id="bad id"),
        _row(text="  "),
        _row(seed=-1),
        _row(seed=True),
        _row(max_duration_seconds=0.01),
        _row(sampling={"strategy": "greedy", "temperature": 0.5}),
        _row(sampling={"temperature": float("nan")}),
        _row(sampling={"predictor": {"repetition_penalty": 1.0}}),
        _row(stream="yes"),
        _row() + _row(),
        b'{"id":"a","id":"b","text":"x","voice_description":"y"}\n',
    ],
)
def test_malformed_workloads_are_rejected(line: bytes) -> None:
    with pytest.raises(WorkloadError):
        parse_workload(line)


def test_normalization_spells_out_defaults() -> None:
    implicit = parse_workload(_row(seed=1, sampling={})).rows[0]
    explicit = parse_workload(
        _row(
            seed=1,
            sampling={
                "strategy": "sample",
                "temperature": 0.9,
                "top_p": 1.0,
                "top_k": 50,
                "repetition_penalty": 1.05,
                "predictor": {"strategy": "sample", "temperature": 0.9, "top_p": 1.0, "top_k": 50},
            },
        )
    ).rows[0]
    assert normalized_sampling(implicit) == normalized_sampling(explicit)
    assert normalized_sampling_sha256(normalized_sampling(implicit)) == normalized_sampling_sha256(
        normalized_sampling(explicit)
    )
    assert parity_reasons(explicit) == []
    assert "sampling.temperature not explicit" in parity_reasons(implicit)
    greedy = parse_workload(_row(sampling={"strategy": "greedy"})).rows[0]
    assert normalized_sampling(greedy)["talker"]["temperature"] is None
    assert normalized_sampling(greedy)["predictor"]["strategy"] == "greedy"
    assert parity_reasons(greedy) == [
        "seed not explicit",
        "sampling.repetition_penalty not explicit",
        "sampling.predictor not explicit",
    ]
    assert normalized_sampling(parse_workload(_row()).rows[0])["talker"] is None


def test_max_codec_frames() -> None:
    assert [max_codec_frames(s) for s in (0.08, 0.081, 20.48, 120)] == [1, 2, 256, 1500]


def test_percentile_linear_interpolation() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile([5.0], 0.99) == 5.0
    d = distribution([4, 1, 3, 2])
    assert d["count"] == 4 and d["min"] == 1 and d["max"] == 4 and d["mean"] == 2.5
    assert d["p90"] == pytest.approx(3.7)
    assert distribution([])["p50"] is None


def test_underruns_model_stalls() -> None:
    # 80 ms of audio per packet (3840 bytes at 24 kHz PCM16).
    assert underruns([0.0, 50.0, 100.0], [3840, 3840, 3840], 24000) == (0, 0.0)
    count, stalled = underruns([0.0, 100.0, 150.0], [3840, 3840, 3840], 24000)
    assert count == 1 and stalled == pytest.approx(20.0)
    # After a stall playback restarts from the late packet: 100 + 80 = 180 covers the packet at 170.
    assert underruns([0.0, 100.0, 170.0, 300.0], [3840] * 4, 24000) == (1 + 1, pytest.approx(20.0 + 40.0))

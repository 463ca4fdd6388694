"""The load client against a loopback test double: records, failures, load shapes, crash-safe streaming."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from evidence_fakes import FakeServer, read_jsonl, workload_lines

from qwen3_tts_native.evidence.adapters import make_adapter
from qwen3_tts_native.evidence.client import (
    PhaseClock,
    Profile,
    RunAborted,
    RunFiles,
    RunSpec,
    arrival_offsets_s,
    run_load,
)
from qwen3_tts_native.evidence.runner import EngineSpec, run_order
from qwen3_tts_native.evidence.workload import parse_workload


@pytest.fixture(scope="module")
def server() -> Iterator[FakeServer]:
    with FakeServer() as fake:
        yield fake


def _run(
    server: FakeServer,
    tmp_path: Path,
    api: str = "native",
    profile: str = "B2",
    requests: int = 3,
    warmups: int = 0,
    texts: list[str] | None = None,
    response: str | None = None,
) -> tuple[list[dict], list[dict], PhaseClock]:
    data = workload_lines()
    if texts:
        rows = [json.loads(line) for line in data.decode().splitlines()]
        for row, text in zip(rows, texts, strict=False):
            row["text"] = text
        data = ("\n".join(json.dumps(r) for r in rows) + "\n").encode()
    spec = RunSpec(
        engine_id="e",
        base_url=server.url,
        adapter=make_adapter(api, response=response),
        profile=Profile.parse(profile),
        round=1,
        warmups=warmups,
        requests=requests,
        timeout_s=30,
        idle_seconds=0.0,
    )
    files = RunFiles(tmp_path / "run")
    phases = PhaseClock()
    done: list[bool] = []
    try:
        asyncio.run(run_load(spec, parse_workload(data), files, phases, done.append))
    finally:
        files.close()
    assert done.count(True) == requests
    return read_jsonl(tmp_path / "run/requests.jsonl"), read_jsonl(tmp_path / "run/packets.jsonl"), phases


def test_native_records(server: FakeServer, tmp_path: Path) -> None:
    requests, packets, phases = _run(server, tmp_path, requests=3, warmups=1)
    assert [e["event"] for e in phases.events] == [
        "idle_start",
        "idle_end",
        "warmup_start",
        "warmup_end",
        "measured_start",
        "measured_end",
    ]
    assert sorted(r["request_index"] for r in requests) == [0, 1, 2]
    for record in requests:
        assert record["success"] and record["status"] == "success" and record["http_status"] == 200
        assert record["samples"] == 5 * 1920 and record["audio_seconds"] == pytest.approx(0.4)
        assert (
            record["packet_count"] == 2 and record["finish_reason"] == "length" and record["length_limited"]
        )
        assert 0 < record["ttfa_ms"] <= record["wall_ms"]
        assert record["rtf"] == pytest.approx(record["wall_ms"] / 1000 / 0.4)
        assert record["sampling_parity_qualifying"] and record["server_seed"] == 40 + record["request_index"]
    first = [p for p in packets if p["request_index"] == 0]
    assert [p["kind"] for p in first] == ["native_audio_packet"] * 2
    assert first[0]["arrival_ms"] == requests[[r["request_index"] for r in requests].index(0)]["ttfa_ms"]


@pytest.mark.parametrize(
    ("api", "response", "kind"),
    [
        ("openai", "pcm", "raw_pcm_transport_arrival"),
        ("openai", "sse", "sse_audio_delta"),
        ("openai", "wav", "wav_data_arrival"),
        ("wav", None, "wav_data_arrival"),
    ],
)
def test_peer_apis(server: FakeServer, tmp_path: Path, api: str, response: str | None, kind: str) -> None:
    requests, packets, _ = _run(server, tmp_path, api=api, requests=2, response=response)
    assert all(r["success"] for r in requests), requests
    assert {p["kind"] for p in packets} == {kind}
    for record in requests:
        mine = [p for p in packets if p["request_index"] == record["request_index"]]
        assert sum(p["payload_bytes"] for p in mine) == 2 * record["samples"]
        assert record["sampling_parity_qualifying"] is (api != "openai")


def test_failures_are_recorded_not_raised(server: FakeServer, tmp_path: Path) -> None:
    requests, packets, _ = _run(
        server, tmp_path, profile="B1", requests=3, texts=["FAIL429", "ERRPART", "TRUNCATE"]
    )
    by_index = {r["request_index"]: r for r in requests}
    assert by_index[0]["failure"]["code"] == "http_429" and by_index[0]["http_status"] == 429
    assert (
        by_index[0]["failure"]["response_body_bytes"] > 0 and by_index[0]["failure"]["response_body_sha256"]
    )
    assert by_index[1]["failure"]["code"] == "internal_error"
    assert by_index[2]["failure"]["code"] == "truncated_stream"
    for record in requests:
        assert not record["success"] and record["status"] == "error" and record["ttfa_ms"] is None
        assert record["packet_count"] == 0
    assert packets == []


def test_warmup_failure_aborts(server: FakeServer, tmp_path: Path) -> None:
    with pytest.raises(RunAborted):
        _run(server, tmp_path, requests=1, warmups=1, texts=["FAIL429"])


def test_connection_refused_is_a_connect_error(tmp_path: Path) -> None:
    spec = RunSpec(
        engine_id="e",
        base_url="http://127.0.0.1:9",
        adapter=make_adapter("native"),
        profile=Profile.parse("B1"),
        round=1,
        warmups=0,
        requests=1,
        timeout_s=5,
        idle_seconds=0,
    )
    files = RunFiles(tmp_path / "run")
    asyncio.run(run_load(spec, parse_workload(workload_lines(1)), files, PhaseClock(), lambda _: None))
    files.close()
    (record,) = read_jsonl(tmp_path / "run/requests.jsonl")
    assert record["failure"]["code"] == "connect_error" and record["http_status"] is None


def test_open_loop_follows_its_schedule(server: FakeServer, tmp_path: Path) -> None:
    requests, _, _ = _run(server, tmp_path, profile="R20", requests=6)
    offsets = arrival_offsets_s(20.0, 6, 0)
    for record in requests:
        scheduled = offsets[record["request_index"]] * 1000
        assert record["scheduled_offset_ms"] == pytest.approx(scheduled)
        assert record["start_offset_ms"] >= scheduled - 1.0


def test_records_reach_disk_before_the_run_ends(server: FakeServer, tmp_path: Path) -> None:
    seen: list[int] = []

    def on_request(measured: bool) -> None:
        seen.append(len((tmp_path / "run/requests.jsonl").read_bytes().splitlines()))

    spec = RunSpec(
        engine_id="e",
        base_url=server.url,
        adapter=make_adapter("native"),
        profile=Profile.parse("B1"),
        round=1,
        warmups=0,
        requests=3,
        timeout_s=30,
        idle_seconds=0,
    )
    files = RunFiles(tmp_path / "run")
    asyncio.run(run_load(spec, parse_workload(workload_lines()), files, PhaseClock(), on_request))
    files.close()
    assert seen == [1, 2, 3]


def test_profiles_and_engine_specs() -> None:
    assert Profile.parse("B6") == Profile("B6", "closed", 6, None)
    assert Profile.parse("R2.5").arrival_rate_per_second == 2.5
    for bad in ("B0", "b3", "R0", "X1", "B1.5"):
        with pytest.raises(ValueError):
            Profile.parse(bad)
    spec = EngineSpec.parse(
        "id=peer,url=http://127.0.0.1:8000/,api=openai,response=sse,role=baseline,gpu=0+1"
    )
    assert spec.url == "http://127.0.0.1:8000" and spec.gpus == (0, 1) and spec.response_format == "sse"
    for bad in (
        "url=http://x:1",
        "id=a",
        "id=a,url=ftp://x",
        "id=a,url=http://x:1/v1",
        "id=a,url=http://x:1,bogus=1",
        "id=a,url=http://x:1,api=grpc",
        "id=a,url=http://x:1,role=winner",
    ):
        with pytest.raises(ValueError):
            EngineSpec.parse(bad)


def test_rounds_alternate_engine_order() -> None:
    a, b = EngineSpec.parse("id=a,url=http://x:1"), EngineSpec.parse("id=b,url=http://x:2")
    order = [(e.id, p.id, r) for e, p, r in run_order([a, b], [Profile.parse("B1")], 3)]
    assert order == [
        ("a", "B1", 1),
        ("b", "B1", 1),
        ("b", "B1", 2),
        ("a", "B1", 2),
        ("a", "B1", 3),
        ("b", "B1", 3),
    ]

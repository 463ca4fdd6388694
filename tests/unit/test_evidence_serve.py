"""Engines brought up one at a time by a serve hook into one bundle, and workload fields on the openai API."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from evidence_fakes import FakeServer, free_port, read_jsonl, workload_lines

from qwen3_tts_native.evidence.adapters import make_adapter
from qwen3_tts_native.evidence.client import Profile
from qwen3_tts_native.evidence.runner import EngineSpec, RunOptions, execute
from qwen3_tts_native.evidence.validate import validate_bundle
from qwen3_tts_native.evidence.workload import parity_reasons, parse_workload

FIELDS = ("language", "seed", "max_duration_seconds", "sampling")


def test_openai_adapter_forwards_the_fields_it_is_given() -> None:
    row = parse_workload(workload_lines(rows=1)).rows[0]
    plain = make_adapter("openai").prepare(row, "r")
    assert set(json.loads(plain.body)) == {"model", "input", "voice", "response_format", "stream_format"}
    assert plain.api_parity_reasons == ("the openai request carries no seed or sampling",)
    seeded = make_adapter("openai", fields=("seed",)).prepare(row, "r")
    assert json.loads(seeded.body)["seed"] == row.seed
    assert seeded.api_parity_reasons == ("the openai request carries no sampling",)
    full = make_adapter("openai", fields=FIELDS).prepare(row, "r")
    body = json.loads(full.body)
    assert {name: body[name] for name in FIELDS} == {name: row.raw[name] for name in FIELDS}
    assert full.api_parity_reasons == ()
    with pytest.raises(ValueError, match="openai fields"):
        make_adapter("openai", fields=("stream",))
    with pytest.raises(ValueError, match="openai API only"):
        make_adapter("native", fields=("seed",))


def test_openai_adapter_forwards_only_what_the_row_has() -> None:
    row = parse_workload(workload_lines(rows=1)).rows[0]
    bare = replace(row, raw={key: row.raw[key] for key in ("id", "text", "voice_description", "language")})
    prepared = make_adapter("openai", fields=FIELDS).prepare(bare, "r")
    body = json.loads(prepared.body)
    assert body["language"] == "English" and not {"seed", "max_duration_seconds", "sampling"} & set(body)
    # the row, not the API, is what keeps this request out of sampling parity
    assert [*parity_reasons(bare), *prepared.api_parity_reasons] == [
        "seed not explicit",
        "sampling not explicit",
    ]
    assert parity_reasons(row) == []


def test_engine_spec_parses_fields() -> None:
    spec = EngineSpec.parse("id=p,url=http://127.0.0.1:9,api=openai,fields=seed+sampling")
    assert spec.fields == ("seed", "sampling")
    assert spec.manifest_notes() == ["openai requests carry the workload fields seed, sampling"]
    with pytest.raises(ValueError):
        EngineSpec.parse("id=p,url=http://127.0.0.1:9,api=openai,fields=seed+speed")
    with pytest.raises(ValueError):
        EngineSpec.parse("id=p,url=http://127.0.0.1:9,api=native,fields=seed")


def test_serve_hook_runs_engines_one_at_a_time_into_one_bundle(tmp_path: Path) -> None:
    events: list[str] = []
    live: dict[str, FakeServer] = {}
    ports = {"ours": free_port(), "peer": free_port()}
    ours = EngineSpec(id="ours", url=f"http://127.0.0.1:{ports['ours']}", api="native", version="1")
    peer = EngineSpec(
        id="peer",
        url=f"http://127.0.0.1:{ports['peer']}",
        api="openai",
        role="baseline",
        fields=FIELDS,
        notes=("a note",),
    )

    @contextlib.contextmanager
    def serve(engine: EngineSpec) -> Iterator[EngineSpec]:
        assert not live, "two engines up at once"
        events.append(f"up {engine.id}")
        with FakeServer(port=ports[engine.id]) as server:
            live[engine.id] = server
            yield replace(engine, pid=os.getpid())
            del live[engine.id]
        events.append(f"down {engine.id}")

    runs: list[tuple[str, str, int]] = []
    options = RunOptions(
        engines=[ours, peer],
        profiles=[Profile.parse("B1"), Profile.parse("B2")],
        workload=parse_workload(workload_lines()),
        out=tmp_path / "bundle",
        requests=2,
        warmups=1,
        rounds=2,
        idle_seconds=0.1,
        timeout_s=30,
    )
    bundle = execute(options, lambda measured: None, lambda e, p, r: runs.append((e.id, p.id, r)), serve)
    assert events == ["up ours", "down ours", "up peer", "down peer", "up ours", "down ours"]
    assert [r[0] for r in runs] == ["ours", "ours", "peer", "peer", "peer", "peer", "ours", "ours"]
    result = validate_bundle(bundle, allow_test_fixture=True)
    assert result.ok, result.findings.failures
    manifest = json.loads((bundle / "manifest.json").read_text())
    implementations = {i["id"]: i for i in manifest["implementations"]}
    assert implementations["ours"]["server_pids"] == [os.getpid()]
    assert implementations["peer"]["notes"] == [
        "a note",
        "openai requests carry the workload fields language, seed, max_duration_seconds, sampling",
    ]
    records = read_jsonl(bundle / "runs/round-01/peer/B1/requests.jsonl")
    assert all(r["sampling_parity_qualifying"] for r in records)


def test_serve_hook_must_keep_the_engine_url(tmp_path: Path) -> None:
    engine = EngineSpec(id="ours", url="http://127.0.0.1:1")

    @contextlib.contextmanager
    def serve(spec: EngineSpec) -> Iterator[EngineSpec]:
        yield replace(spec, url="http://127.0.0.1:3")

    options = RunOptions(
        engines=[engine],
        profiles=[Profile.parse("B1")],
        workload=parse_workload(workload_lines()),
        out=tmp_path / "bundle",
        requests=1,
        warmups=0,
    )
    with pytest.raises(ValueError, match="changed engine"):
        execute(options, lambda measured: None, lambda e, p, r: None, serve)

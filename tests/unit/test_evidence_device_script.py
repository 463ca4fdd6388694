"""The device evidence script (benchmarks/device/evidence_run.py) and the faster-qwen3-tts HTTP wrapper
(benchmarks/peers/faster_server.py), with a stand-in for the faster-qwen3-tts model (it is not installed
here): request mapping, one-at-a-time synthesis, and a whole run of both engines into one valid bundle.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tarfile
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from evidence_fakes import FakeFasterModel
from script_modules import load_script

ROOT = Path(__file__).resolve().parents[2]
PEERS = ROOT / "benchmarks" / "peers"
SCRIPT = ROOT / "benchmarks" / "device" / "evidence_run.py"
FAKE_PEER = """
import sys, time
sys.path.insert(0, {peers!r})
sys.path.insert(0, {tests!r})
import uvicorn
from faster_server import Synthesizer, create_app
from evidence_fakes import FakeFasterModel

app = create_app(Synthesizer(FakeFasterModel(), 4), 256, "0.0-fake")
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


faster_server = load_script(PEERS / "faster_server.py")
evidence_run = load_script(SCRIPT)


def _body(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "input": "Hello there.", "voice": "A calm voice.", **extra}


def test_body_maps_to_voice_design_arguments() -> None:
    sampling = {
        "strategy": "sample",
        "temperature": 0.8,
        "top_p": 0.95,
        "top_k": 40,
        "repetition_penalty": 1.1,
        "predictor": {"strategy": "sample", "temperature": 0.9, "top_p": 1.0, "top_k": 50},
    }
    job = faster_server.parse_body(
        _body(language="German", seed=7, max_duration_seconds=0.4, sampling=sampling), 256
    )
    assert job.seed == 7 and not job.wav
    assert job.kwargs == {
        "text": "Hello there.",
        "instruct": "A calm voice.",
        "language": "German",
        "max_new_tokens": 5,
        "do_sample": True,
        "temperature": 0.8,
        "top_k": 40,
        "top_p": 0.95,
        "repetition_penalty": 1.1,
    }
    plain = faster_server.parse_body(_body(instructions="Bright.", response_format="wav"), 64)
    assert plain.kwargs == {
        "text": "Hello there.",
        "instruct": "Bright.",
        "language": "Auto",
        "max_new_tokens": 64,
    }
    assert plain.wav and plain.seed is None


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (_body(extra=1), 400, "malformed_json"),
        (_body(input=""), 422, "invalid_value"),
        (_body(max_duration_seconds=30.0), 422, "duration_out_of_range"),
        (_body(stream_format="sse"), 422, "unsupported_format"),
        (_body(seed=-1), 422, "invalid_value"),
        (_body(sampling={"strategy": "greedy"}), 422, "unsupported_sampling"),
        (_body(sampling={"predictor": {"top_k": 20}}), 422, "unsupported_sampling"),
    ],
)
def test_body_refusals(body: dict[str, Any], status: int, code: str) -> None:
    with pytest.raises(faster_server.BadRequest) as caught:
        faster_server.parse_body(body, 256)
    assert (caught.value.status, caught.value.code) == (status, code)


def test_server_streams_pcm_one_request_at_a_time() -> None:
    model = FakeFasterModel()
    app = faster_server.create_app(faster_server.Synthesizer(model, 4), 256, "0.0-fake")

    async def scenario() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            ready = await client.get("/health/ready")
            assert ready.json()["version"] == "0.0-fake"
            requests = [
                client.post(
                    "/v1/audio/speech", json=_body(seed=i, max_duration_seconds=0.8, language="English")
                )
                for i in range(3)
            ]
            wav = client.post(
                "/v1/audio/speech", json=_body(response_format="wav", max_duration_seconds=0.16)
            )
            bad = client.post("/v1/audio/speech", json=_body(language="Klingon"))
            return list(await asyncio.gather(*requests, wav, bad))

    *streams, wav, bad = asyncio.run(scenario())
    assert model.most_active == 1
    for index, response in enumerate(streams):
        assert response.status_code == 200 and response.headers["x-qwen3-seed"] == str(index)
        assert response.headers["content-type"].startswith("audio/pcm")
        assert len(response.content) == 10 * 1920 * 2
        assert np.frombuffer(response.content, "<i2")[0] == round(0.25 * 32767)
    assert wav.headers["content-type"] == "audio/wav" and wav.content[:4] == b"RIFF"
    assert len(wav.content) == 44 + 2 * 1920 * 2
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "unsupported_language"


def test_capped_workload_and_engines() -> None:
    workload = evidence_run.capped_workload(evidence_run.WORKLOAD, 5.12)
    assert len(workload.rows) == 10
    assert {row.max_duration_seconds for row in workload.rows} == {5.12}
    shared = ROOT.parent / "shared" / "reference" / "corpora" / "http-workload-10.jsonl"
    if shared.is_file():
        assert shared.read_bytes() == evidence_run.WORKLOAD.read_bytes()
    peer = evidence_run.engine_spec("faster", 9, None)
    assert (peer.api, peer.role, peer.fields) == ("openai", "baseline", evidence_run.PEER_FIELDS)
    ours = evidence_run.engine_spec("ours", 8, "abcdef0")
    assert (ours.api, ours.role, ours.commit) == ("native", "candidate", "abcdef0")
    assert "--max-concurrent-requests" in evidence_run.server_command("ours", Path("m"), 8, 6)
    with pytest.raises(SystemExit):
        evidence_run.parse_args(["--model", "m", "--out", "o", "--engines", "ours,sglang"])


@pytest.mark.integration
def test_both_engines_into_one_valid_bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_snapshot: Path
) -> None:
    """Our server on the tiny snapshot, then the wrapper around the stand-in model: one valid bundle."""
    fake = tmp_path / "fake_peer.py"
    fake.write_text(FAKE_PEER.format(peers=str(PEERS), tests=str(Path(__file__).parent)))
    real_command = evidence_run.server_command

    def command(engine: str, model: Path, port: int, concurrency: int) -> list[str]:
        if engine == "faster":
            return [sys.executable, str(fake), str(port)]
        return real_command(engine, model, port, concurrency)

    monkeypatch.setattr(evidence_run, "server_command", command)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "out"
    code = evidence_run.main(
        [
            "--model",
            str(tiny_snapshot),
            "--out",
            str(out),
            "--profiles",
            "B1,B3",
            "--requests",
            "3",
            "--warmups",
            "1",
            "--idle-seconds",
            "0.3",
            "--max-duration-seconds",
            "0.4",
            "--budget-s",
            "90",
        ]
    )
    assert code == 0, (out / evidence_run.VALIDATION_FILE).read_text()
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [evidence_run.BUNDLE_FILE, evidence_run.REPORT_FILE, evidence_run.VALIDATION_FILE]
    )
    assert "4 runs, 12 measured requests" in (out / evidence_run.VALIDATION_FILE).read_text()
    with tarfile.open(out / evidence_run.REPORT_FILE) as archive:
        names = set(archive.getnames())
    assert {"report/index.html", "validation.txt", "logs/ours-server.log", "logs/faster-server.log"} <= names
    assert any(name.startswith("report/plots/") for name in names)


@pytest.fixture(scope="module")
def tiny_snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import subprocess

    out = tmp_path_factory.mktemp("tiny") / "tiny"
    made = subprocess.run(
        [
            sys.executable,
            "-m",
            "qwen3_tts_native",
            "model",
            "make-random",
            "--preset",
            "tiny",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    json.loads((out / "config.json").read_text())
    return out


def test_a_server_that_dies_aborts_with_its_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def command(engine: str, model: Path, port: int, concurrency: int) -> list[str]:
        return [sys.executable, "-c", "import sys; print('no model here'); sys.exit(5)"]

    monkeypatch.setattr(evidence_run, "server_command", command)
    out = tmp_path / "out"
    code = evidence_run.main(["--model", str(tmp_path), "--out", str(out), "--engines", "faster"])
    assert code == evidence_run.EXIT_ABORTED
    assert sorted(p.name for p in out.iterdir()) == ["evidence-partial.tgz", evidence_run.REPORT_FILE]
    with tarfile.open(out / evidence_run.REPORT_FILE) as archive:
        log = archive.extractfile("logs/faster-server.log")
        assert log is not None and b"no model here" in log.read()

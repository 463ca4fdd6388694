"""Startup policy: the model identity check, the talker context size, the demo's short default duration."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from server_harness import ServerProcess, free_port, parse_multipart, speech_body

from qwen3_tts_native.cli import main
from qwen3_tts_native.engine.checkpoint import preset_config
from qwen3_tts_native.engine.config import load_config
from qwen3_tts_native.engine.model.layers import KVCache
from qwen3_tts_native.engine.server.runner import KV_POOL_BUDGET_BYTES, MAX_TALKER_CONTEXT, talker_context
from qwen3_tts_native.engine.server.settings import (
    DEMO_MAX_DURATION_SECONDS,
    PROMPT_TEMPLATE_TOKENS,
    SettingsError,
    load_settings,
)

pytestmark = pytest.mark.integration

ALLOW_ENV = "QWEN3_TTS_ALLOW_UNVERIFIED_MODEL"


@pytest.fixture
def tampered_model(tiny_model: Path, tmp_path: Path) -> Path:
    """A copy of the tiny snapshot with one file its manifest does not list."""
    copy = Path(shutil.copytree(tiny_model, tmp_path / "tampered"))
    (copy / "notes-from-someone.txt").write_text("not part of the model\n")
    return copy


# --- settings -----------------------------------------------------------------------------------------


def test_demo_defaults_to_short_requests_unless_configured() -> None:
    assert load_settings({}).max_duration_seconds == DEMO_MAX_DURATION_SECONDS
    assert load_settings({}, max_duration_seconds=10.0).max_duration_seconds == 10.0
    assert load_settings({"QWEN3_TTS_MAX_DURATION_SECONDS": "7"}).max_duration_seconds == 7.0
    assert load_settings({}, model=Path("/m")).max_duration_seconds == 120.0
    assert load_settings({"QWEN3_TTS_MODEL": "/m"}).max_duration_seconds == 120.0


def test_allow_unverified_and_threads_settings_parse() -> None:
    assert load_settings({}).allow_unverified_model is False
    assert load_settings({ALLOW_ENV: "1"}).allow_unverified_model is True
    assert load_settings({ALLOW_ENV: "false"}).allow_unverified_model is False
    with pytest.raises(SettingsError, match=ALLOW_ENV):
        load_settings({ALLOW_ENV: "maybe"})
    assert load_settings({"QWEN3_TTS_THREADS": "3"}).threads == 3
    with pytest.raises(SettingsError, match="QWEN3_TTS_THREADS"):
        load_settings({}, threads=-1)


def test_context_covers_the_largest_allowed_request() -> None:
    real = preset_config("full").talker  # 28 layers, 8 KV heads of 128: 112 KiB per position in bfloat16
    bf16 = KVCache.position_bytes(28, 8, 128, torch.bfloat16)
    small = load_settings({}, model=Path("/m"), max_text_bytes=1000, max_voice_description_bytes=200)
    assert small.max_frames == 1500
    assert small.context_positions == 1000 + 200 + PROMPT_TEMPLATE_TOKENS + 1500 - 1
    assert talker_context(small.resolved(True), real, bf16) == small.context_positions
    short = load_settings(
        {}, model=Path("/m"), max_text_bytes=100, max_voice_description_bytes=200, max_duration_seconds=2.0
    ).resolved(True)
    assert talker_context(short, real, bf16) == 100 + 200 + PROMPT_TEMPLATE_TOKENS + 25 - 1  # a smaller pool
    defaults = load_settings({}, model=Path("/m")).resolved(True)  # 8 slots, 36 KiB of free text, 120 s
    assert defaults.context_positions > MAX_TALKER_CONTEXT
    assert talker_context(defaults, real, bf16) == MAX_TALKER_CONTEXT
    many = load_settings({}, model=Path("/m"), max_concurrent_requests=64).resolved(True)
    assert bf16 == 2 * 28 * 8 * 128 * 2
    assert talker_context(many, real, bf16) == KV_POOL_BUDGET_BYTES // (64 * bf16) == 2340
    # fast mode's e4m3 pool (codes and a float32 scale a row): 64 slots get the whole cap under the budget
    e4m3 = KVCache.position_bytes(28, 8, 128, torch.float8_e4m3fn)
    assert e4m3 == 2 * 28 * 8 * (128 + 4)
    assert talker_context(many, real, e4m3) == MAX_TALKER_CONTEXT


def test_tiny_context_is_capped(tiny_model: Path) -> None:
    settings = load_settings({}, model=tiny_model).resolved(False)
    tiny = load_config(tiny_model).talker
    layer_count, kv_heads, dim = tiny.num_hidden_layers, tiny.num_key_value_heads, tiny.head_dim
    float32 = KVCache.position_bytes(layer_count, kv_heads, dim, torch.float32)
    assert talker_context(settings, tiny, float32) == MAX_TALKER_CONTEXT


# --- model identity -----------------------------------------------------------------------------------


def test_help_documents_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--allow-unverified-model" in text and f"[{ALLOW_ENV}=1]" in text
    assert "2 for a bad setting or a model that fails its identity check" in text


def test_a_verified_model_is_logged(server: ServerProcess) -> None:
    assert "model verified: local/random-tiny-seed7@sha256:" in server.log()


def test_serve_refuses_an_unverified_model_with_exit_2(tampered_model: Path) -> None:
    command = [sys.executable, "-m", "qwen3_tts_native", "serve", "--model", str(tampered_model)]
    command += ["--port", str(free_port()), "--device", "cpu"]
    env = {key: value for key, value in os.environ.items() if key != ALLOW_ENV}
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2, done.stderr
    assert "extra file: notes-from-someone.txt" in done.stderr
    assert "--allow-unverified-model" in done.stderr and f"{ALLOW_ENV}=1" in done.stderr
    assert "engine ready" not in done.stderr and "Traceback" not in done.stderr


def test_allow_unverified_model_serves_with_a_warning(
    tampered_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    server = ServerProcess.launch(
        tampered_model, tmp_path_factory.mktemp("unverified"), env={ALLOW_ENV: "1"}, max_duration_seconds="1"
    )
    try:
        log = server.log()
        assert "UNVERIFIED model: 1 identity problem(s) ignored" in log
        assert "notes-from-someone" not in log  # a count, not the snapshot's contents
        assert httpx.get(f"{server.url}/health/ready", timeout=5).status_code == 200
    finally:
        assert server.stop() == 0


# --- context --------------------------------------------------------------------------------------------


def test_a_prompt_longer_than_the_context_is_422_without_echo(server: ServerProcess) -> None:
    assert "talker context: 4096 positions per slot (the server's cap)" in server.log()
    text = "a" * 5000  # one tiny-tokenizer token per byte: more than the 4096 positions
    request_id = str(uuid.uuid4())
    response = httpx.post(
        f"{server.url}/v1/voice-design/speech",
        json=speech_body(text=text, max_duration_seconds=1),
        headers={"x-request-id": request_id},
        timeout=120,
    )
    assert response.status_code == 422, response.text[:300]
    problem = response.json()
    assert problem["code"] == "invalid_request" and problem["request_id"] == request_id
    assert "talker positions" in problem["detail"] and "holds 4096" in problem["detail"]
    assert "aaaa" not in response.text and "calm" not in response.text


# --- the demo checkpoint ------------------------------------------------------------------------------


def _demo_stream(server: ServerProcess, **fields: Any) -> Any:
    body = {"text": "Hello.", "voice_description": "A calm voice.", "seed": 3, **fields}
    response = httpx.post(f"{server.url}/v1/voice-design/speech", json=body, timeout=120)
    assert response.status_code == 200, response.text[:300]
    return parse_multipart(response.headers["content-type"], response.content)


def test_demo_server_defaults_to_short_noise(tmp_path_factory: pytest.TempPathFactory) -> None:
    cache = tmp_path_factory.mktemp("demo-cache")
    server = ServerProcess.launch(None, tmp_path_factory.mktemp("demo"), env={"XDG_CACHE_HOME": str(cache)})
    try:
        assert "requests up to 3.2 s of audio; demo checkpoint: set --max-duration-seconds" in server.log()
        capabilities = httpx.get(f"{server.url}/v1/capabilities", timeout=5).json()
        assert capabilities["max_duration_seconds"] == DEMO_MAX_DURATION_SECONDS
        stream = _demo_stream(server)
        frames = len(stream.pcm) // (1920 * 2)
        assert 1 <= frames <= math.ceil(DEMO_MAX_DURATION_SECONDS * 12.5) == 40
        too_long = httpx.post(
            f"{server.url}/v1/voice-design/speech",
            content=json.dumps({"text": "Hi.", "voice_description": "Calm.", "max_duration_seconds": 4}),
            headers={"content-type": "application/json"},
            timeout=30,
        )
        assert too_long.status_code == 422 and too_long.json()["code"] == "invalid_max_duration"
    finally:
        assert server.stop() == 0

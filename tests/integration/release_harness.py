"""Fixtures, constants and helpers of the release integration tests.

(Kept out of ``conftest.py``, which belongs to the server tests.) The registry and podman's Docker-API
socket come from ``.ci/services.sh start``: environment variables, or ``.ci/services.env`` when they are
not exported. Without them the tests skip locally and FAIL when CI=true, so CI can never pass by
silently skipping the release tests.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from sigstore_fake import FakeSigstore

__all__ = [  # the fixtures; test modules take them with `from release_harness import *`
    "ambient_identity",
    "docker_host",
    "fake_sigstore",
    "foreign_sigstore",
    "model_pin",
    "registry_address",
    "trust_config",
]

ROOT = Path(__file__).resolve().parents[2]
SERVICES_ENV = ROOT / ".ci" / "services.env"

REPOSITORY = "acme/qwen3-tts-native"
WORKFLOW = "release.yml"
REF = "refs/tags/v1.0.0"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
WORKFLOW_URI = f"https://github.com/{REPOSITORY}/.github/workflows/{WORKFLOW}"


def unique_repository(name: str) -> str:
    """A fresh repository per test run: the loopback registry outlives runs, and tags there never move."""
    return f"acme/{name}-{secrets.token_hex(4)}"


def minimal_sbom(name: str = "qwen3-tts-native") -> dict[str, Any]:
    """A small valid CycloneDX 1.6 document (the SBOM builder is tested on its own)."""
    return {
        "bomFormat": "CycloneDX",
        "specVersion": "1.6",
        "version": 1,
        "metadata": {"component": {"type": "container", "name": name, "bom-ref": "image"}},
        "components": [{"type": "library", "name": "requests", "version": "2.32.0", "bom-ref": "requests"}],
    }


def _service_setting(name: str) -> str | None:
    if os.environ.get(name):
        return os.environ[name]
    if SERVICES_ENV.is_file():
        for line in SERVICES_ENV.read_text().splitlines():
            key, _, value = line.removeprefix("export ").partition("=")
            if key == name:
                return value
    return None


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(f"{reason}; CI=true requires the release services (.ci/services.sh start)")
    pytest.skip(f"{reason}; run `.ci/services.sh start` to enable the release integration tests")


@pytest.fixture(scope="session")
def registry_address() -> str:
    """``127.0.0.1:<port>`` of the running docker-registry."""
    address = _service_setting("QWEN3_TTS_TEST_REGISTRY")
    if not address:
        _unavailable("QWEN3_TTS_TEST_REGISTRY is not set and .ci/services.env is missing")
    assert address is not None
    try:
        ok = requests.get(f"http://{address}/v2/", timeout=5).status_code == 200
    except requests.RequestException:
        ok = False
    if not ok:
        _unavailable(f"no registry answers at http://{address}/v2/")
    return address


@pytest.fixture(scope="session")
def docker_host() -> str:
    """``unix://...`` of podman's Docker-API socket."""
    import docker
    from docker.errors import DockerException

    host = _service_setting("QWEN3_TTS_TEST_DOCKER_HOST")
    if not host:
        _unavailable("QWEN3_TTS_TEST_DOCKER_HOST is not set and .ci/services.env is missing")
    assert host is not None
    try:
        docker.DockerClient(base_url=host).ping()
    except DockerException as exc:
        _unavailable(f"no Docker-API engine answers at {host}: {exc}")
    return host


@pytest.fixture(scope="session")
def fake_sigstore() -> Iterator[FakeSigstore]:
    with FakeSigstore("test-sigstore") as fake:
        yield fake


@pytest.fixture(scope="session")
def foreign_sigstore() -> Iterator[FakeSigstore]:
    """A second, unrelated private Sigstore: its signatures must not verify under the first one's root."""
    with FakeSigstore("foreign-sigstore") as fake:
        yield fake


@pytest.fixture(scope="session")
def trust_config(fake_sigstore: FakeSigstore, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_sigstore.write_trust_config(tmp_path_factory.mktemp("trust") / "trust-config.json")


@pytest.fixture
def ambient_identity(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Point sigstore's ambient OIDC detection (GitHub Actions variables) at a fake issuer."""

    def use(fake: FakeSigstore, **overrides: Any) -> None:
        claims = FakeSigstore.github_claims(REPOSITORY, WORKFLOW, REF, COMMIT)
        claims.update(overrides)
        for key, value in fake.ambient_env(claims).items():
            monkeypatch.setenv(key, value)

    return use


@pytest.fixture(scope="session")
def model_pin() -> Path:
    """The shipped pin of the real model: what the gate compares model attestations with by default."""
    pins = sorted((ROOT / "release" / "pins").glob("*.json"))
    assert pins, "release/pins/*.json is missing"
    return pins[0]

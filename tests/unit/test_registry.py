"""The registry client against a small in-process stub: references, token auth, and refusing altered bytes."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from qwen3_tts_native.release.oci import OCI_INDEX
from qwen3_tts_native.release.registry import (
    DOCKER_HUB,
    ImageReference,
    RegistryClient,
    RegistryError,
    is_loopback,
    referrers_tag,
)

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("text", "registry", "repository", "tag", "digest"),
    [
        ("127.0.0.1:5000/acme/tts:v1", "127.0.0.1:5000", "acme/tts", "v1", None),
        (f"ghcr.io/acme/tts@{DIGEST}", "ghcr.io", "acme/tts", None, DIGEST),
        (f"localhost/tts:rc@{DIGEST}", "localhost", "tts", "rc", DIGEST),
        ("ubuntu", DOCKER_HUB, "library/ubuntu", None, None),
        ("acme/tts:1.0", DOCKER_HUB, "acme/tts", "1.0", None),
    ],
)
def test_image_reference_parsing(text: str, registry: str, repository: str, tag: str, digest: str) -> None:
    ref = ImageReference.parse(text)
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == (registry, repository, tag, digest)


@pytest.mark.parametrize("bad", ["ghcr.io/Acme/tts", "ghcr.io/acme/tts@sha256:12", "ghcr.io/acme/tts:-bad"])
def test_image_reference_rejects_malformed(bad: str) -> None:
    with pytest.raises(RegistryError):
        ImageReference.parse(bad)


def test_loopback_and_referrers_tag() -> None:
    assert is_loopback("127.0.0.1:5000") and is_loopback("localhost:1") and is_loopback("[::1]:5000")
    assert not is_loopback("ghcr.io") and not is_loopback("10.0.0.1:5000")
    assert referrers_tag(DIGEST) == "sha256-" + "ab" * 32


class _Stub:
    """A registry needing a bearer token, serving one index whose bytes can be swapped."""

    def __init__(self) -> None:
        self.index = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}).encode()
        self.served = self.index
        self.token_requests: list[str] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                if self.path.startswith("/token"):
                    stub.token_requests.append(self.path)
                    self._send(200, json.dumps({"token": "t0k"}).encode(), "application/json")
                elif self.headers.get("Authorization") != "Bearer t0k":
                    self.send_response(401)
                    realm = f"http://127.0.0.1:{stub.port}/token"
                    self.send_header("WWW-Authenticate", f'Bearer realm="{realm}",service="stub"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                else:
                    self._send(200, stub.served, OCI_INDEX)

            def _send(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.index).hexdigest()


@pytest.fixture
def stub() -> Iterator[_Stub]:
    server = _Stub()
    yield server
    server.server.shutdown()
    server.server.server_close()


def test_bearer_challenge_is_answered_with_a_token(stub: _Stub) -> None:
    client = RegistryClient(f"127.0.0.1:{stub.port}", credentials=None)
    manifest = client.get_manifest("acme/tts", stub.digest)
    assert manifest.data == stub.index and manifest.media_type == OCI_INDEX
    assert len(stub.token_requests) == 1
    assert "scope=repository%3Aacme%2Ftts%3Apull" in stub.token_requests[0]
    client.get_manifest("acme/tts", "v1")
    assert len(stub.token_requests) == 1  # the token is reused for the same scope


def test_bytes_not_matching_the_requested_digest_are_refused(stub: _Stub) -> None:
    stub.served = stub.index.replace(b"[]", b"[ ]")
    client = RegistryClient(f"127.0.0.1:{stub.port}", credentials=None)
    with pytest.raises(RegistryError, match="altered the content"):
        client.get_manifest("acme/tts", stub.digest)


def test_unreachable_registry_says_what_to_check() -> None:
    client = RegistryClient("127.0.0.1:9", credentials=None, timeout=2)
    with pytest.raises(RegistryError, match=r"is the registry 127\.0\.0\.1:9 running"):
        client.head_manifest("acme/tts", "v1")

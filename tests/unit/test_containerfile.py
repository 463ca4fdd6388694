"""Static checks of the Containerfile and .dockerignore, and the loopback-only healthcheck."""

from __future__ import annotations

import http.server
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from qwen3_tts_native.release import healthcheck

ROOT = Path(__file__).resolve().parents[2]


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = (ROOT / "Containerfile").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    result = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result


def stages() -> list[list[tuple[str, str]]]:
    found: list[list[tuple[str, str]]] = [[]]
    for instruction in instructions():
        if instruction[0] == "FROM":
            found.append([])
        found[-1].append(instruction)
    return found


def test_every_base_image_is_pinned_by_digest() -> None:
    global_args = dict(arg.split("=", 1) for kind, arg in stages()[0] if kind == "ARG" and "=" in arg)
    names: set[str] = set()
    for stage in stages()[1:]:
        image, *alias = stage[0][1].split(" AS ")
        names.update(a.strip() for a in alias)
        if image == "scratch" or image in names:
            continue
        variable = re.fullmatch(r"\$\{(\w+)\}", image)
        assert variable, f"FROM {image}: use a global ARG holding an image pinned by digest"
        reference = global_args[variable.group(1)]
        pattern = r"nvidia/cuda:13\.0\.\d+-(devel|runtime)-ubuntu24\.04@sha256:[0-9a-f]{64}"
        assert re.fullmatch(pattern, reference), reference


def test_final_stage_runs_non_root_with_healthcheck_labels_and_signal() -> None:
    final = dict(stages()[-1])
    assert stages()[-1][0][1] == "${CUDA_RUNTIME_IMAGE} AS runtime"
    assert final["USER"] == "10001:10001"
    assert final["STOPSIGNAL"] == "SIGTERM"
    assert final["EXPOSE"] == "8080"
    assert json.loads(final["ENTRYPOINT"]) == ["/opt/venv/bin/qwen3-tts", "serve"]
    assert re.search(
        r'CMD \["/opt/venv/bin/python", "-m", "qwen3_tts_native.release.healthcheck"\]$', final["HEALTHCHECK"]
    )
    labels = dict(re.findall(r'([\w.-]+)="([^"]*)"', final["LABEL"]))
    assert labels["org.opencontainers.image.source"] == "${SOURCE_URL}"
    assert labels["org.opencontainers.image.revision"] == "${VCS_REF}"
    assert labels["org.opencontainers.image.version"] == "${VERSION}"
    assert labels["io.qwen3-tts.model.manifest.sha256"] == "${MODEL_MANIFEST_SHA256}"
    declared = {arg.split("=")[0] for kind, arg in stages()[-1] if kind == "ARG"}
    for value in labels.values():
        assert set(re.findall(r"\$\{(\w+)\}", value)) <= declared


def test_useradd_and_writable_paths_fit_a_read_only_root() -> None:
    final = stages()[-1]
    run = " ".join(args for kind, args in final if kind == "RUN")
    assert "--uid 10001 --gid 10001" in run and "--shell /usr/sbin/nologin" in run
    env = " ".join(args for kind, args in final if kind == "ENV")
    for variable in ("HOME", "XDG_CACHE_HOME", "TORCH_HOME", "HF_HOME", "TRITON_CACHE_DIR"):
        assert re.search(rf"\b{variable}=/tmp(/|\s|$)", env), variable
    assert "HF_HUB_OFFLINE=1" in env
    assert "QWEN3_TTS_MODEL=/opt/qwen3-tts/model" in env


def test_builder_prebuilds_the_kernels_and_handles_both_architectures() -> None:
    builder = next(stage for stage in stages() if stage[0][1].endswith(" AS builder"))
    run = " ".join(args for kind, args in builder if kind == "RUN")
    assert "python -m qwen3_tts_native.engine.kernels build" in run
    assert re.search(r'case "\$\{TARGETARCH\}" in\s+amd64\|arm64\)', run)
    assert ("ARG", "TARGETARCH") in builder


def test_model_comes_only_from_the_named_context_and_is_verified() -> None:
    assert ("FROM", "scratch AS model") in instructions()
    verified = next(stage for stage in stages() if stage[0][1].endswith(" AS model-verified"))
    assert ("COPY", "--from=model . /opt/qwen3-tts/model/") in verified
    assert "qwen3-tts model verify /opt/qwen3-tts/model" in " ".join(args for _, args in verified)
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert next(line for line in ignore if line and not line.startswith("#")) == "*"


class _Handler(http.server.BaseHTTPRequestHandler):
    answer: tuple[int, dict[str, object]] = (200, {"status": "ready", "engine_loaded": True})

    def do_GET(self) -> None:
        status, body = self.answer
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[http.server.HTTPServer]:
    httpd = http.server.HTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def test_healthcheck_ready_not_ready_and_refused(server: http.server.HTTPServer) -> None:
    url = f"http://127.0.0.1:{server.server_address[1]}/health/ready"
    _Handler.answer = (200, {"status": "ready", "engine_loaded": True})
    assert healthcheck.main(["--url", url]) == 0
    _Handler.answer = (503, {"status": "not_ready", "engine_loaded": False})
    assert healthcheck.main(["--url", url]) == 1
    _Handler.answer = (200, {"status": "ready", "engine_loaded": False})
    assert healthcheck.main(["--url", url]) == 1
    for unsafe in (
        "https://127.0.0.1/health/ready",
        "http://user@127.0.0.1/",
        "http://127.0.0.1/#x",
        "http://192.0.2.1/health/ready",
    ):
        assert healthcheck.main(["--url", unsafe]) == 2, unsafe


class _SpeechHandler(_Handler):
    """Just enough of the server for the acceptance client: readiness, multipart PCM, WAV."""

    def do_POST(self) -> None:
        import io
        import wave

        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        pcm = b"\x01\x00" * 1920
        if request.get("stream") is False:
            buffer = io.BytesIO()
            with wave.open(buffer, "wb") as writer:
                writer.setnchannels(1)
                writer.setsampwidth(2)
                writer.setframerate(24000)
                writer.writeframes(pcm * 2)
            self._send("audio/wav", buffer.getvalue())
            return
        boundary = "qwen3tts-" + "0" * 32
        parts: list[tuple[str, bytes, dict[str, str]]] = [
            ("application/json", json.dumps({"type": "start"}).encode(), {})
        ]
        for sequence in range(2):
            final = str(sequence == 1).lower()
            headers = {"X-Sequence": str(sequence), "X-Sample-Count": "1920", "X-Final": final}
            parts.append(("audio/pcm;rate=24000;channels=1;format=s16le", pcm, headers))
        parts.append(("application/json", json.dumps({"type": "end", "finish_reason": "stop"}).encode(), {}))
        body = b""
        for content_type, payload, extra in parts:
            head = f"--{boundary}\r\nContent-Type: {content_type}\r\nContent-Length: {len(payload)}\r\n"
            head += "".join(f"{name}: {value}\r\n" for name, value in extra.items())
            body += head.encode() + b"\r\n" + payload + b"\r\n"
        self._send(f"multipart/mixed; boundary={boundary}", body + f"--{boundary}--\r\n".encode())

    def _send(self, content_type: str, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_acceptance_client_against_a_conforming_server(capsys: pytest.CaptureFixture[str]) -> None:
    from qwen3_tts_native.release import acceptance

    httpd = http.server.HTTPServer(("127.0.0.1", 0), _SpeechHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    _Handler.answer = (200, {"status": "ready", "engine_loaded": True})
    try:
        base = f"http://127.0.0.1:{httpd.server_address[1]}"
        assert acceptance.main(["--base-url", base, "--ready-within", "5"]) == 0
        out = capsys.readouterr().out
        assert "2 audio parts, clean end" in out and "3840 samples" in out
        _Handler.answer = (503, {"status": "not_ready", "engine_loaded": False})
        assert acceptance.main(["--base-url", base, "--ready-within", "0.5"]) == 1
        assert "not ready within" in capsys.readouterr().err
    finally:
        httpd.shutdown()
        httpd.server_close()

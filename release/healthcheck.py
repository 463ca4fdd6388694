"""Container HEALTHCHECK: is the server on loopback ready? ``python -m qwen3_tts_native.release.healthcheck``.

Talks only to loopback: the URL must be ``http://`` with a host that resolves exclusively to loopback
addresses, and no userinfo, fragment or control characters. Healthy means HTTP 200 with a JSON body
whose ``status`` is ``ready`` and ``engine_loaded`` is true. It imports nothing heavy and never touches
CUDA. Exit 0 healthy, 1 unhealthy or unreachable, 2 bad URL.
"""

from __future__ import annotations

import argparse
import http.client
import ipaddress
import json
import os
import socket
import sys
from collections.abc import Sequence
from urllib.parse import urlsplit

TIMEOUT_S = 2.0
MAX_BODY_BYTES = 64 * 1024


class UnsafeUrl(ValueError):
    """The URL is not a plain http:// URL on loopback."""


def default_url() -> str:
    return f"http://127.0.0.1:{os.environ.get('QWEN3_TTS_PORT') or '8080'}/health/ready"


def check_url(url: str) -> tuple[str, int, str]:
    """(host, port, path) of a loopback-only http URL; UnsafeUrl otherwise."""
    if any(ch in url for ch in "@#\r\n\t ") or not url.isprintable():
        raise UnsafeUrl(f"{url!r}: no userinfo, fragment, whitespace or control characters allowed")
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise UnsafeUrl(f"{url!r}: only http://HOST[:PORT]/PATH on loopback")
    port = parts.port or 80
    try:
        infos = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
        addresses = {str(info[4][0]) for info in infos}
    except socket.gaierror as error:
        raise UnsafeUrl(f"{parts.hostname!r} does not resolve: {error}") from error
    if not addresses or not all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses):
        raise UnsafeUrl(f"{parts.hostname!r} resolves to {sorted(addresses)}, not only loopback")
    return parts.hostname, port, (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def probe(host: str, port: int, path: str) -> str | None:
    """None when ready, else why not."""
    connection = http.client.HTTPConnection(host, port, timeout=TIMEOUT_S)
    try:
        connection.request("GET", path, headers={"Accept": "application/json"})
        response = connection.getresponse()
        body = response.read(MAX_BODY_BYTES + 1)
    except (OSError, http.client.HTTPException) as error:
        return f"no answer from {host}:{port}: {error}"
    finally:
        connection.close()
    if response.status != 200:
        return f"HTTP {response.status}"
    if len(body) > MAX_BODY_BYTES:
        return f"body over {MAX_BODY_BYTES} bytes"
    try:
        document = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return "body is not JSON"
    ready = isinstance(document, dict) and document.get("status") == "ready"
    if not ready or document.get("engine_loaded") is not True:
        return f"not ready: {document!r}"[:200]
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m qwen3_tts_native.release.healthcheck",
        description="Exit 0 when the server on loopback reports ready, 1 when not, 2 for a non-loopback URL.",
    )
    parser.add_argument("--url", default=default_url(), help="readiness URL (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        host, port, path = check_url(args.url)
    except UnsafeUrl as error:
        print(f"healthcheck: {error}", file=sys.stderr)
        return 2
    reason = probe(host, port, path)
    if reason is not None:
        print(f"healthcheck: {reason}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

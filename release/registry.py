"""A thin OCI distribution client that owns the exact bytes it sends and receives.

Digests are computed over bytes, so manifests are pushed as bytes with an explicit Content-Type and
everything fetched by digest is re-hashed before it is returned. General-purpose clients (oras-py,
the docker SDK) re-serialise JSON or hide the bytes, which is why this module exists.

Transport rules: HTTPS everywhere except loopback registries (127.0.0.1, ::1, localhost), which are
spoken to over plain HTTP so that tests and CI can use a local ``docker-registry``.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import requests

from .oci import (
    ALL_MANIFEST_TYPES,
    OCI_INDEX,
    Descriptor,
    ImageLayout,
    OciError,
    check_digest,
    image_index,
    index_manifests,
    parse_json_document,
    sha256_digest,
)

MANIFEST_ACCEPT = ", ".join(sorted(ALL_MANIFEST_TYPES))
DOCKER_HUB = "docker.io"
_DOCKER_HUB_API = "registry-1.docker.io"
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
_REPO_RE = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")


class RegistryError(RuntimeError):
    """A registry request failed; the message says what was asked and what to do."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ImageReference:
    """``registry/repository[:tag][@sha256:...]``, split into its parts."""

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @classmethod
    def parse(cls, text: str) -> ImageReference:
        rest, _, digest_part = text.partition("@")
        digest = digest_part or None
        first, _, remainder = rest.partition("/")
        if remainder and ("." in first or ":" in first or first == "localhost"):
            registry, path = first, remainder
        else:
            registry, path = DOCKER_HUB, rest
        tag = None
        last_slash = path.rfind("/")
        if ":" in path[last_slash + 1 :]:
            path, tag = path.rsplit(":", 1)
        if registry == DOCKER_HUB and "/" not in path:
            path = f"library/{path}"
        if not _REPO_RE.match(path):
            raise RegistryError(f"invalid repository name {path!r} in image reference {text!r}")
        if tag is not None and not _TAG_RE.match(tag):
            raise RegistryError(f"invalid tag {tag!r} in image reference {text!r}")
        if digest is not None:
            try:
                check_digest(digest)
            except OciError as exc:
                raise RegistryError(f"image reference {text!r}: {exc}") from exc
        return cls(registry, path, tag, digest)

    @property
    def name(self) -> str:
        """``registry/repository`` without tag or digest."""
        return f"{self.registry}/{self.repository}"

    @property
    def reference(self) -> str:
        """What goes after ``/manifests/``: the digest when pinned, else the tag (default ``latest``)."""
        return self.digest or self.tag or "latest"

    def with_digest(self, digest: str) -> ImageReference:
        return ImageReference(self.registry, self.repository, None, check_digest(digest))

    def with_tag(self, tag: str) -> ImageReference:
        return ImageReference(self.registry, self.repository, tag, None)

    def __str__(self) -> str:
        out = self.name
        if self.tag:
            out += f":{self.tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out


@dataclass(frozen=True)
class Manifest:
    """A manifest as served: the exact bytes, their media type and their digest."""

    data: bytes
    media_type: str
    digest: str

    @property
    def descriptor(self) -> Descriptor:
        return Descriptor(self.media_type, self.digest, len(self.data))

    def json(self) -> dict[str, Any]:
        return parse_json_document(self.data, f"manifest {self.digest}")


def referrers_tag(digest: str) -> str:
    """The OCI 1.1 referrers tag schema: ``sha256-<hex>`` names the fallback referrers index."""
    return check_digest(digest).replace(":", "-")


def is_loopback(registry: str) -> bool:
    if registry.startswith("["):
        host = registry[1 : registry.find("]")]
    else:
        host = registry.rsplit(":", 1)[0] if registry.count(":") == 1 else registry
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def docker_config_credentials(registry: str) -> tuple[str, str] | None:
    """Basic credentials for ``registry`` from ``$DOCKER_CONFIG/config.json`` (``docker login``).

    Credential helpers (``credsStore``) are not consulted: CI logs in with ``docker login`` which writes
    ``auths``; elsewhere, pull anonymously.
    """
    config_dir = Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker")
    try:
        config = json.loads((config_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    auths = config.get("auths") or {}
    keys = [registry, f"https://{registry}"]
    if registry == DOCKER_HUB:
        keys.append("https://index.docker.io/v1/")
    for key in keys:
        encoded = (auths.get(key) or {}).get("auth")
        if encoded:
            user, _, password = base64.b64decode(encoded).decode().partition(":")
            return user, password
    return None


def _parse_challenge(header: str) -> dict[str, str]:
    scheme, _, params = header.partition(" ")
    out = {k.lower(): v for k, v in re.findall(r'(\w+)="([^"]*)"', params)}
    out["scheme"] = scheme.lower()
    return out


class RegistryClient:
    """Speaks the OCI distribution API to one registry."""

    def __init__(
        self,
        registry: str,
        *,
        credentials: tuple[str, str] | None = None,
        timeout: float = 60.0,
        session: requests.Session | None = None,
    ) -> None:
        self.registry = registry
        host = _DOCKER_HUB_API if registry == DOCKER_HUB else registry
        scheme = "http" if is_loopback(registry) else "https"
        self._base = f"{scheme}://{host}"
        self._credentials = credentials if credentials is not None else docker_config_credentials(registry)
        self._timeout = timeout
        self._session = session or requests.Session()
        self._session.trust_env = not is_loopback(registry)
        self._tokens: dict[str, str] = {}

    # -- transport ---------------------------------------------------------------------------------

    def _token(self, challenge: dict[str, str], scope: str) -> str:
        cached = self._tokens.get(scope)
        if cached:
            return cached
        params = {"scope": challenge.get("scope") or scope}
        if "service" in challenge:
            params["service"] = challenge["service"]
        resp = self._session.get(
            challenge["realm"], params=params, auth=self._credentials, timeout=self._timeout
        )
        if resp.status_code != 200:
            raise RegistryError(
                f"token request to {challenge['realm']} for {scope} failed with HTTP {resp.status_code}: "
                "log in with `docker login` (credentials are read from ~/.docker/config.json)",
                resp.status_code,
            )
        body = resp.json()
        token = str(body.get("token") or body.get("access_token") or "")
        if not token:
            raise RegistryError(f"token endpoint {challenge['realm']} returned no token")
        self._tokens[scope] = token
        return token

    def _request(
        self, method: str, url: str, repository: str, *, push: bool = False, **kwargs: Any
    ) -> requests.Response:
        scope = f"repository:{repository}:{'pull,push' if push else 'pull'}"
        headers = dict(kwargs.pop("headers", {}) or {})
        if scope in self._tokens:
            headers["Authorization"] = f"Bearer {self._tokens[scope]}"
        full = url if url.startswith(("http://", "https://")) else self._base + url
        try:
            resp = self._session.request(method, full, headers=headers, timeout=self._timeout, **kwargs)
            if resp.status_code == 401:
                challenge = _parse_challenge(resp.headers.get("WWW-Authenticate", ""))
                if challenge["scheme"] == "bearer" and "realm" in challenge:
                    headers["Authorization"] = f"Bearer {self._token(challenge, scope)}"
                    resp = self._session.request(
                        method, full, headers=headers, timeout=self._timeout, **kwargs
                    )
                elif challenge["scheme"] == "basic" and self._credentials:
                    resp = self._session.request(
                        method, full, headers=headers, auth=self._credentials, timeout=self._timeout, **kwargs
                    )
        except requests.RequestException as exc:
            raise RegistryError(
                f"{method} {full} failed: {exc} (is the registry {self.registry} running and reachable?)"
            ) from exc
        if resp.status_code == 401:
            raise RegistryError(
                f"{method} {full}: unauthorized; log in with `docker login {self.registry}`", 401
            )
        return resp

    @staticmethod
    def _fail(resp: requests.Response, what: str) -> RegistryError:
        return RegistryError(f"{what}: HTTP {resp.status_code} {resp.text[:300]}", resp.status_code)

    # -- manifests ---------------------------------------------------------------------------------

    def head_manifest(self, repository: str, reference: str) -> Descriptor | None:
        """The descriptor the registry reports for ``reference``, or None when it does not exist."""
        resp = self._request(
            "HEAD",
            f"/v2/{repository}/manifests/{reference}",
            repository,
            headers={"Accept": MANIFEST_ACCEPT},
        )
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            raise self._fail(resp, f"HEAD manifest {repository}:{reference}")
        digest = resp.headers.get("Docker-Content-Digest")
        if not digest:
            return self.get_manifest(repository, reference).descriptor
        media_type = resp.headers.get("Content-Type", "").split(";")[0].strip()
        return Descriptor(media_type, check_digest(digest), int(resp.headers.get("Content-Length", "0")))

    def get_manifest(self, repository: str, reference: str) -> Manifest:
        """Fetch a manifest and hash the bytes; a digest reference must match them exactly."""
        resp = self._request(
            "GET",
            f"/v2/{repository}/manifests/{reference}",
            repository,
            headers={"Accept": MANIFEST_ACCEPT},
        )
        if resp.status_code != 200:
            raise self._fail(resp, f"GET manifest {repository}:{reference}")
        data = resp.content
        digest = sha256_digest(data)
        if reference.startswith("sha256:") and digest != reference:
            raise RegistryError(
                f"registry served manifest bytes hashing to {digest} for {repository}@{reference}: "
                "the registry or a proxy altered the content; do not trust this image"
            )
        header = resp.headers.get("Docker-Content-Digest")
        if header and header != digest:
            raise RegistryError(
                f"registry says {repository}:{reference} is {header} but its bytes hash to {digest}"
            )
        media_type = resp.headers.get("Content-Type", "").split(";")[0].strip()
        if media_type not in ALL_MANIFEST_TYPES:
            declared = parse_json_document(data, f"manifest {repository}:{reference}").get("mediaType")
            media_type = str(declared or media_type)
        return Manifest(data, media_type, digest)

    def put_manifest(self, repository: str, reference: str, data: bytes, media_type: str) -> Descriptor:
        """PUT manifest bytes under a tag or digest; returns the descriptor of exactly those bytes."""
        digest = sha256_digest(data)
        resp = self._request(
            "PUT",
            f"/v2/{repository}/manifests/{reference}",
            repository,
            push=True,
            data=data,
            headers={"Content-Type": media_type},
        )
        if resp.status_code not in (200, 201):
            raise self._fail(resp, f"PUT manifest {repository}:{reference}")
        header = resp.headers.get("Docker-Content-Digest")
        if header and header != digest:
            raise RegistryError(f"registry stored {repository}:{reference} as {header}, we sent {digest}")
        return Descriptor(media_type, digest, len(data))

    # -- blobs -------------------------------------------------------------------------------------

    def blob_exists(self, repository: str, digest: str) -> bool:
        resp = self._request("HEAD", f"/v2/{repository}/blobs/{check_digest(digest)}", repository)
        if resp.status_code == 404:
            return False
        if resp.status_code != 200:
            raise self._fail(resp, f"HEAD blob {repository}@{digest}")
        return True

    def upload_blob(self, repository: str, data: bytes) -> str:
        """Monolithic upload (POST then PUT ?digest=); skipped when the blob already exists."""
        digest = sha256_digest(data)
        if self.blob_exists(repository, digest):
            return digest
        resp = self._request("POST", f"/v2/{repository}/blobs/uploads/", repository, push=True)
        if resp.status_code != 202 or "Location" not in resp.headers:
            raise self._fail(resp, f"start blob upload to {repository}")
        location = urljoin(self._base + "/", resp.headers["Location"])
        location += ("&" if "?" in location else "?") + f"digest={digest}"
        resp = self._request(
            "PUT",
            location,
            repository,
            push=True,
            data=data,
            headers={"Content-Type": "application/octet-stream"},
        )
        if resp.status_code != 201:
            raise self._fail(resp, f"finish blob upload {digest} to {repository}")
        return digest

    def get_blob(self, repository: str, digest: str) -> bytes:
        """Fetch a blob and refuse it unless its bytes hash to ``digest``."""
        resp = self._request("GET", f"/v2/{repository}/blobs/{check_digest(digest)}", repository)
        if resp.status_code != 200:
            raise self._fail(resp, f"GET blob {repository}@{digest}")
        actual = sha256_digest(resp.content)
        if actual != digest:
            raise RegistryError(f"blob {repository}@{digest} has bytes hashing to {actual}")
        return resp.content

    # -- tags and referrers ------------------------------------------------------------------------

    def list_tags(self, repository: str) -> list[str]:
        resp = self._request("GET", f"/v2/{repository}/tags/list", repository)
        if resp.status_code == 404:
            return []
        if resp.status_code != 200:
            raise self._fail(resp, f"list tags of {repository}")
        return sorted(resp.json().get("tags") or [])

    def _referrers_api(self, repository: str, digest: str) -> list[Descriptor] | None:
        resp = self._request("GET", f"/v2/{repository}/referrers/{digest}", repository)
        content_type = resp.headers.get("Content-Type", "").split(";")[0].strip()
        if resp.status_code != 200 or content_type != OCI_INDEX:
            return None
        return index_manifests(parse_json_document(resp.content, f"referrers of {digest}"))

    def _referrers_tag_index(self, repository: str, digest: str) -> list[Descriptor]:
        tag = referrers_tag(digest)
        if self.head_manifest(repository, tag) is None:
            return []
        return index_manifests(self.get_manifest(repository, tag).json())

    def referrers(self, repository: str, digest: str) -> list[Descriptor]:
        """Referrers of ``digest``: the referrers API and the ``sha256-<hex>`` tag index, merged.

        Both are read because a registry may have gained the API after artifacts were attached through
        the tag schema. Callers must still verify every referrer: these lists are unauthenticated hints.
        """
        found: dict[str, Descriptor] = {}
        for desc in (self._referrers_api(repository, digest) or []) + self._referrers_tag_index(
            repository, digest
        ):
            found.setdefault(desc.digest, desc)
        return list(found.values())

    def push_referrer(self, repository: str, manifest: bytes, subject_digest: str) -> Descriptor:
        """Push an artifact manifest with a ``subject`` and make it discoverable.

        A registry with the referrers API acknowledges the subject with an ``OCI-Subject`` header;
        otherwise the ``sha256-<hex>`` referrers tag index is updated (read, append, write).
        """
        doc = parse_json_document(manifest, "referrer manifest")
        digest = sha256_digest(manifest)
        resp = self._request(
            "PUT",
            f"/v2/{repository}/manifests/{digest}",
            repository,
            push=True,
            data=manifest,
            headers={"Content-Type": doc["mediaType"]},
        )
        if resp.status_code not in (200, 201):
            raise self._fail(resp, f"PUT referrer manifest to {repository}")
        desc = Descriptor(
            doc["mediaType"],
            digest,
            len(manifest),
            annotations=dict(doc.get("annotations") or {}),
            artifact_type=doc.get("artifactType"),
        )
        if resp.headers.get("OCI-Subject") != subject_digest:
            self._add_to_referrers_tag(repository, subject_digest, [desc])
        return desc

    def _add_to_referrers_tag(self, repository: str, subject_digest: str, add: Iterable[Descriptor]) -> None:
        existing = self._referrers_tag_index(repository, subject_digest)
        known = {d.digest for d in existing}
        merged = existing + [d for d in add if d.digest not in known]
        self.put_manifest(repository, referrers_tag(subject_digest), image_index(merged), OCI_INDEX)

    def push_layout(self, repository: str, layout: ImageLayout, tag: str) -> Descriptor:
        """Push every blob and manifest of a pure-Python ``ImageLayout``, then its index under ``tag``."""
        for data in layout.blobs.values():
            self.upload_blob(repository, data)
        for digest, (media_type, data) in layout.manifests.items():
            self.put_manifest(repository, digest, data, media_type)
        return self.put_manifest(repository, tag, layout.index, layout.index_media_type)

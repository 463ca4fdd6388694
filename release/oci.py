"""OCI data model: media types, descriptors, digests, and a deterministic pure-Python image writer.

Everything that is signed is signed over exact bytes, so this module always produces compact JSON with
sorted keys and never re-serialises something it did not build. The writer exists for tests and for
tiny images (FROM-scratch, COPY-only); real images come from ``release.build``.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_EMPTY = "application/vnd.oci.empty.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
IN_TOTO = "application/vnd.in-toto+json"

INDEX_TYPES = frozenset({OCI_INDEX, DOCKER_LIST})
MANIFEST_TYPES = frozenset({OCI_MANIFEST, DOCKER_MANIFEST})
ALL_MANIFEST_TYPES = INDEX_TYPES | MANIFEST_TYPES

EMPTY_JSON = b"{}"

_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


class OciError(ValueError):
    """Raised for malformed OCI documents or digests."""


def sha256_digest(data: bytes) -> str:
    """Return the ``sha256:<hex>`` digest of ``data``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def check_digest(digest: str) -> str:
    """Return ``digest`` unchanged if it is a well-formed sha256 digest, else raise."""
    if not _DIGEST_RE.match(digest):
        raise OciError(f"not a sha256 digest: {digest!r} (expected sha256:<64 lowercase hex>)")
    return digest


def canonical_json(obj: Any) -> bytes:
    """Compact, key-sorted UTF-8 JSON: the one serialisation used for everything we build."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True)
class Platform:
    """An OCI platform (``os/architecture[/variant]``)."""

    os: str
    architecture: str
    variant: str | None = None

    @classmethod
    def parse(cls, text: str) -> Platform:
        parts = text.split("/")
        if len(parts) not in (2, 3) or not all(parts):
            raise OciError(f"platform {text!r} is not os/arch[/variant], e.g. linux/arm64")
        return cls(parts[0], parts[1], parts[2] if len(parts) == 3 else None)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Platform:
        return cls(str(obj.get("os", "")), str(obj.get("architecture", "")), obj.get("variant"))

    def to_json(self) -> dict[str, str]:
        out = {"architecture": self.architecture, "os": self.os}
        if self.variant:
            out["variant"] = self.variant
        return out

    def __str__(self) -> str:
        return "/".join(p for p in (self.os, self.architecture, self.variant) if p)


UNKNOWN_PLATFORM = Platform("unknown", "unknown")


@dataclass(frozen=True)
class Descriptor:
    """An OCI content descriptor; ``to_json`` gives the exact object written into manifests."""

    media_type: str
    digest: str
    size: int
    platform: Platform | None = None
    annotations: Mapping[str, str] = field(default_factory=dict)
    artifact_type: str | None = None

    @classmethod
    def for_bytes(cls, media_type: str, data: bytes, **kwargs: Any) -> Descriptor:
        return cls(media_type, sha256_digest(data), len(data), **kwargs)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Descriptor:
        try:
            return cls(
                media_type=str(obj["mediaType"]),
                digest=check_digest(str(obj["digest"])),
                size=int(obj["size"]),
                platform=Platform.from_json(obj["platform"]) if "platform" in obj else None,
                annotations=dict(obj.get("annotations") or {}),
                artifact_type=obj.get("artifactType"),
            )
        except (KeyError, TypeError) as exc:
            raise OciError(f"malformed descriptor {obj!r}: {exc}") from exc

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mediaType": self.media_type, "digest": self.digest, "size": self.size}
        if self.platform is not None:
            out["platform"] = self.platform.to_json()
        if self.annotations:
            out["annotations"] = dict(self.annotations)
        if self.artifact_type:
            out["artifactType"] = self.artifact_type
        return out


EMPTY_DESCRIPTOR = Descriptor.for_bytes(OCI_EMPTY, EMPTY_JSON)


def parse_json_document(data: bytes, what: str) -> dict[str, Any]:
    """Parse a manifest/index/config, raising ``OciError`` with ``what`` in the message."""
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise OciError(f"{what} is not JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise OciError(f"{what} is not a JSON object")
    return obj


def index_manifests(index: Mapping[str, Any]) -> list[Descriptor]:
    """The ``manifests`` of an image index (OCI or Docker list)."""
    manifests = index.get("manifests")
    if not isinstance(manifests, list):
        raise OciError("image index has no manifests list")
    return [Descriptor.from_json(m) for m in manifests]


def is_attestation_manifest(desc: Descriptor) -> bool:
    """BuildKit stores attestations as ``unknown/unknown`` entries of the index."""
    return desc.annotations.get("vnd.docker.reference.type") == "attestation-manifest" or (
        desc.platform == UNKNOWN_PLATFORM
    )


def image_index(manifests: list[Descriptor], media_type: str = OCI_INDEX) -> bytes:
    """Serialise an image index (or Docker manifest list) over ``manifests``."""
    return canonical_json(
        {"schemaVersion": 2, "mediaType": media_type, "manifests": [d.to_json() for d in manifests]}
    )


def artifact_manifest(
    artifact_type: str,
    layers: list[Descriptor],
    subject: Descriptor,
    annotations: Mapping[str, str] | None = None,
) -> bytes:
    """An OCI 1.1 artifact manifest (empty config) that refers to ``subject``."""
    doc: dict[str, Any] = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": artifact_type,
        "config": EMPTY_DESCRIPTOR.to_json(),
        "layers": [d.to_json() for d in layers],
        "subject": Descriptor(subject.media_type, subject.digest, subject.size).to_json(),
    }
    if annotations:
        doc["annotations"] = dict(annotations)
    return canonical_json(doc)


def layer_tar(files: Mapping[str, bytes], epoch: int) -> bytes:
    """A reproducible PAX tar: sorted entries, fixed mtime, root ownership, no user or group names."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs: set[str] = set()
        for name in sorted(files):
            parts = name.strip("/").split("/")
            for depth in range(1, len(parts)):
                dirs.add("/".join(parts[:depth]))
        entries: list[tuple[str, bytes | None]] = [(d, None) for d in dirs]
        entries += [(n.strip("/"), files[n]) for n in files]
        for name, content in sorted(entries, key=lambda e: e[0]):
            info = tarfile.TarInfo(name + ("/" if content is None else ""))
            info.mtime = epoch
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if content is None:
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
            else:
                info.mode = 0o444
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


def gzip_bytes(data: bytes) -> bytes:
    """gzip with mtime 0 and no file name, so equal input gives equal output."""
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, filename="") as gz:
        gz.write(data)
    return buf.getvalue()


@dataclass
class ImageLayout:
    """A built multi-platform image: every blob and manifest by digest, plus the index bytes."""

    index: bytes
    index_media_type: str
    manifests: dict[str, tuple[str, bytes]] = field(default_factory=dict)
    blobs: dict[str, bytes] = field(default_factory=dict)

    @property
    def index_descriptor(self) -> Descriptor:
        return Descriptor.for_bytes(self.index_media_type, self.index)


def build_image(
    files: Mapping[str, bytes],
    platforms: list[Platform],
    *,
    epoch: int = 0,
    labels: Mapping[str, str] | None = None,
    extra_manifests: list[tuple[Descriptor, bytes]] | None = None,
) -> ImageLayout:
    """Build a one-layer image for each platform and an OCI index over them.

    ``extra_manifests`` lets a caller append pre-serialised entries (for example a BuildKit-style
    attestation manifest) to the index; their blobs must be added to the returned layout by the caller.
    """
    tar = layer_tar(files, epoch)
    layer = gzip_bytes(tar)
    layer_desc = Descriptor.for_bytes(OCI_LAYER_GZIP, layer)
    layout = ImageLayout(index=b"", index_media_type=OCI_INDEX)
    layout.blobs[layer_desc.digest] = layer
    entries: list[Descriptor] = []
    for platform in platforms:
        config: dict[str, Any] = {
            **platform.to_json(),
            "config": {"Labels": dict(labels or {})},
            "rootfs": {"type": "layers", "diff_ids": [sha256_digest(tar)]},
        }
        config_bytes = canonical_json(config)
        config_desc = Descriptor.for_bytes(OCI_CONFIG, config_bytes)
        layout.blobs[config_desc.digest] = config_bytes
        manifest = canonical_json(
            {
                "schemaVersion": 2,
                "mediaType": OCI_MANIFEST,
                "config": config_desc.to_json(),
                "layers": [layer_desc.to_json()],
            }
        )
        desc = Descriptor.for_bytes(OCI_MANIFEST, manifest, platform=platform)
        layout.manifests[desc.digest] = (OCI_MANIFEST, manifest)
        entries.append(desc)
    for desc, data in extra_manifests or []:
        layout.manifests[desc.digest] = (desc.media_type, data)
        entries.append(desc)
    layout.index = image_index(entries)
    return layout

"""``qwen3-tts release promote``: after the gate passes, point ``vX.Y.Z`` and then ``latest`` at a digest.

Promotion never rebuilds: it re-pushes the exact index bytes the gate approved under the new tags and
reads both tags back. A version tag is immutable: if it already names another digest, promotion stops.
``latest`` moves last, so a failure part-way never advertises an unreleased digest as latest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .gate import GatePolicy, GateResult, run_gate
from .registry import ImageReference, RegistryClient, RegistryError

VERSION_RE = re.compile(r"^v(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$")
PROMOTION_SCHEMA = "qwen3-tts-native/promotion/v1"


class PromotionError(RuntimeError):
    """Promotion stopped; the message says at which step and why. ``gate`` is set once the gate ran."""

    def __init__(self, message: str, gate: GateResult | None = None) -> None:
        super().__init__(message)
        self.gate = gate


@dataclass
class Promotion:
    image: ImageReference
    version: str
    gate: GateResult
    tags: dict[str, str]

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": PROMOTION_SCHEMA,
            "image": str(self.image),
            "digest": self.image.digest,
            "version": self.version,
            "tags": self.tags,
            "gate": self.gate.to_json(),
        }


def check_version(version: str) -> str:
    if not VERSION_RE.match(version):
        raise PromotionError(f"version {version!r} is not vMAJOR.MINOR.PATCH (e.g. v1.2.3)")
    return version


def promote(client: RegistryClient, image: ImageReference, version: str, policy: GatePolicy) -> Promotion:
    """Gate ``image``; on pass set ``version`` then ``latest`` to its digest and confirm both."""
    check_version(version)
    gate = run_gate(client, image, policy)
    if not gate.passed:
        raise PromotionError(
            f"the gate failed ({', '.join(gate.failed) or 'incomplete'}); nothing was tagged", gate
        )
    assert image.digest is not None
    try:
        manifest = client.get_manifest(image.repository, image.digest)
        existing = client.head_manifest(image.repository, version)
        if existing is not None and existing.digest != image.digest:
            raise PromotionError(
                f"{image.name}:{version} already names {existing.digest}; released versions are never moved "
                "(release a new version instead)",
                gate,
            )
        for tag in (version, "latest"):
            client.put_manifest(image.repository, tag, manifest.data, manifest.media_type)
        resolved = {tag: client.get_manifest(image.repository, tag).digest for tag in (version, "latest")}
    except RegistryError as exc:
        raise PromotionError(f"tagging {image.name} failed: {exc}", gate) from exc
    drifted = {tag: digest for tag, digest in resolved.items() if digest != image.digest}
    if drifted:
        raise PromotionError(
            "after tagging, "
            + ", ".join(f"{t} resolves to {d}" for t, d in drifted.items())
            + f" instead of {image.digest}; someone is pushing concurrently",
            gate,
        )
    return Promotion(image, version, gate, resolved)

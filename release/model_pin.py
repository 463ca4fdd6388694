"""Pinning model snapshots: write a manifest for a directory, and read the shipped pin of the real model.

The shipped pin (``release/pins/qwen3-tts-12hz-1.7b-voicedesign.json``) carries the repository, revision,
sizes and digests published for Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign. Small files are pinned by their git
blob id, the only digest the Hub lists for them; the weights by SHA-256.
"""

from __future__ import annotations

import re
from pathlib import Path

from qwen3_tts_native.engine.errors import SnapshotError
from qwen3_tts_native.engine.identity import ModelManifest, build_manifest, shipped_manifests

PINNED_REPOSITORY = "Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign"
_HF_CACHE_SNAPSHOT = re.compile(
    r"models--(?P<owner>[^/]+?)--(?P<name>[^/]+)/snapshots/(?P<rev>[0-9a-f]{40})$"
)


def shipped_pin(repository: str = PINNED_REPOSITORY) -> ModelManifest:
    """The shipped manifest of ``repository``; SnapshotError when none is shipped."""
    for manifest in shipped_manifests():
        if manifest.repository == repository:
            return manifest
    raise SnapshotError(f"no pin is shipped for {repository}; pass a manifest file instead")


def source_of(snapshot_dir: Path) -> tuple[str | None, str | None]:
    """Repository and revision implied by a Hugging Face cache path (``models--o--n/snapshots/<sha>``)."""
    match = _HF_CACHE_SNAPSHOT.search(snapshot_dir.absolute().as_posix())
    if match is None:
        return None, None
    return f"{match['owner']}/{match['name']}", match["rev"]


def pin_snapshot(
    snapshot_dir: Path,
    repository: str | None = None,
    revision: str | None = None,
    license: str | None = None,
    allow_symlinks: bool = False,
) -> ModelManifest:
    """Manifest of ``snapshot_dir``.

    Repository and revision default to what a Hugging Face cache path implies, else to
    ``local/<directory name>`` and a content id. The licence defaults to the shipped pin's when the
    repository is pinned.
    """
    cached_repository, cached_revision = source_of(snapshot_dir)
    repository = repository or cached_repository or f"local/{_slug(snapshot_dir.absolute().name)}"
    revision = revision or cached_revision
    if license is None:
        license = next((m.license for m in shipped_manifests() if m.repository == repository), None)
    return build_manifest(snapshot_dir, repository, revision, license, allow_symlinks)


def contradictions(manifest: ModelManifest, pins: list[ModelManifest] | None = None) -> list[str]:
    """Where ``manifest`` claims a pinned repository@revision but disagrees with the shipped pin."""
    pins = shipped_manifests() if pins is None else pins
    problems = []
    for pin in pins:
        if (pin.repository, pin.revision) != (manifest.repository, manifest.revision):
            continue
        for pinned in pin.files:
            entry = manifest.file(pinned.path)
            if entry is None:
                problems.append(f"missing file: {pinned.path} (pinned in {pin.repository}@{pin.revision})")
                continue
            for name in ("bytes", "sha256", "git_blob_sha1"):
                expected, actual = getattr(pinned, name), getattr(entry, name)
                if expected is not None and actual is not None and expected != actual:
                    problems.append(
                        f"pin mismatch: {pinned.path} {name} is {actual}, the shipped pin says {expected}"
                    )
    return problems


def _slug(name: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-._")
    return slug or "snapshot"

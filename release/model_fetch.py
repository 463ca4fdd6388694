"""Fetch a pinned model snapshot from the Hugging Face Hub and verify it before anyone can use it.

``huggingface_hub.snapshot_download`` brings the manifest's files at the pinned revision into the Hub
cache (with its progress bars; ``HF_HUB_OFFLINE=1`` uses the cache alone). The files are then hard-linked
(or copied, across file systems) into a staging folder beside the output as regular files, verified
against the manifest, and only then renamed into place. A snapshot that fails verification never appears
at the output path.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from qwen3_tts_native.engine.identity import MANIFEST_FILENAME, ModelManifest, verify_snapshot, write_manifest

from .model_pin import pin_snapshot


class FetchError(Exception):
    """The snapshot could not be fetched, or what was fetched is not what was pinned."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or []


@dataclass(frozen=True)
class FetchResult:
    path: Path
    manifest: ModelManifest
    pinned: bool
    """True when verified against the given pin; False for a new revision pinned on first use."""


def fetch_snapshot(manifest: ModelManifest, out_dir: Path, revision: str | None = None) -> FetchResult:
    """Download ``manifest``'s files into ``out_dir`` and verify them.

    With ``revision`` other than the manifest's, the same file list is fetched at that revision and
    pinned on first use: its manifest is written to ``out_dir/qwen3-tts-manifest.json`` for review.
    """
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise FetchError(f"{out_dir} already exists and is not empty; choose a new --out directory")
    wanted = revision or manifest.revision
    new_revision = wanted != manifest.revision
    cached = _download(manifest, wanted)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        missing = _materialize(manifest, cached, staging)
        if new_revision:
            if missing:
                raise FetchError(f"{manifest.repository}@{wanted} lacks files of the pin", missing)
            result_manifest = pin_snapshot(staging, manifest.repository, wanted, manifest.license)
            write_manifest(result_manifest, staging / MANIFEST_FILENAME)
        else:
            problems = verify_snapshot(staging, manifest)
            if problems:
                raise FetchError(f"{manifest.repository}@{wanted} does not match its pin", problems)
            result_manifest = manifest
        if out_dir.exists():
            out_dir.rmdir()
        staging.rename(out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return FetchResult(out_dir, result_manifest, pinned=not new_revision)


def _download(manifest: ModelManifest, revision: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        path = snapshot_download(
            manifest.repository,
            revision=revision,
            allow_patterns=[entry.path for entry in manifest.files],
        )
    except LocalEntryNotFoundError as error:
        raise FetchError(
            f"{manifest.repository}@{revision} is not in the Hugging Face cache and the Hub cannot be "
            "reached (offline, or HF_HUB_OFFLINE=1); fetch with network access or point HF_HUB_CACHE at "
            "a cache that holds it"
        ) from error
    except HfHubHTTPError as error:
        raise FetchError(
            f"the Hub refused {manifest.repository}@{revision}: {error}; check the revision and, for a gated "
            "repository, HF_TOKEN"
        ) from error
    return Path(path)


def _materialize(manifest: ModelManifest, cached: Path, staging: Path) -> list[str]:
    """Regular-file copies of the manifest's files (hard links where possible); returns missing ones."""
    missing = []
    for entry in manifest.files:
        source = (cached / entry.path).resolve()
        if not source.is_file():
            missing.append(f"missing file: {entry.path} (not in the downloaded snapshot)")
            continue
        target = staging / entry.path
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, target)
        except OSError:
            shutil.copyfile(source, target)
    return missing

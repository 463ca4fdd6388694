"""Evidence bundle layout, sealing and archiving.

A bundle is a directory (and the same tree as ``<name>.tar.zst``)::

    manifest.json                      the evidence manifest (schema 2.0, or 1.x for seed bundles)
    SHA256SUMS                         "<sha256>  <path>" for every other file, sorted by path
    workload/workload.jsonl            the exact corpus bytes
    runs/round-NN/<engine>/<profile>/  one directory per run:
        requests.jsonl packets.jsonl summary.json phase-events.jsonl telemetry.jsonl run-resource.json

The archive is deterministic (sorted members, zero mtimes and ids) so the same evidence gives the same
bytes; reading it back refuses links, devices, absolute paths and ``..`` so a hostile archive cannot
write outside its extraction directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

MANIFEST = "manifest.json"
SUMS = "SHA256SUMS"
WORKLOAD_PATH = "workload/workload.jsonl"
ARCHIVE_SUFFIX = ".tar.zst"
RUN_FILES = {
    "client_requests": ("requests.jsonl", "jsonl"),
    "client_packets": ("packets.jsonl", "jsonl"),
    "client_summary": ("summary.json", "json"),
    "phase_events": ("phase-events.jsonl", "jsonl"),
    "telemetry": ("telemetry.jsonl", "jsonl"),
    "run_resource": ("run-resource.json", "json"),
}
_MAX_ARCHIVE_MEMBER_BYTES = 4 * 1024**3


class BundleError(ValueError):
    """The bundle cannot be read (not a directory or archive, unsafe archive member)."""


@dataclass(frozen=True)
class RunKey:
    """One run: an engine measured under one profile in one round."""

    engine_id: str
    profile_id: str
    round: int

    @property
    def path(self) -> str:
        return f"runs/round-{self.round:02d}/{self.engine_id}/{self.profile_id}"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def bundle_files(root: Path) -> list[str]:
    """Every regular file under ``root`` as a sorted POSIX relative path (SHA256SUMS excluded)."""
    files = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            relative = path.relative_to(root).as_posix()
            if relative != SUMS:
                files.append(relative)
    return sorted(files)


def write_sums(root: Path) -> None:
    """Write SHA256SUMS covering every other file of the bundle."""
    lines = [f"{sha256_file(root / name)}  {name}\n" for name in bundle_files(root)]
    (root / SUMS).write_text("".join(lines), encoding="utf-8")


def parse_sums(text: str) -> dict[str, str]:
    """Parse SHA256SUMS lines; raises ValueError on any malformed or duplicate line."""
    entries: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest) or not name:
            raise ValueError(f"SHA256SUMS line {number} is malformed")
        if name in entries:
            raise ValueError(f"SHA256SUMS lists {name} twice")
        entries[name] = digest
    return entries


def pack(root: Path, archive: Path | None = None) -> Path:
    """Write ``<root>.tar.zst`` (deterministic) and return its path."""
    import zstandard

    target = archive or root.with_name(root.name + ARCHIVE_SUFFIX)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        names = [*bundle_files(root), SUMS] if (root / SUMS).exists() else bundle_files(root)
        directories = sorted({p for name in names for p in PurePosixPath(name).parents if str(p) != "."})
        for directory in [root.name, *(f"{root.name}/{d}" for d in directories)]:
            info = tarfile.TarInfo(directory)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            info.mtime = 0
            tar.addfile(info)
        for name in sorted(names):
            data = (root / name).read_bytes()
            info = tarfile.TarInfo(f"{root.name}/{name}")
            info.size = len(data)
            info.mode = 0o644
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    compressed = zstandard.ZstdCompressor(level=19).compress(buffer.getvalue())
    tmp = target.with_name(target.name + ".partial")
    tmp.write_bytes(compressed)
    os.replace(tmp, target)
    return target


def _safe_member(member: tarfile.TarInfo, top: str | None) -> str:
    path = PurePosixPath(member.name)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise BundleError(f"archive member {member.name!r} escapes the bundle")
    if not (member.isfile() or member.isdir()):
        raise BundleError(f"archive member {member.name!r} is not a regular file or directory")
    if top is not None and path.parts[0] != top:
        raise BundleError("archive must contain exactly one top-level directory")
    if member.size > _MAX_ARCHIVE_MEMBER_BYTES:
        raise BundleError(f"archive member {member.name!r} is too large")
    return path.parts[0]


@contextlib.contextmanager
def open_bundle(path: Path) -> Iterator[Path]:
    """Yield the bundle directory for a directory or a ``.tar.zst`` archive (extracted to a temp dir)."""
    if path.is_dir():
        yield path
        return
    if not path.is_file() or not path.name.endswith(ARCHIVE_SUFFIX):
        raise BundleError(f"{path} is neither a bundle directory nor a {ARCHIVE_SUFFIX} archive")
    import zstandard

    with tempfile.TemporaryDirectory(prefix="qwen3-tts-evidence-") as tmp:
        try:
            with (
                path.open("rb") as raw,
                zstandard.ZstdDecompressor().stream_reader(raw) as stream,
                tarfile.open(fileobj=stream, mode="r|") as tar,
            ):
                top: str | None = None
                for member in tar:
                    top = _safe_member(member, top)
                    target = Path(tmp, *PurePosixPath(member.name).parts)
                    if member.isdir():
                        target.mkdir(parents=True, exist_ok=True)
                        continue
                    target.parent.mkdir(parents=True, exist_ok=True)
                    source = tar.extractfile(member)
                    assert source is not None
                    with target.open("xb") as out:
                        shutil.copyfileobj(source, out)
        except (tarfile.TarError, zstandard.ZstdError, FileExistsError) as exc:
            raise BundleError(f"{path}: unreadable archive: {exc}") from exc
        if top is None:
            raise BundleError(f"{path}: empty archive")
        yield Path(tmp, top)

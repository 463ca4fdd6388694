"""Model identity: manifests of snapshot directories, and fail-closed verification against them.

A manifest (``schemas/model-manifest.schema.json``) names where a snapshot comes from (repository and
revision) and lists every file with its size and digest: SHA-256, or the git blob id for small files the
Hub lists only that way. It also counts tensors and parameters per component. The same code serves load
time (``verify_snapshot_for_serving``) and release time (``qwen3-tts model pin/verify``, the SBOM).

Verification is fail-closed: a missing, extra, resized or altered file, a symlink (unless allowed) and
anything that is not a regular file are each reported by path.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any

from .errors import SnapshotError

MANIFEST_FILENAME = "qwen3-tts-manifest.json"
"""A manifest inside a snapshot's root under this name describes that snapshot and is not itself listed."""

SCHEMA_VERSION = 1
COMPONENTS: tuple[str, ...] = ("talker", "code_predictor", "speech_decoder", "speech_encoder_unused")
SHIPPED_PINS = "release/pins"
"""Folder of the shipped manifests of real models, as package data of ``qwen3_tts_native``."""

_CHUNK = 8 * 1024 * 1024
_MAX_HEADER = 100 * 1024 * 1024
_DTYPE_BITS = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E4M3": 8,
    "F8_E5M2": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "I64": 64,
    "U64": 64,
    "F64": 64,
}
# (file, tensor-name prefix, component): the first matching rule wins.
_COMPONENT_RULES: tuple[tuple[str, str, str], ...] = (
    ("model.safetensors", "talker.code_predictor.", "code_predictor"),
    ("model.safetensors", "talker.", "talker"),
    ("speech_tokenizer/model.safetensors", "decoder.", "speech_decoder"),
    ("speech_tokenizer/model.safetensors", "encoder.", "speech_encoder_unused"),
)


class ManifestError(SnapshotError):
    """A manifest file is unreadable, fails its schema, or contradicts itself."""


@dataclass(frozen=True)
class SafetensorsSummary:
    """What a safetensors header says about its file."""

    header_bytes: int
    tensors: int
    parameters: int
    dtypes: tuple[str, ...]


@dataclass(frozen=True)
class FileEntry:
    """One file of a snapshot; at least one of ``sha256`` and ``git_blob_sha1`` is set."""

    path: str
    bytes: int
    sha256: str | None = None
    git_blob_sha1: str | None = None
    safetensors: SafetensorsSummary | None = None


@dataclass(frozen=True)
class ComponentCount:
    tensors: int
    parameters: int


@dataclass(frozen=True)
class ModelManifest:
    """A snapshot's identity. ``files`` are sorted by path; ``components`` has every name of COMPONENTS."""

    repository: str
    revision: str
    files: tuple[FileEntry, ...]
    components: Mapping[str, ComponentCount]
    license: str | None = None

    def file(self, path: str) -> FileEntry | None:
        return next((entry for entry in self.files if entry.path == path), None)

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "repository": self.repository,
            "revision": self.revision,
        }
        if self.license is not None:
            document["license"] = self.license
        document["files"] = [_file_to_json(entry) for entry in self.files]
        document["components"] = {
            name: {"tensors": self.components[name].tensors, "parameters": self.components[name].parameters}
            for name in COMPONENTS
        }
        return document

    def dumps(self) -> str:
        """Canonical text: two-space indent, fixed key order, trailing newline."""
        return json.dumps(self.to_json(), indent=2) + "\n"

    @classmethod
    def from_json(cls, document: Any, source: str = "manifest") -> ModelManifest:
        """Validate against the schema and the manifest's own consistency rules."""
        _validate_schema(document, source)
        files = tuple(_file_from_json(item) for item in document["files"])
        paths = [entry.path for entry in files]
        duplicates = sorted({path for path in paths if paths.count(path) > 1})
        if duplicates:
            raise ManifestError(f"{source}: files listed more than once: {', '.join(duplicates)}")
        if MANIFEST_FILENAME in paths:
            raise ManifestError(f"{source}: must not list {MANIFEST_FILENAME} itself")
        components = {
            name: ComponentCount(int(value["tensors"]), int(value["parameters"]))
            for name, value in document["components"].items()
        }
        manifest = cls(
            repository=document["repository"],
            revision=document["revision"],
            files=tuple(sorted(files, key=lambda entry: entry.path)),
            components=components,
            license=document.get("license"),
        )
        _check_component_totals(manifest, source)
        return manifest


def load_manifest(path: str | os.PathLike[str]) -> ModelManifest:
    """Read and validate a manifest file; ManifestError says what is wrong with it."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ManifestError(f"cannot read manifest {path}: {error.strerror or error}") from error
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise ManifestError(f"{path} is not JSON: {error}") from error
    return ModelManifest.from_json(document, source=str(path))


def write_manifest(manifest: ModelManifest, path: str | os.PathLike[str]) -> None:
    """Write the canonical text atomically (temporary file, then rename)."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    temporary.write_text(manifest.dumps(), encoding="utf-8")
    temporary.replace(path)


def shipped_manifests() -> list[ModelManifest]:
    """The pinned manifests of real models shipped with the package (``release/pins/*.json``)."""
    folder = resources.files("qwen3_tts_native").joinpath(SHIPPED_PINS)
    if not folder.is_dir():
        return []  # a packaging error: every check against a pin then fails closed, naming the gap
    manifests = []
    for item in sorted(folder.iterdir(), key=lambda entry: entry.name):
        if item.name.endswith(".json"):
            manifests.append(ModelManifest.from_json(json.loads(item.read_text(encoding="utf-8")), item.name))
    return manifests


# --- building ----------------------------------------------------------------------------------------


def build_manifest(
    snapshot_dir: str | os.PathLike[str],
    repository: str,
    revision: str | None = None,
    license: str | None = None,
    allow_symlinks: bool = False,
) -> ModelManifest:
    """Hash every file of ``snapshot_dir`` (SHA-256 and git blob id) and count tensors per component.

    ``revision`` defaults to ``sha256:<digest of the file list>``, a content id for snapshots made here.
    Raises SnapshotError if the directory holds anything but regular files (symlinks to regular files
    are followed only with ``allow_symlinks``).
    """
    root = Path(snapshot_dir)
    listing = _list_tree(root, allow_symlinks)
    if listing.problems:
        raise SnapshotError(f"cannot pin {root}:\n  " + "\n  ".join(listing.problems))
    if not listing.files:
        raise SnapshotError(f"cannot pin {root}: it holds no files")
    entries = []
    for relative in sorted(listing.files):
        full = root / relative
        size, sha256, blob_sha1 = _digest_file(full, want_sha256=True, want_git_blob=True)
        summary = read_safetensors_summary(full) if relative.endswith(".safetensors") else None
        entries.append(FileEntry(relative, size, sha256, blob_sha1, summary))
    files = tuple(entries)
    if revision is None:
        listing_digest = hashlib.sha256(
            json.dumps([_file_to_json(entry) for entry in files], sort_keys=True).encode()
        ).hexdigest()
        revision = f"sha256:{listing_digest}"
    components = count_components(root, [entry.path for entry in files if entry.safetensors is not None])
    document = ModelManifest(repository, revision, files, components, license).to_json()
    return ModelManifest.from_json(document, source=f"manifest of {root}")


def read_safetensors_summary(path: str | os.PathLike[str]) -> SafetensorsSummary:
    header, header_bytes = _read_safetensors_header(Path(path))
    dtypes = sorted({tensor["dtype"] for tensor in header.values()})
    parameters = sum(_numel(tensor["shape"]) for tensor in header.values())
    return SafetensorsSummary(header_bytes, len(header), parameters, tuple(dtypes))


def count_components(root: Path, safetensors_paths: Iterable[str]) -> dict[str, ComponentCount]:
    """Tensor and parameter counts per component of the known weight files; other files count nowhere."""
    tensors = dict.fromkeys(COMPONENTS, 0)
    parameters = dict.fromkeys(COMPONENTS, 0)
    for relative in safetensors_paths:
        rules = [(prefix, component) for file, prefix, component in _COMPONENT_RULES if file == relative]
        if not rules:
            continue
        header, _ = _read_safetensors_header(root / relative)
        for name, tensor in header.items():
            component = next((c for prefix, c in rules if name.startswith(prefix)), None)
            if component is None:
                raise SnapshotError(
                    f"{root / relative}: tensor {name!r} belongs to no component "
                    f"(expected a name starting with one of {', '.join(p for p, _ in rules)})"
                )
            tensors[component] += 1
            parameters[component] += _numel(tensor["shape"])
    return {name: ComponentCount(tensors[name], parameters[name]) for name in COMPONENTS}


# --- verifying ---------------------------------------------------------------------------------------


def verify_snapshot(
    snapshot_dir: str | os.PathLike[str], manifest: ModelManifest, allow_symlinks: bool = False
) -> list[str]:
    """Compare ``snapshot_dir`` with ``manifest``; returns one line per problem, empty when identical.

    Every hash an entry carries is checked (SHA-256 and the git blob id), one problem per file. Files
    whose size is already wrong are not hashed.
    """
    root = Path(snapshot_dir)
    listing = _list_tree(root, allow_symlinks)
    problems = list(listing.problems)
    listed = {entry.path for entry in manifest.files}
    for relative in sorted(listing.files - listed):
        problems.append(f"extra file: {relative} (not in the manifest)")
    for entry in manifest.files:
        if entry.path in listing.refused:
            continue
        if entry.path not in listing.files:
            problems.append(f"missing file: {entry.path} (manifest: {entry.bytes} bytes)")
            continue
        full = root / entry.path
        size = full.stat().st_size
        if size != entry.bytes:
            problems.append(f"size mismatch: {entry.path} has {size} bytes, the manifest says {entry.bytes}")
            continue
        try:
            _, sha256, blob_sha1 = _digest_file(
                full, want_sha256=entry.sha256 is not None, want_git_blob=entry.git_blob_sha1 is not None
            )
        except OSError as error:
            problems.append(f"unreadable file: {entry.path} ({error.strerror or error})")
            continue
        if entry.sha256 is not None and sha256 != entry.sha256:
            problems.append(_mismatch(entry.path, "sha256", sha256, entry.sha256))
        elif entry.git_blob_sha1 is not None and blob_sha1 != entry.git_blob_sha1:
            problems.append(_mismatch(entry.path, "git blob", blob_sha1, entry.git_blob_sha1))
    return sorted(problems, key=_problem_sort_key)


@dataclass(frozen=True)
class SnapshotVerification:
    """The outcome of ``verify_snapshot_for_serving``."""

    snapshot_dir: Path
    manifest_source: str
    """The manifest checked against: a path inside the snapshot, or ``shipped pin <file>``."""
    manifest: ModelManifest | None
    problems: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def identity(self) -> str:
        """``repository@revision`` of the manifest checked against, for logs."""
        return f"{self.manifest.repository}@{self.manifest.revision}" if self.manifest else "unknown"


def verify_snapshot_for_serving(
    snapshot_dir: str | os.PathLike[str],
    pins: Sequence[ModelManifest] | None = None,
    allow_symlinks: bool = False,
) -> SnapshotVerification:
    """Check a snapshot before serving it; never raises for a bad snapshot, it reports.

    The manifest is chosen so that a real model cannot vouch for itself:
    1. ``<snapshot>/qwen3-tts-manifest.json`` naming a pinned repository@revision: the shipped pin is used.
    2. ``<snapshot>/qwen3-tts-manifest.json`` naming anything else (a snapshot made here): that manifest.
    3. No manifest inside: the shipped pin (the real model).
    ``pins`` defaults to ``shipped_manifests()``; ``allow_symlinks`` accepts a Hugging Face cache snapshot.
    """
    root = Path(snapshot_dir)
    pins = shipped_manifests() if pins is None else list(pins)
    inside = root / MANIFEST_FILENAME
    if inside.is_file() and not inside.is_symlink():
        try:
            own = load_manifest(inside)
        except ManifestError as error:
            return SnapshotVerification(root, str(inside), None, (f"bad manifest: {error}",))
        for pin in pins:
            if (pin.repository, pin.revision) == (own.repository, own.revision):
                return _against_pin(root, pin, verify_snapshot(root, pin, allow_symlinks))
        return SnapshotVerification(root, str(inside), own, tuple(verify_snapshot(root, own, allow_symlinks)))
    if not pins:
        problem = f"no {MANIFEST_FILENAME} in {root} and no shipped pin"
        return SnapshotVerification(root, "none", None, (problem,))
    results = [(pin, verify_snapshot(root, pin, allow_symlinks)) for pin in pins]
    pin, problems = min(results, key=lambda item: len(item[1]))
    if problems:
        problems.append(
            f"{root} has no {MANIFEST_FILENAME} and is not the pinned model {pin.repository}@{pin.revision}; "
            f"for a snapshot made here run `qwen3-tts model pin {root} -o {inside}`"
        )
    return _against_pin(root, pin, problems)


def _against_pin(root: Path, pin: ModelManifest, problems: list[str]) -> SnapshotVerification:
    return SnapshotVerification(root, f"shipped pin {pin.repository}@{pin.revision}", pin, tuple(problems))


# --- helpers -----------------------------------------------------------------------------------------


@dataclass
class _Listing:
    files: set[str]  # regular files (or symlinks to them, when allowed), relative POSIX paths
    refused: set[str]  # paths present but not acceptable; reported in problems
    problems: list[str]


def _list_tree(root: Path, allow_symlinks: bool) -> _Listing:
    listing = _Listing(set(), set(), [])
    try:
        root_stat = root.lstat()
    except OSError as error:
        listing.problems.append(f"snapshot directory {root} cannot be read: {error.strerror or error}")
        return listing
    if stat.S_ISLNK(root_stat.st_mode) and not allow_symlinks:
        listing.problems.append(f"symlink refused: {root} itself is a symlink (pass the real directory)")
        return listing
    if not root.is_dir():
        listing.problems.append(f"snapshot directory {root} is not a directory")
        return listing
    for relative, kind in _walk(root, PurePosixPath()):
        text = relative.as_posix()
        if text == MANIFEST_FILENAME and kind == "file":
            continue
        if kind == "file" or (kind == "symlink" and allow_symlinks and (root / text).is_file()):
            listing.files.add(text)
        elif kind == "symlink":
            listing.refused.add(text)
            target = os.readlink(root / text)
            reason = (
                "regular files only; pass --allow-symlinks for a Hugging Face cache snapshot"
                if (not allow_symlinks)
                else "it does not point at a regular file"
            )
            listing.problems.append(f"symlink refused: {text} -> {target} ({reason})")
        else:
            listing.refused.add(text)
            listing.problems.append(f"not a regular file: {text} ({kind})")
    return listing


def _walk(root: Path, relative: PurePosixPath) -> Iterator[tuple[PurePosixPath, str]]:
    with os.scandir(root / relative) as entries:
        for entry in sorted(entries, key=lambda item: item.name):
            path = relative / entry.name
            if entry.is_symlink():
                yield path, "symlink"
            elif entry.is_dir(follow_symlinks=False):
                yield from _walk(root, path)
            elif entry.is_file(follow_symlinks=False):
                yield path, "file"
            else:
                yield path, "special file"


def _digest_file(path: Path, want_sha256: bool, want_git_blob: bool) -> tuple[int, str | None, str | None]:
    size = path.stat().st_size
    sha256 = hashlib.sha256() if want_sha256 else None
    blob = hashlib.sha1(f"blob {size}\0".encode(), usedforsecurity=False) if want_git_blob else None
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    total = 0
    with open(path, "rb", buffering=0) as handle:
        while True:
            read = handle.readinto(buffer)
            if not read:
                break
            total += read
            if sha256 is not None:
                sha256.update(view[:read])
            if blob is not None:
                blob.update(view[:read])
    if total != size:
        raise OSError(f"{path} changed size while being read ({size} -> {total} bytes)")
    return size, sha256.hexdigest() if sha256 else None, blob.hexdigest() if blob else None


def git_blob_sha1(data: bytes) -> str:
    """The git blob id of ``data``: sha1 of ``blob <len>\\0`` followed by the bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def _read_safetensors_header(path: Path) -> tuple[dict[str, Any], int]:
    with open(path, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) != 8:
            raise SnapshotError(f"{path}: too short for a safetensors file")
        (length,) = struct.unpack("<Q", prefix)
        if length > _MAX_HEADER:
            raise SnapshotError(f"{path}: safetensors header of {length} bytes is over {_MAX_HEADER}")
        raw = handle.read(length)
    if len(raw) != length:
        raise SnapshotError(f"{path}: safetensors header is truncated")
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise SnapshotError(f"{path}: safetensors header is not JSON: {error}") from error
    if not isinstance(header, dict):
        raise SnapshotError(f"{path}: safetensors header is not a JSON object")
    header.pop("__metadata__", None)
    for name, tensor in header.items():
        if (
            not isinstance(tensor, dict)
            or tensor.get("dtype") not in _DTYPE_BITS
            or not isinstance(tensor.get("shape"), list)
            or not all(isinstance(dim, int) and dim >= 0 for dim in tensor["shape"])
        ):
            raise SnapshotError(f"{path}: safetensors entry {name!r} has no valid dtype and shape")
    return header, 8 + length


def _numel(shape: Sequence[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def _file_to_json(entry: FileEntry) -> dict[str, Any]:
    item: dict[str, Any] = {"path": entry.path, "bytes": entry.bytes}
    if entry.sha256 is not None:
        item["sha256"] = entry.sha256
    if entry.git_blob_sha1 is not None:
        item["git_blob_sha1"] = entry.git_blob_sha1
    if entry.safetensors is not None:
        summary = entry.safetensors
        item["safetensors"] = {
            "header_bytes": summary.header_bytes,
            "tensors": summary.tensors,
            "parameters": summary.parameters,
            "dtypes": list(summary.dtypes),
        }
    return item


def _file_from_json(item: Mapping[str, Any]) -> FileEntry:
    summary = item.get("safetensors")
    return FileEntry(
        path=item["path"],
        bytes=item["bytes"],
        sha256=item.get("sha256"),
        git_blob_sha1=item.get("git_blob_sha1"),
        safetensors=None
        if summary is None
        else SafetensorsSummary(
            summary["header_bytes"], summary["tensors"], summary["parameters"], tuple(summary["dtypes"])
        ),
    )


def _check_component_totals(manifest: ModelManifest, source: str) -> None:
    """Components must add up to the parameters of the weight files they come from, where recorded."""
    for file, members in (
        ("model.safetensors", ("talker", "code_predictor")),
        ("speech_tokenizer/model.safetensors", ("speech_decoder", "speech_encoder_unused")),
    ):
        entry = manifest.file(file)
        if entry is None or entry.safetensors is None:
            continue
        total = sum(manifest.components[name].parameters for name in members)
        if total != entry.safetensors.parameters:
            raise ManifestError(
                f"{source}: components {' + '.join(members)} hold {total} parameters, "
                f"but {file} holds {entry.safetensors.parameters}"
            )


_SCHEMA: dict[str, Any] | None = None


def _validate_schema(document: Any, source: str) -> None:
    global _SCHEMA
    from jsonschema import Draft202012Validator

    if _SCHEMA is None:
        text = resources.files("qwen3_tts_native.schemas").joinpath("model-manifest.schema.json").read_text()
        _SCHEMA = json.loads(text)
    errors = sorted(Draft202012Validator(_SCHEMA).iter_errors(document), key=lambda error: list(error.path))
    if errors:
        details = "; ".join(
            f"{'/'.join(map(str, error.path)) or '(root)'}: {error.message}" for error in errors[:5]
        )
        raise ManifestError(f"{source} is not a valid model manifest: {details}")


def _mismatch(path: str, kind: str, actual: str | None, expected: str) -> str:
    return f"content mismatch: {path} has {kind} {actual}, the manifest says {expected}"


def _problem_sort_key(problem: str) -> tuple[str, str]:
    kind, _, rest = problem.partition(": ")
    return rest, kind

"""Repository hygiene gates: a licence allowlist, and a secret scan of the whole git history.

Licences are evaluated as SPDX expressions with ``license-expression``: ``A OR B`` passes when either
side is allowed, ``A AND B`` when both are, ``A WITH E`` when ``A`` and the exception ``E`` are. The policy
(``release/license-policy.json``) also lists accepted free-text names and waivers, each with a reason
and a review date after which it stops applying.

The secret scan reads every blob of every commit reachable from any ref (``git rev-list --all``, then
``git ls-tree`` per commit, each distinct blob once through ``git cat-file --batch``) with detect-secrets'
detectors for known credential formats and private keys. Its keyword and entropy detectors are off: they
flag variable names and the many digests this repository pins. Findings name the commit, file, line and
kind of secret, never the secret. A line can be exempted with ``pragma: allowlist secret``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fnmatch
import json
import subprocess
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from .sbom import PythonDistribution, spdx_licensing

POLICY_FILE = "release/license-policy.json"
MAX_SCANNED_BLOB_BYTES = 4 * 1024 * 1024
_BINARY_SNIFF_BYTES = 8000
_OFF_DETECTORS = frozenset(
    {"Base64HighEntropyString", "HexHighEntropyString", "KeywordDetector", "IPPublicDetector"}
)


class HygieneError(Exception):
    """A gate could not run (not a git repository, unreadable policy or SBOM)."""


# --- licences ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Waiver:
    package: str  # fnmatch pattern on the normalised name
    reason: str
    review_by: dt.date


@dataclass(frozen=True)
class LicensePolicy:
    allow: frozenset[str]
    allow_exceptions: frozenset[str]
    allow_names: frozenset[str]
    waivers: tuple[Waiver, ...]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LicensePolicy:
        try:
            return cls(
                allow=frozenset(data["allow"]),
                allow_exceptions=frozenset(data.get("allow_exceptions", ())),
                allow_names=frozenset(data.get("allow_names", {})),
                waivers=tuple(
                    Waiver(item["package"], item["reason"], dt.date.fromisoformat(item["review_by"]))
                    for item in data.get("waivers", ())
                ),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise HygieneError(f"licence policy is malformed: {error!r}") from error


def load_policy(path: Path | None = None) -> LicensePolicy:
    """The policy at ``path``, default the shipped ``release/license-policy.json``."""
    source = path or resources.files("qwen3_tts_native").joinpath(POLICY_FILE)
    try:
        return LicensePolicy.from_json(json.loads(source.read_text(encoding="utf-8")))
    except (OSError, json.JSONDecodeError) as error:
        raise HygieneError(f"cannot read licence policy {source}: {error}") from error


@dataclass(frozen=True)
class LicensedItem:
    """Something with declared licences: ``expressions`` are SPDX, ``names`` free text (all must pass)."""

    name: str
    version: str
    expressions: tuple[str, ...]
    names: tuple[str, ...]


def items_from_distributions(distributions: Iterable[PythonDistribution]) -> list[LicensedItem]:
    return [
        LicensedItem(
            dist.key,
            dist.version,
            (dist.license.expression,) if dist.license.expression else (),
            dist.license.names,
        )
        for dist in distributions
    ]


def items_from_sbom(document: dict[str, Any]) -> list[LicensedItem]:
    """The root and every top-level component of a CycloneDX document except plain files."""
    components = list(document.get("components", []))
    root = document.get("metadata", {}).get("component")
    items = []
    for component in ([root] if root else []) + components:
        if component.get("type") == "file":
            continue
        expressions, names = [], []
        for choice in component.get("licenses", []):
            if "expression" in choice:
                expressions.append(choice["expression"])
            elif "id" in choice.get("license", {}):
                expressions.append(choice["license"]["id"])
            elif "name" in choice.get("license", {}):
                names.append(choice["license"]["name"])
        version = component.get("version", "")
        items.append(LicensedItem(component["name"], version, tuple(expressions), tuple(names)))
    return items


def license_violations(
    items: Iterable[LicensedItem], policy: LicensePolicy, today: dt.date | None = None
) -> list[str]:
    """One line per item whose licences the policy does not allow (and no live waiver covers)."""
    from license_expression import ExpressionError

    today = today or dt.date.today()
    licensing = spdx_licensing()
    names = policy.allow_names
    problems = []
    for item in items:
        label = f"{item.name} {item.version}".strip()
        reasons = []
        for expression in item.expressions:
            try:
                if not _allowed(licensing.parse(expression, validate=True), policy):
                    reasons.append(f"{expression} is not allowed")
            except ExpressionError:
                if expression not in policy.allow_names:
                    reasons.append(f"{expression!r} is not a valid SPDX expression nor an allowed name")
        reasons += [f"{name!r} is not an allowed licence name" for name in item.names if name not in names]
        if not item.expressions and not item.names:
            reasons.append("declares no licence")
        if not reasons:
            continue
        waiver = next((w for w in policy.waivers if fnmatch.fnmatchcase(item.name.lower(), w.package)), None)
        if waiver and waiver.review_by >= today:
            continue
        if waiver:
            reasons.append(f"its waiver ({waiver.package}) expired on {waiver.review_by}: review it")
        problems.append(f"{label}: {'; '.join(reasons)}")
    return problems


def _allowed(node: Any, policy: LicensePolicy) -> bool:
    from license_expression import AND, OR, LicenseSymbol, LicenseWithExceptionSymbol

    if isinstance(node, LicenseWithExceptionSymbol):
        exception = node.exception_symbol.key
        return node.license_symbol.key in policy.allow and exception in policy.allow_exceptions
    if isinstance(node, LicenseSymbol):
        return node.key in policy.allow
    if isinstance(node, AND):
        return all(_allowed(arg, policy) for arg in node.args)
    if isinstance(node, OR):
        return any(_allowed(arg, policy) for arg in node.args)
    return False


# --- secrets -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SecretFinding:
    commit: str
    path: str
    line: int
    kind: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} in commit {self.commit[:12]}: {self.kind}"


@dataclass(frozen=True)
class SecretScan:
    commits: int
    blobs_scanned: int
    blobs_skipped: int  # binary, or over MAX_SCANNED_BLOB_BYTES
    findings: tuple[SecretFinding, ...]


def scan_git_history(repository: Path) -> SecretScan:
    """Scan every distinct blob of every commit reachable from any ref of ``repository``."""
    commits = _git(repository, "rev-list", "--all", "--reverse").split()
    first_seen: dict[str, tuple[str, str]] = {}
    for commit in commits:
        for blob, path in _tree_blobs(repository, commit):
            first_seen.setdefault(blob, (commit, path))
    findings: list[SecretFinding] = []
    scanned = skipped = 0
    with tempfile.TemporaryDirectory(prefix="qwen3-tts-secrets-") as folder, _detectors():
        for index, (blob, content) in enumerate(_read_blobs(repository, list(first_seen))):
            commit, path = first_seen[blob]
            if content is None:
                skipped += 1
                continue
            scanned += 1
            hits = _scan(folder, index, path, content)
            findings += (SecretFinding(commit, path, line, kind) for line, kind in hits)
    return SecretScan(len(commits), scanned, skipped, tuple(sorted(findings, key=lambda f: (f.path, f.line))))


def _git(repository: Path, *args: str) -> str:
    try:
        done = subprocess.run(
            ["git", "-C", str(repository), *args], capture_output=True, text=True, check=True
        )
    except FileNotFoundError as error:
        raise HygieneError("git is not installed") from error
    except subprocess.CalledProcessError as error:
        raise HygieneError(f"git {' '.join(args)} failed in {repository}: {error.stderr.strip()}") from error
    return done.stdout


def _tree_blobs(repository: Path, commit: str) -> Iterator[tuple[str, str]]:
    listing = _git(repository, "ls-tree", "-r", "-z", "--full-tree", commit)
    for record in listing.split("\0"):
        if not record:
            continue
        meta, _, path = record.partition("\t")
        mode, kind, blob = meta.split()
        if kind == "blob" and mode != "120000":
            yield blob, path


def _read_blobs(repository: Path, blobs: Sequence[str]) -> Iterator[tuple[str, bytes | None]]:
    """Contents through one ``git cat-file --batch``; None for binary or oversized blobs."""
    process = subprocess.Popen(
        ["git", "-C", str(repository), "cat-file", "--batch"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        for blob in blobs:
            process.stdin.write(f"{blob}\n".encode())
            process.stdin.flush()
            header = process.stdout.readline().split()
            if len(header) != 3 or header[1] != b"blob":
                raise HygieneError(f"git cat-file could not read blob {blob}")
            content = process.stdout.read(int(header[2]))
            process.stdout.read(1)
            binary = len(content) > MAX_SCANNED_BLOB_BYTES or b"\0" in content[:_BINARY_SNIFF_BYTES]
            yield blob, None if binary else content
    finally:
        process.stdin.close()
        process.wait()


@contextlib.contextmanager
def _detectors() -> Iterator[None]:
    """detect-secrets settings for the scan: every detector except the keyword and entropy ones."""
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
    from detect_secrets.settings import transient_settings

    plugin_classes: list[type] = list(get_mapping_from_secret_type_to_class().values())
    detectors = sorted(plugin.__name__ for plugin in plugin_classes)
    plugins = [{"name": name} for name in detectors if name not in _OFF_DETECTORS]
    with transient_settings({"plugins_used": plugins}):
        yield


def _scan(folder: str, index: int, path: str, content: bytes) -> list[tuple[int, str]]:
    """detect-secrets over ``content`` saved under its own file name (detectors look at extensions)."""
    from detect_secrets.core.scan import scan_file

    target = Path(folder) / str(index) / Path(path).name
    target.parent.mkdir()
    target.write_bytes(content)
    try:
        return sorted({(secret.line_number, secret.type) for secret in scan_file(str(target))})
    finally:
        target.unlink()
        target.parent.rmdir()

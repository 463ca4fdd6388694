"""in-toto statements: the ones we sign, and parsing of the ones we check (ours and BuildKit's).

Every signed claim about an image is an in-toto v1 Statement whose subject is the image *index*
digest, so one signature check answers "does this claim talk about exactly this release":

* the image signature: cosign v3's ``https://sigstore.dev/cosign/sign/v1`` with an empty predicate;
* the SBOM: the CycloneDX document as predicate (``https://cyclonedx.org/bom``, cosign's type);
* the model manifest: our predicate type, the model manifest as predicate.

BuildKit's SLSA provenance (v1 or v0.2) is unsigned and stored inside the index; it is parsed here into
the few facts the gate checks (builder, source repository, commit) plus a credential scan.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .oci import IN_TOTO, canonical_json, check_digest

STATEMENT_V1 = "https://in-toto.io/Statement/v1"
STATEMENT_V01 = "https://in-toto.io/Statement/v0.1"
COSIGN_SIGN_PREDICATE = "https://sigstore.dev/cosign/sign/v1"
CYCLONEDX_PREDICATE = "https://cyclonedx.org/bom"
MODEL_MANIFEST_PREDICATE = "https://qwen3-tts-native.github.io/attestations/model-manifest/v1"
SLSA_V1_PREDICATE = "https://slsa.dev/provenance/v1"
SLSA_V02_PREDICATE = "https://slsa.dev/provenance/v0.2"
PROVENANCE_PREDICATES = frozenset({SLSA_V1_PREDICATE, SLSA_V02_PREDICATE})
BUILDKIT_BUILD_TYPES = frozenset(
    {
        "https://github.com/moby/buildkit/blob/master/docs/attestations/slsa-definitions.md",  # SLSA v1
        "https://mobyproject.org/buildkit@v1",  # SLSA v0.2
    }
)


class AttestationError(ValueError):
    """A statement or predicate is malformed or does not say what it must."""


def build_statement(
    subject_name: str, digest: str, predicate_type: str, predicate: Mapping[str, Any]
) -> bytes:
    """Serialise an in-toto v1 Statement about one sha256 subject (canonical JSON bytes)."""
    return canonical_json(
        {
            "_type": STATEMENT_V1,
            "subject": [{"name": subject_name, "digest": {"sha256": check_digest(digest).split(":", 1)[1]}}],
            "predicateType": predicate_type,
            "predicate": dict(predicate),
        }
    )


def image_signature_statement(subject_name: str, index_digest: str) -> bytes:
    """cosign v3's image signature: a sign/v1 statement with an empty predicate."""
    return build_statement(subject_name, index_digest, COSIGN_SIGN_PREDICATE, {})


def sbom_statement(subject_name: str, index_digest: str, sbom: Mapping[str, Any]) -> bytes:
    if sbom.get("bomFormat") != "CycloneDX":
        raise AttestationError("the SBOM is not a CycloneDX JSON document (bomFormat != CycloneDX)")
    return build_statement(subject_name, index_digest, CYCLONEDX_PREDICATE, sbom)


def model_statement(subject_name: str, index_digest: str, manifest: Mapping[str, Any]) -> bytes:
    return build_statement(subject_name, index_digest, MODEL_MANIFEST_PREDICATE, manifest)


@dataclass(frozen=True)
class Statement:
    """A parsed in-toto statement; ``subject_digests`` are ``sha256:<hex>`` strings."""

    predicate_type: str
    subject_digests: frozenset[str]
    predicate: dict[str, Any]


def parse_statement(payload: bytes, payload_type: str = IN_TOTO) -> Statement:
    """Parse a DSSE payload as an in-toto statement (v1, or BuildKit's v0.1)."""
    if payload_type != IN_TOTO:
        raise AttestationError(f"payload type is {payload_type!r}, expected {IN_TOTO}")
    try:
        doc = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AttestationError(f"statement is not JSON: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("_type") not in (STATEMENT_V1, STATEMENT_V01):
        raise AttestationError("not an in-toto statement (_type missing or unknown)")
    predicate_type = doc.get("predicateType")
    if not isinstance(predicate_type, str):
        raise AttestationError("statement has no predicateType")
    digests: set[str] = set()
    for subject in doc.get("subject") or []:
        value = (subject.get("digest") or {}).get("sha256") if isinstance(subject, dict) else None
        if isinstance(value, str):
            digests.add(f"sha256:{value}")
    if not digests:
        raise AttestationError("statement has no sha256 subject")
    predicate = doc.get("predicate")
    return Statement(predicate_type, frozenset(digests), predicate if isinstance(predicate, dict) else {})


# -- provenance ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Provenance:
    """The facts the gate checks in a BuildKit SLSA provenance predicate."""

    slsa_version: str
    builder_id: str
    build_type: str
    source_repository: str | None
    source_revision: str | None


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def normalize_repository(uri: str) -> str:
    """``git+https://github.com/o/r.git#ref`` -> ``https://github.com/o/r`` (for comparison)."""
    uri = uri.removeprefix("git+").split("#", 1)[0].split("?", 1)[0].rstrip("/")
    return uri.removesuffix(".git").lower()


def _source_from_uri(uri: Any, digest: Any) -> tuple[str | None, str | None]:
    if not isinstance(uri, str) or not uri:
        return None, None
    revision = None
    if isinstance(digest, dict):
        revision = digest.get("sha1") or digest.get("gitCommit")
    fragment = uri.split("#", 1)[1] if "#" in uri else ""
    if revision is None and re.fullmatch(r"[0-9a-f]{40}", fragment):
        revision = fragment
    return uri, revision


def parse_provenance(statement: Statement) -> Provenance:
    """Extract builder, build type, source repository and commit from SLSA v1 or v0.2 (BuildKit)."""
    pred = statement.predicate
    if statement.predicate_type == SLSA_V1_PREDICATE:
        builder_id = _get(pred, "runDetails", "builder", "id")
        build_type = _get(pred, "buildDefinition", "buildType")
        vcs = _get(pred, "runDetails", "metadata", "buildkit_metadata", "vcs") or {}
        config = _get(pred, "buildDefinition", "externalParameters", "configSource") or {}
        args = _get(pred, "buildDefinition", "externalParameters", "request", "args") or {}
        version = "v1"
    elif statement.predicate_type == SLSA_V02_PREDICATE:
        builder_id = _get(pred, "builder", "id")
        build_type = pred.get("buildType")
        vcs = _get(pred, "metadata", "https://mobyproject.org/buildkit@v1#metadata", "vcs") or {}
        config = _get(pred, "invocation", "configSource") or {}
        args = _get(pred, "invocation", "parameters", "args") or {}
        version = "v0.2"
    else:
        raise AttestationError(f"{statement.predicate_type} is not SLSA provenance")
    if not isinstance(builder_id, str) or not builder_id:
        raise AttestationError(f"SLSA {version} provenance names no builder id")
    repo: Any = vcs.get("source") if isinstance(vcs, dict) else None
    revision: Any = vcs.get("revision") if isinstance(vcs, dict) else None
    if not repo and isinstance(args, dict):
        repo, revision = args.get("vcs:source"), revision or args.get("vcs:revision")
    if not repo and isinstance(config, dict):
        repo, config_revision = _source_from_uri(config.get("uri"), config.get("digest"))
        revision = revision or config_revision
    return Provenance(
        slsa_version=version,
        builder_id=builder_id,
        build_type=str(build_type or ""),
        source_repository=normalize_repository(repo) if isinstance(repo, str) and repo else None,
        source_revision=str(revision) if revision else None,
    )


_SECRET_KEY = re.compile(r"password|passwd|token|secret|credential|api.?key", re.IGNORECASE)
_SECRET_VALUES = (
    ("GitHub token", re.compile(r"gh[pousr]_[A-Za-z0-9]{20,}")),
    ("GitHub fine-grained token", re.compile(r"github_pat_[A-Za-z0-9_]{20,}")),
    ("GitLab token", re.compile(r"glpat-[A-Za-z0-9_-]{16,}")),
    ("AWS access key", re.compile(r"AKIA[0-9A-Z]{16}")),
    ("API secret key", re.compile(r"(?<![A-Za-z0-9])sk-[A-Za-z0-9_-]{16,}")),
    ("private host path", re.compile(r"/home/|/Users/|/root/")),
)


def _walk(obj: Any, path: str) -> Iterator[tuple[str, str | None, Any]]:
    """Yield ``(path, key, value)`` for every dict value and list item below ``obj``."""
    items: list[tuple[str, str | None, Any]]
    if isinstance(obj, dict):
        items = [(f"{path}.{k}" if path else str(k), str(k), v) for k, v in obj.items()]
    elif isinstance(obj, list):
        items = [(f"{path}[{i}]", None, v) for i, v in enumerate(obj)]
    else:
        return
    for item in items:
        yield item
        yield from _walk(item[2], item[0])


def find_credential_leaks(obj: Any) -> list[str]:
    """Paths in ``obj`` that look like a credential or leak a private host path.

    A credential-like *key* (token, secret, password, ...) counts only when it carries a scalar value:
    BuildKit legitimately lists secret *ids* (``request.secrets: [{"id": ...}]``) without values.
    Values are matched against known token formats and home-directory paths.
    """
    findings: list[str] = []
    for path, key, value in _walk(obj, ""):
        scalar = isinstance(value, str | int | float) and not isinstance(value, bool) and value != ""
        if key is not None and scalar and _SECRET_KEY.search(key):
            findings.append(f"{path}: credential-like key with a value")
        if isinstance(value, str):
            for label, pattern in _SECRET_VALUES:
                if pattern.search(value):
                    findings.append(f"{path}: value looks like a {label}")
    return sorted(set(findings))

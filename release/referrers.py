"""Storing signed statements next to an image as OCI 1.1 referrers, and finding them again.

Layout (cosign v3's "new bundle format"): an artifact manifest whose ``artifactType`` and single layer
are the signature format (a Sigstore bundle v0.3, or a bare DSSE envelope in key-pair mode), with an
empty config and ``subject`` = the image index descriptor. Registries without the referrers API are
served through the ``sha256-<hex>`` referrers tag index (see ``RegistryClient.push_referrer``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from .keypair import DSSE_ENVELOPE
from .oci import EMPTY_JSON, OCI_EMPTY, Descriptor, OciError, artifact_manifest
from .registry import RegistryClient, RegistryError

SIGSTORE_BUNDLE = "application/vnd.dev.sigstore.bundle.v0.3+json"
SIGNATURE_FORMATS = frozenset({SIGSTORE_BUNDLE, DSSE_ENVELOPE})


@dataclass(frozen=True)
class SignedStatement:
    """Signature bytes ready to attach: ``media_type`` is SIGSTORE_BUNDLE or DSSE_ENVELOPE."""

    media_type: str
    content: bytes
    predicate_type: str


@dataclass(frozen=True)
class FoundSignature:
    """A signature blob found among an image's referrers (its bytes already match their digest)."""

    referrer: str
    media_type: str
    content: bytes
    claimed_predicate_type: str | None = None
    """The referrer's predicate-type annotation: unauthenticated, used only to file error reports."""


def attach(
    client: RegistryClient, repository: str, subject: Descriptor, signed: SignedStatement
) -> Descriptor:
    """Upload ``signed`` and an artifact manifest referring to ``subject``; return that manifest."""
    client.upload_blob(repository, EMPTY_JSON)
    digest = client.upload_blob(repository, signed.content)
    suffix = "sigstore.json" if signed.media_type == SIGSTORE_BUNDLE else "dsse.json"
    layer = Descriptor(
        signed.media_type,
        digest,
        len(signed.content),
        annotations={"org.opencontainers.image.title": f"{digest.replace(':', '-')}.{suffix}"},
    )
    annotations = {
        "org.opencontainers.image.created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "in-toto.io/predicate-type": signed.predicate_type,
    }
    if signed.media_type == SIGSTORE_BUNDLE:
        annotations["dev.sigstore.bundle.content"] = "dsse-envelope"
        annotations["dev.sigstore.bundle.predicateType"] = signed.predicate_type
    manifest = artifact_manifest(signed.media_type, [layer], subject, annotations)
    return client.push_referrer(repository, manifest, subject.digest)


def discover(
    client: RegistryClient, repository: str, subject_digest: str
) -> tuple[list[FoundSignature], list[str]]:
    """Every signature blob attached to ``subject_digest``, plus problems met on the way.

    Referrer lists are unauthenticated, so each referrer manifest is fetched by digest (re-hashed) and
    must name ``subject_digest`` as its subject; each blob is re-hashed by the client. Some cosign
    versions wrote ``artifactType`` as the empty media type, so the layer media type decides.
    """
    found: list[FoundSignature] = []
    problems: list[str] = []
    for desc in client.referrers(repository, subject_digest):
        if desc.artifact_type not in SIGNATURE_FORMATS | {OCI_EMPTY, None}:
            continue
        try:
            manifest = client.get_manifest(repository, desc.digest).json()
            subject = Descriptor.from_json(manifest.get("subject") or {})
        except (RegistryError, OciError) as exc:
            problems.append(f"referrer {desc.digest}: {exc}")
            continue
        if subject.digest != subject_digest:
            problems.append(f"referrer {desc.digest} names subject {subject.digest}, not {subject_digest}")
            continue
        for layer in manifest.get("layers") or []:
            media_type = layer.get("mediaType") if isinstance(layer, dict) else None
            if media_type not in SIGNATURE_FORMATS:
                continue
            try:
                content = client.get_blob(repository, Descriptor.from_json(layer).digest)
            except (RegistryError, OciError) as exc:
                problems.append(f"referrer {desc.digest}: {exc}")
                continue
            annotations = manifest.get("annotations") or {}
            claimed = annotations.get("in-toto.io/predicate-type") or annotations.get(
                "dev.sigstore.bundle.predicateType"
            )
            found.append(FoundSignature(desc.digest, str(media_type), content, claimed))
    return found, problems

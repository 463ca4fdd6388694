"""``qwen3-tts release sign``: sign an image index and attach its SBOM and model manifest as attestations.

Keyless (default): sigstore-python asks Fulcio for a short-lived certificate bound to the ambient CI
identity (GitHub Actions OIDC), signs each in-toto statement as a DSSE envelope and logs it in Rekor;
the resulting bundle v0.3 is attached as an OCI referrer, which is what ``cosign sign`` v3 writes.
Key-pair (``--key``): the same statements in bare DSSE envelopes signed with an ECDSA P-256 key
(see ``release.keypair``). Both sign the index digest, never a tag.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from cryptography.hazmat.primitives.asymmetric import ec
from sigstore import dsse
from sigstore.errors import Error as SigstoreError
from sigstore.models import ClientTrustConfig
from sigstore.oidc import IdentityError, IdentityToken, detect_credential
from sigstore.sign import Signer, SigningContext

from .attest import (
    COSIGN_SIGN_PREDICATE,
    CYCLONEDX_PREDICATE,
    MODEL_MANIFEST_PREDICATE,
    image_signature_statement,
    model_statement,
    sbom_statement,
)
from .keypair import DSSE_ENVELOPE, sign_envelope
from .oci import ALL_MANIFEST_TYPES
from .referrers import SIGSTORE_BUNDLE, SignedStatement, attach
from .registry import ImageReference, RegistryClient


class SigningError(RuntimeError):
    """Signing could not be done; the message says why and what to do."""


class StatementSigner(Protocol):
    """Turns in-toto statement bytes into signature bytes ready to attach."""

    def sign(self, statement: bytes, predicate_type: str) -> SignedStatement: ...


class KeyPairSigner:
    """Signs statements into bare DSSE envelopes with an ECDSA P-256 key."""

    def __init__(self, private_key: ec.EllipticCurvePrivateKey) -> None:
        self._key = private_key

    def sign(self, statement: bytes, predicate_type: str) -> SignedStatement:
        return SignedStatement(DSSE_ENVELOPE, sign_envelope(self._key, statement), predicate_type)


class SigstoreSigner:
    """Signs statements into Sigstore bundles (DSSE envelope, Fulcio certificate, Rekor entry)."""

    def __init__(self, signer: Signer) -> None:
        self._signer = signer

    def sign(self, statement: bytes, predicate_type: str) -> SignedStatement:
        try:
            bundle = self._signer.sign_dsse(dsse.Statement(statement))
        except SigstoreError as exc:
            raise SigningError(f"Sigstore signing failed: {exc}") from exc
        return SignedStatement(SIGSTORE_BUNDLE, bundle.to_json().encode(), predicate_type)


def ambient_identity_token() -> IdentityToken:
    """The CI job's OIDC identity (GitHub Actions, GitLab, Buildkite, ...), for Fulcio."""
    try:
        raw = detect_credential()
    except IdentityError as exc:
        raise SigningError(f"ambient OIDC credential detection failed: {exc}\n{exc.diagnostics()}") from exc
    if raw is None:
        raise SigningError(
            "no ambient OIDC identity found: run keyless signing in CI with an identity token "
            "(GitHub Actions: `permissions: id-token: write`), or sign with --key"
        )
    try:
        return IdentityToken(raw)
    except IdentityError as exc:
        raise SigningError(f"the ambient OIDC token is unusable: {exc}") from exc


@contextmanager
def sigstore_signer(trust: ClientTrustConfig) -> Iterator[SigstoreSigner]:
    """One ephemeral key and one Fulcio certificate for all statements of a release."""
    token = ambient_identity_token()
    try:
        context = SigningContext.from_trust_config(trust)
        with context.signer(token, cache=True) as signer:
            yield SigstoreSigner(signer)
    except SigstoreError as exc:
        raise SigningError(f"Sigstore signing failed: {exc}") from exc


@dataclass(frozen=True)
class Attached:
    """One statement attached to the image: its predicate type and the referrer manifest digest."""

    predicate_type: str
    referrer: str


def sign_release(
    client: RegistryClient,
    image: ImageReference,
    signer: StatementSigner,
    *,
    sbom: Mapping[str, Any] | None,
    model_manifest: Mapping[str, Any] | None,
) -> list[Attached]:
    """Sign ``image`` (pinned by digest) and attach the image signature, SBOM and model attestations."""
    if image.digest is None:
        raise SigningError(f"{image} is not pinned: sign IMAGE@sha256:<digest>, never a tag")
    manifest = client.get_manifest(image.repository, image.digest)
    if manifest.media_type not in ALL_MANIFEST_TYPES:
        raise SigningError(f"{image} is a {manifest.media_type}, not an image index or manifest")
    subject = manifest.descriptor
    statements = [(COSIGN_SIGN_PREDICATE, image_signature_statement(image.name, image.digest))]
    if sbom is not None:
        statements.append((CYCLONEDX_PREDICATE, sbom_statement(image.name, image.digest, sbom)))
    if model_manifest is not None:
        statements.append(
            (MODEL_MANIFEST_PREDICATE, model_statement(image.name, image.digest, model_manifest))
        )
    attached = []
    for predicate_type, statement in statements:
        signed = signer.sign(statement, predicate_type)
        referrer = attach(client, image.repository, subject, signed)
        attached.append(Attached(predicate_type, referrer.digest))
    return attached

"""``qwen3-tts release verify``: the pre-deploy gate. Fail closed; report every failed check by id.

Checks (ids are stable; scripts and the gate-result JSON use them):

* ``reference.pinned``     the image is named by digest (``IMAGE@sha256:...``); tags are refused
* ``manifest.digest``      the bytes the registry serves for that digest hash to it
* ``index.platforms``      the index holds exactly the expected platforms, each config agreeing
* ``signature.image``      a cosign ``sign/v1`` statement about this digest verifies for the expected
                           identity and issuer (keyless) or the configured public key
* ``attestation.sbom``     a signed CycloneDX attestation about this digest is present
* ``attestation.model``    a signed model-manifest attestation about this digest equals the pin
* ``provenance``           BuildKit SLSA provenance, when present, has BuildKit's build type, names the
                           expected builder, source repository and commit, and carries no credential
                           or private host path
* ``tags.resolve``         each ``--tag`` still resolves to this digest (no tag drift)

A check that cannot run because an earlier one failed is reported as ``skip``; the gate then fails anyway.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec
from sigstore.errors import Error as SigstoreError
from sigstore.models import Bundle
from sigstore.verify import Verifier, policy

from ..engine.identity import ManifestError, ModelManifest
from .attest import (
    BUILDKIT_BUILD_TYPES,
    COSIGN_SIGN_PREDICATE,
    CYCLONEDX_PREDICATE,
    MODEL_MANIFEST_PREDICATE,
    PROVENANCE_PREDICATES,
    AttestationError,
    Statement,
    find_credential_leaks,
    normalize_repository,
    parse_provenance,
    parse_statement,
)
from .keypair import DSSE_ENVELOPE, KeyPairError, key_id, verify_envelope
from .oci import (
    IN_TOTO,
    INDEX_TYPES,
    Descriptor,
    OciError,
    Platform,
    index_manifests,
    is_attestation_manifest,
    parse_json_document,
)
from .referrers import SIGSTORE_BUNDLE, FoundSignature, discover
from .registry import ImageReference, RegistryClient, RegistryError
from .trust import TrustSource

GITHUB_ISSUER = "https://token.actions.githubusercontent.com"
RESULT_SCHEMA = "qwen3-tts-native/gate-result/v1"

CHECK_REFERENCE = "reference.pinned"
CHECK_MANIFEST = "manifest.digest"
CHECK_PLATFORMS = "index.platforms"
CHECK_SIGNATURE = "signature.image"
CHECK_SBOM = "attestation.sbom"
CHECK_MODEL = "attestation.model"
CHECK_PROVENANCE = "provenance"
CHECK_TAGS = "tags.resolve"
PASS, FAIL, SKIP = "pass", "fail", "skip"
_SIGNED_PREDICATES = frozenset({COSIGN_SIGN_PREDICATE, CYCLONEDX_PREDICATE, MODEL_MANIFEST_PREDICATE})


@dataclass(frozen=True)
class KeylessIdentity:
    """Who must have signed: a CI workflow at a ref, vouched for by an OIDC issuer (Fulcio extensions)."""

    workflow: str
    ref: str
    issuer: str = GITHUB_ISSUER
    commit: str | None = None

    @property
    def identity(self) -> str:
        """The certificate SAN Fulcio writes for a GitHub workflow: ``<workflow URI>@<ref>``."""
        return f"{self.workflow}@{self.ref}"

    @property
    def repository(self) -> str:
        return self.workflow.split("/.github/workflows/", 1)[0]

    def policy(self) -> policy.AllOf:
        checks: list[policy.VerificationPolicy] = [
            policy.Identity(identity=self.identity, issuer=self.issuer),
            policy.OIDCSourceRepositoryURI(self.repository),
            policy.OIDCSourceRepositoryRef(self.ref),
        ]
        if self.commit:
            checks.append(policy.OIDCSourceRepositoryDigest(self.commit))
        return policy.AllOf(checks)


@dataclass(frozen=True)
class GatePolicy:
    """What a release must satisfy. Exactly one of ``identity`` (with ``trust``) and ``public_key``."""

    platforms: tuple[Platform, ...]
    model_pins: tuple[ModelManifest, ...]
    identity: KeylessIdentity | None = None
    trust: TrustSource | None = None
    public_key: ec.EllipticCurvePublicKey | None = None
    builder_id_prefix: str | None = None
    source_repository: str | None = None
    source_commit: str | None = None
    tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (self.identity is None) == (self.public_key is None):
            raise ValueError("configure exactly one of a keyless identity and a public key")
        if self.identity is not None and self.trust is None:
            raise ValueError("a keyless identity needs a trust configuration")
        if not self.platforms:
            raise ValueError("expect at least one platform")
        if not self.model_pins:
            raise ValueError("no model pin to compare the model attestation with")

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "platforms": [str(p) for p in self.platforms],
            "model_pins": [f"{m.repository}@{m.revision}" for m in self.model_pins],
            "tags": list(self.tags),
        }
        if self.identity is not None:
            out["keyless"] = {
                "identity": self.identity.identity,
                "issuer": self.identity.issuer,
                "source_repository": self.identity.repository,
                "ref": self.identity.ref,
                "commit": self.identity.commit,
            }
        if self.public_key is not None:
            out["public_key_id"] = key_id(self.public_key)
        out["provenance"] = {
            "builder_id_prefix": self.expected_builder_prefix(),
            "source_repository": self.expected_source_repository(),
            "commit": self.expected_commit(),
        }
        return out

    def expected_source_repository(self) -> str | None:
        repo = self.source_repository or (self.identity.repository if self.identity else None)
        return normalize_repository(repo) if repo else None

    def expected_commit(self) -> str | None:
        return self.source_commit or (self.identity.commit if self.identity else None)

    def expected_builder_prefix(self) -> str | None:
        if self.builder_id_prefix:
            return self.builder_id_prefix
        repo = self.source_repository or (self.identity.repository if self.identity else None)
        return f"{repo.rstrip('/')}/actions/runs/" if repo else None


@dataclass
class CheckResult:
    id: str
    status: str
    detail: str

    def to_json(self) -> dict[str, str]:
        return {"id": self.id, "status": self.status, "detail": self.detail}


@dataclass
class GateResult:
    image: str
    digest: str | None
    policy: dict[str, Any]
    trust_root: str | None
    checks: list[CheckResult] = field(default_factory=list)
    verified: dict[str, str] = field(default_factory=dict)
    checked_at: str = field(default_factory=lambda: datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))

    @property
    def passed(self) -> bool:
        return (
            bool(self.checks)
            and all(c.status != FAIL for c in self.checks)
            and all(c.status == PASS for c in self.checks if c.id != CHECK_PROVENANCE)
        )

    @property
    def failed(self) -> list[str]:
        return [c.id for c in self.checks if c.status == FAIL]

    def add(self, check_id: str, status: str, detail: str) -> None:
        self.checks.append(CheckResult(check_id, status, detail))

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": RESULT_SCHEMA,
            "image": self.image,
            "digest": self.digest,
            "passed": self.passed,
            "failed": self.failed,
            "checks": [c.to_json() for c in self.checks],
            "verified_referrers": dict(sorted(self.verified.items())),
            "trust_root": self.trust_root,
            "policy": self.policy,
            "checked_at": self.checked_at,
        }


# --- signature verification ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Verified:
    referrer: str
    statement: Statement


class _SignatureVerifier:
    """Verifies found signature blobs under the policy and parses their statements."""

    def __init__(self, gate_policy: GatePolicy) -> None:
        self._public_key = gate_policy.public_key
        self._sigstore: tuple[Verifier, policy.AllOf] | None = None
        if gate_policy.identity is not None and gate_policy.trust is not None:
            verifier = Verifier(trusted_root=gate_policy.trust.config.trusted_root)
            self._sigstore = (verifier, gate_policy.identity.policy())

    def verify(self, found: FoundSignature) -> Statement:
        if found.media_type == SIGSTORE_BUNDLE:
            if self._sigstore is None:
                raise AttestationError("a Sigstore bundle, but the policy trusts only a public key")
            verifier, identity_policy = self._sigstore
            try:
                payload_type, payload = verifier.verify_dsse(Bundle.from_json(found.content), identity_policy)
            except (SigstoreError, ValueError) as exc:
                raise AttestationError(f"Sigstore verification failed: {exc}") from exc
        elif found.media_type == DSSE_ENVELOPE:
            if self._public_key is None:
                raise AttestationError("a key-pair DSSE envelope, but the policy is keyless")
            try:
                payload_type, payload = verify_envelope(self._public_key, found.content)
            except KeyPairError as exc:
                raise AttestationError(str(exc)) from exc
        else:
            raise AttestationError(f"unknown signature format {found.media_type}")
        return parse_statement(payload, payload_type)


# --- the gate ------------------------------------------------------------------------------------


def run_gate(client: RegistryClient, image: ImageReference, gate_policy: GatePolicy) -> GateResult:
    """Run every check against ``image``; never raises for registry content, only records failures."""
    result = GateResult(
        image=str(image),
        digest=image.digest,
        policy=gate_policy.describe(),
        trust_root=gate_policy.trust.description if gate_policy.trust else None,
    )
    later = (CHECK_MANIFEST, CHECK_PLATFORMS, CHECK_SIGNATURE, CHECK_SBOM, CHECK_MODEL, CHECK_PROVENANCE)
    if image.digest is None:
        result.add(CHECK_REFERENCE, FAIL, _tag_refusal(client, image))
        for check_id in later:
            result.add(check_id, SKIP, "not checked: the image is not pinned by digest")
        _check_tags(client, image, None, gate_policy, result)
        return result
    digest = image.digest
    result.add(CHECK_REFERENCE, PASS, f"pinned by digest {digest}")

    try:
        manifest = client.get_manifest(image.repository, digest)
    except RegistryError as exc:
        result.add(CHECK_MANIFEST, FAIL, str(exc))
        for check_id in later[1:]:
            result.add(check_id, SKIP, "not checked: the manifest could not be fetched and verified")
        _check_tags(client, image, digest, gate_policy, result)
        return result
    result.add(CHECK_MANIFEST, PASS, f"{len(manifest.data)} bytes of {manifest.media_type} hash to {digest}")

    entries = _check_platforms(client, image, manifest.media_type, manifest.data, gate_policy, result)
    _check_signatures(client, image, digest, gate_policy, result)
    _check_provenance(client, image, entries, gate_policy, result)
    _check_tags(client, image, digest, gate_policy, result)
    return result


def _tag_refusal(client: RegistryClient, image: ImageReference) -> str:
    detail = f"{image} names a tag, which can be moved; pass IMAGE@sha256:<digest>"
    try:
        current = client.head_manifest(image.repository, image.reference)
    except RegistryError:
        current = None
    if current is not None:
        detail += f" (the tag currently resolves to {current.digest})"
    return detail


def _check_platforms(
    client: RegistryClient,
    image: ImageReference,
    media_type: str,
    data: bytes,
    gate_policy: GatePolicy,
    result: GateResult,
) -> list[Descriptor]:
    if media_type not in INDEX_TYPES:
        result.add(CHECK_PLATFORMS, FAIL, f"{media_type} is not an image index; a release is multi-platform")
        return []
    try:
        entries = index_manifests(parse_json_document(data, "image index"))
    except OciError as exc:
        result.add(CHECK_PLATFORMS, FAIL, str(exc))
        return []
    images = [e for e in entries if not is_attestation_manifest(e)]
    found = {str(e.platform) for e in images if e.platform is not None}
    expected = {str(p) for p in gate_policy.platforms}
    problems = []
    if missing := sorted(expected - found):
        problems.append(f"missing {', '.join(missing)}")
    if extra := sorted(found - expected):
        problems.append(f"unexpected {', '.join(extra)}")
    if len(images) != len(found):
        problems.append("platform entries without a platform or listed twice")
    for entry in images:
        problems.extend(_config_mismatch(client, image, entry))
    if problems:
        result.add(CHECK_PLATFORMS, FAIL, "; ".join(problems))
    else:
        result.add(CHECK_PLATFORMS, PASS, f"exactly {', '.join(sorted(found))}; configs agree")
    return entries


def _config_mismatch(client: RegistryClient, image: ImageReference, entry: Descriptor) -> list[str]:
    try:
        manifest = client.get_manifest(image.repository, entry.digest).json()
        config_desc = Descriptor.from_json(manifest.get("config") or {})
        config = parse_json_document(client.get_blob(image.repository, config_desc.digest), "image config")
    except (RegistryError, OciError) as exc:
        return [f"{entry.platform}: {exc}"]
    actual = Platform(str(config.get("os")), str(config.get("architecture")), config.get("variant"))
    if entry.platform is not None and (actual.os, actual.architecture) != (
        entry.platform.os,
        entry.platform.architecture,
    ):
        return [f"index says {entry.platform} but the image config of {entry.digest} says {actual}"]
    return []


def _check_signatures(
    client: RegistryClient, image: ImageReference, digest: str, gate_policy: GatePolicy, result: GateResult
) -> None:
    try:
        found, problems = discover(client, image.repository, digest)
    except RegistryError as exc:
        for check_id in (CHECK_SIGNATURE, CHECK_SBOM, CHECK_MODEL):
            result.add(check_id, FAIL, f"could not list referrers: {exc}")
        return
    verifier = _SignatureVerifier(gate_policy)
    verified: dict[str, list[_Verified]] = {}
    rejected: dict[str | None, list[str]] = {None: list(problems)}
    for item in found:
        try:
            statement = verifier.verify(item)
        except AttestationError as exc:
            claimed = (
                item.claimed_predicate_type if item.claimed_predicate_type in _SIGNED_PREDICATES else None
            )
            rejected.setdefault(claimed, []).append(f"{item.referrer}: {exc}")
            continue
        if digest not in statement.subject_digests:
            subjects = ", ".join(sorted(statement.subject_digests))
            claimed = statement.predicate_type if statement.predicate_type in _SIGNED_PREDICATES else None
            rejected.setdefault(claimed, []).append(
                f"{item.referrer}: signed statement is about {subjects}, not {digest}"
            )
            continue
        verified.setdefault(statement.predicate_type, []).append(_Verified(item.referrer, statement))

    def why(predicate_type: str) -> str:
        reasons = rejected.get(predicate_type, []) + rejected[None]
        if not found:
            reasons.append(f"no signature referrers found for {digest}")
        return f": {' | '.join(reasons)}" if reasons else ": none attached"

    sigs = verified.get(COSIGN_SIGN_PREDICATE, [])
    if sigs:
        result.verified[COSIGN_SIGN_PREDICATE] = sigs[0].referrer
        result.add(CHECK_SIGNATURE, PASS, f"{_signer(gate_policy)} signed {digest} ({sigs[0].referrer})")
    else:
        result.add(
            CHECK_SIGNATURE,
            FAIL,
            f"no cosign sign/v1 signature about {digest} verifies for {_signer(gate_policy)}"
            + why(COSIGN_SIGN_PREDICATE),
        )

    sboms = [
        v
        for v in verified.get(CYCLONEDX_PREDICATE, [])
        if v.statement.predicate.get("bomFormat") == "CycloneDX"
    ]
    if sboms:
        result.verified[CYCLONEDX_PREDICATE] = sboms[0].referrer
        spec = sboms[0].statement.predicate.get("specVersion")
        result.add(CHECK_SBOM, PASS, f"signed CycloneDX {spec} SBOM ({sboms[0].referrer})")
    else:
        result.add(
            CHECK_SBOM,
            FAIL,
            f"no signed CycloneDX SBOM attestation about {digest} verifies" + why(CYCLONEDX_PREDICATE),
        )

    _check_model(
        verified.get(MODEL_MANIFEST_PREDICATE, []), gate_policy, result, why(MODEL_MANIFEST_PREDICATE)
    )


def _signer(gate_policy: GatePolicy) -> str:
    if gate_policy.identity is not None:
        return f"{gate_policy.identity.identity} (issuer {gate_policy.identity.issuer})"
    assert gate_policy.public_key is not None
    return f"public key {key_id(gate_policy.public_key)[:16]}"


def _check_model(candidates: list[_Verified], gate_policy: GatePolicy, result: GateResult, why: str) -> None:
    if not candidates:
        result.add(CHECK_MODEL, FAIL, "no signed model-manifest attestation about this digest verifies" + why)
        return
    problems = []
    for candidate in candidates:
        try:
            attested = ModelManifest.from_json(candidate.statement.predicate, source="model attestation")
        except ManifestError as exc:
            problems.append(f"{candidate.referrer}: {exc}")
            continue
        pin = next((p for p in gate_policy.model_pins if p.repository == attested.repository), None)
        if pin is None:
            problems.append(f"{candidate.referrer}: no pin for model repository {attested.repository}")
            continue
        differences = _manifest_differences(attested, pin)
        if not differences:
            result.verified[MODEL_MANIFEST_PREDICATE] = candidate.referrer
            result.add(
                CHECK_MODEL,
                PASS,
                f"signed model manifest equals the pin {pin.repository}@{pin.revision} "
                f"(sha256:{_manifest_hash(pin)[:16]}...)",
            )
            return
        problems.append(
            f"{candidate.referrer}: attested manifest sha256:{_manifest_hash(attested)[:16]}... differs "
            f"from the pin sha256:{_manifest_hash(pin)[:16]}...: {'; '.join(differences)}"
        )
    result.add(CHECK_MODEL, FAIL, " | ".join(problems))


def _manifest_hash(manifest: ModelManifest) -> str:
    return hashlib.sha256(manifest.dumps().encode()).hexdigest()


def _manifest_differences(attested: ModelManifest, pin: ModelManifest) -> list[str]:
    out = []
    if attested.revision != pin.revision:
        out.append(f"revision {attested.revision} != {pin.revision}")
    attested_files = {f.path: f for f in attested.files}
    pinned_files = {f.path: f for f in pin.files}
    for path in sorted(attested_files.keys() | pinned_files.keys()):
        a, p = attested_files.get(path), pinned_files.get(path)
        if a is None or p is None:
            out.append(f"{path} {'missing from the attestation' if a is None else 'not in the pin'}")
        elif a != p:
            out.append(f"{path} differs (sha256 {a.sha256} vs {p.sha256}, {a.bytes} vs {p.bytes} bytes)")
    if not out and attested.to_json() != pin.to_json():
        out.append("component counts or license differ")
    return out


def _check_provenance(
    client: RegistryClient,
    image: ImageReference,
    entries: list[Descriptor],
    gate_policy: GatePolicy,
    result: GateResult,
) -> None:
    platform_digests = {e.digest for e in entries if not is_attestation_manifest(e)}
    statements: list[tuple[str, Statement]] = []
    problems: list[str] = []
    for entry in (e for e in entries if is_attestation_manifest(e)):
        try:
            manifest = client.get_manifest(image.repository, entry.digest).json()
            for layer in manifest.get("layers") or []:
                desc = Descriptor.from_json(layer)
                if desc.annotations.get("in-toto.io/predicate-type") not in PROVENANCE_PREDICATES:
                    continue
                statement = parse_statement(client.get_blob(image.repository, desc.digest), IN_TOTO)
                statements.append((entry.digest, statement))
        except (RegistryError, OciError, AttestationError) as exc:
            problems.append(f"attestation manifest {entry.digest}: {exc}")
    if not statements and not problems:
        result.add(
            CHECK_PROVENANCE, SKIP, "no BuildKit provenance in the index (buildx adds it with --provenance)"
        )
        return
    repo, commit, builder = (
        gate_policy.expected_source_repository(),
        gate_policy.expected_commit(),
        gate_policy.expected_builder_prefix(),
    )
    for where, statement in statements:
        label = f"{statement.predicate_type} in {where}"
        if not statement.subject_digests & platform_digests:
            problems.append(f"{label}: its subject is none of the index's platform manifests")
        try:
            prov = parse_provenance(statement)
        except AttestationError as exc:
            problems.append(f"{label}: {exc}")
            continue
        if prov.build_type not in BUILDKIT_BUILD_TYPES:
            problems.append(f"{label}: build type {prov.build_type!r} is not BuildKit's")
        if builder is None or not prov.builder_id.startswith(builder):
            problems.append(f"{label}: builder {prov.builder_id!r} is not the expected {builder!r}")
        if repo is None or prov.source_repository != repo:
            problems.append(f"{label}: source repository {prov.source_repository!r} is not {repo!r}")
        if commit is None or prov.source_revision != commit:
            problems.append(f"{label}: source commit {prov.source_revision!r} is not {commit!r}")
        problems.extend(f"{label}: {leak}" for leak in find_credential_leaks(statement.predicate))
    if problems:
        result.add(CHECK_PROVENANCE, FAIL, "; ".join(problems))
    else:
        result.add(
            CHECK_PROVENANCE,
            PASS,
            f"{len(statements)} provenance statement(s): builder {builder}*, {repo} at {commit}, "
            "no credentials",
        )


def _check_tags(
    client: RegistryClient,
    image: ImageReference,
    digest: str | None,
    gate_policy: GatePolicy,
    result: GateResult,
) -> None:
    if not gate_policy.tags:
        return
    if digest is None:
        result.add(CHECK_TAGS, SKIP, "not checked: the image is not pinned by digest")
        return
    problems, good = [], []
    for tag in gate_policy.tags:
        try:
            current = client.head_manifest(image.repository, tag)
        except RegistryError as exc:
            problems.append(f"{tag}: {exc}")
            continue
        if current is None:
            problems.append(f"{tag} does not exist")
        elif current.digest != digest:
            problems.append(f"tag drift: {tag} now resolves to {current.digest}, not {digest}")
        else:
            good.append(tag)
    if problems:
        result.add(CHECK_TAGS, FAIL, "; ".join(problems))
    else:
        result.add(CHECK_TAGS, PASS, f"{', '.join(good)} resolve to {digest}")


def write_result(result: GateResult, path: str) -> None:
    """Write the gate result as JSON (stable key order) for the release record."""
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(result.to_json(), handle, indent=2, sort_keys=True)
        handle.write("\n")


def summarize(result: GateResult) -> str:
    lines = [f"gate {'PASSED' if result.passed else 'FAILED'} for {result.image}"]
    lines += [f"  [{c.status.upper():4}] {c.id}: {c.detail}" for c in result.checks]
    return "\n".join(lines)

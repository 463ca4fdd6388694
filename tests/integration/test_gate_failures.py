"""The deploy gate fails closed, naming the failed check, for each way a release can be wrong.

Images come from the pure-Python writer (instant, deterministic) and live in the real loopback registry;
signatures come from the production signing code against the in-process test Sigstore.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from release_harness import *  # noqa: F403  (the release test fixtures)
from release_harness import COMMIT, REF, REPOSITORY, WORKFLOW_URI, minimal_sbom, unique_repository
from sigstore.models import ClientTrustConfig
from sigstore_fake import FakeSigstore

from qwen3_tts_native.cli import main
from qwen3_tts_native.engine.identity import load_manifest, shipped_manifests
from qwen3_tts_native.release.attest import SLSA_V1_PREDICATE
from qwen3_tts_native.release.gate import GatePolicy, GateResult, KeylessIdentity, run_gate
from qwen3_tts_native.release.oci import (
    IN_TOTO,
    OCI_CONFIG,
    OCI_INDEX,
    OCI_MANIFEST,
    UNKNOWN_PLATFORM,
    Descriptor,
    Platform,
    build_image,
    canonical_json,
    image_index,
)
from qwen3_tts_native.release.promote import PromotionError, promote
from qwen3_tts_native.release.referrers import SIGSTORE_BUNDLE
from qwen3_tts_native.release.registry import ImageReference, RegistryClient, referrers_tag
from qwen3_tts_native.release.sign import KeyPairSigner, sign_release, sigstore_signer
from qwen3_tts_native.release.trust import load_trust_config

pytestmark = pytest.mark.integration

PLATFORMS = [Platform.parse("linux/amd64"), Platform.parse("linux/arm64")]
BUILDER = f"https://github.com/{REPOSITORY}/actions/runs/4242/attempts/1"


@pytest.fixture(scope="module")
def client(registry_address: str) -> RegistryClient:
    return RegistryClient(registry_address)


@pytest.fixture(scope="module")
def pin_json(model_pin: Path) -> dict[str, Any]:
    return load_manifest(model_pin).to_json()


def push(
    client: RegistryClient,
    repository: str,
    content: str,
    extra_manifests: list[tuple[Descriptor, bytes]] | None = None,
    extra_blobs: dict[str, bytes] | None = None,
) -> ImageReference:
    """Push a tiny two-platform image under ``rc`` and return it pinned by digest."""
    layout = build_image({"opt/release.txt": content.encode()}, PLATFORMS, extra_manifests=extra_manifests)
    layout.blobs.update(extra_blobs or {})
    index = client.push_layout(repository, layout, "rc")
    return ImageReference(client.registry, repository, None, index.digest)


def sign_keyless(
    client: RegistryClient,
    image: ImageReference,
    fake: FakeSigstore,
    ambient_identity: Callable[..., None],
    *,
    sbom: dict[str, Any] | None,
    model: dict[str, Any] | None,
    **claims: Any,
) -> None:
    ambient_identity(fake, **claims)
    trust = ClientTrustConfig.from_json(json.dumps(fake.trust_config()))
    with sigstore_signer(trust) as signer:
        sign_release(client, image, signer, sbom=sbom, model_manifest=model)


def keyless_policy(trust_config: Path, **overrides: Any) -> GatePolicy:
    settings: dict[str, Any] = {
        "platforms": tuple(PLATFORMS),
        "model_pins": tuple(shipped_manifests()),
        "identity": KeylessIdentity(WORKFLOW_URI, REF, commit=COMMIT),
        "trust": load_trust_config(trust_config),
    }
    settings.update(overrides)
    return GatePolicy(**settings)


def statuses(result: GateResult) -> dict[str, str]:
    return {c.id: c.status for c in result.checks}


def detail(result: GateResult, check_id: str) -> str:
    return next(c.detail for c in result.checks if c.id == check_id)


@pytest.fixture(scope="module")
def good_release(
    client: RegistryClient, fake_sigstore: FakeSigstore, pin_json: dict[str, Any]
) -> ImageReference:
    """A correctly signed release that later tests tamper with in their own repositories."""
    image = push(client, unique_repository("gate-good"), "good release")
    with pytest.MonkeyPatch.context() as patch:
        claims = FakeSigstore.github_claims(REPOSITORY, "release.yml", REF, COMMIT)
        for key, value in fake_sigstore.ambient_env(claims).items():
            patch.setenv(key, value)
        trust = ClientTrustConfig.from_json(json.dumps(fake_sigstore.trust_config()))
        with sigstore_signer(trust) as signer:
            sign_release(client, image, signer, sbom=minimal_sbom(), model_manifest=pin_json)
    return image


def test_good_release_passes(
    client: RegistryClient, good_release: ImageReference, trust_config: Path
) -> None:
    result = run_gate(client, good_release, keyless_policy(trust_config))
    assert result.passed, result.to_json()


def test_tag_instead_of_digest_is_refused(
    good_release: ImageReference, trust_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "gate.json"
    code = main(
        [
            "release",
            "verify",
            str(good_release.with_tag("rc")),
            "--certificate-workflow",
            WORKFLOW_URI,
            "--certificate-ref",
            REF,
            "--trust-config",
            str(trust_config),
            "--output",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    assert code == 1
    result = json.loads(out.read_text())
    assert result["failed"] == ["reference.pinned"] and not result["passed"]
    assert "names a tag" in printed and str(good_release.digest) in printed  # says where the tag points now
    assert {c["status"] for c in result["checks"] if c["id"] != "reference.pinned"} == {"skip"}


def test_tag_drift_fails_gate_and_promotion(
    client: RegistryClient,
    fake_sigstore: FakeSigstore,
    ambient_identity: Callable[..., None],
    trust_config: Path,
    pin_json: dict[str, Any],
) -> None:
    repository = unique_repository("gate-drift")
    image = push(client, repository, "release candidate")
    sign_keyless(client, image, fake_sigstore, ambient_identity, sbom=minimal_sbom(), model=pin_json)
    push(client, repository, "someone re-pushed rc")  # the tag now names another index
    policy = keyless_policy(trust_config, tags=("rc",))
    result = run_gate(client, image, policy)
    assert result.failed == ["tags.resolve"]
    assert "tag drift: rc now resolves to" in detail(result, "tags.resolve")
    with pytest.raises(PromotionError, match=r"tags\.resolve"):
        promote(client, image, "v1.0.0", policy)
    assert client.head_manifest(repository, "v1.0.0") is None
    assert client.head_manifest(repository, "latest") is None


@pytest.mark.parametrize(
    ("claims", "reason"),
    [
        ({"job_workflow_ref": f"{REPOSITORY}/.github/workflows/nightly.yml@{REF}"}, "SANs do not match"),
        ({"iss": "https://token.example.invalid"}, "OIDCIssuer"),
        ({"ref": "refs/heads/feature"}, "OIDCSourceRepositoryRef does not match"),
        ({"sha": "f" * 40}, "OIDCSourceRepositoryDigest does not match"),
    ],
    ids=["other-identity", "other-issuer", "other-ref", "other-commit"],
)
def test_signature_by_wrong_signer_fails(
    client: RegistryClient,
    fake_sigstore: FakeSigstore,
    ambient_identity: Callable[..., None],
    trust_config: Path,
    pin_json: dict[str, Any],
    claims: dict[str, str],
    reason: str,
) -> None:
    image = push(client, unique_repository("gate-signer"), f"signed with {claims}")
    sign_keyless(
        client, image, fake_sigstore, ambient_identity, sbom=minimal_sbom(), model=pin_json, **claims
    )
    result = run_gate(client, image, keyless_policy(trust_config))
    # Every statement was signed by the wrong signer, so all three signed checks fail, and all are reported.
    assert result.failed == ["signature.image", "attestation.sbom", "attestation.model"]
    assert reason in detail(result, "signature.image")


def test_foreign_trust_root_fails(
    client: RegistryClient,
    foreign_sigstore: FakeSigstore,
    ambient_identity: Callable[..., None],
    trust_config: Path,
    pin_json: dict[str, Any],
) -> None:
    image = push(client, unique_repository("gate-foreign"), "signed by another Sigstore")
    sign_keyless(client, image, foreign_sigstore, ambient_identity, sbom=minimal_sbom(), model=pin_json)
    result = run_gate(client, image, keyless_policy(trust_config))
    assert "signature.image" in result.failed
    assert "certificate chain" in detail(result, "signature.image")


def test_tampered_sbom_fails(
    client: RegistryClient,
    fake_sigstore: FakeSigstore,
    ambient_identity: Callable[..., None],
    trust_config: Path,
    pin_json: dict[str, Any],
) -> None:
    image = push(client, unique_repository("gate-sbom"), "sbom will be tampered with")
    sign_keyless(client, image, fake_sigstore, ambient_identity, sbom=minimal_sbom(), model=pin_json)
    assert image.digest is not None
    referrers = client.referrers(image.repository, image.digest)
    sbom_ref = next(
        d for d in referrers if d.annotations.get("in-toto.io/predicate-type") == "https://cyclonedx.org/bom"
    )
    manifest = client.get_manifest(image.repository, sbom_ref.digest).json()
    layer = manifest["layers"][0]
    bundle = json.loads(client.get_blob(image.repository, layer["digest"]))
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    statement["predicate"]["components"][0]["version"] = "0.0.1-backdoored"
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(canonical_json(statement)).decode()
    tampered = json.dumps(bundle).encode()
    layer_digest = client.upload_blob(image.repository, tampered)
    manifest["layers"][0] = {**layer, "digest": layer_digest, "size": len(tampered)}
    manifest_bytes = canonical_json(manifest)
    new = client.put_manifest(
        image.repository,
        Descriptor.for_bytes(OCI_MANIFEST, manifest_bytes).digest,
        manifest_bytes,
        OCI_MANIFEST,
    )
    swapped = [
        Descriptor(
            new.media_type,
            new.digest,
            new.size,
            annotations=sbom_ref.annotations,
            artifact_type=SIGSTORE_BUNDLE,
        )
        if d.digest == sbom_ref.digest
        else d
        for d in referrers
    ]
    client.put_manifest(image.repository, referrers_tag(image.digest), image_index(swapped), OCI_INDEX)

    result = run_gate(client, image, keyless_policy(trust_config))
    assert result.failed == ["attestation.sbom"]
    assert "signature" in detail(result, "attestation.sbom").lower()


def test_model_manifest_differing_from_pin_fails(
    client: RegistryClient,
    fake_sigstore: FakeSigstore,
    ambient_identity: Callable[..., None],
    trust_config: Path,
    pin_json: dict[str, Any],
) -> None:
    other = json.loads(json.dumps(pin_json))
    weights = next(f for f in other["files"] if f["path"] == "model.safetensors")
    weights["sha256"] = "0" * 64
    image = push(client, unique_repository("gate-model"), "other weights")
    sign_keyless(client, image, fake_sigstore, ambient_identity, sbom=minimal_sbom(), model=other)
    result = run_gate(client, image, keyless_policy(trust_config))
    assert result.failed == ["attestation.model"]
    assert "model.safetensors differs" in detail(result, "attestation.model")


def test_missing_attestations_fail(
    client: RegistryClient,
    fake_sigstore: FakeSigstore,
    ambient_identity: Callable[..., None],
    trust_config: Path,
) -> None:
    image = push(client, unique_repository("gate-missing"), "signature only")
    sign_keyless(client, image, fake_sigstore, ambient_identity, sbom=None, model=None)
    result = run_gate(client, image, keyless_policy(trust_config))
    assert result.failed == ["attestation.sbom", "attestation.model"]
    assert statuses(result)["signature.image"] == "pass"


def test_unexpected_platforms_fail(
    client: RegistryClient, good_release: ImageReference, trust_config: Path
) -> None:
    result = run_gate(
        client, good_release, keyless_policy(trust_config, platforms=(Platform.parse("linux/arm64"),))
    )
    assert result.failed == ["index.platforms"]
    assert "unexpected linux/amd64" in detail(result, "index.platforms")


def test_key_pair_policy_rejects_other_keys_and_keyless_bundles(
    client: RegistryClient, good_release: ImageReference, pin_json: dict[str, Any]
) -> None:
    image = push(client, unique_repository("gate-keys"), "key-pair release")
    sign_release(
        client,
        image,
        KeyPairSigner(ec.generate_private_key(ec.SECP256R1())),
        sbom=minimal_sbom(),
        model_manifest=pin_json,
    )
    stranger = ec.generate_private_key(ec.SECP256R1()).public_key()
    policy = GatePolicy(
        platforms=tuple(PLATFORMS), model_pins=tuple(shipped_manifests()), public_key=stranger
    )
    result = run_gate(client, image, policy)
    assert result.failed == ["signature.image", "attestation.sbom", "attestation.model"]
    assert "no signature in the envelope verifies" in detail(result, "signature.image")
    keyless_only = run_gate(client, good_release, policy)
    assert "policy trusts only a public key" in detail(keyless_only, "signature.image")


def _provenance(platform_digest: str, *, leaky: bool) -> dict[str, Any]:
    args = {"build-arg:VERSION": "v1.0.0"}
    path = "Containerfile"
    if leaky:
        args["build-arg:HF_TOKEN"] = "hf_abcdefghijklmnopqrstuvwxyz"
        path = "/home/runner/work/qwen3-tts-native/Containerfile"
    return {
        "_type": "https://in-toto.io/Statement/v0.1",
        "predicateType": SLSA_V1_PREDICATE,
        "subject": [
            {"name": "pkg:docker/acme/gate-prov", "digest": {"sha256": platform_digest.split(":")[1]}}
        ],
        "predicate": {
            "buildDefinition": {
                "buildType": "https://github.com/moby/buildkit/blob/master/docs/attestations/slsa-definitions.md",
                "externalParameters": {
                    "configSource": {
                        "uri": f"https://github.com/{REPOSITORY}.git#{REF}",
                        "digest": {"sha1": COMMIT},
                        "path": path,
                    },
                    "request": {
                        "frontend": "dockerfile.v0",
                        "args": args,
                        "secrets": [{"id": "GIT_AUTH_TOKEN", "optional": True}],
                    },
                },
                "internalParameters": {"builderPlatform": "linux/amd64"},
                "resolvedDependencies": [],
            },
            "runDetails": {
                "builder": {"id": BUILDER},
                "metadata": {
                    "buildkit_metadata": {
                        "vcs": {"source": f"https://github.com/{REPOSITORY}", "revision": COMMIT}
                    }
                },
            },
        },
    }


def _with_provenance(client: RegistryClient, repository: str, content: str, *, leaky: bool) -> ImageReference:
    """An index like buildx makes: platform manifests plus one unknown/unknown attestation manifest."""
    plain = build_image({"opt/release.txt": content.encode()}, PLATFORMS)
    first = next(iter(plain.manifests))
    statement = canonical_json(_provenance(first, leaky=leaky))
    layer = Descriptor.for_bytes(
        IN_TOTO, statement, annotations={"in-toto.io/predicate-type": SLSA_V1_PREDICATE}
    )
    config = canonical_json(
        {"architecture": "unknown", "os": "unknown", "rootfs": {"type": "layers", "diff_ids": []}}
    )
    manifest = canonical_json(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": Descriptor.for_bytes(OCI_CONFIG, config).to_json(),
            "layers": [layer.to_json()],
        }
    )
    attestation = Descriptor.for_bytes(
        OCI_MANIFEST,
        manifest,
        platform=UNKNOWN_PLATFORM,
        annotations={
            "vnd.docker.reference.type": "attestation-manifest",
            "vnd.docker.reference.digest": first,
        },
    )
    blobs = {layer.digest: statement, Descriptor.for_bytes(OCI_CONFIG, config).digest: config}
    return push(client, repository, content, [(attestation, manifest)], blobs)


@pytest.mark.parametrize("leaky", [False, True], ids=["clean", "leaky"])
def test_provenance_is_checked_when_present(
    client: RegistryClient,
    fake_sigstore: FakeSigstore,
    ambient_identity: Callable[..., None],
    trust_config: Path,
    pin_json: dict[str, Any],
    leaky: bool,
) -> None:
    image = _with_provenance(
        client, unique_repository("gate-prov"), f"with provenance leaky={leaky}", leaky=leaky
    )
    sign_keyless(client, image, fake_sigstore, ambient_identity, sbom=minimal_sbom(), model=pin_json)
    result = run_gate(client, image, keyless_policy(trust_config))
    if not leaky:
        assert result.passed, result.to_json()
        assert statuses(result)["provenance"] == "pass"
        return
    assert result.failed == ["provenance"]
    text = detail(result, "provenance")
    assert "HF_TOKEN: credential-like key" in text and "private host path" in text
    wrong_builder = run_gate(
        client, image, keyless_policy(trust_config, builder_id_prefix="https://ci.example/")
    )
    assert "is not the expected 'https://ci.example/'" in detail(wrong_builder, "provenance")

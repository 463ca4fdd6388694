"""End to end on loopback: build (docker SDK -> podman) -> push -> sign (test Sigstore) -> gate -> promote.

Everything runs through the production CLI (`qwen3-tts release ...`); the only test-specific inputs are
the trust configuration of the in-process Sigstore and the GitHub Actions OIDC variables pointing at it.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from release_harness import *  # noqa: F403  (the release test fixtures)
from release_harness import COMMIT, REF, WORKFLOW_URI, minimal_sbom, unique_repository
from sigstore_fake import FakeSigstore

from qwen3_tts_native.cli import main
from qwen3_tts_native.release.build import BuildError, confirm_index
from qwen3_tts_native.release.oci import Platform, build_image
from qwen3_tts_native.release.registry import ImageReference, RegistryClient

pytestmark = pytest.mark.integration

PLATFORMS = ("linux/amd64", "linux/arm64")


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _json_tail(output: str) -> dict:
    """The JSON document a command printed (it is the last top-level object on stdout)."""
    return json.loads(output[output.index("{\n") :])


def _keyless_gate_args(image: str, trust: Path, out: Path) -> list[str]:
    return [
        "release",
        "verify",
        image,
        "--certificate-workflow",
        WORKFLOW_URI,
        "--certificate-ref",
        REF,
        "--commit",
        COMMIT,
        "--trust-config",
        str(trust),
        "--output",
        str(out),
    ]


def test_build_sign_verify_promote_keyless(
    registry_address: str,
    docker_host: str,
    fake_sigstore: FakeSigstore,
    trust_config: Path,
    ambient_identity: Callable[..., None],
    model_pin: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    context = tmp_path / "context"
    context.mkdir()
    (context / "hello.txt").write_text("hello from the release test\n")
    (context / "Containerfile").write_text(
        "FROM scratch\nARG VERSION\nCOPY hello.txt /opt/qwen3-tts/hello.txt\n"
        'LABEL org.opencontainers.image.version="${VERSION}"\n'
    )
    monkeypatch.setenv("DOCKER_HOST", docker_host)
    repository = unique_repository("tts-e2e")
    image = f"{registry_address}/{repository}:rc1"
    code, out = _cli(
        capsys,
        "release",
        "build",
        image,
        "--context",
        str(context),
        "--file",
        str(context / "Containerfile"),
        "--builder",
        "docker-api",
        "--build-arg",
        "VERSION=v1.0.0",
        *[arg for p in PLATFORMS for arg in ("--platform", p)],
    )
    assert code == 0, out
    built = _json_tail(out)
    digest = built["digest"]
    assert set(built["platforms"]) == set(PLATFORMS)
    assert built["builder"] == "docker-api"

    # The digest is what the registry serves: hash the bytes ourselves.
    raw = requests.get(
        f"http://{registry_address}/v2/{repository}/manifests/{digest}",
        headers={
            "Accept": "application/vnd.docker.distribution.manifest.list.v2+json, "
            "application/vnd.oci.image.index.v1+json"
        },
        timeout=10,
    )
    assert "sha256:" + hashlib.sha256(raw.content).hexdigest() == digest

    pinned = f"{registry_address}/{repository}@{digest}"
    sbom = tmp_path / "sbom.cdx.json"
    sbom.write_text(json.dumps(minimal_sbom()))
    ambient_identity(fake_sigstore)
    code, out = _cli(
        capsys,
        "release",
        "sign",
        pinned,
        "--trust-config",
        str(trust_config),
        "--sbom",
        str(sbom),
        "--model-manifest",
        str(model_pin),
    )
    assert code == 0, out
    assert len(_json_tail(out)["attached"]) == 3

    result_path = tmp_path / "gate-result.json"
    code, out = _cli(capsys, *_keyless_gate_args(pinned, trust_config, result_path))
    assert code == 0, out
    result = json.loads(result_path.read_text())
    assert result["passed"] is True and result["digest"] == digest
    statuses = {c["id"]: c["status"] for c in result["checks"]}
    assert statuses == {
        "reference.pinned": "pass",
        "manifest.digest": "pass",
        "index.platforms": "pass",
        "signature.image": "pass",
        "attestation.sbom": "pass",
        "attestation.model": "pass",
        "provenance": "skip",
    }

    code, out = _cli(
        capsys,
        "release",
        "promote",
        pinned,
        "--version",
        "v1.0.0",
        "--certificate-workflow",
        WORKFLOW_URI,
        "--certificate-ref",
        REF,
        "--commit",
        COMMIT,
        "--trust-config",
        str(trust_config),
        "--tag",
        "rc1",
        "--output",
        str(tmp_path / "promotion.json"),
    )
    assert code == 0, out
    client = RegistryClient(registry_address)
    for tag in ("v1.0.0", "latest"):
        head = client.head_manifest(repository, tag)
        assert head is not None and head.digest == digest
    tags = client.list_tags(repository)
    assert {"rc1", "rc1-linux-amd64", "rc1-linux-arm64", "v1.0.0", "latest", digest.replace(":", "-")} <= set(
        tags
    )


def _write_keys(directory: Path) -> tuple[Path, Path, ec.EllipticCurvePublicKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    private = directory / "release.key"
    public = directory / "release.pub"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return private, public, key.public_key()


def test_key_pair_signature_verifies_with_cryptography_alone(
    registry_address: str, model_pin: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    layout = build_image({"opt/hello.txt": b"key-pair release\n"}, [Platform.parse(p) for p in PLATFORMS])
    client = RegistryClient(registry_address)
    repository = unique_repository("tts-key")
    index = client.push_layout(repository, layout, "rc1")
    pinned = f"{registry_address}/{repository}@{index.digest}"
    private, public, public_key = _write_keys(tmp_path)
    sbom = tmp_path / "sbom.cdx.json"
    sbom.write_text(json.dumps(minimal_sbom()))

    code, out = _cli(
        capsys,
        "release",
        "sign",
        pinned,
        "--key",
        str(private),
        "--sbom",
        str(sbom),
        "--model-manifest",
        str(model_pin),
    )
    assert code == 0, out
    code, out = _cli(
        capsys, "release", "verify", pinned, "--public-key", str(public), "--output", str(tmp_path / "g.json")
    )
    assert code == 0, out

    # Independently of our verify code: plain HTTP, the referrers tag index, and `cryptography` only.
    base = f"http://{registry_address}/v2/{repository}"
    accept = {"Accept": "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json"}
    referrers = requests.get(
        f"{base}/manifests/{index.digest.replace(':', '-')}", headers=accept, timeout=10
    ).json()
    predicate_types = set()
    for entry in referrers["manifests"]:
        assert entry["artifactType"] == "application/vnd.dsse.envelope.v1+json"
        manifest = requests.get(f"{base}/manifests/{entry['digest']}", headers=accept, timeout=10).json()
        assert manifest["subject"]["digest"] == index.digest
        envelope = json.loads(
            requests.get(f"{base}/blobs/{manifest['layers'][0]['digest']}", timeout=10).content
        )
        payload = base64.b64decode(envelope["payload"])
        payload_type = envelope["payloadType"].encode()
        pae = b"DSSEv1 %d %s %d %s" % (len(payload_type), payload_type, len(payload), payload)
        signature = base64.b64decode(envelope["signatures"][0]["sig"])
        public_key.verify(signature, pae, ec.ECDSA(hashes.SHA256()))  # raises InvalidSignature if wrong
        statement = json.loads(payload)
        assert statement["subject"][0]["digest"]["sha256"] == index.digest.removeprefix("sha256:")
        predicate_types.add(statement["predicateType"])
    assert predicate_types == {
        "https://sigstore.dev/cosign/sign/v1",
        "https://cyclonedx.org/bom",
        "https://qwen3-tts-native.github.io/attestations/model-manifest/v1",
    }


def test_reported_digest_must_be_what_the_registry_serves(registry_address: str) -> None:
    """`release build` re-reads the tag: a digest the registry does not serve under it is an error."""
    client = RegistryClient(registry_address)
    repository = unique_repository("tts-confirm")
    first = client.push_layout(repository, build_image({"a": b"1"}, [Platform.parse("linux/arm64")]), "rc")
    client.push_layout(repository, build_image({"a": b"2"}, [Platform.parse("linux/arm64")]), "rc")
    image = ImageReference(registry_address, repository, "rc")
    with pytest.raises(BuildError, match="someone else pushed the tag"):
        confirm_index(client, image, first.digest, "docker-api")

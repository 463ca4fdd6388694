"""Statements, BuildKit provenance parsing, the credential scan, and key-pair DSSE envelopes."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from qwen3_tts_native.release.attest import (
    COSIGN_SIGN_PREDICATE,
    SLSA_V02_PREDICATE,
    SLSA_V1_PREDICATE,
    AttestationError,
    Statement,
    find_credential_leaks,
    image_signature_statement,
    normalize_repository,
    parse_provenance,
    parse_statement,
    sbom_statement,
)
from qwen3_tts_native.release.keypair import (
    KeyPairError,
    load_private_key,
    load_public_key,
    pae,
    sign_envelope,
    verify_envelope,
)

DIGEST = "sha256:" + "cd" * 32
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def test_image_signature_statement_is_cosign_sign_v1() -> None:
    statement = parse_statement(image_signature_statement("ghcr.io/acme/tts", DIGEST))
    assert statement == Statement(COSIGN_SIGN_PREDICATE, frozenset({DIGEST}), {})


def test_sbom_statement_requires_cyclonedx() -> None:
    with pytest.raises(AttestationError, match="CycloneDX"):
        sbom_statement("x", DIGEST, {"spdxVersion": "SPDX-2.3"})


def test_parse_statement_rejects_non_statements() -> None:
    with pytest.raises(AttestationError):
        parse_statement(b'{"_type": "something else"}')
    with pytest.raises(AttestationError):
        parse_statement(image_signature_statement("x", DIGEST), "text/plain")


def _v1(predicate: dict) -> Statement:
    return Statement(SLSA_V1_PREDICATE, frozenset({DIGEST}), predicate)


def test_buildkit_v1_provenance_from_vcs_metadata() -> None:
    prov = parse_provenance(
        _v1(
            {
                "buildDefinition": {
                    "buildType": "https://github.com/moby/buildkit/blob/master/docs/attestations/slsa-definitions.md"
                },
                "runDetails": {
                    "builder": {"id": "https://github.com/acme/tts/actions/runs/1/attempts/1"},
                    "metadata": {
                        "buildkit_metadata": {
                            "vcs": {"source": "https://github.com/Acme/TTS.git", "revision": COMMIT}
                        }
                    },
                },
            }
        )
    )
    assert (prov.slsa_version, prov.source_repository, prov.source_revision) == (
        "v1",
        "https://github.com/acme/tts",
        COMMIT,
    )


def test_buildkit_v1_provenance_from_git_config_source() -> None:
    prov = parse_provenance(
        _v1(
            {
                "buildDefinition": {
                    "externalParameters": {
                        "configSource": {
                            "uri": f"https://github.com/acme/tts.git#{COMMIT}",
                            "path": "Containerfile",
                        }
                    }
                },
                "runDetails": {"builder": {"id": "b"}},
            }
        )
    )
    assert (prov.source_repository, prov.source_revision) == ("https://github.com/acme/tts", COMMIT)


def test_buildkit_v02_provenance() -> None:
    statement = Statement(
        SLSA_V02_PREDICATE,
        frozenset({DIGEST}),
        {
            "builder": {"id": "https://github.com/acme/tts/actions/runs/9"},
            "buildType": "https://mobyproject.org/buildkit@v1",
            "invocation": {
                "configSource": {
                    "uri": "https://github.com/acme/tts.git#refs/tags/v1",
                    "digest": {"sha1": COMMIT},
                }
            },
        },
    )
    prov = parse_provenance(statement)
    assert (prov.slsa_version, prov.builder_id, prov.source_revision) == (
        "v0.2",
        "https://github.com/acme/tts/actions/runs/9",
        COMMIT,
    )
    with pytest.raises(AttestationError, match="builder"):
        parse_provenance(Statement(SLSA_V02_PREDICATE, frozenset({DIGEST}), {}))


def test_credential_scan() -> None:
    clean = {
        "request": {
            "args": {"build-arg:VERSION": "v1"},
            "secrets": [{"id": "GIT_AUTH_TOKEN", "optional": True}],
        },
        "note": "task-runner output",
    }
    assert find_credential_leaks(clean) == []
    leaky = {
        "args": {"build-arg:API_KEY": "x", "paths": ["/Users/me/src"]},
        "env": "ghp_" + "a" * 36,
        "aws": "AKIA" + "B" * 16,
    }
    findings = find_credential_leaks(leaky)
    assert any("API_KEY: credential-like key" in f for f in findings)
    assert any("paths[0]" in f and "private host path" in f for f in findings)
    assert any(f.startswith("env:") and "GitHub token" in f for f in findings)
    assert any(f.startswith("aws:") and "AWS" in f for f in findings)


def test_normalize_repository() -> None:
    assert normalize_repository("git+https://github.com/Acme/TTS.git#main") == "https://github.com/acme/tts"


def test_dsse_envelope_round_trip_and_tamper(tmp_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    key_path = tmp_path / "k.pem"
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    pub_path = tmp_path / "k.pub"
    pub_path.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    payload = image_signature_statement("x", DIGEST)
    envelope = sign_envelope(load_private_key(key_path), payload)
    assert verify_envelope(load_public_key(pub_path), envelope) == ("application/vnd.in-toto+json", payload)
    doc = json.loads(envelope)
    doc["payload"] = base64.b64encode(payload.replace(b"cdcd", b"cdce", 1)).decode()
    with pytest.raises(KeyPairError, match="no signature"):
        verify_envelope(key.public_key(), json.dumps(doc).encode())
    assert pae("t", b"ab") == b"DSSEv1 1 t 2 ab"


def test_key_loading_refuses_other_curves(tmp_path: Path) -> None:
    path = tmp_path / "p384.pem"
    path.write_bytes(
        ec.generate_private_key(ec.SECP384R1()).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    with pytest.raises(KeyPairError, match="P-256"):
        load_private_key(path)

"""Key-pair signing: ECDSA P-256 over DSSE envelopes, checkable with the ``cryptography`` library alone.

For air-gapped releases, or where no OIDC identity exists. We sign the *same* in-toto statements as in
keyless mode and wrap each in a plain DSSE envelope (no certificate, no transparency log):

    {"payloadType": "application/vnd.in-toto+json", "payload": b64(statement),
     "signatures": [{"keyid": sha256-hex(SubjectPublicKeyInfo DER), "sig": b64(ASN.1 DER ECDSA)}]}

The signature is ECDSA P-256 / SHA-256 over DSSE's pre-authentication encoding
``"DSSEv1" SP len(type) SP type SP len(payload) SP payload``. We chose DSSE over cosign's legacy
simple-signing payload (``sha256-<hex>.sig`` tags) because attestations (SBOM, model manifest) must be
statements anyway, so one envelope format and one discovery path (OCI referrers) serve every signature.
Keys are unencrypted or password-protected PKCS#8 PEM; the public half is a PKIX PEM. Generate with
``openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out release.key`` and
``openssl pkey -in release.key -pubout -out release.pub``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from .oci import IN_TOTO, canonical_json

DSSE_ENVELOPE = "application/vnd.dsse.envelope.v1+json"
KEY_PASSWORD_ENV = "QWEN3_TTS_SIGNING_KEY_PASSWORD"


class KeyPairError(ValueError):
    """A key file is unusable or an envelope does not verify."""


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding: what is actually signed."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def key_id(public_key: ec.EllipticCurvePublicKey) -> str:
    """Hex SHA-256 of the SubjectPublicKeyInfo DER (the same key id sigstore uses for log keys)."""
    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


def _require_p256(key: object, path: Path) -> None:
    curve = getattr(key, "curve", None)
    if not isinstance(curve, ec.SECP256R1):
        raise KeyPairError(f"{path}: expected an ECDSA P-256 key (cosign's key type)")


def load_private_key(path: Path) -> ec.EllipticCurvePrivateKey:
    """Load a PKCS#8 PEM P-256 key; an encrypted one is unlocked with $QWEN3_TTS_SIGNING_KEY_PASSWORD."""
    password = os.environ.get(KEY_PASSWORD_ENV)
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password.encode() if password else None)
    except OSError as exc:
        raise KeyPairError(f"cannot read signing key {path}: {exc.strerror or exc}") from exc
    except (TypeError, ValueError) as exc:
        raise KeyPairError(
            f"{path} is not a usable PEM private key ({exc}); if it is encrypted, set ${KEY_PASSWORD_ENV}"
        ) from exc
    _require_p256(key, path)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return key


def load_public_key(path: Path) -> ec.EllipticCurvePublicKey:
    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except OSError as exc:
        raise KeyPairError(f"cannot read public key {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise KeyPairError(f"{path} is not a PEM public key: {exc}") from exc
    _require_p256(key, path)
    assert isinstance(key, ec.EllipticCurvePublicKey)
    return key


def sign_envelope(
    private_key: ec.EllipticCurvePrivateKey, payload: bytes, payload_type: str = IN_TOTO
) -> bytes:
    """Sign ``payload`` and return the DSSE envelope JSON bytes."""
    signature = private_key.sign(pae(payload_type, payload), ec.ECDSA(hashes.SHA256()))
    return canonical_json(
        {
            "payload": base64.b64encode(payload).decode(),
            "payloadType": payload_type,
            "signatures": [
                {"keyid": key_id(private_key.public_key()), "sig": base64.b64encode(signature).decode()}
            ],
        }
    )


def verify_envelope(public_key: ec.EllipticCurvePublicKey, envelope: bytes) -> tuple[str, bytes]:
    """Return ``(payloadType, payload)`` when some signature in ``envelope`` verifies with ``public_key``."""
    try:
        doc = json.loads(envelope)
        payload_type = str(doc["payloadType"])
        payload = base64.b64decode(doc["payload"], validate=True)
        signatures = [base64.b64decode(s["sig"], validate=True) for s in doc["signatures"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise KeyPairError(f"malformed DSSE envelope: {exc}") from exc
    message = pae(payload_type, payload)
    for signature in signatures:
        try:
            public_key.verify(signature, message, ec.ECDSA(hashes.SHA256()))
        except InvalidSignature:
            continue
        return payload_type, payload
    raise KeyPairError(f"no signature in the envelope verifies with key {key_id(public_key)[:16]}")

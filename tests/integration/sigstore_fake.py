"""An in-process private Sigstore instance for offline tests (tests only; never imported by the package).

It serves, on 127.0.0.1, exactly the protocol surface sigstore-python's *production* code uses, so the
real ``SigningContext``/``Signer``/``Verifier`` run unmodified and only the trust configuration differs:

* Fulcio ``POST /api/v2/signingCert``: verifies the OIDC token (signed by our issuer key) and the CSR,
  issues a 10-minute leaf from a P-384 test root with the OIDC issuer (1.1, 1.8) and GitHub claim
  extensions (1.9, 1.11, 1.12, 1.13, 1.14, 1.20, 1.21) and an embedded precertificate SCT (RFC 6962).
* Rekor v1 ``POST /api/v1/log/entries`` (hashedrekord and dsse 0.0.1): canonical body, signed entry
  timestamp over the RFC 8785 form of {body, integratedTime, logID, logIndex}, an RFC 6962 inclusion
  proof over a real Merkle tree, and a signed checkpoint note.
* A GitHub-Actions-style OIDC token endpoint, so ``sigstore.oidc.detect_credential`` finds a token through
  GITHUB_ACTIONS / ACTIONS_ID_TOKEN_REQUEST_URL / ACTIONS_ID_TOKEN_REQUEST_TOKEN.
* ``trust_config_json()``: a ClientTrustConfig v0.1 (trusted root + signing config v0.2) pointing here.

Written from the protocol descriptions (RFC 6962, Fulcio OID registry, Rekor v1 API, signed-note format).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import secrets
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import jwt
import rfc8785
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID, ObjectIdentifier

GITHUB_ISSUER = "https://token.actions.githubusercontent.com"
_SCT_OID = ObjectIdentifier("1.3.6.1.4.1.11129.2.4.2")
_FULCIO = "1.3.6.1.4.1.57264.1."
_EPOCH = "2020-01-01T00:00:00Z"


def _der_length(n: int) -> bytes:
    if n < 0x80:
        return bytes([n])
    body = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(body)]) + body


def _der(tag: int, content: bytes) -> bytes:
    return bytes([tag]) + _der_length(len(content)) + content


def _spki(key: ec.EllipticCurvePublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _hash_leaf(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def _hash_children(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two strictly below ``n`` (RFC 6962 §2.1)."""
    k = 1
    while k << 1 < n:
        k <<= 1
    return k


def merkle_root(leaves: list[bytes]) -> bytes:
    if len(leaves) == 1:
        return leaves[0]
    k = _split(len(leaves))
    return _hash_children(merkle_root(leaves[:k]), merkle_root(leaves[k:]))


def audit_path(index: int, leaves: list[bytes]) -> list[bytes]:
    """RFC 6962 PATH(m, D[n]), lowest level first."""
    if len(leaves) <= 1:
        return []
    k = _split(len(leaves))
    if index < k:
        return [*audit_path(index, leaves[:k]), merkle_root(leaves[k:])]
    return [*audit_path(index - k, leaves[k:]), merkle_root(leaves[:k])]


@dataclass
class _Log:
    leaves: list[bytes] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class FakeSigstore:
    """A private Fulcio + CT log + Rekor v1 + OIDC issuer on one loopback HTTP port."""

    def __init__(self, name: str = "fake-sigstore") -> None:
        self.name = name
        self._ca_key = ec.generate_private_key(ec.SECP384R1())
        self._ct_key = ec.generate_private_key(ec.SECP256R1())
        self._rekor_key = ec.generate_private_key(ec.SECP256R1())
        self._oidc_key = ec.generate_private_key(ec.SECP256R1())
        self._request_token = secrets.token_hex(16)
        self._claims: dict[str, dict[str, Any]] = {}
        self._log = _Log()
        self._tree_id = secrets.randbelow(2**62)
        now = dt.datetime.now(dt.UTC)
        subject = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, name),
                x509.NameAttribute(NameOID.COMMON_NAME, f"{name} root"),
            ]
        )
        self.root = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=365))
            .add_extension(x509.BasicConstraints(ca=True, path_length=1), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self._ca_key.public_key()), critical=False
            )
            .sign(self._ca_key, hashes.SHA384())
        )
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    # -- lifecycle ---------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> FakeSigstore:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- identities --------------------------------------------------------------------------------

    @staticmethod
    def github_claims(
        repository: str,
        workflow: str,
        ref: str,
        sha: str,
        *,
        issuer: str = GITHUB_ISSUER,
        event: str = "push",
        runner: str = "github-hosted",
    ) -> dict[str, Any]:
        """Claims of a GitHub Actions OIDC token for ``repository``'s ``workflow`` file at ``ref``."""
        return {
            "iss": issuer,
            "sub": f"repo:{repository}:ref:{ref}",
            "repository": repository,
            "repository_owner": repository.split("/")[0],
            "ref": ref,
            "sha": sha,
            "event_name": event,
            "runner_environment": runner,
            "job_workflow_ref": f"{repository}/.github/workflows/{workflow}@{ref}",
            "workflow_ref": f"{repository}/.github/workflows/{workflow}@{ref}",
            "run_id": "4242",
            "run_attempt": "1",
        }

    def identity_token(self, claims: dict[str, Any], audience: str = "sigstore") -> str:
        now = int(time.time())
        body = {"aud": audience, "iat": now, "nbf": now, "exp": now + 300, **claims}
        return jwt.encode(body, self._oidc_key, algorithm="ES256")

    def ambient_env(self, claims: dict[str, Any]) -> dict[str, str]:
        """Environment under which ``detect_credential()`` fetches a token with ``claims`` from us."""
        token_id = secrets.token_hex(8)
        self._claims[token_id] = claims
        return {
            "GITHUB_ACTIONS": "true",
            "ACTIONS_ID_TOKEN_REQUEST_URL": f"{self.url}/gh-oidc/{token_id}?api-version=2.0",
            "ACTIONS_ID_TOKEN_REQUEST_TOKEN": self._request_token,
        }

    # -- trust configuration ------------------------------------------------------------------------

    def _public_key(self, key: ec.EllipticCurvePrivateKey) -> dict[str, Any]:
        return {
            "rawBytes": _b64(_spki(key.public_key())),
            "keyDetails": "PKIX_ECDSA_P256_SHA_256",
            "validFor": {"start": _EPOCH},
        }

    def _log_instance(self, key: ec.EllipticCurvePrivateKey) -> dict[str, Any]:
        return {
            "baseUrl": self.url,
            "hashAlgorithm": "SHA2_256",
            "publicKey": self._public_key(key),
            "logId": {"keyId": _b64(hashlib.sha256(_spki(key.public_key())).digest())},
        }

    def trust_config(self) -> dict[str, Any]:
        service = {
            "url": self.url,
            "majorApiVersion": 1,
            "validFor": {"start": _EPOCH},
            "operator": self.name,
        }
        return {
            "mediaType": "application/vnd.dev.sigstore.clienttrustconfig.v0.1+json",
            "trustedRoot": {
                "mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
                "tlogs": [self._log_instance(self._rekor_key)],
                "certificateAuthorities": [
                    {
                        "subject": {"organization": self.name, "commonName": f"{self.name} root"},
                        "uri": self.url,
                        "certChain": {
                            "certificates": [
                                {"rawBytes": _b64(self.root.public_bytes(serialization.Encoding.DER))}
                            ]
                        },
                        "validFor": {"start": _EPOCH},
                    }
                ],
                "ctlogs": [self._log_instance(self._ct_key)],
                "timestampAuthorities": [],
            },
            "signingConfig": {
                "mediaType": "application/vnd.dev.sigstore.signingconfig.v0.2+json",
                "caUrls": [service],
                "oidcUrls": [],
                "rekorTlogUrls": [service],
                "tsaUrls": [],
                "rekorTlogConfig": {"selector": "ANY"},
                "tsaConfig": {"selector": "ANY"},
            },
        }

    def write_trust_config(self, path: Path) -> Path:
        path.write_text(json.dumps(self.trust_config(), indent=2))
        return path

    # -- Fulcio ------------------------------------------------------------------------------------

    def _issue(self, token: str, csr_pem: bytes) -> list[str]:
        claims = jwt.decode(
            token,
            self._oidc_key.public_key(),
            algorithms=["ES256"],
            audience="sigstore",
            options={"require": ["iss", "sub", "aud", "exp", "iat"]},
        )
        csr = x509.load_pem_x509_csr(csr_pem)
        if not csr.is_signature_valid:
            raise ValueError("CSR signature does not verify (no proof of possession)")
        public_key = csr.public_key()
        assert isinstance(public_key, ec.EllipticCurvePublicKey)
        issuer = str(claims["iss"])
        workflow_ref = claims.get("job_workflow_ref")
        san: x509.GeneralName
        if workflow_ref:
            san = x509.UniformResourceIdentifier(f"https://github.com/{workflow_ref}")
        elif "email" in claims:
            san = x509.RFC822Name(str(claims["email"]))
        else:
            san = x509.UniformResourceIdentifier(str(claims["sub"]))
        extensions: list[tuple[x509.ExtensionType, bool]] = [
            (x509.SubjectAlternativeName([san]), True),
            (
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                True,
            ),
            (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), False),
            (x509.SubjectKeyIdentifier.from_public_key(public_key), False),
            (x509.AuthorityKeyIdentifier.from_issuer_public_key(self._ca_key.public_key()), False),
            (x509.UnrecognizedExtension(ObjectIdentifier(_FULCIO + "1"), issuer.encode()), False),
            (x509.UnrecognizedExtension(ObjectIdentifier(_FULCIO + "8"), _der(0x0C, issuer.encode())), False),
        ]
        if workflow_ref:
            repo = claims["repository"]
            github = {
                "9": f"https://github.com/{workflow_ref}",
                "11": claims.get("runner_environment", ""),
                "12": f"https://github.com/{repo}",
                "13": claims.get("sha", ""),
                "14": claims.get("ref", ""),
                "20": claims.get("event_name", ""),
                "21": f"https://github.com/{repo}/actions/runs/{claims.get('run_id')}/attempts/{claims.get('run_attempt')}",
            }
            for arc, value in github.items():
                extensions.append(
                    (
                        x509.UnrecognizedExtension(
                            ObjectIdentifier(_FULCIO + arc), _der(0x0C, str(value).encode())
                        ),
                        False,
                    )
                )
        now = dt.datetime.now(dt.UTC).replace(microsecond=0)
        serial = x509.random_serial_number()

        def builder() -> x509.CertificateBuilder:
            b = (
                x509.CertificateBuilder()
                .subject_name(x509.Name([]))
                .issuer_name(self.root.subject)
                .public_key(public_key)
                .serial_number(serial)
                .not_valid_before(now - dt.timedelta(seconds=5))
                .not_valid_after(now + dt.timedelta(minutes=10))
            )
            for ext, critical in extensions:
                b = b.add_extension(ext, critical=critical)
            return b

        precert = builder().sign(self._ca_key, hashes.SHA384())
        sct = self._sct(precert.tbs_certificate_bytes)
        leaf = (
            builder()
            .add_extension(x509.UnrecognizedExtension(_SCT_OID, sct), critical=False)
            .sign(self._ca_key, hashes.SHA384())
        )
        assert leaf.tbs_precertificate_bytes == precert.tbs_certificate_bytes
        pem = serialization.Encoding.PEM
        return [leaf.public_bytes(pem).decode(), self.root.public_bytes(pem).decode()]

    def _sct(self, tbs: bytes) -> bytes:
        """An RFC 6962 SCT list over the precertificate TBS, DER-wrapped as the extension value."""
        issuer_key_hash = hashlib.sha256(_spki(self._ca_key.public_key())).digest()
        timestamp = int(time.time() * 1000)
        signed = (
            struct.pack("!BBQH", 0, 0, timestamp, 1)
            + issuer_key_hash
            + len(tbs).to_bytes(3, "big")
            + tbs
            + struct.pack("!H", 0)
        )
        signature = self._ct_key.sign(signed, ec.ECDSA(hashes.SHA256()))
        log_id = hashlib.sha256(_spki(self._ct_key.public_key())).digest()
        sct = (
            struct.pack("!B", 0)
            + log_id
            + struct.pack("!QH", timestamp, 0)
            + struct.pack("!BBH", 4, 3, len(signature))
            + signature
        )
        sct_list = struct.pack("!H", len(sct) + 2) + struct.pack("!H", len(sct)) + sct
        return _der(0x04, sct_list)

    # -- Rekor v1 ----------------------------------------------------------------------------------

    @staticmethod
    def _canonical_body(proposed: dict[str, Any]) -> bytes:
        kind, version = proposed.get("kind"), proposed.get("apiVersion")
        if kind == "hashedrekord" and version == "0.0.1":
            return rfc8785.dumps(proposed)
        if kind == "dsse" and version == "0.0.1":
            content = proposed["spec"]["proposedContent"]
            envelope_text: str = content["envelope"]
            envelope = json.loads(envelope_text)
            verifier_pem = base64.b64decode(content["verifiers"][0])
            key = x509.load_pem_x509_certificate(verifier_pem).public_key()
            assert isinstance(key, ec.EllipticCurvePublicKey)
            payload = base64.b64decode(envelope["payload"])
            kind_bytes = envelope["payloadType"].encode()
            pae = b"DSSEv1 %d %s %d %s" % (len(kind_bytes), kind_bytes, len(payload), payload)
            signatures = []
            for sig in envelope["signatures"]:
                raw = base64.b64decode(sig["sig"])
                key.verify(raw, pae, ec.ECDSA(hashes.SHA256()))
                signatures.append({"signature": _b64(raw), "verifier": content["verifiers"][0]})
            return rfc8785.dumps(
                {
                    "apiVersion": "0.0.1",
                    "kind": "dsse",
                    "spec": {
                        "envelopeHash": {
                            "algorithm": "sha256",
                            "value": hashlib.sha256(envelope_text.encode()).hexdigest(),
                        },
                        "payloadHash": {"algorithm": "sha256", "value": hashlib.sha256(payload).hexdigest()},
                        "signatures": signatures,
                    },
                }
            )
        raise ValueError(f"unsupported entry kind {kind}/{version}")

    def _append(self, proposed: dict[str, Any]) -> dict[str, Any]:
        body = self._canonical_body(proposed)
        leaf = _hash_leaf(body)
        with self._log.lock:
            self._log.leaves.append(leaf)
            index = len(self._log.leaves) - 1
            leaves = list(self._log.leaves)
        size = len(leaves)
        root = merkle_root(leaves)
        path = audit_path(index, leaves)
        log_id_bytes = hashlib.sha256(_spki(self._rekor_key.public_key())).digest()
        integrated = int(time.time())
        body_b64 = _b64(body)
        set_payload = rfc8785.dumps(
            {"body": body_b64, "integratedTime": integrated, "logID": log_id_bytes.hex(), "logIndex": index}
        )
        signed_entry_timestamp = self._rekor_key.sign(set_payload, ec.ECDSA(hashes.SHA256()))
        origin = f"{self.name} - {self._tree_id}"
        note = f"{origin}\n{size}\n{_b64(root)}\n"
        note_sig = self._rekor_key.sign(note.encode(), ec.ECDSA(hashes.SHA256()))
        checkpoint = f"{note}\n\u2014 {self.name} {_b64(log_id_bytes[:4] + note_sig)}\n"
        return {
            leaf.hex(): {
                "body": body_b64,
                "integratedTime": integrated,
                "logID": log_id_bytes.hex(),
                "logIndex": index,
                "verification": {
                    "signedEntryTimestamp": _b64(signed_entry_timestamp),
                    "inclusionProof": {
                        "logIndex": index,
                        "rootHash": root.hex(),
                        "treeSize": size,
                        "hashes": [h.hex() for h in path],
                        "checkpoint": checkpoint,
                    },
                },
            }
        }

    # -- HTTP --------------------------------------------------------------------------------------

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def _reply(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                url = urlparse(self.path)
                parts = url.path.strip("/").split("/")
                if len(parts) == 2 and parts[0] == "gh-oidc" and parts[1] in fake._claims:
                    if self.headers.get("Authorization", "") != f"bearer {fake._request_token}":
                        self._reply(403, {"message": "bad request token"})
                        return
                    audience = parse_qs(url.query).get("audience", ["sigstore"])[0]
                    self._reply(200, {"value": fake.identity_token(fake._claims[parts[1]], audience)})
                    return
                self._reply(404, {"message": "not found"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                try:
                    if self.path == "/api/v2/signingCert":
                        token = self.headers.get("Authorization", "").removeprefix("Bearer ")
                        csr = base64.b64decode(body["certificateSigningRequest"])
                        chain = fake._issue(token, csr)
                        self._reply(201, {"signedCertificateEmbeddedSct": {"chain": {"certificates": chain}}})
                    elif self.path == "/api/v1/log/entries":
                        self._reply(201, fake._append(body))
                    else:
                        self._reply(404, {"message": "not found"})
                except Exception as exc:
                    self._reply(400, {"code": 400, "message": f"{type(exc).__name__}: {exc}"})

        return Handler

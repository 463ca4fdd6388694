"""``qwen3-tts release``: build, sign, verify (the deploy gate) and promote images; SBOM and hygiene.

Exit codes of every subcommand here: 0 success, 1 the operation or a gate check failed, 2 usage or
configuration error (bad arguments, unreadable key/trust/pin files).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import EXIT_FAILED, EXIT_OK, release_hygiene, usage_error

if TYPE_CHECKING:
    from ..release.gate import GatePolicy
    from ..release.registry import ImageReference

DEFAULT_PLATFORMS = ("linux/amd64", "linux/arm64")

_EXIT_CODES = """exit codes:
  0  passed
  1  a check failed (each failure is named by its check id)
  2  usage or configuration error (arguments, unreadable key, trust config or pin file)"""

_GATE_CHECKS = """checks (stable ids, all evaluated, all failures reported):
  reference.pinned    the image is given by digest; tags are refused
  manifest.digest     the bytes served for the digest hash to it
  index.platforms     exactly the expected platforms, configs agreeing
  signature.image     a cosign sign/v1 signature about the digest by the expected identity or key
  attestation.sbom    a signed CycloneDX SBOM attestation about the digest
  attestation.model   a signed model-manifest attestation equal to the pinned manifest
  provenance          BuildKit SLSA provenance, when present: BuildKit build type, expected builder,
                      repository and commit, no credentials or private host paths
  tags.resolve        each --tag still resolves to the digest (no tag drift)"""


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``release`` command group."""
    parser = subparsers.add_parser(
        "release",
        help="build, sign, verify and promote release images",
        description="Release tooling: build and push the image, sign it and attach SBOM and model "
        "attestations, run the deploy gate, and promote a gated digest to a version tag.",
    )
    commands = parser.add_subparsers(dest="release_command", metavar="SUBCOMMAND", required=True)
    _register_build(commands)
    _register_sign(commands)
    _register_verify(commands)
    _register_promote(commands)
    release_hygiene.register(commands)


# --- build ------------------------------------------------------------------------------------------


def _register_build(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = commands.add_parser(
        "build",
        help="build and push a multi-platform image; print its index digest",
        description="Build with docker buildx where available, else through a Docker-API engine at "
        "$DOCKER_HOST (a daemon or podman's socket) one platform at a time, assembling the index here. "
        "The reported digest is re-read from the registry and hashed.",
        epilog="exit codes: 0 built and pushed, 1 the build or push failed, 2 usage error",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("image", help="REGISTRY/REPOSITORY:TAG to push to")
    p.add_argument("--context", type=Path, default=Path("."), help="build context (default: .)")
    p.add_argument(
        "--file", type=Path, default=Path("Containerfile"), help="Containerfile (default: Containerfile)"
    )
    p.add_argument(
        "--platform", action="append", help=f"repeatable (default: {', '.join(DEFAULT_PLATFORMS)})"
    )
    p.add_argument("--build-arg", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument(
        "--build-context",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="named build context, e.g. model=/verified/snapshot (buildx only)",
    )
    p.add_argument("--builder", choices=("auto", "buildx", "docker-api"), default="auto")
    p.add_argument("--output", type=Path, help="also write the build result JSON here")
    p.set_defaults(handler=_build)


def _build(args: argparse.Namespace) -> int:
    from ..release.build import BuildError, BuildRequest, build
    from ..release.oci import OciError, Platform
    from ..release.registry import ImageReference, RegistryClient, RegistryError

    try:
        image = ImageReference.parse(args.image)
        platforms = tuple(Platform.parse(p) for p in (args.platform or DEFAULT_PLATFORMS))
        build_args = dict(_key_value("--build-arg", item) for item in args.build_arg)
        contexts = dict(_key_value("--build-context", item) for item in args.build_context)
    except (RegistryError, OciError, ValueError) as exc:
        return usage_error(exc)
    request = BuildRequest(image, args.context, args.file, platforms, build_args, contexts)
    try:
        result = build(request, RegistryClient(image.registry), args.builder)
    except (BuildError, RegistryError) as exc:
        print(f"release build: {exc}", file=sys.stderr)
        return EXIT_FAILED
    _emit(result.to_json(), args.output)
    return EXIT_OK


def _key_value(option: str, item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise ValueError(f"{option} {item!r} is not KEY=VALUE")
    return key, value


# --- sign -------------------------------------------------------------------------------------------


def _register_sign(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = commands.add_parser(
        "sign",
        help="sign an image digest and attach SBOM and model attestations",
        description="Keyless by default: Sigstore (production unless --trust-config) with the CI job's "
        "ambient OIDC identity; each signature is a Sigstore bundle attached as an OCI referrer (cosign v3 "
        "layout). With --key: ECDSA P-256 DSSE envelopes, verifiable with any ECDSA library.",
        epilog="exit codes: 0 signed and attached, 1 signing or attaching failed, "
        "2 usage or configuration error",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "image", help="REGISTRY/REPOSITORY@sha256:<digest> (the index digest from `release build`)"
    )
    p.add_argument("--sbom", type=Path, help="CycloneDX JSON SBOM to attest")
    p.add_argument(
        "--model-manifest", type=Path, help="model manifest (the pin baked into the image) to attest"
    )
    p.add_argument(
        "--key", type=Path, help="PKCS#8 PEM ECDSA P-256 private key: key-pair mode instead of keyless"
    )
    p.add_argument("--trust-config", type=Path, help="Sigstore ClientTrustConfig JSON (a private instance)")
    p.add_argument("--output", type=Path, help="also write the list of attached referrers (JSON) here")
    p.set_defaults(handler=_sign)


def _sign(args: argparse.Namespace) -> int:
    from ..engine.identity import ManifestError, load_manifest
    from ..release.attest import AttestationError
    from ..release.keypair import KeyPairError, load_private_key
    from ..release.registry import ImageReference, RegistryClient, RegistryError
    from ..release.sign import KeyPairSigner, SigningError, sign_release, sigstore_signer
    from ..release.trust import TrustConfigError, load_trust_config

    try:
        image = ImageReference.parse(args.image)
        if image.digest is None:
            raise ValueError(f"{args.image} is not pinned: sign IMAGE@sha256:<digest>, never a tag")
        sbom = _read_json(args.sbom) if args.sbom else None
        model = load_manifest(args.model_manifest).to_json() if args.model_manifest else None
        key = load_private_key(args.key) if args.key else None
        if key is not None and args.trust_config:
            raise ValueError("--key and --trust-config exclude each other (key-pair mode uses no Sigstore)")
        trust = None if key is not None else load_trust_config(args.trust_config)
    except (RegistryError, ManifestError, KeyPairError, TrustConfigError, ValueError, OSError) as exc:
        return usage_error(exc)
    if model is None:
        print(
            "release sign: no --model-manifest; the deploy gate requires a model attestation", file=sys.stderr
        )
    if sbom is None:
        print("release sign: no --sbom; the deploy gate requires an SBOM attestation", file=sys.stderr)
    client = RegistryClient(image.registry)
    try:
        if key is not None:
            attached = sign_release(client, image, KeyPairSigner(key), sbom=sbom, model_manifest=model)
        else:
            assert trust is not None
            with sigstore_signer(trust.config) as signer:
                attached = sign_release(client, image, signer, sbom=sbom, model_manifest=model)
    except (SigningError, RegistryError, AttestationError) as exc:
        print(f"release sign: {exc}", file=sys.stderr)
        return EXIT_FAILED
    _emit(
        {
            "image": str(image),
            "mode": "key-pair" if key else "keyless",
            "attached": [{"predicate_type": a.predicate_type, "referrer": a.referrer} for a in attached],
        },
        args.output,
    )
    return EXIT_OK


# --- verify and promote -----------------------------------------------------------------------------


def _add_gate_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("image", help="REGISTRY/REPOSITORY@sha256:<digest>; a tag is refused")
    who = p.add_argument_group("signer (keyless: workflow + ref; or --public-key)")
    who.add_argument(
        "--certificate-workflow",
        metavar="URI",
        help="signing workflow, e.g. https://github.com/OWNER/REPO/.github/workflows/release.yml",
    )
    who.add_argument("--certificate-ref", metavar="REF", help="git ref it ran on, e.g. refs/tags/v1.2.3")
    who.add_argument(
        "--certificate-issuer",
        default="https://token.actions.githubusercontent.com",
        help="OIDC issuer (default: GitHub Actions)",
    )
    who.add_argument("--public-key", type=Path, help="PEM P-256 public key (key-pair releases)")
    who.add_argument(
        "--trust-config", type=Path, help="Sigstore ClientTrustConfig JSON instead of production"
    )
    who.add_argument(
        "--offline", action="store_true", help="use the cached production trust root, no TUF refresh"
    )
    what = p.add_argument_group("release content")
    what.add_argument(
        "--platform", action="append", help=f"repeatable (default: {', '.join(DEFAULT_PLATFORMS)})"
    )
    what.add_argument(
        "--model-manifest",
        type=Path,
        help="pinned model manifest to compare with (default: the pins shipped in release/pins/)",
    )
    what.add_argument(
        "--commit", help="source commit (40 hex): checked in the certificate and the provenance"
    )
    what.add_argument(
        "--builder-id", help="provenance builder id prefix (default: <repository>/actions/runs/)"
    )
    what.add_argument(
        "--source-repository", help="provenance source repository (default: from the workflow URI)"
    )
    what.add_argument(
        "--tag", action="append", default=[], help="a tag that must still resolve to the digest"
    )


def _register_verify(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = commands.add_parser(
        "verify",
        help="the deploy gate: verify a digest's signature, attestations and provenance",
        description="Fail closed unless every check passes. Writes the gate result JSON (--output).",
        epilog=f"{_GATE_CHECKS}\n\n{_EXIT_CODES}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_gate_options(p)
    p.add_argument(
        "--output", type=Path, default=Path("gate-result.json"), help="gate result (default: %(default)s)"
    )
    p.set_defaults(handler=_verify)


def _register_promote(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = commands.add_parser(
        "promote",
        help="gate a digest, then point vX.Y.Z and latest at it",
        description="Runs the deploy gate first; only if it passes, re-pushes the exact index bytes as the "
        "version tag and then `latest`, and confirms both resolve to the digest. Version tags never move.",
        epilog=f"{_GATE_CHECKS}\n\nexit codes:\n  0  promoted\n  1  the gate failed or tagging failed\n"
        "  2  usage or configuration error",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_gate_options(p)
    p.add_argument("--version", required=True, help="vMAJOR.MINOR.PATCH")
    p.add_argument(
        "--output", type=Path, default=Path("promotion.json"), help="promotion record (default: %(default)s)"
    )
    p.set_defaults(handler=_promote)


def _gate_policy(args: argparse.Namespace) -> GatePolicy:
    from ..engine.identity import load_manifest, shipped_manifests
    from ..release.gate import GatePolicy, KeylessIdentity
    from ..release.keypair import load_public_key
    from ..release.oci import Platform
    from ..release.trust import load_trust_config

    keyless = bool(args.certificate_workflow or args.certificate_ref)
    if keyless == bool(args.public_key):
        raise ValueError("give either --certificate-workflow and --certificate-ref (keyless) or --public-key")
    identity = trust = public_key = None
    if keyless:
        if not (args.certificate_workflow and args.certificate_ref):
            raise ValueError("keyless verification needs both --certificate-workflow and --certificate-ref")
        if "/.github/workflows/" not in args.certificate_workflow:
            raise ValueError(
                "--certificate-workflow must be https://github.com/OWNER/REPO/.github/workflows/FILE"
            )
        identity = KeylessIdentity(
            args.certificate_workflow, args.certificate_ref, args.certificate_issuer, args.commit
        )
        trust = load_trust_config(args.trust_config, offline=args.offline)
    else:
        public_key = load_public_key(args.public_key)
    pins = (load_manifest(args.model_manifest),) if args.model_manifest else tuple(shipped_manifests())
    return GatePolicy(
        platforms=tuple(Platform.parse(p) for p in (args.platform or DEFAULT_PLATFORMS)),
        model_pins=pins,
        identity=identity,
        trust=trust,
        public_key=public_key,
        builder_id_prefix=args.builder_id,
        source_repository=args.source_repository,
        source_commit=args.commit,
        tags=tuple(args.tag),
    )


def _gate_inputs(args: argparse.Namespace) -> tuple[ImageReference, GatePolicy]:
    from ..engine.identity import ManifestError
    from ..release.keypair import KeyPairError
    from ..release.oci import OciError
    from ..release.registry import ImageReference, RegistryError
    from ..release.trust import TrustConfigError

    try:
        return ImageReference.parse(args.image), _gate_policy(args)
    except (RegistryError, OciError, ManifestError, KeyPairError, TrustConfigError, ValueError) as exc:
        raise _UsageError(str(exc)) from exc


class _UsageError(Exception):
    """Bad arguments or unreadable configuration: exit code 2."""


def _verify(args: argparse.Namespace) -> int:
    from ..release.gate import run_gate, summarize, write_result
    from ..release.registry import RegistryClient

    try:
        image, policy = _gate_inputs(args)
    except _UsageError as exc:
        return usage_error(exc)
    result = run_gate(RegistryClient(image.registry), image, policy)
    write_result(result, str(args.output))
    print(summarize(result))
    print(f"gate result written to {args.output}")
    return EXIT_OK if result.passed else EXIT_FAILED


def _promote(args: argparse.Namespace) -> int:
    from ..release.gate import summarize
    from ..release.promote import PromotionError, check_version, promote
    from ..release.registry import RegistryClient

    try:
        image, policy = _gate_inputs(args)
        check_version(args.version)
    except (_UsageError, PromotionError) as exc:
        return usage_error(exc)
    try:
        promotion = promote(RegistryClient(image.registry), image, args.version, policy)
    except PromotionError as exc:
        if exc.gate is not None:
            print(summarize(exc.gate))
            _write_json(
                {
                    "schema": "qwen3-tts-native/promotion/v1",
                    "promoted": False,
                    "error": str(exc),
                    "gate": exc.gate.to_json(),
                },
                args.output,
            )
        print(f"release promote: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(summarize(promotion.gate))
    _emit({**promotion.to_json(), "promoted": True}, args.output)
    return EXIT_OK


# --- helpers ----------------------------------------------------------------------------------------


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from exc


def _write_json(document: Any, path: Path) -> None:
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _emit(document: Any, path: Path | None) -> None:
    print(json.dumps(document, indent=2, sort_keys=True))
    if path is not None:
        _write_json(document, path)

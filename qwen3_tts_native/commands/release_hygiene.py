"""``qwen3-tts release sbom|licenses|secrets``: the SBOM and the repository hygiene gates.

``commands/release.py`` calls ``register`` with its subparsers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from qwen3_tts_native.commands import failed, usage_error


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``sbom``, ``licenses`` and ``secrets`` to the ``release`` group."""
    formatter = argparse.RawDescriptionHelpFormatter
    sbom = subparsers.add_parser(
        "sbom",
        help="write the CycloneDX 1.6 SBOM of the Python environment and the model",
        formatter_class=formatter,
        description="Every installed Python distribution (name, version, purl, declared licence) and the "
        "model as a machine-learning-model component with its files' SHA-256 and a model card; validated "
        "with the strict CycloneDX 1.6 schema before it is written. SOURCE_DATE_EPOCH fixes the timestamp.",
        epilog="exit codes: 0 written, 1 the document fails the CycloneDX 1.6 schema, 2 usage",
    )
    sbom.add_argument("--model-manifest", type=Path, required=True, metavar="FILE", help="model manifest")
    sbom.add_argument(
        "--path",
        action="append",
        metavar="DIR",
        help="site-packages folder of the environment to describe (repeatable; default: this one)",
    )
    sbom.add_argument("-o", "--output", type=Path, required=True, metavar="FILE", help="SBOM to write")
    sbom.set_defaults(handler=_sbom)

    licenses = subparsers.add_parser(
        "licenses",
        help="check declared licences against the allowlist",
        formatter_class=formatter,
        description="Evaluate each declared licence as an SPDX expression against "
        "release/license-policy.json (allowlist, accepted names, dated waivers). Default: qwen3-tts-native "
        "and everything it requires at run time in this environment; --sbom: every component of an SBOM.",
        epilog="exit codes: 0 all allowed, 1 a licence is not allowed (each named), 2 usage",
    )
    licenses.add_argument("--sbom", type=Path, metavar="FILE", help="CycloneDX JSON SBOM to check instead")
    licenses.set_defaults(handler=_licenses)

    secrets = subparsers.add_parser(
        "secrets",
        help="scan every blob of the whole git history for credentials",
        formatter_class=formatter,
        description="detect-secrets over every distinct blob of every commit reachable from any ref. "
        "Findings name commit, file, line and kind, never the secret. A secret that was committed once "
        "stays in history after deletion: rotate it, then rewrite history.",
        epilog="exit codes: 0 clean, 1 secrets found, 2 not a git repository",
    )
    secrets.add_argument("--repo", type=Path, default=Path("."), metavar="DIR", help="work tree (default: .)")
    secrets.set_defaults(handler=_secrets)


def _sbom(args: argparse.Namespace) -> int:
    from qwen3_tts_native.engine.identity import ManifestError, load_manifest
    from qwen3_tts_native.release.sbom import SbomError, build_sbom, installed_distributions

    try:
        model = load_manifest(args.model_manifest)
    except ManifestError as error:
        return usage_error(error)
    distributions = installed_distributions(args.path)
    if not distributions:
        return usage_error(f"no Python distributions found on {args.path or 'sys.path'}")
    try:
        document = build_sbom(distributions, model)
    except SbomError as error:
        return failed(str(error), [])
    args.output.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    identity = f"{model.repository}@{model.revision}"
    print(f"wrote {args.output}: {len(distributions)} Python distributions and {identity}")
    return 0


def _licenses(args: argparse.Namespace) -> int:
    from qwen3_tts_native.release.hygiene import (
        HygieneError,
        items_from_distributions,
        items_from_sbom,
        license_violations,
        load_policy,
    )
    from qwen3_tts_native.release.sbom import SbomError, installed_distributions, requirement_closure

    try:
        policy = load_policy()
        if args.sbom is not None:
            items = items_from_sbom(json.loads(args.sbom.read_text(encoding="utf-8")))
            scope = str(args.sbom)
        else:
            items = items_from_distributions(requirement_closure(installed_distributions()))
            scope = "qwen3-tts-native and its run-time requirements"
    except (HygieneError, SbomError, OSError, json.JSONDecodeError) as error:
        return usage_error(error)
    problems = license_violations(items, policy)
    if problems:
        return failed(
            f"{len(problems)} of {len(items)} in {scope} are not allowed:",
            problems,
            "allow the licence in release/license-policy.json, or add a dated waiver with a reason",
        )
    print(f"licences allowed: {len(items)} in {scope}")
    return 0


def _secrets(args: argparse.Namespace) -> int:
    from qwen3_tts_native.release.hygiene import HygieneError, scan_git_history

    try:
        scan = scan_git_history(args.repo)
    except HygieneError as error:
        return usage_error(error)
    summary = (
        f"{scan.commits} commits, {scan.blobs_scanned} blobs scanned, "
        f"{scan.blobs_skipped} binary or large blobs skipped"
    )
    if scan.findings:
        return failed(
            f"{len(scan.findings)} possible secrets in the history ({summary}):",
            scan.findings,
            "rotate each credential, then remove it from history; mark a false positive on its line with "
            "`pragma: allowlist secret`",
        )
    print(f"no secrets found: {summary}")
    return 0

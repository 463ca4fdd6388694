"""``qwen3-tts model pin|fetch|verify``: model identity manifests."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from . import EXIT_FAILED, EXIT_OK, failed, usage_error

if TYPE_CHECKING:
    from qwen3_tts_native.engine.identity import ModelManifest

EXIT_CODES = """exit codes:
  0  the snapshot matches its manifest (pin, fetch: the manifest was written / the snapshot is in place)
  1  verification failed: each missing, extra, resized or altered file is named
  2  usage: bad arguments, an unreadable manifest, or an output path in the way"""
SYMLINKS_HELP = "follow symlinks to regular files (a Hugging Face cache snapshot)"


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``pin``, ``fetch`` and ``verify`` to the ``model`` group."""
    formatter = argparse.RawDescriptionHelpFormatter
    pin = subparsers.add_parser(
        "pin",
        help="write the identity manifest of a snapshot directory",
        epilog=EXIT_CODES,
        formatter_class=formatter,
        description="Hash every file of DIR (SHA-256 and git blob id), count tensors and parameters per "
        "component, and write the manifest. For a snapshot you made, write it to DIR/qwen3-tts-manifest.json "
        "so that `serve` and `model verify` find it.",
    )
    pin.add_argument("snapshot", type=Path, metavar="DIR")
    pin.add_argument("--repository", help="owner/name; default: from a Hub cache path, else local/<DIR name>")
    pin.add_argument("--revision", help="40-hex commit; default: from a Hub cache path, else a content id")
    pin.add_argument("--license", help="SPDX expression; default: the shipped pin's for a pinned repository")
    pin.add_argument("--allow-symlinks", action="store_true", help=SYMLINKS_HELP)
    pin.add_argument("-o", "--output", type=Path, required=True, metavar="FILE", help="manifest to write")
    pin.set_defaults(handler=_pin)

    fetch = subparsers.add_parser(
        "fetch",
        help="download the pinned model from the Hub and verify it",
        epilog=EXIT_CODES,
        formatter_class=formatter,
        description="Download the pinned files at the pinned revision (Hugging Face cache, progress bars; "
        "HF_HUB_OFFLINE=1 uses the cache only), place them as regular files in a staging folder, verify, "
        "then move them to --out. A snapshot that fails verification never appears at --out.",
    )
    fetch.add_argument("--manifest", type=Path, metavar="FILE", help="pin to fetch; default: the shipped pin")
    fetch.add_argument(
        "--revision", help="fetch this commit instead and pin it on first use (DIR/qwen3-tts-manifest.json)"
    )
    fetch.add_argument("--out", type=Path, required=True, metavar="DIR", help="new or empty directory")
    fetch.set_defaults(handler=_fetch)

    verify = subparsers.add_parser(
        "verify",
        help="check a snapshot directory against its manifest",
        epilog=EXIT_CODES,
        formatter_class=formatter,
        description="Fail-closed check of DIR: every file listed, nothing else, sizes and digests equal. "
        "Without --manifest the manifest is the one `serve` uses: DIR/qwen3-tts-manifest.json, or the "
        "shipped pin of the real model (always, when the snapshot claims the pinned revision).",
    )
    verify.add_argument("snapshot", type=Path, metavar="DIR")
    verify.add_argument("--manifest", type=Path, metavar="FILE", help="manifest to check against")
    verify.add_argument("--allow-symlinks", action="store_true", help=SYMLINKS_HELP)
    verify.set_defaults(handler=_verify)


def _pin(args: argparse.Namespace) -> int:
    from qwen3_tts_native.engine.errors import SnapshotError
    from qwen3_tts_native.engine.identity import MANIFEST_FILENAME, write_manifest
    from qwen3_tts_native.release.model_pin import contradictions, pin_snapshot

    snapshot: Path = args.snapshot
    output: Path = args.output
    inside = output.absolute().is_relative_to(snapshot.absolute())
    if inside and output.absolute() != (snapshot / MANIFEST_FILENAME).absolute():
        return usage_error(f"write the manifest to {snapshot / MANIFEST_FILENAME} or outside {snapshot}")
    try:
        manifest = pin_snapshot(snapshot, args.repository, args.revision, args.license, args.allow_symlinks)
    except SnapshotError as error:
        print(f"pin failed: {error}", file=sys.stderr)
        return EXIT_FAILED
    problems = contradictions(manifest)
    if problems:
        return failed(f"{snapshot} claims {_identity(manifest)} but is not its pin", problems)
    write_manifest(manifest, output)
    print(f"pinned {_identity(manifest)}: {_summary(manifest)} -> {output}")
    return EXIT_OK


def _fetch(args: argparse.Namespace) -> int:
    from qwen3_tts_native.engine.identity import ManifestError, load_manifest
    from qwen3_tts_native.release.model_fetch import FetchError, fetch_snapshot
    from qwen3_tts_native.release.model_pin import shipped_pin

    try:
        manifest = load_manifest(args.manifest) if args.manifest else shipped_pin()
    except ManifestError as error:
        return usage_error(str(error))
    if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        return usage_error(f"{args.out} already exists and is not empty; choose a new --out directory")
    try:
        result = fetch_snapshot(manifest, args.out, args.revision)
    except FetchError as error:
        return failed(str(error), error.problems)
    if result.pinned:
        print(f"fetched and verified {_identity(manifest)}: {_summary(manifest)} -> {args.out}")
    else:
        print(
            f"fetched {_identity(result.manifest)} -> {args.out}: NOT verified against a pin (pinned on "
            f"first use in {args.out}/qwen3-tts-manifest.json; review it before trusting it)"
        )
    return EXIT_OK


def _verify(args: argparse.Namespace) -> int:
    from qwen3_tts_native.engine.identity import (
        ManifestError,
        load_manifest,
        verify_snapshot,
        verify_snapshot_for_serving,
    )

    if args.manifest is not None:
        try:
            manifest = load_manifest(args.manifest)
        except ManifestError as error:
            return usage_error(str(error))
        problems = verify_snapshot(args.snapshot, manifest, args.allow_symlinks)
        source = str(args.manifest)
    else:
        result = verify_snapshot_for_serving(args.snapshot, allow_symlinks=args.allow_symlinks)
        if result.manifest is None:
            return failed(f"{args.snapshot}: no usable manifest", list(result.problems))
        manifest, problems, source = result.manifest, list(result.problems), result.manifest_source
    if problems:
        return failed(f"{args.snapshot} does not match {_identity(manifest)} ({source})", problems)
    print(f"verified {args.snapshot}: {_identity(manifest)}, {_summary(manifest)} ({source})")
    return EXIT_OK


def _identity(manifest: ModelManifest) -> str:
    return f"{manifest.repository}@{manifest.revision}"


def _summary(manifest: ModelManifest) -> str:
    total = sum(entry.bytes for entry in manifest.files)
    return f"{len(manifest.files)} files, {total} bytes"

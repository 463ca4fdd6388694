"""Strict JSON in and canonical JSON out.

Evidence must parse the same way everywhere: duplicate keys and NaN/Infinity are rejected instead of being
silently resolved, and canonical bytes (compact separators, UTF-8, insertion key order) make hashes of
constructed objects reproducible across tools."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class StrictJSONError(ValueError):
    """The text is not strict JSON (syntax, duplicate key or a non-finite number)."""


def _reject_constant(token: str) -> Any:
    raise StrictJSONError(f"non-finite number {token} is not allowed")


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise StrictJSONError(f"duplicate key {key!r}")
        result[key] = value
    return result


def loads_strict(text: str | bytes) -> Any:
    """Parse one JSON document, rejecting duplicate keys and NaN/Infinity."""
    try:
        return json.loads(text, object_pairs_hook=_unique_object, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise StrictJSONError(str(exc)) from exc
    except UnicodeDecodeError as exc:
        raise StrictJSONError(f"not UTF-8: {exc}") from exc


def load_strict(path: Path) -> Any:
    """Parse a JSON file strictly."""
    return loads_strict(path.read_bytes())


def iter_jsonl_strict(path: Path) -> Iterator[tuple[int, Any]]:
    """Yield (line number, record) for each non-empty line of a JSONL file, parsed strictly.

    A blank line inside the file is an error: canonical JSONL has none, so one signals an edit."""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        raise StrictJSONError(f"{path.name}: last line is not newline-terminated")
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            raise StrictJSONError(f"{path.name}:{number}: blank line")
        try:
            yield number, loads_strict(line)
        except StrictJSONError as exc:
            raise StrictJSONError(f"{path.name}:{number}: {exc}") from exc


def canonical_bytes(value: Any) -> bytes:
    """Canonical JSON bytes: compact, UTF-8, insertion key order, finite numbers only."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def canonical_sha256(value: Any) -> str:
    """SHA-256 hex digest of the canonical JSON bytes of ``value``."""
    return hashlib.sha256(canonical_bytes(value)).hexdigest()


def pretty_bytes(value: Any) -> bytes:
    """Human-readable JSON for documents (manifests, summaries), newline-terminated, finite numbers only."""
    return (json.dumps(value, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")


def jsonl_line(value: Any) -> bytes:
    """One canonical JSONL line."""
    return canonical_bytes(value) + b"\n"

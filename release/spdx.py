"""Validation of SPDX SBOMs, as BuildKit attaches them (an in-toto Statement around SPDX 2.3 JSON)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

SPDX_PREDICATE = "https://spdx.dev/Document"


def spdx_document(data: Any) -> dict[str, Any]:
    """The SPDX document in ``data``: the ``predicate`` of an in-toto Statement, or the document itself."""
    if isinstance(data, dict) and data.get("predicateType") == SPDX_PREDICATE:
        data = data.get("predicate")
    if not isinstance(data, dict) or not str(data.get("spdxVersion", "")).startswith("SPDX-"):
        raise ValueError("not an SPDX JSON document (no spdxVersion) nor an in-toto Statement holding one")
    return data


def validate_spdx(data: Any) -> list[str]:
    """spdx-tools' full validation of an SPDX JSON document or BuildKit statement; empty when valid."""
    from spdx_tools.spdx.parser.error import SPDXParsingError
    from spdx_tools.spdx.parser.parse_anything import parse_file
    from spdx_tools.spdx.validation.document_validator import validate_full_spdx_document

    try:
        document = spdx_document(data)
    except ValueError as error:
        return [str(error)]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "sbom.spdx.json"
        path.write_text(json.dumps(document), encoding="utf-8")
        try:
            parsed = parse_file(str(path))
        except SPDXParsingError as error:
            return [f"SPDX parse error: {message}" for message in error.get_messages()]
    return [message.validation_message for message in validate_full_spdx_document(parsed)]


def validate_spdx_file(path: str | Path) -> list[str]:
    """``validate_spdx`` of a JSON file; unreadable or non-JSON files are reported, not raised."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        return [f"{path}: cannot read SPDX JSON: {error}"]
    return validate_spdx(data)

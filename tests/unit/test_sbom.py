"""CycloneDX 1.6 SBOM of the environment and the model; SPDX validation of BuildKit's SBOM."""

from __future__ import annotations

import copy
import datetime as dt
import json
from email.message import Message
from pathlib import Path
from typing import Any

import pytest

from qwen3_tts_native.cli import main
from qwen3_tts_native.release.model_pin import shipped_pin
from qwen3_tts_native.release.sbom import (
    PythonDistribution,
    SbomError,
    build_sbom,
    declared_license,
    installed_distributions,
    requirement_closure,
    validate_cyclonedx,
)
from qwen3_tts_native.release.spdx import validate_spdx, validate_spdx_file

ROOT = Path(__file__).resolve().parents[2]
EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def distributions() -> list[PythonDistribution]:
    return installed_distributions()


@pytest.fixture(scope="module")
def document(distributions: list[PythonDistribution]) -> dict[str, Any]:
    return build_sbom(distributions, shipped_pin(), timestamp=EPOCH)


def test_document_passes_the_strict_validator_and_names_every_distribution(
    distributions: list[PythonDistribution], document: dict[str, Any]
) -> None:
    assert document["specVersion"] == "1.6"
    assert validate_cyclonedx(document) == []
    assert document["metadata"]["component"]["name"] == "qwen3-tts-native"
    purls = {c.get("purl") for c in document["components"]}
    for dist in distributions:
        if dist.key != "qwen3-tts-native":
            assert f"pkg:pypi/{dist.key}@{dist.version}".replace("+", "%2B") in purls


def test_model_component_carries_files_hashes_and_model_card(document: dict[str, Any]) -> None:
    pin = shipped_pin()
    (model,) = [c for c in document["components"] if c["type"] == "machine-learning-model"]
    identity = (model["group"], model["name"], model["version"])
    assert identity == ("Qwen", "Qwen3-TTS-12Hz-1.7B-VoiceDesign", pin.revision)
    assert model["purl"] == f"pkg:huggingface/Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign@{pin.revision}"
    assert model["licenses"] == [{"license": {"id": "Apache-2.0", "acknowledgement": "declared"}}]
    hashes = {f["name"]: [h["content"] for h in f.get("hashes", [])] for f in model["components"]}
    assert hashes["model.safetensors"] == ["391e8db219f292c515297cdceeb43e4eae67cdde35fa57e79a6a8a532fca0522"]
    assert hashes["speech_tokenizer/model.safetensors"] == [
        "836b7b357f5ea43e889936a3709af68dfe3751881acefe4ecf0dbd30ba571258"
    ]
    assert hashes["config.json"] == []  # pinned by git blob id only: a property, not a false SHA-256
    assert model["modelCard"]["modelParameters"]["task"] == "text-to-speech"
    root_ref = document["metadata"]["component"]["bom-ref"]
    root_deps = next(d for d in document["dependencies"] if d["ref"] == root_ref)
    assert model["bom-ref"] in root_deps["dependsOn"]


def test_validator_rejects_what_the_schema_does_not_allow(document: dict[str, Any]) -> None:
    broken = copy.deepcopy(document)
    broken["components"][0]["type"] = "wheel"
    assert validate_cyclonedx(broken)
    broken = copy.deepcopy(document)
    next(c for c in broken["components"] if "modelCard" in c)["modelCard"]["vibe"] = "good"
    assert validate_cyclonedx(broken)


def test_build_is_deterministic_for_a_fixed_timestamp(
    distributions: list[PythonDistribution], document: dict[str, Any]
) -> None:
    again = build_sbom(distributions, shipped_pin(), timestamp=EPOCH)
    assert json.dumps(again, sort_keys=True) == json.dumps(document, sort_keys=True)


def test_licence_sources_in_order_of_preference() -> None:
    def meta(**fields: str | list[str]) -> Message:
        message = Message()
        for name, value in fields.items():
            for item in value if isinstance(value, list) else [value]:
                message[name.replace("_", "-")] = item
        return message

    mit = "License :: OSI Approved :: MIT License"
    both = meta(License_Expression="MIT OR Apache-2.0", License="BSD", Classifier=mit)
    assert declared_license(both).expression == "MIT OR Apache-2.0"
    assert declared_license(meta(License="Apache-2.0")).source == "License"
    classifier = meta(License="Apache", Classifier="License :: OSI Approved :: Apache Software License")
    declared = declared_license(classifier)
    assert (declared.expression, declared.source) == ("Apache-2.0", "classifiers")
    assert declared_license(meta(License="BSD")).names == ("BSD",)
    assert declared_license(meta(License="line one\nline two")).source == "none"


def test_runtime_closure_excludes_development_tools(distributions: list[PythonDistribution]) -> None:
    keys = {dist.key for dist in requirement_closure(distributions)}
    assert {"qwen3-tts-native", "torch", "fastapi", "jsonschema"} <= keys
    assert not keys & {"pytest", "ruff", "mypy", "sigstore"}
    with pytest.raises(SbomError, match="not installed"):
        requirement_closure(distributions, root="no-such-distribution")


def test_cli_writes_a_valid_sbom(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sbom.cdx.json"
    pin = ROOT / "release/pins/qwen3-tts-12hz-1.7b-voicedesign.json"
    assert main(["release", "sbom", "--model-manifest", str(pin), "-o", str(out)]) == 0
    assert validate_cyclonedx(json.loads(out.read_text())) == []
    assert main(["release", "sbom", "--model-manifest", str(tmp_path / "none.json"), "-o", str(out)]) == 2


SPDX: dict[str, Any] = {
    "spdxVersion": "SPDX-2.3",
    "dataLicense": "CC0-1.0",
    "SPDXID": "SPDXRef-DOCUMENT",
    "name": "ghcr.io/example/qwen3-tts-native",
    "documentNamespace": "https://example.invalid/spdx/qwen3-tts-native-1",
    "creationInfo": {"created": "2026-01-01T00:00:00Z", "creators": ["Tool: buildkit-syft-scanner"]},
    "packages": [
        {
            "SPDXID": "SPDXRef-Package-python-torch",
            "name": "torch",
            "versionInfo": "2.13.0",
            "downloadLocation": "NOASSERTION",
            "filesAnalyzed": False,
        }
    ],
    "relationships": [
        {
            "spdxElementId": "SPDXRef-DOCUMENT",
            "relationshipType": "DESCRIBES",
            "relatedSpdxElement": "SPDXRef-Package-python-torch",
        }
    ],
}


def test_spdx_validation_of_buildkit_statements_and_documents(tmp_path: Path) -> None:
    statement = {
        "_type": "https://in-toto.io/Statement/v0.1",
        "predicateType": "https://spdx.dev/Document",
        "subject": [],
        "predicate": SPDX,
    }
    assert validate_spdx(SPDX) == []
    assert validate_spdx(statement) == []
    dangling = copy.deepcopy(SPDX)
    dangling["relationships"][0]["relatedSpdxElement"] = "SPDXRef-Package-missing"
    assert any("SPDXRef-Package-missing" in problem for problem in validate_spdx(dangling))
    assert validate_spdx({"bomFormat": "CycloneDX"}) == [
        "not an SPDX JSON document (no spdxVersion) nor an in-toto Statement holding one"
    ]
    (tmp_path / "bad.json").write_text("{")
    assert validate_spdx_file(tmp_path / "bad.json")[0].startswith(f"{tmp_path / 'bad.json'}: cannot read")

"""CycloneDX 1.6 SBOM of a Python environment and the model it serves.

Python distributions come from ``importlib.metadata`` (the current environment, or the ``site-packages``
folders given), each with its PyPI purl and its declared licence: the PEP 639 ``License-Expression``;
else a ``License`` field that is a valid SPDX expression; else the ``License ::`` classifiers mapped to
SPDX ids; else the free-text ``License`` field or classifier as a licence name.

Hashes: an installed distribution keeps no hash of the archive it came from, so ``hashes`` is filled
only where PEP 610 ``direct_url.json`` records the archive's SHA-256. Every component also carries the
property ``qwen3-tts:installed-record-sha256``, the SHA-256 of its ``RECORD`` file (which lists the hash
of every installed file), so drift in the installed files shows as a changed property.

The model is a ``machine-learning-model`` component whose sub-components are its files with their
SHA-256 (from the model manifest), plus a ``modelCard``. cyclonedx-python-lib does not model
``modelCard``, so it is injected into the JSON; the whole document is then checked with the library's
strict 1.6 validator.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import os
import re
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from qwen3_tts_native.engine.identity import COMPONENTS, ModelManifest

PROJECT = "qwen3-tts-native"
PROPERTY_PREFIX = "qwen3-tts"
_CLASSIFIER_SPDX = {
    "MIT License": "MIT",
    "MIT No Attribution License (MIT-0)": "MIT-0",
    "Apache Software License": "Apache-2.0",
    "ISC License (ISCL)": "ISC",
    "Mozilla Public License 2.0 (MPL 2.0)": "MPL-2.0",
    "Python Software Foundation License": "PSF-2.0",
    "The Unlicense (Unlicense)": "Unlicense",
    "zlib/libpng License": "Zlib",
    "Boost Software License 1.0 (BSL-1.0)": "BSL-1.0",
    "GNU General Public License v2 (GPLv2)": "GPL-2.0-only",
    "GNU General Public License v3 (GPLv3)": "GPL-3.0-only",
    "GNU Lesser General Public License v2 or later (LGPLv2+)": "LGPL-2.0-or-later",
    "GNU Lesser General Public License v3 (LGPLv3)": "LGPL-3.0-only",
    "GNU Affero General Public License v3": "AGPL-3.0-only",
}


class SbomError(Exception):
    """The SBOM could not be built, or the built document fails the CycloneDX 1.6 schema."""


@dataclass(frozen=True)
class DeclaredLicense:
    """A distribution's licence: an SPDX expression when one could be established, else free-text names."""

    expression: str | None
    names: tuple[str, ...]
    source: str  # "License-Expression", "License", "classifiers", or "none"

    @property
    def text(self) -> str:
        return self.expression or "; ".join(self.names) or "(none declared)"


@dataclass(frozen=True)
class PythonDistribution:
    name: str
    key: str  # PEP 503 normalised name
    version: str
    license: DeclaredLicense
    requires_dist: tuple[str, ...]
    archive_sha256: str | None
    record_sha256: str | None

    @property
    def purl(self) -> str:
        from packageurl import PackageURL

        return str(PackageURL(type="pypi", name=self.key, version=self.version))


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_distributions(paths: Sequence[str] | None = None) -> list[PythonDistribution]:
    """Every distribution on ``paths`` (default ``sys.path``); the first of a name wins, as for imports."""
    found: dict[str, PythonDistribution] = {}
    source = metadata.distributions() if paths is None else metadata.distributions(path=list(paths))
    for dist in source:
        name = dist.metadata["Name"]
        if not name or normalize(name) in found:
            continue
        record = dist.read_text("RECORD")
        found[normalize(name)] = PythonDistribution(
            name=name,
            key=normalize(name),
            version=dist.version,
            license=declared_license(dist.metadata),
            requires_dist=tuple(dist.requires or ()),
            archive_sha256=_archive_sha256(dist.read_text("direct_url.json")),
            record_sha256=hashlib.sha256(record.encode()).hexdigest() if record is not None else None,
        )
    return sorted(found.values(), key=lambda item: item.key)


def declared_license(meta: Any) -> DeclaredLicense:
    """PEP 639 expression, else an SPDX ``License`` field, else classifiers, else free text."""
    licensing = spdx_licensing()

    def spdx(text: str | None) -> str | None:
        if not text or "\n" in text.strip():
            return None
        info = licensing.validate(text.strip())
        return str(info.normalized_expression) if not info.errors and info.normalized_expression else None

    expression = meta.get("License-Expression")
    if expression:
        return DeclaredLicense(spdx(expression) or expression.strip(), (), "License-Expression")
    field = meta.get("License")
    field = field.strip() if field and field.strip() != "UNKNOWN" else None
    if spdx(field):
        return DeclaredLicense(spdx(field), (), "License")
    declared = [c for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
    classifiers = [c.rsplit(" :: ", 1)[-1] for c in declared]
    classifiers = [c for c in classifiers if c not in ("OSI Approved", "DFSG approved")]
    mapped = [_CLASSIFIER_SPDX.get(c) for c in classifiers]
    if classifiers and all(mapped):
        return DeclaredLicense(" AND ".join(sorted({m for m in mapped if m})), (), "classifiers")
    if field and "\n" not in field and len(field) <= 100:
        return DeclaredLicense(None, (field,), "License")
    if classifiers:
        return DeclaredLicense(None, tuple(classifiers), "classifiers")
    return DeclaredLicense(None, (), "none")


@functools.cache
def spdx_licensing() -> Any:
    """The SPDX ``Licensing`` of license-expression (slow to build, so built once)."""
    from license_expression import get_spdx_licensing

    return get_spdx_licensing()


def requirement_closure(
    distributions: Sequence[PythonDistribution], root: str = PROJECT, extras: Iterable[str] = ()
) -> list[PythonDistribution]:
    """``root`` and every installed distribution it requires, transitively, for this platform."""
    by_key = {dist.key: dist for dist in distributions}
    if normalize(root) not in by_key:
        raise SbomError(f"{root} is not installed in the inspected environment")
    wanted: dict[str, set[str]] = {normalize(root): set(extras)}
    queue = [normalize(root)]
    while queue:
        dist = by_key[queue.pop()]
        for key, extra_set in _requirements(dist, wanted[dist.key]):
            if key in by_key and (key not in wanted or not extra_set <= wanted[key]):
                wanted[key] = wanted.get(key, set()) | extra_set
                queue.append(key)
    return [by_key[key] for key in sorted(wanted)]


def build_sbom(
    distributions: Sequence[PythonDistribution],
    model: ModelManifest | None,
    timestamp: dt.datetime | None = None,
) -> dict[str, Any]:
    """The CycloneDX 1.6 document as JSON data, validated; raises SbomError listing schema errors."""
    from cyclonedx.model.bom import Bom
    from cyclonedx.output.json import JsonV1Dot6

    root_dist = next((dist for dist in distributions if dist.key == PROJECT), None)
    bom = Bom()
    bom.metadata.timestamp = timestamp or _timestamp()
    components = {dist.key: _python_component(dist) for dist in distributions if dist is not root_dist}
    for component in components.values():
        bom.components.add(component)
    root = _python_component(root_dist, application=True) if root_dist else None
    if root is not None:
        bom.metadata.component = root
    model_component = _model_component(model) if model else None
    if model_component is not None:
        bom.components.add(model_component)
    for dist in distributions:
        component = root if dist is root_dist else components[dist.key]
        if component is None:
            continue
        needs = [components[key] for key, _ in _requirements(dist, set()) if key in components]
        if dist is root_dist and model_component is not None:
            needs.append(model_component)
        bom.register_dependency(component, needs)
    seed = json.dumps(
        [[dist.key, dist.version] for dist in distributions] + [model.to_json() if model else None],
        sort_keys=True,
    )
    bom.serial_number = uuid.uuid5(uuid.NAMESPACE_URL, f"urn:qwen3-tts:sbom:{seed}")
    document: dict[str, Any] = json.loads(JsonV1Dot6(bom).output_as_string())
    if model is not None:
        for item in document.get("components", []):
            if item.get("type") == "machine-learning-model":
                item["modelCard"] = model_card(model)
    problems = validate_cyclonedx(document)
    if problems:
        raise SbomError("the SBOM fails the CycloneDX 1.6 schema:\n  " + "\n  ".join(problems))
    return document


def validate_cyclonedx(document: dict[str, Any]) -> list[str]:
    """Problems reported by cyclonedx-python-lib's strict CycloneDX 1.6 JSON validator (empty: valid)."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    errors = JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(document), all_errors=True)
    if errors is None:
        return []
    return [str(getattr(error, "data", error)).splitlines()[0] for error in errors]


def model_card(model: ModelManifest) -> dict[str, Any]:
    """The CycloneDX ``modelCard`` of a Qwen3-TTS VoiceDesign snapshot."""
    return {
        "modelParameters": {
            "approach": {"type": "supervised"},
            "task": "text-to-speech",
            "architectureFamily": "Qwen3-TTS",
            "modelArchitecture": "talker transformer, 15-codebook code predictor, 12.5 Hz speech decoder",
            "inputs": [{"format": "text/plain"}],
            "outputs": [{"format": "audio/wav"}, {"format": "audio/L16"}],
        },
        "considerations": {
            "useCases": ["speech synthesis from text and a natural-language voice description"],
            "technicalLimitations": [
                "the speech encoder in speech_tokenizer/model.safetensors is shipped but never run",
            ],
        },
        "properties": [
            {"name": f"{PROPERTY_PREFIX}:component:{name}:{field}", "value": str(getattr(count, field))}
            for name, count in ((name, model.components[name]) for name in COMPONENTS)
            for field in ("tensors", "parameters")
        ],
    }


def _python_component(dist: PythonDistribution, application: bool = False) -> Any:
    from cyclonedx.model.component import Component, ComponentType
    from packageurl import PackageURL

    properties = [_property("license-source", dist.license.source)]
    if dist.record_sha256:
        properties.append(_property("installed-record-sha256", dist.record_sha256))
    return Component(
        type=ComponentType.APPLICATION if application else ComponentType.LIBRARY,
        name=dist.name,
        version=dist.version,
        bom_ref=dist.purl,
        purl=PackageURL(type="pypi", name=dist.key, version=dist.version),
        licenses=_licenses(dist.license),
        hashes=_sha256(dist.archive_sha256),
        properties=properties,
    )


def _model_component(model: ModelManifest) -> Any:
    from cyclonedx.model import ExternalReference, ExternalReferenceType, XsUri
    from cyclonedx.model.component import Component, ComponentType
    from packageurl import PackageURL

    owner, name = model.repository.split("/", 1)
    ref = f"model:{model.repository}@{model.revision}"
    files = []
    for entry in model.files:
        properties = [_property("bytes", str(entry.bytes))]
        if entry.git_blob_sha1:
            properties.append(_property("git-blob-sha1", entry.git_blob_sha1))
        if entry.safetensors:
            properties += [
                _property("safetensors:tensors", str(entry.safetensors.tensors)),
                _property("safetensors:parameters", str(entry.safetensors.parameters)),
                _property("safetensors:dtypes", ",".join(entry.safetensors.dtypes)),
            ]
        files.append(
            Component(
                type=ComponentType.FILE,
                name=entry.path,
                bom_ref=f"{ref}#{entry.path}",
                hashes=_sha256(entry.sha256),
                properties=properties,
            )
        )
    hub = owner != "local"
    return Component(
        type=ComponentType.MACHINE_LEARNING_MODEL,
        group=owner,
        name=name,
        version=model.revision,
        bom_ref=ref,
        purl=PackageURL("huggingface", namespace=owner, name=name, version=model.revision) if hub else None,
        licenses=_licenses(DeclaredLicense(model.license, (), "manifest")) if model.license else [],
        external_references=[
            ExternalReference(
                type=ExternalReferenceType.DISTRIBUTION,
                url=XsUri(f"https://huggingface.co/{model.repository}/tree/{model.revision}"),
            )
        ]
        if hub
        else [],
        components=files,
    )


def _licenses(declared: DeclaredLicense) -> list[Any]:
    from cyclonedx.contrib.license.factories import LicenseFactory
    from cyclonedx.model.license import LicenseAcknowledgement

    factory = LicenseFactory()
    declared_ack = LicenseAcknowledgement.DECLARED
    if declared.expression:
        return [factory.make_from_string(declared.expression, license_acknowledgement=declared_ack)]
    return [factory.make_with_name(name, acknowledgement=declared_ack) for name in declared.names]


def _property(name: str, value: str) -> Any:
    from cyclonedx.model import Property

    return Property(name=f"{PROPERTY_PREFIX}:{name}", value=value)


def _sha256(digest: str | None) -> list[Any]:
    from cyclonedx.model import HashAlgorithm, HashType

    return [HashType(alg=HashAlgorithm.SHA_256, content=digest)] if digest else []


def _requirements(dist: PythonDistribution, extras: set[str]) -> list[tuple[str, set[str]]]:
    """Installed-name keys this distribution requires on this platform with ``extras`` active."""
    from packaging.requirements import InvalidRequirement, Requirement

    needed = []
    for text in dist.requires_dist:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            continue
        marker = requirement.marker
        if marker is None or any(marker.evaluate({"extra": extra}) for extra in (extras or {""})):
            needed.append((normalize(requirement.name), set(requirement.extras)))
    return needed


def _archive_sha256(direct_url: str | None) -> str | None:
    if not direct_url:
        return None
    try:
        info = json.loads(direct_url).get("archive_info", {})
    except (json.JSONDecodeError, AttributeError):
        return None
    value = (info.get("hashes") or {}).get("sha256")
    if value is None and str(info.get("hash", "")).startswith("sha256="):
        value = info["hash"].split("=", 1)[1]
    return value if isinstance(value, str) and re.fullmatch(r"[0-9a-f]{64}", value) else None


def _timestamp() -> dt.datetime:
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch:
        return dt.datetime.fromtimestamp(int(epoch), dt.UTC)
    return dt.datetime.now(dt.UTC).replace(microsecond=0)

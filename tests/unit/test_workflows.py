"""GitHub workflows: schema-valid, pinned, least privilege, building exactly what release/buildx.py says."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from qwen3_tts_native.cli import main
from qwen3_tts_native.release.buildx import buildx_command

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / ".github/workflows").glob("*.yml"))
SHELL_VALUES = {
    "IMAGE": "ghcr.io/owner/repo",
    "GITHUB_SHA": "a" * 40,
    "GITHUB_REF_NAME": "v1.2.3",
    "BUILD_DATE": "2026-01-01T00:00:00+00:00",
    "GITHUB_SERVER_URL": "https://github.com",
    "GITHUB_REPOSITORY": "owner/repo",
    "MODEL_MANIFEST_SHA256": "f" * 64,
}


def load(path: Path) -> dict[str, Any]:
    document = yaml.safe_load(path.read_text())
    if True in document:  # YAML 1.1 reads the key `on` as a boolean
        document["on"] = document.pop(True)
    return document


def vendored_schema(name: str) -> dict[str, Any]:
    folder = "custom" if name.startswith("github-workflows-") else "vendor"
    package = f"check_jsonschema.builtin_schemas.{folder}"
    return json.loads(resources.files(package).joinpath(f"{name}.json").read_text())


def steps(document: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(job, step) for job, spec in document["jobs"].items() for step in spec.get("steps", [])]


def test_workflows_exist() -> None:
    assert [path.name for path in WORKFLOWS] == ["ci.yml", "release.yml"]


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_is_valid_against_schemastore(path: Path) -> None:
    document = load(path)
    for name in ("github-workflows", "github-workflows-require-timeout"):
        schema = vendored_schema(name)
        validator = jsonschema.validators.validator_for(schema)(schema)
        errors = sorted(validator.iter_errors(document), key=lambda error: list(error.path))
        assert not errors, [f"{list(error.path)}: {error.message}" for error in errors[:5]]


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_actions_are_pinned_by_commit_and_permissions_are_minimal(path: Path) -> None:
    document = load(path)
    assert document["permissions"] == {"contents": "read"}
    for job, step in steps(document):
        if "uses" in step:
            pinned = re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", step["uses"])
            assert pinned, f"{job}: {step['uses']} is not pinned by commit"
            if step["uses"].startswith("actions/checkout@"):
                assert step["with"]["persist-credentials"] is False
    for job, spec in document["jobs"].items():
        granted = spec.get("permissions", {})
        assert granted.get("id-token") in (None, "write")
        if granted.get("id-token") == "write":
            assert job == "sign", f"only the signing job may mint OIDC tokens, not {job}"


def test_ci_runs_the_entry_point_and_strict_pip_audit_and_secret_scan() -> None:
    document = load(ROOT / ".github/workflows/ci.yml")
    runs = {
        job: " ".join(step.get("run", "") for _, step in steps({"jobs": {job: spec}}))
        for job, spec in document["jobs"].items()
    }
    assert "bash .ci/run" in runs["test"]
    assert re.search(r"pip-audit --strict\b", runs["pip-audit"])
    assert "qwen3-tts release secrets" in runs["hygiene"]
    checkout = next(
        step
        for job, step in steps(document)
        if job == "hygiene" and step.get("uses", "").startswith("actions/checkout@")
    )
    assert checkout["with"]["fetch-depth"] == 0  # the whole history is scanned


def test_release_runs_in_order_with_the_release_commands() -> None:
    document = load(ROOT / ".github/workflows/release.yml")
    assert document["on"] == {"push": {"tags": ["v*"]}}
    jobs = document["jobs"]
    assert jobs["build"]["needs"] == "base-images"
    assert set(jobs["promote"]["needs"]) >= {"acceptance"} and "gate" in jobs["acceptance"]["needs"]
    text = (ROOT / ".github/workflows/release.yml").read_text()
    for command in (
        "qwen3-tts release build",
        "qwen3-tts release sign",
        "qwen3-tts release verify",
        "qwen3-tts release promote",
        "qwen3-tts release sbom",
    ):
        assert command in text
    acceptance = " ".join(step.get("run", "") for _, step in steps({"jobs": {"a": jobs["acceptance"]}}))
    for flag in (
        "--read-only",
        "--cap-drop ALL",
        "--security-opt no-new-privileges",
        "--pids-limit",
        "--tmpfs /tmp",
        "docker stop",
    ):
        assert flag in acceptance


def test_release_build_arguments_exist_in_the_containerfile() -> None:
    declared = set(re.findall(r"^ARG (\w+)", (ROOT / "Containerfile").read_text(), re.MULTILINE))
    used = set(re.findall(r"--build-arg \"(\w+)=", _build_step_script()))
    assert used and used <= declared, used - declared


def _build_step_script() -> str:
    document = load(ROOT / ".github/workflows/release.yml")
    (step,) = [step for job, step in steps(document) if step.get("id") == "build"]
    return str(step["run"])


def _build_command() -> list[str]:
    script = _build_step_script().replace("\\\n", " ")
    (line,) = [line for line in script.splitlines() if line.strip().startswith("qwen3-tts release build")]

    def value(match: re.Match[str]) -> str:
        return SHELL_VALUES[match.group(1) or match.group(2)]

    expanded = re.sub(r"\$\{(\w+)(?:,,)?\}|\$(\w+)", value, line)
    assert "$" not in expanded
    return shlex.split(expanded)[1:]


def test_release_build_step_runs_exactly_buildx_command(monkeypatch: pytest.MonkeyPatch) -> None:
    import qwen3_tts_native.release.build as build_module

    argv = _build_command()
    assert argv[:3] == ["release", "build", "ghcr.io/owner/repo:candidate-" + "a" * 40]
    ran: list[list[str]] = []

    def fake_run(command: list[str], **_: Any) -> subprocess.CompletedProcess[bytes]:
        ran.append(list(command))
        return subprocess.CompletedProcess(command, 1)

    monkeypatch.setattr(build_module.subprocess, "run", fake_run)
    assert main(argv) == 1  # the fake buildx fails, after the command line was built
    (command,) = ran
    metadata = command[command.index("--metadata-file") + 1]
    assert command == buildx_command(
        image="ghcr.io/owner/repo:candidate-" + "a" * 40,
        context=Path("."),
        containerfile=Path("Containerfile"),
        platforms=["linux/amd64", "linux/arm64"],
        build_args={
            "VERSION": "v1.2.3",
            "VCS_REF": "a" * 40,
            "BUILD_DATE": SHELL_VALUES["BUILD_DATE"],
            "SOURCE_URL": "https://github.com/owner/repo",
            "MODEL_MANIFEST_SHA256": "f" * 64,
        },
        metadata_file=metadata,
    )
    for flag in ("--sbom=true", "--provenance=mode=max,version=v1", "--push"):
        assert flag in command
    assert command[command.index("--platform") + 1] == "linux/amd64,linux/arm64"


def test_buildx_command_shape_and_refusals() -> None:
    command = buildx_command(
        image="r/x:1",
        context=".",
        containerfile="Containerfile",
        platforms=["linux/arm64"],
        build_args={"B": "2", "A": "1"},
        metadata_file="m.json",
        build_contexts={"model": "/models/x"},
        push=False,
    )
    assert command == [
        "docker",
        "buildx",
        "build",
        "--file",
        "Containerfile",
        "--platform",
        "linux/arm64",
        "--tag",
        "r/x:1",
        "--metadata-file",
        "m.json",
        "--sbom=true",
        "--provenance=mode=max,version=v1",
        "--build-arg",
        "A=1",
        "--build-arg",
        "B=2",
        "--build-context",
        "model=/models/x",
        ".",
    ]
    common: dict[str, Any] = {"image": "r/x:1", "context": ".", "containerfile": "C", "metadata_file": "m"}
    with pytest.raises(ValueError, match="credential"):
        buildx_command(platforms=["linux/amd64"], build_args={"HF_TOKEN": "x"}, **common)
    with pytest.raises(ValueError, match="OS/ARCH"):
        buildx_command(platforms=["amd64"], build_args={}, **common)

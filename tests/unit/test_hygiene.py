"""Hygiene gates: licence allowlist and the secret scan of the whole git history."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from pathlib import Path

import pytest

from qwen3_tts_native.cli import main
from qwen3_tts_native.release.hygiene import (
    LicensedItem,
    LicensePolicy,
    Waiver,
    items_from_sbom,
    license_violations,
    load_policy,
    scan_git_history,
)

# Assembled at run time so that this file itself holds no credential-shaped string.
AWS_KEY = "AKIA" + "IOSFODNN7" + "EXAMPLE"
PRIVATE_KEY_LINE = "-----BEGIN " + "RSA PRIVATE KEY-----"

POLICY = LicensePolicy(
    allow=frozenset({"MIT", "Apache-2.0", "BSD-3-Clause"}),
    allow_exceptions=frozenset({"LLVM-exception"}),
    allow_names=frozenset({"BSD License"}),
    waivers=(
        Waiver("nvidia-*", "CUDA runtime", dt.date(2030, 1, 1)),
        Waiver("old-*", "expired", dt.date(2020, 1, 1)),
    ),
)


def item(name: str, *expressions: str, names: tuple[str, ...] = ()) -> LicensedItem:
    return LicensedItem(name, "1.0", expressions, names)


def test_allowlist_evaluates_spdx_expressions() -> None:
    allowed = [
        item("a", "MIT"),
        item("b", "GPL-3.0-only OR MIT"),
        item("c", "Apache-2.0 AND Apache-2.0 WITH LLVM-exception"),
        item("d", names=("BSD License",)),
        item("nvidia-cublas", names=("NVIDIA Proprietary Software",)),
    ]
    assert license_violations(allowed, POLICY) == []


def test_allowlist_fails_on_a_disallowed_licence() -> None:
    problems = license_violations(
        [
            item("soxr", "LGPL-2.1-or-later"),
            item("mixed", "MIT AND GPL-2.0-only"),
            item("exception", "GPL-2.0-only WITH Classpath-exception-2.0"),
            item("bare"),
            item("named", names=("Proprietary",)),
            item("old-lib", names=("Proprietary",)),
        ],
        POLICY,
    )
    assert [p.split(":")[0] for p in problems] == [
        "soxr 1.0",
        "mixed 1.0",
        "exception 1.0",
        "bare 1.0",
        "named 1.0",
        "old-lib 1.0",
    ]
    assert "LGPL-2.1-or-later is not allowed" in problems[0]
    assert "declares no licence" in problems[3]
    assert "expired on 2020-01-01" in problems[5]


def test_shipped_policy_loads_and_covers_the_runtime(capsys: pytest.CaptureFixture[str]) -> None:
    policy = load_policy()
    assert {"Apache-2.0", "MIT", "BSD-3-Clause"} <= policy.allow
    assert all(waiver.reason for waiver in policy.waivers)
    assert main(["release", "licenses"]) == 0, capsys.readouterr().err


def test_licence_gate_on_an_sbom(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sbom = {
        "bomFormat": "CycloneDX",
        "specVersion": "1.6",
        "metadata": {
            "component": {
                "type": "application",
                "name": "app",
                "version": "1",
                "licenses": [{"license": {"id": "Apache-2.0"}}],
            }
        },
        "components": [
            {
                "type": "library",
                "name": "ok",
                "version": "1",
                "licenses": [{"expression": "MIT OR GPL-2.0-only"}],
            },
            {
                "type": "library",
                "name": "copyleft",
                "version": "2",
                "licenses": [{"license": {"id": "AGPL-3.0-only"}}],
            },
            {"type": "file", "name": "weights.bin"},
        ],
    }
    assert [i.name for i in items_from_sbom(sbom)] == ["app", "ok", "copyleft"]
    path = tmp_path / "sbom.json"
    path.write_text(json.dumps(sbom))
    assert main(["release", "licenses", "--sbom", str(path)]) == 1
    err = capsys.readouterr().err
    assert "copyleft 2: AGPL-3.0-only is not allowed" in err
    assert "ok 1" not in err


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    git(path, "init", "-q")
    git(path, "config", "user.email", "ci@example.invalid")
    git(path, "config", "user.name", "ci")
    (path / "README.md").write_text("# project\n")
    (path / "pins.json").write_text(json.dumps({"sha256": "ab" * 32, "git": "cd" * 20}) + "\n")
    git(path, "add", ".")
    git(path, "commit", "-qm", "initial")
    return path


def test_secret_scan_passes_on_a_clean_history(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scan = scan_git_history(repo)
    assert (scan.commits, scan.blobs_scanned, scan.findings) == (1, 2, ())
    assert main(["release", "secrets", "--repo", str(repo)]) == 0
    assert "no secrets found: 1 commits" in capsys.readouterr().out


def test_secret_scan_finds_a_secret_deleted_in_a_later_commit(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (repo / "deploy").mkdir()
    (repo / "deploy/settings.py").write_text(f'AWS_ACCESS_KEY_ID = "{AWS_KEY}"\nregion = "eu"\n')
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "add deployment settings")
    leaked_in = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "rm", "-q", "deploy/settings.py")
    git(repo, "commit", "-qm", "remove settings")
    git(repo, "checkout", "-qb", "side")
    (repo / "key.pem").write_text(PRIVATE_KEY_LINE + "\nMIIB\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "on a side branch")
    git(repo, "checkout", "-q", "-")
    assert not (repo / "deploy/settings.py").exists()

    scan = scan_git_history(repo)
    assert [(f.path, f.line, f.commit, f.kind) for f in scan.findings] == [
        ("deploy/settings.py", 1, leaked_in, "AWS Access Key"),
        ("key.pem", 1, git(repo, "rev-parse", "side").strip(), "Private Key"),
    ]
    assert main(["release", "secrets", "--repo", str(repo)]) == 1
    output = capsys.readouterr()
    assert f"deploy/settings.py:1 in commit {leaked_in[:12]}: AWS Access Key" in output.err
    assert AWS_KEY not in output.err + output.out


def test_allowlisted_line_and_binary_blobs(repo: Path) -> None:
    (repo / "example.py").write_text(f'EXAMPLE = "{AWS_KEY}"  # pragma: allowlist secret\n')
    (repo / "blob.bin").write_bytes(b"\0" + AWS_KEY.encode())
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "docs")
    scan = scan_git_history(repo)
    assert scan.findings == ()
    assert scan.blobs_skipped == 1


def test_secret_scan_outside_a_repository(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["release", "secrets", "--repo", str(tmp_path)]) == 2
    assert "git rev-list" in capsys.readouterr().err

"""`qwen3-tts release` argument handling: configuration mistakes exit 2 before anything is contacted."""

from __future__ import annotations

from pathlib import Path

import pytest

from qwen3_tts_native.cli import main

DIGEST = "sha256:" + "ef" * 32
WORKFLOW = "https://github.com/acme/tts/.github/workflows/release.yml"


@pytest.mark.parametrize(
    "argv",
    [
        ["release", "verify", f"127.0.0.1:9/acme/tts@{DIGEST}"],
        ["release", "verify", f"127.0.0.1:9/acme/tts@{DIGEST}", "--certificate-workflow", WORKFLOW],
        [
            "release",
            "verify",
            f"127.0.0.1:9/acme/tts@{DIGEST}",
            "--certificate-workflow",
            "https://example.com/x",
            "--certificate-ref",
            "refs/tags/v1",
        ],
        ["release", "verify", f"127.0.0.1:9/acme/tts@{DIGEST}", "--public-key", "/nonexistent.pub"],
        ["release", "sign", "127.0.0.1:9/acme/tts:v1", "--key", "/nonexistent.key"],
        ["release", "promote", f"127.0.0.1:9/acme/tts@{DIGEST}", "--version", "1.0", "--public-key", "/x"],
        ["release", "build", "127.0.0.1:9/acme/tts:v1", "--build-arg", "NOVALUE"],
    ],
    ids=[
        "no-signer",
        "workflow-without-ref",
        "not-a-workflow",
        "missing-key",
        "tag-signing",
        "bad-version",
        "bad-build-arg",
    ],
)
def test_configuration_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_verify_help_documents_checks_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["release", "verify", "--help"])
    text = capsys.readouterr().out
    for check_id in (
        "reference.pinned",
        "manifest.digest",
        "index.platforms",
        "signature.image",
        "attestation.sbom",
        "attestation.model",
        "provenance",
        "tags.resolve",
    ):
        assert check_id in text
    assert "2  usage or configuration error" in text


def test_trust_config_must_be_a_client_trust_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "trust.json"
    bad.write_text("{}")
    code = main(
        [
            "release",
            "verify",
            f"127.0.0.1:9/acme/tts@{DIGEST}",
            "--certificate-workflow",
            WORKFLOW,
            "--certificate-ref",
            "refs/tags/v1",
            "--trust-config",
            str(bad),
        ]
    )
    assert code == 2
    assert "ClientTrustConfig" in capsys.readouterr().err

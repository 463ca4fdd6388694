"""Model identity: manifests, fail-closed verification, the shipped pin, fetch from a Hub cache."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from qwen3_tts_native.cli import main
from qwen3_tts_native.engine.errors import SnapshotError
from qwen3_tts_native.engine.identity import (
    MANIFEST_FILENAME,
    ManifestError,
    ModelManifest,
    build_manifest,
    git_blob_sha1,
    load_manifest,
    shipped_manifests,
    verify_snapshot,
    verify_snapshot_for_serving,
    write_manifest,
)
from qwen3_tts_native.release.model_pin import contradictions, pin_snapshot, shipped_pin

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
PINS_JSON = Path(os.environ.get("QWEN3_TTS_SHARED", ROOT.parent / "shared")) / "reference/model/pins.json"
PIN_FILE = ROOT / "release/pins/qwen3-tts-12hz-1.7b-voicedesign.json"


def make_snapshot(root: Path) -> Path:
    """A few hand-made files in the real layout: configs and two small safetensors files."""
    (root / "speech_tokenizer").mkdir(parents=True)
    save_file(
        {
            "talker.model.layers.0.mlp.up_proj.weight": np.ones((4, 8), np.float32),
            "talker.code_predictor.model.norm.weight": np.ones((3,), np.float32),
        },
        str(root / "model.safetensors"),
    )
    save_file(
        {
            "decoder.pre_conv.weight": np.zeros((5,), np.float32),
            "encoder.conv.weight": np.zeros((2, 2), np.float32),
        },
        str(root / "speech_tokenizer/model.safetensors"),
    )
    (root / "config.json").write_text('{"model_type": "qwen3_tts"}\n')
    (root / "speech_tokenizer/config.json").write_text('{"model_type": "qwen3_tts_tokenizer_12hz"}\n')
    return root


@pytest.fixture
def pinned(tmp_path: Path) -> Path:
    snapshot = make_snapshot(tmp_path / "snap")
    assert main(["model", "pin", str(snapshot), "-o", str(snapshot / MANIFEST_FILENAME)]) == 0
    return snapshot


def verify_cli(snapshot: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    code = main(["model", "verify", str(snapshot), *extra])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_manifest_counts_files_tensors_and_components(tmp_path: Path) -> None:
    manifest = build_manifest(make_snapshot(tmp_path / "snap"), "local/snap")
    assert [entry.path for entry in manifest.files] == [
        "config.json",
        "model.safetensors",
        "speech_tokenizer/config.json",
        "speech_tokenizer/model.safetensors",
    ]
    config = manifest.file("config.json")
    assert config is not None
    data = (tmp_path / "snap/config.json").read_bytes()
    assert config.sha256 == hashlib.sha256(data).hexdigest()
    assert config.git_blob_sha1 == git_blob_sha1(data)
    weights = manifest.file("model.safetensors")
    assert weights is not None and weights.safetensors is not None
    summary = weights.safetensors
    assert (summary.tensors, summary.parameters, summary.dtypes) == (2, 35, ("F32",))
    counts = {name: (c.tensors, c.parameters) for name, c in manifest.components.items()}
    assert counts == {
        "talker": (1, 32),
        "code_predictor": (1, 3),
        "speech_decoder": (1, 5),
        "speech_encoder_unused": (1, 4),
    }
    assert manifest.revision.startswith("sha256:")


def test_git_blob_sha1_matches_git(tmp_path: Path) -> None:
    path = tmp_path / "blob.txt"
    path.write_bytes(b"hello\x00world\n")
    expected = subprocess.run(["git", "hash-object", str(path)], capture_output=True, text=True, check=True)
    assert git_blob_sha1(path.read_bytes()) == expected.stdout.strip()


def test_verify_passes_on_an_intact_snapshot(pinned: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, output = verify_cli(pinned, capsys)
    assert code == 0, output
    assert "verified" in output


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        ("missing", "missing file: speech_tokenizer/config.json"),
        ("extra", "extra file: speech_tokenizer/notes.txt"),
        ("flipped", "content mismatch: model.safetensors has sha256"),
        ("truncated", "size mismatch: speech_tokenizer/model.safetensors has"),
        ("symlink", "symlink refused: generation_config.json"),
    ],
)
def test_verify_names_each_damaged_file(
    pinned: Path, capsys: pytest.CaptureFixture[str], damage: str, expected: str
) -> None:
    if damage == "missing":
        (pinned / "speech_tokenizer/config.json").unlink()
    elif damage == "extra":
        (pinned / "speech_tokenizer/notes.txt").write_text("x")
    elif damage == "flipped":
        weights = pinned / "model.safetensors"
        data = bytearray(weights.read_bytes())
        data[-1] ^= 0x01
        weights.write_bytes(bytes(data))
    elif damage == "truncated":
        weights = pinned / "speech_tokenizer/model.safetensors"
        weights.write_bytes(weights.read_bytes()[:-4])
    else:
        (pinned / "generation_config.json").symlink_to(pinned / "config.json")
    code, output = verify_cli(pinned, capsys)
    assert code == 1
    assert expected in output
    assert output.count("\n  ") == 1, output  # exactly the damaged file is reported


def test_verify_with_explicit_manifest_and_usage_errors(
    pinned: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outside = tmp_path / "manifest.json"
    shutil.move(pinned / MANIFEST_FILENAME, outside)
    code, output = verify_cli(pinned, capsys, "--manifest", str(outside))
    assert code == 0, output
    (tmp_path / "broken.json").write_text('{"schema_version": 1}')
    code, output = verify_cli(pinned, capsys, "--manifest", str(tmp_path / "broken.json"))
    assert code == 2 and "is not a valid model manifest" in output


def test_symlinks_pass_only_when_allowed(tmp_path: Path) -> None:
    real = make_snapshot(tmp_path / "real")
    manifest = build_manifest(real, "local/real")
    linked = tmp_path / "linked"
    for entry in manifest.files:
        (linked / entry.path).parent.mkdir(parents=True, exist_ok=True)
        (linked / entry.path).symlink_to(real / entry.path)
    assert all(problem.startswith("symlink refused") for problem in verify_snapshot(linked, manifest))
    assert verify_snapshot(linked, manifest, allow_symlinks=True) == []
    with pytest.raises(SnapshotError, match="symlink refused"):
        build_manifest(linked, "local/linked")


def test_manifest_schema_and_consistency_are_enforced(tmp_path: Path) -> None:
    document = build_manifest(make_snapshot(tmp_path / "snap"), "local/snap").to_json()
    unknown = {**document, "comment": "x"}
    with pytest.raises(ManifestError, match="Additional properties"):
        ModelManifest.from_json(unknown)
    traversal = json.loads(json.dumps(document))
    traversal["files"][0]["path"] = "../etc/passwd"
    with pytest.raises(ManifestError, match="path"):
        ModelManifest.from_json(traversal)
    unpinned = json.loads(json.dumps(document))
    del unpinned["files"][0]["sha256"], unpinned["files"][0]["git_blob_sha1"]
    with pytest.raises(ManifestError):
        ModelManifest.from_json(unpinned)
    wrong_total = json.loads(json.dumps(document))
    wrong_total["components"]["talker"]["parameters"] += 1
    with pytest.raises(ManifestError, match="components talker \\+ code_predictor hold"):
        ModelManifest.from_json(wrong_total)


def test_git_blob_only_entries_are_verified_by_blob_id(tmp_path: Path) -> None:
    snapshot = make_snapshot(tmp_path / "snap")
    document = build_manifest(snapshot, "local/snap").to_json()
    for item in document["files"]:
        if item["path"].endswith(".json"):
            del item["sha256"]  # pinned like the Hub lists small files: git blob id only
    manifest = ModelManifest.from_json(document)
    assert verify_snapshot(snapshot, manifest) == []
    (snapshot / "config.json").write_text('{"model_type": "qwen3_ttz"}\n')  # same size
    actual = git_blob_sha1((snapshot / "config.json").read_bytes())
    expected = manifest.file("config.json").git_blob_sha1  # type: ignore[union-attr]
    assert verify_snapshot(snapshot, manifest) == [
        f"content mismatch: config.json has git blob {actual}, the manifest says {expected}"
    ]


def test_shipped_pin_equals_pins_json() -> None:
    if not PINS_JSON.is_file():
        pytest.skip(f"shared reference {PINS_JSON} is not beside the repository")
    pins = json.loads(PINS_JSON.read_text())
    manifest = load_manifest(PIN_FILE)
    assert manifest == shipped_pin() == shipped_manifests()[0]
    assert (manifest.repository, manifest.revision, manifest.license) == (
        pins["repository"],
        pins["revision"],
        pins["license"],
    )
    assert len(manifest.files) == len(pins["files"])
    for pinned in pins["files"]:
        entry = manifest.file(pinned["path"])
        assert entry is not None
        assert (entry.bytes, entry.sha256, entry.git_blob_sha1) == (
            pinned["bytes"],
            pinned.get("sha256"),
            pinned.get("git_blob_sha1"),
        )
        if "tensors" in pinned:
            summary = entry.safetensors
            assert summary is not None
            assert (summary.tensors, summary.parameters, summary.header_bytes, summary.dtypes) == (
                pinned["tensors"],
                pinned["parameter_count"],
                pinned["header_bytes"],
                (pinned["dtype"],),
            )
    components = pins["components"]
    assert {name: count.parameters for name, count in manifest.components.items()} == {
        "talker": components["talker_parameters"],
        "code_predictor": components["code_predictor_parameters"],
        "speech_decoder": components["speech_decoder_parameters"],
        "speech_encoder_unused": components["speech_encoder_parameters_unused"],
    }


def test_shipped_pin_tensor_counts_equal_the_inventories() -> None:
    manifest = shipped_pin()
    counted = {name: 0 for name in manifest.components}
    for inventory in ("voice-design-model-inventory.json", "speech-tokenizer-model-inventory.json"):
        for tensor in json.loads((DATA / inventory).read_text())["tensors"]:
            name = tensor["name"]
            component = (
                "code_predictor"
                if name.startswith("talker.code_predictor.")
                else "talker"
                if name.startswith("talker.")
                else "speech_decoder"
                if name.startswith("decoder.")
                else "speech_encoder_unused"
            )
            counted[component] += 1
    assert counted == {name: count.tensors for name, count in manifest.components.items()}


def test_serving_check_uses_the_shipped_pin_when_the_snapshot_claims_it(tmp_path: Path) -> None:
    snapshot = make_snapshot(tmp_path / "snap")
    real = shipped_pin()
    forged = pin_snapshot(snapshot, real.repository, real.revision)
    assert contradictions(forged), "a snapshot claiming the pinned revision must contradict the pin"
    write_manifest(forged, snapshot / MANIFEST_FILENAME)
    result = verify_snapshot_for_serving(snapshot)
    assert not result.ok
    assert result.manifest == real
    assert result.identity == f"{real.repository}@{real.revision}"
    assert any(problem.startswith("missing file: generation_config.json") for problem in result.problems)


def test_serving_check_without_manifest_falls_back_to_the_pin(tmp_path: Path) -> None:
    snapshot = make_snapshot(tmp_path / "snap")
    result = verify_snapshot_for_serving(snapshot)
    assert not result.ok and result.manifest == shipped_pin()
    assert f"qwen3-tts model pin {snapshot}" in result.problems[-1]


def test_serving_check_accepts_a_pinned_random_snapshot(tmp_path: Path) -> None:
    from qwen3_tts_native.engine.checkpoint import planned_tensors, write_random_snapshot

    snapshot = write_random_snapshot(tmp_path / "tiny", "tiny", seed=3)
    manifest = pin_snapshot(snapshot)
    write_manifest(manifest, snapshot / MANIFEST_FILENAME)
    result = verify_snapshot_for_serving(snapshot)
    assert result.ok, result.problems
    assert result.manifest_source == str(snapshot / MANIFEST_FILENAME)
    talker_specs, speech_specs = planned_tensors("tiny")
    counts = {name: count.tensors for name, count in manifest.components.items()}
    assert counts["talker"] + counts["code_predictor"] == len(talker_specs)
    assert counts["speech_decoder"] + counts["speech_encoder_unused"] == len(speech_specs)


def _hub_cache(cache: Path, repository: str, revision: str, files: dict[str, bytes]) -> None:
    """The Hugging Face cache layout: blobs by sha256, snapshot files as relative symlinks, refs/main."""
    repo_dir = cache / f"models--{repository.replace('/', '--')}"
    (repo_dir / "blobs").mkdir(parents=True)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs/main").write_text(revision)
    for path, data in files.items():
        digest = hashlib.sha256(data).hexdigest()
        (repo_dir / "blobs" / digest).write_bytes(data)
        link = repo_dir / "snapshots" / revision / path
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(repo_dir / "blobs" / digest, link.parent))


def test_fetch_offline_from_a_hub_cache_verifies_and_refuses_tampering(tmp_path: Path) -> None:
    source = make_snapshot(tmp_path / "source")
    revision = "0123456789abcdef0123456789abcdef01234567"
    manifest = pin_snapshot(source, "test-org/tiny-tts", revision)
    write_manifest(manifest, tmp_path / "pin.json")
    files = {entry.path: (source / entry.path).read_bytes() for entry in manifest.files}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "cache")}
    _hub_cache(tmp_path / "cache", "test-org/tiny-tts", revision, files)

    def fetch(out: Path) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "qwen3_tts_native", "model", "fetch"]
        command += ["--manifest", str(tmp_path / "pin.json"), "--out", str(out)]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)

    done = fetch(tmp_path / "fetched")
    assert done.returncode == 0, done.stderr
    assert "fetched and verified test-org/tiny-tts@" in done.stdout
    assert verify_snapshot(tmp_path / "fetched", manifest) == []  # regular files, no symlinks
    blob = hashlib.sha256(files["config.json"]).hexdigest()
    (tmp_path / "cache/models--test-org--tiny-tts/blobs" / blob).write_text('{"tampered": true}\n')
    done = fetch(tmp_path / "refused")
    assert done.returncode == 1
    assert "config.json" in done.stderr and "mismatch" in done.stderr
    assert not (tmp_path / "refused").exists()
    assert not list(tmp_path.glob(".refused.partial-*"))


def test_pin_refuses_an_output_inside_the_snapshot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snapshot = make_snapshot(tmp_path / "snap")
    assert main(["model", "pin", str(snapshot), "-o", str(snapshot / "other.json")]) == 2
    assert "qwen3-tts-manifest.json" in capsys.readouterr().err

"""The pure-Python OCI writer: exact bytes, determinism, and the document shapes signing relies on."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile

import pytest

from qwen3_tts_native.release.oci import (
    EMPTY_DESCRIPTOR,
    OCI_INDEX,
    OCI_MANIFEST,
    UNKNOWN_PLATFORM,
    Descriptor,
    OciError,
    Platform,
    artifact_manifest,
    build_image,
    canonical_json,
    check_digest,
    gzip_bytes,
    index_manifests,
    is_attestation_manifest,
    layer_tar,
)

PLATFORMS = [Platform.parse("linux/amd64"), Platform.parse("linux/arm64")]


def test_build_is_deterministic_and_content_addressed() -> None:
    files = {"opt/b.txt": b"b", "opt/a.txt": b"a"}
    first = build_image(files, PLATFORMS, epoch=1_700_000_000, labels={"k": "v"})
    second = build_image(
        dict(reversed(list(files.items()))), PLATFORMS, epoch=1_700_000_000, labels={"k": "v"}
    )
    assert first.index == second.index
    for digest, data in first.blobs.items():
        assert digest == "sha256:" + hashlib.sha256(data).hexdigest()
    for digest, (_, data) in first.manifests.items():
        assert digest == "sha256:" + hashlib.sha256(data).hexdigest()
    index = json.loads(first.index)
    assert index["mediaType"] == OCI_INDEX
    assert [m["platform"] for m in index["manifests"]] == [p.to_json() for p in PLATFORMS]
    assert first.index_descriptor.digest == "sha256:" + hashlib.sha256(first.index).hexdigest()


def test_configs_name_their_platform_and_diff_id() -> None:
    layout = build_image({"x": b"1"}, PLATFORMS)
    for desc in index_manifests(json.loads(layout.index)):
        _, manifest_bytes = layout.manifests[desc.digest]
        manifest = json.loads(manifest_bytes)
        config = json.loads(layout.blobs[manifest["config"]["digest"]])
        assert f"{config['os']}/{config['architecture']}" == str(desc.platform)
        layer = layout.blobs[manifest["layers"][0]["digest"]]
        assert config["rootfs"]["diff_ids"] == [
            "sha256:" + hashlib.sha256(gzip.decompress(layer)).hexdigest()
        ]


def test_layer_tar_is_sorted_with_fixed_metadata() -> None:
    tar_bytes = layer_tar({"z/1": b"one", "a/2": b"two"}, epoch=42)
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["a", "a/2", "z", "z/1"]
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(42, 0, 0, "", "")}


def test_gzip_header_has_no_timestamp() -> None:
    assert gzip_bytes(b"x")[4:8] == b"\0\0\0\0"
    assert gzip_bytes(b"x") == gzip_bytes(b"x")


def test_artifact_manifest_refers_to_subject_with_empty_config() -> None:
    subject = Descriptor.for_bytes(OCI_INDEX, b"{}", platform=PLATFORMS[0], annotations={"a": "b"})
    layer = Descriptor.for_bytes("application/vnd.dev.sigstore.bundle.v0.3+json", b"{}")
    doc = json.loads(artifact_manifest(layer.media_type, [layer], subject, {"k": "v"}))
    assert doc["mediaType"] == OCI_MANIFEST
    assert doc["artifactType"] == layer.media_type
    assert doc["config"] == EMPTY_DESCRIPTOR.to_json()
    assert (
        EMPTY_DESCRIPTOR.digest == "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
    )
    assert doc["subject"] == {"mediaType": OCI_INDEX, "digest": subject.digest, "size": 2}


def test_attestation_entries_are_recognised() -> None:
    plain = Descriptor.for_bytes(OCI_MANIFEST, b"1", platform=PLATFORMS[0])
    unknown = Descriptor.for_bytes(OCI_MANIFEST, b"2", platform=UNKNOWN_PLATFORM)
    annotated = Descriptor.for_bytes(
        OCI_MANIFEST, b"3", annotations={"vnd.docker.reference.type": "attestation-manifest"}
    )
    assert not is_attestation_manifest(plain)
    assert is_attestation_manifest(unknown) and is_attestation_manifest(annotated)


def test_descriptor_round_trip_and_validation() -> None:
    desc = Descriptor.for_bytes(
        OCI_MANIFEST, b"abc", platform=Platform.parse("linux/arm64/v8"), artifact_type="t"
    )
    assert Descriptor.from_json(desc.to_json()) == desc
    with pytest.raises(OciError):
        Descriptor.from_json({"mediaType": OCI_MANIFEST, "digest": "sha256:XYZ", "size": 1})
    with pytest.raises(OciError):
        check_digest("sha512:" + "0" * 128)
    with pytest.raises(OciError):
        Platform.parse("linux")
    assert canonical_json({"b": 1, "a": [1, 2]}) == b'{"a":[1,2],"b":1}'

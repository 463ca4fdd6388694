"""``qwen3-tts release build``: build a multi-platform image, push it, and report the index digest.

Two builders, chosen automatically:

* ``buildx`` (CI, wherever ``docker buildx`` exists): one BuildKit build for all platforms with SBOM
  and SLSA provenance attestations; the command line comes from ``release.buildx.buildx_command``.
* ``docker-api`` (any Docker-API engine at $DOCKER_HOST: a daemon, or podman's socket): the legacy
  ``/build`` endpoint the docker SDK speaks builds one platform at a time and cannot make an index or
  attestations, so each platform is built (without cache: podman's cache ignores the platform), pushed
  under ``<tag>-<os>-<arch>``, and the index is assembled from the pushed manifests here.

Either way the digest reported is re-checked: the index is read back from the registry by tag and its
bytes are hashed, so the number we hand to ``sign`` and ``verify`` is the one the registry serves.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .oci import (
    DOCKER_LIST,
    DOCKER_MANIFEST,
    INDEX_TYPES,
    OCI_INDEX,
    Descriptor,
    OciError,
    Platform,
    image_index,
    index_manifests,
    is_attestation_manifest,
    parse_json_document,
)
from .registry import ImageReference, RegistryClient, RegistryError

BUILDERS = ("auto", "buildx", "docker-api")


class BuildError(RuntimeError):
    """The build or push failed; the message says where."""


@dataclass(frozen=True)
class BuildRequest:
    image: ImageReference
    context: Path
    containerfile: Path
    platforms: tuple[Platform, ...]
    build_args: Mapping[str, str] = field(default_factory=dict)
    build_contexts: Mapping[str, str] = field(default_factory=dict)
    """Named contexts (``model=/verified/snapshot``); BuildKit only."""


@dataclass(frozen=True)
class BuildResult:
    """What was pushed: the index digest (re-checked against the registry) and one digest per platform."""

    image: ImageReference
    digest: str
    media_type: str
    platforms: dict[str, str]
    builder: str

    def to_json(self) -> dict[str, Any]:
        return {
            "image": str(self.image.with_digest(self.digest)),
            "tag": self.image.tag,
            "digest": self.digest,
            "media_type": self.media_type,
            "platforms": dict(sorted(self.platforms.items())),
            "builder": self.builder,
        }


def buildx_available() -> bool:
    """True when the docker CLI has a working buildx plugin (BuildKit)."""
    docker = shutil.which("docker")
    if docker is None:
        return False
    probe = subprocess.run([docker, "buildx", "version"], capture_output=True, check=False)
    return probe.returncode == 0


def build(request: BuildRequest, registry: RegistryClient, builder: str = "auto") -> BuildResult:
    """Build and push ``request`` with the chosen builder, then confirm the digest from the registry."""
    if request.image.tag is None or request.image.digest is not None:
        raise BuildError(f"{request.image}: build needs a tag to push to (REGISTRY/REPO:TAG), not a digest")
    if builder == "auto":
        builder = "buildx" if buildx_available() else "docker-api"
    if builder == "buildx":
        claimed = _build_with_buildx(request)
    elif builder == "docker-api":
        claimed = _build_with_docker_api(request, registry)
    else:
        raise BuildError(f"unknown builder {builder!r}; use one of {', '.join(BUILDERS)}")
    return confirm_index(registry, request.image, claimed, builder)


def confirm_index(registry: RegistryClient, image: ImageReference, claimed: str, builder: str) -> BuildResult:
    """Read the pushed index back by tag, hash its bytes, and require the digest the builder claimed."""
    assert image.tag is not None
    try:
        served = registry.get_manifest(image.repository, image.tag)
    except RegistryError as exc:
        raise BuildError(f"cannot read back {image}: {exc}") from exc
    if served.digest != claimed:
        raise BuildError(
            f"{image} resolves to {served.digest} on the registry but the builder reported {claimed}; "
            "someone else pushed the tag, or the builder reported the wrong digest"
        )
    if served.media_type not in INDEX_TYPES:
        raise BuildError(f"{image} is a {served.media_type}, not a multi-platform index")
    platforms = {
        str(d.platform): d.digest
        for d in index_manifests(served.json())
        if d.platform is not None and not is_attestation_manifest(d)
    }
    return BuildResult(image, served.digest, served.media_type, platforms, builder)


# --- buildx -----------------------------------------------------------------------------------------


def _build_with_buildx(request: BuildRequest) -> str:
    from .buildx import buildx_command

    with tempfile.TemporaryDirectory(prefix="qwen3-tts-buildx-") as scratch:
        metadata = Path(scratch) / "metadata.json"
        try:
            command = buildx_command(
                image=str(request.image),
                context=request.context,
                containerfile=request.containerfile,
                platforms=[str(p) for p in request.platforms],
                build_args=dict(request.build_args),
                build_contexts=dict(request.build_contexts),
                metadata_file=metadata,
            )
        except ValueError as exc:
            raise BuildError(str(exc)) from exc
        completed = subprocess.run(command, check=False)
        if completed.returncode != 0:
            raise BuildError(f"docker buildx build failed with exit code {completed.returncode}")
        try:
            digest = str(json.loads(metadata.read_text())["containerimage.digest"])
        except (OSError, ValueError, KeyError) as exc:
            raise BuildError(f"buildx wrote no containerimage.digest to {metadata}: {exc}") from exc
    return digest


# --- docker API (daemon or podman socket) ----------------------------------------------------------


def _build_with_docker_api(request: BuildRequest, registry: RegistryClient) -> str:
    import docker
    from docker.errors import APIError, DockerException
    from docker.errors import BuildError as SdkBuildError

    try:
        client = docker.from_env()
        client.ping()
    except DockerException as exc:
        raise BuildError(
            f"no Docker-API engine reachable ({exc}); set DOCKER_HOST to a daemon or to podman's socket "
            "(`podman system service unix:///tmp/podman.sock`)"
        ) from exc
    if request.build_contexts:
        raise BuildError(
            "named build contexts (--build-context) need BuildKit; the Docker-API builder cannot use them"
        )
    image = request.image
    assert image.tag is not None
    entries: list[Descriptor] = []
    try:
        for platform in request.platforms:
            tag = f"{image.tag}-{platform.os}-{platform.architecture}{platform.variant or ''}"
            client.images.build(
                path=str(request.context),
                dockerfile=str(request.containerfile.resolve()),
                platform=str(platform),
                tag=f"{image.name}:{tag}",
                buildargs=dict(request.build_args),
                nocache=True,
                rm=True,
            )
            for event in client.images.push(image.name, tag=tag, stream=True, decode=True):
                if "error" in event:
                    raise BuildError(f"push of {image.name}:{tag} failed: {event['error']}")
            entries.append(_platform_entry(registry, image.repository, tag, platform))
    except SdkBuildError as exc:
        log = "".join(str(line.get("stream", "")) for line in exc.build_log if isinstance(line, dict))
        raise BuildError(f"build failed: {exc.msg}\n{log[-2000:]}") from exc
    except APIError as exc:
        raise BuildError(f"the engine refused the request: {exc.explanation or exc}") from exc
    media_type = DOCKER_LIST if all(e.media_type == DOCKER_MANIFEST for e in entries) else OCI_INDEX
    pushed = registry.put_manifest(image.repository, image.tag, image_index(entries, media_type), media_type)
    return pushed.digest


def _platform_entry(registry: RegistryClient, repository: str, tag: str, platform: Platform) -> Descriptor:
    """The pushed manifest for ``platform`` under ``tag``, after checking its config names that platform."""
    manifest = registry.get_manifest(repository, tag)
    if manifest.media_type in INDEX_TYPES:
        matches = [
            d
            for d in index_manifests(manifest.json())
            if d.platform is not None
            and (d.platform.os, d.platform.architecture) == (platform.os, platform.architecture)
        ]
        if len(matches) != 1:
            raise BuildError(f"{repository}:{tag} is an index without exactly one {platform} entry")
        manifest = registry.get_manifest(repository, matches[0].digest)
    try:
        config_desc = Descriptor.from_json(manifest.json().get("config") or {})
        config = parse_json_document(registry.get_blob(repository, config_desc.digest), "image config")
    except OciError as exc:
        raise BuildError(f"{repository}:{tag}: {exc}") from exc
    if (config.get("os"), config.get("architecture")) != (platform.os, platform.architecture):
        raise BuildError(
            f"the engine built {config.get('os')}/{config.get('architecture')} for {platform}; "
            "it ignored the requested platform"
        )
    return Descriptor(manifest.media_type, manifest.digest, len(manifest.data), platform=platform)

"""The one ``docker buildx build`` command line of a release build.

``release build --builder buildx`` (``release/build.py``) runs exactly this argv, and a unit test holds
``.github/workflows/release.yml`` to it, so what CI builds is what the code says. Defaults carry the
supply-chain options: both platforms, BuildKit's SPDX SBOM, SLSA v1 provenance in ``max`` mode, push.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

DEFAULT_PROVENANCE = "mode=max,version=v1"
_PLATFORM = re.compile(r"^[a-z0-9]+/[a-z0-9_]+(/[a-z0-9]+)?$")
_BUILD_ARG = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CREDENTIAL_NAME = re.compile(r"password|passwd|token|secret|credential|api.?key", re.IGNORECASE)


def buildx_command(
    *,
    image: str,
    context: Path | str,
    containerfile: Path | str,
    platforms: Sequence[str],
    build_args: Mapping[str, str],
    metadata_file: Path | str,
    build_contexts: Mapping[str, str] | None = None,
    sbom: bool = True,
    provenance: str = DEFAULT_PROVENANCE,
    push: bool = True,
) -> list[str]:
    """argv of ``docker buildx build`` for ``image`` (REGISTRY/REPO:TAG).

    Build arguments and named contexts are sorted so the argv is deterministic. Raises ValueError for
    a malformed platform or build-arg name, and for a build arg named like a credential: build args
    are recorded in the image history and the provenance, so secrets must use ``--secret``.
    """
    if not platforms:
        raise ValueError("at least one platform is needed, e.g. linux/amd64")
    for platform in platforms:
        if not _PLATFORM.match(platform):
            raise ValueError(f"platform {platform!r} is not OS/ARCH[/VARIANT], e.g. linux/arm64")
    for name in build_args:
        if not _BUILD_ARG.match(name):
            raise ValueError(f"build arg {name!r} is not a valid ARG name")
        if _CREDENTIAL_NAME.search(name):
            raise ValueError(f"build arg {name!r} looks like a credential; pass secrets with --secret")
    argv = [
        "docker",
        "buildx",
        "build",
        "--file",
        str(containerfile),
        "--platform",
        ",".join(platforms),
        "--tag",
        image,
        "--metadata-file",
        str(metadata_file),
        f"--sbom={'true' if sbom else 'false'}",
        f"--provenance={provenance}",
    ]
    for name in sorted(build_args):
        argv += ["--build-arg", f"{name}={build_args[name]}"]
    for name in sorted(build_contexts or {}):
        argv += ["--build-context", f"{name}={(build_contexts or {})[name]}"]
    if push:
        argv.append("--push")
    argv.append(str(context))
    return argv

"""Which Sigstore instance to trust: production (via TUF) or a pinned ClientTrustConfig file.

Signing and verification take the same trust configuration, so the only difference between a release
against the public-good instance and a test against a private one is this file.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from sigstore.errors import Error as SigstoreError
from sigstore.models import ClientTrustConfig


class TrustConfigError(RuntimeError):
    """The trust configuration could not be loaded."""


@dataclass(frozen=True)
class TrustSource:
    """A loaded trust configuration and a line saying where it came from (recorded in gate results)."""

    config: ClientTrustConfig
    description: str


def load_trust_config(path: Path | None, *, offline: bool = False) -> TrustSource:
    """Load ``path`` (a ClientTrustConfig JSON) or, without one, Sigstore production via TUF.

    ``offline`` uses the local TUF cache (or the root embedded in sigstore-python) without refreshing.
    """
    if path is not None:
        try:
            raw = path.read_bytes()
            config = ClientTrustConfig.from_json(raw.decode())
        except OSError as exc:
            raise TrustConfigError(f"cannot read trust config {path}: {exc.strerror or exc}") from exc
        except (ValueError, SigstoreError) as exc:
            raise TrustConfigError(f"{path} is not a Sigstore ClientTrustConfig JSON: {exc}") from exc
        return TrustSource(config, f"file {path} (sha256:{hashlib.sha256(raw).hexdigest()})")
    try:
        config = ClientTrustConfig.production(offline=offline)
    except Exception as exc:  # TUF raises many unrelated types; all mean "no trust root"
        raise TrustConfigError(
            f"cannot load the Sigstore production trust root via TUF ({exc}); "
            "check network access to tuf-repo-cdn.sigstore.dev, or pass --offline to use the cached root"
        ) from exc
    return TrustSource(
        config, "sigstore production (TUF cache)" if offline else "sigstore production (TUF refreshed)"
    )

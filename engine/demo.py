"""The embedded demo checkpoint: a tiny random-weight snapshot generated on first use and cached.

It lets ``qwen3-tts synthesize`` and ``serve`` run without downloading the real model. The weights are
random, so the audio is noise, not speech. The snapshot lives in the user cache directory
(``platformdirs.user_cache_dir``, honouring ``XDG_CACHE_HOME``), is keyed by the generator version and
seed, and is written atomically, so concurrent first runs and interrupted runs never leave a
half-written snapshot behind; later runs reuse it. Like every random snapshot it carries its identity
manifest (``qwen3-tts-manifest.json``).
"""

from __future__ import annotations

from pathlib import Path

import platformdirs

from .checkpoint import GENERATOR_VERSION, Preset, ProgressCallback, write_random_snapshot

DEMO_PRESET: Preset = "tiny"
DEMO_SEED = 1234
DEMO_NOTICE = (
    "No --model given: using the embedded demo checkpoint, a tiny model with random weights. "
    "It produces noise, not speech."
)
_APP_NAME = "qwen3-tts-native"


def demo_checkpoint_dir() -> Path:
    """Where the demo snapshot is (or will be) cached."""
    root = Path(platformdirs.user_cache_dir(_APP_NAME))
    return root / f"demo-{DEMO_PRESET}-seed{DEMO_SEED}-v{GENERATOR_VERSION}"


def ensure_demo_checkpoint(progress: ProgressCallback | None = None) -> Path:
    """The demo snapshot directory, generating it first if it is not cached yet."""
    target = demo_checkpoint_dir()
    if target.is_dir() and (target / "config.json").is_file():
        return target
    try:
        return write_random_snapshot(target, DEMO_PRESET, DEMO_SEED, progress)
    except OSError:
        if target.is_dir() and (target / "config.json").is_file():  # another process won the race
            return target
        raise

"""How many CPU threads torch uses for one process: the one place ``serve`` and ``synthesize`` decide it.

torch defaults to one intra-op thread per core. The engine's CPU work is many small ops per frame, which
extra threads slow down rather than speed up, badly so on a shared machine: the tiny demo model takes
about 1 s per frame with 2 contended threads and about 30 ms with 1.

Precedence: an explicit setting (``--threads`` / ``QWEN3_TTS_THREADS``); else ``OMP_NUM_THREADS`` when set
(torch has already applied it, so it is left alone); else 1 for the demo checkpoint and
``min(4, usable cores)`` for a real model.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

THREADS_ENV = "QWEN3_TTS_THREADS"
MAX_DEFAULT_THREADS = 4


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where the platform tells it)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def default_threads(demo: bool) -> int:
    return 1 if demo else min(MAX_DEFAULT_THREADS, usable_cores())


def configure_cpu_threads(
    setting: int | None, demo: bool = False, environ: Mapping[str, str] | None = None
) -> int:
    """Apply the thread count chosen by the precedence above and return it.

    ``setting`` None (or 0) means not given: ``QWEN3_TTS_THREADS`` is read from ``environ`` (default
    ``os.environ``). Raises ValueError naming the variable for a bad value. Call it before the engine is
    loaded: threads that already ran torch ops may keep their old count.
    """
    import torch

    environ = os.environ if environ is None else environ
    if not setting:
        raw = environ.get(THREADS_ENV, "").strip()
        if raw:
            try:
                setting = int(raw)
            except ValueError:
                raise ValueError(f"{THREADS_ENV}={raw!r} is not an integer") from None
    if setting is not None and setting < 0:
        raise ValueError(f"the thread count must be >= 1, got {setting}")
    if not setting and environ.get("OMP_NUM_THREADS", "").strip():
        return torch.get_num_threads()
    count = setting or default_threads(demo)
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)
    return count

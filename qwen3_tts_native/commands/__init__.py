"""One module per command group. Each exposes ``register(subparsers)`` and imports heavy
dependencies only inside its handlers, so ``qwen3-tts --help`` stays fast and ``serve`` never
loads the release or evidence stacks.

The exit codes every command shares, and the two ways a handler reports a failure on stderr."""

from __future__ import annotations

import sys
from collections.abc import Iterable

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def usage_error(message: object) -> int:
    """``error: MESSAGE`` on stderr (bad arguments or unreadable configuration); returns EXIT_USAGE."""
    print(f"error: {message}", file=sys.stderr)
    return EXIT_USAGE


def failed(headline: str, problems: Iterable[object], hint: str | None = None) -> int:
    """``FAILED: HEADLINE``, one indented line per problem and an optional hint on stderr; returns
    EXIT_FAILED."""
    print(f"FAILED: {headline}", file=sys.stderr)
    for problem in problems:
        print(f"  {problem}", file=sys.stderr)
    if hint:
        print(hint, file=sys.stderr)
    return EXIT_FAILED

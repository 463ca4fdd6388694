"""One module per command group. Each exposes ``register(subparsers)`` and imports heavy
dependencies only inside its handlers, so ``qwen3-tts --help`` stays fast and ``serve`` never
loads the release or evidence stacks."""

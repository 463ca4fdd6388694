"""Server settings: one frozen value built from ``QWEN3_TTS_*`` environment variables and CLI overrides.

Every limit is checked once here, so the rest of the server can trust it; a bad value stops startup with
a message naming the variable.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from ..config import FRAMES_PER_SECOND

MODEL_ID = "qwen3-tts-1.7b-voice-design"
MODEL_KIND = "voice_design"
MAX_CODEC_FRAMES = 8192
DEMO_MAX_DURATION_SECONDS = 3.2
"""The demo checkpoint's ``max_duration_seconds`` unless configured: random weights rarely emit EOS, so a
request would otherwise run to the full 120 s of noise (``synthesize`` caps its demo at 40 frames too)."""
PROMPT_TEMPLATE_TOKENS = 32
"""Prompt positions besides the text and description tokens: chat template, role, codec prefix and
language ids, text EOS and codec BOS (15 today)."""
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class SettingsError(ValueError):
    """A setting is out of range or unparsable."""


@dataclass(frozen=True)
class ServerSettings:
    """What ``qwen3-tts serve`` needs; field ``x`` is read from ``QWEN3_TTS_X``."""

    model: Path | None = None  # None: the embedded tiny demo checkpoint
    host: str = "127.0.0.1"
    port: int = 8080
    device: str = ""  # "": cuda when available, else cpu
    max_concurrent_requests: int = 0  # 0: sized for the device (8 on CUDA, 1 on CPU)
    max_text_bytes: int = 32768
    max_voice_description_bytes: int = 4096
    max_duration_seconds: float = 120.0
    slow_client_timeout_s: float = 5.0
    retirement_timeout_s: float = 25.0
    drain_timeout_s: float = 20.0  # SIGTERM: running requests may finish this long, then they are cancelled
    shutdown_timeout_s: float = 35.0  # SIGTERM: the process is gone by then (a watchdog exits 124)
    log_level: str = "info"
    allow_unverified_model: bool = False  # serve a --model whose identity check fails (a warning is logged)
    threads: int = 0  # torch CPU threads; 0: engine.threads.configure_cpu_threads' default

    @property
    def max_body_bytes(self) -> int:
        """JSON overhead allowance on top of the two free-text limits."""
        return self.max_text_bytes + self.max_voice_description_bytes + 16384

    @property
    def default_duration_seconds(self) -> float:
        return min(120.0, self.max_duration_seconds)

    @property
    def max_frames(self) -> int:
        """Frames of the longest request allowed (``max_duration_seconds``)."""
        return math.ceil(self.max_duration_seconds * FRAMES_PER_SECOND)

    @property
    def max_buffered_pcm_bytes(self) -> int:
        return self.max_frames * 1920 * 2

    @property
    def context_positions(self) -> int:
        """Talker positions the largest allowed request can need: prompt + max_frames - 1.

        A text token covers at least one UTF-8 byte, so the two free-text byte limits bound the prompt's
        text and description tokens; ``PROMPT_TEMPLATE_TOKENS`` covers the rest of the prompt.
        """
        prompt = self.max_text_bytes + self.max_voice_description_bytes + PROMPT_TEMPLATE_TOKENS
        return prompt + self.max_frames - 1

    def resolved(self, cuda_available: bool) -> ServerSettings:
        """Fill the device-dependent defaults."""
        device = self.device or ("cuda" if cuda_available else "cpu")
        capacity = self.max_concurrent_requests or (8 if device.startswith("cuda") else 1)
        return replace(self, device=device, max_concurrent_requests=capacity)

    def check(self) -> ServerSettings:
        _require(1 <= self.port <= 65535 or self.port == 0, "port", "must be 0..65535")
        _require(
            0 <= self.max_concurrent_requests <= 64, "max_concurrent_requests", "must be 0 (auto) or 1..64"
        )
        _require(1 <= self.max_text_bytes <= 1_048_576, "max_text_bytes", "must be 1..1048576")
        _require(
            1 <= self.max_voice_description_bytes <= 262_144,
            "max_voice_description_bytes",
            "must be 1..262144",
        )
        _require(
            math.isfinite(self.max_duration_seconds) and 0.08 <= self.max_duration_seconds <= 655.36,
            "max_duration_seconds",
            "must be finite, 0.08..655.36",
        )
        for name in (
            "slow_client_timeout_s",
            "retirement_timeout_s",
            "drain_timeout_s",
            "shutdown_timeout_s",
        ):
            value = getattr(self, name)
            _require(math.isfinite(value) and value > 0, name, "must be a positive number of seconds")
        _require(
            self.drain_timeout_s < self.shutdown_timeout_s, "drain_timeout_s", "must be < shutdown_timeout_s"
        )
        _require(
            self.log_level in ("critical", "error", "warning", "info", "debug"),
            "log_level",
            "must be one of critical, error, warning, info, debug",
        )
        _require(0 <= self.threads <= 1024, "threads", "must be 0 (auto) or 1..1024")
        return self


def _require(ok: bool, name: str, rule: str) -> None:
    if not ok:
        raise SettingsError(f"QWEN3_TTS_{name.upper()} {rule}")


def _parse_bool(raw: str) -> bool:
    if raw.lower() in _TRUE:
        return True
    if raw.lower() in _FALSE:
        return False
    raise ValueError(f"expected one of {', '.join(_TRUE + _FALSE)}")


def _parser(name: str, default: Any) -> Callable[[str], Any]:
    if name == "model":
        return Path
    if isinstance(default, bool):
        return _parse_bool
    return type(default)  # type: ignore[no-any-return]


def load_settings(environ: Mapping[str, str] | None = None, **overrides: Any) -> ServerSettings:
    """Environment first, then explicit overrides (CLI flags); ``None`` overrides are ignored.

    Without a model (the demo checkpoint) ``max_duration_seconds`` defaults to
    ``DEMO_MAX_DURATION_SECONDS`` unless it is configured.
    """
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for field in fields(ServerSettings):
        raw = environ.get(f"QWEN3_TTS_{field.name.upper()}")
        if raw is None or raw == "":
            continue
        try:
            values[field.name] = _parser(field.name, field.default)(raw.strip())
        except ValueError as error:
            raise SettingsError(f"QWEN3_TTS_{field.name.upper()}={raw!r}: {error}") from error
    values.update({name: value for name, value in overrides.items() if value is not None})
    if isinstance(values.get("log_level"), str):
        values["log_level"] = values["log_level"].lower()
    if values.get("model") is None:
        values.setdefault("max_duration_seconds", DEMO_MAX_DURATION_SECONDS)
    return ServerSettings(**values).check()

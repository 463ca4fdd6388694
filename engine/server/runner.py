"""Run the app under uvicorn with the shutdown the contract asks for.

uvicorn's own SIGTERM handling closes the listener at once, so new callers would see "connection refused"
instead of a 503, and it re-raises the signal on exit. Here the first SIGTERM/SIGINT instead drains:
admission answers 503 ``server_shutting_down``, running requests may finish for ``drain_timeout_s``, the rest
are cancelled (their streams end with an error part), then uvicorn stops and the process exits 0. A second
signal stops at once; a watchdog exits 124 if anything hangs past ``shutdown_timeout_s``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
from types import FrameType
from typing import TYPE_CHECKING

import uvicorn

from ..runtime.scheduler import FrameEngine
from .app import EngineFactory, create_app
from .routes import ServerState
from .settings import ServerSettings

if TYPE_CHECKING:
    from ..config import TalkerConfig

logger = logging.getLogger("qwen3_tts.server")
EXIT_WATCHDOG = 124
MAX_TALKER_CONTEXT = 4096
"""Positions per slot at most (the engine's own default). A prefill attending over the whole pool (the
CUDA path, for fixed graph shapes) costs time and memory as prompt x context while every other stream
waits: for the real model the fp32 scores of a prompt that fills the pool are about 1 GiB per layer at
4096 positions and 21 GiB at 18.7k; on the tiny model (one CPU thread, whole-pool attention) an 8000-token
prompt took 22 s with 8192 positions, a 4000-token one 4 s with 4096. Raise it once prefill attends over
the prompt only."""
KV_POOL_BUDGET_BYTES = 16 * 2**30
"""The talker KV pool (all slots) is kept under this by cutting positions per slot (``talker_context``)."""


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose first exit signal drains the engine before stopping."""

    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.state = state
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining = False
        self._drain: asyncio.Task[None] | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._draining or self._loop is None or self.state.admissions is None:
            self.force_exit = self._draining
            self.should_exit = True
            return
        self._draining = True
        settings = self.state.settings
        logger.info("signal %d: draining (new requests get 503)", sig)
        watchdog = threading.Timer(settings.shutdown_timeout_s, os._exit, args=(EXIT_WATCHDOG,))
        watchdog.daemon = True
        watchdog.start()
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain = asyncio.ensure_future(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        settings = self.state.settings
        admissions = self.state.admissions
        assert admissions is not None
        remaining = settings.shutdown_timeout_s - settings.drain_timeout_s
        await admissions.drain(settings.drain_timeout_s, min(settings.retirement_timeout_s, remaining / 2))
        logger.info("drained; stopping")
        self.should_exit = True


def configure_logging(settings: ServerSettings) -> None:
    """uvicorn-style lines on stderr at the configured level (once per process)."""
    logging.basicConfig(level=settings.log_level.upper(), format="%(levelname)s:     %(name)s %(message)s")


def run(settings: ServerSettings, engine_factory: EngineFactory) -> int:
    """Serve until a signal has drained the server; 0 on a clean stop."""
    configure_logging(settings)
    app = create_app(settings, engine_factory)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        lifespan="on",
        timeout_graceful_shutdown=max(1, int((settings.shutdown_timeout_s - settings.drain_timeout_s) / 2)),
    )
    server = DrainingServer(config, app.state.server)
    server.run()
    return 0 if server.started else 1


def talker_context(settings: ServerSettings, talker: TalkerConfig, position_bytes: int) -> int:
    """Positions per slot of the talker KV pool (``max_context``), one position of a slot taking
    `position_bytes` (``KVCache.position_bytes``: half as many in fast mode's e4m3 pool as in bfloat16).

    What the largest request the settings allow can need (``settings.context_positions``: the text and
    description byte limits, the template, ``max_duration_seconds``), capped by ``MAX_TALKER_CONTEXT``, the
    model's position table and ``KV_POOL_BUDGET_BYTES`` over all slots. A request needing more positions
    than the pool holds fails with 422 ``invalid_request``. The defaults (32 KiB text, 4 KiB description,
    120 s) allow more than the cap, so the cap applies: 120 s of audio after a prompt of up to 2597 tokens.
    """
    budget = KV_POOL_BUDGET_BYTES // (position_bytes * settings.max_concurrent_requests)
    needed = min(settings.context_positions, talker.max_position_embeddings, MAX_TALKER_CONTEXT)
    return max(1, min(needed, budget))


def load_engine(settings: ServerSettings) -> FrameEngine:
    """The VoiceDesign engine for these settings: bfloat16 talker on CUDA in the mode QWEN3_TTS_MODE names
    (its KV pool e4m3 in fast mode), float32 on CPU."""
    import torch

    from ..config import load_config
    from ..demo import ensure_demo_checkpoint
    from ..model.layers import KVCache
    from ..runtime.engine import VoiceDesignEngine
    from ..runtime.modes import resolve_mode

    model = settings.model or ensure_demo_checkpoint()
    on_cuda = settings.device.startswith("cuda")
    dtype = torch.bfloat16 if on_cuda else torch.float32
    mode = resolve_mode() if on_cuda else None
    cache_dtype = torch.float8_e4m3fn if mode is not None and mode.kv_cache_fp8 else dtype
    talker = load_config(model).talker
    position_bytes = KVCache.position_bytes(
        talker.num_hidden_layers, talker.num_key_value_heads, talker.head_dim, cache_dtype
    )
    context = talker_context(settings, talker, position_bytes)
    if context >= settings.context_positions:
        logger.info("talker context: %d positions per slot, enough for any request the limits allow", context)
    else:
        cut_by_budget = context < min(talker.max_position_embeddings, MAX_TALKER_CONTEXT)
        (logger.warning if cut_by_budget else logger.info)(
            "talker context: %d positions per slot (%s); the request limits allow prompts + frames of up to "
            "%d, and a request that needs more than the context gets 422 invalid_request",
            context,
            "cut to fit the KV pool budget" if cut_by_budget else "the server's cap",
            settings.context_positions,
        )
    return VoiceDesignEngine.load(
        model,
        device=settings.device,
        dtype=dtype,
        max_sessions=settings.max_concurrent_requests,
        max_context=context,
        mode=mode,
    )

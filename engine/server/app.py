"""The ASGI application: routes, problem rendering, and a lifespan that loads and warms the engine.

The lifespan finishes (and uvicorn binds the listener) only after a real warm-up request has produced
audio through the scheduler, so an open port means a ready engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..config import FRAMES_PER_SECOND, SAMPLES_PER_FRAME
from ..runtime.request import AudioPacket, SynthesisRequest
from ..runtime.scheduler import Failed, FrameEngine, Scheduler
from .admission import Admissions, Ticket
from .ids import uuid7
from .metrics import ServerMetrics
from .problems import Problem
from .routes import (
    ServerState,
    cancel_request,
    capabilities,
    live,
    metrics,
    openai_speech,
    openapi,
    ready,
    voice_design_speech,
)
from .settings import ServerSettings

logger = logging.getLogger("qwen3_tts.server")

EngineFactory = Callable[[ServerSettings], FrameEngine]
WARM_UP_TIMEOUT_S = 60.0


class WarmUpError(RuntimeError):
    """The warm-up request did not produce valid audio; the server must not start."""


async def warm_up(scheduler: Scheduler, settings: ServerSettings) -> None:
    """One real request (English, seed 0) through prefill, a batched step and the codec, then cancelled."""
    request = SynthesisRequest(
        text="Ready.",
        voice_description="A calm, neutral adult voice.",
        language="english",
        seed=0,
        max_frames=math.ceil(settings.default_duration_seconds * FRAMES_PER_SECOND),
    )
    ticket = Ticket(
        str(uuid7()),
        streaming=True,
        loop=asyncio.get_running_loop(),
        retirement_timeout_s=settings.retirement_timeout_s,
    )
    ticket.handle = scheduler.submit(request, ticket.notify)
    packets = 0
    try:
        async with asyncio.timeout(WARM_UP_TIMEOUT_S):
            while packets < 2:
                event = await ticket.next_event()
                if isinstance(event, Failed):
                    raise WarmUpError(f"warm-up request failed: {event.code}: {event.detail}")
                if not isinstance(event, AudioPacket):
                    break
                if event.frame_count < 1 or len(event.pcm) != event.frame_count * SAMPLES_PER_FRAME * 2:
                    raise WarmUpError("warm-up packet has the wrong size")
                packets += 1
    except TimeoutError:
        raise WarmUpError(f"warm-up produced no audio within {WARM_UP_TIMEOUT_S:.0f} s") from None
    finally:
        ticket.cancel("request_cancelled", "warm-up done")
        if not await ticket.wait_retired(settings.retirement_timeout_s):
            raise WarmUpError("the warm-up request's slot was not released")
    if packets == 0:
        raise WarmUpError("the warm-up request ended without audio")


def _problem_handler(request: Request, error: Exception) -> Response:
    assert isinstance(error, Problem)
    return error.to_response()


def create_app(settings: ServerSettings, engine_factory: EngineFactory) -> Starlette:
    """Build the app; ``engine_factory`` loads the engine (called once, in the lifespan)."""
    state = ServerState(settings=settings, metrics=ServerMetrics())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        started = time.monotonic()
        engine = await asyncio.to_thread(engine_factory, settings)
        scheduler = Scheduler(engine, settings.max_concurrent_requests)
        try:
            await warm_up(scheduler, settings)
            state.admissions = Admissions(settings, scheduler, state.metrics)
            logger.info(
                "engine ready in %.1f s (%s, %d slot%s, requests up to %g s of audio%s)",
                time.monotonic() - started,
                settings.device,
                settings.max_concurrent_requests,
                "" if settings.max_concurrent_requests == 1 else "s",
                settings.max_duration_seconds,
                "; demo checkpoint: set --max-duration-seconds for longer" if settings.model is None else "",
            )
            yield
        finally:
            await asyncio.to_thread(scheduler.close, settings.retirement_timeout_s)

    app = Starlette(
        routes=[
            Route("/health/live", live, methods=["GET"]),
            Route("/health/ready", ready, methods=["GET"]),
            Route("/v1/capabilities", capabilities, methods=["GET"]),
            Route("/v1/voice-design/speech", voice_design_speech, methods=["POST"]),
            Route("/v1/audio/speech", openai_speech, methods=["POST"]),
            Route("/v1/requests/{request_id}", cancel_request, methods=["DELETE"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/openapi.json", openapi, methods=["GET"]),
        ],
        exception_handlers={Problem: _problem_handler},
        lifespan=lifespan,
    )
    app.state.server = state
    return app

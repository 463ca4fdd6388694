"""Admission, the active-id registry, cancellation and draining, on the event loop's side.

A request id is active from admission until its engine slot is released *and* its response has ended,
so a duplicate id is refused (409) exactly as long as the earlier request can still be observed.
All methods run on the event loop; the engine worker reaches a ticket only through its ``notify``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Literal

from ..runtime.request import SynthesisRequest
from ..runtime.scheduler import Event, RequestHandle, Scheduler, SchedulerClosed, SchedulerFull
from .metrics import ServerMetrics
from .problems import Problem
from .settings import ServerSettings

logger = logging.getLogger("qwen3_tts.server")

Outcome = Literal["completed", "failed", "cancelled"]
CANCEL_CODES = frozenset({"request_cancelled", "client_disconnected", "slow_client", "server_shutting_down"})


class RetirementTimeout(Exception):
    """The engine did not free the request's slot within the retirement timeout."""


class Ticket:
    """One admitted request: its id, its scheduler handle and an awaitable view of its events.

    Once the request has been cancelled or has delivered its final packet, its slot must be freed within
    ``retirement_timeout_s``: from then on ``next_event`` raises ``RetirementTimeout`` past that deadline.
    """

    def __init__(
        self,
        request_id: str,
        streaming: bool,
        loop: asyncio.AbstractEventLoop,
        retirement_timeout_s: float = 25.0,
    ) -> None:
        self.request_id = request_id
        self.streaming = streaming
        self.handle: RequestHandle | None = None
        self.tombstone = False
        self._loop = loop
        self._ready = asyncio.Event()
        self._retirement_timeout_s = retirement_timeout_s
        self._retire_by: float | None = None

    def notify(self) -> None:
        """Called by the engine worker thread."""
        with contextlib.suppress(RuntimeError):  # the loop has closed; nobody is waiting any more
            self._loop.call_soon_threadsafe(self._ready.set)

    async def next_event(self) -> Event:
        assert self.handle is not None
        while True:
            self._ready.clear()
            event = self.handle.poll()
            if event is not None:
                return event
            if self._retire_by is None:
                await self._ready.wait()
                continue
            remaining = self._retire_by - self._loop.time()
            try:
                if remaining <= 0:
                    raise TimeoutError
                await asyncio.wait_for(self._ready.wait(), remaining)
            except TimeoutError:
                raise RetirementTimeout(
                    f"the engine did not release the request within {self._retirement_timeout_s:g} s"
                ) from None

    def cancel(self, code: str, detail: str) -> None:
        if self.handle is not None:
            self.handle.cancel(code, detail)
            self.expect_retirement()

    def expect_retirement(self) -> None:
        """Start the retirement clock (once): the request was cancelled or delivered its final packet."""
        if self._retire_by is None:
            self._retire_by = self._loop.time() + self._retirement_timeout_s
            self._ready.set()  # a waiter re-polls and starts waiting against the deadline

    async def wait_retired(self, timeout: float) -> bool:
        """Consume events until the terminal one (queued only once the slot is free); False on timeout."""
        try:
            async with asyncio.timeout(timeout):
                while not self.retired:
                    await self.next_event()
        except (TimeoutError, RetirementTimeout):
            return False
        return True

    @property
    def retired(self) -> bool:
        return self.handle is None or self.handle.retired


class Admissions:
    """Who may start: capacity, duplicate ids, shutdown; and what happens when a request ends."""

    def __init__(self, settings: ServerSettings, scheduler: Scheduler, metrics: ServerMetrics) -> None:
        self.settings = settings
        self.scheduler = scheduler
        self.metrics = metrics
        self.shutting_down = False
        self.healthy = True
        self._active: dict[str, Ticket] = {}
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def ready(self) -> bool:
        return self.healthy and not self.shutting_down and self.scheduler.alive

    def get(self, request_id: str) -> Ticket | None:
        return self._active.get(request_id)

    def admit(self, request_id: str, request: SynthesisRequest, streaming: bool) -> Ticket:
        if self.shutting_down:
            raise Problem("server_shutting_down", "the server is shutting down; retry on another instance")
        if request_id in self._active:
            raise Problem("request_id_in_use", "a request with this id is still active", request_id)
        if len(self._active) >= self.settings.max_concurrent_requests:
            self.metrics.add("rejected_requests_total")
            raise Problem("capacity_exhausted", "all synthesis slots are busy; retry shortly", request_id)
        ticket = Ticket(request_id, streaming, asyncio.get_running_loop(), self.settings.retirement_timeout_s)
        try:
            ticket.handle = self.scheduler.submit(request, ticket.notify)
        except SchedulerFull:
            self.metrics.add("rejected_requests_total")
            raise Problem(
                "capacity_exhausted", "all synthesis slots are busy; retry shortly", request_id
            ) from None
        except SchedulerClosed:
            self.metrics.add("rejected_requests_total")
            self.healthy = False
            raise Problem("backend_unavailable", "the engine worker has stopped", request_id) from None
        self._active[request_id] = ticket
        self._idle.clear()
        self.metrics.add("http_requests_total")
        self.metrics.add("active_requests")
        self.metrics.add("streaming_requests_total" if streaming else "buffered_requests_total")
        return ticket

    async def finish(self, ticket: Ticket, outcome: Outcome, emitted_samples: int = 0) -> None:
        """End a request: make sure its slot is free (cancel if needed), count it, free its id."""
        if not ticket.retired:
            ticket.cancel("client_disconnected", "the response ended before the request did")
            if not await ticket.wait_retired(self.settings.retirement_timeout_s):
                self._tombstone(ticket)
                return
        self.metrics.add(f"{outcome}_requests_total")
        if outcome == "completed":
            self.metrics.add("emitted_samples_total", emitted_samples)
        self._forget(ticket)

    def _tombstone(self, ticket: Ticket) -> None:
        """The slot was not freed in time: keep the id (and the gauge) and report not ready until restart."""
        logger.error(
            "engine slot was not released within %.0f s; marking unhealthy",
            self.settings.retirement_timeout_s,
        )
        ticket.tombstone = True
        self.healthy = False
        self.metrics.add("retirement_timeouts_total")
        self.metrics.add("failed_requests_total")

    def _forget(self, ticket: Ticket) -> None:
        if self._active.get(ticket.request_id) is ticket:
            del self._active[ticket.request_id]
            self.metrics.add("active_requests", -1)
        if not any(not t.tombstone for t in self._active.values()):
            self._idle.set()

    async def drain(self, drain_timeout: float, retire_timeout: float) -> None:
        """Refuse new work, let running requests finish for ``drain_timeout``, then cancel the rest."""
        self.shutting_down = True
        try:
            await asyncio.wait_for(self._idle.wait(), drain_timeout)
            return
        except TimeoutError:
            pass
        for ticket in list(self._active.values()):
            ticket.cancel("server_shutting_down", "the server is shutting down")
        try:
            await asyncio.wait_for(self._idle.wait(), retire_timeout)
        except TimeoutError:
            logger.error("%d requests did not end within the shutdown deadline", len(self._active))

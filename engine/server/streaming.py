"""ASGI responses for an admitted synthesis: progressive bodies and buffered WAV.

Both watch for the client leaving while they wait on the engine (the request is cancelled at once, which
frees its slot within one engine step), put a deadline on every chunk they send (a client that stops
reading is cancelled after ``slow_client_timeout_s`` instead of pinning a slot), and hand the request back
to ``Admissions`` when they end, however they end. The status line is sent only once the first packet
exists, so a request that fails before any audio gets a real HTTP error instead of a 200 with an error part.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ..config import SAMPLE_RATE_HZ, SAMPLES_PER_FRAME
from ..runtime.request import AudioPacket
from ..runtime.scheduler import Failed, Finished
from .admission import CANCEL_CODES, Admissions, Outcome, RetirementTimeout, Ticket
from .problems import STATUS_BY_CODE, Problem
from .wire import ProgressiveFormat, wav_bytes

WAV_CHUNK_BYTES = 64 * 1024


class PacketSequence:
    """Re-checks what the scheduler promised: contiguous, well-sized packets and exactly one final one."""

    def __init__(self) -> None:
        self.next_sequence = 0
        self.next_frame = 0
        self.samples = 0
        self.final_seen = False

    def check(self, packet: AudioPacket) -> str | None:
        """None when the packet continues the stream, else what is wrong with it."""
        if self.final_seen:
            return "a packet followed the final packet"
        if (packet.sequence, packet.first_frame) != (self.next_sequence, self.next_frame):
            return "packet positions are not contiguous"
        if not 1 <= packet.frame_count <= 4 or len(packet.pcm) != packet.frame_count * SAMPLES_PER_FRAME * 2:
            return "packet size does not match its frame count"
        self.next_sequence += 1
        self.next_frame += packet.frame_count
        self.samples += packet.frame_count * SAMPLES_PER_FRAME
        self.final_seen = packet.is_final
        return None


class _ClientGone(Exception):
    """The client disconnected or stopped reading; nothing more can be sent."""


def _outcome(failure: Failed) -> Outcome:
    return "cancelled" if failure.code in CANCEL_CODES else "failed"


def _problem_for(failure: Failed, request_id: str) -> Problem:
    code = failure.code if failure.code in STATUS_BY_CODE else "internal_error"
    return Problem(code, failure.detail, request_id)


class SpeechResponse(Response):
    """Runs one admitted request to its end and writes it as a progressive body or a buffered WAV.

    Like starlette's StreamingResponse it subclasses Response for the router's sake and writes its own
    ASGI messages.
    """

    def __init__(
        self,
        admissions: Admissions,
        ticket: Ticket,
        headers: Mapping[str, str],
        body_format: ProgressiveFormat | None,
    ) -> None:
        self.admissions = admissions
        self.ticket = ticket
        self.response_headers = dict(headers)
        self.body_format = body_format
        self.sequence = PacketSequence()
        self.started = time.monotonic()
        self.gone = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.create_task(self._watch_disconnect(receive))
        outcome: Outcome = "failed"
        try:
            if self.body_format is None:
                outcome = await self._buffered(scope, receive, send)
            else:
                outcome = await self._progressive(self.body_format, scope, receive, send)
        except _ClientGone:
            outcome = "cancelled"
        finally:
            watcher.cancel()
            await self.admissions.finish(self.ticket, outcome, self.sequence.samples)

    async def _watch_disconnect(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.gone = True
        self.ticket.cancel("client_disconnected", "the client disconnected")

    async def _send(self, send: Send, body: bytes, more_body: bool = True) -> None:
        if self.gone:
            raise _ClientGone
        timeout = self.admissions.settings.slow_client_timeout_s
        try:
            await asyncio.wait_for(
                send({"type": "http.response.body", "body": body, "more_body": more_body}), timeout
            )
        except (TimeoutError, OSError):
            self.ticket.cancel("slow_client", "the client did not read the response in time")
            raise _ClientGone from None

    async def _start(self, send: Send, headers: Mapping[str, str]) -> None:
        raw = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]
        await send({"type": "http.response.start", "status": 200, "headers": raw})

    async def _next_event(self) -> AudioPacket | Finished | Failed:
        """The ticket's next event; a slot not freed in time ends the request as ``native_retirement_timeout``
        (``Admissions.finish`` then tombstones it)."""
        try:
            return await self.ticket.next_event()
        except RetirementTimeout as error:
            return Failed("native_retirement_timeout", str(error))

    async def _next_packet(self) -> AudioPacket | Finished | Failed:
        """The next event; a packet that breaks the stream's continuity cancels the request instead."""
        event = await self._next_event()
        if isinstance(event, AudioPacket):
            problem = self.sequence.check(event)
            if problem is not None:
                self.ticket.cancel("internal_error", problem)
                return await self._next_terminal()
            if event.is_final:
                self.ticket.expect_retirement()
        elif isinstance(event, Finished) and not self.sequence.final_seen:
            return Failed("internal_error", "the stream ended without a final packet")
        return event

    async def _next_terminal(self) -> Finished | Failed:
        while True:
            event = await self._next_event()
            if not isinstance(event, AudioPacket):
                return event

    def _observe(self, finished: Finished) -> None:
        metrics = self.admissions.metrics
        seconds = self.sequence.samples / SAMPLE_RATE_HZ
        if seconds > 0:
            metrics.observe_real_time_factor(finished.metrics.wall_microseconds / 1e6 / seconds)

    async def _progressive(
        self, body: ProgressiveFormat, scope: Scope, receive: Receive, send: Send
    ) -> Outcome:
        first = await self._next_packet()
        if not isinstance(first, AudioPacket):
            return await self._refuse(first, scope, receive, send)
        await self._start(send, {**self.response_headers, "content-type": body.media_type})
        await self._send(send, body.opening() + body.audio(first))
        self.admissions.metrics.observe_first_audio(time.monotonic() - self.started)
        while True:
            event = await self._next_packet()
            if isinstance(event, AudioPacket):
                await self._send(send, body.audio(event))
            elif isinstance(event, Finished):
                self._observe(event)
                await self._send(send, body.closing(event.finish_reason, event.metrics), more_body=False)
                return "completed"
            else:
                tail = body.failure(event.code, event.detail)
                if tail is not None:
                    await self._send(send, tail, more_body=False)
                return _outcome(event)

    async def _buffered(self, scope: Scope, receive: Receive, send: Send) -> Outcome:
        pcm = bytearray()
        limit = self.admissions.settings.max_buffered_pcm_bytes
        while True:
            event = await self._next_packet()
            if isinstance(event, AudioPacket):
                pcm += event.pcm
                if len(pcm) > limit:
                    self.ticket.cancel("buffer_limit_exceeded", "the audio outgrew the WAV buffer limit")
            elif isinstance(event, Failed):
                return await self._refuse(event, scope, receive, send)
            else:
                break
        self._observe(event)
        data = wav_bytes(bytes(pcm))
        await self._start(
            send,
            {
                **self.response_headers,
                "content-type": "audio/wav",
                "content-length": str(len(data)),
                "content-disposition": "inline; filename=voice-design.wav",
                "x-finish-reason": event.finish_reason,
            },
        )
        self.admissions.metrics.observe_first_audio(time.monotonic() - self.started)
        for offset in range(0, len(data), WAV_CHUNK_BYTES):
            chunk = data[offset : offset + WAV_CHUNK_BYTES]
            await self._send(send, chunk, more_body=offset + WAV_CHUNK_BYTES < len(data))
        return "completed"

    async def _refuse(
        self, failure: Finished | Failed, scope: Scope, receive: Receive, send: Send
    ) -> Outcome:
        """The request ended before any audio: answer with a problem document instead of a stream."""
        if isinstance(failure, Finished):
            failure = Failed("internal_error", "the request ended without audio")
        if not self.gone:
            await _problem_for(failure, self.ticket.request_id).to_response()(scope, receive, send)
        return _outcome(failure)

"""The engine thread: one worker owns the engine and advances every active request one frame per step.

Each loop iteration (1) retires cancelled requests, (2) starts newly admitted ones, prefills them together
in one ``prefill_many`` call and sends their first frames as 1-frame packets ahead of everything else
(first-frame priority: a newcomer never waits for the batch), then (3) launches one batched step over
every session whose output queue has room and (4) collects the step launched by the previous iteration,
so the device computes the next frame while the worker turns the last one into packets (engine.py, "one
frame ahead"). A session whose queue is full is not launched until its consumer drains it (backpressure),
so a slow client slows only itself and the worker never blocks on I/O; the packet a step in flight will
release counts as queued, so a session is launched exactly when a step-by-step loop would step it. The
packets that fall due in one step (several sessions completing a packet, or ending, on the same frame) are
decoded by one ``launch_decode`` call, which batches them on CUDA (one codec graph replay, on the codec's
own stream) and decodes each session alone on CPU (engine.py says why), each continuing its own codec
stream state. A full packet is held until the session's next frame says whether it is the last one, so
its PCM is collected (``collect_decode``) only then: the decode runs beside the next step instead of
stopping the worker. First and final packets are collected at once (first audio waits for nothing).

A frame launched for a session that turns out to have ended at the frame before (EOS), or that is retired
(cancelled, failed) while the frame is in flight, is dropped when collected: no packet or event follows a
request's end. Its slot may be handed to a newcomer before that: the engine orders the newcomer's setup
after the frame on the device.

Consumers (the HTTP layer, other threads) talk to the worker only through a ``RequestHandle``: ``poll``
never blocks, ``cancel`` is idempotent, and a ``notify`` callback tells them when to poll again. Slots are
freed by the worker alone, and a request's terminal event is queued only after its session is released,
so "terminal event seen" means "slot free".

An engine error fails only the requests it touched (``internal_error``), except a device fault (CUDA error,
out of memory: the seed's Model/Allocation/Cuda statuses), after which the engine cannot be trusted: the
worker then stops, every request it holds ends with ``backend_unavailable``, and ``submit`` raises
``SchedulerClosed`` from then on. A worker that dies of anything else ends the same way.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch

from ..errors import InvalidRequestError
from .request import AudioPacket, FinishReason, FrameResult, SynthesisRequest

logger = logging.getLogger("qwen3_tts.engine")


class FrameEngine(Protocol):
    """The part of ``VoiceDesignEngine`` the scheduler drives (sessions are opaque to it). The step is split
    in two (``launch_step`` / ``collect_step``), so the worker runs a step ahead."""

    def start_session(self, request: SynthesisRequest) -> Any: ...

    def prefill_many(self, sessions: list[Any]) -> list[FrameResult]: ...

    def can_launch(self, session: Any) -> bool: ...

    def launch_step(self, sessions: list[Any]) -> Any: ...

    def collect_step(self, pending: Any) -> list[FrameResult | None]: ...

    def launch_decode(self, sessions: list[Any], frames: list[torch.Tensor]) -> Any: ...

    def collect_decode(self, pending: Any) -> list[bytes]: ...

    def release(self, session: Any) -> None: ...


class SchedulerFull(Exception):
    """Every slot is taken; the caller should retry later."""


class SchedulerClosed(Exception):
    """The worker has stopped (shutdown or a fatal error); no request can start."""


def is_backend_failure(error: BaseException) -> bool:
    """A device fault the engine cannot recover from: out of memory, or a CUDA/accelerator error."""
    accelerator_error = getattr(torch, "AcceleratorError", None)
    return (
        isinstance(error, torch.OutOfMemoryError)
        or (accelerator_error is not None and isinstance(error, accelerator_error))
        or (isinstance(error, RuntimeError) and "CUDA error" in str(error))
    )


@dataclass
class RequestMetrics:
    """Per-request timings (microseconds from enqueue) and sizes, as in the seed's end part.

    ``talker_gpu_microseconds`` / ``codec_gpu_microseconds`` are host wall time of the engine calls that
    advanced this request (batch aggregate for batched steps and packet decodes); the device-bytes field is
    0 because memory is not attributed per request; ``peak_request_host_bytes`` is the most PCM this
    request held queued.
    """

    queue_microseconds: int = 0
    prefill_microseconds: int = 0
    first_codec_frame_microseconds: int = 0
    first_audio_microseconds: int = 0
    wall_microseconds: int = 0
    generated_codec_frames: int = 0
    emitted_samples: int = 0
    emitted_packets: int = 0
    talker_gpu_microseconds: float = 0.0
    codec_gpu_microseconds: float = 0.0
    peak_request_device_bytes: int = 0
    peak_request_host_bytes: int = 0


@dataclass(frozen=True)
class Finished:
    """Terminal: every packet was delivered and the session is released."""

    finish_reason: FinishReason
    metrics: RequestMetrics


@dataclass(frozen=True)
class Failed:
    """Terminal: the request ended without finishing (cancelled, invalid, engine error); slot released."""

    code: str
    detail: str


Event = AudioPacket | Finished | Failed


def _micros_since(start_ns: int) -> int:
    return (time.perf_counter_ns() - start_ns) // 1000


class RequestHandle:
    """One request as its consumer sees it. All state is guarded by the scheduler's lock."""

    def __init__(self, scheduler: Scheduler, request: SynthesisRequest, notify: Callable[[], None]) -> None:
        self.request = request
        self.enqueued_ns = time.perf_counter_ns()
        self._scheduler = scheduler
        self._notify = notify
        self._outbox: deque[Event] = deque()
        self._cancel: Failed | None = None
        self._retired = False
        self.metrics = RequestMetrics()

    @property
    def retired(self) -> bool:
        with self._scheduler._lock:
            return self._retired

    def poll(self) -> Event | None:
        """The next event, or None when nothing is ready yet (wait for ``notify``)."""
        with self._scheduler._lock:
            if not self._outbox:
                return None
            event = self._outbox.popleft()
            if isinstance(event, AudioPacket):
                if self.metrics.emitted_packets == 0:
                    self.metrics.first_audio_microseconds = _micros_since(self.enqueued_ns)
                self.metrics.emitted_packets += 1
                self.metrics.emitted_samples += len(event.pcm) // 2
                self._scheduler._wake.notify()
            elif isinstance(event, Finished):
                event = Finished(event.finish_reason, replace(self.metrics))
            return event

    def cancel(self, code: str = "request_cancelled", detail: str = "the request was cancelled") -> None:
        """Ask the worker to stop this request; its terminal event will be ``Failed(code, detail)``."""
        with self._scheduler._lock:
            if self._retired or self._cancel is not None:
                return
            self._cancel = Failed(code, detail)
            self._outbox = deque(e for e in self._outbox if not isinstance(e, AudioPacket))
            self._scheduler._wake.notify()


@dataclass
class _Job:
    """Worker-only state of an admitted request."""

    handle: RequestHandle
    session: Any
    pending: list[torch.Tensor] = field(default_factory=list)
    held: _HeldPacket | None = None  # a launched packet waiting to learn whether it is the final one
    sequence: int = 0
    next_frame: int = 0


@dataclass
class _Decode:
    """One ``launch_decode`` call on its way: collected once, by the first packet that needs its PCM (the
    others find the PCM, or the error, here). ``launch_microseconds`` is the host time the launch took."""

    pending: Any
    jobs: list[_Job]
    launch_microseconds: float
    pcms: list[bytes] | None = None
    error: Exception | None = None


@dataclass
class _HeldPacket:
    """A packet whose decode was launched: its place in the stream, and where its PCM will be."""

    decode: _Decode
    index: int
    sequence: int
    first_frame: int
    frame_count: int


@dataclass
class _InFlight:
    """A launched step: its jobs in launch order, the engine's pending step and the host time the launch took
    (microseconds)."""

    jobs: list[_Job]
    pending: Any
    launch_microseconds: float


class Scheduler:
    """Owns the engine thread; ``submit`` admits, handles stream the results."""

    def __init__(
        self,
        engine: FrameEngine,
        capacity: int,
        *,
        packet_frames: int = 4,
        queue_packets: int = 3,
    ) -> None:
        if capacity < 1 or not 1 <= packet_frames <= 4 or queue_packets < 1:
            raise ValueError("capacity >= 1, packet_frames 1..4 and queue_packets >= 1 are required")
        self.engine = engine
        self.capacity = capacity
        self.packet_frames = packet_frames
        self.queue_packets = queue_packets
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._incoming: list[RequestHandle] = []
        self._admitting: list[RequestHandle] = []  # taken from _incoming, not yet started (worker only)
        self._starting: list[tuple[RequestHandle, Any]] = []  # started, not yet prefilled (worker only)
        self._active: list[_Job] = []
        self._used = 0
        self._closing = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="qwen3-tts-engine", daemon=True)
        self._thread.start()

    @property
    def used_slots(self) -> int:
        with self._lock:
            return self._used

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._closed

    def submit(self, request: SynthesisRequest, notify: Callable[[], None]) -> RequestHandle:
        """Take a slot and queue the request; ``notify`` is called (from the worker) when events arrive."""
        with self._lock:
            if self._closing or self._closed:
                raise SchedulerClosed("the engine worker has stopped")
            if self._used >= self.capacity:
                raise SchedulerFull(f"all {self.capacity} slots are busy")
            handle = RequestHandle(self, request, notify)
            self._used += 1
            self._incoming.append(handle)
            self._wake.notify()
            return handle

    def close(self, timeout: float | None = None) -> None:
        """Stop the worker; requests still running end with ``Failed("server_shutting_down")``."""
        with self._lock:
            self._closing = True
            self._wake.notify()
        self._thread.join(timeout)

    # -- worker -----------------------------------------------------------------------------------------

    def _run(self) -> None:
        failure = Failed("backend_unavailable", "the engine worker failed")
        flight: _InFlight | None = None
        try:
            while True:
                admitted = self._wait_for_work(block=flight is None)
                if admitted is None:
                    failure = Failed("server_shutting_down", "the server is shutting down")
                    break
                self._retire_cancelled()
                self._admitting = admitted
                self._admit()
                ready = self._ready_jobs(flight)
                launched = self._launch(ready) if ready else None
                if flight is not None:
                    self._collect(flight)
                flight = launched
        except Exception as error:
            logger.exception("the engine worker failed; no request can run until a restart")
            failure = Failed("backend_unavailable", f"the engine failed: {type(error).__name__}")
        finally:
            self._fail_all(failure.code, failure.detail)

    def _has_room(self, job: _Job, in_flight: bool = False) -> bool:
        """Whether the job's next frame may be computed now. A job with a frame in flight and a held packet
        will send that packet when the frame is collected (or end), so the packet counts as queued."""
        queued = len(job.handle._outbox) + (1 if in_flight and job.held is not None else 0)
        return queued < self.queue_packets

    def _wait_for_work(self, block: bool) -> list[RequestHandle] | None:
        """The newly submitted requests, or None when closing; with `block`, first wait until there is
        something to do (a step in flight is always something to do: the caller does not block then)."""
        with self._lock:
            while block and not (
                self._closing
                or self._incoming
                or any(job.handle._cancel is not None or self._has_room(job) for job in self._active)
            ):
                self._wake.wait()
            if self._closing:
                return None
            admitted, self._incoming = self._incoming, []
            return admitted

    def _ready_jobs(self, flight: _InFlight | None) -> list[_Job]:
        """The jobs to launch a step for: not cancelled, with room, and with a frame left to launch (the
        engine's call: a job whose last frame is in flight waits for it to be collected)."""
        flying = {id(job) for job in flight.jobs} if flight is not None else set()
        with self._lock:
            jobs = [
                job
                for job in self._active
                if job.handle._cancel is None and self._has_room(job, id(job) in flying)
            ]
        return [job for job in jobs if self.engine.can_launch(job.session)]

    def _retire_cancelled(self) -> None:
        with self._lock:
            cancelled = [(job, job.handle._cancel) for job in self._active if job.handle._cancel is not None]
        for job, failure in cancelled:
            self._retire(job, failure)

    def _admit(self) -> None:
        """Start every request taken from the queue, prefill the started ones in one batched call and send
        their first frames (one ``launch_decode`` call for them all, collected at once).

        Each request fails alone as before: an invalid one is rejected by ``start_session``, and a failed
        batched prefill fails each of its requests as a failed start did. ``prefill_microseconds`` is the
        admission's time, from its first ``start_session`` to the end of the prefill, for each request.
        """
        started_ns = time.perf_counter_ns()
        while self._admitting:
            handle = self._admitting.pop(0)
            handle.metrics.queue_microseconds = (started_ns - handle.enqueued_ns) // 1000
            if handle._cancel is not None:
                self._finish(handle, None, handle._cancel)
                continue
            try:
                self._starting.append((handle, self.engine.start_session(handle.request)))
            except Exception as error:
                self._fail_start([(handle, None)], error)
        started = self._starting
        if not started:
            return
        try:
            results = self.engine.prefill_many([session for _, session in started])
            if len(results) != len(started):
                raise RuntimeError(
                    f"prefill_many returned {len(results)} results for {len(started)} sessions"
                )
        except Exception as error:
            self._starting = []
            self._fail_start(started, error)
            return
        self._starting = []
        elapsed = (time.perf_counter_ns() - started_ns) / 1000
        taken = []
        for (handle, session), result in zip(started, results, strict=True):
            handle.metrics.prefill_microseconds = int(elapsed)
            handle.metrics.talker_gpu_microseconds += elapsed
            job = _Job(handle, session)
            self._active.append(job)
            taken.append((job, result))
        self._take(taken, target=1)  # decoded and sent now: a newcomer never waits for the batch

    def _fail_start(self, failed: list[tuple[RequestHandle, Any]], error: Exception) -> None:
        """End the requests whose start or prefill raised `error`; a device fault is re-raised (it ends
        the worker)."""
        if isinstance(error, InvalidRequestError):
            outcome = Failed("invalid_request", str(error))
        elif is_backend_failure(error):
            outcome = Failed("backend_unavailable", f"the engine failed: {type(error).__name__}")
        else:
            logger.exception("engine start failed for %d request(s)", len(failed))
            outcome = Failed("internal_error", f"engine start failed: {type(error).__name__}")
        for handle, session in failed:
            self._finish(handle, session, outcome)
        if is_backend_failure(error):
            raise error

    def _launch(self, jobs: list[_Job]) -> _InFlight | None:
        """Launch the next step of `jobs`; None when the launch failed and the jobs were retired."""
        started = time.perf_counter_ns()
        try:
            pending = self.engine.launch_step([job.session for job in jobs])
        except Exception as error:
            self._step_failed(jobs, error)
            return None
        return _InFlight(jobs, pending, (time.perf_counter_ns() - started) / 1000)

    def _collect(self, flight: _InFlight) -> None:
        """Wait for a launched step and take the results of its jobs that are still running."""
        started = time.perf_counter_ns()
        try:
            results = self._results(flight)
        except Exception as error:
            self._step_failed([job for job in flight.jobs if job in self._active], error)
            return
        elapsed = flight.launch_microseconds + (time.perf_counter_ns() - started) / 1000
        taken = []
        for job, result in results:
            if result is not None and job in self._active:  # else it ended before this frame: dropped
                job.handle.metrics.talker_gpu_microseconds += elapsed
                taken.append((job, result))
        self._take(taken, target=self.packet_frames)

    def _results(self, flight: _InFlight) -> list[tuple[_Job, FrameResult | None]]:
        """The launched step's results, job by job."""
        results = self.engine.collect_step(flight.pending)
        if len(results) != len(flight.jobs):
            raise RuntimeError(f"step returned {len(results)} results for {len(flight.jobs)} sessions")
        return list(zip(flight.jobs, results, strict=True))

    def _step_failed(self, jobs: list[_Job], error: Exception) -> None:
        """A launch or collect raised: a device fault ends the worker, anything else fails these jobs."""
        if is_backend_failure(error):
            raise error  # _run ends every request, these included
        logger.exception("engine step failed for %d session(s)", len(jobs))
        for job in jobs:
            self._retire(job, Failed("internal_error", f"engine step failed: {type(error).__name__}"))

    def _take(self, taken: list[tuple[_Job, FrameResult]], target: int) -> None:
        """Group each job's frames into packets; the decodes of the packets due now are launched in one call.

        A full packet is held until the job's next result says whether it is the final one (the first
        packet excepted: EOS cannot follow frame 0, so it goes out at once); its PCM is collected when it
        goes out, so its decode overlaps the step launched meanwhile.
        """
        due: list[tuple[_Job, FrameResult]] = []
        for job, result in taken:
            if result.codes is not None:
                job.handle.metrics.generated_codec_frames += 1
                if job.held is not None:
                    held, job.held = job.held, None
                    if not self._send(job, held, None):
                        continue
                job.pending.append(result.codes)
            if job.pending and (result.finish_reason is not None or len(job.pending) >= target):
                due.append((job, result))
            elif result.finish_reason is not None:
                self._finish_job(job, result)
        if not due:
            return
        try:
            launched = self._decode([job for job, _ in due])
        except Exception as error:
            if is_backend_failure(error):
                raise
            logger.exception("codec decode failed for %d session(s)", len(due))
            failure = Failed("internal_error", f"codec decode failed: {type(error).__name__}")
            for job, _ in due:
                self._retire(job, failure)
            return
        for (job, result), held in zip(due, launched, strict=True):
            if result.finish_reason is not None:
                job.held = held
                self._finish_job(job, result)
            elif target == 1 and held.sequence == 0:
                self._send(job, held, None)
            else:
                job.held = held

    def _finish_job(self, job: _Job, result: FrameResult) -> None:
        """The job's last frame is in: its held packet (if any) goes out as the final one; then retire."""
        assert result.finish_reason is not None
        if job.held is not None:
            held, job.held = job.held, None
            if not self._send(job, held, result.finish_reason):
                return
        self._retire(job, result.finish_reason)

    def _decode(self, jobs: list[_Job]) -> list[_HeldPacket]:
        """One ``launch_decode`` call for the pending frames of `jobs`; their packets, in order."""
        started = time.perf_counter_ns()
        pending = self.engine.launch_decode(
            [job.session for job in jobs], [torch.stack(job.pending) for job in jobs]
        )
        decode = _Decode(pending, list(jobs), (time.perf_counter_ns() - started) / 1000)
        packets = []
        for index, job in enumerate(jobs):
            packets.append(_HeldPacket(decode, index, job.sequence, job.next_frame, len(job.pending)))
            job.sequence += 1
            job.next_frame += len(job.pending)
            job.pending = []
        return packets

    def _send(self, job: _Job, held: _HeldPacket, finish_reason: FinishReason | None) -> bool:
        """Collect a launched packet's PCM and emit it (as the final one with `finish_reason`); False when
        its decode failed, after retiring the job. A device fault is re-raised (it ends the worker)."""
        try:
            pcm = self._decoded_pcm(held.decode)[held.index]
        except Exception as error:
            if is_backend_failure(error):
                raise
            self._retire(job, Failed("internal_error", f"codec decode failed: {type(error).__name__}"))
            return False
        final = finish_reason is not None
        self._emit(
            job, AudioPacket(held.sequence, held.first_frame, held.frame_count, pcm, final, finish_reason)
        )
        return True

    def _decoded_pcm(self, decode: _Decode) -> list[bytes]:
        """The decode's PCM, one packet per job, collected on first use; its error, raised again, after."""
        if decode.pcms is None and decode.error is None:
            started = time.perf_counter_ns()
            try:
                pcms = self.engine.collect_decode(decode.pending)
                if len(pcms) != len(decode.jobs):
                    raise RuntimeError(
                        f"collect_decode returned {len(pcms)} packets for {len(decode.jobs)} sessions"
                    )
                decode.pcms = pcms
            except Exception as error:
                decode.error = error
                if not is_backend_failure(error):
                    logger.exception("codec decode failed for %d session(s)", len(decode.jobs))
            elapsed = decode.launch_microseconds + (time.perf_counter_ns() - started) / 1000
            for job in decode.jobs:
                job.handle.metrics.codec_gpu_microseconds += elapsed
        if decode.error is not None:
            raise decode.error
        assert decode.pcms is not None
        return decode.pcms

    def _emit(self, job: _Job, packet: AudioPacket) -> None:
        handle = job.handle
        with self._lock:
            if handle._cancel is not None:
                return
            handle._outbox.append(packet)
            metrics = handle.metrics
            if packet.sequence == 0:
                metrics.first_codec_frame_microseconds = _micros_since(handle.enqueued_ns)
            metrics.wall_microseconds = _micros_since(handle.enqueued_ns)
            queued = sum(len(e.pcm) for e in handle._outbox if isinstance(e, AudioPacket))
            metrics.peak_request_host_bytes = max(metrics.peak_request_host_bytes, queued)
        handle._notify()

    def _retire(self, job: _Job, outcome: FinishReason | Failed) -> None:
        if job in self._active:  # once only: finishing frees the slot
            self._active.remove(job)
            self._finish(job.handle, job.session, outcome)

    def _finish(self, handle: RequestHandle, session: Any, outcome: FinishReason | Failed) -> None:
        """Release the session, then queue the terminal event: the slot is free before anyone hears of it."""
        if session is not None:
            try:
                self.engine.release(session)
            except Exception as error:
                logger.exception("engine release failed")
                if not isinstance(outcome, Failed):  # a request that already failed keeps its reason
                    outcome = Failed("internal_error", f"engine release failed: {type(error).__name__}")
        with self._lock:
            if handle._cancel is not None:
                outcome = handle._cancel
            if isinstance(outcome, Failed):
                handle._outbox = deque(e for e in handle._outbox if not isinstance(e, AudioPacket))
                handle._outbox.append(outcome)
            else:
                handle._outbox.append(Finished(outcome, handle.metrics))
            handle._retired = True
            self._used -= 1
        handle._notify()

    def _fail_all(self, code: str, detail: str) -> None:
        """The worker is stopping: end every request it still holds (a caller's own cancel reason wins)."""
        failure = Failed(code, detail)
        with self._lock:
            self._closed = True
            leftovers, self._incoming = self._admitting + self._incoming, []
            self._admitting = []
        starting, self._starting = self._starting, []
        for handle, session in starting:
            self._finish(handle, session, failure)
        for job in list(self._active):
            self._retire(job, failure)
        for handle in leftovers:
            self._finish(handle, None, failure)

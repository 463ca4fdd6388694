"""The engine thread on the real tiny engine: batching, first-frame priority, backpressure, slots.

The engine is wrapped only to record which calls the scheduler makes; every call goes to the real engine.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from qwen3_tts_native.engine.runtime.engine import PendingDecode, PendingStep, VoiceDesignEngine
from qwen3_tts_native.engine.runtime.request import AudioPacket, FrameResult, SynthesisRequest, TalkerSampling
from qwen3_tts_native.engine.runtime.scheduler import (
    Event,
    Failed,
    Finished,
    RequestHandle,
    Scheduler,
    SchedulerClosed,
    SchedulerFull,
)

pytestmark = pytest.mark.integration


class RecordingEngine:
    """Forwards to a real engine and logs ("prefill", request texts) / ("step", batch size) /
    ("decode", batch size) calls when they are launched, and ("collected", batch size) / ("pcm", batch
    size) when a step's results or a decode's PCM are collected. Every result the worker collects is kept
    by request text (`collected`)."""

    def __init__(self, engine: VoiceDesignEngine) -> None:
        self.engine = engine
        self.calls: list[tuple[str, Any]] = []
        self.collected: dict[str, list[FrameResult | None]] = {}
        self.lock = threading.Lock()

    def start_session(self, request: SynthesisRequest) -> Any:
        return self.engine.start_session(request)

    def prefill_many(self, sessions: list[Any]) -> list[FrameResult]:
        with self.lock:
            self.calls.append(("prefill", tuple(session.request.text for session in sessions)))
        return self.engine.prefill_many(sessions)

    def can_launch(self, session: Any) -> bool:
        return self.engine.can_launch(session)

    def launch_step(self, sessions: list[Any]) -> PendingStep:
        with self.lock:
            self.calls.append(("step", len(sessions)))
        return self.engine.launch_step(sessions)

    def collect_step(self, pending: PendingStep) -> list[FrameResult | None]:
        results = self.engine.collect_step(pending)
        with self.lock:
            self.calls.append(("collected", len(results)))
        for session, result in zip(pending.sessions, results, strict=True):
            self.collected.setdefault(session.request.text, []).append(result)
        return results

    def launch_decode(self, sessions: list[Any], frames: list[torch.Tensor]) -> PendingDecode:
        with self.lock:
            self.calls.append(("decode", len(sessions)))
        return self.engine.launch_decode(sessions, frames)

    def collect_decode(self, pending: PendingDecode) -> list[bytes]:
        with self.lock:
            self.calls.append(("pcm", pending.count))
        return self.engine.collect_decode(pending)

    def release(self, session: Any) -> None:
        self.engine.release(session)


def assert_nothing_after_the_final_result(engine: RecordingEngine) -> None:
    """The worker collected no result for a request after its final one (only dropped frames, None)."""
    for text, results in engine.collected.items():
        ends = [i for i, r in enumerate(results) if r is not None and r.finish_reason is not None]
        assert len(ends) <= 1, text
        if ends:
            assert all(r is None for r in results[ends[0] + 1 :]), text


def request(text: str, frames: int) -> SynthesisRequest:
    return SynthesisRequest(
        text,
        "A calm voice.",
        seed=len(text),
        max_frames=frames,
        talker_sampling=TalkerSampling(repetition_penalty=1.0),
    )


def drain(handle: RequestHandle, timeout: float = 120) -> list[Event]:
    events: list[Event] = []
    deadline = time.monotonic() + timeout
    while not events or isinstance(events[-1], AudioPacket):
        event = handle.poll()
        if event is None:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        else:
            events.append(event)
    return events


@pytest.fixture
def recording(reference_engine: VoiceDesignEngine) -> RecordingEngine:
    return RecordingEngine(reference_engine)


def test_batches_first_frame_priority_and_slots(recording: RecordingEngine) -> None:
    scheduler = Scheduler(recording, capacity=2)
    try:
        first = scheduler.submit(request("first", 12), lambda: None)
        while (head := first.poll()) is None:  # "first" is generating: the next request joins a running batch
            time.sleep(0.001)
        second = scheduler.submit(request("second", 6), lambda: None)
        with pytest.raises(SchedulerFull):
            scheduler.submit(request("third", 6), lambda: None)
        events = drain(second), [head, *drain(first)]
    finally:
        scheduler.close(30)

    for stream in events:
        assert isinstance(stream[-1], Finished) and stream[-1].finish_reason == "length"
        packets = [e for e in stream if isinstance(e, AudioPacket)]
        assert packets[0].frame_count == 1 and [p.is_final for p in packets][-1]
    calls = [call for call in recording.calls if call[0] in ("prefill", "step")]
    second_prefill = calls.index(("prefill", ("second",)))
    assert ("step", 2) in calls[second_prefill:], "the two sessions never shared a step"
    assert all(call == ("step", 1) for call in calls[1:second_prefill])
    assert_nothing_after_the_final_result(recording)
    assert scheduler.used_slots == 0


def test_a_full_queue_pauses_only_its_own_session(recording: RecordingEngine) -> None:
    scheduler = Scheduler(recording, capacity=2, queue_packets=2)
    try:
        stalled = scheduler.submit(request("stalled", 60), lambda: None)
        flowing = scheduler.submit(request("flowing", 24), lambda: None)
        flowing_events = drain(flowing)
        generated = stalled.metrics.generated_codec_frames
        time.sleep(0.3)
        # Two queued packets (1 + 4 frames) and one frame towards the next: then the session is skipped.
        assert generated == stalled.metrics.generated_codec_frames == 1 + 4 + 1
        stalled.cancel()
        assert isinstance(drain(stalled)[-1], Failed)
    finally:
        scheduler.close(30)
    assert isinstance(flowing_events[-1], Finished)
    assert scheduler.used_slots == 0


class PausingEngine(RecordingEngine):
    """A RecordingEngine that holds the worker after its `after`-th launch until `resume` is set (the step
    is then in flight)."""

    def __init__(self, engine: VoiceDesignEngine, after: int) -> None:
        super().__init__(engine)
        self.after = after
        self.steps = 0
        self.paused = threading.Event()
        self.resume = threading.Event()

    def launch_step(self, sessions: list[Any]) -> PendingStep:
        pending = super().launch_step(sessions)
        self.steps += 1
        if self.steps == self.after:
            self.paused.set()
            self.resume.wait(60)
        return pending


def test_packets_due_together_are_decoded_in_one_call(
    reference_engine: VoiceDesignEngine, offline_pcm: Any
) -> None:
    """A request admitted 4 steps after another has its packets due on the same steps (1 + 4k frames), and
    both end on the same step: each such step decodes both in one call, and each stream's PCM is still
    exactly its solo synthesis."""
    engine = PausingEngine(reference_engine, after=4)
    scheduler = Scheduler(engine, capacity=2, queue_packets=64)
    early, late = request("early", 20), request("late", 16)
    try:
        first = scheduler.submit(early, lambda: None)
        assert engine.paused.wait(60)
        second = scheduler.submit(late, lambda: None)
        engine.resume.set()
        streams = drain(first), drain(second)
    finally:
        engine.resume.set()
        scheduler.close(30)
    for req, stream in zip((early, late), streams, strict=True):
        assert isinstance(stream[-1], Finished) and stream[-1].finish_reason == "length"
        pcm = b"".join(e.pcm for e in stream if isinstance(e, AudioPacket))
        assert pcm == offline_pcm(req)
    decodes = [n for call, n in engine.calls if call == "decode"]
    assert decodes.count(2) == 4  # frames 5-8, 9-12, 13-16 and the final 17-19 of "early"
    assert_nothing_after_the_final_result(engine)
    assert scheduler.used_slots == 0


@pytest.fixture(scope="module")
def four_slots(tiny_model: Path) -> VoiceDesignEngine:
    return VoiceDesignEngine.load(tiny_model, max_sessions=4)


def test_requests_waiting_together_are_prefilled_in_one_call(
    four_slots: VoiceDesignEngine, offline_pcm: Any
) -> None:
    """Requests that arrive while the worker is busy start together: one ``prefill_many`` for the valid
    ones (the invalid one is rejected alone, by ``start_session``), one decode call for their first
    packets, and each stream's PCM is still exactly its solo synthesis."""
    engine = PausingEngine(four_slots, after=2)
    scheduler = Scheduler(engine, capacity=4, queue_packets=64)
    first, a, b = request("first", 12), request("a", 9), request("b", 7)
    bad = replace(request("bad", 5), language="klingon")
    try:
        handles = [scheduler.submit(first, lambda: None)]
        assert engine.paused.wait(60)
        handles += [scheduler.submit(r, lambda: None) for r in (a, bad, b)]
        engine.resume.set()
        streams = [drain(handle) for handle in handles]
    finally:
        engine.resume.set()
        scheduler.close(30)
    together = engine.calls.index(("prefill", ("a", "b")))
    assert engine.calls[together + 1] == ("decode", 2)
    rejected = streams.pop(2)[-1]
    assert isinstance(rejected, Failed) and rejected.code == "invalid_request"
    for req, stream in zip((first, a, b), streams, strict=True):
        assert isinstance(stream[-1], Finished) and stream[-1].finish_reason == "length"
        assert b"".join(e.pcm for e in stream if isinstance(e, AudioPacket)) == offline_pcm(req)
    assert scheduler.used_slots == 0 and four_slots.free_slots == 4


class FailingPrefillEngine(PausingEngine):
    """A PausingEngine whose next ``prefill_many`` raises ``prefill_error`` (once), when one is set."""

    prefill_error: Exception | None = None

    def prefill_many(self, sessions: list[Any]) -> list[FrameResult]:
        if self.prefill_error is not None:
            error, self.prefill_error = self.prefill_error, None
            raise error
        return super().prefill_many(sessions)


def test_a_failed_batched_prefill_fails_each_of_its_requests(four_slots: VoiceDesignEngine) -> None:
    engine = FailingPrefillEngine(four_slots, after=2)
    scheduler = Scheduler(engine, capacity=4, queue_packets=64)
    try:
        first = scheduler.submit(request("first", 12), lambda: None)
        assert engine.paused.wait(60)
        engine.prefill_error = RuntimeError("prefill exploded")
        doomed = [scheduler.submit(request(text, 6), lambda: None) for text in ("x", "y")]
        engine.resume.set()
        outcomes = [drain(handle)[-1] for handle in doomed]
        later = drain(scheduler.submit(request("later", 4), lambda: None))
        first_events = drain(first)
    finally:
        engine.resume.set()
        scheduler.close(30)
    assert all(isinstance(o, Failed) and o.code == "internal_error" for o in outcomes), outcomes
    assert isinstance(first_events[-1], Finished) and isinstance(later[-1], Finished)
    assert scheduler.used_slots == 0 and four_slots.free_slots == 4


class BatchPausingEngine(RecordingEngine):
    """A RecordingEngine that holds the worker after its first launch of `batch` sessions until `resume`
    is set (that step is then in flight)."""

    def __init__(self, engine: VoiceDesignEngine, batch: int) -> None:
        super().__init__(engine)
        self.batch = batch
        self.paused = threading.Event()
        self.resume = threading.Event()

    def launch_step(self, sessions: list[Any]) -> PendingStep:
        pending = super().launch_step(sessions)
        if len(sessions) == self.batch and not self.paused.is_set():
            self.paused.set()
            self.resume.wait(60)
        return pending


def test_a_request_cancelled_with_a_frame_in_flight(
    reference_engine: VoiceDesignEngine, offline_pcm: Any
) -> None:
    """A request cancelled while a frame for it is in flight is retired at once and its slot goes to a
    newcomer (two slots, both taken): the frame is collected and dropped, no event follows the
    cancellation, and the other requests' PCM is still exactly their solo synthesis."""
    engine = BatchPausingEngine(reference_engine, batch=2)
    scheduler = Scheduler(engine, capacity=3, queue_packets=64)
    doomed, kept, newcomer = request("doomed", 40), request("kept", 14), request("newcomer", 9)
    try:
        handles = [scheduler.submit(r, lambda: None) for r in (doomed, kept)]
        assert engine.paused.wait(60)
        handles[0].cancel()
        handles.append(scheduler.submit(newcomer, lambda: None))
        engine.resume.set()
        streams = [drain(handle) for handle in handles]
    finally:
        engine.resume.set()
        scheduler.close(30)
    cancelled = streams.pop(0)
    assert isinstance(cancelled[-1], Failed) and cancelled[-1].code == "request_cancelled"
    assert engine.collected["doomed"][-1] is None  # the frame in flight at the cancellation
    for req, stream in zip((kept, newcomer), streams, strict=True):
        assert isinstance(stream[-1], Finished) and stream[-1].finish_reason == "length"
        assert b"".join(e.pcm for e in stream if isinstance(e, AudioPacket)) == offline_pcm(req)
    assert_nothing_after_the_final_result(engine)
    assert scheduler.used_slots == 0 and reference_engine.free_slots == 2


class FailingStepEngine(PausingEngine):
    """A PausingEngine whose next ``launch_step`` or ``collect_step`` raises the error armed for it (once)."""

    launch_error: Exception | None = None
    collect_error: Exception | None = None

    def launch_step(self, sessions: list[Any]) -> PendingStep:
        if self.launch_error is not None:
            error, self.launch_error = self.launch_error, None
            raise error
        return super().launch_step(sessions)

    def collect_step(self, pending: PendingStep) -> list[FrameResult | None]:
        if self.collect_error is not None:
            error, self.collect_error = self.collect_error, None
            raise error
        return super().collect_step(pending)


@pytest.mark.parametrize("where", ["launch", "collect"])
def test_a_failed_launch_or_collect_fails_its_requests(
    reference_engine: VoiceDesignEngine, offline_pcm: Any, where: str
) -> None:
    """An engine error in either half of a step fails the request in it with ``internal_error``; its
    other frame in flight is dropped, its slot is freed and the next request runs as usual."""
    engine = FailingStepEngine(reference_engine, after=3)
    scheduler = Scheduler(engine, capacity=2, queue_packets=64)
    later = request("later", 6)
    try:
        victim = scheduler.submit(request("victim", 30), lambda: None)
        assert engine.paused.wait(60)
        setattr(engine, f"{where}_error", RuntimeError(f"{where} exploded"))
        engine.resume.set()
        outcome = drain(victim)[-1]
        after = drain(scheduler.submit(later, lambda: None))
    finally:
        engine.resume.set()
        scheduler.close(30)
    assert isinstance(outcome, Failed) and outcome.code == "internal_error"
    assert isinstance(after[-1], Finished)
    assert b"".join(e.pcm for e in after if isinstance(e, AudioPacket)) == offline_pcm(later)
    assert_nothing_after_the_final_result(engine)
    assert scheduler.used_slots == 0 and reference_engine.free_slots == 2


def test_a_device_fault_in_a_collect_ends_every_request(reference_engine: VoiceDesignEngine) -> None:
    engine = FailingStepEngine(reference_engine, after=3)
    scheduler = Scheduler(engine, capacity=2, queue_packets=64)
    try:
        handles = [scheduler.submit(request(text, 30), lambda: None) for text in ("one", "two")]
        assert engine.paused.wait(60)
        engine.collect_error = torch.OutOfMemoryError("CUDA out of memory (injected)")
        engine.resume.set()
        outcomes = [drain(handle)[-1] for handle in handles]
        with pytest.raises(SchedulerClosed):
            scheduler.submit(request("refused", 4), lambda: None)
    finally:
        engine.resume.set()
        scheduler.close(30)
    assert all(isinstance(o, Failed) and o.code == "backend_unavailable" for o in outcomes), outcomes
    assert scheduler.used_slots == 0 and reference_engine.free_slots == 2


def test_a_held_packet_is_collected_after_the_next_frame(
    recording: RecordingEngine, offline_pcm: Any
) -> None:
    """A full packet waits for the next frame to know whether it is the last, so its PCM is collected only
    then and its decode overlaps that frame; the first packet (first audio) and the final one are collected
    at once. The bytes are still exactly the solo synthesis."""
    scheduler = Scheduler(recording, capacity=1, queue_packets=64)
    req = request("overlap", 14)  # packets of 1, 4, 4, 4 and 1 frames
    try:
        events = drain(scheduler.submit(req, lambda: None))
    finally:
        scheduler.close(30)
    assert isinstance(events[-1], Finished)
    assert b"".join(e.pcm for e in events if isinstance(e, AudioPacket)) == offline_pcm(req)
    calls = recording.calls
    launched = [i for i, call in enumerate(calls) if call[0] == "decode"]
    collected = [i for i, call in enumerate(calls) if call[0] == "pcm"]
    assert len(launched) == len(collected) == 5
    overlapped = [
        any(call[0] == "collected" for call in calls[start:end])
        for start, end in zip(launched, collected, strict=True)
    ]
    assert overlapped == [False, True, True, True, False]
    assert scheduler.used_slots == 0


class FailingCollectEngine(RecordingEngine):
    """A RecordingEngine whose `fail_at`-th ``collect_decode`` raises (the decode's error surfaces there)."""

    def __init__(self, engine: VoiceDesignEngine, fail_at: int) -> None:
        super().__init__(engine)
        self.collects = 0
        self.fail_at = fail_at

    def collect_decode(self, pending: PendingDecode) -> list[bytes]:
        self.collects += 1
        if self.collects == self.fail_at:
            raise RuntimeError("codec exploded")
        return super().collect_decode(pending)


def test_a_held_packet_whose_decode_fails_fails_its_request(
    reference_engine: VoiceDesignEngine, offline_pcm: Any
) -> None:
    """The second packet's decode fails when its PCM is collected: the request ends with
    ``internal_error`` after its first packet, nothing follows, and the next request runs as usual."""
    engine = FailingCollectEngine(reference_engine, fail_at=2)
    scheduler = Scheduler(engine, capacity=1, queue_packets=64)
    later = request("later", 6)
    try:
        victim = drain(scheduler.submit(request("victim", 20), lambda: None))
        after = drain(scheduler.submit(later, lambda: None))
    finally:
        scheduler.close(30)
    assert [type(event) for event in victim] == [AudioPacket, Failed]
    assert isinstance(victim[-1], Failed) and victim[-1].code == "internal_error"
    assert isinstance(after[-1], Finished)
    assert b"".join(e.pcm for e in after if isinstance(e, AudioPacket)) == offline_pcm(later)
    assert_nothing_after_the_final_result(engine)
    assert scheduler.used_slots == 0 and reference_engine.free_slots == 2

"""The server's scheduler on an accelerated CUDA engine (frame graphs, codec graphs on the codec's own
stream), where a packet's decode is launched at once and its PCM collected a frame later, so a collect can
find the decode still running. Uses a tiny random snapshot made here (no QWEN3_TTS_DEVICE_SNAPSHOT)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from qwen3_tts_native.commands.bench import EOS_TENSOR
from qwen3_tts_native.engine.checkpoint import write_random_snapshot
from qwen3_tts_native.engine.config import load_config
from qwen3_tts_native.engine.runtime.engine import VoiceDesignEngine
from qwen3_tts_native.engine.runtime.request import AudioPacket, SynthesisRequest
from qwen3_tts_native.engine.runtime.scheduler import Event, Finished, RequestHandle, Scheduler


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> VoiceDesignEngine:
    snapshot: Path = tmp_path_factory.mktemp("tiny")
    write_random_snapshot(snapshot, "tiny", 0)
    return VoiceDesignEngine.load(snapshot, device="cuda", dtype=torch.bfloat16, max_sessions=4)


def events_of(handle: RequestHandle, arrived: threading.Event, timeout: float = 120) -> list[Event]:
    """Every event of a request, waiting on its notify callback between polls."""
    events: list[Event] = []
    while not events or isinstance(events[-1], AudioPacket):
        event = handle.poll()
        if event is None:
            assert arrived.wait(timeout), "the request stalled"
            arrived.clear()
        else:
            events.append(event)
    return events


def test_a_stream_through_the_scheduler_is_its_solo_synthesis(engine: VoiceDesignEngine) -> None:
    """Alone in the scheduler a request runs the same graphs as `synthesize` (bucket 1, one-session
    decodes), so its packets are the same, bit for bit, though each held packet is collected a frame after
    its decode was launched. Requests one after another reuse the slot whose last decode just ended."""
    requests = [
        SynthesisRequest(f"Sentence number {i}.", "A calm voice.", seed=i, max_frames=n)
        for i, n in ((0, 21), (1, 14))
    ]
    scheduler = Scheduler(engine, capacity=1, queue_packets=64)
    try:
        streams = []
        for request in requests:
            arrived = threading.Event()
            streams.append(events_of(scheduler.submit(request, arrived.set), arrived))
    finally:
        scheduler.close(30)
    for request, events in zip(requests, streams, strict=True):
        assert isinstance(events[-1], Finished)
        got = [event for event in events if isinstance(event, AudioPacket)]
        assert got == list(engine.synthesize(request))


def test_concurrent_streams_through_the_scheduler_are_well_formed(engine: VoiceDesignEngine) -> None:
    """Three requests at once (batched steps and batched decodes in flight beside them): every stream is a
    contiguous run of packets (1 frame, then up to 4), final exactly at its end, then Finished, and the
    slots are all free afterwards."""
    requests = [
        SynthesisRequest(f"Line {i}.", "A bright voice.", seed=10 + i, max_frames=9 + 6 * i) for i in range(3)
    ]
    scheduler = Scheduler(engine, capacity=3, queue_packets=64)
    signals = [threading.Event() for _ in requests]
    try:
        handles = [scheduler.submit(r, s.set) for r, s in zip(requests, signals, strict=True)]
        streams = [events_of(h, s) for h, s in zip(handles, signals, strict=True)]
    finally:
        scheduler.close(30)
    for request, events in zip(requests, streams, strict=True):
        assert isinstance(events[-1], Finished)
        packets = [event for event in events if isinstance(event, AudioPacket)]
        assert [p.sequence for p in packets] == list(range(len(packets)))
        assert packets[0].frame_count == 1 and all(1 <= p.frame_count <= 4 for p in packets)
        assert [p.first_frame for p in packets] == [
            sum(q.frame_count for q in packets[:i]) for i in range(len(packets))
        ]
        assert [p.is_final for p in packets] == [False] * (len(packets) - 1) + [True]
        assert all(len(p.pcm) == 2 * 1920 * p.frame_count for p in packets)
        assert sum(p.frame_count for p in packets) <= request.max_frames
    assert scheduler.used_slots == 0


def test_opening_a_session_does_not_wait_for_the_frames_in_flight(engine: VoiceDesignEngine) -> None:
    """The scheduler opens a newcomer's session while other sessions' frames run on the stream: nothing in
    `start_session` may wait for that stream (a pageable upload would), or the GPU idles through the rest of
    the admission. A spinning kernel queued first must still be running when it returns.

    The engine is warmed in this thread first, as the scheduler's thread is: a thread's first start waited
    and later ones did not (run 83, `session_start_waits.py`; likely the per-thread cuBLAS handle that torch
    makes on a thread's first product)."""
    request = SynthesisRequest("A newcomer.", "A calm voice.", seed=3, max_frames=4)
    engine.release(engine.start_session(request))
    torch.cuda.synchronize()
    torch.cuda._sleep(1_000_000_000)  # about half a second at the H200's clocks
    session = engine.start_session(request)
    try:
        assert not torch.cuda.current_stream().query(), "start_session waited for the work queued before it"
    finally:
        torch.cuda.synchronize()
        engine.release(session)


@pytest.fixture(scope="module")
def eos_prone_engine(tmp_path_factory: pytest.TempPathFactory) -> VoiceDesignEngine:
    """A tiny engine whose EOS logit is scaled up 1000 times: once the ban lifts, each frame is EOS or not
    by the sign of that logit, so a few seeds find a request whose frame k is EOS."""
    snapshot: Path = tmp_path_factory.mktemp("tiny-eos")
    write_random_snapshot(snapshot, "tiny", 0)
    weights = load_file(snapshot / "model.safetensors")
    eos = load_config(snapshot).talker.codec_eos_token_id
    weights[EOS_TENSOR][eos] *= 1000
    save_file(weights, snapshot / "model.safetensors")
    return VoiceDesignEngine.load(snapshot, device="cuda", dtype=torch.bfloat16, max_sessions=1)


def test_a_last_frame_that_is_eos_ends_synthesize_with_the_frames_before_it(
    eos_prone_engine: VoiceDesignEngine,
) -> None:
    """`synthesize` decodes its last packet before the last frame is collected, from that frame's codes on
    the GPU. When that frame is EOS, the packet is the frames before it: the same packets as the scheduler's
    (which decodes after collecting), the last one's samples within one PCM16 step of its decode (a decode
    of one more frame, cut: the decoder is causal, but the packet sizes' graphs round apart)."""
    engine = eos_prone_engine
    stopped = None
    for seed in range(32):
        probe = SynthesisRequest("An early stop.", "A calm voice.", seed=seed, max_frames=12)
        frames = sum(p.frame_count for p in engine.synthesize(probe))
        if frames < 12:
            stopped = (seed, frames)  # frame `frames` was EOS
            break
    assert stopped is not None, "no seed of 32 drew EOS"
    seed, frames = stopped
    request = SynthesisRequest("An early stop.", "A calm voice.", seed=seed, max_frames=frames + 1)
    got = list(engine.synthesize(request))
    scheduler = Scheduler(engine, capacity=1, queue_packets=64)
    try:
        arrived = threading.Event()
        events = events_of(scheduler.submit(request, arrived.set), arrived)
    finally:
        scheduler.close(30)
    expected = [event for event in events if isinstance(event, AudioPacket)]
    assert [p.frame_count for p in got] == [p.frame_count for p in expected]
    assert sum(p.frame_count for p in got) == frames
    assert got[-1].is_final and got[-1].finish_reason == "stop"
    assert got[:-1] == expected[:-1]
    last, reference = (
        torch.frombuffer(bytearray(p.pcm), dtype=torch.int16).int() for p in (got[-1], expected[-1])
    )
    assert (last - reference).abs().max().item() <= 1

"""Regression tests for bugs found in the review of the engine's hot path (runtime/, prompt, tokenizer)."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
import torch
from torch import Tensor

from qwen3_tts_native.engine.config import VoiceDesignConfig
from qwen3_tts_native.engine.errors import InvalidRequestError
from qwen3_tts_native.engine.model.predictor import CodePredictor
from qwen3_tts_native.engine.model.talker import Talker
from qwen3_tts_native.engine.prompt import PromptPlan
from qwen3_tts_native.engine.runtime.engine import VoiceDesignEngine
from qwen3_tts_native.engine.runtime.request import (
    FrameResult,
    PredictorSampling,
    SynthesisRequest,
    TalkerSampling,
)
from qwen3_tts_native.engine.runtime.scheduler import AudioPacket, Event, Failed, RequestHandle, Scheduler

ROLE = [151644, 77091, 198]


PLAN = PromptPlan(
    [151644, 872, 198, 32, 8205, 13, 151645, 198], ROLE, [9707, 11, 1879], None, "non_streaming"
)


@pytest.fixture(scope="module")
def engine(tiny_voice_design_config: VoiceDesignConfig, tiny_tensors: dict[str, Tensor]) -> VoiceDesignEngine:
    torch.set_num_threads(1)
    config = tiny_voice_design_config
    talker = Talker.from_tensors(config, tiny_tensors)
    predictor = CodePredictor.from_tensors(config, tiny_tensors)
    return VoiceDesignEngine(config, talker, predictor, max_sessions=2, max_context=64)


def test_a_failed_open_does_not_leak_its_cache_slot(engine: VoiceDesignEngine) -> None:
    """A top_k beyond int64 used to raise a ValueError after the slot was taken: the slot was lost for good.
    A top_k above the vocabulary keeps every token (HF clamps it to the vocabulary), so it is honoured."""
    free = engine.free_slots
    huge = SynthesisRequest("x", "", seed=3, max_frames=4, talker_sampling=TalkerSampling(top_k=2**63))
    off = SynthesisRequest("x", "", seed=3, max_frames=4, talker_sampling=TalkerSampling(top_k=0))
    huge_codes = engine.run_to_end(engine.open_session(huge, PLAN))
    assert engine.free_slots == free
    assert torch.equal(huge_codes, engine.run_to_end(engine.open_session(off, PLAN)))
    predictor_huge = SynthesisRequest(
        "x", "", seed=3, max_frames=4, predictor_sampling=PredictorSampling(top_k=2**70)
    )
    engine.run_to_end(engine.open_session(predictor_huge, PLAN))
    assert engine.free_slots == free


def test_an_open_that_fails_after_taking_a_slot_gives_it_back(
    engine: VoiceDesignEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    free = engine.free_slots

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("out of memory")

    monkeypatch.setattr(torch, "Generator", broken)
    with pytest.raises(RuntimeError):
        engine.open_session(SynthesisRequest("x", "", max_frames=4), PLAN)
    assert engine.free_slots == free


@pytest.mark.parametrize(
    "request_",
    [
        SynthesisRequest("x", "", max_frames=8, talker_sampling=TalkerSampling(temperature=1e-50)),
        SynthesisRequest("x", "", max_frames=8, talker_sampling=TalkerSampling(temperature=1e300)),
        SynthesisRequest("x", "", max_frames=8, talker_sampling=TalkerSampling(repetition_penalty=1e-50)),
        SynthesisRequest("x", "", max_frames=8, talker_sampling=TalkerSampling(repetition_penalty=1e300)),
        SynthesisRequest("x", "", max_frames=8, predictor_sampling=PredictorSampling(temperature=1e-50)),
        # float32-representable, but logits / 1.2e-38 still overflow to inf (cb0 was 3071 every frame)
        SynthesisRequest("x", "", max_frames=8, talker_sampling=TalkerSampling(temperature=1.2e-38)),
        SynthesisRequest("x", "", max_frames=8, talker_sampling=TalkerSampling(repetition_penalty=3e38)),
    ],
)
def test_sampling_scales_that_overflow_the_float32_scores_are_rejected(
    engine: VoiceDesignEngine, request_: SynthesisRequest
) -> None:
    """validate_request checked them as Python floats, but the sampler runs in float32: 1e-50 became 0 and
    1e300 inf, the scores went NaN, and the talker emitted the suppressed control id 3071 as a frame's
    cb0 (which the codec cannot decode)."""
    free = engine.free_slots
    with pytest.raises(InvalidRequestError):
        engine.open_session(request_, PLAN)
    assert engine.free_slots == free


def test_valid_extreme_sampling_numbers_never_emit_a_suppressed_id(engine: VoiceDesignEngine) -> None:
    extremes = (
        TalkerSampling(temperature=1e-6),
        TalkerSampling(temperature=1e6),
        TalkerSampling(repetition_penalty=1e-6),
        TalkerSampling(repetition_penalty=1e6),
    )
    for sampling in extremes:
        request = SynthesisRequest("x", "", seed=5, max_frames=8, talker_sampling=sampling)
        codes = engine.run_to_end(engine.open_session(request, PLAN))
        assert int(codes.max()) < 2048, sampling


class _BrokenStepEngine:
    """Forwards to a real engine, but every step launch raises."""

    def __init__(self, engine: VoiceDesignEngine) -> None:
        self.engine = engine

    def start_session(self, request: SynthesisRequest) -> Any:
        return self.engine.open_session(request, PLAN)

    def prefill_many(self, sessions: list[Any]) -> list[FrameResult]:
        return self.engine.prefill_many(sessions)

    def can_launch(self, session: Any) -> bool:
        return self.engine.can_launch(session)

    def launch_step(self, sessions: list[Any]) -> Any:
        raise RuntimeError("kernel exploded at frame 1")

    def collect_step(self, pending: Any) -> list[FrameResult | None]:
        raise AssertionError("nothing was launched")

    def launch_decode(self, sessions: list[Any], frames: list[Tensor]) -> list[Tensor]:
        return frames

    def collect_decode(self, pending: list[Tensor]) -> list[bytes]:
        return [b"\0\0" * 1920 * f.shape[0] for f in pending]

    def release(self, session: Any) -> None:
        self.engine.release(session)


def _drain(handle: RequestHandle, timeout: float = 60) -> list[Event]:
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


def test_engine_failures_in_the_worker_are_logged_with_their_traceback(
    engine: VoiceDesignEngine, caplog: pytest.LogCaptureFixture
) -> None:
    """The worker turned every engine exception into Failed("internal_error", "<ExceptionClass>") and
    dropped the exception: the message and traceback reached no log, so a failing engine was undiagnosable."""
    scheduler = Scheduler(_BrokenStepEngine(engine), capacity=1)
    try:
        with caplog.at_level(logging.ERROR):
            handle = scheduler.submit(SynthesisRequest("x", "", max_frames=8), lambda: None)
            events = _drain(handle)
    finally:
        scheduler.close(10)
    assert isinstance(events[-1], Failed) and events[-1].code == "internal_error"
    logged = [r.exc_info for r in caplog.records if r.exc_info is not None]
    assert logged, "the engine exception was swallowed without a log record"
    assert "kernel exploded at frame 1" in str(logged[0][1])
    assert engine.free_slots == engine.max_sessions

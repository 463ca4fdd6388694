"""The frame loop one frame ahead (`launch_step` / `collect_step`) against the synchronous `step` loop.

Every loop that keeps a frame in flight must give each session exactly the codes (and PCM bytes) of the
step-by-step loop: seeded sampling draws its uniform blocks at launch, in the same order; a frame launched
for a session that turns out to have ended (EOS) or that was released is computed and dropped, and the
next session on its slot starts clean.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_codec_streaming import random_tensors as decoder_tensors
from test_engine_loop import PLANS, REQUESTS, direct_graph_backend
from torch import Tensor

from qwen3_tts_native.engine.config import VoiceDesignConfig
from qwen3_tts_native.engine.errors import EngineError
from qwen3_tts_native.engine.model.codec import SpeechDecoder
from qwen3_tts_native.engine.model.predictor import CodePredictor
from qwen3_tts_native.engine.model.talker import Talker
from qwen3_tts_native.engine.prompt import PromptPlan
from qwen3_tts_native.engine.runtime import graphs
from qwen3_tts_native.engine.runtime.engine import PendingStep, VoiceDesignEngine
from qwen3_tts_native.engine.runtime.modes import EXACT
from qwen3_tts_native.engine.runtime.request import FinishReason, SynthesisRequest
from qwen3_tts_native.engine.runtime.session import Session

PACKETS = (1, 4)  # synthesize's default first and later packet sizes


@pytest.fixture(autouse=True)
def _one_thread() -> Any:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(params=["length", "stop"])
def weights(request: pytest.FixtureRequest) -> tuple[str, dict[str, Tensor]]:
    """Weights whose sessions end by `max_frames` only ("length"), or by EOS too ("stop": EOS wins about
    every other frame once allowed); the name is the finish reason they give."""
    name = "tiny_tensors" if request.param == "length" else "tiny_eos_tensors"
    return request.param, request.getfixturevalue(name)


def make_engine(
    config: VoiceDesignConfig,
    tensors: dict[str, Tensor],
    *,
    slots: int = 4,
    context: int = 64,
    decoder: SpeechDecoder | None = None,
) -> VoiceDesignEngine:
    talker, predictor = Talker.from_tensors(config, tensors), CodePredictor.from_tensors(config, tensors)
    return VoiceDesignEngine(
        config, talker, predictor, decoder=decoder, max_sessions=slots, max_context=context
    )


def stepped(engine: VoiceDesignEngine, request: SynthesisRequest, plan: PromptPlan) -> tuple[Tensor, str]:
    """The synchronous reference: prefill, then one `step` at a time until the session ends; its frames
    [T, 16] and finish reason."""
    session = engine.open_session(request, plan)
    try:
        frames, result = [], engine.prefill(session)
        while True:
            if result.codes is not None:
                frames.append(result.codes)
            if result.finish_reason is not None:
                return torch.stack(frames), result.finish_reason
            result = engine.step([session])[0]
    finally:
        engine.release(session)


def test_solo_loops_equal_the_step_loop(
    tiny_voice_design_config: VoiceDesignConfig,
    weights: tuple[str, dict[str, Tensor]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`run_to_end` and `synthesize` keep a frame in flight: codes, packets and PCM bytes are the step
    loop's, for greedy and seeded-sampled requests ending by EOS or by `max_frames`."""
    config = tiny_voice_design_config
    decoder = SpeechDecoder.from_tensors(config.speech_decoder, decoder_tensors(config.speech_decoder, 3))
    ending, tensors = weights
    engine = make_engine(config, tensors, decoder=decoder)
    reasons = set()
    for request, plan in zip(REQUESTS, PLANS, strict=True):
        codes, reason = stepped(engine, request, plan)
        reasons.add(reason)
        assert torch.equal(engine.run_to_end(engine.open_session(request, plan)), codes)

        monkeypatch.setattr(engine, "start_session", lambda r, plan=plan: engine.open_session(r, plan))
        packets = list(engine.synthesize(request, *PACKETS))
        sizes = [PACKETS[0]]
        while sum(sizes) < codes.shape[0]:
            sizes.append(min(PACKETS[1], codes.shape[0] - sum(sizes)))
        assert [p.frame_count for p in packets] == sizes
        assert [p.first_frame for p in packets] == [sum(sizes[:i]) for i in range(len(sizes))]
        assert [p.sequence for p in packets] == list(range(len(sizes)))
        assert [(p.is_final, p.finish_reason) for p in packets] == [(False, None)] * (len(sizes) - 1) + [
            (True, reason)
        ]
        reference = engine.open_session(request, plan)  # a codec stream only: never prefilled
        for packet in packets:
            frames = codes[packet.first_frame : packet.first_frame + packet.frame_count]
            assert packet.pcm == engine.decode_packet(reference, frames), packet.sequence
        engine.release(reference)
    assert ending in reasons and reasons <= {"length", ending}
    assert engine.free_slots == 4


def test_frames_past_a_uniform_block_equal_the_step_loop(
    tiny_voice_design_config: VoiceDesignConfig, tiny_tensors: dict[str, Tensor]
) -> None:
    """Uniform blocks are drawn when a frame starting one is launched: past frame 64 the sampled codes are
    still the step loop's."""
    engine = make_engine(tiny_voice_design_config, tiny_tensors, context=160)
    request = SynthesisRequest("x", "", seed=11, max_frames=100)
    codes, reason = stepped(engine, request, PLANS[1])
    assert codes.shape[0] == 100 and reason == "length"
    assert torch.equal(engine.run_to_end(engine.open_session(request, PLANS[1])), codes)


def run_one_ahead(engine: VoiceDesignEngine, runs: list[int]) -> tuple[list[Tensor], int]:
    """Runs of the requests `runs` (indices into REQUESTS) through one batch that keeps one step in
    flight, a new session admitted (prefilled) whenever a slot is free, finished sessions released as soon
    as their last result is in, with a frame for them possibly still in flight; each run's frames, and
    how many launched frames were dropped."""
    frames: list[list[Tensor]] = [[] for _ in runs]
    queue, active = list(range(len(runs))), list[tuple[int, Session]]()
    ended: set[int] = set()
    pending: tuple[list[int], PendingStep] | None = None
    dropped = 0
    while queue or active:
        launch = [(run, s) for run, s in active if engine.can_launch(s)]
        following = ([run for run, _ in launch], engine.launch_step([s for _, s in launch]))
        if pending is not None:
            for run, result in zip(pending[0], engine.collect_step(pending[1]), strict=True):
                if result is None:
                    assert run in ended, "only a frame launched after a session's end is dropped"
                    dropped += 1
                    continue
                assert run not in ended, "a result after the final one"
                if result.codes is not None:
                    frames[run].append(result.codes)
                if result.finish_reason is not None:
                    ended.add(run)
        pending = following
        for _, session in active:
            if session.finished:
                engine.release(session)
        active = [(run, s) for run, s in active if not s.finished]
        joining = []
        while queue and engine.free_slots:
            run = queue.pop(0)
            joining.append((run, engine.open_session(REQUESTS[runs[run]], PLANS[runs[run]])))
        for (run, _), result in zip(joining, engine.prefill_many([s for _, s in joining]), strict=True):
            assert result.codes is not None
            frames[run].append(result.codes)
            if result.finish_reason is not None:
                ended.add(run)
        active += joining
    if pending is not None:
        assert all(r is None for r in engine.collect_step(pending[1]))
    assert ended == set(range(len(runs)))
    return [torch.stack(f) for f in frames], dropped


@pytest.mark.parametrize("backend", ["eager", "graph"])
def test_a_batch_one_step_ahead_equals_solo_runs(
    tiny_voice_design_config: VoiceDesignConfig, weights: tuple[str, dict[str, Tensor]], backend: str
) -> None:
    """Sessions joining and leaving a batch that keeps a step in flight, on two slots (a leaving session's
    slot goes to the next one while a frame for it may be in flight), on the eager frame and on the graph
    backend's buffers (whose output the next launch overwrites): each session gets exactly its solo codes,
    and nothing after its final result."""
    ending, tensors = weights
    engine = make_engine(tiny_voice_design_config, tensors, slots=2)
    solo = make_engine(tiny_voice_design_config, tensors)
    if backend == "graph":
        graphs.install(engine, direct_graph_backend(engine, (1, 2)))
        solo.frame_backend = graphs.KernelFrameBackend(solo.talker, solo.predictor, EXACT)
    runs = [0, 1, 2, 3, 2, 0]
    frames, dropped = run_one_ahead(engine, runs)
    expected = {i: stepped(solo, REQUESTS[i], PLANS[i])[0] for i in set(runs)}
    for run, index in enumerate(runs):
        assert torch.equal(frames[run], expected[index]), f"run {run} (request {index})"
    assert (dropped > 0) == (ending == "stop")  # only a frame launched after EOS is dropped
    assert engine.free_slots == 2


def test_launch_and_collect_bookkeeping(
    tiny_voice_design_config: VoiceDesignConfig, tiny_eos_tensors: dict[str, Tensor]
) -> None:
    """A frame in flight counts against `max_frames`; a frame launched after EOS, or for a released
    session, is collected as None; steps are collected in launch order, once."""
    engine = make_engine(tiny_voice_design_config, tiny_eos_tensors)

    three = engine.open_session(SynthesisRequest("x", "", max_frames=3), PLANS[0])
    engine.prefill(three)
    first, last = engine.launch_step([three]), engine.launch_step([three])
    assert three.frames_launched == 3 and three.frames_emitted == 1 and not engine.can_launch(three)
    with pytest.raises(EngineError):
        engine.launch_step([three])
    with pytest.raises(EngineError):
        engine.collect_step(last)  # frame 2 before frame 1
    [one] = engine.collect_step(first)
    assert one is not None and one.codes is not None and one.finish_reason is None
    [two] = engine.collect_step(last)
    assert two is not None and two.codes is not None and two.finish_reason == "length"
    engine.release(three)

    for seed in range(3):
        session = engine.open_session(SynthesisRequest("x", "", seed=seed, max_frames=40), PLANS[seed])
        engine.prefill(session)
        pending = engine.launch_step([session])
        reasons: list[FinishReason | None] = []
        while not session.finished:
            following = engine.launch_step([session])
            [result] = engine.collect_step(pending)
            assert result is not None
            reasons.append(result.finish_reason)
            pending = following
        assert reasons[-1] == "stop" and session.frames_launched == session.frames_emitted + 1
        assert not engine.can_launch(session)
        with pytest.raises(EngineError):
            engine.launch_step([session])
        assert engine.collect_step(pending) == [None]  # the frame launched after EOS
        engine.release(session)

    cancelled = engine.open_session(SynthesisRequest("x", "", max_frames=8), PLANS[2])
    engine.prefill(cancelled)
    pending = engine.launch_step([cancelled])
    engine.release(cancelled)
    assert engine.collect_step(pending) == [None]
    assert engine.step([]) == [] and engine.collect_step(engine.launch_step([])) == []
    assert engine.free_slots == 4


@pytest.mark.parametrize("end", ["eos", "release"])
def test_a_slot_reused_under_a_frame_in_flight_starts_clean(
    tiny_voice_design_config: VoiceDesignConfig, tiny_eos_tensors: dict[str, Tensor], end: str
) -> None:
    """One slot: a session ends (EOS, or released mid-stream) with a frame for it in flight, and the next
    session opens and prefills on the slot before that frame is collected: the frame is dropped and the
    newcomer's codes are its solo run's (its cb0 history, last codes and uniforms are its own)."""
    engine = make_engine(tiny_voice_design_config, tiny_eos_tensors, slots=1)
    first = engine.open_session(REQUESTS[1], PLANS[1])
    engine.prefill(first)
    pending = engine.launch_step([first])
    if end == "eos":
        while not first.finished:
            following = engine.launch_step([first])
            engine.collect_step(pending)
            pending = following
    engine.release(first)
    second = engine.open_session(REQUESTS[3], PLANS[3])
    assert second.slot == first.slot
    frames, result = [], engine.prefill(second)
    assert engine.collect_step(pending) == [None]
    while True:
        if result.codes is not None:
            frames.append(result.codes)
        if result.finish_reason is not None:
            break
        result = engine.step([second])[0]
    engine.release(second)
    solo = make_engine(tiny_voice_design_config, tiny_eos_tensors, slots=1)
    assert torch.equal(torch.stack(frames), stepped(solo, REQUESTS[3], PLANS[3])[0])


def test_decodes_launched_ahead_give_the_bytes_of_decoding_one_by_one(
    tiny_voice_design_config: VoiceDesignConfig, tiny_tensors: dict[str, Tensor]
) -> None:
    """Several `launch_decode` calls in flight before any is collected (packets of two sessions, each
    continuing its own codec stream) give the PCM of decoding the packets one at a time, in order."""
    config = tiny_voice_design_config
    decoder = SpeechDecoder.from_tensors(config.speech_decoder, decoder_tensors(config.speech_decoder, 3))
    engine = make_engine(config, tiny_tensors, decoder=decoder)
    codes = [stepped(engine, REQUESTS[i], PLANS[i])[0][:9] for i in (0, 1)]
    cuts = [(0, 1), (1, 5), (5, 9)]
    sessions = [engine.open_session(REQUESTS[i], PLANS[i]) for i in (0, 1)]
    launched = [engine.launch_decode(sessions, [c[a:b] for c in codes]) for a, b in cuts]
    got = [engine.collect_decode(pending) for pending in launched]
    for session in sessions:
        engine.release(session)
    references = [engine.open_session(REQUESTS[i], PLANS[i]) for i in (0, 1)]
    expected = [
        [engine.decode_packet(s, c[a:b]) for s, c in zip(references, codes, strict=True)] for a, b in cuts
    ]
    assert got == expected
    assert all(len(pcm) == 2 * 1920 * (b - a) for (a, b), row in zip(cuts, got, strict=True) for pcm in row)


def test_bench_lockstep_accounts_every_frame_with_decodes_in_flight(
    tiny_voice_design_config: VoiceDesignConfig,
    tiny_eos_tensors: dict[str, Tensor],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`qwen3-tts bench`'s concurrency level on CPU, decodes collected once done: every frame the sessions
    generate (as their solo runs do; some end by EOS) is counted as audio, once."""
    from qwen3_tts_native.commands.bench import FRAME_SECONDS, make_request, run_concurrent

    config = tiny_voice_design_config
    decoder = SpeechDecoder.from_tensors(config.speech_decoder, decoder_tensors(config.speech_decoder, 3))
    engine = make_engine(config, tiny_eos_tensors, decoder=decoder)
    monkeypatch.setattr(engine, "start_session", lambda request: engine.open_session(request, PLANS[0]))
    streams, frames = 3, 7
    expected = sum(
        stepped(engine, make_request(frames, seed=1000 + i), PLANS[0])[0].shape[0] for i in range(streams)
    )
    result = run_concurrent(engine, streams, frames, timeout_s=600)
    assert not result["truncated"]
    assert result["audio_s"] == pytest.approx(expected * FRAME_SECONDS)
    assert result["per_stream_rtf"]["n"] == streams
    assert engine.free_slots == 4


def test_a_concurrency_level_reports_its_median_run() -> None:
    """Three timed runs of a level: the figures are those of the run of median aggregate RTF, with every
    run's aggregate and worst-stream RTF kept beside them (a stalled run moves no figure)."""
    from qwen3_tts_native.commands.bench import median_run

    runs = [
        {"aggregate_rtf": 0.0029, "worst_stream_rtf": 0.18, "wall_s": 0.47},
        {"aggregate_rtf": 0.0024, "worst_stream_rtf": 0.15, "wall_s": 0.39},
        {"aggregate_rtf": 0.0025, "worst_stream_rtf": 0.16, "wall_s": 0.40},
    ]
    level = median_run(runs)
    assert level["aggregate_rtf"] == 0.0025 and level["wall_s"] == 0.40
    assert [run["aggregate_rtf"] for run in level["runs"]] == [0.0029, 0.0024, 0.0025]
    assert median_run(runs[:2])["aggregate_rtf"] == 0.0024

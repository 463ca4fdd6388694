"""The frame loop on the tiny random model: batch invariance, frame accounting, seeds, packets."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from torch import Tensor

from qwen3_tts_native.engine.config import VoiceDesignConfig
from qwen3_tts_native.engine.errors import EngineError, InvalidRequestError
from qwen3_tts_native.engine.model.predictor import CodePredictor
from qwen3_tts_native.engine.model.talker import FIXED_PROMPT_KEYS, Talker
from qwen3_tts_native.engine.prompt import PromptPlan
from qwen3_tts_native.engine.runtime import graphs
from qwen3_tts_native.engine.runtime.engine import VoiceDesignEngine
from qwen3_tts_native.engine.runtime.modes import EXACT
from qwen3_tts_native.engine.runtime.request import (
    PredictorSampling,
    SynthesisRequest,
    TalkerSampling,
)
from qwen3_tts_native.engine.runtime.sampling import SamplingRows
from qwen3_tts_native.engine.runtime.session import Session
from qwen3_tts_native.engine.runtime.step import StepIndex

ROLE = [151644, 77091, 198]


PLANS = [
    PromptPlan([151644, 872, 198, 32, 8205, 13, 151645, 198], ROLE, [9707, 11, 1879], None, "non_streaming"),
    PromptPlan([], ROLE, [40, 1079, 264, 6366, 1273, 315, 279, 1849, 13], 2050, "streaming"),
    PromptPlan([151644, 872, 198, 21388, 151645, 198], ROLE, [104198, 101909], 2055, "streaming"),
    PromptPlan(
        [151644, 872, 198, 50, 151645, 198], ROLE, [22560, 11, 3162, 21861, 13], 2053, "non_streaming"
    ),
]
REQUESTS = [
    SynthesisRequest("a", "", seed=1, max_frames=14),
    SynthesisRequest(
        "b",
        "",
        seed=2**53 - 1,
        max_frames=20,
        talker_sampling=TalkerSampling(temperature=1.3, top_k=0, top_p=0.9),
        predictor_sampling=PredictorSampling(temperature=0.7, top_k=5),
    ),
    SynthesisRequest(
        "c",
        "",
        seed=7,
        max_frames=9,
        talker_sampling=TalkerSampling(greedy=True),
        predictor_sampling=PredictorSampling(greedy=True),
    ),
    SynthesisRequest("d", "", seed=42, max_frames=16, predictor_sampling=PredictorSampling(top_p=0.8)),
]
JOIN_AT = [0, 3, 4, 9]  # the step at which each session is admitted (prefilled)


class SilentDecoder:
    """Stands in for the speech decoder: 1920 zero samples per frame."""

    def new_stream_state(self) -> list[int]:
        return [0]

    def decode_stream(self, codes: Tensor, state: list[int]) -> Tensor:
        state[0] += codes.shape[0]
        return torch.zeros(codes.shape[0] * 1920)


def make_engine(
    config: VoiceDesignConfig, tensors: dict[str, Tensor], decoder: Any = None
) -> VoiceDesignEngine:
    talker, predictor = Talker.from_tensors(config, tensors), CodePredictor.from_tensors(config, tensors)
    return VoiceDesignEngine(config, talker, predictor, decoder=decoder, max_sessions=4, max_context=64)


def forced_predictor_logits(
    predictor: CodePredictor, hidden: Tensor, cb0_embed: Tensor, codes: Tensor
) -> Tensor:
    """Teacher-forced predictor logits [B, 15, vocab] for given codes [B, 15]."""
    recorded: list[Tensor] = []

    def choose(logits: Tensor, group: int) -> Tensor:
        recorded.append(logits)
        return codes[:, group]

    predictor.generate(hidden, cb0_embed, choose)
    return torch.stack(recorded, dim=1)


@pytest.fixture(scope="module")
def engine(tiny_voice_design_config: VoiceDesignConfig, tiny_tensors: dict[str, Tensor]) -> VoiceDesignEngine:
    torch.set_num_threads(1)
    return make_engine(tiny_voice_design_config, tiny_tensors)


def test_modules_are_batch_invariant(engine: VoiceDesignEngine) -> None:
    """Rows of one talker/predictor call are bit-identical to the same rows computed alone."""
    talker, predictor = engine.talker, engine.predictor
    generator = torch.Generator().manual_seed(0)
    embeds = torch.randn(4, 1, talker.hidden_size, generator=generator)
    positions = torch.tensor([[3], [17], [0], [40]])
    cache = talker.new_cache(4, 64)
    cache.k.normal_(generator=generator)
    cache.v.normal_(generator=generator)
    alone_cache = talker.new_cache(4, 64)
    alone_cache.k.copy_(cache.k)
    alone_cache.v.copy_(cache.v)
    slots = torch.tensor([2, 0, 3, 1])
    batched = talker(embeds, positions, slots, cache)
    for row in range(4):
        alone = talker(embeds[row : row + 1], positions[row : row + 1], slots[row : row + 1], alone_cache)
        assert torch.equal(alone, batched[row : row + 1])
    assert torch.equal(alone_cache.k, cache.k) and torch.equal(alone_cache.v, cache.v)

    codes = torch.randint(0, 2048, (4, 15), generator=generator)
    cb0_embed = talker.codec_embed(torch.tensor([5, 70, 900, 2047]))
    together = forced_predictor_logits(predictor, batched[:, 0], cb0_embed, codes)
    for row in range(4):
        rows = slice(row, row + 1)
        alone = forced_predictor_logits(predictor, batched[rows, 0], cb0_embed[rows], codes[rows])
        assert torch.equal(alone, together[rows])


def test_sessions_joined_at_different_steps_equal_solo_runs(engine: VoiceDesignEngine) -> None:
    solo = [engine.run_to_end(engine.open_session(r, p)) for r, p in zip(REQUESTS, PLANS, strict=True)]
    assert engine.free_slots == 4
    frames: list[list[Tensor]] = [[] for _ in PLANS]
    active: list[tuple[int, Session]] = []
    clock = 0
    while clock <= JOIN_AT[-1] or active:
        results = engine.step([s for _, s in active])
        for (index, _), result in zip(active, results, strict=True):
            if result.codes is not None:
                frames[index].append(result.codes)
        for index, request in enumerate(REQUESTS):
            if JOIN_AT[index] == clock:
                session = engine.open_session(request, PLANS[index])
                result = engine.prefill(session)
                assert result.codes is not None
                frames[index].append(result.codes)
                active.append((index, session))
        for _, session in active:
            if session.finished:
                engine.release(session)
        active = [(i, s) for i, s in active if not s.finished]
        clock += 1
    for index, expected in enumerate(solo):
        assert expected.shape == (REQUESTS[index].max_frames, 16)
        assert torch.equal(torch.stack(frames[index]), expected), f"session {index}"
    assert engine.free_slots == 4


def test_sessions_prefilled_together_equal_solo_runs(engine: VoiceDesignEngine) -> None:
    """`prefill_many` runs each prompt alone and completes the frames 0 as one batch: on CPU each session's
    codes are still exactly its solo run's, here and in the steps that follow."""
    solo = [engine.run_to_end(engine.open_session(r, p)) for r, p in zip(REQUESTS, PLANS, strict=True)]
    sessions = [engine.open_session(r, p) for r, p in zip(REQUESTS, PLANS, strict=True)]
    frames: list[list[Tensor]] = [[] for _ in sessions]
    results = engine.prefill_many(sessions)
    active = list(range(len(sessions)))
    while active:
        for index, result in zip(active, results, strict=True):
            assert result.codes is not None
            frames[index].append(result.codes)
        active = [i for i in active if not sessions[i].finished]
        results = engine.step([sessions[i] for i in active])
    for session in sessions:
        engine.release(session)
    for index, expected in enumerate(solo):
        assert torch.equal(torch.stack(frames[index]), expected), f"session {index}"
    assert engine.prefill_many([]) == []
    twice = engine.open_session(REQUESTS[0], PLANS[0])
    with pytest.raises(EngineError):
        engine.prefill_many([twice, twice])
    engine.prefill_many([twice])
    with pytest.raises(EngineError):
        engine.prefill_many([twice])
    engine.release(twice)
    assert engine.free_slots == 4


class DirectGraph:
    """Stands in for a captured CUDA graph on CPU: a replay runs the captured function into its output."""

    def __init__(self, run: Any, out: Tensor) -> None:
        self.run, self.out = run, out

    def replay(self) -> None:
        self.out.copy_(self.run())


def direct_graph_backend(engine: VoiceDesignEngine, buckets: tuple[int, ...]) -> graphs.GraphFrameBackend:
    """A GraphFrameBackend whose graphs are direct calls, so its buffers run on CPU: rows loaded into a
    bucket, padded rows, batches cut into chunks, the reused output buffer."""
    backend = graphs.GraphFrameBackend.__new__(graphs.GraphFrameBackend)
    backend.mode, backend.buckets = EXACT, buckets
    backend.frame = graphs.KernelFrame(engine.talker, engine.predictor, EXACT)
    backend._decode, backend._complete, backend._prompt, backend._cache_ptr = {}, {}, {}, None
    backend._packed, backend._state = None, None

    def capture(run: Any) -> tuple[Any, Tensor]:
        out = run()
        return DirectGraph(run, out), out

    backend._capture = capture  # type: ignore[method-assign]
    return backend


@pytest.mark.parametrize(
    "buckets,prompt_buckets,packed_buckets",
    [
        ((1, 2, 4), graphs.PROMPT_BUCKETS, graphs.PACKED_PROMPT_BUCKETS),
        ((1, 2, 4), (24,), graphs.PACKED_PROMPT_BUCKETS),
        ((1, 2, 4), (16,), (32, 48)),
        ((3,), (16,), graphs.PACKED_PROMPT_BUCKETS),
    ],
)
def test_graph_backend_buffers_replay_the_kernel_frame_on_cpu(
    tiny_voice_design_config: VoiceDesignConfig,
    tiny_tensors: dict[str, Tensor],
    monkeypatch: pytest.MonkeyPatch,
    buckets: tuple[int, ...],
    prompt_buckets: tuple[int, ...],
    packed_buckets: tuple[int, ...],
) -> None:
    """The graph backend's bookkeeping around its replays, on CPU: sessions prefilled together and joining
    and leaving a running batch (padded rows, stale padding inputs, buckets of 3 cut into chunks, sampling
    rows reused or replaced; prompt passes replayed in their bucket; above the largest one (the first two
    prompts, 20 and 9 tokens, together) replayed from a packed graph where the padding fits the 64-position
    cache (packed buckets of 32 and 48), else run eagerly and unpadded) give each session exactly its solo
    codes on the eager kernel frame."""
    monkeypatch.setattr(graphs, "PROMPT_BUCKETS", prompt_buckets)
    monkeypatch.setattr(graphs, "PACKED_PROMPT_BUCKETS", packed_buckets)
    eager = make_engine(tiny_voice_design_config, tiny_tensors)
    eager.frame_backend = graphs.KernelFrameBackend(eager.talker, eager.predictor, EXACT)
    solo = [eager.run_to_end(eager.open_session(r, p)) for r, p in zip(REQUESTS, PLANS, strict=True)]
    engine = make_engine(tiny_voice_design_config, tiny_tensors)
    backend = direct_graph_backend(engine, buckets)
    graphs.install(engine, backend)
    frames: list[list[Tensor]] = [[] for _ in PLANS]
    active: list[tuple[int, Session]] = []
    for clock in range(40):
        results = engine.step([s for _, s in active])
        for (index, _), result in zip(active, results, strict=True):
            if result.codes is not None:
                frames[index].append(result.codes)
        joining = [
            (i, engine.open_session(REQUESTS[i], PLANS[i])) for i in range(4) if (0, 0, 4, 9)[i] == clock
        ]
        for (index, _), result in zip(joining, engine.prefill_many([s for _, s in joining]), strict=True):
            assert result.codes is not None
            frames[index].append(result.codes)
        active += joining
        for _, session in active:
            if session.finished:
                engine.release(session)
        active = [(i, s) for i, s in active if not s.finished]
    for index, expected in enumerate(solo):
        assert torch.equal(torch.stack(frames[index]), expected), f"session {index}"
    assert engine.free_slots == 4 and not active
    assert backend._prompt and set(backend._prompt) <= set(prompt_buckets)  # (16,): longer ones run eagerly
    packed = set() if backend._packed is None else {rows for rows, _ in backend._packed.graphs}
    assert packed == ({32} if packed_buckets == (32, 48) else set())


def test_padded_graph_rows_run_on_the_scratch_slot() -> None:
    """Rows a smaller batch leaves in a bucket go back to the scratch slot at position 0, so a padded row
    never reads or writes a session's slot (its other inputs may stay stale: its outputs are dropped)."""
    one = SamplingRows.single(greedy=True, temperature=1.0, top_k=0, top_p=1.0)
    static = graphs._DecodeStatic.allocate(4, one, torch.zeros(8), scratch=9)
    four = SamplingRows.cat([one] * 4)
    text = [torch.full((8,), float(i)) for i in range(4)]
    static.load(
        StepIndex.host_table([5, 6, 7, 8], [0, 1, 2, 3], [1, 1, 1, 1], [0, 64, 128, 192]), text, (four, four)
    )
    index = StepIndex(static.index)
    assert index.slots.tolist() == [0, 1, 2, 3] and index.positions.tolist() == [5, 6, 7, 8]
    assert index.uniform_rows.tolist() == [0, 64, 128, 192] and static.text[:, 0].tolist() == [0, 1, 2, 3]
    assert index.lengths.tolist() == [6, 7, 8, 9]
    two = SamplingRows.cat([one] * 2)
    static.load(StepIndex.host_table([1, 2], [3, 0], [2, 2], [193, 1]), text[2:], (two, two))
    assert index.slots.tolist() == [3, 0, 9, 9] and index.positions.tolist() == [1, 2, 0, 0]
    assert index.uniform_rows.tolist() == [193, 1, 0, 0] and index.frames_generated.tolist() == [2, 2, 0, 0]
    assert index.lengths.tolist() == [2, 3, 1, 1]


def test_a_padded_decode_row_records_only_into_the_scratch_slot(
    tiny_voice_design_config: VoiceDesignConfig, tiny_tensors: dict[str, Tensor]
) -> None:
    """One session in a bucket of two: its slot gets its frame's codes and cb0, the padding row records into
    the scratch slot, and no other slot's last codes or history move (the graph's in-replay records)."""
    engine = make_engine(tiny_voice_design_config, tiny_tensors)
    graphs.install(engine, direct_graph_backend(engine, (2,)))
    state, scratch = engine.slot_state, engine.cache.k.shape[1] - 1
    assert state.last_codes.shape[0] == scratch + 1  # grown with the KV pool
    neighbour = engine.open_session(REQUESTS[1], PLANS[1])
    engine.prefill(neighbour)
    session = engine.open_session(REQUESTS[0], PLANS[0])
    engine.prefill(session)
    codes, history = state.last_codes.clone(), state.cb0_history.clone()
    state.cb0_history[scratch].zero_()
    result = engine.step([session])[0]
    assert result.codes is not None
    assert torch.equal(state.last_codes[session.slot], result.codes)
    assert bool(state.cb0_history[session.slot, int(result.codes[0])])
    assert bool(state.cb0_history[scratch].any())
    untouched = [s for s in range(scratch) if s != session.slot]
    assert torch.equal(state.last_codes[untouched], codes[untouched])
    assert torch.equal(state.cb0_history[untouched], history[untouched])
    engine.release(session)
    engine.release(neighbour)


def test_max_frames_ends_with_length(engine: VoiceDesignEngine) -> None:
    session = engine.open_session(SynthesisRequest("x", "", max_frames=3), PLANS[0])
    results = [engine.prefill(session), *(engine.step([session])[0] for _ in range(2))]
    assert [r.finish_reason for r in results] == [None, None, "length"]
    assert all(r.codes is not None and r.codes.shape == (16,) for r in results)
    with pytest.raises(EngineError):
        engine.step([session])
    engine.release(session)
    engine.release(session)  # idempotent
    one = engine.open_session(SynthesisRequest("x", "", max_frames=1), PLANS[1])
    result = engine.prefill(one)
    assert result.codes is not None and result.finish_reason == "length"
    engine.release(one)
    assert engine.free_slots == 4


def test_eos_ends_with_stop_and_no_frame(
    tiny_voice_design_config: VoiceDesignConfig, tiny_eos_tensors: dict[str, Tensor]
) -> None:
    eos_engine = make_engine(tiny_voice_design_config, tiny_eos_tensors)
    for seed in range(3):
        session = eos_engine.open_session(SynthesisRequest("x", "", seed=seed, max_frames=40), PLANS[seed])
        results = [eos_engine.prefill(session)]
        while results[-1].finish_reason is None:
            results.extend(eos_engine.step([session]))
        assert results[-1].codes is None and results[-1].finish_reason == "stop"
        assert all(r.codes is not None and r.finish_reason is None for r in results[:-1])
        assert len(results) - 1 >= 2, "EOS is banned for frames 0 and 1"
        assert session.frames_emitted == len(results) - 1
        assert all(int(r.codes[0]) < 2048 for r in results[:-1] if r.codes is not None)
        eos_engine.release(session)


def test_seeds_reproduce_and_differ(engine: VoiceDesignEngine) -> None:
    request = SynthesisRequest("x", "", seed=123, max_frames=6)
    first = engine.run_to_end(engine.open_session(request, PLANS[3]))
    again = engine.run_to_end(engine.open_session(request, PLANS[3]))
    other = engine.run_to_end(engine.open_session(replace(request, seed=124), PLANS[3]))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_invalid_requests_and_capacity(engine: VoiceDesignEngine) -> None:
    bad = [
        SynthesisRequest("x", "", seed=-1),
        SynthesisRequest("x", "", seed=2**53),
        SynthesisRequest("x", "", max_frames=0),
        SynthesisRequest("x", "", talker_sampling=TalkerSampling(temperature=0.0)),
        SynthesisRequest("x", "", predictor_sampling=PredictorSampling(top_p=0.0)),
        SynthesisRequest("x", "", talker_sampling=TalkerSampling(top_k=-1)),
        SynthesisRequest("x", "", max_frames=64),  # prompt + 63 positions > max_context 64
    ]
    for request in bad:
        with pytest.raises(InvalidRequestError):
            engine.open_session(request, PLANS[0])
    assert engine.free_slots == 4
    sessions = [engine.open_session(SynthesisRequest("x", "", max_frames=2), PLANS[0]) for _ in range(4)]
    with pytest.raises(EngineError):
        engine.open_session(SynthesisRequest("x", "", max_frames=2), PLANS[0])
    for session in sessions:
        engine.release(session)


def test_synthesize_packets(
    tiny_voice_design_config: VoiceDesignConfig,
    tiny_tensors: dict[str, Tensor],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    silent = make_engine(tiny_voice_design_config, tiny_tensors, decoder=SilentDecoder())
    monkeypatch.setattr(silent, "start_session", lambda request: silent.open_session(request, PLANS[2]))
    for max_frames, sizes in ((10, [1, 4, 4, 1]), (9, [1, 4, 4]), (1, [1])):
        packets = list(silent.synthesize(SynthesisRequest("x", "", max_frames=max_frames)))
        assert [p.frame_count for p in packets] == sizes
        assert [p.sequence for p in packets] == list(range(len(sizes)))
        assert [p.first_frame for p in packets] == [sum(sizes[:i]) for i in range(len(sizes))]
        assert [p.is_final for p in packets] == [False] * (len(sizes) - 1) + [True]
        assert [p.finish_reason for p in packets] == [None] * (len(sizes) - 1) + ["length"]
        assert all(len(p.pcm) == p.frame_count * 1920 * 2 for p in packets)
    assert silent.free_slots == 4


def test_synthesize_collects_a_held_packet_after_the_next_frame(
    tiny_voice_design_config: VoiceDesignConfig,
    tiny_tensors: dict[str, Tensor],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A full packet that must wait for the next result is decoded at once but collected only when it goes
    out, after the next frame was launched (the codec overlaps it on CUDA); the first packet, sent under the
    EOS ban, goes out at once but after frame 1 was launched beside its decode, both launched before frame 0
    is collected (its decode reads frame 0's codes where they were made); the final one is collected at
    once. The bytes equal a blocking decode's."""
    silent = make_engine(tiny_voice_design_config, tiny_tensors, decoder=SilentDecoder())
    monkeypatch.setattr(silent, "start_session", lambda request: silent.open_session(request, PLANS[2]))
    calls: list[str] = []

    def logging(name: str) -> Any:
        method = getattr(silent, name)

        def logged(*args: Any) -> Any:
            calls.append(name)
            return method(*args)

        return logged

    for name in ("launch_step", "collect_step", "launch_decode", "collect_decode"):
        monkeypatch.setattr(silent, name, logging(name))
    packets = list(silent.synthesize(SynthesisRequest("x", "", max_frames=14)))
    assert [p.frame_count for p in packets] == [1, 4, 4, 4, 1]
    assert calls[:3] == ["launch_decode", "launch_step", "collect_step"], calls
    calls = [call for call in calls if call != "collect_step"]
    decodes = [i for i, call in enumerate(calls) if call == "launch_decode"]
    assert len(decodes) == 5 and calls.count("collect_decode") == 5
    first, *held, last_held, final = decodes
    for index in (last_held, final):  # the last held packet: no frame is left to launch
        assert calls[index + 1] == "collect_decode", calls
    for index in (first, *held):
        assert calls[index + 1 : index + 3] == ["launch_step", "collect_decode"], calls
    assert all(p.pcm == bytes(len(p.pcm)) for p in packets)


def test_fixed_prompt_pieces_are_kept_per_role_and_language(
    tiny_voice_design_config: VoiceDesignConfig, tiny_tensors: dict[str, Tensor]
) -> None:
    """A prompt built from the kept pieces equals the one built when they are computed afresh; the pieces are
    kept per (role ids, language), so another language gets its own codec prefix, and the store stays
    bounded however many role prefixes it sees."""
    talker = Talker.from_tensors(tiny_voice_design_config, tiny_tensors)
    for plan in PLANS:
        first = talker.prompt_embeddings(plan)
        kept = talker.fixed_prompt_pieces(tuple(plan.role_ids), plan.language_id)
        assert talker.fixed_prompt_pieces(tuple(plan.role_ids), plan.language_id) is kept
        again = talker.prompt_embeddings(plan)
        talker._fixed_prompt_pieces.clear()
        afresh = talker.prompt_embeddings(plan)
        for a, b, c in zip(first, again, afresh, strict=True):
            assert torch.equal(a, b) and torch.equal(a, c)
    auto = talker.fixed_prompt_pieces(tuple(ROLE), None)
    english = talker.fixed_prompt_pieces(tuple(ROLE), 2050)
    assert auto.codec_prefix.shape[0] + 1 == english.codec_prefix.shape[0]  # the language tag
    assert torch.equal(auto.role, english.role)
    for index in range(FIXED_PROMPT_KEYS + 5):
        talker.fixed_prompt_pieces((index, index + 1), None)
        assert len(talker._fixed_prompt_pieces) <= FIXED_PROMPT_KEYS

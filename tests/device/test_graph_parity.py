"""The CUDA frame on the full random snapshot (QWEN3_TTS_DEVICE_SNAPSHOT):

- exact mode's graphs reproduce the same kernels run eagerly (`KernelFrameBackend`, launched without
  programmatic dependent launch), greedy, for >= 200 frames, bit for bit: ragged positions, padded buckets,
  replays and the dependent launches are correct;
- exact mode computes the torch model's math: teacher-forced on the torch model's own 200 greedy frames,
  its talker logits stay within a relative L2 of LOGIT_TOLERANCE of the torch model's (the kernels round
  differently, so free-running greedy codes part early on random weights, whose logits are nearly tied:
  how early is reported, with the same figures for fast mode);
- exact mode on the GPU: a session's codes do not depend on which sessions share its bucket. Full batch
  invariance (together == alone) is a CPU property only: the GEMV/cuBLAS choice and cuBLAS's kernels
  follow the bucket size. tests/unit keeps the CPU acceptance test of batch invariance;
- a seeded sampled request gives the same codes run to run;
- fast mode: how many greedy frames agree with exact before the first difference (reported, not gated).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from qwen3_tts_native.engine.audio import float_to_pcm16
from qwen3_tts_native.engine.kernels import ops
from qwen3_tts_native.engine.runtime import codec_graphs, graphs, step
from qwen3_tts_native.engine.runtime.accelerate import accelerate
from qwen3_tts_native.engine.runtime.codec_graphs import fp32_codec
from qwen3_tts_native.engine.runtime.engine import VoiceDesignEngine
from qwen3_tts_native.engine.runtime.modes import EXACT, FAST, Mode
from qwen3_tts_native.engine.runtime.request import PredictorSampling, SynthesisRequest, TalkerSampling

FRAMES = 200
LOGIT_TOLERANCE = 5e-2
"""Relative L2 of the teacher-forced talker logits, exact kernels against the torch model (bf16)."""
TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away into the quiet forest."
VOICE = "A deep, slow male voice."


def greedy(seed: int = 0, frames: int = FRAMES) -> SynthesisRequest:
    return SynthesisRequest(
        TEXT,
        VOICE,
        language="english",
        seed=seed,
        max_frames=frames,
        talker_sampling=TalkerSampling(greedy=True),
        predictor_sampling=PredictorSampling(greedy=True),
    )


@pytest.fixture(scope="module")
def engine(device_snapshot: Path) -> VoiceDesignEngine:
    return VoiceDesignEngine.load(
        device_snapshot,
        device="cuda",
        dtype=torch.bfloat16,
        max_sessions=4,
        max_context=512,
        accelerate=False,
    )


def fresh_engine(engine: VoiceDesignEngine) -> VoiceDesignEngine:
    return VoiceDesignEngine(
        engine.config,
        engine.talker,
        engine.predictor,
        tokenizer=engine.tokenizer,
        decoder=engine.decoder,
        max_sessions=4,
        max_context=512,
    )


def with_backend(engine: VoiceDesignEngine, mode: Mode = EXACT):  # type: ignore[no-untyped-def]
    fresh = fresh_engine(engine)
    undo = graphs.install(fresh, graphs.GraphFrameBackend(engine.talker, engine.predictor, mode))
    return fresh, undo


def first_difference(a: torch.Tensor, b: torch.Tensor) -> int:
    frames = min(a.shape[0], b.shape[0])
    return next((i for i in range(frames) if not torch.equal(a[i], b[i])), frames)


def test_exact_graphs_replay_the_eager_kernel_frame(engine: VoiceDesignEngine) -> None:
    """The eager run launches every kernel plainly (each waits for the previous one to finish); the graphs
    use programmatic dependent launch, so this also proves that no kernel touches memory before its
    predecessor is done."""
    eager_engine = fresh_engine(engine)
    eager_engine.frame_backend = graphs.KernelFrameBackend(engine.talker, engine.predictor, EXACT)
    ops.set_dependent_launch(False)
    try:
        eager = eager_engine.generate_codes(greedy())
    finally:
        ops.set_dependent_launch(True)
    graphed_engine, undo = with_backend(engine)
    try:
        graphed = graphed_engine.generate_codes(greedy())
        again = graphed_engine.generate_codes(greedy())
    finally:
        undo()
    assert eager.shape[0] >= FRAMES or eager.shape[0] == graphed.shape[0]
    assert first_difference(eager, graphed) == eager.shape[0] == graphed.shape[0]
    assert torch.equal(graphed, again)


def teacher_forced_logits(
    engine: VoiceDesignEngine, codes: torch.Tensor, frame: graphs.KernelFrame | None
) -> torch.Tensor:
    """cb0 logits [T, vocab] of frames 0..T-1 when every input is the given codes' previous frame: the
    torch model's (`frame` None) or the kernel frame's, each on a private cache (e4m3 where the frame's
    mode keeps one: `Mode.kv_cache_fp8`)."""
    talker = engine.talker
    session = engine.start_session(greedy())
    try:
        assert session.prompt is not None
        cache = talker.new_cache(1, engine.max_context, fp8=frame is not None and frame.mode.kv_cache_fp8)
        slot = torch.zeros(1, dtype=torch.int64, device=engine.device)
        if frame is None:
            hidden = step.prefill_hidden(talker, cache, session.prompt, slot)
        else:
            hidden = frame.prefill_hidden(session.prompt, slot, cache)
        logits = [talker.logits(hidden) if frame is None else frame.logits(hidden)]
        for t in range(1, codes.shape[0]):
            session.frames_emitted = t
            embeds = step.frame_input(
                talker, codes[t - 1 : t].to(engine.device), session.text_element()[None]
            )
            position = torch.full(
                (1,), session.prompt_length + t - 1, dtype=torch.int64, device=engine.device
            )
            if frame is None:
                hidden = talker(embeds.unsqueeze(1), position.unsqueeze(1), slot, cache)[:, 0]
                logits.append(talker.logits(hidden))
            else:
                logits.append(
                    frame.logits(frame.talker_hidden(embeds, position, slot, cache, distinct_slots=True))
                )
        return torch.cat(logits)
    finally:
        engine.release(session)


def test_exact_kernels_compute_the_torch_model(engine: VoiceDesignEngine, report_dir: Path) -> None:
    reference = engine.generate_codes(greedy())  # the torch model (accelerate=False)
    expected = teacher_forced_logits(engine, reference, None)
    report: dict[str, object] = {"reference_frames": reference.shape[0]}
    for mode in (EXACT, FAST):
        got = teacher_forced_logits(
            engine, reference, graphs.KernelFrame(engine.talker, engine.predictor, mode)
        )
        per_frame = (got - expected).norm(dim=-1) / expected.norm(dim=-1)
        graphed_engine, undo = with_backend(engine, mode)
        try:
            free_running = graphed_engine.generate_codes(greedy())
        finally:
            undo()
        report[mode.name] = {
            "teacher_forced_logit_rel_l2_max": float(per_frame.max()),
            "teacher_forced_logit_rel_l2_median": float(per_frame.median()),
            "teacher_forced_cb0_argmax_agreement": float(
                (got.argmax(-1) == expected.argmax(-1)).float().mean()
            ),
            "free_running_identical_prefix_frames": first_difference(reference, free_running),
        }
    (report_dir / "exact-greedy-parity.json").write_text(json.dumps(report, indent=2))
    print(report)
    exact = report["exact"]
    assert isinstance(exact, dict)
    assert exact["teacher_forced_logit_rel_l2_max"] <= LOGIT_TOLERANCE, exact


def run_together(engine: VoiceDesignEngine, requests: list[SynthesisRequest]) -> list[torch.Tensor]:
    """Prefill each request, then step them all together until each ends; codes per request."""
    sessions = [engine.start_session(r) for r in requests]
    frames: list[list[torch.Tensor]] = [[] for _ in sessions]
    try:
        active = []
        for i, s in enumerate(sessions):
            result = engine.prefill(s)
            assert result.codes is not None, "a prefill yields the first frame's codes"
            frames[i].append(result.codes)
            active.append(i)
        while active:
            results = engine.step([sessions[i] for i in active])
            still = []
            for i, result in zip(active, results, strict=True):
                if result.codes is not None:
                    frames[i].append(result.codes)
                if result.finish_reason is None:
                    still.append(i)
            active = still
    finally:
        for s in sessions:
            engine.release(s)
    return [torch.stack(f) for f in frames]


def test_exact_mode_rows_do_not_depend_on_their_companions(engine: VoiceDesignEngine) -> None:
    graphed_engine, undo = with_backend(engine)
    try:
        target = greedy(seed=0, frames=24)
        # Companions outlive the target (40 frames), so the bucket stays the same for all its frames.
        companions = [
            [greedy(seed=1, frames=40), replace(greedy(seed=2, frames=40), talker_sampling=TalkerSampling())],
            [
                replace(greedy(seed=3, frames=40), text="Hello there, how are you today?"),
                replace(greedy(seed=4, frames=40), talker_sampling=TalkerSampling(temperature=1.3)),
            ],
        ]
        first = run_together(graphed_engine, [target, *companions[0]])[0]
        second = run_together(graphed_engine, [target, *companions[1]])[0]
    finally:
        undo()
    assert torch.equal(first, second), "a session's codes changed with the sessions sharing its bucket"


def test_seeded_request_is_reproducible(engine: VoiceDesignEngine) -> None:
    request = SynthesisRequest(TEXT, VOICE, language="english", seed=4242, max_frames=40)
    for mode in (EXACT, FAST):
        graphed_engine, undo = with_backend(engine, mode)
        try:
            first = graphed_engine.generate_codes(request)
            second = graphed_engine.generate_codes(request)
        finally:
            undo()
        assert torch.equal(first, second), mode.name


def test_fast_mode_agreement_is_reported(engine: VoiceDesignEngine, report_dir: Path) -> None:
    exact_engine, undo = with_backend(engine, EXACT)
    try:
        exact = exact_engine.generate_codes(greedy(frames=100))
    finally:
        undo()
    out = {}
    for mode in (FAST, replace(FAST, weights="fp8")):
        fast_engine, undo = with_backend(engine, mode)
        try:
            fast = fast_engine.generate_codes(greedy(frames=100))
        finally:
            undo()
        n = min(exact.shape[0], fast.shape[0])
        first_diff = next((i for i in range(n) if not torch.equal(exact[i], fast[i])), n)
        out[mode.weights] = {
            "frames": n,
            "identical_prefix_frames": first_diff,
            "cb0_agreement_teacherless": float((exact[:n, 0] == fast[:n, 0]).float().mean()),
        }
    (report_dir / "fast-mode-agreement.json").write_text(json.dumps(out, indent=2))
    print(out)


BATCHED = [
    greedy(seed=0, frames=16),
    replace(greedy(seed=1, frames=16), text="Hello there, how are you today?"),
    replace(greedy(seed=2, frames=16), talker_sampling=TalkerSampling()),
    replace(greedy(seed=3, frames=16), text="One.", talker_sampling=TalkerSampling(temperature=1.3)),
]
"""Four sessions of different prompt lengths, greedy and sampled: bucket 4 with no padded row."""
LONG_TEXT = (
    "The committee met on Tuesday afternoon to review the budget, the hiring plan and the schedule for the "
    "new laboratory, and after a long discussion it agreed to postpone the decision until the spring, when "
    "the final figures from the last quarter would be known to everyone involved."
)
LONG = [replace(r, text=f"{r.text} {LONG_TEXT}") for r in BATCHED]
"""The same four with prompts too long to share the largest of `PROMPT_BUCKETS`: one pass above it, padded to
a `PACKED_PROMPT_BUCKETS` entry."""


def run_batched(
    engine: VoiceDesignEngine, requests: list[SynthesisRequest], leave: dict[int, int] | None = None
) -> list[torch.Tensor]:
    """Prefill the requests in one `prefill_many`, then step them together until each ends; session i
    is released after `leave[i]` steps. Codes per request."""
    sessions = [engine.start_session(r) for r in requests]
    leave = leave or {}
    try:
        results = engine.prefill_many(sessions)
        frames: list[list[torch.Tensor]] = [[r.codes] for r in results if r.codes is not None]
        active = list(range(len(sessions)))
        steps = 0
        while active:
            active = [i for i in active if not sessions[i].finished and leave.get(i, -1) != steps]
            results = engine.step([sessions[i] for i in active])
            steps += 1
            for i, result in zip(active, results, strict=True):
                if result.codes is not None:
                    frames[i].append(result.codes)
    finally:
        for s in sessions:
            engine.release(s)
    return [torch.stack(f) for f in frames]


@pytest.mark.parametrize(
    "name,requests,prefill_rows",
    [
        ("batched", BATCHED, graphs.PREFILL_ROWS),
        ("packed", LONG, graphs.PREFILL_ROWS),
        ("packed_twice", LONG, 512),
    ],
)
def test_batched_prefill_replays_the_eager_kernels(
    engine: VoiceDesignEngine,
    report_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    requests: list[SynthesisRequest],
    prefill_rows: int,
) -> None:
    """Exact mode: `prefill_many` (the prompts as rows of one kernel pass within a bucket, replayed; or above
    the buckets, padded to a packed bucket, replayed from its graph and attending per prompt, in one pass or
    two passes of one graph at `prefill_rows` 512; frame 0 on the complete-frames graph of bucket 4) and the
    steps after it equal the same kernels run eagerly, bit for bit; each prompt's last hidden from the batched
    passes stays within LOGIT_TOLERANCE (talker logits, relative L2) of its single-prompt pass (cuBLAS rounds
    a product of M = all rows differently from M = one prompt; flash attention rounds unlike the decode
    kernel)."""
    monkeypatch.setattr(graphs, "PREFILL_ROWS", prefill_rows)
    eager_engine = fresh_engine(engine)
    eager_engine.frame_backend = graphs.KernelFrameBackend(engine.talker, engine.predictor, EXACT)
    eager = run_batched(eager_engine, requests)
    graphed_engine, undo = with_backend(engine)
    try:
        graphed = run_batched(graphed_engine, requests)
    finally:
        undo()
    for index, (e, g) in enumerate(zip(eager, graphed, strict=True)):
        assert first_difference(e, g) == e.shape[0] == g.shape[0], f"session {index}"

    frame = graphs.KernelFrame(engine.talker, engine.predictor, EXACT)
    sessions = [engine.start_session(r) for r in requests]
    try:
        prompts = [s.prompt for s in sessions if s.prompt is not None]
        passes = [
            sum(p.shape[0] for p in prompts[part])
            for part in graphs.prompt_passes([p.shape[0] for p in prompts])
        ]
        largest = graphs.PROMPT_BUCKETS[-1]
        shapes = {
            "batched": len(passes) == 1 and passes[0] <= largest,
            "packed": len(passes) == 1 and passes[0] > largest,
            "packed_twice": len(passes) == 2 and min(passes) > largest,
        }
        assert shapes[name], passes
        cache = engine.talker.new_cache(len(prompts), engine.max_context)
        slots = torch.arange(len(prompts), device=engine.device)
        together = frame.logits(frame.prefill_hidden_many(prompts, slots, cache))
        alone = torch.cat(
            [frame.logits(frame.prefill_hidden(p, slots[i : i + 1], cache)) for i, p in enumerate(prompts)]
        )
    finally:
        for s in sessions:
            engine.release(s)
    rel = ((together - alone).norm(dim=-1) / alone.norm(dim=-1)).tolist()
    report = {
        "prompt_lengths": [p.shape[0] for p in prompts],
        "pass_rows": passes,
        "batched_vs_single_prompt_logit_rel_l2": rel,
        "cb0_argmax_agreement": float((together.argmax(-1) == alone.argmax(-1)).float().mean()),
    }
    (report_dir / f"{name}-prefill.json").write_text(json.dumps(report, indent=2))
    print(report)
    assert max(rel) <= LOGIT_TOLERANCE, report


def test_fast_packed_pass_quantizes_its_rows_in_the_norm_and_silu_kernels(
    engine: VoiceDesignEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fast mode: the fp8 products of a packed pass (912 rows) take rows the RMSNorm and SiLU x up kernels
    quantize as they make them. The pass's last hiddens equal, bit for bit, those of the pass whose rows
    are made by the bf16 kernels and then quantized by `quantize_rows_fp8` (the route before the fusion)."""
    frame = graphs.KernelFrame(engine.talker, engine.predictor, FAST)
    sessions = [engine.start_session(r) for r in LONG]
    try:
        prompts = [s.prompt for s in sessions if s.prompt is not None]
        slots = torch.arange(len(prompts), device=engine.device)
        fused = frame.prefill_hidden_many(prompts, slots, engine.talker.new_cache(len(prompts), 512))
        calls = {"norm": 0, "silu": 0}

        def unfused_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> ops.QuantizedRows:
            calls["norm"] += 1
            return ops.quantize_rows_fp8(ops.rms_norm(x, w, eps))

        def unfused_add_norm(
            d: torch.Tensor, x: torch.Tensor, w: torch.Tensor, eps: float
        ) -> ops.QuantizedRows:
            calls["norm"] += 1
            return ops.quantize_rows_fp8(ops.add_rms_norm_(d, x, w, eps))

        def unfused_silu(gate: torch.Tensor, up: torch.Tensor) -> ops.QuantizedRows:
            calls["silu"] += 1
            return ops.quantize_rows_fp8(ops.silu_mul(gate, up))

        monkeypatch.setattr(ops, "rms_norm_fp8", unfused_norm)
        monkeypatch.setattr(ops, "add_rms_norm_fp8_", unfused_add_norm)
        monkeypatch.setattr(ops, "silu_mul_fp8", unfused_silu)
        unfused = frame.prefill_hidden_many(prompts, slots, engine.talker.new_cache(len(prompts), 512))
    finally:
        for s in sessions:
            engine.release(s)
    layers = len(engine.talker.layers)
    assert calls == {"norm": 2 * layers, "silu": layers}
    assert torch.equal(fused, unfused)


def test_a_session_leaving_a_full_bucket_changes_nothing_for_the_others(engine: VoiceDesignEngine) -> None:
    """A session leaves a full bucket after 5 steps: the others run on with a padded row in its place and
    a new batch of sampling rows, and their codes equal those of the run where it stays (exact mode: within
    a bucket a row does not depend on its companions)."""
    graphed_engine, undo = with_backend(engine)
    try:
        stays = run_batched(graphed_engine, BATCHED)
        leaves = run_batched(graphed_engine, BATCHED, leave={1: 5})
    finally:
        undo()
    assert leaves[1].shape[0] == 6
    for index in (0, 2, 3):
        assert torch.equal(stays[index], leaves[index]), f"session {index}"


def test_streamed_pcm_on_the_codec_stream_is_the_one_shot_decode(engine: VoiceDesignEngine) -> None:
    """With the frame and codec graphs installed (the server's paths), the codec runs on its own stream,
    overlapping the frame launched ahead of it. The streamed PCM must still be the decode of the frames'
    codes: within 2 PCM16 steps of the one-shot float32 decode (a packet is one pass, so its GEMMs round
    at other N than the one-shot's 32-frame passes; a race would be off by far more)."""
    fresh = fresh_engine(engine)
    undo = accelerate(fresh, EXACT)
    try:
        request = greedy(frames=41)
        pcm = b"".join(packet.pcm for packet in fresh.synthesize(request))
        codes = fresh.generate_codes(request)
    finally:
        undo()
    assert fresh.decoder is not None
    with fp32_codec():
        wave = fresh.decoder.decode(codes.T.unsqueeze(0).to("cuda"))[0].cpu()
    streamed = torch.frombuffer(bytearray(pcm), dtype=torch.int16).to(torch.int32)
    one_shot = torch.frombuffer(bytearray(float_to_pcm16(wave)), dtype=torch.int16).to(torch.int32)
    assert streamed.shape == one_shot.shape == (codes.shape[0] * 1920,)
    assert (streamed - one_shot).abs().max().item() <= 2


def test_codec_state_tensors_but_one_suit_the_row_copy_kernel(engine: VoiceDesignEngine) -> None:
    """A codec graph gathers every state tensor from the pool and scatters it back with one kernel each way
    (`ops.gather_rows`, `ops.scatter_rows_`); a tensor the kernel does not take goes to torch's index ops,
    one kernel each. Run 57's packet profile still showed 29 torch index kernels for the scatter: the op
    then fell back as a whole for one tensor, the pre_conv's context, a view of the time-major codebook
    embeddings (last dim strided) when a pass has more frames than the context. Every other state tensor,
    as the decoder leaves it after a 4-frame pass on CUDA, must suit the kernel."""
    decoder = engine.decoder
    assert decoder is not None
    pool = decoder.new_stream_state(2)
    index = torch.zeros(1, dtype=torch.int64, device="cuda")
    codes = torch.zeros(1, decoder.config.num_quantizers, 4, dtype=torch.int64, device="cuda")
    with fp32_codec(), torch.no_grad():
        state = codec_graphs._gather(pool, index)
        decoder(codes, state, compact=False)
    unsuited = {name: (t.shape, t.stride()) for name, t in state.history.items() if not ops.row_copy_suits(t)}
    assert set(unsuited) <= {"pre_conv"}, unsuited
    assert all(ops.row_copy_suits(t) for t in [state.position, *state.kv])

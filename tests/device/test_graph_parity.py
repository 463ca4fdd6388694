"""The CUDA-graph frame backend on the full random snapshot (QWEN3_TTS_DEVICE_SNAPSHOT):

- exact mode reproduces the eager engine's greedy codes for >= 200 frames (bit-exact by construction:
  the graphs replay step.decode_frames itself);
- exact mode on the GPU: a session's codes do not depend on which sessions share its bucket. Full batch
  invariance (together == alone) is a CPU property only: cuBLAS picks a different kernel for each batch
  count of the per-row bmm in layers.linear (first device run), and a padded bucket of B rows is a
  different shape from a bucket of 1. tests/unit keeps the CPU acceptance test of batch invariance;
- a seeded sampled request gives the same codes run to run;
- fast mode: how many greedy frames agree with exact before the first difference (reported, not gated).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from qwen3_tts_native.engine.runtime import graphs
from qwen3_tts_native.engine.runtime.engine import VoiceDesignEngine
from qwen3_tts_native.engine.runtime.modes import EXACT, FAST
from qwen3_tts_native.engine.runtime.request import PredictorSampling, SynthesisRequest, TalkerSampling

FRAMES = 200
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


def with_backend(engine: VoiceDesignEngine, mode=EXACT):  # type: ignore[no-untyped-def]
    fresh = VoiceDesignEngine(
        engine.config,
        engine.talker,
        engine.predictor,
        tokenizer=engine.tokenizer,
        decoder=engine.decoder,
        max_sessions=4,
        max_context=512,
    )
    undo = graphs.install(fresh, graphs.GraphFrameBackend(engine.talker, engine.predictor, mode))
    return fresh, undo


def test_exact_mode_reproduces_eager_greedy_codes(engine: VoiceDesignEngine, report_dir: Path) -> None:
    eager = engine.generate_codes(greedy())
    graphed_engine, undo = with_backend(engine)
    try:
        graphed = graphed_engine.generate_codes(greedy())
        again = graphed_engine.generate_codes(greedy())
    finally:
        undo()
    frames = min(eager.shape[0], graphed.shape[0])
    agree = next((i for i in range(frames) if not torch.equal(eager[i], graphed[i])), frames)
    (report_dir / "exact-greedy-parity.json").write_text(
        json.dumps(
            {"eager_frames": eager.shape[0], "graph_frames": graphed.shape[0], "identical_prefix": agree}
        )
    )
    assert eager.shape[0] >= FRAMES or eager.shape[0] == graphed.shape[0]
    assert torch.equal(eager, graphed)
    assert torch.equal(graphed, again)


def run_together(engine: VoiceDesignEngine, requests: list[SynthesisRequest]) -> list[torch.Tensor]:
    """Prefill each request, then step them all together until each ends; codes per request."""
    sessions = [engine.start_session(r) for r in requests]
    frames: list[list[torch.Tensor]] = [[] for _ in sessions]
    try:
        active = []
        for i, s in enumerate(sessions):
            result = engine.prefill(s)
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
    for mode in (replace(FAST, weights="bf16"), FAST, replace(FAST, weights="fp8")):
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

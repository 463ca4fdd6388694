"""Talker + code predictor vs the official qwen-tts 0.1.1 model on the same tiny random weights (fp32).

One batched official `generate` per text mode covers four requests (auto, english, chinese, german; one
without a voice description), greedy for 64 frames, with hooks recording every talker and predictor
logit. Ours must produce bit-identical codes (through the batched engine step) and, teacher-forced on
the official codes, logits within 1e-4.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import Tensor

from qwen3_tts_native.engine.config import VoiceDesignConfig
from qwen3_tts_native.engine.model.predictor import CodePredictor
from qwen3_tts_native.engine.model.talker import Talker
from qwen3_tts_native.engine.prompt import PromptPlan
from qwen3_tts_native.engine.runtime.engine import VoiceDesignEngine
from qwen3_tts_native.engine.runtime.request import (
    PredictorSampling,
    SynthesisRequest,
    TalkerSampling,
    TextMode,
)

pytestmark = pytest.mark.parity

FRAMES = 64
LOGIT_TOLERANCE = 1e-4
ROLE = [151644, 77091, 198]  # <|im_start|>assistant\n
TEXT_END = [151645, 198, *ROLE]  # <|im_end|>\n<|im_start|>assistant\n

# (language, text token ids, instruct ids or None): different lengths, one request without a description.
REQUESTS: list[tuple[str, list[int], list[int] | None]] = [
    ("auto", [9707, 11, 1879, 0, 358, 1079], [151644, 872, 198, 32, 8205, 13, 151645, 198]),
    ("english", [40, 1079, 264, 6366, 1273, 315, 279, 1849, 13], [151644, 872, 198, 21388, 151645, 198]),
    ("chinese", [104198, 101909, 3837, 100165], None),
    ("german", [22560, 11, 3162, 21861, 13, 5542, 2712], [151644, 872, 198, 50, 4326, 46, 151645, 198]),
]


@dataclass
class OfficialRun:
    codes: list[Tensor]  # per request [FRAMES, 16]
    talker_logits: list[Tensor]  # per talker call [B, T, 3072] (prefill first, left-padded)
    predictor_logits: list[Tensor]  # per predictor call [B, 2048], 15 per frame


def plans(config: VoiceDesignConfig, mode: TextMode) -> list[PromptPlan]:
    return [
        PromptPlan(instruct or [], ROLE, text, config.talker.codec_language_id.get(language), mode)
        for language, text, instruct in REQUESTS
    ]


def run_official(model: Any, mode: TextMode) -> OfficialRun:
    talker_logits: list[Tensor] = []
    predictor_logits: list[Tensor] = []

    def on_talker(module: Any, args: Any, kwargs: Any, output: Any) -> None:
        talker_logits.append(output.logits.detach().clone())

    def on_predictor(module: Any, args: Any, kwargs: Any, output: Any) -> None:
        predictor_logits.append(output.logits[:, -1].detach().clone())

    hooks = [
        model.talker.register_forward_hook(on_talker, with_kwargs=True),
        model.talker.code_predictor.register_forward_hook(on_predictor, with_kwargs=True),
    ]
    try:
        with torch.no_grad():
            codes, _ = model.generate(
                input_ids=[torch.tensor([ROLE + text + TEXT_END]) for _, text, _ in REQUESTS],
                instruct_ids=[None if ins is None else torch.tensor([ins]) for _, _, ins in REQUESTS],
                languages=[language for language, _, _ in REQUESTS],
                non_streaming_mode=mode == "non_streaming",
                do_sample=False,
                subtalker_dosample=False,
                repetition_penalty=1.05,
                max_new_tokens=FRAMES + 1,  # N sampled cb0 give N - 1 frames
            )
    finally:
        for hook in hooks:
            hook.remove()
    return OfficialRun(codes, talker_logits, predictor_logits)


@pytest.fixture(scope="module", params=["non_streaming", "streaming"])
def official_run(request: pytest.FixtureRequest, official_tiny_model: Any) -> tuple[TextMode, OfficialRun]:
    torch.set_num_threads(1)
    mode: TextMode = "streaming" if request.param == "streaming" else "non_streaming"
    return mode, run_official(official_tiny_model, mode)


@pytest.fixture(scope="module")
def modules(
    tiny_voice_design_config: VoiceDesignConfig, tiny_tensors: dict[str, Tensor]
) -> tuple[Talker, CodePredictor]:
    return (
        Talker.from_tensors(tiny_voice_design_config, tiny_tensors),
        CodePredictor.from_tensors(tiny_voice_design_config, tiny_tensors),
    )


def test_greedy_codes_are_bit_identical(
    official_run: tuple[TextMode, OfficialRun],
    modules: tuple[Talker, CodePredictor],
    tiny_voice_design_config: VoiceDesignConfig,
) -> None:
    mode, official = official_run
    talker, predictor = modules
    engine = VoiceDesignEngine(tiny_voice_design_config, talker, predictor, max_sessions=4, max_context=128)
    request = SynthesisRequest(
        text="unused: the plan carries the ids",
        voice_description="",
        max_frames=FRAMES,
        talker_sampling=TalkerSampling(greedy=True, repetition_penalty=1.05),
        predictor_sampling=PredictorSampling(greedy=True),
    )
    sessions = [engine.open_session(request, plan) for plan in plans(tiny_voice_design_config, mode)]
    frames: list[list[Tensor]] = [[] for _ in sessions]
    results = [engine.prefill(session) for session in sessions]
    while True:
        for index, result in enumerate(results):
            assert result.codes is not None, "EOS is scaled out of these weights"
            frames[index].append(result.codes)
        if any(result.finish_reason for result in results):
            assert all(result.finish_reason == "length" for result in results)
            break
        results = engine.step(sessions)
    for index, (language, _, _) in enumerate(REQUESTS):
        ours = torch.stack(frames[index])
        assert official.codes[index].shape == (FRAMES, 16)
        assert torch.equal(ours, official.codes[index]), f"{mode}/{language}: codes differ"


def forced_predictor_logits(
    predictor: CodePredictor, hidden: Tensor, cb0_embed: Tensor, codes: Tensor
) -> Tensor:
    """Teacher-forced predictor logits [B, 15, vocab] of frames whose codes [B, 16] are known."""
    recorded: list[Tensor] = []

    def choose(logits: Tensor, group: int) -> Tensor:
        recorded.append(logits)
        return codes[:, group + 1]

    predictor.generate(hidden, cb0_embed, choose)
    return torch.stack(recorded, dim=1)


def test_teacher_forced_logits_match(
    official_run: tuple[TextMode, OfficialRun],
    modules: tuple[Talker, CodePredictor],
    tiny_voice_design_config: VoiceDesignConfig,
) -> None:
    """All four requests teacher-forced together: each prompt alone, then one batched step per frame."""
    mode, official = official_run
    talker, predictor = modules
    assert len(official.talker_logits) == FRAMES + 1
    assert len(official.predictor_logits) == FRAMES * 15
    codes = torch.stack(official.codes)  # [B, FRAMES, 16]
    batch = codes.shape[0]
    cache = talker.new_cache(batch, 128)
    talker_diff = predictor_diff = 0.0
    with torch.no_grad():
        last_hidden, lengths, texts = [], [], []
        for row, plan in enumerate(plans(tiny_voice_design_config, mode)):
            prompt, trailing, tts_pad = talker.prompt_embeddings(plan)
            length = prompt.shape[0]
            positions = torch.arange(length).unsqueeze(0)
            hidden = talker(prompt.unsqueeze(0), positions, torch.tensor([row]), cache)[0]
            expected = official.talker_logits[0][row, -length:]  # left padding precedes the prompt
            talker_diff = max(talker_diff, (talker.logits(hidden) - expected).abs().max().item())
            last_hidden.append(hidden[-1])
            lengths.append(length)
            texts.append([trailing[k] if k < trailing.shape[0] else tts_pad for k in range(FRAMES)])
        hidden = torch.stack(last_hidden)
        slots = torch.arange(batch)
        for frame in range(FRAMES):
            frame_codes = codes[:, frame]
            forced = forced_predictor_logits(
                predictor, hidden, talker.codec_embed(frame_codes[:, 0]), frame_codes
            )
            expected = torch.stack(official.predictor_logits[frame * 15 : (frame + 1) * 15], dim=1)
            predictor_diff = max(predictor_diff, (forced - expected).abs().max().item())
            text = torch.stack([texts[row][frame] for row in range(batch)])
            embeds = talker.frame_embedding(frame_codes) + text
            positions = torch.tensor(lengths).unsqueeze(1) + frame
            hidden = talker(embeds.unsqueeze(1), positions, slots, cache)[:, 0]
            expected = official.talker_logits[frame + 1][:, -1]
            talker_diff = max(talker_diff, (talker.logits(hidden) - expected).abs().max().item())
    print(f"\n{mode}: max |logit diff| talker {talker_diff:.3g}, predictor {predictor_diff:.3g}")
    assert talker_diff <= LOGIT_TOLERANCE
    assert predictor_diff <= LOGIT_TOLERANCE

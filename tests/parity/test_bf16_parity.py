"""bf16 talker + code predictor vs the official qwen-tts 0.1.1 model on the tiny random weights (CPU).

The official model is built as `from_pretrained(dtype=torch.bfloat16)` builds it (bf16 parameters, fp32
RoPE `inv_freq`) and run one request at a time, as the device acceptance run does (no padding, so HF
passes no attention mask). It runs with each attention backend, and ours with the matching `attention`:

- "eager": HF's eager attention; ours is the engine default, `layers.attention` (on CPU each row over
  exactly its own keys; CUDA uses the fixed-shape masked form that the graphs capture).
- "sdpa": HF's sdpa attention, torch's fused kernel; ours is `layers.sdpa_attention` (CPU reference).

The two backends round differently (see `layers.sdpa_attention`), so each of ours is compared with its own.

Gates, per backend and text mode, for all four requests:
- teacher-forced stages (prompt and step embeddings, every layer's input norm, q/k norm, attention output,
  o_proj, post-attention norm, MLP output, layer output, final norm, logits of the talker and predictor):
  tolerance 0, i.e. bit-identical;
- greedy codes for 64 frames: all 4 x 64 x 16 codes identical.
Printed, not gated: how many greedy codes ours (eager) shares with the official sdpa run (the
cross-backend figure the device acceptance measured).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from test_talker_parity import REQUESTS, ROLE, TEXT_END, plans
from torch import Tensor, nn

from qwen3_tts_native.engine.config import VoiceDesignConfig
from qwen3_tts_native.engine.model.layers import AttentionImpl
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
TOLERANCE = 0.0
"""Max |official - ours| allowed for every teacher-forced stage: bit-identical on CPU."""

BLOCK_STAGES: dict[str, tuple[str, str]] = {
    # stage: (official submodule, our submodule); the output of each is compared.
    "input_norm": ("input_layernorm", "input_layernorm"),
    "q_norm": ("self_attn.q_norm", "q_norm"),
    "k_norm": ("self_attn.k_norm", "k_norm"),
    "o_proj": ("self_attn.o_proj", "o_proj"),
    "post_attention_norm": ("post_attention_layernorm", "post_attention_layernorm"),
    "mlp": ("mlp.down_proj", "down_proj"),
}
"""Besides these: "attention" (o_proj's input: softmax(QK^T)V after RoPE) and "layer" (the block output)."""

Records = defaultdict[str, list[Tensor]]


def _hook(records: Records, stage: str, take_input: bool = False) -> Callable[..., None]:
    def record(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        value = args[0] if take_input else output[0] if isinstance(output, tuple) else output
        records[stage].append(value.detach().clone())

    return record


@contextmanager
def recording(
    records: Records, models: Sequence[tuple[str, nn.Module, nn.ModuleList, nn.Module]], official: bool
) -> Iterator[None]:
    """Forward hooks on every stage of each (tag, model, layers, final norm); removed on exit."""
    handles = []
    for tag, _, layers, norm in models:
        for index, layer in enumerate(layers):
            prefix = f"{tag}.{index}"
            for stage, (theirs, ours) in BLOCK_STAGES.items():
                module = layer.get_submodule(theirs if official else ours)
                handles.append(module.register_forward_hook(_hook(records, f"{prefix}.{stage}")))
            o_proj = layer.get_submodule("self_attn.o_proj" if official else "o_proj")
            handles.append(o_proj.register_forward_hook(_hook(records, f"{prefix}.attention", True)))
            handles.append(layer.register_forward_hook(_hook(records, f"{prefix}.layer")))
        handles.append(norm.register_forward_hook(_hook(records, f"{tag}.norm")))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _hook_into(values: list[Tensor]) -> Callable[..., None]:
    def record(module: nn.Module, args: tuple[Any, ...], output: Tensor) -> None:
        values.append(output)

    return record


def run_official(model: Any, mode: TextMode, request: int, records: Records) -> Tensor:
    """One request, greedy, batch 1 (as the acceptance runs it); codes [FRAMES, 16], stages into records."""
    language, text, instruct = REQUESTS[request]
    talker = model.talker
    predictor = talker.code_predictor
    handles = [
        talker.model.register_forward_pre_hook(
            lambda m, a, k: records["talker.embeds"].append(k["inputs_embeds"].clone()), with_kwargs=True
        ),
        talker.register_forward_hook(
            lambda m, a, k, out: records["talker.logits"].append(out.logits.float()), with_kwargs=True
        ),
        predictor.register_forward_hook(
            lambda m, a, k, out: records["predictor.logits"].append(out.logits.float()), with_kwargs=True
        ),
    ]
    models = [
        ("talker", talker.model, talker.model.layers, talker.model.norm),
        ("predictor", predictor.model, predictor.model.layers, predictor.model.norm),
    ]
    try:
        with recording(records, models, official=True), torch.no_grad():
            codes, _ = model.generate(
                input_ids=[torch.tensor([ROLE + text + TEXT_END])],
                instruct_ids=[None if instruct is None else torch.tensor([instruct])],
                languages=[language],
                non_streaming_mode=mode == "non_streaming",
                do_sample=False,
                subtalker_dosample=False,
                repetition_penalty=1.05,
                max_new_tokens=FRAMES + 1,  # N sampled cb0 give N - 1 frames
            )
    finally:
        for handle in handles:
            handle.remove()
    return codes[0]


def run_forced(
    talker: Talker, predictor: CodePredictor, plan: PromptPlan, codes: Tensor, records: Records
) -> None:
    """Ours, teacher-forced on the official codes [FRAMES, 16], in the official call order: the prompt,
    then per frame the predictor's 15 calls and the talker step that feeds the next frame."""
    models = [
        ("talker", talker, talker.layers, talker.norm),
        ("predictor", predictor, predictor.layers, predictor.norm),
    ]
    with recording(records, models, official=False), torch.no_grad():
        prompt, trailing, tts_pad = talker.prompt_embeddings(plan)
        cache = talker.new_cache(1, 128)
        slot = torch.tensor([0])
        length = prompt.shape[0]
        embeds = prompt.unsqueeze(0)
        positions = torch.arange(length).unsqueeze(0)
        for frame in range(FRAMES):
            records["talker.embeds"].append(embeds)
            hidden = talker(embeds, positions, slot, cache)
            records["talker.logits"].append(talker.logits(hidden))

            def choose(logits: Tensor, group: int, frame: int = frame) -> Tensor:
                return codes[frame, group + 1].view(1)

            # The predictor's logits, from its post-norm hidden of each step ([1, 2, H] at step 0).
            cb0 = codes[frame, :1]
            predictor_hidden: list[Tensor] = []
            hook = predictor.norm.register_forward_hook(_hook_into(predictor_hidden))
            try:
                predictor.generate(hidden[:, -1], talker.codec_embed(cb0), choose)
            finally:
                hook.remove()
            for group, state in enumerate(predictor_hidden):
                records["predictor.logits"].append(predictor.logits(state, group))
            text = trailing[frame] if frame < trailing.shape[0] else tts_pad
            embeds = (talker.frame_embedding(codes[frame : frame + 1]) + text).unsqueeze(1)
            positions = torch.tensor([[length + frame]])
        records["talker.embeds"].append(embeds)
        records["talker.logits"].append(talker.logits(talker(embeds, positions, slot, cache)))


def greedy_codes(talker: Talker, predictor: CodePredictor, plan: PromptPlan) -> Tensor:
    engine = VoiceDesignEngine(talker.config, talker, predictor, max_sessions=1, max_context=128)
    request = SynthesisRequest(
        text="unused: the plan carries the ids",
        voice_description="",
        max_frames=FRAMES,
        talker_sampling=TalkerSampling(greedy=True, repetition_penalty=1.05),
        predictor_sampling=PredictorSampling(greedy=True),
    )
    return engine.run_to_end(engine.open_session(request, plan))


def bf16(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    return {name: value.to(torch.bfloat16) for name, value in tensors.items()}


@pytest.fixture(scope="module")
def tiny_bf16(tiny_tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    return bf16(tiny_tensors)


@pytest.mark.parametrize("mode", ["non_streaming", "streaming"])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_bf16_matches_official_backend(
    attention: AttentionImpl,
    mode: TextMode,
    tiny_voice_design_config: VoiceDesignConfig,
    tiny_tensors: dict[str, Tensor],
    tiny_bf16: dict[str, Tensor],
    official_model_builder: Callable[..., Any],
) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    official = official_model_builder(tiny_tensors, attention, torch.bfloat16)
    assert official.talker.model.rotary_emb.inv_freq.dtype == torch.float32  # as from_pretrained leaves it
    config = tiny_voice_design_config
    talker = Talker.from_tensors(config, tiny_bf16, attention=attention)
    predictor = CodePredictor.from_tensors(config, tiny_bf16, attention=attention)
    eager_talker = Talker.from_tensors(config, tiny_bf16)
    eager_predictor = CodePredictor.from_tensors(config, tiny_bf16)

    worst: dict[str, float] = defaultdict(float)
    matching = cross_matching = total = 0
    for request, plan in enumerate(plans(config, mode)):
        theirs: Records = defaultdict(list)
        ours: Records = defaultdict(list)
        codes = run_official(official, mode, request, theirs)
        assert codes.shape == (FRAMES, 16)
        run_forced(talker, predictor, plan, codes, ours)
        # Step 0 of the predictor has logits for both positions; the sampler reads the last one.
        for records in (theirs, ours):
            records["predictor.logits"] = [logits[:, -1] for logits in records["predictor.logits"]]
        assert theirs.keys() == ours.keys()
        for stage in theirs:
            assert len(theirs[stage]) == len(ours[stage]), stage
            for expected, got in zip(theirs[stage], ours[stage], strict=True):
                diff = (got.float() - expected.reshape(got.shape).float()).abs().max().item()
                worst[stage] = max(worst[stage], diff)
        matching += int((greedy_codes(talker, predictor, plan) == codes).sum())
        cross_matching += int((greedy_codes(eager_talker, eager_predictor, plan) == codes).sum())
        total += codes.numel()

    print(f"\nbf16 {attention}/{mode}: greedy codes identical {matching}/{total}; ours(eager) vs official")
    print(f"  {attention}: {cross_matching}/{total}. Teacher-forced max |diff| per stage:")
    for stage, diff in worst.items():
        print(f"  {stage:<36}{diff:.3g}")
    bad = {stage: diff for stage, diff in worst.items() if diff > TOLERANCE}
    assert not bad, f"stages beyond tolerance {TOLERANCE}: {bad}"
    assert matching == total

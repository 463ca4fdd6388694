"""The code predictor's GEMV matrices lie in one allocation (`KernelFrame.predictor_weights`), which the L2
persisting window covers (runtime/l2_residency.py): every matrix a predictor GEMV reads is inside it, the
model's parameters keep their values, and a second frame built on the same model moves nothing (graphs
captured by the first keep valid pointers)."""

from __future__ import annotations

import pytest
import torch

from qwen3_tts_native.engine.config import VoiceDesignConfig
from qwen3_tts_native.engine.kernels.reference import QuantizedWeight
from qwen3_tts_native.engine.model.predictor import CodePredictor
from qwen3_tts_native.engine.model.talker import Talker
from qwen3_tts_native.engine.runtime import l2_residency
from qwen3_tts_native.engine.runtime.graphs import KernelFrame
from qwen3_tts_native.engine.runtime.modes import EXACT, FAST

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _span(tensor: torch.Tensor) -> tuple[int, int]:
    start = tensor.data_ptr()
    return start, start + tensor.numel() * tensor.element_size()


def _inside(tensor: torch.Tensor, arena: torch.Tensor) -> bool:
    start, end = _span(tensor)
    arena_start, arena_end = _span(arena)
    return arena_start <= start and end <= arena_end


@pytest.mark.parametrize("mode", [EXACT, FAST], ids=["bf16", "int8"])
def test_predictor_gemv_matrices_share_one_allocation(
    tiny_voice_design_config: VoiceDesignConfig, tiny_tensors: dict[str, torch.Tensor], mode: object
) -> None:
    talker = Talker.from_tensors(tiny_voice_design_config, tiny_tensors).to(torch.bfloat16)
    predictor = CodePredictor.from_tensors(tiny_voice_design_config, tiny_tensors).to(torch.bfloat16)
    before = {
        (i, name): getattr(layer, name).weight.detach().clone()
        for i, layer in enumerate(predictor.layers)
        for name in PROJECTIONS
    }
    frame = KernelFrame(talker, predictor, mode)  # type: ignore[arg-type]
    arena = frame.predictor_weights
    for block in frame.predictor_blocks:
        for weight in (block.qkv, block.o, block.gate_up, block.down):
            small = weight.small.data if isinstance(weight.small, QuantizedWeight) else weight.small
            assert _inside(small, arena)
    for (i, name), value in before.items():
        param = getattr(predictor.layers[i], name).weight
        assert torch.equal(param, value), (i, name)
        assert mode is FAST or _inside(param, arena)
    pointers = [getattr(layer, name).weight.data_ptr() for layer in predictor.layers for name in PROJECTIONS]
    again = KernelFrame(talker, predictor, mode)  # type: ignore[arg-type]
    assert [
        getattr(layer, name).weight.data_ptr() for layer in predictor.layers for name in PROJECTIONS
    ] == pointers
    if mode is EXACT:
        assert again.predictor_weights.data_ptr() == arena.data_ptr()


def test_no_l2_window_off_cuda(
    tiny_voice_design_config: VoiceDesignConfig, tiny_tensors: dict[str, torch.Tensor]
) -> None:
    talker = Talker.from_tensors(tiny_voice_design_config, tiny_tensors).to(torch.bfloat16)
    predictor = CodePredictor.from_tensors(tiny_voice_design_config, tiny_tensors).to(torch.bfloat16)
    frame = KernelFrame(talker, predictor, EXACT)
    assert l2_residency.plan(frame.predictor_weights) is None

"""Shared fixtures: the tiny preset as a config, seeded random weights with the real tensor names, and the
official qwen-tts model built on those weights (model.md §7).

Nothing here reads a snapshot or writes to disk, so the talker/predictor tests do not depend on the
snapshot, tokenizer or checkpoint code.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.machinery
import math
import sys
import types
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor

from qwen3_tts_native.engine.config import (
    SpeechDecoderConfig,
    VoiceDesignConfig,
    parse_generation_defaults,
    parse_speech_decoder_config,
    parse_talker_config,
)

LANGUAGE_IDS = {
    "chinese": 2055,
    "english": 2050,
    "german": 2053,
    "italian": 2070,
    "portuguese": 2071,
    "spanish": 2054,
    "japanese": 2058,
    "korean": 2064,
    "french": 2061,
    "russian": 2069,
}

TINY_CONFIG_JSON: dict[str, Any] = {
    "model_type": "qwen3_tts",
    "tokenizer_type": "qwen3_tts_tokenizer_12hz",
    "tts_model_size": "1b7",
    "tts_model_type": "voice_design",
    "assistant_token_id": 77091,
    "im_start_token_id": 151644,
    "im_end_token_id": 151645,
    "tts_pad_token_id": 151671,
    "tts_bos_token_id": 151672,
    "tts_eos_token_id": 151673,
    "talker_config": {
        "vocab_size": 3072,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "rope_scaling": {"interleaved": True, "mrope_section": [3, 3, 2], "rope_type": "default"},
        "num_code_groups": 16,
        "text_hidden_size": 64,
        "text_vocab_size": 151936,
        "position_id_per_seconds": 13,
        "codec_bos_id": 2149,
        "codec_eos_token_id": 2150,
        "codec_pad_id": 2148,
        "codec_think_id": 2154,
        "codec_nothink_id": 2155,
        "codec_think_bos_id": 2156,
        "codec_think_eos_id": 2157,
        "codec_language_id": LANGUAGE_IDS,
        "spk_id": {},
        "spk_is_dialect": {},
        "code_predictor_config": {
            "vocab_size": 2048,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "hidden_act": "silu",
            "max_position_embeddings": 65536,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000,
            "num_code_groups": 16,
        },
    },
}

TINY_SPEECH_TOKENIZER_JSON: dict[str, Any] = {
    "decode_upsample_rate": 1920,
    "output_sample_rate": 24000,
    "decoder_config": {
        "codebook_size": 2048,
        "codebook_dim": 16,
        "hidden_size": 32,
        "latent_dim": 32,
        "head_dim": 8,
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "num_hidden_layers": 2,
        "num_quantizers": 16,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000,
        "sliding_window": 72,
        "layer_scale_initial_scale": 0.01,
        "max_position_embeddings": 8000,
        "decoder_dim": 32,
        "upsample_rates": [8, 5, 4, 3],
        "upsampling_ratios": [2, 2],
    },
}

GENERATION_CONFIG_JSON: dict[str, Any] = {
    "do_sample": True,
    "temperature": 0.9,
    "top_k": 50,
    "top_p": 1.0,
    "repetition_penalty": 1.05,
    "max_new_tokens": 8192,
    "subtalker_dosample": True,
    "subtalker_temperature": 0.9,
    "subtalker_top_k": 50,
    "subtalker_top_p": 1.0,
}

HEAD_LOGIT_STD = 4.0
"""Output heads draw logits with std ~4: argmax gaps ~1, far above fp32 rounding (greedy parity is robust)."""


def tiny_config() -> VoiceDesignConfig:
    main = TINY_CONFIG_JSON
    return VoiceDesignConfig(
        im_start_token_id=main["im_start_token_id"],
        im_end_token_id=main["im_end_token_id"],
        assistant_token_id=main["assistant_token_id"],
        tts_pad_token_id=main["tts_pad_token_id"],
        tts_bos_token_id=main["tts_bos_token_id"],
        tts_eos_token_id=main["tts_eos_token_id"],
        talker=parse_talker_config(main["talker_config"], "tiny config.json"),
        speech_decoder=parse_speech_decoder_config(TINY_SPEECH_TOKENIZER_JSON, "tiny speech_tokenizer"),
        generation=parse_generation_defaults(GENERATION_CONFIG_JSON, "tiny generation_config.json"),
    )


def tensor_shapes(config: VoiceDesignConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every talker/predictor tensor, as the official classes name them."""
    tc, pc = config.talker, config.talker.code_predictor
    shapes: dict[str, tuple[int, ...]] = {}

    def block(prefix: str, hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int) -> None:
        shapes.update(
            {
                f"{prefix}.self_attn.q_proj.weight": (heads * head_dim, hidden),
                f"{prefix}.self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
                f"{prefix}.self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
                f"{prefix}.self_attn.o_proj.weight": (hidden, heads * head_dim),
                f"{prefix}.self_attn.q_norm.weight": (head_dim,),
                f"{prefix}.self_attn.k_norm.weight": (head_dim,),
                f"{prefix}.mlp.gate_proj.weight": (intermediate, hidden),
                f"{prefix}.mlp.up_proj.weight": (intermediate, hidden),
                f"{prefix}.mlp.down_proj.weight": (hidden, intermediate),
                f"{prefix}.input_layernorm.weight": (hidden,),
                f"{prefix}.post_attention_layernorm.weight": (hidden,),
            }
        )

    h = tc.hidden_size
    for i in range(tc.num_hidden_layers):
        block(
            f"talker.model.layers.{i}",
            h,
            tc.intermediate_size,
            tc.num_attention_heads,
            tc.num_key_value_heads,
            tc.head_dim,
        )
    shapes["talker.model.norm.weight"] = (h,)
    shapes["talker.model.codec_embedding.weight"] = (tc.vocab_size, h)
    shapes["talker.model.text_embedding.weight"] = (tc.text_vocab_size, tc.text_hidden_size)
    shapes["talker.text_projection.linear_fc1.weight"] = (tc.text_hidden_size, tc.text_hidden_size)
    shapes["talker.text_projection.linear_fc1.bias"] = (tc.text_hidden_size,)
    shapes["talker.text_projection.linear_fc2.weight"] = (h, tc.text_hidden_size)
    shapes["talker.text_projection.linear_fc2.bias"] = (h,)
    shapes["talker.codec_head.weight"] = (tc.vocab_size, h)
    p = pc.hidden_size
    for i in range(pc.num_hidden_layers):
        block(
            f"talker.code_predictor.model.layers.{i}",
            p,
            pc.intermediate_size,
            pc.num_attention_heads,
            pc.num_key_value_heads,
            pc.head_dim,
        )
    shapes["talker.code_predictor.model.norm.weight"] = (p,)
    for j in range(pc.num_code_groups - 1):
        shapes[f"talker.code_predictor.model.codec_embedding.{j}.weight"] = (pc.vocab_size, h)
        shapes[f"talker.code_predictor.lm_head.{j}.weight"] = (pc.vocab_size, p)
    shapes["talker.code_predictor.small_to_mtp_projection.weight"] = (p, h)
    shapes["talker.code_predictor.small_to_mtp_projection.bias"] = (p,)
    return shapes


def random_tensors(config: VoiceDesignConfig, seed: int, eos_scale: float = 0.0) -> dict[str, Tensor]:
    """Seeded fp32 weights that make a *decisive* model (the default N(0, 0.02) init is nearly uniform).

    Norm gains ~ 1 + N(0, 0.1), biases N(0, 0.1), embeddings N(0, 1), matrices unit-gain N(0, 1/fan_in),
    output heads logit std ~4. codec_head's EOS row is scaled by `eos_scale`: 0 keeps EOS from ever winning
    (long greedy runs), a large value makes it win about every other step once allowed.
    """
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in tensor_shapes(config).items():
        values = torch.randn(shape, generator=generator)
        if name.endswith("norm.weight"):
            values = 1.0 + 0.1 * values
        elif name.endswith(".bias"):
            values = 0.1 * values
        elif "embedding" in name:
            pass
        elif name.endswith("codec_head.weight") or ".lm_head." in name:
            values = values * (HEAD_LOGIT_STD / math.sqrt(shape[1]))
        else:
            values = values / math.sqrt(shape[1])
        tensors[name] = values
    tensors["talker.codec_head.weight"][config.talker.codec_eos_token_id] *= eos_scale
    return tensors


def import_official_model() -> Any:
    """The official modeling module; torchaudio, used only by the 25 Hz tokenizer, is stubbed (§7.1)."""
    for name in ("torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi"):
        if name not in sys.modules:
            stub = types.ModuleType(name)
            stub.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
            sys.modules[name] = stub
    from qwen_tts.core.models import modeling_qwen3_tts

    return modeling_qwen3_tts


def build_official_model(
    tensors: dict[str, Tensor], attn_implementation: str = "eager", dtype: torch.dtype = torch.float32
) -> Any:
    """Qwen3TTSForConditionalGeneration on the tiny config in `dtype`, loaded (strictly) with `tensors`.

    Built the way `from_pretrained(dtype=...)` builds it: the modules are created under `dtype` as the
    default dtype, so the parameters are `dtype` but buffers created explicitly in fp32 (the RoPE
    `inv_freq`) stay fp32. `model.to(torch.bfloat16)` would also round `inv_freq` to bf16 and give
    different RoPE angles from the official loading path.
    """
    modeling = import_official_model()
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig

    config = Qwen3TTSConfig(**copy.deepcopy(TINY_CONFIG_JSON))
    config._attn_implementation = attn_implementation
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        model = modeling.Qwen3TTSForConditionalGeneration(config)
    finally:
        torch.set_default_dtype(previous)
    model.load_state_dict({name: value.to(dtype) for name, value in tensors.items()}, strict=True)
    return model.eval()


@pytest.fixture(scope="session")
def official_model_builder() -> Callable[..., Any]:
    """`build_official_model`, for tests that build the official model with other settings.

    A fixture rather than `from conftest import ...`: several conftest.py files exist under tests/, and
    which one that import finds depends on what pytest collected first."""
    return build_official_model


@pytest.fixture(scope="session")
def tiny_voice_design_config() -> VoiceDesignConfig:
    return tiny_config()


@pytest.fixture(scope="session")
def deep_grouped_kv_decoder_config(tiny_voice_design_config: VoiceDesignConfig) -> SpeechDecoderConfig:
    """The tiny speech decoder at full depth (8 transformer layers: an attention field of 8 x 71 frames)
    with grouped KV heads (two query heads a KV head)."""
    return dataclasses.replace(
        tiny_voice_design_config.speech_decoder,
        codebook_dim=32,
        hidden_size=64,
        latent_dim=48,
        head_dim=16,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=8,
        intermediate_size=96,
        decoder_dim=48,
    )


@pytest.fixture(scope="session")
def tiny_tensors(tiny_voice_design_config: VoiceDesignConfig) -> dict[str, Tensor]:
    """Decisive random weights (seed 1234) with EOS never winning."""
    return random_tensors(tiny_voice_design_config, seed=1234)


@pytest.fixture(scope="session")
def official_tiny_model(tiny_tensors: dict[str, Tensor]) -> Any:
    """The official model on `tiny_tensors` (eager attention, fp32). Do not mutate it."""
    torch.manual_seed(0)
    return build_official_model(tiny_tensors)


@pytest.fixture(scope="session")
def tiny_eos_tensors(tiny_voice_design_config: VoiceDesignConfig) -> dict[str, Tensor]:
    """Decisive random weights (seed 99) whose EOS logit wins about every other step once allowed."""
    return random_tensors(tiny_voice_design_config, seed=99, eos_scale=30.0)

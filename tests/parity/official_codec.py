"""Random speech-decoder weights with the real tensor names, and the official qwen-tts decoder on them.

The official default init is degenerate (every code decodes to zero, model.md §7), so weights are drawn
from a seeded generator by role: cluster_usage ~ U(0.5, 1.5), embedding_sum ~ N(0, 0.25²) (the sum of 15
codebooks stays O(1)), matrices ~ N(0, gain²/fan_in), norm weights ~ N(1, 0.1²), SnakeBeta logs
~ N(0, 0.3²), LayerScale / ConvNeXt gamma ~ N(0.3, 0.1²), biases ~ N(0, 0.02²).

With unit gain everywhere the waveform decoder roughly doubles its activations per block (residual units
and SnakeBeta offsets add up) and fp32 rounding grows with them, so residual-unit output convs use gain
0.3 and the waveform upsampling transposed convs gain 0.5: every stage stays O(1) and the waveform is
speech-like (std about 0.3), which makes absolute fp32 tolerances meaningful.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types
from typing import Any, cast

import torch
from torch import Tensor, nn

from qwen3_tts_native.engine.config import SpeechDecoderConfig
from qwen3_tts_native.engine.snapshot import expected_speech_decoder_tensors


def _std(name: str, shape: tuple[int, ...]) -> tuple[float, float]:
    """(mean, std) of the normal draw for one tensor."""
    if name.endswith("norm.weight"):
        return 1.0, 0.1
    if name.endswith((".alpha", ".beta")):
        return 0.0, 0.3
    if name.endswith(("layer_scale.scale", ".gamma")):
        return 0.3, 0.1
    if name.endswith("embedding_sum"):
        return 0.0, 0.25
    if len(shape) == 1:
        return 0.0, 0.02
    if ".block.1.conv." in name:  # waveform upsampling ConvTranspose1d [in, out, 2 * stride]
        return 0.0, 0.5 / (shape[0] * 2) ** 0.5
    if ".upsample." in name and name.endswith(".0.conv.weight"):  # latent ConvTranspose1d, kernel = stride
        return 0.0, shape[0] ** -0.5
    fan_in = shape[1] * (shape[2] if len(shape) == 3 else 1)
    gain = 0.3 if name.endswith("conv2.conv.weight") else 1.0
    return 0.0, gain * fan_in**-0.5


def random_decoder_tensors(config: SpeechDecoderConfig, seed: int) -> dict[str, Tensor]:
    """fp32 `decoder.*` tensors for `config`, as speech_tokenizer/model.safetensors names them."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, (shape, _dtype) in expected_speech_decoder_tensors(config).items():
        if name.endswith("cluster_usage"):
            tensors[name] = torch.rand(shape, generator=generator) + 0.5
        else:
            mean, std = _std(name, shape)
            tensors[name] = torch.randn(shape, generator=generator) * std + mean
    return tensors


def import_official() -> Any:
    """The official 12 Hz tokenizer module; torchaudio (used only by the 25 Hz tokenizer) is stubbed."""
    for name in ("torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi"):
        if name not in sys.modules:
            stub = types.ModuleType(name)
            stub.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
            sys.modules[name] = stub
    from qwen_tts.core.tokenizer_12hz import modeling_qwen3_tts_tokenizer_v2

    return modeling_qwen3_tts_tokenizer_v2


def official_decoder(config: SpeechDecoderConfig, tensors: dict[str, Tensor]) -> nn.Module:
    """The official `Qwen3TTSTokenizerV2Decoder` for `config` (sdpa, fp32, eval), strictly loaded."""
    official = import_official()
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import (
        Qwen3TTSTokenizerV2DecoderConfig,
    )

    decoder_config = Qwen3TTSTokenizerV2DecoderConfig(
        codebook_size=config.codebook_size,
        codebook_dim=config.codebook_dim,
        hidden_size=config.hidden_size,
        latent_dim=config.latent_dim,
        head_dim=config.head_dim,
        intermediate_size=config.intermediate_size,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        num_hidden_layers=config.num_hidden_layers,
        num_quantizers=config.num_quantizers,
        rms_norm_eps=config.rms_norm_eps,
        rope_theta=config.rope_theta,
        sliding_window=config.sliding_window,
        layer_scale_initial_scale=config.layer_scale_initial_scale,
        max_position_embeddings=config.max_position_embeddings,
        decoder_dim=config.decoder_dim,
        upsample_rates=list(config.upsample_rates),
        upsampling_ratios=list(config.upsampling_ratios),
        hidden_act="silu",
        attention_bias=False,
    )
    decoder_config._attn_implementation = "sdpa"
    decoder = official.Qwen3TTSTokenizerV2Decoder(decoder_config)
    decoder.load_state_dict({name.removeprefix("decoder."): t for name, t in tensors.items()}, strict=True)
    return decoder.float().eval()


def official_waveform(decoder: nn.Module, codes: Tensor) -> Tensor:
    """Full (unchunked) official decode of codes [B, Q, T] before the final clamp: [B, T * hop].

    The official forward clamps its output, so the last conv's output is captured with a hook.
    """
    captured: list[Tensor] = []
    final_conv = cast(nn.ModuleList, decoder.decoder)[-1]
    handle = final_conv.register_forward_hook(lambda _m, _i, out: captured.append(out))
    try:
        with torch.no_grad():
            decoder(codes)
    finally:
        handle.remove()
    return captured[0].squeeze(1)

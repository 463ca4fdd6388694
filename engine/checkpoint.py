"""Write random-weight snapshots in the real Hugging Face layout (the ``tiny`` and ``full`` presets).

The result loads unchanged in the official ``Qwen3TTSModel.from_pretrained`` and in this engine, so
parity tests, demos and benchmarks run without downloading the 4.5 GB checkpoint:

- ``config.json`` (4.x form, no ``speaker_encoder_config``, no ``transformers_version``, like the real
  file), ``generation_config.json`` (the real 10 keys), ``preprocessor_config.json``;
- ``vocab.json`` + ``merges.txt`` + ``tokenizer_config.json``: a small byte-level BPE learned here from a
  built-in multilingual corpus, padded with unreachable filler tokens so that every added token sits at
  its real id (``<|im_start|>`` 151644 ... ``<tts_text_eod>`` 151673);
- ``model.safetensors`` (talker + code predictor, BF16) and ``speech_tokenizer/`` (config, preprocessor
  config, ModelScope ``configuration.json``, F32 ``model.safetensors`` with the decoder, plus the unused
  Mimi encoder for ``full``);
- ``qwen3-tts-manifest.json``: the snapshot's identity manifest (``engine/identity.py``, repository
  ``local/random-<preset>-seed<seed>``), so ``serve`` accepts it.

Weights are a pure function of (preset, seed, tensor name): each tensor has its own generator, and
safetensors files are streamed tensor by tensor (in row chunks for the big embedding), so ``full``
never holds more than one tensor in memory. The whole snapshot is written into a temporary sibling
directory and renamed into place, so an interrupted run leaves nothing half-written behind.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import os
import re
import shutil
import struct
import tempfile
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import torch
from tokenizers import Regex, pre_tokenizers

from .config import (
    VoiceDesignConfig,
    parse_generation_defaults,
    parse_speech_decoder_config,
    parse_talker_config,
)
from .identity import MANIFEST_FILENAME, build_manifest, write_manifest
from .snapshot import (
    DTYPE_BYTES,
    MODEL_FILE,
    SPEECH_TOKENIZER_DIR,
    TensorSpec,
    expected_speech_decoder_tensors,
    expected_voice_design_tensors,
)
from .tokenizer import QWEN2_PRETOKENIZE_REGEX

Preset = Literal["tiny", "full"]
PRESETS: tuple[Preset, ...] = ("tiny", "full")
ProgressCallback = Callable[[int, int], None]  # (bytes written so far, total bytes)

GENERATOR_VERSION = 2  # bump whenever the written bytes change for a given (preset, seed)
TEXT_VOCAB_BASE = 151643  # ids below this are BPE tokens; the added tokens start here

# (id, content, special) of the real Qwen3-TTS tokenizer_config.json added_tokens_decoder.
QWEN3_TTS_ADDED_TOKENS: tuple[tuple[int, str, bool], ...] = (
    (151643, "<|endoftext|>", True),
    (151644, "<|im_start|>", True),
    (151645, "<|im_end|>", True),
    (151646, "<|object_ref_start|>", True),
    (151647, "<|object_ref_end|>", True),
    (151648, "<|box_start|>", True),
    (151649, "<|box_end|>", True),
    (151650, "<|quad_start|>", True),
    (151651, "<|quad_end|>", True),
    (151652, "<|vision_start|>", True),
    (151653, "<|vision_end|>", True),
    (151654, "<|vision_pad|>", True),
    (151655, "<|image_pad|>", True),
    (151656, "<|video_pad|>", True),
    (151657, "<tool_call>", False),
    (151658, "</tool_call>", False),
    (151659, "<|fim_prefix|>", False),
    (151660, "<|fim_middle|>", False),
    (151661, "<|fim_suffix|>", False),
    (151662, "<|fim_pad|>", False),
    (151663, "<|repo_name|>", False),
    (151664, "<|file_sep|>", False),
    (151665, "<tool_response>", False),
    (151666, "</tool_response>", False),
    (151667, "<think>", False),
    (151668, "</think>", False),
    (151669, "<|audio_start|>", True),
    (151670, "<|audio_end|>", True),
    (151671, "<tts_pad>", True),
    (151672, "<tts_text_bos>", True),
    (151673, "<tts_text_eod>", True),
    (151674, "<tts_text_bos_single>", True),
    (151675, "<|audio_pad|>", True),
)

LANGUAGE_IDS: dict[str, int] = {
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

GENERATION_CONFIG: dict[str, Any] = {
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

PREPROCESSOR_CONFIG: dict[str, Any] = {
    "padding_side": "left",
    "padding_value": 0.0,
    "processor_class": "Qwen3TTSProcessor",
    "return_attention_mask": True,
}

SPEECH_PREPROCESSOR_CONFIG: dict[str, Any] = {
    "chunk_length_s": None,
    "feature_extractor_type": "EncodecFeatureExtractor",
    "feature_size": 1,
    "overlap": None,
    "padding_side": "right",
    "padding_value": 0.0,
    "return_attention_mask": True,
    "sampling_rate": 24000,
}

MODELSCOPE_CONFIGURATION: dict[str, Any] = {
    "framework": "pytorch",
    "task": "text-to-speech",
    "allow_remote": True,
}

_FULL_TALKER: dict[str, Any] = {
    "vocab_size": 3072,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rope_scaling": {"interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
    "text_hidden_size": 2048,
}
_FULL_PREDICTOR: dict[str, Any] = {
    "vocab_size": 2048,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 5,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
}
_FULL_DECODER: dict[str, Any] = {
    "codebook_size": 2048,
    "codebook_dim": 512,
    "hidden_size": 512,
    "latent_dim": 1024,
    "head_dim": 64,
    "intermediate_size": 1024,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "num_hidden_layers": 8,
    "decoder_dim": 1536,
}
_TINY_TALKER: dict[str, Any] = {
    "vocab_size": 3072,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rope_scaling": {"interleaved": True, "mrope_section": [3, 3, 2], "rope_type": "default"},
    "text_hidden_size": 64,
}
_TINY_PREDICTOR: dict[str, Any] = {
    "vocab_size": 2048,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}
_TINY_DECODER: dict[str, Any] = {
    "codebook_size": 2048,
    "codebook_dim": 16,
    "hidden_size": 32,
    "latent_dim": 32,
    "head_dim": 8,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "decoder_dim": 32,
}


def config_json(preset: Preset) -> dict[str, Any]:
    """The root ``config.json`` of a preset (same keys as the real VoiceDesign config)."""
    talker_geometry, predictor_geometry = (
        (_FULL_TALKER, _FULL_PREDICTOR) if preset == "full" else (_TINY_TALKER, _TINY_PREDICTOR)
    )
    predictor = {
        **predictor_geometry,
        "hidden_act": "silu",
        "max_position_embeddings": 65536,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000,
        "num_code_groups": 16,
    }
    talker = {
        "vocab_size": talker_geometry["vocab_size"],
        "hidden_size": talker_geometry["hidden_size"],
        "intermediate_size": talker_geometry["intermediate_size"],
        "num_hidden_layers": talker_geometry["num_hidden_layers"],
        "num_attention_heads": talker_geometry["num_attention_heads"],
        "num_key_value_heads": talker_geometry["num_key_value_heads"],
        "head_dim": talker_geometry["head_dim"],
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000,
        "rope_scaling": copy.deepcopy(talker_geometry["rope_scaling"]),
        "num_code_groups": 16,
        "text_hidden_size": talker_geometry["text_hidden_size"],
        "text_vocab_size": 151936,
        "position_id_per_seconds": 13,
        "codec_bos_id": 2149,
        "codec_eos_token_id": 2150,
        "codec_pad_id": 2148,
        "codec_think_id": 2154,
        "codec_nothink_id": 2155,
        "codec_think_bos_id": 2156,
        "codec_think_eos_id": 2157,
        "codec_language_id": dict(LANGUAGE_IDS),
        "spk_id": {},
        "spk_is_dialect": {},
        "code_predictor_config": predictor,
    }
    return {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
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
        "talker_config": talker,
    }


def speech_tokenizer_config_json(preset: Preset) -> dict[str, Any]:
    """``speech_tokenizer/config.json``; the encoder keeps the Mimi defaults (``{}``) as in the real file."""
    geometry = _FULL_DECODER if preset == "full" else _TINY_DECODER
    decoder = {
        **geometry,
        "num_quantizers": 16,
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000,
        "sliding_window": 72,
        "layer_scale_initial_scale": 0.01,
        "max_position_embeddings": 8000,
        "upsample_rates": [8, 5, 4, 3],
        "upsampling_ratios": [2, 2],
        "hidden_act": "silu",
        "attention_bias": False,
    }
    return {
        "model_type": "qwen3_tts_tokenizer_12hz",
        "decode_upsample_rate": 1920,
        "output_sample_rate": 24000,
        "encoder_valid_num_quantizers": 16,
        "encoder_config": {},
        "decoder_config": decoder,
    }


def preset_config(preset: Preset) -> VoiceDesignConfig:
    """The parsed ``VoiceDesignConfig`` of a preset, without touching the disk."""
    main = config_json(preset)
    return VoiceDesignConfig(
        im_start_token_id=main["im_start_token_id"],
        im_end_token_id=main["im_end_token_id"],
        assistant_token_id=main["assistant_token_id"],
        tts_pad_token_id=main["tts_pad_token_id"],
        tts_bos_token_id=main["tts_bos_token_id"],
        tts_eos_token_id=main["tts_eos_token_id"],
        talker=parse_talker_config(main["talker_config"], f"{preset}:config.json"),
        speech_decoder=parse_speech_decoder_config(speech_tokenizer_config_json(preset), f"{preset}:speech"),
        generation=parse_generation_defaults(GENERATION_CONFIG, f"{preset}:generation_config.json"),
    )


def mimi_encoder_tensors() -> dict[str, TensorSpec]:
    """The ``encoder.*`` tensors of the Mimi encoder with MimiConfig defaults (unused by VoiceDesign)."""
    specs: dict[str, tuple[int, ...]] = {}

    def conv(prefix: str, out_channels: int, in_channels: int, kernel: int, bias: bool = True) -> None:
        specs[f"{prefix}weight"] = (out_channels, in_channels, kernel)
        if bias:
            specs[f"{prefix}bias"] = (out_channels,)

    filters, hidden = 64, 512
    conv("encoder.encoder.layers.0.conv.", filters, 1, 7)
    for index, ratio in enumerate((4, 5, 6, 8)):  # reversed MimiConfig.upsampling_ratios
        channels, base = filters * 2**index, 1 + 3 * index
        conv(f"encoder.encoder.layers.{base}.block.1.conv.", channels // 2, channels, 3)
        conv(f"encoder.encoder.layers.{base}.block.3.conv.", channels, channels // 2, 1)
        conv(f"encoder.encoder.layers.{base + 2}.conv.", channels * 2, channels, 2 * ratio)
    conv("encoder.encoder.layers.14.conv.", hidden, filters * 16, 3)
    for index in range(8):
        layer = f"encoder.encoder_transformer.layers.{index}."
        for norm in ("input_layernorm", "post_attention_layernorm"):
            specs[f"{layer}{norm}.weight"] = (hidden,)
            specs[f"{layer}{norm}.bias"] = (hidden,)
        for projection in ("q_proj", "k_proj", "v_proj", "o_proj"):
            specs[f"{layer}self_attn.{projection}.weight"] = (hidden, hidden)
        specs[f"{layer}mlp.fc1.weight"] = (2048, hidden)
        specs[f"{layer}mlp.fc2.weight"] = (hidden, 2048)
        specs[f"{layer}self_attn_layer_scale.scale"] = (hidden,)
        specs[f"{layer}mlp_layer_scale.scale"] = (hidden,)
    conv("encoder.downsample.conv.", hidden, hidden, 4, bias=False)
    for quantizer, count in (("semantic", 1), ("acoustic", 31)):
        prefix = f"encoder.quantizer.{quantizer}_residual_vector_quantizer."
        specs[f"{prefix}input_proj.weight"] = (256, hidden, 1)
        specs[f"{prefix}output_proj.weight"] = (hidden, 256, 1)
        for number in range(count):
            specs[f"{prefix}layers.{number}.codebook.cluster_usage"] = (2048,)
            specs[f"{prefix}layers.{number}.codebook.embed_sum"] = (2048, 256)
            specs[f"{prefix}layers.{number}.codebook.initialized"] = (1,)
    return {name: (shape, "F32") for name, shape in specs.items()}


def planned_tensors(preset: Preset) -> tuple[dict[str, TensorSpec], dict[str, TensorSpec]]:
    """(model.safetensors, speech_tokenizer/model.safetensors) tensor specs that ``write`` will produce."""
    config = preset_config(preset)
    speech = dict(expected_speech_decoder_tensors(config))
    if preset == "full":
        speech.update(mimi_encoder_tensors())
    return expected_voice_design_tensors(config), speech


# ---------------------------------------------------------------------------------------------------------
# Text vocabulary

_CORPUS: tuple[str, ...] = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>",
    "<|im_start|>assistant\nHello, how can I help you today?<|im_end|>\n<|im_start|>assistant\n",
    "A warm, calm female voice speaking slowly, with a slight smile in her tone.",
    "A deep male voice, energetic and fast, like a sports commentator on the radio.",
    "The quick brown fox jumps over the lazy dog. It is 10:45 on 2024-05-17, and it costs $3.99.",
    "Good morning everyone, welcome to the show. Please read the following sentence out loud.",
    "今天天气很好，我们一起去公园散步吧。请用温柔的声音读这句话。",
    "一个年轻女性的声音，语速适中，语气开心，带着一点笑意。",
    "今日はとても良い天気ですね。ゆっくり話してください。こんにちは、世界。",
    "落ち着いた男性の声で、ニュースを読むように話します。",
    "안녕하세요, 만나서 반갑습니다. 오늘 날씨가 정말 좋네요.",
    "부드럽고 따뜻한 목소리로 천천히 말해 주세요.",
    "Guten Morgen! Wie geht es Ihnen heute? Die Stimme ist ruhig und freundlich.",
    "Bonjour tout le monde, je suis très heureux de vous voir aujourd'hui.",
    "Une voix douce et chaleureuse, qui parle lentement et avec le sourire.",
    "Привет, как дела? Сегодня прекрасная погода, давай пойдём гулять.",
    "Спокойный мужской голос, говорит медленно и уверенно.",
    "Olá, tudo bem? Hoje o dia está lindo e eu estou muito feliz.",
    "Uma voz feminina suave, falando devagar e com calma.",
    "¡Hola! ¿Cómo estás? Hoy hace un día precioso para pasear por la ciudad.",
    "Una voz masculina profunda y tranquila, que habla despacio.",
    "Ciao, come stai? Oggi è una bellissima giornata, andiamo al mare.",
    "Una voce femminile dolce e calda, che parla lentamente.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14159 42% #1 @home & more...",
    "Emoji and symbols: 😀 🎉 👍 ♪ ★ → ← © ® ™ — « » “quoted” ‘single’",
    "  leading spaces, trailing spaces   \n\n  and\ttabs\r\nand windows newlines\n",
    "I'm sure you're right, we'll see what they've done; it's what he'd say.",
)
_FORCED_WORDS: tuple[str, ...] = ("assistant", "user", "system")
_MAX_MERGES = 1500


def byte_level_alphabet() -> list[str]:
    """The 256 byte-level symbols in Qwen2's id order (GPT-2 ``bytes_to_unicode``): id i -> symbol."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    symbols = [chr(code) for code in printable]
    symbols += [chr(256 + index) for index in range(256 - len(printable))]
    return symbols


def _corpus_words() -> list[tuple[tuple[str, ...], int]]:
    pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    specials = re.compile("|".join(re.escape(content) for _, content, _ in QWEN3_TTS_ADDED_TOKENS))
    counts: Counter[str] = Counter()
    for line in _CORPUS:
        for segment in specials.split(unicodedata.normalize("NFC", line)):
            counts.update(piece for piece, _ in pre_tokenizer.pre_tokenize_str(segment))
    return [(tuple(word), count) for word, count in sorted(counts.items())]


def _apply_merge(words: list[tuple[tuple[str, ...], int]], pair: tuple[str, str]) -> None:
    merged = pair[0] + pair[1]
    for index, (symbols, count) in enumerate(words):
        if len(symbols) < 2:
            continue
        out: list[str] = []
        position = 0
        while position < len(symbols):
            if position + 1 < len(symbols) and (symbols[position], symbols[position + 1]) == pair:
                out.append(merged)
                position += 2
            else:
                out.append(symbols[position])
                position += 1
        if len(out) != len(symbols):
            words[index] = (tuple(out), count)


def demo_vocabulary() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A small deterministic byte-level BPE, padded to 151643 entries so the added tokens keep real ids.

    Merges: first chains that make ``assistant``, ``user`` and ``system`` single tokens (as in the real
    vocabulary, so the prompt's role slice [:3] means the same), then classic BPE on the built-in corpus
    (most frequent pair, ties broken by the pair's text). Fillers ``<unused_N>`` pad the id space; no
    merge produces them, so they are unreachable.
    """
    words = _corpus_words()
    merges: list[tuple[str, str]] = []
    for word in _FORCED_WORDS:
        current = word[0]
        for char in word[1:]:
            merges.append((current, char))
            current += char
    for pair in merges:
        _apply_merge(words, pair)
    seen = set(merges)
    while len(merges) < _MAX_MERGES:
        pairs: Counter[tuple[str, str]] = Counter()
        for symbols, count in words:
            for left, right in itertools.pairwise(symbols):
                pairs[(left, right)] += count
        candidates = [(count, pair) for pair, count in pairs.items() if pair not in seen and count >= 2]
        if not candidates:
            break
        best_count = max(count for count, _ in candidates)
        best = min(pair for count, pair in candidates if count == best_count)
        merges.append(best)
        seen.add(best)
        _apply_merge(words, best)

    vocab: dict[str, int] = {symbol: index for index, symbol in enumerate(byte_level_alphabet())}
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    filler = 0
    while len(vocab) < TEXT_VOCAB_BASE:
        vocab[f"<unused_{filler}>"] = len(vocab)
        filler += 1
    return vocab, merges


def tokenizer_config_json() -> dict[str, Any]:
    """``tokenizer_config.json`` in the form of the real Qwen3-TTS one (Qwen2Tokenizer, added tokens)."""
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(token_id): {
                "content": content,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": special,
            }
            for token_id, content, special in QWEN3_TTS_ADDED_TOKENS
        },
        "additional_special_tokens": [
            content
            for _, content, special in QWEN3_TTS_ADDED_TOKENS
            if special and content != "<|endoftext|>"
        ],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


# ---------------------------------------------------------------------------------------------------------
# Weights

_TORCH_DTYPES: dict[str, torch.dtype] = {"BF16": torch.bfloat16, "F32": torch.float32}
_CHUNK_ELEMENTS = 1 << 24  # rows are generated in blocks of about 16 M values (64 MB in float32)
_HEAD_GAIN = 3.0  # output heads: logits with std ~3, clearly non-uniform after top-k/temperature
_EOS_ROW_SCALE = 0.25  # codec_head EOS row: a small but non-zero logit, so EOS stays possible yet rare
_TRANSPOSED_CONV = re.compile(r"^decoder\.(upsample\.\d+\.0|decoder\.\d+\.block\.1)\.conv\.weight$")
_RESIDUAL_OUT_CONV = re.compile(r"^decoder\.decoder\.\d+\.block\.\d+\.conv2\.conv\.weight$")
_RESIDUAL_GAIN = 0.2  # residual units add a fraction of their input, so 12 of them do not blow up the signal
_WAVE_GAIN = 0.15  # final conv: keep the random waveform mostly inside [-1, 1] (little clipping)


def _generator(seed: int, name: str) -> torch.Generator:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))


def _normal(shape: tuple[int, ...], std: float, mean: float, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=generator, dtype=torch.float32).mul_(std).add_(mean)


def _std_for(name: str, shape: tuple[int, ...], config: VoiceDesignConfig) -> tuple[float, float]:
    """(mean, std) of the normal init of a tensor, chosen by its role so that no stage is degenerate."""
    if name.endswith(("norm.weight", "q_norm.weight", "k_norm.weight")):
        return 1.0, 0.1  # RMSNorm / LayerNorm gains near 1
    if name.endswith((".alpha", ".beta")):
        return 0.0, 0.1  # SnakeBeta log-parameters: exp(.) near 1
    if name.endswith(("layer_scale.scale", ".gamma")):
        return 0.1, 0.02  # LayerScale / ConvNeXt gamma: small but far from the degenerate 1e-6
    if name.endswith(".bias"):
        return 0.0, 0.02
    if "embedding" in name or name.endswith(("embedding_sum", "embed_sum")):
        return 0.0, 1.0
    if name.endswith(("codec_head.weight",)) or ".lm_head." in name:
        return 0.0, _HEAD_GAIN / math.sqrt(shape[-1])
    if len(shape) == 3:
        if _TRANSPOSED_CONV.match(name):
            fan_in = shape[0]  # an output sample sees in_channels x (kernel / stride) taps: x2 or x1
            if ".block." in name:
                fan_in *= 2
        else:
            fan_in = shape[1] * shape[2]
        if name == _final_conv_name(config):
            return 0.0, _WAVE_GAIN / math.sqrt(fan_in)
        if _RESIDUAL_OUT_CONV.match(name):
            return 0.0, _RESIDUAL_GAIN / math.sqrt(fan_in)
        return 0.0, 1.0 / math.sqrt(fan_in)
    return 0.0, 1.0 / math.sqrt(shape[-1])


def _final_conv_name(config: VoiceDesignConfig) -> str:
    return f"decoder.decoder.{len(config.speech_decoder.upsample_rates) + 2}.conv.weight"


def tensor_chunks(
    name: str, shape: tuple[int, ...], seed: int, config: VoiceDesignConfig
) -> Iterator[torch.Tensor]:
    """The float32 values of one tensor, in row blocks; a pure function of (seed, name, shape, config)."""
    generator = _generator(seed, name)
    if name.endswith("cluster_usage"):
        yield torch.rand(shape, generator=generator).add_(0.5)  # U(0.5, 1.5): positive
        return
    if name.endswith("codebook.initialized"):
        yield torch.ones(shape)
        return
    mean, std = _std_for(name, shape, config)
    if name == "talker.codec_head.weight":
        values = _normal(shape, std, mean, generator)
        values[config.talker.codec_eos_token_id].mul_(_EOS_ROW_SCALE)
        yield values
        return
    row_elements = math.prod(shape[1:]) if len(shape) > 1 else 1
    rows_per_chunk = max(1, _CHUNK_ELEMENTS // max(1, row_elements))
    for start in range(0, shape[0], rows_per_chunk):
        rows = min(rows_per_chunk, shape[0] - start)
        yield _normal((rows, *shape[1:]), std, mean, generator)


def write_safetensors(
    path: Path,
    specs: dict[str, TensorSpec],
    produce: Callable[[str, tuple[int, ...]], Iterator[torch.Tensor]],
    on_bytes: Callable[[int], None] | None = None,
) -> None:
    """Stream a safetensors file: header first, then each tensor's chunks cast to its dtype, in name order."""
    names = sorted(specs)
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in names:
        shape, dtype = specs[name]
        size = math.prod(shape) * DTYPE_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)  # keep the payload 8-byte aligned, as the reference writer does
    with path.open("wb") as handle:
        handle.write(struct.pack("<Q", len(encoded)))
        handle.write(encoded)
        for name in names:
            shape, dtype = specs[name]
            written = 0
            for chunk in produce(name, shape):
                data = chunk.to(_TORCH_DTYPES[dtype]).contiguous().view(torch.uint8).numpy().tobytes()
                handle.write(data)
                written += len(data)
                if on_bytes is not None:
                    on_bytes(len(data))
            expected = header[name]["data_offsets"][1] - header[name]["data_offsets"][0]
            if written != expected:
                raise RuntimeError(f"{name}: wrote {written} bytes, expected {expected}")


def planned_bytes(preset: Preset) -> int:
    """Total payload bytes of both safetensors files of a preset (for progress bars)."""
    model, speech = planned_tensors(preset)
    return sum(math.prod(shape) * DTYPE_BYTES[dtype] for shape, dtype in (*model.values(), *speech.values()))


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_tokenizer_files(root: Path) -> None:
    """Write the demo ``vocab.json``, ``merges.txt`` and ``tokenizer_config.json`` into ``root``."""
    vocab, merges = demo_vocabulary()
    (root / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    lines = ["#version: 0.2", *(f"{left} {right}" for left, right in merges)]
    (root / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    _write_json(root / "tokenizer_config.json", tokenizer_config_json())


def _fill_snapshot(root: Path, preset: Preset, seed: int, progress: ProgressCallback | None) -> None:
    config = preset_config(preset)
    model_specs, speech_specs = planned_tensors(preset)
    total = planned_bytes(preset)
    done = 0

    def advance(count: int) -> None:
        nonlocal done
        done += count
        if progress is not None:
            progress(done, total)

    def produce(name: str, shape: tuple[int, ...]) -> Iterator[torch.Tensor]:
        return tensor_chunks(name, shape, seed, config)

    _write_json(root / "config.json", config_json(preset))
    _write_json(root / "generation_config.json", GENERATION_CONFIG)
    _write_json(root / "preprocessor_config.json", PREPROCESSOR_CONFIG)
    write_tokenizer_files(root)
    speech_dir = root / SPEECH_TOKENIZER_DIR
    speech_dir.mkdir()
    _write_json(speech_dir / "config.json", speech_tokenizer_config_json(preset))
    _write_json(speech_dir / "preprocessor_config.json", SPEECH_PREPROCESSOR_CONFIG)
    _write_json(speech_dir / "configuration.json", MODELSCOPE_CONFIGURATION)
    write_safetensors(root / MODEL_FILE, model_specs, produce, advance)
    write_safetensors(speech_dir / "model.safetensors", speech_specs, produce, advance)
    write_manifest(build_manifest(root, random_repository(preset, seed)), root / MANIFEST_FILENAME)


def random_repository(preset: Preset, seed: int) -> str:
    """The manifest's repository name of a random snapshot (its revision is the content id)."""
    return f"local/random-{preset}-seed{seed}"


def write_random_snapshot(
    out_dir: str | Path, preset: Preset, seed: int, progress: ProgressCallback | None = None
) -> Path:
    """Write a random-weight snapshot to ``out_dir`` (absent or empty), atomically; returns its path.

    Everything is written into a temporary sibling directory first and renamed into place at the end.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    if not 0 <= seed < 2**63:
        raise ValueError(f"seed must be in [0, 2**63), got {seed}")
    target = Path(out_dir).absolute()
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise FileExistsError(f"{target} exists and is not an empty directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        _fill_snapshot(staging, preset, seed, progress)
        if target.exists():
            target.rmdir()
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target

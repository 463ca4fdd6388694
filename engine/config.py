"""Typed views of a snapshot's config.json, generation_config.json and speech_tokenizer/config.json.

Only the fields the engine uses are kept; parsing fails with a SnapshotError that names the file and
the key, so a broken snapshot is reported before any tensor is read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import SnapshotError

SAMPLE_RATE_HZ = 24_000
SAMPLES_PER_FRAME = 1920
FRAMES_PER_SECOND = SAMPLE_RATE_HZ / SAMPLES_PER_FRAME  # 12.5
LANGUAGES: tuple[str, ...] = (
    "auto",
    "chinese",
    "english",
    "japanese",
    "korean",
    "german",
    "french",
    "russian",
    "portuguese",
    "spanish",
    "italian",
)


@dataclass(frozen=True)
class CodePredictorConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    num_code_groups: int


@dataclass(frozen=True)
class TalkerConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    num_code_groups: int
    text_hidden_size: int
    text_vocab_size: int
    codec_bos_id: int
    codec_eos_token_id: int
    codec_pad_id: int
    codec_think_id: int
    codec_nothink_id: int
    codec_think_bos_id: int
    codec_think_eos_id: int
    codec_language_id: dict[str, int]
    code_predictor: CodePredictorConfig


@dataclass(frozen=True)
class SpeechDecoderConfig:
    codebook_size: int
    codebook_dim: int
    hidden_size: int
    latent_dim: int
    head_dim: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    num_hidden_layers: int
    num_quantizers: int
    rms_norm_eps: float
    rope_theta: float
    sliding_window: int
    layer_scale_initial_scale: float
    max_position_embeddings: int
    decoder_dim: int
    upsample_rates: tuple[int, ...]
    upsampling_ratios: tuple[int, ...]
    decode_upsample_rate: int
    output_sample_rate: int


@dataclass(frozen=True)
class GenerationDefaults:
    """generation_config.json: the sampling defaults of the official wrapper."""

    do_sample: bool
    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float
    max_new_tokens: int
    subtalker_dosample: bool
    subtalker_temperature: float
    subtalker_top_k: int
    subtalker_top_p: float


@dataclass(frozen=True)
class VoiceDesignConfig:
    """The whole model: talker (+ its code predictor), text-side special ids, codec, generation defaults."""

    im_start_token_id: int
    im_end_token_id: int
    assistant_token_id: int
    tts_pad_token_id: int
    tts_bos_token_id: int
    tts_eos_token_id: int
    talker: TalkerConfig
    speech_decoder: SpeechDecoderConfig
    generation: GenerationDefaults


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise SnapshotError(f"missing snapshot file: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SnapshotError(f"{path} is not valid JSON: {error}") from error
    if not isinstance(data, dict):
        raise SnapshotError(f"{path} must hold a JSON object")
    return data


def _pick(data: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in data:
        raise SnapshotError(f"{where}: missing key {key!r}")
    value = data[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind is int and isinstance(value, bool):
        raise SnapshotError(f"{where}: key {key!r} must be an integer")
    if not isinstance(value, kind):
        raise SnapshotError(f"{where}: key {key!r} must be {kind.__name__}, got {type(value).__name__}")
    return value


def _fields(cls: type, data: dict[str, Any], where: str, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    hints = {name: field.type for name, field in cls.__dataclass_fields__.items()}  # type: ignore[attr-defined]
    out: dict[str, Any] = {}
    for name, hint in hints.items():
        if name in skip:
            continue
        kind = {"int": int, "float": float, "bool": bool}.get(str(hint))
        if kind is not None:
            out[name] = _pick(data, name, kind, where)
    return out


def parse_code_predictor_config(data: dict[str, Any], where: str) -> CodePredictorConfig:
    return CodePredictorConfig(**_fields(CodePredictorConfig, data, where))


def parse_talker_config(data: dict[str, Any], where: str) -> TalkerConfig:
    predictor_data = _pick(data, "code_predictor_config", dict, where)
    languages = _pick(data, "codec_language_id", dict, where)
    for name, value in languages.items():
        if not isinstance(value, int):
            raise SnapshotError(f"{where}: codec_language_id[{name!r}] must be an integer")
    return TalkerConfig(
        **_fields(TalkerConfig, data, where),
        codec_language_id={name.lower(): value for name, value in languages.items()},
        code_predictor=parse_code_predictor_config(predictor_data, f"{where}.code_predictor_config"),
    )


def parse_speech_decoder_config(data: dict[str, Any], where: str) -> SpeechDecoderConfig:
    decoder = _pick(data, "decoder_config", dict, where)
    decoder_where = f"{where}.decoder_config"
    rates = _pick(decoder, "upsample_rates", list, decoder_where)
    ratios = _pick(decoder, "upsampling_ratios", list, decoder_where)
    merged = dict(decoder)
    merged["decode_upsample_rate"] = _pick(data, "decode_upsample_rate", int, where)
    merged["output_sample_rate"] = _pick(data, "output_sample_rate", int, where)
    config = SpeechDecoderConfig(
        **_fields(SpeechDecoderConfig, merged, decoder_where),
        upsample_rates=tuple(int(r) for r in rates),
        upsampling_ratios=tuple(int(r) for r in ratios),
    )
    hop = 1
    for rate in (*config.upsampling_ratios, *config.upsample_rates):
        hop *= rate
    if hop != config.decode_upsample_rate:
        raise SnapshotError(
            f"{where}: upsampling ratios multiply to {hop}, but decode_upsample_rate is "
            f"{config.decode_upsample_rate}"
        )
    return config


def parse_generation_defaults(data: dict[str, Any], where: str) -> GenerationDefaults:
    return GenerationDefaults(**_fields(GenerationDefaults, data, where))


def load_config(snapshot_dir: str | Path) -> VoiceDesignConfig:
    """Read and check the three config files of a snapshot directory."""
    root = Path(snapshot_dir)
    if not root.is_dir():
        raise SnapshotError(f"model snapshot directory does not exist: {root}")
    main = _read_json(root / "config.json")
    where = str(root / "config.json")
    if main.get("tts_model_type") != "voice_design":
        found = main.get("tts_model_type")
        raise SnapshotError(f"{where}: tts_model_type must be 'voice_design', got {found!r}")
    talker = parse_talker_config(_pick(main, "talker_config", dict, where), f"{where}.talker_config")
    tokenizer_path = root / "speech_tokenizer" / "config.json"
    speech = parse_speech_decoder_config(_read_json(tokenizer_path), str(tokenizer_path))
    generation_path = root / "generation_config.json"
    generation = parse_generation_defaults(_read_json(generation_path), str(generation_path))
    if speech.codebook_size != talker.code_predictor.vocab_size:
        raise SnapshotError(
            f"speech decoder codebook_size {speech.codebook_size} != code predictor vocab_size "
            f"{talker.code_predictor.vocab_size}"
        )
    return VoiceDesignConfig(
        **_fields(VoiceDesignConfig, main, where),
        talker=talker,
        speech_decoder=speech,
        generation=generation,
    )

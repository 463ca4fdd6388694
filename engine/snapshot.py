"""Expected tensor layout of a snapshot, header checks, and mmap'd loading of the weights.

The expected names, shapes and dtypes are derived from the config, so one check covers the real
1.7B snapshot and the tiny test preset. Every problem with a file (missing, truncated, wrong header,
missing / extra / mis-shaped / mis-typed tensors) is reported as one ``SnapshotError`` that lists all
offending tensors, so a broken snapshot is diagnosed in one go and never surfaces as a traceback.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from .config import SpeechDecoderConfig, VoiceDesignConfig
from .errors import SnapshotError

TensorSpec = tuple[tuple[int, ...], str]

MODEL_FILE = "model.safetensors"
SPEECH_TOKENIZER_DIR = "speech_tokenizer"
SPEECH_TOKENIZER_MODEL_FILE = f"{SPEECH_TOKENIZER_DIR}/model.safetensors"
SPEECH_ENCODER_PREFIX = "encoder."

DTYPE_BYTES: dict[str, int] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
_MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors library's own limit
_MAX_LISTED = 20


def expected_voice_design_tensors(config: VoiceDesignConfig) -> dict[str, TensorSpec]:
    """Name -> (shape, dtype) of every tensor in ``model.safetensors`` (talker + code predictor, BF16)."""
    talker = config.talker
    predictor = talker.code_predictor
    specs: dict[str, tuple[int, ...]] = {
        "talker.model.text_embedding.weight": (talker.text_vocab_size, talker.text_hidden_size),
        "talker.model.codec_embedding.weight": (talker.vocab_size, talker.hidden_size),
        "talker.model.norm.weight": (talker.hidden_size,),
        "talker.text_projection.linear_fc1.weight": (talker.text_hidden_size, talker.text_hidden_size),
        "talker.text_projection.linear_fc1.bias": (talker.text_hidden_size,),
        "talker.text_projection.linear_fc2.weight": (talker.hidden_size, talker.text_hidden_size),
        "talker.text_projection.linear_fc2.bias": (talker.hidden_size,),
        "talker.codec_head.weight": (talker.vocab_size, talker.hidden_size),
        "talker.code_predictor.model.norm.weight": (predictor.hidden_size,),
    }
    for index in range(talker.num_hidden_layers):
        specs.update(
            _decoder_layer(
                f"talker.model.layers.{index}.",
                talker.hidden_size,
                talker.intermediate_size,
                talker.num_attention_heads,
                talker.num_key_value_heads,
                talker.head_dim,
            )
        )
    for index in range(predictor.num_hidden_layers):
        specs.update(
            _decoder_layer(
                f"talker.code_predictor.model.layers.{index}.",
                predictor.hidden_size,
                predictor.intermediate_size,
                predictor.num_attention_heads,
                predictor.num_key_value_heads,
                predictor.head_dim,
            )
        )
    for group in range(predictor.num_code_groups - 1):
        specs[f"talker.code_predictor.model.codec_embedding.{group}.weight"] = (
            predictor.vocab_size,
            talker.hidden_size,
        )
        specs[f"talker.code_predictor.lm_head.{group}.weight"] = (predictor.vocab_size, predictor.hidden_size)
    if predictor.hidden_size != talker.hidden_size:  # the official code uses Identity otherwise
        specs["talker.code_predictor.small_to_mtp_projection.weight"] = (
            predictor.hidden_size,
            talker.hidden_size,
        )
        specs["talker.code_predictor.small_to_mtp_projection.bias"] = (predictor.hidden_size,)
    return {name: (shape, "BF16") for name, shape in specs.items()}


def _decoder_layer(
    prefix: str, hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int
) -> dict[str, tuple[int, ...]]:
    """One Qwen3 decoder block: q/k RMSNorm per head, SwiGLU MLP, no biases."""
    return {
        f"{prefix}input_layernorm.weight": (hidden,),
        f"{prefix}post_attention_layernorm.weight": (hidden,),
        f"{prefix}self_attn.q_proj.weight": (heads * head_dim, hidden),
        f"{prefix}self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
        f"{prefix}self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
        f"{prefix}self_attn.o_proj.weight": (hidden, heads * head_dim),
        f"{prefix}self_attn.q_norm.weight": (head_dim,),
        f"{prefix}self_attn.k_norm.weight": (head_dim,),
        f"{prefix}mlp.gate_proj.weight": (intermediate, hidden),
        f"{prefix}mlp.up_proj.weight": (intermediate, hidden),
        f"{prefix}mlp.down_proj.weight": (hidden, intermediate),
    }


def expected_speech_decoder_tensors(config: VoiceDesignConfig | SpeechDecoderConfig) -> dict[str, TensorSpec]:
    """Name -> (shape, dtype) of the ``decoder.*`` tensors of ``speech_tokenizer/model.safetensors`` (F32)."""
    decoder = config.speech_decoder if isinstance(config, VoiceDesignConfig) else config
    specs: dict[str, tuple[int, ...]] = {}
    rvq_dim = decoder.codebook_dim // 2
    for group, count in (("rvq_first", 1), ("rvq_rest", decoder.num_quantizers - 1)):
        prefix = f"decoder.quantizer.{group}."
        specs[f"{prefix}input_proj.weight"] = (rvq_dim, decoder.codebook_dim, 1)
        specs[f"{prefix}output_proj.weight"] = (decoder.codebook_dim, rvq_dim, 1)
        for number in range(count):
            specs[f"{prefix}vq.layers.{number}._codebook.cluster_usage"] = (decoder.codebook_size,)
            specs[f"{prefix}vq.layers.{number}._codebook.embedding_sum"] = (decoder.codebook_size, rvq_dim)
    specs.update(_conv("decoder.pre_conv.conv.", decoder.codebook_dim, decoder.latent_dim, 3))

    hidden = decoder.hidden_size
    attention = decoder.num_attention_heads * decoder.head_dim
    kv = decoder.num_key_value_heads * decoder.head_dim
    prefix = "decoder.pre_transformer."
    specs[f"{prefix}input_proj.weight"] = (hidden, decoder.latent_dim)
    specs[f"{prefix}input_proj.bias"] = (hidden,)
    specs[f"{prefix}output_proj.weight"] = (decoder.latent_dim, hidden)
    specs[f"{prefix}output_proj.bias"] = (decoder.latent_dim,)
    specs[f"{prefix}norm.weight"] = (hidden,)
    for index in range(decoder.num_hidden_layers):
        layer = f"{prefix}layers.{index}."
        specs.update(
            {
                f"{layer}input_layernorm.weight": (hidden,),
                f"{layer}post_attention_layernorm.weight": (hidden,),
                f"{layer}self_attn.q_proj.weight": (attention, hidden),
                f"{layer}self_attn.k_proj.weight": (kv, hidden),
                f"{layer}self_attn.v_proj.weight": (kv, hidden),
                f"{layer}self_attn.o_proj.weight": (hidden, attention),
                f"{layer}mlp.gate_proj.weight": (decoder.intermediate_size, hidden),
                f"{layer}mlp.up_proj.weight": (decoder.intermediate_size, hidden),
                f"{layer}mlp.down_proj.weight": (hidden, decoder.intermediate_size),
                f"{layer}self_attn_layer_scale.scale": (hidden,),
                f"{layer}mlp_layer_scale.scale": (hidden,),
            }
        )

    latent = decoder.latent_dim
    for index, factor in enumerate(decoder.upsampling_ratios):
        stage = f"decoder.upsample.{index}."
        specs.update(_conv(f"{stage}0.conv.", latent, latent, factor, transposed=True))
        specs.update(_conv(f"{stage}1.dwconv.conv.", 1, latent, 7))  # depthwise: weight [C, 1, 7]
        specs.update(
            {
                f"{stage}1.norm.weight": (latent,),
                f"{stage}1.norm.bias": (latent,),
                f"{stage}1.pwconv1.weight": (4 * latent, latent),
                f"{stage}1.pwconv1.bias": (4 * latent,),
                f"{stage}1.pwconv2.weight": (latent, 4 * latent),
                f"{stage}1.pwconv2.bias": (latent,),
                f"{stage}1.gamma": (latent,),
            }
        )

    specs.update(_conv("decoder.decoder.0.conv.", latent, decoder.decoder_dim, 7))
    for index, rate in enumerate(decoder.upsample_rates):
        in_dim = decoder.decoder_dim // 2**index
        out_dim = decoder.decoder_dim // 2 ** (index + 1)
        block = f"decoder.decoder.{index + 1}.block."
        specs.update(_snake(f"{block}0.", in_dim))
        specs.update(_conv(f"{block}1.conv.", in_dim, out_dim, 2 * rate, transposed=True))
        for unit in range(3):  # residual units at dilations 1, 3, 9
            unit_prefix = f"{block}{unit + 2}."
            specs.update(_snake(f"{unit_prefix}act1.", out_dim))
            specs.update(_conv(f"{unit_prefix}conv1.conv.", out_dim, out_dim, 7))
            specs.update(_snake(f"{unit_prefix}act2.", out_dim))
            specs.update(_conv(f"{unit_prefix}conv2.conv.", out_dim, out_dim, 1))
    output_dim = decoder.decoder_dim // 2 ** len(decoder.upsample_rates)
    tail = len(decoder.upsample_rates) + 1
    specs.update(_snake(f"decoder.decoder.{tail}.", output_dim))
    specs.update(_conv(f"decoder.decoder.{tail + 1}.conv.", output_dim, 1, 7))
    return {name: (shape, "F32") for name, shape in specs.items()}


def _conv(
    prefix: str, in_channels: int, out_channels: int, kernel: int, transposed: bool = False
) -> dict[str, tuple[int, ...]]:
    """Conv1d weight [out, in, k] (ConvTranspose1d: [in, out, k]) plus bias [out]."""
    weight = (in_channels, out_channels, kernel) if transposed else (out_channels, in_channels, kernel)
    return {f"{prefix}weight": weight, f"{prefix}bias": (out_channels,)}


def _snake(prefix: str, channels: int) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}alpha": (channels,), f"{prefix}beta": (channels,)}


@dataclass(frozen=True)
class HeaderEntry:
    """One tensor as declared in a safetensors header."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def read_safetensors_header(path: str | Path) -> dict[str, HeaderEntry]:
    """Parse and sanity-check a safetensors header without reading the payload.

    Checks what the safetensors library would otherwise report as an opaque error (or not at all until
    a tensor is read): the file is long enough, the header is JSON, every dtype is known, offsets are
    in bounds, and each byte range matches its shape and dtype.
    """
    file = Path(path)
    if not file.is_file():
        raise SnapshotError(f"missing snapshot file: {file}")
    size = file.stat().st_size
    with file.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise SnapshotError(f"{file} is truncated: {size} bytes, too short for a safetensors header")
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > _MAX_HEADER_BYTES or 8 + header_len > size:
            raise SnapshotError(
                f"{file} is truncated or not a safetensors file: header claims {header_len} bytes, "
                f"file has {size}"
            )
        raw = handle.read(header_len)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SnapshotError(f"{file} has a corrupt safetensors header: {error}") from error
    if not isinstance(header, dict):
        raise SnapshotError(f"{file} has a corrupt safetensors header: not a JSON object")
    payload = size - 8 - header_len
    entries: dict[str, HeaderEntry] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = str(info["dtype"])
            shape = tuple(int(dim) for dim in info["shape"])
            begin, end = (int(offset) for offset in info["data_offsets"])
        except (KeyError, TypeError, ValueError) as error:
            raise SnapshotError(f"{file}: malformed header entry for {name!r}") from error
        if dtype not in DTYPE_BYTES:
            raise SnapshotError(f"{file}: tensor {name!r} has unknown dtype {dtype!r}")
        numel = 1
        for dim in shape:
            numel *= dim
        if not 0 <= begin <= end <= payload or end - begin != numel * DTYPE_BYTES[dtype]:
            raise SnapshotError(
                f"{file} is truncated or corrupt: tensor {name!r} claims bytes [{begin}, {end}) of a "
                f"{payload}-byte payload for {dtype} {list(shape)}"
            )
        entries[name] = HeaderEntry(dtype, shape, begin, end)
    return entries


def _listed(label: str, items: list[str]) -> str:
    shown = "\n  ".join(items[:_MAX_LISTED])
    more = f"\n  ... and {len(items) - _MAX_LISTED} more" if len(items) > _MAX_LISTED else ""
    return f"{len(items)} {label}:\n  {shown}{more}"


def check_tensors(
    path: str | Path,
    header: dict[str, HeaderEntry],
    expected: dict[str, TensorSpec],
    ignored_prefixes: Iterable[str] = (),
) -> None:
    """Raise one SnapshotError listing every missing, extra, mis-shaped or mis-typed tensor."""
    ignored = tuple(ignored_prefixes)
    missing = sorted(name for name in expected if name not in header)
    extra = sorted(name for name in header if name not in expected and not name.startswith(ignored))
    wrong: list[str] = []
    for name in sorted(set(expected) & set(header)):
        shape, dtype = expected[name]
        entry = header[name]
        if entry.shape != shape or entry.dtype != dtype:
            wrong.append(f"{name}: {entry.dtype} {list(entry.shape)}, expected {dtype} {list(shape)}")
    problems = [
        _listed(label, items)
        for label, items in (
            ("missing tensors", missing),
            ("unexpected tensors", extra),
            ("tensors with the wrong shape or dtype", wrong),
        )
        if items
    ]
    if problems:
        raise SnapshotError(f"{path} does not match the config:\n" + "\n".join(problems))


def _load(
    path: Path,
    expected: dict[str, TensorSpec],
    ignored_prefixes: tuple[str, ...],
    dtype: torch.dtype,
    device: str | torch.device,
) -> dict[str, torch.Tensor]:
    header = read_safetensors_header(path)
    check_tensors(path, header, expected, ignored_prefixes)
    tensors: dict[str, torch.Tensor] = {}
    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:  # mmap'd, read tensor by tensor
            for name in expected:
                tensors[name] = handle.get_tensor(name).to(device=device, dtype=dtype)
    except (OSError, RuntimeError, ValueError, SafetensorError) as error:
        raise SnapshotError(f"cannot read {path}: {error}") from error
    return tensors


def load_voice_design_tensors(
    snapshot_dir: str | Path,
    config: VoiceDesignConfig,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
) -> dict[str, torch.Tensor]:
    """The checked tensors of ``model.safetensors``, cast to ``dtype`` on ``device``, keyed by real name."""
    return _load(Path(snapshot_dir) / MODEL_FILE, expected_voice_design_tensors(config), (), dtype, device)


def load_speech_decoder_tensors(
    snapshot_dir: str | Path,
    config: VoiceDesignConfig | SpeechDecoderConfig,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> dict[str, torch.Tensor]:
    """The checked ``decoder.*`` tensors of ``speech_tokenizer/model.safetensors`` (``encoder.*`` ignored)."""
    return _load(
        Path(snapshot_dir) / SPEECH_TOKENIZER_MODEL_FILE,
        expected_speech_decoder_tensors(config),
        (SPEECH_ENCODER_PREFIX,),
        dtype,
        device,
    )

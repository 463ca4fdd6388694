"""Expected tensor specs, header checks and loading; every bad snapshot is one clear SnapshotError."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from qwen3_tts_native.engine.checkpoint import preset_config, write_random_snapshot
from qwen3_tts_native.engine.config import load_config
from qwen3_tts_native.engine.errors import SnapshotError
from qwen3_tts_native.engine.snapshot import (
    expected_speech_decoder_tensors,
    expected_voice_design_tensors,
    load_speech_decoder_tensors,
    load_voice_design_tensors,
    read_safetensors_header,
)

DATA = Path(__file__).resolve().parents[1] / "data"


def _inventory(name: str) -> dict[str, tuple[tuple[int, ...], str]]:
    tensors = json.loads((DATA / name).read_text(encoding="utf-8"))["tensors"]
    return {t["name"]: (tuple(t["shape"]), t["dtype"]) for t in tensors}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_snapshot(tmp_path_factory.mktemp("snap") / "tiny", "tiny", seed=7)


@pytest.fixture
def tiny_copy(tiny: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny, tmp_path / "copy"))


def test_expected_specs_of_the_real_config_equal_the_inventories() -> None:
    config = load_config(DATA / "reference_model")
    assert expected_voice_design_tensors(config) == _inventory("voice-design-model-inventory.json")
    decoder = {
        k: v
        for k, v in _inventory("speech-tokenizer-model-inventory.json").items()
        if k.startswith("decoder.")
    }
    assert expected_speech_decoder_tensors(config) == decoder
    assert expected_speech_decoder_tensors(config.speech_decoder) == decoder


def test_tiny_loads_cast_to_the_requested_dtype(tiny: Path) -> None:
    config = load_config(tiny)
    tensors = load_voice_design_tensors(tiny, config, torch.float32)
    expected = expected_voice_design_tensors(config)
    assert set(tensors) == set(expected)
    for name, tensor in tensors.items():
        assert tuple(tensor.shape) == expected[name][0] and tensor.dtype == torch.float32
    assert tensors["talker.model.layers.0.self_attn.q_proj.weight"].shape == (64, 64)
    decoder = load_speech_decoder_tensors(tiny, config, torch.bfloat16)
    assert set(decoder) == set(expected_speech_decoder_tensors(config))
    assert all(t.dtype == torch.bfloat16 for t in decoder.values())


def test_encoder_tensors_are_ignored(tiny_copy: Path) -> None:
    config = load_config(tiny_copy)
    path = tiny_copy / "speech_tokenizer" / "model.safetensors"
    tensors = load_speech_decoder_tensors(tiny_copy, config)
    tensors["encoder.downsample.conv.weight"] = torch.zeros(4, 4, 4)
    save_file(tensors, str(path))
    assert "encoder.downsample.conv.weight" not in load_speech_decoder_tensors(tiny_copy, config)


def test_missing_extra_and_misshaped_tensors_are_all_named(tiny_copy: Path) -> None:
    config = load_config(tiny_copy)
    tensors = {k: v.to(torch.bfloat16) for k, v in load_voice_design_tensors(tiny_copy, config).items()}
    del tensors["talker.codec_head.weight"]
    del tensors["talker.model.norm.weight"]
    tensors["talker.model.layers.1.mlp.up_proj.weight"] = torch.zeros(3, 3, dtype=torch.bfloat16)
    tensors["talker.extra.weight"] = torch.zeros(1, dtype=torch.bfloat16)
    tensors["talker.model.norm2.weight"] = torch.zeros(1, dtype=torch.bfloat16)
    save_file(tensors, str(tiny_copy / "model.safetensors"))
    with pytest.raises(SnapshotError) as error:
        load_voice_design_tensors(tiny_copy, config)
    message = str(error.value)
    for fragment in (
        "2 missing tensors",
        "talker.codec_head.weight",
        "talker.model.norm.weight",
        "2 unexpected tensors",
        "talker.extra.weight",
        "talker.model.norm2.weight",
        "wrong shape or dtype",
        "talker.model.layers.1.mlp.up_proj.weight: BF16 [3, 3]",
    ):
        assert fragment in message


def test_wrong_dtype_is_reported(tiny_copy: Path) -> None:
    config = load_config(tiny_copy)
    tensors = load_voice_design_tensors(tiny_copy, config, torch.float32)
    save_file(tensors, str(tiny_copy / "model.safetensors"))
    with pytest.raises(
        SnapshotError, match=r"lm_head.0.weight: F32 \[2048, 32\], expected BF16 \[2048, 32\]"
    ):
        load_voice_design_tensors(tiny_copy, config)


def test_long_lists_are_capped(tiny_copy: Path) -> None:
    save_file({"unrelated": torch.zeros(1)}, str(tiny_copy / "model.safetensors"))
    with pytest.raises(SnapshotError) as error:
        load_voice_design_tensors(tiny_copy, load_config(tiny_copy))
    assert "missing tensors" in str(error.value) and "... and" in str(error.value)


@pytest.mark.parametrize("keep", [0, 5, 100, 1000])
def test_truncated_file_is_a_snapshot_error(tiny_copy: Path, keep: int) -> None:
    path = tiny_copy / "model.safetensors"
    path.write_bytes(path.read_bytes()[:keep])
    with pytest.raises(SnapshotError, match="truncated"):
        load_voice_design_tensors(tiny_copy, load_config(tiny_copy))


def test_truncated_payload_is_a_snapshot_error(tiny_copy: Path) -> None:
    path = tiny_copy / "speech_tokenizer" / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(SnapshotError, match="truncated or corrupt"):
        load_speech_decoder_tensors(tiny_copy, load_config(tiny_copy))


def test_garbage_header_is_a_snapshot_error(tiny_copy: Path) -> None:
    path = tiny_copy / "model.safetensors"
    path.write_bytes(struct.pack("<Q", 8) + b"not json" + b"\0" * 64)
    with pytest.raises(SnapshotError, match="corrupt safetensors header"):
        read_safetensors_header(path)


def test_missing_file_is_a_snapshot_error(tiny_copy: Path) -> None:
    (tiny_copy / "model.safetensors").unlink()
    with pytest.raises(SnapshotError, match="missing snapshot file"):
        load_voice_design_tensors(tiny_copy, preset_config("tiny"))

"""Random snapshots: real layout, determinism, non-degenerate weights, official loader, full-size headers."""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import shutil
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from qwen3_tts_native.engine.checkpoint import (
    GENERATION_CONFIG,
    config_json,
    planned_tensors,
    random_repository,
    speech_tokenizer_config_json,
    write_random_snapshot,
)
from qwen3_tts_native.engine.config import load_config
from qwen3_tts_native.engine.identity import MANIFEST_FILENAME, load_manifest, verify_snapshot_for_serving
from qwen3_tts_native.engine.snapshot import (
    load_speech_decoder_tensors,
    load_voice_design_tensors,
    read_safetensors_header,
)
from qwen3_tts_native.engine.tokenizer import TextTokenizer

DATA = Path(__file__).resolve().parents[1] / "data"
SNAPSHOT_FILES = {
    "config.json",
    "generation_config.json",
    "preprocessor_config.json",
    "vocab.json",
    "merges.txt",
    "tokenizer_config.json",
    "model.safetensors",
    "speech_tokenizer/config.json",
    "speech_tokenizer/preprocessor_config.json",
    "speech_tokenizer/configuration.json",
    "speech_tokenizer/model.safetensors",
    MANIFEST_FILENAME,
}


def _inventory(name: str) -> dict[str, Any]:
    return json.loads((DATA / name).read_text(encoding="utf-8"))


def _specs(inventory: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], str]]:
    return {t["name"]: (tuple(t["shape"]), t["dtype"]) for t in inventory["tensors"]}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_snapshot(tmp_path_factory.mktemp("ckpt") / "tiny", "tiny", seed=3)


def test_full_plan_equals_the_inventories() -> None:
    model, speech = planned_tensors("full")
    assert model == _specs(_inventory("voice-design-model-inventory.json"))
    assert speech == _specs(_inventory("speech-tokenizer-model-inventory.json"))


def test_full_configs_equal_the_reference_files() -> None:
    reference = DATA / "reference_model"
    assert config_json("full") == json.loads((reference / "config.json").read_text(encoding="utf-8"))
    generation = json.loads((reference / "generation_config.json").read_text(encoding="utf-8"))
    assert generation == GENERATION_CONFIG
    speech = json.loads((reference / "speech_tokenizer" / "config.json").read_text(encoding="utf-8"))
    assert speech_tokenizer_config_json("full") == speech


def test_tiny_layout_and_configs(tiny: Path) -> None:
    files = {str(p.relative_to(tiny)) for p in tiny.rglob("*") if p.is_file()}
    assert files == SNAPSHOT_FILES
    main = json.loads((tiny / "config.json").read_text(encoding="utf-8"))
    assert "speaker_encoder_config" not in main and "transformers_version" not in main
    config = load_config(tiny)
    assert config.talker.hidden_size == 64 and config.talker.code_predictor.hidden_size == 32
    assert config.speech_decoder.decode_upsample_rate == 1920
    preprocessor = json.loads((tiny / "speech_tokenizer" / "preprocessor_config.json").read_text())
    assert preprocessor["feature_extractor_type"] == "EncodecFeatureExtractor"
    assert preprocessor["sampling_rate"] == 24000 and preprocessor["feature_size"] == 1
    assert not any(p.name.startswith(".") for p in tiny.parent.iterdir())  # no staging dir left behind


def test_tiny_headers_match_the_plan(tiny: Path) -> None:
    model, speech = planned_tensors("tiny")
    for path, plan in (
        (tiny / "model.safetensors", model),
        (tiny / "speech_tokenizer/model.safetensors", speech),
    ):
        header = read_safetensors_header(path)
        assert {name: (entry.shape, entry.dtype) for name, entry in header.items()} == plan


def test_same_seed_same_bytes_other_seed_other_weights(tiny: Path, tmp_path: Path) -> None:
    again = write_random_snapshot(tmp_path / "again", "tiny", seed=3)
    names = ("model.safetensors", "speech_tokenizer/model.safetensors", "vocab.json", "merges.txt")
    for name in (*names, MANIFEST_FILENAME):
        assert _sha256(tiny / name) == _sha256(again / name), name
    other = write_random_snapshot(tmp_path / "other", "tiny", seed=4)
    assert _sha256(tiny / "model.safetensors") != _sha256(other / "model.safetensors")
    assert _sha256(tiny / "vocab.json") == _sha256(other / "vocab.json")


def test_weights_are_not_degenerate(tiny: Path) -> None:
    config = load_config(tiny)
    talker = load_voice_design_tensors(tiny, config, torch.float32)
    codec = load_speech_decoder_tensors(tiny, config, torch.float32)
    for name, tensor in {**talker, **codec}.items():
        if tensor.numel() > 1:
            assert float(tensor.std()) > 0, name
    usage = [t for n, t in codec.items() if n.endswith("cluster_usage")]
    assert len(usage) == 16 and all(bool((t > 0.4).all()) for t in usage)
    assert 0.8 < float(codec["decoder.quantizer.rvq_first.vq.layers.0._codebook.embedding_sum"].std()) < 1.2
    snake = [t for n, t in codec.items() if n.endswith((".alpha", ".beta"))]
    assert all(float(t.abs().max()) < 1.0 for t in snake)
    assert 0.8 < float(talker["talker.model.norm.weight"].mean()) < 1.2
    head = talker["talker.codec_head.weight"]
    eos = config.talker.codec_eos_token_id
    assert 0 < float(head[eos].std()) < float(head[:2048].std())  # EOS possible but unlikely


def test_manifest_describes_the_snapshot_and_passes_the_serving_check(tiny: Path) -> None:
    manifest = load_manifest(tiny / MANIFEST_FILENAME)
    assert manifest.repository == random_repository("tiny", 3) == "local/random-tiny-seed3"
    assert manifest.revision.startswith("sha256:")
    assert {entry.path for entry in manifest.files} == SNAPSHOT_FILES - {MANIFEST_FILENAME}
    result = verify_snapshot_for_serving(tiny)
    assert result.ok, result.problems
    assert result.manifest == manifest and result.manifest_source == str(tiny / MANIFEST_FILENAME)


def test_refuses_a_non_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("keep me")
    with pytest.raises(FileExistsError):
        write_random_snapshot(tmp_path, "tiny", seed=0)
    assert (tmp_path / "x").read_text() == "keep me"


def test_engine_tokenizer_loads_the_tiny_snapshot(tiny: Path) -> None:
    tokenizer = TextTokenizer.from_snapshot(tiny)
    assert tokenizer.encode("<|im_start|>assistant\n")[0] == 151644


def _import_official() -> types.ModuleType:
    """Import qwen_tts without torchaudio: stub modules with a __spec__ (model.md §7.1)."""
    for name in ("torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi"):
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__spec__ = importlib.machinery.ModuleSpec(name, None)
            sys.modules[name] = module
    return pytest.importorskip("qwen_tts")


@pytest.mark.parity
def test_official_package_loads_and_generates(tiny: Path) -> None:
    qwen_tts = _import_official()
    model = qwen_tts.Qwen3TTSModel.from_pretrained(
        str(tiny), dtype=torch.float32, device_map="cpu", attn_implementation="sdpa"
    )
    captured: list[list[torch.Tensor]] = []
    generate = model.model.generate

    def capture(*args: Any, **kwargs: Any) -> Any:
        codes, hidden = generate(*args, **kwargs)
        captured.append(codes)
        return codes, hidden

    model.model.generate = capture
    wavs, sample_rate = model.generate_voice_design(
        text="Hello world, this is a test.",
        instruct="A calm voice.",
        language="English",
        do_sample=False,
        subtalker_dosample=False,
        max_new_tokens=8,
    )
    assert sample_rate == 24000
    codes = captured[0][0]
    assert tuple(codes.shape) == (7, 16)  # N sampled cb0 without EOS give N-1 frames
    assert len(set(codes[:, 0].tolist())) > 1 and len(set(codes[0].tolist())) > 1
    wave = torch.as_tensor(wavs[0])
    assert wave.shape == (7 * 1920,)
    assert 0.05 < float(wave.std()) < 0.9
    assert float((wave.abs() >= 0.999).float().mean()) < 0.05  # audible noise, not a clipped square wave


@pytest.mark.slow
def test_full_snapshot_headers_equal_the_inventories(tmp_path: Path) -> None:
    out = write_random_snapshot(tmp_path / "full", "full", seed=0)
    try:
        _check_full(out)
    finally:
        shutil.rmtree(out)  # 4.5 GB: do not leave it in pytest's kept temp directories


def _check_full(out: Path) -> None:
    for file, inventory_name in (
        ("model.safetensors", "voice-design-model-inventory.json"),
        ("speech_tokenizer/model.safetensors", "speech-tokenizer-model-inventory.json"),
    ):
        inventory = _inventory(inventory_name)
        header = read_safetensors_header(out / file)
        assert {name: (entry.shape, entry.dtype) for name, entry in header.items()} == _specs(inventory)
        assert sum(entry.end - entry.begin for entry in header.values()) == inventory["payload_bytes"]
    config = load_config(out)
    assert config.talker.num_hidden_layers == 28

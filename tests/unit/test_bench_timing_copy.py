"""`qwen3-tts bench`'s timing copy of a snapshot: the EOS row of the talker's codec head zeroed, nothing else
changed, made once."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from qwen3_tts_native.commands.bench import EOS_TENSOR, zero_eos_copy
from qwen3_tts_native.engine.checkpoint import write_random_snapshot
from qwen3_tts_native.engine.config import load_config


def test_zero_eos_copy_zeroes_only_the_eos_row_and_is_made_once(tmp_path: Path) -> None:
    snapshot = write_random_snapshot(tmp_path / "tiny", "tiny", 0)
    copy = zero_eos_copy(snapshot)
    assert copy == tmp_path / "tiny-noeos"
    eos = load_config(snapshot).talker.codec_eos_token_id
    original = load_file(snapshot / "model.safetensors")
    copied = load_file(copy / "model.safetensors")
    assert original.keys() == copied.keys()
    assert bool(original[EOS_TENSOR][eos].ne(0).any())
    assert bool(copied[EOS_TENSOR][eos].eq(0).all())
    others = torch.ones(original[EOS_TENSOR].shape[0], dtype=torch.bool)
    others[eos] = False
    assert torch.equal(copied[EOS_TENSOR][others], original[EOS_TENSOR][others])
    for name in original.keys() - {EOS_TENSOR}:
        assert torch.equal(copied[name], original[name])
    for path in snapshot.rglob("*"):
        if path.is_file() and path.name != "model.safetensors":
            assert (copy / path.relative_to(snapshot)).read_bytes() == path.read_bytes()
    written = (copy / "model.safetensors").stat().st_mtime_ns
    assert zero_eos_copy(snapshot) == copy
    assert (copy / "model.safetensors").stat().st_mtime_ns == written

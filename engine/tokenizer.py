"""The Qwen2 byte-level BPE text tokenizer, built from a snapshot's vocab.json + merges.txt.

The snapshot ships no tokenizer.json, so the fast tokenizer is assembled here exactly the way
transformers' ``Qwen2Converter`` assembles ``Qwen2TokenizerFast``: NFC normalisation, the plain Qwen2
pre-tokenizer regex (never the "Mistral fix" regex that ``fix_mistral_regex=True`` swaps in, see
model.md §8.4), byte-level mapping without a prefix space, and the added tokens of
``tokenizer_config.json`` at the ids listed in its ``added_tokens_decoder``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from .errors import SnapshotError

QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
    r"""\s*[\r\n]+|\s+(?!\S)|\s+"""
)

VOCAB_FILE = "vocab.json"
MERGES_FILE = "merges.txt"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"


def _read_vocab(path: Path) -> dict[str, int]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise SnapshotError(f"missing tokenizer file: {path}") from error
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SnapshotError(f"{path} is not valid JSON: {error}") from error
    if not isinstance(data, dict) or not all(
        isinstance(key, str) and isinstance(value, int) and not isinstance(value, bool)
        for key, value in data.items()
    ):
        raise SnapshotError(f"{path} must map token strings to integer ids")
    return data


def _read_merges(path: Path) -> list[tuple[str, str]]:
    """Parse merges.txt the way the slow Qwen2Tokenizer does (skip a '#version' first line and blanks)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError as error:
        raise SnapshotError(f"missing tokenizer file: {path}") from error
    except UnicodeDecodeError as error:
        raise SnapshotError(f"{path} is not UTF-8: {error}") from error
    merges: dict[tuple[str, str], None] = {}
    for number, raw in enumerate(lines):
        line = raw.strip()
        if (number == 0 and line.startswith("#version:")) or not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise SnapshotError(f"{path}:{number + 1}: a merge must be two tokens, got {line!r}")
        merges.setdefault((parts[0], parts[1]), None)
    return list(merges)


def _read_added_tokens(path: Path) -> list[tuple[int, AddedToken]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise SnapshotError(f"missing tokenizer file: {path}") from error
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SnapshotError(f"{path} is not valid JSON: {error}") from error
    decoder = data.get("added_tokens_decoder", {}) if isinstance(data, dict) else None
    if not isinstance(decoder, dict):
        raise SnapshotError(f"{path}: added_tokens_decoder must be an object")
    tokens: list[tuple[int, AddedToken]] = []
    for key, entry in decoder.items():
        if not key.isdigit() or not isinstance(entry, dict) or not isinstance(entry.get("content"), str):
            raise SnapshotError(f"{path}: bad added_tokens_decoder entry {key!r}")
        flags: dict[str, Any] = {
            name: bool(entry.get(name, False)) for name in ("single_word", "lstrip", "rstrip", "normalized")
        }
        special = bool(entry.get("special", False))
        tokens.append((int(key), AddedToken(entry["content"], special=special, **flags)))
    return sorted(tokens, key=lambda item: item[0])


def _base_tokenizer(vocab: dict[str, int], merges: list[tuple[str, str]]) -> Tokenizer:
    """BPE + normaliser + pre-tokenizer + decoder, with no added tokens."""
    tokenizer = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


class TextTokenizer:
    """Qwen2 BPE with two encoders: one that recognises added tokens and one that never does.

    ``encode`` matches transformers' ``Qwen2TokenizerFast`` (special tokens such as ``<|im_start|>`` are
    single ids). ``encode_plain`` runs the same BPE on a tokenizer that has no added tokens at all, so
    user text containing ``<|im_end|>`` or ``<think>`` is split into ordinary byte-level pieces and can
    never inject a control token into the prompt.
    """

    def __init__(
        self,
        vocab: dict[str, int],
        merges: list[tuple[str, str]],
        added: list[tuple[int, AddedToken]],
        where: str = "tokenizer",
    ) -> None:
        self._plain = _base_tokenizer(vocab, merges)
        self._full = Tokenizer.from_str(self._plain.to_str())
        self._added_ids: dict[str, int] = {}
        for token_id, token in added:
            if token.special:
                self._full.add_special_tokens([token])
            else:
                self._full.add_tokens([token])
            actual = self._full.token_to_id(token.content)
            if actual != token_id:
                raise SnapshotError(
                    f"{where}: added token {token.content!r} should have id {token_id} but lands at "
                    f"{actual}; vocab.json must hold exactly the ids below the first added token"
                )
            self._added_ids[token.content] = token_id

    @classmethod
    def from_files(
        cls, vocab_path: str | Path, merges_path: str | Path, tokenizer_config_path: str | Path
    ) -> TextTokenizer:
        return cls(
            _read_vocab(Path(vocab_path)),
            _read_merges(Path(merges_path)),
            _read_added_tokens(Path(tokenizer_config_path)),
            where=str(Path(tokenizer_config_path)),
        )

    @classmethod
    def from_snapshot(cls, snapshot_dir: str | Path) -> TextTokenizer:
        """Build from ``vocab.json``, ``merges.txt`` and ``tokenizer_config.json`` of a snapshot."""
        root = Path(snapshot_dir)
        return cls.from_files(root / VOCAB_FILE, root / MERGES_FILE, root / TOKENIZER_CONFIG_FILE)

    def encode(self, text: str) -> list[int]:
        """Token ids with added/special tokens recognised (identical to ``Qwen2TokenizerFast``)."""
        return list(self._full.encode(text, add_special_tokens=False).ids)

    def encode_plain(self, text: str) -> list[int]:
        """Token ids with no added token recognised: ``<|im_end|>`` becomes ordinary text pieces."""
        return list(self._plain.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self._full.decode(ids, skip_special_tokens=False))

    def token_id(self, token: str) -> int:
        """The id of an added token (e.g. ``<|im_start|>``); KeyError if the snapshot lacks it."""
        return self._added_ids[token]

    @property
    def added_tokens(self) -> dict[str, int]:
        return dict(self._added_ids)

    @property
    def vocab_size(self) -> int:
        return int(self._full.get_vocab_size(with_added_tokens=True))

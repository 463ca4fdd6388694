"""Turn a request (text, voice description, language, text mode) into the token ids of the prompt.

Mirrors ``Qwen3TTSModel.generate_voice_design`` (model.md §2.3): the assistant string
``<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n`` is tokenized as a whole and
then sliced by position ([:3] role, [3:-5] text), because BPE may merge the role's newline with the
start of the text. The instruct string ``<|im_start|>user\\n{instruct}<|im_end|>\\n`` is kept whole.

Sanitising: the user's text and description are encoded with ``TextTokenizer.encode_plain`` (no added
token is recognised), while the template's own control tokens are encoded with ``encode``. Added tokens
always split the string into independently tokenized segments, so for text without control-token
strings the ids equal those of tokenizing the whole string at once; for text that contains e.g.
``<|im_end|>`` the string is tokenized as literal characters instead of closing the turn early.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .config import VoiceDesignConfig
from .errors import InvalidRequestError
from .tokenizer import TextTokenizer

TextMode = Literal["non_streaming", "streaming"]
TEXT_MODES: tuple[str, ...] = ("non_streaming", "streaming")

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"


@dataclass(frozen=True)
class PromptPlan:
    """Token ids of one request's prompt; the talker turns them into embeddings (model.md §2.4)."""

    instruct_ids: list[int] = field(hash=False)
    role_ids: list[int] = field(hash=False)
    text_ids: list[int] = field(hash=False)
    language_id: int | None
    text_mode: TextMode


def accepted_languages(config: VoiceDesignConfig) -> tuple[str, ...]:
    """``auto`` plus every language of the snapshot's ``codec_language_id`` (lower case)."""
    return ("auto", *config.talker.codec_language_id)


def resolve_language(config: VoiceDesignConfig, language: str) -> int | None:
    """Codec id of a language name (case-insensitive); None for ``auto``."""
    name = language.strip().lower() if isinstance(language, str) else ""
    if name == "auto":
        return None
    if name in config.talker.codec_language_id:
        return config.talker.codec_language_id[name]
    raise InvalidRequestError(
        f"unknown language {language!r}; accepted (case-insensitive): {', '.join(accepted_languages(config))}"
    )


def _turn_ids(tokenizer: TextTokenizer, role: str, content: str, closing: str) -> list[int]:
    """``<|im_start|>{role}\\n{content}<|im_end|>{closing}`` with ``content`` sanitised."""
    return [
        tokenizer.token_id(IM_START),
        *tokenizer.encode_plain(f"{role}\n{content}"),
        tokenizer.token_id(IM_END),
        *tokenizer.encode(closing),
    ]


def build_prompt_plan(
    tokenizer: TextTokenizer,
    config: VoiceDesignConfig,
    text: str,
    voice_description: str,
    language: str,
    text_mode: str,
) -> PromptPlan:
    """Validate a request and tokenize its prompt.

    Raises ``InvalidRequestError`` for empty or whitespace-only text, an unknown language or text mode.
    An empty voice description means no instruct block at all, as in the official wrapper.
    """
    if not isinstance(text, str) or not text.strip():
        raise InvalidRequestError("text must not be empty or only whitespace")
    if not isinstance(voice_description, str):
        raise InvalidRequestError("voice_description must be a string")
    if text_mode not in TEXT_MODES:
        raise InvalidRequestError(f"unknown text_mode {text_mode!r}; accepted: {', '.join(TEXT_MODES)}")
    language_id = resolve_language(config, language)

    assistant = _turn_ids(tokenizer, "assistant", text, f"\n{IM_START}assistant\n")
    role_ids, text_ids = assistant[:3], assistant[3:-5]
    instruct_ids = _turn_ids(tokenizer, "user", voice_description, "\n") if voice_description else []
    mode: TextMode = "streaming" if text_mode == "streaming" else "non_streaming"
    return PromptPlan(
        instruct_ids=instruct_ids,
        role_ids=role_ids,
        text_ids=text_ids,
        language_id=language_id,
        text_mode=mode,
    )

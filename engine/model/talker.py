"""The talker: a Qwen3 decoder over text + codec embeddings that predicts codebook 0 of each frame.

Built straight from the checkpoint's tensor names (`talker.model.*`, `talker.text_projection.*`,
`talker.codec_head.*`). It also holds the 15 predictor codec tables
(`talker.code_predictor.model.codec_embedding.{j}`), because the talker's per-frame input sums them
(model.md §2.5); the tensors are shared with `CodePredictor`, not copied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import VoiceDesignConfig
from ..transfer import upload
from .layers import (
    AttentionImpl,
    BlockShape,
    DecoderBlock,
    KVCache,
    Linear,
    RMSNorm,
    rope_cos_sin,
    summed_embeddings,
)


class PromptPlanLike(Protocol):
    """The fields of `engine.prompt.PromptPlan` that the talker reads (docs/architecture.md)."""

    @property
    def instruct_ids(self) -> list[int]: ...
    @property
    def role_ids(self) -> list[int]: ...
    @property
    def text_ids(self) -> list[int]: ...
    @property
    def language_id(self) -> int | None: ...
    @property
    def text_mode(self) -> Literal["non_streaming", "streaming"]: ...


FixedPromptKey = tuple[torch.device, tuple[int, ...], int | None]
"""(device, role ids, language id): what `Talker.fixed_prompt_pieces` depends on."""
FIXED_PROMPT_KEYS = 64
"""The most (device, role ids, language) entries `Talker.fixed_prompt_pieces` keeps."""


@dataclass(frozen=True)
class FixedPromptPieces:
    """The request-independent parts of a prompt (model.md §2.4), each [n, H]: the role prefix's text
    embedding, the codec prefix (tts_pad.. tts_bos over the think / language tags + codec_pad), the tts_eos
    and tts_pad text embeddings, and the codec_pad and codec_bos embeddings."""

    role: Tensor
    codec_prefix: Tensor
    tts_eos: Tensor
    tts_pad: Tensor
    codec_pad: Tensor
    codec_bos: Tensor


class Talker(nn.Module):
    rope_cos: Tensor  # [positions, head_dim] table, gathered per position (see rope_cos_sin)
    rope_sin: Tensor

    def __init__(
        self, config: VoiceDesignConfig, tensors: dict[str, Tensor], *, attention: AttentionImpl = "eager"
    ) -> None:
        super().__init__()
        self.config = config
        tc = config.talker
        self.shape = BlockShape(tc.num_attention_heads, tc.num_key_value_heads, tc.head_dim, tc.rms_norm_eps)
        self.layers = nn.ModuleList(
            DecoderBlock(self.shape, tensors, f"talker.model.layers.{i}", attention)
            for i in range(tc.num_hidden_layers)
        )
        self.norm = RMSNorm(tensors["talker.model.norm.weight"], tc.rms_norm_eps)
        self.codec_head = Linear(tensors["talker.codec_head.weight"])
        self.text_fc1 = Linear(
            tensors["talker.text_projection.linear_fc1.weight"],
            tensors["talker.text_projection.linear_fc1.bias"],
        )
        self.text_fc2 = Linear(
            tensors["talker.text_projection.linear_fc2.weight"],
            tensors["talker.text_projection.linear_fc2.bias"],
        )
        self.text_embedding = nn.Parameter(tensors["talker.model.text_embedding.weight"], requires_grad=False)
        self.codec_embedding = nn.Parameter(
            tensors["talker.model.codec_embedding.weight"], requires_grad=False
        )
        self.codebook_embeddings = nn.ParameterList(
            nn.Parameter(
                tensors[f"talker.code_predictor.model.codec_embedding.{j}.weight"], requires_grad=False
            )
            for j in range(tc.num_code_groups - 1)
        )
        weight = self.codec_head.weight
        positions = torch.arange(tc.max_position_embeddings, device=weight.device)
        cos, sin = rope_cos_sin(positions, tc.head_dim, tc.rope_theta, weight.dtype)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self._fixed_prompt_pieces: dict[FixedPromptKey, FixedPromptPieces] = {}

    @classmethod
    def from_tensors(
        cls, config: VoiceDesignConfig, tensors: dict[str, Tensor], *, attention: AttentionImpl = "eager"
    ) -> Talker:
        """`attention`: the official backend to reproduce ("sdpa" is a CPU reference, see layers)."""
        return cls(config, tensors, attention=attention)

    @property
    def hidden_size(self) -> int:
        return self.codec_embedding.shape[1]

    def new_cache(self, slots: int, max_len: int, *, fp8: bool = False) -> KVCache:
        """A KV pool of `slots` sessions of up to `max_len` positions each: in the model's dtype, or e4m3
        codes with row scales (`fp8`; only the attention kernels' ops take one)."""
        weight = self.codec_head.weight
        return KVCache.allocate(
            len(self.layers),
            slots,
            self.shape.kv_heads,
            max_len,
            self.shape.head_dim,
            torch.float8_e4m3fn if fp8 else weight.dtype,
            weight.device,
        )

    def text_embed(self, ids: Tensor) -> Tensor:
        """T(x) = text_projection(text_embedding(x)) (model.md §2.4) of one segment of ids [n] -> [n, H].

        The n tokens go through the projection as one [1, n] sequence, as the official prompt builder
        passes each segment, so its two products have M = n like the official ones (see `layers.linear`).
        SiLU runs in the model dtype on the rounded fc1 output, as ACT2FN["silu"] does.
        """
        hidden = F.embedding(ids, self.text_embedding).unsqueeze(0)
        return self.text_fc2(F.silu(self.text_fc1(hidden)))[0]

    def codec_embed(self, ids: Tensor) -> Tensor:
        """C(x): the talker's codec-vocabulary table (codebook-0 codes and control ids)."""
        return F.embedding(ids, self.codec_embedding)

    def frame_embedding(self, codes: Tensor) -> Tensor:
        """[B, 16] codes -> [B, H]: C(cb0) + sum_j E_j(cb_j), one stacked reduction like the reference."""
        return summed_embeddings(codes, [self.codec_embedding, *self.codebook_embeddings])

    def prompt_embeddings(self, plan: PromptPlanLike) -> tuple[Tensor, Tensor, Tensor]:
        """(prefill_embeds [L, H], trailing_text_embeds [T, H], tts_pad_embed [H]) per model.md §2.4.

        Layout: instruct (text only), role prefix (text only), codec prefix (tts_pad.. tts_bos + think /
        language tags + codec_pad), then the text: all of it in the prompt for "non_streaming" (the
        trailing stream is empty, so every step adds tts_pad), or only its first token for "streaming"
        (the rest plus tts_eos is fed one element per frame).

        The segments are projected with the official grouping (`text_embed`): in streaming mode the first
        text token and the rest are two separate segments, as the official `[3:4]` and `[4:-5]` slices are.
        The pieces that do not depend on the request's text come from `fixed_prompt_pieces`.
        """
        if not plan.text_ids:
            raise ValueError("the prompt plan has no text tokens")
        fixed = self.fixed_prompt_pieces(tuple(plan.role_ids), plan.language_id)
        ids = self._device_ids([*plan.instruct_ids, *plan.text_ids])  # one copy, not one per segment
        instruct_ids, text_ids = ids.split([len(plan.instruct_ids), len(plan.text_ids)])
        segments = []
        if plan.instruct_ids:
            segments.append(self.text_embed(instruct_ids))
        segments += [fixed.role, fixed.codec_prefix]
        if plan.text_mode == "non_streaming":
            text = self.text_embed(text_ids)
            segments.append(torch.cat([text, fixed.tts_eos]) + fixed.codec_pad)
            segments.append(fixed.tts_pad + fixed.codec_bos)
            trailing = text.new_zeros((0, text.shape[1]))
        else:
            first = self.text_embed(text_ids[:1])
            segments.append(first + fixed.codec_bos)
            rest = self.text_embed(text_ids[1:]) if len(plan.text_ids) > 1 else first[:0]
            trailing = torch.cat([rest, fixed.tts_eos])
        return torch.cat(segments), trailing, fixed.tts_pad[0]

    def fixed_prompt_pieces(self, role_ids: tuple[int, ...], language_id: int | None) -> FixedPromptPieces:
        """The prompt's pieces that only the role ids and the language decide, computed on first use and
        kept: the same products a request would compute, so prompts are unchanged, and opening a session
        (host time the GPU waits for at a request's start) projects only the request's own text.

        Kept per (device, role ids, language); a prompt builder has one role prefix and a handful of
        languages, and the store is emptied when it passes `FIXED_PROMPT_KEYS` entries.
        """
        device = self.codec_embedding.device
        key = (device, role_ids, language_id)
        cached = self._fixed_prompt_pieces.get(key)
        if cached is not None:
            return cached
        cfg, tc = self.config, self.config.talker
        if language_id is None:
            tags = [tc.codec_nothink_id, tc.codec_think_bos_id, tc.codec_think_eos_id]
        else:
            tags = [tc.codec_think_id, tc.codec_think_bos_id, language_id, tc.codec_think_eos_id]
        pieces = [
            [cfg.tts_bos_token_id, cfg.tts_eos_token_id, cfg.tts_pad_token_id],
            [*tags, tc.codec_pad_id, tc.codec_bos_id],
            list(role_ids),
        ]
        ids = self._device_ids([i for piece in pieces for i in piece])
        specials, codec_ids, role = ids.split([len(p) for p in pieces])
        with torch.no_grad():
            tts_bos, tts_eos, tts_pad = self.text_embed(specials).split(1)
            codec = self.codec_embed(codec_ids)  # tags, codec_pad, codec_bos
            text_side = torch.cat([tts_pad.expand(len(tags), -1), tts_bos])
            fixed = FixedPromptPieces(
                role=self.text_embed(role),
                codec_prefix=text_side + codec[:-1],
                tts_eos=tts_eos,
                tts_pad=tts_pad,
                codec_pad=codec[-2:-1],
                codec_bos=codec[-1:],
            )
        if len(self._fixed_prompt_pieces) >= FIXED_PROMPT_KEYS:
            self._fixed_prompt_pieces.clear()
        self._fixed_prompt_pieces[key] = fixed
        return fixed

    def _device_ids(self, ids: list[int]) -> Tensor:
        """Token ids on the talker's device, without waiting for the other sessions' frames (`upload`)."""
        return upload(torch.tensor(ids, dtype=torch.long), self.codec_embedding.device)

    def forward(self, embeds: Tensor, positions: Tensor, slots: Tensor, cache: KVCache) -> Tensor:
        """Run embeds [B, T, H] at positions [B, T] for the sessions in cache `slots` [B].

        Writes their K/V into the cache and returns the post-norm hidden [B, T, H] (the tensor that feeds
        both codec_head and the code predictor).
        """
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        x = embeds
        for index, layer in enumerate(self.layers):
            x = layer(x, cos, sin, positions, cache.k[index], cache.v[index], slots)
        return self.norm(x)

    def logits(self, hidden: Tensor) -> Tensor:
        """codec_head in the model dtype, then fp32 (the sampler works on fp32 logits).

        The head's output is rounded to the model dtype first, like the official `codec_head` whose bf16
        logits HF generate casts to fp32. hidden [B, H] or [B, T, H]. The official prefill applies the head
        to all L prompt positions (one product of M = L) and samples the last; the engine's prefill applies
        it to the last position only (M = 1): the same math, and on CPU at the real widths about 2 in
        10,000 logits differ by a bf16 ulp (see `layers.linear`). The CUDA-graph prefill captures the
        M = 1 form, so matching the official product needs both backends changed together.
        """
        return self.codec_head(hidden).float()

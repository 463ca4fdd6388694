"""The code predictor ("sub-talker"): completes a frame's codebooks 1..15 from the talker's hidden and cb0.

Per frame (model.md §3): a fresh cache; step 0 runs two positions [proj(talker hidden), proj(C(cb0))]
and lm_head[0] on the last gives cb1; step s = 1..14 runs proj(codec_embedding[s-1](cb_s)) at position
s + 1 and lm_head[s] gives cb_{s+1}. Positions restart at 0 every frame.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import VoiceDesignConfig
from .layers import AttentionImpl, BlockShape, DecoderBlock, KVCache, Linear, RMSNorm, rope_cos_sin

CodeChooser = Callable[[Tensor, int], Tensor]
"""(fp32 logits [B, vocab], group) -> codes [B]; group g predicts codebook g + 1."""


class CodePredictor(nn.Module):
    rope_cos: Tensor  # [positions, head_dim] table, gathered per position (see rope_cos_sin)
    rope_sin: Tensor

    def __init__(
        self, config: VoiceDesignConfig, tensors: dict[str, Tensor], *, attention: AttentionImpl = "eager"
    ) -> None:
        super().__init__()
        pc = config.talker.code_predictor
        prefix = "talker.code_predictor"
        self.groups = pc.num_code_groups - 1
        self.shape = BlockShape(pc.num_attention_heads, pc.num_key_value_heads, pc.head_dim, pc.rms_norm_eps)
        self.projection = Linear(
            tensors[f"{prefix}.small_to_mtp_projection.weight"],
            tensors[f"{prefix}.small_to_mtp_projection.bias"],
        )
        self.layers = nn.ModuleList(
            DecoderBlock(self.shape, tensors, f"{prefix}.model.layers.{i}", attention)
            for i in range(pc.num_hidden_layers)
        )
        self.norm = RMSNorm(tensors[f"{prefix}.model.norm.weight"], pc.rms_norm_eps)
        self.embeddings = nn.ParameterList(
            nn.Parameter(tensors[f"{prefix}.model.codec_embedding.{j}.weight"], requires_grad=False)
            for j in range(self.groups)
        )
        self.heads = nn.ModuleList(
            Linear(tensors[f"{prefix}.lm_head.{j}.weight"]) for j in range(self.groups)
        )
        weight = self.projection.weight
        positions = torch.arange(pc.num_code_groups, device=weight.device)
        cos, sin = rope_cos_sin(positions, pc.head_dim, pc.rope_theta, weight.dtype)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    @classmethod
    def from_tensors(
        cls, config: VoiceDesignConfig, tensors: dict[str, Tensor], *, attention: AttentionImpl = "eager"
    ) -> CodePredictor:
        """`attention`: the official backend to reproduce ("sdpa" is a CPU reference, see layers)."""
        return cls(config, tensors, attention=attention)

    def new_cache(self, batch: int) -> KVCache:
        """A per-frame cache: one slot per row, 16 positions (talker hidden, cb0, cb1..cb14)."""
        weight = self.projection.weight
        shape = self.shape
        return KVCache.allocate(
            len(self.layers),
            batch,
            shape.kv_heads,
            self.groups + 1,
            shape.head_dim,
            weight.dtype,
            weight.device,
        )

    def forward(self, inputs: Tensor, positions: Tensor, cache: KVCache) -> Tensor:
        """inputs [B, T, talker_hidden] at positions [B, T] -> post-norm hidden [B, T, hidden]."""
        slots = torch.arange(inputs.shape[0], device=inputs.device)
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        x = self.projection(inputs)
        for index, layer in enumerate(self.layers):
            x = layer(x, cos, sin, positions, cache.k[index], cache.v[index], slots)
        return self.norm(x)

    def logits(self, hidden: Tensor, group: int) -> Tensor:
        """lm_head[group] (codebook group + 1) in the model dtype, then fp32 (as HF generate casts)."""
        return self.heads[group](hidden).float()

    def embed(self, codes: Tensor, group: int) -> Tensor:
        """codec_embedding[group]: embeds codebook group + 1 in the talker's width."""
        return F.embedding(codes, self.embeddings[group])

    def generate(self, talker_hidden: Tensor, cb0_embed: Tensor, choose: CodeChooser) -> Tensor:
        """Codebooks 1..15 for B frames: talker_hidden, cb0_embed [B, talker_hidden] -> codes [B, 15].

        `choose` turns each step's logits into codes (sampling, greedy, or teacher forcing in tests).

        Step 0 applies lm_head[0] to both of its positions and keeps the last, as the official forward
        does: one product of M = 2 per session (see `layers.linear`), not M = 1 on the last position.
        """
        batch = talker_hidden.shape[0]
        cache = self.new_cache(batch)
        x = torch.stack([talker_hidden, cb0_embed], dim=1)
        positions = torch.arange(2, device=x.device).expand(batch, 2)
        codes = []
        for group in range(self.groups):
            hidden = self.forward(x, positions, cache)
            code = choose(self.logits(hidden, group)[:, -1], group)
            codes.append(code)
            if group + 1 < self.groups:
                x = self.embed(code, group).unsqueeze(1)
                positions = positions[:, -1:] + 1
        return torch.stack(codes, dim=1)

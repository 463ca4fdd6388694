"""The 12 Hz speech decoder (codec codes -> 24 kHz waveform) as plain torch, one-shot and streaming.

Pipeline (model.md §5): split RVQ lookup -> causal pre-conv -> sliding-window transformer -> two x2
latent upsampling stages (transposed conv + ConvNeXt) -> waveform decoder (causal conv, four blocks of
SnakeBeta + transposed conv + dilated residual units, SnakeBeta, causal conv to one channel) -> clamp.

Every layer is causal, so a decoder that keeps the right left-context can decode a stream packet by packet.
`forward(codes, state)` decodes the next n frames of a batch of streams in passes through the decoder
(`packet`, `pass_frames` frames each, see Passes below), updating their
`CodecStreamState`, and `decode` is a fresh state plus `forward`. The convs take any number of steps; in
the transformer each of the pass's n frames is a query at its own absolute position p, over the keys of
the state's 71 cached frames followed by the n new ones, masked to its window max(0, p - 71) .. p. The
state holds, per stream:

- the RoPE'd key and the value of the last `sliding_window - 1` frames of each transformer layer (a query
  sees itself plus 71 earlier frames), kept oldest first, with the absolute frame position deciding which
  slots are real (slots before frame 0 are masked);
- the last `(kernel - 1) * dilation` input samples of every causal conv (zeros at the start, which is
  exactly the zero padding of a whole-utterance decode);
- for every transposed conv with kernel `k = m * stride`, its last `m - 1` input frames. Together with the
  new frames they recompute the overlap that the previous pass could not finish (the official module trims
  the last `k - stride` outputs). Keeping inputs rather than partial output sums means every output sample
  is computed from the same values as in a whole decode, bias included, with no overlap-add bookkeeping.

RoPE positions are absolute frame indices (the first frame is 0, like the official decoder).

Passes: how many frames one pass takes is `SpeechDecoder.pass_frames`. By default a CPU decoder passes one
frame at a time, so every frame runs the same products whatever the packet schedule, and a CUDA decoder
passes a whole packet (up to PASS_FRAMES frames), where launches, not arithmetic, are the cost.

Guarantee: streaming is exact in the math: the concatenated packets of any schedule compute the same
function as `decode` of all frames, state hand-overs included (float64 on CPU, 400 frames: 1.6e-14 at test
sizes, 1.8e-14 at the real shapes, with passes of whole packets). In the bits it is exact when the passes
are the same: one frame per pass (the CPU default) gives streamed == one-shot bit for bit in every dtype,
which is the foundation contract (float32, <= 1e-6) and what the server's byte-equality guarantees rest on.
Passes of whole packets run their GEMMs, convs and attention over N = B * n frames' columns, and kernels
round a column differently for a different N (on this CPU, MKL's GEMMs take other code paths below N = 9):
measured on CPU, 400 frames, packets of 1 to 4 frames, float32 differs from one-shot by up to 9.3e-6 at
test sizes and 8.9e-6 at the real shapes, the size of a float32 decode's own error against float64 (4.3e-6
at the real shapes, 4.1e-6 for the official decoder); bfloat16 by 3% relative L2, its own rounding. The
CUDA bench reports the GPU's figure. The batch size rounds the same way: a stream decoded with others in
one call equals it decoded alone to the rounding of the dtype. Against the official decoder, which runs
the whole utterance through each layer at once, the waveform agrees to float32 rounding (a few 1e-6 on an
O(1) waveform).

Launch count: on a GPU a pass costs what its kernel launches cost, ~2-4 µs each even replayed as a CUDA
graph, so a pass is written as few ops (a few hundred kernels at the real shapes, whatever its n: a 4-frame
packet was 4 single-frame passes, ~1,270 kernels on the H200, and is now one pass). q/k/v and gate/up are
one matrix each, with the qkv rows ordered so that one RoPE pass covers q, k and v (v at angle 0); the RoPE
angles are made once per pass for all layers; a layer's RoPE, cache update and windowed attention are one
kernel on CUDA (`kernels.ops.codec_window_attention`, torch ops elsewhere); LayerScale and its residual one
`addcmul`; RMSNorm is torch's fused `rms_norm`; SnakeBeta's e^alpha and 1 / (e^beta + 1e-9) are computed
when the weights are loaded or converted, not per call, and SnakeBeta is one fused kernel on CUDA
(`kernels.ops`) that also adds the bias of a conv right before it (cuDNN would add it in a kernel of its
own); a residual unit's 1x1 conv and residual add are one GEMM into `x + bias`; and the state is advanced
by keeping views of the pass's activations instead of copies (`forward` compacts them once per call).

Cost: work is the same as frame by frame, in n times larger GEMMs. On CPU (one thread, test sizes) a
one-shot decode of 400 frames in passes of 32 frames takes 0.2 s, in 4-frame passes 0.5 s, in 1-frame
passes 1.4 s. On CUDA the activations of a pass grow with B * n (PASS_FRAMES).

Precision: the compute dtype is the dtype of the module's parameters: float32 by default (the engine's
choice, since one PCM16 step is 3e-5), `module.to(torch.bfloat16)` to run like the official bf16 example.
As in the official code, RMSNorm statistics, RoPE tables and the attention softmax use float32 (float64
when the module is float64, which the tests use to check the streaming logic exactly). The waveform is
returned in at least float32, because its consumer is PCM conversion. On CUDA, PyTorch may run float32
convolutions and matmuls in TF32 (`torch.backends.cudnn.allow_tf32`, `torch.backends.cuda.matmul.allow_tf32`);
those flags are the caller's to clear when float32 accuracy is wanted (`runtime.codec_graphs.fp32_codec`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import SpeechDecoderConfig
from ..kernels import ops
from ..kernels.reference import SnakeBetaParameters

_CHECKPOINT_PREFIX = "decoder."
_SNAKE_EPS = 1e-9
_CODEBOOK_USAGE_MIN = 1e-5
_CONVNEXT_LAYER_NORM_EPS = 1e-6

PASS_FRAMES = 32
"""The most frames one pass through the decoder takes; longer inputs (a one-shot decode) are cut into passes
of this many. It bounds the activations: the largest is the unfolded input of the last block's k=7 convs on
the GEMM path (96 channels x 7 taps x 1920 samples, 5 MB a frame and stream in float32), so a full pass
holds ~0.3 GB per stream on CUDA at the peak. The engine's packets (1..4 frames) are single passes."""


@dataclass
class CodecStreamState:
    """Everything the decoder must remember between packets, for a batch of B independent streams.

    `position[b]` is the absolute index of stream b's next frame. `kv` holds one tensor per transformer
    layer, [B, kv_heads, sliding_window - 1, 2 * head_dim]: each cached frame's RoPE'd key, then its value,
    oldest frame first. `history` maps the module path of every causal conv / transposed conv to its left
    context, [B, channels, length]. Inside a `SpeechDecoder.forward` call the entries are views into the
    last pass's activations; `compact` gives them their own storage again.
    """

    position: Tensor
    kv: list[Tensor]
    history: dict[str, Tensor] = field(default_factory=dict)

    @classmethod
    def cat(cls, states: list[CodecStreamState]) -> CodecStreamState:
        """Stack several streams' states along the batch axis, e.g. to decode sessions together."""
        return cls(
            position=torch.cat([s.position for s in states]),
            kv=[torch.cat(layer) for layer in zip(*(s.kv for s in states), strict=True)],
            history={name: torch.cat([s.history[name] for s in states]) for name in states[0].history},
        )

    def select(self, index: int) -> CodecStreamState:
        """Stream `index` of a batched state, as a batch of one (shares no storage with this state)."""
        pick = slice(index, index + 1)
        return CodecStreamState(
            position=self.position[pick].clone(),
            kv=[t[pick].clone() for t in self.kv],
            history={name: h[pick].clone() for name, h in self.history.items()},
        )

    def compact(self) -> None:
        """Copy every cache and history into storage of its own, so that a state kept between packets holds
        its own ~5 MB per stream (float32) and not also the activations its entries are views of (~7 MB a
        frame). Entries that already own exactly their storage (the window attention kernel's next caches)
        are kept as they are."""
        self.kv = [_own_storage(t) for t in self.kv]
        self.history = {name: _own_storage(h) for name, h in self.history.items()}


def _own_storage(t: Tensor) -> Tensor:
    """t itself when it is contiguous and its storage holds exactly it, else a contiguous copy."""
    whole = t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size()
    return t if whole and t.is_contiguous() else t.clone(memory_format=torch.contiguous_format)


class _Derived(nn.Module):
    """A module with tensors computed from its parameters once rather than on every call (non-persistent
    buffers). `_derive` runs again after every load and every conversion (`.to()`, `.cuda()`, ...), so they
    always follow the parameters' dtype and device, and hold what the per-call computation would give."""

    def __init__(self) -> None:
        super().__init__()
        self.register_load_state_dict_post_hook(_rederive)

    def _derive(self) -> None:
        raise NotImplementedError

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> _Derived:
        super()._apply(fn, recurse)
        with torch.no_grad():
            self._derive()
        return self


def _rederive(module: nn.Module, _incompatible: Any) -> None:
    assert isinstance(module, _Derived)
    with torch.no_grad():
        module._derive()


class _Streamed(nn.Module):
    """A layer with left context in `CodecStreamState.history`, keyed by `state_key` (its module path), of
    `context` samples."""

    state_key: str = ""
    context: int = 0

    def context_shape(self) -> tuple[int, int]:
        """(channels, length) of the left context this layer keeps."""
        raise NotImplementedError

    def advance(self, x: Tensor, state: CodecStreamState) -> Tensor | None:
        """The layer's left context before x (None when it keeps none); the state then holds the context
        after x: the last `context` samples of [history | x], a view of x when it has that many (which
        `CodecStreamState.compact` or a graph's scatter copies out), else a small concatenation."""
        if self.context == 0:
            return None
        history = state.history[self.state_key]
        if x.shape[-1] >= self.context:
            state.history[self.state_key] = x[..., x.shape[-1] - self.context :]
        else:
            state.history[self.state_key] = torch.cat([history[..., x.shape[-1] :], x], dim=-1)
        return history

    def advance_activated(self, x: Tensor, state: CodecStreamState) -> tuple[Tensor | None, Tensor | None]:
        """`advance` for a layer whose unfold puts x through SnakeBeta as it reads it (`ops.unfold_columns`'s
        `snake`): (the context before x, an empty tensor that is now the state's context), the latter for the
        unfold to fill with the activation of x's last `context` samples (its `activation_tail`), since the
        activation is never written out whole. x must hold at least `context` samples."""
        if self.context == 0:
            return None, None
        if x.shape[-1] < self.context:
            raise ValueError(f"{x.shape[-1]} samples hold less than the layer's context of {self.context}")
        history = state.history[self.state_key]
        tail = torch.empty(history.shape, dtype=x.dtype, device=x.device)
        state.history[self.state_key] = tail
        return history, tail


def _gemm_path(x: Tensor) -> bool:
    """Whether the convs and SnakeBetas take the CUDA formulation (`conv1d_as_gemm`): on CUDA tensors. One
    predicate rather than `x.is_cuda` at every call site, so that the CPU tests can run that formulation."""
    return x.is_cuda


def _channel_rows(x: Tensor) -> Tensor:
    """x [B, C, T] as [C, B * T]: a view when x is channel-major (what the GEMM convs return), else a copy."""
    return x.transpose(0, 1).reshape(x.shape[1], -1)


def _batch_view(rows: Tensor, batch: int) -> Tensor:
    """rows [C, B * T] as the channel-major [B, C, T] view of it (strides T, B * T, 1)."""
    return rows.view(rows.shape[0], batch, -1).transpose(0, 1)


def conv1d_as_gemm(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    dilation: int,
    history: Tensor | None = None,
    snake: SnakeBetaParameters | None = None,
    activation_tail: Tensor | None = None,
    tap_major_weight: Tensor | None = None,
) -> Tensor:
    """`F.conv1d(s, weight, bias, dilation=dilation)` (no padding, one group) of the samples s = [history | x]
    (x alone without a history) as one GEMM over the unfolded input, s [B, C, T + (K - 1) * dilation] (any
    strides) -> channel-major [B, O, T]: weight [O, C*K] @ columns [C*K, B*T] (+ bias). The columns are
    copied from the history and x directly (`ops.unfold_columns`), so a causal conv's context is never
    concatenated with its input. With `snake`, x's samples are SnakeBeta(x + bias) (the history holds the
    activation already), and `activation_tail`, if given, receives the activation of x's last samples.

    Why on CUDA: a frame gives the codec's convs only 4..1920 output steps a stream, where cuDNN's float32
    kernels reached ~2 TFLOP/s (95 us a call, most of the float32 codec's time in the device profile) and
    its bf16 kernels first convert every weight to NHWC (a third of the bf16 codec's time); cuBLAS takes
    the weight as it is stored. The batch is folded into the GEMM's N so that the weight is read once per
    call, not once per stream (a batched GEMM over a stride-0 weight re-reads it for every batch element:
    at 64 streams, the codec's 457 MB of float32 weights 64 times a pass). The result stays in the GEMM's
    [O, B, T] storage: its consumers (SnakeBeta, the next GEMM, the next conv's unfold) take any
    strides, and a 1x1 conv or SnakeBeta reads it as [C, B * T] without a copy. Same math; the rounding
    follows cuBLAS's blocking. Given `tap_major_weight` (the weight as [O, K, C]), bf16 convs run as an
    implicit GEMM instead, without the unfolded copy (`ops.conv_rows`).
    """
    rows = ops.conv_rows(x, weight, bias, dilation, history, snake, activation_tail, tap_major_weight)
    return _batch_view(rows, x.shape[0])


class CausalConv1d(_Streamed, _Derived):
    """Conv1d with (kernel - 1) * dilation samples of left context and none on the right (stride 1)."""

    tap_major_weight: Tensor

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1, groups: int = 1
    ):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation, groups=groups)
        self.context = (kernel_size - 1) * dilation
        self.register_buffer("tap_major_weight", torch.empty(0), persistent=False)
        self._derive()

    def _derive(self) -> None:
        """tap_major_weight [O, K, C] = the weight with its taps outermost, which `ops.conv_rows`' implicit
        GEMM reads, for a bf16 conv of one group and several taps (the fast codec's); empty otherwise."""
        weight = self.conv.weight
        implicit = weight.dtype == torch.bfloat16 and self.conv.groups == 1 and weight.shape[2] > 1
        self.tap_major_weight = weight.permute(0, 2, 1).contiguous() if implicit else weight.new_empty(0)

    def _implicit_weight(self) -> Tensor | None:
        return self.tap_major_weight if self.tap_major_weight.numel() else None

    def context_shape(self) -> tuple[int, int]:
        return self.conv.in_channels, self.context

    def forward(
        self,
        x: Tensor,
        state: CodecStreamState,
        bias: bool = True,
        activation: SnakeBeta | None = None,
        activation_bias: Tensor | None = None,
    ) -> Tensor:
        """Without `bias` the conv's bias is the caller's to add (a SnakeBeta after it adds it for free).

        With `activation` the conv's input is activation(x, activation_bias). On the GEMM path, when x holds
        the whole context, the unfold applies it as it reads x (`conv1d_as_gemm(snake=)`): the activation is
        never written out but for its last `context` samples, the layer's history, which the unfold writes too
        (`advance_activated`)."""
        conv = self.conv
        offset = conv.bias if bias else None
        if activation is not None:
            if conv.groups == 1 and conv.out_channels > 1 and _gemm_path(x) and x.shape[-1] >= self.context:
                return self._activated_gemm(x, state, offset, activation, activation_bias)
            x = activation(x, activation_bias)
        history = self.advance(x, state)
        if conv.groups == 1 and _gemm_path(x):
            if conv.out_channels == 1:  # the last conv, to the waveform: no unfolded copy for one output row
                return ops.conv_to_one_channel(x, conv.weight, offset, conv.dilation[0], history)
            return conv1d_as_gemm(
                x, conv.weight, offset, conv.dilation[0], history, tap_major_weight=self._implicit_weight()
            )
        if history is not None:
            x = torch.cat([history, x], dim=-1)
        return F.conv1d(x, conv.weight, offset, dilation=conv.dilation, groups=conv.groups)

    def _activated_gemm(
        self,
        x: Tensor,
        state: CodecStreamState,
        offset: Tensor | None,
        activation: SnakeBeta,
        activation_bias: Tensor | None,
    ) -> Tensor:
        """The GEMM-path conv of activation(x, activation_bias), applied by the unfold; the state keeps the
        activation's last `context` samples as this layer's history."""
        snake = activation.kernel_parameters(activation_bias)
        history, tail = self.advance_activated(x, state)
        return conv1d_as_gemm(
            x, self.conv.weight, offset, self.conv.dilation[0], history, snake, tail, self._implicit_weight()
        )


def conv_transpose1d_as_gemm(
    x: Tensor,
    gemm_weight: Tensor,
    gemm_bias: Tensor,
    stride: int,
    history: Tensor | None = None,
    snake: SnakeBetaParameters | None = None,
    activation_tail: Tensor | None = None,
) -> Tensor:
    """The causal transposed conv of `CausalConvTranspose1d` as one GEMM: input [history | x]
    [B, C, m - 1 + T] (left context first) -> the T new blocks [B, O, T * stride]. `snake` and
    `activation_tail` as in `conv1d_as_gemm`.

    Output sample t * s + r of a new frame t is sum over j' < m of W[:, :, (m - 1 - j') * s + r]^T x[t + j']:
    a stride-1 conv of kernel m over the input frames (`conv1d_as_gemm`) whose O * s output channels are the
    (channel, phase) pairs. `gemm_weight` [O * s, C, m] and `gemm_bias` [O * s] are that conv's
    (`CausalConvTranspose1d` derives them); the (channel, phase, stream, frame) result is reordered to
    (channel, stream, frame, phase), channel-major like `conv1d_as_gemm`'s, and the bias is added by that
    reorder (`ops.interleave_phases`): as the GEMM's [O * s, 1] bias, addmm first copied it, broadcast, over
    the whole output (one pass more; 1-2.6% of a packet, run 144).
    """
    blocks = ops.conv_rows(
        x, gemm_weight, None, 1, history, snake, activation_tail
    )  # [(channel, phase), (stream, frame)]
    return _batch_view(ops.interleave_phases(blocks, gemm_bias, stride), x.shape[0])


class CausalConvTranspose1d(_Streamed, _Derived):
    """ConvTranspose1d whose last kernel - stride outputs are dropped, so n frames give n * stride samples.

    Output block t depends on input frames t - m + 1 .. t (m = kernel / stride); the m - 1 earlier input
    frames are the left context. On CUDA it runs as one GEMM (`conv_transpose1d_as_gemm`, for the reason
    `conv1d_as_gemm` gives: cuDNN's float32 transposed convs were a quarter of the float32 codec's time, and
    its bf16 ones convert their weights to NHWC on every call).
    """

    gemm_weight: Tensor
    gemm_bias: Tensor

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int):
        super().__init__()
        if kernel_size % stride:
            raise ValueError(f"kernel {kernel_size} must be a multiple of stride {stride}")
        self.conv = nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride=stride)
        self.stride = stride
        self.context = kernel_size // stride - 1
        self.register_buffer("gemm_weight", torch.empty(0), persistent=False)
        self.register_buffer("gemm_bias", torch.empty(0), persistent=False)
        self._derive()

    def _derive(self) -> None:
        """gemm_weight[o * s + r, c, j'] = W[c, o, (m - 1 - j') * s + r]; gemm_bias[o * s + r] = b[o]."""
        weight, bias = self.conv.weight, self.conv.bias
        channels, out_channels, kernel = weight.shape
        taps = kernel // self.stride
        per_tap = weight.view(channels, out_channels, taps, self.stride).flip(2)
        self.gemm_weight = per_tap.permute(1, 3, 0, 2).reshape(out_channels * self.stride, channels, taps)
        assert bias is not None
        self.gemm_bias = bias.repeat_interleave(self.stride)

    def context_shape(self) -> tuple[int, int]:
        return self.conv.in_channels, self.context

    def forward(
        self,
        x: Tensor,
        state: CodecStreamState,
        activation: SnakeBeta | None = None,
        activation_bias: Tensor | None = None,
    ) -> Tensor:
        """With `activation` the input is activation(x, activation_bias); on the GEMM path the unfold applies
        it as it reads x, as in `CausalConv1d.forward` (each block's first SnakeBeta: 4 passes a packet)."""
        frames = x.shape[-1]
        if _gemm_path(x):
            snake, tail = None, None
            if activation is None:
                history = self.advance(x, state)
            else:
                snake = activation.kernel_parameters(activation_bias)
                history, tail = self.advance_activated(x, state)
            return conv_transpose1d_as_gemm(
                x, self.gemm_weight, self.gemm_bias, self.stride, history, snake, tail
            )
        if activation is not None:
            x = activation(x, activation_bias)
        history = self.advance(x, state)
        if history is not None:
            x = torch.cat([history, x], dim=-1)
        start = self.context * self.stride
        return self.conv(x)[..., start : start + frames * self.stride]


class SnakeBeta(_Derived):
    """x + sin²(x·e^alpha) / (e^beta + 1e-9), per channel; alpha and beta are stored as logs.

    `frequency` = e^alpha and `inverse_beta` = 1 / (e^beta + 1e-9) are derived once, in the parameters'
    dtype and by the same ops the official module runs on every call, so the values are the same."""

    frequency: Tensor
    inverse_beta: Tensor

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))
        self.register_buffer("frequency", torch.empty(channels), persistent=False)
        self.register_buffer("inverse_beta", torch.empty(channels), persistent=False)
        with torch.no_grad():
            self._derive()

    def _derive(self) -> None:
        self.frequency = self.alpha.exp()
        self.inverse_beta = 1.0 / (self.beta.exp() + _SNAKE_EPS)

    def kernel_parameters(self, bias: Tensor | None = None) -> SnakeBetaParameters:
        """What a kernel applying SnakeBeta(x + bias) as it reads x takes (`ops.unfold_columns`'s `snake`)."""
        return SnakeBetaParameters(self.frequency, self.inverse_beta, bias)

    def forward(self, x: Tensor, bias: Tensor | None = None) -> Tensor:
        """SnakeBeta(x + bias) with bias [C] when given: the bias of the conv before, in the same kernel.

        On the GEMM path x is channel-major, so it is one [1, C, B * T] block for the kernel, and the
        result keeps that layout for the GEMM after it."""
        if _gemm_path(x):
            rows = ops.snake_beta(_channel_rows(x)[None], self.frequency, self.inverse_beta, bias)
            return _batch_view(rows[0], x.shape[0])
        return ops.snake_beta(x, self.frequency, self.inverse_beta, bias)


class RMSNorm(nn.Module):
    """RMSNorm with (at least) float32 statistics; torch's `rms_norm`, one fused kernel on CUDA."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


class LayerScale(nn.Module):
    def __init__(self, size: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(size))

    def forward(self, residual: Tensor, x: Tensor) -> Tensor:
        """residual + scale * x, one op."""
        return torch.addcmul(residual, self.scale, x)


def _at_least_fp32(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


class SlidingWindowAttention(nn.Module):
    """Multi-head attention of a pass's frames over the cached window and themselves; RoPE, no q/k norm, no
    bias.

    `qkv_proj` is the official q, k and v projections in one matrix whose output rows are grouped by KV
    head: that head's `group` query heads, its key, its value ([kv_heads, group + 2, head_dim]). One RoPE
    pass then covers all of them (the value rows get angle 0: cos 1, sin 0, exact), the new keys and values
    join the cache as one copy, and a KV head's queries attend as `frames * group` query rows (frame-major)
    over it, so grouped KV heads need no repeat.
    """

    def __init__(self, config: SpeechDecoderConfig, layer_index: int):
        super().__init__()
        self.layer_index = layer_index
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.group = self.num_heads // self.num_kv_heads
        self.head_dim = config.head_dim
        rows = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, rows, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, state: CodecStreamState) -> Tensor:
        """x [B, n, hidden]; cos/sin [B, n, 1, group + 2, head_dim] (`PreTransformer.rope`). Each frame's
        queries see its window over the cached frames then x's (`ops.codec_window_attention`, one kernel on
        CUDA); the state's cache then keeps the last window - 1 keys and values."""
        batch, frames, _ = x.shape
        qkv = self.qkv_proj(x).view(batch, frames, self.num_kv_heads, self.group + 2, self.head_dim)
        cache = state.kv[self.layer_index]
        out, state.kv[self.layer_index] = ops.codec_window_attention(qkv, cos, sin, cache, state.position)
        return self.o_proj(out)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)) with gate and up as one matrix (`gate_up_proj`, gate rows first)."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(ops.silu_mul(gate, up))


class TransformerLayer(nn.Module):
    def __init__(self, config: SpeechDecoderConfig, layer_index: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = SlidingWindowAttention(config, layer_index)
        self.self_attn_layer_scale = LayerScale(config.hidden_size)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size)
        self.mlp_layer_scale = LayerScale(config.hidden_size)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, state: CodecStreamState) -> Tensor:
        x = self.self_attn_layer_scale(x, self.self_attn(self.input_layernorm(x), cos, sin, state))
        return self.mlp_layer_scale(x, self.mlp(self.post_attention_layernorm(x)))


class PreTransformer(_Derived):
    """latent -> hidden, sliding-window transformer layers, final norm, hidden -> latent; the n frames of a
    pass [B, n, C] (n <= PASS_FRAMES), from the state's position on. Leaves `state.position` as it is."""

    inv_freq: Tensor
    steps: Tensor

    def __init__(self, config: SpeechDecoderConfig):
        super().__init__()
        self.head_dim = config.head_dim
        self.group = config.num_attention_heads // config.num_key_value_heads
        self.rope_theta = config.rope_theta
        self.input_proj = nn.Linear(config.latent_dim, config.hidden_size)
        self.layers = nn.ModuleList(TransformerLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.output_proj = nn.Linear(config.hidden_size, config.latent_dim)
        for name in ("inv_freq", "steps"):
            self.register_buffer(name, torch.empty(0), persistent=False)
        with torch.no_grad():
            self._derive()

    def _derive(self) -> None:
        """inv_freq [group + 2, head_dim] in >= float32: per qkv row, the RoPE frequencies with the first
        half negated (so sin gives rotate-half's signs), zero for the value row. steps [PASS_FRAMES]: each
        frame's offset in the pass."""
        weight = self.input_proj.weight
        device, wide = weight.device, _at_least_fp32(weight.dtype)
        exponents = torch.arange(0, self.head_dim, 2, device=device).to(wide)
        inv_freq = 1.0 / (self.rope_theta ** (exponents / self.head_dim))
        signed = torch.cat([-inv_freq, inv_freq])
        self.inv_freq = torch.cat([signed.expand(self.group + 1, -1), torch.zeros_like(signed)[None]])
        self.steps = torch.arange(PASS_FRAMES, device=device)

    def rope(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos and signed sin [B, n, 1, group + 2, head_dim] for absolute positions [B, n], computed in
        >= float32 and cast: q * cos + roll(q, head_dim / 2) * sin is rotate-half RoPE, and leaves the value
        rows."""
        angles = positions[:, :, None, None] * self.inv_freq
        return angles.cos().to(dtype)[:, :, None], angles.sin().to(dtype)[:, :, None]

    def forward(self, x: Tensor, state: CodecStreamState) -> Tensor:
        """The frames from `state.position` on: x [B, n, latent] -> [B, n, latent]."""
        frames = x.shape[1]
        cos, sin = self.rope(state.position[:, None] + self.steps[:frames], x.dtype)
        x = self.input_proj(x)
        for layer in self.layers:
            x = layer(x, cos, sin, state)
        return self.output_proj(self.norm(x))


class ConvNeXtBlock(nn.Module):
    """Causal depthwise conv k=7, LayerNorm, Linear x4, exact GELU, Linear, gamma, residual."""

    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, kernel_size=7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=_CONVNEXT_LAYER_NORM_EPS)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor, state: CodecStreamState) -> Tensor:
        h = self.dwconv(x, state).transpose(1, 2)
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(h))))
        return torch.addcmul(x, self.gamma[:, None], h.transpose(1, 2))


class LatentUpsample(nn.ModuleList):
    """Causal transposed conv (kernel = stride = ratio, so no overlap) then a ConvNeXt block."""

    def __init__(self, dim: int, ratio: int):
        super().__init__([CausalConvTranspose1d(dim, dim, ratio, ratio), ConvNeXtBlock(dim)])

    def forward(self, x: Tensor, state: CodecStreamState) -> Tensor:
        upsample, convnext = self
        return convnext(upsample(x, state), state)


def pointwise_residual_as_gemm(h: Tensor, residual: Tensor, weight: Tensor) -> Tensor:
    """residual + Conv1d(k=1, no bias)(h) with weight [O, C], h and residual [B, C, T] -> channel-major
    [B, O, T]: one GEMM of N = B * T accumulating into the residual (the weight read once, as in
    `conv1d_as_gemm`).

    A channel-major residual (a GEMM output) is accumulated into in place, so the sum costs no pass of its
    own: the caller gives up `residual`. Any other layout is copied first (for T = 1 and B > 1 the view
    would keep the transposed strides of a contiguous residual)."""
    rows = _channel_rows(residual).contiguous().addmm_(weight, _channel_rows(h))
    return _batch_view(rows, h.shape[0])


class PointwiseResidual(nn.Module):
    """residual + Conv1d(k=1)(h) without the conv's bias, which the caller carries on (`DecoderBlock`): a
    GEMM accumulating into the residual (`pointwise_residual_as_gemm`) on the GEMM path, a batched GEMM on
    CPU (the arithmetic the CPU tests pin)."""

    def __init__(self, dim: int):
        super().__init__()
        self.conv = nn.Conv1d(dim, dim, kernel_size=1)

    def forward(self, h: Tensor, residual: Tensor) -> Tensor:
        weight = self.conv.weight[..., 0]
        if _gemm_path(h):
            return pointwise_residual_as_gemm(h, residual, weight)
        return residual.baddbmm(weight.expand(h.shape[0], -1, -1), h)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, kernel_size=7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = PointwiseResidual(dim)

    def forward(self, x: Tensor, state: CodecStreamState, bias: Tensor | None = None) -> Tensor:
        """The unit's output less its last conv's bias (`PointwiseResidual`), for the input x + bias (the
        biases not yet added, see `DecoderBlock`; x may be accumulated into)."""
        h = self.conv1(x, state, bias=False, activation=self.act1, activation_bias=bias)
        return self.conv2(self.act2(h, self.conv1.conv.bias), x)


class DecoderBlock(_Derived):
    """SnakeBeta, causal transposed conv (kernel 2r, stride r), residual units at dilations 1, 3, 9.

    The layers sit in one ModuleList named `block` so that parameter names match the checkpoint.

    The residual units' last 1x1 convs leave their biases unadded: each unit's SnakeBeta adds the sum so
    far to its input in the same kernel, and the block returns the rest for the next layer to add the
    same way. Adding them to the residual stream was a pass over it per unit (at 64 streams, 0.75 ms of a
    9 ms bf16 packet, benchmarks/results/2026-11-30-run35). `unit_biases[i]` is the sum of units 0..i's.
    """

    unit_biases: Tensor

    def __init__(self, in_dim: int, out_dim: int, rate: int):
        super().__init__()
        units = [ResidualUnit(out_dim, dilation) for dilation in (1, 3, 9)]
        self.block = nn.ModuleList(
            [SnakeBeta(in_dim), CausalConvTranspose1d(in_dim, out_dim, 2 * rate, rate), *units]
        )
        self.register_buffer("unit_biases", torch.empty(0), persistent=False)
        self._derive()

    def _derive(self) -> None:
        """unit_biases: summed in float64, rounded once to the biases' dtype."""
        biases = [cast(ResidualUnit, unit).conv2.conv.bias for unit in list(self.block)[2:]]
        total = torch.stack([cast(Tensor, b).double() for b in biases]).cumsum(dim=0)
        self.unit_biases = total.to(cast(Tensor, biases[0]).dtype)

    def forward(
        self, x: Tensor, state: CodecStreamState, bias: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """(y, b): the block's output is y + b per channel. bias: the unadded bias of the layer before, if
        any (see `CausalConv1d.forward`)."""
        activation, upsample, *units = self.block
        x = upsample(x, state, activation, bias)
        pending = None
        for unit, unit_bias in zip(units, self.unit_biases, strict=True):
            x = unit(x, state, pending)
            pending = unit_bias
        assert pending is not None
        return x, pending


class SpeechDecoder(_Derived):
    """The codec decoder. Submodule paths mirror the checkpoint's `decoder.*` tensor names, except the RVQ,
    which is stored as precomputed codebook vectors (`embedding_sum / clamp(cluster_usage, 1e-5)`), and the
    fused `qkv_proj` / `gate_up_proj` of the transformer layers (`from_tensors` concatenates them)."""

    first_codebook: Tensor
    rest_codebooks: Tensor
    rest_rows: Tensor

    def __init__(self, config: SpeechDecoderConfig):
        super().__init__()
        self.config = config
        rvq_dim = config.codebook_dim // 2
        self.register_buffer("first_codebook", torch.zeros(config.codebook_size, rvq_dim))
        self.register_buffer(
            "rest_codebooks", torch.zeros(config.num_quantizers - 1, config.codebook_size, rvq_dim)
        )
        self.register_buffer("rest_rows", torch.empty(0), persistent=False)
        self.first_proj = nn.Linear(rvq_dim, config.codebook_dim, bias=False)
        self.rest_proj = nn.Linear(rvq_dim, config.codebook_dim, bias=False)

        self.pre_conv = CausalConv1d(config.codebook_dim, config.latent_dim, kernel_size=3)
        self.pre_transformer = PreTransformer(config)
        self.upsample = nn.ModuleList(
            LatentUpsample(config.latent_dim, ratio) for ratio in config.upsampling_ratios
        )
        widths = [config.decoder_dim // 2**i for i in range(len(config.upsample_rates) + 1)]
        self.decoder = nn.ModuleList(
            [
                CausalConv1d(config.latent_dim, widths[0], kernel_size=7),
                *(
                    DecoderBlock(widths[i], widths[i + 1], rate)
                    for i, rate in enumerate(config.upsample_rates)
                ),
                SnakeBeta(widths[-1]),
                CausalConv1d(widths[-1], 1, kernel_size=7),
            ]
        )
        self.pass_frames: int | None = None
        """Frames per pass through the decoder; None: one on CPU, a whole packet (<= PASS_FRAMES) on CUDA
        (module docstring, Passes)."""
        self.streamed_layers: list[_Streamed] = []
        for name, module in self.named_modules():
            if isinstance(module, _Streamed):
                module.state_key = name
                self.streamed_layers.append(module)
        self.requires_grad_(False)
        self._derive()

    def _derive(self) -> None:
        """rest_rows: the codebook index of each of codes 1.. (an arange not remade every pass)."""
        self.rest_rows = torch.arange(self.config.num_quantizers - 1, device=self.rest_codebooks.device)

    @classmethod
    def from_tensors(cls, config: SpeechDecoderConfig, tensors: Mapping[str, Tensor]) -> SpeechDecoder:
        """Build from the `decoder.*` tensors of speech_tokenizer/model.safetensors (real names, any dtype).

        The module takes the tensors' dtype and device and shares their storage, except for the fused
        projections, which are new tensors. The RVQ `input_proj` weights belong to the encoding direction
        and are dropped; a missing or unexpected name raises.
        """
        own = {name.removeprefix(_CHECKPOINT_PREFIX): tensor for name, tensor in tensors.items()}
        q = "quantizer.rvq_first."
        r = "quantizer.rvq_rest."
        del own[q + "input_proj.weight"], own[r + "input_proj.weight"]
        first = _codebook_vectors(own, q + "vq.layers.0._codebook.")
        rest = [
            _codebook_vectors(own, f"{r}vq.layers.{i}._codebook.") for i in range(config.num_quantizers - 1)
        ]
        own["first_codebook"] = first
        own["rest_codebooks"] = torch.stack(rest)
        own["first_proj.weight"] = own.pop(q + "output_proj.weight").squeeze(-1)
        own["rest_proj.weight"] = own.pop(r + "output_proj.weight").squeeze(-1)
        for i in range(config.num_hidden_layers):
            _fuse_layer(own, f"pre_transformer.layers.{i}.", config)
        with torch.device("meta"):
            model = cls(config)
        model.load_state_dict(own, strict=True, assign=True)
        return model.eval()

    def new_stream_state(self, batch_size: int = 1) -> CodecStreamState:
        """A state for `batch_size` streams that start at frame 0."""
        weight = self.first_proj.weight
        config = self.config
        kv_shape = (batch_size, config.num_key_value_heads, config.sliding_window - 1, 2 * config.head_dim)
        return CodecStreamState(
            position=torch.zeros(batch_size, dtype=torch.long, device=weight.device),
            kv=[weight.new_zeros(kv_shape) for _ in range(config.num_hidden_layers)],
            history={
                m.state_key: weight.new_zeros(batch_size, *m.context_shape())
                for m in self.streamed_layers
                if m.context_shape()[1] > 0
            },
        )

    @torch.no_grad()
    def forward(
        self, codes: Tensor, state: CodecStreamState, clamp: bool = True, compact: bool = True
    ) -> Tensor:
        """Decode the next n frames of B streams: codes [B, num_quantizers, n] -> [B, n * hop].

        One pass through the decoder (`packet`) per `pass_frames` frames. Updates `state` (histories, caches,
        positions) and, with `compact`, gives its entries their own storage at the end
        (`CodecStreamState.compact`; a caller that copies the state out anyway, like a CUDA graph's
        scatter, skips that)."""
        batch, quantizers, frames = codes.shape
        if quantizers != self.config.num_quantizers:
            raise ValueError(f"expected {self.config.num_quantizers} codebooks, got {quantizers}")
        if frames == 0:
            return torch.zeros(batch, 0, dtype=_at_least_fp32(self.first_codebook.dtype), device=codes.device)
        step = min(self.pass_frames or (PASS_FRAMES if codes.is_cuda else 1), PASS_FRAMES)
        passes = [self.packet(codes[..., t : t + step], state) for t in range(0, frames, step)]
        wave = passes[0] if len(passes) == 1 else torch.cat(passes, dim=1)
        if compact:
            state.compact()
        wave = wave.to(_at_least_fp32(wave.dtype))
        return wave.clamp(-1.0, 1.0) if clamp else wave

    def packet(self, codes: Tensor, state: CodecStreamState) -> Tensor:
        """One pass: the n <= PASS_FRAMES frames from `state.position` on of B streams, codes
        [B, num_quantizers, n] -> [B, n * hop] in the compute dtype, unclamped. Advances `state` by n."""
        x = self.pre_conv(self.embed_codes(codes), state)
        x = self.pre_transformer(x.transpose(1, 2), state).transpose(1, 2)
        for stage in self.upsample:
            x = stage(x, state)

        first_conv, first_block, *blocks, final_activation, final_conv = self.decoder
        bias = cast(CausalConv1d, first_conv).conv.bias  # added by the first block's SnakeBeta
        x, bias = first_block(first_conv(x, state, bias=False), state, bias)
        for block in blocks:
            x, bias = block(x, state, bias)
        state.position = state.position + codes.shape[-1]
        return final_conv(final_activation(x, bias), state)[:, 0]

    def embed_codes(self, codes: Tensor) -> Tensor:
        """Split RVQ: codebook 0 and the sum of codebooks 1.. get separate 1x1 projections.

        codes [B, num_quantizers, n] -> [B, codebook_dim, n]."""
        first = F.embedding(codes[:, 0], self.first_codebook)
        rest = self.rest_codebooks[self.rest_rows[:, None], codes[:, 1:]]  # [B, num_quantizers - 1, n, dim]
        return (self.first_proj(first) + self.rest_proj(rest.sum(dim=1))).transpose(1, 2)

    def decode(self, codes: Tensor, clamp: bool = True) -> Tensor:
        """One-shot decode, a fresh state plus `forward` (passes of `pass_frames` frames): codes
        [B, num_quantizers, T] -> [B, T * hop].

        Codes must lie in [0, codebook_size): the official -1 batch padding is the caller's to strip."""
        return self(codes, self.new_stream_state(codes.shape[0]), clamp)

    def decode_stream(self, codes: Tensor, state: CodecStreamState, clamp: bool = True) -> Tensor:
        """Decode the next packet of one stream: codes [n, num_quantizers] -> [n * hop].

        Concatenating the packets of any schedule equals `decode` of all frames to the rounding of the
        dtype (module docstring)."""
        return self(codes.T[None], state, clamp)[0]


def _fuse_layer(tensors: dict[str, Tensor], prefix: str, config: SpeechDecoderConfig) -> None:
    """Replace one transformer layer's q/k/v and gate/up weights by `qkv_proj` (rows per KV head: its
    query heads, key, value; see `SlidingWindowAttention`) and `gate_up_proj` (gate rows, then up)."""
    attn, mlp = prefix + "self_attn.", prefix + "mlp."
    kv_heads, dim = config.num_key_value_heads, config.head_dim
    q, k, v = (tensors.pop(f"{attn}{n}_proj.weight") for n in "qkv")
    hidden = q.shape[1]
    per_head = [w.view(kv_heads, -1, dim, hidden) for w in (q, k, v)]
    tensors[attn + "qkv_proj.weight"] = torch.cat(per_head, dim=1).reshape(-1, hidden)
    gate, up = tensors.pop(mlp + "gate_proj.weight"), tensors.pop(mlp + "up_proj.weight")
    tensors[mlp + "gate_up_proj.weight"] = torch.cat([gate, up])


def _codebook_vectors(tensors: dict[str, Tensor], prefix: str) -> Tensor:
    """Pop one codebook's `embedding_sum` and `cluster_usage`; return its vectors (divided in >= fp32)."""
    embedding_sum = tensors.pop(prefix + "embedding_sum")
    usage = tensors.pop(prefix + "cluster_usage")
    wide = _at_least_fp32(embedding_sum.dtype)
    vectors = embedding_sum.to(wide) / usage.to(wide).clamp(min=_CODEBOOK_USAGE_MIN)[:, None]
    return vectors.to(embedding_sum.dtype)

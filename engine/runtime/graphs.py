"""Whole-frame CUDA graphs over static caches: the GPU frame backend of `VoiceDesignEngine`.

A frame (talker step + cb0 draw + the 15 predictor steps and draws) is captured once per batch-size
bucket (1, 2, 4, 8, 16, 32, 64) and replayed: one launch per frame instead of ~1,200, and no host
synchronisation inside it. A step's per-row integers (`step.StepIndex`: positions, slots, frames generated,
uniform rows, lengths) go up in one copy into the bucket's static index and its text rows into a static
buffer; the graph itself reads the rows' last codes, cb0 histories and uniforms from the engine's
`step.SlotState` (the gathers on a side stream, beside the talker) and records the new codes there, so no
other host op surrounds a replay. Sessions may sit at different positions
(ragged), and padded rows of a partly filled bucket run on the cache's scratch slot (the last one) at
position 0, so they never touch a live session.

The captured frame is `KernelFrame`: the frame of `step.decode_frames` on the fused kernels of engine/kernels
(ops.*): fused RMSNorm + residual, q/k-norm + RoPE + cache write, flash-decoding attention over each row's
live length, SwiGLU, the one-kernel sampler, and weight-only GEMVs for products of fewer than
`mode.gemm_min_rows` rows (the gate/up GEMV writes the SwiGLU directly). The GEMVs' weight loads carry L2
eviction priorities: a share of the predictor's weights stays in the L2 between its 15 steps
(`PREDICTOR_L2_SHARE`). Every kernel of ours, the Triton ones included, is launched with programmatic
dependent launch (kernels/csrc/launch.cuh), so inside the graph a kernel's launch overlaps the end of the one
before it; cuBLAS's kernels (products of more than `Mode.triton_max_rows` rows) break that chain. Larger
products run on cuBLAS (F.linear, bf16 weights): the GEMV re-reads the weights per tile of 16 rows and is
CUDA-core bound from ~8 rows on (kernel-bench.json), while cuBLAS streams them once. A prefill runs on the
same kernels: the prompts of the sessions prefilled together are the rows of a pass, one row per token
(`KernelFrame.prefill_hidden_many`), and their frames 0 are completed by the complete-frames graph of the
batch's bucket. A pass is padded and replayed from a graph: within the largest prompt bucket, from that
bucket's; above it (several sessions, or a long prompt), from the graph of its `PACKED_PROMPT_BUCKETS` entry
and span, attending through torch's varlen flash attention over each prompt (`PromptSequences`) instead of the
per-row decode kernel. Only a pass whose padding would not fit (`KernelFrame.pass_rows`) runs eagerly. Modes
(runtime/modes.py) differ in the weights: bf16 (exact) or fp8 (fast), the GEMVs reading those, and fast's
products of many rows (prompt passes of several sessions) running as fp8 GEMMs (`Weight`); and in the
talker's KV cache: bf16 (exact) or e4m3 codes with a scale a row (fast: `Mode.kv_cache_fp8`; `install`
reallocates a pool that is not already one).

Numerics: the kernels compute the reference ops of model/layers.py (each checked against its torch
reference on the device, tests/device/test_kernel_parity.py) but round differently, so the GPU frame is
not bit-identical to the torch model (`step.EagerFrameBackend`, which is the CPU engine and is bit-exact
against the official package). A replay is bit-identical to the same kernels run eagerly
(`KernelFrameBackend`), and each bucket's shapes are fixed, so the choice of GEMV or cuBLAS is made once
per graph: a session's codes can differ between buckets (deterministic per bucket, not batch invariant),
and with the prompts prefilled alongside it (cuBLAS picks its kernels by the pass's total row count).

The fused bf16 qkv and gate/up matrices are made once and the model's own q/k/v and gate/up parameters
are re-pointed at row slices of them, so a backend adds only its 8-bit copies (fast) to the footprint.

`GraphFrameBackend` implements `step.FrameBackend`; `install` makes it an engine's `frame_backend`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from ..kernels import ops
from ..kernels.reference import QuantizedRows, QuantizedWeight, SplitSums, quantize_weight
from ..model.layers import CacheScales, KVCache
from ..model.predictor import CodePredictor
from ..model.talker import Talker
from ..transfer import upload, upload_into
from . import step
from .capture import capture_after_warm_up
from .modes import EXACT, Mode
from .sampling import SamplingRows
from .step import FrameRows, SlotState, StepIndex

if TYPE_CHECKING:
    from .engine import VoiceDesignEngine

BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
SCRATCH_SLOTS = 1
SAMPLERS_RECORD_MAX_ROWS = 32
"""Rows up to which a decode frame's samplers record it (`ops.DrawRecord`); larger frames record after
their last draw, the cb0 history on a side stream beside the last codes. H200, frame replays in alternating
processes against the records after the frame (benchmarks/results/2026-12-03-run114): samplers' records
0.2-0.4% shorter at 1-16 rows, 2.7% longer at 64 (5.10 -> 5.24 ms, both modes); the side-stream record had
taken 64 rows 5.26 -> 5.09 ms (run 110). With this split (run 115): 4-16 rows 0.1-0.5% shorter, 64 rows
5.10 -> 5.08 ms."""
PROMPT_BUCKETS: tuple[int, ...] = tuple(range(32, 257, 32))
"""Row counts a prompt pass is padded to, each with a captured graph: run eagerly, a pass is ~280 kernel
launches from Python (about 5 ms of host time for a GPU pass of ~1.5 ms at one stream), most of a request's
time to first audio. Steps of 32 rows: a padding row costs what a prompt row does (the bench's 152-token
prompt ran 256 rows with powers of two). A pass of more rows is packed (`PACKED_PROMPT_BUCKETS`). The
largest bucket bounds what these graphs add to the footprint (the attention workspace grows as rows x
context)."""
PROMPTS_PER_PASS = 64
"""Prompts in one pass at most: a packed pass's sequence table has this many entries and one for padding."""
PREFILL_ROWS = PROMPTS_PER_PASS * PROMPT_BUCKETS[-1]
"""Prompt tokens per pass at most (whole prompts; a longer one runs alone): as many prompts of the largest
prompt bucket as a pass takes prompts, so the sessions of a full batch prefill in one pass. The packed passes'
shared static inputs and their largest graph (`PACKED_PROMPT_BUCKETS`) have this many rows (the kernels put
a pass's rows on a grid dimension of at most 65535 blocks). A smaller pass runs its products slower a row:
with 8,192 rows here the bench's 64 prompts of 152 tokens split into 8,192 + 1,792 rows, and the second
pass's products ran at 400-900 TFLOP/s against 650-1,200 (H200, run 125)."""
PACKED_PROMPT_BUCKETS: tuple[int, ...] = tuple(range(PROMPT_BUCKETS[-1] + 256, PREFILL_ROWS + 1, 256))
"""Row counts a pass above `PROMPT_BUCKETS` is padded to, each with a graph per `PACKED_SPANS` entry. Run
eagerly such a pass is ~2,000 host ops (732 allocations, 555 launches, 112 `torch._scaled_mm` calls at 43-103
us of host each in fast mode, run 91), so the host sets its time where the host is slow: a 64-stream prefill
of 91 ms against 50 ms on a fast host with the same GPU work (fast mode, runs 111 and 117). A replay does not
wait on the host. Steps of 256 rows: at most 255 padding rows a pass (the bench's 64 x 152-token prefill,
9,728 rows, needs none). Several sessions' prompts go into one such pass rather than one bucketed pass
each, which reads the weights again a pass: H200, the bench's 152-token prompt, 2 / 3 / 4 / 8 sessions 7.4 /
7.4 / 8.3 / 11.2 ms against 7.9 / 10.6 / 13.1 / 23.2 ms as bucketed passes (fast mode, run 121; exact
alike)."""
PACKED_SPANS: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192)
"""Longest-sequence bounds of the packed passes' graphs: the flash kernel has a block per (128 queries of the
longest sequence, sequence, head), so a graph is captured per bound, not once for the longest possible."""


def prompt_pass_rows(rows: int) -> int:
    """The rows a prompt pass of `rows` tokens runs: its bucket, or `rows` above the largest."""
    return next((bucket for bucket in (*PROMPT_BUCKETS, *PACKED_PROMPT_BUCKETS) if bucket >= rows), rows)


def packed_span(longest: int) -> int:
    """The sequence-length bound a packed pass whose longest sequence is `longest` rows runs with."""
    return next((span for span in PACKED_SPANS if span >= longest), longest)


def prompt_passes(lengths: list[int]) -> list[slice]:
    """How prompts of these lengths (in tokens) split into passes of whole prompts, in order: at most
    `PREFILL_ROWS` rows (a longer prompt runs alone) and `PROMPTS_PER_PASS` prompts a pass."""
    passes, start = [], 0
    while start < len(lengths):
        stop, rows = start + 1, lengths[start]
        while (
            stop < len(lengths) and stop - start < PROMPTS_PER_PASS and rows + lengths[stop] <= PREFILL_ROWS
        ):
            rows += lengths[stop]
            stop += 1
        passes.append(slice(start, stop))
        start = stop
    return passes


@dataclass(frozen=True)
class PromptRows:
    """One prompt pass's rows: embeddings [R, H], positions [R] and cache slots [R]."""

    embeds: Tensor
    positions: Tensor
    slots: Tensor

    @classmethod
    def of(cls, prompts: list[Tensor], slots: Tensor, rows: int) -> tuple[PromptRows, Tensor]:
        """(the rows of prompts[i] into cache slot slots[i], padded to `rows`; the row of each prompt's last
        token [B]). Rows past the prompts repeat the last prompt's last token: they compute and write exactly
        what that row does (same slot, position and input), so padding changes no other row's inputs and no
        cache entry."""
        lengths = [p.shape[0] for p in prompts]
        pad = rows - sum(lengths)
        positions = torch.cat([torch.arange(n) for n in lengths] + [torch.full((pad,), lengths[-1] - 1)])
        ends = torch.tensor(lengths).cumsum(0) - 1
        counts = torch.tensor([*lengths[:-1], lengths[-1] + pad])
        # One upload for the three index vectors (a pinned copy costs host time before the pass can start).
        positions, counts, ends = upload(torch.cat([positions, counts, ends]), prompts[0].device).split(
            [rows, len(prompts), len(prompts)]
        )
        # torch.cat copies: the pass updates its residual stream in place.
        embeds = torch.cat([*prompts, prompts[-1][-1:].expand(pad, -1)])
        padded = cls(embeds, positions, slots.repeat_interleave(counts, output_size=rows))
        return padded, ends

    @classmethod
    def packed(
        cls, prompts: list[Tensor], slots: Tensor, rows: int
    ) -> tuple[PromptRows, Tensor, PromptSequences]:
        """(the rows of a pass of at most `PROMPTS_PER_PASS` prompts above `PROMPT_BUCKETS`, padded to
        `rows`; the row of each prompt's last token [PROMPTS_PER_PASS] (row 0 past the prompts); the pass's
        sequences), in tables of fixed shapes for the pass's graph.

        The padding rows are a sequence of their own that continues the last prompt past its end (its slot,
        positions L.., which the caller keeps inside the cache and the RoPE table): they attend only to each
        other, and the cache entries they write are ones that session overwrites before it reads them (a
        decode step writes its position's K/V before it attends)."""
        lengths = [p.shape[0] for p in prompts]
        total, last = sum(lengths), lengths[-1]
        pad = rows - total
        positions = torch.cat([torch.arange(n) for n in lengths] + [torch.arange(last, last + pad)])
        counts = torch.tensor([*lengths[:-1], last + pad])
        cumulative = torch.tensor(lengths).cumsum(0)
        ends = torch.zeros(PROMPTS_PER_PASS, dtype=torch.int64)
        ends[: len(prompts)] = cumulative - 1
        bounds = torch.full((PROMPTS_PER_PASS + 2,), rows, dtype=torch.int64)  # empty sequences past the pad
        bounds[0] = 0
        bounds[1 : len(prompts) + 1] = cumulative
        # One upload for the four index vectors (a pinned copy costs host time before the pass can start).
        positions, counts, ends, bounds = upload(
            torch.cat([positions, counts, ends, bounds]), prompts[0].device
        ).split([rows, len(prompts), PROMPTS_PER_PASS, PROMPTS_PER_PASS + 2])
        embeds = torch.cat([*prompts, prompts[-1][-1:].expand(pad, -1)])
        padded = cls(embeds, positions, slots.repeat_interleave(counts, output_size=rows))
        return padded, ends, PromptSequences(bounds.int(), packed_span(max(*lengths, pad)))

    @classmethod
    def zeros(cls, rows: int, like: Tensor, slot: int) -> PromptRows:
        """`rows` rows of zero embeddings (`like`'s width, dtype and device) at position 0 of `slot`."""
        device = like.device
        return cls(
            torch.zeros(rows, like.shape[-1], dtype=like.dtype, device=device),
            torch.zeros(rows, dtype=torch.int64, device=device),
            torch.full((rows,), slot, dtype=torch.int64, device=device),
        )

    def load(self, rows: PromptRows) -> None:
        """Copy `rows` (of the same shapes) into these tensors."""
        self.embeds.copy_(rows.embeds)
        self.positions.copy_(rows.positions)
        self.slots.copy_(rows.slots)

    def head(self, rows: int) -> PromptRows:
        """The first `rows` rows (views)."""
        return PromptRows(self.embeds[:rows], self.positions[:rows], self.slots[:rows])


@dataclass(frozen=True)
class PromptSequences:
    """The sequences of a pass above `PROMPT_BUCKETS`, for a causal attention inside each (`attend`): rows
    bounds[i] .. bounds[i + 1] - 1 are sequence i, all of one slot from its position 0 (the padding sequence
    excepted, which needs only its own order).

    Why: the decode attention kernel runs a block per (row, KV head, 64-key split) and reads each row's keys
    itself, so a prompt of L tokens reads its keys L times; at 64 prompts of 152 tokens that was 38 ms of a
    prefill's 88 (run 27). A flash attention reads them once per tile of queries; a varlen one over the
    pass's own rows needs no [prompts, longest] grid and no per-query-head copy of the keys (run 94: a
    64-stream prefill of 49 ms in fast mode, GPU-bound); over the pass's own keys in row order it has fixed
    launch shapes for a given span, so a graph can capture it. Passes within `PROMPT_BUCKETS` keep the
    decode kernel, which their graphs replay bit for bit.
    """

    bounds: Tensor  # [sequences + 1] int32, the first row of each sequence and the pass's row count last
    span: int  # no sequence is longer

    def attend(self, queries: Tensor, keys: Tensor, values: Tensor, scale: float) -> Tensor:
        """Each row's roped queries [R, Hq, D] over its sequence's roped keys and values [R, Hkv, D] (the
        pass's own rows, as it writes them to the cache) up to its own: [R, Hq * D]."""
        return ops.prompt_attention(queries, keys, values, self.bounds, self.span, scale)


@dataclass(frozen=True)
class Weight:
    """A decode weight in both layouts: `dense` bf16 for cuBLAS, `small` (bf16 or 8-bit) for the GEMV.

    Products of fewer than `gemm_min_rows` rows take the GEMV; from `fp8_min_rows` rows on (when set; `small`
    is then fp8) an fp8 GEMM over `small`; in between, the tensor-core kernel over `small` up to
    `tensor_core_max_rows` rows (where it takes the shapes: ops.tensor_core_linear_suits), then the Triton
    kernels over `dense` up to `triton_max_rows` rows (set for the attention's, the MLP's and the heads'
    weights: ops.triton_linear; `residual_delta` for down and o, whose products only feed the residual add;
    over `small` and the norm's e4m3 rows for a qkv or gate/up weight with `triton_fp8_rows`), else bf16
    cuBLAS over `dense`. The GEMV ranks its loads of `small` in the L2 by `l2_keep` (ops.linear;
    `KernelFrame`'s L2 plan)."""

    dense: Tensor
    small: Tensor | QuantizedWeight
    gemm_min_rows: int
    norm_in_gemv: bool = True
    fp8_min_rows: int | None = None
    l2_keep: int | None = None
    tensor_core_max_rows: int = 0
    triton_max_rows: int = 0
    triton_fp8_rows: bool = False

    @property
    def small_bytes(self) -> int:
        data = self.small if isinstance(self.small, Tensor) else self.small.data
        return data.numel() * data.element_size()

    def __call__(self, x: Tensor | QuantizedRows, bias: Tensor | None = None) -> Tensor:
        if isinstance(x, QuantizedRows):
            return ops.fp8_linear(x, cast(QuantizedWeight, self.small), bias)
        if self._dense_rows(x):
            return self._gemm(x, bias)
        return ops.linear(x, self.small, bias, self.l2_keep)

    def swiglu(self, x: Tensor | QuantizedRows) -> Tensor | QuantizedRows:
        """SiLU(gate) * up for this fused [gate; up] weight: on the GEMV path one kernel that writes only the
        SwiGLU (ops.linear_swiglu), on cuBLAS the product then `silu_mul`; the same result either way. Rows
        whose products run fp8 come back quantized (`ops.silu_mul_fp8`) for the down projection, whose rows
        run fp8 too (a block's weights share one mode)."""
        if isinstance(x, QuantizedRows) or self._fp8_rows(x):
            gate_up = self(x)
            width = gate_up.shape[1] // 2
            return ops.silu_mul_fp8(gate_up[:, :width], gate_up[:, width:])
        if not self._dense_rows(x):
            return ops.linear_swiglu(x, self.small, self.l2_keep)
        if self._on_tensor_cores(x, swiglu=True):
            return ops.tensor_core_linear_swiglu(x, self.small)
        if self._on_triton(x, swiglu=True):
            return ops.triton_linear_swiglu(x, self.dense)
        gate_up = self._gemm(x)
        width = gate_up.shape[1] // 2
        return ops.silu_mul(gate_up[:, :width], gate_up[:, width:])

    def residual_delta(self, x: Tensor | QuantizedRows) -> Tensor | SplitSums:
        """This weight's product where only the next residual add reads it (`after_rms_norm`'s delta,
        `ops.add_rms_norm_`): on Triton its split sums unadded (`ops.SplitSums`), which the add-RMSNorm kernel
        adds, one kernel fewer a product; elsewhere the product."""
        if isinstance(x, Tensor) and self._dense_rows(x) and self._gemm_on_triton(x):
            return ops.triton_linear_split_sums(x, self.dense)
        return self(x)

    def after_rms_norm(
        self, x: Tensor, delta: Tensor | SplitSums | None, norm_weight: Tensor, eps: float
    ) -> tuple[Tensor, Tensor]:
        """(this weight's product with rms_norm(s) * norm_weight, s), s = x + delta (x when delta is None): a
        block's residual add, its RMSNorm and the projection after it.

        On the GEMV path one kernel whose blocks norm their input (ops.rms_norm_linear; s is a new tensor).
        On cuBLAS the add-RMSNorm kernel updates x in place (s is x), then the product; on Triton with
        `triton_fp8_rows` the norm's e4m3 rows times the fp8 weight."""
        if self.norm_in_gemv and not self._dense_rows(x):
            gemv_delta = None if delta is None else ops.added(delta)
            return ops.rms_norm_linear(
                x, norm_weight, eps, self.small, delta=gemv_delta, l2_keep=self.l2_keep
            )
        if self._fp8_on_triton(x):
            rows = self._normed_fp8(x, delta, norm_weight, eps)
            return ops.triton_fp8_linear(rows, cast(QuantizedWeight, self.small)), x
        return self(self._normed(x, delta, norm_weight, eps)), x

    def swiglu_after_rms_norm(
        self, x: Tensor, delta: Tensor | SplitSums | None, norm_weight: Tensor, eps: float
    ) -> tuple[Tensor | QuantizedRows, Tensor]:
        """`after_rms_norm` for a gate/up weight: the SwiGLU (`swiglu`) of the normed rows; on Triton with
        `triton_fp8_rows`, of the norm's e4m3 rows and the fp8 weight."""
        if self.norm_in_gemv and not self._dense_rows(x):
            gemv_delta = None if delta is None else ops.added(delta)
            return ops.rms_norm_linear(
                x, norm_weight, eps, self.small, delta=gemv_delta, swiglu=True, l2_keep=self.l2_keep
            )
        if self._fp8_on_triton(x, swiglu=True):
            rows = self._normed_fp8(x, delta, norm_weight, eps)
            return ops.triton_fp8_linear_swiglu(rows, cast(QuantizedWeight, self.small)), x
        return self.swiglu(self._normed(x, delta, norm_weight, eps)), x

    def _normed(
        self, x: Tensor, delta: Tensor | SplitSums | None, norm_weight: Tensor, eps: float
    ) -> Tensor | QuantizedRows:
        """rms_norm(x + delta) * norm_weight with x updated in place, quantized in the norm's kernel where
        this weight's product runs fp8: the activations' quantization took 4.4 of a 64-session prefill's
        44.7 ms as kernels of their own (run 123)."""
        if self._fp8_rows(x):
            return self._normed_fp8(x, delta, norm_weight, eps)
        return (
            ops.rms_norm(x, norm_weight, eps)
            if delta is None
            else ops.add_rms_norm_(delta, x, norm_weight, eps)
        )

    @staticmethod
    def _normed_fp8(
        x: Tensor, delta: Tensor | SplitSums | None, norm_weight: Tensor, eps: float
    ) -> QuantizedRows:
        """`_normed` quantized per row by the norm's kernel (split sums added there too)."""
        if delta is None:
            return ops.rms_norm_fp8(x, norm_weight, eps)
        return ops.add_rms_norm_fp8_(delta, x, norm_weight, eps)

    def _dense_rows(self, x: Tensor) -> bool:
        return x.shape[0] >= self.gemm_min_rows and x.is_cuda

    def _on_tensor_cores(self, x: Tensor, swiglu: bool = False) -> bool:
        return x.shape[0] <= self.tensor_core_max_rows and ops.tensor_core_linear_suits(x, self.small, swiglu)

    def _on_triton(self, x: Tensor, swiglu: bool = False) -> bool:
        return x.shape[0] <= self.triton_max_rows and ops.triton_linear_suits(x, self.dense, swiglu)

    def _gemm_on_triton(self, x: Tensor, swiglu: bool = False) -> bool:
        """Whether `_gemm` (with `swiglu`: the `swiglu` method) runs x (without a bias) on Triton: after its
        fp8 and tensor-core branches. The row bound first, so other weights and larger passes skip the
        tensor-core kernel's plan."""
        return self._on_triton(x, swiglu) and not self._fp8_rows(x) and not self._on_tensor_cores(x, swiglu)

    def _fp8_on_triton(self, x: Tensor, swiglu: bool = False) -> bool:
        """Whether the product after the norm (`after_rms_norm`, `swiglu_after_rms_norm`) runs x on the fp8
        Triton kernels: where the bf16 ones would run it and the weight takes fp8 rows."""
        return self.triton_fp8_rows and self._dense_rows(x) and self._gemm_on_triton(x, swiglu)

    def _fp8_rows(self, x: Tensor) -> bool:
        return self.fp8_min_rows is not None and x.shape[0] >= self.fp8_min_rows and self._dense_rows(x)

    def _gemm(self, x: Tensor, bias: Tensor | None = None) -> Tensor:
        if self._fp8_rows(x):
            return ops.fp8_linear(x, cast(QuantizedWeight, self.small), bias)
        if self._on_tensor_cores(x):
            return ops.tensor_core_linear(x, self.small, bias)
        if bias is None and self._on_triton(x):
            return ops.triton_linear(x, self.dense)
        return F.linear(x, self.dense, bias)


# The L2 plan of the frame's GEMVs. The code predictor reads its blocks' weights 15 times a frame, more
# bytes than the L2 holds (78.6 MB in fast mode, 157 MB in exact, against the H200's 60 MB), so with plain
# loads every weight is evicted before its next read. The plan keeps the same first share of each predictor
# weight, PREDICTOR_L2_SHARE of the device's L2 in all (evict_last), and streams the rest of them, the
# talker's weights and the heads (evict_first). H200 (runs 76, 77): one-stream frame replay 2.80 -> 2.70 ms
# (exact), 2.38 -> 2.27 ms (fast); 64 streams unchanged. Keeping 16 MB did as well, 36 and 48 MB worse, and
# whole weights instead of a share of each worse; streaming the talker alone gained nothing.
PREDICTOR_L2_SHARE = 0.4


def _streamed(weight: Weight) -> Weight:
    return replace(weight, l2_keep=0)


def _l2_plan(blocks: list[_Block], keep: int) -> list[_Block]:
    """`blocks` with their GEMV weights ranked in the L2: the first keep / (their bytes) share of each weight
    kept, the rest streamed."""
    total = sum(w.small_bytes for b in blocks for w in b.weights)

    def ranked(weight: Weight) -> Weight:
        return replace(weight, l2_keep=weight.small_bytes * keep // total // 128 * 128)

    return [b.with_weights(ranked) for b in blocks]


def _l2_bytes(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).L2_cache_size if device.type == "cuda" else 0


def _prepare(weight: Tensor, mode: Mode, triton: bool = False, fp8_rows: bool = False) -> Weight:
    """`weight` for `mode`; `triton`: a decoder block's weight (qkv, o, gate/up, down) or a head, whose
    products of 33-128 rows run on Triton (`Mode.triton_max_rows`); `fp8_rows`: one whose product follows an
    RMSNorm that can quantize its rows (qkv, gate/up; `Mode.triton_fp8_rows`)."""
    dense = weight.contiguous()
    small = dense if mode.weights == "bf16" else quantize_weight(dense, mode.weights)
    return Weight(
        dense,
        small,
        mode.gemm_min_rows,
        mode.norm_in_gemv,
        mode.fp8_gemm_min_rows,
        tensor_core_max_rows=mode.tensor_core_max_rows,
        triton_max_rows=mode.triton_max_rows if triton else 0,
        triton_fp8_rows=mode.triton_fp8_rows and triton and fp8_rows,
    )


def _fuse(*params: Tensor) -> Tensor:
    """Concatenate weights along rows and re-point each parameter at its slice (no second bf16 copy).

    Parameters that are already adjacent slices of one storage (fused by an earlier backend) are viewed
    in place, so a second backend neither copies nor moves them: graphs captured earlier keep valid
    pointers. Re-pointing happens once, when the first backend is built."""
    first = params[0].detach()
    end = first.data_ptr()
    adjacent = True
    for param in params:
        same_storage = param.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
        if not (param.is_contiguous() and same_storage and param.data_ptr() == end):
            adjacent = False
            break
        end += param.numel() * param.element_size()
    if adjacent:
        rows = sum(p.shape[0] for p in params)
        return first.as_strided((rows, *first.shape[1:]), first.stride())
    fused = torch.cat([p.detach() for p in params])
    start = 0
    for param in params:
        rows = param.shape[0]
        param.data = fused[start : start + rows]
        start += rows
    return fused


@dataclass
class _Block:
    """One decoder block in kernel layout: fused qkv and gate/up, optionally 8-bit."""

    input_norm: Tensor
    post_norm: Tensor
    q_norm: Tensor
    k_norm: Tensor
    qkv: Weight
    o: Weight
    gate_up: Weight
    down: Weight
    q_width: int
    kv_width: int

    @classmethod
    def from_module(cls, block: torch.nn.Module, mode: Mode) -> _Block:
        b: Any = block
        q, k, v = b.q_proj.weight, b.k_proj.weight, b.v_proj.weight
        gate, up = b.gate_proj.weight, b.up_proj.weight
        return cls(
            input_norm=b.input_layernorm.weight,
            post_norm=b.post_attention_layernorm.weight,
            q_norm=b.q_norm.weight,
            k_norm=b.k_norm.weight,
            qkv=_prepare(_fuse(q, k, v), mode, triton=True, fp8_rows=True),
            o=_prepare(b.o_proj.weight, mode, triton=True),
            gate_up=_prepare(_fuse(gate, up), mode, triton=True, fp8_rows=True),
            down=_prepare(b.down_proj.weight, mode, triton=True),
            q_width=q.shape[0],
            kv_width=k.shape[0],
        )

    @property
    def weights(self) -> tuple[Weight, Weight, Weight, Weight]:
        """The block's GEMV weights: qkv, o, gate/up, down."""
        return self.qkv, self.o, self.gate_up, self.down

    def with_weights(self, change: Callable[[Weight], Weight]) -> _Block:
        """The block with `change` applied to each of its GEMV weights."""
        return replace(
            self, qkv=change(self.qkv), o=change(self.o), gate_up=change(self.gate_up), down=change(self.down)
        )


def _run_blocks(
    blocks: list[_Block],
    x: Tensor,
    eps: float,
    cos: Tensor,
    sin: Tensor,
    positions: Tensor,
    lengths: Tensor,
    slots: Tensor,
    cache_k: Tensor,
    cache_v: Tensor,
    scale: float,
    distinct_slots: bool,
    span: int | None = None,
    sequences: PromptSequences | None = None,
    cache_scales: CacheScales | None = None,
) -> tuple[Tensor, Tensor | SplitSums]:
    """One token per row through every block (the residual stream `x` [N, H] may be updated in place); row i
    is at positions[i] and attends to lengths[i] = positions[i] + 1 keys.

    Returns (residual, delta): the last block's residual stream and its MLP output (its split sums where the
    down product ran on Triton: `Weight.residual_delta`), whose add and final RMSNorm are left to the caller
    (`ops.add_rms_norm_`, or the head's `Weight.after_rms_norm`). Each residual add is fused into the next
    RMSNorm, and on the GEMV path that into the qkv or gate/up projection after it (the residual stream then
    moves to new tensors instead). `distinct_slots`: no two rows write the same cache slot, and `span` bounds
    lengths (see `ops.rope_attention`). With `sequences` (a packed prompt pass) the attention is
    `PromptSequences.attend`. `cache_scales`: every layer's row scales of an e4m3 cache (`KVCache.scales`).
    """
    residual = x
    delta: Tensor | SplitSums | None = None
    for index, blk in enumerate(blocks):
        qkv, residual = blk.qkv.after_rms_norm(residual, delta, blk.input_norm, eps)
        q, k, v = qkv.split([blk.q_width, blk.kv_width, blk.kv_width], dim=1)
        k_cache, v_cache = cache_k[index], cache_v[index]
        scales = None if cache_scales is None else CacheScales(cache_scales.k[index], cache_scales.v[index])
        if sequences is not None:
            # The pass's keys straight from the rope kernel: gathered back from the cache they took 3.6 of a
            # 64-stream prefill's 49 ms (run 123).
            head_dim = k_cache.shape[-1]
            keys = k.new_empty(k.shape[0], k.shape[1] // head_dim, head_dim)
            roped = ops.qk_norm_rope_cache(
                q,
                k,
                v,
                blk.q_norm,
                blk.k_norm,
                cos,
                sin,
                positions,
                slots,
                k_cache,
                v_cache,
                eps,
                keys,
                scales,
            )
            attended = sequences.attend(roped, keys, v.view(keys.shape), scale)
        else:
            attended = ops.rope_attention(
                q,
                k,
                v,
                blk.q_norm,
                blk.k_norm,
                cos,
                sin,
                positions,
                lengths,
                slots,
                k_cache,
                v_cache,
                eps,
                scale,
                distinct_slots=distinct_slots,
                span=span,
                scales=scales,
            )
        attention_delta = blk.o.residual_delta(attended)
        mlp, residual = blk.gate_up.swiglu_after_rms_norm(residual, attention_delta, blk.post_norm, eps)
        delta = blk.down.residual_delta(mlp)
    assert delta is not None
    return residual, delta


@dataclass(frozen=True)
class _PredictorIndex:
    """The predictor's positions and cache slots for a batch of B rows: step 0's pairs (each row's two prefix
    tokens, 2B rows) and steps 1.. (row i of `step_positions` is step i + 1, at position i + 2). Constant per
    batch size, so `KernelFrame` makes them once instead of ~10 small kernels in every frame."""

    row_slots: Tensor
    pair_slots: Tensor
    pair_positions: Tensor
    pair_lengths: Tensor
    step_positions: Tensor
    step_lengths: Tensor

    @classmethod
    def of(cls, batch: int, groups: int, device: torch.device) -> _PredictorIndex:
        row_slots = torch.arange(batch, device=device)
        pair_positions = torch.arange(2, device=device).repeat(batch)
        step_positions = torch.arange(2, groups + 1, device=device).repeat_interleave(batch).view(-1, batch)
        return cls(
            row_slots=row_slots,
            pair_slots=row_slots.repeat_interleave(2),
            pair_positions=pair_positions,
            pair_lengths=pair_positions + 1,
            step_positions=step_positions,
            step_lengths=step_positions + 1,
        )


def _codebook_tables(talker: Talker, predictor: CodePredictor) -> Tensor:
    """[groups - 1, vocab, H]: the codebooks' embedding tables in one tensor, as `ops.frame_embedding` reads
    them. The talker's parameters are re-pointed at its slices (`_fuse`), and so are the predictor's where
    they were the same tensors (the snapshot stores each table once), so no table is held twice."""
    shared = [
        p.data_ptr() == q.data_ptr() and p.shape == q.shape
        for p, q in zip(talker.codebook_embeddings, predictor.embeddings, strict=True)
    ]
    fused = _fuse(*talker.codebook_embeddings)
    tables = fused.view(len(shared), -1, fused.shape[1])
    for same, param, table in zip(shared, predictor.embeddings, tables, strict=True):
        if same:
            param.data = table
    return tables


def _projected_embeddings(predictor: CodePredictor) -> Tensor:
    """[groups - 1, vocab, predictor hidden]: projection(embedding[g][code]) for every code of the groups
    whose code feeds a next step, made once. A codebook step's input is then a row of this table, which
    the sampler gathers (`ops.sample_predictor_and_embed`), instead of a lookup and a projection GEMV:
    each row is the same product of the same bf16 operands (fp32 accumulation, one rounding), summed in
    another order."""
    weight, bias = predictor.projection.weight, predictor.projection.bias
    with torch.no_grad():
        return torch.stack(
            [F.linear(table, weight, bias) for table in list(predictor.embeddings)[: predictor.groups - 1]]
        )


class KernelFrame:
    """The frame of `step.decode_frames` on the fused kernels, with the GEMV weights of `mode`."""

    def __init__(self, talker: Talker, predictor: CodePredictor, mode: Mode) -> None:
        self.mode = mode
        self.talker = talker
        self.predictor = predictor
        tc = talker.config.talker
        pc = tc.code_predictor
        self.eos = tc.codec_eos_token_id
        self.talker_eps = tc.rms_norm_eps
        self.predictor_eps = pc.rms_norm_eps
        self.talker_scale = tc.head_dim**-0.5
        self.predictor_scale = pc.head_dim**-0.5
        keep = int(PREDICTOR_L2_SHARE * _l2_bytes(predictor.norm.weight.device))
        self.talker_blocks = [
            _Block.from_module(layer, mode).with_weights(_streamed) for layer in talker.layers
        ]
        predictor_blocks = [_Block.from_module(layer, mode) for layer in predictor.layers]
        self.predictor_blocks = _l2_plan(predictor_blocks, keep)
        self.codec_head = _streamed(_prepare(talker.codec_head.weight, mode, triton=True))
        self.projection = _streamed(_prepare(predictor.projection.weight, mode))
        self.projection_bias = predictor.projection.bias
        self.heads = [
            _streamed(_prepare(cast(Tensor, head.weight), mode, triton=True)) for head in predictor.heads
        ]
        self.groups = predictor.groups
        self.step_inputs = _projected_embeddings(predictor)
        self.codebook_tables = _codebook_tables(talker, predictor)
        self._predictor_indices = {
            batch: _PredictorIndex.of(batch, self.groups, self.codebook_tables.device) for batch in BUCKETS
        }
        self.predictor_shape = (len(predictor.layers), pc.num_key_value_heads, self.groups + 1, pc.head_dim)
        self._predictor_kv: tuple[Tensor, Tensor] | None = None
        self._side = _SideStream(self.codebook_tables.device)

    def prefill_hidden(self, prompt: Tensor, slot: Tensor, cache: KVCache) -> Tensor:
        """One prompt [L, H] into cache slot `slot` [1]: its last token's post-norm hidden [1, H]."""
        return self.prefill_hidden_many([prompt], slot, cache)

    def prefill_hidden_many(self, prompts: list[Tensor], slots: Tensor, cache: KVCache) -> Tensor:
        """B prompts (prompts[i] [L_i, H] into cache slot slots[i], at positions 0..L_i-1) as the rows of
        one pass, one row per token; returns each prompt's last-token post-norm hidden [B, H].

        Rows of different slots do not interact: each layer writes every row's K/V before its attention
        reads any, and attention reads each row's own slot up to the row's position, so a row sees exactly
        its own prompt's prefix. The prompts run in the passes of `prompt_passes`.
        """
        passes = prompt_passes([p.shape[0] for p in prompts])
        hidden = [self.prompt_pass(prompts[part], slots[part], cache) for part in passes]
        return hidden[0] if len(hidden) == 1 else torch.cat(hidden)

    def prompt_pass(self, prompts: list[Tensor], slots: Tensor, cache: KVCache) -> Tensor:
        """One eager pass over whole prompts, padded as `pass_rows` says (the rows a graph replay runs, so
        that this pass and the graph compute the same products): the prompts' last-token hidden [B, H].
        Above the largest of `PROMPT_BUCKETS` the pass attends through `PromptSequences`."""
        rows = self.pass_rows(prompts, cache)
        if rows in PROMPT_BUCKETS:
            padded, ends = PromptRows.of(prompts, slots, rows)
            return self.prompt_hidden(padded, cache).index_select(0, ends)
        packed, ends, sequences = PromptRows.packed(prompts, slots, rows)
        return self.prompt_hidden(packed, cache, sequences).index_select(0, ends[: len(prompts)])

    def pass_rows(self, prompts: list[Tensor], cache: KVCache) -> int:
        """The rows a pass over `prompts` runs: `prompt_pass_rows` of their tokens, unless a packed pass's
        padding (positions past the last prompt's end) would run past the cache or the RoPE table; then the
        tokens alone."""
        total = sum(p.shape[0] for p in prompts)
        rows = prompt_pass_rows(total)
        if rows in PROMPT_BUCKETS:
            return rows
        limit = min(cache.k.shape[3], self.talker.rope_cos.shape[0])
        return rows if prompts[-1].shape[0] + rows - total <= limit else total

    def prompt_hidden(
        self, rows: PromptRows, cache: KVCache, sequences: PromptSequences | None = None
    ) -> Tensor:
        """The post-norm hidden [R, H] of every row of a prompt pass (its K/V written to the cache). No row
        attends to more keys than the pass has rows, so the attention grid spans that many positions."""
        span = min(rows.positions.shape[0], cache.k.shape[3])
        return self.talker_hidden(
            rows.embeds,
            rows.positions,
            rows.slots,
            cache,
            distinct_slots=False,
            span=span,
            sequences=sequences,
        )

    def talker_hidden(
        self,
        embeds: Tensor,
        positions: Tensor,
        slots: Tensor,
        cache: KVCache,
        *,
        distinct_slots: bool,
        lengths: Tensor | None = None,
        span: int | None = None,
        sequences: PromptSequences | None = None,
        out: Tensor | None = None,
    ) -> Tensor:
        """One talker token per row: embeds [N, H] at positions [N] in cache rows slots [N] -> the
        post-norm hidden [N, H]. `distinct_slots`: the rows are different sessions (a decode frame; padded
        rows share the scratch slot at position 0, where they read nothing another row writes), not the
        tokens of one prompt. `lengths`: positions + 1, when the caller has it. `span` and `sequences`: as
        `_run_blocks`'s. `out`: where the hidden is written (`ops.add_rms_norm_`'s)."""
        x = embeds.contiguous()
        t = self.talker
        residual, delta = _run_blocks(
            self.talker_blocks,
            x,
            self.talker_eps,
            t.rope_cos,
            t.rope_sin,
            positions,
            positions + 1 if lengths is None else lengths,
            slots,
            cache.k,
            cache.v,
            self.talker_scale,
            distinct_slots=distinct_slots,
            span=span,
            sequences=sequences,
            cache_scales=cache.scales,
        )
        return ops.add_rms_norm_(delta, residual, t.norm.weight, self.talker_eps, out=out)

    def _predict(self, pair: Tensor, rows: FrameRows, codes: Tensor, record: ops.DrawRecord | None) -> None:
        """Codebooks 1..15 into codes[:, 1:]: step 0 runs both prefix tokens (`pair` [B, 2, H]: the talker's
        hidden, cb0's embedding) as 2B rows (causal by position), then 14 steps. `record`: the last draw's
        (`ops.DrawRecord`)."""
        batch = pair.shape[0]
        device = pair.device
        cache_k, cache_v = self._predictor_cache(pair)
        p = self.predictor
        blocks, eps, scale = self.predictor_blocks, self.predictor_eps, self.predictor_scale
        final = p.norm.weight
        index = self._predictor_index(batch, device)
        x = self.projection(pair.view(2 * batch, -1), self.projection_bias)
        residual, delta = _run_blocks(
            blocks,
            x,
            eps,
            p.rope_cos,
            p.rope_sin,
            index.pair_positions,
            index.pair_lengths,
            index.pair_slots,
            cache_k,
            cache_v,
            scale,
            distinct_slots=False,  # each session's two prefix tokens share its slot
        )
        # The head reads every second row in place (the GEMV takes rows a stride apart).
        logits = self.heads[0](ops.add_rms_norm_(delta, residual, final, eps)[1::2])
        for group in range(self.groups):
            uniforms, column = rows.uniforms[:, 1 + group], codes[:, 1 + group]
            if group + 1 == self.groups:
                ops.sample_predictor(logits, uniforms, rows.predictor_sampling, out=column, record=record)
                break
            # The sampler also gathers the code's projected embedding: the next step's input.
            _, x = ops.sample_predictor_and_embed(
                logits, uniforms, rows.predictor_sampling, self.step_inputs[group], out=column
            )
            residual, delta = _run_blocks(
                blocks,
                x,
                eps,
                p.rope_cos,
                p.rope_sin,
                index.step_positions[group],
                index.step_lengths[group],
                index.row_slots,
                cache_k,
                cache_v,
                scale,
                distinct_slots=True,
            )
            logits, _ = self.heads[group + 1].after_rms_norm(residual, delta, final, eps)

    def _predictor_cache(self, like: Tensor) -> tuple[Tensor, Tensor]:
        """The predictor's K and V caches for the B rows (dim 0) of `like`, [layers, B, kv heads, positions,
        head dim] each. A frame writes every position before any step reads it (the kernels read no other; the
        torch reference masks them, and their stale values are finite), so one pair made for the largest
        bucket serves every frame of up to that many rows (views of its first rows) without zeroing kernels
        in each; it is made by the first call outside a graph capture (a capture's warm-up), not kept in a
        graph's memory pool, and never replaced (captured graphs hold its address). Other batches get zeros of
        their own."""
        batch = like.shape[0]
        kept = self._predictor_kv
        if kept is not None and batch <= kept[0].shape[1] and kept[0].dtype == like.dtype:
            return kept[0][:, :batch], kept[1][:, :batch]
        layers, kv_heads, length, head_dim = self.predictor_shape
        rows = max(batch, BUCKETS[-1])
        cache = torch.zeros(2, layers, rows, kv_heads, length, head_dim, dtype=like.dtype, device=like.device)
        if kept is None and not (like.is_cuda and torch.cuda.is_current_stream_capturing()):
            self._predictor_kv = (cache[0], cache[1])
        return cache[0][:, :batch], cache[1][:, :batch]

    def _predictor_index(self, batch: int, device: torch.device) -> _PredictorIndex:
        """The bucket sizes' indices were made with the frame; another batch (an eager frame) makes its own.
        One made during a graph capture would live in the graph's memory pool, so it is not kept."""
        index = self._predictor_indices.get(batch)
        if index is not None and index.row_slots.device == device:
            return index
        index = _PredictorIndex.of(batch, self.groups, device)
        if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            self._predictor_indices[batch] = index
        return index

    def logits(self, hidden: Tensor) -> Tensor:
        """The talker's cb0 logits [N, vocab] in float32 from its post-norm hidden [N, H]."""
        return self.codec_head(hidden).float()

    def complete_frames(self, hidden: Tensor, rows: FrameRows) -> Tensor:
        """From the talker's post-norm hidden [B, H] to the frame's codes [B, 16] (`step.complete_frames`)."""
        pair = hidden.new_empty(hidden.shape[0], 2, hidden.shape[1])
        pair[:, 0] = hidden
        return self._draw_frames(pair, rows)

    def _draw_frames(
        self, pair: Tensor, rows: FrameRows, state: SlotState | None = None, slots: Tensor | None = None
    ) -> Tensor:
        """`complete_frames` on `pair` [B, 2, H], whose rows [:, 0] hold the talker's post-norm hidden: the
        cb0 draw writes its embedding into [:, 1] and the predictor's first step reads both in place (no
        stack kernel). Each sampler writes its codebook's column of the frame's codes. With `state`, the
        draws also record the frame in the rows' `slots` (`ops.DrawRecord`: the cb0 draw its history bit,
        the last draw the codes), so that no kernel follows the last draw."""
        hidden = pair[:, 0]
        codes = torch.empty(pair.shape[0], self.groups + 1, dtype=torch.int64, device=pair.device)
        history = last = None
        if state is not None:
            assert slots is not None
            history = ops.DrawRecord(slots, history=state.cb0_history)
            last = ops.DrawRecord(slots, last_codes=state.last_codes, frame_codes=codes)
        ops.sample_talker_and_embed(
            self.codec_head(hidden),  # bfloat16: the sampler reads it as float32
            rows.uniforms[:, 0],
            rows.talker_sampling,
            rows.cb0_history,
            rows.frames_generated,
            self.eos,
            self.talker.codec_embedding,  # the predictor's second input, gathered by the sampler
            out=codes[:, 0],
            embed_out=pair[:, 1],
            record=history,
        )
        self._predict(pair, rows, codes, last)
        return codes

    def decode_step(
        self,
        cache: KVCache,
        state: SlotState,
        index: StepIndex,
        text: Tensor,
        sampling: tuple[SamplingRows, SamplingRows],
    ) -> Tensor:
        """`step.decode_frames` on inputs gathered from `state`, its codes recorded there (as
        `step.recorded_frames` does): what a decode graph captures, so a replay needs no host op around it
        but the index's upload and the text rows.

        The talker's input reads each slot's last codes in place (`ops.frame_embedding`'s code rows), the
        sampling rows' gathers run beside the talker on a second stream (`_SideStream`), where the frame's
        chain would wait for each in turn, and up to `SAMPLERS_RECORD_MAX_ROWS` rows the samplers record the
        frame (`_draw_frames`); larger frames record the cb0 history on the side stream, beside the last
        codes."""
        side = self._side
        rows = state.frame_rows(index, sampling, side.gather)
        t = self.talker
        embeds = ops.frame_embedding(
            state.last_codes, t.codec_embedding, self.codebook_tables, text, index.slots
        )
        pair = embeds.new_empty(embeds.shape[0], 2, embeds.shape[1])
        self.talker_hidden(
            embeds,
            index.positions,
            index.slots,
            cache,
            distinct_slots=True,
            lengths=index.lengths,
            out=pair[:, 0],
        )
        side.join()
        if pair.shape[0] <= SAMPLERS_RECORD_MAX_ROWS:
            return self._draw_frames(pair, rows, state, index.slots)
        codes = self._draw_frames(pair, rows)
        with side.run():
            state.record_history(index, codes)
        state.record_codes(index, codes)
        side.join()
        return codes


class _SideStream:
    """A second CUDA stream for a frame's small ops that its chain of kernels need not wait for, forked from
    the current stream and joined back into it (inside a graph capture too: the ops become a branch of the
    graph). Off CUDA the ops run in order on the current stream.

    Ops run here write only long-lived tensors or ones allocated on the current stream (`gather` allocates
    before it forks), so the caching allocator never hands their memory to other work before the join."""

    def __init__(self, device: torch.device) -> None:
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    @contextmanager
    def run(self) -> Iterator[None]:
        """The block's ops on the side stream, after the current stream's work so far."""
        if self._stream is None:
            yield
            return
        self._stream.wait_stream(torch.cuda.current_stream(self._stream.device))
        with torch.cuda.stream(self._stream):
            yield

    def gather(self, table: Tensor, rows: Tensor) -> Tensor:
        """table's rows `rows` (along dim 0), taken on the side stream; read them after `join`."""
        out = table.new_empty((rows.shape[0], *table.shape[1:]))
        with self.run():
            torch.index_select(table, 0, rows, out=out)
        return out

    def join(self) -> None:
        """The current stream waits for the side stream's ops so far."""
        if self._stream is not None:
            torch.cuda.current_stream(self._stream.device).wait_stream(self._stream)


class KernelFrameBackend:
    """`KernelFrame` run eagerly, without graphs: the computation a `GraphFrameBackend` replays, against
    which its replays are checked bit for bit (tests/device)."""

    scratch_slots = 0

    def __init__(self, talker: Talker, predictor: CodePredictor, mode: Mode = EXACT) -> None:
        self.frame = KernelFrame(talker, predictor, mode)

    def decode_frames(
        self,
        talker: Talker,
        predictor: CodePredictor,
        cache: KVCache,
        state: SlotState,
        index: Tensor,
        text: list[Tensor],
        sampling: tuple[SamplingRows, SamplingRows],
    ) -> Tensor:
        rows = StepIndex(upload(index, cache.k.device))
        return self.frame.decode_step(cache, state, rows, torch.stack(text), sampling)

    def prefill_frames(
        self,
        talker: Talker,
        predictor: CodePredictor,
        cache: KVCache,
        state: SlotState,
        index: Tensor,
        prompts: list[Tensor],
        sampling: tuple[SamplingRows, SamplingRows],
    ) -> Tensor:
        rows = StepIndex(upload(index, cache.k.device))
        hidden = self.frame.prefill_hidden_many(prompts, rows.slots, cache)
        return step.recorded_frames(state, rows, sampling, lambda r: self.frame.complete_frames(hidden, r))


def _sampling_like(rows: SamplingRows, batch: int) -> SamplingRows:
    return SamplingRows(
        greedy=rows.greedy.new_zeros(batch),
        temperature=rows.temperature.new_ones(batch),
        top_k=rows.top_k.new_zeros(batch),
        top_p=rows.top_p.new_ones(batch),
        repetition_penalty=rows.repetition_penalty.new_ones(batch),
    )


def _load_sampling(
    targets: tuple[SamplingRows, SamplingRows],
    sampling: tuple[SamplingRows, SamplingRows],
    loaded: tuple[SamplingRows, SamplingRows] | None,
    n: int,
) -> tuple[SamplingRows, SamplingRows]:
    """Copy a batch's (talker, predictor) sampling rows into a static's first n rows unless they are the
    objects copied last (`loaded`); returns what the static now holds."""
    if loaded is not None and loaded[0] is sampling[0] and loaded[1] is sampling[1]:
        return loaded
    for target, source in zip(targets, sampling, strict=True):
        for name in ("greedy", "temperature", "top_k", "top_p", "repetition_penalty"):
            getattr(target, name)[:n].copy_(getattr(source, name))
    return sampling


@dataclass
class _DecodeStatic:
    """One bucket's decode inputs, its graph and its output.

    A call fills columns/rows [:n]; the others are padding rows, which run on the scratch slot at position 0
    (they gather uniform row 0 and the scratch slot's codes and history, and record into the scratch slot),
    so they never touch a live session. The sampling rows are copied only when the batch's sessions change
    (`loaded` holds the objects last copied; the engine reuses them while its batch stays the same, and
    never changes their values).
    """

    index: Tensor  # [StepIndex.ROWS, bucket] int64
    text: Tensor  # [bucket, H]
    talker_sampling: SamplingRows
    predictor_sampling: SamplingRows
    scratch: int
    graph: torch.cuda.CUDAGraph | None = None
    out: Tensor | None = None
    loaded: tuple[SamplingRows, SamplingRows] | None = None

    @classmethod
    def allocate(cls, batch: int, template: SamplingRows, like: Tensor, scratch: int) -> _DecodeStatic:
        index = torch.zeros(StepIndex.ROWS, batch, dtype=torch.int64, device=like.device)
        index[1].fill_(scratch)
        index[4].fill_(1)
        return cls(
            index=index,
            text=like.new_zeros(batch, like.shape[-1]),
            talker_sampling=_sampling_like(template, batch),
            predictor_sampling=_sampling_like(template, batch),
            scratch=scratch,
        )

    def load(self, index: Tensor, text: list[Tensor], sampling: tuple[SamplingRows, SamplingRows]) -> None:
        """The batch's host index [5, n] (one upload, with the padding columns), text and sampling rows."""
        n = index.shape[1]
        table = torch.zeros(self.index.shape, dtype=torch.int64)
        table[:, :n] = index
        table[1, n:] = self.scratch
        table[4, n:] = 1
        upload_into(self.index, table)
        torch.stack(text, out=self.text[:n])
        self.loaded = _load_sampling(
            (self.talker_sampling, self.predictor_sampling), sampling, self.loaded, n
        )


@dataclass
class _CompleteStatic:
    """One bucket's complete-frames inputs (hidden and rows [:n]; the other rows keep valid values and their
    outputs are dropped), its graph and its output. Sampling rows are copied as `_DecodeStatic`'s are."""

    rows: FrameRows
    hidden: Tensor
    graph: torch.cuda.CUDAGraph | None = None
    out: Tensor | None = None
    loaded: tuple[SamplingRows, SamplingRows] | None = None

    @classmethod
    def allocate(cls, batch: int, template: FrameRows, like: Tensor) -> _CompleteStatic:
        device = like.device
        rows = FrameRows(
            uniforms=torch.full((batch, step.UNIFORMS_PER_FRAME), 0.5, dtype=torch.float64, device=device),
            cb0_history=torch.zeros(batch, template.cb0_history.shape[1], dtype=torch.bool, device=device),
            frames_generated=torch.zeros(batch, dtype=torch.int64, device=device),
            talker_sampling=_sampling_like(template.talker_sampling, batch),
            predictor_sampling=_sampling_like(template.predictor_sampling, batch),
        )
        return cls(rows=rows, hidden=like.new_zeros(batch, like.shape[-1]))

    def load(self, hidden: Tensor, rows: FrameRows) -> None:
        n = hidden.shape[0]
        mine = self.rows
        self.hidden[:n].copy_(hidden)
        mine.uniforms[:n].copy_(rows.uniforms)
        mine.cb0_history[:n].copy_(rows.cb0_history)
        mine.frames_generated[:n].copy_(rows.frames_generated)
        sampling = (rows.talker_sampling, rows.predictor_sampling)
        self.loaded = _load_sampling(
            (mine.talker_sampling, mine.predictor_sampling), sampling, self.loaded, n
        )


@dataclass
class _PromptStatic:
    """One prompt bucket's input rows, graph and output hidden [R, H]. Capture runs on the scratch slot."""

    rows: PromptRows
    graph: torch.cuda.CUDAGraph | None = None
    out: Tensor | None = None


@dataclass
class _PackedStatic:
    """The inputs every packed-pass graph reads (each views the first rows of `rows`), and one graph and
    output [PROMPTS_PER_PASS, H] (the rows `ends` picks) per (rows, span)."""

    rows: PromptRows
    ends: Tensor  # [PROMPTS_PER_PASS] int64
    bounds: Tensor  # [PROMPTS_PER_PASS + 2] int32
    graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, Tensor]]

    @classmethod
    def allocate(cls, like: Tensor) -> _PackedStatic:
        rows = PromptRows.zeros(PREFILL_ROWS, like, 0)
        ends = torch.zeros(PROMPTS_PER_PASS, dtype=torch.int64, device=like.device)
        bounds = torch.zeros(PROMPTS_PER_PASS + 2, dtype=torch.int32, device=like.device)
        return cls(rows, ends, bounds, {})

    def load_capture_inputs(self, rows: int, span: int, scratch: int, context: int) -> None:
        """Inputs to capture a graph of `rows` and `span` on: the scratch slot (capture runs the pass, and
        the inputs may still hold a live session's rows), positions cycling through the cache, sequences
        `span` long (a capture's launch shapes depend only on rows and span)."""
        device = self.ends.device
        self.rows.slots.fill_(scratch)
        self.rows.positions.copy_(torch.arange(PREFILL_ROWS, device=device) % context)
        self.ends.zero_()
        self.bounds.copy_((torch.arange(PROMPTS_PER_PASS + 2, device=device) * span).clamp(max=rows))

    def load(self, rows: PromptRows, ends: Tensor, sequences: PromptSequences) -> None:
        self.rows.head(rows.embeds.shape[0]).load(rows)
        self.ends.copy_(ends)
        self.bounds.copy_(sequences.bounds)


class GraphFrameBackend:
    """Captures and replays whole frames per bucket; see the module docstring."""

    scratch_slots = SCRATCH_SLOTS

    def __init__(
        self, talker: Talker, predictor: CodePredictor, mode: Mode = EXACT, buckets: tuple[int, ...] = BUCKETS
    ):
        if not talker.codec_embedding.is_cuda:
            raise ValueError("GraphFrameBackend needs the model on a CUDA device")
        self.mode = mode
        self.buckets = tuple(sorted(buckets))
        self.frame = KernelFrame(talker, predictor, mode)
        self._decode: dict[int, _DecodeStatic] = {}
        self._complete: dict[int, _CompleteStatic] = {}
        self._prompt: dict[int, _PromptStatic] = {}
        self._packed: _PackedStatic | None = None
        self._pool = torch.cuda.graph_pool_handle()
        self._cache_ptr: int | None = None
        self._state: SlotState | None = None

    def bucket(self, batch: int) -> int | None:
        return next((b for b in self.buckets if b >= batch), None)

    # The two step.py entry points -------------------------------------------------------------------
    def decode_frames(
        self,
        talker: Talker,
        predictor: CodePredictor,
        cache: KVCache,
        state: SlotState,
        index: Tensor,
        text: list[Tensor],
        sampling: tuple[SamplingRows, SamplingRows],
    ) -> Tensor:
        batch = index.shape[1]
        top = self.buckets[-1]
        if batch > top:
            return torch.cat(
                [
                    self.decode_frames(
                        talker,
                        predictor,
                        cache,
                        state,
                        index[:, i : i + top],
                        text[i : i + top],
                        (_slice_sampling(sampling[0], i, i + top), _slice_sampling(sampling[1], i, i + top)),
                    ).clone()  # the next chunk's replay may overwrite this output
                    for i in range(0, batch, top)
                ]
            )
        static = self._decode_static(self._bucket_of(batch), cache, state, sampling[0], text[0])
        static.load(index, text, sampling)
        assert static.graph is not None and static.out is not None
        static.graph.replay()
        return static.out[:batch]

    def prefill_frames(
        self,
        talker: Talker,
        predictor: CodePredictor,
        cache: KVCache,
        state: SlotState,
        index: Tensor,
        prompts: list[Tensor],
        sampling: tuple[SamplingRows, SamplingRows],
    ) -> Tensor:
        rows = StepIndex(upload(index, cache.k.device))
        hidden = self._prefill_hidden(prompts, rows.slots, cache)
        return step.recorded_frames(state, rows, sampling, lambda r: self._complete_frames(hidden, r))

    def _prefill_hidden(self, prompts: list[Tensor], slots: Tensor, cache: KVCache) -> Tensor:
        """`KernelFrame.prefill_hidden_many`'s passes, each replayed on the graph of its rows (and span): the
        same padded pass. A pass of the rows of its tokens alone (`KernelFrame.pass_rows`) runs eagerly."""
        hidden = []
        for part in prompt_passes([p.shape[0] for p in prompts]):
            group, group_slots = prompts[part], slots[part]
            rows = self.frame.pass_rows(group, cache)
            if rows in PROMPT_BUCKETS:
                padded, ends = PromptRows.of(group, group_slots, rows)
                static = self._prompt_static(rows, cache, padded.embeds)
                static.rows.load(padded)
                assert static.graph is not None and static.out is not None
                static.graph.replay()
                # A new tensor, taken before the next replay of this bucket overwrites the graph's output.
                hidden.append(static.out.index_select(0, ends))
            elif rows in PACKED_PROMPT_BUCKETS:
                packed, ends, sequences = PromptRows.packed(group, group_slots, rows)
                graph, out = self._packed_graph(rows, sequences.span, cache, packed.embeds)
                assert self._packed is not None
                self._packed.load(packed, ends, sequences)
                graph.replay()
                hidden.append(out[: len(group)].clone())  # the next pass may replay this graph again
            else:
                hidden.append(self.frame.prompt_pass(group, group_slots, cache))
        return hidden[0] if len(hidden) == 1 else torch.cat(hidden)

    def _complete_frames(self, hidden: Tensor, rows: FrameRows) -> Tensor:
        """Frame 0 of B prefilled sessions from their hidden [B, H], on the complete-frames graph of the
        smallest bucket that holds them (padded rows complete a frame nobody reads)."""
        batch = hidden.shape[0]
        top = self.buckets[-1]
        if batch > top:
            return torch.cat(
                [
                    self._complete_frames(hidden[i : i + top], _slice_rows(rows, i, i + top)).clone()
                    for i in range(0, batch, top)
                ]
            )
        static = self._complete_static(self._bucket_of(batch), rows, hidden)
        static.load(hidden, rows)
        assert static.graph is not None and static.out is not None
        static.graph.replay()
        return static.out[:batch]

    def decode_graph(self, batch: int) -> torch.cuda.CUDAGraph:
        """The captured decode graph of `batch`'s bucket (benchmarks replay it without the host work)."""
        static = self._decode.get(self._bucket_of(batch))
        if static is None or static.graph is None:
            raise KeyError(f"no decode graph has been captured for {batch} rows")
        return static.graph

    def release_graphs(self) -> None:
        """Drop every captured graph; the next call of each kind captures again (e.g. after
        `ops.set_dependent_launch`, which applies to graphs captured afterwards)."""
        self._decode.clear()
        self._complete.clear()
        self._prompt.clear()
        self._packed = None
        torch.cuda.synchronize()
        self._pool = torch.cuda.graph_pool_handle()  # the old pool may still back tensors we handed out

    def _bucket_of(self, batch: int) -> int:
        bucket = self.bucket(batch)
        assert bucket is not None
        return bucket

    # Capture ------------------------------------------------------------------------------------------
    def capture_all(self, cache: KVCache, state: SlotState, template: FrameRows, text: Tensor) -> None:
        """Capture every bucket's frame and complete-frames graphs and every prompt bucket's graph now (server
        start), not on first use: the packed passes' at the smallest span, up to the rows of as many prompts
        of `PROMPT_BUCKETS[-1]` tokens as there are live slots (longer prompts capture on first use)."""
        for bucket in self.buckets:
            self._decode_static(bucket, cache, state, template.talker_sampling, text[0])
            self._complete_static(bucket, template, text[:1])
        for rows in PROMPT_BUCKETS:
            self._prompt_static(rows, cache, text)
        typical_rows = (cache.k.shape[1] - self.scratch_slots) * PROMPT_BUCKETS[-1]
        for rows in PACKED_PROMPT_BUCKETS:
            if rows <= typical_rows:
                self._packed_graph(rows, PACKED_SPANS[0], cache, text)

    def _check_cache(self, cache: KVCache) -> None:
        if self._cache_ptr is None:
            self._cache_ptr = cache.k.data_ptr()
        elif self._cache_ptr != cache.k.data_ptr():
            raise RuntimeError("the graphs were captured on another KV cache")

    def _decode_static(
        self, bucket: int, cache: KVCache, state: SlotState, template: SamplingRows, like: Tensor
    ) -> _DecodeStatic:
        self._check_cache(cache)
        if self._state is None:
            self._state = state
        elif self._state is not state:
            raise RuntimeError("the decode graphs were captured on another slot state")
        static = self._decode.get(bucket)
        if static is None:
            static = _DecodeStatic.allocate(bucket, template, like, cache.k.shape[1] - 1)
            s, frame = static, self.frame

            def run() -> Tensor:
                return frame.decode_step(
                    cache, state, StepIndex(s.index), s.text, (s.talker_sampling, s.predictor_sampling)
                )

            static.graph, static.out = self._capture(run)
            self._decode[bucket] = static
        return static

    def _complete_static(self, bucket: int, template: FrameRows, like: Tensor) -> _CompleteStatic:
        static = self._complete.get(bucket)
        if static is None:
            static = _CompleteStatic.allocate(bucket, template, like)
            s, frame = static, self.frame

            def run() -> Tensor:
                return frame.complete_frames(s.hidden, s.rows)

            static.graph, static.out = self._capture(run)
            self._complete[bucket] = static
        return static

    def _prompt_static(self, bucket: int, cache: KVCache, like: Tensor) -> _PromptStatic:
        self._check_cache(cache)
        static = self._prompt.get(bucket)
        if static is None:
            static = _PromptStatic(PromptRows.zeros(bucket, like, cache.k.shape[1] - 1))
            rows, frame = static.rows, self.frame

            def run() -> Tensor:
                return frame.prompt_hidden(rows, cache)

            static.graph, static.out = self._capture(run)
            self._prompt[bucket] = static
        return static

    def _packed_graph(
        self, rows: int, span: int, cache: KVCache, like: Tensor
    ) -> tuple[torch.cuda.CUDAGraph, Tensor]:
        """The graph of a packed pass of `rows` rows whose sequences are at most `span` long: the pass over
        the first `rows` rows of the shared static inputs, its output the `ends` rows."""
        self._check_cache(cache)
        if self._packed is None:
            self._packed = _PackedStatic.allocate(like)
        static = self._packed
        captured = static.graphs.get((rows, span))
        if captured is None:
            static.load_capture_inputs(rows, span, cache.k.shape[1] - 1, cache.k.shape[3])
            frame, inputs = self.frame, static.rows.head(rows)
            sequences = PromptSequences(static.bounds, span)

            def run() -> Tensor:
                return frame.prompt_hidden(inputs, cache, sequences).index_select(0, static.ends)

            captured = self._capture(run)
            static.graphs[(rows, span)] = captured
        return captured

    def _capture(self, run: Callable[[], Tensor]) -> tuple[torch.cuda.CUDAGraph, Tensor]:
        """`capture_after_warm_up` into this backend's pool: the one seam through which every graph of the
        backend is made (a CPU test replaces it with direct calls)."""
        return capture_after_warm_up(run, self._pool)


def _slice_sampling(rows: SamplingRows, start: int, stop: int) -> SamplingRows:
    return SamplingRows(
        rows.greedy[start:stop],
        rows.temperature[start:stop],
        rows.top_k[start:stop],
        rows.top_p[start:stop],
        rows.repetition_penalty[start:stop],
    )


def _slice_rows(rows: FrameRows, start: int, stop: int) -> FrameRows:
    return FrameRows(
        rows.uniforms[start:stop],
        rows.cb0_history[start:stop],
        rows.frames_generated[start:stop],
        _slice_sampling(rows.talker_sampling, start, stop),
        _slice_sampling(rows.predictor_sampling, start, stop),
    )


def install(engine: VoiceDesignEngine, backend: GraphFrameBackend) -> Callable[[], None]:
    """Make `backend` the engine's frame backend (growing its KV pool by the scratch slot, and making it an
    e4m3 pool where the mode asks: `Mode.kv_cache_fp8`); returns a function that restores the previous
    backend (the grown pool stays, in the model's dtype: the eager backends read only that). A new pool
    holds no session's keys: install before sessions start."""
    slots = max(engine.max_sessions + backend.scratch_slots, engine.cache.k.shape[1])
    fp8 = backend.mode.kv_cache_fp8
    if engine.cache.k.shape[1] < slots or (engine.cache.scales is not None) != fp8:
        engine.cache = engine.talker.new_cache(slots, engine.max_context, fp8=fp8)
        engine.slot_state = engine.slot_state.with_slots(slots)
    previous = engine.frame_backend
    engine.frame_backend = backend

    def undo() -> None:
        engine.frame_backend = previous
        if engine.cache.scales is not None:
            engine.cache = engine.talker.new_cache(engine.cache.k.shape[1], engine.max_context)

    return undo

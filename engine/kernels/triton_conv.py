"""The bf16 codec's multi-tap convs as implicit GEMMs on Triton (wgmma on Hopper): no unfolded input.

Why: `codec.conv1d_as_gemm` runs a conv as one GEMM over its unfolded input, a [C * K, B * T] matrix that
`ops.unfold_columns` writes and the GEMM reads back: K = 7 times the activations each way. In the fast
codec's 64-stream packet (benchmarks/results/2026-12-04-run143, H100) the unfold kernels were 2.19 of 6.42 ms
and the 7-tap GEMMs 1.59 ms, both bound by that matrix's bytes (the 96-channel convs: 660 MB a call, for a
product of 94 MB of samples). Here a block reads its tile of the columns straight from the samples.

The samples are time-major, [B * L, C] (channels contiguous; `ops.time_major_samples` writes them in one
transposing pass, SnakeBeta applied), and the weight tap-major, [O, K, C]: tap j's columns for steps t.. of
stream b are then the sample rows b * L + t + j * dilation.., whole aligned rows, so both operands load as
16-byte vectors into the pipeline's shared memory whatever the dilation (channel-major samples would start
each tap's rows j * dilation elements off alignment). The reduction runs over (tap, channel) in that order
with blocks that depend on the weight's shape alone, so an output element's sums do not depend on the batch or
on where its step falls in a tile. Only bf16 (the fast codec): the exact codec's float32 convs stay on
cuBLAS's SGEMMs. Only where a stream has at least `MIN_STEPS` steps and the grid has a block a multiprocessor
(`suits` says why): a block computes one stream's steps, so a pass of a few steps a stream (the pre-conv and
the decoder's first conv, a one-frame packet's first stage) would spend most of its tile on nothing and read
the weight once a stream; those stay on the unfold and cuBLAS, which fold the streams into one product. Run
159 (an H200, the 64-stream 4-frame packet's twelve residual convs, tilings in `codec_conv_ab.py`): the kernel
2.22 ms at `blocks_for`'s tilings against 4.18 for the unfold and cuBLAS. Run 161 (an H100), with the
transposing samples kernel (1.36 ms for those convs' samples): the 64-stream packet 7.71 -> 7.01 ms, the
16-stream one 2.33 -> 2.22. Run 163 (an H100), with the samples staged as 16-byte vectors (0.92 ms): the fast
packets at 64 / 16 / 4 streams 7.73 -> 6.56, 2.33 -> 2.08, 1.06 -> 1.02 ms, one-stream ones equal.
`CausalConv1d` passes the tap-major weight it derives for a bf16 conv (`ops.conv_rows` runs the kernel only
given it). Only imported where Triton is (ops.py guards it); the torch reference is `reference.conv_rows`.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from .triton_dependent import begin_dependent_kernel

# The 2-tap convs (the transposed convs' GEMMs: thousands of (channel, phase) rows over the few frames of a
# packet) stay on cuBLAS: their unfold only doubles a small input.
MIN_TAPS = 3
# Steps a stream from which the kernel runs: one full tile of `ConvBlocks.steps`.
MIN_STEPS = 128


class ConvBlocks(NamedTuple):
    """A launch's tiling: output channels and steps a block, channels a reduction step, warps, stages."""

    out: int
    steps: int
    channels: int
    warps: int
    stages: int


def blocks_for(out_channels: int) -> ConvBlocks:
    """The tiling of a weight of `out_channels` rows: a function of the weight's shape alone (the module
    docstring says why), the fastest of `codec_conv_ab.py`'s spill-free tilings at the codec's residual convs
    in run 159 (H200, 64 streams, 4 frames): 96 channels 228 us a conv (within 3% of the best), 192 channels
    200 (64-channel chunks; 268 with 32), 384 and 768 channels 175 and 132 (128 x 128 on 8 warps, 64-channel
    chunks, 3 stages; 209-220 and 171-176 with 32-channel chunks and 4 stages). A 128 x 128 float32
    accumulator takes 8 warps: on 4 (128 registers a thread for it alone) the kernel spilled
    (benchmarks/device/triton_pipelines.py)."""
    if out_channels <= 96:
        return ConvBlocks(out=64, steps=128, channels=32, warps=4, stages=4)
    if out_channels <= 192:
        return ConvBlocks(out=64, steps=128, channels=64, warps=4, stages=3)
    return ConvBlocks(out=128, steps=128, channels=64, warps=8, stages=3)


@triton.jit
def _conv_rows_kernel(  # type: ignore[no-untyped-def]
    weight_ptr,
    samples_ptr,
    bias_ptr,
    out_ptr,
    out_channels,
    channels,
    length,
    steps,
    dilation,
    TAPS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_OUT: tl.constexpr,
    BLOCK_STEPS: tl.constexpr,
    BLOCK_CHANNELS: tl.constexpr,
    DEPENDENT: tl.constexpr,
):
    """out [O, B * T] (+ bias): a block's BLOCK_OUT channels over BLOCK_STEPS steps of stream program_id(2),
    sum over taps j and channels c of weight[o, j, c] * samples[b * L + t + j * dilation, c]."""
    begin_dependent_kernel(DEPENDENT)
    offs_out = tl.program_id(0) * BLOCK_OUT + tl.arange(0, BLOCK_OUT)
    offs_step = tl.program_id(1) * BLOCK_STEPS + tl.arange(0, BLOCK_STEPS)
    stream = tl.program_id(2)
    offs_channel = tl.arange(0, BLOCK_CHANNELS)
    out_mask = offs_out < out_channels
    step_mask = offs_step < steps
    sample_rows = stream.to(tl.int64) * length + offs_step
    weight_rows = weight_ptr + offs_out[:, None].to(tl.int64) * (TAPS * channels)
    sample_starts = samples_ptr + sample_rows[None, :] * channels
    chunks = tl.cdiv(channels, BLOCK_CHANNELS)
    acc = tl.zeros((BLOCK_OUT, BLOCK_STEPS), dtype=tl.float32)
    # One loop over (tap, channel chunk), not a loop per tap: the pipeline's stages then stay full across taps
    # (a 96-channel conv has 3 chunks a tap, fewer than the stages).
    for tap_chunk in tl.range(0, TAPS * chunks):
        tap = tap_chunk // chunks
        c = (tap_chunk - tap * chunks) * BLOCK_CHANNELS + offs_channel
        c_mask = c < channels
        w_ptrs = weight_rows + tap * channels + c[None, :]
        s_ptrs = sample_starts + tap * dilation * channels + c[:, None]
        w = tl.load(w_ptrs, mask=out_mask[:, None] & c_mask[None, :], other=0.0)
        s = tl.load(s_ptrs, mask=c_mask[:, None] & step_mask[None, :], other=0.0)
        acc = tl.dot(w, s, acc)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_out, mask=out_mask, other=0.0).to(tl.float32)[:, None]
    out = acc.to(tl.bfloat16, fp_downcast_rounding="rtne")
    columns = tl.num_programs(2) * steps
    out_ptrs = out_ptr + offs_out[:, None].to(tl.int64) * columns + (stream * steps + offs_step)[None, :]
    tl.store(out_ptrs, out, mask=out_mask[:, None] & step_mask[None, :])


def suits(x: Tensor, tap_major_weight: Tensor, bias: Tensor | None, steps: int) -> bool:
    """Whether the kernel takes these operands: a Hopper (or later) GPU, bf16 x [B, C, T] giving at least
    `MIN_STEPS` output `steps` a stream, a contiguous bf16 tap-major weight [O, K, C] of at least `MIN_TAPS`
    taps with C a multiple of 8 (16-byte rows), a contiguous bf16 bias [O] if any; and a grid of at least a
    block a multiprocessor. Below that (a one-stream packet's convs: 6 blocks for the 768-channel one, 120 for
    the 96-channel one) the blocks each reduce over all K * C columns while cuBLAS splits that reduction over
    the idle multiprocessors: run 161 (an H100), one-stream packets 0.73 -> 0.87 ms (one frame) and
    0.81 -> 1.06 (four) with every 128-step conv on the kernel."""
    tensors = (x, tap_major_weight) if bias is None else (x, tap_major_weight, bias)
    if steps < MIN_STEPS or not all(t.is_cuda and t.dtype == torch.bfloat16 for t in tensors):
        return False
    if x.dim() != 3 or tap_major_weight.dim() != 3 or tap_major_weight.shape[2] != x.shape[1]:
        return False
    if tap_major_weight.shape[1] < MIN_TAPS or x.shape[1] % 8 or not tap_major_weight.is_contiguous():
        return False
    if bias is not None and not (bias.dim() == 1 and bias.is_contiguous()):
        return False
    if torch.cuda.get_device_capability(x.device)[0] < 9:
        return False
    return grid_blocks(tap_major_weight.shape[0], steps, x.shape[0]) >= _multiprocessors(x.device)


def grid_blocks(out_channels: int, steps: int, streams: int) -> int:
    """The blocks of a launch at `blocks_for`'s tiling: output channel tiles x step tiles x streams."""
    tiling = blocks_for(out_channels)
    return triton.cdiv(out_channels, tiling.out) * triton.cdiv(steps, tiling.steps) * streams


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def conv_rows(
    samples: Tensor,
    tap_major_weight: Tensor,
    bias: Tensor | None,
    dilation: int,
    batch: int,
    blocks: ConvBlocks | None = None,
    dependent: bool = False,
) -> Tensor:
    """The conv (no padding) of time-major samples [B * L, C] (contiguous; stream b's at rows b * L..) with
    the tap-major weight [O, K, C] (+ bias) as rows [O, B * T], T = L - (K - 1) * dilation: column b * T + t
    is step t of stream b. `blocks`: the tiling (default `blocks_for`; benchmarks try others). `dependent`:
    launch it with programmatic dependent launch (triton_dependent)."""
    out_channels, taps, channels = tap_major_weight.shape
    length = samples.shape[0] // batch
    steps = length - (taps - 1) * dilation
    out = torch.empty(out_channels, batch * steps, dtype=samples.dtype, device=samples.device)
    tiling = blocks or blocks_for(out_channels)
    grid = (triton.cdiv(out_channels, tiling.out), triton.cdiv(steps, tiling.steps), batch)
    _conv_rows_kernel[grid](
        tap_major_weight,
        samples,
        bias if bias is not None else tap_major_weight,
        out,
        out_channels,
        channels,
        length,
        steps,
        dilation,
        TAPS=taps,
        HAS_BIAS=bias is not None,
        BLOCK_OUT=tiling.out,
        BLOCK_STEPS=tiling.steps,
        BLOCK_CHANNELS=tiling.channels,
        DEPENDENT=dependent,
        num_warps=tiling.warps,
        num_stages=tiling.stages,
        launch_pdl=dependent,
    )
    return out

"""CUDA-graph codec decode over a pool of stream states: the GPU codec backend of `VoiceDesignEngine`.

Why: an eager `SpeechDecoder.forward` is a few hundred small kernels per pass driven from Python (before
the fusions in codec.py and with a pass per frame, about 23 ms per packet on the H200 in the first device
run, more than the frame step itself). Here one packet of B sessions is one graph replay.

Layout: every state tensor of `CodecStreamState` lives once, in a pool with one row per engine cache slot plus
a scratch row (the last). A graph is captured per (batch bucket, frames per packet); it gathers its rows'
states by slot index (one kernel, `ops.gather_rows`), runs `SpeechDecoder.forward` (the module's own code,
unchanged: one pass through the decoder for all the packet's frames; it skips compacting the state, which the
scatter copies anyway), and scatters the updated states back (one kernel, `ops.scatter_rows_`, plus a torch
copy for the one state entry that is a strided view), all inside the graph. Padded rows of a partly filled
bucket use the scratch row, whose contents never matter. A session's stream starts when `reset(slot)` zeroes
its row.

Stream: everything that touches the pool (resets, replays) runs on the backend's own CUDA stream
(`stream`; the engine decodes inside it), so a packet's decode overlaps the frame the engine launched
ahead of it on the main stream instead of queueing behind it. The stream has high priority, so the
packet's kernels are scheduled ahead of the frame's when both wait for SMs (the packet is what a listener
waits for; the frame has 80 ms of audio to run ahead). The pool is made on the caller's stream, which
`stream` then waits for; graphs are captured on a capture stream of their own (see __init__).

A graph's activations grow with bucket x frames: the (64, 4) graph's float32 peak is about 2.5 GB by its
shapes (PASS_FRAMES in codec.py), in the pool all graphs share.

Numerics: the same module code as the eager decoder on the same dtype; float32 decoders run with TF32
disabled (`fp32_codec`), so float32 stays float32. A graph's GEMMs see N = bucket x frames columns, and
cuBLAS rounds a column differently for a different N: several sessions decoded in one batch may round
differently from each decoded alone, and a stream differently from its one-shot decode, at the float32
rounding of the decoder (a few 1e-6 on CPU; codec.py); the codes, which are what parity is defined on, are
unaffected.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..kernels import ops
from ..model.codec import CodecStreamState, SpeechDecoder
from .capture import capture_after_warm_up

if TYPE_CHECKING:
    from .engine import VoiceDesignEngine

BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
MAX_PACKET_FRAMES = 4
"""Packets of 1..4 frames (the engine's and the server's packet sizes) are captured, each as one pass;
longer ones are split."""


@contextmanager
def fp32_codec() -> Iterator[None]:
    """Disable TF32 for the duration: PyTorch runs float32 convolutions in TF32 by default, which costs the
    float32 codec ~3 decimal digits (max error 1.4e-3 against float64 in the first device run)."""
    cudnn, matmul = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = cudnn
        torch.backends.cuda.matmul.allow_tf32 = matmul


def _state_tensors(state: CodecStreamState) -> list[Tensor]:
    """The state's tensors in one fixed order: position, the K/V caches, then the histories by name."""
    return [state.position, *state.kv, *(state.history[name] for name in sorted(state.history))]


def _gather(pool: CodecStreamState, index: Tensor) -> CodecStreamState:
    """The pool rows `index` of every state tensor, by one kernel (`ops.gather_rows`)."""
    names = sorted(pool.history)
    position, *rest = ops.gather_rows(_state_tensors(pool), index)
    layers = len(pool.kv)
    return CodecStreamState(
        position=position, kv=rest[:layers], history=dict(zip(names, rest[layers:], strict=True))
    )


def _scatter(pool: CodecStreamState, index: Tensor, state: CodecStreamState) -> None:
    """Copy the decoded rows back, by one kernel (`ops.scatter_rows_`; the pre_conv's context, a view of the
    time-major codebook embeddings, goes through torch); the sources may be views into the last frame's
    activations (the decoder runs with `compact=False`, since this copy gives the pool rows their values
    anyway)."""
    ops.scatter_rows_(_state_tensors(pool), index, _state_tensors(state))


@dataclass
class _Packet:
    """One (bucket, frames) graph: its static inputs and output."""

    codes: Tensor  # [bucket, quantizers, frames] int64
    index: Tensor  # [bucket] int64 pool rows
    graph: torch.cuda.CUDAGraph
    wave: Tensor  # [bucket, frames * hop]


class CodecGraphs:
    """Graph-captured streaming decode for the sessions of one engine; see the module docstring."""

    def __init__(self, decoder: SpeechDecoder, slots: int, buckets: tuple[int, ...] = BUCKETS) -> None:
        if not decoder.first_codebook.is_cuda:
            raise ValueError("CodecGraphs needs the speech decoder on a CUDA device")
        self.decoder = decoder
        self.scratch = slots
        self.buckets = tuple(sorted(buckets))
        self.pool = decoder.new_stream_state(slots + 1)
        self._packets: dict[tuple[int, int], _Packet] = {}
        self._graph_pool = torch.cuda.graph_pool_handle()
        self._fp32 = decoder.first_codebook.dtype == torch.float32
        self.stream = torch.cuda.Stream(device=decoder.first_codebook.device, priority=-1)
        self.stream.wait_stream(torch.cuda.current_stream())  # the pool's zeros
        # Captured on a stream of their own, not torch's shared default capture stream: cuBLAS keeps a
        # workspace per stream and a graph embeds the one it was captured with, so the codec graphs must not
        # share the frame graphs' workspace while the two replay concurrently.
        self._capture_stream = torch.cuda.Stream(device=decoder.first_codebook.device)

    def reset(self, slot: int) -> None:
        """Start a new stream in pool row `slot` (frame 0, empty histories), on `stream`."""
        pool = self.pool
        with torch.cuda.stream(self.stream):
            pool.position[slot] = 0
            # The ~30 cache and history rows share the codec's dtype, so they zero in one multi-tensor launch
            # instead of a launch each: a session start runs this on the host before its prefill can launch.
            torch._foreach_zero_([tensor[slot] for tensor in [*pool.kv, *pool.history.values()]])

    def decode(self, slots: list[int], codes: Tensor) -> Tensor:
        """The next n frames of the streams in `slots`: codes [B, quantizers, n] -> wave [B, n * hop]."""
        batch, _, frames = codes.shape
        if frames > MAX_PACKET_FRAMES:
            parts = [
                self.decode(slots, codes[..., i : i + MAX_PACKET_FRAMES])
                for i in range(0, frames, MAX_PACKET_FRAMES)
            ]
            return torch.cat(parts, dim=1)
        top = self.buckets[-1]
        if batch > top:
            parts = [self.decode(slots[i : i + top], codes[i : i + top]) for i in range(0, batch, top)]
            return torch.cat(parts)
        bucket = self._bucket(batch)
        packet = self._packet(bucket, frames)
        packet.codes[:batch].copy_(codes, non_blocking=True)
        # From pinned memory: a pageable copy would wait for the stream, i.e. for earlier decodes.
        index = torch.tensor(slots + [self.scratch] * (bucket - batch), dtype=torch.int64).pin_memory()
        packet.index.copy_(index, non_blocking=True)
        packet.graph.replay()
        return packet.wave[:batch].clone()

    def capture_all(self, batches: Iterable[int] | None = None) -> None:
        """Capture every packet size for the buckets of `batches` (default: all buckets) now, e.g. at
        server start, instead of on first use."""
        wanted = self.buckets if batches is None else {self._bucket(b) for b in batches}
        for bucket in sorted(wanted):
            for frames in range(1, MAX_PACKET_FRAMES + 1):
                self._packet(bucket, frames)
        self.stream.wait_stream(torch.cuda.current_stream())  # the warm-ups advanced the scratch row

    def _bucket(self, batch: int) -> int:
        return next((b for b in self.buckets if b >= batch), self.buckets[-1])

    def _packet(self, bucket: int, frames: int) -> _Packet:
        packet = self._packets.get((bucket, frames))
        if packet is not None:
            return packet
        device = self.decoder.first_codebook.device
        quantizers = self.decoder.config.num_quantizers
        codes = torch.zeros(bucket, quantizers, frames, dtype=torch.int64, device=device)
        index = torch.full((bucket,), self.scratch, dtype=torch.int64, device=device)

        def run() -> Tensor:
            state = _gather(self.pool, index)
            wave = self.decoder(codes, state, compact=False)
            _scatter(self.pool, index, state)
            return wave

        graph, wave = self._capture(run)
        packet = _Packet(codes, index, graph, wave)
        self._packets[(bucket, frames)] = packet
        return packet

    def _capture(self, run: Callable[[], Tensor]) -> tuple[torch.cuda.CUDAGraph, Tensor]:
        """`capture_after_warm_up` on the capture stream, in the codec's precision. The warm-up run advances
        only the scratch row (the index is all scratch at capture)."""
        with fp32_codec() if self._fp32 else _nothing():
            return capture_after_warm_up(run, self._graph_pool, self._capture_stream)


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def install(engine: VoiceDesignEngine, codec: CodecGraphs | None = None) -> Callable[[], None]:
    """Make graph-captured decoding the engine's codec path (sessions opened afterwards use it); returns a
    function that restores the eager path. Call after `graphs.install`, which may grow the slot count."""
    if engine.decoder is None:
        raise ValueError("the engine has no speech decoder")
    backend = codec or CodecGraphs(engine.decoder, engine.cache.k.shape[1])
    previous = engine.codec_backend
    engine.codec_backend = backend

    def undo() -> None:
        engine.codec_backend = previous

    return undo

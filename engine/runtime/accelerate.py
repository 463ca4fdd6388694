"""The one place that puts an engine on its CUDA fast paths: frame graphs, then codec graphs, captured now.

`accelerate(engine, mode)` is what `VoiceDesignEngine.load` does on CUDA (so the server and the CLI get
it) and what `qwen3-tts bench` does to the engines it times. On CPU it does nothing: the eager engine is
the reference there.

Order (as runtime/codec_graphs.install asks): `graphs.install` first, because it may grow the KV pool by
its scratch slot; then the codec graphs, whose state pool has one row per KV slot. Both are captured
before the engine is handed out (server start, not a request's first frame): the frame graph of every
batch bucket, the complete-frames graph of every bucket (frame 0 after a prefill), and the codec graph of
every (bucket, packet size).

The garbage collector: once everything is captured, the objects alive (modules, weights, graphs, the
libraries' own) are frozen (`gc.freeze`), so the collections a request's allocations trigger stop walking
that long-lived heap: a solo fast request took 1.5 ms less with the collector off on run 85's machine
(benchmarks/results/2026-12-01-run85), the same on run 86's. `undo` unfreezes.

Buckets: the graph buckets are the powers of two below the engine's session count plus that count itself
(8 sessions: 1, 2, 4, 8; 6: 1, 2, 4, 6; 16: 1, 2, 4, 8, 16), so a full engine runs in one replay with no
padded rows, and a graph is never captured for a batch the engine cannot hold.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import torch

from . import codec_graphs, graphs
from .modes import Mode, resolve_mode
from .sampling import SamplingRows
from .step import UNIFORMS_PER_FRAME, FrameRows

if TYPE_CHECKING:
    from .engine import VoiceDesignEngine


def buckets_for(sessions: int, ladder: Iterable[int] = graphs.BUCKETS) -> tuple[int, ...]:
    """Graph buckets for an engine of `sessions` slots: the ladder's sizes below it, and it."""
    if sessions < 1:
        raise ValueError("an engine has at least one session slot")
    return tuple(sorted({b for b in ladder if b < sessions} | {sessions}))


def accelerate(
    engine: VoiceDesignEngine,
    mode: Mode | str | None = None,
    *,
    capture: bool = True,
) -> Callable[[], None]:
    """Install the CUDA frame and codec graphs of `mode` (default: QWEN3_TTS_MODE, else exact) on a CUDA
    engine and, unless `capture` is False, capture every graph now (otherwise each is captured on first
    use); returns a function that restores the eager backends (the grown KV pool stays). No-op on CPU.
    """
    if engine.device.type != "cuda":
        return lambda: None
    chosen = mode if isinstance(mode, Mode) else resolve_mode(mode)
    buckets = buckets_for(engine.max_sessions)
    backend = graphs.GraphFrameBackend(engine.talker, engine.predictor, chosen, buckets=buckets)
    undo_frames = graphs.install(engine, backend)  # first: it may grow the KV pool by the scratch slot
    undo_codec: Callable[[], None] = lambda: None  # noqa: E731
    codec: codec_graphs.CodecGraphs | None = None
    if engine.decoder is not None:
        codec = codec_graphs.CodecGraphs(engine.decoder, engine.cache.k.shape[1], buckets=buckets)
        undo_codec = codec_graphs.install(engine, codec)

    def undo() -> None:
        gc.unfreeze()
        undo_codec()
        undo_frames()

    if capture:
        template, text = _template(engine)
        backend.capture_all(engine.cache, engine.slot_state, template, text)
        if codec is not None:
            codec.capture_all()
        torch.cuda.synchronize(engine.device)
    gc.collect()
    gc.freeze()
    return undo


def _template(engine: VoiceDesignEngine) -> tuple[FrameRows, torch.Tensor]:
    """Rows and a text row of the shapes and dtypes a step feeds the frame graphs (values do not matter:
    capture runs on the scratch slot)."""
    device = engine.device
    talker = engine.config.talker
    sampling = SamplingRows.single(greedy=False, temperature=1.0, top_k=0, top_p=1.0, device=device)
    rows = FrameRows(
        uniforms=torch.full((1, UNIFORMS_PER_FRAME), 0.5, dtype=torch.float64, device=device),
        cb0_history=torch.zeros(1, talker.vocab_size, dtype=torch.bool, device=device),
        frames_generated=torch.zeros(1, dtype=torch.int64, device=device),
        talker_sampling=sampling,
        predictor_sampling=sampling,
    )
    embedding = engine.talker.codec_embedding
    text = torch.zeros(1, embedding.shape[1], dtype=embedding.dtype, device=device)
    return rows, text

"""A CUDA graph captured after one warm-up run: the frame, prompt and packed-pass graphs (`graphs.py`) and the
codec's packet graphs (`codec_graphs.py`) are all made this way."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE  # `torch.cuda.graph_pool_handle()`'s type


def capture_after_warm_up(
    run: Callable[[], Tensor], pool: _POOL_HANDLE, stream: torch.cuda.Stream | None = None
) -> tuple[torch.cuda.CUDAGraph, Tensor]:
    """Run `run` once on a side stream (lazy inits, cuBLAS workspaces, cuDNN's algorithm choice), then capture
    it into the memory pool `pool` (on `stream`, torch's capture stream when None): the graph and the output
    tensor its replays refill. One warm-up run: a second initialises nothing the first did not, and the
    warm-ups of the packed passes' graphs (up to 16,384 rows each) were most of an engine's start
    (run 137)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph, pool=pool, stream=stream):
        out = run()
    return graph, out

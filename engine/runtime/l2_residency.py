"""Part of the code predictor's weights kept in L2 for the whole frame (a persisting access window).

Why: a frame runs the predictor's 5 blocks 15 times over the same matrices (150 MB in bf16, 75 MB in 8 bits),
so at one stream 2.25 GB of the exact frame's 5.26 GB of weight reads are re-reads. As a normal cache the
H200's L2 keeps none of them: the talker's stream and the predictor's own matrices, each larger than L2,
evict every line before its next read. With CUDA's L2 set-aside, the lines an access window marks
persisting are evicted only by other persisting lines, so a fixed fraction of the predictor's lines (set
aside / window bytes, chosen by address) stays cached and each predictor step reads that fraction from L2.

How: `graphs.KernelFrame` lays the predictor's GEMV matrices out in one allocation (`predictor_weights`),
`plan` sizes the window and the set-aside to the device, and `GraphFrameBackend` sets the L2 aside and
stamps the window on the kernels of the graphs it captures (kernels/csrc/launch.cuh). The fraction is at
most set-aside / window, so persisting lines never evict each other; a larger fraction would thrash (a step
reads the window in order, which LRU serves worst). No effect on numerics: it changes where bytes come from.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from ..kernels import ops


@dataclass(frozen=True)
class L2Residency:
    """A persisting window over `region` with `hit_ratio` of its lines persisting, and the L2 set aside."""

    region: Tensor
    hit_ratio: float
    set_aside: int


def plan(weights: Tensor, set_aside: int | None = None) -> L2Residency | None:
    """The window over the start of `weights` (one allocation) that the device allows, with `set_aside`
    bytes of L2 (default: the most the device allows, capped at the window), or None where there is no
    persisting L2 (CPU, no extension, a device without it) or `set_aside` is 0."""
    if not weights.is_cuda:
        return None
    limits = ops.l2_persisting_limits()
    if limits is None:
        return None
    _, most_set_aside, largest_window = limits
    window = min(weights.numel() * weights.element_size(), largest_window)
    chosen = min(most_set_aside if set_aside is None else set_aside, most_set_aside, window)
    if chosen <= 0 or window <= 0:
        return None
    region = weights.view(-1).view(torch.uint8)[:window]
    return L2Residency(region, chosen / window, chosen)


def reserve(residency: L2Residency | None) -> None:
    """Set the L2 aside for `residency` (none for None). Process-wide: the last call wins."""
    ops.set_l2_persisting_size(0 if residency is None else residency.set_aside)


@contextmanager
def stamped(residency: L2Residency | None) -> Iterator[None]:
    """Kernels launched inside (a graph captured inside) carry `residency`'s window."""
    if residency is None:
        yield
        return
    ops.set_l2_persisting_window(residency.region, residency.hit_ratio)
    try:
        yield
    finally:
        ops.set_l2_persisting_window(None)

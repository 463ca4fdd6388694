"""Host-to-device copies that do not stall the stream.

Why: a copy from pageable host memory synchronizes the CUDA stream (it waits for the work queued before it),
so a few small uploads per prompt pass or frame would each wait for the GPU. From pinned memory the copy is
asynchronous; torch's pinned allocator keeps the host buffer until the copy has run.
"""

from __future__ import annotations

import torch
from torch import Tensor


def upload(host: Tensor, device: torch.device) -> Tensor:
    """`host` (a CPU tensor) on `device`, without waiting for the stream on CUDA."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def upload_into(target: Tensor, host: Tensor) -> None:
    """Copy `host` (a CPU tensor) into `target`, without waiting for the stream on CUDA."""
    if target.device.type != "cuda":
        target.copy_(host)
        return
    target.copy_(host.pin_memory(), non_blocking=True)

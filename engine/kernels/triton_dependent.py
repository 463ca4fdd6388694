"""Triton kernels as links of the chains of dependently launched kernels (kernels/csrc/launch.cuh).

Why: the frame's and the codec's CUDA kernels are launched with programmatic dependent launch, so each is
scheduled while the kernel before it finishes and its launch overlaps that kernel's tail. A Triton kernel
launched plainly breaks the chain on both sides: it is scheduled only once its predecessor has finished, and
its successor only once it has. Launched with `launch_pdl` (when `ops.dependent_launch()`) and starting with
`begin_dependent_kernel`, it keeps launch.cuh's contract. The 64-row frame has 294 such kernels (the MLP's
and o products): its replay 5.07 -> 4.72 ms in both modes (benchmarks/results/2026-12-07-run164, an H100).
Asking for a block's weights into L2 before the wait (a bulk prefetch a weight row) was slower there (4.85
ms): it is not done.

Only imported where Triton is (ops.py guards it).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def begin_dependent_kernel(DEPENDENT: tl.constexpr):  # type: ignore[no-untyped-def]
    """common.cuh's `begin_dependent_kernel`: wait until the previous kernel has finished and its writes are
    visible, then let the next kernel be scheduled. Before it a kernel reads and writes no global memory.
    Nothing without dependent launch (`DEPENDENT` false: the wait would need a Hopper GPU's PTX)."""
    if DEPENDENT:
        gdc_wait()
        gdc_launch_dependents()

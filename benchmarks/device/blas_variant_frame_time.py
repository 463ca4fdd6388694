"""`frame_time.py` with torch's cuBLAS settings of one variant, set before the engine loads (so its graphs are
captured with them): run it in alternating processes, one variant each, to compare the settings.

Variants (`--blas`, comma-joined): `lt` routes torch's GEMMs through cuBLASLt (`preferred_blas_library`);
`nosplit` forbids split-K for bf16 GEMMs (`allow_bf16_reduced_precision_reduction = (False, False)`, which
cuBLASLt honours as its reduction-scheme mask); `base` changes nothing.

Why: at 64 streams cuBLAS runs 103 of the frame's products as split-K GEMMs, each followed by a
`splitKreduce_kernel` of ~2 us (run 111's profile), and inside a graph neither gets a dependent launch.

Usage: python benchmarks/device/blas_variant_frame_time.py --blas lt,nosplit --model SNAP --out DIR --tag T
"""

from __future__ import annotations

import sys

import torch
from frame_time import main

VARIANTS = ("base", "lt", "nosplit")


def apply(variants: list[str]) -> None:
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown --blas variant(s) {sorted(unknown)}; choose from {VARIANTS}")
    if "lt" in variants:
        torch.backends.cuda.preferred_blas_library("cublaslt")
    if "nosplit" in variants:
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = (False, False)
    print(
        "blas:",
        torch.backends.cuda.preferred_blas_library(),
        torch._C._get_cublas_allow_bf16_reduced_precision_reduction(),
        flush=True,
    )


if __name__ == "__main__":
    arguments = sys.argv[1:]
    if "--blas" not in arguments:
        raise SystemExit("--blas VARIANTS is required (comma-joined: " + ", ".join(VARIANTS) + ")")
    at = arguments.index("--blas")
    apply([name.strip() for name in arguments[at + 1].split(",") if name.strip()])
    sys.argv = [sys.argv[0], *arguments[:at], *arguments[at + 2 :]]
    raise SystemExit(main())

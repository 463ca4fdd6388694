"""Build and load the CUDA extension on first use (ninja), cached per source hash, torch, CUDA and arch.

The extension is optional: `load()` returns None on a machine without CUDA, without a compiler, or when
QWEN3_TTS_KERNELS=off, and `ops` then runs the torch references. A failed build is reported once (as a
warning) and not retried in the same process.
"""

from __future__ import annotations

import hashlib
import os
import threading
import warnings
from pathlib import Path
from types import ModuleType

import torch

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = (
    "bindings.cpp",
    "norm.cu",
    "rope_cache.cu",
    "attention.cu",
    "swiglu.cu",
    "quantize.cu",
    "gemv.cu",
    "tensor_core_linear.cu",
    "sampling.cu",
    "snake.cu",
    "unfold.cu",
    "codec_attention.cu",
    "embedding.cu",
    "row_copy.cu",
)
HEADERS = (
    "common.cuh",
    "fp8.cuh",
    "kv_cache.cuh",
    "launch.cuh",
    "launchers.h",
    "rope.cuh",
    "snake.cuh",
    "weight_load.cuh",
)
DISABLE_ENV = "QWEN3_TTS_KERNELS"
CACHE_ENV = "QWEN3_TTS_KERNEL_CACHE"

_lock = threading.Lock()
_module: ModuleType | None = None
_tried = False
_error: str | None = None


def arch_flags(capability: tuple[int, int]) -> list[str]:
    """nvcc targets for one device: sm_90a on Hopper (wgmma/setmaxnreg legal), plain sm_XY elsewhere."""
    major, minor = capability
    if (major, minor) == (9, 0):
        return ["-gencode=arch=compute_90a,code=sm_90a"]
    return [f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}"]


def source_hash() -> str:
    digest = hashlib.sha256()
    for name in (*SOURCES, *HEADERS):
        digest.update(name.encode())
        digest.update((CSRC / name).read_bytes())
    return digest.hexdigest()[:16]


def cache_dir(capability: tuple[int, int]) -> Path:
    """<cache root>/kernels/<sources>-torch<ver>-cu<ver>-sm<XY>: a new key never reuses a stale build."""
    root = os.environ.get(CACHE_ENV)
    if root is None:
        import platformdirs

        root = platformdirs.user_cache_dir("qwen3-tts-native")
    cuda = (torch.version.cuda or "none").replace(".", "")
    key = f"{source_hash()}-torch{torch.__version__.split('+')[0]}-cu{cuda}-sm{capability[0]}{capability[1]}"
    return Path(root) / "kernels" / key


def disabled() -> bool:
    return os.environ.get(DISABLE_ENV, "").lower() in {"0", "off", "false", "no"}


def build(verbose: bool = False) -> ModuleType:
    """Compile (or load the cached build of) the extension for the current CUDA device; raises on failure."""
    from torch.utils.cpp_extension import load as load_extension

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device")
    capability = torch.cuda.get_device_capability()
    directory = cache_dir(capability)
    directory.mkdir(parents=True, exist_ok=True)
    return load_extension(
        name="qwen3_tts_kernels",
        sources=[str(CSRC / name) for name in SOURCES],
        extra_cflags=["-O3"],
        extra_cuda_cflags=["-O3", *arch_flags(capability), "-lineinfo"],
        build_directory=str(directory),
        verbose=verbose,
    )


def load() -> ModuleType | None:
    """The extension module, or None when it is unavailable (see module docstring)."""
    global _module, _tried, _error
    if _module is not None or _tried:
        return _module
    with _lock:
        if _tried:
            return _module
        _tried = True
        if disabled() or not torch.cuda.is_available():
            return None
        try:
            _module = build()
        except Exception as error:  # a missing compiler, headers or an nvcc error: fall back, say why once
            _error = f"{type(error).__name__}: {error}"
            warnings.warn(
                f"qwen3-tts CUDA kernels unavailable, using torch references ({_error})", stacklevel=2
            )
    return _module


def load_error() -> str | None:
    """Why the last `load()` returned None after trying to build, if it did."""
    return _error

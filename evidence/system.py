"""A description of the measuring host for the manifest, without identifying it (the hostname is an alias)."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Any

from .. import __version__
from .telemetry import gpu_status


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace").strip() or None
    except OSError:
        return None


def _os_name() -> str:
    text = _read("/etc/os-release") or ""
    for line in text.splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip().strip('"')
    return platform.platform()


def _cpu_name() -> str:
    for line in (_read("/proc/cpuinfo") or "").splitlines():
        if line.lower().startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _nvml_details() -> tuple[str, int, str | None, str | None]:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
            names = sorted(
                {str(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))) for i in range(count)}
            )
            driver = str(pynvml.nvmlSystemGetDriverVersion())
            cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return ", ".join(names), count, driver, f"{cuda // 1000}.{cuda % 1000 // 10}"
    except Exception:  # any NVML failure means no GPU facts
        return "none (CPU only)", 0, None, None


def describe_system(hostname_alias: str) -> dict[str, Any]:
    """The manifest's ``system`` object for this host."""
    import psutil

    available, detail = gpu_status()
    accelerator, count, driver, cuda = _nvml_details() if available else ("none (CPU only)", 0, None, None)
    notes = [f"GPU telemetry: {detail}"]
    if not available:
        notes.append("gpu: unavailable - no power, GPU memory or GPU process figures were recorded")
    return {
        "host_model": _read("/sys/devices/virtual/dmi/id/product_name") or "unrecorded",
        "hostname_alias": hostname_alias,
        "os": _os_name(),
        "kernel": platform.release() or "unrecorded",
        "architecture": platform.machine() or "unrecorded",
        "cpu": _cpu_name() or "unrecorded",
        "cpu_count": os.cpu_count() or 1,
        "memory_bytes": int(psutil.virtual_memory().total),
        "accelerator": accelerator,
        "accelerator_count": count,
        "driver_version": driver,
        "cuda_version": cuda,
        "gpu_telemetry": "nvml" if available else "unavailable",
        "gpu_telemetry_detail": detail,
        "power_measurement_source": "NVML nvmlDeviceGetPowerUsage (board power)"
        if available
        else "unavailable: no GPU telemetry on this host",
        "python_version": sys.version.split()[0],
        "client_version": __version__,
        "notes": notes,
    }

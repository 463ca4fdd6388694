"""Telemetry sampling at a fixed interval (100 ms by default), in a process of its own.

A separate process keeps the sampling cadence independent of the client's event loop and GIL, so a gap in
the record means the machine was starved, not that the client was busy parsing. Each sample is one JSONL
line flushed at once (a crash loses nothing already sampled) with:

- per monitored GPU (NVML via nvidia-ml-py): power, memory used/total, utilization, SM/memory clocks;
- every compute process on those GPUs, marked target (the server's process tree) or competing;
- the server process tree's RSS and CPU share, system CPU share and available memory (psutil).

Without a usable NVML the samples say ``"gpu": "unavailable"`` and carry the CPU-side figures only.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.synchronize
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .jsonio import jsonl_line

TELEMETRY_SCHEMA = "qwen3-tts-native-telemetry/v1"
DEFAULT_INTERVAL_MS = 100
MAXIMUM_GAP_MS = 200
_READY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class TelemetryConfig:
    """What to sample: the server's root pids and the GPU indices (None: every visible GPU)."""

    path: Path
    interval_ms: int = DEFAULT_INTERVAL_MS
    server_pids: tuple[int, ...] = ()
    gpu_indices: tuple[int, ...] | None = None


def _process_tree(pids: tuple[int, ...]) -> dict[int, Any]:
    import psutil

    tree: dict[int, Any] = {}
    for pid in pids:
        try:
            root = psutil.Process(pid)
            tree[pid] = root
            for child in root.children(recursive=True):
                tree[child.pid] = child
        except psutil.Error:
            continue
    return tree


class _Nvml:
    """NVML handles and queries; every query failure degrades to None and marks the sample incomplete."""

    def __init__(self, indices: tuple[int, ...] | None) -> None:
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        wanted = indices if indices is not None else tuple(range(count))
        missing = [i for i in wanted if not 0 <= i < count]
        if missing:
            raise RuntimeError(f"GPU indices {missing} not present ({count} visible)")
        self.handles = [(i, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in wanted]
        self.uuids = {i: str(pynvml.nvmlDeviceGetUUID(h)) for i, h in self.handles}

    def sample(self, targets: set[int]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], bool]:
        nvml = self.nvml
        complete = True
        gpus: list[dict[str, Any]] = []
        processes: list[dict[str, Any]] = []

        def query(fn: Any, *args: Any) -> Any:
            nonlocal complete
            try:
                return fn(*args)
            except nvml.NVMLError:
                complete = False
                return None

        for index, handle in self.handles:
            power = query(nvml.nvmlDeviceGetPowerUsage, handle)
            memory = query(nvml.nvmlDeviceGetMemoryInfo, handle)
            util = query(nvml.nvmlDeviceGetUtilizationRates, handle)
            gpus.append(
                {
                    "index": index,
                    "uuid": self.uuids[index],
                    "power_w": power / 1000.0 if power is not None else None,
                    "memory_used_bytes": int(memory.used) if memory is not None else None,
                    "memory_total_bytes": int(memory.total) if memory is not None else None,
                    "utilization_gpu_percent": float(util.gpu) if util is not None else None,
                    "utilization_memory_percent": float(util.memory) if util is not None else None,
                    "sm_clock_mhz": query(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM),
                    "memory_clock_mhz": query(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_MEM),
                }
            )
            for proc in query(nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []:
                used = getattr(proc, "usedGpuMemory", None)
                processes.append(
                    {
                        "gpu_index": index,
                        "pid": int(proc.pid),
                        "used_memory_bytes": int(used) if used is not None else None,
                        "target": int(proc.pid) in targets,
                    }
                )
        return gpus, processes, complete


def _sampler_main(
    config: TelemetryConfig, ready: multiprocessing.synchronize.Event, stop: multiprocessing.synchronize.Event
) -> None:
    """Sample every interval until ``stop`` is set; a late sample is taken at once, then the schedule
    continues from it, so starvation shows up as one gap of its own length. The sampler asks for a higher
    scheduling priority (granted to root) so that client or server load starves it less."""
    import psutil

    with contextlib.suppress(OSError):
        os.nice(-10)
    nvml: _Nvml | None = None
    try:
        nvml = _Nvml(config.gpu_indices)
    except Exception:  # any NVML failure means CPU-only telemetry, which samples say
        nvml = None
    cached: dict[int, Any] = {}
    psutil.cpu_percent(interval=None)
    interval_ns = config.interval_ms * 1_000_000
    sequence = 0
    with config.path.open("ab", buffering=0) as out:
        next_ns = time.monotonic_ns()
        while True:
            tree = _process_tree(config.server_pids)
            for pid, proc in tree.items():
                if pid not in cached:
                    cached[pid] = proc
                    with contextlib.suppress(psutil.Error):
                        proc.cpu_percent(interval=None)
            rss = 0
            cpu = 0.0
            complete = True
            for pid in tree:
                try:
                    rss += int(cached[pid].memory_info().rss)
                    cpu += float(cached[pid].cpu_percent(interval=None))
                except psutil.Error:
                    complete = False
            gpus: list[dict[str, Any]] = []
            processes: list[dict[str, Any]] = []
            if nvml is not None:
                gpus, processes, gpu_complete = nvml.sample(set(tree))
                complete = complete and gpu_complete
            record = {
                "schema_version": TELEMETRY_SCHEMA,
                "sequence": sequence,
                "monotonic_ns": time.monotonic_ns(),
                "wall_time_unix_ns": time.time_ns(),
                "gpu": "nvml" if nvml is not None else "unavailable",
                "gpus": gpus,
                "gpu_processes": processes,
                "target_pids": sorted(tree),
                "target_rss_bytes": rss if tree else None,
                "target_cpu_percent": cpu if tree else None,
                "system_cpu_percent": float(psutil.cpu_percent(interval=None)),
                "system_memory_available_bytes": int(psutil.virtual_memory().available),
                "competing_gpu_processes": len({p["pid"] for p in processes if not p["target"]}),
                "sample_complete": complete,
            }
            out.write(jsonl_line(record))
            sequence += 1
            if sequence == 1:
                ready.set()
            if stop.is_set():
                break
            now = time.monotonic_ns()
            next_ns = max(next_ns + interval_ns, now)
            stop.wait((next_ns - now) / 1e9)
    if nvml is not None:
        with contextlib.suppress(Exception):
            nvml.nvml.nvmlShutdown()


class TelemetrySampler:
    """Starts the sampler process, waits for its first sample, and stops it after one final sample."""

    def __init__(self, config: TelemetryConfig) -> None:
        context = multiprocessing.get_context("spawn")
        self.config = config
        self._ready = context.Event()
        self._stop = context.Event()
        self._process = context.Process(
            target=_sampler_main,
            args=(config, self._ready, self._stop),
            name="qwen3-tts-telemetry",
            daemon=True,
        )

    def __enter__(self) -> TelemetrySampler:
        self._process.start()
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while not self._ready.wait(0.1):
            if not self._process.is_alive() or time.monotonic() > deadline:
                self._process.kill()
                raise RuntimeError("the telemetry sampler did not produce a first sample")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop after the sampler's next sample (so the record brackets everything before this call)."""
        if self._process.pid is None or not self._process.is_alive():
            return
        self._stop.set()
        self._process.join(timeout=10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()


def gpu_status() -> tuple[bool, str]:
    """Whether NVML works here, and what it is (driver/device) or why not."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
            names = [
                str(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))) for i in range(count)
            ]
            driver = str(pynvml.nvmlSystemGetDriverVersion())
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # NVML raises library-specific errors; all mean "no GPU"
        return False, f"NVML unavailable: {type(exc).__name__}: {exc}"
    if not count:
        return False, "NVML reports no GPU"
    return True, f"{count} x {names[0]} (driver {driver})"


def discover_server_pid(port: int) -> int | None:
    """The pid listening on a local TCP port, when this user may see it."""
    import psutil

    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, PermissionError):
        return None
    for conn in connections:
        listening = conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port
        if listening and conn.pid and conn.pid != os.getpid():
            return int(conn.pid)
    return None

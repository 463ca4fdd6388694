"""``qwen3-tts bench``: single-stream RTF and TTFA, aggregate RTF under concurrency, memory, a per-frame
profile, and the same workload on the peers (faster-qwen3-tts, the official qwen-tts loop) in one run.

Timing runs use a copy of the snapshot whose EOS row of ``talker.codec_head`` is zeroed, so every request
yields exactly the frames asked for (as the peers appendix of shared/docs/peers.md did); compute is
unchanged and the JSON says so. Parity runs (tests/device) use the unaltered snapshot.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

TEXT = (
    "Ladies and gentlemen, I have just been informed that this speech is being generated faster than I can "
    "speak it. The quick brown fox jumps over the lazy dog."
)
INSTRUCT = "A warm, calm female voice with a slight smile, speaking at a relaxed pace."
FRAME_SECONDS = 0.08
EOS_TENSOR = "talker.codec_head.weight"
PEER_SCRIPTS = {"faster": "faster_qwen3_tts_peer.py", "official": "official_qwen_tts_peer.py"}


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "bench",
        help="measure RTF, time to first audio, concurrency, memory and the peers on a snapshot (CUDA)",
        description=(
            "Benchmark the engine on a snapshot: single-stream RTF and TTFA (engine-side and over HTTP), "
            "aggregate and per-stream RTF at several concurrencies, peak GPU memory, a profile of one frame, "
            "and the peers on the same snapshot. Writes benchmarks/results/bench-<mode>-<commit>.json."
        ),
    )
    parser.add_argument("--model", type=Path, required=True, metavar="DIR", help="snapshot directory")
    parser.add_argument(
        "--timing-model",
        type=Path,
        metavar="DIR",
        help="EOS-free copy used for timing (default: made next to --model as <DIR>-noeos)",
    )
    parser.add_argument(
        "--modes",
        default="exact,fast",
        help="comma list of exact, fast, fast-fp8, eager (engine without graphs); each mode runs in a "
        "process of its own, one after the other, then the peers",
    )
    parser.add_argument("--frames", type=int, default=100, help="frames per single-stream synthesis")
    parser.add_argument("--runs", type=int, default=3, help="timed single-stream syntheses")
    parser.add_argument("--ttfa-runs", type=int, default=20, help="engine-side first-audio measurements")
    parser.add_argument("--concurrency", default="1,3,6,16,64", help="comma list of concurrent streams")
    parser.add_argument("--concurrency-frames", type=int, default=48, help="frames per stream under load")
    parser.add_argument("--level-timeout-s", type=float, default=60.0, help="cut a concurrency level after S")
    parser.add_argument(
        "--level-runs",
        type=int,
        default=3,
        help="timed runs per concurrency level; the level reports the run of median aggregate RTF",
    )
    parser.add_argument("--max-context", type=int, default=512, help="talker positions per session")
    parser.add_argument("--peers", default="faster,official", help="comma list of faster, official, or none")
    parser.add_argument(
        "--peer-pythonpath",
        action="append",
        default=[],
        metavar="PEER=PATH",
        help="PYTHONPATH for a peer's process, e.g. faster=/tmp/site_faster:/tmp/site_common",
    )
    parser.add_argument("--peer-frames", type=int, default=100)
    parser.add_argument("--peer-timeout-s", type=float, default=240.0)
    parser.add_argument(
        "--http", action=argparse.BooleanOptionalAction, default=True, help="measure TTFA over HTTP"
    )
    parser.add_argument("--http-runs", type=int, default=10)
    parser.add_argument("--out-dir", type=Path, default=Path("benchmarks/results"))
    parser.add_argument(
        "--profile-dir", type=Path, help="write the per-frame profiles here (default: --out-dir)"
    )
    # Set by the parent run on the process it starts for one mode (`mode_process_command`).
    parser.add_argument("--mode-json", type=Path, help=argparse.SUPPRESS)
    parser.set_defaults(handler=run)


# ----------------------------------------------------------------------------------------------- helpers
def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def summarize(values: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values) if values else float("nan"),
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "min": min(values) if values else float("nan"),
        "max": max(values) if values else float("nan"),
        "n": len(values),
    }


def zero_eos_copy(model: Path) -> Path:
    """The snapshot's timing copy beside it (`<name>-noeos`; hard links where possible) with the EOS row of
    talker.codec_head set to zero, so that a run yields the frames it asks for. Made once, then reused."""
    from ..engine.config import load_config

    eos_id = load_config(model).talker.codec_eos_token_id
    target = model.with_name(model.name + "-noeos")
    if (target / ".eos-zeroed").exists():
        return target
    if target.exists():
        shutil.rmtree(target)
    for source in model.rglob("*"):
        destination = target / source.relative_to(model)
        if source.is_dir():
            destination.mkdir(parents=True, exist_ok=True)
            continue
        destination.parent.mkdir(parents=True, exist_ok=True)
        if source == model / "model.safetensors":
            shutil.copyfile(source, destination)
        else:
            try:
                os.link(source, destination)
            except OSError:
                shutil.copyfile(source, destination)
    path = target / "model.safetensors"
    with path.open("r+b") as handle:
        header_len = struct.unpack("<Q", handle.read(8))[0]
        header = json.loads(handle.read(header_len))
        entry = header[EOS_TENSOR]
        if entry["dtype"] != "BF16":
            raise ValueError(f"{EOS_TENSOR} is {entry['dtype']}, expected BF16")
        row_bytes = entry["shape"][1] * 2
        handle.seek(8 + header_len + entry["data_offsets"][0] + eos_id * row_bytes)
        handle.write(b"\0" * row_bytes)
    (target / ".eos-zeroed").write_text(f"{EOS_TENSOR} row {eos_id} zeroed\n")
    return target


def system_info() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version,name,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        info["driver"], _, info["gpu_memory"] = (part.strip() for part in out.split(",", 2))
    except (OSError, subprocess.SubprocessError, ValueError):
        info["driver"] = None
    if os.environ.get("COMMIT"):
        info["commit"] = os.environ["COMMIT"]
        return info
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], capture_output=True, text=True, timeout=10
        ).stdout
        info["commit"] = commit + ("-dirty" if dirty.strip() else "")
    except (OSError, subprocess.SubprocessError):
        info["commit"] = "unknown"
    return info


@contextmanager
def stage(log: dict[str, float], name: str) -> Iterator[None]:
    start = time.perf_counter()
    print(f"[bench] {name} ...", flush=True)
    try:
        yield
    finally:
        log[name] = round(time.perf_counter() - start, 2)
        print(f"[bench] {name}: {log[name]:.1f} s", flush=True)


# --------------------------------------------------------------------------------------- engine workload
def make_request(frames: int, seed: int) -> Any:
    from ..engine.runtime.request import SynthesisRequest

    return SynthesisRequest(TEXT, INSTRUCT, language="english", seed=seed, max_frames=frames)


def measure_ttfa(engine: Any, runs: int) -> dict[str, float]:
    """First audio of a 16-frame request, each from an idle GPU: a request closed after its first packet
    leaves the frame launched beside that packet's decode in flight."""
    import torch

    values = []
    for index in range(runs + 1):
        torch.cuda.synchronize()
        start = time.perf_counter()
        packets = engine.synthesize(make_request(16, seed=index))
        next(packets)
        values.append((time.perf_counter() - start) * 1000)
        packets.close()
    return summarize(values[1:])


def measure_single(engine: Any, frames: int, runs: int) -> dict[str, Any]:
    import torch

    rtfs, loop_rtfs, produced = [], [], 0
    for index in range(runs):
        torch.cuda.synchronize()
        start = time.perf_counter()
        produced = sum(p.frame_count for p in engine.synthesize(make_request(frames, seed=100 + index)))
        rtfs.append((time.perf_counter() - start) / (produced * FRAME_SECONDS))
        start = time.perf_counter()
        codes = engine.generate_codes(make_request(frames, seed=200 + index))
        loop_rtfs.append((time.perf_counter() - start) / (codes.shape[0] * FRAME_SECONDS))
    return {"frames": produced, "rtf": summarize(rtfs), "frame_loop_rtf": summarize(loop_rtfs)}


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median aggregate RTF among a level's timed runs (one host hiccup, e.g. a stalled codec
    call, moves one run, not the figure), with every run's aggregate and worst-stream RTF beside it."""
    ordered = sorted(runs, key=lambda run: run["aggregate_rtf"])
    return {
        **ordered[(len(ordered) - 1) // 2],
        "runs": [{key: run[key] for key in ("aggregate_rtf", "worst_stream_rtf")} for run in runs],
    }


def run_concurrent(
    engine: Any, streams: int, frames: int, timeout_s: float, decode_ahead: bool = True
) -> dict[str, Any]:
    """Lockstep: all streams arrive at t0 and are prefilled in one `prefill_many` call, then stepped
    together, one step in flight (the next is launched before the last is collected, as the server does);
    1-frame first packet, then 4-frame packets. The packets due after a step are decoded in one
    `launch_decode` call (batched across sessions, on the codec's stream) and collected once done, so frames
    go on while the codec works; a packet's audio counts when its PCM is on the host. Per-stream RTF counts
    from t0 to the stream's last PCM; `steps` counts the steps collected; `codec_s` is the host's time in
    decode calls (launch, and the final wait); `prefill_s` the time from t0 to every stream's frame 0.
    `decode_ahead=False` waits for each decode at once instead (the server scheduler's way;
    benchmarks/device/decode_ahead_ab.py compares the two)."""
    import torch

    sessions = [engine.start_session(make_request(frames, seed=1000 + i)) for i in range(streams)]
    buffers: dict[int, list[Any]] = {i: [] for i in range(streams)}
    packets = dict.fromkeys(range(streams), 0)
    audio = dict.fromkeys(range(streams), 0)
    finished_at: dict[int, float] = {}
    decoding: list[tuple[Any, list[tuple[int, int]], list[int]]] = []  # (pending, (stream, frames), finals)
    codec_s = 0.0
    start = time.perf_counter()
    deadline = start + timeout_s

    def launch_packets(due: list[tuple[int, bool]]) -> None:
        """Enqueue the decode of the packets that are due, all sessions in one call."""
        nonlocal codec_s
        ready = [
            i
            for i, final in due
            if buffers[i] and (final or len(buffers[i]) >= (1 if packets[i] == 0 else 4))
        ]
        finals = [i for i, final in due if final]
        if not ready:
            decoding.append((None, [], finals))
            return
        t = time.perf_counter()
        pending = engine.launch_decode([sessions[i] for i in ready], [torch.stack(buffers[i]) for i in ready])
        codec_s += time.perf_counter() - t
        decoding.append((pending, [(i, len(buffers[i])) for i in ready], finals))
        for i in ready:
            packets[i] += 1
            buffers[i] = []
        if not decode_ahead:
            collect_packets(wait=True)

    def collect_packets(wait: bool) -> None:
        """Take the decodes that are done, in launch order (all of them when `wait`)."""
        nonlocal codec_s
        while decoding and (wait or decoding[0][0] is None or decoding[0][0].done()):
            pending, counts, finals = decoding.pop(0)
            if pending is not None:
                t = time.perf_counter()
                engine.collect_decode(pending)
                codec_s += time.perf_counter() - t
            for i, n in counts:
                audio[i] += n
            now = time.perf_counter()
            for i in finals:
                finished_at[i] = now

    truncated = False
    prefill_s = None
    try:
        first = engine.prefill_many(sessions)
        prefill_s = time.perf_counter() - start
        for index, result in enumerate(first):
            if result.codes is not None:
                buffers[index].append(result.codes)
        launch_packets([(index, result.finish_reason is not None) for index, result in enumerate(first)])
        active = [index for index, result in enumerate(first) if result.finish_reason is None]
        steps = 0
        pending_step: tuple[list[int], Any] | None = None
        while active:
            if time.perf_counter() > deadline:
                truncated = True
                break
            launch = [i for i in active if engine.can_launch(sessions[i])]
            following = (launch, engine.launch_step([sessions[i] for i in launch])) if launch else None
            if pending_step is None:
                pending_step = following
                continue
            stepped, results = pending_step[0], engine.collect_step(pending_step[1])
            pending_step = following
            steps += 1
            still, due = [], []
            for index, result in zip(stepped, results, strict=True):
                if result is None:  # launched after the session's last frame: dropped
                    continue
                if result.codes is not None:
                    buffers[index].append(result.codes)
                done = result.finish_reason is not None
                due.append((index, done))
                if not done:
                    still.append(index)
            launch_packets(due)
            collect_packets(wait=False)
            active = still
        collect_packets(wait=True)
    finally:
        for session in sessions:
            engine.release(session)
    wall = time.perf_counter() - start
    total_audio = sum(audio.values()) * FRAME_SECONDS
    per_stream = [
        (finished_at.get(i, time.perf_counter()) - start) / max(audio[i] * FRAME_SECONDS, 1e-9)
        for i in range(streams)
    ]
    return {
        "streams": streams,
        "frames_per_stream": frames,
        "wall_s": wall,
        "audio_s": total_audio,
        "aggregate_rtf": wall / total_audio if total_audio else None,
        "per_stream_rtf": summarize(per_stream),
        "worst_stream_rtf": max(per_stream),
        "codec_s": codec_s,
        "prefill_s": prefill_s,
        "steps": steps,
        "truncated": truncated,
    }


def weight_bytes_per_frame(engine: Any, backend: Any) -> int:
    """Bytes a frame must stream at batch 1: talker blocks + codec_head once, the predictor 15 times (the
    graphs' predictor projects its input only at step 0; later steps gather a projected-embedding row)."""
    from ..engine.kernels.reference import QuantizedWeight
    from ..engine.runtime.graphs import Weight

    def size(weight: Any) -> int:
        if isinstance(weight, Weight):
            return size(weight.small)
        if isinstance(weight, QuantizedWeight):
            return weight.data.numel() * weight.data.element_size() + weight.scale.numel() * 4
        return int(weight.numel() * weight.element_size())

    frame = getattr(backend, "frame", None)  # the graphs' KernelFrame: its GEMV weights of the mode
    if frame is not None:

        def block(b: Any) -> int:
            return sum(size(w) for w in (b.qkv, b.o, b.gate_up, b.down))

        talker = sum(block(b) for b in frame.talker_blocks) + size(frame.codec_head)
        per_step = sum(block(b) for b in frame.predictor_blocks) + size(frame.heads[0])
        return talker + 15 * per_step + size(frame.projection)
    talker = sum(size(p) for p in engine.talker.layers.parameters()) + size(engine.talker.codec_head.weight)
    predictor = engine.predictor
    per_step = (
        sum(size(p) for p in predictor.layers.parameters())
        + size(predictor.projection.weight)
        + size(predictor.heads[0].weight)
    )
    return talker + 15 * per_step


def profile_frame(engine: Any, backend: Any, streams: int, path: Path) -> dict[str, Any]:
    """torch.profiler over one batched step at `streams` sessions: top kernels, kernel count, GB/s."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    sessions = [engine.start_session(make_request(64, seed=5000 + i)) for i in range(streams)]
    try:
        for session in sessions:
            engine.prefill(session)
        for _ in range(3):
            engine.step(sessions)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(5):
            engine.step(sessions)
        torch.cuda.synchronize()
        frame_s = (time.perf_counter() - start) / 5
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            engine.step(sessions)
            torch.cuda.synchronize()
        replay = graph_replay_ms(engine, backend, sessions)
    finally:
        for session in sessions:
            engine.release(session)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu_us = sum(e.device_time for e in kernels) if kernels and hasattr(kernels[0], "device_time") else None
    weights = weight_bytes_per_frame(engine, backend)
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=30)
    summary = {
        "streams": streams,
        "frame_ms": frame_s * 1000,
        "kernels_per_frame": len(kernels),
        "gpu_busy_ms": None if gpu_us is None else gpu_us / 1000,
        "weight_bytes_per_frame": weights,
        "achieved_weight_gbps": weights / frame_s / 1e9,
        **replay,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"# one batched frame (engine.step) at {streams} stream(s)\n"
        f"{json.dumps(summary, indent=2)}\n\n{table}\n"
    )
    return summary


def replay_ms(graph: Any, replays: int = 20) -> float:
    """Milliseconds per replay of a captured CUDA graph, replayed back to back after one warm replay."""
    import torch

    graph.replay()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(replays):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / replays * 1000


def chained_call_us(op: Any, chain: int = 50) -> float:
    """Microseconds one call of `op()` takes inside a captured CUDA graph of `chain` calls back to back: the
    cost a frame's graph sees, without launch overhead (the micro-benchmarks' in-graph figure)."""
    import torch

    op()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(chain):
            op()
    return replay_ms(graph) * 1000 / chain


def graph_replay_ms(engine: Any, backend: Any, sessions: list[Any], replays: int = 20) -> dict[str, float]:
    """The frame graph of this batch replayed back to back, without the step's host work: with programmatic
    dependent launch (as captured) and recaptured without it, so the difference is what it saves."""

    from ..engine.kernels import ops

    if backend is None or not hasattr(backend, "decode_graph"):
        return {}

    with_dependent_launch = replay_ms(backend.decode_graph(len(sessions)), replays)
    try:
        ops.set_dependent_launch(False)
        backend.release_graphs()
        engine.step(sessions)  # recaptures this bucket without dependent launch
        without = replay_ms(backend.decode_graph(len(sessions)), replays)
    finally:
        ops.set_dependent_launch(True)
        backend.release_graphs()
    return {"graph_replay_ms": with_dependent_launch, "graph_replay_ms_without_dependent_launch": without}


def codec_packet_ms(engine: Any, runs: int = 20, profile_path: Path | None = None) -> dict[str, float]:
    """Median wall time of `decode_packet` for 1- and 4-frame packets of one session (PCM bytes included),
    and with `profile_path` the kernel count and GPU time of a 4-frame packet."""
    import torch

    session = engine.start_session(make_request(8, seed=3))
    out: dict[str, float] = {}
    try:
        for frames in (1, 4):
            codes = torch.randint(0, 2048, (frames, 16), device=engine.device)
            engine.decode_packet(session, codes)
            values = []
            for _ in range(runs):
                torch.cuda.synchronize()
                start = time.perf_counter()
                engine.decode_packet(session, codes)
                values.append((time.perf_counter() - start) * 1000)
            out[f"{frames}_frame"] = statistics.median(values)
        if profile_path is not None:
            out.update(profile_codec_packet(engine, [session], profile_path))
    finally:
        engine.release(session)
    return out


def profile_codec_packet(engine: Any, sessions: list[Any], path: Path) -> dict[str, float]:
    """torch.profiler over one 4-frame `decode_packets` of `sessions` (after one unprofiled call, which
    captures a graph on first use): kernel count, GPU busy and wall time; the table goes to `path`."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    packets = [torch.randint(0, 2048, (4, 16), device=engine.device) for _ in sessions]
    engine.decode_packets(sessions, packets)
    torch.cuda.synchronize()
    start = time.perf_counter()
    engine.decode_packets(sessions, packets)
    wall_ms = (time.perf_counter() - start) * 1000
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        engine.decode_packets(sessions, packets)
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    summary = {
        "codec_4_frame_kernels": float(len(kernels)),
        "codec_4_frame_gpu_busy_ms": sum(e.device_time for e in kernels) / 1000,
        "codec_4_frame_wall_ms": wall_ms,
    }
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
    path.parent.mkdir(parents=True, exist_ok=True)
    title = f"# one 4-frame codec packet (decode_packets) of {len(sessions)} session(s)"
    path.write_text(f"{title}\n{json.dumps(summary)}\n\n{table}\n")
    return summary


def profile_codec_streams(engine: Any, streams: int, path: Path) -> dict[str, float]:
    """`profile_codec_packet` for `streams` fresh sessions decoded together (the lockstep case)."""
    sessions = [engine.start_session(make_request(8, seed=7000 + i)) for i in range(streams)]
    try:
        return profile_codec_packet(engine, sessions, path)
    finally:
        for session in sessions:
            engine.release(session)


def codec_error(engine: Any, decoder_bf16: Any, frames: int = 48) -> dict[str, float]:
    """Waveform error of the streamed (1 then 4-frame packets) bf16 and fp32 decodes against the fp32
    one-shot decode of the same codes (all float32 work with TF32 off, as the engine runs it)."""
    import torch

    from ..engine.runtime.codec_graphs import fp32_codec

    codes = engine.generate_codes(make_request(frames, seed=77)).to(engine.device)
    with torch.no_grad(), fp32_codec():
        reference = engine.decoder.decode(codes.T.unsqueeze(0))[0].float()
        out: dict[str, float] = {}
        for name, decoder in (("fp32", engine.decoder), ("bf16", decoder_bf16)):
            state = decoder.new_stream_state()
            pieces, start = [], 0
            for size in [1] + [4] * frames:
                if start >= codes.shape[0]:
                    break
                pieces.append(decoder.decode_stream(codes[start : start + size], state).float())
                start += size
            wave = torch.cat(pieces)
            error = wave - reference
            out[f"{name}_max_abs"] = float(error.abs().max())
            out[f"{name}_snr_db"] = float(
                10 * torch.log10(reference.pow(2).sum() / error.pow(2).sum().clamp_min(1e-30))
            )
    return out


def engine_mode(name: str) -> Any:
    """The engine `Mode` a bench mode name times ("eager": exact's, without graphs)."""
    from ..engine.runtime.modes import resolve_mode

    mode = resolve_mode("fast") if name.startswith("fast") else resolve_mode("exact")
    return replace(mode, weights="fp8") if name == "fast-fp8" else mode


def bench_mode(
    name: str, load_engine: Callable[[int, Any], Any], args: argparse.Namespace, profile_dir: Path
) -> dict[str, Any]:
    import torch

    from ..engine.runtime.accelerate import accelerate

    mode = engine_mode(name)
    eager = name == "eager"
    result: dict[str, Any] = {"mode": name, "weights": mode.weights, "codec_dtype": str(mode.codec_dtype)}
    timings: dict[str, float] = {}
    result["stage_s"] = timings

    def attach(engine: Any) -> tuple[Any, Callable[[], None]]:
        """The engine's CUDA fast paths, as the server gets them (runtime/accelerate.py): frame graphs and
        codec graphs of this mode, every bucket up to the engine's session count captured now, so no capture
        falls inside a timed run."""
        if eager:
            return None, lambda: None
        undo = accelerate(engine, mode)
        return engine.frame_backend, undo

    with stage(timings, f"{name}: one stream"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        engine = load_engine(1, mode.codec_dtype)
        backend, undo = attach(engine)
        try:
            list(engine.synthesize(make_request(8, seed=0)))  # captures bucket 1 and the prefill graph
            result["ttfa_ms"] = measure_ttfa(engine, args.ttfa_runs)
            result["single"] = measure_single(engine, args.frames, args.runs)
            result["peak_gpu_memory_bytes_b1"] = torch.cuda.max_memory_allocated()
            codec_profile = profile_dir / f"profile-{name}-codec.txt"
            result["codec_packet_ms"] = codec_packet_ms(engine, profile_path=codec_profile)
            result["profile_b1"] = profile_frame(engine, backend, 1, profile_dir / f"profile-{name}-b1.txt")
        finally:
            undo()
        engine = backend = None
    levels = [int(c) for c in args.concurrency.split(",") if c]
    with stage(timings, f"{name}: concurrency"):
        torch.cuda.empty_cache()
        engine = load_engine(max(levels), mode.codec_dtype)
        backend, undo = attach(engine)
        try:
            result["concurrency"] = {}
            for streams in levels:
                run_concurrent(
                    engine, streams, 2, args.level_timeout_s
                )  # capture this bucket, warm the codec
                runs = [
                    run_concurrent(engine, streams, args.concurrency_frames, args.level_timeout_s)
                    for _ in range(max(1, args.level_runs))
                ]
                level = median_run(runs)
                result["concurrency"][str(streams)] = level
                print(
                    f"[bench] {name}: {streams} streams -> aggregate RTF {level['aggregate_rtf']}", flush=True
                )
            top = max(levels)
            result[f"profile_b{top}"] = profile_frame(
                engine, backend, top, profile_dir / f"profile-{name}-b{top}.txt"
            )
            result[f"codec_packet_b{top}"] = profile_codec_streams(
                engine, top, profile_dir / f"profile-{name}-codec-b{top}.txt"
            )
        finally:
            undo()
    return result


# ------------------------------------------------------------------------------------------ peers, HTTP
def run_peer(peer: str, args: argparse.Namespace, model: Path, out_dir: Path) -> dict[str, Any]:
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "peers" / PEER_SCRIPTS[peer]
    out = out_dir / f"peer-{peer}.json"
    env = dict(os.environ)
    for item in args.peer_pythonpath:
        key, _, value = item.partition("=")
        if key == peer:
            env["PYTHONPATH"] = value
    command = [
        sys.executable,
        str(script),
        "--model",
        str(model),
        "--out",
        str(out),
        "--frames",
        str(args.peer_frames),
    ]
    try:
        proc = subprocess.run(command, env=env, timeout=args.peer_timeout_s, capture_output=True, text=True)
        (out_dir / f"peer-{peer}.log").write_text(proc.stdout + proc.stderr)
    except subprocess.TimeoutExpired:
        return {"peer": peer, "error": f"timed out after {args.peer_timeout_s} s"}
    if not out.exists():
        return {"peer": peer, "error": f"exit {proc.returncode}: {proc.stderr[-2000:]}"}
    record: dict[str, Any] = json.loads(out.read_text())
    return record


def http_ttfa(model: Path, runs: int, mode: str, port: int = 18089) -> dict[str, Any]:
    """Start `qwen3-tts serve` in `mode` on loopback and time the first PCM byte of streamed requests.

    The timing copy of the snapshot (EOS row zeroed) no longer matches its manifest, so the server is told
    to serve it unverified."""
    import httpx

    from ..evidence.client import RunAborted, wait_for_server

    env = dict(os.environ, QWEN3_TTS_LOG_LEVEL="warning", QWEN3_TTS_MODE=mode)
    command = [
        sys.executable,
        "-m",
        "qwen3_tts_native",
        "serve",
        "--model",
        str(model),
        "--port",
        str(port),
        "--device",
        "cuda",
        "--max-concurrent-requests",
        "2",
        "--allow-unverified-model",
    ]
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_for_server(server, base, 180)
        except RunAborted as error:
            log = server.stderr.read() if server.stderr and server.poll() is not None else ""
            return {"error": f"{error}: {log[-2000:]}" if log else str(error)}
        body = {
            "text": TEXT,
            "voice_description": INSTRUCT,
            "language": "english",
            "stream": True,
            "output_format": "pcm_s16le",
            "max_duration_seconds": 2.0,
        }
        values = []
        with httpx.Client(timeout=60) as client:
            for _ in range(runs + 1):
                start = time.perf_counter()
                with client.stream("POST", f"{base}/v1/voice-design/speech", json=body) as response:
                    if response.status_code != 200:
                        return {"error": f"HTTP {response.status_code}: {response.read()[:500]!r}"}
                    seen = b""
                    multipart = "multipart" in response.headers.get("content-type", "")
                    first: float | None = None
                    for chunk in response.iter_bytes():
                        seen += chunk
                        if first is None:
                            head_end = seen.find(b"\r\n\r\n")
                            if not multipart or (head_end >= 0 and len(seen) > head_end + 4):
                                first = time.perf_counter()
                values.append(((first or time.perf_counter()) - start) * 1000)
        return {
            "ttfa_ms": summarize(values[1:]),
            "note": "first PCM byte of a streamed request, loopback, the server's engine (accelerated)",
        }
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


# ------------------------------------------------------------------------------------------------ main
def _times_faster(peer: Any, ours: Any) -> float | None:
    """How many times a peer's figure is ours (RTF or latency: lower is faster), None without both."""
    if isinstance(peer, int | float) and isinstance(ours, int | float) and ours > 0:
        return float(peer) / float(ours)
    return None


def build_summary(result: dict[str, Any], mode: str) -> dict[str, Any]:
    """The figures anyone compares runs by, for one mode; each peer's single-stream RTF and time to first
    audio from the same run, with how many times faster this mode is on each (`*_times_faster`)."""
    m = result["modes"].get(mode, {})
    conc = m.get("concurrency", {})
    single_stream_rtf = m.get("single", {}).get("rtf", {}).get("median")
    ttfa_p50_ms = m.get("ttfa_ms", {}).get("p50")
    peers = {}
    for name, rec in result.get("peers", {}).items():
        peer = {k: rec.get(k) for k in ("single_stream_rtf", "ttfa_ms", "error") if rec.get(k) is not None}
        ratios = {
            "single_stream_rtf_times_faster": _times_faster(rec.get("single_stream_rtf"), single_stream_rtf),
            "ttfa_times_faster": _times_faster(rec.get("ttfa_ms"), ttfa_p50_ms),
        }
        peers[name] = peer | {k: v for k, v in ratios.items() if v is not None}
    return {
        "mode": mode,
        "gpu": result["system"].get("gpu"),
        "single_stream_rtf": single_stream_rtf,
        "ttfa_p50_ms": ttfa_p50_ms,
        "ttfa_p95_ms": m.get("ttfa_ms", {}).get("p95"),
        "http_ttfa_p50_ms": result.get("http", {}).get(mode, {}).get("ttfa_ms", {}).get("p50"),
        "aggregate_rtf": {k: v.get("aggregate_rtf") for k, v in conc.items()},
        "worst_stream_rtf": {k: v.get("worst_stream_rtf") for k, v in conc.items()},
        "peak_gpu_memory_bytes_b1": m.get("peak_gpu_memory_bytes_b1"),
        "frame_loop_rtf": m.get("single", {}).get("frame_loop_rtf", {}).get("median"),
        "codec_packet_ms": m.get("codec_packet_ms"),
        "codec_waveform_error": result.get("codec_waveform_error"),
        "peers": peers,
    }


def print_table(summary: dict[str, Any]) -> None:
    def fmt(value: Any) -> str:
        return f"{value:.4f}" if isinstance(value, float) else str(value)

    def times(ratio: float | None) -> str:
        return "no ratio" if ratio is None else f"ours {ratio:.1f}x faster"

    print(f"\n== {summary['mode']} on {summary['gpu']}")
    print(
        f"single-stream RTF {fmt(summary['single_stream_rtf'])}   TTFA p50/p95 {fmt(summary['ttfa_p50_ms'])}/"
        f"{fmt(summary['ttfa_p95_ms'])} ms   HTTP TTFA p50 {fmt(summary['http_ttfa_p50_ms'])} ms   "
        f"peak mem b1 {summary['peak_gpu_memory_bytes_b1']}"
    )
    for streams, agg in summary["aggregate_rtf"].items():
        print(
            f"  {streams:>3} streams: aggregate RTF {fmt(agg)}  "
            f"worst stream RTF {fmt(summary['worst_stream_rtf'][streams])}"
        )
    for name, peer in summary["peers"].items():
        if "error" in peer:
            print(f"  peer {name}: {peer['error']}")
            continue
        rtf_ratio, ttfa_ratio = peer.get("single_stream_rtf_times_faster"), peer.get("ttfa_times_faster")
        print(
            f"  peer {name}: single-stream RTF {fmt(peer.get('single_stream_rtf'))} ({times(rtf_ratio)})   "
            f"TTFA {fmt(peer.get('ttfa_ms'))} ms ({times(ttfa_ratio)})"
        )


def mode_process_command(args: argparse.Namespace, mode: str, timing_model: Path, out: Path) -> list[str]:
    """The command that benches one mode in a process of its own and writes its figures to `out`.

    Why a process per mode: in one process a mode measured after another carried the first one's history:
    fast's peak memory counted what exact's stages left allocated (7.70 GB in run 37, 6.89 GB alone in run
    49) and its first audio followed exact's 64-stream level (11.7 ms in run 37, 10.9 ms alone)."""
    command = [sys.executable, "-m", "qwen3_tts_native", "bench", "--model", str(args.model)]
    command += ["--timing-model", str(timing_model), "--modes", mode, "--mode-json", str(out)]
    options = {
        "--frames": args.frames,
        "--runs": args.runs,
        "--ttfa-runs": args.ttfa_runs,
        "--concurrency": args.concurrency,
        "--concurrency-frames": args.concurrency_frames,
        "--level-timeout-s": args.level_timeout_s,
        "--level-runs": args.level_runs,
        "--max-context": args.max_context,
        "--out-dir": args.out_dir,
        "--profile-dir": args.profile_dir or args.out_dir,
    }
    for option, value in options.items():
        command += [option, str(value)]
    return command


def run_mode_process(args: argparse.Namespace, mode: str, timing_model: Path) -> dict[str, Any]:
    """`bench_mode` for one mode in a child process (its log goes to ours); the child's error if it fails."""
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / f"mode-{mode}.json"
    out.unlink(missing_ok=True)
    proc = subprocess.run(mode_process_command(args, mode, timing_model, out))
    if not out.exists():
        return {"error": f"the {mode} process exited {proc.returncode} without figures (its log is above)"}
    record: dict[str, Any] = json.loads(out.read_text())
    out.unlink()
    return record


def load_base_engine(timing_model: Path, max_context: int, codec_dtype: Any) -> Any:
    """The weights every timed engine shares, the codec in `codec_dtype` (not accelerated: each timed engine
    is, in its mode)."""
    import torch

    from ..engine.runtime.engine import VoiceDesignEngine

    return VoiceDesignEngine.load(
        timing_model,
        device="cuda",
        dtype=torch.bfloat16,
        codec_dtype=codec_dtype,
        max_sessions=1,
        max_context=max_context,
        accelerate=False,
    )


def engine_factory(base: Any, max_context: int, codec_dtype: Any) -> Callable[..., Any]:
    """load_engine(sessions, dtype): an engine of `sessions` slots over `base`'s weights (KV pool sized
    per run, weights shared). `codec_dtype` is base's codec's; a float32 codec is copied once to another
    dtype when one is asked for."""
    import copy

    import torch

    from ..engine.runtime.engine import VoiceDesignEngine
    from ..engine.runtime.graphs import SCRATCH_SLOTS

    decoders: dict[Any, Any] = {codec_dtype: base.decoder}

    def load_engine(sessions: int, dtype: Any = codec_dtype) -> Any:
        if dtype not in decoders:
            if torch.float32 not in decoders:
                raise ValueError(f"a {dtype} codec can only be copied from a float32 one")
            decoders[dtype] = copy.deepcopy(decoders[torch.float32]).to(dtype)
        return VoiceDesignEngine(
            base.config,
            base.talker,
            base.predictor,
            tokenizer=base.tokenizer,
            decoder=decoders[dtype],
            max_sessions=sessions,
            max_context=max_context,
            scratch_slots=SCRATCH_SLOTS,
        )

    return load_engine


def run_one_mode(args: argparse.Namespace, mode: str, out: Path) -> int:
    """The child side of `run_mode_process`: load the weights, bench `mode`, write its figures to `out`."""
    timings: dict[str, float] = {}
    codec_dtype = engine_mode(mode).codec_dtype  # loaded in the mode's dtype, as the server loads it
    with stage(timings, "load weights"):
        base = load_base_engine(args.timing_model, args.max_context, codec_dtype)
    load_engine = engine_factory(base, args.max_context, codec_dtype)
    record = bench_mode(mode, load_engine, args, args.profile_dir or args.out_dir)
    record["stage_s"] = {**timings, **record["stage_s"]}
    out.write_text(json.dumps(record, default=str))
    return 0


def run(args: argparse.Namespace) -> int:
    import torch

    from ..engine.config import load_config

    if not torch.cuda.is_available():
        print("qwen3-tts bench: needs a CUDA device", file=sys.stderr)
        return 2
    if args.mode_json is not None:
        return run_one_mode(args, args.modes, args.mode_json)
    stages: dict[str, float] = {}
    result: dict[str, Any] = {"system": system_info(), "stage_s": stages, "modes": {}, "peers": {}}
    eos = load_config(args.model).talker.codec_eos_token_id
    with stage(stages, "eos-free copy"):
        timing_model = args.timing_model or zero_eos_copy(args.model)
    result["workload"] = {
        "snapshot": str(args.model),
        "timing_snapshot": str(timing_model),
        "eos_row_zeroed": f"{EOS_TENSOR}[{eos}] = 0 in the timing copy: runs yield the frames asked for",
        "text": TEXT,
        "voice_description": INSTRUCT,
        "language": "english",
        "sampling": "generation_config defaults (temperature 0.9, top-k 50, repetition penalty 1.05)",
        "frames": args.frames,
        "concurrency_frames": args.concurrency_frames,
        "packets": "1 frame first, then 4",
        "max_context": args.max_context,
    }
    modes = [m for m in args.modes.split(",") if m]
    for mode in modes:
        with stage(stages, f"{mode} process"):
            result["modes"][mode] = run_mode_process(args, mode, timing_model)
        if "error" in result["modes"][mode]:
            print(f"[bench] {mode} failed: {result['modes'][mode]['error']}", file=sys.stderr)
    with stage(stages, "codec error"):
        base = load_base_engine(timing_model, args.max_context, torch.float32)
        load_engine = engine_factory(base, args.max_context, torch.float32)
        result["codec_waveform_error"] = codec_error(load_engine(1), load_engine(1, torch.bfloat16).decoder)
        del base, load_engine  # the weights leave the GPU before the peers load theirs
    torch.cuda.empty_cache()
    for peer in [p for p in args.peers.split(",") if p and p != "none"]:
        with stage(stages, f"peer {peer}"):
            result["peers"][peer] = run_peer(peer, args, timing_model, args.out_dir)
    if args.http:
        result["http"] = {}
        for mode in [m for m in modes if m in ("exact", "fast")]:  # the server's modes
            with stage(stages, f"http ttfa {mode}"):
                result["http"][mode] = http_ttfa(timing_model, args.http_runs, mode)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    commit = result["system"]["commit"]
    for mode in modes:
        record = dict(result, summary=build_summary(result, mode), mode=mode)
        path = args.out_dir / f"bench-{mode}-{commit}.json"
        path.write_text(json.dumps(record, indent=2, sort_keys=True, default=str))
        print_table(record["summary"])
        print(f"wrote {path}")
    return 0

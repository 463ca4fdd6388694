"""One frame graph's kernels under Nsight Compute (`ncu`): per kind of kernel (name and grid), its count,
time, DRAM bytes and rate, L2 traffic, achieved occupancy, issue-slot use, instructions (thousands of warp
instructions a kernel) and top warp stall reasons.

Why: at one stream the frame replays in ~3.0 ms (exact) against ~1.2 ms of weight reads; whether that time
is inside the kernels (slow kernels: fix them) or between them (the kernels' sum is short of the replay:
fewer kernels) decides the next change. ncu times each kernel alone (serialized, caches flushed, as the
weights are in a frame), so the sum of the kernels' times against the replay is the cost of the chain.

Usage: python benchmarks/device/frame_ncu.py --model SNAPSHOT --out DIR [--modes exact,fast] [--streams 1]
           [--skip K] [--kernels N] [--timeout S] [--tensor-core-max-rows R]
(runs itself under ncu once per mode, N kernels of the frame after its first K; writes
ncu-<mode>-b<streams>[-tc<R>].csv, ncu's log (without the table) and the .txt summary, and prints the summary.
--tensor-core-max-rows overrides the mode's `tensor_core_max_rows`: 0 puts every product of 4 rows or more
on cuBLAS, 128 every one the tensor-core kernel takes)
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict

STALL_PREFIX = "smsp__average_warps_issue_stalled_"
STALL_SUFFIX = "_per_issue_active.ratio"
METRICS = [
    "gpu__time_duration.sum",
    "dram__bytes_read.sum",
    "lts__t_bytes.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "launch__grid_size",
    "launch__block_size",
    "launch__registers_per_thread",
    "launch__occupancy_limit_registers",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "smsp__inst_executed.sum",
    f"regex:{STALL_PREFIX}.*{STALL_SUFFIX}",
]


def profile_target(args: argparse.Namespace) -> int:
    """Under ncu: one decode frame graph of `streams` sessions replayed between profiler start and stop."""
    from dataclasses import replace

    import torch
    from common import load_timing_engine

    from qwen3_tts_native.commands.bench import make_request, replay_ms
    from qwen3_tts_native.engine.runtime.modes import resolve_mode

    started = time.perf_counter()
    mode = resolve_mode(args.target)
    if args.tensor_core_max_rows is not None:
        mode = replace(mode, tensor_core_max_rows=args.tensor_core_max_rows)
    engine = load_timing_engine(args.model, mode, max(args.streams, 1))
    print(f"engine loaded in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    sessions = [engine.start_session(make_request(64, seed=5000 + i)) for i in range(args.streams)]
    engine.prefill_many(sessions)
    engine.step(sessions)
    graph = engine.frame_backend.decode_graph(len(sessions))
    replay_ms(graph, 3)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    graph.replay()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(f"profiled by {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    return 0


def short_name(name: str) -> str:
    """`void q3tts::(anonymous namespace)::gemv_kernel<(q3tts::WeightKind)0, 1, true, 1>(...)` ->
    `gemv_kernel<0, 1, true, 1>`; torch and cuBLAS kernels keep their base name."""
    name = re.sub(r"\(q3tts::WeightKind\)", "", name)
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"\w+::\(anonymous namespace\)::", "", name)
    name = re.sub(r"q3tts::", "", name)
    depth, out = 0, list[str]()
    for char in name:  # drop the parameter list, keep the template arguments
        if char == "(" and depth == 0 and out:
            break
        depth += char == "<"
        depth -= char == ">"
        out.append(char)
    return "".join(out)[:90]


def summarize(raw_csv: str, title: str) -> str:
    """The text summary of ncu's raw CSV (one row per kernel)."""
    rows = [r for r in csv.DictReader(io.StringIO(raw_csv)) if r.get("ID", "").strip().isdigit()]

    def number(row: dict[str, str], key: str) -> float:
        text = row.get(key, "").replace(",", "").strip()
        try:
            return float(text)
        except ValueError:
            return 0.0

    groups: dict[tuple[str, int, int], list[dict[str, str]]] = defaultdict(list)
    for row in rows:
        grid = int(number(row, "launch__grid_size"))
        groups[(short_name(row["Kernel Name"]), grid, int(number(row, "launch__block_size")))].append(row)
    stall_keys = [k for k in (rows[0].keys() if rows else []) if k.startswith(STALL_PREFIX)]
    total_ns = sum(number(r, "gpu__time_duration.sum") for r in rows)
    total_bytes = sum(number(r, "dram__bytes_read.sum") for r in rows)
    lines = [
        f"# {title}: {len(rows)} kernels, their times summed {total_ns / 1e6:.3f} ms",
        "# (each kernel alone, caches flushed);",
        f"# {total_bytes / 1e9:.3f} GB read from DRAM: {total_bytes / max(total_ns, 1):.0f} GB/s over it",
        "",
        f"{'kernel':<62} {'grid':>6} {'n':>4} {'us each':>8} {'ms all':>7} {'GB/s':>6} {'L2 MB':>6} "
        f"{'occ%':>5} {'issue%':>6} {'k inst':>7} {'regs':>4}  top stalls (cycles per issue)",
    ]
    ordered = sorted(groups.items(), key=lambda kv: -sum(number(r, "gpu__time_duration.sum") for r in kv[1]))
    for (name, grid, _block), members in ordered:
        ns = sum(number(r, "gpu__time_duration.sum") for r in members)
        read = sum(number(r, "dram__bytes_read.sum") for r in members)
        l2_bytes = sum(number(r, "lts__t_bytes.sum") for r in members)
        occupancy = sum(number(r, "sm__warps_active.avg.pct_of_peak_sustained_active") for r in members)
        issue = sum(number(r, "smsp__issue_active.avg.pct_of_peak_sustained_active") for r in members)
        instructions = sum(number(r, "smsp__inst_executed.sum") for r in members)
        stalls = {
            key.removeprefix(STALL_PREFIX).removesuffix(STALL_SUFFIX): sum(number(r, key) for r in members)
            / len(members)
            for key in stall_keys
        }
        top = sorted(stalls.items(), key=lambda kv: -kv[1])[:3]
        lines.append(
            f"{name:<62} {grid:>6} {len(members):>4} {ns / len(members) / 1e3:>8.2f} {ns / 1e6:>7.3f} "
            f"{read / max(ns, 1):>6.0f} {l2_bytes / len(members) / 1e6:>6.1f} "
            f"{occupancy / len(members):>5.1f} {issue / len(members):>6.1f} "
            f"{instructions / len(members) / 1e3:>7.0f} "
            f"{int(number(members[0], 'launch__registers_per_thread')):>4}  "
            + ", ".join(f"{k} {v:.1f}" for k, v in top)
        )
    return "\n".join(lines) + "\n"


def run_profiles(args: argparse.Namespace) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    for mode in args.modes:
        command = [
            "ncu",
            "--profile-from-start",
            "off",
            "--graph-profiling",
            "node",
            "--clock-control",
            "none",
            "--csv",
            "--page",
            "raw",
            "--print-units",
            "base",
            "--launch-skip",
            str(args.skip),
            "--launch-count",
            str(args.kernels),
            "--metrics",
            ",".join(METRICS),
            sys.executable,
            __file__,
            "--model",
            str(args.model),
            "--out",
            str(args.out),
            "--target",
            mode,
            "--streams",
            str(args.streams),
        ]
        rows = args.tensor_core_max_rows
        if rows is not None:
            command += ["--tensor-core-max-rows", str(rows)]
        stem = args.out / f"ncu-{mode}-b{args.streams}{'' if rows is None else f'-tc{rows}'}"
        log = stem.with_suffix(".log")
        with log.open("w") as sink:  # ncu prints its table when the target exits
            process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                process.wait(timeout=args.timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)  # ncu and the target under it
                process.wait()
        output = log.read_text()
        start = output.find('"ID"')
        raw = output[start:] if start >= 0 else ""
        if not raw:
            print(mode, "ncu wrote no table; rc", process.returncode, output[-3000:], flush=True)
            continue
        stem.with_suffix(".csv").write_text(raw)
        log.write_text(output[:start])  # the table is in the .csv; the log keeps what ncu said
        variant = "" if rows is None else f", tensor_core_max_rows {rows}"
        text = summarize(raw, f"{mode} mode{variant}, one decode frame graph at {args.streams} stream(s)")
        stem.with_suffix(".txt").write_text(text)
        print(text, flush=True)
    return 0


def main() -> int:
    from common import measurement_parser

    parser = measurement_parser(__doc__)
    parser.add_argument("--streams", type=int, default=1, help="sessions in the frame (a graph bucket)")
    parser.add_argument("--skip", type=int, default=0, help="kernels of the frame not profiled first")
    parser.add_argument("--kernels", type=int, default=700, help="kernels profiled after those skipped")
    parser.add_argument("--timeout", type=float, default=300, help="seconds a mode's ncu run may take")
    parser.add_argument(
        "--tensor-core-max-rows", type=int, default=None, help="the mode's tensor_core_max_rows, overridden"
    )
    parser.add_argument("--target", help=argparse.SUPPRESS)  # set when ncu runs this script on one mode
    args = parser.parse_args()
    return profile_target(args) if args.target else run_profiles(args)


if __name__ == "__main__":
    raise SystemExit(main())

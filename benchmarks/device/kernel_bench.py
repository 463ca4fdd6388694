"""Micro-benchmarks of the decode kernels at the model's shapes on the GPU: achieved GB/s of the GEMV
(bf16 / int8 / fp8 weights) against torch (F.linear and the reference layers.linear) and FP8 W8A8
torch._scaled_mm, the one-row GEMV inside a CUDA graph (as a frame runs it) with and without programmatic
dependent launch, the tensor-core products of 4 to 128 rows inside a CUDA graph against cuBLAS, the attention
kernel against the reference, and the sampler. Writes JSON to --out; --tables picks the tables."""

# ruff: noqa: B023  (every closure is timed inside the loop iteration that defines it)

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from qwen3_tts_native.commands.bench import chained_call_us
from qwen3_tts_native.engine.kernels import loader, ops, reference
from qwen3_tts_native.engine.model import layers
from qwen3_tts_native.engine.runtime import sampling

BF16 = torch.bfloat16
SHAPES = {  # (in, out) of the decode GEMVs
    "talker.qkv": (2048, 4096),
    "talker.o": (2048, 2048),
    "talker.gate_up": (2048, 12288),
    "talker.down": (6144, 2048),
    "predictor.qkv": (1024, 4096),
    "predictor.o": (2048, 1024),
    "predictor.gate_up": (1024, 6144),
    "predictor.down": (3072, 1024),
    "predictor.lm_head": (1024, 2048),
}


def bench_us(fn: Any) -> float:
    return float(do_bench(fn, warmup=25, rep=100, return_mode="median")) * 1000


def gemv_table(batches: list[int]) -> list[dict[str, Any]]:
    rows = []
    for name, (k, m) in SHAPES.items():
        w = (torch.randn(m, k, device="cuda") / k**0.5).to(BF16)
        quantized = {kind: reference.quantize_weight(w, kind) for kind in ("int8", "fp8")}
        for n in batches:
            x = torch.randn(n, k, device="cuda", dtype=BF16)
            entry: dict[str, Any] = {"op": name, "n": n, "k": k, "m": m}
            timings = {
                "torch_F.linear": lambda: F.linear(x, w),
                "reference_layers.linear": lambda: layers.linear(x, w),
                "kernel_bf16": lambda: ops.linear(x, w),
                "kernel_int8": lambda: ops.linear(x, quantized["int8"]),
                "kernel_fp8": lambda: ops.linear(x, quantized["fp8"]),
            }
            w8 = quantized["fp8"].data.t()
            scale_w = quantized["fp8"].scale.view(1, -1)

            def scaled_mm() -> torch.Tensor:
                amax = x.abs().amax(dim=1, keepdim=True).float().clamp_min(1e-12)
                xs = (x.float() / (amax / 448)).to(torch.float8_e4m3fn)
                rows_padded = max(16, -(-n // 16) * 16)
                if rows_padded != n:
                    xs = F.pad(xs.float(), (0, 0, 0, rows_padded - n)).to(torch.float8_e4m3fn)
                    amax = F.pad(amax, (0, 0, 0, rows_padded - n), value=1.0)
                return torch._scaled_mm(xs, w8, scale_a=amax / 448, scale_b=scale_w, out_dtype=BF16)[:n]

            timings["torch_scaled_mm_fp8_w8a8"] = scaled_mm
            for label, fn in timings.items():
                try:
                    us = bench_us(fn)
                except Exception as error:  # _scaled_mm layout limits differ across torch versions
                    entry[label] = {"error": f"{type(error).__name__}: {error}"[:200]}
                    continue
                weight_bytes = m * k * (1 if ("int8" in label or "fp8" in label) else 2)
                entry[label] = {"us": round(us, 2), "weight_gbps": round(weight_bytes / us / 1e3, 1)}
            rows.append(entry)
    return rows


L2_BYTES = 60 * 2**20
GRAPH_CALLS = 24
TABLES = ("gemv", "gemv_in_graph", "products_in_graph", "attention", "sampling")


def graph_gemv_table() -> list[dict[str, Any]]:
    """One activation row through `GRAPH_CALLS` back-to-back GEMVs captured in one CUDA graph, each on its
    own copy of the weight from a ring larger than twice L2 (so nothing is served from cache): the per-call
    cost as a frame's graph sees it, gaps included. With dependent launch on and off."""
    ext = loader.load()
    assert ext is not None
    rows = []
    for name, (k, m) in SHAPES.items():
        for kind in ("bf16", "fp8"):  # exact's and fast's weights
            w = (torch.randn(m, k, device="cuda") / k**0.5).to(BF16)
            weight = w if kind == "bf16" else reference.quantize_weight(w, kind)
            data = weight if isinstance(weight, torch.Tensor) else weight.data
            scale = None if isinstance(weight, torch.Tensor) else weight.scale
            copies = max(2, -(-2 * L2_BYTES // (data.numel() * data.element_size())))
            ring = [data.clone() for _ in range(copies)]
            x = torch.randn(1, k, device="cuda", dtype=BF16)
            out = torch.empty(1, m, device="cuda", dtype=BF16)
            entry: dict[str, Any] = {"op": name, "weights": kind, "k": k, "m": m}
            for dependent in (True, False):
                ops.set_dependent_launch(dependent)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    for call in range(GRAPH_CALLS):
                        ext.gemv(out, x, ring[call % copies], scale, None, -1)
                us = bench_us(graph.replay) / GRAPH_CALLS
                label = "dependent_launch" if dependent else "plain_launch"
                weight_bytes = data.numel() * data.element_size()
                entry[label] = {"us": round(us, 2), "weight_gbps": round(weight_bytes / us / 1e3, 1)}
            ops.set_dependent_launch(True)
            rows.append(entry)
            del ring
    return rows


PRODUCT_ROWS = (4, 16, 64, 128)


def graph_products_table() -> list[dict[str, Any]]:
    """n activation rows through `GRAPH_CALLS` back-to-back products captured in one CUDA graph, each on its
    own copy of the weight from a ring larger than twice L2, as a frame of n streams runs them: the
    tensor-core kernel (bf16 and fp8 weights; the SwiGLU form for gate/up) against bf16 cuBLAS (and silu_mul
    for gate/up), microseconds a call, gaps included."""
    rows = []
    for name, (k, m) in SHAPES.items():
        swiglu = name.endswith("gate_up")
        w = (torch.randn(m, k, device="cuda") / k**0.5).to(BF16)
        for kind in ("bf16", "fp8"):
            weight = w if kind == "bf16" else reference.quantize_weight(w, kind)
            data = weight if isinstance(weight, torch.Tensor) else weight.data
            copies = max(2, -(-2 * L2_BYTES // (data.numel() * data.element_size())))
            ring = [weight if c == 0 else _copy_weight(weight) for c in range(copies)]
            dense_ring = [w.clone() for _ in range(copies)] if kind == "bf16" else None
            for n in PRODUCT_ROWS:
                x = torch.randn(n, k, device="cuda", dtype=BF16)
                if not ops.tensor_core_linear_suits(x, weight, swiglu):
                    continue
                entry: dict[str, Any] = {"op": name, "weights": kind, "n": n, "k": k, "m": m}

                def ours(c: int) -> torch.Tensor:
                    if swiglu:
                        return ops.tensor_core_linear_swiglu(x, ring[c % copies])
                    return ops.tensor_core_linear(x, ring[c % copies])

                def cublas(c: int) -> torch.Tensor:
                    assert dense_ring is not None
                    out = F.linear(x, dense_ring[c % copies])
                    return ops.silu_mul(out[:, : m // 2], out[:, m // 2 :]) if swiglu else out

                calls = [("tensor_cores", ours)] + ([("cublas", cublas)] if dense_ring is not None else [])
                for label, call in calls:
                    call(0)  # outside the capture: cuBLAS makes its handle, the kernel its launch plan
                    torch.cuda.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        for c in range(GRAPH_CALLS):
                            call(c)
                    entry[f"{label}_us"] = round(bench_us(graph.replay) / GRAPH_CALLS, 2)
                rows.append(entry)
    return rows


def _copy_weight(
    weight: torch.Tensor | reference.QuantizedWeight,
) -> torch.Tensor | reference.QuantizedWeight:
    if isinstance(weight, torch.Tensor):
        return weight.clone()
    return reference.QuantizedWeight(weight.data.clone(), weight.scale.clone())


def attention_table() -> list[dict[str, Any]]:
    rows = []
    for batch, length, max_len in (
        (1, 300, 2048),
        (1, 1500, 2048),
        (16, 300, 512),
        (64, 300, 512),
        (64, 16, 16),
    ):
        k_cache = torch.randn(batch + 1, 8, max_len, 128, device="cuda", dtype=BF16)
        v_cache = torch.randn_like(k_cache)
        q = torch.randn(batch, 16, 128, device="cuda", dtype=BF16)
        slots = torch.arange(batch, device="cuda")
        lengths = torch.full((batch,), length, device="cuda")
        kv_bytes = batch * length * 8 * 128 * 2 * 2
        entry: dict[str, Any] = {"batch": batch, "length": length, "max_len": max_len}
        for label, fn in (
            ("kernel", lambda: ops.decode_attention(q, k_cache, v_cache, slots, lengths, 128**-0.5)),
            ("reference", lambda: reference.decode_attention(q, k_cache, v_cache, slots, lengths, 128**-0.5)),
        ):
            us = bench_us(fn)
            entry[label] = {"us": round(us, 2), "kv_gbps": round(kv_bytes / us / 1e3, 1)}
        rows.append(entry)
    return rows


def sampling_table() -> list[dict[str, Any]]:
    rows = []
    for batch in (1, 64):
        logits = torch.randn(batch, 3072, device="cuda") * 3
        u = torch.rand(batch, device="cuda", dtype=torch.float64)
        params = sampling.SamplingRows.cat(
            [
                sampling.SamplingRows.single(
                    greedy=False, temperature=0.9, top_k=50, top_p=1.0, repetition_penalty=1.05, device="cuda"
                )
            ]
            * batch
        )
        history = torch.rand(batch, 3072, device="cuda") < 0.05
        frames = torch.full((batch,), 10, device="cuda")
        banned = sampling.talker_banned_tokens(frames, 3072, 2150)
        predictor_logits = torch.randn(batch, 2048, device="cuda", dtype=torch.bfloat16) * 3
        rows.append(
            {
                "batch": batch,
                "kernel_us": round(
                    bench_us(lambda: ops.sample_talker(logits, u, params, history, frames, 2150)), 2
                ),
                "reference_us": round(
                    bench_us(lambda: sampling.sample_with_uniform(logits, u, params, history, banned)), 2
                ),
                "talker_in_graph_us": round(
                    chained_call_us(lambda: ops.sample_talker(logits, u, params, history, frames, 2150)), 2
                ),
                "predictor_in_graph_us": round(
                    chained_call_us(lambda: ops.sample_predictor(predictor_logits, u, params)), 2
                ),
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batches", default="1,2,4,8,64")
    parser.add_argument(
        "--tables",
        default=",".join(TABLES),
        help=f"comma list of the tables to measure (default: all of {', '.join(TABLES)})",
    )
    args = parser.parse_args()
    tables = [name.strip() for name in args.tables.split(",") if name.strip()]
    unknown = set(tables) - set(TABLES)
    if unknown:
        raise SystemExit(f"unknown tables {sorted(unknown)}: choose from {', '.join(TABLES)}")
    if not ops.kernels_available():
        raise SystemExit("the CUDA extension is not available")
    copy_bytes = 2 * 2**30
    src = torch.empty(copy_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_us = bench_us(lambda: dst.copy_(src))
    result: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(),
        "copy_gbps": round(2 * copy_bytes / copy_us / 1e3, 1),
    }
    measures = {
        "gemv": lambda: gemv_table([int(b) for b in args.batches.split(",")]),
        "gemv_in_graph": graph_gemv_table,
        "products_in_graph": graph_products_table,
        "attention": attention_table,
        "sampling": sampling_table,
    }
    for name in tables:
        result[name] = measures[name]()
    args.out.write_text(json.dumps(result, indent=2))
    print(f"copy {result['copy_gbps']} GB/s")
    for row in result.get("products_in_graph", []):
        cells = "  ".join(f"{k}={v}" for k, v in row.items() if k.endswith("_us"))
        print(f"products {row['op']:>18} {row['weights']} n={row['n']:<3}: {cells}")
    for row in result.get("gemv", []):
        cells = "  ".join(
            f"{k}={v['weight_gbps']}" for k, v in row.items() if isinstance(v, dict) and "weight_gbps" in v
        )
        print(f"{row['op']:>18} n={row['n']:<3} GB/s: {cells}")
    for row in result.get("gemv_in_graph", []):
        cells = "  ".join(f"{k}={v['us']}us" for k, v in row.items() if isinstance(v, dict) and "us" in v)
        print(f"graph {row['op']:>18} {row['weights']}: {cells}")
    for row in result.get("attention", []):
        print(
            f"attention b={row['batch']} L={row['length']}: "
            f"kernel {row['kernel']['us']} us, reference {row['reference']['us']} us"
        )
    for row in result.get("sampling", []):
        print(f"sampling b={row['batch']}: kernel {row['kernel_us']} us, reference {row['reference_us']} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

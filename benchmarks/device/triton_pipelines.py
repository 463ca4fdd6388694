"""Whether each Triton kernel of the engine compiles for Hopper with its reduction loop pipelined.

Triton pipelines a `tl.range` loop only where it can prove its loads 16-byte aligned (the JIT specializes a
pointer or an int argument divisible by 16) and only within one loop: the first implicit-GEMM conv ran a loop
per tap, each with its own prologue and drained pipeline, which a 96-channel conv (3 chunks a tap, 4 stages)
never filled. This compiles every kernel at the launch constants the engine uses for sm_90 (no GPU: Triton's
compiler and its bundled ptxas), with the divisibility the JIT gives at the engine's shapes, and reports per
kernel the asynchronous copies and wgmma instructions in its PTX and its shared memory, against the bytes of
`stages` copies of one step's tiles (every stage resident: the loop is pipelined) and against the copy
instructions of one pipelined loop: a prologue of `stages - 1` steps and one step in the loop, 16 bytes a
thread an instruction (a loop per tap has as many prologues as taps); and its registers and stack (spills)
from the cubin: a 128 x 128 float32 accumulator on 4 warps is 128 registers a thread before any operand, and
the conv's first tiling for wide weights spilled 312 bytes a thread. Each is compiled as the engine launches
it on Hopper, dependently (`triton_dependent`), and must wait for its predecessor exactly once.

tests/unit/test_triton_pipelines.py holds every kernel to it.

    python benchmarks/device/triton_pipelines.py
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from qwen3_tts_native.engine.kernels import triton_conv, triton_products

HOPPER = GPUTarget("cuda", 90, 32)
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
RESOURCES = re.compile(r"REG:(\d+) STACK:(\d+)")
BF16_BYTES = 2
COPY_BYTES = 16  # a thread's asynchronous copy instruction


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel at one launch's constants: its arguments' types, which of them the JIT knows to be
    multiples of 16, and the bytes one step of its pipelined loop stages in shared memory."""

    name: str
    kernel: Any
    signature: dict[str, str]
    constants: dict[str, int | bool]
    aligned: tuple[str, ...]
    warps: int
    stages: int
    step_bytes: int


@dataclass(frozen=True)
class Pipeline:
    """What the compiled kernel does: asynchronous copy and wgmma instructions in its PTX and its shared
    memory, beside those of one pipelined loop over `stages` steps' tiles."""

    name: str
    async_copies: int
    dependent_waits: int
    tensor_core_ops: int
    shared_bytes: int
    staged_bytes: int
    one_loop_async_copies: int
    registers: int
    stack_bytes: int

    def faults(self) -> list[str]:
        """What keeps the kernel from one pipelined loop on wgmma without spills: none when it is one."""
        found = []
        if self.tensor_core_ops == 0:
            found.append("no wgmma: the products do not run on Hopper's tensor cores")
        if self.shared_bytes < self.staged_bytes:
            found.append(
                f"{self.shared_bytes} bytes of shared memory: fewer stages resident than the launch asks"
            )
        if self.async_copies != self.one_loop_async_copies:
            found.append(
                f"{self.async_copies} async copies; one pipelined loop has {self.one_loop_async_copies}"
            )
        if self.stack_bytes:
            found.append(f"spills {self.stack_bytes} bytes a thread ({self.registers} registers)")
        if self.dependent_waits != 1:
            found.append(f"{self.dependent_waits} griddepcontrol.wait: a dependent launch needs exactly one")
        return found


def conv_launch(out_channels: int) -> KernelLaunch:
    """`triton_conv.conv_rows` for a 7-tap weight of `out_channels` rows (its tiling: `blocks_for`)."""
    blocks = triton_conv.blocks_for(out_channels)
    pointers = ("weight_ptr", "samples_ptr", "bias_ptr", "out_ptr")
    sizes = ("out_channels", "channels", "length", "steps", "dilation")
    return KernelLaunch(
        name=f"triton_conv {out_channels} channels",
        kernel=triton_conv._conv_rows_kernel,
        signature={
            **dict.fromkeys(pointers, "*bf16"),
            **dict.fromkeys(sizes, "i32"),
            **dict.fromkeys(
                ("TAPS", "HAS_BIAS", "BLOCK_OUT", "BLOCK_STEPS", "BLOCK_CHANNELS", "DEPENDENT"), "constexpr"
            ),
        },
        constants={
            "TAPS": 7,
            "HAS_BIAS": True,
            "BLOCK_OUT": blocks.out,
            "BLOCK_STEPS": blocks.steps,
            "BLOCK_CHANNELS": blocks.channels,
            "DEPENDENT": True,
        },
        # the codec's channel counts (1536 .. 96) are multiples of 16; lengths and dilations need not be
        aligned=(*pointers, "channels", "out_channels"),
        warps=blocks.warps,
        stages=blocks.stages,
        step_bytes=(blocks.out + blocks.steps) * blocks.channels * BF16_BYTES,
    )


def product_launch(
    name: str,
    kernel: Any,
    out: tuple[str, str],
    sizes: tuple[str, ...],
    weights: int,
    options: dict[str, int | bool] | None = None,
    codes: bool = False,
) -> KernelLaunch:
    """A `triton_products` kernel at its launch constants: weight pointer, activation pointer, output pointer
    `out` (name, type), int `sizes` (all but the first, the row count, multiples of 16 at the engine's
    shapes), `weights` weight tiles a step, the kernel's own constexpr `options`; `codes`: both operands
    e4m3 (`CODES`; the scales' pointers float32)."""
    element, element_bytes = ("fp8e4nv", 1) if codes else ("bf16", BF16_BYTES)
    weight_rows = triton_products.BLOCK_WEIGHT_ROWS
    activation_rows = triton_products.BLOCK_ACTIVATION_ROWS
    constants = {
        "BLOCK_M": weight_rows,
        "BLOCK_N": activation_rows,
        "BLOCK_K": triton_products.BLOCK_K,
        **(options or {}),
        "CODES": codes,
        "DEPENDENT": True,
    }
    types = {
        "w_ptr": f"*{element}",
        "x_ptr": f"*{element}",
        "w_scale_ptr": "*fp32",
        "x_scale_ptr": "*fp32",
        out[0]: out[1],
        **dict.fromkeys(sizes, "i32"),
        **dict.fromkeys(constants, "constexpr"),
    }
    return KernelLaunch(
        name=name,
        kernel=kernel,
        signature={arg: types[arg] for arg in kernel.arg_names},
        constants=constants,
        aligned=("w_ptr", "x_ptr", out[0], *sizes[1:]),
        warps=4,
        stages=triton_products.STAGES,
        step_bytes=(weights * weight_rows + activation_rows) * triton_products.BLOCK_K * element_bytes,
    )


def product_launches() -> list[KernelLaunch]:
    """`triton_products`' SwiGLU ([gate; up]: two weight tiles a step) and product kernels, the product
    rounded (one split) and as split sums; the SwiGLU and the rounded product also on e4m3 codes."""
    launches = []
    for codes in (False, True):
        prefix = "fp8 " if codes else ""
        launches += [
            product_launch(
                f"triton_products {prefix}swiglu",
                triton_products._swiglu_kernel,
                ("out_ptr", "*bf16"),
                ("rows", "width", "k"),
                2,
                codes=codes,
            ),
            product_launch(
                f"triton_products {prefix}product",
                triton_products._product_kernel,
                ("out_ptr", "*bf16"),
                ("rows", "m_out", "k", "k_split"),
                1,
                {"ROUNDED": True},
                codes=codes,
            ),
        ]
    split_sums = product_launch(
        "triton_products split sums",
        triton_products._product_kernel,
        ("out_ptr", "*fp32"),
        ("rows", "m_out", "k", "k_split"),
        1,
        {"ROUNDED": False},
    )
    return [*launches, split_sums]


def engine_launches() -> list[KernelLaunch]:
    """Every pipelined Triton kernel of the engine: the products, and the conv at each tiling
    `blocks_for` picks for the codec's channel counts."""
    tilings = {triton_conv.blocks_for(channels): channels for channels in (1536, 768, 384, 192, 96)}
    return product_launches() + [conv_launch(channels) for channels in tilings.values()]


def compile_for_hopper(launch: KernelLaunch) -> Pipeline:
    """The launch compiled for sm_90 here (the JIT's divisibility on `launch.aligned`), read from its PTX and
    its cubin's resource usage."""
    names = launch.kernel.arg_names
    attributes = {(names.index(name),): [["tt.divisibility", 16]] for name in launch.aligned}
    source = ASTSource(launch.kernel, launch.signature, constexprs=launch.constants, attrs=attributes)
    compiled = triton.compile(
        source,
        target=HOPPER,
        options={"num_warps": launch.warps, "num_stages": launch.stages, "launch_pdl": True},
    )
    ptx = compiled.asm["ptx"]
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        dump = subprocess.run(
            [str(CUOBJDUMP), "--dump-resource-usage", cubin.name], capture_output=True, text=True, check=True
        ).stdout
    resources = RESOURCES.search(dump)
    if resources is None:
        raise RuntimeError(f"no resource usage in cuobjdump's output for {launch.name}: {dump[-500:]}")
    return Pipeline(
        name=launch.name,
        async_copies=ptx.count("cp.async.cg") + ptx.count("cp.async.ca") + ptx.count("cp.async.bulk"),
        dependent_waits=ptx.count("griddepcontrol.wait"),
        tensor_core_ops=ptx.count("wgmma.mma_async"),
        shared_bytes=int(compiled.metadata.shared),
        staged_bytes=launch.stages * launch.step_bytes,
        one_loop_async_copies=launch.stages * launch.step_bytes // (launch.warps * 32 * COPY_BYTES),
        registers=int(resources.group(1)),
        stack_bytes=int(resources.group(2)),
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.parse_args()
    columns = ("async copies", "one loop", "wgmma", "shared", "staged", "registers", "stack", "waits")
    print(f"{'kernel':30}" + "".join(f" {c:>12}" for c in columns) + "  faults")
    for launch in engine_launches():
        p = compile_for_hopper(launch)
        values = (
            p.async_copies,
            p.one_loop_async_copies,
            p.tensor_core_ops,
            p.shared_bytes,
            p.staged_bytes,
            p.registers,
            p.stack_bytes,
            p.dependent_waits,
        )
        print(f"{p.name:30}" + "".join(f" {v:12}" for v in values) + f"  {'; '.join(p.faults()) or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Which global loads each CUDA kernel issues before its `griddepcontrol.wait` (SASS `ACQBULK`).

A kernel launched with programmatic dependent launch (engine/kernels/csrc/launch.cuh) may load data no kernel
writes (weights, norm weights, RoPE tables, index inputs) before it waits for the previous kernel, so that
those round trips overlap that kernel's tail. ptxas decides where the loads land: it moves the wait above
non-coherent loads (`ld.global.nc`) of the same basic block, so a load written before the wait can run after
it (common.cuh's `load_before_wait`). This compiles the extension's sources for sm_90a and counts, in the SASS
of every kernel, the loads (LDG, LDGSTS, bulk copies) placed before the wait, and lists the loads placed
after the kernel's first global store: the compiler must assume a store may alias a later load, so such a
load is a round trip after the kernel's result (the sampler's draw) rather than one made with its inputs.

Runs on the workstation, no GPU: needs nvcc, and cuobjdump with nvdisasm (on PATH, or the PyPI packages
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm, which the `dev` extra installs).
tests/unit/test_pre_wait_loads.py holds every kernel to its count.

    python benchmarks/device/pre_wait_loads.py                 # every source
    python benchmarks/device/pre_wait_loads.py attention norm  # some
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

SOURCES = Path(__file__).resolve().parents[2] / "engine" / "kernels" / "csrc"
INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]{4}\*/\s+(.*?)\s*;")
LOAD = re.compile(r"\b(?:LDG|LDGSTS|UBLKCP|UTMALDG)\b\S*")
STORE = re.compile(r"\b(?:STG|RED|ATOMG|UTMASTG)\b")
FLOAT_OP = re.compile(r"\b(?:FADD|FMUL|FFMA|HADD2|HMUL2|HFMA2)\b")
NAMESPACE = re.compile(r"_ZN5q3tts\d+_GLOBAL__N__\w+?_cu_[0-9a-f]+\d+")


def sass_tools_folder() -> Path | None:
    """cuobjdump's and nvdisasm's folder: on PATH, else the PyPI packages' (`nvidia/cu*/bin`), else None."""
    found = shutil.which("cuobjdump")
    if found is not None and shutil.which("nvdisasm") is not None:
        return Path(found).parent
    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in roots:
        for folder in sorted(Path(root).glob("cu*/bin")):
            if (folder / "cuobjdump").exists() and (folder / "nvdisasm").exists():
                return folder
    return None


def compile_cubin(source: str, folder: Path) -> Path:
    """engine/kernels/csrc/<source>.cu compiled for sm_90a (the H100/H200 build's target) into folder."""
    cubin = folder / f"{source}.cubin"
    command = ["nvcc", "-arch=sm_90a", "-O3", "-std=c++17", "-cubin", "-o", str(cubin)]
    subprocess.run([*command, str(SOURCES / f"{source}.cu")], check=True, capture_output=True, text=True)
    return cubin


def _uses_a_register_in_float_op(instruction: str) -> bool:
    """A floating-point instruction that reads a register (not a zeroing idiom such as
    `HFMA2.MMA R40, -RZ, RZ, 0, 0`)."""
    match = FLOAT_OP.search(instruction)
    if match is None:
        return False
    sources = instruction[match.end() :].split(",")[1:]
    return any(re.search(r"\bR\d+\b", source) for source in sources)


@dataclass(frozen=True)
class KernelLoads:
    """One kernel's global loads in its SASS."""

    before_wait: int
    opcodes: tuple[str, ...]  # every load's (e.g. LDG.E.128, LDGSTS.E.BYPASS.128), in order
    after_first_store: tuple[str, ...]  # those of the loads after the kernel's first store
    # Loads issued after the wait and before the kernel's first floating-point instruction: those in flight
    # together before any loaded value is used (a load placed after that use waits a round trip more).
    before_first_float_op: int

    @property
    def total(self) -> int:
        return len(self.opcodes)


def kernel_loads(cubin: Path, tools: Path) -> dict[str, KernelLoads]:
    """Per kernel that waits, its loads (KernelLoads), from the cubin's SASS."""
    environment = {**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ.get('PATH', '')}"}
    command = [str(tools / "cuobjdump"), "-sass", str(cubin)]
    sass = subprocess.run(command, capture_output=True, text=True, check=True, env=environment).stdout
    result: dict[str, KernelLoads] = {}
    for block in re.split(r"\n\s*Function : ", sass)[1:]:
        name, _, body = block.partition("\n")
        instructions = [m.group(1) for line in body.splitlines() if (m := INSTRUCTION.match(line))]
        wait = next((i for i, text in enumerate(instructions) if "ACQBULK" in text), None)
        if wait is None:
            continue
        store = next((i for i, text in enumerate(instructions) if STORE.search(text)), len(instructions))
        float_op = next(
            (i for i, text in enumerate(instructions) if i > wait and _uses_a_register_in_float_op(text)),
            len(instructions),
        )
        loads = [(i, m.group(0)) for i, text in enumerate(instructions) if (m := LOAD.search(text))]
        result[NAMESPACE.sub("", name.strip())] = KernelLoads(
            before_wait=sum(1 for i, _ in loads if i < wait),
            opcodes=tuple(opcode for _, opcode in loads),
            after_first_store=tuple(opcode for i, opcode in loads if i > store),
            before_first_float_op=sum(1 for i, _ in loads if wait < i < float_op),
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("sources", nargs="*", help="source names under engine/kernels/csrc (default: all)")
    args = parser.parse_args()
    tools = sass_tools_folder()
    if tools is None or shutil.which("nvcc") is None:
        parser.exit(
            1, "needs nvcc, cuobjdump and nvdisasm: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm\n"
        )
    names = args.sources or sorted(path.stem for path in SOURCES.glob("*.cu"))
    with tempfile.TemporaryDirectory() as folder:
        for name in names:
            for kernel, loads in sorted(kernel_loads(compile_cubin(name, Path(folder)), tools).items()):
                print(
                    f"{name:20s} {loads.before_wait:3d} of {loads.total:4d} loads before the wait, "
                    f"{len(loads.after_first_store):3d} after the first store  {kernel[:100]}"
                )


if __name__ == "__main__":
    main()

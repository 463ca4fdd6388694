"""Every Triton kernel of the engine compiles for Hopper with one pipelined reduction loop: its tiles copied
asynchronously into `stages` resident buffers and multiplied on wgmma (benchmarks/device/triton_pipelines.py
says how it is read from the PTX), without spilling registers, and launched dependently waits once for the
kernel before it. On the CPU, with Triton's compiler and bundled ptxas: a kernel that no longer compiles, lost
its pipeline, spills or lost its wait fails here rather than in a device run.
"""

from __future__ import annotations

import pytest
from script_modules import BENCHMARKS, load_script

pytest.importorskip("triton", reason="needs Triton (pip install -e '.[dev]' on x86_64)")

SCRIPT = BENCHMARKS / "device" / "triton_pipelines.py"

TOOL = load_script(SCRIPT)
LAUNCHES = TOOL.engine_launches()


@pytest.mark.parametrize("launch", LAUNCHES, ids=[launch.name for launch in LAUNCHES])
def test_kernel_compiles_with_one_pipelined_loop(launch: object) -> None:
    assert TOOL.compile_for_hopper(launch).faults() == []


def test_conv_tilings_cover_the_codec_channel_counts() -> None:
    """The conv is checked at each tiling `blocks_for` picks for the codec's channels, the 96-channel convs
    (three 32-channel chunks a tap, fewer than the stages) among them, and each of the products' kernels."""
    names = {launch.name for launch in LAUNCHES}
    assert "triton_conv 96 channels" in names
    products = {"swiglu", "fp8 swiglu", "product", "fp8 product", "split sums"}
    assert {f"triton_products {product}" for product in products} <= names

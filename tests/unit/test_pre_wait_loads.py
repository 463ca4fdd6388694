"""The CUDA kernels load their constants before the dependent-launch wait in the SASS nvcc makes, not only in
the source: ptxas moves the wait above non-coherent loads (common.cuh's `load_before_wait`), and a load that
lands after the wait adds an L2 round trip to the kernel's dependent chain. Compiles the sources for sm_90a
on the CPU (about 40 s on 2 cores) and reads the SASS (benchmarks/device/pre_wait_loads.py).
"""

from __future__ import annotations

import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from script_modules import BENCHMARKS, load_script

SCRIPT = BENCHMARKS / "device" / "pre_wait_loads.py"

TOOL = load_script(SCRIPT)
LoadsBySource = dict[str, dict[str, Any]]  # source -> kernel -> the script's KernelLoads (loaded at run time)
TOOLS = TOOL.sass_tools_folder()

pytestmark = pytest.mark.skipif(
    shutil.which("nvcc") is None or TOOLS is None,
    reason="needs nvcc and cuobjdump/nvdisasm (pip install -e '.[dev]' on x86_64)",
)

# (source, kernel name pattern): the fewest loads each instance must issue before its wait. The weights'
# first chunks (4 a weight row), the row's scale and bias, the normed GEMVs' norm weight, the RoPE rows and
# norm weights (2 or 4 a slice of a head, 4 slices), positions, slots and lengths.
EXPECTED = {
    ("gemv", r"gemv_kernelILNS_10WeightKindE\dELi\d+ELb0E"): 6,
    ("gemv", r"gemv_kernelILNS_10WeightKindE\dELi\d+ELb1E"): 7,
    ("gemv", r"gemv_swiglu_kernelILNS_10WeightKindE\dELi\d+ELb0E"): 10,
    ("gemv", r"gemv_swiglu_kernelILNS_10WeightKindE\dELi\d+ELb1E"): 11,
    ("norm", r"rms_norm_kernel"): 4,
    ("rope_cache", r"qk_norm_rope_cache_kernelILi1E"): 8,
    ("rope_cache", r"qk_norm_rope_cache_kernelILi2E"): 14,
    ("attention", r"rope_attention_kernelILi64E"): 10,
    ("attention", r"rope_attention_kernelILi128E"): 18,
    ("attention", r"attention_merge_kernel"): 1,
    ("attention", r"attention_split_kernel"): 2,
    ("embedding", r"frame_embedding_kernel"): 1,
}


@pytest.fixture(scope="module")
def loads_by_source(tmp_path_factory: pytest.TempPathFactory) -> LoadsBySource:
    folder = tmp_path_factory.mktemp("cubins")
    sources = sorted({source for source, _ in EXPECTED} | {"sampling"})
    with ThreadPoolExecutor(max_workers=2) as pool:
        cubins = list(pool.map(lambda source: TOOL.compile_cubin(source, folder), sources))
    return {source: TOOL.kernel_loads(cubin, TOOLS) for source, cubin in zip(sources, cubins, strict=True)}


@pytest.mark.parametrize(("source", "pattern"), list(EXPECTED), ids=[p for _, p in EXPECTED])
def test_constants_load_before_the_wait(loads_by_source: LoadsBySource, source: str, pattern: str) -> None:
    instances = {name: counts for name, counts in loads_by_source[source].items() if re.search(pattern, name)}
    assert instances, f"no kernel of {source}.cu matches {pattern}"
    fewest = EXPECTED[(source, pattern)]
    late = {name: loads.before_wait for name, loads in instances.items() if loads.before_wait < fewest}
    assert not late, f"loads before the wait, expected at least {fewest}: {late}"


def test_the_sampler_loads_only_the_embedding_row_after_its_draw(
    loads_by_source: LoadsBySource,
) -> None:
    """The draw's parameters, the record's slot and the frame's other codes load with the scores: after the
    store of `chosen`, which the compiler must assume may alias them, each would be one more round trip."""
    sampling = loads_by_source["sampling"]
    instances = {name: loads for name, loads in sampling.items() if "sample_kernel" in name}
    assert len(instances) == 2, sorted(sampling)
    for name, loads in instances.items():
        assert loads.after_first_store, f"{name}: the embedding row's loads follow the draw's store"
        assert set(loads.after_first_store) == {"LDG.E.128"}, f"{name}: {loads.after_first_store}"


def test_the_frame_embedding_copies_every_row_at_once(
    loads_by_source: LoadsBySource,
) -> None:
    """The talker's input row: its 16 codebooks' table rows and its text row go out as asynchronous copies
    together, after the codes; as register loads ptxas issued them one after another (one L2 round trip a
    codebook, 9-10 us at one stream)."""
    (loads,) = (loads for name, loads in loads_by_source["embedding"].items() if "frame_embedding" in name)
    copies = [i for i, opcode in enumerate(loads.opcodes) if opcode.startswith("LDGSTS")]
    assert len(copies) == 17, loads.opcodes
    assert copies == list(range(copies[0], copies[0] + 17)), loads.opcodes
    assert all(opcode.startswith("LDGSTS") for opcode in loads.opcodes[copies[0] :]), loads.opcodes


def test_the_split_sums_norm_loads_the_residual_with_the_partial_sums(
    loads_by_source: LoadsBySource,
) -> None:
    """The add-RMSNorm of a product's split sums (every 33-64-row frame's two norms a layer): its 4 splits'
    partial sums (8 vectors) and the residual row go out before any is added; the residual loaded after the
    partials' adds was one L2 round trip more."""
    (loads,) = (
        loads for name, loads in loads_by_source["norm"].items() if "rms_norm_kernelILb1ELb0ELi4E" in name
    )
    assert loads.before_first_float_op >= 9, loads

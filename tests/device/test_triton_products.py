"""The Triton products (engine/kernels/triton_products.py) against their torch references, and the frame's
routing of its 33-128-row MLP and attention products to them.

Tolerances:
- triton_linear: linear's (relative L2 <= 5e-3 to the reference: the fp32 sums of the same products in
  another order, one bf16 rounding), and the same bits call to call (one kernel, a fixed order).
- triton_linear_split_sums: linear's tolerance for its sums added (`ops.added`, Triton's reduce kernel), which
  are bit-identical to reference.added's; add_rms_norm_ (and add_rms_norm_fp8_) of the split sums
  bit-identical to add_rms_norm_ (add_rms_norm_fp8_) of them added.
- triton_linear_swiglu: relative L2 <= 1e-2 to reference.linear_swiglu (tensor_core_linear_swiglu's), and
  silu_mul's roundings: >= 95% of elements identical to silu_mul of the float32 products rounded to bf16 (only
  the products' fp32 summation order differs), all within the deviation that order can cause
  (swiglu_deviation_bound).
- triton_fp8_linear (triton_fp8_linear_swiglu): relative L2 <= 5e-3 to reference.fp8_linear
  (reference.fp8_linear_swiglu: the float32 products of the same codes, exact a term), and the same bits call
  to call. Not triton_linear_swiglu's elementwise criteria: Hopper's e4m3 wgmma accumulates with less than
  float32's precision (Triton does not promote its sums on sm_90 unless asked), which an H100 measured at
  2.4-3.0e-3 relative L2 for the SwiGLU and 1.5-1.9e-3 for the qkv, 70-87% of elements identical, against
  3.7-5.3e-2 for the e4m3 quantization itself (benchmarks/results/2026-12-07-run175). Promoting the sums every
  128 columns made 89% identical and the fast 64-row frame 0.07 ms longer (run 174).
"""

from __future__ import annotations

from typing import cast

import pytest
import torch

from qwen3_tts_native.engine.kernels import ops, reference
from qwen3_tts_native.engine.kernels.reference import QuantizedWeight
from qwen3_tts_native.engine.runtime import graphs
from qwen3_tts_native.engine.runtime.modes import EXACT, FAST, Mode

BF16 = torch.bfloat16
DOWN_SHAPES = [(3072, 1024), (6144, 2048)]  # (k, m): the predictor's and the talker's down projections
GATE_UP_SHAPES = [(1024, 3072), (2048, 6144)]  # (k, intermediate)
QKV_SHAPES = [(1024, 4096), (2048, 4096)]  # (k, m): the predictor's and the talker's fused qkv
HEAD_SHAPES = [(1024, 2048), (2048, 3072)]  # (k, m): a predictor head and the talker's codec head


@pytest.fixture(scope="module")
def hopper() -> None:
    """A Hopper GPU, where the engine expects Triton: its absence there is a failure, not a skip."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the Triton products need a Hopper (sm_90) or later GPU")
    assert ops.triton_products is not None, "Triton did not import: the MLP products fall back to cuBLAS"


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("n", [1, 33, 64, 100, 128])
@pytest.mark.parametrize("k,m", DOWN_SHAPES + QKV_SHAPES + HEAD_SHAPES)
def test_triton_linear(hopper: None, n: int, k: int, m: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(n + k + m)
    x = torch.randn(n, k, generator=g, device="cuda").to(BF16)
    w = (torch.randn(m, k, generator=g, device="cuda") / k**0.5).to(BF16)
    assert ops.triton_linear_suits(x, w)
    out = ops.triton_linear(x, w)
    assert out.shape == (n, m) and not torch.isnan(out.float()).any()
    assert rel(out, reference.linear(x, w)) <= 5e-3
    assert torch.equal(ops.triton_linear(x, w), out)


@pytest.mark.parametrize("n", [1, 33, 64, 100, 128])
@pytest.mark.parametrize("k,m", QKV_SHAPES)
def test_triton_fp8_linear(hopper: None, n: int, k: int, m: int) -> None:
    """e4m3 rows on an e4m3 weight, multiplied as codes: within 5e-3 of `reference.fp8_linear` (the float32
    products of the codes), the same bits call to call."""
    g = torch.Generator(device="cuda").manual_seed(n * 7 + k + m)
    x = torch.randn(n, k, generator=g, device="cuda").to(BF16)
    w = (torch.randn(m, k, generator=g, device="cuda") / k**0.5).to(BF16)
    rows, weight = reference.quantize_rows_fp8(x), reference.quantize_weight(w, "fp8")
    assert ops.triton_fp8_linear_suits(rows, weight)
    out = ops.triton_fp8_linear(rows, weight)
    assert out.shape == (n, m) and out.dtype == BF16 and not torch.isnan(out.float()).any()
    assert rel(out, reference.fp8_linear(rows, weight)) <= 5e-3
    assert torch.equal(ops.triton_fp8_linear(rows, weight), out)


@pytest.mark.parametrize("n", [33, 64, 128])
@pytest.mark.parametrize("k,m", DOWN_SHAPES)
def test_triton_linear_split_sums_added_by_the_norm(hopper: None, n: int, k: int, m: int) -> None:
    """The down product's split sums, left for the add-RMSNorm after it: the product within linear's
    tolerance, and the same norm, bit for bit, as the sums reduced by their own kernel."""
    g = torch.Generator(device="cuda").manual_seed(3 * n + k)
    x = torch.randn(n, k, generator=g, device="cuda").to(BF16)
    w = (torch.randn(m, k, generator=g, device="cuda") / k**0.5).to(BF16)
    sums = ops.triton_linear_split_sums(x, w)
    assert isinstance(sums, ops.SplitSums) and sums.rows == n
    product = ops.added(sums)
    assert torch.equal(reference.added(sums), product)
    assert rel(product, reference.linear(x, w)) <= 5e-3
    norm_weight = (1 + 0.1 * torch.randn(m, generator=g, device="cuda")).to(BF16)
    residual = torch.randn(n, m, generator=g, device="cuda").to(BF16)
    r_sums, r_product = residual.clone(), residual.clone()
    normed = ops.add_rms_norm_(sums, r_sums, norm_weight, 1e-6)
    assert torch.equal(normed, ops.add_rms_norm_(product, r_product, norm_weight, 1e-6))
    assert torch.equal(r_sums, r_product)
    r_sums, r_product = residual.clone(), residual.clone()
    quantized = ops.add_rms_norm_fp8_(sums, r_sums, norm_weight, 1e-6)
    expected = ops.add_rms_norm_fp8_(product, r_product, norm_weight, 1e-6)
    assert torch.equal(quantized.codes.view(torch.uint8), expected.codes.view(torch.uint8))
    assert torch.equal(quantized.scale, expected.scale) and torch.equal(r_sums, r_product)


@pytest.mark.parametrize("n", [1, 33, 64, 100, 128])
@pytest.mark.parametrize("k,intermediate", GATE_UP_SHAPES)
def test_triton_linear_swiglu(hopper: None, n: int, k: int, intermediate: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(n * 3 + k)
    x = torch.randn(n, k, generator=g, device="cuda").to(BF16)
    w = (torch.randn(2 * intermediate, k, generator=g, device="cuda") / k**0.5 * 3).to(BF16)
    assert ops.triton_linear_suits(x, w, swiglu=True)
    out = ops.triton_linear_swiglu(x, w)
    assert out.shape == (n, intermediate) and not torch.isnan(out.float()).any()
    assert rel(out, reference.linear_swiglu(x, w)) <= 1e-2
    products = (x.float() @ w.float().T).to(BF16)
    rounded = reference.silu_mul(products[:, :intermediate], products[:, intermediate:]).float()
    identical = float((out.float() == rounded).float().mean())
    assert identical >= 0.95, identical
    bound = swiglu_deviation_bound(x, w, products)
    assert bool(((out.float() - rounded).abs() <= bound).all())


@pytest.mark.parametrize("n", [1, 33, 64, 100, 128])
@pytest.mark.parametrize("k,intermediate", GATE_UP_SHAPES)
def test_triton_fp8_linear_swiglu(hopper: None, n: int, k: int, intermediate: int) -> None:
    """e4m3 rows on an e4m3 [gate; up], multiplied as codes: within 5e-3 of the float32 products of the codes
    with silu_mul's roundings (the tensor cores' e4m3 sums are less precise than float32: module docstring),
    and the same bits call to call."""
    g = torch.Generator(device="cuda").manual_seed(n * 5 + k)
    x = torch.randn(n, k, generator=g, device="cuda").to(BF16)
    w = (torch.randn(2 * intermediate, k, generator=g, device="cuda") / k**0.5 * 3).to(BF16)
    rows, weight = reference.quantize_rows_fp8(x), reference.quantize_weight(w, "fp8")
    assert ops.triton_fp8_linear_suits(rows, weight, swiglu=True)
    out = ops.triton_fp8_linear_swiglu(rows, weight)
    assert out.shape == (n, intermediate) and out.dtype == BF16 and not torch.isnan(out.float()).any()
    assert rel(out, reference.fp8_linear_swiglu(rows, weight)) <= 5e-3
    assert torch.equal(ops.triton_fp8_linear_swiglu(rows, weight), out)


def swiglu_deviation_bound(x: torch.Tensor, w: torch.Tensor, products: torch.Tensor) -> torch.Tensor:
    """How far silu(g) * u may move when only the fp32 summation order of its products g and u changes:
    each sum by at most k * 2^-24 * sum |x_i w_i| (the worst-case bound of a length-k fp32 sum), then one bf16
    rounding each (one ulp, 2^-7 relative, between two roundings), carried to the output through
    d/dg = silu'(g) u (|silu'| <= 1.1) and d/du = silu(g); plus two ulps of the output for its own roundings.
    A nearly cancelling gate product moves by many of its own ulps (run 149: 158 at 64 rows), which a fixed
    ulp count cannot allow and this bound does; a wrong row, column or activation exceeds it."""
    intermediate = products.shape[1] // 2
    k = x.shape[1]
    magnitudes = x.float().abs() @ w.float().abs().T
    summed = products.float()
    moved = k * 2.0**-24 * magnitudes + 2.0**-7 * summed.abs()
    gate, up = summed[:, :intermediate], summed[:, intermediate:]
    silu = torch.nn.functional.silu(gate)
    return (
        1.1 * up.abs() * moved[:, :intermediate]
        + silu.abs() * moved[:, intermediate:]
        + 2.0**-6 * (silu * up).abs()
        + 1e-30
    )


@pytest.mark.parametrize("k,m", DOWN_SHAPES[:1] + QKV_SHAPES[:1])
def test_a_rows_products_are_the_same_in_either_tile(hopper: None, k: int, m: int) -> None:
    """128 rows run as two tiles of 64: each row's product, split sums and SwiGLU are bit for bit those of the
    same row among 64 (the frame's rows are independent of their companions)."""
    g = torch.Generator(device="cuda").manual_seed(k + m)
    x = torch.randn(128, k, generator=g, device="cuda").to(BF16)
    w = (torch.randn(m, k, generator=g, device="cuda") / k**0.5).to(BF16)
    gate_up = (torch.randn(2 * m, k, generator=g, device="cuda") / k**0.5).to(BF16)

    def products(rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
        split = ops.added(ops.triton_linear_split_sums(rows, w))
        return ops.triton_linear(rows, w), split, ops.triton_linear_swiglu(rows, gate_up)

    together = products(x)
    for rows in (slice(0, 64), slice(64, 128)):
        for both, alone in zip(together, products(x[rows]), strict=True):
            assert torch.equal(both[rows], alone)


def test_what_the_kernels_take(hopper: None) -> None:
    """1 to 128 contiguous bf16 rows of the MLP's shapes; not 129 rows, fp8 codes or a k the splits cannot
    divide (those stay on cuBLAS)."""
    x64 = torch.zeros(64, 3072, device="cuda", dtype=BF16)
    down = torch.zeros(1024, 3072, device="cuda", dtype=BF16)
    assert ops.triton_linear_suits(x64, down)
    assert ops.triton_linear_suits(torch.zeros(128, 3072, device="cuda", dtype=BF16), down)
    assert not ops.triton_linear_suits(torch.zeros(129, 3072, device="cuda", dtype=BF16), down)
    assert not ops.triton_linear_suits(x64, reference.quantize_weight(down, "fp8").data)
    odd = torch.zeros(1024, 3000, device="cuda", dtype=BF16)
    assert not ops.triton_linear_suits(torch.zeros(64, 3000, device="cuda", dtype=BF16), odd)


class PredictorBlockShapes(torch.nn.Module):
    """A decoder block's parameters at the code predictor's shapes (hidden 1024, 16 query and 8 key/value
    heads of 128, MLP 3072), as `graphs._Block.from_module` reads them."""

    def __init__(self) -> None:
        super().__init__()
        hidden, heads, kv_heads, head_dim, intermediate = 1024, 16, 8, 128, 3072

        def linear(k: int, m: int) -> torch.nn.Linear:
            return torch.nn.Linear(k, m, bias=False)

        self.q_proj = linear(hidden, heads * head_dim)
        self.k_proj = linear(hidden, kv_heads * head_dim)
        self.v_proj = linear(hidden, kv_heads * head_dim)
        self.o_proj = linear(heads * head_dim, hidden)
        self.gate_proj = linear(hidden, intermediate)
        self.up_proj = linear(hidden, intermediate)
        self.down_proj = linear(intermediate, hidden)
        self.input_layernorm = torch.nn.RMSNorm(hidden)
        self.post_attention_layernorm = torch.nn.RMSNorm(hidden)
        self.q_norm = torch.nn.RMSNorm(head_dim)
        self.k_norm = torch.nn.RMSNorm(head_dim)


@pytest.mark.parametrize("mode", [EXACT, FAST], ids=["exact", "fast"])
def test_the_frames_products_of_33_to_128_rows_run_on_triton(hopper: None, mode: Mode) -> None:
    """The engine's block gives its gate/up, down, o and qkv products of more than `tensor_core_max_rows`
    rows, up to `triton_max_rows`, to the Triton kernels (bit for bit their output; down and o as split
    sums)."""
    torch.manual_seed(7)
    block = graphs._Block.from_module(PredictorBlockShapes().to("cuda", BF16), mode)
    g = torch.Generator(device="cuda").manual_seed(7)
    for n in (33, 64, 128):
        x = torch.randn(n, 1024, generator=g, device="cuda").to(BF16)
        swiglu = block.gate_up.swiglu(x)
        assert isinstance(swiglu, torch.Tensor)
        assert torch.equal(swiglu, ops.triton_linear_swiglu(x, block.gate_up.dense))
        assert torch.equal(block.qkv(x), ops.triton_linear(x, block.qkv.dense))
        for product, k in ((block.down, 3072), (block.o, 2048)):
            h = torch.randn(n, k, generator=g, device="cuda").to(BF16)
            delta = product.residual_delta(h)
            split_sums = ops.triton_linear_split_sums(h, product.dense)
            assert isinstance(delta, ops.SplitSums) and isinstance(split_sums, ops.SplitSums)
            assert torch.equal(delta.partials[:, :n], split_sums.partials[:, :n])
    below = torch.randn(mode.tensor_core_max_rows, 3072, generator=g, device="cuda").to(BF16)
    assert isinstance(block.down.residual_delta(below), torch.Tensor)


@pytest.mark.parametrize("product", ["qkv", "gate_up"])
@pytest.mark.parametrize("mode", [EXACT, FAST], ids=["exact", "fast"])
def test_the_products_after_a_norm_take_fp8_rows_in_fast_mode(hopper: None, mode: Mode, product: str) -> None:
    """33-128 rows: in fast mode (`triton_fp8_rows`) the qkv after the add-RMSNorm of the down product's split
    sums, and the gate/up after that of the o product's, are the fp8 kernels' on the norm's e4m3 rows, bit for
    bit; in exact mode the bf16 kernels'."""
    torch.manual_seed(13)
    block = graphs._Block.from_module(PredictorBlockShapes().to("cuda", BF16), mode)
    g = torch.Generator(device="cuda").manual_seed(13)
    norm_weight = (1 + 0.1 * torch.randn(1024, generator=g, device="cuda")).to(BF16)
    qkv = product == "qkv"
    weight, before = (block.qkv, block.down) if qkv else (block.gate_up, block.o)
    fp8_product = ops.triton_fp8_linear if qkv else ops.triton_fp8_linear_swiglu
    bf16_product = ops.triton_linear if qkv else ops.triton_linear_swiglu
    for n in (33, 64, 128):
        residual = torch.randn(n, 1024, generator=g, device="cuda").to(BF16)
        sums = before.residual_delta(
            torch.randn(n, before.dense.shape[1], generator=g, device="cuda").to(BF16)
        )
        r_block, r_expected = residual.clone(), residual.clone()
        after_norm = weight.after_rms_norm if qkv else weight.swiglu_after_rms_norm
        out, updated = after_norm(r_block, sums, norm_weight, 1e-6)
        assert updated is r_block and isinstance(out, torch.Tensor)
        if mode.triton_fp8_rows:
            rows = ops.add_rms_norm_fp8_(sums, r_expected, norm_weight, 1e-6)
            expected = fp8_product(rows, cast(QuantizedWeight, weight.small))
        else:
            expected = bf16_product(ops.add_rms_norm_(sums, r_expected, norm_weight, 1e-6), weight.dense)
        assert torch.equal(out, expected) and torch.equal(r_block, r_expected)

"""Each CUDA kernel against its torch reference (engine/kernels/reference.py) on fresh random inputs.

Tolerances, per op:
- silu_mul: bit-identical (same fp32 expression and bf16 roundings as ATen).
- rms_norm, add_rms_norm_ (residual exact), qk_norm_rope_cache (v exact): at most 1 bf16 ulp apart
  (only the fp32 sum of squares is reduced in another order), and >= 99% of elements identical.
  add_rms_norm_ of split sums: bit-identical to add_rms_norm_ of the sums added (reference.added), residual
  included (the kernel adds them in the same order with the same rounding, then runs the same norm).
- decode_attention: judged against float64 attention over the same bf16 inputs, not against the bf16
  reference: the reference rounds scores and probabilities to bf16, and at 2048 keys that alone costs it
  ~1.5e-2 relative L2 (first device run), while the kernel keeps both in fp32 and rounds once, at the
  output. Gate: relative L2 <= 4e-3 to float64 (one bf16 output rounding is ~1.1e-3 RMS, 2^-9 at most
  per element; fp32 accumulation adds ~1e-6), and no farther from float64 than the reference is.
- prompt_attention (packed prompt passes; torch's varlen flash attention): like decode_attention, against
  float64, relative L2 <= 1e-2 (it rounds the probabilities to bf16 before P.V) and <= 1.5x the bf16
  reference's.
- linear: bf16 weights, relative L2 <= 5e-3 against layers.linear; 8-bit weights, relative L2 <= 5e-3
  against the fp32 product of the stored codes (reference.linear).
- tensor_core_linear: linear's tolerance (the fp32 sums of the same products in another order; tensor cores
  round nothing before the fp32 accumulator, e4m3 codes are exact in bf16); the same bits from rows a stride
  apart as from contiguous ones, and call to call. tensor_core_linear_swiglu: bit-identical to
  tensor_core_linear then silu_mul (the same tiles, splits and roundings).
- rms_norm_linear: the residual sum exact; the product equal to the norm kernel then the GEMV in >= 95% of
  elements and within 2e-3 relative L2 of it (only the norm's fp32 sum order differs), 1e-2 of the reference.
- snake_beta: bit-identical in float32 and bf16 (the reference's ops in its order with torch's roundings,
  no FMA contraction; float32 with CUDA's own sinf, bf16 with a hardware sine that rounds to sinf's bf16 at
  every one of the 65536 bf16 arguments, tested over all of them).
- unfold_columns: bit-identical (a copy); with `snake`, bit-identical to snake_beta then the copy, and its
  `activation_tail` to snake_beta's last samples.
- time_major_samples: bit-identical to the reference (the 1-tap unfold, transposed), its tail as the unfold's.
- interleave_phases: bit-identical (a copy with one rounding of a + b, as torch's add).
- gather_rows, scatter_rows_: bit-identical (copies).
- conv_to_one_channel: float32 within 1e-5 relative L2 of the float64 conv, bf16 within 4e-3 (its output
  rounding); the same bits from a split history and for a stream alone as in the batch.
- codec_window_attention: the next cache bit-identical (the RoPE'd keys round as torch's mul and addcmul
  do); the output within 1e-5 relative L2 in float32 of the reference, bf16 within 1e-2 (the reference
  rounds its softmax's inputs and its product to bf16 in other places); a stream alone as in the batch.
- e4m3 KV caches (fast mode's talker, `layers.CacheScales`): qk_norm_rope_cache writes the codes and scales
  `reference.quantize_rows_fp8` makes of the rows it writes (its bf16 keys, carrying the norm's ulp, and the
  values, exact); decode_attention over such a cache is judged like the bf16 one, against float64 attention
  over its dequantized rows (`reference.cache_rows`), relative L2 <= 4e-3; rope_attention is
  qk_norm_rope_cache then decode_attention bit for bit, as over a bf16 cache.
- quantize_rows_fp8: bit-identical codes and scales (the same correctly rounded divisions, product and cast).
- fp8_linear: relative L2 <= 1e-2 against the fp32 product of the same codes (reference.fp8_linear); the
  GEMM accumulates in fp32 in its own order and rounds once to bf16. Rows quantized already give the same
  bits as the bf16 rows they came from.
- rms_norm_fp8, add_rms_norm_fp8_, silu_mul_fp8: bit-identical to the unfused kernels (the norm or silu_mul
  kernel, then quantize_rows_fp8): the same expressions, held in registers instead of written. Against the
  reference, silu_mul_fp8 is bit-identical; the norms carry rms_norm's ulp, which can move a code by one step.
"""

from __future__ import annotations

import pytest
import torch

from qwen3_tts_native.engine.kernels import ops, reference
from qwen3_tts_native.engine.model import layers

BF16 = torch.bfloat16


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def ulp_close(a: torch.Tensor, b: torch.Tensor, identical: float = 0.99) -> None:
    """At most two bf16 ulps apart everywhere (test_rms_norm says why), and mostly identical."""
    assert a.dtype == b.dtype == BF16 and a.shape == b.shape
    ai = a.contiguous().view(torch.int16).int()
    bi = b.contiguous().view(torch.int16).int()
    assert not torch.isnan(a.float()).any()
    assert int((ai - bi).abs().max()) <= 2, "more than two bf16 ulps apart"
    assert float((ai == bi).float().mean()) >= identical


@pytest.mark.parametrize("rows,hidden", [(1, 2048), (64, 2048), (33, 1024), (7, 512)])
def test_rms_norm(ext, rows: int, hidden: int) -> None:  # type: ignore[no-untyped-def]
    """The kernel sums squares in another fp32 order than torch, which can move the normalised value one ulp
    before it is rounded and scaled by a weight above 1 and rounded again: up to two ulps in the output
    (seen once in 64 x 2048 outputs, run 17), and almost always none."""
    torch.manual_seed(rows * hidden)
    x = torch.randn(rows, hidden, device="cuda", dtype=BF16) * 3
    w = (1 + 0.1 * torch.randn(hidden, device="cuda")).to(BF16)
    ulp_close(ops.rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6))
    residual = torch.randn_like(x)
    r_kernel, r_ref = residual.clone(), residual.clone()
    out = ops.add_rms_norm_(x, r_kernel, w, 1e-6)
    expected = reference.add_rms_norm_(x, r_ref, w, 1e-6)
    assert torch.equal(r_kernel, r_ref)
    ulp_close(out, expected)
    # Written into every second row of a buffer (the decode frame's pair of predictor inputs): the same bits.
    pair = torch.zeros(rows, 2, hidden, device="cuda", dtype=BF16)
    r_pair = residual.clone()
    ops.add_rms_norm_(x, r_pair, w, 1e-6, out=pair[:, 0])
    assert torch.equal(pair[:, 0], out) and torch.equal(r_pair, r_kernel)
    assert not pair[:, 1].any()


@pytest.mark.parametrize("rows,hidden", [(64, 2048), (33, 1024), (1, 2048)])
def test_add_rms_norm_of_split_sums(ext, rows: int, hidden: int) -> None:  # type: ignore[no-untyped-def]
    """The norm kernel's split-sums form (a Triton down product's partials, unadded) against the same kernel
    given those sums added: the same bits, into a new tensor and into every second row of a buffer."""
    torch.manual_seed(rows + hidden)
    partials = torch.randn(4, 64, hidden, device="cuda") * 2
    partials[:, rows:] = float("nan")  # rows past `rows` are not the product's: never read
    sums = ops.SplitSums(partials, rows)
    w = (1 + 0.1 * torch.randn(hidden, device="cuda")).to(BF16)
    residual = (torch.randn(rows, hidden, device="cuda") * 3).to(BF16)
    r_sums, r_added = residual.clone(), residual.clone()
    out = ops.add_rms_norm_(sums, r_sums, w, 1e-6)
    expected = ops.add_rms_norm_(reference.added(sums), r_added, w, 1e-6)
    assert torch.equal(r_sums, r_added)
    assert torch.equal(out, expected)
    pair = torch.zeros(rows, 2, hidden, device="cuda", dtype=BF16)
    r_pair = residual.clone()
    ops.add_rms_norm_(sums, r_pair, w, 1e-6, out=pair[:, 0])
    assert torch.equal(pair[:, 0], expected) and torch.equal(r_pair, r_added)
    assert not pair[:, 1].any()


def rope_inputs(
    batch: int, heads: int, kv_heads: int, dim: int, max_len: int, exact_sums: bool = False
) -> tuple[torch.Tensor, ...]:
    """One new token per row for the rope ops: q, k, v (views of one fused qkv row), the q/k norm weights and
    the cos/sin tables of `max_len` positions. With `exact_sums` the q/k/v values are multiples of 0.5 in
    [-2, 2]: their squares are multiples of 0.25 whose fp32 sum over a head is exact in any order, so a norm
    reduced in another order than the reference's gives the same bits."""
    width = (heads + 2 * kv_heads) * dim
    if exact_sums:
        qkv = (torch.randint(-4, 5, (batch, width), device="cuda") * 0.5).to(BF16)
    else:
        qkv = torch.randn(batch, width, device="cuda", dtype=BF16)
    q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=1)
    qn = (1 + 0.1 * torch.randn(dim, device="cuda")).to(BF16)
    kn = (1 + 0.1 * torch.randn(dim, device="cuda")).to(BF16)
    cos, sin = layers.rope_cos_sin(torch.arange(max_len, device="cuda"), dim, 1e6, BF16)
    return q, k, v, qn, kn, cos, sin


def e4m3_cache(slots: int, kv_heads: int, max_len: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random rows quantized as an e4m3 cache holds them: codes [slots, kv_heads, max_len, dim] and their
    float32 scales [slots, kv_heads, max_len]."""
    rows = torch.randn(slots * kv_heads * max_len, dim, device="cuda", dtype=BF16) * 3
    quantized = reference.quantize_rows_fp8(rows)
    return quantized.codes.view(slots, kv_heads, max_len, dim), quantized.scale.view(slots, kv_heads, max_len)


def e4m3_caches(
    slots: int, kv_heads: int, max_len: int, dim: int
) -> tuple[torch.Tensor, torch.Tensor, layers.CacheScales]:
    (k, k_scale), (v, v_scale) = (e4m3_cache(slots, kv_heads, max_len, dim) for _ in range(2))
    return k, v, layers.CacheScales(k_scale, v_scale)


@pytest.mark.parametrize("exact_sums", [True, False])
@pytest.mark.parametrize("batch,heads,kv_heads,dim", [(1, 16, 8, 128), (64, 16, 8, 128), (5, 16, 16, 64)])
def test_qk_norm_rope_cache(ext, batch: int, heads: int, kv_heads: int, dim: int, exact_sums: bool) -> None:  # type: ignore[no-untyped-def]
    """The kernel rounds as the reference does; only the fp32 sum of squares of the norm is added in another
    order. Where that sum is exact in any order the results are bit-identical. Elsewhere a 1-ulp change of
    a normed value can move a rotated one (a sum of two rounded products) by more than 1 ulp of its own
    when the products cancel, so the gate is: nearly all identical, relative L2 within 1/256. The keys the
    kernel also writes as rows (`keys_out`, for a prompt pass's attention) are the cache's, bit for bit."""
    torch.manual_seed(100 + batch + dim)
    slots_total, max_len = batch + 3, 300
    q, k, v, qn, kn, cos, sin = rope_inputs(batch, heads, kv_heads, dim, max_len, exact_sums)
    positions = torch.randint(0, max_len, (batch,), device="cuda")
    slots = torch.randperm(slots_total, device="cuda")[:batch]
    poison = torch.full((slots_total, kv_heads, max_len, dim), float("nan"), device="cuda", dtype=BF16)
    k1, v1, k2, v2 = poison.clone(), poison.clone(), poison.clone(), poison.clone()
    keys = torch.full((batch, kv_heads, dim), float("nan"), device="cuda", dtype=BF16)
    q_kernel = ops.qk_norm_rope_cache(q, k, v, qn, kn, cos, sin, positions, slots, k1, v1, 1e-6, keys)
    q_ref = reference.qk_norm_rope_cache(q, k, v, qn, kn, cos, sin, positions, slots, k2, v2, 1e-6)
    written_k1, written_k2 = k1[slots, :, positions], k2[slots, :, positions]
    assert torch.equal(keys, written_k1)
    for got, expected in ((q_kernel, q_ref), (written_k1, written_k2)):
        assert not torch.isnan(got.float()).any()
        if exact_sums:
            assert torch.equal(got, expected)
        else:
            assert float((got == expected).float().mean()) >= 0.99
            assert rel(got, expected) <= 2**-8
    assert torch.equal(v1[slots, :, positions], v2[slots, :, positions])
    untouched = torch.ones(slots_total, max_len, dtype=torch.bool, device="cuda")
    untouched[slots, positions] = False
    assert torch.isnan(k1.float().permute(0, 2, 1, 3)[untouched]).all()


@pytest.mark.parametrize(
    "batch,heads,kv_heads,dim,max_len",
    [(1, 16, 8, 128, 2048), (64, 16, 8, 128, 512), (8, 16, 8, 128, 16), (4, 16, 16, 64, 72)],
)
def test_decode_attention(ext, batch: int, heads: int, kv_heads: int, dim: int, max_len: int) -> None:  # type: ignore[no-untyped-def]
    slots_total = batch + 2
    k_cache = torch.randn(slots_total, kv_heads, max_len, dim, device="cuda", dtype=BF16)
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(batch, heads, dim, device="cuda", dtype=BF16) * 2
    slots = torch.randperm(slots_total, device="cuda")[:batch]
    lengths = torch.randint(1, max_len + 1, (batch,), device="cuda")
    lengths[0] = max_len
    out = ops.decode_attention(q, k_cache, v_cache, slots, lengths, dim**-0.5)
    expected = reference.decode_attention(q, k_cache, v_cache, slots, lengths, dim**-0.5)
    assert not torch.isnan(out.float()).any()
    exact = reference.decode_attention(
        q.double(), k_cache.double(), v_cache.double(), slots, lengths, dim**-0.5
    )
    assert rel(out, exact) <= 4e-3
    assert rel(out, exact) <= rel(expected, exact)
    # Pass 1 writes no partials for splits past a row's length and the merge reads none: a workspace full
    # of NaN gives the same bits.
    poisoned = torch.full(
        (ext.decode_attention_workspace(batch, heads, dim, max_len),), float("nan"), device="cuda"
    )
    again = torch.empty_like(q)
    ext.decode_attention(again, q, k_cache, v_cache, slots, lengths, poisoned, dim**-0.5, max_len, None, None)
    assert torch.equal(again.view(batch, heads * dim), out)


@pytest.mark.parametrize("max_len,longest", [(512, 152), (4096, 80), (512, 64), (512, 40), (2048, 2048)])
def test_decode_attention_over_a_span_is_bit_identical(ext, max_len: int, longest: int) -> None:  # type: ignore[no-untyped-def]
    """A grid over the first `span` positions gives the bits of the whole-cache grid (a prompt pass's rows
    sized by its longest prompt): the same live splits, and one live split merges to its own output. A
    span below the cache's positions that holds every length, at several split counts (1, 2, 3, 32)."""
    batch, heads, kv_heads, dim = 300, 16, 8, 128
    k_cache = torch.randn(4, kv_heads, max_len, dim, device="cuda", dtype=BF16)
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(batch, heads, dim, device="cuda", dtype=BF16) * 2
    slots = torch.randint(0, 4, (batch,), device="cuda")
    lengths = torch.randint(1, longest + 1, (batch,), device="cuda")
    lengths[0] = longest
    whole = ops.decode_attention(q, k_cache, v_cache, slots, lengths, dim**-0.5)
    spanned = ops.decode_attention(q, k_cache, v_cache, slots, lengths, dim**-0.5, span=longest)
    assert torch.equal(spanned, whole)
    workspace = torch.empty(ext.decode_attention_workspace(batch, heads, dim, max_len), device="cuda")
    with pytest.raises(RuntimeError, match="span"):
        out = torch.empty_like(q)
        ext.decode_attention(
            out, q, k_cache, v_cache, slots, lengths, workspace, 1.0, max_len + 1, None, None
        )


def test_packed_prompt_attention_on_cuda() -> None:
    """A pass of whole prompts above the graph buckets attends through `PromptSequences.attend`
    (`ops.prompt_attention`: torch's varlen flash attention over each prompt of the pass): judged like
    decode_attention, against float64 attention over the same bf16 inputs, within 1e-2 relative L2 (flash
    rounds the probabilities to bf16 before P.V, as the bf16 reference does) and no farther than 1.5x the
    bf16 reference's own distance. The values are a strided view, as a pass passes its qkv product's slice."""
    from qwen3_tts_native.engine.runtime.graphs import PromptRows

    heads, kv_heads, dim, cache_len, scale = 16, 8, 128, 320, 128**-0.5
    lengths = [152] * 8 + [37, 151, 1, 300]
    slots = torch.randperm(16, device="cuda")[: len(lengths)]
    k_cache = torch.randn(16, kv_heads, cache_len, dim, device="cuda", dtype=BF16)
    v_cache = torch.randn_like(k_cache)
    total = sum(lengths)
    rows, _, sequences = PromptRows.packed([torch.zeros(n, 1, device="cuda") for n in lengths], slots, total)
    queries = torch.randn(total, heads, dim, device="cuda", dtype=BF16) * 2
    keys = k_cache[rows.slots, :, rows.positions]
    qkv = torch.randn(total, (heads + 2 * kv_heads) * dim, device="cuda", dtype=BF16)
    values = qkv[:, (heads + kv_heads) * dim :].view(total, kv_heads, dim)
    values.copy_(v_cache[rows.slots, :, rows.positions])
    got = sequences.attend(queries, keys, values, scale)
    exact = reference.decode_attention(
        queries.double(), k_cache.double(), v_cache.double(), rows.slots, rows.positions + 1, scale
    )
    expected = reference.decode_attention(queries, k_cache, v_cache, rows.slots, rows.positions + 1, scale)
    assert not torch.isnan(got.float()).any()
    assert rel(got, exact) <= 1e-2
    assert rel(got, exact) <= 1.5 * rel(expected, exact)


@pytest.mark.parametrize("cache", ["bf16", "e4m3"])
@pytest.mark.parametrize(
    "batch,heads,kv_heads,dim,max_len",
    [
        (1, 16, 8, 128, 16),
        (3, 16, 8, 128, 16),
        (64, 16, 8, 128, 16),
        (5, 8, 8, 64, 64),
        (2, 16, 8, 128, 300),
        (7, 16, 8, 128, 4096),
        (64, 16, 8, 128, 1024),
        (64, 16, 8, 128, 4096),
        (6, 8, 8, 64, 200),
    ],
)
def test_rope_attention_is_rope_then_attention(  # type: ignore[no-untyped-def]
    ext, batch: int, heads: int, kv_heads: int, dim: int, max_len: int, cache: str
) -> None:
    """The fused path (one kernel up to 64 positions, then split tiles and the merge) equals
    qk_norm_rope_cache then decode_attention bit for bit: the output and both caches, with new tokens at
    the first and last position of a cache and on both sides of a tile boundary. From 7 rows of a
    4096-position cache (64 rows of 1024) its blocks take several splits each: up to 4 a block at 64 rows of
    1024, up to 16 at 64 rows of 4096. Over an e4m3 cache too: its codes and scales, the new token's key and
    value attended as their codes times their scales (from registers in the fused kernel)."""
    slots_total = batch + 2
    q, k, v, qn, kn, cos, sin = rope_inputs(batch, heads, kv_heads, dim, max_len)
    positions = torch.randint(0, max_len, (batch,), device="cuda")
    edges = torch.tensor([max_len - 1, 0, 63, 64, 127, 128, 65], device="cuda").clamp(max=max_len - 1)
    positions[: min(batch, 7)] = edges[: min(batch, 7)]
    slots = torch.randperm(slots_total, device="cuda")[:batch]
    scales1: layers.CacheScales | None = None
    scales2: layers.CacheScales | None = None
    if cache == "e4m3":
        k1, v1, scales1 = e4m3_caches(slots_total, kv_heads, max_len, dim)
        scales2 = layers.CacheScales(scales1.k.clone(), scales1.v.clone())
    else:
        k1 = torch.randn(slots_total, kv_heads, max_len, dim, device="cuda", dtype=BF16)
        v1 = torch.randn_like(k1)
    k2, v2 = k1.clone(), v1.clone()
    scale = dim**-0.5
    fused = ops.rope_attention(
        q,
        k,
        v,
        qn,
        kn,
        cos,
        sin,
        positions,
        positions + 1,
        slots,
        k1,
        v1,
        1e-6,
        scale,
        distinct_slots=True,
        scales=scales1,
    )
    rotated = ops.qk_norm_rope_cache(q, k, v, qn, kn, cos, sin, positions, slots, k2, v2, 1e-6, None, scales2)
    expected = ops.decode_attention(rotated, k2, v2, slots, positions + 1, scale, scales=scales2)
    assert torch.equal(fused, expected)
    assert torch.equal(k1.view(torch.uint8), k2.view(torch.uint8))
    assert torch.equal(v1.view(torch.uint8), v2.view(torch.uint8))
    if scales1 is not None and scales2 is not None:
        assert torch.equal(scales1.k, scales2.k) and torch.equal(scales1.v, scales2.v)


@pytest.mark.parametrize("batch,heads,kv_heads,dim", [(1, 16, 8, 128), (64, 16, 8, 128), (5, 16, 16, 64)])
def test_qk_norm_rope_cache_into_an_e4m3_cache(ext, batch: int, heads: int, kv_heads: int, dim: int) -> None:  # type: ignore[no-untyped-def]
    """Each K and V row lands as the codes and scale `quantize_rows_fp8` makes of it: the values' from the
    reference's (exact) values, the keys' from the kernel's own bf16 keys (`keys_out`, which carry the norm's
    ulp against the reference's); nothing else in the cache moves."""
    torch.manual_seed(200 + batch + dim)
    slots_total, max_len = batch + 3, 300
    q, k, v, qn, kn, cos, sin = rope_inputs(batch, heads, kv_heads, dim, max_len)
    positions = torch.randint(0, max_len, (batch,), device="cuda")
    slots = torch.randperm(slots_total, device="cuda")[:batch]
    k1, v1, scales1 = e4m3_caches(slots_total, kv_heads, max_len, dim)
    k2, v2, scales2 = k1.clone(), v1.clone(), layers.CacheScales(scales1.k.clone(), scales1.v.clone())
    keys = torch.full((batch, kv_heads, dim), float("nan"), device="cuda", dtype=BF16)
    ops.qk_norm_rope_cache(q, k, v, qn, kn, cos, sin, positions, slots, k1, v1, 1e-6, keys, scales1)
    reference.qk_norm_rope_cache(q, k, v, qn, kn, cos, sin, positions, slots, k2, v2, 1e-6, None, scales2)
    own_keys = reference.quantize_rows_fp8(keys.view(-1, dim))
    assert torch.equal(
        k1[slots, :, positions].view(-1, dim).view(torch.uint8), own_keys.codes.view(torch.uint8)
    )
    assert torch.equal(scales1.k[slots, :, positions].view(-1), own_keys.scale)
    assert torch.equal(v1.view(torch.uint8), v2.view(torch.uint8)) and torch.equal(scales1.v, scales2.v)
    untouched = torch.ones(slots_total, max_len, dtype=torch.bool, device="cuda")
    untouched[slots, positions] = False
    assert torch.equal(
        k1.view(torch.uint8).permute(0, 2, 1, 3)[untouched],
        k2.view(torch.uint8).permute(0, 2, 1, 3)[untouched],
    )


@pytest.mark.parametrize(
    "batch,heads,kv_heads,dim,max_len",
    [(1, 16, 8, 128, 2048), (64, 16, 8, 128, 512), (8, 16, 8, 128, 16), (4, 16, 16, 64, 72)],
)
def test_decode_attention_over_an_e4m3_cache(  # type: ignore[no-untyped-def]
    ext, batch: int, heads: int, kv_heads: int, dim: int, max_len: int
) -> None:
    slots_total = batch + 2
    k_cache, v_cache, scales = e4m3_caches(slots_total, kv_heads, max_len, dim)
    q = torch.randn(batch, heads, dim, device="cuda", dtype=BF16) * 2
    slots = torch.randperm(slots_total, device="cuda")[:batch]
    lengths = torch.randint(1, max_len + 1, (batch,), device="cuda")
    lengths[0] = max_len
    out = ops.decode_attention(q, k_cache, v_cache, slots, lengths, dim**-0.5, scales=scales)
    assert not torch.isnan(out.float()).any()
    every_slot = torch.arange(slots_total, device="cuda")
    keys = reference.cache_rows(k_cache, scales.k, every_slot).double()
    values = reference.cache_rows(v_cache, scales.v, every_slot).double()
    exact = reference.decode_attention(q.double(), keys, values, slots, lengths, dim**-0.5)
    assert rel(out, exact) <= 4e-3
    fallback = reference.decode_attention(q, k_cache, v_cache, slots, lengths, dim**-0.5, scales)
    assert rel(fallback, exact) <= 3e-2


@pytest.mark.parametrize("rows,cols", [(1, 6144), (64, 6144), (17, 3072)])
def test_silu_mul_bit_identical(ext, rows: int, cols: int) -> None:  # type: ignore[no-untyped-def]
    gate_up = torch.randn(rows, 2 * cols, device="cuda", dtype=BF16) * 4
    gate, up = gate_up[:, :cols], gate_up[:, cols:]
    assert torch.equal(ops.silu_mul(gate, up), reference.silu_mul(gate, up))


@pytest.mark.parametrize("n", [1, 2, 3, 8, 16, 37, 64])
@pytest.mark.parametrize("k,m", [(2048, 4096), (1024, 3072), (3072, 1024), (2048, 3072), (6144, 2048)])
@pytest.mark.parametrize("kind", ["bf16", "int8", "fp8"])
def test_linear(ext, n: int, k: int, m: int, kind: str) -> None:  # type: ignore[no-untyped-def]
    """The GEMV against the reference; (3072, 1024) takes four warps a row and (6144, 2048) two."""
    x = torch.randn(n, k, device="cuda", dtype=BF16)
    w = (torch.randn(m, k, device="cuda") / k**0.5).to(BF16)
    bias = (0.1 * torch.randn(m, device="cuda")).to(BF16) if m == 3072 else None
    weight = w if kind == "bf16" else reference.quantize_weight(w, kind)
    out = ops.linear(x, weight, bias)
    expected = reference.linear(x, weight, bias)
    assert out.shape == (n, m) and not torch.isnan(out.float()).any()
    assert rel(out, expected) <= 5e-3
    # batch invariance: a row computed alone equals the same row in the batch, bit for bit
    assert torch.equal(ops.linear(x[-1:], weight, bias)[0], out[-1])


@pytest.mark.parametrize("n", [1, 2, 17])
@pytest.mark.parametrize("kind", ["bf16", "int8", "fp8"])
@pytest.mark.parametrize("keep_share", [0.0, 0.37, 1.0, 2.0])
def test_l2_ranks_leave_the_gemvs_results(ext, n: int, kind: str, keep_share: float) -> None:  # type: ignore[no-untyped-def]
    """`l2_keep` ranks the weight's loads in the L2 (streamed, partly kept, kept, or more than the weight
    kept). That moves where its lines wait, never a product: the plain, SwiGLU and normed GEMVs equal their
    unhinted results bit for bit."""
    k, m = 1024, 3072
    x = torch.randn(n, k, device="cuda", dtype=BF16)
    w = (torch.randn(m, k, device="cuda") / k**0.5).to(BF16)
    weight = w if kind == "bf16" else reference.quantize_weight(w, kind)
    data = weight if isinstance(weight, torch.Tensor) else weight.data
    keep = int(keep_share * data.numel() * data.element_size())
    assert torch.equal(ops.linear(x, weight, l2_keep=keep), ops.linear(x, weight))
    assert torch.equal(ops.linear_swiglu(x, weight, keep), ops.linear_swiglu(x, weight))
    if n <= 4:
        norm = (1 + 0.1 * torch.randn(k, device="cuda")).to(BF16)
        hinted, _ = ops.rms_norm_linear(x, norm, 1e-6, weight, l2_keep=keep)
        assert torch.equal(hinted, ops.rms_norm_linear(x, norm, 1e-6, weight)[0])


@pytest.mark.parametrize("rows", [1, 5, 64])
def test_frame_embedding(ext, rows: int) -> None:  # type: ignore[no-untyped-def]
    """The one-kernel talker input against the 16 gathers, the stacked sum and the add: the kernel sums in
    codebook order, torch's reduction may group the 16 terms otherwise, so a sum may round 1 bf16 ulp apart
    (then the text is added); codes outside a table add zeros."""
    g = torch.Generator(device="cuda").manual_seed(rows)
    first = torch.randn(3072, 2048, generator=g, device="cuda").to(BF16)
    tables = torch.randn(15, 2048, 2048, generator=g, device="cuda").to(BF16)
    codes = torch.randint(0, 2048, (rows, 16), generator=g, device="cuda")
    codes[:, 0] = torch.randint(0, 3072, (rows,), generator=g, device="cuda")
    text = torch.randn(rows, 2048, generator=g, device="cuda").to(BF16)
    out = ops.frame_embedding(codes, first, tables, text)
    expected = reference.frame_embedding(codes, first, tables, text)
    ulp = (expected.float().abs() + text.float().abs()) * 2**-7  # of the sum before the text is added
    assert bool(((out.float() - expected.float()).abs() <= 2 * ulp).all())
    assert float((out == expected).float().mean()) >= 0.97
    outside = codes.clone()
    outside[:, 3] = 5000
    zeroed = tables.clone()
    zeroed[2] = 0
    guarded = ops.frame_embedding(outside, first, tables, text)
    assert torch.equal(guarded, ops.frame_embedding(codes, first, zeroed, text))
    # Rows of a larger table read in place (a decode frame's slots) embed as those rows gathered first.
    slots = torch.randperm(rows + 3, generator=g, device="cuda")[:rows]
    table = torch.randint(0, 2048, (rows + 3, 16), generator=g, device="cuda")
    table[slots] = codes
    assert torch.equal(ops.frame_embedding(table, first, tables, text, slots), out)


@pytest.mark.parametrize("rows,cols", [(1, 2048), (9733, 2048), (600, 6144), (64, 1024), (3, 8)])
def test_quantize_rows_fp8_bit_identical(ext, rows: int, cols: int) -> None:  # type: ignore[no-untyped-def]
    x = torch.randn(rows, cols, device="cuda", dtype=BF16) * torch.rand(rows, 1, device="cuda").to(BF16) * 8
    x[0] = 0  # an all-zero row takes the smallest scale
    codes, scale = ops.quantize_rows_fp8(x)
    expected_codes, expected_scale = reference.quantize_rows_fp8(x)
    assert torch.equal(scale, expected_scale)
    assert torch.equal(codes.view(torch.uint8), expected_codes.view(torch.uint8))
    sliced = torch.randn(rows, cols + 16, device="cuda", dtype=BF16)[:, :cols]  # rows a stride apart
    assert torch.equal(ops.quantize_rows_fp8(sliced)[1], reference.quantize_rows_fp8(sliced)[1])


@pytest.mark.parametrize("n", [256, 600, 9733])
@pytest.mark.parametrize("k,m", [(2048, 4096), (2048, 12288), (6144, 2048), (1024, 3072)])
def test_fp8_linear(ext, n: int, k: int, m: int) -> None:  # type: ignore[no-untyped-def]
    """The fp8 GEMM against the fp32 product of the same codes, and near the bf16 product of the unquantized
    operands (what an fp8 prompt pass changes: ~3% relative L2 at e4m3's 3 mantissa bits)."""
    x = torch.randn(n, k, device="cuda", dtype=BF16)
    w = (torch.randn(m, k, device="cuda") / k**0.5).to(BF16)
    weight = reference.quantize_weight(w, "fp8")
    out = ops.fp8_linear(x, weight)
    assert out.shape == (n, m) and out.dtype == BF16 and not torch.isnan(out.float()).any()
    assert rel(out, reference.fp8_linear(x, weight)) <= 1e-2
    assert rel(out, x @ w.t()) <= 8e-2


def same_rows(a: reference.QuantizedRows, b: reference.QuantizedRows) -> bool:
    return torch.equal(a.scale, b.scale) and torch.equal(a.codes.view(torch.uint8), b.codes.view(torch.uint8))


@pytest.mark.parametrize("rows,hidden", [(1, 2048), (600, 2048), (9733, 2048), (33, 1024), (7, 8192)])
def test_rms_norm_fp8_is_the_norm_then_the_quantization(ext, rows: int, hidden: int) -> None:  # type: ignore[no-untyped-def]
    """The norm kernel that quantizes its rows against the norm kernel then `quantize_rows_fp8`, with and
    without the residual add (updated in place, bit for bit), an all-zero row included."""
    torch.manual_seed(rows + hidden)
    x = torch.randn(rows, hidden, device="cuda", dtype=BF16) * 3
    x[0] = 0
    w = (1 + 0.1 * torch.randn(hidden, device="cuda")).to(BF16)
    fused = ops.rms_norm_fp8(x, w, 1e-6)
    assert fused.codes.dtype == torch.float8_e4m3fn and fused.codes.shape == x.shape
    assert same_rows(fused, ops.quantize_rows_fp8(ops.rms_norm(x, w, 1e-6)))
    delta = torch.randn_like(x)
    r_fused, r_unfused, r_ref = x.clone(), x.clone(), x.clone()
    fused = ops.add_rms_norm_fp8_(delta, r_fused, w, 1e-6)
    assert same_rows(fused, ops.quantize_rows_fp8(ops.add_rms_norm_(delta, r_unfused, w, 1e-6)))
    assert torch.equal(r_fused, r_unfused)
    expected = reference.add_rms_norm_fp8_(delta, r_ref, w, 1e-6)
    assert torch.equal(r_fused, r_ref) and torch.equal(fused.scale, expected.scale)
    steps = (fused.codes.view(torch.uint8).int() - expected.codes.view(torch.uint8).int()).abs()
    assert int(steps.max()) <= 1 and float((steps == 0).float().mean()) >= 0.99


@pytest.mark.parametrize("rows,cols", [(1, 6144), (600, 6144), (9733, 6144), (64, 3072), (5, 8192)])
def test_silu_mul_fp8_bit_identical(ext, rows: int, cols: int) -> None:  # type: ignore[no-untyped-def]
    """SiLU x up quantized in its kernel, from the halves of a gate/up product (rows a stride apart), against
    silu_mul then `quantize_rows_fp8`, and against the reference."""
    torch.manual_seed(rows + cols)
    gate_up = torch.randn(rows, 2 * cols, device="cuda", dtype=BF16) * 4
    gate, up = gate_up[:, :cols], gate_up[:, cols:]
    fused = ops.silu_mul_fp8(gate, up)
    assert same_rows(fused, ops.quantize_rows_fp8(ops.silu_mul(gate, up)))
    assert same_rows(fused, reference.silu_mul_fp8(gate, up))


def test_fp8_linear_of_quantized_rows_is_the_product_of_the_bf16_rows(ext) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(5)
    x = torch.randn(600, 2048, device="cuda", dtype=BF16)
    weight = reference.quantize_weight((torch.randn(4096, 2048, device="cuda") / 45).to(BF16), "fp8")
    bias = torch.randn(4096, device="cuda", dtype=BF16)
    assert torch.equal(
        ops.fp8_linear(ops.quantize_rows_fp8(x), weight, bias), ops.fp8_linear(x, weight, bias)
    )


TENSOR_CORE_SHAPES = [
    (1024, 4096),  # the code predictor's qkv: 64 tiles, k split over 4 blocks
    (2048, 1024),  # its o projection: 16 tiles, clusters of 8
    (3072, 1024),  # its down projection: slices of 384
    (1024, 2048),  # a codebook head
    (2048, 4096),  # the talker's qkv
    (6144, 2048),  # the talker's down projection: at 64 rows more blocks than one wave (cuBLAS's)
    (2048, 12288),  # the talker's gate/up as one product: 192 tiles, one wave only in stages (<= 8 rows)
    (2048, 3072),  # the codec head, with a bias
]


@pytest.mark.parametrize("n", [4, 8, 13, 64, 128])
@pytest.mark.parametrize("k,m", TENSOR_CORE_SHAPES)
@pytest.mark.parametrize("kind", ["bf16", "fp8"])
def test_tensor_core_linear(ext, n: int, k: int, m: int, kind: str) -> None:  # type: ignore[no-untyped-def]
    """The tensor-core product of the frame's shapes against the reference, from 4 rows (one column tile,
    half of it padding) to 128 (the predictor's first step at 64 streams); a product the kernel does not take
    (its blocks would not fit the device at once) is the reference's."""
    g = torch.Generator(device="cuda").manual_seed(n * 7 + k + m)
    x = torch.randn(n, k, generator=g, device="cuda").to(BF16)
    w = (torch.randn(m, k, generator=g, device="cuda") / k**0.5).to(BF16)
    bias = (0.1 * torch.randn(m, generator=g, device="cuda")).to(BF16) if m == 3072 else None
    weight = w if kind == "bf16" else reference.quantize_weight(w, kind)
    out = ops.tensor_core_linear(x, weight, bias)
    expected = reference.linear(x, weight, bias)
    if not ops.tensor_core_linear_suits(x, weight):
        assert torch.equal(out, expected)
        return
    assert out.shape == (n, m) and not torch.isnan(out.float()).any()
    assert rel(out, expected) <= 5e-3
    assert torch.equal(ops.tensor_core_linear(x, weight, bias), out)
    strided = torch.zeros(n, 2 * k, device="cuda", dtype=BF16)
    strided[:, k:] = x  # the rows 2k apart, as the predictor's head reads every second row
    assert torch.equal(ops.tensor_core_linear(strided[:, k:], weight, bias), out)


@pytest.mark.parametrize("kind", ["bf16", "fp8"])
def test_the_frames_products_take_the_tensor_cores(ext, kind: str) -> None:  # type: ignore[no-untyped-def]
    """Every product of the predictor's frame steps and the talker's qkv and o of the rows the engine gives
    the kernel by default (up to `Mode.tensor_core_max_rows`, 32) runs on it (a shape it stopped taking would
    fall back unnoticed). The talker's gate/up, which fits one wave only in stages, runs on it up to 8 rows,
    and on cuBLAS with more (stages lost there: run 103); so does its down with bf16 weights (run 107). Larger
    products are not asserted: whether their clusters fit the device at once is the runtime's answer."""
    products = {
        "predictor qkv": (1024, 4096, False),
        "predictor o": (2048, 1024, False),
        "predictor gate/up": (1024, 6144, True),
        "predictor down": (3072, 1024, False),
        "codebook head": (1024, 2048, False),
        "talker qkv": (2048, 4096, False),
        "talker o": (2048, 2048, False),
        "talker gate/up": (2048, 12288, True),
        "talker down": (6144, 2048, False),
    }
    staged = {"talker gate/up", "talker down"} if kind == "bf16" else {"talker gate/up"}
    for n in (4, 8, 16, 32):
        for name, (k, m, swiglu) in products.items():
            if name == "talker down" and kind == "fp8" and n > 8:
                continue  # whole slices, whose blocks may or may not all fit at once
            w = torch.zeros(m, k, device="cuda", dtype=BF16)
            weight = w if kind == "bf16" else reference.quantize_weight(w, kind)
            x = torch.zeros(n, k, device="cuda", dtype=BF16)
            expected = name not in staged or n <= 8
            assert ops.tensor_core_linear_suits(x, weight, swiglu) == expected, (name, n)


@pytest.mark.parametrize("n", [4, 17, 64])
@pytest.mark.parametrize("k,intermediate", [(1024, 3072), (2048, 6144)])
@pytest.mark.parametrize("kind", ["bf16", "fp8"])
def test_tensor_core_swiglu_is_the_product_then_silu_mul(  # type: ignore[no-untyped-def]
    ext, n: int, k: int, intermediate: int, kind: str
) -> None:
    check_swiglu_is_the_product_then_silu_mul(
        ops.tensor_core_linear_swiglu, ops.tensor_core_linear, n, k, intermediate, kind
    )


def check_swiglu_is_the_product_then_silu_mul(  # type: ignore[no-untyped-def]
    swiglu, product, n: int, k: int, intermediate: int, kind: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | reference.QuantizedWeight]:
    """Checks that `swiglu` (x, fused gate/up weight) equals `product` then silu_mul bit for bit and is within
    1e-2 of the reference; returns (x, the SwiGLU, the weight)."""
    x = torch.randn(n, k, device="cuda", dtype=BF16)
    w = (torch.randn(2 * intermediate, k, device="cuda") / k**0.5).to(BF16) * 3
    weight = w if kind == "bf16" else reference.quantize_weight(w, kind)
    out = swiglu(x, weight)
    gate_up = product(x, weight)
    assert out.shape == (n, intermediate)
    assert torch.equal(out, ops.silu_mul(gate_up[:, :intermediate], gate_up[:, intermediate:]))
    assert rel(out, reference.linear_swiglu(x, weight)) <= 1e-2
    return x, out, weight


@pytest.mark.parametrize("n", [1, 2, 3, 5, 17])
@pytest.mark.parametrize("k,intermediate", [(2048, 6144), (1024, 3072), (1024, 1003)])
@pytest.mark.parametrize("kind", ["bf16", "int8", "fp8"])
def test_linear_swiglu_is_linear_then_silu_mul(ext, n: int, k: int, intermediate: int, kind: str) -> None:  # type: ignore[no-untyped-def]
    """The gate/up GEMV that writes the SwiGLU equals the plain GEMV followed by silu_mul, bit for bit (the
    same products and roundings), and is within the GEMV's tolerance of the torch reference."""
    x, out, weight = check_swiglu_is_the_product_then_silu_mul(
        ops.linear_swiglu, ops.linear, n, k, intermediate, kind
    )
    assert torch.equal(ops.linear_swiglu(x[-1:], weight)[0], out[-1])


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize(
    "k,m,swiglu", [(1024, 4096, False), (2048, 4096, False), (1024, 6144, True), (2048, 12288, True)]
)
@pytest.mark.parametrize("kind", ["bf16", "int8"])
@pytest.mark.parametrize("with_delta", [False, True])
def test_rms_norm_linear_is_the_norm_then_the_gemv(  # type: ignore[no-untyped-def]
    ext, n: int, k: int, m: int, swiglu: bool, kind: str, with_delta: bool
) -> None:
    """The GEMV whose blocks norm their input rows (shapes of the predictor's and the talker's qkv and gate/up
    projections) against the add-RMSNorm kernel followed by the GEMV. The new residual is exactly x + delta
    and x is untouched. The normed input differs from the norm kernel's only where the other fp32 order of
    the sum of squares flips a bf16 rounding (by 1 ulp), and the GEMV code is the same: on inputs whose sums
    of squares are exact in any order the products are the same bits, and on random ones within 2e-3
    relative L2 (one flipped input of a row moves a few percent of its outputs by an ulp, so a share of
    identical elements is no gate: run 94 saw 94% at 4 rows); and within the GEMV's tolerance of the torch
    reference."""
    x = torch.randn(n, k, device="cuda", dtype=BF16) * 2
    delta = torch.randn(n, k, device="cuda", dtype=BF16) if with_delta else None
    w = (torch.randn(m, k, device="cuda") / k**0.5).to(BF16)
    weight = w if kind == "bf16" else reference.quantize_weight(w, kind)
    norm = (1 + 0.1 * torch.randn(k, device="cuda")).to(BF16)
    before = x.clone()
    out, s = ops.rms_norm_linear(x, norm, 1e-6, weight, delta=delta, swiglu=swiglu)
    assert torch.equal(x, before)
    expected_sum = x.clone()
    h = ops.rms_norm(x, norm, 1e-6) if delta is None else ops.add_rms_norm_(delta, expected_sum, norm, 1e-6)
    assert torch.equal(s, expected_sum)
    expected = ops.linear_swiglu(h, weight) if swiglu else ops.linear(h, weight)
    assert out.shape == expected.shape == (n, m // 2 if swiglu else m)
    assert rel(out, expected) <= 2e-3
    # Multiples of 1/8 of magnitude <= 4: every square and partial sum is exact in fp32, in any order.
    grid_x = (torch.randint(-16, 17, (n, k), device="cuda") / 8).to(BF16)
    grid_delta = (torch.randint(-16, 17, (n, k), device="cuda") / 8).to(BF16) if with_delta else None
    grid_out, _ = ops.rms_norm_linear(grid_x, norm, 1e-6, weight, delta=grid_delta, swiglu=swiglu)
    grid_sum = grid_x.clone()
    grid_h = (
        ops.rms_norm(grid_x, norm, 1e-6)
        if grid_delta is None
        else ops.add_rms_norm_(grid_delta, grid_sum, norm, 1e-6)
    )
    assert torch.equal(grid_out, ops.linear_swiglu(grid_h, weight) if swiglu else ops.linear(grid_h, weight))
    reference_out, reference_sum = reference.rms_norm_linear(x, norm, 1e-6, weight, delta, swiglu)
    assert torch.equal(s, reference_sum)
    assert rel(out, reference_out) <= 1e-2


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
@pytest.mark.parametrize("batch,channels,length", [(1, 96, 1920), (64, 1536, 4), (3, 768, 32), (5, 192, 640)])
@pytest.mark.parametrize("layout", ["contiguous", "slice", "channel_major"])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("scale", [3.0, 1000.0])
def test_snake_beta_bit_identical(  # type: ignore[no-untyped-def]
    ext,
    dtype: torch.dtype,
    batch: int,
    channels: int,
    length: int,
    layout: str,
    with_bias: bool,
    scale: float,
) -> None:
    """Shapes of the codec's SnakeBeta inputs, in the layouts it meets: contiguous rows (the vector path when
    a row is a multiple of 8 long), a slice of a longer signal (misaligned: the element path), and the
    channel-major [C, B, T] storage of the GEMM convs' outputs. At scale 1000, |x * frequency| also goes past
    2048, where the bf16 kernel's fast sine hands over to sinf."""
    x = torch.randn(batch, channels, length + 7, device="cuda", dtype=dtype) * scale
    if layout == "slice":
        x = x[..., 3 : 3 + length]
    elif layout == "channel_major":
        x = x[..., :length].permute(1, 0, 2).contiguous().permute(1, 0, 2)
    else:
        x = x[..., :length].contiguous()
    frequency = (0.3 * torch.randn(channels, device="cuda")).exp().to(dtype)
    inverse_beta = 1.0 / ((0.3 * torch.randn(channels, device="cuda")).exp() + 1e-9).to(dtype)
    bias = (0.1 * torch.randn(channels, device="cuda")).to(dtype) if with_bias else None
    out = ops.snake_beta(x, frequency, inverse_beta, bias)
    assert out.is_contiguous() and out.shape == x.shape
    assert torch.equal(out, reference.snake_beta(x, frequency, inverse_beta, bias))


@pytest.mark.parametrize("misaligned", [False, True])
def test_snake_beta_every_bf16_argument(ext, misaligned: bool) -> None:  # type: ignore[no-untyped-def]
    """The bf16 kernel's sine (MUFU after a Cody-Waite reduction) rounds to the bf16 of sinf thanks to a
    margin at each value its argument, x * frequency rounded to bf16, can take: all the finite bf16 values
    as x with frequency 1, through the vector path and (starting one element in) the element path."""
    every = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(BF16)
    x = every[every.float().isfinite()].reshape(1, 16, -1).to("cuda")  # 65280 values, 4080 a row
    if misaligned:
        x = torch.cat([x[..., :1], x], dim=-1)[..., 1:]
    frequency = torch.ones(16, device="cuda", dtype=BF16)
    inverse_beta = (0.5 + torch.rand(16, device="cuda")).to(BF16)
    expected = reference.snake_beta(x, frequency, inverse_beta)
    assert torch.equal(ops.snake_beta(x, frequency, inverse_beta), expected)


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
@pytest.mark.parametrize(
    "batch,channels,kernel,dilation,length,layout",
    [
        (64, 96, 7, 9, 7680, "contiguous"),
        (64, 768, 7, 1, 128, "channel-major"),
        (4, 24, 7, 9, 2568, "offset"),
        (16, 32, 7, 3, 16, "channel-major"),
        (3, 16, 7, 3, 13, "channel-major"),
        (1, 1024, 7, 1, 4, "contiguous"),
        (5, 8, 2, 1, 20, "offset"),
        (2, 12, 3, 1, 1, "contiguous"),
    ],
)
def test_unfold_columns_is_the_reference_copy(  # type: ignore[no-untyped-def]
    ext, dtype: torch.dtype, batch: int, channels: int, kernel: int, dilation: int, length: int, layout: str
) -> None:
    """The codec's unfolded GEMM input, bit for bit, from a batch-major input, a channel-major one (the GEMM
    convs' outputs) and one that starts mid-row (unaligned); rows staged in shared memory (>= 64 samples,
    one tile or several, the last partial), short rows of whole vectors, and rows of any length; with the
    samples whole or given as a history and the rest."""
    samples = (kernel - 1) * dilation + length
    x = torch.randn(batch, channels, samples + 5, device="cuda").to(dtype)
    x = x[..., 5:] if layout == "offset" else x[..., :samples].contiguous()
    if layout == "channel-major":
        x = x.transpose(0, 1).contiguous().transpose(0, 1)
    expected = reference.unfold_columns(x, kernel, dilation)
    got = ops.unfold_columns(x, kernel, dilation)
    assert got.shape == (channels * kernel, batch * length)
    assert torch.equal(got, expected)
    # A causal conv's context as a separate history (the codec's way): read from both, never concatenated.
    # Splits at the context and off it (a history longer or shorter than the span).
    for context in {(kernel - 1) * dilation, 1, samples - 1}:
        split = ops.unfold_columns(x[..., context:], kernel, dilation, history=x[..., :context])
        assert torch.equal(split, expected)


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
@pytest.mark.parametrize(
    "channels,phases,columns",
    [
        (768, 8, 1024),
        (96, 3, 163840),
        (384, 5, 128),
        (192, 4, 300),
        (5, 2, 1026),
        (3, 6, 514),
        (4, 7, 1000),
        (7, 1, 2),
        (7, 1, 1),
        (2, 8, 257),
    ],
)
def test_interleave_phases_is_the_reference(  # type: ignore[no-untyped-def]
    ext, dtype: torch.dtype, channels: int, phases: int, columns: int
) -> None:
    """A transposed conv's GEMM rows in sample order with the bias added, bit for bit: the codec blocks'
    shapes at 64 streams (8 and 3 phases) and at one, runs of columns whole and partial, every phase count
    from 1 to 8; an odd column count (the kernel takes columns in pairs) through the reference."""
    rows = torch.randn(channels * phases, columns, device="cuda").to(dtype)
    bias = torch.randn(channels, device="cuda").to(dtype).repeat_interleave(phases)
    got = ops.interleave_phases(rows, bias, phases)
    assert got.shape == (channels, columns * phases)
    assert torch.equal(got, reference.interleave_phases(rows, bias, phases))
    assert torch.equal(
        got.view(channels, columns, phases)[:, 3 % columns, 0], rows[::phases, 3 % columns] + bias[::phases]
    )


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize(
    "batch,channels,kernel,dilation,length,scale",
    [
        (64, 96, 7, 9, 7680, 1.0),
        (16, 32, 7, 3, 16, 1.0),
        (3, 16, 7, 3, 13, 1.0),
        (4, 24, 7, 1, 2568, 1000.0),
        (64, 48, 2, 1, 16, 1.0),
        (4, 24, 2, 1, 2560, 1.0),
    ],
)
def test_unfold_columns_with_snake_is_snake_then_unfold(  # type: ignore[no-untyped-def]
    ext,
    dtype: torch.dtype,
    with_bias: bool,
    batch: int,
    channels: int,
    kernel: int,
    dilation: int,
    length: int,
    scale: float,
) -> None:
    """The SnakeBeta before a conv (a residual unit's 7 taps, a transposed conv's 2) applied by the unfold as
    it reads x (`snake=`), with the history (already activated) read as it is: bit for bit `snake_beta` then
    the copy, and the reference, on channel-major inputs staged (>= 64 samples) or not, and past the bf16 fast
    sine's range (scale 1000). The activation's last n samples written to `activation_tail` (the next
    history) are `snake_beta`'s, for n = 1, the conv's context and the whole x."""
    context = (kernel - 1) * dilation
    x = (torch.randn(batch, channels, length, device="cuda") * scale).to(dtype)
    x = x.transpose(0, 1).contiguous().transpose(0, 1)
    history = torch.randn(batch, channels, context, device="cuda").to(dtype)
    frequency = (0.3 * torch.randn(channels, device="cuda")).exp().to(dtype)
    inverse_beta = 1.0 / ((0.3 * torch.randn(channels, device="cuda")).exp() + 1e-9).to(dtype)
    bias = (0.1 * torch.randn(channels, device="cuda")).to(dtype) if with_bias else None
    snake = reference.SnakeBetaParameters(frequency, inverse_beta, bias)
    got = ops.unfold_columns(x, kernel, dilation, history=history, snake=snake)
    activated = ops.snake_beta(x, frequency, inverse_beta, bias)
    assert torch.equal(got, ops.unfold_columns(activated, kernel, dilation, history=history))
    assert torch.equal(got, reference.unfold_columns(x, kernel, dilation, history=history, snake=snake))
    for n in sorted({1, min(context, length), length}):
        tail = torch.full((batch, channels, n), float("nan"), device="cuda").to(dtype)
        with_tail = ops.unfold_columns(
            x, kernel, dilation, history=history, snake=snake, activation_tail=tail
        )
        assert torch.equal(with_tail, got)
        assert torch.equal(tail, activated[..., length - n :])


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
@pytest.mark.parametrize("with_snake", [False, True])
@pytest.mark.parametrize(
    "batch,channels,context,length",
    [
        (64, 96, 54, 7680),
        (64, 768, 6, 128),
        (4, 64, 12, 1000),
        (2, 40, 18, 16),
        (2, 40, 18, 13),
        (3, 24, 0, 300),
        (5, 130, 7, 65),
    ],
)
def test_time_major_samples_is_the_transposed_unfold(  # type: ignore[no-untyped-def]
    ext, dtype: torch.dtype, with_snake: bool, batch: int, channels: int, context: int, length: int
) -> None:
    """The implicit-GEMM conv's operand, [history | SnakeBeta(x)] as rows [B * L, C], bit for bit the
    reference's (a 1-tap unfold, transposed), from a channel-major x: the codec's 64-stream shapes, 16-byte
    vectors with a partial history block or a partial channel block, element by element (rows that are not
    whole vectors) with partial blocks, a history longer than x, none at all. The activation tail, when
    written, is the unfold's, for n = 1 and the whole x."""
    x = torch.randn(batch, channels, length, device="cuda").to(dtype)
    x = x.transpose(0, 1).contiguous().transpose(0, 1)
    history = torch.randn(batch, channels, context, device="cuda").to(dtype) if context else None
    snake = None
    if with_snake:
        frequency = (0.3 * torch.randn(channels, device="cuda")).exp().to(dtype)
        inverse_beta = 1.0 / ((0.3 * torch.randn(channels, device="cuda")).exp() + 1e-9).to(dtype)
        bias = (0.1 * torch.randn(channels, device="cuda")).to(dtype)
        snake = reference.SnakeBetaParameters(frequency, inverse_beta, bias)
    got = ops.time_major_samples(x, history, snake)
    assert got.shape == (batch * (context + length), channels) and got.is_contiguous()
    assert torch.equal(got, reference.time_major_samples(x, history, snake))
    if snake is not None:
        for n in sorted({1, length}):
            tail = torch.full((batch, channels, n), float("nan"), device="cuda").to(dtype)
            expected_tail = torch.full_like(tail, float("nan"))
            assert torch.equal(ops.time_major_samples(x, history, snake, tail), got)
            ops.unfold_columns(x, 1, 1, history, snake, expected_tail)
            assert torch.equal(tail, expected_tail)


def test_unfold_columns_checks_the_activation_tail(ext) -> None:  # type: ignore[no-untyped-def]
    """A tail longer than the conv's steps, or one without SnakeBeta, is refused: nothing out of bounds."""
    x = torch.randn(2, 8, 16, device="cuda")
    history = torch.randn(2, 8, 6, device="cuda")
    snake = reference.SnakeBetaParameters(torch.ones(8, device="cuda"), torch.ones(8, device="cuda"))
    with pytest.raises(RuntimeError, match="tail must be"):
        ops.unfold_columns(x, 7, 1, history, snake, torch.empty(2, 8, 17, device="cuda"))
    with pytest.raises(ValueError, match="needs snake"):
        ops.unfold_columns(x, 7, 1, history, None, torch.empty(2, 8, 6, device="cuda"))


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
@pytest.mark.parametrize(
    "batch,channels,kernel,dilation,length",
    [(64, 96, 7, 1, 7680), (1, 96, 7, 1, 1920), (3, 40, 5, 3, 33), (2, 8, 1, 1, 5)],
)
def test_conv_to_one_channel(  # type: ignore[no-untyped-def]
    ext, dtype: torch.dtype, batch: int, channels: int, kernel: int, dilation: int, length: int
) -> None:
    """The codec's last conv computed directly, against the float64 conv of the same inputs: float32 within
    1e-5 relative L2, bf16 within its output rounding; from a channel-major input with a separate history."""
    context = (kernel - 1) * dilation
    samples = torch.randn(batch, channels, context + length, device="cuda").to(dtype)
    samples = samples.transpose(0, 1).contiguous().transpose(0, 1)  # channel-major, like a GEMM conv's output
    weight = (torch.randn(1, channels, kernel, device="cuda") / (channels * kernel) ** 0.5).to(dtype)
    bias = torch.randn(1, device="cuda").to(dtype)
    expected = torch.nn.functional.conv1d(samples.double(), weight.double(), bias.double(), dilation=dilation)
    whole = ops.conv_to_one_channel(samples, weight, bias, dilation)
    rest, history = samples[..., context:], samples[..., :context]
    split = ops.conv_to_one_channel(rest, weight, bias, dilation, history=history)
    assert whole.shape == (batch, 1, length) and whole.dtype == dtype
    assert torch.equal(split, whole)
    assert rel(whole, expected) <= (1e-5 if dtype == torch.float32 else 4e-3)
    assert torch.equal(ops.conv_to_one_channel(samples[-1:], weight, bias, dilation)[0], whole[-1])


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
@pytest.mark.parametrize(
    "batch,frames,position,group",
    [(1, 4, 500, 1), (1, 1, 0, 1), (64, 4, 37, 1), (3, 32, 2, 1), (2, 4, 70, 2), (5, 3, 71, 1)],
)
def test_codec_window_attention(  # type: ignore[no-untyped-def]
    ext, dtype: torch.dtype, batch: int, frames: int, position: int, group: int
) -> None:
    """The codec transformer's attention of one pass against the torch ops it replaces, at the codec's 16 KV
    heads of 64 dims and its 72-frame window: packets of 1 and 4 frames, a one-shot decode's 32-frame pass
    (dynamic shared memory above 48 KB), streams whose window starts before frame 0 (only some slots real),
    grouped KV heads, streams at different positions in one batch."""
    generator = torch.Generator(device="cuda").manual_seed(batch * 1000 + frames + position)
    kv_heads, dim, window = 16 // group, 64, 72

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, device="cuda").to(dtype)

    qkv = rand(batch, frames, kv_heads, group + 2, dim)
    cache = rand(batch, kv_heads, window - 1, 2 * dim)
    positions = position + torch.arange(batch, device="cuda") * 3
    inv_freq = 1.0 / 10000 ** (torch.arange(0, dim, 2, device="cuda") / dim)
    signed = torch.cat([-inv_freq, inv_freq])  # as `PreTransformer` derives it; the value row at angle 0
    rows = torch.cat([signed.expand(group + 1, -1), torch.zeros(1, dim, device="cuda")])
    angles = (positions[:, None] + torch.arange(frames, device="cuda"))[:, :, None, None] * rows
    cos, sin = angles.cos().to(dtype)[:, :, None], angles.sin().to(dtype)[:, :, None]
    out, next_cache = ops.codec_window_attention(qkv, cos, sin, cache, positions)
    expected_out, expected_cache = reference.codec_window_attention(qkv, cos, sin, cache, positions)
    assert out.shape == expected_out.shape and next_cache.shape == expected_cache.shape
    assert torch.equal(next_cache, expected_cache), "the next cache differs from torch's"
    assert rel(out, expected_out) <= (1e-5 if dtype == torch.float32 else 1e-2)
    alone, alone_cache = ops.codec_window_attention(qkv[-1:], cos[-1:], sin[-1:], cache[-1:], positions[-1:])
    assert torch.equal(alone, out[-1:]) and torch.equal(alone_cache, next_cache[-1:])


def _codec_like_state(slots: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Tensors shaped like a codec stream state's pool (int64 positions, a float32 K/V ring, histories of
    odd lengths in float32 and bf16, one starting mid-row), each with `slots` rows."""

    def rand(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, device="cuda").to(dtype)

    return [
        torch.randint(0, 1000, (slots,), generator=generator, device="cuda"),
        rand(slots, 16, 71, 128),
        rand(slots, 1024, 6),
        rand(slots, 96, 3, dtype=BF16),
        rand(slots, 384, 18)[..., 1:],  # a view that starts mid-row: 68-byte rows, 4-byte granules
        rand(slots, 5, 1, dtype=BF16)[..., :1],
    ]


@pytest.mark.parametrize("slots,batch", [(65, 1), (65, 64), (9, 4)])
def test_gather_and_scatter_rows_are_the_index_ops(ext, slots: int, batch: int) -> None:  # type: ignore[no-untyped-def]
    """The codec graphs' state gather and scatter (one kernel each way) against index_select / index_copy_,
    bit for bit, from contiguous pools and into them from strided views (the decoder's state entries are
    slices of its activations), for tensors whose rows need 16-, 8-, 4- and 2-byte copies."""
    generator = torch.Generator(device="cuda").manual_seed(slots * 100 + batch)
    pool = _codec_like_state(slots, generator)
    picked = torch.randint(0, slots, (batch,), generator=generator, device="cuda")  # repeats allowed
    gathered = ops.gather_rows(pool, picked)
    for got, expected in zip(gathered, reference.gather_rows(pool, picked), strict=True):
        assert got.shape == expected.shape and got.dtype == expected.dtype
        assert torch.equal(got, expected)

    sources = []  # the pool's row shapes, as views into wider tensors (rows and last dims not contiguous)
    for t in pool:
        if t.dim() == 1:
            positions = torch.randint(0, 1000, (batch + 3,), generator=generator, device="cuda")
            sources.append(positions[1 : batch + 1])
            continue
        wide = torch.randn(batch + 3, *t.shape[1:-1], t.shape[-1] + 2, generator=generator, device="cuda")
        sources.append(wide.to(t.dtype)[1 : batch + 1, ..., 1 : t.shape[-1] + 1])
    distinct = torch.randperm(slots, generator=generator, device="cuda")[:batch]
    targets = [t.clone() for t in pool]
    expected_targets = [t.clone() for t in pool]
    ops.scatter_rows_(targets, distinct, sources)
    reference.scatter_rows_(expected_targets, distinct, sources)
    for got, expected in zip(targets, expected_targets, strict=True):
        assert torch.equal(got, expected)

"""Without CUDA the kernel ops fall back to the torch references and give identical results; the fast
frame (fused layout: qkv and gate/up concatenated, per-row linears, one-token attention) computes the same
frame as `step.decode_frames` when its ops run on those references."""

from __future__ import annotations

from dataclasses import replace
from typing import cast

import pytest
import torch

from qwen3_tts_native.engine.config import VoiceDesignConfig
from qwen3_tts_native.engine.kernels import loader, ops, reference
from qwen3_tts_native.engine.model import layers
from qwen3_tts_native.engine.model.predictor import CodePredictor
from qwen3_tts_native.engine.model.talker import Talker
from qwen3_tts_native.engine.runtime import graphs, sampling, step
from qwen3_tts_native.engine.runtime.graphs import KernelFrame
from qwen3_tts_native.engine.runtime.modes import FAST, resolve_mode

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")


def test_extension_is_not_loaded_without_cuda() -> None:
    assert loader.load() is None
    assert not ops.kernels_available()


def test_every_kernel_source_is_built_and_hashed() -> None:
    """A source file left out of SOURCES/HEADERS would be missing from the build or, worse, could change
    without changing the build cache key."""
    on_disk = {p.name for p in loader.CSRC.iterdir() if p.suffix in {".cu", ".cuh", ".cpp", ".h"}}
    assert on_disk == {*loader.SOURCES, *loader.HEADERS}


def test_norms_rope_swiglu_fall_back_exactly() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 64, generator=g)
    w = torch.randn(64, generator=g)
    assert torch.equal(ops.rms_norm(x, w, 1e-6), layers.rms_norm(x, w, 1e-6))
    residual = torch.randn(3, 64, generator=g)
    expected_sum = residual + x
    r = residual.clone()
    assert torch.equal(ops.add_rms_norm_(x, r, w, 1e-6), layers.rms_norm(expected_sum, w, 1e-6))
    assert torch.equal(r, expected_sum)
    gate, up = torch.randn(3, 64, generator=g), torch.randn(3, 64, generator=g)
    assert torch.equal(ops.silu_mul(gate, up), layers.swiglu(gate, up))
    pair = torch.zeros(3, 2, 64)
    r = residual.clone()
    written = ops.add_rms_norm_(x, r, w, 1e-6, out=pair[:, 0])
    assert written.data_ptr() == pair.data_ptr()
    assert torch.equal(pair[:, 0], layers.rms_norm(expected_sum, w, 1e-6))
    assert not pair[:, 1].any()


def test_split_sums_are_added_in_split_order_then_normed() -> None:
    """A product's unadded split sums (`ops.SplitSums`, rows past `rows` ignored) through `add_rms_norm_`: off
    CUDA the partials added in split order from zero and rounded once to bf16 (`ops.added`), then the
    add-RMSNorm of that product, residual updated in place, `out` written where asked."""
    g = torch.Generator().manual_seed(5)
    partials = torch.randn(4, 8, 64, generator=g) * 4
    sums = ops.SplitSums(partials, 3)
    product = (((partials[0, :3] + partials[1, :3]) + partials[2, :3]) + partials[3, :3]).to(torch.bfloat16)
    assert torch.equal(ops.added(sums), product)
    w = (1 + 0.1 * torch.randn(64, generator=g)).to(torch.bfloat16)
    residual = torch.randn(3, 64, generator=g).to(torch.bfloat16)
    r_sums, r_product = residual.clone(), residual.clone()
    expected = ops.add_rms_norm_(product, r_product, w, 1e-6)
    assert torch.equal(ops.add_rms_norm_(sums, r_sums, w, 1e-6), expected)
    assert torch.equal(r_sums, r_product) and not torch.equal(r_sums, residual)
    pair = torch.zeros(3, 2, 64, dtype=torch.bfloat16)
    r_pair = residual.clone()
    ops.add_rms_norm_(sums, r_pair, w, 1e-6, out=pair[:, 0])
    assert torch.equal(pair[:, 0], expected) and torch.equal(r_pair, r_product) and not pair[:, 1].any()
    r_quantized = residual.clone()
    quantized = ops.add_rms_norm_fp8_(sums, r_quantized, w, 1e-6)
    assert torch.equal(r_quantized, r_product)
    codes = ops.quantize_rows_fp8(expected).codes
    assert torch.equal(quantized.codes.view(torch.uint8), codes.view(torch.uint8))


def test_the_fp8_triton_products_fall_back_to_fp8_linear() -> None:
    """Off CUDA (or where Triton does not take them) e4m3 rows on an e4m3 weight are `fp8_linear`'s product,
    and on an e4m3 [gate; up] that product rounded to bf16, then `silu_mul` of its halves."""
    g = torch.Generator().manual_seed(6)
    rows = ops.quantize_rows_fp8(torch.randn(5, 64, generator=g, dtype=torch.bfloat16))
    weight = reference.quantize_weight(torch.randn(96, 64, generator=g), "fp8")
    assert not ops.triton_fp8_linear_suits(rows, weight, swiglu=True)
    product = ops.fp8_linear(rows, weight)
    expected = ops.silu_mul(product[:, :48], product[:, 48:])
    assert torch.equal(ops.triton_fp8_linear_swiglu(rows, weight), expected)
    assert torch.equal(ops.triton_fp8_linear(rows, weight), product)


def test_samplers_record_their_draws_in_the_rows_slots() -> None:
    """`ops.DrawRecord`: the cb0 draw sets its bit of each row's slot history and writes its embedding where
    it is told; the last draw copies each row's codes to its slot's last frame. The scratch slot (3) is shared
    by two padded rows."""
    g = torch.Generator().manual_seed(4)
    rows, vocab = 4, 48
    slots = torch.tensor([2, 0, 3, 3])
    params = sampling.SamplingRows(
        greedy=torch.tensor([True, False, False, True]),
        temperature=torch.full((rows,), 0.9),
        top_k=torch.full((rows,), 5),
        top_p=torch.ones(rows, dtype=torch.float64),
        repetition_penalty=torch.full((rows,), 1.05),
    )
    logits = torch.randn(rows, vocab, generator=g)
    uniforms = torch.rand(rows, generator=g, dtype=torch.float64)
    seen = torch.zeros(rows, vocab, dtype=torch.bool)
    frames = torch.full((rows,), 5)
    table = torch.randn(vocab, 8, generator=g)
    history = torch.zeros(5, vocab, dtype=torch.bool)
    codes = torch.full((rows, 3), -1)
    pair = torch.zeros(rows, 2, 8)
    drawn, embedded = ops.sample_talker_and_embed(
        logits,
        uniforms,
        params,
        seen,
        frames,
        vocab - 1,
        table,
        out=codes[:, 0],
        embed_out=pair[:, 1],
        record=ops.DrawRecord(slots, history=history),
    )
    expected = ops.sample_talker(logits, uniforms, params, seen, frames, vocab - 1)
    assert torch.equal(drawn, expected) and torch.equal(codes[:, 0], expected)
    assert embedded.data_ptr() == pair[:, 1].data_ptr() and torch.equal(pair[:, 1], table[expected])
    assert not pair[:, 0].any()
    for row in range(2):
        assert history[slots[row]].nonzero().flatten().tolist() == [int(expected[row])]
    assert not history[1].any() and not history[4].any()
    codes[:, 1] = torch.arange(rows)
    last_codes = torch.full((5, 3), -7)
    drawn = ops.sample_predictor(
        logits,
        uniforms,
        params,
        out=codes[:, 2],
        record=ops.DrawRecord(slots, last_codes=last_codes, frame_codes=codes),
    )
    assert torch.equal(last_codes[2], codes[0]) and torch.equal(last_codes[0], codes[1])
    assert torch.equal(last_codes[[1, 4]], torch.full((2, 3), -7))
    assert int(last_codes[3, 2]) in drawn[2:].tolist()


def test_snake_beta_falls_back_to_the_official_expression() -> None:
    """The codec's SnakeBeta from its precomputed per-channel constants equals the official module's
    expression (exponentials taken on every call) exactly, with and without a conv bias added first."""
    g = torch.Generator().manual_seed(6)
    x, alpha, beta, bias = torch.randn(2, 8, 5, generator=g), *torch.randn(3, 8, generator=g)
    for dtype in (torch.float32, torch.bfloat16):
        xd, a, b, c = (t.to(dtype) for t in (x, alpha, beta, bias))
        frequency, inverse_beta = a.exp(), 1.0 / (b.exp() + 1e-9)
        for given, summed in ((None, xd), (c, xd + c[None, :, None])):
            official = summed + (1.0 / (b.exp()[None, :, None] + 1e-9)) * torch.sin(
                summed * a.exp()[None, :, None]
            ).pow(2)
            assert torch.equal(ops.snake_beta(xd, frequency, inverse_beta, given), official)


def test_linear_falls_back_for_bf16_and_8bit() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 32, generator=g)
    w = torch.randn(48, 32, generator=g)
    bias = torch.randn(48, generator=g)
    assert torch.equal(ops.linear(x, w, bias), layers.linear(x, w, bias))
    for kind in ("int8", "fp8"):
        q = reference.quantize_weight(w, kind)
        out = ops.linear(x, q)
        assert torch.equal(out, reference.linear(x, q))
        rel = (out - x @ w.t()).norm() / (x @ w.t()).norm()
        assert rel < (0.02 if kind == "int8" else 0.08)


def test_fp8_linear_falls_back_to_the_product_of_row_quantized_codes() -> None:
    """Off CUDA `fp8_linear` is the reference: x quantized per row (its largest element to +-448), times the
    fp8 weight codes, both scales applied; within e4m3's error of the plain product."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, 64, generator=g, dtype=torch.bfloat16)
    x[1] = 0
    w = torch.randn(48, 64, generator=g)
    weight = reference.quantize_weight(w, "fp8")
    codes, scale = ops.quantize_rows_fp8(x)
    assert codes.dtype == torch.float8_e4m3fn and scale.shape == (5,)
    assert torch.equal(codes.float().abs().amax(dim=1)[[0, 2, 3, 4]], torch.full((4,), 448.0))
    assert not codes[1].float().any()
    assert (codes.float() * scale[:, None] - x.float()).norm() / x.float().norm() < 0.04
    out = ops.fp8_linear(x, weight)
    assert out.dtype == torch.bfloat16 and torch.equal(out, reference.fp8_linear(x, weight))
    expected = codes.float() @ weight.data.float().t() * scale[:, None] * weight.scale
    assert torch.equal(out, expected.to(torch.bfloat16))
    plain = x.float() @ w.t()
    assert (out.float() - plain).norm() / plain.norm() < 0.08
    assert torch.equal(ops.fp8_linear(ops.quantize_rows_fp8(x), weight), out)


def test_row_ops_that_quantize_are_the_op_then_the_quantization() -> None:
    """Off CUDA the norm and SiLU x up that quantize their rows for `fp8_linear` are the bf16 op then
    `quantize_rows_fp8`; the residual add lands in place as `add_rms_norm_`'s does."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(6, 64, generator=g, dtype=torch.bfloat16)
    delta = torch.randn(6, 64, generator=g, dtype=torch.bfloat16)
    w = (1 + 0.1 * torch.randn(64, generator=g)).to(torch.bfloat16)

    def same(a: reference.QuantizedRows, b: reference.QuantizedRows) -> bool:
        return torch.equal(a.scale, b.scale) and torch.equal(
            a.codes.view(torch.uint8), b.codes.view(torch.uint8)
        )

    assert same(ops.rms_norm_fp8(x, w, 1e-6), ops.quantize_rows_fp8(ops.rms_norm(x, w, 1e-6)))
    residual, expected_residual = x.clone(), x.clone()
    fused = ops.add_rms_norm_fp8_(delta, residual, w, 1e-6)
    assert same(fused, ops.quantize_rows_fp8(ops.add_rms_norm_(delta, expected_residual, w, 1e-6)))
    assert torch.equal(residual, expected_residual) and not torch.equal(residual, x)
    gate, up = x, delta
    assert same(ops.silu_mul_fp8(gate, up), ops.quantize_rows_fp8(ops.silu_mul(gate, up)))


def test_linear_swiglu_falls_back_to_linear_then_swiglu() -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 64, generator=g)
    gate_up = torch.randn(2 * 48, 64, generator=g)
    product = layers.linear(x, gate_up)
    expected = layers.swiglu(product[:, :48], product[:, 48:])
    assert torch.equal(ops.linear_swiglu(x, gate_up), expected)
    quantized = reference.quantize_weight(gate_up, "int8")
    product = reference.linear(x, quantized)
    assert torch.equal(ops.linear_swiglu(x, quantized), layers.swiglu(product[:, :48], product[:, 48:]))


def test_tensor_core_linear_falls_back_to_the_reference_products() -> None:
    """Off CUDA the tensor-core products are not taken (`tensor_core_linear_suits` is False) and both ops are
    their references: bf16 weights the model's product, fp8 the fp32 product of the stored codes."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(8, 64, generator=g, dtype=torch.bfloat16)
    w = torch.randn(128, 64, generator=g).to(torch.bfloat16)
    bias = torch.randn(128, generator=g).to(torch.bfloat16)
    quantized = reference.quantize_weight(w.float(), "fp8")
    for weight in (w, quantized):
        assert not ops.tensor_core_linear_suits(x, weight)
        assert not ops.tensor_core_linear_suits(x, weight, swiglu=True)
        assert torch.equal(ops.tensor_core_linear(x, weight, bias), reference.linear(x, weight, bias))
        assert torch.equal(ops.tensor_core_linear_swiglu(x, weight), reference.linear_swiglu(x, weight))


@pytest.mark.parametrize("swiglu", [False, True])
@pytest.mark.parametrize("with_delta", [False, True])
def test_rms_norm_linear_falls_back_to_add_norm_then_linear(swiglu: bool, with_delta: bool) -> None:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 64, generator=g)
    delta = torch.randn(3, 64, generator=g) if with_delta else None
    norm = torch.randn(64, generator=g)
    w = torch.randn(96, 64, generator=g)
    before = x.clone()
    out, s = ops.rms_norm_linear(x, norm, 1e-6, w, delta=delta, swiglu=swiglu)
    expected_sum = x if delta is None else x + delta
    h = layers.rms_norm(expected_sum, norm, 1e-6)
    product = layers.linear(h, w)
    expected = layers.swiglu(product[:, :48], product[:, 48:]) if swiglu else product
    assert torch.equal(s, expected_sum)
    assert torch.equal(out, expected)
    assert torch.equal(x, before)
    reference_out, reference_sum = reference.rms_norm_linear(x, norm, 1e-6, w, delta=delta, swiglu=swiglu)
    assert torch.equal(out, reference_out) and torch.equal(s, reference_sum)


def test_attention_and_cache_write_fall_back() -> None:
    g = torch.Generator().manual_seed(2)
    batch, heads, kv_heads, dim, max_len = 3, 4, 2, 16, 12
    cache_k = torch.randn(4, kv_heads, max_len, dim, generator=g)
    cache_v = torch.randn(4, kv_heads, max_len, dim, generator=g)
    q = torch.randn(batch, heads * dim, generator=g)
    k = torch.randn(batch, kv_heads * dim, generator=g)
    v = torch.randn(batch, kv_heads * dim, generator=g)
    qn, kn = torch.randn(dim, generator=g), torch.randn(dim, generator=g)
    cos, sin = layers.rope_cos_sin(torch.arange(max_len), dim, 1e6, torch.float32)
    positions, slots = torch.tensor([0, 5, 11]), torch.tensor([2, 0, 3])
    k1, v1 = cache_k.clone(), cache_v.clone()
    keys = torch.empty(batch, kv_heads, dim)
    q_roped = ops.qk_norm_rope_cache(q, k, v, qn, kn, cos, sin, positions, slots, k1, v1, 1e-6, keys)
    k2, v2 = cache_k.clone(), cache_v.clone()
    expected = reference.qk_norm_rope_cache(q, k, v, qn, kn, cos, sin, positions, slots, k2, v2, 1e-6)
    assert torch.equal(q_roped, expected) and torch.equal(k1, k2) and torch.equal(v1, v2)
    assert torch.equal(keys, k2[slots, :, positions])
    out = ops.decode_attention(q_roped, k1, v1, slots, positions + 1, dim**-0.5)
    assert torch.equal(out, reference.decode_attention(q_roped, k1, v1, slots, positions + 1, dim**-0.5))


def test_rope_attention_over_an_e4m3_cache_falls_back() -> None:
    """Without the extension an e4m3 cache (fast mode's talker) takes the references: each written K/V row
    is `quantize_rows_fp8`'s codes and scale of the bf16 one, and the attention reads the codes times their
    scales, close to the attention over the bf16 cache (the e4m3 rounding of the keys and values)."""
    g = torch.Generator().manual_seed(4)
    batch, heads, kv_heads, dim, max_len = 3, 4, 2, 64, 40
    bf16 = torch.bfloat16
    q, k, v = (torch.randn(batch, n * dim, generator=g).to(bf16) for n in (heads, kv_heads, kv_heads))
    qn, kn = (
        (1 + 0.1 * torch.randn(dim, generator=g)).to(bf16),
        (1 + 0.1 * torch.randn(dim, generator=g)).to(bf16),
    )
    cos, sin = layers.rope_cos_sin(torch.arange(max_len), dim, 1e6, bf16)
    positions, slots = torch.tensor([0, 17, 39]), torch.tensor([2, 0, 3])
    plain = layers.KVCache.allocate(1, 4, kv_heads, max_len, dim, bf16, "cpu")
    plain.k.normal_(generator=g)
    plain.v.normal_(generator=g)
    coded = layers.KVCache.allocate(1, 4, kv_heads, max_len, dim, torch.float8_e4m3fn, "cpu")
    assert coded.scales is not None and coded.scales.k.shape == (1, 4, kv_heads, max_len)
    for source, codes, scale in ((plain.k, coded.k, coded.scales.k), (plain.v, coded.v, coded.scales.v)):
        quantized = reference.quantize_rows_fp8(source.view(-1, dim))
        codes.copy_(quantized.codes.view(codes.shape))
        scale.copy_(quantized.scale.view(scale.shape))
    scales = layers.CacheScales(coded.scales.k[0], coded.scales.v[0])
    args = (q, k, v, qn, kn, cos, sin, positions, positions + 1, slots)
    expected = ops.rope_attention(*args, plain.k[0], plain.v[0], 1e-6, dim**-0.5, distinct_slots=True)
    got = ops.rope_attention(
        *args, coded.k[0], coded.v[0], 1e-6, dim**-0.5, distinct_slots=True, scales=scales
    )
    for cache, codes, scale in ((plain.k, coded.k, scales.k), (plain.v, coded.v, scales.v)):
        written = reference.quantize_rows_fp8(cache[0][slots, :, positions].reshape(-1, dim))
        assert torch.equal(codes[0][slots, :, positions].reshape(-1, dim).float(), written.codes.float())
        assert torch.equal(scale[slots, :, positions].reshape(-1), written.scale)
    assert 0 < float((got.float() - expected.float()).norm() / expected.float().norm()) < 0.1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float8_e4m3fn])
def test_kv_cache_position_bytes_are_what_a_pool_allocates(dtype: torch.dtype) -> None:
    """`KVCache.position_bytes` (the server sizes its pool by it) counts every tensor `allocate` makes: an
    e4m3 pool's codes and row scales take 132 of bfloat16's 256 bytes a row of 128."""
    layers_, slots, kv_heads, max_len, dim = 3, 2, 4, 5, 128
    cache = layers.KVCache.allocate(layers_, slots, kv_heads, max_len, dim, dtype, "cpu")
    tensors = [cache.k, cache.v, *(cache.scales or ())]
    allocated = sum(t.numel() * t.element_size() for t in tensors)
    assert allocated == slots * max_len * layers.KVCache.position_bytes(layers_, kv_heads, dim, dtype)


def test_samplers_fall_back_to_sample_with_uniform() -> None:
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(5, 3072, generator=g) * 3
    u = torch.rand(5, generator=g, dtype=torch.float64)
    params = sampling.SamplingRows.cat(
        [
            sampling.SamplingRows.single(
                greedy=i == 0, temperature=0.9, top_k=50, top_p=0.95, repetition_penalty=1.05
            )
            for i in range(5)
        ]
    )
    history = torch.rand(5, 3072, generator=g) < 0.01
    frames = torch.tensor([0, 1, 2, 3, 50])
    banned = sampling.talker_banned_tokens(frames, 3072, 2150)
    assert torch.equal(
        ops.sample_talker(logits, u, params, history, frames, 2150),
        sampling.sample_with_uniform(logits, u, params, history, banned),
    )
    assert torch.equal(
        ops.sample_predictor(logits[:, :2048], u, params),
        sampling.sample_with_uniform(logits[:, :2048], u, params),
    )
    table = torch.randn(2048, 64, generator=g).to(torch.bfloat16)
    codes, embedded = ops.sample_predictor_and_embed(logits[:, :2048].to(torch.bfloat16), u, params, table)
    assert torch.equal(
        codes, sampling.sample_with_uniform(logits[:, :2048].to(torch.bfloat16).float(), u, params)
    )
    assert torch.equal(embedded, table[codes])
    talker_table = torch.randn(3072, 64, generator=g).to(torch.bfloat16)
    cb0, cb0_embed = ops.sample_talker_and_embed(logits, u, params, history, frames, 2150, talker_table)
    assert torch.equal(cb0, sampling.sample_with_uniform(logits, u, params, history, banned))
    assert torch.equal(cb0_embed, talker_table[cb0])


def test_frame_embedding_falls_back_to_the_talker_input(
    tiny_voice_design_config: VoiceDesignConfig, tiny_tensors: dict[str, torch.Tensor]
) -> None:
    talker = Talker.from_tensors(tiny_voice_design_config, tiny_tensors)
    g = torch.Generator().manual_seed(5)
    codes = torch.randint(0, 2048, (3, 16), generator=g)
    text = torch.randn(3, talker.hidden_size, generator=g).to(torch.bfloat16)
    tables = torch.stack(list(talker.codebook_embeddings))
    got = ops.frame_embedding(codes, talker.codec_embedding, tables, text)
    assert torch.equal(got, step.frame_input(talker, codes, text))


def test_modes_resolve(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QWEN3_TTS_MODE", raising=False)
    assert resolve_mode().name == "exact"
    monkeypatch.setenv("QWEN3_TTS_MODE", "FAST")
    assert resolve_mode() is FAST
    with pytest.raises(ValueError):
        resolve_mode("turbo")
    with pytest.raises(ValueError, match="fp8 weights"):
        replace(FAST, weights="int8")  # int8 codes cannot feed an fp8 GEMM


@pytest.mark.parametrize("samplers_record", [True, False])
def test_fast_frame_matches_the_reference_frame_on_cpu(
    tiny_voice_design_config: VoiceDesignConfig,
    tiny_tensors: dict[str, torch.Tensor],
    monkeypatch: pytest.MonkeyPatch,
    samplers_record: bool,
) -> None:
    """`KernelFrame.decode_step` (what a decode graph captures: each slot's last codes read in place, the
    sampling rows gathered beside the frame on CUDA, the codes recorded by the samplers or, above
    `SAMPLERS_RECORD_MAX_ROWS`, after the frame) computes the eager backend's frame on the CPU fallbacks: the
    same codes, recorded into the slot state the same way."""
    if not samplers_record:
        monkeypatch.setattr(graphs, "SAMPLERS_RECORD_MAX_ROWS", 0)
    talker = Talker.from_tensors(tiny_voice_design_config, tiny_tensors)
    predictor = CodePredictor.from_tensors(tiny_voice_design_config, tiny_tensors)
    bf16_fast = type(FAST)("fast", "bf16", torch.float32)
    fast = KernelFrame(talker, predictor, bf16_fast)
    batch = 3
    g = torch.Generator().manual_seed(4)
    cache_a = talker.new_cache(4, 32)
    cache_a.k.normal_(generator=g)
    cache_a.v.normal_(generator=g)
    cache_b = layers.KVCache(cache_a.k.clone(), cache_a.v.clone())
    state_a = step.SlotState.zeros(4, 16, 3072, 8, torch.device("cpu"))
    state_a.last_codes.copy_(torch.randint(0, 2048, (4, 16), generator=g))
    state_a.cb0_history.copy_(torch.rand(4, 3072, generator=g) < 0.01)
    state_a.uniforms.copy_(torch.rand(8, 16, generator=g, dtype=torch.float64))
    state_b = state_a.with_slots(4)
    text = torch.randn(batch, talker.hidden_size, generator=g)
    index = step.StepIndex.host_table([3, 17, 9], [1, 3, 0], [0, 5, 9], [6, 2, 4])
    sampling_rows = (
        sampling.SamplingRows.cat(
            [
                sampling.SamplingRows.single(
                    greedy=True, temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.05
                )
            ]
            * batch
        ),
        sampling.SamplingRows.cat(
            [sampling.SamplingRows.single(greedy=True, temperature=1.0, top_k=0, top_p=1.0)] * batch
        ),
    )
    with torch.no_grad():
        expected = step.EagerFrameBackend.decode_frames(
            talker, predictor, cache_a, state_a, index, list(text), sampling_rows
        )
        got = fast.decode_step(cache_b, state_b, step.StepIndex(index), text, sampling_rows)
    assert torch.equal(got, expected)
    assert torch.equal(state_b.last_codes, state_a.last_codes)
    assert torch.equal(state_b.cb0_history, state_a.cb0_history)
    assert bool(state_a.cb0_history[[1, 3, 0], expected[:, 0]].all())
    torch.testing.assert_close(cache_b.k, cache_a.k, rtol=1e-5, atol=1e-5)


def test_the_kept_predictor_cache_is_never_replaced(
    tiny_voice_design_config: VoiceDesignConfig, tiny_tensors: dict[str, torch.Tensor]
) -> None:
    """The predictor's K/V kept for the largest bucket serve every smaller batch from the same storage (a
    captured graph holds its address); a larger batch gets caches of its own and leaves the kept ones."""
    talker = Talker.from_tensors(tiny_voice_design_config, tiny_tensors)
    predictor = CodePredictor.from_tensors(tiny_voice_design_config, tiny_tensors)
    frame = KernelFrame(talker, predictor, type(FAST)("fast", "bf16", torch.float32))
    hidden = torch.zeros(graphs.BUCKETS[-1] + 1, talker.hidden_size)
    first_k, _ = frame._predictor_cache(hidden[:3])
    assert first_k.shape[1] == 3
    larger_k, _ = frame._predictor_cache(hidden)
    assert larger_k.shape[1] == graphs.BUCKETS[-1] + 1
    assert larger_k.untyped_storage().data_ptr() != first_k.untyped_storage().data_ptr()
    again_k, _ = frame._predictor_cache(hidden[:1])
    assert again_k.untyped_storage().data_ptr() == first_k.untyped_storage().data_ptr()


def test_the_blocks_and_heads_take_the_modes_triton_rows(
    tiny_voice_design_config: VoiceDesignConfig, tiny_tensors: dict[str, torch.Tensor]
) -> None:
    """Every block weight and every head carries the mode's `triton_max_rows` (on Hopper their 33-128-row
    products leave cuBLAS, whose kernels break the dependent-launch chain); the predictor's input projection,
    with its bias, does not."""
    talker = Talker.from_tensors(tiny_voice_design_config, tiny_tensors)
    predictor = CodePredictor.from_tensors(tiny_voice_design_config, tiny_tensors)
    mode = type(FAST)("fast", "bf16", torch.float32)
    frame = KernelFrame(talker, predictor, mode)
    blocks = frame.talker_blocks + frame.predictor_blocks
    weights = [frame.codec_head, *frame.heads, *(w for block in blocks for w in block.weights)]
    assert len(weights) == 1 + len(predictor.heads) + 4 * len(blocks)
    assert {w.triton_max_rows for w in weights} == {mode.triton_max_rows} == {128}
    assert frame.projection.triton_max_rows == 0
    fast = KernelFrame(talker, predictor, FAST)
    fp8_rows = [w for block in fast.talker_blocks + fast.predictor_blocks for w in (block.qkv, block.gate_up)]
    others = [fast.codec_head, *fast.heads, *(w for b in fast.talker_blocks for w in (b.o, b.down))]
    assert all(w.triton_fp8_rows for w in fp8_rows) and not any(w.triton_fp8_rows for w in others)


def test_fast_prefill_matches_the_talker_prompt_pass_on_cpu(
    tiny_voice_design_config: VoiceDesignConfig, tiny_tensors: dict[str, torch.Tensor]
) -> None:
    """The fast prefill (one kernel row per prompt token) computes the talker's prompt pass."""
    talker = Talker.from_tensors(tiny_voice_design_config, tiny_tensors)
    predictor = CodePredictor.from_tensors(tiny_voice_design_config, tiny_tensors)
    fast = KernelFrame(talker, predictor, type(FAST)("fast", "bf16", torch.float32))
    prompt = torch.randn(11, talker.hidden_size, generator=torch.Generator().manual_seed(8))
    slot = torch.tensor([2])
    cache_a, cache_b = talker.new_cache(4, 32), talker.new_cache(4, 32)
    with torch.no_grad():
        positions = torch.arange(prompt.shape[0]).unsqueeze(0)
        expected = talker(prompt.unsqueeze(0), positions, slot, cache_a)[:, -1]
        got = fast.prefill_hidden(prompt, slot, cache_b)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cache_b.k, cache_a.k, rtol=1e-5, atol=1e-5)


def test_fast_prefill_of_several_prompts_equals_each_prompt_alone_on_cpu(
    tiny_voice_design_config: VoiceDesignConfig,
    tiny_tensors: dict[str, torch.Tensor],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Several sessions' prompts as the rows of one kernel pass (each row at its own position in its own
    slot) give each session exactly its single-prompt pass, hidden and cache (the CPU fallback is exact per
    row), also when the prompts are cut into two passes within a bucket (`prompt_passes`); their frames
    completed together equal those completed alone. Passes above the buckets, padded or not, give the same
    to within rounding."""
    talker = Talker.from_tensors(tiny_voice_design_config, tiny_tensors)
    predictor = CodePredictor.from_tensors(tiny_voice_design_config, tiny_tensors)
    fast = KernelFrame(talker, predictor, type(FAST)("fast", "bf16", torch.float32))
    g = torch.Generator().manual_seed(9)
    prompts = [torch.randn(n, talker.hidden_size, generator=g) for n in (11, 4, 7)]
    slots = torch.tensor([2, 0, 3])
    rows = [
        step.FrameRows(
            uniforms=torch.rand(1, 16, generator=g, dtype=torch.float64),
            cb0_history=torch.zeros(1, 3072, dtype=torch.bool),
            frames_generated=torch.zeros(1, dtype=torch.int64),
            talker_sampling=sampling.SamplingRows.single(
                greedy=False, temperature=0.9, top_k=50, top_p=0.95, repetition_penalty=1.05
            ),
            predictor_sampling=sampling.SamplingRows.single(
                greedy=False, temperature=0.9, top_k=50, top_p=1.0
            ),
        )
        for _ in prompts
    ]
    batch_rows = step.FrameRows(
        uniforms=torch.cat([r.uniforms for r in rows]),
        cb0_history=torch.cat([r.cb0_history for r in rows]),
        frames_generated=torch.cat([r.frames_generated for r in rows]),
        talker_sampling=sampling.SamplingRows.cat([r.talker_sampling for r in rows]),
        predictor_sampling=sampling.SamplingRows.cat([r.predictor_sampling for r in rows]),
    )
    alone_cache = talker.new_cache(4, 32)
    with torch.no_grad():
        alone = torch.cat(
            [fast.prefill_hidden(p, slots[i : i + 1], alone_cache) for i, p in enumerate(prompts)]
        )
        one_by_one = torch.cat([fast.complete_frames(alone[i : i + 1], r) for i, r in enumerate(rows)])
        # Passes above the buckets attend per sequence (`PromptSequences`), not row by row as the buckets'
        # decode attention does: the same math, rounded differently, so they are equal to within rounding.
        splits = {
            "one pass": ({}, True),
            "passes of [11] and [4, 7] within a 12-row bucket": (
                {"PROMPT_BUCKETS": (12,), "PREFILL_ROWS": 12},
                True,
            ),
            "passes of [11] and [4, 7] above the buckets, padded to 12 rows": (
                {
                    "PROMPT_BUCKETS": (4,),
                    "PACKED_PROMPT_BUCKETS": (12,),
                    "PREFILL_ROWS": 12,
                },
                False,
            ),
            "passes of [11] and [4, 7] above the buckets, unpadded (40 rows would pass the cache)": (
                {
                    "PROMPT_BUCKETS": (4,),
                    "PACKED_PROMPT_BUCKETS": (40,),
                    "PREFILL_ROWS": 12,
                },
                False,
            ),
        }
        for split, (settings, exact) in splits.items():
            with monkeypatch.context() as patch:
                for name, value in settings.items():
                    patch.setattr(graphs, name, value)
                cache = talker.new_cache(4, 32)
                together = fast.prefill_hidden_many(prompts, slots, cache)

            def same(got: torch.Tensor, expected: torch.Tensor, exact: bool = exact) -> bool:
                return torch.equal(got, expected) if exact else torch.allclose(got, expected, atol=1e-5)

            assert same(together, alone), split
            for slot, prompt in zip(slots.tolist(), prompts, strict=True):
                # Positions past a prompt hold the padding's entries, which decoding overwrites first.
                for got, expected in ((cache.k, alone_cache.k), (cache.v, alone_cache.v)):
                    length = prompt.shape[0]
                    assert same(got[:, slot, :, :length], expected[:, slot, :, :length]), split
            if exact:
                assert torch.equal(fast.complete_frames(together, batch_rows), one_by_one), split


def test_codec_pool_gather_scatter_equals_separate_streams(
    tiny_voice_design_config: VoiceDesignConfig,
) -> None:
    """What a codec graph replays (gather rows of the state pool, decode, scatter back) continues each
    stream exactly as decoding it alone does (float64, so any difference would be a state bug)."""
    from qwen3_tts_native.engine.model.codec import SpeechDecoder
    from qwen3_tts_native.engine.runtime.codec_graphs import _gather, _scatter
    from qwen3_tts_native.engine.snapshot import expected_speech_decoder_tensors

    config = tiny_voice_design_config.speech_decoder
    g = torch.Generator().manual_seed(5)
    tensors = {
        name: (
            torch.rand(shape, generator=g) + 0.5
            if name.endswith("cluster_usage")
            else 0.05 * torch.randn(shape, generator=g)
        ).double()
        for name, (shape, _dtype) in expected_speech_decoder_tensors(config).items()
    }
    decoder = SpeechDecoder.from_tensors(config, tensors)
    pool = decoder.new_stream_state(4)  # slots 0..2 and scratch 3
    alone = [decoder.new_stream_state() for _ in range(2)]
    slots = torch.tensor([2, 0, 3])  # two live streams and a padded row on the scratch slot
    for frames in (1, 4, 3):
        codes = torch.randint(0, config.codebook_size, (3, config.num_quantizers, frames), generator=g)
        state = _gather(pool, slots)
        batched = decoder(codes, state)
        _scatter(pool, slots, state)
        for row in range(2):
            torch.testing.assert_close(batched[row], decoder(codes[row : row + 1], alone[row])[0])


def test_session_uniform_blocks_equal_frame_by_frame_draws() -> None:
    """Uniforms drawn in blocks are the generator's frame-by-frame stream (seeded codes are unchanged)."""
    from qwen3_tts_native.engine.runtime.session import UNIFORM_BLOCK_FRAMES, Session

    session = Session.__new__(Session)
    session.generator = torch.Generator().manual_seed(99)
    got = torch.cat([session.draw_uniform_block() for _ in range(2)])
    g = torch.Generator().manual_seed(99)
    expected = torch.stack(
        [torch.rand(16, generator=g, dtype=torch.float64) for _ in range(2 * UNIFORM_BLOCK_FRAMES)]
    )
    assert torch.equal(got, expected)


def test_prompts_fill_passes_in_order_up_to_the_row_and_prompt_limits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whole prompts, in order, in passes of at most `PREFILL_ROWS` rows and `PROMPTS_PER_PASS` prompts; a
    prompt longer than `PREFILL_ROWS` runs alone."""
    monkeypatch.setattr(graphs, "PREFILL_ROWS", 40)
    monkeypatch.setattr(graphs, "PROMPTS_PER_PASS", 3)
    assert graphs.prompt_passes([]) == []
    assert graphs.prompt_passes([10, 5, 10]) == [slice(0, 3)]
    assert graphs.prompt_passes([10, 10, 10, 10]) == [slice(0, 3), slice(3, 4)]
    assert graphs.prompt_passes([30, 5, 10]) == [slice(0, 2), slice(2, 3)]
    assert graphs.prompt_passes([5, 50, 5]) == [slice(0, 1), slice(1, 2), slice(2, 3)]


def test_prompt_passes_are_padded_with_their_last_token() -> None:
    """A prompt pass runs its bucket's row count (so an eager pass and its graph compute the same
    products); the padding rows repeat the last prompt's last token, so they write only what it writes."""
    assert graphs.PREFILL_ROWS == graphs.PROMPTS_PER_PASS * graphs.PROMPT_BUCKETS[-1] == 16384
    assert [graphs.prompt_pass_rows(n) for n in (1, 32, 33, 152, 256, 257, 9728, 9729, 16384, 16385)] == [
        32,
        32,
        64,
        160,
        256,
        512,
        9728,
        9984,
        16384,
        16385,
    ]
    assert [graphs.packed_span(n) for n in (1, 256, 257, 8192, 8193)] == [256, 256, 512, 8192, 8193]
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randn(3, 8, generator=g), torch.randn(5, 8, generator=g)]
    rows, ends = graphs.PromptRows.of(prompts, torch.tensor([2, 0]), 32)
    assert torch.equal(rows.embeds[:8], torch.cat(prompts))
    assert torch.equal(rows.embeds[8:], prompts[1][-1].expand(24, -1))
    assert rows.positions.tolist() == [0, 1, 2, 0, 1, 2, 3, 4] + [4] * 24
    assert rows.slots.tolist() == [2, 2, 2] + [0] * 29
    assert ends.tolist() == [2, 7]


def test_packed_prompts_attend_like_the_decode_attention(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass above the buckets (`PromptRows.packed`: the prompts' rows, each prompt a sequence of
    `PromptSequences`, then the padding as a sequence that continues the last prompt) gives each prompt row,
    attending over the pass's own keys and values, the attention of its query over its own prompt's keys
    0..its position, as the decode attention does row by row from the cache the pass wrote: keys of other
    slots, stale cache entries past a prompt and the padding do not leak in. The tables have fixed shapes
    (`PROMPTS_PER_PASS`), for the pass's graph."""
    monkeypatch.setattr(graphs, "PROMPTS_PER_PASS", 6)
    g = torch.Generator().manual_seed(5)
    lengths, slots = [3, 7, 1, 5], torch.tensor([4, 0, 2, 1])
    heads, kv_heads, dim, positions_total = 4, 2, 16, 12
    k_cache = torch.randn(5, kv_heads, positions_total, dim, generator=g)
    v_cache = torch.randn(5, kv_heads, positions_total, dim, generator=g)
    prompts = [torch.randn(n, 8, generator=g) for n in lengths]
    rows, ends, sequences = graphs.PromptRows.packed(prompts, slots, 20)
    assert torch.equal(rows.embeds, torch.cat([*prompts, prompts[-1][-1:].expand(4, -1)]))
    assert rows.positions.tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 5, 6, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]
    assert rows.slots.tolist() == [4] * 3 + [0] * 7 + [2] + [1] * 9
    assert ends.tolist() == [2, 9, 10, 15, 0, 0]
    assert sequences.bounds.dtype == torch.int32
    assert sequences.bounds.tolist() == [0, 3, 10, 11, 16, 20, 20, 20]
    assert sequences.span == 256
    queries = torch.randn(20, heads, dim, generator=g)
    k_cache[rows.slots, :, rows.positions] = torch.randn(20, kv_heads, dim, generator=g)
    v_cache[rows.slots, :, rows.positions] = torch.randn(20, kv_heads, dim, generator=g)
    keys, values = k_cache[rows.slots, :, rows.positions], v_cache[rows.slots, :, rows.positions]
    got = sequences.attend(queries, keys, values, dim**-0.5)
    expected = reference.decode_attention(
        queries, k_cache, v_cache, rows.slots, rows.positions + 1, dim**-0.5
    )
    assert got.shape == expected.shape == (20, heads * dim)
    assert torch.allclose(got[:16], expected[:16], atol=1e-5, rtol=1e-5)


def test_the_l2_plan_keeps_one_share_of_every_predictor_weight(
    tiny_voice_design_config: VoiceDesignConfig, tiny_tensors: dict[str, torch.Tensor]
) -> None:
    """The predictor's GEMV weights keep the same share of their bytes (128-byte lines, `keep` bytes at most
    in all) and every other frame weight is streamed; on CPU (no L2 to plan) nothing is kept."""
    talker = Talker.from_tensors(tiny_voice_design_config, tiny_tensors)
    predictor = CodePredictor.from_tensors(tiny_voice_design_config, tiny_tensors)
    frame = KernelFrame(talker, predictor, type(FAST)("fast", "bf16", torch.float32))
    streamed = [frame.codec_head, frame.projection, *frame.heads]
    for block in frame.talker_blocks + frame.predictor_blocks:
        streamed += block.weights
    assert all(weight.l2_keep == 0 for weight in streamed)
    weights = [w for b in frame.predictor_blocks for w in b.weights]
    total = sum(w.small_bytes for w in weights)
    keep = total // 3
    planned = graphs._l2_plan(frame.predictor_blocks, keep)
    kept = [cast(int, w.l2_keep) for b in planned for w in b.weights]
    assert all(k % 128 == 0 for k in kept) and sum(kept) <= keep
    for weight, k in zip(weights, kept, strict=True):
        assert weight.small_bytes // 3 - 128 <= k <= weight.small_bytes // 3
